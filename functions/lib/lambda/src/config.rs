//! Typed configuration from environment variables, shared by every function.
//!
//! Functions read their variables through a lookup function rather than the process
//! environment directly, so tests can pass a map and never race on `std::env`.

use std::cell::RefCell;
use std::error::Error as StdError;
use std::str::FromStr;

use flashsale_adapters::breaker::BreakerPolicy;
use flashsale_domain::error::BoxError;
use flashsale_domain::service::DEFAULT_SALE_REFRESH;

/// How long a process trusts its copy of a sale, in milliseconds: [`Env::sale_refresh`].
pub const SALE_REFRESH_VAR: &str = "SALE_REFRESH_MS";

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

/// A function's configuration, read from its environment variables through [`Env`].
///
/// The names of the variables are written once, in [`FromEnv::read`]: every read there
/// is unconditional, so one pass with nothing set asks for every variable, and
/// [`FromEnv::env_vars`] lists them from that pass (the template checks compare the
/// list with what the template sets).
pub trait FromEnv: Sized {
    /// The configuration from `env`'s reads. A read that fails answers a stand-in and
    /// `env` keeps the failure, which [`FromEnv::from_lookup`] returns instead of the
    /// value: a stand-in never leaves this function.
    fn read(env: &Env<'_>) -> Self;

    /// The configuration from `lookup`, or the first variable, in read order, that is
    /// missing or invalid.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env::new(&lookup);
        let value = Self::read(&env);
        env.finish(value)
    }

    /// The configuration from the process environment.
    fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(process_env)
    }

    /// Every environment variable [`FromEnv::read`] asks for, in the order it asks
    /// (besides `RUST_LOG`, which the log setup reads).
    fn env_vars() -> Vec<&'static str> {
        let env = Env::new(&|_: &str| None);
        let _stand_in = Self::read(&env);
        env.asked.into_inner()
    }
}

/// Variables read through a lookup. Empty values count as unset, because templates
/// often render an absent parameter as `""`. Each read records the variable's name and,
/// when it fails, the first failure; reads go on after one, so every name is recorded.
pub struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    asked: RefCell<Vec<&'static str>>,
    failure: RefCell<Option<ConfigError>>,
}

impl<'a> Env<'a> {
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            lookup,
            asked: RefCell::new(Vec::new()),
            failure: RefCell::new(None),
        }
    }

    /// `value`, unless a read failed: then the first failure.
    pub fn finish<T>(self, value: T) -> Result<T, ConfigError> {
        match self.failure.into_inner() {
            Some(failure) => Err(failure),
            None => Ok(value),
        }
    }

    fn fail(&self, failure: ConfigError) {
        self.failure.borrow_mut().get_or_insert(failure);
    }

    /// The value, if set and not empty.
    pub fn optional(&self, var: &'static str) -> Option<String> {
        let mut asked = self.asked.borrow_mut();
        if !asked.contains(&var) {
            asked.push(var);
        }
        (self.lookup)(var).filter(|value| !value.trim().is_empty())
    }

    /// The value; when it is missing, [`ConfigError::Missing`] is kept and an empty
    /// stand-in answered.
    pub fn required(&self, var: &'static str) -> String {
        self.optional(var).unwrap_or_else(|| {
            self.fail(ConfigError::Missing(var));
            String::new()
        })
    }

    /// The value parsed as `T`, or `default` when unset. When it does not parse,
    /// [`ConfigError::Invalid`] is kept and `default` answered.
    pub fn parsed_or<T>(&self, var: &'static str, default: T) -> T
    where
        T: FromStr,
        T::Err: StdError + Send + Sync + 'static,
    {
        match self.optional(var).map(|raw| raw.trim().parse()) {
            None => default,
            Some(Ok(value)) => value,
            Some(Err(source)) => {
                self.fail(ConfigError::invalid(var, source));
                default
            }
        }
    }

    /// How long a process answers a sale from memory before it rereads it for its
    /// control (`SALE_REFRESH_MS`): what bounds how long an operator's pause takes to
    /// reach it. A zero is invalid.
    pub fn sale_refresh(&self) -> std::time::Duration {
        let default = DEFAULT_SALE_REFRESH.as_millis();
        let default = u64::try_from(default).unwrap_or(u64::MAX);
        match self.parsed_or(SALE_REFRESH_VAR, default) {
            0 => {
                self.fail(ConfigError::invalid(SALE_REFRESH_VAR, NotPositive));
                DEFAULT_SALE_REFRESH
            }
            millis => std::time::Duration::from_millis(millis),
        }
    }

    /// The circuit breakers' policy from [`BREAKER_ENV_VARS`]; a zero is invalid.
    pub fn breaker_policy(&self) -> BreakerPolicy {
        let [failures_var, window_var, cool_off_var] = BREAKER_ENV_VARS;
        let default = BreakerPolicy::DEFAULT;
        let positive = |var: &'static str, default: u64| -> u64 {
            match self.parsed_or(var, default) {
                0 => {
                    self.fail(ConfigError::invalid(var, NotPositive));
                    default
                }
                value => value,
            }
        };
        let millis =
            |duration: std::time::Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let failures = positive(failures_var, u64::from(default.failures));
        BreakerPolicy {
            failures: u32::try_from(failures).unwrap_or(u32::MAX),
            window: std::time::Duration::from_millis(positive(window_var, millis(default.window))),
            cool_off: std::time::Duration::from_millis(positive(
                cool_off_var,
                millis(default.cool_off),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |var: &str| map.get(var).cloned()
    }

    /// A configuration of every kind of read, as a function's would be.
    #[derive(Debug, PartialEq)]
    struct Sample {
        table: String,
        recheck_ms: u64,
        note: Option<String>,
        breaker: BreakerPolicy,
    }

    impl FromEnv for Sample {
        fn read(env: &Env<'_>) -> Self {
            Self {
                table: env.required("TABLE_NAME"),
                recheck_ms: env.parsed_or("SOLD_OUT_RECHECK_MS", 1000),
                note: env.optional("NOTE"),
                breaker: env.breaker_policy(),
            }
        }
    }

    #[test]
    fn env_vars_names_every_read_once_in_read_order() {
        assert_eq!(
            Sample::env_vars(),
            [
                "TABLE_NAME",
                "SOLD_OUT_RECHECK_MS",
                "NOTE",
                "BREAKER_FAILURES",
                "BREAKER_WINDOW_MS",
                "BREAKER_COOL_OFF_MS",
            ]
        );
    }

    #[test]
    fn the_reads_go_on_after_a_failure_and_the_first_one_is_answered() {
        let asked = RefCell::new(Vec::new());
        let result = Sample::from_lookup(|var| {
            asked.borrow_mut().push(var.to_owned());
            (var == "SOLD_OUT_RECHECK_MS").then(|| "soon".to_owned())
        });
        assert!(
            matches!(result, Err(ConfigError::Missing("TABLE_NAME"))),
            "{result:?}"
        );
        assert_eq!(asked.into_inner().len(), 6, "every variable was still read");
    }

    #[test]
    fn an_empty_value_counts_as_missing() {
        let result = Sample::from_lookup(lookup(&[("TABLE_NAME", "  ")]));
        assert!(
            matches!(result, Err(ConfigError::Missing("TABLE_NAME"))),
            "{result:?}"
        );
    }

    #[test]
    fn an_unparsable_value_is_invalid_and_keeps_the_parse_error() {
        let err = Sample::from_lookup(lookup(&[
            ("TABLE_NAME", "t"),
            ("SOLD_OUT_RECHECK_MS", "soon"),
        ]))
        .unwrap_err();
        let ConfigError::Invalid { var, source } = &err else {
            panic!("expected Invalid, got {err:?}");
        };
        assert_eq!(*var, "SOLD_OUT_RECHECK_MS");
        assert!(source.is::<std::num::ParseIntError>());
    }

    #[test]
    fn unset_optional_values_take_their_defaults() {
        let defaults = Sample::from_lookup(lookup(&[("TABLE_NAME", "t")])).unwrap();
        assert_eq!(
            defaults,
            Sample {
                table: "t".to_owned(),
                recheck_ms: 1000,
                note: None,
                breaker: BreakerPolicy::DEFAULT,
            }
        );
        let set = Sample::from_lookup(lookup(&[
            ("TABLE_NAME", "t"),
            ("SOLD_OUT_RECHECK_MS", " 250 "),
            ("NOTE", "n"),
        ]))
        .unwrap();
        assert_eq!((set.recheck_ms, set.note.as_deref()), (250, Some("n")));
    }

    #[test]
    fn the_breaker_policy_reads_its_variables_and_refuses_zero() {
        let set = Sample::from_lookup(lookup(&[
            ("TABLE_NAME", "t"),
            ("BREAKER_FAILURES", "3"),
            ("BREAKER_WINDOW_MS", "5000"),
            ("BREAKER_COOL_OFF_MS", "1500"),
        ]))
        .unwrap();
        assert_eq!(
            set.breaker,
            BreakerPolicy {
                failures: 3,
                window: std::time::Duration::from_secs(5),
                cool_off: std::time::Duration::from_millis(1500),
            }
        );
        assert!(matches!(
            Sample::from_lookup(lookup(&[("TABLE_NAME", "t"), ("BREAKER_COOL_OFF_MS", "0")])),
            Err(ConfigError::Invalid {
                var: "BREAKER_COOL_OFF_MS",
                ..
            })
        ));
    }
}
