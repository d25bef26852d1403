//! The caller, as API Gateway's JWT authorizer describes them in
//! `requestContext.authorizer.jwt.claims`. The authorizer has already verified the
//! token; the function only reads the claims it was handed.

use std::collections::HashMap;

use flashsale_domain::{AppError, UserId};
use lambda_http::Request;
use lambda_http::RequestExt as _;

use crate::error::ApiError;

/// Default claim that lists the caller's groups (Cognito's).
pub const DEFAULT_ADMIN_CLAIM: &str = "cognito:groups";
/// Default group whose members may administer sales.
pub const DEFAULT_ADMIN_GROUP: &str = "admin";

/// Which claim lists the caller's groups, and which group makes them an administrator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRule {
    pub claim: String,
    pub group: String,
}

impl Default for AdminRule {
    fn default() -> Self {
        Self {
            claim: DEFAULT_ADMIN_CLAIM.to_owned(),
            group: DEFAULT_ADMIN_GROUP.to_owned(),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: UserId,
    pub is_admin: bool,
}

impl Caller {
    /// The caller, from the JWT claims of the request: `sub` is the user, and the admin
    /// rule's claim decides whether they administer. `unauthorized` when there are no
    /// claims or no usable `sub`.
    pub fn of(req: &Request, admin: &AdminRule) -> Result<Self, ApiError> {
        let claims = claims_of(req)?;
        let is_admin = claims
            .get(&admin.claim)
            .is_some_and(|groups| claim_lists_group(groups, &admin.group));
        Ok(Self {
            user: subject_of(claims)?,
            is_admin,
        })
    }

    /// `forbidden` unless the caller is an administrator.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.is_admin {
            Ok(())
        } else {
            Err(AppError::Forbidden.into())
        }
    }
}

/// The authenticated user (the JWT `sub`), for routes that never need admin rights.
pub fn user_of(req: &Request) -> Result<UserId, ApiError> {
    subject_of(claims_of(req)?)
}

fn claims_of(req: &Request) -> Result<&HashMap<String, String>, ApiError> {
    req.request_context_ref()
        .and_then(|context| context.authorizer())
        .and_then(|authorizer| authorizer.jwt.as_ref())
        .map(|jwt| &jwt.claims)
        .ok_or(ApiError::Unauthenticated {
            reason: "the request carries no verified token",
        })
}

fn subject_of(claims: &HashMap<String, String>) -> Result<UserId, ApiError> {
    let subject = claims.get("sub").ok_or(ApiError::Unauthenticated {
        reason: "the token has no subject",
    })?;
    UserId::parse(subject.as_str()).map_err(|source| ApiError::InvalidSubject { source })
}

/// Whether a group-list claim names `group`. API Gateway flattens an array claim to a
/// string such as `[admin ops]`; other issuers send a JSON array string or a single
/// name, and some separate names with commas. All of these are accepted; a group name
/// only ever matches whole.
pub fn claim_lists_group(claim: &str, group: &str) -> bool {
    if let Ok(groups) = serde_json::from_str::<Vec<String>>(claim) {
        return groups.iter().any(|candidate| candidate == group);
    }
    let trimmed = claim.trim();
    let inner = trimmed
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(trimmed);
    inner
        .split(|c: char| c.is_whitespace() || c == ',')
        .any(|candidate| candidate == group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_claims_in_every_issuer_format_are_understood() {
        for claim in [
            "[admin]",
            "[ops admin]",
            r#"["ops","admin"]"#,
            "admin",
            "ops,admin",
            " [admin] ",
        ] {
            assert!(claim_lists_group(claim, "admin"), "{claim}");
        }
    }

    #[test]
    fn a_group_only_matches_whole() {
        for claim in [
            "[administrators]",
            "[ops]",
            r#"["not-admin"]"#,
            "",
            "[]",
            "superadmin",
        ] {
            assert!(!claim_lists_group(claim, "admin"), "{claim}");
        }
    }
}
