//! Start ordering by readiness: a task whose `wait_healthy` names other tasks of its group
//! starts only once every check of each of them passes, on top of its lifecycle gate.
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

/// A task that waited too long: who, and for which task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overdue {
    pub(crate) task: String,
    pub(crate) waited_for: String,
    pub(crate) deadline: Duration,
}

impl Overdue {
    /// The reason the allocation fails.
    pub(crate) fn reason(&self) -> String {
        format!(
            "task {:?} was not healthy within the wait_deadline of {} of task {:?}",
            self.waited_for,
            wharf_state::duration::Formatted(self.deadline),
            self.task
        )
    }
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
    /// Whether `task` (in `state`) is free to start as far as its waits go; remembers a task
    /// whose wait is over.
    pub(crate) fn may_start(&self, task: &Task, state: &TaskState, checks: &[CheckState]) -> bool {
        if task.wait_healthy.is_empty() {
            return true;
        }
        let mut ready = self.ready.lock();
        if ready.contains(&task.name) {
            return true;
        }
        let over =
            state.started_at.is_some() || first_unhealthy(&task.wait_healthy, checks).is_none();
        if over {
            tracing::debug!(task = %task.name, waited_for = ?task.wait_healthy, "wait_healthy is over");
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
                !task.wait_healthy.is_empty()
                    && !ready.contains(&task.name)
                    && state.status != TaskStatus::Dead
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
        elapsed: Duration,
    ) -> Result<Option<Duration>, Overdue> {
        let waiting = self.waiting(tasks);
        if let Some((task, deadline)) = waiting.iter().find(|(_, deadline)| elapsed >= *deadline) {
            let waited_for = first_unhealthy(&task.wait_healthy, checks)
                .unwrap_or(task.wait_healthy[0].as_str())
                .to_owned();
            return Err(Overdue { task: task.name.clone(), waited_for, deadline: *deadline });
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
        assert!(!r.may_start(&task, &state, &[]), "no checks yet");
        assert!(!r.may_start(&task, &state, &[check("db", pass)]), "cache has none");
        let half = [check("db", pass), check("cache", pass), check("cache", CheckStatus::Critical)];
        assert!(!r.may_start(&task, &state, &half));
        assert!(r.may_start(&task, &state, &[check("db", pass), check("cache", pass)]));
        assert!(r.may_start(&task, &state, &[]), "once over, the wait stays over");
        assert!(r.may_start(&Task::new("free", "mock"), &state, &[]), "nothing to wait for");
    }

    #[test]
    fn the_deadline_names_the_task_waited_for() {
        let r = Readiness::default();
        let mut task = waiter();
        task.wait_deadline = Some(Duration::from_secs(30));
        let tasks = || std::iter::once((&task, TaskState::new()));
        let checks = [check("db", CheckStatus::Passing)];
        assert_eq!(
            r.deadline(tasks(), &checks, Duration::from_secs(10)),
            Ok(Some(Duration::from_secs(20)))
        );
        let overdue = r.deadline(tasks(), &checks, Duration::from_secs(30)).unwrap_err();
        assert_eq!(overdue.waited_for, "cache");
        assert_eq!(
            overdue.reason(),
            "task \"cache\" was not healthy within the wait_deadline of 30s of task \"web\""
        );
    }
}
