//! A secret a function reads once per cold start from Secrets Manager, before it serves
//! anything, and keeps for the life of the process: the grab-token key, the Stripe keys.
//! A request never calls Secrets Manager.

use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueOutput;
use flashsale_domain::error::BoxError;

use crate::CallBudget;

/// How long reading a secret may take. It runs once, in Lambda's init phase (10 s at
/// most), where a slow first TLS handshake is normal: longer than a request's budget,
/// and still well inside the phase, so a stuck Secrets Manager fails the cold start with
/// this error rather than with an opaque init timeout.
pub const SECRET_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_secs(2),
    operation: std::time::Duration::from_secs(5),
};

/// Why a secret could not be read. Each fails the cold start of the function that
/// needs it.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Secrets Manager refused or did not answer (no such secret, no permission, a
    /// timeout).
    #[error("could not read the secret {arn} from Secrets Manager")]
    Unreadable {
        arn: String,
        #[source]
        source: BoxError,
    },
    /// The secret exists but its current version holds no value.
    #[error("the secret {arn} has no value")]
    Missing { arn: String },
}

/// The secret an ARN names, in Secrets Manager.
#[derive(Debug, Clone)]
pub struct SecretsManagerSecret {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
}

impl SecretsManagerSecret {
    /// A client within [`SECRET_BUDGET`]; endpoint and credentials come from `sdk`
    /// (`AWS_ENDPOINT_URL_SECRETS_MANAGER` points it at moto locally).
    pub fn new(sdk: &aws_types::SdkConfig, arn: impl Into<String>) -> Self {
        Self {
            client: aws_sdk_secretsmanager::Client::new(&SECRET_BUDGET.bound(sdk)),
            arn: arn.into(),
        }
    }

    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// One `GetSecretValue` of the current version: its string (what
    /// `GenerateSecretString` and `put-secret-value --secret-string` store), else its
    /// binary; never empty.
    pub async fn value(&self) -> Result<Vec<u8>, SecretError> {
        let value = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .send()
            .await
            .map_err(|error| SecretError::Unreadable {
                arn: self.arn.clone(),
                source: Box::new(aws_sdk_secretsmanager::Error::from(error)),
            })?;
        value_bytes(value).ok_or_else(|| SecretError::Missing {
            arn: self.arn.clone(),
        })
    }

    #[cfg(test)]
    fn client(&self) -> &aws_sdk_secretsmanager::Client {
        &self.client
    }
}

fn value_bytes(value: GetSecretValueOutput) -> Option<Vec<u8>> {
    let bytes = match (value.secret_string, value.secret_binary) {
        (Some(text), _) => text.into_bytes(),
        (None, Some(blob)) => blob.into_inner(),
        (None, None) => return None,
    };
    (!bytes.is_empty()).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use aws_sdk_secretsmanager::primitives::Blob;

    use super::*;

    #[test]
    fn the_client_is_built_within_the_init_budget() {
        let secret = SecretsManagerSecret::new(&aws_types::SdkConfig::builder().build(), "arn");
        let timeouts = secret.client().config().timeout_config();
        assert_eq!(timeouts.and_then(CallBudget::of), Some(SECRET_BUDGET));
    }

    #[test]
    fn the_value_is_the_string_else_the_binary_and_never_empty() {
        let string = GetSecretValueOutput::builder()
            .secret_string("text-key")
            .build();
        assert_eq!(value_bytes(string), Some(b"text-key".to_vec()));
        let binary = GetSecretValueOutput::builder()
            .secret_binary(Blob::new(vec![1, 2, 3]))
            .build();
        assert_eq!(value_bytes(binary), Some(vec![1, 2, 3]));
        let empty = GetSecretValueOutput::builder().secret_string("").build();
        assert_eq!(value_bytes(empty), None);
        assert_eq!(value_bytes(GetSecretValueOutput::builder().build()), None);
    }
}
