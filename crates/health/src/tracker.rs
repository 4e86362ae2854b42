//! Allocation health: whether an allocation became healthy, as Nomad's alloc health tracker
//! decides it (`client/allochealth/tracker.go`), as a pure function of what the allocation
//! looks like and the time.
//!
//! [`HealthTracker::observe`] takes a [`Snapshot`] (task states, check statuses, whether the
//! allocation is stopped or failed) and the time since watching began, and says: judged
//! ([`Verdict`]), stopped (no health is set), or still waiting, with the next moment at which
//! time alone could change the answer. The caller (the alloc runner's health hook) calls it on
//! every change and at that moment. The rules:
//!
//! - A task that failed, or died (other than a prestart task that ran to completion, a
//!   poststart task that succeeded, or a poststop task), makes the allocation unhealthy at
//!   once; so does the allocation failing.
//! - Tasks are healthy once every one of them runs (poststop tasks do not count; prestart
//!   and poststart tasks that completed do) and has run for `min_healthy_time` with no
//!   restart in between.
//! - With `health_check = "checks"`, every check must also pass, continuously for
//!   `min_healthy_time`, counted from when every task ran and every check passed. A check
//!   that has not run yet does not pass. A check's `on_update` says what passing is:
//!   `require_healthy` passes only when passing, `ignore_warnings` also when warning, and
//!   `ignore` does not count at all (Nomad's readiness checks). With `"task_states"`, checks do
//!   not count.
//! - Not healthy by `healthy_deadline`: unhealthy, with a reason per task (Nomad's
//!   "Task not running by healthy_deadline of 5m0s", "Services not healthy by deadline: web").
//! - Once judged, the verdict never changes.
//!
//! Where wharf differs from Nomad on purpose: checks are not polled every 500 ms but looked
//! at on every change of status, so `min_healthy_time` is measured from the moment the last
//! check passed rather than from the next poll.

use crate::check::CheckId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use wharf_state::duration::Formatted;
use wharf_state::service::{HealthCheck, OnUpdate, UpdateStrategy};
use wharf_state::spec::Stage;
use wharf_state::{CheckStatus, TaskState, TaskStatus};

/// One task as the tracker sees it.
#[derive(Debug, Clone, Copy)]
pub struct TaskView<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its place in the lifecycle.
    pub stage: Stage,
    /// Its state.
    pub state: &'a TaskState,
}

/// One check as the tracker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckView {
    /// Which check.
    pub id: CheckId,
    /// Its latest status, pending until it has run.
    pub status: CheckStatus,
    /// How it counts towards health.
    pub on_update: OnUpdate,
}

impl CheckView {
    /// A check that must pass (`on_update = "require_healthy"`).
    pub fn new(id: CheckId, status: CheckStatus) -> CheckView {
        CheckView { id, status, on_update: OnUpdate::RequireHealthy }
    }

    /// Whether it lets the allocation be healthy; None if it does not count.
    fn passes(&self) -> Option<bool> {
        self.on_update.passes(self.status)
    }
}

/// The allocation as the tracker sees it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot<'a> {
    /// It is being stopped: its health will not be set.
    pub stopping: bool,
    /// It failed as a whole (not only through a task).
    pub failed: bool,
    /// Its tasks.
    pub tasks: Vec<TaskView<'a>>,
    /// Every check of its group.
    pub checks: Vec<CheckView>,
}

/// The tracker's answer, once given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Healthy.
    Healthy,
    /// Unhealthy.
    Unhealthy {
        /// Why, in one line.
        reason: String,
        /// What each task contributed, for its event log, when the deadline passed (empty when
        /// a task failed or died, which its own events already say).
        task_events: BTreeMap<String, String>,
    },
}

/// What [`HealthTracker::observe`] concludes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The allocation is judged.
    Judged(Verdict),
    /// The allocation is stopping: no health is set, and watching can end.
    Stopped,
    /// Not yet; look again on a change, or at `wake_at` (time since watching began).
    Waiting {
        /// The next moment at which time alone could change the answer.
        wake_at: Duration,
    },
}

/// Decides one allocation's health.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    strategy: UpdateStrategy,
    /// The restart counts of the tasks when they were all seen running.
    running_as: Option<Vec<u64>>,
    /// Since when every task has run (no restart since).
    tasks_since: Option<Duration>,
    /// Since when every check has passed, with every task running.
    checks_since: Option<Duration>,
    verdict: Option<Verdict>,
}

impl HealthTracker {
    /// A tracker for `strategy`, watching from time zero.
    pub fn new(strategy: UpdateStrategy) -> HealthTracker {
        HealthTracker {
            strategy,
            running_as: None,
            tasks_since: None,
            checks_since: None,
            verdict: None,
        }
    }

    /// Looks at the allocation `now` after watching began.
    pub fn observe(&mut self, snapshot: &Snapshot<'_>, now: Duration) -> Progress {
        if let Some(verdict) = &self.verdict {
            return Progress::Judged(verdict.clone());
        }
        if snapshot.stopping {
            return Progress::Stopped;
        }
        if let Some(verdict) = terminal(snapshot) {
            return self.judge(verdict);
        }
        let counted = || snapshot.tasks.iter().filter(|t| counts(t));
        let all_running = counted().all(|t| {
            t.state.status == TaskStatus::Running
                || (t.stage == Stage::PrestartEphemeral && t.state.successful())
        });
        if all_running {
            let restarts: Vec<u64> = counted().map(|t| t.state.restarts).collect();
            if self.running_as.as_ref() != Some(&restarts) {
                self.running_as = Some(restarts);
                self.tasks_since = Some(now);
                self.checks_since = None;
            }
        } else {
            self.running_as = None;
            self.tasks_since = None;
            self.checks_since = None;
        }
        let min = self.strategy.min_healthy_time;
        let use_checks = self.strategy.health_check == HealthCheck::Checks
            && snapshot.checks.iter().any(|c| c.passes().is_some());
        let tasks_ok = self.tasks_since.is_some_and(|since| now >= since + min);
        let checks_ok = if use_checks {
            let passing = snapshot.checks.iter().all(|c| c.passes() != Some(false));
            if !passing || self.tasks_since.is_none() {
                self.checks_since = None;
            } else if self.checks_since.is_none() {
                self.checks_since = Some(now);
            }
            self.checks_since.is_some_and(|since| now >= since + min)
        } else {
            true
        };
        if tasks_ok && checks_ok {
            return self.judge(Verdict::Healthy);
        }
        let deadline = self.strategy.healthy_deadline;
        if now >= deadline {
            let verdict = self.at_deadline(snapshot, use_checks, tasks_ok);
            return self.judge(verdict);
        }
        // Healthy next when the last of the two waits ends: with checks, that of the checks
        // (counted only once every task runs, so never before that of the tasks).
        let healthy_at = if use_checks { self.checks_since } else { self.tasks_since };
        let wake_at = healthy_at.map_or(deadline, |since| (since + min).min(deadline));
        Progress::Waiting { wake_at }
    }

    fn judge(&mut self, verdict: Verdict) -> Progress {
        self.verdict = Some(verdict.clone());
        Progress::Judged(verdict)
    }

    /// Why the allocation is not healthy at its deadline, task by task (Nomad's
    /// `taskHealthState.event`).
    fn at_deadline(&self, snapshot: &Snapshot<'_>, use_checks: bool, tasks_ok: bool) -> Verdict {
        let deadline = Formatted(self.strategy.healthy_deadline);
        let min = Formatted(self.strategy.min_healthy_time);
        let mut task_events = BTreeMap::new();
        for task in snapshot.tasks.iter().filter(|t| counts(t)) {
            let failing: BTreeSet<&str> = snapshot
                .checks
                .iter()
                .filter(|c| c.id.task == task.name && c.passes() == Some(false))
                .map(|c| c.id.service.as_str())
                .collect();
            let message = match task.state.status {
                TaskStatus::Pending => {
                    format!("Task not running by healthy_deadline of {deadline}")
                }
                TaskStatus::Running if !tasks_ok => format!(
                    "Task not running for min_healthy_time of {min} by healthy_deadline of {deadline}"
                ),
                _ if use_checks && !failing.is_empty() => format!(
                    "Services not healthy by deadline: {}",
                    failing.into_iter().collect::<Vec<_>>().join(", ")
                ),
                _ => continue,
            };
            task_events.insert(task.name.to_owned(), message);
        }
        let mut reason = format!("not healthy by its healthy_deadline of {deadline}");
        if task_events.is_empty() {
            reason.push_str(&format!(": its checks did not pass for min_healthy_time of {min}"));
        }
        for (task, message) in &task_events {
            reason.push_str(&format!("; task {task:?}: {message}"));
        }
        Verdict::Unhealthy { reason, task_events }
    }
}

/// Whether `task` takes part in health: poststop tasks never do, a poststart task that
/// completed no longer does.
fn counts(task: &TaskView<'_>) -> bool {
    match task.stage {
        Stage::Poststop => false,
        Stage::PoststartEphemeral => !task.state.successful(),
        _ => true,
    }
}

/// The verdict if a task or the allocation has already failed for good.
fn terminal(snapshot: &Snapshot<'_>) -> Option<Verdict> {
    for task in snapshot.tasks.iter().filter(|t| counts(t)) {
        let message = if task.state.failed {
            "Unhealthy because of failed task"
        } else if task.state.status == TaskStatus::Dead && task.stage != Stage::PrestartEphemeral {
            "Unhealthy because of dead task"
        } else {
            continue;
        };
        // The task's own events already say what happened to it.
        let reason = format!("task {:?}: {message}", task.name);
        return Some(Verdict::Unhealthy { reason, task_events: BTreeMap::new() });
    }
    snapshot.failed.then(|| Verdict::Unhealthy {
        reason: "the allocation failed".into(),
        task_events: BTreeMap::new(),
    })
}
