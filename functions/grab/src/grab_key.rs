//! The grab-token key: the HMAC key of the dynamic grab path. The stack generates it
//! into a Secrets Manager secret; the function reads it once per cold start (see
//! [`SecretsManagerSecret`]) and keeps the keyed signer for the life of the process.

use flashsale_domain::token::{GrabTokenSigner, WeakSecret};
use flashsale_lambda::{SecretError, SecretsManagerSecret};

/// Why the grab-token key could not be loaded. Each fails the cold start: a grab
/// function without its key could neither hand out nor check a single grab path.
#[derive(Debug, thiserror::Error)]
pub enum GrabKeyError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The value is too short to be an HMAC key.
    #[error("the grab-token secret {arn} is unusable")]
    Weak {
        arn: String,
        #[source]
        source: WeakSecret,
    },
}

/// The grab-token signer keyed by `secret`'s value.
pub async fn signer(secret: &SecretsManagerSecret) -> Result<GrabTokenSigner, GrabKeyError> {
    GrabTokenSigner::new(secret.value().await?).map_err(|source| GrabKeyError::Weak {
        arn: secret.arn().to_owned(),
        source,
    })
}
