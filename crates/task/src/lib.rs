//! The task lifecycle: [`TaskRunner`] runs one task of an allocation from start to death.
//!
//! It waits for the start gate the alloc runner opens, runs prestart hooks, starts the task
//! through its [`wharf_driver::Driver`] (or adopts one recovered after an agent restart), runs
//! poststart hooks, waits for the exit, asks the [`RestartTracker`] whether to run it again,
//! and when it is dead runs the stop hooks. Every step becomes a [`wharf_state::TaskEvent`]
//! persisted with the task state through the [`wharf_store::StateStore`].
//!
//! Neighbours: the alloc runner (wharf-alloc) builds one runner per task and coordinates them;
//! drivers (wharf-driver, wharf-exec) do the actual work; the store keeps the state. This
//! crate touches no process and no store file itself, so its tests run on the mock driver and
//! the in-memory store under tokio's paused clock.

pub mod clock;
pub mod env;
mod error;
pub mod hooks;
pub mod lifecycle;
pub mod local_state;
pub mod restart;
mod runner;

pub use clock::{SystemClock, TokioClock, WallClock};
pub use error::TaskError;
pub use hooks::{HookContext, PrestartResponse, TaskDirHook, TaskDirs, TaskHook};
pub use lifecycle::RunnerState;
pub use restart::RestartTracker;
pub use runner::{
    DESTROY_TIMEOUT, EXIT_RESULT_TIMEOUT, LogLimits, REATTACH_WAIT, START_TIMEOUT, STOP_GRACE,
    TaskRunner, TaskRunnerConfig,
};
