//! EventBridge rules from `Schedule` events: every `rate(...)` period, the function is
//! invoked asynchronously with the Scheduled Event EventBridge sends (or the rule's
//! `Input`). As on AWS, the first event comes one period after the rule exists.

use chrono::{SecondsFormat, Utc};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::lambda::{LambdaService, error_chain};
use crate::model::RuleSpec;

/// The event a scheduled rule delivers.
pub fn scheduled_event(rule: &RuleSpec, region: &str, account_id: &str) -> Value {
    if let Some(input) = &rule.input {
        return input.clone();
    }
    json!({
        "version": "0",
        "id": ulid::Ulid::new().to_string().to_lowercase(),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account_id,
        "time": Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true),
        "region": region,
        "resources": [rule.rule_arn],
        "detail": {},
    })
}

/// Fires `rule` at `function` until `shutdown` turns true.
pub async fn run(
    lambda: LambdaService,
    function: String,
    rule: RuleSpec,
    mut shutdown: watch::Receiver<bool>,
) {
    let region = lambda.model().region.clone();
    let account = lambda.model().account_id.clone();
    let start = tokio::time::Instant::now() + rule.period;
    let mut ticks = tokio::time::interval_at(start, rule.period);
    // A late tick is not made up for with a burst: EventBridge fires on the period.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tracing::info!(function, rule = %rule.rule_name, expression = %rule.expression, "rule started");
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
        let event = scheduled_event(&rule, &region, &account);
        if let Err(e) = lambda.invoke_async(&function, event) {
            tracing::error!(function, rule = %rule.rule_name, error = %error_chain(&e), "rule target could not be invoked");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rule(input: Option<Value>) -> RuleSpec {
        RuleSpec {
            logical_id: "FTick".to_owned(),
            rule_name: "st-FTick".to_owned(),
            rule_arn: "arn:aws:events:us-east-1:123456789012:rule/st-FTick".to_owned(),
            expression: "rate(1 minute)".to_owned(),
            period: Duration::from_secs(60),
            input,
            enabled: true,
        }
    }

    #[test]
    fn a_rule_without_input_sends_a_scheduled_event() {
        let event = scheduled_event(&rule(None), "us-east-1", "123456789012");
        assert_eq!(event["detail-type"], "Scheduled Event");
        assert_eq!(event["source"], "aws.events");
        assert_eq!(
            event["resources"][0],
            "arn:aws:events:us-east-1:123456789012:rule/st-FTick"
        );
        assert_eq!(event["detail"], json!({}));
    }

    #[test]
    fn a_rule_with_input_sends_the_input() {
        let input = json!({"pass": "full"});
        assert_eq!(scheduled_event(&rule(Some(input.clone())), "r", "a"), input);
    }
}
