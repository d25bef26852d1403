//! What the api's handler tests share.

use std::collections::HashMap;

use chrono::{DateTime, TimeZone, Utc};
use flashsale_api::Config;
use flashsale_lambda::FromEnv as _;

/// When the tests' sales start.
pub fn starts_at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// The api's configuration as the template sets it, its table and group made up (the
/// ports are fakes), and Stripe nowhere (the provider is a fake too).
pub fn config() -> Config {
    let vars: HashMap<&str, &str> = [
        ("TABLE_NAME", "flashsale-test"),
        ("SCHEDULE_GROUP_NAME", "flashsale-test-releases"),
        ("STRIPE_API_BASE", "http://127.0.0.1:9"),
    ]
    .into_iter()
    .collect();
    Config::from_lookup(|var| vars.get(var).map(|v| (*v).to_owned())).unwrap()
}
