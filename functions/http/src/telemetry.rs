//! Logs as one JSON object per line, which CloudWatch Logs Insights queries by field.

use std::error::Error as StdError;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The variable that sets the log filter (`info`, `flashsale_grab=debug,warn`, ...).
pub const LOG_ENV_VAR: &str = "RUST_LOG";

#[derive(Debug, thiserror::Error)]
#[error("could not install the log subscriber")]
pub struct TelemetryError(#[source] Box<dyn StdError + Send + Sync + 'static>);

/// Installs the JSON log subscriber for this process, filtered by `RUST_LOG` (default
/// `info`). Call once, first thing in `main`.
pub fn init() -> Result<(), TelemetryError> {
    let filter = log_filter(std::env::var(LOG_ENV_VAR).ok().as_deref());
    tracing_subscriber::fmt()
        .json()
        // Lambda stamps each line and colour codes would be noise in CloudWatch.
        .with_ansi(false)
        .flatten_event(true)
        .with_current_span(true)
        .with_target(true)
        .finish()
        .with(filter)
        .try_init()
        .map_err(|error| TelemetryError(error.into()))
}

/// A default level and per-target levels (`info`, `flashsale_grab=debug,warn`); `info`
/// when unset or unreadable. `Targets` rather than `EnvFilter`: the same syntax minus
/// span-field filters, without the regex engine EnvFilter links into every bootstrap.
fn log_filter(spec: Option<&str>) -> Targets {
    spec.and_then(|spec| spec.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

/// Logs a start-up failure (bad configuration) as a JSON line and hands it back, so
/// `main` can still return it: the reason lands in the function's structured log
/// stream, not only in the runtime's raw stderr.
pub fn startup_failure<E: StdError + 'static>(err: E) -> E {
    tracing::error!(error = %error_chain(&err), "cannot start");
    err
}

/// An error and all its causes on one line (`outer: inner: root`), for log fields:
/// formatters print only the outermost message of an error value.
pub fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut chain = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reserve failed transiently")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("throttled")]
    struct Inner;

    #[test]
    fn the_log_filter_takes_a_default_level_and_per_target_levels() {
        use tracing::Level;
        let filter = log_filter(Some("flashsale_grab=debug,warn"));
        assert!(filter.would_enable("flashsale_grab", &Level::DEBUG));
        assert!(filter.would_enable("aws_smithy_runtime", &Level::WARN));
        assert!(!filter.would_enable("aws_smithy_runtime", &Level::INFO));
        for unset_or_bad in [None, Some("flashsale_grab=loud")] {
            let filter = log_filter(unset_or_bad);
            assert!(filter.would_enable("flashsale_grab", &Level::INFO));
            assert!(!filter.would_enable("flashsale_grab", &Level::DEBUG));
        }
    }

    #[test]
    fn the_chain_names_every_cause() {
        assert_eq!(
            error_chain(&Outer(Inner)),
            "reserve failed transiently: throttled"
        );
    }
}
