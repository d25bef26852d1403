//! One contract suite for every store: scenarios generic over the port traits, each
//! asserting what the docs in [`crate::ports`] promise. The domain's tests play them on
//! the in-memory fakes and the adapters' on `DynamoStore` against DynamoDB Local, so the
//! fakes the domain tests rely on are shown to behave like DynamoDB.
//!
//! [`contract_tests!`](crate::contract_tests) makes each scenario its own test.

use std::collections::BTreeSet;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use futures::future::{join, join_all};

use crate::buyer_orders::BuyerOrdersCursor;
use crate::control::{ControlWrite, SaleAction, SaleAudit, SaleControl};
use crate::fulfilment::BuyerCursor;
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::{Order, OrderStatus, ReleaseReason, Reservation};
use crate::payment::{FollowedMoney, OrderPayment, PaymentId, PaymentState};
use crate::ports::{
    Blocklist, OrderBook, OrderPayments, PayOutcome, PaymentAttach, PaymentRecorded,
    ProviderEvents, ReserveRefusal, SaleCatalog, Settlement, ShardTakers, StockLedger, Take,
    TakeReturn,
};
use crate::sale::{MAX_ABANDONED_HOLDS, Sale, SaleCursor, SaleStats, StockCounts};
use crate::testing::{InMemoryStore, pay_by_card, sale};

/// Leaves a take no hold accounts for, as a reserve that died between its take and its
/// hold leaves it. No port can do that on purpose, so each store under test brings its
/// own way (the fake's [`InMemoryStore::leave_take`], a writer that dies on DynamoDB).
#[async_trait]
pub trait StrandsTakes<S>: Send + Sync {
    async fn strand_take(&self, store: &S, sale: &Sale, reservation: &Reservation);
}

/// The fake's way: [`InMemoryStore::leave_take`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LeftTakes;

#[async_trait]
impl StrandsTakes<InMemoryStore> for LeftTakes {
    async fn strand_take(&self, store: &InMemoryStore, sale: &Sale, reservation: &Reservation) {
        store.leave_take(sale, take_of(reservation));
    }
}

/// One `#[tokio::test]` per scenario of [`crate::testing::contract`]. `subject` is an
/// expression (evaluated afresh in each test, so each has a store of its own) giving the
/// store and its [`StrandsTakes`]; `blocklist`, one giving a fresh [`Blocklist`].
#[macro_export]
macro_rules! contract_tests {
    (subject: $subject:expr, blocklist: $blocklist:expr $(,)?) => {
        $crate::contract_tests!(@store $subject;
            creating_an_existing_sale_answers_false_and_changes_nothing,
            sales_ending_after_returns_the_sales_ending_at_or_after_the_cutoff,
            list_sales_pages_through_every_sale_latest_ending_first,
            a_sales_control_changes_only_where_its_action_applies_each_change_audited_once,
            sale_orders_pages_through_every_buyers_orders_once_in_one_order,
            sale_orders_walks_a_sale_of_many_empty_buckets_over_pages_to_its_few_orders,
            buyer_orders_pages_through_the_buyers_own_orders_newest_first,
            reserve_takes_one_unit_and_records_a_reserved_hold,
            reserve_never_oversells_and_refuses_an_empty_shard_naming_its_takers,
            reserve_over_the_per_user_limit_is_refused_as_limit_reached_and_takes_nothing,
            a_buyer_who_abandoned_the_most_holds_is_refused_as_limit_reached,
            a_retried_reserve_of_a_held_order_answers_already_held_and_takes_nothing,
            release_gives_the_unit_back_exactly_once,
            releasing_an_unknown_reservation_is_unknown_and_takes_nothing,
            an_order_keeps_the_price_it_was_reserved_at_until_it_settles,
            another_users_order_is_not_found_at_any_stage,
            counts_and_open_holds_agree_with_what_was_done,
            every_take_of_a_held_order_is_accounted_for,
            returning_a_take_given_back_already_still_voids_its_order,
            attach_payment_records_one_payment_per_open_order,
            pay_with_pays_only_with_the_orders_payment_inside_its_window,
            pay_with_and_release_of_one_order_have_exactly_one_winner,
            two_calls_paying_one_order_at_once_sell_it_once,
            record_payment_records_the_state_of_the_orders_own_payment_only,
            record_refund_moves_a_released_order_with_its_payment_to_refunded_once,
            reopen_refund_moves_a_refunded_order_back_to_where_it_was_refunded_from_once,
            fail_payment_gives_a_paid_orders_unit_back_once_its_payment_is_recorded_cancelled,
            followed_money_lists_each_followed_order_once_since_its_first_follow,
            unsettled_payments_lists_exactly_the_orders_a_settlement_has_not_finished,
            a_provider_event_is_recorded_processed_once,
        );
        $crate::contract_tests!(@stranding $subject;
            a_stranded_take_is_returned_once_and_voids_its_order,
            a_stranded_take_is_finished_once_by_its_retry_on_the_same_shard,
            a_retry_finishing_a_stranded_take_still_keeps_the_limit,
            a_take_superseded_by_a_hold_on_another_shard_is_dropped_once,
        );
        $crate::contract_tests!(@blocklist $blocklist;
            blocking_and_unblocking_are_idempotent_and_the_list_names_each_user_once,
        );
    };
    (@store $subject:expr; $($scenario:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $scenario() {
            let (store, _strands) = $subject;
            $crate::testing::contract::$scenario(&store).await;
        }
    )*};
    (@stranding $subject:expr; $($scenario:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $scenario() {
            let (store, strands) = $subject;
            $crate::testing::contract::$scenario(&store, &strands).await;
        }
    )*};
    (@blocklist $blocklist:expr; $($scenario:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $scenario() {
            let blocklist = $blocklist;
            $crate::testing::contract::$scenario(&blocklist).await;
        }
    )*};
}

/// Every port of the sales, stock, orders and their payments: what the scenarios need.
pub trait Store: SaleCatalog + StockLedger + OrderBook + OrderPayments + ProviderEvents {}
impl<S: SaleCatalog + StockLedger + OrderBook + OrderPayments + ProviderEvents> Store for S {}

fn user(name: &str) -> UserId {
    UserId::parse(name).expect("a valid user id")
}

/// A minute into the sale: when the scenarios grab, pay and release. Not on a whole
/// second, so a store must keep times to the nanosecond, as chrono's clock gives them.
fn during(sale: &Sale) -> DateTime<Utc> {
    sale.starts_at + Duration::minutes(1) + Duration::nanoseconds(123_456_789)
}

/// A reservation as the grab makes it, a minute into the sale.
fn reservation(sale: &Sale, user_name: &str, shard: u16) -> Reservation {
    let now = during(sale);
    Reservation {
        order_id: OrderId::new(sale.sale_id.clone()),
        sale_id: sale.sale_id.clone(),
        user_id: user(user_name),
        shard,
        created_at: now,
        expires_at: sale.payment_deadline(now),
        price: sale.price,
    }
}

async fn created(store: &impl SaleCatalog, sale: &Sale) {
    assert!(store.create_sale(sale).await.expect("create the sale"));
}

/// A sale of `stock` on `shards`, each buyer limited to `limit`, created in `store`.
async fn new_sale(store: &impl SaleCatalog, stock: i64, shards: i64, limit: i64) -> Sale {
    let sale = sale(stock, shards).per_user_limit(limit).build();
    created(store, &sale).await;
    sale
}

/// Reserves, waiting out `Contended`: it wrote nothing, so the same call again is safe.
async fn reserve(
    store: &impl StockLedger,
    sale: &Sale,
    reservation: &Reservation,
) -> Result<(), ReserveRefusal> {
    loop {
        match store
            .reserve(sale, reservation.shard, reservation)
            .await
            .expect("reserve")
        {
            Err(ReserveRefusal::Contended) => {}
            answer => return answer,
        }
    }
}

async fn reserved(
    store: &impl StockLedger,
    sale: &Sale,
    user_name: &str,
    shard: u16,
) -> Reservation {
    let held = reservation(sale, user_name, shard);
    reserve(store, sale, &held)
        .await
        .expect("stock and limit allow it");
    held
}

async fn stock(store: &impl StockLedger, sale: &Sale) -> Vec<u64> {
    store.availability(sale).await.expect("availability")
}

async fn counts(store: &impl OrderBook, sale: &Sale) -> StockCounts {
    store.count(sale).await.expect("count")
}

async fn status_of(store: &impl OrderBook, reservation: &Reservation) -> Option<OrderStatus> {
    store
        .find(&reservation.order_id, &reservation.user_id)
        .await
        .expect("find")
        .map(|(order, _)| order.status)
}

async fn release(
    store: &impl StockLedger,
    reservation: &Reservation,
    reason: ReleaseReason,
) -> Settlement {
    store
        .release(reservation, reason, reservation.created_at)
        .await
        .expect("release")
}

/// The order and its reservation, as their owner finds them.
async fn found_by_owner(store: &impl OrderBook, held: &Reservation) -> (Order, Reservation) {
    store
        .find(&held.order_id, &held.user_id)
        .await
        .expect("find")
        .expect("the owner finds the order")
}

/// When the order's release that expired it committed, as its owner reads it.
async fn expired_at_of(store: &impl OrderBook, held: &Reservation) -> Option<DateTime<Utc>> {
    found_by_owner(store, held).await.0.expired_at
}

/// The take `reservation` makes, dated when it was made.
fn take_of(reservation: &Reservation) -> Take {
    Take {
        shard: reservation.shard,
        order_id: reservation.order_id.clone(),
        user_id: reservation.user_id.clone(),
        taken_at: reservation.created_at,
    }
}

/// A new sale of `stock` on `shards`, limit `limit`, with a take stranded on shard 0
/// for a new order of alice's: the sale and the order.
async fn sale_with_a_stranded_take<S: Store>(
    store: &S,
    strands: &impl StrandsTakes<S>,
    (stock, shards, limit): (i64, i64, i64),
) -> (Sale, Reservation) {
    let sale = new_sale(store, stock, shards, limit).await;
    let dead = reservation(&sale, "alice", 0);
    strands.strand_take(store, &sale, &dead).await;
    (sale, dead)
}

/// That `voided`, alice's order on a sale of two units on one shard, limit one, was
/// voided by `return_take` at `voided_at`: an expired order like any other, that no
/// reserve can hold any more, and that does not count against her limit.
async fn assert_voided(
    store: &impl Store,
    sale: &Sale,
    voided: &Reservation,
    voided_at: DateTime<Utc>,
) {
    assert_eq!(
        reserve(store, sale, voided).await,
        Err(ReserveRefusal::AlreadyHeld),
        "the voided order cannot be held any more"
    );
    assert_eq!(stock(store, sale).await, vec![2]);
    let (order, _) = found_by_owner(store, voided).await;
    assert_eq!(
        (order.status, order.expired_at),
        (OrderStatus::Expired, Some(voided_at))
    );
    assert_eq!(
        pay_by_card(store, voided, during(sale))
            .await
            .expect("pay by card"),
        PayOutcome::Settled(OrderStatus::Expired)
    );
    assert_eq!(
        counts(store, sale).await,
        StockCounts {
            available: 2,
            expired: 1,
            ..StockCounts::default()
        },
        "the voided order counts as expired, though its buyer holds nothing else"
    );
    reserved(store, sale, "alice", 0).await;
    assert_eq!(
        counts(store, sale).await,
        StockCounts {
            available: 1,
            reserved: 1,
            expired: 1,
            ..StockCounts::default()
        },
        "the voided order counts as expired"
    );
}

async fn unaccounted(store: &impl StockLedger, sale: &Sale) -> Vec<Take> {
    store
        .unaccounted_takes(sale)
        .await
        .expect("unaccounted takes")
}

fn assert_reconciles(sale: &Sale, counts: &StockCounts) {
    assert_eq!(
        counts.available + counts.reserved + counts.paid,
        u64::from(sale.stock_total),
        "every unit is available, held or sold: {counts:?}"
    );
}

/// Whether `takers` are exactly these reservations' orders. Times are not compared: a
/// take records when it was written, which a scenario knows only to within its calls.
fn names_exactly(takers: &ShardTakers, reservations: &[&Reservation]) -> bool {
    takers.len() == reservations.len()
        && reservations
            .iter()
            .all(|held| takers.include(&held.order_id))
}

fn assert_shard_empty(answer: Result<(), ReserveRefusal>, holders: &[&Reservation], why: &str) {
    match answer {
        Err(ReserveRefusal::ShardEmpty(takers)) => assert!(
            names_exactly(&takers, holders),
            "{why}: the refusal names who holds the shard's units: {takers:?}"
        ),
        other => panic!("{why}: expected the shard empty, got {other:?}"),
    }
}

/// `SaleCatalog::create_sale`: a second create of an id answers `false` and writes no
/// shard; each shard holds its share; an unknown id is not found.
pub async fn creating_an_existing_sale_answers_false_and_changes_nothing<S: Store>(store: &S) {
    let sale = sale(10, 4).build();
    assert!(store.create_sale(&sale).await.expect("first create"));
    let again = Sale {
        name: "Another name".to_owned(),
        stock_total: 40,
        ..sale.clone()
    };
    assert!(!store.create_sale(&again).await.expect("second create"));
    assert_eq!(
        store.find_sale(&sale.sale_id).await.expect("find"),
        Some(sale.clone()),
        "the second create changed nothing"
    );
    assert_eq!(stock(store, &sale).await, vec![3, 3, 2, 2]);
    let unknown = crate::testing::sale(1, 1).id("no-such-sale").build();
    assert_eq!(store.find_sale(&unknown.sale_id).await.expect("find"), None);
}

/// `SaleCatalog::sales_ending_after`: every sale ending at or after the cutoff, to the
/// nanosecond, and no other.
pub async fn sales_ending_after_returns_the_sales_ending_at_or_after_the_cutoff<S: Store>(
    store: &S,
) {
    let cutoff = during(&sale(1, 1).build()) + Duration::days(1);
    let offsets = [
        ("ended-a-day-before", -Duration::days(1)),
        ("ended-just-before", -Duration::nanoseconds(1)),
        ("ends-at-the-cutoff", Duration::zero()),
        ("ends-just-after", Duration::nanoseconds(1)),
        ("ends-a-month-after", Duration::days(30)),
    ];
    let mut sales = Vec::new();
    for (id, offset) in offsets {
        let sale = sale(3, 1)
            .id(id)
            .starting_at(cutoff - Duration::days(2))
            .with(|draft| draft.ends_at = cutoff + offset)
            .build();
        created(store, &sale).await;
        sales.push(sale);
    }
    let mut found = store.sales_ending_after(cutoff).await.expect("sales");
    found.sort_by(|a, b| a.sale_id.cmp(&b.sale_id));
    let mut expected: Vec<Sale> = sales[2..].to_vec();
    expected.sort_by(|a, b| a.sale_id.cmp(&b.sale_id));
    assert_eq!(found, expected);
    assert_eq!(
        store
            .sales_ending_after(cutoff + Duration::days(31))
            .await
            .expect("sales"),
        Vec::<Sale>::new(),
        "no sale ends after the last one"
    );
}

/// `SaleCatalog::list_sales`: every sale once, the latest-ending first and then by id
/// (descending), in pages of at most the limit, the last page saying so.
pub async fn list_sales_pages_through_every_sale_latest_ending_first<S: Store>(store: &S) {
    let starts = during(&sale(1, 1).build());
    let ends = [
        ("ends-first", Duration::days(1)),
        ("ends-last", Duration::days(9)),
        ("ties-a", Duration::days(5)),
        ("ties-b", Duration::days(5)),
        (
            "ends-a-nanosecond-later",
            Duration::days(5) + Duration::nanoseconds(1),
        ),
    ];
    for (id, after) in ends {
        let made = sale(2, 1)
            .id(id)
            .starting_at(starts)
            .with(|draft| draft.ends_at = starts + after)
            .build();
        created(store, &made).await;
    }
    let expected = [
        "ends-last",
        "ends-a-nanosecond-later",
        "ties-b",
        "ties-a",
        "ends-first",
    ];
    for limit in [1, 2, 4, 5, 50] {
        let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = store
                .list_sales(after.as_ref(), limit)
                .await
                .expect("list sales");
            assert!(page.sales.len() <= limit, "{limit}: {page:?}");
            listed.extend(page.sales.iter().map(|sale| sale.sale_id.to_string()));
            pages += 1;
            // What a client sends back is the cursor as the API writes it.
            match page.next {
                Some(next) => after = Some(SaleCursor::parse(&next.encode()).expect("a cursor")),
                None => break,
            }
            assert!(pages <= expected.len(), "{limit}: no end to the pages");
        }
        assert_eq!(listed, expected, "limit {limit}");
        assert_eq!(
            pages,
            expected.len().div_ceil(limit),
            "limit {limit}: no empty last page"
        );
    }
    let first = store.list_sales(None, 0).await.expect("list sales");
    assert_eq!(first.sales.len(), 1, "a limit of 0 lists one");
}

/// `SaleCatalog::control_sale` moves a sale's control only from a control its action
/// applies to, and records each change, and only changes, in the audit trail: among
/// racing pauses one wins. An ended sale stays ended; the rest of the sale never
/// changes.
pub async fn a_sales_control_changes_only_where_its_action_applies_each_change_audited_once<
    S: Store,
>(
    store: &S,
) {
    let made = new_sale(store, 4, 2, 1).await;
    let id = &made.sale_id;
    let control_of = |found: Option<Sale>| found.expect("the sale").control;
    assert_eq!(
        control_of(store.find_sale(id).await.expect("find")),
        SaleControl::Open
    );
    let change = |action, by: &str, seconds| SaleAudit {
        action,
        by: user(by),
        at: during(&made) + Duration::seconds(seconds),
    };
    let control =
        |change: SaleAudit| async move { store.control_sale(id, &change).await.expect("control") };

    // Racing pauses: one changes the control, the others find it paused.
    let racing = (0..8).map(|i| control(change(SaleAction::Pause, &format!("op-{i}"), 1)));
    let answers = join_all(racing).await;
    let changed = answers
        .iter()
        .filter(|answer| **answer == ControlWrite::Changed)
        .count();
    assert_eq!(changed, 1, "{answers:?}");
    assert!(answers.iter().all(|answer| matches!(
        answer,
        ControlWrite::Changed
            | ControlWrite::Refused {
                current: SaleControl::Paused
            }
    )));
    let found = store.find_sale(id).await.expect("find").expect("the sale");
    assert_eq!(
        found,
        Sale {
            control: SaleControl::Paused,
            ..made.clone()
        }
    );
    let pauser = store.audit_trail(id, 10).await.expect("trail")[0]
        .by
        .clone();

    assert_eq!(
        control(change(SaleAction::Resume, "op-resume", 2)).await,
        ControlWrite::Changed
    );
    assert_eq!(
        control(change(SaleAction::Resume, "op-resume", 3)).await,
        ControlWrite::Refused {
            current: SaleControl::Open
        }
    );
    assert_eq!(
        control_of(store.find_sale(id).await.expect("find")),
        SaleControl::Open
    );
    assert_eq!(
        control(change(SaleAction::End, "op-end", 4)).await,
        ControlWrite::Changed
    );
    for action in SaleAction::ALL {
        assert_eq!(
            control(change(action, "op-late", 5)).await,
            ControlWrite::Refused {
                current: SaleControl::Ended
            },
            "{action:?} after the end"
        );
    }
    let listed = store.list_sales(None, 50).await.expect("list");
    let listed = listed
        .sales
        .iter()
        .find(|sale| sale.sale_id == *id)
        .expect("listed");
    assert_eq!(
        *listed,
        Sale {
            control: SaleControl::Ended,
            ..made.clone()
        }
    );

    let trail = store.audit_trail(id, 10).await.expect("trail");
    assert_eq!(
        trail,
        [
            change(SaleAction::End, "op-end", 4),
            change(SaleAction::Resume, "op-resume", 2),
            SaleAudit {
                by: pauser,
                ..change(SaleAction::Pause, "op-0", 1)
            },
        ],
        "newest first, only the changes"
    );
    assert_eq!(store.audit_trail(id, 2).await.expect("trail"), trail[..2]);

    let missing = SaleId::parse("no-such-sale").expect("a sale id");
    assert_eq!(
        store
            .control_sale(&missing, &change(SaleAction::Pause, "op", 1))
            .await
            .expect("control"),
        ControlWrite::NoSale
    );
    assert_eq!(store.audit_trail(&missing, 10).await.expect("trail"), []);
    assert_eq!(
        store.find_sale(&missing).await.expect("find"),
        None,
        "nothing written"
    );
}

/// `OrderBook::sale_orders` pages through every order of the sale and no other, buyer
/// by buyer, each once and in the same order whatever the page size; each order as
/// `find` answers it, a paid one with the time its pay committed.
pub async fn sale_orders_pages_through_every_buyers_orders_once_in_one_order<S: Store>(store: &S) {
    let sale = new_sale(store, 20, 4, 2).await;
    let other = crate::testing::sale(5, 1).generated_id().build();
    created(store, &other).await;
    let buyers = ["ann", "bob", "cy", "dee", "eve", "fay", "gus"];
    let mut held = Vec::new();
    for (i, name) in buyers.iter().enumerate() {
        let shard = u16::try_from(i % 4).expect("a shard");
        held.push(reserved(store, &sale, name, shard).await);
        if i % 3 == 0 {
            held.push(reserved(store, &sale, name, (shard + 1) % 4).await);
        }
    }
    reserved(store, &other, "ann", 0).await;
    let paid_at = during(&sale) + Duration::seconds(7);
    assert_eq!(
        pay_by_card(store, &held[0], paid_at).await.expect("pay"),
        PayOutcome::Paid
    );
    let mut expected = Vec::new();
    for reservation in &held {
        let (order, _) = store
            .find(&reservation.order_id, &reservation.user_id)
            .await
            .expect("find")
            .expect("the order");
        expected.push(order);
    }
    assert_eq!(expected[0].paid_at, Some(paid_at), "{:?}", expected[0]);
    assert!(expected[1..].iter().all(|order| order.paid_at.is_none()));

    let mut first_order = None;
    for limit in [1, 2, 3, 7, 50] {
        let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = store
                .sale_orders(&sale, after.as_ref(), limit)
                .await
                .expect("sale orders");
            let page_buyers: BTreeSet<_> = page.orders.iter().map(|o| o.user_id.clone()).collect();
            assert!(page_buyers.len() <= limit, "{limit}: {page:?}");
            listed.extend(page.orders);
            pages += 1;
            match page.next {
                Some(next) => {
                    after = Some(BuyerCursor::parse(&next.encode()).expect("a cursor"));
                }
                None => break,
            }
            assert!(pages <= buyers.len() + 1, "{limit}: no end to the pages");
        }
        let ids: Vec<_> = listed.iter().map(|order| order.order_id.clone()).collect();
        let unique: BTreeSet<_> = ids.iter().cloned().collect();
        assert_eq!(unique.len(), ids.len(), "limit {limit}: an order twice");
        let mut sorted = listed.clone();
        sorted.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        let mut wanted = expected.clone();
        wanted.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        assert_eq!(
            sorted, wanted,
            "limit {limit}: every order of the sale, as find has it"
        );
        match &first_order {
            None => first_order = Some(ids),
            Some(first) => assert_eq!(&ids, first, "limit {limit}: the same order"),
        }
    }
}

/// A buyer's own orders in three sales: the sales by when the buyer's first hold there
/// was recorded, each with the buyer's orders, the latest first, each as `find` has it;
/// every order once over pages of any size; never another buyer's.
pub async fn buyer_orders_pages_through_the_buyers_own_orders_newest_first<S: Store>(store: &S) {
    let mut sales = Vec::new();
    for _ in 0..3 {
        let sale = crate::testing::sale(10, 2)
            .per_user_limit(2)
            .generated_id()
            .build();
        created(store, &sale).await;
        sales.push(sale);
    }
    let start = during(&sales[0]);
    let held_at = |sale: &Sale, name: &str, seconds: i64| {
        let at = start + Duration::seconds(seconds);
        Reservation {
            created_at: at,
            expires_at: sale.payment_deadline(at),
            ..reservation(sale, name, 0)
        }
    };
    // Ann's first holds: sales 0, 2, 1 in that order; a second in sale 0 last of all.
    let mut anns = Vec::new();
    for (sale, seconds) in [(0, 0), (2, 5), (1, 10), (0, 20)] {
        let held = held_at(&sales[sale], "ann", seconds);
        reserve(store, &sales[sale], &held).await.expect("held");
        anns.push(held);
    }
    for (sale, seconds) in [(0, 1), (1, 30)] {
        let held = held_at(&sales[sale], "bob", seconds);
        reserve(store, &sales[sale], &held).await.expect("held");
    }
    let paid_at = start + Duration::seconds(40);
    assert_eq!(
        pay_by_card(store, &anns[2], paid_at).await.expect("pay"),
        PayOutcome::Paid
    );
    let mut expected = Vec::new();
    for newest_first in [&anns[2], &anns[1], &anns[3], &anns[0]] {
        let (order, _) = store
            .find(&newest_first.order_id, &newest_first.user_id)
            .await
            .expect("find")
            .expect("the order");
        expected.push(order);
    }
    assert_eq!(expected[0].status, OrderStatus::Paid);

    for limit in [1, 2, 3, 10] {
        let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = store
                .buyer_orders(&user("ann"), after.as_ref(), limit)
                .await
                .expect("buyer orders");
            let page_sales: BTreeSet<_> = page.orders.iter().map(|o| o.sale_id.clone()).collect();
            assert!(page_sales.len() <= limit, "{limit}: {page:?}");
            listed.extend(page.orders);
            pages += 1;
            assert!(pages <= 4, "{limit}: one page a sale at most, and one more");
            match page.next {
                Some(next) => {
                    after = Some(BuyerOrdersCursor::parse(&next.encode()).expect("a cursor"));
                }
                None => break,
            }
        }
        assert_eq!(listed, expected, "limit {limit}");
    }
    let bobs = store
        .buyer_orders(&user("bob"), None, 10)
        .await
        .expect("buyer orders");
    assert_eq!(bobs.orders.len(), 2, "{bobs:?}");
    assert!(bobs.orders.iter().all(|order| order.user_id == user("bob")));
    assert_eq!(
        bobs.orders[0].sale_id, sales[1].sale_id,
        "bob's latest first"
    );
    let nobodys = store
        .buyer_orders(&user("cy"), None, 10)
        .await
        .expect("buyer orders");
    assert_eq!((nobodys.orders.len(), nobodys.next), (0, None));
}

/// `OrderBook::sale_orders` reaches every order of a sale of many buckets and few
/// buyers, however a store bounds the reads of one page, and ends.
pub async fn sale_orders_walks_a_sale_of_many_empty_buckets_over_pages_to_its_few_orders<
    S: Store,
>(
    store: &S,
) {
    let sale = new_sale(store, 250, 250, 1).await;
    let mut wanted = BTreeSet::new();
    for name in ["first", "last"] {
        let buyer = user(name);
        let held = reserved(store, &sale, name, sale.bucket_of(&buyer)).await;
        wanted.insert(held.order_id);
    }
    let (mut listed, mut after, mut pages) = (BTreeSet::new(), None, 0);
    loop {
        let page = store
            .sale_orders(&sale, after.as_ref(), 50)
            .await
            .expect("sale orders");
        listed.extend(page.orders.into_iter().map(|order| order.order_id));
        pages += 1;
        match page.next {
            Some(next) => after = Some(BuyerCursor::parse(&next.encode()).expect("a cursor")),
            None => break,
        }
        assert!(pages <= 10, "no end to the pages");
    }
    assert_eq!(listed, wanted);
}

/// `StockLedger::reserve` takes one unit of its shard and records a `reserved` hold,
/// which the order book finds, counts and lists as open.
pub async fn reserve_takes_one_unit_and_records_a_reserved_hold<S: Store>(store: &S) {
    let sale = new_sale(store, 5, 2, 1).await;
    let held = reserved(store, &sale, "alice", 1).await;

    assert_eq!(stock(store, &sale).await, vec![3, 1]);
    let (order, found) = found_by_owner(store, &held).await;
    assert_eq!(found, held);
    assert_eq!(order.status, OrderStatus::Reserved);
    assert_eq!(order.expires_at, held.expires_at);
    assert_eq!(order.expired_at, None);
    assert_eq!(
        store.open_holds(&sale).await.expect("open holds"),
        vec![held.clone()]
    );
    let states = store.shard_states(&sale).await.expect("shard states");
    assert_eq!(states.len(), 2);
    assert_eq!((states[0].available, states[1].available), (3, 1));
    assert!(states[0].takers.is_empty());
    assert!(names_exactly(&states[1].takers, &[&held]));
    let counts = counts(store, &sale).await;
    assert_eq!(counts.reserved, 1);
    assert_reconciles(&sale, &counts);
    assert!(
        unaccounted(store, &sale).await.is_empty(),
        "the take has its hold"
    );
}

/// Buyers at once on one shard: exactly its stock is held, then the shard answers
/// `ShardEmpty` naming its takers, and a refusal leaves no trace on the buyer.
pub async fn reserve_never_oversells_and_refuses_an_empty_shard_naming_its_takers<S: Store>(
    store: &S,
) {
    let sale = new_sale(store, 5, 2, 1).await;
    let bids: Vec<Reservation> = (0..8)
        .map(|buyer| reservation(&sale, &format!("buyer-{buyer}"), 0))
        .collect();
    let answers = join_all(bids.iter().map(|bid| reserve(store, &sale, bid))).await;

    let winners: Vec<&Reservation> = bids
        .iter()
        .zip(&answers)
        .filter(|(_, answer)| answer.is_ok())
        .map(|(bid, _)| bid)
        .collect();
    assert_eq!(winners.len(), 3, "exactly the shard's stock: {answers:?}");
    for (bid, answer) in bids.iter().zip(&answers) {
        if answer.is_err() {
            assert!(
                matches!(answer, Err(ReserveRefusal::ShardEmpty(_))),
                "{answer:?}"
            );
            assert_eq!(status_of(store, bid).await, None, "a refusal holds nothing");
        }
    }
    assert_eq!(stock(store, &sale).await, vec![0, 2], "none negative");
    let late = reservation(&sale, "late", 0);
    assert_shard_empty(reserve(store, &sale, &late).await, &winners, "a late buyer");
    let states = store.shard_states(&sale).await.expect("shard states");
    assert_eq!(states[0].available, 0);
    assert!(names_exactly(&states[0].takers, &winners));
    let counts = counts(store, &sale).await;
    assert_eq!(counts.reserved, 3);
    assert_reconciles(&sale, &counts);
    assert!(unaccounted(store, &sale).await.is_empty());
    // The refusal left no trace on the late buyer: a grab elsewhere succeeds.
    reserved(store, &sale, "late", 1).await;
}

/// `LimitReached` at `per_user_limit` open or paid units, leaving the stock as it was;
/// on an empty shard the shard answers first.
pub async fn reserve_over_the_per_user_limit_is_refused_as_limit_reached_and_takes_nothing<
    S: Store,
>(
    store: &S,
) {
    let sale = new_sale(store, 4, 2, 2).await;
    let first = reserved(store, &sale, "alice", 0).await;
    let second = reserved(store, &sale, "alice", 0).await;
    assert_eq!(
        pay_by_card(store, &second, during(&sale))
            .await
            .expect("pay by card"),
        PayOutcome::Paid,
        "a paid unit counts against the limit too"
    );

    let third = reservation(&sale, "alice", 1);
    assert_eq!(
        reserve(store, &sale, &third).await,
        Err(ReserveRefusal::LimitReached)
    );
    assert_eq!(stock(store, &sale).await, vec![0, 2]);
    assert_eq!(status_of(store, &third).await, None);
    assert!(unaccounted(store, &sale).await.is_empty(), "nothing taken");

    let on_the_empty_shard = reservation(&sale, "alice", 0);
    assert_shard_empty(
        reserve(store, &sale, &on_the_empty_shard).await,
        &[&first, &second],
        "empty shard and limit reached",
    );
    assert!(
        unaccounted(store, &sale).await.is_empty(),
        "the refused take was undone"
    );
    // The limit is alice's alone.
    reserved(store, &sale, "bob", 1).await;
    assert_eq!(stock(store, &sale).await, vec![0, 1]);
}

/// `LimitReached` once a buyer cancelled or let lapse `MAX_ABANDONED_HOLDS` holds.
pub async fn a_buyer_who_abandoned_the_most_holds_is_refused_as_limit_reached<S: Store>(store: &S) {
    let sale = new_sale(store, 3, 1, 1).await;
    for n in 0..MAX_ABANDONED_HOLDS {
        let held = reserved(store, &sale, "alice", 0).await;
        let reason = if n % 2 == 0 {
            ReleaseReason::Cancelled
        } else {
            ReleaseReason::Expired
        };
        assert_eq!(release(store, &held, reason).await, Settlement::Applied);
    }

    let one_more = reservation(&sale, "alice", 0);
    assert_eq!(
        reserve(store, &sale, &one_more).await,
        Err(ReserveRefusal::LimitReached)
    );
    assert_eq!(stock(store, &sale).await, vec![3]);
    assert_eq!(status_of(store, &one_more).await, None);
    reserved(store, &sale, "bob", 0).await;
}

/// Idempotent per order id: once the order has a hold, in any status, a reserve of it
/// answers `AlreadyHeld` and takes nothing, before the limit and its own shard's stock.
pub async fn a_retried_reserve_of_a_held_order_answers_already_held_and_takes_nothing<S: Store>(
    store: &S,
) {
    // One unit, limit one: after alice's order, both her shard and her limit refuse.
    let sale = new_sale(store, 1, 1, 1).await;
    let held = reserved(store, &sale, "alice", 0).await;
    assert_eq!(
        reserve(store, &sale, &held).await,
        Err(ReserveRefusal::AlreadyHeld),
        "empty shard and limit reached, but this order is held"
    );
    for (name, why) in [("alice", "a new order of hers"), ("bob", "anyone else's")] {
        assert_shard_empty(
            reserve(store, &sale, &reservation(&sale, name, 0)).await,
            &[&held],
            why,
        );
    }

    // Two shards, limit one: a retry of her order on the shard with stock is held
    // already, not at her limit, and takes nothing.
    let sale = crate::testing::sale(4, 2).id("second-sale").build();
    created(store, &sale).await;
    let held = reserved(store, &sale, "alice", 0).await;
    let elsewhere = Reservation {
        shard: 1,
        ..held.clone()
    };
    assert_eq!(
        reserve(store, &sale, &elsewhere).await,
        Err(ReserveRefusal::AlreadyHeld)
    );
    assert_eq!(stock(store, &sale).await, vec![1, 2], "nothing taken");
    assert_eq!(counts(store, &sale).await.reserved, 1, "one hold");

    // Paid or released, the order is held for good.
    assert_eq!(
        pay_by_card(store, &held, during(&sale))
            .await
            .expect("pay by card"),
        PayOutcome::Paid
    );
    let cancelled = reserved(store, &sale, "bob", 1).await;
    assert_eq!(
        release(store, &cancelled, ReleaseReason::Cancelled).await,
        Settlement::Applied
    );
    for (again, what) in [(&held, "paid"), (&cancelled, "cancelled")] {
        assert_eq!(
            reserve(store, &sale, again).await,
            Err(ReserveRefusal::AlreadyHeld),
            "{what}"
        );
    }
    assert_eq!(stock(store, &sale).await, vec![1, 2], "nothing taken");
    assert_eq!(status_of(store, &held).await, Some(OrderStatus::Paid));
    assert_eq!(
        status_of(store, &cancelled).await,
        Some(OrderStatus::Cancelled)
    );
    let counts = counts(store, &sale).await;
    assert_eq!((counts.paid, counts.reserved, counts.cancelled), (1, 0, 1));
    assert_reconciles(&sale, &counts);
}

/// `StockLedger::release`: the unit comes back once; a repeated or concurrent call
/// answers `AlreadySettled` with the first outcome; the hold no longer counts against
/// the limit, and an expiry records when it committed.
pub async fn release_gives_the_unit_back_exactly_once<S: Store>(store: &S) {
    let sale = new_sale(store, 2, 1, 1).await;
    let cancelled = reserved(store, &sale, "alice", 0).await;
    assert_eq!(
        release(store, &cancelled, ReleaseReason::Cancelled).await,
        Settlement::Applied
    );
    assert_eq!(
        release(store, &cancelled, ReleaseReason::Expired).await,
        Settlement::AlreadySettled(OrderStatus::Cancelled),
        "the first outcome stands"
    );
    assert_eq!(stock(store, &sale).await, vec![2]);
    assert_eq!(
        status_of(store, &cancelled).await,
        Some(OrderStatus::Cancelled)
    );

    // Her limit of one is free again; ten releases at once apply once.
    let expired = reserved(store, &sale, "alice", 0).await;
    let expired_at = expired.created_at + Duration::seconds(5);
    let answers =
        join_all((0..10).map(|_| store.release(&expired, ReleaseReason::Expired, expired_at)))
            .await;
    let applied = answers
        .iter()
        .filter(|answer| matches!(answer, Ok(Settlement::Applied)))
        .count();
    assert_eq!(applied, 1, "ten releases, one applied: {answers:?}");
    assert!(
        answers.iter().all(|answer| matches!(
            answer,
            Ok(Settlement::Applied | Settlement::AlreadySettled(OrderStatus::Expired))
        )),
        "{answers:?}"
    );
    assert_eq!(stock(store, &sale).await, vec![2]);

    assert_eq!(expired_at_of(store, &expired).await, Some(expired_at));
    assert_eq!(
        expired_at_of(store, &cancelled).await,
        None,
        "a cancel is no expiry"
    );
    assert_eq!(store.open_holds(&sale).await.expect("open holds"), vec![]);
    let counts = counts(store, &sale).await;
    assert_eq!(
        counts,
        StockCounts {
            available: 2,
            cancelled: 1,
            expired: 1,
            ..StockCounts::default()
        },
        "each released unit is counted once"
    );
    assert_reconciles(&sale, &counts);
}

/// Releasing a reservation that was never reserved answers `Unknown`.
pub async fn releasing_an_unknown_reservation_is_unknown_and_takes_nothing<S: Store>(store: &S) {
    let sale = new_sale(store, 2, 1, 1).await;
    let never = reservation(&sale, "alice", 0);
    assert_eq!(
        release(store, &never, ReleaseReason::Cancelled).await,
        Settlement::Unknown
    );
    assert_eq!(stock(store, &sale).await, vec![2]);
    assert_eq!(status_of(store, &never).await, None);
}

/// The order is sold at the price its reservation carried: the sale is stored with its
/// price, and the hold keeps the reservation's through every read and settlement (the
/// order's own, not a later read of the sale). A reservation without one (made before
/// prices) stays without.
pub async fn an_order_keeps_the_price_it_was_reserved_at_until_it_settles<S: Store>(store: &S) {
    let sale = sale(4, 1).priced(1_299, "JPY").build();
    created(store, &sale).await;
    let price = sale.price.expect("a priced sale");
    assert_eq!(
        store
            .find_sale(&sale.sale_id)
            .await
            .expect("find")
            .and_then(|found| found.price),
        Some(price)
    );
    let paid = reserved(store, &sale, "alice", 0).await;
    let cancelled = reserved(store, &sale, "bob", 0).await;
    let open = reserved(store, &sale, "carol", 0).await;
    let now = during(&sale);
    assert_eq!(
        pay_by_card(store, &paid, now).await.expect("pay by card"),
        PayOutcome::Paid
    );
    release(store, &cancelled, ReleaseReason::Cancelled).await;
    for held in [&paid, &cancelled, &open] {
        let (order, found) = found_by_owner(store, held).await;
        assert_eq!(order.price, Some(price), "{:?}", order.status);
        assert_eq!(found.price, Some(price));
    }
    assert_eq!(
        store.open_holds(&sale).await.expect("open holds"),
        vec![open.clone()],
        "the open hold lists with its price"
    );
    let unpriced = Reservation {
        price: None,
        ..reservation(&sale, "dave", 0)
    };
    reserve(store, &sale, &unpriced).await.expect("a unit left");
    assert_eq!(found_by_owner(store, &unpriced).await.0.price, None);
}

/// `OrderBook::find`: another user's order is `None`, held or settled.
pub async fn another_users_order_is_not_found_at_any_stage<S: Store>(store: &S) {
    let sale = new_sale(store, 3, 1, 1).await;
    let held = reserved(store, &sale, "alice", 0).await;
    let mallory = user("mallory");
    let found_by_mallory = || store.find(&held.order_id, &mallory);
    assert!(found_by_mallory().await.expect("find").is_none(), "held");
    release(store, &held, ReleaseReason::Cancelled).await;
    assert!(found_by_mallory().await.expect("find").is_none(), "settled");
    let (order, found) = found_by_owner(store, &held).await;
    assert_eq!(found, held);
    assert_eq!(order.status, OrderStatus::Cancelled);
}

/// `count` and `open_holds` after a mix of reserves, payments and releases: every unit
/// where it is, and the open holds exactly those not settled.
pub async fn counts_and_open_holds_agree_with_what_was_done<S: Store>(store: &S) {
    let sale = new_sale(store, 10, 3, 2).await;
    let mut orders = Vec::new();
    for buyer in 0..7u16 {
        orders.push(reserved(store, &sale, &format!("mixer-{}", buyer % 4), buyer % 3).await);
    }
    let now = during(&sale);
    for paid in [0, 3] {
        assert_eq!(
            pay_by_card(store, &orders[paid], now)
                .await
                .expect("pay by card"),
            PayOutcome::Paid
        );
    }
    assert_eq!(
        release(store, &orders[1], ReleaseReason::Cancelled).await,
        Settlement::Applied
    );
    assert_eq!(
        release(store, &orders[4], ReleaseReason::Expired).await,
        Settlement::Applied
    );

    let counts = counts(store, &sale).await;
    assert_eq!(
        counts,
        StockCounts {
            available: 5,
            reserved: 3,
            paid: 2,
            cancelled: 1,
            expired: 1,
            ..StockCounts::default()
        }
    );
    assert_reconciles(&sale, &counts);
    assert_eq!(stock(store, &sale).await.iter().sum::<u64>(), 5);
    let mut open: Vec<Reservation> = [2, 5, 6].map(|index| orders[index].clone()).to_vec();
    open.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    let mut listed = store.open_holds(&sale).await.expect("open holds");
    listed.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    assert_eq!(listed, open);
    assert!(unaccounted(store, &sale).await.is_empty());
}

/// `return_take` leaves a take an open or paid hold on its shard accounts for
/// (`Accounted`), and one a release gave back is `AlreadyReturned`.
pub async fn every_take_of_a_held_order_is_accounted_for<S: Store>(store: &S) {
    let sale = new_sale(store, 4, 1, 3).await;
    let open = reserved(store, &sale, "alice", 0).await;
    let paid = reserved(store, &sale, "alice", 0).await;
    let cancelled = reserved(store, &sale, "alice", 0).await;
    assert_eq!(
        pay_by_card(store, &paid, during(&sale))
            .await
            .expect("pay by card"),
        PayOutcome::Paid
    );
    assert_eq!(
        release(store, &cancelled, ReleaseReason::Cancelled).await,
        Settlement::Applied
    );
    assert!(unaccounted(store, &sale).await.is_empty());

    let now = during(&sale) + Duration::minutes(1);
    for (held, expected, what) in [
        (&open, TakeReturn::Accounted, "open"),
        (&paid, TakeReturn::Accounted, "paid"),
        (&cancelled, TakeReturn::AlreadyReturned, "cancelled"),
    ] {
        assert_eq!(
            store
                .return_take(&take_of(held), now)
                .await
                .expect("return"),
            expected,
            "{what}"
        );
    }
    assert_eq!(stock(store, &sale).await, vec![2], "nothing given back");
    assert_eq!(status_of(store, &open).await, Some(OrderStatus::Reserved));
    let counts = counts(store, &sale).await;
    assert_eq!((counts.reserved, counts.paid, counts.cancelled), (1, 1, 1));
    assert_reconciles(&sale, &counts);
}

/// `return_take` of a take whose unit is back already (a reserve's undo, say) still
/// records the order's hold as `expired`, so the reserve on its way cannot hold it.
pub async fn returning_a_take_given_back_already_still_voids_its_order<S: Store>(store: &S) {
    let sale = new_sale(store, 2, 1, 1).await;
    let on_its_way = reservation(&sale, "alice", 0);
    let now = during(&sale) + Duration::minutes(1);
    assert_eq!(
        store
            .return_take(&take_of(&on_its_way), now)
            .await
            .expect("return"),
        TakeReturn::AlreadyReturned
    );
    assert_voided(store, &sale, &on_its_way, now).await;
}

/// A take a dead reserve left: `unaccounted_takes` finds it, `return_take` gives its
/// unit back once and voids the order as `expired`, so a late retry is `AlreadyHeld`.
pub async fn a_stranded_take_is_returned_once_and_voids_its_order<S: Store>(
    store: &S,
    strands: &impl StrandsTakes<S>,
) {
    let (sale, dead) = sale_with_a_stranded_take(store, strands, (2, 1, 1)).await;
    assert_eq!(stock(store, &sale).await, vec![1]);
    let counts_before = counts(store, &sale).await;
    assert_eq!(
        counts_before.available + counts_before.reserved + counts_before.paid,
        1,
        "the stranded unit is nowhere until returned: {counts_before:?}"
    );
    let states = store.shard_states(&sale).await.expect("shard states");
    assert!(
        names_exactly(&states[0].takers, &[&dead]),
        "the take is the shard's"
    );

    let takes = unaccounted(store, &sale).await;
    assert_eq!(takes.len(), 1, "{takes:?}");
    let take = &takes[0];
    assert_eq!(
        (take.shard, &take.order_id, &take.user_id),
        (0, &dead.order_id, &dead.user_id)
    );
    let now = during(&sale) + Duration::minutes(1);
    assert_eq!(
        store.return_take(take, now).await.expect("return"),
        TakeReturn::Returned
    );
    assert_eq!(
        store.return_take(take, now).await.expect("return again"),
        TakeReturn::AlreadyReturned
    );
    assert_eq!(stock(store, &sale).await, vec![2]);
    assert!(unaccounted(store, &sale).await.is_empty());

    assert_voided(store, &sale, &dead, now).await;
}

/// A retry of a dead reserve on the same shard finds its take and holds it: one unit.
pub async fn a_stranded_take_is_finished_once_by_its_retry_on_the_same_shard<S: Store>(
    store: &S,
    strands: &impl StrandsTakes<S>,
) {
    let (sale, dead) = sale_with_a_stranded_take(store, strands, (2, 1, 1)).await;
    assert_eq!(stock(store, &sale).await, vec![1]);
    let takes = unaccounted(store, &sale).await;
    assert_eq!(
        takes.len(),
        1,
        "the take, with no hold behind it: {takes:?}"
    );
    assert_eq!(
        (&takes[0].order_id, &takes[0].user_id),
        (&dead.order_id, &dead.user_id)
    );

    reserve(store, &sale, &dead).await.expect("finished");
    assert_eq!(stock(store, &sale).await, vec![1], "taken once");
    assert!(unaccounted(store, &sale).await.is_empty());
    assert_eq!(status_of(store, &dead).await, Some(OrderStatus::Reserved));
    assert_eq!(
        reserve(store, &sale, &dead).await,
        Err(ReserveRefusal::AlreadyHeld)
    );
    let counts = counts(store, &sale).await;
    assert_eq!(counts.reserved, 1);
    assert_reconciles(&sale, &counts);
    assert_eq!(
        reserve(store, &sale, &reservation(&sale, "alice", 0)).await,
        Err(ReserveRefusal::LimitReached),
        "her limit of one holds"
    );
    assert_eq!(stock(store, &sale).await, vec![1]);
}

/// A retry that finds its take still answers to the limit: over it, `LimitReached`, and
/// the take goes back, as any refused hold's does.
pub async fn a_retry_finishing_a_stranded_take_still_keeps_the_limit<S: Store>(
    store: &S,
    strands: &impl StrandsTakes<S>,
) {
    let (sale, dead) = sale_with_a_stranded_take(store, strands, (3, 1, 1)).await;
    let other = reserved(store, &sale, "alice", 0).await;

    assert_eq!(
        reserve(store, &sale, &dead).await,
        Err(ReserveRefusal::LimitReached)
    );
    assert_eq!(stock(store, &sale).await, vec![2], "the take went back");
    assert!(unaccounted(store, &sale).await.is_empty());
    assert_eq!(status_of(store, &dead).await, None);
    let counts = counts(store, &sale).await;
    assert_eq!(counts.reserved, 1);
    assert_reconciles(&sale, &counts);
    assert_eq!(status_of(store, &other).await, Some(OrderStatus::Reserved));
}

/// A dead reserve's take on one shard, then the order held on another: the first take
/// is unaccounted, `shards_taken_by` finds both takes at once (the consumer's read for
/// a retry), and `drop_superseded_take` gives the first back once.
pub async fn a_take_superseded_by_a_hold_on_another_shard_is_dropped_once<S: Store>(
    store: &S,
    strands: &impl StrandsTakes<S>,
) {
    let (sale, dead) = sale_with_a_stranded_take(store, strands, (4, 2, 1)).await;
    let moved = Reservation {
        shard: 1,
        ..dead.clone()
    };
    reserve(store, &sale, &moved)
        .await
        .expect("held on shard 1");
    assert_eq!(stock(store, &sale).await, vec![1, 1]);
    let takes = unaccounted(store, &sale).await;
    assert_eq!(takes.len(), 1, "{takes:?}");
    assert_eq!((takes[0].shard, &takes[0].order_id), (0, &dead.order_id));
    assert_eq!(
        store
            .shards_taken_by(&sale, &moved.order_id)
            .await
            .expect("read"),
        vec![0, 1],
        "read consistently, right after the writes"
    );
    let someone_else = reservation(&sale, "bob", 0);
    assert!(
        store
            .shards_taken_by(&sale, &someone_else.order_id)
            .await
            .expect("read")
            .is_empty()
    );

    assert!(store.drop_superseded_take(&moved, 0).await.expect("drop"));
    assert!(
        !store
            .drop_superseded_take(&moved, 0)
            .await
            .expect("drop again"),
        "given back once"
    );
    assert_eq!(stock(store, &sale).await, vec![2, 1]);
    assert!(unaccounted(store, &sale).await.is_empty());
    assert_eq!(
        store
            .shards_taken_by(&sale, &moved.order_id)
            .await
            .expect("read"),
        vec![1]
    );
    assert_eq!(status_of(store, &moved).await, Some(OrderStatus::Reserved));
    let counts = counts(store, &sale).await;
    assert_eq!(counts.reserved, 1);
    assert_reconciles(&sale, &counts);
}

/// A payment id at the provider, named for the scenario's reader.
fn payment_id(name: &str) -> PaymentId {
    PaymentId::new(format!("pi_{name}"))
}

fn payment_in(id: &PaymentId, state: PaymentState) -> OrderPayment {
    OrderPayment {
        id: id.clone(),
        state,
    }
}

/// Attaches `name`'s payment to the held order, which records none yet: its id.
async fn attached(store: &impl OrderPayments, held: &Reservation, name: &str) -> PaymentId {
    let id = payment_id(name);
    assert_eq!(
        store.attach_payment(held, &id).await.expect("attach"),
        PaymentAttach::Attached
    );
    id
}

/// The order's payment, as its owner finds the order.
async fn payment_of(store: &impl OrderBook, held: &Reservation) -> Option<OrderPayment> {
    found_by_owner(store, held).await.0.payment
}

async fn pay_with(
    store: &impl OrderPayments,
    held: &Reservation,
    payment: &OrderPayment,
    now: DateTime<Utc>,
) -> PayOutcome {
    store.pay_with(held, payment, now).await.expect("pay with")
}

/// Whether the order records `payment` once this call is done.
async fn record_payment(
    store: &impl OrderPayments,
    held: &Reservation,
    payment: &OrderPayment,
) -> bool {
    recorded_as(store, held, payment).await.is_recorded()
}

async fn recorded_as(
    store: &impl OrderPayments,
    held: &Reservation,
    payment: &OrderPayment,
) -> PaymentRecorded {
    store
        .record_payment(held, payment)
        .await
        .expect("record the payment")
}

async fn record_refund(store: &impl OrderPayments, held: &Reservation, id: &PaymentId) -> bool {
    store
        .record_refund(held, id)
        .await
        .expect("record the refund")
}

async fn reopen_refund(
    store: &impl OrderPayments,
    held: &Reservation,
    id: &PaymentId,
    from: OrderStatus,
) -> bool {
    store
        .reopen_refund(held, id, from)
        .await
        .expect("reopen the refund")
}

fn consistent(sale: &Sale, counts: StockCounts) -> bool {
    SaleStats::reconcile(sale.stock_total, counts).consistent
}

/// `OrderPayments::attach_payment`: one payment per order, recorded `open` on an open
/// hold; the same payment again is `Attached`, another is `Taken` by the first; a
/// released hold is `Settled` and records none; an unknown one is `Unknown`.
pub async fn attach_payment_records_one_payment_per_open_order<S: Store>(store: &S) {
    let sale = new_sale(store, 4, 1, 1).await;
    let held = reserved(store, &sale, "alice", 0).await;
    assert_eq!(payment_of(store, &held).await, None, "none before");
    let first = attached(store, &held, "first").await;
    assert_eq!(
        store.attach_payment(&held, &first).await.expect("attach"),
        PaymentAttach::Attached,
        "the same payment again"
    );
    assert_eq!(
        store
            .attach_payment(&held, &payment_id("second"))
            .await
            .expect("attach"),
        PaymentAttach::Taken(first.clone()),
        "one payment per order"
    );
    let (order, found) = found_by_owner(store, &held).await;
    assert_eq!(found, held);
    assert_eq!(
        order.status,
        OrderStatus::Reserved,
        "attaching pays nothing"
    );
    assert_eq!(order.payment, Some(payment_in(&first, PaymentState::Open)));

    for (name, reason) in [
        ("bob", ReleaseReason::Cancelled),
        ("carol", ReleaseReason::Expired),
    ] {
        let released = reserved(store, &sale, name, 0).await;
        assert_eq!(release(store, &released, reason).await, Settlement::Applied);
        assert_eq!(
            store
                .attach_payment(&released, &payment_id(name))
                .await
                .expect("attach"),
            PaymentAttach::Settled(reason.final_status()),
            "{name}'s order is {reason:?}"
        );
        assert_eq!(payment_of(store, &released).await, None, "nothing recorded");
    }
    let never = reservation(&sale, "dave", 0);
    assert_eq!(
        store
            .attach_payment(&never, &payment_id("dave"))
            .await
            .expect("attach"),
        PaymentAttach::Unknown
    );
    assert_eq!(status_of(store, &never).await, None, "no hold made");
    assert_eq!(
        store.open_holds(&sale).await.expect("open holds"),
        vec![held.clone()]
    );
    let counts = counts(store, &sale).await;
    assert_eq!(
        counts,
        StockCounts {
            available: 3,
            reserved: 1,
            cancelled: 1,
            expired: 1,
            ..StockCounts::default()
        },
        "an open payment is neither sold nor pending"
    );
    assert!(consistent(&sale, counts));
}

/// `OrderPayments::pay_with`: pays an open order with its own payment only, inside the
/// window `[created, expires)`; paying twice answers `Paid` twice, and a paid order cannot
/// be released. A paid order whose payment is authorised is sold but its capture
/// pending, which the stats call inconsistent until `record_payment` records it
/// captured. A released order answers its status; an unknown one is `Unknown`.
pub async fn pay_with_pays_only_with_the_orders_payment_inside_its_window<S: Store>(store: &S) {
    let sale = new_sale(store, 4, 1, 1).await;
    let held = reserved(store, &sale, "alice", 0).await;
    let own = attached(store, &held, "alice").await;
    let authorised = payment_in(&own, PaymentState::Authorised);
    let in_window = held.expires_at - Duration::milliseconds(1);

    let another = payment_in(&payment_id("mallory"), PaymentState::Authorised);
    let refused = pay_with(store, &held, &another, in_window).await;
    assert_ne!(refused, PayOutcome::Paid, "not the order's payment");
    let unpaid = reserved(store, &sale, "bob", 0).await;
    let unattached = payment_in(&payment_id("bob"), PaymentState::Authorised);
    let refused = pay_with(store, &unpaid, &unattached, in_window).await;
    assert_ne!(refused, PayOutcome::Paid, "the order records no payment");
    assert_eq!(
        pay_with(store, &held, &authorised, held.expires_at).await,
        PayOutcome::WindowClosed,
        "at expires_at the window is closed"
    );
    for (order, what) in [(&held, "alice's"), (&unpaid, "bob's")] {
        assert_eq!(
            status_of(store, order).await,
            Some(OrderStatus::Reserved),
            "{what}: nothing written"
        );
    }
    assert_eq!(
        payment_of(store, &held).await,
        Some(payment_in(&own, PaymentState::Open))
    );
    assert_eq!(payment_of(store, &unpaid).await, None);

    assert_eq!(
        pay_with(store, &held, &authorised, in_window).await,
        PayOutcome::Paid
    );
    // Another call with the same payment (the page's confirm after the webhook's), at
    // the same instant or later: the first alone sold the unit.
    for at in [in_window, in_window + Duration::milliseconds(1)] {
        assert_eq!(
            pay_with(store, &held, &authorised, at).await,
            PayOutcome::Settled(OrderStatus::Paid),
        );
    }
    let (order, _) = found_by_owner(store, &held).await;
    assert_eq!(order.status, OrderStatus::Paid);
    assert_eq!(order.payment, Some(authorised.clone()));
    assert_eq!(
        release(store, &held, ReleaseReason::Expired).await,
        Settlement::AlreadySettled(OrderStatus::Paid)
    );
    assert_eq!(
        stock(store, &sale).await,
        vec![2],
        "the paid unit stays sold"
    );
    let counts_authorised = counts(store, &sale).await;
    assert_eq!(
        (
            counts_authorised.paid,
            counts_authorised.reserved,
            counts_authorised.capture_pending,
            counts_authorised.refund_pending
        ),
        (1, 1, 1, 0),
        "{counts_authorised:?}"
    );
    assert_reconciles(&sale, &counts_authorised);
    assert!(
        !consistent(&sale, counts_authorised),
        "sold, but its money not moved"
    );

    let captured = payment_in(&own, PaymentState::Captured);
    assert!(record_payment(store, &held, &captured).await);
    assert_eq!(payment_of(store, &held).await, Some(captured));
    let counts_captured = counts(store, &sale).await;
    assert_eq!(
        counts_captured,
        StockCounts {
            capture_pending: 0,
            ..counts_authorised
        }
    );
    assert!(consistent(&sale, counts_captured));

    // Paid with its money moved already (an automatic capture): nothing pending.
    let carol = reserved(store, &sale, "carol", 0).await;
    let carols = payment_in(
        &attached(store, &carol, "carol").await,
        PaymentState::Captured,
    );
    assert_eq!(
        pay_with(store, &carol, &carols, during(&sale)).await,
        PayOutcome::Paid
    );
    assert_eq!(payment_of(store, &carol).await, Some(carols));
    let counts = counts(store, &sale).await;
    assert_eq!((counts.paid, counts.capture_pending), (2, 0));

    // Released once its window closed, with its payment attached: the timeout won.
    let late = reserved(store, &sale, "erin", 0).await;
    let erins = payment_in(
        &attached(store, &late, "erin").await,
        PaymentState::Authorised,
    );
    assert_eq!(
        store
            .release(&late, ReleaseReason::Expired, late.expires_at)
            .await
            .expect("release"),
        Settlement::Applied
    );
    assert_eq!(
        pay_with(store, &late, &erins, late.expires_at).await,
        PayOutcome::Settled(OrderStatus::Expired)
    );
    assert_eq!(status_of(store, &late).await, Some(OrderStatus::Expired));

    let never = reservation(&sale, "dave", 0);
    let nobodys = payment_in(&payment_id("dave"), PaymentState::Authorised);
    assert_eq!(
        pay_with(store, &never, &nobodys, during(&sale)).await,
        PayOutcome::Unknown
    );
}

/// Two settlements of one order with its payment at once (the page's confirm and
/// Stripe's webhook): the order is paid once, and exactly one call says it sold the unit.
pub async fn two_calls_paying_one_order_at_once_sell_it_once<S: Store>(store: &S) {
    const ROUNDS: u32 = 10;
    let sale = sale(2 * i64::from(ROUNDS), 2).per_user_limit(1).build();
    created(store, &sale).await;
    for round in 0..ROUNDS {
        let name = format!("payer-{round}");
        let held = reserved(store, &sale, &name, sale.bucket_of(&user(&name))).await;
        let id = attached(store, &held, &name).await;
        let authorised = payment_in(&id, PaymentState::Authorised);
        let now = during(&sale);
        let (page, webhook) = join(
            store.pay_with(&held, &authorised, now),
            store.pay_with(&held, &authorised, now),
        )
        .await;
        let mut outcomes = [page.expect("pay with"), webhook.expect("pay with")];
        outcomes.sort_by_key(|outcome| *outcome != PayOutcome::Paid);
        assert_eq!(
            outcomes,
            [PayOutcome::Paid, PayOutcome::Settled(OrderStatus::Paid)],
            "round {round}"
        );
        let (order, _) = found_by_owner(store, &held).await;
        assert_eq!(order.status, OrderStatus::Paid, "round {round}");
    }
    assert_eq!(counts(store, &sale).await.paid, u64::from(ROUNDS));
}

/// `pay_with` and the timeout's release of one open order, sent at once: exactly one
/// wins, the other answers the winner's status, and the loser changes nothing, its
/// payment's record included.
pub async fn pay_with_and_release_of_one_order_have_exactly_one_winner<S: Store>(store: &S) {
    const ROUNDS: u32 = 20;
    // A unit for every racer on either shard, wherever their buckets put them.
    let sale = sale(2 * i64::from(ROUNDS), 2).per_user_limit(1).build();
    created(store, &sale).await;
    let (mut paid, mut expired) = (0, 0);
    for round in 0..ROUNDS {
        let name = format!("racer-{round}");
        let held = reserved(store, &sale, &name, sale.bucket_of(&user(&name))).await;
        let id = attached(store, &held, &name).await;
        let authorised = payment_in(&id, PaymentState::Authorised);
        let now = during(&sale);
        let (pay, expire) = (
            store.pay_with(&held, &authorised, now),
            store.release(&held, ReleaseReason::Expired, now),
        );
        // Each sent first in turn: polled first, a call is sent first.
        let (paid_outcome, released) = if round % 2 == 0 {
            join(pay, expire).await
        } else {
            let (released, paid_outcome) = join(expire, pay).await;
            (paid_outcome, released)
        };
        let (order, _) = found_by_owner(store, &held).await;
        match (paid_outcome.expect("pay with"), released.expect("release")) {
            (PayOutcome::Paid, Settlement::AlreadySettled(OrderStatus::Paid)) => {
                assert_eq!(order.status, OrderStatus::Paid);
                assert_eq!(order.payment, Some(authorised));
                paid += 1;
            }
            (PayOutcome::Settled(OrderStatus::Expired), Settlement::Applied) => {
                assert_eq!(order.status, OrderStatus::Expired);
                assert_eq!(order.payment, Some(payment_in(&id, PaymentState::Open)));
                expired += 1;
            }
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        }
    }
    eprintln!("pay_with won {paid}, release won {expired} of {ROUNDS}");
    let counts = counts(store, &sale).await;
    assert_eq!((counts.paid, counts.expired), (paid, expired));
    assert_eq!(counts.reserved, 0);
    assert_eq!(counts.available, u64::from(ROUNDS) + expired);
    assert_eq!(
        (counts.capture_pending, counts.refund_pending),
        (paid, 0),
        "every paid order's capture is pending; no expired one's money moved"
    );
    assert_reconciles(&sale, &counts);
}

/// `OrderPayments::record_payment`: records the state only of the order's own payment,
/// whatever the order's status, and changes no status. Idempotent, and a change is
/// answered `Changed` once: the same state again is `Unchanged`.
pub async fn record_payment_records_the_state_of_the_orders_own_payment_only<S: Store>(store: &S) {
    let sale = new_sale(store, 4, 1, 1).await;
    let held = reserved(store, &sale, "alice", 0).await;
    let own = attached(store, &held, "alice").await;
    let another = payment_in(&payment_id("mallory"), PaymentState::Captured);
    assert!(
        !record_payment(store, &held, &another).await,
        "not the order's payment"
    );
    assert_eq!(
        payment_of(store, &held).await,
        Some(payment_in(&own, PaymentState::Open)),
        "nothing changed"
    );
    let authorised = payment_in(&own, PaymentState::Authorised);
    for (attempt, answer) in [
        ("record", PaymentRecorded::Changed),
        ("record again", PaymentRecorded::Unchanged),
    ] {
        assert_eq!(
            recorded_as(store, &held, &authorised).await,
            answer,
            "{attempt}: a change is made, and counted, once"
        );
    }
    let (order, _) = found_by_owner(store, &held).await;
    assert_eq!(order.status, OrderStatus::Reserved, "the status stays");
    assert_eq!(order.payment, Some(authorised));

    let without = reserved(store, &sale, "bob", 0).await;
    let bobs = payment_in(&payment_id("bob"), PaymentState::Authorised);
    assert!(
        !record_payment(store, &without, &bobs).await,
        "the order records no payment"
    );
    assert_eq!(payment_of(store, &without).await, None);
    let never = reservation(&sale, "dave", 0);
    assert!(!record_payment(store, &never, &bobs).await, "no such order");
    assert_eq!(status_of(store, &never).await, None);

    // A released order's payment is recorded too: what the refund is decided on.
    let expired = reserved(store, &sale, "carol", 0).await;
    let carols = attached(store, &expired, "carol").await;
    assert_eq!(
        release(store, &expired, ReleaseReason::Expired).await,
        Settlement::Applied
    );
    let captured = payment_in(&carols, PaymentState::Captured);
    assert!(record_payment(store, &expired, &captured).await);
    // A stale read recorded late undoes no final state.
    for stale in [
        PaymentState::Open,
        PaymentState::Authorised,
        PaymentState::Cancelled,
    ] {
        assert!(
            !record_payment(store, &expired, &payment_in(&carols, stale)).await,
            "{stale:?} after captured"
        );
    }
    assert_eq!(
        recorded_as(store, &expired, &captured).await,
        PaymentRecorded::Unchanged,
        "the same again"
    );
    let (order, _) = found_by_owner(store, &expired).await;
    assert_eq!(order.status, OrderStatus::Expired, "the status stays");
    assert_eq!(order.payment, Some(captured));
    let counts = counts(store, &sale).await;
    assert_eq!(
        counts,
        StockCounts {
            available: 2,
            reserved: 2,
            expired: 1,
            refund_pending: 1,
            ..StockCounts::default()
        },
        "an expired order whose money moved waits for its refund"
    );
    assert!(!consistent(&sale, counts));
}

/// `OrderPayments::reopen_refund`: a refunded order whose refund failed after all goes
/// back to the status it was refunded from, recorded by the refund, once however often
/// asked, its payment still captured: unsettled again, and counted refund-pending. Not
/// another payment's order, not to another status, not an order never refunded. The
/// unit stays back.
pub async fn reopen_refund_moves_a_refunded_order_back_to_where_it_was_refunded_from_once<
    S: Store,
>(
    store: &S,
) {
    let sale = new_sale(store, 4, 1, 1).await;
    let mut refunded = Vec::new();
    for (buyer, reason, status) in [
        ("alice", ReleaseReason::Expired, OrderStatus::Expired),
        ("bob", ReleaseReason::Cancelled, OrderStatus::Cancelled),
    ] {
        let held = reserved(store, &sale, buyer, 0).await;
        let payment = attached(store, &held, buyer).await;
        assert_eq!(release(store, &held, reason).await, Settlement::Applied);
        let captured = payment_in(&payment, PaymentState::Captured);
        assert!(record_payment(store, &held, &captured).await);
        assert!(record_refund(store, &held, &payment).await);
        let (order, _) = found_by_owner(store, &held).await;
        assert_eq!(
            (order.status, order.refunded_from),
            (OrderStatus::Refunded, Some(status)),
            "{buyer}: the refund records where from"
        );
        refunded.push((held, payment, captured, status));
    }
    let (alices, alices_payment, _, _) = &refunded[0];
    assert!(
        !reopen_refund(store, alices, &payment_id("mallory"), OrderStatus::Expired).await,
        "not the order's payment"
    );
    assert!(
        !reopen_refund(store, alices, alices_payment, OrderStatus::Cancelled).await,
        "not where it was refunded from"
    );
    assert_eq!(status_of(store, alices).await, Some(OrderStatus::Refunded));
    for (held, payment, captured, status) in &refunded {
        for attempt in ["reopen", "reopen again"] {
            assert!(
                reopen_refund(store, held, payment, *status).await,
                "{status}: {attempt}"
            );
        }
        let (order, _) = found_by_owner(store, held).await;
        assert_eq!(order.status, *status);
        assert_eq!(order.refunded_from, None);
        assert_eq!(order.payment.as_ref(), Some(captured), "still captured");
    }
    let after = counts(store, &sale).await;
    assert_eq!(
        (after.available, after.refund_pending, after.refunded),
        (4, 2, 0),
        "{after:?}"
    );
    assert!(
        !consistent(&sale, after),
        "money not back is not consistent until it is"
    );
    assert_eq!(stock(store, &sale).await, vec![4], "the units stay back");
    let unsettled = store
        .unsettled_payments(&sale)
        .await
        .expect("the unsettled payments");
    assert_eq!(unsettled.len(), 2, "both are the reconciler's again");

    // Refunded again, and reopened again: the refund records where from each time.
    let (alices, alices_payment, _, _) = &refunded[0];
    assert!(record_refund(store, alices, alices_payment).await);
    assert!(reopen_refund(store, alices, alices_payment, OrderStatus::Expired).await);

    let open = reserved(store, &sale, "carol", 0).await;
    let carols = attached(store, &open, "carol").await;
    assert!(
        !reopen_refund(store, &open, &carols, OrderStatus::Expired).await,
        "an open order was never refunded"
    );
    assert_eq!(status_of(store, &open).await, Some(OrderStatus::Reserved));
}

/// `OrderPayments::fail_payment`: a paid order whose own payment is recorded cancelled
/// (its authorisation gone before the capture) becomes `payment_failed` and its unit
/// goes back, once however often asked, and the buyer's limit is free again; an order
/// whose payment is recorded authorised, another payment, or an open order is refused
/// and nothing changes.
pub async fn fail_payment_gives_a_paid_orders_unit_back_once_its_payment_is_recorded_cancelled<
    S: Store,
>(
    store: &S,
) {
    let sale = new_sale(store, 3, 1, 1).await;
    let held = reserved(store, &sale, "alice", 0).await;
    let payment = attached(store, &held, "alice").await;
    let authorised = payment_in(&payment, PaymentState::Authorised);
    assert_eq!(
        pay_with(store, &held, &authorised, during(&sale)).await,
        PayOutcome::Paid
    );
    let now = during(&sale);
    let fail = |held: &Reservation, id: &PaymentId| {
        let (held, id) = (held.clone(), id.clone());
        async move { store.fail_payment(&held, &id, now).await.expect("fail") }
    };
    assert!(
        !fail(&held, &payment).await,
        "its payment is still authorised"
    );
    let cancelled = payment_in(&payment, PaymentState::Cancelled);
    assert!(record_payment(store, &held, &cancelled).await);
    assert!(
        !fail(&held, &payment_id("mallory")).await,
        "not the order's payment"
    );
    assert_eq!(status_of(store, &held).await, Some(OrderStatus::Paid));
    assert_eq!(stock(store, &sale).await, vec![2]);

    assert!(fail(&held, &payment).await);
    assert!(
        !fail(&held, &payment).await,
        "failed before: not counted again"
    );
    let (order, _) = found_by_owner(store, &held).await;
    assert_eq!(order.status, OrderStatus::PaymentFailed);
    assert_eq!(order.payment, Some(cancelled));
    assert_eq!(stock(store, &sale).await, vec![3], "the unit back, once");
    let after = counts(store, &sale).await;
    assert_eq!(
        (
            after.available,
            after.paid,
            after.payment_failed,
            after.capture_pending
        ),
        (3, 0, 1, 0),
        "{after:?}"
    );
    assert!(consistent(&sale, after), "{after:?}");
    assert!(
        store
            .unsettled_payments(&sale)
            .await
            .expect("the unsettled payments")
            .is_empty(),
        "nothing left to settle"
    );
    assert!(
        store
            .unaccounted_takes(&sale)
            .await
            .expect("the takes")
            .is_empty(),
        "the take went with the unit"
    );
    // The buyer's limit of one counts the failed order no more.
    reserved(store, &sale, "alice", 0).await;

    let open = reserved(store, &sale, "bob", 0).await;
    let bobs = attached(store, &open, "bob").await;
    assert!(record_payment(store, &open, &payment_in(&bobs, PaymentState::Cancelled)).await);
    assert!(!fail(&open, &bobs).await, "an open order was never paid");
    assert_eq!(status_of(store, &open).await, Some(OrderStatus::Reserved));
}

/// `OrderPayments::follow_money`, `unfollow_money` and `followed_money`: each followed
/// order is listed once, with its buyer and its first `since` however often it is
/// followed again, whatever its sale's age, until it is unfollowed as last read; an
/// unfollow decided on a read older than a follow leaves it followed; unfollowing one
/// not followed changes nothing.
pub async fn followed_money_lists_each_followed_order_once_since_its_first_follow<S: Store>(
    store: &S,
) {
    let sale = new_sale(store, 3, 1, 1).await;
    assert!(store.followed_money().await.expect("followed").is_empty());
    let alices = reserved(store, &sale, "alice", 0).await;
    let bobs = reserved(store, &sale, "bob", 0).await;
    let first = during(&sale);
    let later = first + Duration::days(3);
    for (held, since) in [(&alices, first), (&bobs, first), (&alices, later)] {
        store.follow_money(held, since).await.expect("follow");
    }
    let read = followed_by_buyer(store).await;
    assert_eq!(
        read.iter()
            .map(|money| (&money.order_id, &money.buyer, money.since))
            .collect::<Vec<_>>(),
        [&alices, &bobs].map(|held| (&held.order_id, &held.user_id, first)),
        "once each, since the first follow"
    );
    let (alices_read, bobs_read) = (&read[0], &read[1]);

    // Alice's is followed again after the read: the unfollow decided on it keeps it.
    store.follow_money(&alices, later).await.expect("follow");
    store.unfollow_money(alices_read).await.expect("unfollow");
    let reread = followed_by_buyer(store).await;
    assert_eq!(reread.len(), 2, "followed again since the read: {reread:?}");
    for _ in ["unfollow", "unfollow again"] {
        store.unfollow_money(&reread[0]).await.expect("unfollow");
    }
    let never = FollowedMoney {
        order_id: reservation(&sale, "carol", 0).order_id,
        ..bobs_read.clone()
    };
    store
        .unfollow_money(&never)
        .await
        .expect("unfollow one never followed");
    assert_eq!(
        followed_by_buyer(store).await,
        std::slice::from_ref(bobs_read)
    );
}

async fn followed_by_buyer(store: &impl OrderPayments) -> Vec<FollowedMoney> {
    let mut followed = store.followed_money().await.expect("followed");
    followed.sort_by(|a, b| a.buyer.cmp(&b.buyer));
    followed
}

/// `OrderPayments::record_refund`: a cancelled or expired order with its own payment
/// becomes `refunded`, once, however often asked; a paid or open order, or another
/// payment, is refused and nothing changes. The unit came back at the release, and
/// stays back.
pub async fn record_refund_moves_a_released_order_with_its_payment_to_refunded_once<S: Store>(
    store: &S,
) {
    let sale = new_sale(store, 4, 1, 1).await;
    let expired = reserved(store, &sale, "alice", 0).await;
    let alices = attached(store, &expired, "alice").await;
    assert_eq!(
        release(store, &expired, ReleaseReason::Expired).await,
        Settlement::Applied
    );
    let captured = payment_in(&alices, PaymentState::Captured);
    assert!(record_payment(store, &expired, &captured).await);
    let before = counts(store, &sale).await;
    assert_eq!(
        (before.expired, before.refund_pending, before.refunded),
        (1, 1, 0),
        "{before:?}"
    );

    assert!(
        !record_refund(store, &expired, &payment_id("mallory")).await,
        "not the order's payment"
    );
    assert_eq!(status_of(store, &expired).await, Some(OrderStatus::Expired));
    for attempt in ["record", "record again"] {
        assert!(record_refund(store, &expired, &alices).await, "{attempt}");
    }
    let (order, found) = found_by_owner(store, &expired).await;
    assert_eq!(found, expired);
    assert_eq!(order.status, OrderStatus::Refunded);
    assert_eq!(order.payment, Some(captured), "the payment's record stays");
    let after = counts(store, &sale).await;
    assert_eq!(
        after,
        StockCounts {
            available: 4,
            refunded: 1,
            ..StockCounts::default()
        },
        "refunded, no longer expired, nothing pending"
    );
    assert!(consistent(&sale, after));
    assert_eq!(
        stock(store, &sale).await,
        vec![4],
        "the unit came back once"
    );

    let cancelled = reserved(store, &sale, "bob", 0).await;
    let bobs = attached(store, &cancelled, "bob").await;
    assert_eq!(
        release(store, &cancelled, ReleaseReason::Cancelled).await,
        Settlement::Applied
    );
    assert!(
        !record_refund(store, &cancelled, &bobs).await,
        "no money recorded captured, so none to have refunded"
    );
    assert_eq!(
        status_of(store, &cancelled).await,
        Some(OrderStatus::Cancelled)
    );
    assert!(
        record_payment(
            store,
            &cancelled,
            &payment_in(&bobs, PaymentState::Captured)
        )
        .await
    );
    assert!(record_refund(store, &cancelled, &bobs).await);
    assert_eq!(
        status_of(store, &cancelled).await,
        Some(OrderStatus::Refunded)
    );

    let paid = reserved(store, &sale, "carol", 0).await;
    let carols = attached(store, &paid, "carol").await;
    let carols_captured = payment_in(&carols, PaymentState::Captured);
    assert_eq!(
        pay_with(store, &paid, &carols_captured, during(&sale)).await,
        PayOutcome::Paid
    );
    let open = reserved(store, &sale, "dave", 0).await;
    let daves = attached(store, &open, "dave").await;
    for (held, id, status, what) in [
        (&paid, &carols, OrderStatus::Paid, "a paid order"),
        (&open, &daves, OrderStatus::Reserved, "an open order"),
    ] {
        assert!(!record_refund(store, held, id).await, "{what}");
        assert_eq!(status_of(store, held).await, Some(status), "{what}");
    }
    let released_without = reserved(store, &sale, "erin", 0).await;
    assert_eq!(
        release(store, &released_without, ReleaseReason::Expired).await,
        Settlement::Applied
    );
    assert!(
        !record_refund(store, &released_without, &payment_id("erin")).await,
        "an order without a payment"
    );
    assert_eq!(
        status_of(store, &released_without).await,
        Some(OrderStatus::Expired)
    );
    assert!(!record_refund(store, &reservation(&sale, "frank", 0), &daves).await);

    let counts = counts(store, &sale).await;
    assert_eq!(
        counts,
        StockCounts {
            available: 2,
            reserved: 1,
            paid: 1,
            expired: 1,
            refunded: 2,
            ..StockCounts::default()
        }
    );
    assert!(consistent(&sale, counts));
}

/// The next of `buyers`' orders in `sale`, held on the buyer's own shard: the order
/// and the buyer's name.
async fn next_buyer(
    store: &impl StockLedger,
    sale: &Sale,
    buyers: &mut std::ops::RangeFrom<u32>,
) -> (Reservation, String) {
    let name = format!("buyer-{}", buyers.next().unwrap_or_default());
    let held = reserved(store, sale, &name, sale.bucket_of(&user(&name))).await;
    (held, name)
}

/// `OrderPayments::unsettled_payments`: open with a payment; paid with a payment not
/// recorded captured; cancelled or expired with a payment not recorded cancelled. No
/// order without a payment, and none a settlement finished.
pub async fn unsettled_payments_lists_exactly_the_orders_a_settlement_has_not_finished<S: Store>(
    store: &S,
) {
    // A unit for every buyer on either shard, wherever their buckets put them.
    let sale = new_sale(store, 20, 2, 1).await;
    let now = during(&sale);
    let mut buyers = 0..;
    let mut listed = Vec::new();

    let (_open_without, _) = next_buyer(store, &sale, &mut buyers).await;
    let (open_with, name) = next_buyer(store, &sale, &mut buyers).await;
    attached(store, &open_with, &name).await;
    listed.push(open_with);

    let (paid_authorised, name) = next_buyer(store, &sale, &mut buyers).await;
    let id = attached(store, &paid_authorised, &name).await;
    let authorised = payment_in(&id, PaymentState::Authorised);
    assert_eq!(
        pay_with(store, &paid_authorised, &authorised, now).await,
        PayOutcome::Paid
    );
    listed.push(paid_authorised);

    let (paid_captured, name) = next_buyer(store, &sale, &mut buyers).await;
    let id = attached(store, &paid_captured, &name).await;
    let authorised = payment_in(&id, PaymentState::Authorised);
    assert_eq!(
        pay_with(store, &paid_captured, &authorised, now).await,
        PayOutcome::Paid
    );
    assert!(
        record_payment(
            store,
            &paid_captured,
            &payment_in(&id, PaymentState::Captured)
        )
        .await
    );

    for (reason, recorded) in [
        (ReleaseReason::Cancelled, None),
        (ReleaseReason::Expired, Some(PaymentState::Authorised)),
        (ReleaseReason::Expired, Some(PaymentState::Captured)),
    ] {
        let (released, name) = next_buyer(store, &sale, &mut buyers).await;
        let id = attached(store, &released, &name).await;
        assert_eq!(release(store, &released, reason).await, Settlement::Applied);
        if let Some(state) = recorded {
            assert!(record_payment(store, &released, &payment_in(&id, state)).await);
        }
        listed.push(released);
    }

    let (cancelled_settled, name) = next_buyer(store, &sale, &mut buyers).await;
    let id = attached(store, &cancelled_settled, &name).await;
    release(store, &cancelled_settled, ReleaseReason::Cancelled).await;
    assert!(
        record_payment(
            store,
            &cancelled_settled,
            &payment_in(&id, PaymentState::Cancelled)
        )
        .await
    );

    let (refunded, name) = next_buyer(store, &sale, &mut buyers).await;
    let id = attached(store, &refunded, &name).await;
    release(store, &refunded, ReleaseReason::Expired).await;
    assert!(record_payment(store, &refunded, &payment_in(&id, PaymentState::Captured)).await);
    assert!(record_refund(store, &refunded, &id).await);

    let (expired_without, _) = next_buyer(store, &sale, &mut buyers).await;
    release(store, &expired_without, ReleaseReason::Expired).await;

    let mut expected = Vec::new();
    for held in &listed {
        expected.push(found_by_owner(store, held).await);
    }
    expected.sort_by(|a, b| a.0.order_id.cmp(&b.0.order_id));
    let mut unsettled = store
        .unsettled_payments(&sale)
        .await
        .expect("unsettled payments");
    unsettled.sort_by(|a, b| a.0.order_id.cmp(&b.0.order_id));
    assert_eq!(
        unsettled
            .iter()
            .map(|(order, _)| (&order.order_id, order.status, &order.payment))
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|(order, _)| (&order.order_id, order.status, &order.payment))
            .collect::<Vec<_>>(),
        "the orders, their statuses and their payments"
    );
    assert_eq!(
        unsettled
            .iter()
            .map(|(_, reservation)| reservation)
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|(_, reservation)| reservation)
            .collect::<Vec<_>>(),
        "with their reservations"
    );
    assert!(
        unsettled.iter().all(|(order, _)| order.payment.is_some()),
        "each with its payment"
    );

    let other = crate::testing::sale(2, 1).id("another-sale").build();
    created(store, &other).await;
    assert!(
        store
            .unsettled_payments(&other)
            .await
            .expect("unsettled payments")
            .is_empty(),
        "another sale's orders are not listed"
    );
}

/// `ProviderEvents`: an event is recorded processed by one call, however many
/// deliveries race; from then on it reads processed. Events are independent.
pub async fn a_provider_event_is_recorded_processed_once<S: Store>(store: &S) {
    let now = during(&sale(1, 1).build());
    let (first, second) = ("evt_first", "evt_second");
    assert!(!store.was_processed(first).await.expect("read"));
    assert!(store.record_processed(first, now).await.expect("record"));
    assert!(
        !store
            .record_processed(first, now)
            .await
            .expect("record again"),
        "another delivery recorded it first"
    );
    assert!(store.was_processed(first).await.expect("read"));
    assert!(
        !store.was_processed(second).await.expect("read"),
        "events are independent"
    );

    let racing = join_all((0..5).map(|_| store.record_processed(second, now))).await;
    let recorded = racing
        .iter()
        .filter(|answer| matches!(answer, Ok(true)))
        .count();
    assert_eq!(recorded, 1, "five deliveries, one recorded: {racing:?}");
    assert!(racing.iter().all(Result::is_ok), "{racing:?}");
    assert!(store.was_processed(second).await.expect("read"));
}

async fn sorted_blocked(blocklist: &impl Blocklist) -> Vec<UserId> {
    let mut users = blocklist.blocked().await.expect("read the blocklist");
    users.sort();
    users
}

/// `Blocklist`: block and unblock are idempotent, and `blocked` names each blocked
/// user once, whatever characters the id holds.
pub async fn blocking_and_unblocking_are_idempotent_and_the_list_names_each_user_once<
    B: Blocklist,
>(
    blocklist: &B,
) {
    assert!(sorted_blocked(blocklist).await.is_empty(), "empty at first");
    let (alice, bob) = (user("alice"), user("bob"));
    let odd = user("auth0|user#42 Ünïcode");
    for blocked in [&alice, &bob, &alice, &odd] {
        blocklist.block(blocked).await.expect("block");
    }
    let mut expected = vec![alice.clone(), bob.clone(), odd.clone()];
    expected.sort();
    assert_eq!(sorted_blocked(blocklist).await, expected);

    for unblocked in [&alice, &alice, &user("never-blocked"), &odd] {
        blocklist.unblock(unblocked).await.expect("unblock");
    }
    assert_eq!(sorted_blocked(blocklist).await, vec![bob.clone()]);
    blocklist.unblock(&bob).await.expect("unblock");
    assert!(sorted_blocked(blocklist).await.is_empty());
}
