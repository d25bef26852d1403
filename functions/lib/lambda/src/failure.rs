//! How a failure is told: an error and its causes on one line for the logs, the
//! Diagnostic the Lambda runtime reports for a failed invocation, and a start-up
//! failure logged before `main` returns it.

use std::error::Error as StdError;

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

/// What the Lambda runtime reports for a failed invocation: `error_type` a stable name
/// the function gives the error (alarms and queries match it), `error_message` the whole
/// chain. Without it the runtime would name the Rust type and print only the outermost
/// message.
pub fn diagnostic(
    error_type: &str,
    err: &(dyn StdError + 'static),
) -> lambda_http::lambda_runtime::Diagnostic {
    lambda_http::lambda_runtime::Diagnostic {
        error_type: error_type.to_owned(),
        error_message: error_chain(err),
    }
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
    fn the_chain_names_every_cause() {
        assert_eq!(
            error_chain(&Outer(Inner)),
            "reserve failed transiently: throttled"
        );
    }
}
