//! A sale's price: an amount in the smallest unit of its currency (cents for EUR, yen
//! for JPY), and the currency, by its ISO 4217 code.
//!
//! An integer of the minor unit, never a float: what adds up exactly. The currency's
//! exponent (how many decimals its minor unit is: 2 for EUR, 0 for JPY, 3 for BHD) is
//! ISO 4217's, and the API says it beside the amount (`decimals`), so that a page shows
//! 129900 EUR as €1,299.00 and 1299 JPY as ¥1,299 without a table of its own. Stripe's
//! `amount` is the same money in Stripe's unit ([`Price::stripe_amount`]), which differs
//! for a few currencies; a price Stripe cannot charge is refused ([`crate::currency`]).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::currency::Currency;
use crate::error::ValidationError;

/// The largest amount of any price, in ISO 4217's minor unit: Stripe's eight digits of
/// whole ariary are 9,999,999,900 of ISO's hundredths. Each currency's own bound is
/// [`Currency::largest_amount`].
pub const MAX_PRICE_AMOUNT: u64 = 9_999_999_900;

/// What something costs: `amount` minor units of `currency`, an amount Stripe charges in
/// that currency. In JSON `{"amount": 129900, "currency": "EUR", "decimals": 2}`;
/// `decimals` is written for readers and ignored when read (the currency decides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Price {
    amount: u64,
    currency: Currency,
    /// The same money as Stripe's `amount`.
    charged: u64,
}

impl Price {
    /// A price of `amount` minor units of the currency coded `currency`. Errors name
    /// `price.amount` or `price.currency`, as the sale's JSON does.
    pub fn new(amount: i64, currency: &str) -> Result<Self, ValidationError> {
        let currency = Currency::parse("price.currency", currency)?;
        let amount = u64::try_from(amount)
            .ok()
            .filter(|&amount| amount >= 1)
            .ok_or_else(|| {
                ValidationError::new(
                    "price.amount",
                    "must be positive, in the currency's minor unit (cents for EUR)",
                )
            })?;
        let charged = currency.to_stripe("price.amount", amount)?;
        Ok(Self {
            amount,
            currency,
            charged,
        })
    }

    /// The amount in ISO 4217's minor unit, as the API takes and shows it.
    pub fn amount(self) -> u64 {
        self.amount
    }

    /// The amount as Stripe's `amount` takes it, in Stripe's unit for the currency: the
    /// money [`Price::major_units`] shows (1,300 ISK is 130000; 1,299.00 MGA is 1299).
    pub fn stripe_amount(self) -> u64 {
        self.charged
    }

    pub fn currency(self) -> Currency {
        self.currency
    }

    /// The amount in the currency's major unit, with its own decimals and a dot, as a
    /// spreadsheet reads a number: `1299.00` EUR, `1299` JPY, `1.250` BHD.
    pub fn major_units(self) -> String {
        self.currency.major_units(self.amount)
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
        assert_eq!(Currency::parse("c", "EUR").unwrap().major_units(5), "0.05");
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
        assert_eq!(
            accepted.len(),
            crate::currency::STRIPE_CURRENCIES.len(),
            "{accepted:?}"
        );
        assert_eq!(listed, accepted);
    }

    #[test]
    fn the_minor_unit_is_iso_4217s() {
        for (code, decimals) in [
            ("EUR", 2),
            ("USD", 2),
            ("JPY", 0),
            ("KRW", 0),
            ("BHD", 3),
            ("ISK", 0),
            ("MGA", 2),
        ] {
            assert_eq!(Currency::parse("c", code).unwrap().decimals(), decimals);
        }
    }

    #[test]
    fn an_amount_is_positive_and_at_most_stripes_eight_digits() {
        assert_eq!(Price::new(50, "EUR").unwrap().amount(), 50);
        assert_eq!(Price::new(99_999_999, "JPY").unwrap().amount(), 99_999_999);
        for wrong in [0, -1, 100_000_000, i64::MAX, i64::MIN] {
            let error = Price::new(wrong, "EUR").unwrap_err();
            assert_eq!(error.field, "price.amount", "{wrong}");
        }
    }

    /// Issue 47: the price took ISO 4217's decimals and went to Stripe as it was, so a
    /// buyer shown 1,299.00 Ar was charged 129,900 Ar, and one shown 1,300 kr was
    /// charged 13 kr.
    #[test]
    fn stripe_is_sent_the_money_the_buyer_is_shown() {
        let sent = |amount, currency| {
            let price = Price::new(amount, currency).unwrap();
            (price.major_units(), price.stripe_amount())
        };
        assert_eq!(sent(129_900, "MGA"), ("1299.00".to_owned(), 1_299));
        assert_eq!(sent(1_300, "ISK"), ("1300".to_owned(), 130_000));
        assert_eq!(sent(1_299, "ISK"), ("1299".to_owned(), 129_900));
        assert_eq!(sent(129_900, "EUR"), ("1299.00".to_owned(), 129_900));
        assert_eq!(sent(1_299, "JPY"), ("1299".to_owned(), 1_299));
        assert_eq!(sent(5_120, "KWD"), ("5.120".to_owned(), 5_120));
        assert_eq!(sent(20_000, "HUF"), ("200.00".to_owned(), 20_000));
        assert_eq!(sent(5_000, "UGX"), ("5000".to_owned(), 5_000));
    }

    /// Issue 47: a sale was accepted at prices Stripe never takes, and its buyers were
    /// answered 503 at the payment.
    #[test]
    fn a_price_stripe_cannot_charge_is_refused_naming_what_is_wrong() {
        for (amount, currency, field, expected) in [
            (
                129_950,
                "MGA",
                "price.amount",
                "Stripe charges MGA in steps of 1.00",
            ),
            (5_125, "KWD", "price.amount", "multiple of 10"),
            (
                49,
                "USD",
                "price.amount",
                "at least 0.50 USD, Stripe's minimum",
            ),
            (29, "GBP", "price.amount", "at least 0.30 GBP"),
            (17_499, "HUF", "price.amount", "at least 175.00 HUF"),
            (49, "JPY", "price.amount", "at least 50 JPY"),
            (1_000_000, "ISK", "price.amount", "at most 999999 ISK"),
            (100_000_000, "USD", "price.amount", "at most 999999.99 USD"),
            (
                10_000_000_000,
                "MGA",
                "price.amount",
                "at most 99999999.00 MGA",
            ),
            (100_000_000, "JPY", "price.amount", "at most 99999999 JPY"),
            (
                100,
                "IRR",
                "price.currency",
                "a currency Stripe charges in, which",
            ),
            (
                100,
                "CUP",
                "price.currency",
                "a currency Stripe charges in, which",
            ),
        ] {
            let error = Price::new(amount, currency).unwrap_err();
            assert_eq!(error.field, field, "{amount} {currency}");
            assert!(
                error.problem.contains(expected),
                "{amount} {currency}: {error}"
            );
        }
        for (amount, currency) in [
            (50, "USD"),
            (30, "GBP"),
            (17_500, "HUF"),
            (50, "JPY"),
            (999_999, "ISK"),
            (9_999_999_900, "MGA"),
            (5_120, "KWD"),
            (1, "IDR"),
        ] {
            assert!(Price::new(amount, currency).is_ok(), "{amount} {currency}");
        }
    }

    #[test]
    fn the_largest_price_is_the_largest_stripe_charges_in_any_currency() {
        let largest = accepted_codes()
            .iter()
            .map(|code| Currency::parse("c", code).unwrap().largest_amount())
            .max();
        assert_eq!(largest, Some(MAX_PRICE_AMOUNT));
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
