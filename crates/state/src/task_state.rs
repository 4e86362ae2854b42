//! The state of one task and the events that explain it.
//!
//! [`TaskState`] is what the task runner persists on every change and what users read. Its
//! transitions are checked by [`TaskState::set_status`]; its event history is a ring of the
//! latest [`MAX_TASK_EVENTS`] events, so a task that restarts forever does not grow it.

use crate::duration::Formatted;
use crate::signal::Signal;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

/// How many events a task keeps, newest last (Nomad keeps 10).
pub const MAX_TASK_EVENTS: usize = 10;

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Not started yet, or waiting to be restarted.
    Pending,
    /// The driver reports it running.
    Running,
    /// It will not run again unless the allocation is restarted.
    Dead,
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Dead => "dead",
        })
    }
}

/// A task's state as persisted and reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// Pending, running or dead.
    pub status: TaskStatus,
    /// Set by an event that fails the task; a failed dead task fails its allocation.
    pub failed: bool,
    /// How many times it was restarted.
    pub restarts: u64,
    /// When it was last restarted.
    pub last_restart: Option<Timestamp>,
    /// When it first started running.
    pub started_at: Option<Timestamp>,
    /// When it died.
    pub finished_at: Option<Timestamp>,
    /// When it first said `READY=1` on its notify socket (`notify_socket`); kept across
    /// restarts of the task and of the agent, so a task waiting on it is not held again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Timestamp>,
    /// The latest events, oldest first.
    pub events: VecDeque<TaskEvent>,
}

/// A status change [`TaskState::set_status`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a task cannot go from {from} to {to}")]
pub struct InvalidTransition {
    /// The status it had.
    pub from: TaskStatus,
    /// The status asked for.
    pub to: TaskStatus,
}

impl Default for TaskState {
    fn default() -> Self {
        TaskState::new()
    }
}

impl TaskState {
    /// A task that has not started.
    pub fn new() -> TaskState {
        TaskState {
            status: TaskStatus::Pending,
            failed: false,
            restarts: 0,
            last_restart: None,
            started_at: None,
            finished_at: None,
            ready_at: None,
            events: VecDeque::new(),
        }
    }

    /// Dead without having failed.
    pub fn successful(&self) -> bool {
        self.status == TaskStatus::Dead && !self.failed
    }

    /// Moves to `to` at time `at`. Entering running sets `started_at` the first time; entering
    /// dead sets `finished_at`. Running to pending is a restart; dead to pending is a restart
    /// of the whole allocation. A dead task never goes straight back to running.
    pub fn set_status(&mut self, to: TaskStatus, at: Timestamp) -> Result<(), InvalidTransition> {
        use TaskStatus::*;
        match (self.status, to) {
            (from, to) if from == to => return Ok(()),
            (Pending, Running) | (Pending, Dead) | (Running, Pending) | (Running, Dead) => {}
            (Dead, Pending) => {
                self.failed = false;
                self.finished_at = None;
            }
            (from, to) => return Err(InvalidTransition { from, to }),
        }
        match to {
            Running if self.started_at.is_none() => self.started_at = Some(at),
            Dead => self.finished_at = Some(at),
            _ => {}
        }
        self.status = to;
        Ok(())
    }

    /// Records an event: an event that fails the task sets `failed`, a restart counts.
    pub fn append_event(&mut self, event: TaskEvent) {
        if event.fails_task {
            self.failed = true;
        }
        if let TaskEventKind::Restarting { .. } = event.kind {
            self.restarts += 1;
            self.last_restart = Some(event.time);
        }
        if self.events.len() == MAX_TASK_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }
}

/// Something that happened to a task, with when and whether it fails the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// When it happened.
    pub time: Timestamp,
    /// What happened.
    #[serde(flatten)]
    pub kind: TaskEventKind,
    /// Whether this event marks the task failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fails_task: bool,
}

impl TaskEvent {
    /// An event of `kind` at `time`; it fails the task when the kind always does.
    pub fn new(time: Timestamp, kind: TaskEventKind) -> TaskEvent {
        let fails_task = kind.always_fails_task();
        TaskEvent { time, kind, fails_task }
    }

    /// The same event, marked as failing the task.
    pub fn failing(mut self) -> TaskEvent {
        self.fails_task = true;
        self
    }
}

/// The kinds of task event, each with the details it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TaskEventKind {
    /// The node accepted the task.
    Received,
    /// The task's directory and environment are being built.
    Setup {
        /// What is being done.
        message: String,
    },
    /// Building the task's directory or environment failed; the task cannot run.
    SetupFailure {
        /// Why.
        error: String,
    },
    /// The driver rejected the task's configuration; retrying would not help.
    FailedValidation {
        /// Why.
        error: String,
    },
    /// The driver failed to start the task.
    DriverFailure {
        /// Why.
        error: String,
    },
    /// The driver started the task.
    Started,
    /// After an agent restart, the task was found still running and reattached.
    Reattached,
    /// The task exited.
    Terminated {
        /// Its exit code.
        exit_code: i32,
        /// The signal that ended it, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// Whether the kernel killed it for using too much memory.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        oom_killed: bool,
        /// What the driver added, if anything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The task will be started again after `delay`.
    Restarting {
        /// The wait before the restart.
        #[serde(with = "crate::duration::serde_str")]
        delay: Duration,
        /// Why it restarts.
        reason: String,
    },
    /// The task will not be started again.
    NotRestarting {
        /// Why.
        reason: String,
    },
    /// A user or a hook asked for a restart.
    RestartSignaled {
        /// Why.
        reason: String,
    },
    /// A signal is being sent to the task.
    Signaling {
        /// Which one.
        signal: Signal,
        /// Why.
        reason: String,
    },
    /// The stop signal was sent; the task is killed for good after the timeout.
    Killing {
        /// The signal sent.
        signal: Signal,
        /// The grace period before the force kill.
        #[serde(with = "crate::duration::serde_str")]
        kill_timeout: Duration,
    },
    /// The task was killed.
    Killed {
        /// Set when killing did not go cleanly, such as a driver that never answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Another task of the allocation failed, so this one is killed.
    SiblingFailed {
        /// The task that failed.
        task: String,
    },
    /// The leader task died, so this one is killed.
    LeaderDead,
    /// Only sidecars were left, so this one is killed.
    MainTasksDead,
    /// A message from the driver, such as download progress.
    DriverMessage {
        /// The text.
        message: String,
        /// Driver-specific details.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        annotations: BTreeMap<String, String>,
    },
    /// A task hook failed.
    HookFailed {
        /// The hook's name.
        hook: String,
        /// Why.
        error: String,
    },
    /// A task hook reported progress.
    HookMessage {
        /// The hook's name.
        hook: String,
        /// The text.
        message: String,
    },
    /// After an agent restart, the task could not be reattached.
    FailedRestoring {
        /// Why.
        error: String,
    },
    /// The allocation was judged unhealthy, and this task is part of why.
    AllocUnhealthy {
        /// What about this task made it unhealthy.
        message: String,
    },
    /// A template could not be rendered, waits for data, or acted on a change.
    Template {
        /// What happened.
        message: String,
    },
    /// The allocation ran as long as its group's `max_run_duration` allows, so this task is
    /// killed.
    MaxRunDurationExceeded {
        /// The limit.
        #[serde(with = "crate::duration::serde_str")]
        max_run_duration: Duration,
    },
    /// The task's services left the catalog; it is sent its kill signal after the delay.
    WaitingShutdownDelay {
        /// The delay.
        #[serde(with = "crate::duration::serde_str")]
        delay: Duration,
    },
    /// An artifact could not be fetched, checked or unpacked; the task does not start.
    ArtifactDownloadFailed {
        /// Why.
        error: String,
    },
}

impl TaskEventKind {
    /// Kinds that mean the task cannot succeed, whoever emits them.
    fn always_fails_task(&self) -> bool {
        matches!(self, TaskEventKind::SetupFailure { .. } | TaskEventKind::FailedValidation { .. })
    }

    /// The kind's name as users see it, such as `"Sibling Task Failed"`.
    pub fn title(&self) -> &'static str {
        use TaskEventKind::*;
        match self {
            Received => "Received",
            Setup { .. } => "Task Setup",
            SetupFailure { .. } => "Setup Failure",
            FailedValidation { .. } => "Failed Validation",
            DriverFailure { .. } => "Driver Failure",
            Started => "Started",
            Reattached => "Reattached",
            // The kernel's memory limit ended it: what a user looks for first.
            Terminated { oom_killed: true, .. } => "OOM Killed",
            Terminated { .. } => "Terminated",
            Restarting { .. } => "Restarting",
            NotRestarting { .. } => "Not Restarting",
            RestartSignaled { .. } => "Restart Signaled",
            Signaling { .. } => "Signaling",
            Killing { .. } => "Killing",
            Killed { .. } => "Killed",
            SiblingFailed { .. } => "Sibling Task Failed",
            LeaderDead => "Leader Task Dead",
            MainTasksDead => "Main Tasks Dead",
            DriverMessage { .. } => "Driver",
            HookFailed { .. } => "Task Hook Failed",
            HookMessage { .. } => "Task Hook Message",
            FailedRestoring { .. } => "Failed Restoring Task",
            AllocUnhealthy { .. } => "Alloc Unhealthy",
            Template { .. } => "Template",
            MaxRunDurationExceeded { .. } => "Max Run Duration Exceeded",
            WaitingShutdownDelay { .. } => "Waiting for shutdown delay",
            ArtifactDownloadFailed { .. } => "Failed Artifact Download",
        }
    }
}

impl fmt::Display for TaskEventKind {
    /// A one-line description for people, such as `Exit Code: 1, Signal: 9`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TaskEventKind::*;
        match self {
            Received => f.write_str("Task received by node"),
            Setup { message } => f.write_str(message),
            SetupFailure { error }
            | FailedValidation { error }
            | DriverFailure { error }
            | FailedRestoring { error } => f.write_str(error),
            Started => f.write_str("Task started by node"),
            Reattached => f.write_str("Task still running after the agent restarted; reattached"),
            Terminated { exit_code, signal, oom_killed, message } => {
                write!(f, "Exit Code: {exit_code}")?;
                if let Some(signal) = signal {
                    write!(f, ", Signal: {signal}")?;
                }
                if *oom_killed {
                    f.write_str(", OOM Killed: true")?;
                }
                if let Some(message) = message {
                    write!(f, ", Exit Message: {message}")?;
                }
                Ok(())
            }
            Restarting { delay, reason } => {
                write!(f, "{reason}; restarting in {}", Formatted(*delay))
            }
            NotRestarting { reason } | RestartSignaled { reason } => f.write_str(reason),
            Signaling { signal, reason } => write!(f, "Sending {signal}: {reason}"),
            Killing { signal, kill_timeout } => write!(
                f,
                "Sent {}. Waiting {} before force killing",
                signal.description(),
                Formatted(*kill_timeout)
            ),
            Killed { error: None } => f.write_str("Task successfully killed"),
            Killed { error: Some(error) } => write!(f, "Task killed with an error: {error}"),
            SiblingFailed { task } => write!(f, "Task's sibling {task:?} failed"),
            LeaderDead => f.write_str("Leader task in the group is dead"),
            MainTasksDead => f.write_str("Main tasks in the group died"),
            DriverMessage { message, .. } => f.write_str(message),
            HookFailed { hook, error } => write!(f, "Hook {hook:?} failed: {error}"),
            HookMessage { hook, message } => write!(f, "Hook {hook:?}: {message}"),
            AllocUnhealthy { message } => f.write_str(message),
            Template { message } => f.write_str(message),
            MaxRunDurationExceeded { max_run_duration } => write!(
                f,
                "allocation exceeded max_run_duration of {}",
                Formatted(*max_run_duration)
            ),
            WaitingShutdownDelay { delay } => {
                write!(
                    f,
                    "Waiting for shutdown_delay of {} before killing the task",
                    Formatted(*delay)
                )
            }
            ArtifactDownloadFailed { error } => f.write_str(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskStatus::*;

    #[test]
    fn transitions_table() {
        // (from, to, allowed)
        let table = [
            (Pending, Pending, true),
            (Pending, Running, true),
            (Pending, Dead, true),
            (Running, Pending, true),
            (Running, Running, true),
            (Running, Dead, true),
            (Dead, Pending, true),
            (Dead, Running, false),
            (Dead, Dead, true),
        ];
        for (from, to, allowed) in table {
            let mut state = TaskState { status: from, ..TaskState::new() };
            let result = state.set_status(to, Timestamp(7));
            assert_eq!(result.is_ok(), allowed, "{from} -> {to}");
            assert_eq!(state.status, if allowed { to } else { from });
        }
    }

    #[test]
    fn timestamps_follow_transitions() {
        let mut state = TaskState::new();
        state.set_status(Running, Timestamp(10)).unwrap();
        state.set_status(Pending, Timestamp(20)).unwrap();
        state.set_status(Running, Timestamp(30)).unwrap();
        assert_eq!(state.started_at, Some(Timestamp(10)), "started_at is the first start");
        state.set_status(Dead, Timestamp(40)).unwrap();
        assert_eq!(state.finished_at, Some(Timestamp(40)));
        state.failed = true;
        state.set_status(Pending, Timestamp(50)).unwrap();
        assert_eq!(
            (state.failed, state.finished_at),
            (false, None),
            "an alloc restart starts clean"
        );
    }

    #[test]
    fn events_count_restarts_mark_failure_and_stay_bounded() {
        let mut state = TaskState::new();
        for i in 0..25 {
            let kind = TaskEventKind::Restarting {
                delay: Duration::from_secs(1),
                reason: "exited".into(),
            };
            state.append_event(TaskEvent::new(Timestamp(i), kind));
        }
        assert_eq!(state.restarts, 25);
        assert_eq!(state.last_restart, Some(Timestamp(24)));
        assert_eq!(state.events.len(), MAX_TASK_EVENTS);
        assert_eq!(state.events.front().unwrap().time, Timestamp(15));
        assert!(!state.failed);
        state.append_event(
            TaskEvent::new(Timestamp(30), TaskEventKind::NotRestarting { reason: "out".into() })
                .failing(),
        );
        assert!(state.failed);
        let mut state = TaskState::new();
        state.append_event(TaskEvent::new(
            Timestamp(1),
            TaskEventKind::SetupFailure { error: "no dir".into() },
        ));
        assert!(state.failed, "setup failures always fail the task");
    }

    #[test]
    fn events_read_durations_as_people_write_them() {
        let kind = TaskEventKind::Restarting {
            delay: Duration::from_millis(16_637),
            reason: "Restart within policy".into(),
        };
        assert_eq!(kind.to_string(), "Restart within policy; restarting in 16.637s");
        let json = serde_json::to_string(&TaskEvent::new(Timestamp(1), kind)).unwrap();
        assert!(json.contains(r#""delay":"16.637s""#), "{json}");
    }

    #[test]
    fn events_serialise_with_a_type_tag() {
        let event = TaskEvent::new(
            Timestamp(5),
            TaskEventKind::Terminated {
                exit_code: 137,
                signal: Some(9),
                oom_killed: true,
                message: None,
            },
        );
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            json,
            r#"{"time":5,"type":"terminated","exit_code":137,"signal":9,"oom_killed":true}"#
        );
        assert_eq!(serde_json::from_str::<TaskEvent>(&json).unwrap(), event);
        assert_eq!(event.kind.to_string(), "Exit Code: 137, Signal: 9, OOM Killed: true");
        assert_eq!(event.kind.title(), "OOM Killed");
    }

    /// Nomad's `TestTaskEventPopulate` cases for `TaskKilling`, with the default signal.
    #[test]
    fn killing_reads_as_in_nomad() {
        let killing = |signal, secs| TaskEventKind::Killing {
            signal,
            kill_timeout: Duration::from_secs(secs),
        };
        assert_eq!(
            killing(crate::spec::DEFAULT_KILL_SIGNAL, 5).to_string(),
            "Sent interrupt. Waiting 5s before force killing"
        );
        assert_eq!(
            killing(crate::Signal::Term, 1).to_string(),
            "Sent terminated. Waiting 1s before force killing"
        );
    }
}
