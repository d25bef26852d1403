//! The hot path: hand out grab paths, and turn a grab into a reservation.
//!
//! A grab walks the sale's shards in the buyer's order until one gives it a unit. Two
//! things make that walk more than a loop:
//! - **Contention.** A reserve is the brief's transaction, the take on the shard and the
//!   hold on the buyer's item (see [`StockLedger`]); on a shard hot enough that
//!   transactions cancel each other the store goes on there as take then hold, plain
//!   writes that queue, and a sale set to
//!   [`TakeThenHold`](crate::sale::ReservePath::TakeThenHold) (a flash sale)
//!   starts so. What still answers `Contended` is a write that met another
//!   transaction on its item: the buyer's own pay or cancel on their item, or a plain
//!   take that met a reserve's transaction on the shard. A contended shard is left at once
//!   for the next one in the buyer's order, and after a couple of contended shards in a
//!   row the grab pauses (full jitter, growing) and goes round again: queueing on one
//!   busy shard while others are free is slow, and probing every shard while all are
//!   busy multiplies billed writes for nothing.
//! - **Unknown outcomes.** A reserve that timed out or failed in transit may still have
//!   taken its unit. The grab never answers such a request as anything but what
//!   happened: it reads the buyer's own item (one consistent read, which names the
//!   path's order) and answers 202 if the hold is there. If it is not, the reserve is
//!   asked again on the same shard (idempotent per order id), which finds a take that
//!   landed and finishes it (`AlreadyHeld` if the hold landed too) rather than hiding
//!   it behind a "sold out".
//! - **"Sold out" only when the stock says so.** Every shard known empty from the
//!   table, and no unit on its way back: no reserve of this process in flight (one whose
//!   hold is refused gives its take back), no take younger than the undo window, and no
//!   failed read in place of an answer. Otherwise the answer is a 503, whose retry
//!   tells.

use std::ops::ControlFlow;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::challenge::{CHALLENGE_LIFETIME, IssuedChallenge};
use crate::error::{AppError, StoreError, WriteOutcome};
use crate::gate::{SoldOutGate, TakeSlot};
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::{OrderMessage, Reservation};
use crate::ports::{
    Clock, IdSource, OrderBook, OrderQueue, Pause, ProofOfWork, ReserveRefusal, SaleCatalog,
    StockLedger,
};
use crate::sale::{Sale, SalePhase, TOKEN_LEAD};
use crate::service::{CachedBlocklist, settled_error};
use crate::token::{GrabTokenSigner, PathRefusal};

/// How long a grab path stays valid. Short, so a leaked path is soon useless, and a
/// client that needs another simply asks again.
pub const GRAB_PATH_LIFETIME: Duration = Duration::minutes(5);

/// The grab path that the token endpoint hands out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrabPass {
    pub grab_path: String,
    pub expires_at: DateTime<Utc>,
}

/// Which try of one grab path a grab is, as the client says (the `X-Retry-Attempt`
/// header over HTTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The first request on this path: it cannot have taken a unit before.
    First,
    /// A repeat of a request on the same path whose answer the client did not get.
    Retry,
}

/// Who decided that a grab found the sale sold out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoldOutBy {
    /// The in-memory gate: no write was sent.
    Gate,
    /// The database: every shard tried refused for want of stock.
    Database,
}

/// What a grab did, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrabOutcome {
    /// This request's reserve took the unit (including one whose answer was lost and
    /// that the grab found committed).
    Reserved(Reservation),
    /// The path's order was held already (a retry whose first answer was lost): the
    /// same order, answered again.
    Resumed(Reservation),
    /// No unit left.
    SoldOut(SoldOutBy),
}

/// A grab's outcome, with what it cost the database.
#[derive(Debug)]
pub struct GrabReport {
    pub outcome: Result<GrabOutcome, AppError>,
    /// Reserves sent (0: answered from memory, or refused before the ledger was asked),
    /// each the transaction, or take then hold on a hot shard.
    pub reserves: u32,
    /// Of those, how many contention refused with nothing written.
    pub contended: u32,
}

impl GrabReport {
    /// The answer as the buyer hears it: the reservation they hold, or why not.
    pub fn into_answer(self) -> Result<Reservation, AppError> {
        match self.outcome? {
            GrabOutcome::Reserved(reservation) | GrabOutcome::Resumed(reservation) => {
                Ok(reservation)
            }
            GrabOutcome::SoldOut(_) => Err(AppError::SoldOut),
        }
    }
}

/// How a grab goes round the shards when they are contended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentionPolicy {
    /// Walks over the shards worth a write, the first included. A walk ends at the
    /// first free shard, or after `max_contended_per_walk` contended ones; the next one
    /// starts with the shards it did not reach, then those it found contended.
    pub max_walks: u32,
    /// Contended shards a walk tries before it pauses. Hopping on is right while some
    /// shards are free; once this many in a row were busy, every further probe is
    /// likely one more billed, cancelled write.
    pub max_contended_per_walk: u32,
    /// The ceiling of the pause before the second walk; it doubles with each walk.
    pub pause_base: std::time::Duration,
    /// No pause exceeds this.
    pub pause_cap: std::time::Duration,
    /// No reserve starts once the grab has run this long, so that it always has time
    /// left to resolve an unknown outcome and answer within the function's deadline.
    pub budget: Duration,
    /// How long after it was written a take may still be undone: a take comes before
    /// its hold, and a hold refused (the buyer's limit, or the order held on another
    /// shard) gives the take back, one write later. (Counted from the take, not from its
    /// grab's start: a grab may wait for a slot or out of contention for most of its
    /// budget before it takes.) A grab that found every shard empty, one of them with a
    /// take this young, waits until that take is this old (at most one window past its
    /// budget, inside the function's deadline) and reads the shards once before it
    /// answers "sold out", so that a unit about to come back is not answered as gone to
    /// every buyer in between; a take that read still finds this young, or a read that
    /// fails, is answered 503, not "sold out".
    /// (This process's own reserves in flight are waited for as such: see
    /// [`SoldOutGate::takes_in_flight`].)
    pub undo_window: Duration,
    /// Reserves whose outcome was unknown (and whose hold the read did not find) that a
    /// grab goes on after. One more means the table is failing rather than slow: the
    /// grab answers 503 instead of adding load, and the buyer's retry of the same path
    /// (idempotent) tells.
    pub max_unknown_outcomes: u32,
    /// Takes one process sends a shard at once (see [`SoldOutGate::admit`]). A grab
    /// finding every shard with stock at the cap waits for a slot instead of queueing a
    /// write that the last unit's taker may leave refused.
    pub max_takes_in_flight_per_shard: u32,
    /// The ceiling of the wait for a slot, uniform below it; such waits are not walks,
    /// and only the budget bounds them.
    pub slot_wait: std::time::Duration,
}

impl ContentionPolicy {
    /// A transaction holds a shard for about its own latency (10 to 30 ms on AWS), so a
    /// first pause of up to 10 ms, doubling, reaches past several commits by the third
    /// walk; twelve walks wait at most 10 + 20 + 40 + 80 + 160 + 6 × 200 ms, about
    /// 1.5 s, inside the budget.
    pub const DEFAULT: Self = Self {
        max_walks: 12,
        max_contended_per_walk: 2,
        pause_base: std::time::Duration::from_millis(10),
        pause_cap: std::time::Duration::from_millis(200),
        budget: Duration::milliseconds(2500),
        // A take, the refused hold and the undo are three writes, tens of milliseconds
        // on AWS; a second covers them queued behind a crowd on one shard.
        undo_window: Duration::seconds(1),
        max_unknown_outcomes: 1,
        max_takes_in_flight_per_shard: 2,
        slot_wait: std::time::Duration::from_millis(5),
    };

    /// The pause before walk number `walk` (1 for the second), uniform in
    /// `[0, min(cap, base * 2^(walk-1))]`, drawn from the order's own random bits so
    /// that buyers who collided spread apart instead of colliding again in step.
    fn pause_before(&self, walk: u32, order_id: &OrderId) -> std::time::Duration {
        let factor = 1_u32
            .checked_shl(walk.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let ceiling = self.pause_base.saturating_mul(factor).min(self.pause_cap);
        let ceiling_micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        let draw = splitmix64(order_id.random_bits() ^ u64::from(walk));
        std::time::Duration::from_micros(draw % (ceiling_micros + 1))
    }

    /// The wait number `wait` of `order_id` for a slot, uniform in `[0, slot_wait]`.
    fn slot_wait_before(&self, wait: u32, order_id: &OrderId) -> std::time::Duration {
        let ceiling_micros = u64::try_from(self.slot_wait.as_micros()).unwrap_or(u64::MAX);
        let draw = splitmix64(order_id.random_bits().rotate_left(17) ^ u64::from(wait));
        std::time::Duration::from_micros(draw % (ceiling_micros + 1))
    }
}

impl Default for ContentionPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A well-mixed 64-bit value from `x` (Steele, Lea and Flood's SplitMix64 finaliser).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Reserve attempts and contention seen by one grab, and what it may have taken.
#[derive(Debug, Default)]
struct Tally {
    reserves: u32,
    contended: u32,
    doubt: Doubt,
}

/// Whether this grab's order may have a take whose hold is missing, and on which shard:
/// a reserve there was sent and not answered, and the buyer's item showed no hold. Only a
/// reserve on that same shard finds such a take and finishes it (going on elsewhere
/// would strand the unit until the reconciler returns it), so the walk asks it first,
/// whatever the gate thinks of it, and moves on from it only once it answers. This is
/// the grab's one keeper of it; the gate carries it from one request of a path to the
/// next in this process (see [`SoldOutGate::note_doubt`]).
#[derive(Debug, Default)]
struct Doubt {
    shard: Option<u16>,
    /// Whether the gate holds a doubt of this order's, to update when the grab ends.
    noted: bool,
}

impl Doubt {
    /// What the gate knows of `order`: a shard where its path's earlier request gave up
    /// in doubt, or a shard seen empty with `order` among its takers.
    fn recall(gate: &SoldOutGate, sale: &Sale, order: &OrderId) -> Self {
        let shard = gate.shard_taken_by(&sale.sale_id, sale.shards, order);
        Self {
            shard,
            noted: shard.is_some(),
        }
    }

    fn is_on(&self, shard: u16) -> bool {
        self.shard == Some(shard)
    }

    /// A reserve on `shard` was sent and not answered, and the hold was not found.
    fn suspect(&mut self, shard: u16) {
        self.shard = Some(shard);
        self.noted = true;
    }

    /// The hold was found: nothing of this order's is stranded.
    fn resolve(&mut self) {
        self.shard = None;
    }

    /// The doubted shard answered empty: a take of this order's there would have been
    /// found, not refused. The gate stops pointing the order back there at once, or the
    /// walk would come back to it until it ran out of walks.
    fn refute(&mut self, gate: &SoldOutGate, sale: &Sale, order: &OrderId, now: DateTime<Utc>) {
        self.shard = None;
        gate.note_doubt(&sale.sale_id, sale.shards, order, None, now);
    }

    /// Puts the doubted shard first in a walk's `shards`. With no shard left at all, a
    /// shard the gate saw empty with this order among its takers is asked: only a
    /// reserve's answer there, not the gate's, can say the order took nothing.
    fn lead(&self, shards: &mut Vec<u16>, gate: &SoldOutGate, sale: &Sale, order: &OrderId) {
        if let Some(doubt) = self.shard {
            shards.retain(|shard| *shard != doubt);
            shards.insert(0, doubt);
        }
        if shards.is_empty() {
            shards.extend(gate.shard_taken_by(&sale.sale_id, sale.shards, order));
        }
    }

    /// When the grab ends: one that gives up in doubt leaves the shard to its path's
    /// next request in this process; one that knows what happened clears it.
    fn hand_on(
        self,
        gate: &SoldOutGate,
        sale: &Sale,
        order: &OrderId,
        outcome: &Result<GrabOutcome, AppError>,
        now: DateTime<Utc>,
    ) {
        let shard = match outcome {
            Err(error) if error.is_retryable() => self.shard,
            _ => None,
        };
        if self.noted || shard.is_some() {
            gate.note_doubt(&sale.sale_id, sale.shards, order, shard, now);
        }
    }
}

/// A grab's answer.
type Answer = Result<GrabOutcome, AppError>;

/// One grab's walks over the sale's shards, once its request is known valid.
struct Walk<'a> {
    sale: &'a Sale,
    user: &'a UserId,
    started: DateTime<Utc>,
    /// The hold to reserve; its shard is the one last asked.
    reservation: Reservation,
    tally: &'a mut Tally,
    walks: u32,
    slot_waits: u32,
    unknown_outcomes: u32,
    /// Until when a shard this grab found empty may get a unit back from an undone
    /// take (see [`ContentionPolicy::undo_window`]).
    undo_possible_until: Option<DateTime<Utc>>,
}

impl<'a> Walk<'a> {
    fn new(
        sale: &'a Sale,
        user: &'a UserId,
        order_id: OrderId,
        started: DateTime<Utc>,
        tally: &'a mut Tally,
    ) -> Self {
        let reservation = Reservation {
            order_id,
            sale_id: sale.sale_id.clone(),
            user_id: user.clone(),
            shard: 0,
            created_at: started,
            expires_at: sale.payment_deadline(started),
            price: sale.price,
        };
        Self {
            sale,
            user,
            started,
            reservation,
            tally,
            walks: 0,
            slot_waits: 0,
            unknown_outcomes: 0,
            undo_possible_until: None,
        }
    }

    fn order_id(&self) -> &OrderId {
        &self.reservation.order_id
    }
}

/// What one walk left for the next.
#[derive(Debug, Default)]
struct WalkLeft {
    /// Shards it did not reach.
    untried: Vec<u16>,
    /// Shards with stock that this process had enough takes in flight on.
    at_cap: Vec<u16>,
    /// Shards it found contended, or reached with the budget spent.
    contended: Vec<u16>,
    /// Whether it sent a reserve at all.
    wrote: bool,
}

/// What asking one shard came to.
enum ShardAnswer {
    /// The grab has its answer.
    Answered(Answer),
    /// The gate knows it empty, or it was found so.
    Empty,
    /// This process had enough takes in flight on it.
    AtCap,
    Contended,
    /// No other shard before this one is asked again: a take of this order's may be
    /// on it.
    EndWalk,
}

/// The hot path: hand out grab paths, and turn a grab into a reservation.
pub struct GrabService {
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    /// Read to answer a retried grab, and to resolve a reserve whose outcome is
    /// unknown; see [`GrabService::grab`].
    pub orders: Arc<dyn OrderBook>,
    pub queue: Arc<dyn OrderQueue>,
    pub clock: Arc<dyn Clock>,
    /// The order ids of grab paths that need no challenge (a solved challenge names
    /// its own).
    pub ids: Arc<dyn IdSource>,
    /// Waits between walks over contended shards.
    pub pause: Arc<dyn Pause>,
    pub signer: GrabTokenSigner,
    /// Issues and checks the challenge of a sale that asks for one, in memory.
    pub challenges: Arc<dyn ProofOfWork>,
    pub gate: SoldOutGate,
    /// Checked first on both routes, from memory: a blocked user costs no store call.
    pub blocked_users: CachedBlocklist,
    pub contention: ContentionPolicy,
}

/// Contention that outlasted every walk (or the budget): transient, the buyer's retry of
/// the same path may find a shard free.
#[derive(Debug, thiserror::Error)]
#[error("every shard with stock stayed contended for {walks} walks")]
pub struct ContentionOutlasted {
    pub walks: u32,
}

const GRAB: &str = "grab";

/// How often a grab that found every shard empty looks again while takes of this
/// process are in flight: about a write's round trip.
const LANDING_POLL: std::time::Duration = std::time::Duration::from_millis(10);
/// A bound on those looks besides the budget (a clock that stands still in a test).
const MAX_POLLS_FOR_LANDING: u32 = 300;
/// Reads of the shards a grab makes while young takes may yet be given back: each
/// waits for the youngest it saw, so more are rare (takes younger still, in a surge).
const MAX_LOOKS_FOR_UNDONE_TAKES: u32 = 3;

/// Every shard was seen empty, but a unit could still come back when the grab had to
/// answer: a take in flight or young, or a read that failed. "Sold out" is not known;
/// the buyer's retry (503, `Retry-After`) tells.
#[derive(Debug, thiserror::Error)]
#[error("every shard was seen empty, but a unit could still come back")]
pub struct SoldOutUnsettled;

fn sold_out_unsettled() -> AppError {
    AppError::Store(StoreError::transient(GRAB, SoldOutUnsettled))
}

impl GrabService {
    async fn sale(&self, sale_id: &SaleId) -> Result<Sale, AppError> {
        self.catalog
            .find_sale(sale_id)
            .await?
            .ok_or(AppError::SaleNotFound)
    }

    /// Refuses a blocked user before anything else is looked at.
    async fn refuse_blocked(&self, user: &UserId, now: DateTime<Utc>) -> Result<(), AppError> {
        if self.blocked_users.is_blocked(user, now).await? {
            tracing::debug!(%user, "refused a blocked user");
            return Err(AppError::Blocked);
        }
        Ok(())
    }

    /// The sale, if a grab path (or its challenge) may be handed out for it now: once it
    /// is (about to be) active and until it ends, and never to a blocked user.
    async fn sale_open_to(&self, sale_id: &SaleId, user: &UserId) -> Result<Sale, AppError> {
        let now = self.clock.now();
        self.refuse_blocked(user, now).await?;
        let sale = self.sale(sale_id).await?;
        match (sale.phase(now), sale.phase(now + TOKEN_LEAD)) {
            (SalePhase::Paused, _) => Err(AppError::Paused),
            (SalePhase::Ended, _) => Err(AppError::Ended),
            (_, SalePhase::Upcoming) => Err(AppError::NotStarted),
            _ => Ok(sale),
        }
    }

    /// The challenge `user` solves for a grab path of a sale that asks for one. Issued
    /// only once the sale opens, as the path is: a challenge solved in advance would
    /// bring every buyer back at the start instant, which is what it is there to stop.
    pub async fn issue_challenge(
        &self,
        sale_id: &SaleId,
        user: &UserId,
    ) -> Result<IssuedChallenge, AppError> {
        let sale = self.sale_open_to(sale_id, user).await?;
        let work = sale.challenge_work.ok_or(AppError::NoChallenge)?;
        let now = self.clock.now();
        let expires_at = sale.ends_at.min(now + CHALLENGE_LIFETIME);
        Ok(self.challenges.issue(sale_id, user, work, now, expires_at))
    }

    /// A grab path for this user, only once the sale is (about to be) active, and never
    /// for a blocked user. A sale that asks for a challenge needs its `solution`, which
    /// is checked first, in memory, so a wrong one costs no call at all; the path it
    /// buys names the challenge's own order, so the same solution again gets a path to
    /// that same order, never a second unit.
    pub async fn issue_pass(
        &self,
        sale_id: &SaleId,
        user: &UserId,
        solution: Option<&serde_json::Value>,
    ) -> Result<GrabPass, AppError> {
        let solved = solution
            .map(|solution| {
                self.challenges
                    .verify(solution, sale_id, user, self.clock.now())
            })
            .transpose()?;
        let sale = self.sale_open_to(sale_id, user).await?;
        let order = match (sale.challenge_work, solved) {
            (Some(_), None) => return Err(AppError::ChallengeRequired),
            (_, Some(solved)) => solved.order(),
            (None, None) => self.ids.ulid(),
        };
        let now = self.clock.now();
        let expires_at = sale.ends_at.min(now + GRAB_PATH_LIFETIME);
        let token = self
            .signer
            .issue_for_order(sale_id, user, order, expires_at);
        Ok(GrabPass {
            grab_path: format!("/sales/{sale_id}/grab/{token}"),
            expires_at,
        })
    }

    /// Reserves one unit for `user`, or says why not, and what it cost.
    ///
    /// No write at all once the gate knows the sale is sold out, or for a blocked user
    /// (whose grab path, issued before the block, is refused too). A refused first
    /// attempt reads nothing. Only an [`Attempt::Retry`] may be the retry of a grab
    /// whose answer was lost after it took a unit, so only a retry that the gate
    /// refuses pays one read, on the buyer's own key, to answer that order. A database
    /// answer that this path's order is held is itself proof of a retry, and is
    /// answered the same way whatever the client said.
    ///
    /// A reservation that committed is answered as one: when a reserve's outcome is
    /// unknown the grab resolves it before answering, and a failed hand-over to the
    /// queue does not turn a held unit into an error (its buyer can pay it without a
    /// timer, and the reconciler releases it past its deadline if they do not).
    pub async fn grab(
        &self,
        sale_id: &SaleId,
        token: &str,
        user: &UserId,
        attempt: Attempt,
    ) -> GrabReport {
        let mut tally = Tally::default();
        let outcome = self
            .grab_counted(sale_id, token, user, attempt, &mut tally)
            .await;
        GrabReport {
            outcome,
            reserves: tally.reserves,
            contended: tally.contended,
        }
    }

    async fn grab_counted(
        &self,
        sale_id: &SaleId,
        token: &str,
        user: &UserId,
        attempt: Attempt,
        tally: &mut Tally,
    ) -> Answer {
        let started = self.clock.now();
        // The path's signature first, in memory: a forged or junk path (an unknown sale
        // id included) costs no call to the store. A genuine one that expired is told
        // whether its sale ended.
        let order_id = match self.signer.check(token, sale_id, user, started) {
            Ok(order_id) => Some(order_id),
            Err(PathRefusal::Expired) => None,
            Err(PathRefusal::Forged) => return Err(AppError::InvalidToken),
        };
        self.refuse_blocked(user, started).await?;
        let sale = self.sale(sale_id).await?;
        let halted = match sale.phase(started) {
            // Not yet on this function's clock: a retry's first try may have committed
            // on a function whose clock is ahead.
            SalePhase::Upcoming => Some(AppError::NotStarted),
            SalePhase::Paused => Some(AppError::Paused),
            SalePhase::Ended => Some(AppError::Ended),
            SalePhase::Active => None,
        };
        if let Some(refusal) = halted {
            let outcome = self
                .refuse_halted(order_id.as_ref(), user, attempt, refusal)
                .await;
            if let Ok(GrabOutcome::Resumed(held)) = &outcome {
                self.hand_over(held, attempt).await;
            }
            return outcome;
        }
        let order_id = order_id.ok_or(AppError::InvalidToken)?;
        tally.doubt = Doubt::recall(&self.gate, &sale, &order_id);
        let mut walk = Walk::new(&sale, user, order_id.clone(), started, tally);
        self.give_back_parked_takes(&sale).await;
        let outcome = self.take_a_unit(&mut walk, attempt).await;
        if let Ok(GrabOutcome::Reserved(held) | GrabOutcome::Resumed(held)) = &outcome {
            self.hand_over(held, attempt).await;
        }
        std::mem::take(&mut tally.doubt).hand_on(
            &self.gate,
            &sale,
            &order_id,
            &outcome,
            self.clock.now(),
        );
        outcome
    }

    /// A sale paused, ended or not started (on this function's clock) takes no grab. But
    /// a marked retry, whose first attempt may have committed just before, gets its order
    /// back (one read), as after a sell-out: a buyer must not lose a unit they hold to a
    /// pause, or to a clock behind the one that took it.
    async fn refuse_halted(
        &self,
        order_id: Option<&OrderId>,
        user: &UserId,
        attempt: Attempt,
        refusal: AppError,
    ) -> Answer {
        if let (Some(order_id), Attempt::Retry) = (order_id, attempt) {
            match self.resume(order_id, user).await {
                Ok(Some(held)) => return Ok(GrabOutcome::Resumed(held)),
                Ok(None) => {}
                // The path's order settled: its fate says more than the sale's phase.
                Err(failed) => return Err(failed),
            }
        }
        Err(refusal)
    }

    /// Walks the shards until one gives the order a unit, all are found empty, or the
    /// walks or the budget are spent.
    async fn take_a_unit(&self, walk: &mut Walk<'_>, attempt: Attempt) -> Answer {
        let mut shards = match self.first_walk(walk, attempt).await? {
            ControlFlow::Continue(shards) => shards,
            ControlFlow::Break(answered) => return Ok(answered),
        };
        loop {
            let left = match self.walk_once(walk, shards).await {
                ControlFlow::Continue(left) => left,
                ControlFlow::Break(answer) => return answer,
            };
            shards = match self.next_walk(walk, left).await {
                ControlFlow::Continue(shards) => shards,
                ControlFlow::Break(answer) => return answer,
            };
        }
    }

    /// The first walk's shards: those the gate thinks worth a write, the doubted one
    /// first. Sold out as far as this process knows, so no write, unless this path's
    /// order may hold a unit: a request that repeats a winner's (with or without the
    /// retry header) is told so, for one read, instead of "sold out"; a take whose hold
    /// never landed is finished by one reserve on its shard. Before "sold out" the grab
    /// waits for this process's takes in flight, and marks too old to trust (a recheck
    /// that could not read) answer 503 instead.
    async fn first_walk(
        &self,
        walk: &mut Walk<'_>,
        attempt: Attempt,
    ) -> Result<ControlFlow<GrabOutcome, Vec<u16>>, AppError> {
        let (mut shards, stale) = self
            .shards_worth_a_write(walk.sale, walk.user, walk.started)
            .await;
        let doubted = walk.tally.doubt.shard.is_some();
        if shards.is_empty() && (doubted || attempt == Attempt::Retry) {
            // A doubted take elsewhere than the hold is no one's: it goes back now, or
            // the unit waits for the reconciler while the sale looks sold out.
            let held = match walk.tally.doubt.shard {
                Some(doubted) => self.held_after_all(walk, doubted).await?,
                None => self.resume(walk.order_id(), walk.user).await?,
            };
            if let Some(held) = held {
                return Ok(ControlFlow::Break(GrabOutcome::Resumed(held)));
            }
        }
        if shards.is_empty() && !doubted {
            shards = self.once_takes_land(walk).await?;
            if shards.is_empty() && stale {
                // Its marks are stale, and the table did not answer or was not asked.
                return Err(sold_out_unsettled());
            }
            if shards.is_empty() {
                return Ok(ControlFlow::Break(GrabOutcome::SoldOut(SoldOutBy::Gate)));
            }
        }
        walk.tally
            .doubt
            .lead(&mut shards, &self.gate, walk.sale, walk.order_id());
        Ok(ControlFlow::Continue(shards))
    }

    /// One walk over `shards` in order, until one answers the grab, or a few in a row
    /// are contended: past that the crowd is everywhere, and waiting is cheaper than
    /// probing (every contended shard is one more write for nothing).
    async fn walk_once(
        &self,
        walk: &mut Walk<'_>,
        shards: Vec<u16>,
    ) -> ControlFlow<Answer, WalkLeft> {
        walk.walks += 1;
        let reserves_before = walk.tally.reserves;
        let mut left = WalkLeft::default();
        let mut shards = shards.into_iter();
        for shard in shards.by_ref() {
            if self.clock.now() - walk.started >= self.contention.budget {
                left.contended.push(shard);
                break;
            }
            match self.ask(walk, shard).await {
                ShardAnswer::Answered(answer) => return ControlFlow::Break(answer),
                ShardAnswer::Empty => {}
                ShardAnswer::AtCap => left.at_cap.push(shard),
                ShardAnswer::Contended => left.contended.push(shard),
                ShardAnswer::EndWalk => break,
            }
            if left.contended.len() >= self.contention.max_contended_per_walk as usize {
                break;
            }
        }
        left.untried = shards.collect();
        left.wrote = walk.tally.reserves > reserves_before;
        ControlFlow::Continue(left)
    }

    /// Asks `shard` for a unit, if the gate lets this grab write there now.
    async fn ask(&self, walk: &mut Walk<'_>, shard: u16) -> ShardAnswer {
        let (sale_id, shards) = (&walk.sale.sale_id, walk.sale.shards);
        let slot = if walk.tally.doubt.is_on(shard) {
            // The shard this order may have a take on is asked whatever the crowd.
            self.gate.admit_regardless(sale_id, shards, shard)
        } else if !self.gate.is_worth_a_write(sale_id, shards, shard) {
            // Another grab found it empty since this walk was planned: a write there
            // now would only be refused (and billed).
            return ShardAnswer::Empty;
        } else {
            let cap = self.contention.max_takes_in_flight_per_shard;
            match self.gate.admit(sale_id, shards, shard, cap) {
                Some(slot) => slot,
                None => return ShardAnswer::AtCap,
            }
        };
        walk.reservation.shard = shard;
        walk.tally.reserves += 1;
        let sent_at = self.clock.now();
        let answer = self
            .ledger
            .reserve(walk.sale, shard, &walk.reservation)
            .await;
        self.take_in(walk, shard, answer, slot, sent_at).await
    }

    /// What a reserve's answer on `shard` means for the grab. The slot frees only once
    /// the gate knows what the take found, so a grab waiting for it never writes to a
    /// shard just found empty, and a grab waiting for takes to land (see
    /// [`GrabService::once_takes_land`]) never answers "sold out" before a unit that the
    /// reserve gave back is marked.
    async fn take_in(
        &self,
        walk: &mut Walk<'_>,
        shard: u16,
        answer: Result<Result<(), ReserveRefusal>, StoreError>,
        slot: TakeSlot,
        sent_at: DateTime<Utc>,
    ) -> ShardAnswer {
        let (sale_id, shards) = (&walk.sale.sale_id, walk.sale.shards);
        match answer {
            Ok(Ok(())) => {
                // The shard had a unit when this take landed: a mark from before it was
                // sent is stale (one after it may have seen the last unit go).
                self.gate
                    .mark_stocked_if_seen_empty_before(sale_id, shards, shard, sent_at);
                drop(slot);
                ShardAnswer::Answered(Ok(GrabOutcome::Reserved(walk.reservation.clone())))
            }
            Ok(Err(ReserveRefusal::ShardEmpty(takers))) => {
                let now = self.clock.now();
                let undo_until = takers
                    .latest_take()
                    .map(|began| began + self.contention.undo_window)
                    .filter(|until| *until > now);
                walk.undo_possible_until = walk.undo_possible_until.max(undo_until);
                if walk.tally.doubt.is_on(shard) {
                    let order_id = &walk.reservation.order_id;
                    walk.tally
                        .doubt
                        .refute(&self.gate, walk.sale, order_id, now);
                }
                // Dated when the reserve was sent: the shard was empty at some instant
                // between then and now, and a unit may have come back since.
                self.gate
                    .mark_empty(sale_id, shards, shard, takers, sent_at);
                ShardAnswer::Empty
            }
            Ok(Err(ReserveRefusal::LimitReached)) => {
                // The store gave the take back when the hold was refused: the shard has
                // that unit again, whatever it looked like meanwhile.
                self.gate.mark_stocked(sale_id, shards, shard);
                ShardAnswer::Answered(Err(AppError::LimitReached))
            }
            Ok(Err(ReserveRefusal::AlreadyHeld)) => {
                // Held already, so a take of this order's here was given back: a shard
                // seen empty with this order among its takers has that unit again.
                self.gate
                    .reopen_if_taken_by(sale_id, shards, shard, walk.order_id());
                drop(slot);
                let held = self.resume(walk.order_id(), walk.user).await;
                ShardAnswer::Answered(held.and_then(|held| {
                    held.map(GrabOutcome::Resumed)
                        .ok_or(AppError::OrderNotFound)
                }))
            }
            Ok(Err(ReserveRefusal::Contended)) => {
                walk.tally.contended += 1;
                if walk.tally.doubt.is_on(shard) {
                    ShardAnswer::EndWalk
                } else {
                    ShardAnswer::Contended
                }
            }
            Err(error) if error.outcome() == WriteOutcome::InDoubt => {
                // The slot is kept until the doubt is looked into: a take superseded
                // elsewhere goes back meanwhile.
                let answer = self.resolve_unknown(walk, shard, error).await;
                drop(slot);
                answer
            }
            // Never sent (nothing is in doubt, and asking again now would only be
            // refused the same way), or refused for good.
            Err(error) => ShardAnswer::Answered(Err(error.into())),
        }
    }

    /// A reserve on `shard` was sent and not answered, so a take of this order's may be
    /// there. One read of the buyer's item (which names the path's order) answers the
    /// grab if the hold landed. If not, the walk ends, and the next begins on `shard`.
    async fn resolve_unknown(
        &self,
        walk: &mut Walk<'_>,
        shard: u16,
        error: StoreError,
    ) -> ShardAnswer {
        tracing::warn!(
            order_id = %walk.reservation.order_id,
            shard,
            error = &error as &dyn std::error::Error,
            "reserve outcome unknown; reading the buyer's item"
        );
        walk.tally.doubt.suspect(shard);
        match self.held_after_all(walk, shard).await {
            Ok(Some(held)) => return ShardAnswer::Answered(Ok(GrabOutcome::Reserved(held))),
            Ok(None) => {}
            // A read that fails too leaves the outcome as unknown as before: the reserve
            // on this shard, asked again, tells.
            Err(read) if read.is_retryable() => {}
            Err(read) => return ShardAnswer::Answered(Err(read)),
        }
        walk.unknown_outcomes += 1;
        if walk.unknown_outcomes > self.contention.max_unknown_outcomes {
            return ShardAnswer::Answered(Err(error.into()));
        }
        ShardAnswer::EndWalk
    }

    /// The next walk's shards: what the last one did not reach first, then what was at
    /// the cap, then what was contended, less what another process may have found empty
    /// meanwhile; the doubted shard first. None left: sold out, once a unit that an
    /// undone take may give back has been looked for.
    async fn next_walk(
        &self,
        walk: &mut Walk<'_>,
        left: WalkLeft,
    ) -> ControlFlow<Answer, Vec<u16>> {
        let (sale_id, shard_count) = (&walk.sale.sale_id, walk.sale.shards);
        let next = left
            .untried
            .into_iter()
            .chain(left.at_cap)
            .chain(left.contended)
            .collect();
        let mut shards = self.gate.still_worth_a_write(sale_id, shard_count, next);
        walk.tally
            .doubt
            .lead(&mut shards, &self.gate, walk.sale, walk.order_id());
        if shards.is_empty() {
            let back = match self.once_takes_land(walk).await {
                Ok(back) if back.is_empty() => self.stock_back_from_undone_takes(walk).await,
                landed => landed,
            };
            return match back {
                // A shard this walk did not try was seen empty too long ago to say so
                // (its recheck failed): a unit may be back there.
                Ok(shards)
                    if shards.is_empty()
                        && self
                            .gate
                            .has_stale_marks(sale_id, shard_count, walk.started) =>
                {
                    ControlFlow::Break(Err(sold_out_unsettled()))
                }
                Ok(shards) if shards.is_empty() => {
                    ControlFlow::Break(Ok(GrabOutcome::SoldOut(SoldOutBy::Database)))
                }
                // No contention pause: the wait for the unit was the pause.
                Ok(shards) => ControlFlow::Continue(shards),
                Err(unsettled) => ControlFlow::Break(Err(unsettled)),
            };
        }
        self.pause_before_next_walk(walk, left.wrote).await?;
        ControlFlow::Continue(shards)
    }

    /// Waits before the next walk, growing with the walks (full jitter), or gives up
    /// once the walks or the budget are spent.
    async fn pause_before_next_walk(
        &self,
        walk: &mut Walk<'_>,
        wrote: bool,
    ) -> ControlFlow<Answer> {
        // Every shard left was at the cap: a slot frees within a take's round trip, so
        // that wait is not a walk.
        if !wrote {
            walk.walks -= 1;
        }
        if walk.walks >= self.contention.max_walks
            || self.clock.now() - walk.started >= self.contention.budget
        {
            return ControlFlow::Break(self.give_up_contended(walk).await);
        }
        let pause = if wrote {
            self.contention.pause_before(walk.walks, walk.order_id())
        } else {
            walk.slot_waits += 1;
            self.contention
                .slot_wait_before(walk.slot_waits, walk.order_id())
        };
        self.pause.pause(pause).await;
        ControlFlow::Continue(())
    }

    /// Contention outlasted the walks or the budget: transient, the buyer's retry may
    /// find a shard free. But before a grab gives up with a reserve's outcome still
    /// unknown, one more read of the buyer's item: a lost reserve that landed meanwhile
    /// is answered as the reservation it is, not as a 503 whose retry the gate may call
    /// sold out.
    async fn give_up_contended(&self, walk: &mut Walk<'_>) -> Answer {
        if let Some(shard) = walk.tally.doubt.shard
            && let Some(held) = self.held_after_all(walk, shard).await?
        {
            return Ok(GrabOutcome::Reserved(held));
        }
        Err(AppError::Store(StoreError::transient(
            GRAB,
            ContentionOutlasted { walks: walk.walks },
        )))
    }

    /// The sale's shards that the gate thinks worth a write, in the buyer's order. If
    /// this grab drew the sale's one recheck turn of the interval, it first reads the
    /// shards (one read, no write) and the gate takes in what came back. Whether some
    /// mark is stale still (the read failed, or another grab has the turn): then its
    /// grab has nothing known to answer "sold out" on.
    async fn shards_worth_a_write(
        &self,
        sale: &Sale,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> (Vec<u16>, bool) {
        let mut plan = self
            .gate
            .plan(&sale.sale_id, sale.shards, sale.shard_order(user), now);
        if let Some(recheck) = plan.recheck.take() {
            // What the read saw is dated when it was sent, as the reserve's refusals are.
            let sent_at = self.clock.now();
            let read = self.ledger.shard_states(sale).await;
            recheck.settle(read, sent_at);
            plan = self
                .gate
                .plan(&sale.sale_id, sale.shards, sale.shard_order(user), now);
        }
        (plan.shards, plan.stale)
    }

    /// Every shard was found empty, one of them with a take young enough to be undone
    /// still: waits until it is not (at most one undo window past the grab's budget),
    /// then reads every shard once (no write) and answers the shards the gate, told what
    /// the read saw, now thinks worth a write. Once per grab; empty: sold out after all.
    /// Not known, and so a 503 that the buyer's retry settles rather than "sold out": a
    /// read that failed, or a take on an empty shard that the read finds still young.
    async fn stock_back_from_undone_takes(
        &self,
        walk: &mut Walk<'_>,
    ) -> Result<Vec<u16>, AppError> {
        let Some(mut until) = walk.undo_possible_until.take() else {
            return Ok(Vec::new());
        };
        let sale = walk.sale;
        // One undo window past the budget at most: a take seen before the budget ran
        // out is old by then, and the wait ends inside the function's deadline.
        let last_look = walk.started + self.contention.budget + self.contention.undo_window;
        let undo_window = self.contention.undo_window;
        for _ in 0..MAX_LOOKS_FOR_UNDONE_TAKES {
            let wait = (until.min(last_look) - self.clock.now())
                .to_std()
                .unwrap_or_default();
            self.pause.pause(wait).await;
            let sent_at = self.clock.now();
            let states = self.ledger.shard_states(sale).await.inspect_err(|error| {
                tracing::warn!(
                    sale_id = %sale.sale_id,
                    error = error as &dyn std::error::Error,
                    "could not read the shards after a young take; answering 503, not sold out"
                );
            })?;
            let now = self.clock.now();
            // The read covers every shard: another one's last take may be younger than
            // the one waited for.
            let youngest = states
                .iter()
                .filter(|state| state.available == 0)
                .filter_map(|state| state.takers.latest_take())
                .map(|taken| taken + undo_window)
                .filter(|undo_until| *undo_until > now)
                .max();
            self.gate.apply(&sale.sale_id, states, sent_at);
            let shards = self
                .gate
                .plan(&sale.sale_id, sale.shards, sale.shard_order(walk.user), now)
                .shards;
            match youngest {
                _ if !shards.is_empty() => return Ok(shards),
                None => return Ok(shards),
                Some(young_until) if now < last_look => until = young_until,
                Some(_) => break,
            }
        }
        Err(sold_out_unsettled())
    }

    /// Every shard is known empty. But a reserve in flight in this process may yet give
    /// its unit back (one whose hold is refused undoes its take before it answers): the
    /// grab waits for them to land, within its budget, and answers the shards that the
    /// gate then thinks worth a write; none: sold out. Still in flight one undo window
    /// past the budget: "sold out" is not known, and the answer is a 503.
    async fn once_takes_land(&self, walk: &Walk<'_>) -> Result<Vec<u16>, AppError> {
        let (sale_id, shards) = (&walk.sale.sale_id, walk.sale.shards);
        for _ in 0..MAX_POLLS_FOR_LANDING {
            if self.gate.takes_in_flight(sale_id, shards) == 0 {
                let order = walk.sale.shard_order(walk.user).collect();
                return Ok(self.gate.still_worth_a_write(sale_id, shards, order));
            }
            // As the wait for a young take: one undo window past the budget at most,
            // inside the function's deadline; a take lands within a write's round trip.
            if self.clock.now() - walk.started
                >= self.contention.budget + self.contention.undo_window
            {
                break;
            }
            self.pause.pause(LANDING_POLL).await;
        }
        Err(sold_out_unsettled())
    }

    /// The path's order, if it is held and open, to answer again (the grab finishes its
    /// hand-over when it answers; the queue deduplicates by order id). A path whose
    /// order is settled is used up, and its grab is told the order's fate
    /// (`OrderExpired`, `OrderCancelled`, `OrderPaid`): a buyer whose first try held a
    /// unit and whose retries met an outage as long as the payment window learns that
    /// the unit was theirs and lapsed, not that their path is invalid. `None`: no hold
    /// at all.
    async fn resume(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<Reservation>, AppError> {
        match self.orders.find(order_id, user).await? {
            Some((order, reservation)) if order.status.is_open() => Ok(Some(reservation)),
            Some((order, _)) => Err(settled_error(order.status)),
            None => Ok(None),
        }
    }

    /// A reserve on `shard` whose outcome was lost may have taken a unit there, but the
    /// order turned out held on another shard (a concurrent request of the same path
    /// won there): that take is no one's, so it goes back at once rather than wait for
    /// the reconciler while buyers are told "sold out". Failing that, the take is still
    /// there.
    async fn drop_if_superseded(
        &self,
        sale: &Sale,
        held: &Reservation,
        shard: u16,
    ) -> Result<(), StoreError> {
        if held.shard == shard {
            return Ok(());
        }
        let given_back = self
            .ledger
            .drop_superseded_take(held, shard)
            .await
            .inspect_err(|error| {
                tracing::warn!(
                    order_id = %held.order_id,
                    shard,
                    error = error as &dyn std::error::Error,
                    "giving back a superseded take failed; the next grab gives it back"
                );
            })?;
        if given_back {
            // Its unit is back: later grabs of this process may take it at once.
            self.gate.mark_stocked(&sale.sale_id, sale.shards, shard);
        }
        Ok(())
    }

    /// The order's hold, if a reserve on `shard` whose answer was lost turns out to have
    /// landed (one read of the buyer's item). If it is held on another shard (a
    /// concurrent request of the same path won there), a take on `shard` is no one's and
    /// goes back.
    async fn held_after_all(
        &self,
        walk: &mut Walk<'_>,
        shard: u16,
    ) -> Result<Option<Reservation>, AppError> {
        let held = self.resume(walk.order_id(), walk.user).await?;
        if let Some(held) = &held {
            walk.tally.doubt.resolve();
            if self
                .drop_if_superseded(walk.sale, held, shard)
                .await
                .is_err()
            {
                // The take is still there, no one's. The buyer holds their unit and is
                // answered so; the take is parked with the gate, and the next grab of
                // the sale in this process gives it back, within seconds rather than
                // the reconciler's grace.
                self.gate.park_superseded_take(held, shard);
            }
        }
        Ok(held)
    }

    /// Gives back the superseded takes parked with the gate for this sale (see
    /// [`GrabService::held_after_all`]), before this grab walks: a unit no one holds is
    /// this grab's to take. One that fails again stays parked for the next grab.
    async fn give_back_parked_takes(&self, sale: &Sale) {
        for (held, shard) in self
            .gate
            .unpark_superseded_takes(&sale.sale_id, sale.shards)
        {
            if self.drop_if_superseded(sale, &held, shard).await.is_err() {
                self.gate.park_superseded_take(&held, shard);
            }
        }
    }

    /// Sends a committed reservation to the order consumer. If that fails, the hold
    /// stays and the buyer is still told they hold it: the hand-over is the system's
    /// job, not the buyer's. A retry of the same grab path sends it again (the queue
    /// deduplicates, see [`OrderMessage::deduplication_id`]); without one, the buyer
    /// can still pay (pay needs no
    /// timer) and the [`Reconciler`](crate::service::Reconciler) releases the hold once
    /// it is past its deadline. A retry says so: the consumer then gives back what its
    /// path's earlier requests may have taken elsewhere ([`OrderMessage::retried`]).
    async fn hand_over(&self, reservation: &Reservation, attempt: Attempt) {
        let message = OrderMessage {
            reservation: reservation.clone(),
            retried: attempt == Attempt::Retry,
        };
        if let Err(error) = self.queue.enqueue(&message).await {
            tracing::error!(
                order_id = %reservation.order_id,
                error = &error as &dyn std::error::Error,
                "enqueue failed; the hold waits for a retry or the reconciler"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_stay_under_their_ceiling_and_differ_between_orders() {
        let policy = ContentionPolicy::DEFAULT;
        let sale = SaleId::parse("s").unwrap();
        let orders: Vec<OrderId> = (0..200).map(|_| OrderId::new(sale.clone())).collect();
        for walk in 1..8 {
            let ceiling = policy
                .pause_base
                .saturating_mul(1 << (walk - 1))
                .min(policy.pause_cap);
            let pauses: Vec<_> = orders
                .iter()
                .map(|order| policy.pause_before(walk, order))
                .collect();
            assert!(pauses.iter().all(|pause| *pause <= ceiling));
            assert!(
                pauses.iter().any(|pause| *pause != pauses[0]),
                "full jitter must not pause in step"
            );
        }
    }
}
