//! When work that was lost or failed is placed again: Nomad's reschedule decision as a pure
//! function of the policy, the reschedules so far and the time of the failure.
//!
//! - The delay ([`next_delay`], Nomad's `NextDelay`): `delay` for the first reschedule; then
//!   constant stays at `delay`, exponential doubles the last delay, fibonacci adds the last
//!   two (starting a new series after a reset); a delay past `max_delay` is `max_delay`, and
//!   goes back to `delay` when the work ran longer than `max_delay` since the last reschedule.
//! - Eligibility ([`decide`], Nomad's `NextRescheduleTime`): never with `attempts = 0` and not
//!   `unlimited`; always when `unlimited`; otherwise while fewer than `attempts` reschedules
//!   happened within `interval` before the failure, and the delay is shorter than `interval`.
//! - What is kept ([`prune`], as Nomad's scheduler copies reschedule events to the next
//!   allocation): a limited policy keeps the attempts that ended within `interval`, an
//!   unlimited one the last [`MAX_PAST_RESCHEDULES`], so a record that keeps failing does not
//!   grow without end.

use std::time::Duration;
use wharf_state::Timestamp;
use wharf_state::fleet::{Attempt, RescheduleEvent};
use wharf_state::reschedule::{DelayFunction, ReschedulePolicy};

/// The wait before the next attempt, after a failure at `failed_at`.
pub fn next_delay(
    policy: &ReschedulePolicy,
    events: &[&RescheduleEvent],
    failed_at: Timestamp,
) -> Duration {
    let Some(last) = events.last() else { return policy.delay };
    let mut delay = match policy.delay_function {
        DelayFunction::Constant => return policy.delay,
        DelayFunction::Exponential => last.delay.saturating_mul(2),
        DelayFunction::Fibonacci => match events.len() {
            0 | 1 => policy.delay,
            n => {
                let (n1, n2) = (last.delay, events[n - 2].delay);
                // A reset to `delay` after the ceiling starts a new series.
                if n2 == policy.max_delay && n1 == policy.delay {
                    n1
                } else {
                    n1.saturating_add(n2)
                }
            }
        },
    };
    if !policy.max_delay.is_zero() && delay > policy.max_delay {
        delay = policy.max_delay;
        if failed_at.since(last.at) > delay {
            delay = policy.delay;
        }
    }
    delay
}

/// When work that failed (or was lost) at `failed_at` may be placed again, or `None` if the
/// policy allows no more attempts. `events` are the reschedules so far, oldest first.
pub fn decide(
    policy: &ReschedulePolicy,
    events: &[&RescheduleEvent],
    failed_at: Timestamp,
) -> Option<(Timestamp, Duration)> {
    if !policy.enabled() {
        return None;
    }
    let delay = next_delay(policy, events, failed_at);
    let eligible = policy.unlimited || {
        let recent = events.iter().filter(|e| failed_at.since(e.at) < policy.interval).count();
        (recent as u64) < u64::from(policy.attempts) && delay < policy.interval
    };
    eligible.then(|| (failed_at.saturating_add(delay), delay))
}

/// Past reschedules an unlimited policy keeps (Nomad's `maxPastRescheduleEvents`).
pub const MAX_PAST_RESCHEDULES: usize = 5;

/// Drops the past attempts `policy` no longer needs at `now`, oldest first: a limited policy
/// keeps those that ended within its interval (the only ones whose reschedules count), an
/// unlimited one the last [`MAX_PAST_RESCHEDULES`]; the attempt that ended last always stays.
pub fn prune(policy: &ReschedulePolicy, history: &mut Vec<Attempt>, now: Timestamp) {
    let last = history.len().saturating_sub(1);
    let keep_from = if policy.unlimited {
        history.len().saturating_sub(MAX_PAST_RESCHEDULES)
    } else {
        history.iter().position(|a| now.since(a.finished) <= policy.interval).unwrap_or(last)
    };
    history.drain(..keep_from.min(last));
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp(10_000_000_000);

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn ago(d: Duration) -> Timestamp {
        Timestamp(NOW.0 - d.as_millis() as u64)
    }

    fn event(at: Duration, delay: Duration) -> RescheduleEvent {
        RescheduleEvent { at: ago(at), delay, reason: "lost".into() }
    }

    fn policy(function: DelayFunction, delay: u64, max: u64) -> ReschedulePolicy {
        ReschedulePolicy {
            attempts: 0,
            interval: Duration::ZERO,
            delay: s(delay),
            delay_function: function,
            max_delay: s(max),
            unlimited: true,
        }
    }

    /// A row: its name, the policy, the reschedules so far (seconds ago, delay in seconds),
    /// seconds since the failure, and the delay in seconds the next attempt waits (if any).
    type NextDelayCase = (&'static str, ReschedulePolicy, Vec<(u64, u64)>, u64, Option<u64>);

    /// Nomad's `TestAllocation_NextDelay`, row by row: the policy, the reschedules so far (how
    /// long ago, with which delay), how long ago the failure was, and when the next attempt is
    /// due (or that none is).
    #[test]
    fn allocation_next_delay() {
        use DelayFunction::*;
        let h = 3600;
        let limited = ReschedulePolicy {
            attempts: 2,
            interval: s(600),
            unlimited: false,
            ..policy(Constant, 5, 0)
        };
        #[rustfmt::skip]
        let cases: Vec<NextDelayCase> = vec![
            ("linear delay, unlimited, no reschedules", policy(Constant, 5, 0), vec![], 2, Some(5)),
            ("linear delay with reschedule tracker", limited, vec![(120, 5)], 2, Some(5)),
            ("linear delay, attempts exhausted", limited, vec![(180, 5), (120, 5)], 2, None),
            ("exponential delay, no reschedules", policy(Exponential, 5, 90), vec![], 2, Some(5)),
            ("exponential delay with reschedules", policy(Exponential, 5, 90),
                vec![(2 * h, 5), (h, 10), (h, 20)], 2, Some(40)),
            ("exponential delay, ceiling reached", policy(Exponential, 5, 90),
                vec![(2 * h, 5), (h, 10), (h, 20), (h, 40), (40, 80)], 15, Some(90)),
            ("exponential delay, ceiling reset", policy(Exponential, 5, 90),
                vec![(2 * h, 5), (h, 10), (h, 20), (h, 40), (h, 80), (h, 90), (h, 90)], 15 * 60, Some(5)),
            ("fibonacci delay, no reschedules", policy(Fibonacci, 5, 90), vec![], 2, Some(5)),
            ("fibonacci delay with reschedules", policy(Fibonacci, 5, 90),
                vec![(2 * h, 5), (5, 5)], 2, Some(10)),
            ("fibonacci delay with more reschedules", policy(Fibonacci, 5, 90),
                vec![(2 * h, 5), (h, 5), (h, 10), (h, 15), (h, 25)], 2, Some(40)),
            ("fibonacci delay, ceiling reached", policy(Fibonacci, 5, 50),
                vec![(2 * h, 5), (h, 5), (h, 10), (h, 15), (h, 25), (40, 40)], 15, Some(50)),
            ("fibonacci delay, ceiling reset", policy(Fibonacci, 5, 50),
                vec![(2 * h, 5), (h, 5), (h, 10), (h, 15), (h, 25), (h, 40)], 5 * 60, Some(5)),
            ("fibonacci delay, the last reschedule reset it", policy(Fibonacci, 5, 50),
                vec![(2 * h, 5), (h, 5), (h, 10), (h, 15), (h, 25), (h, 40), (h, 50), (60, 5)], 5, Some(5)),
        ];
        for (name, policy, events, failed_ago, due) in cases {
            let events: Vec<RescheduleEvent> =
                events.into_iter().map(|(at, delay)| event(s(at), s(delay))).collect();
            let events: Vec<&RescheduleEvent> = events.iter().collect();
            let failed_at = ago(s(failed_ago));
            let expected = due.map(|d| (failed_at.saturating_add(s(d)), s(d)));
            assert_eq!(decide(&policy, &events, failed_at), expected, "{name}");
        }
    }

    fn attempt(n: u32, rescheduled: Option<RescheduleEvent>) -> Attempt {
        Attempt {
            attempt: n,
            runner_id: format!("w__{n}"),
            worker: Some("h1".into()),
            started: None,
            finished: NOW,
            outcome: "ended: failed".into(),
            rescheduled,
            price_micros_per_hour: None,
        }
    }

    /// Nomad's `TestServiceSched_Reschedule_PruneEvents`: an unlimited exponential policy with
    /// six past reschedules (5s to 160s) waits 320s next, and keeps the last five of them
    /// (from the 10s one) beside the new one.
    #[test]
    fn reschedule_prune_events() {
        let policy = policy(DelayFunction::Exponential, 5, 3600);
        let past = [(3600, 5), (2400, 10), (1800, 20), (1200, 40), (600, 80), (180, 160)];
        // Attempt 1 was placed fresh; attempts 2..=7 were each a reschedule.
        let mut history = vec![attempt(1, None)];
        for (n, (ago_s, delay)) in (2..).zip(past) {
            history.push(attempt(n, Some(event(s(ago_s), s(delay)))));
        }
        let events: Vec<&RescheduleEvent> =
            history.iter().filter_map(|a| a.rescheduled.as_ref()).collect();
        assert_eq!(decide(&policy, &events, NOW).map(|(_, d)| d), Some(s(320)));
        prune(&policy, &mut history, NOW);
        let kept: Vec<Duration> =
            history.iter().filter_map(|a| a.rescheduled.as_ref()).map(|e| e.delay).collect();
        assert_eq!(kept, [s(10), s(20), s(40), s(80), s(160)]);
        assert_eq!(history[0].attempt, 3);
    }

    /// A limited policy keeps the attempts that ended within its interval, which hold every
    /// reschedule that counts toward its attempts, and always the last one.
    #[test]
    fn a_limited_policy_keeps_the_attempts_within_its_interval() {
        let policy = ReschedulePolicy {
            attempts: 3,
            interval: s(1800),
            unlimited: false,
            ..policy(DelayFunction::Constant, 5, 0)
        };
        let ended = |n: u32, ago_s: u64| Attempt { finished: ago(s(ago_s)), ..attempt(n, None) };
        let mut history = vec![ended(1, 4000), ended(2, 3000), ended(3, 1000), ended(4, 10)];
        prune(&policy, &mut history, NOW);
        assert_eq!(history.iter().map(|a| a.attempt).collect::<Vec<_>>(), [3, 4]);
        let mut old = vec![ended(1, 4000), ended(2, 3000)];
        prune(&policy, &mut old, NOW);
        assert_eq!(old.iter().map(|a| a.attempt).collect::<Vec<_>>(), [2]);
    }

    /// Nomad's `TestAllocation_ShouldReschedule` and `TestAllocation_NextRescheduleTime`:
    /// whether a failure leads to another attempt, by policy and past reschedules.
    #[test]
    fn allocation_should_reschedule() {
        let m = |n: u64| s(60 * n);
        let limited = |attempts, interval| ReschedulePolicy {
            attempts,
            interval,
            delay: s(5),
            delay_function: DelayFunction::Constant,
            max_delay: Duration::ZERO,
            unlimited: false,
        };
        let cases: Vec<(&str, ReschedulePolicy, Vec<Duration>, bool)> = vec![
            ("disabled rescheduling", limited(0, m(1)), vec![], false),
            (
                "unlimited with no attempts",
                ReschedulePolicy { unlimited: true, ..limited(0, m(1)) },
                vec![],
                true,
            ),
            ("no previous attempts", limited(1, m(1)), vec![], true),
            ("leftover attempts", limited(2, m(5)), vec![m(1)], true),
            ("too old previous attempts", limited(1, m(5)), vec![m(6)], true),
            ("no leftover attempts", limited(2, m(5)), vec![m(3), m(4)], false),
            ("not exceeded within the hour", limited(2, m(60)), vec![m(10)], true),
            ("exceeded within the hour", limited(2, m(60)), vec![m(10), m(5)], false),
        ];
        for (name, policy, past, expected) in cases {
            let events: Vec<RescheduleEvent> = past.into_iter().map(|at| event(at, s(5))).collect();
            let events: Vec<&RescheduleEvent> = events.iter().collect();
            assert_eq!(decide(&policy, &events, NOW).is_some(), expected, "{name}");
        }
    }
}
