//! Per-process caches the grab reads instead of the store: the sales and the blocklist.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};

use crate::control::{ControlWrite, SaleAudit};
use crate::error::StoreError;
use crate::ids::{SaleId, UserId};
use crate::ports::{Blocklist, Clock, SaleCatalog, SystemClock};
use crate::sale::{Sale, SaleCursor, SalePage};

/// How long a [`CachedCatalog`] answers a found sale from memory before it rereads it,
/// unless [`CachedCatalog::with_refresh`] says otherwise: the bound on how long an
/// operator's pause takes to reach a warm process.
pub const DEFAULT_SALE_REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// A [`SaleCatalog`] that remembers the sales it has found. A sale's definition never
/// changes after creation, only its control (pause, resume, end), so a found sale is
/// answered from memory and reread from the store at most once per
/// [`CachedCatalog::with_refresh`] interval: an operator's pause reaches every process
/// within that interval (plus the one read), at one read per sale, process and
/// interval, never one per request. While one request rereads a sale, the process's
/// other requests answer from the copy they have.
///
/// A sale not found is remembered too, for [`CachedCatalog::MISS_LIFETIME`]: a flood of
/// requests naming sales that do not exist costs one read per id and interval, not one
/// each, and a sale created meanwhile is found within that interval.
pub struct CachedCatalog<C> {
    inner: C,
    capacity: usize,
    sales: RwLock<HashMap<SaleId, CachedSale>>,
    refresh: std::time::Duration,
    /// The sales one request is rereading now.
    refreshing: Mutex<HashSet<SaleId>>,
    miss_lifetime: std::time::Duration,
    misses: RwLock<HashMap<SaleId, DateTime<Utc>>>,
    /// What the ages are told by: the clock port, so that a simulation's time drives
    /// the cache as it drives everything else.
    clock: Arc<dyn Clock>,
}

#[derive(Clone)]
struct CachedSale {
    sale: Sale,
    read_at: DateTime<Utc>,
}

impl<C> CachedCatalog<C> {
    /// How long "no such sale" is remembered: short, since a sale may be created after
    /// someone first asks for it, and its page is not announced before it exists.
    pub const MISS_LIFETIME: std::time::Duration = std::time::Duration::from_secs(5);

    pub fn new(inner: C, capacity: usize) -> Self {
        Self {
            inner,
            capacity,
            sales: RwLock::new(HashMap::new()),
            refresh: DEFAULT_SALE_REFRESH,
            refreshing: Mutex::new(HashSet::new()),
            miss_lifetime: Self::MISS_LIFETIME,
            misses: RwLock::new(HashMap::new()),
            clock: Arc::new(SystemClock),
        }
    }

    /// This cache, telling the ages of what it remembers by `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Whether something remembered `at` is younger than `age` now, by the clock port:
    /// the wall clock in a function, since a monotonic clock may not advance while
    /// Lambda freezes the process between invocations, which would keep a copy "fresh"
    /// for as long as the process sleeps. A clock set back reads as old.
    fn younger_than(&self, at: DateTime<Utc>, age: std::time::Duration) -> bool {
        let elapsed = self.clock.now() - at;
        elapsed >= Duration::zero() && elapsed.to_std().is_ok_and(|elapsed| elapsed < age)
    }

    /// This cache, remembering a miss for `lifetime` instead.
    #[must_use]
    pub fn with_miss_lifetime(mut self, lifetime: std::time::Duration) -> Self {
        self.miss_lifetime = lifetime;
        self
    }

    /// This cache, rereading a found sale once it is `refresh` old.
    #[must_use]
    pub fn with_refresh(mut self, refresh: std::time::Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// Whether `sale_id` was looked up and not found less than a miss's lifetime ago.
    fn recently_missed(&self, sale_id: &SaleId) -> bool {
        read(&self.misses)
            .get(sale_id)
            .is_some_and(|at| self.younger_than(*at, self.miss_lifetime))
    }

    fn remember_miss(&self, sale_id: &SaleId) {
        let mut misses = write(&self.misses);
        if misses.len() >= self.capacity {
            let lifetime = self.miss_lifetime;
            misses.retain(|_, at| self.younger_than(*at, lifetime));
            if misses.len() >= self.capacity {
                misses.clear();
            }
        }
        misses.insert(sale_id.clone(), self.clock.now());
    }

    fn remember(&self, sale: Sale) {
        let mut sales = write(&self.sales);
        if sales.len() >= self.capacity && !sales.contains_key(&sale.sale_id) {
            sales.clear();
        }
        sales.insert(
            sale.sale_id.clone(),
            CachedSale {
                sale,
                read_at: self.clock.now(),
            },
        );
    }

    /// The turn to reread `sale_id`, unless another request of the process has it.
    fn refresh_turn(&self, sale_id: &SaleId) -> Option<RereadTurn<'_>> {
        let mut refreshing = self
            .refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        refreshing.insert(sale_id.clone()).then(|| RereadTurn {
            refreshing: &self.refreshing,
            sale_id: sale_id.clone(),
        })
    }
}

/// Gives the reread turn back however the reread ends, including when the request is
/// dropped mid-read.
struct RereadTurn<'a> {
    refreshing: &'a Mutex<HashSet<SaleId>>,
    sale_id: SaleId,
}

impl Drop for RereadTurn<'_> {
    fn drop(&mut self) {
        self.refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.sale_id);
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<C: SaleCatalog> CachedCatalog<C> {
    /// A sale this process holds no copy of, read and remembered, found or not.
    async fn first_read(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        let found = self.inner.find_sale(sale_id).await?;
        match &found {
            Some(sale) => self.remember(sale.clone()),
            None => self.remember_miss(sale_id),
        }
        Ok(found)
    }

    /// The sale as stored now, if this request has the turn to reread it and the read
    /// works; else the copy held. A failed read is tried again an interval later, not
    /// at once by every request.
    async fn reread(&self, held: Sale) -> Sale {
        let Some(_turn) = self.refresh_turn(&held.sale_id) else {
            return held;
        };
        let current = match self.inner.find_sale(&held.sale_id).await {
            Ok(Some(sale)) => sale,
            // A sale is never deleted: this is a lagging read.
            Ok(None) => held,
            Err(error) => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    sale_id = %held.sale_id,
                    "could not reread a sale; answering from the copy held"
                );
                held
            }
        };
        self.remember(current.clone());
        current
    }
}

#[async_trait]
impl<C: SaleCatalog> SaleCatalog for CachedCatalog<C> {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        // This process's own miss is forgotten at once; another's lasts its lifetime.
        write(&self.misses).remove(&sale.sale_id);
        self.inner.create_sale(sale).await
    }

    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        self.inner.sales_ending_after(cutoff).await
    }

    async fn list_sales(
        &self,
        after: Option<&SaleCursor>,
        limit: usize,
    ) -> Result<SalePage, StoreError> {
        self.inner.list_sales(after, limit).await
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        // Copied out first: the lock is not held while a read awaits.
        let cached = read(&self.sales).get(sale_id).cloned();
        match cached {
            Some(fresh) if self.younger_than(fresh.read_at, self.refresh) => Ok(Some(fresh.sale)),
            Some(stale) => Ok(Some(self.reread(stale.sale).await)),
            None if self.recently_missed(sale_id) => Ok(None),
            None => self.first_read(sale_id).await,
        }
    }

    async fn control_sale(
        &self,
        sale_id: &SaleId,
        change: &SaleAudit,
    ) -> Result<ControlWrite, StoreError> {
        let written = self.inner.control_sale(sale_id, change).await;
        // This process's own change shows at once; another's within an interval.
        write(&self.sales).remove(sale_id);
        written
    }

    async fn audit_trail(
        &self,
        sale_id: &SaleId,
        limit: usize,
    ) -> Result<Vec<SaleAudit>, StoreError> {
        self.inner.audit_trail(sale_id, limit).await
    }
}

/// The blocklist as the grab sees it: a per-process snapshot of the whole list, read
/// from the store at most once per `refresh` interval, so checking a user costs no
/// read per request. A block takes effect within one interval of being written (plus
/// the time of the one read that refreshes it, during which the process's other
/// requests still answer from the old snapshot).
pub struct CachedBlocklist {
    inner: Arc<dyn Blocklist>,
    refresh: Duration,
    snapshot: RwLock<Option<Snapshot>>,
    /// Set while one request refreshes a stale snapshot, so concurrent requests answer
    /// from the stale one instead of all reading the store at once.
    refreshing: AtomicBool,
}

struct Snapshot {
    users: HashSet<UserId>,
    taken_at: DateTime<Utc>,
}

/// Clears the refreshing flag however the refresh ends, including when the request
/// is dropped mid-read.
struct RefreshTurn<'a>(&'a AtomicBool);

impl Drop for RefreshTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl CachedBlocklist {
    pub fn new(inner: Arc<dyn Blocklist>, refresh: Duration) -> Self {
        Self {
            inner,
            refresh,
            snapshot: RwLock::new(None),
            refreshing: AtomicBool::new(false),
        }
    }

    /// Whether `user` is blocked, as of a snapshot at most `refresh` old at `now`.
    ///
    /// The first call of the process must read the list: if that fails, the error is
    /// returned (there is nothing to answer from, and letting a blocked user through
    /// is the failure this exists to prevent). A later refresh that fails keeps the
    /// last snapshot, logs, and is tried again only after another interval, so a
    /// failing store is not read once per request either.
    pub async fn is_blocked(&self, user: &UserId, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let have_snapshot = match &*self.read_snapshot() {
            Some(snapshot) if now - snapshot.taken_at < self.refresh => {
                return Ok(snapshot.users.contains(user));
            }
            Some(_) => true,
            None => false,
        };
        let _turn = if have_snapshot {
            if self.refreshing.swap(true, Ordering::AcqRel) {
                return Ok(self.snapshot_contains(user));
            }
            Some(RefreshTurn(&self.refreshing))
        } else {
            None
        };
        match self.inner.blocked().await {
            Ok(users) => {
                let users: HashSet<UserId> = users.into_iter().collect();
                let blocked = users.contains(user);
                *self.write_snapshot() = Some(Snapshot {
                    users,
                    taken_at: now,
                });
                Ok(blocked)
            }
            Err(error) => {
                let mut snapshot = self.write_snapshot();
                let Some(snapshot) = snapshot.as_mut() else {
                    return Err(error);
                };
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    age_secs = (now - snapshot.taken_at).num_seconds(),
                    "could not refresh the blocklist; answering from the last snapshot"
                );
                snapshot.taken_at = now;
                Ok(snapshot.users.contains(user))
            }
        }
    }

    fn snapshot_contains(&self, user: &UserId) -> bool {
        self.read_snapshot()
            .as_ref()
            .is_some_and(|snapshot| snapshot.users.contains(user))
    }

    fn read_snapshot(&self) -> std::sync::RwLockReadGuard<'_, Option<Snapshot>> {
        self.snapshot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_snapshot(&self) -> std::sync::RwLockWriteGuard<'_, Option<Snapshot>> {
        self.snapshot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::SaleControl;
    use crate::testing::{InMemoryStore, ManualClock, sale};

    /// The store behind the cache, counting the lookups that reach it.
    #[derive(Default)]
    struct CountedLookups {
        store: InMemoryStore,
        lookups: AtomicUsize,
    }

    #[async_trait]
    impl SaleCatalog for CountedLookups {
        async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
            self.store.create_sale(sale).await
        }

        async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            self.store.find_sale(sale_id).await
        }

        async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
            self.store.sales_ending_after(cutoff).await
        }

        async fn list_sales(
            &self,
            after: Option<&SaleCursor>,
            limit: usize,
        ) -> Result<SalePage, StoreError> {
            self.store.list_sales(after, limit).await
        }

        async fn control_sale(
            &self,
            sale_id: &SaleId,
            change: &SaleAudit,
        ) -> Result<ControlWrite, StoreError> {
            self.store.control_sale(sale_id, change).await
        }

        async fn audit_trail(
            &self,
            sale_id: &SaleId,
            limit: usize,
        ) -> Result<Vec<SaleAudit>, StoreError> {
            self.store.audit_trail(sale_id, limit).await
        }
    }

    fn pause_by(operator: &str) -> SaleAudit {
        SaleAudit {
            action: crate::SaleAction::Pause,
            by: UserId::parse(operator).expect("a user id"),
            at: Utc::now(),
        }
    }

    #[tokio::test]
    async fn another_process_pause_is_seen_once_the_copy_is_a_refresh_old_at_one_read() {
        let refresh = std::time::Duration::from_millis(200);
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let cache = CachedCatalog::new(CountedLookups::default(), 8)
            .with_refresh(refresh)
            .with_clock(clock.clone());
        let made = sale(10, 2).build();
        assert!(cache.inner.create_sale(&made).await.expect("create"));
        assert_eq!(
            cache.find_sale(&made.sale_id).await.expect("find"),
            Some(made.clone())
        );

        // Paused by another process: this one answers its copy until it is a refresh old.
        let paused = cache
            .inner
            .control_sale(&made.sale_id, &pause_by("operator"))
            .await
            .expect("pause");
        assert_eq!(paused, ControlWrite::Changed);
        for _ in 0..20 {
            clock.advance(Duration::milliseconds(9));
            let found = cache.find_sale(&made.sale_id).await.expect("find");
            assert_eq!(found.map(|sale| sale.control), Some(SaleControl::Open));
        }
        clock.advance(Duration::milliseconds(20));
        let rereads = (0..20).map(|_| cache.find_sale(&made.sale_id));
        for found in futures::future::join_all(rereads).await {
            let found = found.expect("find").expect("the sale");
            assert_eq!(found.control, SaleControl::Paused);
        }
        assert_eq!(
            cache.inner.lookups.load(Ordering::SeqCst),
            2,
            "one read when first found, one reread after the refresh interval"
        );
    }

    #[tokio::test]
    async fn a_pause_through_the_cache_is_seen_by_its_own_process_at_once() {
        let cache = CachedCatalog::new(CountedLookups::default(), 8);
        let made = sale(10, 2).build();
        assert!(cache.create_sale(&made).await.expect("create"));
        assert!(
            cache
                .find_sale(&made.sale_id)
                .await
                .expect("find")
                .is_some()
        );
        let paused = cache
            .control_sale(&made.sale_id, &pause_by("operator"))
            .await
            .expect("pause");
        assert_eq!(paused, ControlWrite::Changed);
        let found = cache.find_sale(&made.sale_id).await.expect("find");
        assert_eq!(found.map(|sale| sale.control), Some(SaleControl::Paused));
    }

    #[tokio::test]
    async fn a_missing_sale_is_looked_up_once_per_miss_lifetime_and_found_once_created() {
        let lifetime = std::time::Duration::from_millis(200);
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let cache = CachedCatalog::new(CountedLookups::default(), 8)
            .with_miss_lifetime(lifetime)
            .with_clock(clock.clone());
        let made = sale(10, 2).build();
        for _ in 0..50 {
            assert_eq!(cache.find_sale(&made.sale_id).await.expect("find"), None);
        }
        assert_eq!(
            cache.inner.lookups.load(Ordering::SeqCst),
            1,
            "one read for 50 misses"
        );

        // Created by another process: this one finds it once its miss has lapsed.
        assert!(cache.inner.create_sale(&made).await.expect("create"));
        clock.advance(Duration::milliseconds(199));
        assert_eq!(cache.find_sale(&made.sale_id).await.expect("find"), None);
        clock.advance(Duration::milliseconds(1));
        assert_eq!(
            cache.find_sale(&made.sale_id).await.expect("find"),
            Some(made.clone())
        );
        assert_eq!(
            cache.find_sale(&made.sale_id).await.expect("find"),
            Some(made)
        );
        assert_eq!(
            cache.inner.lookups.load(Ordering::SeqCst),
            2,
            "found sales stay cached"
        );
    }

    #[tokio::test]
    async fn a_sale_created_through_the_cache_is_found_at_once_after_a_miss() {
        let cache = CachedCatalog::new(CountedLookups::default(), 8);
        let made = sale(10, 2).build();
        assert_eq!(cache.find_sale(&made.sale_id).await.expect("find"), None);
        assert!(cache.create_sale(&made).await.expect("create"));
        assert_eq!(
            cache.find_sale(&made.sale_id).await.expect("find"),
            Some(made)
        );
    }
}
