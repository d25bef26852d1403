//! The operator's pause under a surge: how long after the pause's 200 the last grab it
//! admits is answered. On a sale with more stock than the run can sell, half the surge
//! is new buyers (each a token, a grab path and a grab), the other half buyers who got
//! their grab path before and grab with it now; an admin pauses the sale mid-surge, and
//! the surge goes on past the stated bound (`SaleRefreshMs`). Then the sale is resumed
//! and must sell on, and its stock must reconcile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flashsale_domain::ReservePath;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::scenarios::{ScenarioError, Session, asked_while_busy};

/// The sale's payment window: long enough that no hold lapses during the run, so the
/// reservations' own times can be read back from their deadlines.
const PAYMENT_WINDOW_SECS: u32 = 900;

#[derive(Debug, Clone, Copy)]
pub struct PauseSizes {
    /// Buyers in flight at once: half new, half holding a grab path from before.
    pub concurrency: usize,
    /// Grab paths handed out before the surge, for the buyers who hold one.
    pub paths: usize,
    /// How often each buyer holding a path grabs with the next one: paced, so that the
    /// paths last past the bound.
    pub holder_every: Duration,
    /// How long the surge runs before the pause.
    pub before: Duration,
    /// How long it goes on after the pause's 200, past the bound.
    pub after: Duration,
    /// The template's `SaleRefreshMs`: the bound under test.
    pub sale_refresh: Duration,
    pub stock: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct PauseReport {
    pub concurrency: usize,
    pub sale_refresh: Duration,
    /// What each request of the surge was answered, by route.
    pub outcomes: BTreeMap<String, usize>,
    /// Reservations answered before, and after, the pause's 200.
    pub admitted_before: usize,
    pub admitted_after: usize,
    /// From the pause's 200 to the answer of the last grab it admitted (client side).
    pub last_admitted_after: Option<Duration>,
    /// From the pause's 200 to the first `sale_paused` answer.
    pub first_refused_after: Option<Duration>,
    /// Grabs whose request was sent at least one bound after the pause's 200, and of
    /// those, how many were admitted (the bound's claim: none).
    pub sent_past_the_bound: usize,
    pub admitted_past_the_bound: usize,
    /// A buyer bought once the sale was resumed.
    pub sold_after_resume: bool,
    /// `available + reserved + paid == stock` and the reservations counted by the stats
    /// are the 202s the surge saw.
    pub consistent: bool,
}

/// One request of the surge.
struct Answer {
    route: &'static str,
    status: u16,
    code: Option<String>,
    sent: Instant,
    answered: Instant,
}

impl Answer {
    fn outcome(&self) -> String {
        match &self.code {
            Some(code) => format!("{} {} {code}", self.route, self.status),
            None => format!("{} {}", self.route, self.status),
        }
    }

    fn admitted(&self) -> bool {
        self.route == "grab" && self.status == 202
    }

    fn paused(&self) -> bool {
        self.code.as_deref() == Some("sale_paused")
    }
}

/// The request, its answer as recorded, and the answer's body.
async fn timed(session: &Session, route: &'static str, path: &str, token: &str) -> (Answer, Value) {
    let sent = Instant::now();
    let answer = session
        .api
        .send_raw(Method::POST, path, Some(token), None)
        .await;
    let answered = Instant::now();
    let (status, body) = match answer {
        Ok(response) => (response.status.as_u16(), response.body),
        Err(_) => (0, Value::Null),
    };
    let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
    let answer = Answer {
        route,
        status,
        code: field("error"),
        sent,
        answered,
    };
    (answer, body)
}

/// One buyer: a token, a grab path, and the grab, each answer recorded.
async fn one_buyer(session: &Session, sale_id: &str, buyer: &str, answers: &Mutex<Vec<Answer>>) {
    let Ok(token) = session.api.local_token(buyer, false).await else {
        return;
    };
    let (pass, body) = timed(session, "token", &format!("/sales/{sale_id}/token"), &token).await;
    answers.lock().await.push(pass);
    if let Some(grab_path) = body.get("grab_path").and_then(Value::as_str) {
        let (grab, _) = timed(session, "grab", grab_path, &token).await;
        answers.lock().await.push(grab);
    }
}

pub async fn pause_under_surge(
    session: &Session,
    sizes: &PauseSizes,
) -> Result<PauseReport, ScenarioError> {
    let sale_id = session
        .create_sale_on_shards(
            "pause",
            sizes.stock,
            PAYMENT_WINDOW_SECS,
            None,
            ReservePath::TakeThenHold,
        )
        .await?;
    let held = session
        .buyers_with_paths(&sale_id, "pause-held", sizes.paths)
        .await?;
    let held = Arc::new(Mutex::new(held));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let surge = (0..sizes.concurrency).map(|worker| {
        let (answers, stop, sale_id) = (answers.clone(), stop.clone(), sale_id.clone());
        let held = held.clone();
        async move {
            let mut n = 0_usize;
            while !stop.load(Ordering::Relaxed) {
                if worker % 2 == 0 {
                    let buyer = format!("bench-pause-{worker}-{n}-{}", session.run);
                    one_buyer(session, &sale_id, &buyer, &answers).await;
                    n += 1;
                    continue;
                }
                let Some((token, path)) = held.lock().await.pop() else {
                    break;
                };
                let (grab, _) = timed(session, "grab", &path, &token).await;
                answers.lock().await.push(grab);
                tokio::time::sleep(sizes.holder_every).await;
            }
        }
    });
    let operator = async {
        tokio::time::sleep(sizes.before).await;
        let path = format!("/admin/sales/{sale_id}/pause");
        // Pausing is idempotent: a busy answer is asked again.
        let (answer, _) = asked_while_busy(
            || async {
                Ok(session
                    .api
                    .send_raw(Method::POST, &path, Some(&session.admin), None)
                    .await?)
            },
            |answer| answer.status,
        )
        .await?;
        let paused = Instant::now();
        if answer.status != StatusCode::OK {
            return Err(ScenarioError::Unexpected(format!(
                "pause answered {}: {}",
                answer.status, answer.body
            )));
        }
        tokio::time::sleep(sizes.after).await;
        stop.store(true, Ordering::Relaxed);
        Ok(paused)
    };
    let (paused, _) = tokio::join!(operator, futures::future::join_all(surge));
    let paused_at = paused?;
    let answers = std::mem::take(&mut *answers.lock().await);

    let since_pause = |at: Instant| at.checked_duration_since(paused_at);
    let admitted: Vec<&Answer> = answers.iter().filter(|a| a.admitted()).collect();
    let after: Vec<&&Answer> = admitted.iter().filter(|a| a.answered > paused_at).collect();
    let past_the_bound = |a: &Answer| {
        a.route == "grab" && since_pause(a.sent).is_some_and(|d| d >= sizes.sale_refresh)
    };
    let mut outcomes = BTreeMap::new();
    for answer in &answers {
        *outcomes.entry(answer.outcome()).or_default() += 1;
    }

    // Resumed, it sells on: a new buyer within a bound and a margin.
    let path = format!("/admin/sales/{sale_id}/resume");
    session
        .api
        .send(Method::POST, &path, Some(&session.admin), None)
        .await?;
    let resumed = Arc::new(Mutex::new(Vec::new()));
    let give_up = Instant::now() + sizes.sale_refresh * 5;
    let mut tries = 0;
    let sold_after_resume = loop {
        let buyer = format!("bench-resumed-{tries}-{}", session.run);
        one_buyer(session, &sale_id, &buyer, &resumed).await;
        tries += 1;
        if resumed.lock().await.iter().any(Answer::admitted) {
            break true;
        }
        if Instant::now() > give_up {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let stats = session.api.stats(&session.admin, &sale_id).await?;
    let count = |name: &str| stats.body.get(name).and_then(Value::as_u64).unwrap_or(0);
    let sold_after = u64::from(sold_after_resume);
    let consistent = stats.body.get("consistent") == Some(&Value::Bool(true))
        && count("reserved") + count("paid") == admitted.len() as u64 + sold_after
        && count("available") + count("reserved") + count("paid") == u64::from(sizes.stock);

    Ok(PauseReport {
        concurrency: sizes.concurrency,
        sale_refresh: sizes.sale_refresh,
        outcomes,
        admitted_before: admitted.len() - after.len(),
        admitted_after: after.len(),
        last_admitted_after: after.iter().filter_map(|a| since_pause(a.answered)).max(),
        first_refused_after: answers
            .iter()
            .filter(|a| a.paused())
            .filter_map(|a| since_pause(a.answered))
            .min(),
        sent_past_the_bound: answers.iter().filter(|a| past_the_bound(a)).count(),
        admitted_past_the_bound: admitted.iter().filter(|a| past_the_bound(a)).count(),
        sold_after_resume,
        consistent,
    })
}
