//! Start ordering by readiness: a task whose `wait_healthy` names other tasks of its group
//! starts only once every check of each of them passes, and one whose `wait_ready` names
//! others only once each of them has said `READY=1` on its notify socket (their state's
//! `ready_at`, which the task runner records and persists), on top of its lifecycle gate.
//!
//! Once a task's wait is over it stays over (it was started; a later failing check does not
//! hold back its restarts), and a task restored after an agent restart that had started
//! before is not held again. A task still waiting when its `wait_deadline` (counted from the
//! start of the run) has passed fails, which fails the allocation, with the reason naming the
//! task it waited for. The alloc runner asks [`Readiness::may_start`] when it applies the
//! lifecycle gates, and runs [`Readiness::deadline`] beside the run.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::time::Duration;
use wharf_state::readiness::DEFAULT_WAIT_DEADLINE;
use wharf_state::spec::Task;
use wharf_state::{CheckState, CheckStatus, TaskState, TaskStatus};

/// Which tasks are done waiting.
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    ready: Mutex<HashSet<String>>,
}

/// A task that waited too long: who, for which task, and for what of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overdue {
    pub(crate) task: String,
    pub(crate) waited_for: String,
    pub(crate) deadline: Duration,
    /// It waited for the task's `READY=1`, not its checks.
    pub(crate) for_ready: bool,
}

impl Overdue {
    /// The reason the allocation fails.
    pub(crate) fn reason(&self) -> String {
        let what = if self.for_ready { "did not say READY=1" } else { "was not healthy" };
        format!(
            "task {:?} {what} within the wait_deadline of {} of task {:?}",
            self.waited_for,
            wharf_state::duration::Formatted(self.deadline),
            self.task
        )
    }
}

/// The tasks of the group that have said `READY=1`, from their states.
pub(crate) fn notified_ready<'a>(
    states: impl Iterator<Item = (&'a str, &'a TaskState)>,
) -> HashSet<String> {
    states.filter(|(_, state)| state.ready_at.is_some()).map(|(name, _)| name.to_owned()).collect()
}

/// The first task of `waits` not in `ready`.
fn first_unready<'a>(waits: &'a [String], ready: &HashSet<String>) -> Option<&'a str> {
    waits.iter().map(String::as_str).find(|name| !ready.contains(*name))
}

/// Whether `task` waits for anything.
fn waits(task: &Task) -> bool {
    !task.wait_healthy.is_empty() || !task.wait_ready.is_empty()
}

/// The first task of `waits` that is not healthy: one whose checks have not all passed (or
/// that has none running).
fn first_unhealthy<'a>(waits: &'a [String], checks: &[CheckState]) -> Option<&'a str> {
    waits.iter().map(String::as_str).find(|name| {
        let mut of_task = checks.iter().filter(|c| c.task == *name).peekable();
        of_task.peek().is_none() || !of_task.all(|c| c.status == CheckStatus::Passing)
    })
}

impl Readiness {
    /// Whether `task` (in `state`) is free to start as far as its waits go, given the checks
    /// and the tasks that said `READY=1` (`notified`); remembers a task whose wait is over.
    pub(crate) fn may_start(
        &self,
        task: &Task,
        state: &TaskState,
        checks: &[CheckState],
        notified: &HashSet<String>,
    ) -> bool {
        if !waits(task) {
            return true;
        }
        let mut ready = self.ready.lock();
        if ready.contains(&task.name) {
            return true;
        }
        let over = state.started_at.is_some()
            || (first_unhealthy(&task.wait_healthy, checks).is_none()
                && first_unready(&task.wait_ready, notified).is_none());
        if over {
            tracing::debug!(task = %task.name, waited_for = ?task.wait_healthy, waited_ready = ?task.wait_ready, "the wait is over");
            ready.insert(task.name.clone());
        }
        over
    }

    /// The tasks still waiting, each with how long it may wait in all.
    fn waiting<'a>(
        &self,
        tasks: impl Iterator<Item = (&'a Task, TaskState)>,
    ) -> Vec<(&'a Task, Duration)> {
        let ready = self.ready.lock();
        tasks
            .filter(|(task, state)| {
                waits(task) && !ready.contains(&task.name) && state.status != TaskStatus::Dead
            })
            .map(|(task, _)| (task, task.wait_deadline.unwrap_or(DEFAULT_WAIT_DEADLINE)))
            .collect()
    }

    /// After `elapsed` of the run: the first waiting task whose deadline has passed, or how
    /// long until the next deadline (None: nobody waits).
    pub(crate) fn deadline<'a>(
        &self,
        tasks: impl Iterator<Item = (&'a Task, TaskState)>,
        checks: &[CheckState],
        notified: &HashSet<String>,
        elapsed: Duration,
    ) -> Result<Option<Duration>, Overdue> {
        let waiting = self.waiting(tasks);
        if let Some((task, deadline)) = waiting.iter().find(|(_, deadline)| elapsed >= *deadline) {
            let unhealthy = first_unhealthy(&task.wait_healthy, checks);
            let unready = first_unready(&task.wait_ready, notified);
            let (waited_for, for_ready) = match (unhealthy, unready) {
                (Some(name), _) => (name, false),
                (None, Some(name)) => (name, true),
                // Everything it waits for is there: its gate opens with the next look.
                (None, None) => match task.wait_healthy.first() {
                    Some(name) => (name.as_str(), false),
                    None => (task.wait_ready[0].as_str(), true),
                },
            };
            return Err(Overdue {
                task: task.name.clone(),
                waited_for: waited_for.to_owned(),
                deadline: *deadline,
                for_ready,
            });
        }
        Ok(waiting.iter().map(|(_, deadline)| *deadline - elapsed).min())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_state::CheckKind;

    fn check(task: &str, status: CheckStatus) -> CheckState {
        CheckState {
            task: task.into(),
            service: format!("{task}-svc"),
            check: "up".into(),
            kind: CheckKind::Script,
            status,
            last: None,
        }
    }

    fn waiter() -> Task {
        let mut task = Task::new("web", "mock");
        task.wait_healthy = vec!["db".into(), "cache".into()];
        task
    }

    #[test]
    fn every_check_of_every_named_task_must_pass() {
        let r = Readiness::default();
        let task = waiter();
        let state = TaskState::new();
        let pass = CheckStatus::Passing;
        let none = HashSet::new();
        assert!(!r.may_start(&task, &state, &[], &none), "no checks yet");
        assert!(!r.may_start(&task, &state, &[check("db", pass)], &none), "cache has none");
        let half = [check("db", pass), check("cache", pass), check("cache", CheckStatus::Critical)];
        assert!(!r.may_start(&task, &state, &half, &none));
        assert!(r.may_start(&task, &state, &[check("db", pass), check("cache", pass)], &none));
        assert!(r.may_start(&task, &state, &[], &none), "once over, the wait stays over");
        assert!(r.may_start(&Task::new("free", "mock"), &state, &[], &none), "nothing to wait for");
    }

    #[test]
    fn the_deadline_names_the_task_waited_for() {
        let r = Readiness::default();
        let mut task = waiter();
        task.wait_deadline = Some(Duration::from_secs(30));
        let tasks = || std::iter::once((&task, TaskState::new()));
        let checks = [check("db", CheckStatus::Passing)];
        let none = HashSet::new();
        assert_eq!(
            r.deadline(tasks(), &checks, &none, Duration::from_secs(10)),
            Ok(Some(Duration::from_secs(20)))
        );
        let overdue = r.deadline(tasks(), &checks, &none, Duration::from_secs(30)).unwrap_err();
        assert_eq!(overdue.waited_for, "cache");
        assert_eq!(
            overdue.reason(),
            "task \"cache\" was not healthy within the wait_deadline of 30s of task \"web\""
        );
    }

    fn ready_waiter() -> Task {
        let mut task = Task::new("web", "mock");
        task.wait_ready = vec!["db".into()];
        task.wait_healthy = vec!["cache".into()];
        task
    }

    #[test]
    fn a_ready_wait_needs_the_named_tasks_ready_and_the_checks_too() {
        let r = Readiness::default();
        let task = ready_waiter();
        let state = TaskState::new();
        let healthy = [check("cache", CheckStatus::Passing)];
        let mut db = TaskState::new();
        let notified = |db: &TaskState| notified_ready(std::iter::once(("db", db)));
        assert!(!r.may_start(&task, &state, &healthy, &notified(&db)), "db has not said it");
        db.ready_at = Some(wharf_state::Timestamp(5));
        assert!(!r.may_start(&task, &state, &[], &notified(&db)), "cache is not healthy");
        assert!(r.may_start(&task, &state, &healthy, &notified(&db)));
    }

    #[test]
    fn the_deadline_names_the_task_that_did_not_say_ready() {
        let r = Readiness::default();
        let mut task = ready_waiter();
        task.wait_deadline = Some(Duration::from_secs(30));
        let tasks = || std::iter::once((&task, TaskState::new()));
        let checks = [check("cache", CheckStatus::Passing)];
        let overdue =
            r.deadline(tasks(), &checks, &HashSet::new(), Duration::from_secs(30)).unwrap_err();
        assert_eq!(
            overdue.reason(),
            "task \"db\" did not say READY=1 within the wait_deadline of 30s of task \"web\""
        );
    }
}
