//! The history checks that the simulation and the local stack's surges share (issue
//! 48): what every buyer's grab was told in the end, against the sale's holds, shards
//! and takes read after it. The simulation reads them from its in-memory store; the
//! surges (`tests/tests/sold_out_under_faults.rs`) from DynamoDB Local, through the
//! same ports.
//!
//! What each caller adds is what only it can know: the simulation when each unit came
//! back (so a "sold out" is judged against the gate's interval) and the money; a surge
//! what it injected.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::StoreError;
use crate::ids::{OrderId, UserId};
use crate::order::{Order, OrderStatus, Reservation};
use crate::ports::{OrderBook, StockLedger, Take};
use crate::sale::Sale;

/// What one grab (one click, retries included) was told in the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Told {
    /// 202: this order holds a unit for the buyer.
    Held(OrderId),
    /// 409 `sold_out`.
    SoldOut,
    /// 409 `order_expired`, `order_cancelled` or `order_paid`: the path's order (a
    /// retry's, whose first try held it) had settled.
    Settled(OrderId),
    /// Any other refusal, by its error code.
    Refused(String),
    /// The client stopped retrying failures (503s, lost answers, dead invocations):
    /// whether the grab held is unknown to the buyer.
    InDoubt,
}

/// The sale as the checks read it, after the answers.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Every order of the sale, with the hold behind it.
    pub holds: Vec<(Order, Reservation)>,
    /// Units on each shard, index = shard.
    pub available: Vec<u64>,
    /// Takes no open or paid hold accounts for.
    pub takes_without_hold: Vec<Take>,
}

/// Orders read per page of [`OrderBook::sale_orders`].
const BUYERS_PER_PAGE: usize = 100;

impl Ledger {
    /// Reads the sale through the ports: every order (paged), each one's hold, the
    /// shards and the takes without a hold.
    pub async fn read(
        store: &(impl OrderBook + StockLedger),
        sale: &Sale,
    ) -> Result<Self, StoreError> {
        let mut holds = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .sale_orders(sale, after.as_ref(), BUYERS_PER_PAGE)
                .await?;
            for order in page.orders {
                if let Some(held) = store.find(&order.order_id, &order.user_id).await? {
                    holds.push(held);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(Self {
            holds,
            available: store.availability(sale).await?,
            takes_without_hold: store.unaccounted_takes(sale).await?,
        })
    }

    fn units_in(&self, status: OrderStatus) -> u64 {
        self.holds
            .iter()
            .filter(|(order, _)| order.status == status)
            .count() as u64
    }
}

/// When the ledger was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// Right after the last answer: holds may still be open.
    AfterTheAnswers,
    /// Once every deadline passed and the repairs ran: every hold has ended, and no
    /// take lacks its hold.
    Quiescent,
}

/// A hold the reconciler recorded for a take no grab finished: settled as expired at
/// the instant of the take, and sold to no one (see [`Take::as_lapsed_reservation`]).
fn voided(held: &Reservation) -> bool {
    held.expires_at == held.created_at && held.price.is_none()
}

/// Everything `told` and `ledger` say together that a correct sale cannot: an oversell,
/// a unit unaccounted for, a buyer over the limit, a 202 that holds nothing, a hold no
/// grab answered for with a 202 or its fate (unless its buyer's client gave up in
/// doubt), and, once
/// quiescent, a hold still open or a take without its hold. Each in words.
pub fn check(sale: &Sale, told: &[(UserId, Told)], ledger: &Ledger, moment: Moment) -> Vec<String> {
    let mut found = Vec::new();
    let stock = u64::from(sale.stock_total);
    let (reserved, paid) = (
        ledger.units_in(OrderStatus::Reserved),
        ledger.units_in(OrderStatus::Paid),
    );
    let available: u64 = ledger.available.iter().sum();
    let loose = ledger.takes_without_hold.len() as u64;
    if reserved + paid > stock {
        found.push(format!(
            "oversold: {reserved} held and {paid} paid of {stock}"
        ));
    }
    if available + loose + reserved + paid != stock {
        found.push(format!(
            "units not conserved: {available} on the shards {:?}, {loose} taken without a hold, {reserved} held, {paid} paid, of {stock}",
            ledger.available
        ));
    }
    let mut units_of: BTreeMap<&UserId, u32> = BTreeMap::new();
    for (order, _) in &ledger.holds {
        if order.status.is_open() || order.status == OrderStatus::Paid {
            *units_of.entry(&order.user_id).or_default() += 1;
        }
    }
    for (user, units) in units_of {
        if units > sale.per_user_limit {
            found.push(format!(
                "{user} holds {units} units, over the limit of {}",
                sale.per_user_limit
            ));
        }
    }
    let hold_of = |order_id: &OrderId| {
        ledger
            .holds
            .iter()
            .find(|(order, _)| order.order_id == *order_id)
    };
    let mut answered: BTreeSet<&OrderId> = BTreeSet::new();
    let mut in_doubt: BTreeSet<&UserId> = BTreeSet::new();
    for (user, answer) in told {
        match answer {
            Told::Held(order_id) => {
                answered.insert(order_id);
                match hold_of(order_id) {
                    Some((order, _)) if order.user_id != *user => found.push(format!(
                        "{user} was told 202 for {order_id}, which {} holds",
                        order.user_id
                    )),
                    Some((order, _)) if moment == Moment::Quiescent && order.status.is_open() => {
                        found.push(format!(
                            "{user} was told 202 for {order_id}, still {:?} after every deadline",
                            order.status
                        ));
                    }
                    Some(_) => {}
                    None => found.push(format!(
                        "{user} was told 202 for {order_id}, which holds nothing"
                    )),
                }
            }
            Told::Settled(order_id) => {
                answered.insert(order_id);
                match hold_of(order_id) {
                    Some((order, _)) if order.user_id == *user && !order.status.is_open() => {}
                    held => found.push(format!(
                        "{user} was told {order_id} had settled: {:?}",
                        held.map(|(order, _)| (&order.user_id, order.status))
                    )),
                }
            }
            Told::InDoubt => {
                in_doubt.insert(user);
            }
            Told::SoldOut | Told::Refused(_) => {}
        }
    }
    for (order, held) in &ledger.holds {
        if !voided(held)
            && !answered.contains(&order.order_id)
            && !in_doubt.contains(&order.user_id)
        {
            found.push(format!(
                "{} holds {} ({:?}) though no grab answered for it",
                order.user_id, order.order_id, order.status
            ));
        }
    }
    if moment == Moment::Quiescent {
        if reserved != 0 {
            found.push(format!(
                "{reserved} hold(s) still open after every deadline"
            ));
        }
        if loose != 0 {
            found.push(format!(
                "takes without a hold after every repair: {:?}",
                ledger.takes_without_hold
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, TimeZone, Utc};

    use super::*;
    use crate::ports::SaleCatalog;
    use crate::testing::{self, InMemoryStore};

    async fn a_sale(stock: i64, limit: i64) -> (InMemoryStore, Sale) {
        let store = InMemoryStore::new();
        let sale = testing::sale(stock, 1)
            .starting_at(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap())
            .per_user_limit(limit)
            .build();
        assert!(store.create_sale(&sale).await.unwrap());
        (store, sale)
    }

    fn held_by(sale: &Sale, user: &str) -> Reservation {
        let now = sale.starts_at + Duration::seconds(1);
        Reservation {
            order_id: OrderId::new(sale.sale_id.clone()),
            sale_id: sale.sale_id.clone(),
            user_id: UserId::parse(user).unwrap(),
            shard: 0,
            created_at: now,
            expires_at: sale.payment_deadline(now),
            price: sale.price,
        }
    }

    async fn reserved(store: &InMemoryStore, sale: &Sale, user: &str) -> Reservation {
        let held = held_by(sale, user);
        store.reserve(sale, 0, &held).await.unwrap().unwrap();
        held
    }

    async fn found(store: &InMemoryStore, sale: &Sale, told: &[(UserId, Told)]) -> Vec<String> {
        let ledger = Ledger::read(store, sale).await.unwrap();
        check(sale, told, &ledger, Moment::AfterTheAnswers)
    }

    fn winner(held: &Reservation) -> (UserId, Told) {
        (held.user_id.clone(), Told::Held(held.order_id.clone()))
    }

    #[tokio::test]
    async fn a_sale_that_kept_its_word_passes() {
        let (store, sale) = a_sale(2, 1).await;
        let alice = reserved(&store, &sale, "alice").await;
        let bob = reserved(&store, &sale, "bob").await;
        let told = [
            winner(&alice),
            winner(&bob),
            (UserId::parse("carol").unwrap(), Told::SoldOut),
        ];
        assert_eq!(found(&store, &sale, &told).await, Vec::<String>::new());
    }

    #[tokio::test]
    async fn an_oversell_is_found() {
        let (store, sale) = a_sale(1, 1).await;
        let alice = reserved(&store, &sale, "alice").await;
        let bob = held_by(&sale, "bob");
        store.force_hold(&sale, &bob);
        let found = found(&store, &sale, &[winner(&alice), winner(&bob)]).await;
        assert!(found.iter().any(|f| f.starts_with("oversold")), "{found:?}");
        assert!(
            found.iter().any(|f| f.starts_with("units not conserved")),
            "{found:?}"
        );
    }

    #[tokio::test]
    async fn a_202_that_holds_nothing_and_a_hold_nobody_was_told_of_are_found() {
        let (store, sale) = a_sale(2, 1).await;
        let alice = reserved(&store, &sale, "alice").await;
        let never_held = held_by(&sale, "bob");
        let found = found(&store, &sale, &[winner(&never_held)]).await;
        assert!(
            found.iter().any(|f| f.contains("holds nothing")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|f| f.contains(&format!(
                "holds {} (Reserved) though no grab",
                alice.order_id
            ))),
            "{found:?}"
        );
    }

    #[tokio::test]
    async fn a_hold_of_a_buyer_left_in_doubt_is_theirs_to_have() {
        let (store, sale) = a_sale(2, 1).await;
        let alice = reserved(&store, &sale, "alice").await;
        let told = [(alice.user_id.clone(), Told::InDoubt)];
        assert_eq!(found(&store, &sale, &told).await, Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_buyer_over_the_limit_is_found() {
        let (store, sale) = a_sale(3, 1).await;
        let first = reserved(&store, &sale, "alice").await;
        let second = held_by(&sale, "alice");
        store.strand(&sale, &second);
        let found = found(&store, &sale, &[winner(&first), winner(&second)]).await;
        assert!(
            found
                .iter()
                .any(|f| f == "alice holds 2 units, over the limit of 1"),
            "{found:?}"
        );
    }

    #[tokio::test]
    async fn once_quiescent_an_open_hold_and_a_take_without_one_are_found() {
        let (store, sale) = a_sale(3, 1).await;
        let alice = reserved(&store, &sale, "alice").await;
        let loose = held_by(&sale, "bob");
        store.leave_take(
            &sale,
            Take {
                shard: 0,
                order_id: loose.order_id.clone(),
                user_id: loose.user_id.clone(),
                taken_at: loose.created_at,
            },
        );
        let ledger = Ledger::read(&store, &sale).await.unwrap();
        let told = [winner(&alice), (loose.user_id.clone(), Told::InDoubt)];
        assert_eq!(
            check(&sale, &told, &ledger, Moment::AfterTheAnswers),
            Vec::<String>::new()
        );
        let found = check(&sale, &told, &ledger, Moment::Quiescent);
        assert!(
            found
                .iter()
                .any(|f| f.contains("still Reserved after every deadline")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|f| f.starts_with("1 hold(s) still open")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|f| f.starts_with("takes without a hold")),
            "{found:?}"
        );
    }
}
