//! Old items withheld, and reads counted.
//!
//! `reserve` asks DynamoDB to send back the user item when its condition fails, so the
//! refusal alone tells a retried order from a user at the limit. This interceptor can
//! take that request out of every transaction and plain update, which is what a store that does not send
//! the item looks like, and counts `GetItem` calls, so a test can prove which path the
//! store took: the old item, or the consistent read it falls back to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::operation::get_item::GetItemInput;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemInput;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextMut;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

#[derive(Debug, Clone)]
pub struct OldItems {
    withhold: bool,
    reads: Arc<AtomicU64>,
}

impl OldItems {
    /// `withhold`: strip `ReturnValuesOnConditionCheckFailure` from every transaction.
    pub fn new(withhold: bool) -> Self {
        Self {
            withhold,
            reads: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `GetItem` calls sent so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Intercept for OldItems {
    fn name(&self) -> &'static str {
        "OldItems"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let input = context.input_mut();
        if input.downcast_ref::<GetItemInput>().is_some() {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
        if self.withhold
            && let Some(transaction) = input.downcast_mut::<TransactWriteItemsInput>()
        {
            for item in transaction.transact_items.iter_mut().flatten() {
                if let Some(update) = item.update.as_mut() {
                    update.return_values_on_condition_check_failure = None;
                }
                if let Some(put) = item.put.as_mut() {
                    put.return_values_on_condition_check_failure = None;
                }
            }
        }
        if self.withhold
            && let Some(update) = input.downcast_mut::<UpdateItemInput>()
        {
            update.return_values_on_condition_check_failure = None;
        }
        Ok(())
    }
}
