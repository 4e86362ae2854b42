//! Duration strings as users write them: `"5s"`, `"30m"`, `"1h30m"`, `"250ms"`.
//!
//! The grammar is Go's `time.ParseDuration` without signs: one or more `<number><unit>` pairs,
//! where the number may have a fraction and the unit is one of `ns`, `us`, `µs`, `ms`, `s`,
//! `m`, `h`. A bare `"0"` is zero. [`format()`] is its inverse and the one way wharf writes a
//! duration for people: Go's `time.Duration` form (`"1.039s"`, `"1m30s"`, `"2h0m0s"`), which
//! [`parse`] reads back to the same nanosecond, so specs round-trip.

use std::fmt;
use std::time::Duration;

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    /// The string as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000), // U+00B5 MICRO SIGN, which `format` writes
    ("μs", 1_000), // U+03BC GREEK SMALL LETTER MU, which looks the same
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a duration string such as `"1h30m"` or `"1.5s"`.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError { input: input.to_owned(), reason };
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    if input.is_empty() {
        return Err(err("empty string; write a number and a unit, like \"5s\""));
    }
    let mut rest = input;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len =
            rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(err("expected a number before each unit"));
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let Some(&(_, unit_nanos)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(if unit.is_empty() {
                err("missing unit; use one of ns, us, ms, s, m, h")
            } else {
                err("unknown unit; use one of ns, us, ms, s, m, h")
            });
        };
        total_nanos = total_nanos
            .checked_add(scale(number, unit_nanos).ok_or_else(|| err("not a number"))?)
            .ok_or_else(|| err("too large"))?;
        rest = after;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| err("too large"))?;
    Ok(Duration::new(secs, (total_nanos % 1_000_000_000) as u32))
}

/// `number` (digits with at most one '.') times `unit_nanos`, truncated to whole nanoseconds.
fn scale(number: &str, unit_nanos: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let mut nanos = whole.checked_mul(unit_nanos)?;
    // Fractions beyond nanosecond precision cannot change the result.
    let mut place = unit_nanos;
    for digit in fraction.bytes().take(30) {
        place /= 10;
        nanos = nanos.checked_add(u128::from(digit - b'0') * place)?;
    }
    Some(nanos)
}

/// Formats a duration the way people read and write them, as Go's `time.Duration` prints:
/// `5s`, `1.039s`, `1m30s`, `2h0m0s`, `250ms`, `1.5µs`, `0s`.
///
/// [`parse`] reads every result back to the same value, to the nanosecond, so this one
/// formatter serves events, CLI output, errors and the unit strings written into specs.
pub fn format(duration: Duration) -> String {
    Formatted(duration).to_string()
}

/// A [`Duration`] that displays in the form of [`format()`].
///
/// The rules are Go's: below one second, the largest of `ns`, `µs`, `ms` that is not above
/// the value, with a decimal fraction; from one second up, `<h>h<m>m<s>s` where hours appear
/// only when non-zero, minutes whenever hours do or are themselves non-zero, and the seconds
/// always, with a fraction. A fraction has its trailing zeros cut, and no point when it is
/// zero. Hours are the largest unit because days differ in length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formatted(pub Duration);

impl fmt::Display for Formatted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs();
        let nanos = self.0.subsec_nanos();
        if secs == 0 {
            let (unit, digits, per_unit) = match nanos {
                0 => return f.write_str("0s"),
                1..1_000 => ("ns", 0, 1),
                1_000..1_000_000 => ("µs", 3, 1_000),
                _ => ("ms", 6, 1_000_000),
            };
            write!(f, "{}", nanos / per_unit)?;
            write_fraction(f, nanos % per_unit, digits)?;
            return f.write_str(unit);
        }
        let (hours, minutes) = (secs / 3600, secs / 60 % 60);
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if secs >= 60 {
            write!(f, "{minutes}m")?;
        }
        write!(f, "{}", secs % 60)?;
        write_fraction(f, nanos, 9)?;
        f.write_str("s")
    }
}

/// Writes `.` and the `digits`-digit decimal `fraction` without its trailing zeros, or nothing
/// when the fraction is zero.
fn write_fraction(f: &mut fmt::Formatter<'_>, mut fraction: u32, mut digits: usize) -> fmt::Result {
    if fraction == 0 {
        return Ok(());
    }
    while fraction.is_multiple_of(10) {
        fraction /= 10;
        digits -= 1;
    }
    write!(f, ".{fraction:0digits$}")
}

/// Serde helpers for `Duration` fields written as unit strings.
pub mod serde_str {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Writes the duration in [`super::format`] form.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::Formatted(*value))
    }

    /// Reads a unit string such as `"5s"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        super::parse(&text).map_err(serde::de::Error::custom)
    }

    /// The same for `Option<Duration>`.
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};
        use std::time::Duration;

        /// Writes `Some` in [`super::super::format`] form.
        pub fn serialize<S: Serializer>(
            value: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(d) => serializer.collect_str(&super::super::Formatted(*d)),
                None => serializer.serialize_none(),
            }
        }

        /// Reads an optional unit string.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            let text = Option::<std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            text.map(|t| super::super::parse(&t).map_err(serde::de::Error::custom)).transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_what_users_write() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("5s", Duration::from_secs(5)),
            ("30m", Duration::from_secs(1800)),
            ("24h", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5400)),
            ("250ms", Duration::from_millis(250)),
            ("1.5s", Duration::from_millis(1500)),
            (".5s", Duration::from_millis(500)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("10\u{3bc}s", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("1m0.5s", Duration::from_millis(60_500)),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), Ok(*want), "{input}");
        }
    }

    #[test]
    fn rejects_with_a_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("5", "missing unit"),
            ("5 s", "unknown unit"),
            ("5d", "unknown unit"),
            ("s", "expected a number"),
            ("-5s", "expected a number"),
            ("1..5s", "not a number"),
            (".s", "not a number"),
            ("9999999999999999999999999999999999999999h", "not a number"),
            ("6000000000000000h", "too large"),
        ];
        for (input, reason) in cases {
            let err = parse(input).expect_err(input);
            assert!(err.reason.contains(reason), "{input}: {err}");
            assert!(err.to_string().contains(&format!("{input:?}")), "{err}");
        }
    }

    /// Go's `TestDurationString` (`time/time_test.go`), the cases wharf can hold (durations
    /// are never negative here), and the ones people meet in events and the CLI.
    #[test]
    fn duration_string() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1100), "1.1µs"),
            (Duration::from_micros(2200), "2.2ms"),
            (Duration::from_millis(3300), "3.3s"),
            (Duration::from_secs(4 * 60 + 5), "4m5s"),
            (Duration::from_millis(4 * 60_000 + 5001), "4m5.001s"),
            (Duration::from_millis(5 * 3_600_000 + 6 * 60_000 + 7001), "5h6m7.001s"),
            (Duration::new(8 * 60, 1), "8m0.000000001s"),
            (Duration::new(9_223_372_036, 854_775_807), "2562047h47m16.854775807s"),
            (Duration::from_nanos(1_039_486_064), "1.039486064s"),
            (Duration::from_millis(1039), "1.039s"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(7200), "2h0m0s"),
            (Duration::from_secs(3600 + 1), "1h0m1s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_nanos(999), "999ns"),
            (Duration::from_nanos(1_000_001), "1.000001ms"),
            (Duration::from_nanos(999_999_999), "999.999999ms"),
            (Duration::MAX, "5124095576030431h0m15.999999999s"),
        ];
        for (duration, want) in cases {
            assert_eq!(format(*duration), *want, "{duration:?}");
            assert_eq!(parse(want), Ok(*duration), "{want} does not read back");
        }
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(secs in 0u64..10_000_000_000, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }

        #[test]
        fn parse_never_panics(input in "\\PC{0,24}") {
            let _ = parse(&input);
        }
    }
}
