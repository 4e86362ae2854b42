//! check_restart: when failing checks restart their task.
//!
//! One [`RestartWatch`] per running task holds the count of each of its checks that has a
//! check_restart policy. [`RestartWatch::observe`] takes one result and decides, as a pure
//! function of the counts, the result and the time since the task started:
//!
//! - passing (or warning, with `ignore_warnings`) resets the check's count;
//! - a failure within `grace` of the start is not counted;
//! - otherwise the count grows, and at `limit` the task is restarted, once: the watch disarms
//!   itself, so several failing checks of one task cause one restart (the task's next start
//!   brings a new watch).
//!
//! Nomad's watcher (`client/serviceregistration/watcher.go`) polls statuses and measures
//! `interval × (limit − 1)` from the first failure; wharf counts `limit` failing results in a
//! row instead. On a steady schedule the two agree; when runs are late (a slow check, a busy
//! node) a count cannot restart a task on fewer failures than the limit says.

use crate::check::CheckId;
use std::collections::BTreeMap;
use std::time::Duration;
use wharf_state::CheckStatus;
use wharf_state::service::CheckRestartPolicy;

/// A restart the watch decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartCall {
    /// The check that reached its limit.
    pub check: CheckId,
    /// How many failing results in a row it had.
    pub failures: u32,
    /// Why, for the task's event: names the check, as Nomad's does.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Counted {
    policy: CheckRestartPolicy,
    failures: u32,
}

/// The check_restart counts of one run of one task.
#[derive(Debug, Clone)]
pub struct RestartWatch {
    checks: BTreeMap<CheckId, Counted>,
    armed: bool,
}

impl RestartWatch {
    /// A watch over the checks with a policy; checks without one are never counted.
    pub fn new(policies: impl IntoIterator<Item = (CheckId, CheckRestartPolicy)>) -> RestartWatch {
        let checks: BTreeMap<CheckId, Counted> = policies
            .into_iter()
            .map(|(check, policy)| (check, Counted { policy, failures: 0 }))
            .collect();
        RestartWatch { armed: !checks.is_empty(), checks }
    }

    /// Whether any check can still restart the task.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Takes `status`, the latest result of `check`, `since_start` after the task started.
    /// Returns the restart to make, at most once per watch.
    pub fn observe(
        &mut self,
        check: &CheckId,
        status: CheckStatus,
        since_start: Duration,
    ) -> Option<RestartCall> {
        if !self.armed {
            return None;
        }
        let counted = self.checks.get_mut(check)?;
        let failing = match status {
            CheckStatus::Pending => return None,
            CheckStatus::Passing => false,
            CheckStatus::Warning => !counted.policy.ignore_warnings,
            CheckStatus::Critical => true,
        };
        if !failing {
            counted.failures = 0;
            return None;
        }
        if since_start < counted.policy.grace {
            return None;
        }
        counted.failures += 1;
        if counted.failures < counted.policy.limit {
            return None;
        }
        self.armed = false;
        Some(RestartCall {
            check: check.clone(),
            failures: counted.failures,
            reason: format!("healthcheck: check {:?} unhealthy", check.check),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CheckStatus::*;

    fn policy(limit: u32, grace_secs: u64, ignore_warnings: bool) -> CheckRestartPolicy {
        CheckRestartPolicy { limit, grace: Duration::from_secs(grace_secs), ignore_warnings }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn id(check: &str) -> CheckId {
        CheckId { task: "t".into(), service: "s".into(), check: check.into() }
    }

    fn watching(policies: &[(&str, CheckRestartPolicy)]) -> RestartWatch {
        RestartWatch::new(policies.iter().map(|(check, policy)| (id(check), *policy)))
    }

    /// Feeds `results` (check, status, seconds since start) and returns the indexes of the
    /// results that caused a restart.
    fn restarts_at(watch: &mut RestartWatch, results: &[(&str, CheckStatus, u64)]) -> Vec<usize> {
        results
            .iter()
            .enumerate()
            .filter_map(|(i, (check, status, at))| {
                watch.observe(&id(check), *status, secs(*at)).map(|_| i)
            })
            .collect()
    }

    /// Nomad's `TestCheckWatcher_SkipUnwatched`: a check without a policy is never counted.
    #[test]
    fn skip_unwatched() {
        let mut watch = watching(&[]);
        assert!(!watch.armed());
        assert_eq!(restarts_at(&mut watch, &[("c", Critical, 100); 10]), Vec::<usize>::new());
        let mut watch = watching(&[("other", policy(1, 0, false))]);
        assert_eq!(restarts_at(&mut watch, &[("c", Critical, 100); 10]), Vec::<usize>::new());
    }

    /// Nomad's `TestCheckWatcher_Healthy`: passing checks never restart, whatever the limit.
    #[test]
    fn healthy() {
        let mut watch = watching(&[("c1", policy(3, 1, false)), ("c2", policy(1, 0, false))]);
        let results: Vec<(&str, CheckStatus, u64)> =
            (0..20).flat_map(|t| [("c1", Passing, t), ("c2", Passing, t)]).collect();
        assert_eq!(restarts_at(&mut watch, &results), Vec::<usize>::new());
        assert!(watch.armed());
    }

    /// Nomad's `TestCheckWatcher_Unhealthy`: a check that always fails restarts its task
    /// exactly once, at the limit, with a reason that names it.
    #[test]
    fn unhealthy() {
        let mut watch = watching(&[("testcheck", policy(3, 0, false))]);
        let results: Vec<(&str, CheckStatus, u64)> =
            (1..=10).map(|t| ("testcheck", Critical, t)).collect();
        assert_eq!(restarts_at(&mut watch, &results), [2]);
        assert!(!watch.armed());
        let mut watch = watching(&[("testcheck", policy(1, 0, false))]);
        assert_eq!(
            watch.observe(&id("testcheck"), Critical, secs(1)),
            Some(RestartCall {
                check: id("testcheck"),
                failures: 1,
                reason: "healthcheck: check \"testcheck\" unhealthy".into()
            })
        );
    }

    /// Nomad's `TestCheckWatcher_HealthyWarning`: warnings with ignore_warnings never restart;
    /// without it they count as failures.
    #[test]
    fn healthy_warning() {
        let mut ignoring = watching(&[("c", policy(1, 0, true))]);
        assert_eq!(restarts_at(&mut ignoring, &[("c", Warning, 5); 5]), Vec::<usize>::new());
        let mut counting = watching(&[("c", policy(2, 0, false))]);
        assert_eq!(restarts_at(&mut counting, &[("c", Warning, 5); 5]), [1]);
    }

    /// Nomad's `TestCheckWatcher_Flapping`: a check that passes before reaching its limit
    /// starts counting again.
    #[test]
    fn flapping() {
        let mut watch = watching(&[("c", policy(3, 0, false))]);
        let results = [
            ("c", Passing, 0),
            ("c", Critical, 1),
            ("c", Critical, 2),
            ("c", Passing, 3),
            ("c", Critical, 4),
            ("c", Critical, 5),
            ("c", Passing, 6),
            ("c", Critical, 7),
        ];
        assert_eq!(restarts_at(&mut watch, &results), Vec::<usize>::new());
    }

    /// Failures within grace of the start are not counted (Nomad's `graceUntil`).
    #[test]
    fn failures_within_grace_do_not_count() {
        let mut watch = watching(&[("c", policy(2, 10, false))]);
        let results: Vec<(&str, CheckStatus, u64)> = (0..14).map(|t| ("c", Critical, t)).collect();
        // Counted from t=10: the second counted failure, at t=11, restarts.
        assert_eq!(restarts_at(&mut watch, &results), [11]);
    }

    /// Nomad's `TestCheckWatcher_MultipleChecks`: several failing checks of one task restart it
    /// once; a passing check of the same task never does.
    #[test]
    fn multiple_checks() {
        let mut watch = watching(&[
            ("c1", policy(1, 0, false)),
            ("c2", policy(1, 0, false)),
            ("c3", policy(1, 0, false)),
        ]);
        let results =
            [("c1", Critical, 1), ("c2", Critical, 1), ("c3", Passing, 1), ("c2", Critical, 2)];
        assert_eq!(restarts_at(&mut watch, &results), [0]);
    }

    /// Pending (no result yet) is neither a failure nor a pass.
    #[test]
    fn pending_changes_nothing() {
        let mut watch = watching(&[("c", policy(2, 0, false))]);
        let results = [("c", Critical, 1), ("c", Pending, 2), ("c", Critical, 3)];
        assert_eq!(restarts_at(&mut watch, &results), [2]);
    }
}
