//! A task group's `reschedule` block: how a fleet places an allocation again after it was
//! lost with its worker or failed there, with Nomad's fields, defaults and rules.
//!
//! ```toml
//! [group]
//! name = "web"
//! reschedule = { delay = "30s", delay_function = "exponential", max_delay = "1h", unlimited = true }
//! ```
//!
//! Defaults by job type (Nomad's): services reschedule without limit, 30s apart at first and
//! doubling up to an hour; batch jobs once in 24 hours, 5s after the failure. A policy with
//! `attempts = 0` and `unlimited = false` never reschedules. The decisions made with a policy
//! (when the next attempt is due, whether one is left) are the fleet's.

use crate::duration;
use crate::job_type::JobType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The shortest delay between reschedule attempts (Nomad's `ReschedulePolicyMinDelay`).
pub const MIN_RESCHEDULE_DELAY: Duration = Duration::from_secs(5);
/// The shortest interval a limited policy may count attempts in (Nomad's
/// `ReschedulePolicyMinInterval`).
pub const MIN_RESCHEDULE_INTERVAL: Duration = Duration::from_secs(15);

/// How the delay grows from one attempt to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DelayFunction {
    /// Always `delay`.
    Constant,
    /// Twice the previous delay, up to `max_delay`.
    Exponential,
    /// The sum of the two previous delays, up to `max_delay`.
    Fibonacci,
}

impl fmt::Display for DelayFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DelayFunction::Constant => "constant",
            DelayFunction::Exponential => "exponential",
            DelayFunction::Fibonacci => "fibonacci",
        })
    }
}

/// A complete reschedule policy, as the fleet applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReschedulePolicy {
    /// Attempts allowed within one `interval` (ignored when `unlimited`).
    pub attempts: u32,
    /// The window attempts are counted in.
    #[serde(with = "duration::serde_str")]
    pub interval: Duration,
    /// The wait before the first attempt, and the base of the delay function.
    #[serde(with = "duration::serde_str")]
    pub delay: Duration,
    /// How the delay grows.
    pub delay_function: DelayFunction,
    /// The longest delay (not used by `constant`).
    #[serde(with = "duration::serde_str")]
    pub max_delay: Duration,
    /// Reschedule without a limit on attempts.
    pub unlimited: bool,
}

impl ReschedulePolicy {
    /// Nomad's defaults: services unlimited, 30s exponential up to 1h; batch once in 24h, 5s
    /// constant.
    pub fn defaults_for(job_type: JobType) -> ReschedulePolicy {
        if job_type.runs_to_completion() {
            ReschedulePolicy {
                attempts: 1,
                interval: Duration::from_secs(24 * 3600),
                delay: Duration::from_secs(5),
                delay_function: DelayFunction::Constant,
                max_delay: Duration::ZERO,
                unlimited: false,
            }
        } else {
            ReschedulePolicy {
                attempts: 0,
                interval: Duration::ZERO,
                delay: Duration::from_secs(30),
                delay_function: DelayFunction::Exponential,
                max_delay: Duration::from_secs(3600),
                unlimited: true,
            }
        }
    }

    /// Never reschedule.
    pub const DISABLED: ReschedulePolicy = ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay: Duration::ZERO,
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    };

    /// Applies the fields `overrides` sets.
    pub fn with(mut self, overrides: &RescheduleOverrides) -> ReschedulePolicy {
        self.attempts = overrides.attempts.unwrap_or(self.attempts);
        self.interval = overrides.interval.unwrap_or(self.interval);
        self.delay = overrides.delay.unwrap_or(self.delay);
        self.delay_function = overrides.delay_function.unwrap_or(self.delay_function);
        self.max_delay = overrides.max_delay.unwrap_or(self.max_delay);
        self.unlimited = overrides.unlimited.unwrap_or(self.unlimited);
        self
    }

    /// Whether it reschedules at all (Nomad's `Enabled`).
    pub fn enabled(&self) -> bool {
        self.attempts > 0 || self.unlimited
    }

    /// Nomad's rules (`ReschedulePolicy.Validate`): nothing to check when disabled; a delay of
    /// at least 5s; a `max_delay` of at least 5s and no less than `delay` unless constant;
    /// `attempts` with `unlimited` is ambiguous; a limited policy needs an interval of at least
    /// 15s that fits its attempts with their delays, and is told the interval that would.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.enabled() {
            return problems;
        }
        let f = duration::Formatted;
        if self.attempts > 0 && self.unlimited {
            problems.push(format!(
                "attempts = {} with unlimited = true is ambiguous: set one of them",
                self.attempts
            ));
        }
        let mut delays_valid = true;
        if self.delay < MIN_RESCHEDULE_DELAY {
            problems.push(format!(
                "delay {} is shorter than the minimum of {}",
                f(self.delay),
                f(MIN_RESCHEDULE_DELAY)
            ));
            delays_valid = false;
        }
        if self.delay_function != DelayFunction::Constant {
            if self.max_delay < MIN_RESCHEDULE_DELAY {
                problems.push(format!(
                    "max_delay {} is shorter than the minimum of {}",
                    f(self.max_delay),
                    f(MIN_RESCHEDULE_DELAY)
                ));
                delays_valid = false;
            } else if self.max_delay < self.delay {
                problems.push(format!(
                    "max_delay {} is shorter than delay {}",
                    f(self.max_delay),
                    f(self.delay)
                ));
                delays_valid = false;
            }
        }
        if !self.unlimited {
            if self.interval < MIN_RESCHEDULE_INTERVAL {
                problems.push(format!(
                    "interval {} is shorter than the minimum of {}",
                    f(self.interval),
                    f(MIN_RESCHEDULE_INTERVAL)
                ));
            } else if delays_valid && let Some((possible, needed)) = self.unviable() {
                problems.push(format!(
                    "only {possible} of {} attempts fit in the interval of {} with a {} delay \
                     of {}{}; set the interval to at least {}",
                    self.attempts,
                    f(self.interval),
                    self.delay_function,
                    f(self.delay),
                    if self.delay_function == DelayFunction::Constant {
                        String::new()
                    } else {
                        format!(" up to {}", f(self.max_delay))
                    },
                    f(needed)
                ));
            }
        }
        problems
    }

    /// When the attempts do not fit in the interval: how many would, and the interval they
    /// need (Nomad's `viableAttempts`).
    fn unviable(&self) -> Option<(u32, Duration)> {
        let attempts = self.attempts;
        match self.delay_function {
            DelayFunction::Constant => {
                let needed = self.delay.saturating_mul(attempts);
                let possible = (self.interval.as_millis() / self.delay.as_millis().max(1)) as u32;
                (self.interval < needed).then_some((possible, needed))
            }
            DelayFunction::Exponential => {
                let (mut possible, mut needed) = (0, Duration::ZERO);
                for i in 0..attempts {
                    let next = self.delay.saturating_mul(2u32.saturating_pow(i.min(31)));
                    if next > self.max_delay {
                        needed = needed.saturating_add(self.max_delay);
                    } else {
                        needed = next;
                    }
                    if needed < self.interval {
                        possible += 1;
                    }
                }
                (possible < attempts).then_some((possible, needed))
            }
            DelayFunction::Fibonacci => {
                let mut slots = vec![self.delay, self.delay];
                let mut ceiling = false;
                for i in 2..attempts as usize {
                    let next = if ceiling {
                        slots[i - 1].saturating_add(self.max_delay)
                    } else {
                        let sum = slots[i - 1].saturating_add(slots[i - 2]);
                        if sum > self.max_delay {
                            ceiling = true;
                            self.max_delay
                        } else {
                            sum
                        }
                    };
                    slots.push(next);
                }
                let needed = slots[slots.len() - 1];
                if self.interval >= needed {
                    return None;
                }
                let possible = slots.iter().position(|s| *s > self.interval).unwrap_or(0) as u32;
                Some((possible, needed))
            }
        }
    }
}

/// A `reschedule` block as written in a spec: each field may be left to the job type's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescheduleOverrides {
    /// Attempts allowed within one interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The window attempts are counted in.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub interval: Option<Duration>,
    /// The first delay.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub delay: Option<Duration>,
    /// `constant`, `exponential` or `fibonacci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_function: Option<DelayFunction>,
    /// The longest delay.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub max_delay: Option<Duration>,
    /// Reschedule without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlimited: Option<bool>,
}

impl RescheduleOverrides {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        *self == RescheduleOverrides::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(minutes: u64) -> Duration {
        Duration::from_secs(60 * minutes)
    }

    fn policy(
        attempts: u32,
        interval: Duration,
        delay: Duration,
        delay_function: DelayFunction,
        max_delay: Duration,
        unlimited: bool,
    ) -> ReschedulePolicy {
        ReschedulePolicy { attempts, interval, delay, delay_function, max_delay, unlimited }
    }

    /// Nomad's `TestReschedulePolicy_Validate`, row by row: the problems each policy has (a
    /// phrase of each), or none.
    #[test]
    fn reschedule_policy_validate() {
        use DelayFunction::*;
        let s = Duration::from_secs;
        let cases: Vec<(&str, ReschedulePolicy, Vec<&str>)> = vec![
            ("disabled", policy(0, s(0), s(0), Constant, s(0), false), vec![]),
            ("valid linear delay", policy(1, m(5), s(10), Constant, s(0), false), vec![]),
            ("valid exponential delay", policy(5, m(60), s(30), Exponential, m(5), false), vec![]),
            ("valid fibonacci delay", policy(5, m(15), s(10), Fibonacci, m(5), false), vec![]),
            (
                "invalid delay ceiling",
                policy(1, s(8), s(15), Exponential, s(5), false),
                vec!["max_delay 5s is shorter than delay 15s", "interval 8s is shorter"],
            ),
            (
                "invalid delay and interval",
                policy(1, s(1), s(0), Constant, s(0), false),
                vec!["interval 1s is shorter than the minimum of 15s", "delay 0s is shorter"],
            ),
            (
                // Nomad suggests 2h40m.
                "invalid attempts, linear delay",
                policy(10, m(60), m(20), Constant, s(0), false),
                vec!["only 3 of 10 attempts fit", "at least 3h20m0s"],
            ),
            (
                // Delays in minutes 5, 10, 20, 40, 40, ...: 280 minutes.
                "invalid attempts, exponential delay",
                policy(10, m(30), m(5), Exponential, m(40), false),
                vec!["only 3 of 10 attempts fit", "at least 4h40m0s"],
            ),
            (
                // Delays in minutes 20, 20, 40, 60, 80, then 80 more each: 480 minutes.
                "invalid attempts, fibonacci delay",
                policy(10, m(60), m(20), Fibonacci, m(80), false),
                vec!["only 4 of 10 attempts fit", "at least 8h0m0s"],
            ),
            (
                "ambiguous unlimited config",
                policy(1, s(0), m(5), Exponential, m(60), true),
                vec!["attempts = 1 with unlimited = true is ambiguous"],
            ),
            (
                "invalid unlimited config",
                policy(1, s(1), s(0), Exponential, s(0), true),
                vec!["delay 0s is shorter than the minimum of 5s", "max_delay 0s is shorter"],
            ),
            ("valid unlimited config", policy(0, s(0), s(5), Exponential, m(60), true), vec![]),
        ];
        for (name, policy, expected) in cases {
            let problems = policy.problems();
            if expected.is_empty() {
                assert!(problems.is_empty(), "{name}: {problems:?}");
            }
            for phrase in expected {
                assert!(problems.iter().any(|p| p.contains(phrase)), "{name}: {problems:?}");
            }
        }
    }

    #[test]
    fn defaults_are_nomads_and_valid() {
        let service = ReschedulePolicy::defaults_for(JobType::Service);
        assert!(service.unlimited && service.enabled());
        assert_eq!((service.delay, service.max_delay), (Duration::from_secs(30), m(60)));
        assert_eq!(service.delay_function, DelayFunction::Exponential);
        let batch = ReschedulePolicy::defaults_for(JobType::Batch);
        assert_eq!((batch.attempts, batch.interval), (1, m(24 * 60)));
        assert_eq!(
            (batch.delay, batch.delay_function),
            (Duration::from_secs(5), DelayFunction::Constant)
        );
        assert!(service.problems().is_empty() && batch.problems().is_empty());
        let off = batch.with(&RescheduleOverrides { attempts: Some(0), ..Default::default() });
        assert!(!off.enabled() && off.problems().is_empty());
    }
}
