//! Per-process caches the grab reads instead of the store: the sales and the blocklist.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};

use crate::error::StoreError;
use crate::ids::{SaleId, UserId};
use crate::ports::{Blocklist, SaleCatalog};
use crate::sale::Sale;

/// A [`SaleCatalog`] that remembers the sales it has found. Sales never change after
/// creation, so the grab path reads each sale from the store once per process.
pub struct CachedCatalog<C> {
    inner: C,
    capacity: usize,
    sales: RwLock<HashMap<SaleId, Sale>>,
}

impl<C> CachedCatalog<C> {
    pub fn new(inner: C, capacity: usize) -> Self {
        Self {
            inner,
            capacity,
            sales: RwLock::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl<C: SaleCatalog> SaleCatalog for CachedCatalog<C> {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        self.inner.create_sale(sale).await
    }

    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        self.inner.sales_ending_after(cutoff).await
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        let cached = self
            .sales
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(sale_id)
            .cloned();
        if cached.is_some() {
            return Ok(cached);
        }
        // Misses are not cached: a sale may be created after someone first asks for it.
        let found = self.inner.find_sale(sale_id).await?;
        if let Some(sale) = &found {
            let mut sales = self
                .sales
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if sales.len() >= self.capacity {
                sales.clear();
            }
            sales.insert(sale_id.clone(), sale.clone());
        }
        Ok(found)
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
