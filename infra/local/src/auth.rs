//! The HTTP API's JWT authorizer, locally: tokens are HS256, signed with a local secret,
//! and checked the way API Gateway checks a JWT (signature, `exp`, `nbf`, `iss`, `aud`
//! or `client_id`, scopes) before any function runs. The claims reach the function as
//! API Gateway passes them: every value a string, arrays as `[a b]`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{Map, Value, json};

use crate::model::JwtAuthorizerSpec;

/// Why a token was refused (401, or 403 for missing scopes).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no token in the {0} header")]
    Missing(String),
    #[error("the token is malformed")]
    Malformed(#[source] jsonwebtoken::errors::Error),
    #[error("the token signature is invalid")]
    BadSignature(#[source] jsonwebtoken::errors::Error),
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token issuer is not {0}")]
    WrongIssuer(String),
    #[error("the token audience is not one of {0:?}")]
    WrongAudience(Vec<String>),
    #[error("the token has none of the scopes {0:?}")]
    MissingScope(Vec<String>),
    #[error("the token was refused")]
    Invalid(#[source] jsonwebtoken::errors::Error),
}

impl AuthError {
    /// API Gateway answers 403 for a valid token without the route's scopes, else 401.
    pub fn status(&self) -> u16 {
        match self {
            AuthError::MissingScope(_) => 403,
            _ => 401,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the stack has no JWT authorizer to issue tokens for")]
    NoAuthorizer,
    #[error("could not sign the token")]
    Sign(#[source] jsonwebtoken::errors::Error),
}

/// What a verified token hands the function.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub claims: BTreeMap<String, String>,
    pub scopes: Option<Vec<String>>,
}

/// Local tokens: the secret, and what admin tokens carry.
#[derive(Clone)]
pub struct LocalJwt {
    secret: Vec<u8>,
    /// The authorizer local tokens are issued for (the stack's default one).
    pub authorizer: Option<JwtAuthorizerSpec>,
    /// The claim admin tokens carry the admin group in (`cognito:groups`).
    pub admin_claim: String,
    pub admin_group: String,
    /// Lifetime of issued tokens.
    pub lifetime: Duration,
}

impl std::fmt::Debug for LocalJwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalJwt")
            .field("secret", &"<redacted>")
            .field("authorizer", &self.authorizer)
            .field("admin_claim", &self.admin_claim)
            .field("admin_group", &self.admin_group)
            .finish()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl LocalJwt {
    pub fn new(
        secret: impl Into<Vec<u8>>,
        authorizer: Option<JwtAuthorizerSpec>,
        admin_claim: impl Into<String>,
        admin_group: impl Into<String>,
    ) -> Self {
        Self {
            secret: secret.into(),
            authorizer,
            admin_claim: admin_claim.into(),
            admin_group: admin_group.into(),
            lifetime: Duration::from_secs(3600),
        }
    }

    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The claims of a token for `user_id` (an admin's carries the admin group), valid
    /// for the issuer and first audience of the stack's authorizer.
    pub fn claims(&self, user_id: &str, admin: bool) -> Result<Map<String, Value>, TokenError> {
        let authorizer = self.authorizer.as_ref().ok_or(TokenError::NoAuthorizer)?;
        let now = now_secs();
        let mut claims = Map::new();
        claims.insert("sub".to_owned(), json!(user_id));
        claims.insert("iss".to_owned(), json!(authorizer.issuer));
        if let Some(audience) = authorizer.audience.first() {
            claims.insert("aud".to_owned(), json!(audience));
        }
        claims.insert("iat".to_owned(), json!(now));
        claims.insert("exp".to_owned(), json!(now + self.lifetime.as_secs()));
        claims.insert("token_use".to_owned(), json!("access"));
        claims.insert("username".to_owned(), json!(user_id));
        if admin {
            claims.insert(self.admin_claim.clone(), json!([self.admin_group]));
        }
        Ok(claims)
    }

    /// Signs arbitrary claims with the local secret (tests use it for odd tokens).
    pub fn sign(&self, claims: &Map<String, Value>) -> Result<String, TokenError> {
        let key = EncodingKey::from_secret(&self.secret).map_err(TokenError::Sign)?;
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).map_err(TokenError::Sign)
    }

    /// A token for `user_id`, as `POST /local/token` returns it.
    pub fn issue(&self, user_id: &str, admin: bool) -> Result<String, TokenError> {
        self.sign(&self.claims(user_id, admin)?)
    }

    /// Checks the token in `header_value` for `authorizer` and a route requiring one of
    /// `scopes` (none: any valid token).
    pub fn verify(
        &self,
        authorizer: &JwtAuthorizerSpec,
        scopes: &[String],
        header_value: Option<&str>,
    ) -> Result<Verified, AuthError> {
        let raw = header_value
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| AuthError::Missing(authorizer.header.clone()))?;
        // API Gateway accepts the token with or without the Bearer prefix.
        let token = raw
            .strip_prefix("Bearer ")
            .or_else(|| raw.strip_prefix("bearer "))
            .unwrap_or(raw)
            .trim();
        let key = DecodingKey::from_secret(&self.secret).map_err(AuthError::Invalid)?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss"]);
        validation.set_issuer(&[&authorizer.issuer]);
        // The audience is checked below: API Gateway accepts `aud` or `client_id`.
        validation.validate_aud = false;
        let data =
            jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation).map_err(|e| {
                match e.kind() {
                    ErrorKind::InvalidSignature => AuthError::BadSignature(e),
                    ErrorKind::ExpiredSignature => AuthError::Expired,
                    ErrorKind::ImmatureSignature => AuthError::NotYetValid,
                    ErrorKind::InvalidIssuer => AuthError::WrongIssuer(authorizer.issuer.clone()),
                    ErrorKind::InvalidToken
                    | ErrorKind::Base64(_)
                    | ErrorKind::Json(_)
                    | ErrorKind::Utf8(_) => AuthError::Malformed(e),
                    _ => AuthError::Invalid(e),
                }
            })?;
        let claims = data.claims;
        if !authorizer.audience.is_empty() {
            let mut presented: Vec<String> = match claims.get("aud") {
                Some(Value::String(s)) => vec![s.clone()],
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            };
            if presented.is_empty()
                && let Some(Value::String(client_id)) = claims.get("client_id")
            {
                presented.push(client_id.clone());
            }
            if !presented.iter().any(|a| authorizer.audience.contains(a)) {
                return Err(AuthError::WrongAudience(authorizer.audience.clone()));
            }
        }
        let token_scopes: Vec<String> = match claims.get("scope").or_else(|| claims.get("scp")) {
            Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        if !scopes.is_empty() && !token_scopes.iter().any(|s| scopes.contains(s)) {
            return Err(AuthError::MissingScope(scopes.to_vec()));
        }
        Ok(Verified {
            claims: claims
                .iter()
                .map(|(k, v)| (k.clone(), gateway_claim(v)))
                .collect(),
            scopes: (!token_scopes.is_empty()).then_some(token_scopes),
        })
    }
}

/// A claim value as API Gateway passes it to the function: a string; arrays as `[a b]`.
pub fn gateway_claim(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(gateway_claim).collect();
            format!("[{}]", parts.join(" "))
        }
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authorizer() -> JwtAuthorizerSpec {
        JwtAuthorizerSpec {
            name: "Jwt".to_owned(),
            issuer: "https://issuer.example".to_owned(),
            audience: vec!["flashsale".to_owned()],
            header: "Authorization".to_owned(),
        }
    }

    fn jwt() -> LocalJwt {
        LocalJwt::new(
            b"0123456789abcdef0123456789abcdef".to_vec(),
            Some(authorizer()),
            "cognito:groups",
            "admin",
        )
    }

    #[test]
    fn an_issued_admin_token_verifies_with_gateway_style_claims() {
        let jwt = jwt();
        let token = jwt.issue("alice", true).expect("issued");
        let verified = jwt
            .verify(&authorizer(), &[], Some(&format!("Bearer {token}")))
            .expect("valid");
        assert_eq!(verified.claims["sub"], "alice");
        assert_eq!(verified.claims["cognito:groups"], "[admin]");
        assert!(verified.claims["exp"].parse::<u64>().is_ok());
    }

    #[test]
    fn missing_wrongly_signed_expired_and_foreign_tokens_are_refused() {
        let jwt = jwt();
        assert!(matches!(
            jwt.verify(&authorizer(), &[], None),
            Err(AuthError::Missing(_))
        ));
        assert!(matches!(
            jwt.verify(&authorizer(), &[], Some("Bearer not.a.jwt")),
            Err(AuthError::Malformed(_))
        ));
        let other = LocalJwt::new(
            b"another-secret-another-secret-xx".to_vec(),
            Some(authorizer()),
            "g",
            "a",
        );
        let forged = other.issue("mallory", true).expect("issued");
        assert!(matches!(
            jwt.verify(&authorizer(), &[], Some(&forged)),
            Err(AuthError::BadSignature(_))
        ));
        let mut claims = jwt.claims("bob", false).expect("claims");
        claims.insert("exp".to_owned(), json!(now_secs() - 10));
        let expired = jwt.sign(&claims).expect("signed");
        assert!(matches!(
            jwt.verify(&authorizer(), &[], Some(&expired)),
            Err(AuthError::Expired)
        ));
        let mut claims = jwt.claims("bob", false).expect("claims");
        claims.insert("aud".to_owned(), json!("someone-else"));
        let foreign = jwt.sign(&claims).expect("signed");
        assert!(matches!(
            jwt.verify(&authorizer(), &[], Some(&foreign)),
            Err(AuthError::WrongAudience(_))
        ));
        let mut claims = jwt.claims("bob", false).expect("claims");
        claims.insert("iss".to_owned(), json!("https://elsewhere"));
        let foreign = jwt.sign(&claims).expect("signed");
        assert!(matches!(
            jwt.verify(&authorizer(), &[], Some(&foreign)),
            Err(AuthError::WrongIssuer(_))
        ));
    }

    #[test]
    fn a_route_with_scopes_needs_one_of_them() {
        let jwt = jwt();
        let token = jwt.issue("bob", false).expect("issued");
        let err = jwt
            .verify(&authorizer(), &["orders/write".to_owned()], Some(&token))
            .expect_err("no scope");
        assert_eq!(err.status(), 403);
        let mut claims = jwt.claims("bob", false).expect("claims");
        claims.insert("scope".to_owned(), json!("openid orders/write"));
        let scoped = jwt.sign(&claims).expect("signed");
        let verified = jwt
            .verify(&authorizer(), &["orders/write".to_owned()], Some(&scoped))
            .expect("scoped");
        assert_eq!(
            verified.scopes,
            Some(vec!["openid".to_owned(), "orders/write".to_owned()])
        );
    }

    #[test]
    fn nested_claims_are_flattened_like_api_gateway() {
        assert_eq!(gateway_claim(&json!(["admin", "other"])), "[admin other]");
        assert_eq!(gateway_claim(&json!(42)), "42");
        assert_eq!(gateway_claim(&json!(true)), "true");
    }
}
