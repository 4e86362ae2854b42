//! The restart tracker: given how a run ended, whether and when to run the task again.
//!
//! Pure logic over an injected "now", tested as a table. The rules follow Nomad's:
//! a kill ends the task; a restart asked for by a user is immediate and not counted; a fatal
//! start error is never retried; a successful exit of a task that is not restarted on success
//! is done (see [`restarts_on_success`]: the job type decides first, then the lifecycle, so a
//! prestart or poststart sidecar restarts even in a batch job); otherwise
//! attempts are counted in a window of `interval`, and once they exceed `attempts` the task
//! fails (mode fail) or waits for the window to end (mode delay). Each restart waits `delay`
//! plus up to 25% jitter.

use std::time::Duration;
use wharf_driver::ExitResult;
use wharf_state::spec::{JobType, RestartMode, RestartPolicy, Stage};

/// How the last run ended, as the tracker is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The task exited.
    Exited(ExitResult),
    /// Starting it failed; `retryable` says whether trying again could help.
    StartFailed {
        /// Whether a retry could succeed.
        retryable: bool,
    },
    /// Someone asked for a restart; `failure` says whether it counts as one.
    RestartRequested {
        /// Counts against the attempts when true.
        failure: bool,
    },
    /// The task was killed for good.
    Killed,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start it again after `delay`.
    Restart {
        /// The wait before the restart.
        delay: Duration,
        /// Why, for the event log.
        reason: String,
    },
    /// Do not start it again; the task fails.
    Fail {
        /// Why, for the event log.
        reason: String,
    },
    /// It finished its work.
    Done,
    /// It was killed.
    Killed,
}

/// Whether a task that exits 0 runs again (Nomad's `NewRestartTracker`): the job type decides
/// first (batch and sysbatch jobs run to completion, services and system jobs run on), then the
/// lifecycle overrides it: a prestart or poststart task restarts exactly when it is a sidecar,
/// and a poststop task never does.
pub fn restarts_on_success(job_type: JobType, stage: Stage) -> bool {
    match stage {
        Stage::Main => !job_type.runs_to_completion(),
        Stage::PrestartSidecar | Stage::PoststartSidecar => true,
        Stage::PrestartEphemeral | Stage::PoststartEphemeral | Stage::Poststop => false,
    }
}

/// Counts restarts of one task against its policy.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    policy: RestartPolicy,
    restart_on_success: bool,
    /// Restarts counted in the current window.
    count: u32,
    /// When the current window began, as time since an origin the caller chose.
    window_start: Option<Duration>,
    rng: u64,
}

impl RestartTracker {
    /// A tracker for a task of `stage` in a job of `job_type`. `seed` drives the jitter.
    pub fn new(
        policy: RestartPolicy,
        job_type: JobType,
        stage: Stage,
        seed: u64,
    ) -> RestartTracker {
        let restart_on_success = restarts_on_success(job_type, stage);
        RestartTracker { policy, restart_on_success, count: 0, window_start: None, rng: seed | 1 }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &RestartPolicy {
        &self.policy
    }

    /// Decides what follows `outcome` at time `now` (any monotonic origin).
    pub fn decide(&mut self, outcome: &Outcome, now: Duration) -> Decision {
        match outcome {
            Outcome::Killed => return Decision::Killed,
            Outcome::RestartRequested { failure: false } => {
                return Decision::Restart {
                    delay: Duration::ZERO,
                    reason: "Restart requested".into(),
                };
            }
            Outcome::StartFailed { retryable: false } => {
                return Decision::Fail { reason: "Error was unrecoverable".into() };
            }
            Outcome::Exited(exit) if exit.successful() && !self.restart_on_success => {
                return Decision::Done;
            }
            _ => {}
        }
        if self.policy.attempts == 0 {
            return Decision::Fail { reason: "Policy allows no restarts".into() };
        }
        let window_start = *self.window_start.get_or_insert(now);
        if now > window_start + self.policy.interval {
            self.count = 0;
            self.window_start = Some(now);
        }
        self.count += 1;
        if self.count > self.policy.attempts {
            let window_end = self.window_start.unwrap_or(now) + self.policy.interval;
            return match self.policy.mode {
                RestartMode::Fail => Decision::Fail {
                    reason: format!(
                        "Exceeded allowed attempts {} in interval {}",
                        self.policy.attempts,
                        wharf_state::duration::Formatted(self.policy.interval)
                    ),
                },
                RestartMode::Delay => Decision::Restart {
                    delay: window_end.saturating_sub(now),
                    reason: "Exceeded allowed attempts, applying a delay".into(),
                },
            };
        }
        Decision::Restart {
            delay: self.policy.delay + self.jitter(),
            reason: "Restart within policy".into(),
        }
    }

    /// Up to 25% of the delay, in whole milliseconds: tokio's timer counts milliseconds, and
    /// the event then reads "restarting in 16.637s" rather than carrying digits no timer keeps.
    fn jitter(&mut self) -> Duration {
        // xorshift64: enough to spread restarts of many tasks apart.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let fraction = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        let jitter = self.policy.delay.mul_f64(0.25 * fraction);
        jitter - Duration::from_nanos(u64::from(jitter.subsec_nanos() % 1_000_000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Outcome::*;

    const SEC: Duration = Duration::from_secs(1);

    fn policy(attempts: u32, interval: u64, delay: u64, mode: RestartMode) -> RestartPolicy {
        RestartPolicy {
            attempts,
            interval: Duration::from_secs(interval),
            delay: Duration::from_secs(delay),
            mode,
        }
    }

    fn failed() -> Outcome {
        Exited(ExitResult::code(1))
    }

    fn ok() -> Outcome {
        Exited(ExitResult::code(0))
    }

    /// What a decision looks like without its exact jitter.
    fn shape(decision: &Decision, policy: &RestartPolicy) -> String {
        match decision {
            Decision::Restart { delay, reason } if reason == "Restart within policy" => {
                assert!(
                    *delay >= policy.delay && *delay <= policy.delay.mul_f64(1.25),
                    "jitter out of range: {delay:?}"
                );
                "restart".into()
            }
            Decision::Restart { delay, .. } => format!("restart after {}s", delay.as_secs()),
            Decision::Fail { reason } => format!("fail: {reason}"),
            Decision::Done => "done".into(),
            Decision::Killed => "killed".into(),
        }
    }

    #[test]
    fn restart_policy_matrix() {
        // (case, job type, stage, policy, [(outcome, at second, expected)])
        type Step = (Outcome, u64, &'static str);
        let service = JobType::Service;
        let batch = JobType::Batch;
        let fail2 = policy(2, 60, 5, RestartMode::Fail);
        let delay2 = policy(2, 60, 5, RestartMode::Delay);
        let cases: Vec<(&str, JobType, Stage, RestartPolicy, Vec<Step>)> = vec![
            (
                "service failures restart until attempts run out",
                service,
                Stage::Main,
                fail2,
                vec![
                    (failed(), 0, "restart"),
                    (failed(), 6, "restart"),
                    (failed(), 12, "fail: Exceeded allowed attempts 2 in interval 1m0s"),
                ],
            ),
            (
                "a service task that exits 0 is restarted too",
                service,
                Stage::Main,
                fail2,
                vec![
                    (ok(), 0, "restart"),
                    (ok(), 6, "restart"),
                    (ok(), 12, "fail: Exceeded allowed attempts 2 in interval 1m0s"),
                ],
            ),
            (
                "a batch task that exits 0 is done",
                batch,
                Stage::Main,
                fail2,
                vec![(ok(), 0, "done")],
            ),
            (
                "a batch task that fails is restarted",
                batch,
                Stage::Main,
                fail2,
                vec![(failed(), 0, "restart")],
            ),
            (
                "a successful ephemeral prestart is done",
                service,
                Stage::PrestartEphemeral,
                fail2,
                vec![(ok(), 0, "done")],
            ),
            (
                "a successful ephemeral poststart is done",
                service,
                Stage::PoststartEphemeral,
                fail2,
                vec![(ok(), 0, "done")],
            ),
            (
                "a successful poststop is done",
                service,
                Stage::Poststop,
                fail2,
                vec![(ok(), 0, "done")],
            ),
            (
                "a prestart sidecar that exits is restarted",
                service,
                Stage::PrestartSidecar,
                fail2,
                vec![(ok(), 0, "restart")],
            ),
            (
                "a failing prestart is restarted by policy",
                service,
                Stage::PrestartEphemeral,
                fail2,
                vec![(failed(), 0, "restart")],
            ),
            (
                "the window resets after the interval",
                service,
                Stage::Main,
                fail2,
                vec![
                    (failed(), 0, "restart"),
                    (failed(), 10, "restart"),
                    (failed(), 61, "restart"),
                    (failed(), 70, "restart"),
                    (failed(), 80, "fail: Exceeded allowed attempts 2 in interval 1m0s"),
                ],
            ),
            (
                "mode delay waits for the window to end",
                service,
                Stage::Main,
                delay2,
                vec![
                    (failed(), 0, "restart"),
                    (failed(), 10, "restart"),
                    (failed(), 20, "restart after 40s"),
                    (failed(), 61, "restart"),
                ],
            ),
            (
                "zero attempts fail at once",
                service,
                Stage::Main,
                policy(0, 60, 5, RestartMode::Fail),
                vec![(failed(), 0, "fail: Policy allows no restarts")],
            ),
            (
                "fatal start errors are never retried",
                service,
                Stage::Main,
                fail2,
                vec![(StartFailed { retryable: false }, 0, "fail: Error was unrecoverable")],
            ),
            (
                "retryable start errors count as attempts",
                service,
                Stage::Main,
                fail2,
                vec![
                    (StartFailed { retryable: true }, 0, "restart"),
                    (StartFailed { retryable: true }, 6, "restart"),
                    (
                        StartFailed { retryable: true },
                        12,
                        "fail: Exceeded allowed attempts 2 in interval 1m0s",
                    ),
                ],
            ),
            (
                "user restarts are immediate and do not count",
                service,
                Stage::Main,
                fail2,
                vec![
                    (RestartRequested { failure: false }, 0, "restart after 0s"),
                    (RestartRequested { failure: false }, 1, "restart after 0s"),
                    (RestartRequested { failure: false }, 2, "restart after 0s"),
                    (failed(), 3, "restart"),
                    (failed(), 9, "restart"),
                    (failed(), 15, "fail: Exceeded allowed attempts 2 in interval 1m0s"),
                ],
            ),
            (
                "a restart marked as failure counts",
                service,
                Stage::Main,
                policy(1, 60, 5, RestartMode::Fail),
                vec![
                    (RestartRequested { failure: true }, 0, "restart"),
                    (failed(), 6, "fail: Exceeded allowed attempts 1 in interval 1m0s"),
                ],
            ),
            (
                "a kill ends it whatever the policy",
                service,
                Stage::Main,
                fail2,
                vec![(Killed, 0, "killed")],
            ),
        ];
        for (case, job_type, stage, policy, steps) in cases {
            let mut tracker = RestartTracker::new(policy, job_type, stage, 42);
            for (i, (outcome, at, want)) in steps.iter().enumerate() {
                let got = shape(&tracker.decide(outcome, Duration::from_secs(*at)), &policy);
                assert_eq!(&got, want, "{case}, step {i}");
            }
        }
    }

    /// Nomad's `TestClient_RestartTracker_Lifecycle`, every case, plus the rows it leaves out
    /// (poststart, poststop, sysbatch): a successful exit restarts or ends the task, and a
    /// failure always restarts it while the policy allows.
    #[test]
    fn restart_tracker_lifecycle() {
        use JobType::*;
        use Stage::*;
        // (case, job type, stage, restarts on success)
        let cases = [
            ("system job no lifecycle", System, Main, true),
            ("service job no lifecycle", Service, Main, true),
            ("batch job no lifecycle", Batch, Main, false),
            ("sysbatch job no lifecycle", SysBatch, Main, false),
            ("system job w/ ephemeral prestart hook", System, PrestartEphemeral, false),
            ("system job w/ sidecar prestart hook", System, PrestartSidecar, true),
            ("service job w/ ephemeral prestart hook", Service, PrestartEphemeral, false),
            ("service job w/ sidecar prestart hook", Service, PrestartSidecar, true),
            ("batch job w/ ephemeral prestart hook", Batch, PrestartEphemeral, false),
            ("batch job w/ sidecar prestart hook", Batch, PrestartSidecar, true),
            ("batch job w/ ephemeral poststart hook", Batch, PoststartEphemeral, false),
            ("batch job w/ sidecar poststart hook", Batch, PoststartSidecar, true),
            ("service job w/ poststop hook", Service, Poststop, false),
            ("batch job w/ poststop hook", Batch, Poststop, false),
        ];
        let policy = policy(3, 600, 1, RestartMode::Fail);
        for (case, job_type, stage, on_success) in cases {
            let mut tracker = RestartTracker::new(policy, job_type, stage, 42);
            let after_success = shape(&tracker.decide(&ok(), Duration::ZERO), &policy);
            assert_eq!(after_success, if on_success { "restart" } else { "done" }, "{case}");
            let after_failure = shape(&tracker.decide(&failed(), SEC), &policy);
            assert_eq!(after_failure, "restart", "{case}");
        }
    }

    #[test]
    fn jitter_spreads_delays_within_a_quarter() {
        let policy = policy(1000, 100_000, 4, RestartMode::Fail);
        let mut tracker = RestartTracker::new(policy, JobType::Service, Stage::Main, 7);
        let delays: Vec<Duration> = (0..200)
            .map(|i| {
                match tracker.decide(&Outcome::Exited(ExitResult::code(1)), Duration::from_secs(i))
                {
                    Decision::Restart { delay, .. } => delay,
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        assert!(delays.iter().all(|d| *d >= 4 * SEC && *d <= 5 * SEC));
        assert!(
            delays.iter().all(|d| d.subsec_nanos().is_multiple_of(1_000_000)),
            "whole milliseconds"
        );
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter varies");
        assert!(
            delays.iter().any(|d| *d > Duration::from_millis(4750)),
            "reaches the upper part of the range"
        );
    }
}
