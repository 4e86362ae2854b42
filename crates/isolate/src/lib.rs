//! OS containment for wharf's drivers: cgroups (v1 and v2), Landlock, workload users.
//!
//! A driver asks this crate for a contained place to run a task; it never writes cgroup files
//! or makes Landlock calls itself. Nothing here needs tokio, so the per-task shim can use it.
//! Which drivers contain what, and how, is described in `docs/ARCHITECTURE.md`.
//!
//! The isolated `exec` driver's containment, module by module:
//! - [`users`]: workload users, one uid (and gid) per task from a configured range, leased in
//!   a journal file so that an agent restart never reuses a live one;
//! - [`landlock`]: the file system a task can reach (`unveil` entries, the node's default
//!   system paths), signals and abstract sockets scoped to the task;
//! - [`namespace`]: private PID (with the task's own `/proc`) and IPC namespaces;
//! - [`privileges`]: the `no_new_privs` flag;
//! - [`Containment`]: one task's plan, carried on the shim's command line, and
//!   [`Prepared::apply`], the steps the task's process takes between fork and exec;
//! - `sys`: the system calls, each behind a small safe function.

#[cfg(not(target_os = "linux"))]
compile_error!("wharf-isolate contains tasks with Linux system calls (Landlock, namespaces)");

mod contain;
mod error;
pub mod landlock;
pub mod namespace;
pub mod privileges;
mod sys;
pub mod users;

pub use contain::{Containment, Failure, Prepared, Step};
pub use error::IsolateError;
