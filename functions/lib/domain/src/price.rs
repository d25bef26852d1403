//! A sale's price: an amount in the smallest unit of its currency (cents for EUR, yen
//! for JPY), and the currency, by its ISO 4217 code.
//!
//! An integer of the minor unit, never a float: that is what a payment provider takes
//! (Stripe's `amount`), and what adds up exactly. The currency's exponent (how many
//! decimals its minor unit is: 2 for EUR, 0 for JPY, 3 for BHD) is ISO 4217's, and the
//! API says it beside the amount (`decimals`), so that a page shows 129900 EUR as
//! €1,299.00 and 1299 JPY as ¥1,299 without a table of its own.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ValidationError;

/// The largest amount, in minor units: eight digits, Stripe's own limit for a charge
/// ($999,999.99, ¥99,999,999), and far above any unit a flash sale sells.
pub const MAX_PRICE_AMOUNT: u64 = 99_999_999;

/// A currency a price may be in: one of ISO 4217's, current, and money a buyer pays in.
/// Funds (`CLF`, `USN`), the special codes (gold, `XDR`, the test code `XTS`, "no
/// currency" `XXX`) and superseded currencies (`HRK`, now EUR) are refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency(iso_currency::Currency);

impl Currency {
    /// The currency of an upper-case ISO 4217 code such as `EUR`, refused with a reason
    /// under `field`.
    pub fn parse(field: &'static str, code: &str) -> Result<Self, ValidationError> {
        let Some(currency) = iso_currency::Currency::from_code(code) else {
            let hint = if iso_currency::Currency::from_code(&code.to_ascii_uppercase()).is_some() {
                " (in upper case)"
            } else {
                ""
            };
            return Err(ValidationError::new(
                field,
                format!("must be an ISO 4217 currency code such as EUR or JPY{hint}"),
            ));
        };
        if let Some(successor) = currency.is_superseded() {
            return Err(ValidationError::new(
                field,
                format!("{code} is superseded by {}", successor.code()),
            ));
        }
        if currency.is_fund() || currency.is_special() || currency.exponent().is_none() {
            return Err(ValidationError::new(
                field,
                format!("{code} is a fund or special ISO 4217 code, not money a buyer pays in"),
            ));
        }
        Ok(Self(currency))
    }

    /// The ISO 4217 code, upper case: `EUR`.
    pub fn code(self) -> &'static str {
        self.0.code()
    }

    /// The code as Stripe takes it: lower case, `eur`.
    pub fn stripe_code(self) -> String {
        self.code().to_ascii_lowercase()
    }

    /// Decimals of the minor unit (ISO 4217's exponent): 2 for EUR, 0 for JPY, 3 for
    /// BHD. Every currency [`Currency::parse`] accepts has one.
    pub fn decimals(self) -> u8 {
        self.0
            .exponent()
            .and_then(|exponent| u8::try_from(exponent).ok())
            .unwrap_or(0)
    }
}

impl fmt::Debug for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// What something costs: `amount` minor units of `currency`, at least one, at most
/// [`MAX_PRICE_AMOUNT`]. In JSON `{"amount": 129900, "currency": "EUR", "decimals": 2}`;
/// `decimals` is written for readers and ignored when read (the currency decides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Price {
    amount: u64,
    currency: Currency,
}

impl Price {
    /// A price of `amount` minor units of the currency coded `currency`. Errors name
    /// `price.amount` or `price.currency`, as the sale's JSON does.
    pub fn new(amount: i64, currency: &str) -> Result<Self, ValidationError> {
        let amount = u64::try_from(amount)
            .ok()
            .filter(|amount| (1..=MAX_PRICE_AMOUNT).contains(amount))
            .ok_or_else(|| {
                ValidationError::new(
                    "price.amount",
                    format!(
                        "must be between 1 and {MAX_PRICE_AMOUNT}, in the currency's minor unit (cents for EUR)"
                    ),
                )
            })?;
        let currency = Currency::parse("price.currency", currency)?;
        Ok(Self { amount, currency })
    }

    /// The amount in minor units, as Stripe's `amount` takes it.
    pub fn amount(self) -> u64 {
        self.amount
    }

    pub fn currency(self) -> Currency {
        self.currency
    }

    /// The amount in the currency's major unit, with its own decimals and a dot, as a
    /// spreadsheet reads a number: `1299.00` EUR, `1299` JPY, `1.250` BHD.
    pub fn major_units(self) -> String {
        let decimals = self.currency.decimals();
        let scale = 10_u64.pow(u32::from(decimals));
        let (whole, fraction) = (self.amount / scale, self.amount % scale);
        if decimals == 0 {
            whole.to_string()
        } else {
            format!("{whole}.{fraction:0width$}", width = usize::from(decimals))
        }
    }
}

/// A price's JSON, written and read.
#[derive(Serialize, Deserialize)]
struct PriceJson {
    amount: i64,
    currency: String,
    #[serde(default, skip_deserializing)]
    decimals: u8,
}

impl Serialize for Price {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        PriceJson {
            amount: i64::try_from(self.amount).unwrap_or(i64::MAX),
            currency: self.currency.code().to_owned(),
            decimals: self.currency.decimals(),
        }
        .serialize(out)
    }
}

/// Validated as a draft's price is: a message or a stored item cannot carry a price
/// the API would have refused.
impl<'de> Deserialize<'de> for Price {
    fn deserialize<D: Deserializer<'de>>(input: D) -> Result<Self, D::Error> {
        let json = PriceJson::deserialize(input)?;
        Self::new(json.amount, &json.currency).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn major_units_have_the_currencys_own_decimals() {
        let price = |amount, currency| Price::new(amount, currency).unwrap().major_units();
        assert_eq!(price(129_900, "EUR"), "1299.00");
        assert_eq!(price(5, "EUR"), "0.05");
        assert_eq!(price(1_299, "JPY"), "1299");
        assert_eq!(price(1_250, "BHD"), "1.250");
    }

    #[test]
    fn a_currency_is_a_current_iso_4217_code_of_money() {
        assert_eq!(Currency::parse("c", "EUR").unwrap().code(), "EUR");
        assert_eq!(Currency::parse("c", "EUR").unwrap().stripe_code(), "eur");
        for (code, expected) in [
            ("eur", "(in upper case)"),
            ("EURO", "ISO 4217"),
            ("ABC", "ISO 4217"),
            ("", "ISO 4217"),
            ("HRK", "superseded by EUR"),
            ("XAU", "not money"),
            ("XTS", "not money"),
            ("XXX", "not money"),
            ("CLF", "not money"),
            ("USN", "not money"),
        ] {
            let error = Currency::parse("price.currency", code).unwrap_err();
            assert_eq!(error.field, "price.currency");
            assert!(error.problem.contains(expected), "{code}: {error}");
        }
    }

    /// Every code of three capital letters the API accepts, found by asking.
    fn accepted_codes() -> Vec<String> {
        let letters = || b'A'..=b'Z';
        letters()
            .flat_map(|a| letters().flat_map(move |b| letters().map(move |c| [a, b, c])))
            .map(|code| String::from_utf8(code.to_vec()).unwrap())
            .filter(|code| Currency::parse("c", code).is_ok())
            .collect()
    }

    #[test]
    fn the_contract_lists_exactly_the_currencies_accepted() {
        const CONTRACT: &str = include_str!("../../../../openapi.yaml");
        let schema = CONTRACT
            .split_once("\n    Currency:\n")
            .expect("openapi.yaml has a Currency schema")
            .1;
        let listed = schema
            .lines()
            .find_map(|line| line.trim().strip_prefix("enum: ["))
            .and_then(|rest| rest.strip_suffix(']'))
            .expect("the Currency schema's enum, on one line");
        let listed: Vec<String> = listed.split(", ").map(str::to_owned).collect();
        let accepted = accepted_codes();
        assert!(accepted.len() > 150, "{accepted:?}");
        assert_eq!(listed, accepted);
    }

    #[test]
    fn the_minor_unit_is_iso_4217s() {
        for (code, decimals) in [("EUR", 2), ("USD", 2), ("JPY", 0), ("KRW", 0), ("BHD", 3)] {
            assert_eq!(Currency::parse("c", code).unwrap().decimals(), decimals);
        }
    }

    #[test]
    fn an_amount_is_positive_and_at_most_eight_digits() {
        assert_eq!(Price::new(1, "EUR").unwrap().amount(), 1);
        assert_eq!(
            Price::new(99_999_999, "JPY").unwrap().amount(),
            MAX_PRICE_AMOUNT
        );
        for wrong in [0, -1, 100_000_000, i64::MAX, i64::MIN] {
            let error = Price::new(wrong, "EUR").unwrap_err();
            assert_eq!(error.field, "price.amount", "{wrong}");
        }
    }

    #[test]
    fn a_price_is_written_with_its_decimals_and_read_back_validated() {
        let price = Price::new(129_900, "EUR").unwrap();
        let written = serde_json::to_value(price).unwrap();
        assert_eq!(
            written,
            json!({"amount": 129_900, "currency": "EUR", "decimals": 2})
        );
        assert_eq!(serde_json::from_value::<Price>(written).unwrap(), price);
        // Without decimals too: the currency decides them.
        let read: Price =
            serde_json::from_value(json!({"amount": 500, "currency": "JPY"})).unwrap();
        assert_eq!(read.currency().decimals(), 0);
        for wrong in [
            json!({"amount": 0, "currency": "EUR"}),
            json!({"amount": 5, "currency": "XAU"}),
        ] {
            assert!(
                serde_json::from_value::<Price>(wrong.clone()).is_err(),
                "{wrong}"
            );
        }
    }
}
