//! The admins' blocklist.

use std::sync::Arc;

use crate::error::AppError;
use crate::ids::UserId;
use crate::ports::Blocklist;

/// The admins' blocklist of users barred from every sale.
pub struct BlocklistService {
    pub blocklist: Arc<dyn Blocklist>,
}

impl BlocklistService {
    /// Bars the user. Idempotent. Grabs notice within the grab's cache refresh interval.
    pub async fn block_user(&self, user: &UserId) -> Result<(), AppError> {
        Ok(self.blocklist.block(user).await?)
    }

    /// Lifts the bar. Idempotent: unblocking a user who is not blocked succeeds.
    pub async fn unblock_user(&self, user: &UserId) -> Result<(), AppError> {
        Ok(self.blocklist.unblock(user).await?)
    }

    /// Every blocked user, sorted, so the admin's view is stable.
    pub async fn blocked_users(&self) -> Result<Vec<UserId>, AppError> {
        let mut users = self.blocklist.blocked().await?;
        users.sort();
        users.dedup();
        Ok(users)
    }
}
