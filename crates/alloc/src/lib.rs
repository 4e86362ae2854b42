//! The alloc runner: everything that happens to one allocation on a node.
//!
//! [`AllocRunner`] builds one [`wharf_task::TaskRunner`] per task of the allocation's group and
//! coordinates them: lifecycle order (prestart, main, poststart, poststop; see [`coordinator`]),
//! reactions to task states (a failed task or a dead leader kills the rest; sidecars alone are
//! killed), the kill order, asynchronous updates, alloc hooks, destroy and shutdown, restarts,
//! signals and exec. Watchers see the allocation's latest [`wharf_state::AllocState`].
//!
//! Neighbours: the node agent (wharf-node) creates, restores, updates and destroys alloc
//! runners; the task runners do the per-task work. This crate touches tasks only through the
//! task runners (and so through `Driver`) and state only through `StateStore`.

pub mod coordinator;
mod error;
pub mod hooks;
pub mod lifecycle;
mod runner;
pub mod spare_dirs;

pub use error::AllocError;
pub use hooks::{AllocDirHook, AllocHook, AllocHookContext};
pub use lifecycle::RunnerState;
pub use runner::{AllocRunner, AllocRunnerConfig, AllocUsage, DEFAULT_POSTSTOP_TIMEOUT};
pub use spare_dirs::SpareDirs;
