//! The in-memory sold-out gate: the last funnel layer before the database.
//!
//! After a sale sells out, most grabs would still reach DynamoDB and fail a condition,
//! which costs a write each. The gate remembers, per process, which shards answered
//! "empty" and when. While every shard of a sale is known empty, grabs are refused in
//! memory. Released stock must not be stranded, so a mark only lasts `recheck_after`;
//! the first grab to see a stale mark re-arms it and tries that shard for real, so a
//! process spends at most one write per shard per interval on a sold-out sale.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};

use crate::ids::SaleId;

#[derive(Debug)]
pub struct SoldOutGate {
    recheck_after: Duration,
    empty_since: Mutex<HashMap<SaleId, Vec<Option<DateTime<Utc>>>>>,
}

impl SoldOutGate {
    pub fn new(recheck_after: Duration) -> Self {
        Self {
            recheck_after,
            empty_since: Mutex::new(HashMap::new()),
        }
    }

    fn with_marks<T>(
        &self,
        sale_id: &SaleId,
        shards: u16,
        f: impl FnOnce(&mut Vec<Option<DateTime<Utc>>>) -> T,
    ) -> T {
        // A poisoned lock only means another grab panicked mid-update; the marks are
        // hints, so carry on with whatever they hold.
        let mut sales = self
            .empty_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let marks = sales
            .entry(sale_id.clone())
            .or_insert_with(|| vec![None; usize::from(shards)]);
        marks.resize(usize::from(shards), None);
        f(marks)
    }

    /// The shards of `preference` worth a write now, in that order: those not known to
    /// be empty, and those whose mark has gone stale (re-armed, so concurrent grabs in
    /// this process keep being refused while this one checks).
    pub fn shards_to_try(
        &self,
        sale_id: &SaleId,
        shards: u16,
        preference: impl Iterator<Item = u16>,
        now: DateTime<Utc>,
    ) -> Vec<u16> {
        self.with_marks(sale_id, shards, |marks| {
            preference
                .filter(|&shard| {
                    let mark = &mut marks[usize::from(shard)];
                    match mark {
                        Some(since) if now - *since < self.recheck_after => false,
                        Some(since) => {
                            *since = now;
                            true
                        }
                        None => true,
                    }
                })
                .collect()
        })
    }

    pub fn mark_empty(&self, sale_id: &SaleId, shards: u16, shard: u16, now: DateTime<Utc>) {
        self.with_marks(sale_id, shards, |marks| {
            marks[usize::from(shard)] = Some(now);
        });
    }

    pub fn mark_stocked(&self, sale_id: &SaleId, shards: u16, shard: u16) {
        self.with_marks(sale_id, shards, |marks| marks[usize::from(shard)] = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_shards_are_skipped_until_their_mark_goes_stale() {
        let gate = SoldOutGate::new(Duration::seconds(1));
        let sale = SaleId::parse("s").unwrap();
        let t0 = Utc::now();
        assert_eq!(
            gate.shards_to_try(&sale, 3, [1, 2, 0].into_iter(), t0),
            [1, 2, 0]
        );

        gate.mark_empty(&sale, 3, 2, t0);
        assert_eq!(
            gate.shards_to_try(&sale, 3, [1, 2, 0].into_iter(), t0),
            [1, 0]
        );

        let later = t0 + Duration::milliseconds(1500);
        assert_eq!(gate.shards_to_try(&sale, 3, [2].into_iter(), later), [2]);
        // Re-armed by the grab that took it: its peers in the same instant skip it.
        assert!(
            gate.shards_to_try(&sale, 3, [2].into_iter(), later)
                .is_empty()
        );

        gate.mark_stocked(&sale, 3, 2);
        assert_eq!(gate.shards_to_try(&sale, 3, [2].into_iter(), later), [2]);
    }
}
