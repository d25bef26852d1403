//! The correlation id of an API request: the caller's own `x-correlation-id` when it is
//! a sane token, else API Gateway's request id. Every log line of the request carries
//! it, and the grab hands it on along the order.

use lambda_http::Request;
use lambda_http::RequestExt as _;
use lambda_http::request::RequestContext;

/// The header a client (or an upstream service) names its request with.
pub const HEADER: &str = "x-correlation-id";

/// Longer ids are refused, not cut: an id is only useful if it matches exactly.
pub const MAX_LEN: usize = 128;

/// The request's correlation id, if it has one.
pub fn of(req: &Request) -> Option<String> {
    let offered = req
        .headers()
        .get(HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|id| is_sane(id));
    offered
        .map(str::to_owned)
        .or_else(|| match req.request_context_ref() {
            Some(RequestContext::ApiGatewayV2(context)) => context.request_id.clone(),
            _ => None,
        })
}

/// A log field, not free text: no spaces, quotes or control characters.
fn is_sane(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(header: Option<&str>, request_id: Option<&str>) -> Request {
        let mut context =
            lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequestContext::default();
        context.request_id = request_id.map(str::to_owned);
        let mut builder = http::Request::builder();
        if let Some(header) = header {
            builder = builder.header(HEADER, header);
        }
        let mut req: Request = builder.body(lambda_http::Body::Empty).expect("request");
        req.extensions_mut()
            .insert(RequestContext::ApiGatewayV2(context));
        req
    }

    #[test]
    fn the_callers_id_wins_when_sane_else_the_gateways_request_id() {
        assert_eq!(
            of(&request(Some("checkout-7f3a"), Some("gw-1"))).as_deref(),
            Some("checkout-7f3a")
        );
        assert_eq!(
            of(&request(Some("has space"), Some("gw-1"))).as_deref(),
            Some("gw-1")
        );
        assert_eq!(
            of(&request(Some(&"x".repeat(MAX_LEN + 1)), Some("gw-1"))).as_deref(),
            Some("gw-1")
        );
        assert_eq!(of(&request(None, None)), None);
    }
}
