//! Sale administration and the public sale page.

use std::sync::Arc;

use crate::control::{AuditTrail, ControlWrite, Controlled, SaleAction, SaleAudit, SaleControl};
use crate::error::AppError;
use crate::fulfilment::{BuyerCursor, FulfilmentLine, FulfilmentPage};
use crate::ids::{SaleId, UserId};
use crate::order::OrderStatus;
use crate::ports::{Clock, IdSource, OrderBook, SaleCatalog, StockLedger};
use crate::sale::{
    MAX_ABANDONED_HOLDS, Sale, SaleCursor, SaleDraft, SaleList, SaleStats, SaleView,
};

/// The most orders one page of the export may hold: 15,000 lines of CSV or JSON are
/// about 3.5 MB, within Lambda's 6 MB response whatever the buyers' ids.
pub const MAX_ORDERS_PER_PAGE: u32 = 15_000;

/// Sale administration and the public sale page.
pub struct SaleService {
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    pub orders: Arc<dyn OrderBook>,
    pub clock: Arc<dyn Clock>,
    /// The ids of sales created without one.
    pub ids: Arc<dyn IdSource>,
}

impl SaleService {
    pub async fn create(&self, draft: SaleDraft) -> Result<Sale, AppError> {
        let sale = Sale::from_draft_or(draft, || SaleId::from_ulid(self.ids.ulid()))?;
        if self.catalog.create_sale(&sale).await? {
            Ok(sale)
        } else {
            Err(AppError::SaleExists)
        }
    }

    async fn sale(&self, sale_id: &SaleId) -> Result<Sale, AppError> {
        self.catalog
            .find_sale(sale_id)
            .await?
            .ok_or(AppError::SaleNotFound)
    }

    pub async fn view(&self, sale_id: &SaleId) -> Result<SaleView, AppError> {
        let sale = self.sale(sale_id).await?;
        let available = self.ledger.availability(&sale).await?.iter().sum();
        Ok(SaleView::new(&sale, available, self.clock.now()))
    }

    /// One page of every sale for the admin console, the latest-ending first, each as
    /// its page shows it (status and stock left): one index read, then each sale's
    /// shards, read side by side.
    pub async fn list(
        &self,
        after: Option<&SaleCursor>,
        limit: usize,
    ) -> Result<SaleList, AppError> {
        let page = self.catalog.list_sales(after, limit).await?;
        let now = self.clock.now();
        let views = page.sales.iter().map(|sale| async move {
            let shards = self.ledger.availability(sale).await?;
            Ok::<_, AppError>(SaleView::new(sale, shards.iter().sum(), now))
        });
        Ok(SaleList {
            sales: futures::future::try_join_all(views).await?,
            next_cursor: page.next.as_ref().map(SaleCursor::encode),
        })
    }

    /// Pauses, resumes or ends the sale for `by`, recording it in the sale's audit trail.
    /// A repeat (pausing a paused sale, ending an ended one) answers the control as it
    /// is and records nothing. A sale that is over, by its window or ended early, is
    /// never paused or resumed again.
    pub async fn control(
        &self,
        sale_id: &SaleId,
        action: SaleAction,
        by: &UserId,
    ) -> Result<Controlled, AppError> {
        let now = self.clock.now();
        let sale = self.sale(sale_id).await?;
        let change = SaleAudit {
            action,
            by: by.clone(),
            at: now,
        };
        // Already where the action leads: a repeat, which changes nothing. Anywhere else
        // the sale is ended, which nothing reopens.
        let refused = |current: SaleControl| {
            if current == action.target() {
                Ok(Controlled {
                    sale_id: sale_id.clone(),
                    control: current,
                    changed: false,
                })
            } else {
                Err(AppError::Ended)
            }
        };
        if now >= sale.ends_at {
            // Over by its window: ended, whatever its item says.
            return refused(SaleControl::Ended);
        }
        match self.catalog.control_sale(sale_id, &change).await? {
            ControlWrite::Changed => Ok(Controlled {
                sale_id: sale_id.clone(),
                control: action.target(),
                changed: true,
            }),
            ControlWrite::Refused { current } => refused(current),
            ControlWrite::NoSale => Err(AppError::SaleNotFound),
        }
    }

    /// The sale's audit trail, newest first: at most `limit` entries.
    pub async fn audit(&self, sale_id: &SaleId, limit: usize) -> Result<AuditTrail, AppError> {
        self.sale(sale_id).await?;
        let entries = self.catalog.audit_trail(sale_id, limit).await?;
        Ok(AuditTrail { entries })
    }

    /// One page of the sale's orders for fulfilment, those in `status` (every order
    /// when `None`): the orders of at most `limit` buyers, read through the index after
    /// the buyer `cursor` names (as a previous page answered it). A page may hold none
    /// of `status` and still name a next one.
    pub async fn orders(
        &self,
        sale_id: &SaleId,
        status: Option<OrderStatus>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<FulfilmentPage, AppError> {
        let sale = self.sale(sale_id).await?;
        let after = cursor.map(BuyerCursor::parse).transpose()?;
        // A buyer holds at most the limit's orders and the abandoned ones: so many
        // buyers that a page stays well within one Lambda response (6 MB).
        let orders_per_buyer = sale.per_user_limit + MAX_ABANDONED_HOLDS;
        let most_buyers = (MAX_ORDERS_PER_PAGE / orders_per_buyer.max(1)).max(1);
        let limit = limit.min(usize::try_from(most_buyers).unwrap_or(usize::MAX));
        let page = self
            .orders
            .sale_orders(&sale, after.as_ref(), limit)
            .await?;
        Ok(FulfilmentPage {
            orders: page
                .orders
                .iter()
                .filter(|order| status.is_none_or(|status| order.status == status))
                .map(FulfilmentLine::from)
                .collect(),
            next_cursor: page.next.as_ref().map(BuyerCursor::encode),
        })
    }

    pub async fn stats(&self, sale_id: &SaleId) -> Result<SaleStats, AppError> {
        let sale = self.sale(sale_id).await?;
        let counts = self.orders.count(&sale).await?;
        Ok(SaleStats::reconcile(sale.stock_total, counts))
    }
}
