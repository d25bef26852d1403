//! Logs and metrics of a function process.
//!
//! Logs are one JSON object per line, which CloudWatch Logs Insights queries by field,
//! with the keys serverless tooling (Powertools) uses: `level`, `message`, `timestamp`,
//! `service`, `function_name`, `cold_start`, `function_request_id`, `xray_trace_id`,
//! and the fields of every enclosing span at the top level (a handler's
//! `correlation_id`, a record's `message_id`).
//!
//! Metrics are CloudWatch Embedded Metric Format documents, written to stdout with the
//! logs; see [`crate::metrics`].

use std::error::Error as StdError;
use std::future::Future;
use std::io::Write as _;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::process_env;
use crate::failure::error_chain;

/// The variable that sets the log filter (`info`, `flashsale_grab=debug,warn`, ...).
/// It wins over [`LAMBDA_LOG_LEVEL_VAR`]: it is only ever set on purpose, by someone
/// who wants per-crate directives, while Lambda sets the other on every function with
/// an application log level.
pub const LOG_ENV_VAR: &str = "RUST_LOG";

/// The level Lambda's logging configuration (`ApplicationLogLevel`) hands the
/// function: `TRACE`, `DEBUG`, `INFO`, `WARN`, `ERROR` or `FATAL`. Used when
/// [`LOG_ENV_VAR`] is unset.
pub const LAMBDA_LOG_LEVEL_VAR: &str = "AWS_LAMBDA_LOG_LEVEL";

/// The function's name, set by Lambda: the `function` metric dimension and the
/// `function_name` log key.
pub const FUNCTION_NAME_VAR: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// The `service` key of every log line: the application all five functions make up.
pub const SERVICE: &str = "flashsale";

#[derive(Debug, thiserror::Error)]
#[error("could not install the {what}")]
pub struct TelemetryError {
    what: &'static str,
    #[source]
    source: Box<dyn StdError + Send + Sync + 'static>,
}

/// The installed metrics collector. Wrap each invocation in [`Telemetry::flushed`]:
/// the collector aggregates in memory and writes only when flushed, and Lambda may
/// freeze the process for good right after the invocation returns.
#[derive(Clone, Copy)]
pub struct Telemetry {
    metrics: &'static metrics_cloudwatch_embedded::Collector,
}

impl Telemetry {
    /// Runs one invocation, then writes the metrics it recorded.
    pub async fn flushed<F: Future>(self, invocation: F) -> F::Output {
        let output = invocation.await;
        // Under the stdout lock: no log line of another task lands inside a document.
        if let Err(error) = self.flush_to(std::io::stdout().lock()) {
            tracing::warn!(error = %error, "could not write the metrics");
        }
        output
    }

    /// Writes the metrics recorded since the last flush, one EMF document per line.
    pub fn flush_to(self, writer: impl std::io::Write) -> std::io::Result<()> {
        let mut writer = std::io::BufWriter::new(writer);
        self.metrics.flush(&mut writer)?;
        writer.flush()
    }
}

/// Installs the JSON log subscriber and the EMF metrics recorder for this process.
/// Call once, first thing in `main`.
pub fn init() -> Result<Telemetry, TelemetryError> {
    let function_name = process_env(FUNCTION_NAME_VAR);
    subscriber(
        log_filter(process_env),
        function_name.clone(),
        std::io::stdout,
    )
    .try_init()
    .map_err(|source| TelemetryError {
        what: "log subscriber",
        source: source.into(),
    })?;
    install_metrics(function_name.as_deref().unwrap_or("local"))
}

/// Installs the EMF collector as the process's `metrics` recorder, with `function`
/// as the dimension every metric carries.
pub fn install_metrics(function: &str) -> Result<Telemetry, TelemetryError> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(crate::metrics::NAMESPACE)
        .with_dimension(crate::metrics::FUNCTION, function.to_owned())
        .init()
        .map_err(|source| TelemetryError {
            what: "metrics recorder",
            source,
        })?;
    crate::metrics::describe();
    Ok(Telemetry { metrics: collector })
}

/// The log filter: `RUST_LOG` if set, else `AWS_LAMBDA_LOG_LEVEL`, else `info`.
/// A value neither understands falls back to `info` rather than silencing the logs.
/// `Targets` rather than `EnvFilter`: the same directive syntax minus span-field
/// filters, without the regex engine `EnvFilter` links into every bootstrap.
pub fn log_filter(lookup: impl Fn(&str) -> Option<String>) -> Targets {
    let set = |var| lookup(var).filter(|value| !value.trim().is_empty());
    if let Some(directives) = set(LOG_ENV_VAR)
        && let Ok(filter) = directives.parse::<Targets>()
    {
        return filter;
    }
    let level: LevelFilter = match set(LAMBDA_LOG_LEVEL_VAR)
        .map(|level| level.trim().to_ascii_uppercase())
        .as_deref()
    {
        Some("TRACE") => LevelFilter::TRACE,
        Some("DEBUG") => LevelFilter::DEBUG,
        Some("WARN") => LevelFilter::WARN,
        // `tracing` has no level above error.
        Some("ERROR" | "FATAL") => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    };
    Targets::new().with_default(level)
}

/// The subscriber [`init`] installs, writing to `writer` (tests capture it).
pub fn subscriber<W>(
    filter: Targets,
    function_name: Option<String>,
    writer: W,
) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_ansi(false)
        .fmt_fields(JsonFields::new())
        .event_format(LambdaJson {
            function_name,
            first_request: Arc::default(),
        })
        .with_writer(writer)
        .finish()
        .with(filter)
}

/// One JSON object per event, with the Lambda context at the top level.
struct LambdaJson {
    function_name: Option<String>,
    /// The first invocation this process served: its lines are the cold start.
    first_request: Arc<OnceLock<String>>,
}

impl LambdaJson {
    /// The first invocation, and everything logged before any, is the cold start.
    fn cold_start(&self, request_id: Option<&str>) -> bool {
        match request_id {
            Some(id) => self.first_request.get_or_init(|| id.to_owned()) == id,
            None => self.first_request.get().is_none(),
        }
    }
}

/// Span fields renamed to the keys serverless tooling expects; the Lambda runtime
/// names them in camel case on its invocation span.
fn log_key(span_field: &str) -> &str {
    match span_field {
        "requestId" => "function_request_id",
        "xrayTraceId" => "xray_trace_id",
        "tenantId" => "tenant_id",
        other => other,
    }
}

impl<S> FormatEvent<S, JsonFields> for LambdaJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut line = Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert("service".into(), SERVICE.into());
        if let Some(name) = &self.function_name {
            line.insert("function_name".into(), name.as_str().into());
        }
        // Outer spans first, so an inner span's field of the same name wins.
        for span in ctx
            .event_scope()
            .into_iter()
            .flat_map(|scope| scope.from_root())
        {
            let extensions = span.extensions();
            let Some(fields) = extensions.get::<FormattedFields<JsonFields>>() else {
                continue;
            };
            if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&fields.fields) {
                for (key, value) in fields {
                    line.insert(log_key(&key).to_owned(), value);
                }
            }
        }
        event.record(&mut FieldsVisitor(&mut line));
        let request_id = line.get("function_request_id").and_then(Value::as_str);
        let cold_start = self.cold_start(request_id);
        line.insert("cold_start".into(), cold_start.into());
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
struct FieldsVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for FieldsVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn StdError + 'static)) {
        self.0
            .insert(field.name().into(), error_chain(value).into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            pairs
                .iter()
                .find(|(name, _)| *name == var)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    #[test]
    fn rust_log_wins_over_the_lambda_level_which_wins_over_the_default() {
        let filter = |pairs| log_filter(env(pairs)).to_string();
        assert_eq!(
            filter(&[("RUST_LOG", "debug"), ("AWS_LAMBDA_LOG_LEVEL", "WARN")]),
            "debug"
        );
        assert_eq!(filter(&[("AWS_LAMBDA_LOG_LEVEL", "WARN")]), "warn");
        assert_eq!(filter(&[("AWS_LAMBDA_LOG_LEVEL", "fatal")]), "error");
        assert_eq!(filter(&[("AWS_LAMBDA_LOG_LEVEL", "TRACE")]), "trace");
        assert_eq!(filter(&[]), "info");
        // A filter RUST_LOG cannot parse falls back instead of silencing the logs.
        assert_eq!(
            filter(&[("RUST_LOG", "=[bad"), ("AWS_LAMBDA_LOG_LEVEL", "DEBUG")]),
            "debug"
        );
    }

    /// Log lines written to memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("capture lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn lines(&self) -> Vec<Value> {
            let bytes = self.0.lock().expect("capture lock").clone();
            String::from_utf8(bytes)
                .expect("utf-8 logs")
                .lines()
                .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
                .collect()
        }
    }

    #[test]
    fn every_line_carries_the_lambda_context_at_the_top_level() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = subscriber(
            Targets::new().with_default(LevelFilter::INFO),
            Some("stack-GrabFunction-1".into()),
            move || writer.clone(),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("starting");
            for request_id in ["req-1", "req-2"] {
                let invocation =
                    tracing::info_span!("Lambda runtime invoke", requestId = request_id);
                let _invocation = invocation.enter();
                let request = tracing::info_span!("request", correlation_id = "corr-9");
                let _request = request.enter();
                tracing::info!(order_id = "o-1", shard = 3_u64, "reserved");
            }
        });
        let lines = captured.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        for line in &lines {
            assert_eq!(line["service"], "flashsale");
            assert_eq!(line["function_name"], "stack-GrabFunction-1");
            assert_eq!(line["level"], "INFO");
        }
        assert_eq!(lines[0]["message"], "starting");
        assert_eq!(lines[0]["cold_start"], true);
        assert_eq!(lines[1]["function_request_id"], "req-1");
        assert_eq!(lines[1]["correlation_id"], "corr-9");
        assert_eq!(lines[1]["order_id"], "o-1");
        assert_eq!(lines[1]["shard"], 3);
        assert_eq!(lines[1]["cold_start"], true);
        assert_eq!(lines[2]["function_request_id"], "req-2");
        assert_eq!(lines[2]["cold_start"], false);
    }
}
