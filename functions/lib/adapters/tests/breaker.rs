//! The circuit breaker in front of a real SDK client: DynamoDB Local behind the
//! fault-injecting proxy, every request counted at the HTTP level. A failing table is
//! called until the breaker opens, then not at all until one probe after the cool-off.

mod support;

use std::time::Duration;

use flashsale_adapters::breaker::{BreakerPolicy, CircuitBreaker};
use flashsale_adapters::{DynamoStore, dynamodb_behind};
use flashsale_domain::ports::SaleCatalog;
use flashsale_emulators::proxy::{Fault, FaultRule};

const POLICY: BreakerPolicy = BreakerPolicy {
    failures: 3,
    window: Duration::from_secs(10),
    cool_off: Duration::from_millis(400),
};

#[tokio::test]
async fn a_failing_table_is_called_until_the_breaker_opens_then_once_per_cool_off() {
    let (proxy, sdk) = support::proxied().await;
    let (plain, _, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    assert!(plain.create_sale(&sale).await.expect("create the sale"));
    let breaker = CircuitBreaker::new("dynamodb", POLICY);
    let store = DynamoStore::new(dynamodb_behind(&sdk, &breaker), &table);
    assert!(
        store
            .find_sale(&sale.sale_id)
            .await
            .expect("healthy")
            .is_some()
    );

    proxy.set_faults(vec![FaultRule::always("*", Fault::ServerError)]);
    let before = proxy.counts().total();
    let mut last = None;
    for _ in 0..10 {
        let error = store
            .find_sale(&sale.sale_id)
            .await
            .expect_err("the table fails");
        assert!(error.is_retryable(), "{error:?}");
        last = Some(error);
    }
    assert_eq!(
        proxy.counts().total() - before,
        u64::from(POLICY.failures),
        "the tries that opened the breaker, and no more"
    );
    let last = last.expect("ten calls");
    assert!(last.was_not_attempted(), "{last:?}");
    assert!(
        last.retry_after()
            .is_some_and(|wait| wait <= POLICY.cool_off)
    );

    // After the cool-off one probe goes; the table failing still, it opens again.
    tokio::time::sleep(POLICY.cool_off).await;
    let before = proxy.counts().total();
    let probe = store
        .find_sale(&sale.sale_id)
        .await
        .expect_err("still failing");
    assert!(!probe.was_not_attempted(), "the probe was sent: {probe:?}");
    assert!(
        store
            .find_sale(&sale.sale_id)
            .await
            .expect_err("open again")
            .was_not_attempted()
    );
    assert_eq!(proxy.counts().total() - before, 1, "one probe, one try");

    // The table recovers: the next probe is answered and the breaker closes.
    proxy.set_faults(Vec::new());
    tokio::time::sleep(POLICY.cool_off).await;
    assert!(
        store
            .find_sale(&sale.sale_id)
            .await
            .expect("the probe")
            .is_some()
    );
    assert!(
        store
            .find_sale(&sale.sale_id)
            .await
            .expect("closed")
            .is_some()
    );
}

#[tokio::test]
async fn a_refusal_from_a_healthy_table_keeps_the_breaker_closed() {
    let (_proxy, sdk) = support::proxied().await;
    let breaker = CircuitBreaker::new("dynamodb", POLICY);
    // No such table: a 400 each time, an answer from a service that is up.
    let store = DynamoStore::new(dynamodb_behind(&sdk, &breaker), "no-such-table");
    let sale = support::sale(3, 1, 1);
    for _ in 0..(2 * POLICY.failures) {
        let error = store.find_sale(&sale.sale_id).await.expect_err("no table");
        assert!(!error.was_not_attempted(), "{error:?}");
    }
}
