//! [`SaleCatalog`]: the sale items, and creating a sale with all its shards.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, ReturnValuesOnConditionCheckFailure,
};
use chrono::{DateTime, Utc};
use flashsale_domain::control::ControlWrite;
use flashsale_domain::ports::SaleCatalog;
use flashsale_domain::{Sale, SaleAudit, SaleControl, SaleCursor, SaleId, SalePage, StoreError};

use super::DynamoStore;
use super::item::{self, CLAIM_TOKEN, CONTROL, GSI1, GSI1_PK, GSI1_SK, PK, s};
use super::requests::{built, corrupt, names, values};
use super::transact::{self, in_request_order};

const CREATE_SALE: &str = "dynamodb.create_sale";
const CONTROL_SALE: &str = "dynamodb.control_sale";
const AUDIT_TRAIL: &str = "dynamodb.audit_trail";
const FIND_SALE: &str = "dynamodb.find_sale";
const LIST_SALES: &str = "dynamodb.list_sales";
const SALES_ENDING_AFTER: &str = "dynamodb.sales_ending_after";

/// The most items one `TransactWriteItems` may hold (DynamoDB's limit).
const MAX_TRANSACTION_ITEMS: usize = 100;
/// Shards written per transaction: all the items but the claim check.
const SHARDS_PER_TRANSACTION: usize = MAX_TRANSACTION_ITEMS - 1;

/// That the claim still holds this call's token: the condition on every step after
/// the claim.
const CLAIM_HELD: &str = "#token = :token";

fn claim_held_names() -> Option<HashMap<String, String>> {
    names(&[("#token", CLAIM_TOKEN)])
}

fn claim_held_values(token: &str) -> Option<HashMap<String, AttributeValue>> {
    values([(":token", s(token))])
}

/// The transaction that claims a sale's creation.
mod claiming {
    /// Checks that no sale with this id exists.
    pub(super) const SALE_ITEM: usize = 0;
    /// Puts this call's claim, taking over any earlier one.
    pub(super) const CLAIM_ITEM: usize = 1;
}

/// Each transaction that writes shards: the claim check, then the shard puts.
mod stocking {
    /// Checks that this call still holds the claim.
    pub(super) const CLAIM_ITEM: usize = 0;
}

/// The transaction that changes a sale's control.
mod controlling {
    /// Sets the control, if the sale exists and its control is one the action changes.
    pub(super) const SALE_ITEM: usize = 0;
    /// Puts the audit entry.
    pub(super) const AUDIT_ITEM: usize = 1;
}

/// The transaction that makes the sale exist.
mod committing {
    /// Puts the sale item, unless a sale with this id exists.
    pub(super) const SALE_ITEM: usize = 0;
    /// Retires the claim (removes its token), if this call still holds it.
    pub(super) const CLAIM_ITEM: usize = 1;
}

/// A sale is visible only through its item, so it is written last, once every shard is
/// in place: a sale with more shards than one transaction holds is then never seen half
/// created. The steps are fenced by a claim item holding a token of this call:
///
/// 1. claim: no sale item exists, and this call's claim replaces any other (one left by
///    a create that died, or one still running; that one then answers `false`);
/// 2. write the shards, up to 99 a transaction, each checking the claim is still ours;
/// 3. commit: put the sale item and retire the claim (remove its token), again only if
///    it is still ours. The claim is retired with an update, not deleted: the functions
///    may delete items only in the blocklist's partition (template.yaml), and its TTL
///    removes the spent claim a day later.
///
/// A create that died part way left shards and a claim but no sale, so a retry, with
/// the same definition or another, rewrites every shard and completes. Once the sale
/// exists, step 1 refuses, so the shards of a live sale are never written again.
impl DynamoStore {
    async fn claim_creation(&self, sale: &Sale, token: &str) -> Result<bool, StoreError> {
        let absent = built(
            CREATE_SALE,
            ConditionCheck::builder()
                .table_name(&self.table)
                .set_key(Some(item::sale_key(&sale.sale_id)))
                .condition_expression("attribute_not_exists(#pk)")
                .set_expression_attribute_names(names(&[("#pk", PK)]))
                .build(),
        )?;
        let claim = built(
            CREATE_SALE,
            self.put(item::claim_item(&sale.sale_id, token, Utc::now()))
                .build(),
        )?;
        let items = in_request_order([
            (claiming::SALE_ITEM, transact::check(absent)),
            (claiming::CLAIM_ITEM, transact::put(claim)),
        ]);
        match self.run(CREATE_SALE, items).await? {
            Ok(()) => Ok(true),
            Err(refusal) if refusal.failed(claiming::SALE_ITEM) => Ok(false),
            Err(refusal) => Err(refusal.unexpected(CREATE_SALE)),
        }
    }

    /// Puts `shards` of the sale with their full stock, if the claim is still ours.
    async fn write_shards(
        &self,
        sale: &Sale,
        token: &str,
        shards: &[u16],
    ) -> Result<bool, StoreError> {
        let held = built(
            CREATE_SALE,
            ConditionCheck::builder()
                .table_name(&self.table)
                .set_key(Some(item::claim_key(&sale.sale_id)))
                .condition_expression(CLAIM_HELD)
                .set_expression_attribute_names(claim_held_names())
                .set_expression_attribute_values(claim_held_values(token))
                .build(),
        )?;
        let mut items = Vec::with_capacity(shards.len() + 1);
        debug_assert_eq!(stocking::CLAIM_ITEM, items.len());
        items.push(transact::check(held));
        for &shard in shards {
            let stock = item::shard_item(&sale.sale_id, shard, sale.shard_stock(shard));
            items.push(transact::put(built(CREATE_SALE, self.put(stock).build())?));
        }
        match self.run(CREATE_SALE, items).await? {
            Ok(()) => Ok(true),
            Err(refusal) if refusal.failed(stocking::CLAIM_ITEM) => Ok(false),
            Err(refusal) => Err(refusal.unexpected(CREATE_SALE)),
        }
    }

    async fn commit_creation(&self, sale: &Sale, token: &str) -> Result<bool, StoreError> {
        let meta = built(
            CREATE_SALE,
            self.put(item::sale_item(sale))
                .condition_expression("attribute_not_exists(#pk)")
                .set_expression_attribute_names(names(&[("#pk", PK)]))
                .build(),
        )?;
        let retire = built(
            CREATE_SALE,
            self.update(item::claim_key(&sale.sale_id))
                .update_expression("REMOVE #token")
                .condition_expression(CLAIM_HELD)
                .set_expression_attribute_names(claim_held_names())
                .set_expression_attribute_values(claim_held_values(token))
                .build(),
        )?;
        let items = in_request_order([
            (committing::SALE_ITEM, transact::put(meta)),
            (committing::CLAIM_ITEM, transact::update(retire)),
        ]);
        match self.run(CREATE_SALE, items).await? {
            Ok(()) => Ok(true),
            // Another create of this id completed, or took the claim over and will.
            Err(refusal)
                if refusal.failed(committing::SALE_ITEM)
                    || refusal.failed(committing::CLAIM_ITEM) =>
            {
                Ok(false)
            }
            Err(refusal) => Err(refusal.unexpected(CREATE_SALE)),
        }
    }
}

#[async_trait]
impl SaleCatalog for DynamoStore {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        let token = format!("{:032x}", rand::random::<u128>());
        if !self.claim_creation(sale, &token).await? {
            return Ok(false);
        }
        let shards: Vec<u16> = (0..sale.shards).collect();
        for batch in shards.chunks(SHARDS_PER_TRANSACTION) {
            if !self.write_shards(sale, &token, batch).await? {
                return Ok(false);
            }
        }
        self.commit_creation(sale, &token).await
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        self.read_item(FIND_SALE, item::sale_key(sale_id), item::parse_sale)
            .await
    }

    /// One transaction: the sale item's control, conditioned on the controls the action
    /// changes (an absent control is open), and the audit entry. A refused condition
    /// hands back the item as it was, so the answer names the control found without a
    /// second read.
    async fn control_sale(
        &self,
        sale_id: &SaleId,
        change: &SaleAudit,
    ) -> Result<ControlWrite, StoreError> {
        let mut values = HashMap::from([(
            ":to".to_owned(),
            item::control_value(change.action.target()),
        )]);
        let mut allowed = Vec::new();
        for (i, &from) in change.action.applies_to().iter().enumerate() {
            let placeholder = format!(":from{i}");
            allowed.push(format!("#control = {placeholder}"));
            if from == SaleControl::Open {
                allowed.push("attribute_not_exists(#control)".to_owned());
            }
            values.insert(placeholder, item::control_value(from));
        }
        let set = built(
            CONTROL_SALE,
            self.update(item::sale_key(sale_id))
                .update_expression("SET #control = :to")
                .condition_expression(format!(
                    "attribute_exists(#pk) AND ({})",
                    allowed.join(" OR ")
                ))
                .set_expression_attribute_names(names(&[("#pk", PK), ("#control", CONTROL)]))
                .set_expression_attribute_values(Some(values))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build(),
        )?;
        let audit = built(
            CONTROL_SALE,
            self.put(item::audit_item(sale_id, change)).build(),
        )?;
        let items = in_request_order([
            (controlling::SALE_ITEM, transact::update(set)),
            (controlling::AUDIT_ITEM, transact::put(audit)),
        ]);
        match self.run(CONTROL_SALE, items).await? {
            Ok(()) => Ok(ControlWrite::Changed),
            Err(refusal) if refusal.failed(controlling::SALE_ITEM) => {
                match refusal.old_item(controlling::SALE_ITEM) {
                    None => Ok(ControlWrite::NoSale),
                    Some(found) => item::parse_control(found)
                        .map(|current| ControlWrite::Refused { current })
                        .map_err(|error| corrupt(CONTROL_SALE, found, error)),
                }
            }
            Err(refusal) => Err(refusal.unexpected(CONTROL_SALE)),
        }
    }

    /// One consistent query of the trail's own partition, newest first.
    async fn audit_trail(
        &self,
        sale_id: &SaleId,
        limit: usize,
    ) -> Result<Vec<SaleAudit>, StoreError> {
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :trail")
            .set_expression_attribute_names(names(&[("#pk", PK)]))
            .set_expression_attribute_values(values([(":trail", s(item::audit_pk(sale_id)))]))
            .scan_index_forward(false)
            .consistent_read(true)
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|error| crate::classify::store_error(AUDIT_TRAIL, error))?;
        output
            .items()
            .iter()
            .map(|found| {
                item::parse_audit(found).map_err(|error| corrupt(AUDIT_TRAIL, found, error))
            })
            .collect()
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

    /// One query of the sales' `gsi1` partition, newest end first, asking for one sale
    /// more than the page: whether it came says whether there is a next page.
    async fn list_sales(
        &self,
        after: Option<&SaleCursor>,
        limit: usize,
    ) -> Result<SalePage, StoreError> {
        let limit = limit.max(1);
        let asked = i32::try_from(limit + 1).unwrap_or(i32::MAX);
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(GSI1)
            .key_condition_expression("#gsi1pk = :sales")
            .set_expression_attribute_names(names(&[("#gsi1pk", GSI1_PK)]))
            .set_expression_attribute_values(values([(":sales", item::sales_gsi_pk())]))
            .scan_index_forward(false)
            .limit(asked)
            .set_exclusive_start_key(after.map(item::sale_index_key))
            .send()
            .await
            .map_err(|error| crate::classify::store_error(LIST_SALES, error))?;
        let more = output.last_evaluated_key().is_some();
        let mut sales = output
            .items()
            .iter()
            .map(|found| item::parse_sale(found).map_err(|error| corrupt(LIST_SALES, found, error)))
            .collect::<Result<Vec<_>, _>>()?;
        // More than the page came: the next page starts after the page's last. Fewer,
        // with a key to go on from (the query's 1 MB page ended first): after the last.
        let next = if sales.len() > limit {
            sales.truncate(limit);
            sales.last().map(SaleCursor::after)
        } else if more {
            sales.last().map(SaleCursor::after)
        } else {
            None
        };
        Ok(SalePage { sales, next })
    }
}
