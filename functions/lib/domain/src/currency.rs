//! The currencies a sale may be priced in: ISO 4217's current money that Stripe charges,
//! with Stripe's rules for each.
//!
//! A price's amount is in ISO 4217's minor unit (cents for EUR, none for JPY, fils for
//! BHD), which is what the API takes and what the page divides by to show it. Stripe's
//! `amount` is in its own "smallest currency unit", which differs from ISO's for a few
//! currencies, and Stripe charges only some amounts. [`STRIPE_CURRENCIES`] is Stripe's
//! table, and [`Currency::to_stripe`] turns an amount into Stripe's, or says why Stripe
//! cannot charge it, so that a sale it cannot charge is refused when it is created, not
//! at its buyers' payment.

use std::fmt;

use crate::error::ValidationError;

/// The largest `amount` Stripe takes for a charge, in its own unit: "The amount value
/// supports up to eight digits (e.g., a value of 99999999 for a USD charge of
/// $999,999.99)" (the PaymentIntent's `amount`).
pub const STRIPE_MAX_AMOUNT: u64 = 99_999_999;

/// How Stripe writes a currency's `amount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StripeUnit {
    /// Hundredths: Stripe's default, cents for USD.
    TwoDecimal,
    /// Whole units: Stripe's zero-decimal currencies, "provide an amount value as an
    /// integer but without multiplying by 100" (¥1 is 1).
    ZeroDecimal,
    /// Hundredths whose last two digits are 00: ISK "transitioned to a zero-decimal
    /// currency, but backward compatibility requires you to represent it as a
    /// two-decimal value, where the decimal amount is always 00. [...] You can't charge
    /// fractions of ISK." (5 kr is 500.)
    TwoDecimalWhole,
    /// Thousandths whose last digit is 0: BHD, JOD, KWD, OMR and TND, "the smallest unit
    /// must end in 0" (5.124 KWD is refused, 5.120 KWD is 5120).
    ThreeDecimalTens,
}

impl StripeUnit {
    /// The decimals of Stripe's `amount`.
    pub fn decimals(self) -> u8 {
        match self {
            Self::ZeroDecimal => 0,
            Self::TwoDecimal | Self::TwoDecimalWhole => 2,
            Self::ThreeDecimalTens => 3,
        }
    }

    /// Stripe's `amount` is a multiple of this.
    pub fn step(self) -> u64 {
        match self {
            Self::TwoDecimal | Self::ZeroDecimal => 1,
            Self::TwoDecimalWhole => 100,
            Self::ThreeDecimalTens => 10,
        }
    }
}

/// One currency as Stripe charges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeCurrency {
    /// ISO 4217's code, upper case (Stripe takes it in lower case).
    pub code: &'static str,
    pub unit: StripeUnit,
    /// The least `amount` Stripe charges, in its own unit, where its table of minimum
    /// charge amounts lists the currency. For the others Stripe's minimum is $0.50
    /// converted at the day's rate, which a table cannot hold: such a price is checked
    /// against one unit only.
    pub minimum: Option<u64>,
}

const fn row(code: &'static str, unit: StripeUnit, minimum: Option<u64>) -> StripeCurrency {
    StripeCurrency {
        code,
        unit,
        minimum,
    }
}

use StripeUnit::{ThreeDecimalTens, TwoDecimal, TwoDecimalWhole, ZeroDecimal};

/// Stripe's presentment currencies and how it charges each, from
/// <https://docs.stripe.com/currencies> ("Supported presentment currencies",
/// "Zero-decimal currencies", "Three-decimal currencies", "Special cases", "Minimum and
/// maximum charge amounts"), sorted by code.
///
/// Where the page has a special case that does not touch a charge, the row is plain:
/// - HUF and TWD are "zero-decimal for payouts, even though you can charge two-decimal
///   amounts": charged in hundredths, as ISO 4217 has them.
/// - UGX is on Stripe's zero-decimal list, and ISO 4217 gives it no decimals either.
///
/// Stripe also lists ANG, BGN and STD, which ISO 4217 has superseded (by XCG, EUR and
/// STN, which Stripe does not list): a sale is priced in current money only, so they
/// have no row.
pub const STRIPE_CURRENCIES: &[StripeCurrency] = &[
    row("AED", TwoDecimal, Some(200)),
    row("AFN", TwoDecimal, None),
    row("ALL", TwoDecimal, None),
    row("AMD", TwoDecimal, None),
    row("AOA", TwoDecimal, None),
    row("ARS", TwoDecimal, None),
    row("AUD", TwoDecimal, Some(50)),
    row("AWG", TwoDecimal, None),
    row("AZN", TwoDecimal, None),
    row("BAM", TwoDecimal, None),
    row("BBD", TwoDecimal, None),
    row("BDT", TwoDecimal, None),
    row("BHD", ThreeDecimalTens, None),
    row("BIF", ZeroDecimal, None),
    row("BMD", TwoDecimal, None),
    row("BND", TwoDecimal, None),
    row("BOB", TwoDecimal, None),
    row("BRL", TwoDecimal, Some(50)),
    row("BSD", TwoDecimal, None),
    row("BWP", TwoDecimal, None),
    row("BYN", TwoDecimal, None),
    row("BZD", TwoDecimal, None),
    row("CAD", TwoDecimal, Some(50)),
    row("CDF", TwoDecimal, None),
    row("CHF", TwoDecimal, Some(50)),
    row("CLP", ZeroDecimal, None),
    row("CNY", TwoDecimal, None),
    row("COP", TwoDecimal, None),
    row("CRC", TwoDecimal, None),
    row("CVE", TwoDecimal, None),
    row("CZK", TwoDecimal, Some(1500)),
    row("DJF", ZeroDecimal, None),
    row("DKK", TwoDecimal, Some(250)),
    row("DOP", TwoDecimal, None),
    row("DZD", TwoDecimal, None),
    row("EGP", TwoDecimal, None),
    row("ETB", TwoDecimal, None),
    row("EUR", TwoDecimal, Some(50)),
    row("FJD", TwoDecimal, None),
    row("FKP", TwoDecimal, None),
    row("GBP", TwoDecimal, Some(30)),
    row("GEL", TwoDecimal, None),
    row("GIP", TwoDecimal, None),
    row("GMD", TwoDecimal, None),
    row("GNF", ZeroDecimal, None),
    row("GTQ", TwoDecimal, None),
    row("GYD", TwoDecimal, None),
    row("HKD", TwoDecimal, Some(400)),
    row("HNL", TwoDecimal, None),
    row("HTG", TwoDecimal, None),
    row("HUF", TwoDecimal, Some(17500)),
    row("IDR", TwoDecimal, None),
    row("ILS", TwoDecimal, None),
    row("INR", TwoDecimal, Some(50)),
    row("ISK", TwoDecimalWhole, None),
    row("JMD", TwoDecimal, None),
    row("JOD", ThreeDecimalTens, None),
    row("JPY", ZeroDecimal, Some(50)),
    row("KES", TwoDecimal, None),
    row("KGS", TwoDecimal, None),
    row("KHR", TwoDecimal, None),
    row("KMF", ZeroDecimal, None),
    row("KRW", ZeroDecimal, None),
    row("KWD", ThreeDecimalTens, None),
    row("KYD", TwoDecimal, None),
    row("KZT", TwoDecimal, None),
    row("LAK", TwoDecimal, None),
    row("LBP", TwoDecimal, None),
    row("LKR", TwoDecimal, None),
    row("LRD", TwoDecimal, None),
    row("LSL", TwoDecimal, None),
    row("MAD", TwoDecimal, None),
    row("MDL", TwoDecimal, None),
    row("MGA", ZeroDecimal, None),
    row("MKD", TwoDecimal, None),
    row("MMK", TwoDecimal, None),
    row("MNT", TwoDecimal, None),
    row("MOP", TwoDecimal, None),
    row("MUR", TwoDecimal, None),
    row("MVR", TwoDecimal, None),
    row("MWK", TwoDecimal, None),
    row("MXN", TwoDecimal, Some(1000)),
    row("MYR", TwoDecimal, Some(200)),
    row("MZN", TwoDecimal, None),
    row("NAD", TwoDecimal, None),
    row("NGN", TwoDecimal, None),
    row("NIO", TwoDecimal, None),
    row("NOK", TwoDecimal, Some(300)),
    row("NPR", TwoDecimal, None),
    row("NZD", TwoDecimal, Some(50)),
    row("OMR", ThreeDecimalTens, None),
    row("PAB", TwoDecimal, None),
    row("PEN", TwoDecimal, None),
    row("PGK", TwoDecimal, None),
    row("PHP", TwoDecimal, None),
    row("PKR", TwoDecimal, None),
    row("PLN", TwoDecimal, Some(200)),
    row("PYG", ZeroDecimal, None),
    row("QAR", TwoDecimal, None),
    row("RON", TwoDecimal, Some(200)),
    row("RSD", TwoDecimal, None),
    row("RUB", TwoDecimal, None),
    row("RWF", ZeroDecimal, None),
    row("SAR", TwoDecimal, None),
    row("SBD", TwoDecimal, None),
    row("SCR", TwoDecimal, None),
    row("SEK", TwoDecimal, Some(300)),
    row("SGD", TwoDecimal, Some(50)),
    row("SHP", TwoDecimal, None),
    row("SLE", TwoDecimal, None),
    row("SOS", TwoDecimal, None),
    row("SRD", TwoDecimal, None),
    row("SZL", TwoDecimal, None),
    row("THB", TwoDecimal, Some(1000)),
    row("TJS", TwoDecimal, None),
    row("TND", ThreeDecimalTens, None),
    row("TOP", TwoDecimal, None),
    row("TRY", TwoDecimal, None),
    row("TTD", TwoDecimal, None),
    row("TWD", TwoDecimal, None),
    row("TZS", TwoDecimal, None),
    row("UAH", TwoDecimal, None),
    row("UGX", ZeroDecimal, None),
    row("USD", TwoDecimal, Some(50)),
    row("UYU", TwoDecimal, None),
    row("UZS", TwoDecimal, None),
    row("VND", ZeroDecimal, None),
    row("VUV", ZeroDecimal, None),
    row("WST", TwoDecimal, None),
    row("XAF", ZeroDecimal, None),
    row("XCD", TwoDecimal, None),
    row("XCG", TwoDecimal, None),
    row("XOF", ZeroDecimal, None),
    row("XPF", ZeroDecimal, None),
    row("YER", TwoDecimal, None),
    row("ZAR", TwoDecimal, None),
    row("ZMW", TwoDecimal, None),
];

/// The row of Stripe's table for an upper-case code.
fn stripe_currency(code: &str) -> Option<&'static StripeCurrency> {
    STRIPE_CURRENCIES
        .binary_search_by(|row| row.code.cmp(code))
        .ok()
        .map(|at| &STRIPE_CURRENCIES[at])
}

/// A currency a price may be in: one of ISO 4217's, current, money a buyer pays in, and
/// one Stripe charges. Funds (`CLF`, `USN`), the special codes (gold, `XDR`, the test
/// code `XTS`, "no currency" `XXX`), superseded currencies (`HRK`, now EUR) and money
/// Stripe does not take (`IRR`, `CUP`) are refused.
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
        if stripe_currency(code).is_none() {
            return Err(ValidationError::new(
                field,
                format!("must be a currency Stripe charges in, which {code} is not"),
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

    /// How Stripe charges this currency.
    pub fn stripe(self) -> &'static StripeCurrency {
        stripe_currency(self.code()).expect("parse accepts only currencies Stripe charges")
    }

    /// `amount` minor units (ISO 4217's) as Stripe's `amount`: the same money, in
    /// Stripe's unit (1,300 ISK is 130000, 1,299.00 MGA is 1299), or why Stripe cannot
    /// charge it, under `field`.
    pub fn to_stripe(self, field: &'static str, amount: u64) -> Result<u64, ValidationError> {
        let stripe = self.stripe();
        let refused = |problem: String| Err(ValidationError::new(field, problem));
        let (iso, ours) = (self.decimals(), stripe.unit.decimals());
        let converted = if ours >= iso {
            amount.checked_mul(10_u64.pow(u32::from(ours - iso)))
        } else {
            let scale = 10_u64.pow(u32::from(iso - ours));
            amount.is_multiple_of(scale).then_some(amount / scale)
        };
        let charged = converted.filter(|charged| charged % stripe.unit.step() == 0);
        let Some(charged) = charged else {
            let step = self.iso_step();
            return refused(format!(
                "must be a multiple of {step} (in ISO 4217's minor unit, {iso} decimals): \
                 Stripe charges {code} in steps of {shown}",
                code = self.code(),
                shown = self.major_units(step),
            ));
        };
        if stripe.minimum.is_some_and(|minimum| charged < minimum) {
            return refused(format!(
                "must be at least {} {}, Stripe's minimum charge",
                self.major_units(self.least_amount()),
                self.code()
            ));
        }
        if charged > STRIPE_MAX_AMOUNT {
            return refused(format!(
                "must be at most {} {}, Stripe's largest charge",
                self.major_units(self.largest_amount()),
                self.code()
            ));
        }
        Ok(charged)
    }

    /// The least amount Stripe charges, in ISO 4217's minor unit.
    pub fn least_amount(self) -> u64 {
        let least = self.in_iso(self.stripe().minimum.unwrap_or(1), Rounding::Up);
        least.div_ceil(self.iso_step()) * self.iso_step()
    }

    /// The largest amount Stripe charges, in ISO 4217's minor unit.
    pub fn largest_amount(self) -> u64 {
        let largest = self.in_iso(STRIPE_MAX_AMOUNT, Rounding::Down);
        largest / self.iso_step() * self.iso_step()
    }

    /// The least step between two amounts Stripe charges, in ISO 4217's minor unit: 1
    /// for EUR, 100 for MGA (whole ariary), 10 for KWD.
    pub fn iso_step(self) -> u64 {
        let stripe = self.stripe().unit;
        let (iso, ours) = (self.decimals(), stripe.decimals());
        if ours >= iso {
            let scale = 10_u64.pow(u32::from(ours - iso));
            stripe.step() / gcd(stripe.step(), scale)
        } else {
            stripe.step() * 10_u64.pow(u32::from(iso - ours))
        }
    }

    /// Stripe's `amount` in ISO 4217's minor unit, rounded to a whole one.
    fn in_iso(self, charged: u64, rounding: Rounding) -> u64 {
        let (iso, ours) = (self.decimals(), self.stripe().unit.decimals());
        if iso >= ours {
            charged * 10_u64.pow(u32::from(iso - ours))
        } else {
            let scale = 10_u64.pow(u32::from(ours - iso));
            match rounding {
                Rounding::Up => charged.div_ceil(scale),
                Rounding::Down => charged / scale,
            }
        }
    }

    /// `amount` minor units in the major unit, with the currency's own decimals and a
    /// dot: `1299.00` EUR, `1299` JPY, `1.250` BHD.
    pub fn major_units(self, amount: u64) -> String {
        let decimals = self.decimals();
        let scale = 10_u64.pow(u32::from(decimals));
        let (whole, fraction) = (amount / scale, amount % scale);
        if decimals == 0 {
            whole.to_string()
        } else {
            format!("{whole}.{fraction:0width$}", width = usize::from(decimals))
        }
    }
}

#[derive(Clone, Copy)]
enum Rounding {
    Up,
    Down,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::price::Price;

    #[test]
    fn the_table_is_sorted_by_code_once_each_and_every_row_is_current_money() {
        for pair in STRIPE_CURRENCIES.windows(2) {
            assert!(pair[0].code < pair[1].code, "{pair:?}");
        }
        for row in STRIPE_CURRENCIES {
            let currency = Currency::parse("c", row.code).unwrap();
            assert_eq!(currency.stripe(), row);
        }
        assert_eq!(STRIPE_CURRENCIES.len(), 137);
    }

    #[test]
    fn only_mga_and_isk_are_written_in_other_units_than_iso_4217s() {
        let differing: Vec<_> = STRIPE_CURRENCIES
            .iter()
            .filter(|row| Currency::parse("c", row.code).unwrap().decimals() != row.unit.decimals())
            .map(|row| row.code)
            .collect();
        assert_eq!(differing, ["ISK", "MGA"]);
    }

    /// The console turns the operator's price into minor units with its own copy of the
    /// decimals (web/assets/currencies.js): the browser's locale data differs from ISO
    /// 4217 for some currencies (MGA, HUF, IDR), so 1,500 Ft was sent as 15.00 Ft.
    #[test]
    fn the_console_knows_each_currencys_decimals() {
        const CONSOLE: &str = include_str!("../../../../web/assets/currencies.js");
        let table = CONSOLE
            .split_once("Object.freeze({")
            .and_then(|(_, rest)| rest.split_once("})"))
            .expect("currencies.js's frozen object")
            .0;
        let console: Vec<(String, u8)> = table
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let (code, decimals) = entry.split_once(": ").expect("CODE: decimals");
                (code.to_owned(), decimals.parse().expect("decimals"))
            })
            .collect();
        let ours: Vec<(String, u8)> = STRIPE_CURRENCIES
            .iter()
            .map(|row| {
                let currency = Currency::parse("c", row.code).unwrap();
                (row.code.to_owned(), currency.decimals())
            })
            .collect();
        assert_eq!(console, ours);
    }

    /// `amount` minor units with `decimals` decimals, and Stripe's `charged` with
    /// `stripe_decimals`, are the same money.
    fn same_money(amount: u64, decimals: u8, charged: u64, stripe_decimals: u8) -> bool {
        u128::from(amount) * 10_u128.pow(u32::from(stripe_decimals))
            == u128::from(charged) * 10_u128.pow(u32::from(decimals))
    }

    fn any_currency() -> impl Strategy<Value = Currency> {
        proptest::sample::select(STRIPE_CURRENCIES)
            .prop_map(|row| Currency::parse("c", row.code).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_096))]

        /// For every currency in the table, a price is accepted exactly when Stripe
        /// charges it, and what the buyer is shown is what Stripe is sent.
        #[test]
        fn what_the_buyer_is_shown_is_what_stripe_charges(
            currency in any_currency(),
            amount in prop_oneof![1_u64..100_000, 1_u64..=MAX_STRIPE_PROBE],
        ) {
            let price = Price::new(i64::try_from(amount).unwrap(), currency.code());
            let stripe = currency.stripe();
            let chargeable = amount % currency.iso_step() == 0
                && (currency.least_amount()..=currency.largest_amount()).contains(&amount);
            prop_assert_eq!(price.is_ok(), chargeable, "{} {}: {:?}", amount, currency, price);
            if let Ok(price) = price {
                let charged = price.stripe_amount();
                let shown: u64 = price.major_units().replace('.', "").parse().unwrap();
                prop_assert_eq!(shown, amount);
                prop_assert!(same_money(shown, currency.decimals(), charged, stripe.unit.decimals()));
                prop_assert_eq!(charged % stripe.unit.step(), 0);
                prop_assert!(charged <= STRIPE_MAX_AMOUNT);
                prop_assert!(charged >= stripe.minimum.unwrap_or(1));
            }
        }

        /// The bounds are Stripe's own: one step below the least and one above the
        /// largest are refused.
        #[test]
        fn the_bounds_are_tight(currency in any_currency()) {
            let (least, largest, step) =
                (currency.least_amount(), currency.largest_amount(), currency.iso_step());
            prop_assert!(currency.to_stripe("a", least).is_ok());
            prop_assert!(currency.to_stripe("a", largest).is_ok());
            prop_assert!(least <= step || currency.to_stripe("a", least - step).is_err());
            prop_assert!(currency.to_stripe("a", largest + step).is_err());
        }
    }

    /// Past every currency's largest price: MGA's 9,999,999,900.
    const MAX_STRIPE_PROBE: u64 = 20_000_000_000;
}
