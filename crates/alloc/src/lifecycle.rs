//! The alloc runner's own lifecycle: one value, changed only by [`AllocRunnerState::on`].
//!
//! Every request to an alloc runner (run, kill, shutdown, destroy, an allocation-wide restart)
//! and every milestone of its run becomes an [`AllocRunnerEvent`]. The pure transition
//! function decides the next state and what the runner does about it ([`AllocRunnerAction`]);
//! no combination of requests exists that the table below does not name. The runner keeps the
//! state in a watch channel, so "wait until destroyed" or "wait until the run is over" is a
//! wait for a state.
//!
//! ```text
//!            run               kill                every task but poststop dead
//! Pending ────────> Running ────────> Killing ──────────────────────────> Ending
//!    │                 │  └─────────────────────────────────────────────────┘ │ run over
//!    │                 │              (every task but poststop dead)           v
//!    │                 └───── shutdown (from Running, Killing, Ending) ──> ShuttingDown ──> ShutDown
//!    │                                                                      (run over, hooks)
//!    └──── destroy (from any state; waits for a shutdown under way) ──> Destroying ──> Destroyed
//!                                                                      (run over, hooks, records)
//! ```
//!
//! | state | run | kill | all dead | run over | shutdown | destroy | restart all |
//! |---|---|---|---|---|---|---|---|
//! | Pending | Running: start | ignored | - | - | ShuttingDown (run over): hooks | Destroying (run over): end unstarted tasks | refused |
//! | Running | ignored | Killing: kill in order | Ending: release the dead | Dead: postrun hooks | ShuttingDown: leave tasks | Destroying: kill, bounded wait | allowed |
//! | Killing | ignored | ignored | Ending: release the dead | Dead: postrun hooks | ShuttingDown | Destroying: kill, bounded wait | refused |
//! | Ending | ignored | ignored | ignored | Dead: postrun hooks | ShuttingDown | Destroying: kill, bounded wait | refused |
//! | Dead | ignored | ignored | ignored | - | ShuttingDown (run over): hooks | Destroying (run over): hooks, records | refused |
//! | ShuttingDown | ignored | ignored | ignored | marks the run over | waits | waits, then destroys | refused |
//! | ShutDown | ignored | ignored | ignored | - | ignored | Destroying (run over): hooks, records | refused |
//! | Destroying | ignored | ignored | ignored | marks the run over | waits for Destroyed | waits for Destroyed | refused |
//! | Destroyed | ignored | ignored | ignored | - | ignored | ignored | refused |
//!
//! Who causes what: the agent (or any embedder) calls run, shutdown, destroy and the restarts;
//! a stop update (the agent's stop, a server's desired status) and the runner's own reactions
//! to task states (a failed task, a dead leader, only sidecars left) cause kill; the run itself
//! reports "all dead" and "run over". After a shutdown the task runners have left their tasks
//! to the next agent, so a destroy that follows deletes the records without killing them, as
//! Nomad's does.

/// Where an alloc runner's own life stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocRunnerState {
    /// Built, perhaps restored; the run has not begun.
    Pending,
    /// The tasks run under their lifecycle gates; an allocation-wide restart is possible.
    Running,
    /// The tasks are being killed (a stop, a failed sibling, a dead leader, only sidecars
    /// left); poststop tasks run once the rest are dead. Nothing restarts any more.
    Killing,
    /// Every task but the poststop ones is dead and released; poststop tasks run.
    Ending,
    /// The run is over: every task runner finished and the postrun hooks ran.
    Dead,
    /// The agent is leaving: the tasks are left running for the next agent to reattach.
    ShuttingDown {
        /// Whether the run has ended (or never began).
        run_over: bool,
    },
    /// Shutdown is complete; the shutdown hooks ran.
    ShutDown,
    /// Destroy is under way: tasks are killed, then the destroy hooks run and the records go.
    Destroying {
        /// Whether the run has ended (or never began).
        run_over: bool,
    },
    /// The allocation's records are deleted; nothing more happens.
    Destroyed,
}

/// What happens to an alloc runner: the input of [`AllocRunnerState::on`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocRunnerEvent {
    /// `run` was called.
    Run,
    /// The tasks must be killed.
    Kill,
    /// Every task but the poststop ones is dead.
    AllDead,
    /// Every task runner has finished (and the postrun hooks ran, unless shutting down).
    RunOver,
    /// `shutdown` was called.
    Shutdown,
    /// The shutdown hooks ran.
    ShutdownDone,
    /// `destroy` was called.
    Destroy,
    /// The destroy hooks ran and the records are deleted.
    DestroyDone,
    /// An allocation-wide restart (of every task, or of the running ones) was asked for.
    RestartAll,
}

/// What the alloc runner does about an event: the output of [`AllocRunnerState::on`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocRunnerAction {
    /// Nothing: the event is already being dealt with, or no longer matters.
    Ignore,
    /// The request is not allowed in this state; the reason is for the caller.
    Refuse(&'static str),
    /// Start the run: prerun hooks and the task runners.
    StartRun,
    /// Kill the tasks in order: prekill hooks, the leader, the others, the sidecars.
    KillTasks,
    /// Every task but the poststop ones is dead: run the prekill hooks once more (the
    /// allocation is done) and release the dead tasks, which stop waiting for an
    /// allocation-wide restart.
    ReleaseDeadTasks,
    /// The run ended normally: publish the final state.
    Finish,
    /// Nothing will run: finish the shutdown at once.
    ShutDownUnstarted,
    /// Tell the task runners to leave their tasks, wait for the run to end, run the hooks.
    ShutDownRun,
    /// Wait for the shutdown under way to complete.
    AwaitShutDown,
    /// Wait for the shutdown under way, then destroy.
    AwaitShutDownThenDestroy,
    /// The run never began: end each task runner without starting its task, then destroy.
    DestroyUnstarted,
    /// Kill the tasks, let poststop run (bounded), then destroy.
    DestroyRun,
    /// The run is over: run the destroy hooks and delete the records.
    DestroyRecords,
    /// Wait for the destroy under way to complete.
    AwaitDestroyed,
    /// Go ahead with the restart.
    Restart,
}

impl AllocRunnerState {
    /// The transition table (see the module docs): the next state and what to do.
    pub fn on(self, event: AllocRunnerEvent) -> (AllocRunnerState, AllocRunnerAction) {
        use AllocRunnerAction as A;
        use AllocRunnerEvent as E;
        use AllocRunnerState as S;
        let unchanged = |action| (self, action);
        match (self, event) {
            (S::Pending, E::Run) => (S::Running, A::StartRun),
            (_, E::Run) => unchanged(A::Ignore),

            (S::Running, E::Kill) => (S::Killing, A::KillTasks),
            (_, E::Kill) => unchanged(A::Ignore),

            (S::Running | S::Killing, E::AllDead) => (S::Ending, A::ReleaseDeadTasks),
            (_, E::AllDead) => unchanged(A::Ignore),

            (S::Running | S::Killing | S::Ending, E::RunOver) => (S::Dead, A::Finish),
            (S::ShuttingDown { .. }, E::RunOver) => (S::ShuttingDown { run_over: true }, A::Ignore),
            (S::Destroying { .. }, E::RunOver) => (S::Destroying { run_over: true }, A::Ignore),
            (_, E::RunOver) => unchanged(A::Ignore),

            (S::Pending | S::Dead, E::Shutdown) => {
                (S::ShuttingDown { run_over: true }, A::ShutDownUnstarted)
            }
            (S::Running | S::Killing | S::Ending, E::Shutdown) => {
                (S::ShuttingDown { run_over: false }, A::ShutDownRun)
            }
            (S::ShuttingDown { .. }, E::Shutdown) => unchanged(A::AwaitShutDown),
            (S::Destroying { .. }, E::Shutdown) => unchanged(A::AwaitDestroyed),
            (S::ShutDown | S::Destroyed, E::Shutdown) => unchanged(A::Ignore),

            (S::ShuttingDown { run_over: true }, E::ShutdownDone) => (S::ShutDown, A::Ignore),
            (_, E::ShutdownDone) => unchanged(A::Ignore),

            (S::Pending, E::Destroy) => (S::Destroying { run_over: true }, A::DestroyUnstarted),
            (S::Running | S::Killing | S::Ending, E::Destroy) => {
                (S::Destroying { run_over: false }, A::DestroyRun)
            }
            (S::Dead | S::ShutDown, E::Destroy) => {
                (S::Destroying { run_over: true }, A::DestroyRecords)
            }
            (S::ShuttingDown { .. }, E::Destroy) => unchanged(A::AwaitShutDownThenDestroy),
            (S::Destroying { .. }, E::Destroy) => unchanged(A::AwaitDestroyed),
            (S::Destroyed, E::Destroy) => unchanged(A::Ignore),

            (S::Destroying { run_over: true }, E::DestroyDone) => (S::Destroyed, A::Ignore),
            (_, E::DestroyDone) => unchanged(A::Ignore),

            (S::Running, E::RestartAll) => unchanged(A::Restart),
            (S::Pending, E::RestartAll) => unchanged(A::Refuse("it has not started")),
            (S::Killing | S::Ending | S::Dead, E::RestartAll) => {
                unchanged(A::Refuse("it is ending"))
            }
            (S::ShuttingDown { .. } | S::ShutDown, E::RestartAll) => {
                unchanged(A::Refuse("the agent is shutting down"))
            }
            (S::Destroying { .. } | S::Destroyed, E::RestartAll) => {
                unchanged(A::Refuse("it is being destroyed"))
            }
        }
    }

    /// Whether the run is over, or will never begin.
    pub fn run_over(self) -> bool {
        matches!(
            self,
            AllocRunnerState::Dead
                | AllocRunnerState::ShuttingDown { run_over: true }
                | AllocRunnerState::ShutDown
                | AllocRunnerState::Destroying { run_over: true }
                | AllocRunnerState::Destroyed
        )
    }

    /// Whether the agent is leaving this allocation's tasks running.
    pub fn shutting_down(self) -> bool {
        matches!(self, AllocRunnerState::ShuttingDown { .. } | AllocRunnerState::ShutDown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AllocRunnerAction as A;
    use AllocRunnerEvent as E;
    use AllocRunnerState as S;

    const STATES: [AllocRunnerState; 11] = [
        S::Pending,
        S::Running,
        S::Killing,
        S::Ending,
        S::Dead,
        S::ShuttingDown { run_over: false },
        S::ShuttingDown { run_over: true },
        S::ShutDown,
        S::Destroying { run_over: false },
        S::Destroying { run_over: true },
        S::Destroyed,
    ];
    const EVENTS: [AllocRunnerEvent; 9] = [
        E::Run,
        E::Kill,
        E::AllDead,
        E::RunOver,
        E::Shutdown,
        E::ShutdownDone,
        E::Destroy,
        E::DestroyDone,
        E::RestartAll,
    ];

    #[test]
    fn transition_table() {
        // Every transition that changes the state or does something; (state, event) pairs not
        // listed must leave the state as it is and be ignored or refused.
        let table: &[(AllocRunnerState, AllocRunnerEvent, AllocRunnerState, AllocRunnerAction)] = &[
            (S::Pending, E::Run, S::Running, A::StartRun),
            (S::Pending, E::Shutdown, S::ShuttingDown { run_over: true }, A::ShutDownUnstarted),
            (S::Pending, E::Destroy, S::Destroying { run_over: true }, A::DestroyUnstarted),
            (S::Running, E::Kill, S::Killing, A::KillTasks),
            (S::Running, E::AllDead, S::Ending, A::ReleaseDeadTasks),
            (S::Running, E::RunOver, S::Dead, A::Finish),
            (S::Running, E::Shutdown, S::ShuttingDown { run_over: false }, A::ShutDownRun),
            (S::Running, E::Destroy, S::Destroying { run_over: false }, A::DestroyRun),
            (S::Running, E::RestartAll, S::Running, A::Restart),
            (S::Killing, E::AllDead, S::Ending, A::ReleaseDeadTasks),
            (S::Killing, E::RunOver, S::Dead, A::Finish),
            (S::Killing, E::Shutdown, S::ShuttingDown { run_over: false }, A::ShutDownRun),
            (S::Killing, E::Destroy, S::Destroying { run_over: false }, A::DestroyRun),
            (S::Ending, E::RunOver, S::Dead, A::Finish),
            (S::Ending, E::Shutdown, S::ShuttingDown { run_over: false }, A::ShutDownRun),
            (S::Ending, E::Destroy, S::Destroying { run_over: false }, A::DestroyRun),
            (S::Dead, E::Shutdown, S::ShuttingDown { run_over: true }, A::ShutDownUnstarted),
            (S::Dead, E::Destroy, S::Destroying { run_over: true }, A::DestroyRecords),
            (
                S::ShuttingDown { run_over: false },
                E::RunOver,
                S::ShuttingDown { run_over: true },
                A::Ignore,
            ),
            (
                S::ShuttingDown { run_over: false },
                E::Shutdown,
                S::ShuttingDown { run_over: false },
                A::AwaitShutDown,
            ),
            (
                S::ShuttingDown { run_over: true },
                E::Shutdown,
                S::ShuttingDown { run_over: true },
                A::AwaitShutDown,
            ),
            (
                S::ShuttingDown { run_over: false },
                E::Destroy,
                S::ShuttingDown { run_over: false },
                A::AwaitShutDownThenDestroy,
            ),
            (
                S::ShuttingDown { run_over: true },
                E::Destroy,
                S::ShuttingDown { run_over: true },
                A::AwaitShutDownThenDestroy,
            ),
            (S::ShuttingDown { run_over: true }, E::ShutdownDone, S::ShutDown, A::Ignore),
            (S::ShutDown, E::Destroy, S::Destroying { run_over: true }, A::DestroyRecords),
            (
                S::Destroying { run_over: false },
                E::RunOver,
                S::Destroying { run_over: true },
                A::Ignore,
            ),
            (
                S::Destroying { run_over: false },
                E::Shutdown,
                S::Destroying { run_over: false },
                A::AwaitDestroyed,
            ),
            (
                S::Destroying { run_over: true },
                E::Shutdown,
                S::Destroying { run_over: true },
                A::AwaitDestroyed,
            ),
            (
                S::Destroying { run_over: false },
                E::Destroy,
                S::Destroying { run_over: false },
                A::AwaitDestroyed,
            ),
            (
                S::Destroying { run_over: true },
                E::Destroy,
                S::Destroying { run_over: true },
                A::AwaitDestroyed,
            ),
            (S::Destroying { run_over: true }, E::DestroyDone, S::Destroyed, A::Ignore),
        ];
        for state in STATES {
            for event in EVENTS {
                let got = state.on(event);
                match table.iter().find(|(s, e, _, _)| *s == state && *e == event) {
                    Some((_, _, next, action)) => {
                        assert_eq!(got, (*next, *action), "{state:?} on {event:?}")
                    }
                    None => {
                        assert_eq!(got.0, state, "{state:?} on {event:?} must not move");
                        assert!(
                            matches!(got.1, A::Ignore | A::Refuse(_)),
                            "{state:?} on {event:?} must do nothing, not {:?}",
                            got.1
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_a_running_allocation_restarts() {
        for state in STATES {
            let allowed = state.on(E::RestartAll).1 == A::Restart;
            assert_eq!(allowed, state == S::Running, "{state:?}");
        }
    }

    #[test]
    fn the_run_is_over_exactly_in_the_final_states() {
        let over: Vec<AllocRunnerState> = STATES.into_iter().filter(|s| s.run_over()).collect();
        assert_eq!(
            over,
            [
                S::Dead,
                S::ShuttingDown { run_over: true },
                S::ShutDown,
                S::Destroying { run_over: true },
                S::Destroyed
            ]
        );
    }

    /// Whatever happens, in any order, the runner ends destroyed once destroy has been asked
    /// for and the run reports its end: destroy always wins, and nothing leaves `Destroyed`.
    #[test]
    fn destroy_always_ends_destroyed() {
        // Every sequence of up to four events, then a destroy, the end of the run (and of a
        // shutdown under way), the destroy again (a waiter retrying) and its completion.
        fn walk(state: AllocRunnerState, depth: usize) {
            let mut end = state;
            for event in [E::Destroy, E::RunOver, E::ShutdownDone, E::Destroy, E::DestroyDone] {
                end = end.on(event).0;
            }
            assert_eq!(end, S::Destroyed, "from {state:?}");
            if depth == 0 {
                return;
            }
            for event in EVENTS {
                walk(state.on(event).0, depth - 1);
            }
        }
        walk(S::Pending, 4);
        for event in EVENTS {
            assert_eq!(S::Destroyed.on(event).0, S::Destroyed);
        }
    }
}
