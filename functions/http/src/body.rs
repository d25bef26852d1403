//! JSON request bodies: a size limit first, then parsing that names the offending field.

use lambda_http::Request;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use crate::error::ApiError;

/// The largest body any route accepts. Every valid body of this API is well under 1 KiB;
/// the limit stops a client from making the function parse megabytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Refuses a body larger than [`MAX_BODY_BYTES`], whatever the route.
pub fn ensure_within_limit(req: &Request) -> Result<(), ApiError> {
    let actual = req.body().len();
    if actual > MAX_BODY_BYTES {
        return Err(ApiError::PayloadTooLarge {
            limit: MAX_BODY_BYTES,
            actual,
        });
    }
    Ok(())
}

/// The body parsed as `T`. Syntax errors are `invalid_json`; a body that is JSON but
/// does not fit `T` is `invalid_input`, naming the field.
pub fn json_body<T: DeserializeOwned>(req: &Request) -> Result<T, ApiError> {
    ensure_within_limit(req)?;
    let bytes: &[u8] = req.body();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::EmptyBody);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let field = err.path().to_string();
        classify(field, err.into_inner())
    })?;
    // Trailing garbage after a valid value is malformed JSON too.
    deserializer
        .end()
        .map_err(|source| ApiError::InvalidJson { source })?;
    Ok(value)
}

fn classify(field: String, source: serde_json::Error) -> ApiError {
    match source.classify() {
        Category::Data => ApiError::InvalidField {
            // serde_path_to_error renders the root as "."; a missing field is reported
            // at its parent, and the message names the field itself.
            field: (field != ".").then_some(field),
            source,
        },
        Category::Syntax | Category::Eof | Category::Io => ApiError::InvalidJson { source },
    }
}

#[cfg(test)]
mod tests {
    use lambda_http::Body;
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Draft {
        name: String,
        stock: i64,
    }

    fn request(body: impl Into<Body>) -> Request {
        Request::new(body.into())
    }

    fn parse(body: &str) -> Result<Draft, ApiError> {
        json_body::<Draft>(&request(body.to_owned()))
    }

    #[test]
    fn a_well_formed_body_parses() {
        let draft = parse(r#"{"name":"phone","stock":3}"#).unwrap();
        assert_eq!(draft.stock, 3);
    }

    #[test]
    fn malformed_json_is_invalid_json() {
        for body in [
            r#"{"name":"phone","#,
            "{not json}",
            r#"{"name":"a","stock":1} trailing"#,
        ] {
            let err = parse(body).unwrap_err();
            assert_eq!(err.code(), "invalid_json", "{body}: {err}");
        }
        assert!(matches!(
            json_body::<Draft>(&request(Body::Empty)),
            Err(ApiError::EmptyBody)
        ));
    }

    #[test]
    fn a_wrong_type_names_its_field() {
        let err = parse(r#"{"name":"phone","stock":"ten"}"#).unwrap_err();
        assert_eq!(err.code(), "invalid_input");
        let message = err.to_string();
        assert!(message.contains("`stock`"), "{message}");
        assert!(message.contains("expected i64"), "{message}");
    }

    #[test]
    fn a_missing_or_unknown_field_is_invalid_input_naming_it() {
        let missing = parse(r#"{"name":"phone"}"#).unwrap_err();
        assert_eq!(missing.code(), "invalid_input");
        assert!(
            missing.to_string().contains("missing field `stock`"),
            "{missing}"
        );

        let unknown = parse(r#"{"name":"phone","stock":1,"price":5}"#).unwrap_err();
        assert_eq!(unknown.code(), "invalid_input");
        assert!(
            unknown.to_string().contains("unknown field `price`"),
            "{unknown}"
        );
    }

    #[test]
    fn an_oversize_body_is_refused_before_parsing() {
        let huge = format!(r#"{{"name":"{}","stock":1}}"#, "x".repeat(MAX_BODY_BYTES));
        let err = parse(&huge).unwrap_err();
        assert!(matches!(
            err,
            ApiError::PayloadTooLarge {
                limit: MAX_BODY_BYTES,
                ..
            }
        ));
        assert_eq!(err.status().as_u16(), 413);
    }
}
