//! Sale administration and the public sale page.

use std::sync::Arc;

use crate::error::AppError;
use crate::ids::SaleId;
use crate::ports::{Clock, OrderBook, SaleCatalog, StockLedger};
use crate::sale::{Sale, SaleCursor, SaleDraft, SaleList, SaleStats, SaleView};

/// Sale administration and the public sale page.
pub struct SaleService {
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    pub orders: Arc<dyn OrderBook>,
    pub clock: Arc<dyn Clock>,
}

impl SaleService {
    pub async fn create(&self, draft: SaleDraft) -> Result<Sale, AppError> {
        let sale = Sale::from_draft(draft)?;
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

    pub async fn stats(&self, sale_id: &SaleId) -> Result<SaleStats, AppError> {
        let sale = self.sale(sale_id).await?;
        let counts = self.orders.count(&sale).await?;
        Ok(SaleStats::reconcile(sale.stock_total, counts))
    }
}
