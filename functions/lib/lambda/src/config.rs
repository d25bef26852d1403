//! Typed configuration from environment variables, shared by every function.
//!
//! Functions read their variables through a lookup function rather than the process
//! environment directly, so tests can pass a map and never race on `std::env`.

use std::error::Error as StdError;
use std::str::FromStr;

use flashsale_adapters::breaker::BreakerPolicy;
use flashsale_domain::error::BoxError;

/// The variables of the circuit breakers' policy, read by [`Env::breaker_policy`];
/// each defaults to [`BreakerPolicy::DEFAULT`]'s.
pub const BREAKER_ENV_VARS: [&str; 3] = [
    "BREAKER_FAILURES",
    "BREAKER_WINDOW_MS",
    "BREAKER_COOL_OFF_MS",
];

/// A breaker setting that cannot work: no failure count or no time at all.
#[derive(Debug, thiserror::Error)]
#[error("must be at least 1")]
pub struct NotPositive;

/// Why a function's configuration could not be built. Functions fail at start-up on
/// this, before serving anything, so a misconfigured deployment never half-works.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The variable is unset or empty.
    #[error("environment variable {0} is required but not set")]
    Missing(&'static str),
    /// The variable is set, but its value is unusable; `source` says why.
    #[error("environment variable {var} is invalid")]
    Invalid {
        var: &'static str,
        #[source]
        source: BoxError,
    },
}

impl ConfigError {
    pub fn invalid(var: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Invalid {
            var,
            source: source.into(),
        }
    }
}

/// The process environment as a lookup function. A value that is not valid Unicode is
/// passed on lossily, so it fails validation with a message instead of reading as unset.
pub fn process_env(var: &str) -> Option<String> {
    std::env::var_os(var).map(|value| value.to_string_lossy().into_owned())
}

/// Variables read through a lookup. Empty values count as unset, because templates
/// often render an absent parameter as `""`.
pub struct Env<F> {
    lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    pub fn new(lookup: F) -> Self {
        Self { lookup }
    }

    /// The value, if set and not empty.
    pub fn optional(&self, var: &'static str) -> Option<String> {
        (self.lookup)(var).filter(|value| !value.trim().is_empty())
    }

    /// The value, or [`ConfigError::Missing`].
    pub fn required(&self, var: &'static str) -> Result<String, ConfigError> {
        self.optional(var).ok_or(ConfigError::Missing(var))
    }

    /// The value parsed as `T`, or `default` when unset.
    pub fn parsed_or<T>(&self, var: &'static str, default: T) -> Result<T, ConfigError>
    where
        T: FromStr,
        T::Err: StdError + Send + Sync + 'static,
    {
        match self.optional(var) {
            None => Ok(default),
            Some(raw) => raw
                .trim()
                .parse()
                .map_err(|source| ConfigError::invalid(var, source)),
        }
    }
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// The circuit breakers' policy from [`BREAKER_ENV_VARS`].
    pub fn breaker_policy(&self) -> Result<BreakerPolicy, ConfigError> {
        let [failures_var, window_var, cool_off_var] = BREAKER_ENV_VARS;
        let default = BreakerPolicy::DEFAULT;
        let positive = |var: &'static str, default: u64| -> Result<u64, ConfigError> {
            match self.parsed_or(var, default)? {
                0 => Err(ConfigError::invalid(var, NotPositive)),
                value => Ok(value),
            }
        };
        let millis =
            |duration: std::time::Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let failures = positive(failures_var, u64::from(default.failures))?;
        Ok(BreakerPolicy {
            failures: u32::try_from(failures).unwrap_or(u32::MAX),
            window: std::time::Duration::from_millis(positive(window_var, millis(default.window))?),
            cool_off: std::time::Duration::from_millis(positive(
                cool_off_var,
                millis(default.cool_off),
            )?),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env<impl Fn(&str) -> Option<String>> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Env::new(move |var: &str| map.get(var).cloned())
    }

    #[test]
    fn an_empty_value_counts_as_missing() {
        let env = env(&[("TABLE_NAME", "  ")]);
        assert!(matches!(
            env.required("TABLE_NAME"),
            Err(ConfigError::Missing("TABLE_NAME"))
        ));
    }

    #[test]
    fn an_unparsable_value_is_invalid_and_keeps_the_parse_error() {
        let env = env(&[("SOLD_OUT_RECHECK_MS", "soon")]);
        let err = env.parsed_or("SOLD_OUT_RECHECK_MS", 1000_u64).unwrap_err();
        let ConfigError::Invalid { var, source } = &err else {
            panic!("expected Invalid, got {err:?}");
        };
        assert_eq!(*var, "SOLD_OUT_RECHECK_MS");
        assert!(source.is::<std::num::ParseIntError>());
    }

    #[test]
    fn an_unset_optional_value_takes_the_default() {
        assert_eq!(
            env(&[]).parsed_or("SOLD_OUT_RECHECK_MS", 1000_u64).unwrap(),
            1000
        );
        assert_eq!(
            env(&[("SOLD_OUT_RECHECK_MS", " 250 ")])
                .parsed_or("SOLD_OUT_RECHECK_MS", 1000_u64)
                .unwrap(),
            250
        );
    }

    #[test]
    fn the_breaker_policy_defaults_reads_its_variables_and_refuses_zero() {
        assert_eq!(env(&[]).breaker_policy().unwrap(), BreakerPolicy::DEFAULT);
        let set = env(&[
            ("BREAKER_FAILURES", "3"),
            ("BREAKER_WINDOW_MS", "5000"),
            ("BREAKER_COOL_OFF_MS", "1500"),
        ])
        .breaker_policy()
        .unwrap();
        assert_eq!(
            set,
            BreakerPolicy {
                failures: 3,
                window: std::time::Duration::from_secs(5),
                cool_off: std::time::Duration::from_millis(1500),
            }
        );
        assert!(matches!(
            env(&[("BREAKER_COOL_OFF_MS", "0")]).breaker_policy(),
            Err(ConfigError::Invalid {
                var: "BREAKER_COOL_OFF_MS",
                ..
            })
        ));
    }
}
