//! The contract suite (`flashsale_domain::testing::contract`) on `DynamoStore` against
//! DynamoDB Local: the scenarios the domain's tests play on the in-memory fakes, so the
//! fakes are shown to behave as DynamoDB does, once for each path a reserve can take
//! (the transaction, and take-then-hold on a hot shard). Each test has a table of its own.

mod support;

use async_trait::async_trait;
use flashsale_adapters::{DynamoStore, ReserveMode};
use flashsale_domain::Reservation;
use flashsale_domain::Sale;
use flashsale_domain::ports::StockLedger;
use flashsale_domain::testing::contract::StrandsTakes;

use support::conflicts::Pattern;

/// Strands a take as a take-then-hold reserve killed between its two writes does:
/// through a client on the same table whose writes fail from the second on, retries
/// included.
struct KilledAfterTheTake {
    table: String,
}

#[async_trait]
impl StrandsTakes<DynamoStore> for KilledAfterTheTake {
    async fn strand_take(&self, _store: &DynamoStore, sale: &Sale, reservation: &Reservation) {
        let (client, _) = support::failing_writes_client(Pattern::FromCall(1)).await;
        let error = DynamoStore::new(client, &self.table)
            .with_reserve_mode(ReserveMode::TakeThenHold)
            .reserve(sale, reservation.shard, reservation)
            .await
            .expect_err("killed before the hold");
        assert!(error.is_retryable(), "{error:?}");
    }
}

/// Each reserve path on its own: the suite holds whichever one a shard is on.
mod transaction {
    use super::*;

    flashsale_domain::contract_tests! {
        subject: {
            let (store, _, table) = support::store().await;
            (store.with_reserve_mode(ReserveMode::Transaction), KilledAfterTheTake { table })
        },
        blocklist: support::store().await.0,
    }
}

mod take_then_hold {
    use super::*;

    flashsale_domain::contract_tests! {
        subject: {
            let (store, _, table) = support::store().await;
            (store.with_reserve_mode(ReserveMode::TakeThenHold), KilledAfterTheTake { table })
        },
        blocklist: support::store().await.0,
    }
}
