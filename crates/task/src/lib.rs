#![doc = include_str!("../README.md")]
//!
//! Neighbours: the alloc runner (wharf-alloc) builds one runner per task and coordinates them;
//! drivers (wharf-driver, wharf-exec) do the actual work; the store keeps the state. This
//! crate touches no process and no store file itself, so its tests run on the mock driver and
//! the in-memory store under tokio's paused clock.

pub mod clock;
mod config;
pub mod env;
mod error;
pub mod events;
mod facts;
pub mod hooks;
pub mod lifecycle;
pub mod local_state;
pub mod notify;
pub mod restart;
mod runner;
pub mod template;
pub mod watched;

pub use clock::{SystemClock, TokioClock, WallClock};
pub use config::{DEFAULT_MAX_KILL_TIMEOUT, LogLimits, TaskRunnerConfig};
pub use error::TaskError;
pub use events::{EventStream, RecordedEvent};
pub use hooks::{HookContext, PrestartResponse, TaskDirHook, TaskDirs, TaskHook};
pub use lifecycle::TaskRunnerState;
pub use local_state::LocalState;
pub use restart::{Decision, Outcome, RestartTracker};
pub use runner::{
    DESTROY_TIMEOUT, EXIT_RESULT_TIMEOUT, REATTACH_WAIT, START_TIMEOUT, STOP_GRACE, TaskRunner,
};
pub use template::{MemorySources, TemplateSources};
pub use watched::Watched;
/// The attribute that implementations of [`TaskHook`] put on their `impl` block.
pub use wharf_driver::async_trait;

// The crates this one's API is written in, so that a user gets the very versions it was built
// with without depending on them.
pub use wharf_driver as driver;
pub use wharf_state as state;
pub use wharf_store as store;
