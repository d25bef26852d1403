//! The hot path: hand out grab paths, and turn a grab into a reservation.
//!
//! A grab walks the sale's shards in the buyer's order until one gives it a unit. Two
//! things make that walk more than a loop:
//! - **Contention.** A reserve is the brief's transaction, the take on the shard and the
//!   hold on the buyer's item (see [`StockLedger`]); on a shard hot enough that
//!   transactions cancel each other the store goes on there as take then hold, plain
//!   writes that queue. What still answers `Contended` is a write that met another
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

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::challenge::{CHALLENGE_LIFETIME, IssuedChallenge};
use crate::error::{AppError, StoreError, WriteOutcome};
use crate::gate::SoldOutGate;
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::Reservation;
use crate::ports::{
    Clock, OrderBook, OrderQueue, Pause, ProofOfWork, ReserveRefusal, SaleCatalog, StockLedger,
};
use crate::sale::{Sale, SalePhase, TOKEN_LEAD};
use crate::service::CachedBlocklist;
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
    /// its hold, and a hold refused for the buyer's limit gives the take back, one
    /// write later. (Counted from the take, not from its grab's start: a grab may wait
    /// for a slot or out of contention for most of its budget before it takes.) A grab that found every shard empty, one of them with a take this
    /// young, waits until that take is this old (within its budget) and reads the
    /// shards once before it answers "sold out", so that a unit about to come back is
    /// not answered as gone to every buyer in between.
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

/// Reserve attempts and contention seen by one grab.
#[derive(Debug, Default)]
struct Tally {
    reserves: u32,
    contended: u32,
    /// A shard on which this grab's order may have a take whose hold is missing (a
    /// reserve there answered nothing definite, and the read did not find the hold),
    /// until a reserve there answers definitely. See [`SoldOutGate::note_doubt`].
    in_doubt: Option<u16>,
    /// Whether `in_doubt` was ever set, so the gate has a doubt of this order's to
    /// update when the grab ends.
    doubted: bool,
    /// Until when a shard this grab found empty may get a unit back from an undone
    /// take (see [`ContentionPolicy::undo_window`]).
    undo_possible_until: Option<DateTime<Utc>>,
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
        match sale.phase(now + TOKEN_LEAD) {
            SalePhase::Upcoming => Err(AppError::NotStarted),
            SalePhase::Ended if sale.phase(now) == SalePhase::Ended => Err(AppError::Ended),
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
            (None, None) => ulid::Ulid::new(),
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
    ) -> Result<GrabOutcome, AppError> {
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
        match sale.phase(started) {
            SalePhase::Upcoming => return Err(AppError::NotStarted),
            SalePhase::Ended => return Err(AppError::Ended),
            SalePhase::Active => {}
        }
        let order_id = order_id.ok_or(AppError::InvalidToken)?;
        let outcome = self
            .take_a_unit(&sale, order_id.clone(), user, attempt, started, tally)
            .await;
        // A grab that gives up in doubt leaves the shard to its path's next request in
        // this process; one that knows what happened clears it.
        let in_doubt = match &outcome {
            Err(error) if error.is_retryable() => tally.in_doubt,
            _ => None,
        };
        if tally.doubted || in_doubt.is_some() {
            self.gate
                .note_doubt(sale_id, sale.shards, &order_id, in_doubt, self.clock.now());
        }
        outcome
    }

    /// The walk over the shards for `order_id`, once the request is known valid.
    async fn take_a_unit(
        &self,
        sale: &Sale,
        order_id: OrderId,
        user: &UserId,
        attempt: Attempt,
        started: DateTime<Utc>,
        tally: &mut Tally,
    ) -> Result<GrabOutcome, AppError> {
        let sale_id = &sale.sale_id;
        // A shard where this order may have a take whose hold is missing is asked
        // first, whatever the gate thinks of it: a reserve takes from the shard before
        // it holds, and only a reserve on the same shard finds a take that landed and
        // finishes it (going on elsewhere would strand that unit until the reconciler
        // returns it). The gate knows it from this path's earlier request that gave up
        // in doubt here, or from the takers of a shard it saw empty.
        tally.in_doubt = self.gate.shard_taken_by(sale_id, sale.shards, &order_id);
        tally.doubted = tally.in_doubt.is_some();
        let mut shards = self.shards_worth_a_write(sale, user, started).await;
        if shards.is_empty() {
            // Sold out as far as this process knows, so no write, unless this path's
            // order may hold a unit: a request that repeats a winner's (with or without
            // the retry header) is told so, for one read, instead of "sold out"; a take
            // whose hold never landed is finished by one reserve on its shard.
            if tally.in_doubt.is_none() && attempt == Attempt::First {
                return Ok(GrabOutcome::SoldOut(SoldOutBy::Gate));
            }
            if let Some(held) = self.resume(&order_id, user).await? {
                return Ok(GrabOutcome::Resumed(held));
            }
            if tally.in_doubt.is_none() {
                return Ok(GrabOutcome::SoldOut(SoldOutBy::Gate));
            }
        }
        if let Some(doubt) = tally.in_doubt {
            shards.retain(|shard| *shard != doubt);
            shards.insert(0, doubt);
        }
        let mut unknown_outcomes = 0_u32;
        let mut reservation = Reservation {
            order_id,
            sale_id: sale_id.clone(),
            user_id: user.clone(),
            shard: 0,
            created_at: started,
            expires_at: sale.payment_deadline(started),
            price: sale.price,
        };
        let mut walks = 0_u32;
        let mut slot_waits = 0_u32;
        loop {
            walks += 1;
            // Shards this walk found contended, or whose answer was lost.
            let mut contended = Vec::new();
            // Shards with stock that this process had enough takes in flight on.
            let mut at_cap = Vec::new();
            let mut wrote = false;
            let mut untried = shards.into_iter();
            for shard in untried.by_ref() {
                if self.clock.now() - started >= self.contention.budget {
                    contended.push(shard);
                    break;
                }
                // Another grab may have found it empty since this walk was planned: a
                // write there now would only be refused (and billed).
                if tally.in_doubt != Some(shard)
                    && !self.gate.is_worth_a_write(sale_id, sale.shards, shard)
                {
                    continue;
                }
                // The shard this order may have a take on is asked whatever the crowd.
                let slot = if tally.in_doubt == Some(shard) {
                    None
                } else {
                    let cap = self.contention.max_takes_in_flight_per_shard;
                    match self.gate.admit(sale_id, sale.shards, shard, cap) {
                        Some(slot) => Some(slot),
                        None => {
                            at_cap.push(shard);
                            continue;
                        }
                    }
                };
                reservation.shard = shard;
                tally.reserves += 1;
                wrote = true;
                let answer = self.ledger.reserve(sale, shard, &reservation).await;
                // The slot frees only once the gate knows what this take found (below),
                // so a grab waiting for it never writes to a shard just found empty; and
                // before anything else is awaited.
                if tally.in_doubt == Some(shard)
                    && matches!(answer, Ok(Err(ReserveRefusal::ShardEmpty(_))))
                {
                    // A take that had landed would have been found, not refused; and
                    // the gate stops pointing this order back here at once, or the walk
                    // would come back to it until it ran out of walks.
                    tally.in_doubt = None;
                    self.gate.note_doubt(
                        sale_id,
                        sale.shards,
                        &reservation.order_id,
                        None,
                        started,
                    );
                }
                match answer {
                    Ok(Ok(())) => {
                        self.gate.mark_stocked(sale_id, sale.shards, shard);
                        drop(slot);
                        self.hand_over(&reservation).await;
                        return Ok(GrabOutcome::Reserved(reservation));
                    }
                    Ok(Err(ReserveRefusal::ShardEmpty(takers))) => {
                        let now = self.clock.now();
                        let undo_until = takers
                            .latest_take()
                            .map(|began| began + self.contention.undo_window)
                            .filter(|until| *until > now);
                        tally.undo_possible_until = tally.undo_possible_until.max(undo_until);
                        self.gate
                            .mark_empty(sale_id, sale.shards, shard, takers, now);
                        drop(slot);
                    }
                    Ok(Err(ReserveRefusal::LimitReached)) => {
                        // The store gave the take back when the hold was refused: the
                        // shard has that unit again, whatever it looked like meanwhile.
                        self.gate.mark_stocked(sale_id, sale.shards, shard);
                        return Err(AppError::LimitReached);
                    }
                    Ok(Err(ReserveRefusal::AlreadyHeld)) => {
                        drop(slot);
                        return self
                            .resume(&reservation.order_id, user)
                            .await?
                            .map(GrabOutcome::Resumed)
                            .ok_or(AppError::OrderNotFound);
                    }
                    Ok(Err(ReserveRefusal::Contended)) => {
                        tally.contended += 1;
                        if tally.in_doubt == Some(shard) {
                            // Not another shard before this one answers: a take of
                            // ours may be here.
                            break;
                        }
                        contended.push(shard);
                    }
                    // Sent and unanswered: a take of this order may be on `shard`.
                    Err(error) if error.outcome() == WriteOutcome::InDoubt => {
                        tracing::warn!(
                            order_id = %reservation.order_id,
                            shard,
                            error = &error as &dyn std::error::Error,
                            "reserve outcome unknown; reading the buyer's item"
                        );
                        drop(slot);
                        tally.in_doubt = Some(shard);
                        tally.doubted = true;
                        match self.resume(&reservation.order_id, user).await {
                            Ok(Some(held)) => {
                                tally.in_doubt = None;
                                self.drop_if_superseded(&held, shard).await;
                                return Ok(GrabOutcome::Reserved(held));
                            }
                            Ok(None) => {}
                            // A read that fails too leaves the outcome as unknown as
                            // before: the reserve on this shard, asked again, tells.
                            Err(read) if read.is_retryable() => {}
                            Err(read) => return Err(read),
                        }
                        unknown_outcomes += 1;
                        if unknown_outcomes > self.contention.max_unknown_outcomes {
                            return Err(error.into());
                        }
                        break;
                    }
                    // Never sent (nothing is in doubt, and asking again now would only be
                    // refused the same way), or refused for good.
                    Err(error) => return Err(error.into()),
                }
                // Every contended shard is one more write for nothing: past a few in a
                // row the crowd is everywhere, and waiting is cheaper than probing.
                if contended.len() >= self.contention.max_contended_per_walk as usize {
                    break;
                }
            }
            // The next walk tries what this one did not reach first, then what it found
            // contended; another process may have found some of them empty meanwhile.
            let next: Vec<u16> = untried
                .chain(at_cap.iter().copied())
                .chain(contended)
                .filter(|shard| Some(*shard) != tally.in_doubt)
                .collect();
            shards = self.gate.still_worth_a_write(sale_id, sale.shards, next);
            // Sold out, unless the lost reserve took a unit after all: only a reserve's
            // answer on its shard, not the gate's, can tell.
            shards.splice(0..0, tally.in_doubt);
            if shards.is_empty() {
                shards.extend(self.gate.shard_taken_by(
                    sale_id,
                    sale.shards,
                    &reservation.order_id,
                ));
            }
            if shards.is_empty() {
                shards = self
                    .stock_back_from_undone_takes(sale, user, started, tally)
                    .await;
                if shards.is_empty() {
                    return Ok(GrabOutcome::SoldOut(SoldOutBy::Database));
                }
                // No contention pause: the wait for the undo was the pause.
                continue;
            }
            // Every shard left was at the cap: a slot frees within a take's round trip,
            // so that wait is not a walk.
            if !wrote {
                walks -= 1;
            }
            if walks >= self.contention.max_walks
                || self.clock.now() - started >= self.contention.budget
            {
                if let Some(held) = self.resume_in_doubt(tally, &reservation).await? {
                    return Ok(GrabOutcome::Reserved(held));
                }
                return Err(AppError::Store(StoreError::transient(
                    GRAB,
                    ContentionOutlasted { walks },
                )));
            }
            let pause = if wrote {
                self.contention.pause_before(walks, &reservation.order_id)
            } else {
                slot_waits += 1;
                self.contention
                    .slot_wait_before(slot_waits, &reservation.order_id)
            };
            self.pause.pause(pause).await;
        }
    }

    /// The sale's shards that the gate thinks worth a write, in the buyer's order. If
    /// this grab drew the sale's one recheck turn of the interval, it first reads the
    /// shards (one read, no write) and the gate takes in what came back.
    async fn shards_worth_a_write(
        &self,
        sale: &Sale,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> Vec<u16> {
        let mut plan = self
            .gate
            .plan(&sale.sale_id, sale.shards, sale.shard_order(user), now);
        if let Some(recheck) = plan.recheck.take() {
            recheck.settle(self.ledger.shard_states(sale).await, self.clock.now());
            plan = self
                .gate
                .plan(&sale.sale_id, sale.shards, sale.shard_order(user), now);
        }
        plan.shards
    }

    /// Every shard was found empty, one of them with a take young enough to be undone
    /// still: waits until it is not, or until the grab's budget is spent, then reads
    /// every shard once (no write) and answers the shards the gate, told what the read
    /// saw, now thinks worth a write. Once per grab; empty: sold out after all. (A unit
    /// back after the budget is spent is answered 503, and the buyer's retry takes it.)
    async fn stock_back_from_undone_takes(
        &self,
        sale: &Sale,
        user: &UserId,
        started: DateTime<Utc>,
        tally: &mut Tally,
    ) -> Vec<u16> {
        let Some(until) = tally.undo_possible_until.take() else {
            return Vec::new();
        };
        let until = until.min(started + self.contention.budget);
        let wait = (until - self.clock.now()).to_std().unwrap_or_default();
        self.pause.pause(wait).await;
        match self.ledger.shard_states(sale).await {
            Ok(states) => {
                let now = self.clock.now();
                self.gate.apply(&sale.sale_id, states, now);
                self.gate
                    .plan(&sale.sale_id, sale.shards, sale.shard_order(user), now)
                    .shards
            }
            Err(error) => {
                tracing::warn!(
                    sale_id = %sale.sale_id,
                    error = &error as &dyn std::error::Error,
                    "could not read the shards after a young take; answering sold out"
                );
                Vec::new()
            }
        }
    }

    /// The path's order, if it is held and open: the hand-over is finished (the queue
    /// deduplicates by order id) and the reservation answered again. A path whose order
    /// is settled is used up (`InvalidToken`). `None`: no hold at all.
    async fn resume(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<Reservation>, AppError> {
        match self.orders.find(order_id, user).await? {
            Some((order, reservation)) if order.status.is_open() => {
                self.hand_over(&reservation).await;
                Ok(Some(reservation))
            }
            Some(_) => Err(AppError::InvalidToken),
            None => Ok(None),
        }
    }

    /// A reserve on `shard` whose outcome was lost may have taken a unit there, but the
    /// order turned out held on another shard (a concurrent request of the same path
    /// won there): that take is no one's, so it goes back at once rather than wait for
    /// the reconciler while buyers are told "sold out".
    async fn drop_if_superseded(&self, held: &Reservation, shard: u16) {
        if held.shard == shard {
            return;
        }
        if let Err(error) = self.ledger.drop_superseded_take(held, shard).await {
            tracing::warn!(
                order_id = %held.order_id,
                shard,
                error = &error as &dyn std::error::Error,
                "giving back a superseded take failed; the reconciler returns it"
            );
        }
    }

    /// Before a grab gives up with a reserve's outcome still unknown, one more read of
    /// the buyer's item: a lost reserve that landed meanwhile is answered as the
    /// reservation it is, not as a 503 whose retry the gate may call sold out.
    async fn resume_in_doubt(
        &self,
        tally: &mut Tally,
        reservation: &Reservation,
    ) -> Result<Option<Reservation>, AppError> {
        let Some(shard) = tally.in_doubt else {
            return Ok(None);
        };
        let held = self
            .resume(&reservation.order_id, &reservation.user_id)
            .await?;
        if let Some(held) = &held {
            tally.in_doubt = None;
            self.drop_if_superseded(held, shard).await;
        }
        Ok(held)
    }

    /// Sends a committed reservation to the order consumer. If that fails, the hold
    /// stays and the buyer is still told they hold it: the hand-over is the system's
    /// job, not the buyer's. A retry of the same grab path sends it again (the queue
    /// deduplicates by order id); without one, the buyer can still pay (pay needs no
    /// timer) and the [`Reconciler`](crate::service::Reconciler) releases the hold once
    /// it is past its deadline.
    async fn hand_over(&self, reservation: &Reservation) {
        if let Err(error) = self.queue.enqueue(reservation).await {
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
