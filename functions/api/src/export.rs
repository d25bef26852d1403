//! The fulfilment export: `GET /admin/sales/{sale_id}/orders` (JSON) and
//! `/orders.csv` (for a spreadsheet), a page of buyers at a time.

use flashsale_domain::fulfilment::{FulfilmentLine, FulfilmentPage};
use flashsale_domain::{AppError, OrderStatus, ValidationError};
use flashsale_lambda::{ApiError, CachePolicy, json, sale_id_param};
use lambda_http::http::header::{CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_TYPE, HeaderValue};
use lambda_http::http::{Response, StatusCode};
use lambda_http::{Body, Request, RequestExt as _};

use crate::{Deps, admin, limit_param};

/// Buyers per page when the caller does not say, and the most a caller may ask for:
/// each buyer is one index item. A sale whose buyers may hold many orders gets fewer a
/// page (`SaleService::orders` bounds a page's orders), so a page stays within
/// Lambda's 6 MB response.
const BUYERS_PER_PAGE: usize = 500;
const MAX_BUYERS_PER_PAGE: usize = 1000;

/// The response header that names the next page's cursor in the CSV, whose body has no
/// room for it.
pub const NEXT_CURSOR_HEADER: &str = "x-next-cursor";

/// The CSV's columns, in order.
const COLUMNS: [&str; 8] = [
    "order_id", "buyer", "status", "payment", "amount", "currency", "price", "paid_at",
];

async fn page(deps: &Deps, req: &Request) -> Result<FulfilmentPage, ApiError> {
    admin(deps, req)?;
    let sale_id = sale_id_param(req)?;
    let query = req.query_string_parameters();
    let status = query
        .first("status")
        .map(|raw| {
            raw.parse::<OrderStatus>().map_err(|_| {
                AppError::Invalid(ValidationError::new(
                    "status",
                    "must be one of reserved, paid, cancelled, expired, refunded",
                ))
            })
        })
        .transpose()?;
    let limit = limit_param(&query, BUYERS_PER_PAGE, MAX_BUYERS_PER_PAGE)?;
    Ok(deps
        .sales
        .orders(&sale_id, status, query.first("cursor"), limit)
        .await?)
}

pub(crate) async fn sale_orders(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let page = page(deps, req).await?;
    json(StatusCode::OK, &page, CachePolicy::NoStore)
}

/// The same page as CSV: a header row on the first page only (no cursor), so that the
/// pages of an export join into one file; the next page's cursor in
/// [`NEXT_CURSOR_HEADER`].
pub(crate) async fn sale_orders_csv(
    deps: &Deps,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let page = page(deps, req).await?;
    let first = req.query_string_parameters().first("cursor").is_none();
    let sale_id = sale_id_param(req)?;
    let text = to_csv(&page.orders, first)?;
    let mut response = Response::new(Body::Text(text));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(disposition) =
        HeaderValue::from_str(&format!("attachment; filename=\"{sale_id}-orders.csv\""))
    {
        headers.insert(CONTENT_DISPOSITION, disposition);
    }
    if let Some(next) = page
        .next_cursor
        .as_deref()
        .and_then(|next| HeaderValue::from_str(next).ok())
    {
        headers.insert(NEXT_CURSOR_HEADER, next);
    }
    Ok(response)
}

/// RFC 4180 CSV (CRLF line ends) through the `csv` crate. A text cell that a
/// spreadsheet would read as a formula (`=`, `+`, `-`, `@`, a tab or a carriage return
/// first: a buyer id is the identity provider's subject, not ours) is prefixed with
/// `'`, as OWASP advises.
fn to_csv(lines: &[FulfilmentLine], header: bool) -> Result<String, ApiError> {
    let mut out = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::new());
    let failed = |source: csv::Error| ApiError::Encode {
        source: source.into(),
    };
    if header {
        out.write_record(COLUMNS).map_err(failed)?;
    }
    for line in lines {
        let (amount, currency, price) = match line.price {
            Some(price) => (
                price.amount().to_string(),
                price.currency().code().to_owned(),
                price.major_units(),
            ),
            None => Default::default(),
        };
        out.write_record([
            defused(&line.order_id.to_string()),
            defused(line.buyer.as_str()),
            line.status.as_str().to_owned(),
            line.payment.unwrap_or_default().to_owned(),
            amount,
            currency,
            price,
            line.paid_at
                .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .unwrap_or_default(),
        ])
        .map_err(failed)?;
    }
    let bytes = out.into_inner().map_err(|error| ApiError::Encode {
        source: error.into_error().into(),
    })?;
    String::from_utf8(bytes).map_err(|source| ApiError::Encode {
        source: source.into(),
    })
}

/// `cell`, made safe to open in a spreadsheet.
fn defused(cell: &str) -> String {
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{cell}")
    } else {
        cell.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_formula_is_defused_and_plain_text_is_not() {
        assert_eq!(defused("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        assert_eq!(defused("-1+1"), "'-1+1");
        assert_eq!(defused("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(defused("user-42"), "user-42");
    }
}
