//! [`SaleCatalog`]: the sale items.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_domain::ports::SaleCatalog;
use flashsale_domain::{Sale, SaleId, StoreError};

use super::DynamoStore;
use super::item::{self, GSI1_PK, GSI1_SK, PK};
use super::requests::{built, corrupt, names, values};
use super::transact;

const CREATE_SALE: &str = "dynamodb.create_sale";
const FIND_SALE: &str = "dynamodb.find_sale";
const SALES_ENDING_AFTER: &str = "dynamodb.sales_ending_after";

/// `create_sale`'s transaction: the sale item first, then one put per shard.
const SALE_ITEM: usize = 0;

#[async_trait]
impl SaleCatalog for DynamoStore {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        let meta = built(
            CREATE_SALE,
            self.put(item::sale_item(sale))
                .condition_expression("attribute_not_exists(#pk)")
                .set_expression_attribute_names(names(&[("#pk", PK)]))
                .build(),
        )?;
        let mut items = vec![transact::put(meta)];
        for shard in 0..sale.shards {
            let stock = item::shard_item(&sale.sale_id, shard, sale.shard_stock(shard));
            items.push(transact::put(built(CREATE_SALE, self.put(stock).build())?));
        }
        match self.run(CREATE_SALE, items).await? {
            Ok(()) => Ok(true),
            Err(refusal) if refusal.failed(SALE_ITEM) => Ok(false),
            Err(refusal) => Err(refusal.unexpected(CREATE_SALE)),
        }
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        self.read_item(FIND_SALE, item::sale_key(sale_id), item::parse_sale)
            .await
    }

    /// Reads the sales' `gsi1` partition from the cutoff on, so the cost follows the
    /// sales that can still matter, not every sale ever made.
    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        let mut sales = Vec::new();
        self.query_index(
            SALES_ENDING_AFTER,
            "#gsi1pk = :sales AND #gsi1sk >= :from",
            &[("#gsi1pk", GSI1_PK), ("#gsi1sk", GSI1_SK)],
            values([
                (":sales", item::sales_gsi_pk()),
                (":from", item::sales_ending_from(cutoff)),
            ]),
            |found| {
                let sale = item::parse_sale(&found)
                    .map_err(|error| corrupt(SALES_ENDING_AFTER, &found, error))?;
                // The key's time is clamped to years 0 to 9999, so near those ends the
                // range can let in a sale that ended before the cutoff.
                if sale.ends_at >= cutoff {
                    sales.push(sale);
                }
                Ok(())
            },
        )
        .await?;
        sales.sort_by(|a, b| a.sale_id.cmp(&b.sale_id));
        Ok(sales)
    }
}
