#![doc = include_str!("../README.md")]
//!
//! Neighbours: the node agent (wharf-node) creates, restores, updates and destroys alloc
//! runners; the task runners ([`task`]) do the per-task work. This crate touches tasks only
//! through the task runners (and so through a [`driver::Driver`]) and state only through a
//! [`store::StateStore`].

mod alloc_dir;
pub mod coordinator;
mod error;
mod health_hooks;
pub mod hooks;
pub mod lifecycle;
mod max_run;
mod readiness;
mod runner;
pub mod spare_dirs;

pub use coordinator::LifecyclePhase;
pub use error::AllocError;
pub use health_hooks::HealthConfig;
pub use hooks::{AllocDirHook, AllocHook, AllocHookContext};
pub use lifecycle::AllocRunnerState;
pub use runner::{AllocRunner, AllocRunnerConfig, AllocUsage, DEFAULT_POSTSTOP_TIMEOUT};
pub use spare_dirs::SpareDirs;
pub use wharf_task::{LogLimits, RecordedEvent, SystemClock, TokioClock, WallClock};

/// The attribute that implementations of [`AllocHook`] (and of the task and driver traits) put
/// on their `impl` block.
pub use wharf_driver::async_trait;

// The crates this one's API is written in, so that a user needs no other wharf dependency and
// gets the very versions this crate was built with.
pub use wharf_driver as driver;
pub use wharf_health as health;
pub use wharf_state as state;
pub use wharf_store as store;
pub use wharf_task as task;
