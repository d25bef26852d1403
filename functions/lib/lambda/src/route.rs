//! Routing by API Gateway's `routeKey` (`"POST /sales/{sale_id}/grab/{token}"`), and the
//! path parameters API Gateway extracted for it.
//!
//! Dispatching on the route key, not on the raw path, keeps the function and the API's
//! route table in one vocabulary: a route the template declares is matched by the very
//! string the template declares.

use flashsale_domain::{AppError, OrderId, SaleId};
use lambda_http::Request;
use lambda_http::RequestExt as _;
use lambda_http::request::RequestContext;

use crate::error::ApiError;

/// The route this request was matched to. When API Gateway gives none (a `$default`
/// route, or an event from elsewhere), the method and path stand in, which match no
/// declared route and so answer `not_found`.
pub fn route_key(req: &Request) -> String {
    let declared = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => context.route_key.as_deref(),
        _ => None,
    };
    match declared {
        Some(key) if key != "$default" => key.to_owned(),
        _ => format!("{} {}", req.method(), req.raw_http_path()),
    }
}

/// A path parameter of the matched route.
pub fn path_param<'r>(req: &'r Request, name: &'static str) -> Result<&'r str, ApiError> {
    req.path_parameters_ref()
        .and_then(|params| params.first(name))
        .ok_or(ApiError::MissingPathParameter(name))
}

/// The `sale_id` path parameter. Ids are opaque to clients, so one that could never
/// name a sale is simply a sale that does not exist.
pub fn sale_id_param(req: &Request) -> Result<SaleId, ApiError> {
    SaleId::parse(path_param(req, "sale_id")?).map_err(|_| AppError::SaleNotFound.into())
}

/// The `order_id` path parameter; a malformed id is an order that does not exist,
/// exactly like another user's.
pub fn order_id_param(req: &Request) -> Result<OrderId, ApiError> {
    OrderId::parse(path_param(req, "order_id")?).map_err(|_| AppError::OrderNotFound.into())
}
