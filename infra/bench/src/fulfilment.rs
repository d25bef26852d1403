//! The fulfilment export at size: a sale of many paid orders (100,000 in `make bench`)
//! exported as CSV through the local stack, page after page as the console does, and
//! checked against the stats: every paid order once, read through the index (the
//! proxy counts the calls: queries, never a scan).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use flashsale_domain::payment::{OrderPayment, PaymentId, PaymentState};
use flashsale_domain::ports::{OrderPayments, StockLedger};
use flashsale_domain::{OrderId, Reservation, ReservePath, UserId};
use futures::stream::{self, StreamExt, TryStreamExt};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;

use crate::contention::{RawReserve, RawTarget};
use crate::proxy::Counts;
use crate::scenarios::{ScenarioError, Session, asked_while_busy};
use crate::stack::BenchStack;

/// The longest payment window a sale takes: no order lapses while the bench runs.
const PAYMENT_WINDOW_SECS: u32 = 86_400;

#[derive(Debug, Clone, Copy)]
pub struct ExportSizes {
    pub orders: usize,
    /// Orders seeded at once, straight into the table through the store.
    pub seed_concurrency: usize,
    /// Buyers per page of the export (the console asks for 1,000).
    pub page: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub orders: usize,
    pub shards: u16,
    pub page: usize,
    pub seeded_in: Duration,
    /// From the first page's request to the last page's answer.
    pub exported_in: Duration,
    pub pages: usize,
    /// Data rows in the joined CSV, and how many distinct order ids they name.
    pub rows: usize,
    pub distinct: usize,
    /// Rows whose status is not `paid`, whose payment is not `captured`, or whose
    /// `paid_at` is empty.
    pub not_paid: usize,
    /// The stats' `paid` and `consistent`, read after the export.
    pub stats_paid: u64,
    pub stats_consistent: bool,
    /// DynamoDB calls during the export, counted by the proxy.
    pub dynamodb: Counts,
}

impl ExportReport {
    pub fn queries(&self) -> u64 {
        self.dynamodb.of("DynamoDB_20120810.Query")
    }

    pub fn scans(&self) -> u64 {
        self.dynamodb.of("DynamoDB_20120810.Scan")
    }
}

fn unexpected(error: impl std::fmt::Display) -> ScenarioError {
    ScenarioError::Unexpected(error.to_string())
}

/// Seeds `sizes.orders` paid orders as the grab and the settlement write them (a
/// take-then-hold reserve, the payment attached, `pay_with`), one buyer each; then
/// exports them and checks the file.
pub async fn export_at_size(
    session: &Session,
    stack: &BenchStack,
    sizes: &ExportSizes,
) -> Result<ExportReport, ScenarioError> {
    let stock = u32::try_from(sizes.orders).map_err(unexpected)?;
    let sale_id = session
        .create_sale_on_shards(
            "export",
            stock,
            PAYMENT_WINDOW_SECS,
            None,
            ReservePath::TakeThenHold,
        )
        .await?;
    let target = RawTarget::new(stack).await.map_err(unexpected)?;
    let sale = target.sale(&sale_id).await.map_err(unexpected)?;
    let store = target.store_for(RawReserve::TakeThenHold);

    let seeding = Instant::now();
    stream::iter(0..sizes.orders)
        .map(|n| {
            let (store, sale) = (store.clone(), sale.clone());
            async move {
                let user_id = UserId::parse(format!("bench-export-{n}")).map_err(unexpected)?;
                let now = Utc::now();
                let reservation = Reservation {
                    order_id: OrderId::new(sale.sale_id.clone()),
                    sale_id: sale.sale_id.clone(),
                    shard: u16::try_from(n % usize::from(sale.shards)).map_err(unexpected)?,
                    user_id,
                    created_at: now,
                    expires_at: sale.payment_deadline(now),
                    price: sale.price,
                };
                store
                    .reserve(&sale, reservation.shard, &reservation)
                    .await
                    .map_err(unexpected)?
                    .map_err(|refusal| unexpected(format!("seed {n}: {refusal:?}")))?;
                let payment = PaymentId::new(format!("pi_bench_{}", reservation.order_id));
                store
                    .attach_payment(&reservation, &payment)
                    .await
                    .map_err(unexpected)?;
                let paid = OrderPayment {
                    id: payment,
                    state: PaymentState::Captured,
                };
                store
                    .pay_with(&reservation, &paid, Utc::now())
                    .await
                    .map_err(unexpected)?;
                Ok::<_, ScenarioError>(())
            }
        })
        .buffer_unordered(sizes.seed_concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    let seeded_in = seeding.elapsed();

    let http = reqwest::Client::new();
    let url = format!(
        "{}/admin/sales/{sale_id}/orders.csv",
        session.api.base_url()
    );
    let limit = sizes.page.to_string();
    let counts_before = stack.dynamodb.counts();
    let exporting = Instant::now();
    let (mut csv, mut cursor, mut pages) = (String::new(), None::<String>, 0);
    loop {
        let mut query = vec![("status", "paid"), ("limit", limit.as_str())];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.as_str()));
        }
        // A read: a busy answer is asked again, as the console does.
        let (answer, _) = asked_while_busy(
            || async {
                http.get(&url)
                    .query(&query)
                    .bearer_auth(&session.admin)
                    .send()
                    .await
                    .map_err(unexpected)
            },
            reqwest::Response::status,
        )
        .await?;
        if answer.status() != StatusCode::OK {
            let status = answer.status();
            let body = answer.text().await.unwrap_or_default();
            return Err(unexpected(format!("export page {pages}: {status} {body}")));
        }
        let next = answer
            .headers()
            .get("x-next-cursor")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        csv.push_str(&answer.text().await.map_err(unexpected)?);
        pages += 1;
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let exported_in = exporting.elapsed();
    let dynamodb = stack.dynamodb.counts().since(&counts_before);

    let mut rows = 0;
    let mut not_paid = 0;
    let mut ids = BTreeSet::new();
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        rows += 1;
        ids.insert(cells.first().copied().unwrap_or_default().to_owned());
        // order_id, buyer, status, payment, amount, currency, price, paid_at
        if cells.get(2) != Some(&"paid")
            || cells.get(3) != Some(&"captured")
            || cells.get(7).is_none_or(|at| at.is_empty())
        {
            not_paid += 1;
        }
    }
    let stats = session.api.stats(&session.admin, &sale_id).await?;
    Ok(ExportReport {
        orders: sizes.orders,
        shards: sale.shards,
        page: sizes.page,
        seeded_in,
        exported_in,
        pages,
        rows,
        distinct: ids.len(),
        not_paid,
        stats_paid: stats.body.get("paid").and_then(Value::as_u64).unwrap_or(0),
        stats_consistent: stats.body.get("consistent") == Some(&Value::Bool(true)),
        dynamodb,
    })
}
