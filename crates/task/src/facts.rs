//! What a task runner knows that changes as it lives, in one value: [`RunnerFacts`], which the
//! runner keeps under one lock (a [`crate::watched::Watched`]; the lock order is in the runner
//! module's docs), and [`Change`], the one way the task's state is edited.
//!
//! Each fact has one field, and a question that needs several facts is answered from one
//! look at them all, by a pure method here:
//!
//! | question | facts it reads | answer |
//! |---|---|---|
//! | [`RunnerFacts::running_task`] | the local state's driver handle | its task id, if any |
//! | [`RunnerFacts::wind_down`] | the lifecycle | Killing: kill; ShuttingDown: shut down; else none |
//! | [`RunnerFacts::may_still_attach`] | the lifecycle | Idle or Running |
//! | [`RunnerFacts::may_record_kill`] | the lifecycle, the task's status | may attach, and the task not dead |
//! | [`RunnerFacts::may_wait_for_reattach`] | the lifecycle, the task's status | may attach, and the task reported running |
//! | [`RunnerFacts::awaits_rerun`] | the lifecycle, the task's status, the run's completion | Running, the task dead, its run not complete |
//! | [`RunnerFacts::restored_dead`] | the task's status, what restore left | dead, and not lost while away |
//!
//! The driver handle in the local state is the one record of which task runs: set when a
//! start returns or a restore reattaches, cleared when a run is released or abandoned.
//!
//! The task's status changes only through [`Change::set_status`] and, for a rerun, which is not
//! a change of its own, [`RunnerFacts::set_status`]. [`wharf_state::TaskState::set_status`] allows every change the runner makes but one:
//! a dead task does not go straight back to running. The runner's own flow never asks for that
//! (a dead task is made pending before it runs again); should a caller have declared the task
//! dead while a run was starting, the refusal is logged and the task stays dead.

use crate::lifecycle::TaskRunnerState;
use crate::local_state::LocalState;
use crate::restart::{Outcome, RestartTracker};
use std::collections::BTreeMap;
use std::sync::Arc;
use wharf_driver::TaskId;
use wharf_state::{Allocation, TaskEvent, TaskState, TaskStatus, Timestamp};

/// Everything about a task runner that changes as it lives. Only the runner builds and
/// changes it, under its lock.
#[derive(Debug)]
pub(crate) struct RunnerFacts {
    /// The runner's own life; changed only by [`TaskRunnerState::on`].
    pub(crate) lifecycle: TaskRunnerState,
    /// The allocation, as last updated (one copy, shared with the alloc runner).
    pub(crate) alloc: Arc<Allocation>,
    /// The task's state, as persisted and reported.
    pub(crate) task: TaskState,
    /// No change has been made and no state restored: the first change records `Received`.
    pub(crate) received_unrecorded: bool,
    /// What the runner keeps across agent restarts: the driver handle of the task that runs,
    /// hook state, the run counter, whether the run is complete.
    pub(crate) local: LocalState,
    /// The local state changed since it was last written (a released handle): the next
    /// commit writes it too.
    pub(crate) local_unwritten: bool,
    /// What a restore left for the run loop to act on first.
    pub(crate) restored: Restored,
    /// The environment of the last run, once its handle (which holds it while the task runs)
    /// is released: what hooks see between runs and after the last.
    pub(crate) last_env: BTreeMap<String, String>,
    /// The lifecycle gate the alloc runner opens and closes.
    pub(crate) gate_open: bool,
    /// A restart asked for and not yet acted on; a later request replaces it.
    pub(crate) restart: Option<RestartRequest>,
    /// An allocation-wide restart of the dead task, asked for and not yet acted on.
    pub(crate) rerun: bool,
    /// The restart policy's count of this runner's runs.
    pub(crate) restarts: RestartTracker,
}

/// What a restore left for the run loop.
#[derive(Debug)]
pub(crate) enum Restored {
    /// Nothing: nothing was restored, or the loop took it.
    Nothing,
    /// Reattached to the task whose handle is in the local state: the loop adopts it instead
    /// of starting one.
    Reattached,
    /// The task was lost while the agent was away: this outcome goes to the restart tracker
    /// before anything else.
    Lost(Outcome),
}

/// A user's or a hook's request to restart the running task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RestartRequest {
    /// Whether it counts against the restart policy.
    pub(crate) failure: bool,
}

/// Which way the runner was asked to wind down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindDown {
    /// Stop the task for good.
    Kill,
    /// Leave the task running for the next agent.
    Shutdown,
}

impl RunnerFacts {
    /// A runner of a task of `alloc` that has not run, counting restarts with `restarts`.
    pub(crate) fn new(alloc: Arc<Allocation>, restarts: RestartTracker) -> RunnerFacts {
        RunnerFacts {
            lifecycle: TaskRunnerState::Idle,
            alloc,
            task: TaskState::new(),
            received_unrecorded: true,
            local_unwritten: false,
            local: LocalState::default(),
            restored: Restored::Nothing,
            last_env: BTreeMap::new(),
            gate_open: false,
            restart: None,
            rerun: false,
            restarts,
        }
    }

    /// The id of the task that runs (or was reattached to), from its driver handle.
    pub(crate) fn running_task(&self) -> Option<TaskId> {
        self.local.handle.as_ref().map(|handle| handle.id().clone())
    }

    /// Which way the runner is asked to wind down, if it is.
    pub(crate) fn wind_down(&self) -> Option<WindDown> {
        match self.lifecycle {
            TaskRunnerState::Killing => Some(WindDown::Kill),
            TaskRunnerState::ShuttingDown => Some(WindDown::Shutdown),
            TaskRunnerState::Idle | TaskRunnerState::Running | TaskRunnerState::Finished => None,
        }
    }

    /// Whether the runner may still attach to a task: its loop has not begun or is running.
    pub(crate) fn may_still_attach(&self) -> bool {
        matches!(self.lifecycle, TaskRunnerState::Idle | TaskRunnerState::Running)
    }

    /// Whether a kill still records the event it brings (such as "Sibling Task Failed"): the
    /// task is not dead and no kill or shutdown came before.
    pub(crate) fn may_record_kill(&self) -> bool {
        self.task.status != TaskStatus::Dead && self.may_still_attach()
    }

    /// Whether a restart or signal that finds no task attached waits for one: the task is
    /// reported running (just restored) and the runner may still attach to it.
    pub(crate) fn may_wait_for_reattach(&self) -> bool {
        self.task.status == TaskStatus::Running && self.may_still_attach()
    }

    /// Whether the task is dead and waits for an allocation-wide restart: the loop runs, and
    /// its run was not completed (a run completed before a restore never runs again).
    pub(crate) fn awaits_rerun(&self) -> bool {
        self.lifecycle == TaskRunnerState::Running
            && !self.local.run_complete
            && self.task.status == TaskStatus::Dead
    }

    /// Whether the task was restored dead, with only the end of its run left (not lost while
    /// the agent was away, which the restart policy decides on first).
    pub(crate) fn restored_dead(&self) -> bool {
        self.task.status == TaskStatus::Dead && !matches!(self.restored, Restored::Lost(_))
    }

    /// Takes the outcome of a task lost while the agent was away, if restore left one.
    pub(crate) fn take_lost(&mut self) -> Option<Outcome> {
        match std::mem::replace(&mut self.restored, Restored::Nothing) {
            Restored::Lost(outcome) => Some(outcome),
            other => {
                self.restored = other;
                None
            }
        }
    }

    /// Takes the task restore reattached to, if any: its id, for the loop to adopt.
    pub(crate) fn take_reattached(&mut self) -> Option<TaskId> {
        match std::mem::replace(&mut self.restored, Restored::Nothing) {
            Restored::Reattached => self.running_task(),
            other => {
                self.restored = other;
                None
            }
        }
    }

    /// Moves the task's status, as [`Change::set_status`] does, outside a change of the state
    /// (a rerun's pending status, which is persisted with the loop's next commit).
    pub(crate) fn set_status(&mut self, to: TaskStatus, at: Timestamp, task: &str) {
        set_status(&mut self.task, to, at, &self.alloc.id, task);
    }
}

/// A change of the task state being made: events appended through it also go to the event
/// stream, and a status it is refused is logged.
pub(crate) struct Change<'a> {
    pub(crate) state: &'a mut TaskState,
    pub(crate) events: &'a mut Vec<TaskEvent>,
    pub(crate) alloc_id: &'a str,
    pub(crate) task: &'a str,
}

impl Change<'_> {
    /// Records an event.
    pub(crate) fn append_event(&mut self, event: TaskEvent) {
        self.events.push(event.clone());
        self.state.append_event(event);
    }

    /// Moves the task's status to `to` at `at` (see the module docs for the one move refused).
    pub(crate) fn set_status(&mut self, to: TaskStatus, at: Timestamp) {
        set_status(self.state, to, at, self.alloc_id, self.task);
    }
}

/// Moves `state` to `to`; a move [`TaskState::set_status`] refuses leaves the status as it was
/// and is logged, naming the task and both statuses.
fn set_status(state: &mut TaskState, to: TaskStatus, at: Timestamp, alloc_id: &str, task: &str) {
    if let Err(refused) = state.set_status(to, at) {
        tracing::error!(
            %alloc_id, %task, from = %refused.from, to = %refused.to,
            "the task runner asked for a status change the task's state refuses; it keeps its status"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskRunnerState as L;
    use TaskStatus as T;
    use wharf_driver::{ExitResult, TaskConfig, TaskHandle};
    use wharf_state::spec::Stage;
    use wharf_state::{Job, JobType, RestartPolicy, Task, TaskGroup};

    fn facts() -> RunnerFacts {
        let task = Task::new("t", "mock");
        let job = Job::new("j", JobType::Service, TaskGroup::new("g", [task]));
        let policy = RestartPolicy::defaults_for(JobType::Service);
        let tracker = RestartTracker::new(policy, JobType::Service, Stage::Main, 1);
        RunnerFacts::new(Arc::new(Allocation::new("a1", job, "g")), tracker)
    }

    fn lost() -> Outcome {
        Outcome::Exited(ExitResult {
            exit_code: 0,
            signal: None,
            oom_killed: false,
            error: Some("lost".into()),
        })
    }

    const LIFECYCLES: [TaskRunnerState; 5] =
        [L::Idle, L::Running, L::Killing, L::ShuttingDown, L::Finished];

    #[test]
    fn lifecycle_questions_table() {
        // (lifecycle, wind_down, may_still_attach)
        let table = [
            (L::Idle, None, true),
            (L::Running, None, true),
            (L::Killing, Some(WindDown::Kill), false),
            (L::ShuttingDown, Some(WindDown::Shutdown), false),
            (L::Finished, None, false),
        ];
        assert_eq!(table.map(|row| row.0), LIFECYCLES, "one row per state");
        for (lifecycle, wind_down, attach) in table {
            let mut facts = facts();
            facts.lifecycle = lifecycle;
            assert_eq!(facts.wind_down(), wind_down, "{lifecycle:?}");
            assert_eq!(facts.may_still_attach(), attach, "{lifecycle:?}");
        }
    }

    #[test]
    fn questions_over_lifecycle_and_status_table() {
        // The combinations that answer yes; every other (lifecycle, status, run complete)
        // answers no.
        let record_kill = [
            (L::Idle, T::Pending),
            (L::Idle, T::Running),
            (L::Running, T::Pending),
            (L::Running, T::Running),
        ];
        let wait_for_reattach = [(L::Idle, T::Running), (L::Running, T::Running)];
        let rerun = [(L::Running, T::Dead, false)];
        for lifecycle in LIFECYCLES {
            for status in [T::Pending, T::Running, T::Dead] {
                for complete in [false, true] {
                    let mut facts = facts();
                    facts.lifecycle = lifecycle;
                    facts.task.status = status;
                    facts.local.run_complete = complete;
                    let row = format!("{lifecycle:?}, {status}, complete {complete}");
                    let pair = (lifecycle, status);
                    assert_eq!(facts.may_record_kill(), record_kill.contains(&pair), "{row}");
                    let reattach = wait_for_reattach.contains(&pair);
                    assert_eq!(facts.may_wait_for_reattach(), reattach, "{row}");
                    let rerun = rerun.contains(&(lifecycle, status, complete));
                    assert_eq!(facts.awaits_rerun(), rerun, "{row}");
                }
            }
        }
    }

    #[test]
    fn what_restore_left_is_taken_once_and_only_by_its_taker() {
        // (left by restore, status, restored_dead, take_lost, take_reattached)
        let handle = TaskHandle::new("mock", TaskConfig::new("a1", "t", "/tmp/a1/t"));
        let table = [
            ("nothing", T::Dead, true, false, false),
            ("nothing", T::Pending, false, false, false),
            ("reattached", T::Dead, true, false, true),
            ("reattached", T::Running, false, false, true),
            ("lost", T::Dead, false, true, false),
            ("lost", T::Running, false, true, false),
        ];
        for (left, status, dead, lost_taken, reattached_taken) in table {
            let fresh = || {
                let mut facts = facts();
                facts.task.status = status;
                facts.local.handle = Some(handle.clone());
                facts.restored = match left {
                    "reattached" => Restored::Reattached,
                    "lost" => Restored::Lost(lost()),
                    _ => Restored::Nothing,
                };
                facts
            };
            let row = format!("{left}, {status}");
            assert_eq!(fresh().restored_dead(), dead, "{row}");
            // The other taker leaves it; its own takes it once.
            let mut facts = fresh();
            assert_eq!(facts.take_reattached().is_some(), reattached_taken, "{row}");
            assert_eq!(facts.take_lost().is_some(), lost_taken, "{row}");
            assert!(facts.take_lost().is_none() && facts.take_reattached().is_none(), "{row}");
            let mut facts = fresh();
            assert_eq!(facts.take_lost().is_some(), lost_taken, "{row}");
            assert_eq!(facts.take_reattached(), reattached_taken.then(|| handle.id().clone()));
        }
    }

    #[test]
    fn status_moves_table() {
        // (from, to, the status after): every move the runner makes is allowed but one.
        let table = [
            (T::Pending, T::Pending, T::Pending),
            (T::Pending, T::Running, T::Running),
            (T::Pending, T::Dead, T::Dead),
            (T::Running, T::Pending, T::Pending),
            (T::Running, T::Running, T::Running),
            (T::Running, T::Dead, T::Dead),
            (T::Dead, T::Pending, T::Pending),
            (T::Dead, T::Running, T::Dead),
            (T::Dead, T::Dead, T::Dead),
        ];
        for (from, to, after) in table {
            let mut facts = facts();
            facts.task.status = from;
            let mut events = Vec::new();
            let mut change =
                Change { state: &mut facts.task, events: &mut events, alloc_id: "a1", task: "t" };
            change.set_status(to, Timestamp(5));
            assert_eq!(facts.task.status, after, "{from} -> {to}");
            facts.task.status = from;
            facts.set_status(to, Timestamp(5), "t");
            assert_eq!(facts.task.status, after, "{from} -> {to}, outside a change");
        }
    }
}
