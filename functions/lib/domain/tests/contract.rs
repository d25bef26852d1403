//! The contract suite (`flashsale_domain::testing::contract`) on the in-memory fakes:
//! the same scenarios the adapters' tests play on `DynamoStore`.

use flashsale_domain::testing::contract::LeftTakes;
use flashsale_domain::testing::{InMemoryBlocklist, InMemoryStore};

flashsale_domain::contract_tests! {
    subject: (InMemoryStore::new(), LeftTakes),
    blocklist: InMemoryBlocklist::new(),
}
