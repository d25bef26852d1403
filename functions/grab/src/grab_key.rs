//! The grab-token key: the HMAC key of the dynamic grab path. The stack generates it
//! into a Secrets Manager secret; the function reads it once per cold start, before it
//! serves anything, and keeps the keyed signer for the life of the process. A request
//! never calls Secrets Manager.

use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueOutput;
use flashsale_domain::error::BoxError;
use flashsale_domain::token::{GrabTokenSigner, WeakSecret};
use flashsale_lambda::CallBudget;

/// How long reading the key may take. It runs once, in Lambda's init phase (10 s at
/// most), where a slow first TLS handshake is normal: longer than a request's budget,
/// and still well inside the phase, so a stuck Secrets Manager fails the cold start with
/// this error rather than with an opaque init timeout.
pub const GRAB_KEY_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_secs(2),
    operation: std::time::Duration::from_secs(5),
};

/// Why the grab-token key could not be loaded. Each fails the cold start: a grab
/// function without its key could neither hand out nor check a single grab path.
#[derive(Debug, thiserror::Error)]
pub enum GrabKeyError {
    /// Secrets Manager refused or did not answer (no such secret, no permission, a
    /// timeout).
    #[error("could not read the grab-token secret {arn} from Secrets Manager")]
    Unreadable {
        arn: String,
        #[source]
        source: BoxError,
    },
    /// The secret exists but its current version holds no value.
    #[error("the grab-token secret {arn} has no value")]
    Missing { arn: String },
    /// The value is too short to be an HMAC key.
    #[error("the grab-token secret {arn} is unusable")]
    Weak {
        arn: String,
        #[source]
        source: WeakSecret,
    },
}

/// The secret `GRAB_TOKEN_SECRET_ARN` names, in Secrets Manager.
#[derive(Debug, Clone)]
pub struct SecretsManagerKey {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
}

impl SecretsManagerKey {
    /// A client within [`GRAB_KEY_BUDGET`]; endpoint and credentials come from `sdk`
    /// (`AWS_ENDPOINT_URL_SECRETS_MANAGER` points it at moto locally).
    pub fn new(sdk: &aws_config::SdkConfig, arn: impl Into<String>) -> Self {
        Self {
            client: aws_sdk_secretsmanager::Client::new(&GRAB_KEY_BUDGET.bound(sdk)),
            arn: arn.into(),
        }
    }

    /// One `GetSecretValue` of the current version, made into a signer.
    pub async fn signer(&self) -> Result<GrabTokenSigner, GrabKeyError> {
        let value = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .send()
            .await
            .map_err(|error| GrabKeyError::Unreadable {
                arn: self.arn.clone(),
                source: Box::new(aws_sdk_secretsmanager::Error::from(error)),
            })?;
        let key = key_bytes(value).ok_or_else(|| GrabKeyError::Missing {
            arn: self.arn.clone(),
        })?;
        GrabTokenSigner::new(key).map_err(|source| GrabKeyError::Weak {
            arn: self.arn.clone(),
            source,
        })
    }

    #[cfg(test)]
    fn client(&self) -> &aws_sdk_secretsmanager::Client {
        &self.client
    }
}

/// The key: the secret's string (what `GenerateSecretString` stores), else its binary.
fn key_bytes(value: GetSecretValueOutput) -> Option<Vec<u8>> {
    let key = match (value.secret_string, value.secret_binary) {
        (Some(text), _) => text.into_bytes(),
        (None, Some(blob)) => blob.into_inner(),
        (None, None) => return None,
    };
    (!key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use aws_sdk_secretsmanager::primitives::Blob;

    use super::*;

    #[test]
    fn the_client_is_built_within_the_init_budget() {
        let key = SecretsManagerKey::new(&aws_config::SdkConfig::builder().build(), "arn");
        let timeouts = key.client().config().timeout_config();
        assert_eq!(timeouts.and_then(CallBudget::of), Some(GRAB_KEY_BUDGET));
    }

    #[test]
    fn the_key_is_the_string_else_the_binary_and_never_empty() {
        let string = GetSecretValueOutput::builder()
            .secret_string("text-key")
            .build();
        assert_eq!(key_bytes(string), Some(b"text-key".to_vec()));
        let binary = GetSecretValueOutput::builder()
            .secret_binary(Blob::new(vec![1, 2, 3]))
            .build();
        assert_eq!(key_bytes(binary), Some(vec![1, 2, 3]));
        let empty = GetSecretValueOutput::builder().secret_string("").build();
        assert_eq!(key_bytes(empty), None);
        assert_eq!(key_bytes(GetSecretValueOutput::builder().build()), None);
    }
}
