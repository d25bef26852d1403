//! Sale administration and the public sale page.

use std::sync::Arc;

use crate::error::AppError;
use crate::ids::SaleId;
use crate::ports::{Clock, OrderBook, SaleCatalog, StockLedger};
use crate::sale::{Sale, SaleDraft, SaleStats, SaleView};

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

    pub async fn stats(&self, sale_id: &SaleId) -> Result<SaleStats, AppError> {
        let sale = self.sale(sale_id).await?;
        let counts = self.orders.count(&sale).await?;
        Ok(SaleStats::reconcile(sale.stock_total, counts))
    }
}
