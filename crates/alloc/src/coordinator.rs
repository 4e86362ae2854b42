//! Lifecycle coordination: which stages of an allocation's tasks may start.
//!
//! The allocation moves through `prestart -> main -> poststart -> wait -> poststop` as its
//! tasks' states allow, and each stage opens or closes the start gates of the task stages:
//!
//! | coordinator stage | gates open |
//! |---|---|
//! | prestart | prestart (ephemeral and sidecar) |
//! | main | prestart sidecars, main |
//! | poststart | prestart sidecars, main, poststart (both) |
//! | wait | prestart sidecars, main, poststart sidecars |
//! | poststop | poststop only |
//!
//! It moves on from prestart once every ephemeral prestart task succeeded and every prestart
//! sidecar runs; from main once no main task is pending; from poststart once every ephemeral
//! poststart task is dead; to poststop from anywhere once every other task is dead. Pure logic:
//! the alloc runner feeds it task states and applies the gates.

use wharf_state::spec::Stage;
use wharf_state::{TaskState, TaskStatus};

/// Where the allocation's tasks are in their lifecycle order (prestart, main, poststart,
/// wait, poststop), which says which task stages may start. Not the runner's own life: that
/// is `AllocRunnerState` (in `lifecycle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LifecyclePhase {
    /// Prestart tasks run; main tasks wait.
    Prestart,
    /// Main tasks start.
    Main,
    /// Poststart tasks start.
    Poststart,
    /// Everything that should run does.
    Wait,
    /// Every other task is dead; poststop tasks run.
    Poststop,
}

/// Tracks the phase across state updates.
#[derive(Debug, Clone)]
pub struct Coordinator {
    phase: LifecyclePhase,
}

impl Default for Coordinator {
    fn default() -> Self {
        Coordinator::new()
    }
}

impl Coordinator {
    /// A coordinator at the start of an allocation's life.
    pub fn new() -> Coordinator {
        Coordinator { phase: LifecyclePhase::Prestart }
    }

    /// The current phase.
    pub fn phase(&self) -> LifecyclePhase {
        self.phase
    }

    /// Starts over, for a restart of the whole allocation.
    pub fn reset(&mut self) {
        self.phase = LifecyclePhase::Prestart;
    }

    /// Advances as far as `tasks` (each task's stage and state) allow; returns the new phase.
    pub fn update<'a>(
        &mut self,
        tasks: impl Iterator<Item = (Stage, &'a TaskState)> + Clone,
    ) -> LifecyclePhase {
        let others_dead = tasks
            .clone()
            .filter(|(stage, _)| *stage != Stage::Poststop)
            .all(|(_, s)| s.status == TaskStatus::Dead);
        if others_dead {
            self.phase = LifecyclePhase::Poststop;
            return self.phase;
        }
        loop {
            let next = match self.phase {
                LifecyclePhase::Prestart => {
                    let ready = tasks.clone().all(|(stage, state)| match stage {
                        Stage::PrestartEphemeral => state.successful(),
                        Stage::PrestartSidecar => state.status == TaskStatus::Running,
                        _ => true,
                    });
                    ready.then_some(LifecyclePhase::Main)
                }
                LifecyclePhase::Main => {
                    let started = tasks
                        .clone()
                        .filter(|(stage, _)| *stage == Stage::Main)
                        .all(|(_, s)| s.status != TaskStatus::Pending);
                    started.then_some(LifecyclePhase::Poststart)
                }
                LifecyclePhase::Poststart => {
                    let done = tasks
                        .clone()
                        .filter(|(stage, _)| *stage == Stage::PoststartEphemeral)
                        .all(|(_, s)| s.status == TaskStatus::Dead);
                    done.then_some(LifecyclePhase::Wait)
                }
                LifecyclePhase::Wait | LifecyclePhase::Poststop => None,
            };
            match next {
                Some(next) => self.phase = next,
                None => return self.phase,
            }
        }
    }

    /// Whether tasks of `stage` may start in the current phase.
    pub fn gate_open(&self, stage: Stage) -> bool {
        use LifecyclePhase as P;
        use Stage as S;
        match (self.phase, stage) {
            (P::Poststop, stage) => stage == S::Poststop,
            (_, S::Poststop) => false,
            (P::Prestart, stage) => matches!(stage, S::PrestartEphemeral | S::PrestartSidecar),
            (_, S::PrestartEphemeral) => false,
            (_, S::PrestartSidecar | S::Main) => true,
            (P::Main, S::PoststartEphemeral | S::PoststartSidecar) => false,
            (P::Poststart, S::PoststartEphemeral | S::PoststartSidecar) => true,
            (P::Wait, S::PoststartSidecar) => true,
            (P::Wait, S::PoststartEphemeral) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Stage::*;

    fn state(status: TaskStatus, failed: bool) -> TaskState {
        TaskState { status, failed, ..TaskState::new() }
    }
    const P: TaskStatus = TaskStatus::Pending;
    const R: TaskStatus = TaskStatus::Running;
    const D: TaskStatus = TaskStatus::Dead;

    #[test]
    fn phase_table() {
        // (case, tasks as (stage, status, failed), expected phase from a fresh coordinator)
        type Tasks = Vec<(Stage, TaskStatus, bool)>;
        let cases: Vec<(&str, Tasks, LifecyclePhase)> = vec![
            ("main only, pending", vec![(Main, P, false)], LifecyclePhase::Main),
            ("main only, running", vec![(Main, R, false)], LifecyclePhase::Wait),
            (
                "prestart pending holds main",
                vec![(PrestartEphemeral, P, false), (Main, P, false)],
                LifecyclePhase::Prestart,
            ),
            (
                "prestart running holds main",
                vec![(PrestartEphemeral, R, false), (Main, P, false)],
                LifecyclePhase::Prestart,
            ),
            (
                "prestart succeeded opens main",
                vec![(PrestartEphemeral, D, false), (Main, P, false)],
                LifecyclePhase::Main,
            ),
            (
                "prestart failed holds main",
                vec![(PrestartEphemeral, D, true), (Main, P, false)],
                LifecyclePhase::Prestart,
            ),
            (
                "sidecar pending holds main",
                vec![(PrestartSidecar, P, false), (Main, P, false)],
                LifecyclePhase::Prestart,
            ),
            (
                "sidecar running opens main",
                vec![(PrestartSidecar, R, false), (Main, P, false)],
                LifecyclePhase::Main,
            ),
            (
                "main running opens poststart",
                vec![(Main, R, false), (PoststartEphemeral, P, false)],
                LifecyclePhase::Poststart,
            ),
            (
                "poststart done: wait",
                vec![(Main, R, false), (PoststartEphemeral, D, false)],
                LifecyclePhase::Wait,
            ),
            (
                "poststart sidecar does not hold wait",
                vec![(Main, R, false), (PoststartSidecar, R, false)],
                LifecyclePhase::Wait,
            ),
            (
                "all dead: poststop",
                vec![(Main, D, false), (PoststartSidecar, D, false), (Poststop, P, false)],
                LifecyclePhase::Poststop,
            ),
            (
                "failed prestart and dead main: poststop",
                vec![(PrestartEphemeral, D, true), (Main, D, false), (Poststop, P, false)],
                LifecyclePhase::Poststop,
            ),
            (
                "a live sidecar keeps it out of poststop",
                vec![(Main, D, false), (PrestartSidecar, R, false), (Poststop, P, false)],
                LifecyclePhase::Wait,
            ),
        ];
        for (case, tasks, want) in cases {
            let states: Vec<(Stage, TaskState)> =
                tasks.iter().map(|(st, s, f)| (*st, state(*s, *f))).collect();
            let mut c = Coordinator::new();
            assert_eq!(c.update(states.iter().map(|(st, s)| (*st, s))), want, "{case}");
        }
    }

    #[test]
    fn phases_do_not_go_back_until_reset() {
        let mut c = Coordinator::new();
        let running = [(Main, state(R, false))];
        assert_eq!(c.update(running.iter().map(|(st, s)| (*st, s))), LifecyclePhase::Wait);
        // The main task restarts (pending again): the phase stays.
        let restarting = [(Main, state(P, false))];
        assert_eq!(c.update(restarting.iter().map(|(st, s)| (*st, s))), LifecyclePhase::Wait);
        c.reset();
        let with_prestart = [(PrestartEphemeral, state(P, false)), (Main, state(P, false))];
        assert_eq!(
            c.update(with_prestart.iter().map(|(st, s)| (*st, s))),
            LifecyclePhase::Prestart
        );
    }

    #[test]
    fn gates_per_phase() {
        let stages = [
            PrestartEphemeral,
            PrestartSidecar,
            Main,
            PoststartEphemeral,
            PoststartSidecar,
            Poststop,
        ];
        // Expected open gates in the order of `stages`.
        let table = [
            (LifecyclePhase::Prestart, [true, true, false, false, false, false]),
            (LifecyclePhase::Main, [false, true, true, false, false, false]),
            (LifecyclePhase::Poststart, [false, true, true, true, true, false]),
            (LifecyclePhase::Wait, [false, true, true, false, true, false]),
            (LifecyclePhase::Poststop, [false, false, false, false, false, true]),
        ];
        for (phase, open) in table {
            let c = Coordinator { phase };
            let got: Vec<bool> = stages.iter().map(|s| c.gate_open(*s)).collect();
            assert_eq!(got, open, "{phase:?}");
        }
    }
}
