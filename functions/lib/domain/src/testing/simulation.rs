//! A whole sale on the fakes, interleaved on one thread from one seed (issue 48).
//!
//! Why a small scheduler of our own rather than `turmoil` or `madsim`: the domain talks
//! to the world only through its ports, and the fakes behind them are in memory, so
//! there is no network to simulate. What needs controlling is the order in which
//! concurrent use cases take their turns, and time. Here every port call is a turn
//! point (the task yields before and after it), [`SimPause`] sleeps on the simulated
//! clock, and [`Executor`] picks which task runs next from the seed. Nothing else in the
//! domain reads time or randomness (both are ports), so a seed fixes the whole run, and
//! a failing seed replays exactly. `madsim` would replace tokio under every crate of
//! the workspace, and `turmoil` simulates hosts and sockets we do not have here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use futures::FutureExt;

use super::{InMemoryStore, ManualClock, RecordingQueue, RecordingScheduler};
use crate::error::StoreError;
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::{Order, ReleaseReason, Reservation};
use crate::ports::{
    Clock, OrderBook, OrderQueue, Pause, ReleaseScheduler, ReserveRefusal, Settlement, ShardState,
    StockLedger, Take, TakeReturn,
};
use crate::sale::{Sale, StockCounts};

/// The run's random draws: SplitMix64 from the seed.
#[derive(Debug)]
pub struct SimRng(AtomicU64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    pub fn next_u64(&self) -> u64 {
        let state = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `percent` / 100.
    pub fn percent(&self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The simulated world's clock and draws, shared by every task of a run.
#[derive(Debug)]
pub struct Sim {
    pub rng: SimRng,
    pub clock: Arc<ManualClock>,
    /// The earliest time a sleeping task wakes, since the clock last jumped.
    next_wake: Mutex<Option<DateTime<Utc>>>,
    /// Whether the last poll ended in a sleep.
    slept: Mutex<bool>,
}

impl Sim {
    pub fn new(seed: u64, start: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self {
            rng: SimRng::new(seed),
            clock: Arc::new(ManualClock::new(start)),
            next_wake: Mutex::new(None),
            slept: Mutex::new(false),
        })
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Sleeps until `until` on the simulated clock, giving every other task its turns.
    pub async fn sleep_until(&self, until: DateTime<Utc>) {
        while self.now() < until {
            {
                let mut next = lock(&self.next_wake);
                *next = Some(next.map_or(until, |next| next.min(until)));
            }
            *lock(&self.slept) = true;
            turn().await;
        }
    }

    pub async fn sleep(&self, how_long: Duration) {
        self.sleep_until(self.now() + how_long).await;
    }
}

/// Gives the other tasks a turn: pending once, then ready.
pub fn turn() -> impl Future<Output = ()> {
    struct Turn(bool);
    impl Future for Turn {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                Poll::Ready(())
            } else {
                self.0 = true;
                Poll::Pending
            }
        }
    }
    Turn(false)
}

/// The domain's [`Pause`] on the simulated clock.
#[derive(Debug)]
pub struct SimPause(pub Arc<Sim>);

#[async_trait]
impl Pause for SimPause {
    async fn pause(&self, how_long: std::time::Duration) {
        self.0
            .sleep(Duration::from_std(how_long).unwrap_or(Duration::MAX))
            .await;
    }
}

/// Tasks that never all ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no end after {steps} steps: a livelock")]
pub struct Livelock {
    pub steps: u64,
}

/// A task of the run.
pub type Task<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Runs tasks one poll at a time, the next one drawn from the seed; time moves on a
/// little at every step, and jumps to the next wake-up when every task sleeps.
pub struct Executor<'a> {
    sim: Arc<Sim>,
    tasks: Vec<Option<Task<'a>>>,
    pub steps: u64,
}

impl<'a> Executor<'a> {
    pub fn new(sim: Arc<Sim>) -> Self {
        Self {
            sim,
            tasks: Vec::new(),
            steps: 0,
        }
    }

    pub fn spawn(&mut self, task: impl Future<Output = ()> + 'a) {
        self.tasks.push(Some(Box::pin(task)));
    }

    /// Runs until every task is done, calling `check` after every step; past
    /// `max_steps` it gives up with a livelock, a failure too.
    pub fn run(&mut self, max_steps: u64, mut check: impl FnMut()) -> Result<(), Livelock> {
        let mut context = Context::from_waker(Waker::noop());
        let mut sleeping_polls = 0_usize;
        loop {
            let live: Vec<usize> = (0..self.tasks.len())
                .filter(|index| self.tasks[*index].is_some())
                .collect();
            if live.is_empty() {
                return Ok(());
            }
            if self.steps >= max_steps {
                return Err(Livelock { steps: self.steps });
            }
            self.steps += 1;
            let index = live[usize::try_from(self.sim.rng.below(live.len() as u64)).unwrap_or(0)];
            *lock(&self.sim.slept) = false;
            if let Some(task) = self.tasks[index].as_mut()
                && task.as_mut().poll(&mut context).is_ready()
            {
                self.tasks[index] = None;
            }
            // Time passes while tasks run: a few milliseconds a step, at random.
            let step = self.sim.rng.below(3);
            self.sim
                .clock
                .advance(Duration::milliseconds(i64::try_from(step).unwrap_or(0)));
            if *lock(&self.sim.slept) {
                sleeping_polls += 1;
            } else {
                sleeping_polls = 0;
            }
            // Every task seems to sleep: the clock jumps to the first wake-up.
            if sleeping_polls > live.len() * 3 {
                if let Some(wake) = lock(&self.sim.next_wake).take()
                    && wake > self.sim.now()
                {
                    self.sim.clock.set(wake);
                }
                sleeping_polls = 0;
            }
            check();
        }
    }
}

/// The fakes behind ports whose every call is a turn point: the task yields before the
/// call and after it, so concurrent use cases interleave between any two of their
/// store calls, as they do on AWS.
pub struct Interleaved {
    pub store: Arc<InMemoryStore>,
    pub queue: Arc<RecordingQueue>,
    pub scheduler: Arc<RecordingScheduler>,
    /// A bug planted on purpose, to show the checker catches it.
    pub planted: Option<PlantedBug>,
}

/// Bugs the simulation must catch, planted behind the ports (a checker that cannot fail
/// proves nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// A release that answers `Applied` and does nothing: the hold stays open and its
    /// unit never comes back.
    ReleaseThatDoesNothing,
    /// A reserve that skips the shard's condition once the shard is empty, as a take
    /// without `available > 0` would: a unit sold twice.
    ReserveWithoutTheStockCondition,
}

async fn between<T>(call: impl Future<Output = T>) -> T {
    turn().await;
    let answer = call.await;
    turn().await;
    answer
}

#[async_trait]
impl StockLedger for Interleaved {
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        let answer = between(self.store.reserve(sale, shard, reservation)).await;
        if self.planted == Some(PlantedBug::ReserveWithoutTheStockCondition)
            && matches!(answer, Ok(Err(ReserveRefusal::ShardEmpty(_))))
        {
            // As if the take had no condition: the hold is written all the same.
            self.store.force_hold(sale, reservation);
            return Ok(Ok(()));
        }
        answer
    }

    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError> {
        between(self.store.availability(sale)).await
    }

    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        between(self.store.shard_states(sale)).await
    }

    async fn release(
        &self,
        reservation: &Reservation,
        reason: ReleaseReason,
        now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        if self.planted == Some(PlantedBug::ReleaseThatDoesNothing) {
            turn().await;
            return Ok(Settlement::Applied);
        }
        between(self.store.release(reservation, reason, now)).await
    }

    async fn drop_superseded_take(
        &self,
        reservation: &Reservation,
        shard: u16,
    ) -> Result<bool, StoreError> {
        between(self.store.drop_superseded_take(reservation, shard)).await
    }

    async fn unaccounted_takes(&self, sale: &Sale) -> Result<Vec<Take>, StoreError> {
        between(self.store.unaccounted_takes(sale)).await
    }

    async fn return_take(&self, take: &Take, now: DateTime<Utc>) -> Result<TakeReturn, StoreError> {
        between(self.store.return_take(take, now)).await
    }
}

#[async_trait]
impl OrderBook for Interleaved {
    async fn find(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<(Order, Reservation)>, StoreError> {
        between(self.store.find(order_id, user)).await
    }

    async fn open_holds(&self, sale: &Sale) -> Result<Vec<Reservation>, StoreError> {
        between(self.store.open_holds(sale)).await
    }

    async fn count(&self, sale: &Sale) -> Result<StockCounts, StoreError> {
        between(self.store.count(sale)).await
    }

    async fn sale_orders(
        &self,
        sale: &Sale,
        after: Option<&crate::fulfilment::BuyerCursor>,
        limit: usize,
    ) -> Result<crate::fulfilment::OrderPage, StoreError> {
        between(self.store.sale_orders(sale, after, limit)).await
    }

    async fn buyer_orders(
        &self,
        user: &UserId,
        after: Option<&crate::buyer_orders::BuyerOrdersCursor>,
        limit: usize,
    ) -> Result<crate::buyer_orders::BuyerOrdersPage, StoreError> {
        between(self.store.buyer_orders(user, after, limit)).await
    }
}

#[async_trait]
impl OrderQueue for Interleaved {
    async fn enqueue(&self, reservation: &Reservation) -> Result<(), StoreError> {
        between(self.queue.enqueue(reservation)).await
    }
}

#[async_trait]
impl ReleaseScheduler for Interleaved {
    async fn schedule_release(&self, reservation: &Reservation) -> Result<(), StoreError> {
        between(self.scheduler.schedule_release(reservation)).await
    }

    async fn cancel_release(&self, order_id: &OrderId) -> Result<(), StoreError> {
        between(self.scheduler.cancel_release(order_id)).await
    }
}

/// The sale's counts as the store holds them now (the fake answers at once).
pub fn counts_now(store: &InMemoryStore, sale: &Sale) -> StockCounts {
    store
        .count(sale)
        .now_or_never()
        .expect("the in-memory store answers at once")
        .expect("the in-memory store does not fail")
}

/// The units on the sale's shards now.
pub fn available_now(store: &InMemoryStore, sale_id: &SaleId, shards: u16) -> u64 {
    (0..shards)
        .map(|shard| store.shard_available(sale_id, shard))
        .sum()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
