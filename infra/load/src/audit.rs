//! The invariants a run must leave true, checked from what the buyers saw and what the
//! server's stats say. Any failed check makes the tool exit non-zero.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// One audited invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, passed: bool, detail: String) -> Self {
        Self {
            name,
            passed,
            detail,
        }
    }
}

/// What the audit looks at.
#[derive(Debug, Clone)]
pub struct AuditInput<'a> {
    pub stock: u32,
    pub per_user_limit: u32,
    /// Attempts made by each buyer (the demand).
    pub attempts_by_buyer: BTreeMap<String, usize>,
    /// Orders each buyer was answered 202 for.
    pub reserved: &'a BTreeMap<String, Vec<String>>,
    /// Attempts whose last answer settled nothing: still 429/503 after every retry,
    /// a lost connection, or an unexpected error.
    pub unresolved: usize,
    pub stats_after_surge: &'a Value,
    /// After the payment deadline passed and every lapsed unit came back.
    pub after_expiry: Option<AfterExpiry<'a>>,
}

#[derive(Debug, Clone)]
pub struct AfterExpiry<'a> {
    pub stats: &'a Value,
    /// Orders the run paid (answered 200 paid).
    pub paid: usize,
}

fn count(stats: &Value, field: &str) -> Option<u64> {
    stats.get(field).and_then(Value::as_u64)
}

/// Runs every check.
pub fn audit(input: &AuditInput<'_>) -> Vec<Check> {
    let stock = u64::from(input.stock);
    let reserved: u64 = input
        .reserved
        .values()
        .map(|orders| orders.len() as u64)
        .sum();
    let demand: u64 = input
        .attempts_by_buyer
        .values()
        .map(|attempts| (*attempts as u64).min(u64::from(input.per_user_limit)))
        .sum();
    let expected = demand.min(stock);
    let mut checks = vec![Check::new(
        "orders_within_stock",
        reserved <= stock,
        format!("{reserved} reserved of {stock}"),
    )];

    let sold = if reserved == expected {
        Check::new(
            "stock_sold_to_demand",
            true,
            format!("{reserved} reserved = min(stock {stock}, demand {demand})"),
        )
    } else if input.unresolved > 0 {
        Check::new(
            "stock_sold_to_demand",
            false,
            format!(
                "{reserved} reserved, expected {expected}; inconclusive: {} attempts ended unanswered",
                input.unresolved
            ),
        )
    } else {
        Check::new(
            "stock_sold_to_demand",
            false,
            format!(
                "{reserved} reserved, expected min(stock {stock}, demand {demand}) = {expected}"
            ),
        )
    };
    checks.push(sold);

    let over: Vec<String> = input
        .reserved
        .iter()
        .filter(|(_, orders)| orders.len() > input.per_user_limit as usize)
        .map(|(buyer, orders)| format!("{buyer} holds {}", orders.len()))
        .collect();
    checks.push(Check::new(
        "per_user_limit",
        over.is_empty(),
        if over.is_empty() {
            format!(
                "nobody holds more than {} (of {} buyers with orders)",
                input.per_user_limit,
                input.reserved.len()
            )
        } else {
            over.join(", ")
        },
    ));

    let stats = input.stats_after_surge;
    checks.push(consistent("stats_consistent", stats));
    let out = count(stats, "stock_total")
        .zip(count(stats, "available"))
        .map(|(total, available)| total.saturating_sub(available));
    checks.push(Check::new(
        "server_agrees_on_orders",
        out == Some(reserved),
        match out {
            Some(out) => format!("server: {out} units out of stock; buyers saw {reserved} orders"),
            None => format!("stats lack stock_total/available: {stats}"),
        },
    ));

    if let Some(after) = &input.after_expiry {
        checks.push(consistent("stats_consistent_after_expiry", after.stats));
        let paid = after.paid as u64;
        let available = count(after.stats, "available");
        let server_paid = count(after.stats, "paid");
        let expected_available = stock.saturating_sub(paid);
        checks.push(Check::new(
            "after_expiry_available_is_stock_minus_paid",
            available == Some(expected_available) && server_paid == Some(paid),
            format!(
                "available {} (expected {stock} - {paid} = {expected_available}), server paid {}",
                available.map_or("?".to_owned(), |n| n.to_string()),
                server_paid.map_or("?".to_owned(), |n| n.to_string()),
            ),
        ));
    }
    checks
}

fn consistent(name: &'static str, stats: &Value) -> Check {
    let is = stats.get("consistent").and_then(Value::as_bool) == Some(true);
    Check::new(name, is, format!("stats: {stats}"))
}

/// The audit as a table for the terminal.
pub fn table(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = format!("{:<width$}  result  detail\n", "invariant");
    for check in checks {
        let verdict = if check.passed { "PASS" } else { "FAIL" };
        out.push_str(&format!(
            "{:<width$}  {verdict:<6}  {}\n",
            check.name, check.detail
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn orders(per_buyer: &[usize]) -> BTreeMap<String, Vec<String>> {
        per_buyer
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(b, n)| {
                (
                    format!("b{b}"),
                    (0..*n).map(|o| format!("o{b}.{o}")).collect(),
                )
            })
            .collect()
    }

    fn attempts(buyers: usize, each: usize) -> BTreeMap<String, usize> {
        (0..buyers).map(|b| (format!("b{b}"), each)).collect()
    }

    fn stats(total: u64, available: u64, consistent: bool) -> Value {
        json!({"stock_total": total, "available": available, "consistent": consistent, "paid": 0})
    }

    fn failed(checks: &[Check]) -> Vec<&'static str> {
        checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn a_sold_out_sale_with_one_order_a_buyer_passes() {
        let reserved = orders(&[1, 1, 1, 0, 0]);
        let stats = stats(3, 0, true);
        let checks = audit(&AuditInput {
            stock: 3,
            per_user_limit: 1,
            attempts_by_buyer: attempts(5, 2),
            reserved: &reserved,
            unresolved: 0,
            stats_after_surge: &stats,
            after_expiry: None,
        });
        assert!(failed(&checks).is_empty(), "{}", table(&checks));
        assert_eq!(checks.len(), 5);
    }

    #[test]
    fn oversold_doubled_and_inconsistent_are_all_named() {
        let reserved = orders(&[2, 1, 1]);
        let stats = stats(3, 0, false);
        let checks = audit(&AuditInput {
            stock: 3,
            per_user_limit: 1,
            attempts_by_buyer: attempts(3, 2),
            reserved: &reserved,
            unresolved: 0,
            stats_after_surge: &stats,
            after_expiry: None,
        });
        assert_eq!(
            failed(&checks),
            vec![
                "orders_within_stock",
                "stock_sold_to_demand",
                "per_user_limit",
                "stats_consistent",
                "server_agrees_on_orders"
            ],
            "{}",
            table(&checks)
        );
    }

    #[test]
    fn undersold_is_a_failure_and_unanswered_attempts_make_it_inconclusive() {
        // 4 buyers want 1 each of 3 units; only 2 were sold.
        let reserved = orders(&[1, 1, 0, 0]);
        let short_stats = stats(3, 1, true);
        let mut input = AuditInput {
            stock: 3,
            per_user_limit: 1,
            attempts_by_buyer: attempts(4, 1),
            reserved: &reserved,
            unresolved: 0,
            stats_after_surge: &short_stats,
            after_expiry: None,
        };
        let checks = audit(&input);
        assert_eq!(failed(&checks), vec!["stock_sold_to_demand"]);
        input.unresolved = 2;
        let checks = audit(&input);
        assert!(checks[1].detail.contains("inconclusive"), "{:?}", checks[1]);
        // Fewer buyers than units: each gets one, and the rest stays on sale.
        let reserved = orders(&[1, 1]);
        let left_stats = stats(5, 3, true);
        let checks = audit(&AuditInput {
            stock: 5,
            per_user_limit: 1,
            attempts_by_buyer: attempts(2, 3),
            reserved: &reserved,
            unresolved: 0,
            stats_after_surge: &left_stats,
            after_expiry: None,
        });
        assert!(failed(&checks).is_empty(), "{}", table(&checks));
    }

    #[test]
    fn after_expiry_the_unpaid_units_are_back() {
        let reserved = orders(&[1, 1, 1]);
        let surge_stats = stats(3, 0, true);
        let back = json!({"stock_total": 3, "available": 2, "paid": 1, "consistent": true});
        let mut input = AuditInput {
            stock: 3,
            per_user_limit: 1,
            attempts_by_buyer: attempts(3, 1),
            reserved: &reserved,
            unresolved: 0,
            stats_after_surge: &surge_stats,
            after_expiry: Some(AfterExpiry {
                stats: &back,
                paid: 1,
            }),
        };
        assert!(failed(&audit(&input)).is_empty());
        let stuck = json!({"stock_total": 3, "available": 1, "paid": 1, "consistent": true});
        input.after_expiry = Some(AfterExpiry {
            stats: &stuck,
            paid: 1,
        });
        assert_eq!(
            failed(&audit(&input)),
            vec!["after_expiry_available_is_stock_minus_paid"]
        );
    }

    #[test]
    fn the_table_marks_each_check() {
        let checks = vec![
            Check::new("a", true, "fine".into()),
            Check::new("longer_name", false, "broken".into()),
        ];
        let text = table(&checks);
        assert!(text.contains("a            PASS    fine"), "{text}");
        assert!(text.contains("longer_name  FAIL    broken"), "{text}");
    }
}
