//! JSON request bodies: a size limit first, then the media type, then parsing that names
//! the offending field.

use lambda_http::Request;
use lambda_http::http::header::CONTENT_TYPE;
use mime::Mime;
use serde::de::DeserializeOwned;
use serde_json::Value;

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

/// The body parsed as `T`, which is a JSON object in every body of this API. Syntax
/// errors are `invalid_json`; a body that is JSON but does not fit `T` is
/// `invalid_input`, naming the field; a body declared as anything but JSON is
/// `unsupported_media_type`.
pub fn json_body<T: DeserializeOwned>(req: &Request) -> Result<T, ApiError> {
    ensure_within_limit(req)?;
    let bytes: &[u8] = req.body();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::EmptyBody);
    }
    ensure_json_media_type(req)?;
    // Parsed in two steps: syntax first, with its line and column, then the shape, from
    // the parsed value, whose errors carry only the field's own words.
    let value: Value =
        serde_json::from_slice(bytes).map_err(|source| ApiError::InvalidJson { source })?;
    if !value.is_object() {
        return Err(ApiError::InvalidField {
            field: None,
            problem: "the request body must be a JSON object".to_owned(),
        });
    }
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        ApiError::InvalidField {
            // serde_path_to_error renders the root as "."; a missing or unknown field is
            // reported there, and the problem names the field itself.
            field: (path != ".").then_some(path),
            problem: err.into_inner().to_string(),
        }
    })
}

/// `application/json`, or any `application/*+json`, with or without parameters such as
/// `charset`.
fn ensure_json_media_type(req: &Request) -> Result<(), ApiError> {
    let declared = req
        .headers()
        .get(CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let is_json = declared
        .as_deref()
        .and_then(|raw| raw.parse::<Mime>().ok())
        .is_some_and(|mime| {
            mime.type_() == mime::APPLICATION
                && (mime.subtype() == mime::JSON || mime.suffix() == Some(mime::JSON))
        });
    if is_json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType { declared })
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

    fn request_as(content_type: Option<&str>, body: impl Into<Body>) -> Request {
        let mut req = Request::new(body.into());
        if let Some(content_type) = content_type {
            req.headers_mut()
                .insert(CONTENT_TYPE, content_type.parse().unwrap());
        }
        req
    }

    fn request(body: impl Into<Body>) -> Request {
        request_as(Some("application/json"), body)
    }

    fn parse(body: &str) -> Result<Draft, ApiError> {
        json_body::<Draft>(&request(body.to_owned()))
    }

    const WELL_FORMED: &str = r#"{"name":"phone","stock":3}"#;

    #[test]
    fn a_well_formed_body_parses() {
        let draft = parse(WELL_FORMED).unwrap();
        assert_eq!(draft.stock, 3);
    }

    #[test]
    fn json_media_types_with_parameters_are_accepted() {
        for content_type in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=UTF-8",
            "application/merge-patch+json",
        ] {
            let req = request_as(Some(content_type), WELL_FORMED);
            assert!(json_body::<Draft>(&req).is_ok(), "{content_type}");
        }
    }

    #[test]
    fn a_body_not_declared_as_json_is_unsupported_media_type() {
        for content_type in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("application/jsonp"),
            Some("text/json+xml"),
            Some("not a media type"),
            None,
        ] {
            let err = json_body::<Draft>(&request_as(content_type, WELL_FORMED)).unwrap_err();
            assert_eq!(err.status().as_u16(), 415, "{content_type:?}");
            assert_eq!(err.code(), "unsupported_media_type", "{content_type:?}");
            assert!(err.to_string().contains("application/json"), "{err}");
        }
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
    fn a_body_that_is_not_an_object_says_so_without_naming_a_type() {
        for body in ["[]", "3", r#""phone""#, "null"] {
            let err = parse(body).unwrap_err();
            assert_eq!(err.code(), "invalid_input", "{body}");
            assert_eq!(err.to_string(), "the request body must be a JSON object");
        }
    }

    #[test]
    fn a_wrong_type_names_its_field() {
        let err = parse(r#"{"name":"phone","stock":"ten"}"#).unwrap_err();
        assert_eq!(err.code(), "invalid_input");
        assert!(err.to_string().starts_with("`stock` "), "{err}");
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
