//! Orders after the grab: the consumer's timer, cancel, and the timeout. Paying is
//! [`super::PaymentService`]'s.

use std::sync::Arc;

use crate::buyer_orders::{BuyerOrders, BuyerOrdersCursor};
use crate::error::AppError;
use crate::ids::{OrderId, UserId};
use crate::order::{Order, OrderMessage, OrderStatus, ReleaseReason, Reservation};
use crate::ports::{Clock, OrderBook, ReleaseScheduler, SaleCatalog, Settlement, StockLedger};

/// What the consumer's step left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerSet {
    /// The order is held and its release timer is set (now or before).
    Set,
    /// Paid, cancelled or expired before the consumer came; no timer is needed.
    AlreadySettled(OrderStatus),
}

/// Orders after the grab: the consumer, the owner's cancel, and the timeout.
pub struct OrderService {
    pub orders: Arc<dyn OrderBook>,
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    pub scheduler: Arc<dyn ReleaseScheduler>,
    pub clock: Arc<dyn Clock>,
}

impl OrderService {
    async fn owned(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<(Order, Reservation), AppError> {
        self.orders
            .find(order_id, user)
            .await?
            .ok_or(AppError::OrderNotFound)
    }

    pub async fn get(&self, order_id: &OrderId, user: &UserId) -> Result<Order, AppError> {
        Ok(self.owned(order_id, user).await?.0)
    }

    /// A page of `user`'s own orders in every sale, newest first, each as
    /// [`OrderService::get`] answers it: see [`OrderBook::buyer_orders`]. One index
    /// query; no other buyer's order can be in it, as it is keyed by the buyer.
    pub async fn mine(
        &self,
        user: &UserId,
        after: Option<&BuyerOrdersCursor>,
        limit: usize,
    ) -> Result<BuyerOrders, AppError> {
        Ok(self.orders.buyer_orders(user, after, limit).await?.into())
    }

    /// The consumer's step for one message: the held order's release timer is set, and
    /// a retry's order gets back the takes its path left on other shards than its hold.
    /// For a first try, one read of the hold and no write: the grab's hold already is
    /// the order, so the table is not written for a unit between its grab and its
    /// settlement. The timer carries the hold's own reservation, whatever else the
    /// message says, and is idempotent by order id. A retry that lands in another process than
    /// its first try knows nothing of a take that try left (its hold write in doubt, its
    /// invocation dead between the two writes) and reserves afresh: the first take is
    /// no one's, its unit out of every shard until the reconciler's grace, while buyers
    /// are told "sold out". Off the grab's path, for retries only: one read of the sale
    /// and one of its shards. A failure fails the step, so the message comes again.
    /// Safe to repeat.
    pub async fn receive(&self, message: &OrderMessage) -> Result<TimerSet, AppError> {
        let (order, held) = self.held(&message.reservation).await?;
        if message.retried {
            self.give_back_takes_elsewhere(&held).await?;
        }
        self.set_timer(&order, &held).await
    }

    /// The order and its hold, if the hold is the one `reservation` names: a message
    /// naming another shard is not what the grab committed.
    async fn held(&self, reservation: &Reservation) -> Result<(Order, Reservation), AppError> {
        match self
            .orders
            .find(&reservation.order_id, &reservation.user_id)
            .await?
        {
            Some((order, held)) if held.shard == reservation.shard => Ok((order, held)),
            _ => Err(AppError::OrderNotFound),
        }
    }

    async fn set_timer(&self, order: &Order, held: &Reservation) -> Result<TimerSet, AppError> {
        if !order.status.is_open() {
            return Ok(TimerSet::AlreadySettled(order.status));
        }
        self.scheduler.schedule_release(held).await?;
        Ok(TimerSet::Set)
    }

    /// Gives back the takes of `held`'s order on shards other than its hold's: no
    /// reserve can record a hold for it there any more, whatever the order's status.
    async fn give_back_takes_elsewhere(&self, held: &Reservation) -> Result<(), AppError> {
        let Some(sale) = self.catalog.find_sale(&held.sale_id).await? else {
            return Ok(());
        };
        let taken = self.ledger.shards_taken_by(&sale, &held.order_id).await?;
        for shard in taken.into_iter().filter(|shard| *shard != held.shard) {
            if self.ledger.drop_superseded_take(held, shard).await? {
                tracing::info!(order_id = %held.order_id, shard, "gave back a take a retry superseded");
            }
        }
        Ok(())
    }

    pub async fn cancel(&self, order_id: &OrderId, user: &UserId) -> Result<Order, AppError> {
        let (order, reservation) = self.owned(order_id, user).await?;
        if let Some(answer) = answer_if_settled(&order) {
            return answer;
        }
        let now = self.clock.now();
        let reason = if now >= reservation.expires_at {
            ReleaseReason::Expired
        } else {
            ReleaseReason::Cancelled
        };
        let final_status = match self.ledger.release(&reservation, reason, now).await? {
            Settlement::Applied => reason.final_status(),
            Settlement::AlreadySettled(status) => status,
            Settlement::Unknown => return Err(AppError::OrderNotFound),
        };
        match final_status {
            OrderStatus::Cancelled => {
                self.forget_timer(order_id).await;
                Ok(Order {
                    status: OrderStatus::Cancelled,
                    ..order
                })
            }
            other => Err(settled_error(other)),
        }
    }

    async fn forget_timer(&self, order_id: &OrderId) {
        if let Err(error) = self.scheduler.cancel_release(order_id).await {
            // Harmless: the timer will fire, find the order settled, and do nothing.
            tracing::warn!(%order_id, error = &error as &dyn std::error::Error, "could not delete the release timer");
        }
    }
}

/// The release function's use case: the payment window closed, give the unit back.
pub struct ExpiryService {
    pub ledger: Arc<dyn StockLedger>,
    pub clock: Arc<dyn Clock>,
}

impl ExpiryService {
    /// The release function's step, fired by the order's timer. Safe to repeat.
    pub async fn expire(&self, reservation: &Reservation) -> Result<Settlement, AppError> {
        if self.clock.now() < reservation.expires_at {
            return Err(AppError::NotYetDue);
        }
        Ok(self
            .ledger
            .release(reservation, ReleaseReason::Expired, self.clock.now())
            .await?)
    }
}

/// The answer to a cancel of an order read consistently, if it is settled: a settled
/// order never moves again, so no write can change the answer (a retried call, or one
/// after the timer fired). `None` while the order is open.
fn answer_if_settled(order: &Order) -> Option<Result<Order, AppError>> {
    match order.status {
        OrderStatus::Cancelled => Some(Ok(order.clone())),
        status if !status.is_open() => Some(Err(settled_error(status))),
        _ => None,
    }
}

/// What a buyer's step on an order that settled as `status` is told.
pub(crate) fn settled_error(status: OrderStatus) -> AppError {
    match status {
        OrderStatus::Paid => AppError::OrderPaid,
        OrderStatus::Cancelled => AppError::OrderCancelled,
        _ => AppError::OrderExpired,
    }
}
