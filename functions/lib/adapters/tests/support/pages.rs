//! Small query pages.
//!
//! DynamoDB ends a query page at 1 MB, so reaching a second page honestly would take
//! thousands of items. This interceptor sets `Limit` on every `Query` the client sends,
//! which makes DynamoDB Local end pages after a few items with a `LastEvaluatedKey`
//! exactly as it does at 1 MB, and counts the calls so a test can prove the store
//! followed the pages.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::operation::query::QueryInput;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextMut;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

#[derive(Debug, Clone)]
pub struct SmallPages {
    limit: i32,
    queries: Arc<AtomicU64>,
}

impl SmallPages {
    pub fn new(limit: i32) -> Self {
        Self {
            limit,
            queries: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `Query` calls sent so far: one per page.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::SeqCst)
    }
}

impl Intercept for SmallPages {
    fn name(&self) -> &'static str {
        "SmallPages"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(query) = context.input_mut().downcast_mut::<QueryInput>() {
            query.limit = Some(self.limit);
            self.queries.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}
