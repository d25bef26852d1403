//! The local Lambda service: functions are JSON in, JSON out, as on AWS, invoked either
//! synchronously (API Gateway, the SQS event source mapping) or asynchronously
//! (EventBridge Scheduler), with Lambda's timeout and asynchronous retry rules.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::Instrument;

/// An error and its sources on one line, for logs: the functions' own.
pub use flashsale_lambda::failure::error_chain;

use crate::model::{FunctionSpec, StackModel};

/// A function's own error, as the Lambda runtime reports it.
pub type FunctionError = Box<dyn std::error::Error + Send + Sync>;

/// What Lambda passes a function besides its event.
#[derive(Debug, Clone)]
pub struct InvokeContext {
    pub request_id: String,
    pub function_arn: String,
    pub deadline: SystemTime,
}

/// A function the local Lambda service can run: the JSON event in, the JSON result out.
#[async_trait]
pub trait LambdaFunction: Send + Sync {
    async fn invoke(&self, event: Value, context: InvokeContext) -> Result<Value, FunctionError>;
}

struct FnFunction<F>(F);

#[async_trait]
impl<F, Fut> LambdaFunction for FnFunction<F>
where
    F: Fn(Value) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Value, FunctionError>> + Send,
{
    async fn invoke(&self, event: Value, _context: InvokeContext) -> Result<Value, FunctionError> {
        (self.0)(event).await
    }
}

/// A function from a closure, e.g. a test target that records its events.
pub fn function_fn<F, Fut>(f: F) -> Arc<dyn LambdaFunction>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, FunctionError>> + Send + 'static,
{
    Arc::new(FnFunction(f))
}

#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("function {0} is not part of this stack")]
    UnknownFunction(String),
    #[error("function {function} failed")]
    Failed {
        function: String,
        #[source]
        source: FunctionError,
    },
    #[error("function {function} timed out after {timeout:?}")]
    TimedOut { function: String, timeout: Duration },
    /// The execution environment died mid-invocation (a fault drill's crash): whatever
    /// the function had done so far stays done, and it answered nothing.
    #[error("function {function}: the runtime exited mid-invocation (Runtime.ExitError)")]
    Crashed { function: String },
}

/// A crash armed on a function, for fault drills: called with the event of each
/// invocation of that function; the future it answers completing first abandons the
/// invocation, as the death of its process would. The first crash disarms it.
pub type CrashTrigger = Arc<dyn Fn(&Value) -> BoxFuture<'static, ()> + Send + Sync>;

/// How Lambda retries asynchronous invocations, locally.
#[derive(Debug, Clone)]
pub struct AsyncRetryTiming {
    /// The wait before each retry; AWS waits about 1 then 2 minutes.
    pub delays: Vec<Duration>,
}

impl Default for AsyncRetryTiming {
    fn default() -> Self {
        Self {
            delays: vec![Duration::from_secs(60), Duration::from_secs(120)],
        }
    }
}

struct Deployed {
    spec: FunctionSpec,
    code: Arc<dyn LambdaFunction>,
    /// `ReservedConcurrentExecutions` as permits, for asynchronous invocations.
    reserved: Option<Arc<tokio::sync::Semaphore>>,
}

/// The stack's functions.
#[derive(Clone)]
pub struct LambdaService {
    functions: Arc<BTreeMap<String, Deployed>>,
    model: Arc<StackModel>,
    sqs: aws_sdk_sqs::Client,
    timing: AsyncRetryTiming,
    shutdown: watch::Receiver<bool>,
    crashes: Arc<Mutex<BTreeMap<String, CrashTrigger>>>,
}

impl LambdaService {
    /// `code` maps each logical id of `model.functions` to its implementation.
    pub fn new(
        model: Arc<StackModel>,
        code: BTreeMap<String, Arc<dyn LambdaFunction>>,
        sqs: aws_sdk_sqs::Client,
        timing: AsyncRetryTiming,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let functions = model
            .functions
            .iter()
            .filter_map(|spec| {
                code.get(&spec.logical_id).map(|code| {
                    (
                        spec.logical_id.clone(),
                        Deployed {
                            spec: spec.clone(),
                            code: code.clone(),
                            reserved: spec
                                .reserved_concurrency
                                .map(|n| Arc::new(tokio::sync::Semaphore::new(n as usize))),
                        },
                    )
                })
            })
            .collect();
        Self {
            functions: Arc::new(functions),
            model,
            sqs,
            timing,
            shutdown,
            crashes: Arc::default(),
        }
    }

    /// Arms a crash of `logical_id`: its invocations race `trigger` until one loses and
    /// is abandoned mid-way (Lambda reports `Runtime.ExitError`; an SQS batch comes back
    /// whole after its visibility timeout). For fault drills.
    pub fn crash_when(&self, logical_id: &str, trigger: CrashTrigger) {
        self.crashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(logical_id.to_owned(), trigger);
    }

    pub fn model(&self) -> &StackModel {
        &self.model
    }

    /// Runs the function and waits for its result (InvocationType RequestResponse),
    /// cut off at the function's `Timeout` as Lambda does.
    pub async fn invoke(&self, logical_id: &str, event: Value) -> Result<Value, InvokeError> {
        let deployed = self
            .functions
            .get(logical_id)
            .ok_or_else(|| InvokeError::UnknownFunction(logical_id.to_owned()))?;
        let timeout = deployed.spec.timeout;
        // Lambda's own `Invocations` metric, so a test can see what reached a function.
        ::metrics::counter!("lambda_invocations", "function" => logical_id.to_owned()).increment(1);
        let context = InvokeContext {
            request_id: ulid::Ulid::new().to_string().to_lowercase(),
            function_arn: deployed.spec.arn.clone(),
            deadline: SystemTime::now() + timeout,
        };
        let span =
            tracing::info_span!("invoke", function = logical_id, request_id = %context.request_id);
        let armed = self
            .crashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(logical_id)
            .cloned();
        let crash = armed.as_ref().map(|trigger| trigger(&event));
        let run = tokio::time::timeout(timeout, deployed.code.invoke(event, context));
        let finished = match crash {
            None => run.instrument(span).await,
            Some(crash) => tokio::select! {
                finished = run.instrument(span) => finished,
                () = crash => {
                    // Only this trigger: another may have been armed meanwhile.
                    let mut crashes = self.crashes.lock().unwrap_or_else(PoisonError::into_inner);
                    if crashes.get(logical_id).zip(armed.as_ref()).is_some_and(|(now, fired)| Arc::ptr_eq(now, fired)) {
                        crashes.remove(logical_id);
                    }
                    tracing::warn!(function = logical_id, "invocation abandoned: the runtime exited (fault drill)");
                    return Err(InvokeError::Crashed { function: logical_id.to_owned() });
                }
            },
        };
        match finished {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(source)) => Err(InvokeError::Failed {
                function: logical_id.to_owned(),
                source,
            }),
            Err(_) => Err(InvokeError::TimedOut {
                function: logical_id.to_owned(),
                timeout,
            }),
        }
    }

    /// Queues the event for the function and returns at once (InvocationType Event),
    /// as EventBridge Scheduler invokes Lambda. A failed run is retried after the
    /// configured delays, up to the function's `EventInvokeConfig` (2 retries and 6
    /// hours by default); then the invocation record goes to the `OnFailure` queue if
    /// there is one, and is otherwise dropped, as on AWS.
    pub fn invoke_async(&self, logical_id: &str, event: Value) -> Result<(), InvokeError> {
        let deployed = self
            .functions
            .get(logical_id)
            .ok_or_else(|| InvokeError::UnknownFunction(logical_id.to_owned()))?;
        let config = deployed.spec.async_invoke.clone();
        let reserved = deployed.reserved.clone();
        let function_arn = deployed.spec.arn.clone();
        let service = self.clone();
        let logical_id = logical_id.to_owned();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let queued = Instant::now();
            let request_id = ulid::Ulid::new().to_string().to_lowercase();
            let mut attempt: u32 = 0;
            loop {
                attempt += 1;
                // A throttled asynchronous event waits in Lambda's queue (retried, not
                // failed) until the function has a free slot of its reserved concurrency.
                let slot = match &reserved {
                    Some(slots) => tokio::select! {
                        slot = slots.clone().acquire_owned() => slot.ok(),
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    },
                    None => None,
                };
                let error = match service.invoke(&logical_id, event.clone()).await {
                    Ok(_) => return,
                    Err(error) => error,
                };
                let retries_left = attempt <= config.maximum_retry_attempts;
                let delay = service
                    .timing
                    .delays
                    .get(attempt as usize - 1)
                    .or(service.timing.delays.last())
                    .copied()
                    .unwrap_or_default();
                drop(slot);
                let too_old = queued.elapsed() + delay > config.maximum_event_age;
                if retries_left && !too_old {
                    tracing::warn!(function = %logical_id, attempt, error = %error_chain(&error), ?delay, "asynchronous invocation failed; Lambda will retry");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => continue,
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                }
                let condition = if too_old {
                    "EventAgeExceeded"
                } else {
                    "RetriesExhausted"
                };
                tracing::error!(function = %logical_id, attempt, error = %error_chain(&error), condition, "asynchronous invocation dropped");
                if let Some(queue_arn) = &config.on_failure_queue_arn {
                    service
                        .send_failure_record(
                            queue_arn,
                            &function_arn,
                            &request_id,
                            condition,
                            attempt,
                            &event,
                            &error,
                        )
                        .await;
                }
                return;
            }
        });
        Ok(())
    }

    /// Sends Lambda's asynchronous-invocation failure record to an SQS destination.
    #[allow(clippy::too_many_arguments)]
    async fn send_failure_record(
        &self,
        queue_arn: &str,
        function_arn: &str,
        request_id: &str,
        condition: &str,
        attempts: u32,
        event: &Value,
        error: &InvokeError,
    ) {
        let Some(queue) = self.model.queue_by_arn(queue_arn) else {
            tracing::error!(
                queue_arn,
                "OnFailure destination is not a queue of this stack"
            );
            return;
        };
        let record = json!({
            "version": "1.0",
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "requestContext": {
                "requestId": request_id,
                "functionArn": format!("{function_arn}:$LATEST"),
                "condition": condition,
                "approximateInvokeCount": attempts,
            },
            "requestPayload": event,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": {"errorMessage": error_chain(error), "errorType": error_type(error)},
        });
        let mut request = self
            .sqs
            .send_message()
            .queue_url(&queue.url)
            .message_body(record.to_string());
        if queue.fifo {
            request = request
                .message_group_id(request_id)
                .message_deduplication_id(request_id);
        }
        if let Err(e) = request.send().await {
            tracing::error!(error = %error_chain(&e), queue = %queue.url, "could not send the failure record");
        }
    }
}

fn error_type(error: &InvokeError) -> &'static str {
    match error {
        InvokeError::TimedOut { .. } => "Sandbox.Timedout",
        InvokeError::Crashed { .. } => "Runtime.ExitError",
        _ => "Runtime.Unhandled",
    }
}
