//! [`Blocklist`]: one item per blocked user, pk `BLOCKLIST`, sk `USER#{user_id}`.

use async_trait::async_trait;
use flashsale_domain::ports::Blocklist;
use flashsale_domain::{StoreError, UserId};

use super::DynamoStore;
use super::item::{self, PK, SK};
use super::requests::{corrupt, names, values};
use crate::classify::store_error;

const BLOCK: &str = "dynamodb.block";
const UNBLOCK: &str = "dynamodb.unblock";
const BLOCKED: &str = "dynamodb.blocked";

#[async_trait]
impl Blocklist for DynamoStore {
    async fn block(&self, user: &UserId) -> Result<(), StoreError> {
        // Unconditional: putting the same key again is the idempotent block.
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item::blocked_user_key(user)))
            .send()
            .await
            .map_err(|error| store_error(BLOCK, error))?;
        Ok(())
    }

    async fn unblock(&self, user: &UserId) -> Result<(), StoreError> {
        // Deleting a missing key succeeds, which is the idempotent unblock.
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::blocked_user_key(user)))
            .send()
            .await
            .map_err(|error| store_error(UNBLOCK, error))?;
        Ok(())
    }

    async fn blocked(&self) -> Result<Vec<UserId>, StoreError> {
        // Consistent, so an admin who lists right after a block sees it; the grab reads
        // this only once per refresh interval per process, so the double cost is noise.
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :blocklist")
            .set_expression_attribute_names(names(&[("#pk", PK), ("#sk", SK)]))
            .set_expression_attribute_values(values([(":blocklist", item::blocklist_pk())]))
            .projection_expression("#pk, #sk")
            .consistent_read(true)
            .into_paginator()
            .items()
            .send();
        let mut users = Vec::new();
        while let Some(found) = pages.next().await {
            let found = found.map_err(|error| store_error(BLOCKED, error))?;
            users.push(
                item::parse_blocked_user(&found)
                    .map_err(|error| corrupt(BLOCKED, &found, error))?,
            );
        }
        Ok(users)
    }
}
