//! Points in time as plain data. Nothing here reads a clock: callers pass the time in.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// Milliseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The timestamp `duration` after the epoch, saturating at the largest value.
    pub fn from_unix(duration: Duration) -> Timestamp {
        Timestamp(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    /// `self + duration`, saturating.
    pub fn saturating_add(self, duration: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)))
    }

    /// How long after `earlier` this is; zero if it is not later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC with milliseconds: `2026-11-29T16:10:17.000Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0 % 1000;
        let secs = self.0 / 1000;
        let (days, day_secs) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            day_secs / 3600,
            day_secs / 60 % 60,
            day_secs % 60
        )
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_rfc3339() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp(951_782_400_000).to_string(), "2000-02-29T00:00:00.000Z");
        assert_eq!(Timestamp(1_795_968_617_123).to_string(), "2026-11-29T16:10:17.123Z");
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Timestamp(u64::MAX).saturating_add(Duration::from_secs(1)), Timestamp(u64::MAX));
        assert_eq!(Timestamp(5).since(Timestamp(9)), Duration::ZERO);
        assert_eq!(Timestamp(9_000).since(Timestamp(4_000)), Duration::from_secs(5));
    }
}
