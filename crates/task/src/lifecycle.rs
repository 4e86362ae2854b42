//! The task runner's own lifecycle: one value, changed only by [`TaskRunnerState::on`].
//!
//! This is the runner's life, not the task's status (`pending`, `running`, `dead` in
//! [`wharf_state::TaskState`]): whether its run loop has begun, whether it was told to kill
//! the task for good or to leave it running for the next agent, and whether the loop is over.
//!
//! ```text
//!          run                  kill                       run ends
//!   Idle ───────> Running ──────────────> Killing ───────────────────> Finished
//!    │  \            │ shutdown                                            ^
//!    │   \ kill      └──────────> ShuttingDown ─────────────────────────────┤
//!    │    └─(the caller runs it to its end; nothing starts)─> Killing       │
//!    └──── shutdown (never ran: its task, if any, is left as it is) ────────┘
//! ```
//!
//! | state | run | kill | shutdown | run ends |
//! |---|---|---|---|---|
//! | Idle | Running: run the loop | Killing: the caller runs it to its end | Finished | - |
//! | Running | ignored | Killing: wait for the end | ShuttingDown | Finished |
//! | Killing | ignored | wait for the end | ignored: the kill completes (it is bounded) | Finished |
//! | ShuttingDown | ignored | wait for the end | ignored | Finished |
//! | Finished | ignored | ignored | ignored | - |
//!
//! Kill comes from the alloc runner (a stop, a failed sibling, releasing a dead task, destroy);
//! shutdown from the agent leaving; run from the alloc runner starting its tasks.

/// Where a task runner's own life stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRunnerState {
    /// Built, perhaps restored; the run loop has not begun.
    Idle,
    /// The run loop starts, watches and restarts the task.
    Running,
    /// The task is being stopped for good; the run ends once it is dead and its stop hooks ran.
    Killing,
    /// The agent is leaving: the task is left running, its handle persisted for the next agent.
    ShuttingDown,
    /// The run loop has returned.
    Finished,
}

/// What happens to a task runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRunnerEvent {
    /// `run` was called.
    Run,
    /// `kill` was called: stop the task for good.
    Kill,
    /// `shutdown` was called: leave the task running.
    Shutdown,
    /// The run loop returned.
    RunEnded,
}

/// What the runner does about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRunnerAction {
    /// Nothing: already under way, or over.
    Ignore,
    /// Run the loop.
    RunLoop,
    /// The run loop never began: the caller runs it here, and it ends without starting the task.
    RunToEnd,
    /// Wait until the run loop has returned.
    AwaitFinished,
}

impl TaskRunnerState {
    /// The transition table (see the module docs): the next state and what to do.
    pub fn on(self, event: TaskRunnerEvent) -> (TaskRunnerState, TaskRunnerAction) {
        use TaskRunnerAction as A;
        use TaskRunnerEvent as E;
        use TaskRunnerState as S;
        match (self, event) {
            (S::Idle, E::Run) => (S::Running, A::RunLoop),
            (S::Idle, E::Kill) => (S::Killing, A::RunToEnd),
            (S::Idle, E::Shutdown) => (S::Finished, A::Ignore),
            (S::Running, E::Kill) => (S::Killing, A::AwaitFinished),
            (S::Running, E::Shutdown) => (S::ShuttingDown, A::Ignore),
            (S::Killing | S::ShuttingDown, E::Kill) => (self, A::AwaitFinished),
            (_, E::RunEnded) => (S::Finished, A::Ignore),
            (S::Running | S::Killing | S::ShuttingDown | S::Finished, E::Run)
            | (S::Killing | S::ShuttingDown | S::Finished, E::Shutdown)
            | (S::Finished, E::Kill) => (self, A::Ignore),
        }
    }

    /// Whether the task is being stopped for good or left behind: the loop must wind down.
    pub fn winding_down(self) -> bool {
        matches!(self, TaskRunnerState::Killing | TaskRunnerState::ShuttingDown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskRunnerAction as A;
    use TaskRunnerEvent as E;
    use TaskRunnerState as S;

    #[test]
    fn transition_table() {
        // (state, event, next, action) for every pair.
        let table = [
            (S::Idle, E::Run, S::Running, A::RunLoop),
            (S::Idle, E::Kill, S::Killing, A::RunToEnd),
            (S::Idle, E::Shutdown, S::Finished, A::Ignore),
            (S::Idle, E::RunEnded, S::Finished, A::Ignore),
            (S::Running, E::Run, S::Running, A::Ignore),
            (S::Running, E::Kill, S::Killing, A::AwaitFinished),
            (S::Running, E::Shutdown, S::ShuttingDown, A::Ignore),
            (S::Running, E::RunEnded, S::Finished, A::Ignore),
            (S::Killing, E::Run, S::Killing, A::Ignore),
            (S::Killing, E::Kill, S::Killing, A::AwaitFinished),
            (S::Killing, E::Shutdown, S::Killing, A::Ignore),
            (S::Killing, E::RunEnded, S::Finished, A::Ignore),
            (S::ShuttingDown, E::Run, S::ShuttingDown, A::Ignore),
            (S::ShuttingDown, E::Kill, S::ShuttingDown, A::AwaitFinished),
            (S::ShuttingDown, E::Shutdown, S::ShuttingDown, A::Ignore),
            (S::ShuttingDown, E::RunEnded, S::Finished, A::Ignore),
            (S::Finished, E::Run, S::Finished, A::Ignore),
            (S::Finished, E::Kill, S::Finished, A::Ignore),
            (S::Finished, E::Shutdown, S::Finished, A::Ignore),
            (S::Finished, E::RunEnded, S::Finished, A::Ignore),
        ];
        for (state, event, next, action) in table {
            assert_eq!(state.on(event), (next, action), "{state:?} on {event:?}");
        }
    }

    #[test]
    fn the_loop_runs_at_most_once() {
        // Whatever the order of requests, RunLoop or RunToEnd is handed out once.
        let events = [E::Run, E::Kill, E::Shutdown, E::Run, E::Kill];
        for first in 0..events.len() {
            let mut state = S::Idle;
            let mut runs = 0;
            for event in events.iter().cycle().skip(first).take(events.len()) {
                let (next, action) = state.on(*event);
                runs += usize::from(matches!(action, A::RunLoop | A::RunToEnd));
                state = next;
            }
            assert!(runs <= 1, "starting at {first}: {runs} runs");
        }
    }
}
