//! Fault drills: a small surge on a local stack whose every AWS call goes through a
//! fault-injecting proxy (flashsale_emulators::proxy), one drill per fault. In every
//! drill the DynamoDB proxy also plays DynamoDB's transaction conflicts (a transaction
//! holds its items for its round trip plus a commit time), which DynamoDB Local alone
//! never answers. Whatever the fault, nothing may be lost: every reservation ends paid,
//! cancelled or expired with its unit returned (available == stock - paid), the stats
//! are consistent, no unit is sold twice and no buyer holds more than the limit. Each
//! drill also proves its fault was injected, and prints one row of the drill table in
//! docs/reliability.md: the fault, its rate, the outcome, what repaired it and how long
//! the sale took to settle.
//!
//! The drills run side by side, each on a stack and proxies of its own (over the
//! emulators this test process shares), so the file takes about as long as its slowest
//! drill: a lapsed order's timer fires within a minute of being set, and the
//! reconciler's first pass comes a minute after its stack started.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

use flashsale_e2e::{CONSUMER_LAG, Harness, assert_error};
use flashsale_emulators::LocalEndpoints;
use flashsale_emulators::proxy::{ConflictMode, Counts, Fault, FaultRule, Proxy, ProxyOptions};
use flashsale_load::ApiResponse;
use flashsale_local::lambda::CrashTrigger;
use flashsale_local::{EmulatorSource, StackOptions};
use reqwest::{Method, StatusCode};
use serde_json::Value;

const STOCK: u32 = 10;
const SHARDS: u16 = 2;
/// Three buyers for every unit; the first few try twice at once, against the limit.
const BUYERS: usize = 30;
const DOUBLE_TRYERS: usize = 5;
/// Short, so unpaid units lapse within the drill, yet long enough that a buyer whose
/// answers a loaded machine slowed still pays in time. Any window under a minute
/// lapses within a minute of its timer being set: the timer's minute begins then (see
/// `EventBridgeScheduler::at_expression`). A hold whose hand-over was lost has no
/// timer: the reconciler releases it past this deadline by the timer grace
/// ([`TIMER_GRACE`]).
const WINDOW_SECS: u32 = 30;
/// How long a drill's sale may take to settle before the drill fails. Generous: it only
/// bounds a failure. A lapsed order's timer fires within a minute of being set, the
/// reconciler passes once a minute, and the machine may be loaded.
const SETTLE_WITHIN: Duration = Duration::from_secs(300);

/// How long a buyer answered 202 waits before acting on the order before the drill
/// fails: for the order to read as held, or, where the drill wants the consumer first
/// ([`Drill::settle_after_timer`]), for its timer (or its lapse: a hold whose hand-over
/// was lost never gets a timer, and the reconciler releases it past its deadline by the
/// timer grace, passing once a minute). Only a bound on a failure; a passing drill does
/// not wait it out.
const OPEN_WITHIN: Duration = Duration::from_secs(CONSUMER_LAG.as_secs() + 90);

/// How often a drill looks at an order or the stats while it waits: gently, since the
/// drills share one DynamoDB Local, which runs one transaction at a time.
const POLL_EVERY: Duration = Duration::from_millis(700);

/// Polls `probe` every [`POLL_EVERY`] until it answers `Ok`, failing with its last
/// answer after `within`.
async fn eventually<T, E, F, Fut>(within: Duration, probe: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    flashsale_e2e::eventually_every(within, POLL_EVERY, probe).await
}

/// What each DynamoDB transaction adds to its round trip on the conflict proxy, in
/// every drill: the contention AWS answers with `TransactionConflict`.
const COMMIT_TIME: Duration = Duration::from_millis(15);
/// The conflicts drill's: twice as long, so every hot item is contended all surge long.
const CONFLICTS_DRILL_COMMIT_TIME: Duration = Duration::from_millis(30);

/// The reconciler's timer grace where a drill may leave a hold without a timer (a
/// SendMessage that failed after the commit, so the consumer never heard of the hold)
/// or its timer unfired: 5 s past the deadline instead of the deployed 180, so the
/// drill settles within minutes.
const TIMER_GRACE: (&str, &str) = ("ReconcileTimerGraceSecs", "5");
/// And, in every drill, a take with no hold behind it is returned as soon, where it
/// waits out a grab path's life on AWS (6 minutes): these drills end within minutes.
const TAKE_GRACE: (&str, &str) = ("ReconcileTakeGraceSecs", "5");

/// Drills run at once.
const SIDE_BY_SIDE: usize = 3;

/// The consumer's logical id in template.yaml.
const CONSUMER: &str = "OrderConsumerFunction";
/// Scheduler's CreateSchedule, as the proxy names it.
const CREATE_SCHEDULE: &str = "POST /schedules";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    DynamoDb,
    Sqs,
    Scheduler,
}

/// One drill: the fault, how often, and what is expected to repair it.
struct Drill {
    name: &'static str,
    fault: &'static str,
    rate: &'static str,
    repaired_by: String,
    rules: Vec<(Service, FaultRule)>,
    /// Template parameters beyond the drills' common ones.
    parameters: Vec<(&'static str, &'static str)>,
    /// Buyers retry a 503 on the same grab path, as the sale page does; when false
    /// they give up after the first answer, leaving any hold to the system.
    buyers_retry: bool,
    /// Abandon one consumer invocation mid-batch, as a crashed runtime would.
    crash_consumer: bool,
    /// No hold gets more than one timer: asserted where no fault can make a
    /// CreateSchedule's fate unknown to the proxy.
    check_one_timer_per_order: bool,
    /// How long a DynamoDB transaction holds its items beyond its round trip.
    commit_time: Duration,
    /// The point of the drill is the conflicts: assert some were answered.
    expect_conflicts: bool,
    /// Buyers send their pay or cancel twice at once, as a double click does: two
    /// transactions on one buyer's and one order's items, where conflicts still happen
    /// now that no transaction touches a stock shard.
    double_settle: bool,
    /// Buyers act only once the consumer has set their order's timer (or the order
    /// lapsed), so the consumer's batches hold open orders, each of which gets a timer.
    /// Otherwise they act as the sale page lets them: at once, on the held order,
    /// whether or not the consumer has got to it (it then finds the order settled and
    /// sets no timer).
    settle_after_timer: bool,
}

fn on_all(fault: Fault, every: u64) -> Vec<(Service, FaultRule)> {
    [Service::DynamoDb, Service::Sqs, Service::Scheduler]
        .into_iter()
        .map(|service| (service, FaultRule::every("*", fault, every)))
        .collect()
}

impl Drill {
    fn new(
        name: &'static str,
        fault: &'static str,
        rate: &'static str,
        repaired_by: impl Into<String>,
        rules: Vec<(Service, FaultRule)>,
    ) -> Self {
        Self {
            name,
            fault,
            rate,
            repaired_by: repaired_by.into(),
            rules,
            parameters: Vec::new(),
            buyers_retry: true,
            crash_consumer: false,
            check_one_timer_per_order: false,
            commit_time: COMMIT_TIME,
            expect_conflicts: false,
            double_settle: false,
            settle_after_timer: false,
        }
    }

    /// A stack with no standing fault: a drill that arms its own.
    fn quiet(name: &'static str) -> Self {
        Self::new(name, "-", "-", "-", Vec::new())
    }
}

fn drills() -> Vec<Drill> {
    // One request in three to every service faults. SendMessage is among them, so a
    // grab whose hand-over failed after its commit is answered 202 all the same: its
    // buyer may still pay or cancel it, and the reconciler releases it otherwise, a
    // short grace past its deadline here (no timer was ever set for it).
    let one_request_in_three = |name, fault_text, buyer_retry, fault| Drill {
        parameters: vec![TIMER_GRACE],
        ..Drill::new(
            name,
            fault_text,
            "every 3rd request to each service",
            format!(
                "the SDK's retries; what outlasted them: {buyer_retry}, SQS redelivery, the next scheduler poll, and, for a hand-over that failed after its commit (no timer), the reconciler's release past the deadline by the timer grace (5 s here)"
            ),
            on_all(fault, 3),
        )
    };
    vec![
        Drill {
            check_one_timer_per_order: true,
            ..Drill::new(
                "baseline",
                "none (baseline; conflicts at a 15 ms commit time, as in every drill)",
                "-",
                "-",
                Vec::new(),
            )
        },
        one_request_in_three(
            "throttle",
            "throttling: ProvisionedThroughputExceededException (DynamoDB), RequestThrottled (SQS), ThrottlingException (Scheduler)",
            "the buyer's retry of the same grab path (503)",
            Fault::Throttle,
        ),
        one_request_in_three(
            "server-error",
            "500 InternalServerError from every service",
            "the buyer's retry (503)",
            Fault::ServerError,
        ),
        one_request_in_three(
            "reset",
            "connection reset before the request is forwarded",
            "the buyer's retry (503)",
            Fault::ConnectionReset,
        ),
        Drill::new(
            "commit-then-drop",
            "the request is applied, its answer dropped (transaction committed, message sent, schedule created)",
            "every 4th request to each service",
            "retries that find their own work done: the grab's condition names the buyer's hold (resume), FIFO deduplication by order id, CreateSchedule's ConflictException, pay/cancel re-reading a settled order",
            on_all(Fault::CommitThenDrop, 4),
        ),
        // Buyers retry a 503 here too, as the page does: a failed hand-over is answered
        // 202, so no retry can send it again, and buyers that gave up on a 503 from a
        // slow first wave would leave no grab that reaches SendMessage at all.
        Drill {
            parameters: vec![TIMER_GRACE],
            ..Drill::new(
                "send-after-commit",
                "SendMessage fails after the reservation committed, so the consumer never sets a timer; the grab answers 202 all the same, so nothing is retried",
                "the first 15 SendMessage calls",
                "nothing is sent again: the buyer pays or cancels the hold as usual (neither needs its timer), and the reconciler releases one left unpaid once past its deadline by the timer grace (5 s here)",
                vec![(
                    Service::Sqs,
                    FaultRule {
                        times: Some(15),
                        ..FaultRule::always("AmazonSQS.SendMessage", Fault::ServerError)
                    },
                )],
            )
        },
        Drill::new(
            "create-schedule",
            "CreateSchedule fails (500) when the consumer sets an order's timer",
            "the first 15 CreateSchedule calls",
            "the consumer reports the record failed; SQS redelivers it after the visibility timeout and the consumer's repeat sets the timer",
            vec![(
                Service::Scheduler,
                FaultRule {
                    times: Some(15),
                    ..FaultRule::always(CREATE_SCHEDULE, Fault::ServerError)
                },
            )],
        ),
        Drill {
            parameters: vec![TIMER_GRACE],
            ..Drill::new(
                "timer-lost",
                "no schedule ever fires: the local Scheduler's ListSchedules/GetSchedule fail",
                "every schedule read (100%)",
                "the reconciler: an order past its deadline by the timer grace (5 s here) is released",
                vec![(
                    Service::Scheduler,
                    FaultRule::always("GET /schedules", Fault::ServerError),
                )],
            )
        },
        Drill {
            commit_time: CONFLICTS_DRILL_COMMIT_TIME,
            expect_conflicts: true,
            double_settle: true,
            ..Drill::new(
                "conflicts",
                "transaction conflicts: a transaction holds its items for its round trip + 30 ms; another touching one is cancelled (TransactionConflict), a plain write of one refused; every pay and cancel sent twice at once",
                "every item a transaction touches (the buyers' and orders' items: pay, cancel, release) for the whole surge; the shards take plain writes only",
                "the store's jittered retry of a TransactionConflict, the hold read back after a lost race (a pay that finds its order paid answers paid: both clicks hear the same), the buyer's retry of the same grab path (503)",
                Vec::new(),
            )
        },
        Drill {
            crash_consumer: true,
            check_one_timer_per_order: true,
            // The crash comes once half of a batch's records have set their timer: with
            // buyers settling first, a batch of settled orders would set none.
            settle_after_timer: true,
            ..Drill::new(
                "consumer-crash",
                "the consumer's runtime dies mid-batch (Runtime.ExitError), after some records were applied",
                "one batch",
                "the batch comes back whole after the visibility timeout; the consumer writes nothing to the table and names each timer after its order, so a record applied twice sets its timer once",
                Vec::new(),
            )
        },
    ]
}

/// A local stack whose DynamoDB, SQS and Scheduler calls all pass through proxies.
struct Rig {
    harness: Harness,
    dynamodb: Arc<Proxy>,
    sqs: Arc<Proxy>,
    scheduler: Arc<Proxy>,
}

impl Rig {
    async fn start(drill: &Drill) -> Self {
        let emulators = flashsale_emulators::shared().await;
        let proxy = |upstream: String| async move {
            Arc::new(Proxy::start(&upstream, 0).await.expect("a proxy starts"))
        };
        let conflicts = ProxyOptions {
            conflicts: Some(ConflictMode::with_commit_time(drill.commit_time)),
        };
        let dynamodb = Arc::new(
            Proxy::start_with(&emulators.dynamodb_endpoint, 0, conflicts)
                .await
                .expect("a proxy starts"),
        );
        let sqs = proxy(emulators.sqs_endpoint.clone()).await;
        let scheduler = proxy(emulators.moto_endpoint.clone()).await;
        let stack_name = format!(
            "drill-{}-{}",
            drill.name,
            flashsale_emulators::unique_suffix()
        );
        let mut options = StackOptions::new(stack_name)
            // Redelivery after a failure in seconds, not the deployed 3 minutes.
            .parameter("OrdersVisibilityTimeout", "2")
            // Any fault may leave a take with no hold (a grab that gave up between its
            // two writes); every drill waits for the reconciler to give it back.
            .parameter(TAKE_GRACE.0, TAKE_GRACE.1);
        for (key, value) in &drill.parameters {
            options = options.parameter(*key, *value);
        }
        options.emulators = EmulatorSource::Endpoints(LocalEndpoints {
            dynamodb: dynamodb.url(),
            sqs: sqs.url(),
            moto: scheduler.url(),
        });
        // Stripe is not AWS's: not proxied, neither faulted nor counted.
        options.stripe_endpoint = Some(emulators.stripe_endpoint.clone());
        let stack = flashsale_local::LocalStack::start(options)
            .await
            .expect("the local stack starts");
        // The test's own reads bypass the proxies: they are neither faulted nor counted.
        let raw = emulators.sdk_config().await;
        let harness = Harness {
            api: flashsale_load::ApiClient::new(&stack.api_url),
            admin: stack.token("drill-admin", true).expect("an admin token"),
            dynamodb: aws_sdk_dynamodb::Client::new(&raw),
            scheduler: aws_sdk_scheduler::Client::new(&raw),
            stack,
            dynamodb_proxy: Some(Arc::clone(&dynamodb)),
        };
        Self {
            harness,
            dynamodb,
            sqs,
            scheduler,
        }
    }

    fn proxy(&self, service: Service) -> &Proxy {
        match service {
            Service::DynamoDb => &self.dynamodb,
            Service::Sqs => &self.sqs,
            Service::Scheduler => &self.scheduler,
        }
    }

    fn arm(&self, rules: &[(Service, FaultRule)]) {
        for service in [Service::DynamoDb, Service::Sqs, Service::Scheduler] {
            let mine = rules
                .iter()
                .filter(|(target, _)| *target == service)
                .map(|(_, rule)| rule.clone())
                .collect();
            self.proxy(service).set_faults(mine);
        }
    }

    fn counts(&self) -> [(Service, Counts); 3] {
        [Service::DynamoDb, Service::Sqs, Service::Scheduler]
            .map(|service| (service, self.proxy(service).counts()))
    }
}

fn faults_of(counts: &Counts) -> u64 {
    counts.operations.values().map(|op| op.faults).sum()
}

fn created_timers(counts: &Counts) -> u64 {
    counts
        .operations
        .get(CREATE_SCHEDULE)
        .and_then(|op| op.by_outcome.get("200"))
        .copied()
        .unwrap_or(0)
}

/// Arms a crash of the consumer's next invocation of two records or more (or of one,
/// if such a batch never comes), right after half of its records have set their timer:
/// those are applied, the rest are not or are half-way. Answers how big the abandoned
/// batch was, once it happened.
fn arm_consumer_crash(rig: &Rig) -> Arc<AtomicUsize> {
    let crashed_batch = Arc::new(AtomicUsize::new(0));
    let scheduler = Arc::clone(&rig.scheduler);
    let seen = Arc::clone(&crashed_batch);
    let trigger: CrashTrigger = Arc::new(move |event: &Value| {
        let records = event["Records"].as_array().map_or(0, Vec::len);
        let applied = u64::try_from(records / 2).unwrap_or(1).max(1);
        let before = created_timers(&scheduler.counts());
        let scheduler = Arc::clone(&scheduler);
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            while created_timers(&scheduler.counts()) < before + applied {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen.store(records, Ordering::SeqCst);
        })
    });
    rig.harness.stack.lambda().crash_when(CONSUMER, trigger);
    crashed_batch
}

/// What the buyer was told of their order in the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Paid,
    Cancelled,
    Expired,
    /// Left to lapse.
    Nothing,
}

/// One buyer's part: one grab (two at once for the first few, against the limit),
/// then pay, cancel or let the order lapse.
#[derive(Debug, Default)]
struct BuyerReport {
    /// (order id, what the buyer was told) for each 202.
    orders: Vec<(String, Told)>,
    /// Answers by `"{status} {code}"`, the 202s included.
    answers: Vec<String>,
}

async fn grab_once(harness: &Harness, token: &str, sale_id: &str, retry: bool) -> ApiResponse {
    if retry {
        return harness
            .api
            .grab(token, sale_id)
            .await
            .expect("grab answers");
    }
    // The grab path itself is fetched patiently: giving up is about the grab.
    let pass = eventually(SETTLE_WITHIN, || async {
        let pass = harness
            .api
            .grab_pass(token, sale_id)
            .await
            .expect("token answers");
        (pass.status == StatusCode::OK)
            .then(|| pass.clone())
            .ok_or(pass)
    })
    .await;
    let path = pass.str_field("grab_path").expect("a grab path").to_owned();
    harness
        .api
        .send_raw(Method::POST, &path, Some(token), None)
        .await
        .expect("grab answers")
}

async fn buyer(harness: &Harness, drill: &Drill, sale_id: &str, n: usize) -> BuyerReport {
    let token = harness.user(&format!("{sale_id}-buyer-{n}"));
    let tries = if n < DOUBLE_TRYERS { 2 } else { 1 };
    let answers = futures::future::join_all(
        (0..tries).map(|_| grab_once(harness, &token, sale_id, drill.buyers_retry)),
    )
    .await;
    let mut report = BuyerReport::default();
    for answer in answers {
        report.answers.push(format!(
            "{} {}",
            answer.status.as_u16(),
            answer.error_code().unwrap_or("-")
        ));
        if answer.status != StatusCode::ACCEPTED {
            continue;
        }
        let order_id = answer.str_field("order_id").expect("order_id").to_owned();
        // As a buyer's page does: act once the order reads as awaiting payment (held,
        // `reserved`) or lapsed; in a drill that wants the consumer first, only once
        // the order's timer is set as well.
        let opened = eventually(OPEN_WITHIN, || async {
            let status = harness.order_status(&token, &order_id).await;
            let ready = match status.as_str() {
                "expired" => true,
                "reserved" if drill.settle_after_timer => {
                    // Read straight from moto: the proxies neither fault nor count it.
                    // A timer that fired early may be gone already; the order then
                    // lapses at its deadline.
                    harness.release_timer_input(&order_id).await.is_some()
                }
                "reserved" => true,
                _ => false,
            };
            ready.then(|| status.clone()).ok_or(status)
        })
        .await;
        if n.is_multiple_of(3) && opened != "expired" {
            // A paying buyer's card, confirmed at Stripe before the clicks that settle.
            if let Err(refused) = harness.card_confirmed(&token, &order_id).await {
                assert_error(&refused, StatusCode::CONFLICT, "order_expired");
                report.orders.push((order_id, Told::Expired));
                continue;
            }
        }
        let settle = || settle_once(harness, drill, &token, &order_id, n, &opened);
        let told = if drill.double_settle {
            let (first, second) = futures::future::join(settle(), settle()).await;
            assert_eq!(
                first, second,
                "{}: a double click on order {order_id} answered differently",
                drill.name
            );
            first
        } else {
            settle().await
        };
        report.orders.push((order_id, told));
    }
    report
}

/// The buyer's one move on an open order: pay (its card confirmed already), cancel or
/// nothing, by the buyer's number.
async fn settle_once(
    harness: &Harness,
    drill: &Drill,
    token: &str,
    order_id: &str,
    n: usize,
    opened: &str,
) -> Told {
    match (n % 3, opened) {
        (_, "expired") | (2, _) => Told::Nothing,
        (0, _) => {
            // The page's card was confirmed at Stripe before (once); the buyer's click
            // asks for the settlement.
            let paid = harness
                .api
                .confirm_payment(token, order_id)
                .await
                .expect("the settlement answers");
            match (paid.status, paid.str_field("status")) {
                (StatusCode::OK, Some("paid")) => Told::Paid,
                // The window closed before the card: the settlement voided it.
                (StatusCode::OK, Some("expired")) => Told::Expired,
                _ => panic!(
                    "{}: paying answered {}: {}",
                    drill.name, paid.status, paid.body
                ),
            }
        }
        _ => {
            let cancelled = harness
                .api
                .cancel(token, order_id)
                .await
                .expect("cancel answers");
            match (cancelled.status, cancelled.error_code()) {
                (StatusCode::OK, _) => Told::Cancelled,
                (StatusCode::CONFLICT, Some("order_expired")) => Told::Expired,
                _ => panic!(
                    "{}: cancel answered {}: {}",
                    drill.name, cancelled.status, cancelled.body
                ),
            }
        }
    }
}

/// One row of the drill table, measured.
struct Row {
    fault: &'static str,
    rate: String,
    outcome: String,
    repaired_by: String,
    settled_in: Duration,
}

async fn run(drill: Drill) -> Row {
    let rig = Rig::start(&drill).await;
    let harness = &rig.harness;
    let sale_id = format!("drill-{}", drill.name);
    harness
        .active_sale(&sale_id, STOCK, SHARDS, WINDOW_SECS)
        .await;
    let before = rig.counts();
    rig.arm(&drill.rules);
    let crashed_batch = drill.crash_consumer.then(|| arm_consumer_crash(&rig));

    let surge_started = Instant::now();
    eprintln!("drill {}: stack up, faults armed, surge starts", drill.name);
    let buyers =
        futures::future::join_all((0..BUYERS).map(|n| buyer(harness, &drill, &sale_id, n))).await;
    eprintln!(
        "drill {}: buyers done after {:.1} s",
        drill.name,
        surge_started.elapsed().as_secs_f64()
    );

    // Every reservation a buyer was told of ends settled, as the buyer was told.
    let orders: Vec<(String, String, Told)> = buyers
        .iter()
        .enumerate()
        .flat_map(|(n, report)| {
            let token = harness.user(&format!("{sale_id}-buyer-{n}"));
            report
                .orders
                .iter()
                .map(move |(order_id, told)| (token.clone(), order_id.clone(), *told))
        })
        .collect();
    for (token, order_id, told) in &orders {
        let status = eventually(SETTLE_WITHIN, || async {
            let status = harness.order_status(token, order_id).await;
            matches!(status.as_str(), "paid" | "cancelled" | "expired")
                .then(|| status.clone())
                .ok_or(status)
        })
        .await;
        let expected = match told {
            Told::Paid => "paid",
            Told::Cancelled => "cancelled",
            Told::Expired | Told::Nothing => "expired",
        };
        assert_eq!(status, expected, "{}: order {order_id}", drill.name);
    }
    // And so does every hold, told or not (a buyer who gave up after a 503).
    let open_settled = eventually(SETTLE_WITHIN, || async {
        let stats = harness.stats(&sale_id).await;
        let open = stats["reserved"].as_u64().unwrap_or(u64::MAX);
        (open == 0).then(|| stats.clone()).ok_or(stats)
    })
    .await;
    // A grab whose hold never landed (its buyer gave up, or its retries ran out between
    // the two writes) leaves a unit no hold accounts for; the reconciler gives it back
    // once it is older than the take grace. So with no hold open, a unit short of the
    // stock must be one of those takes, and nothing else. The takes are read first: the
    // reconciler may only return some meanwhile, which shrinks the shortfall too.
    let stray = u64::try_from(harness.stray_takes(&sale_id).await.len()).expect("small");
    let stats = harness.stats(&sale_id).await;
    let accounted = ["available", "reserved", "paid"]
        .iter()
        .map(|field| stats[*field].as_u64().expect("a count"))
        .sum::<u64>();
    assert!(
        accounted <= u64::from(STOCK) && u64::from(STOCK) - accounted <= stray,
        "{}: with no hold open, every unit short of the stock is a take no hold accounts for ({stray} of them): {stats} (then {open_settled})",
        drill.name
    );
    // Then the reconciler's repair: nothing lost once it has passed.
    let stats = eventually(SETTLE_WITHIN, || async {
        let stats = harness.stats(&sale_id).await;
        (stats["consistent"] == true)
            .then(|| stats.clone())
            .ok_or(stats)
    })
    .await;
    let settled_in = surge_started.elapsed();
    eprintln!(
        "drill {}: settled after {:.1} s",
        drill.name,
        settled_in.as_secs_f64()
    );
    rig.arm(&[]);
    let counts = rig.counts().map(|(service, now)| {
        let then = &before
            .iter()
            .find(|(s, _)| *s == service)
            .expect("all three")
            .1;
        (service, now.since(then))
    });

    // Nothing lost, nothing sold twice.
    let count = |field: &str| stats[field].as_u64().expect("a count");
    let told = |wanted: Told| {
        u64::try_from(orders.iter().filter(|(_, _, t)| *t == wanted).count()).expect("small")
    };
    assert_eq!(
        count("available"),
        u64::from(STOCK) - count("paid"),
        "{}: every unit not paid is back on sale: {stats}",
        drill.name
    );
    let on_shards: i64 = harness
        .shard_availability(&sale_id, SHARDS)
        .await
        .iter()
        .sum();
    assert_eq!(
        u64::try_from(on_shards).ok(),
        Some(count("available")),
        "{}: the shards hold what the stats say: {stats}",
        drill.name
    );
    assert_eq!(count("paid"), told(Told::Paid), "{}: {stats}", drill.name);
    assert_eq!(
        count("cancelled"),
        told(Told::Cancelled),
        "{}: {stats}",
        drill.name
    );
    let reservations = count("paid") + count("cancelled") + count("expired");
    assert!(
        reservations >= u64::try_from(orders.len()).expect("small"),
        "{}: every order a buyer was told of is counted: {stats}",
        drill.name
    );
    for (n, report) in buyers.iter().enumerate() {
        assert!(
            report.orders.len() <= 1,
            "{}: buyer {n} holds {} orders over a limit of 1",
            drill.name,
            report.orders.len()
        );
        for answer in &report.answers {
            let status: u16 = answer[..3].parse().expect("a status");
            assert!(
                status < 500 || (status == 503 && !drill.buyers_retry),
                "{}: buyer {n} was answered {answer}",
                drill.name
            );
        }
    }
    let answers: BTreeMap<&str, usize> =
        buyers
            .iter()
            .flat_map(|b| b.answers.iter())
            .fold(BTreeMap::new(), |mut tally, answer| {
                *tally.entry(answer.as_str()).or_default() += 1;
                tally
            });

    // The fault was really there.
    for (service, _) in &drill.rules {
        let (_, seen) = counts
            .iter()
            .find(|(s, _)| s == service)
            .expect("all three");
        assert!(
            faults_of(seen) > 0,
            "{}: no fault was injected into {service:?}: {seen:?}",
            drill.name
        );
    }
    let (_, dynamodb_counts) = counts
        .iter()
        .find(|(s, _)| *s == Service::DynamoDb)
        .expect("all three");
    let conflicts = flashsale_e2e::conflicts_by_operation(dynamodb_counts);
    let conflicts_answered: u64 = conflicts.values().sum();
    if drill.expect_conflicts {
        assert!(
            conflicts_answered > 0,
            "{}: no transaction conflict was answered: {dynamodb_counts:?}",
            drill.name,
        );
    }
    let crashed = crashed_batch.map(|batch| batch.load(Ordering::SeqCst));
    if let Some(batch) = crashed {
        assert!(batch > 0, "{}: the consumer never crashed", drill.name);
    }
    let scheduler_counts = &counts[2].1;
    if drill.check_one_timer_per_order {
        // Each timer is named after its order, so a hold never gets two at once: the
        // second CreateSchedule is a ConflictException. (How many were made is a lower
        // bound here: a CreateSchedule cut off by the crash can still create its
        // schedule unseen by the proxy's count.) A record of the crashed batch comes
        // back after the visibility timeout, and if its order's timer fired meanwhile
        // (a window of seconds fires at the next second; Scheduler deletes an `at()`
        // schedule once it has invoked the release, which then waits for the deadline)
        // the name is free again and the redelivery sets a second timer, whose release
        // finds the order settled. So each redelivered record may add one.
        let redelivered = crashed.map_or(0, |batch| u64::try_from(batch).unwrap_or(u64::MAX));
        let timers = created_timers(scheduler_counts);
        assert!(
            timers <= reservations + redelivered,
            "{}: {timers} timers for {reservations} holds and {redelivered} redelivered record(s): {scheduler_counts:?}",
            drill.name
        );
    }

    let injected: u64 = counts.iter().map(|(_, c)| faults_of(c)).sum();
    let requests: u64 = counts.iter().map(|(_, c)| c.total()).sum();
    let rate = match crashed {
        Some(batch) => format!(
            "{}: a batch of {batch} record(s), abandoned after {} timer(s) were set",
            drill.rate,
            (batch / 2).max(1)
        ),
        None if drill.expect_conflicts => format!(
            "{}: {conflicts_answered} of {requests} AWS requests answered a conflict {conflicts:?}",
            drill.rate
        ),
        None if drill.rules.is_empty() => format!("no fault ({requests} AWS requests)"),
        None => format!(
            "{}: {injected} of {requests} AWS requests faulted",
            drill.rate
        ),
    };
    let gave_up: usize = answers
        .iter()
        .filter(|(answer, _)| answer.starts_with("503"))
        .map(|(_, count)| count)
        .sum();
    let outcome = format!(
        "{} holds: {} paid, {} cancelled, {} expired and returned; available {} = stock {STOCK} - paid; consistent; {} timer(s) created; {conflicts_answered} transaction conflict(s) answered{}",
        reservations,
        count("paid"),
        count("cancelled"),
        count("expired"),
        count("available"),
        created_timers(scheduler_counts),
        if gave_up > 0 {
            format!("; {gave_up} grab(s) answered 503 and abandoned")
        } else {
            String::new()
        },
    );
    eprintln!(
        "drill {}: answers {answers:?}; requests {counts:?}",
        drill.name
    );
    Row {
        fault: drill.fault,
        rate,
        outcome,
        repaired_by: drill.repaired_by,
        settled_in,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_fault_drill_ends_with_nothing_lost() {
    // FLASHSALE_DRILLS=name,name runs only those (to work on one); all by default.
    let only = std::env::var("FLASHSALE_DRILLS").ok();
    // A few at a time: every stack shares one DynamoDB Local and one moto, and more
    // side by side starve each other on a loaded machine.
    let turns = Arc::new(tokio::sync::Semaphore::new(SIDE_BY_SIDE));
    let runs: Vec<_> = drills()
        .into_iter()
        .filter(|drill| {
            only.as_deref()
                .is_none_or(|names| names.split(',').any(|name| name.trim() == drill.name))
        })
        .map(|drill| {
            let name = drill.name;
            let turns = Arc::clone(&turns);
            let drill_run = async move {
                let _turn = turns.acquire_owned().await.expect("never closed");
                run(drill).await
            };
            (name, tokio::spawn(drill_run))
        })
        .collect();
    let mut failed = Vec::new();
    println!("| fault | rate | outcome | repaired by | settled in |");
    println!("|---|---|---|---|---|");
    for (name, run) in runs {
        match run.await {
            Ok(row) => println!(
                "| {} | {} | {} | {} | {:.1} s |",
                row.fault,
                row.rate,
                row.outcome,
                row.repaired_by,
                row.settled_in.as_secs_f64()
            ),
            Err(error) => failed.push(format!("{name}: {error}")),
        }
    }
    assert!(failed.is_empty(), "drills failed: {failed:#?}");
}

// ------------------------------------------------------------------ the outage drill

/// The outage drill (issue 16 §3): a steady stream of grabs, then DynamoDB answers 500
/// to every request for [`OUTAGE`], then it recovers.
const OUTAGE: Duration = Duration::from_secs(30);
/// Grabs before the outage, and after it.
const OUTAGE_LEAD: Duration = Duration::from_secs(3);
const OUTAGE_TAIL: Duration = Duration::from_secs(8);
/// Buyers grabbing at once, each sending one grab per [`OUTAGE_PACE`] at most (and one
/// at a time): about 80 grabs a second while the table is healthy.
const OUTAGE_WORKERS: usize = 8;
/// Requests the sale page sends on one grab path at the most (`MAX_GRAB_ATTEMPTS`).
const PAGE_GRAB_ATTEMPTS: u32 = 40;
const OUTAGE_PACE: Duration = Duration::from_millis(100);
/// Enough stock that the stream never sells out: at most `OUTAGE_LEAD + OUTAGE_TAIL`
/// of grabs at 80 a second can be served.
const OUTAGE_STOCK: u32 = 1600;
const OUTAGE_SHARDS: u16 = 8;
/// Long enough that no hold lapses within the drill: a release would call the table
/// during the outage, and those calls are not the grab's.
const OUTAGE_WINDOW_SECS: u32 = 900;
/// A breaker that never opens: the grab as it was before the breakers.
const NO_BREAKER: (&str, &str) = ("BreakerFailures", "1000000000");
/// The route throttles out of the way: the drill is about what reaches the function.
const UNTHROTTLED: [(&str, &str); 4] = [
    ("GrabThrottleRateLimit", "100000"),
    ("GrabThrottleBurstLimit", "100000"),
    ("TokenThrottleRateLimit", "100000"),
    ("TokenThrottleBurstLimit", "100000"),
];

/// Each worker sends the grabs on its own paths, one at a time and at most one per
/// [`OUTAGE_PACE`], for `how_long`; answers in the order they came.
async fn stream(
    harness: &Harness,
    paths: &mut [std::vec::IntoIter<(String, String)>],
    how_long: Duration,
) -> Vec<Answered> {
    let started = Instant::now();
    let per_worker = futures::future::join_all(paths.iter_mut().map(|paths| async move {
        let mut answered = Vec::new();
        while started.elapsed() < how_long {
            let Some((token, path)) = paths.next() else {
                break;
            };
            let sent = started.elapsed();
            let answer = harness
                .api
                .send_raw(Method::POST, &path, Some(&token), None)
                .await
                .expect("grab answers");
            answered.push(Answered {
                at: started.elapsed(),
                status: answer.status.as_u16(),
                order_id: answer.str_field("order_id").map(str::to_owned),
                path: (token, path),
            });
            if let Some(wait) = (sent + OUTAGE_PACE).checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        answered
    }))
    .await;
    let mut answered: Vec<Answered> = per_worker.into_iter().flatten().collect();
    answered.sort_by_key(|a| a.at);
    answered
}

/// One grab of the outage drill: when it was answered, since its stream began, and how.
struct Answered {
    at: Duration,
    status: u16,
    order_id: Option<String>,
    /// The buyer's token and the grab path, for the page's retry of a 503.
    path: (String, String),
}

/// What one run of the outage drill measured.
struct OutageRun {
    grabs_in_outage: usize,
    dynamodb_requests_in_outage: u64,
    /// From the end of the outage to the first 202 after it (answered).
    served_again_after: Option<Duration>,
    answers: BTreeMap<u16, usize>,
}

impl OutageRun {
    fn requests_per_grab(&self) -> f64 {
        self.dynamodb_requests_in_outage as f64 / self.grabs_in_outage.max(1) as f64
    }
}

async fn outage_run(
    name: &'static str,
    parameters: Vec<(&'static str, &'static str)>,
) -> OutageRun {
    let drill = Drill {
        parameters: UNTHROTTLED.into_iter().chain(parameters).collect(),
        buyers_retry: false,
        ..Drill::quiet(name)
    };
    let rig = Rig::start(&drill).await;
    let harness = &rig.harness;
    let sale_id = format!("drill-{name}");
    harness
        .active_sale(&sale_id, OUTAGE_STOCK, OUTAGE_SHARDS, OUTAGE_WINDOW_SECS)
        .await;
    // Every buyer's grab path first, fetched as the page does (a busy answer from a
    // slow first wave is retried): the drill is about the grab route.
    let per_worker =
        ((OUTAGE_LEAD + OUTAGE + OUTAGE_TAIL).as_millis() / OUTAGE_PACE.as_millis()) as usize + 1;
    let paths: Vec<Vec<(String, String)>> =
        futures::future::join_all((0..OUTAGE_WORKERS).map(|worker| {
            let sale_id = &sale_id;
            async move {
                let mut paths = Vec::with_capacity(per_worker);
                for n in 0..per_worker {
                    let token = harness.user(&format!("{sale_id}-w{worker}-{n}"));
                    let pass = harness
                        .api
                        .grab_pass_retrying(&token, sale_id)
                        .await
                        .expect("token answers");
                    assert_eq!(pass.status, StatusCode::OK, "{name}: {}", pass.body);
                    let path = pass.str_field("grab_path").expect("a grab path").to_owned();
                    paths.push((token, path));
                }
                paths
            }
        }))
        .await;

    let mut paths: Vec<_> = paths.into_iter().map(Vec::into_iter).collect();

    // The stream while the table is healthy; then, once the consumer has read every
    // hold it made (its reads are not the grab's and have no breaker), the outage.
    let lead = stream(harness, &mut paths, OUTAGE_LEAD).await;
    let lead_held = lead.iter().filter(|a| a.status == 202).count();
    harness
        .wait_for_orders_opened(&sale_id, u64::try_from(lead_held).expect("small"))
        .await;
    let before = rig.dynamodb.counts();
    rig.arm(&[(
        Service::DynamoDb,
        FaultRule::always("*", Fault::ServerError),
    )]);
    eprintln!("drill {name}: DynamoDB answers 500 to everything");
    let outage = stream(harness, &mut paths, OUTAGE).await;
    rig.arm(&[]);
    let dynamodb_requests_in_outage = rig.dynamodb.counts().since(&before).total();
    eprintln!("drill {name}: DynamoDB is back");
    let tail = stream(harness, &mut paths, OUTAGE_TAIL).await;

    let grabs_in_outage = outage.len();
    let served_again_after = tail.iter().find(|a| a.status == 202).map(|a| a.at);
    // The sale page retries a 503 on the same path, and so do these buyers once the
    // table is back: a grab whose reserve committed but whose answer was lost at the
    // outage's edge (its SDK retry met the outage) is answered 202 then, as its buyer
    // would hear it. Without this the drill counted such holds as never answered.
    let retried: Vec<Answered> = futures::stream::iter(
        lead.iter()
            .chain(&outage)
            .chain(&tail)
            .filter(|first| first.status == 503),
    )
    .map(|first| async move {
        let (token, path) = &first.path;
        // Until an answer that is not busy, as the page retries (up to its 40 requests
        // a path, after a jittered pause): the first resends meet a table that has just
        // come back, and a 503 among them may again be a hold whose answer was lost.
        let mut retry = 0;
        let answer = loop {
            let answer = harness
                .api
                .send_raw(Method::POST, path, Some(token), None)
                .await
                .expect("grab answers");
            if answer.status != StatusCode::SERVICE_UNAVAILABLE || retry == PAGE_GRAB_ATTEMPTS {
                break answer;
            }
            tokio::time::sleep(flashsale_load::surge::backoff(retry)).await;
            retry += 1;
        };
        Answered {
            at: first.at,
            status: answer.status.as_u16(),
            order_id: answer.str_field("order_id").map(str::to_owned),
            path: first.path.clone(),
        }
    })
    .buffered(OUTAGE_WORKERS)
    .collect()
    .await;
    let first: Vec<&Answered> = lead.iter().chain(&outage).chain(&tail).collect();
    let answers = first.iter().fold(BTreeMap::new(), |mut tally, a| {
        *tally.entry(a.status).or_default() += 1;
        tally
    });
    for status in first.iter().copied().chain(&retried).map(|a| a.status) {
        assert!(
            status < 500 || status == 503,
            "{name}: a grab was answered {status}: {answers:?}"
        );
    }
    // What each buyer heard in the end.
    let answered: Vec<&Answered> = first
        .into_iter()
        .filter(|a| a.status != 503)
        .chain(&retried)
        .collect();

    // Nothing lost: every order answered 202 is held, and once the reconciler has given
    // back the takes whose hold the outage cut off, the stock adds up.
    let held: std::collections::BTreeSet<&str> = answered
        .iter()
        .filter(|a| a.status == 202)
        .filter_map(|a| a.order_id.as_deref())
        .collect();
    let stats = eventually(SETTLE_WITHIN, || async {
        let stats = harness.stats(&sale_id).await;
        let count = |field: &str| stats[field].as_u64().unwrap_or(u64::MAX);
        let adds_up =
            count("available").saturating_add(count("reserved")) == u64::from(OUTAGE_STOCK);
        (stats["consistent"] == true && adds_up)
            .then(|| stats.clone())
            .ok_or(stats)
    })
    .await;
    assert_eq!(
        stats["reserved"].as_u64(),
        u64::try_from(held.len()).ok(),
        "{name}: every hold is one a buyer was answered 202 for: {stats}"
    );
    OutageRun {
        grabs_in_outage,
        dynamodb_requests_in_outage,
        served_again_after,
        answers,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dynamodb_outage_is_refused_in_memory_and_the_grab_serves_again_soon_after() {
    // The breaker as deployed, and beside it the grab with a breaker that never opens.
    let (breaker, without) = tokio::join!(
        outage_run("outage", Vec::new()),
        outage_run("outage-no-breaker", vec![NO_BREAKER]),
    );
    for (label, run) in [("with the breaker", &breaker), ("without", &without)] {
        eprintln!(
            "outage drill, {label}: {} DynamoDB requests for {} grabs in the {} s outage ({:.3} a grab); served again {:?} after it; answers {:?}",
            run.dynamodb_requests_in_outage,
            run.grabs_in_outage,
            OUTAGE.as_secs(),
            run.requests_per_grab(),
            run.served_again_after,
            run.answers,
        );
    }
    assert!(
        breaker.grabs_in_outage > 0 && without.grabs_in_outage > 0,
        "grabs were sent during the outage"
    );
    assert!(
        breaker.requests_per_grab() <= 0.1,
        "{:.3} DynamoDB requests a grab during the outage ({} for {})",
        breaker.requests_per_grab(),
        breaker.dynamodb_requests_in_outage,
        breaker.grabs_in_outage
    );
    let served_again = breaker
        .served_again_after
        .expect("the grab served again after the outage");
    let without_breaker = without
        .served_again_after
        .expect("the grab without a breaker served again after the outage");
    // The breaker's cost, side by side with the grab without one in the same instant
    // (so that a loaded machine slows both): a cool-off, and one more if the first
    // probe after the outage is refused or slow. Its goal of 5 s in all is a speed
    // target, measured and recorded in docs/reliability.md on a quiet machine, not
    // asserted here: a fresh CI run on a loaded machine took 5.8 s once.
    let cool_off = flashsale_adapters::breaker::BreakerPolicy::DEFAULT.cool_off;
    assert!(
        served_again <= without_breaker + 2 * cool_off + Duration::from_secs(1),
        "served again {served_again:?} after the outage, {without_breaker:?} without the breaker"
    );
}
