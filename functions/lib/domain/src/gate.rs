//! The in-memory sold-out gate: the last funnel layer before the database.
//!
//! After a sale sells out, most grabs would still reach DynamoDB and fail a condition,
//! which costs a write each. The gate remembers, per process, which shards are known
//! to be empty and since when. Grabs only write to shards not known empty; while every
//! shard of a sale is known empty, grabs are refused in memory, at no cost.
//!
//! Released stock must not be stranded, so a mark goes stale after `recheck_after`.
//! The grab that first sees a stale mark gets the sale's one [`Recheck`] turn: a single
//! eventually consistent read of every shard's stock, whose answer clears the marks of
//! the shards with stock and renews the others. That grab runs the read itself and
//! then tries what it reopened, so its answer is true. Not in the background: Lambda
//! freezes the environment once an invocation answers, and a read left running then
//! would keep the turn (and stale marks) until the next invocation thaws it. So a
//! process spends at most one read per sale per interval on a sold-out sale, no write
//! at all, and stock that comes back is sold within about one interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Duration, Utc};

use crate::error::StoreError;
use crate::ids::{OrderId, SaleId};
use crate::order::Reservation;
use crate::ports::{ShardState, ShardTakers};

/// How often the doubts older than a grab path are dropped.
const DOUBT_PRUNE_EVERY: Duration = Duration::minutes(1);

/// One process's marks, shared with the rechecks it hands out.
#[derive(Debug, Clone)]
pub struct SoldOutGate {
    recheck_after: Duration,
    sales: Arc<Mutex<HashMap<SaleId, SaleMarks>>>,
}

#[derive(Debug, Default)]
struct SaleMarks {
    /// Per shard: when it was last seen empty, or `None` if it is worth a write.
    empty_since: Vec<Option<DateTime<Utc>>>,
    /// Per shard seen empty: the orders holding its units then. A reserve takes its
    /// unit before it records the buyer's hold, so a grab whose answer was lost may
    /// have a take on a shard that is empty now; its retry finds it here, in memory.
    takers: Vec<ShardTakers>,
    /// Orders whose last grab in this process gave up with a reserve's outcome unknown
    /// on a shard (the key's value), and since when: that request's take may have
    /// landed there without its hold, and only a reserve on that same shard finds and
    /// finishes it. The order's next request, with or without the retry header, goes
    /// there first instead of taking a second unit elsewhere.
    in_doubt: HashMap<OrderId, (u16, DateTime<Utc>)>,
    /// When `in_doubt` was last pruned: once a minute is enough to bound it, where
    /// every insert would walk all of it.
    doubts_pruned_at: Option<DateTime<Utc>>,
    /// A [`Recheck`] of this sale is out, so no other is handed out.
    rechecking: bool,
    /// When the last recheck failed to read: a failing store is asked once an interval,
    /// not once a grab, and the stale marks meanwhile say nothing (see
    /// [`GatePlan::stale`]).
    recheck_failed_at: Option<DateTime<Utc>>,
    /// Per shard: the takes this process has in flight on it (see [`TakeSlot`]).
    in_flight: Vec<u32>,
    /// Takes no one holds (their order is held on another shard) whose give-back
    /// failed: the next grab of the sale in this process gives them back.
    parked: Vec<(Reservation, u16)>,
}

impl SaleMarks {
    /// Some shard's mark is older than `recheck_after` at `now`.
    fn stale_at(&self, now: DateTime<Utc>, recheck_after: Duration) -> bool {
        self.empty_since
            .iter()
            .flatten()
            .any(|since| now - *since >= recheck_after)
    }

    /// The shard exists and is not known to be empty.
    fn worth_a_write(&self, shard: u16) -> bool {
        self.empty_since
            .get(usize::from(shard))
            .is_some_and(Option::is_none)
    }
}

/// What the gate lets one grab do.
#[derive(Debug)]
pub struct GatePlan {
    /// The shards worth a write, in the grab's order of preference. Empty: refuse.
    pub shards: Vec<u16>,
    /// This grab's turn to recheck the sale's stale marks, if it has it.
    pub recheck: Option<Recheck>,
    /// Some mark is older than the recheck interval: what it says empty may have had a
    /// unit back since (a cancel, a lapse), so it keeps writes away from that shard,
    /// but it cannot answer "sold out".
    pub stale: bool,
}

impl SoldOutGate {
    pub fn new(recheck_after: Duration) -> Self {
        Self {
            recheck_after,
            sales: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn with_marks<T>(
        &self,
        sale_id: &SaleId,
        shards: u16,
        f: impl FnOnce(&mut SaleMarks) -> T,
    ) -> T {
        let mut sales = lock(&self.sales);
        let marks = sales.entry(sale_id.clone()).or_default();
        marks.empty_since.resize(usize::from(shards), None);
        marks
            .takers
            .resize(usize::from(shards), ShardTakers::default());
        marks.in_flight.resize(usize::from(shards), 0);
        f(marks)
    }

    /// The shards of `preference` not known to be empty, and, if some mark of the sale
    /// has gone stale and no recheck is out, the turn to recheck them.
    pub fn plan(
        &self,
        sale_id: &SaleId,
        shards: u16,
        preference: impl Iterator<Item = u16>,
        now: DateTime<Utc>,
    ) -> GatePlan {
        self.with_marks(sale_id, shards, |marks| {
            let shards = preference
                .filter(|&shard| marks.worth_a_write(shard))
                .collect();
            let stale = marks.stale_at(now, self.recheck_after);
            let failed_lately = marks
                .recheck_failed_at
                .is_some_and(|failed| now - failed < self.recheck_after);
            let recheck = (stale && !marks.rechecking && !failed_lately).then(|| {
                marks.rechecking = true;
                Recheck {
                    gate: self.clone(),
                    sale_id: sale_id.clone(),
                }
            });
            GatePlan {
                shards,
                recheck,
                stale,
            }
        })
    }

    /// Whether some mark of the sale was older than the recheck interval at `at`: a
    /// grab that began then cannot answer "sold out" on it (see [`GatePlan::stale`]).
    pub fn has_stale_marks(&self, sale_id: &SaleId, shards: u16, at: DateTime<Utc>) -> bool {
        self.with_marks(sale_id, shards, |marks| {
            marks.stale_at(at, self.recheck_after)
        })
    }

    /// Those of `candidates` (in their order) not known to be empty: what a grab going
    /// round again still has to try, now that other grabs may have marked some.
    pub fn still_worth_a_write(
        &self,
        sale_id: &SaleId,
        shards: u16,
        candidates: Vec<u16>,
    ) -> Vec<u16> {
        self.with_marks(sale_id, shards, |marks| {
            candidates
                .into_iter()
                .filter(|&shard| marks.worth_a_write(shard))
                .collect()
        })
    }

    /// Whether `shard` is not known to be empty: checked again before each write of a
    /// walk, since other grabs may have found it empty since the walk was planned.
    pub fn is_worth_a_write(&self, sale_id: &SaleId, shards: u16, shard: u16) -> bool {
        self.with_marks(sale_id, shards, |marks| marks.worth_a_write(shard))
    }

    /// A slot for one take on `shard`, unless this process has `cap` in flight there.
    ///
    /// Plain writes to one item queue rather than cancel each other, so a crowd on one
    /// shard is not refused by DynamoDB; it is refused by the shard running dry under
    /// it: every take queued behind the last unit fails its condition, and each is a
    /// billed write. Where one environment serves many grabs at once (the local stack,
    /// Lambda Managed Instances), capping its takes in flight per shard bounds that
    /// waste to `cap - 1` per shard; it does not slow the sale while the shards with
    /// stock can take the environment's grabs between them. With one grab per
    /// environment (Lambda's default), the cap never binds.
    pub fn admit(&self, sale_id: &SaleId, shards: u16, shard: u16, cap: u32) -> Option<TakeSlot> {
        self.with_marks(sale_id, shards, |marks| {
            let in_flight = marks.in_flight.get_mut(usize::from(shard))?;
            if *in_flight >= cap.max(1) {
                return None;
            }
            *in_flight += 1;
            Some(TakeSlot {
                gate: self.clone(),
                sale_id: sale_id.clone(),
                shard,
            })
        })
    }

    /// The takes this process has in flight on the sale's shards. A reserve whose hold
    /// is refused gives its take back before it answers, so while one is in flight a
    /// shard seen empty may have a unit again a moment later.
    pub fn takes_in_flight(&self, sale_id: &SaleId, shards: u16) -> u32 {
        self.with_marks(sale_id, shards, |marks| marks.in_flight.iter().sum())
    }

    /// A slot for a take on `shard` whatever the cap: the reserve that finishes a take
    /// this order may already have there is sent whatever the crowd, and counted all
    /// the same.
    pub fn admit_regardless(&self, sale_id: &SaleId, shards: u16, shard: u16) -> TakeSlot {
        self.with_marks(sale_id, shards, |marks| {
            if let Some(in_flight) = marks.in_flight.get_mut(usize::from(shard)) {
                *in_flight += 1;
            }
        });
        TakeSlot {
            gate: self.clone(),
            sale_id: sale_id.clone(),
            shard,
        }
    }

    /// `shard` was seen empty at `now` or later, held by `takers`: callers date what a
    /// call saw by when they sent it, so a mark is never younger than what it saw.
    pub fn mark_empty(
        &self,
        sale_id: &SaleId,
        shards: u16,
        shard: u16,
        takers: ShardTakers,
        now: DateTime<Utc>,
    ) {
        self.with_marks(sale_id, shards, |marks| {
            marks.empty_since[usize::from(shard)] = Some(now);
            marks.takers[usize::from(shard)] = takers;
        });
    }

    /// A take on `shard` sent at `sent_at` landed: the shard had a unit then, so a mark
    /// from before that is stale. A mark since may have seen the last unit go, and stays.
    pub fn mark_stocked_if_seen_empty_before(
        &self,
        sale_id: &SaleId,
        shards: u16,
        shard: u16,
        sent_at: DateTime<Utc>,
    ) {
        self.with_marks(sale_id, shards, |marks| {
            let index = usize::from(shard);
            if marks.empty_since[index].is_some_and(|since| since < sent_at) {
                marks.empty_since[index] = None;
                marks.takers[index] = ShardTakers::default();
            }
        });
    }

    /// `order`'s take on `shard`, if it had one, was given back: a mark that counted it
    /// among the shard's takers is stale, since that unit is on the shard again.
    pub fn reopen_if_taken_by(&self, sale_id: &SaleId, shards: u16, shard: u16, order: &OrderId) {
        self.with_marks(sale_id, shards, |marks| {
            let index = usize::from(shard);
            if marks.empty_since[index].is_some() && marks.takers[index].include(order) {
                marks.empty_since[index] = None;
                marks.takers[index] = ShardTakers::default();
            }
        });
    }

    /// A take on `shard` that no one holds (`held` is its order's hold elsewhere), whose
    /// give-back failed: kept for the next grab of the sale to give back.
    pub fn park_superseded_take(&self, held: &Reservation, shard: u16) {
        let mut sales = lock(&self.sales);
        let marks = sales.entry(held.sale_id.clone()).or_default();
        if !marks
            .parked
            .iter()
            .any(|(parked, at)| parked.order_id == held.order_id && *at == shard)
        {
            marks.parked.push((held.clone(), shard));
        }
    }

    /// The parked takes of the sale, handed to the grab that gives them back.
    pub fn unpark_superseded_takes(
        &self,
        sale_id: &SaleId,
        shards: u16,
    ) -> Vec<(Reservation, u16)> {
        self.with_marks(sale_id, shards, |marks| std::mem::take(&mut marks.parked))
    }

    pub fn mark_stocked(&self, sale_id: &SaleId, shards: u16, shard: u16) {
        self.with_marks(sale_id, shards, |marks| {
            marks.empty_since[usize::from(shard)] = None;
            marks.takers[usize::from(shard)] = ShardTakers::default();
        });
    }

    /// The shard on which `order` may have a take whose hold is missing, for a reserve
    /// there to finish: where its last grab here gave up in doubt, or else a shard
    /// known empty that `order` held a unit of when it was seen so.
    pub fn shard_taken_by(&self, sale_id: &SaleId, shards: u16, order: &OrderId) -> Option<u16> {
        self.with_marks(sale_id, shards, |marks| {
            let in_doubt = marks
                .in_doubt
                .get(order)
                .map(|(shard, _)| *shard)
                .filter(|shard| *shard < shards);
            in_doubt.or_else(|| {
                (0..shards).find(|&shard| {
                    !marks.worth_a_write(shard) && marks.takers[usize::from(shard)].include(order)
                })
            })
        })
    }

    /// A grab of `order` gave up at `now` with its reserve's outcome on `shard` unknown
    /// (`Some`), or ended knowing what happened (`None`). Doubts older than a grab path
    /// lives are dropped as others come: no request of theirs can arrive any more.
    pub fn note_doubt(
        &self,
        sale_id: &SaleId,
        shards: u16,
        order: &OrderId,
        shard: Option<u16>,
        now: DateTime<Utc>,
    ) {
        self.with_marks(sale_id, shards, |marks| match shard {
            Some(shard) => {
                let due = marks
                    .doubts_pruned_at
                    .is_none_or(|pruned| now - pruned >= DOUBT_PRUNE_EVERY);
                if due {
                    marks
                        .in_doubt
                        .retain(|_, (_, since)| now - *since < crate::grab::GRAB_PATH_LIFETIME);
                    marks.doubts_pruned_at = Some(now);
                }
                marks.in_doubt.insert(order.clone(), (shard, now));
            }
            None => {
                marks.in_doubt.remove(order);
            }
        });
    }

    /// Takes in what a read of every shard sent at `now` saw: a recheck's, or a grab's
    /// that waited out a young take.
    pub fn apply(&self, sale_id: &SaleId, states: Vec<ShardState>, now: DateTime<Utc>) {
        let shards = u16::try_from(states.len()).unwrap_or(u16::MAX);
        self.with_marks(sale_id, shards, |marks| {
            for (shard, state) in states.into_iter().enumerate() {
                let empty = state.available == 0;
                marks.empty_since[shard] = empty.then_some(now);
                marks.takers[shard] = if empty {
                    state.takers
                } else {
                    ShardTakers::default()
                };
            }
        });
    }

    /// A recheck that could not read: the next is handed out an interval later. The
    /// marks stay as old as they are: renewing them would let a mark seen long ago
    /// answer "sold out" through a whole outage, with a unit back on the shard.
    fn note_failed_recheck(&self, sale_id: &SaleId, now: DateTime<Utc>) {
        if let Some(marks) = lock(&self.sales).get_mut(sale_id) {
            marks.recheck_failed_at = Some(now);
        }
    }
}

/// The one outstanding recheck of a sale in this process. Dropping it, whether it ran
/// or not, lets the next stale grab take another turn.
#[derive(Debug)]
pub struct Recheck {
    gate: SoldOutGate,
    sale_id: SaleId,
}

impl Recheck {
    /// Takes in the answer of the read of every shard that the holder of this turn made
    /// at `now`. After a read that failed the next recheck waits an interval, so a
    /// failing store is asked once per interval, not once per grab.
    pub fn settle(self, read: Result<Vec<ShardState>, StoreError>, now: DateTime<Utc>) {
        match read {
            Ok(states) => self.gate.apply(&self.sale_id, states, now),
            Err(error) => {
                tracing::warn!(
                    sale_id = %self.sale_id,
                    error = &error as &dyn std::error::Error,
                    "the sold-out recheck could not read the stock; trying again next interval"
                );
                self.gate.note_failed_recheck(&self.sale_id, now);
            }
        }
    }
}

/// One take in flight on a shard, counted by [`SoldOutGate::admit`] until dropped.
#[derive(Debug)]
pub struct TakeSlot {
    gate: SoldOutGate,
    sale_id: SaleId,
    shard: u16,
}

impl Drop for TakeSlot {
    fn drop(&mut self) {
        if let Some(marks) = lock(&self.gate.sales).get_mut(&self.sale_id)
            && let Some(in_flight) = marks.in_flight.get_mut(usize::from(self.shard))
        {
            *in_flight = in_flight.saturating_sub(1);
        }
    }
}

impl Drop for Recheck {
    fn drop(&mut self) {
        if let Some(marks) = lock(&self.gate.sales).get_mut(&self.sale_id) {
            marks.rechecking = false;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another grab panicked mid-update; the marks are
    // hints, so carry on with whatever they hold.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(gate: &SoldOutGate, sale: &SaleId, now: DateTime<Utc>) -> GatePlan {
        gate.plan(sale, 3, [1, 2, 0].into_iter(), now)
    }

    fn states(units: &[u64]) -> Vec<ShardState> {
        units
            .iter()
            .map(|&available| ShardState {
                available,
                takers: ShardTakers::default(),
            })
            .collect()
    }

    #[test]
    fn an_order_holding_a_unit_of_a_shard_seen_empty_is_pointed_back_to_it() {
        let gate = SoldOutGate::new(Duration::seconds(1));
        let sale = SaleId::parse("s").unwrap();
        let (mine, other) = (OrderId::new(sale.clone()), OrderId::new(sale.clone()));
        let t0 = Utc::now();
        gate.mark_empty(&sale, 3, 1, ShardTakers::of([&mine]), t0);
        assert_eq!(gate.shard_taken_by(&sale, 3, &mine), Some(1));
        assert_eq!(gate.shard_taken_by(&sale, 3, &other), None);
        // Stock came back to it: worth a write again, and its takers are forgotten.
        gate.mark_stocked(&sale, 3, 1);
        assert_eq!(gate.shard_taken_by(&sale, 3, &mine), None);
        // A recheck brings the takers of the shards it finds empty.
        gate.apply(
            &sale,
            vec![
                ShardState::default(),
                ShardState {
                    available: 2,
                    takers: ShardTakers::of([&other]),
                },
                ShardState {
                    available: 0,
                    takers: ShardTakers::of([&mine, &other]),
                },
            ],
            t0,
        );
        assert_eq!(gate.shard_taken_by(&sale, 3, &mine), Some(2));
        assert_eq!(gate.shard_taken_by(&sale, 3, &other), Some(2));
    }

    #[test]
    fn an_order_whose_grab_gave_up_in_doubt_is_pointed_back_to_that_shard_until_it_knows() {
        let gate = SoldOutGate::new(Duration::seconds(1));
        let sale = SaleId::parse("s").unwrap();
        let (mine, other) = (OrderId::new(sale.clone()), OrderId::new(sale.clone()));
        let t0 = Utc::now();
        gate.mark_empty(&sale, 3, 1, ShardTakers::of([&mine]), t0);
        // A doubt is where the order's own grab left off, stocked shard or not, and
        // comes before what an empty shard's takers say.
        gate.note_doubt(&sale, 3, &mine, Some(2), t0);
        assert_eq!(gate.shard_taken_by(&sale, 3, &mine), Some(2));
        assert_eq!(gate.shard_taken_by(&sale, 3, &other), None);
        gate.note_doubt(&sale, 3, &mine, None, t0);
        assert_eq!(gate.shard_taken_by(&sale, 3, &mine), Some(1));
        // Doubts outlive no grab path.
        gate.note_doubt(&sale, 3, &other, Some(0), t0);
        let later = t0 + crate::grab::GRAB_PATH_LIFETIME;
        gate.note_doubt(&sale, 3, &mine, Some(2), later);
        assert_eq!(gate.shard_taken_by(&sale, 3, &other), None);
        assert_eq!(gate.shard_taken_by(&sale, 3, &mine), Some(2));
    }

    #[test]
    fn empty_shards_are_skipped_and_a_stale_mark_hands_out_one_recheck() {
        let gate = SoldOutGate::new(Duration::seconds(1));
        let sale = SaleId::parse("s").unwrap();
        let t0 = Utc::now();
        assert_eq!(plan(&gate, &sale, t0).shards, [1, 2, 0]);

        gate.mark_empty(&sale, 3, 2, ShardTakers::default(), t0);
        let fresh = plan(&gate, &sale, t0);
        assert_eq!(fresh.shards, [1, 0]);
        assert!(fresh.recheck.is_none());

        // Stale: still skipped (no write on the request path), and exactly one grab
        // gets the turn to recheck until that turn is over.
        let later = t0 + Duration::milliseconds(1500);
        let first = plan(&gate, &sale, later);
        assert_eq!(first.shards, [1, 0]);
        assert!(first.recheck.is_some());
        assert!(plan(&gate, &sale, later).recheck.is_none());
        drop(first);
        assert!(plan(&gate, &sale, later).recheck.is_some());
    }

    #[test]
    fn a_recheck_reopens_stocked_shards_and_renews_empty_ones() {
        let gate = SoldOutGate::new(Duration::seconds(1));
        let sale = SaleId::parse("s").unwrap();
        let t0 = Utc::now();
        for shard in 0..3 {
            gate.mark_empty(&sale, 3, shard, ShardTakers::default(), t0);
        }
        assert!(plan(&gate, &sale, t0).shards.is_empty());

        let later = t0 + Duration::seconds(2);
        gate.apply(&sale, states(&[0, 4, 0]), later);
        let after = plan(&gate, &sale, later);
        assert_eq!(after.shards, [1]);
        assert!(after.recheck.is_none(), "the empty shards were just seen");

        let failed_at = later + Duration::milliseconds(1_200);
        gate.note_failed_recheck(&sale, failed_at);
        let after_the_failure = plan(&gate, &sale, failed_at + Duration::milliseconds(500));
        assert!(after_the_failure.recheck.is_none(), "one read an interval");
        assert!(after_the_failure.stale, "the old marks cannot say sold out");
        assert!(
            plan(&gate, &sale, failed_at + Duration::seconds(1))
                .recheck
                .is_some()
        );
    }
}
