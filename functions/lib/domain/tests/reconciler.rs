//! The reconciler: stranded holds come back, healthy ones are left alone.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Duration, TimeZone, Utc};
use flashsale_domain::buyer_orders::{BuyerOrdersCursor, BuyerOrdersPage};
use flashsale_domain::error::StoreError;
use flashsale_domain::fulfilment::{BuyerCursor, OrderPage};
use flashsale_domain::ports::{Clock, OrderBook, SaleCatalog, StockLedger, Take};
use flashsale_domain::sale::StockCounts;
use flashsale_domain::service::{ReconcileReport, Reconciler};
use flashsale_domain::testing;
use flashsale_domain::testing::{InMemoryStore, InjectedFailure, ManualClock};
use flashsale_domain::{Order, OrderId, OrderStatus, Reservation, Sale, SaleId, UserId};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 11, 0, 0, 0).unwrap()
}

struct World {
    store: Arc<InMemoryStore>,
    clock: Arc<ManualClock>,
    reconciler: Reconciler,
    sale: Sale,
}

async fn world() -> World {
    let store = Arc::new(InMemoryStore::new());
    let clock = Arc::new(ManualClock::new(start()));
    let clock_port: Arc<dyn Clock> = clock.clone();
    let sale = testing::sale(10, 1)
        .id("s")
        .starting_at(start())
        .payment_window_secs(600)
        .build();
    store.create_sale(&sale).await.unwrap();
    let reconciler = Reconciler {
        catalog: store.clone(),
        orders: store.clone(),
        ledger: store.clone(),
        clock: clock_port,
        timer_grace: Duration::seconds(120),
        take_grace: Duration::seconds(360),
        payments: None,
    };
    World {
        store,
        clock,
        reconciler,
        sale,
    }
}

fn reservation(world: &World, user: &str) -> Reservation {
    let now = world.clock.now();
    Reservation {
        order_id: OrderId::new(world.sale.sale_id.clone()),
        sale_id: world.sale.sale_id.clone(),
        user_id: UserId::parse(user).unwrap(),
        shard: 0,
        created_at: now,
        expires_at: world.sale.payment_deadline(now),
        price: world.sale.price,
    }
}

#[tokio::test]
async fn a_hold_within_its_window_is_left_alone_timer_or_not() {
    let world = world().await;
    // A hold whose hand-over was lost has no timer; its buyer may still pay it.
    world.store.strand(&world.sale, &reservation(&world, "a"));
    for at in [Duration::seconds(30), Duration::seconds(599)] {
        world.clock.set(start() + at);
        let report = world.reconciler.run().await.unwrap();
        assert_eq!(
            report,
            ReconcileReport {
                sales: 1,
                open_holds: 1,
                ..ReconcileReport::default()
            }
        );
    }
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 9);
}

#[tokio::test]
async fn a_hold_no_timer_released_is_released_once_past_its_deadline_by_the_grace() {
    let world = world().await;
    let held = reservation(&world, "a");
    world.store.strand(&world.sale, &held);

    world.clock.set(held.expires_at + Duration::seconds(60));
    assert_eq!(
        world.reconciler.run().await.unwrap().expired,
        0,
        "the timer still has time"
    );
    world.clock.set(held.expires_at + Duration::seconds(120));
    assert_eq!(world.reconciler.run().await.unwrap().expired, 1);
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 10);
    let settled = world
        .store
        .release(
            &held,
            flashsale_domain::ReleaseReason::Expired,
            world.clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(
        settled,
        flashsale_domain::ports::Settlement::AlreadySettled(OrderStatus::Expired)
    );
    // A second pass finds nothing open.
    let again = world.reconciler.run().await.unwrap();
    assert_eq!((again.open_holds, again.expired), (0, 0));
}

#[tokio::test]
async fn long_ended_sales_are_not_read() {
    let world = world().await;
    world.clock.set(start() + Duration::days(3));
    assert_eq!(world.reconciler.run().await.unwrap().sales, 0);
}

/// The in-memory order book, except that one sale's holds cannot be read.
struct UnreadableSale {
    store: Arc<InMemoryStore>,
    unreadable: SaleId,
}

#[async_trait]
impl OrderBook for UnreadableSale {
    async fn find(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<(Order, Reservation)>, StoreError> {
        self.store.find(order_id, user).await
    }

    async fn open_holds(&self, sale: &Sale) -> Result<Vec<Reservation>, StoreError> {
        if sale.sale_id == self.unreadable {
            return Err(StoreError::permanent("open_holds", InjectedFailure));
        }
        self.store.open_holds(sale).await
    }

    async fn count(&self, sale: &Sale) -> Result<StockCounts, StoreError> {
        self.store.count(sale).await
    }

    async fn sale_orders(
        &self,
        sale: &Sale,
        after: Option<&BuyerCursor>,
        limit: usize,
    ) -> Result<OrderPage, StoreError> {
        self.store.sale_orders(sale, after, limit).await
    }

    async fn buyer_orders(
        &self,
        user: &UserId,
        after: Option<&BuyerOrdersCursor>,
        limit: usize,
    ) -> Result<BuyerOrdersPage, StoreError> {
        self.store.buyer_orders(user, after, limit).await
    }
}

#[tokio::test]
async fn a_sale_whose_holds_cannot_be_read_does_not_stop_the_others_being_repaired() {
    let mut world = world().await;
    let unreadable = Sale {
        sale_id: SaleId::parse("unreadable").unwrap(),
        ..world.sale.clone()
    };
    world.store.create_sale(&unreadable).await.unwrap();
    world.reconciler.orders = Arc::new(UnreadableSale {
        store: world.store.clone(),
        unreadable: unreadable.sale_id.clone(),
    });
    let lost = reservation(&world, "a");
    world.store.strand(&world.sale, &lost);
    world.clock.set(lost.expires_at + Duration::seconds(120));
    let report = world.reconciler.run().await.unwrap();
    assert_eq!((report.sales, report.failed_sales), (2, 1));
    assert_eq!(report.expired, 1);
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 10);
}

/// A take the shard records with no hold behind it: a grab that died between the
/// reserve's two writes.
fn loose_take(world: &World, user: &str) -> Take {
    Take {
        shard: 0,
        order_id: OrderId::new(world.sale.sale_id.clone()),
        user_id: UserId::parse(user).unwrap(),
        taken_at: world.clock.now(),
    }
}

#[tokio::test]
async fn a_take_with_no_hold_is_given_back_once_its_grab_path_can_no_longer_finish_it() {
    let world = world().await;
    let take = loose_take(&world, "a");
    world.store.leave_take(&world.sale, take.clone());
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 9);

    world.clock.advance(Duration::seconds(30));
    let early = world.reconciler.run().await.unwrap();
    assert_eq!(early.takes_returned, 0, "a reserve may be writing its hold");
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 9);

    // A while on, but the path lives: its buyer's retry may finish it.
    world.clock.advance(Duration::seconds(270));
    let living = world.reconciler.run().await.unwrap();
    assert_eq!(
        living.takes_returned, 0,
        "its grab path may still come back"
    );
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 9);

    world.clock.advance(Duration::seconds(61));
    let report = world.reconciler.run().await.unwrap();
    assert_eq!(report.takes_returned, 1);
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 10);
    // The order is settled, so its path can never take a unit again.
    let (order, _) = world
        .store
        .find(&take.order_id, &take.user_id)
        .await
        .unwrap()
        .expect("the settled hold");
    assert_eq!(order.status, OrderStatus::Expired);
    let again = world.reconciler.run().await.unwrap();
    assert_eq!(again.takes_returned, 0, "given back once");
    assert_eq!(world.store.shard_available(&world.sale.sale_id, 0), 10);
}
