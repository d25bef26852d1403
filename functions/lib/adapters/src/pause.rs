//! [`Pause`] on tokio's timer.

use async_trait::async_trait;
use flashsale_domain::ports::Pause;

/// Waits on tokio's timer, as the functions run.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioPause;

#[async_trait]
impl Pause for TokioPause {
    async fn pause(&self, how_long: std::time::Duration) {
        tokio::time::sleep(how_long).await;
    }
}
