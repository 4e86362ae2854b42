#![doc = include_str!("../README.md")]
//!
//! ## Inside
//!
//! A driver asks this crate for a contained place to run a task; it never writes cgroup files
//! or makes Landlock calls itself. Nothing here needs tokio, so the per-task shim can use it.
//! Which drivers contain what, and how, is described in `docs/ARCHITECTURE.md`.
//!
//! Every task's cgroup (raw_exec's where the node can give one, the isolated `exec` driver's
//! always):
//! - [`cgroup`]: the node's task cgroups ([`Cgroups`]) and one task's ([`TaskCgroup`]):
//!   limits from `resources`, reserved cores, kills nothing escapes, stats, OOM;
//! - [`host`]: the node's CPUs and memory, for admission and CPU quotas;
//! - [`cpuset`]: CPU sets in the kernel's list format.
//!
//! The isolated `exec` driver's containment, module by module:
//! - [`users`]: workload users, one uid (and gid) per task from a configured range, leased in
//!   a journal file so that an agent restart never reuses a live one;
//! - [`dirs`]: directories a task can write, as root works in them (the task runner, the
//!   driver): every path below them resolved without following a link, modes and owners
//!   changed through the open directory;
//! - [`landlock`]: the file system a task can reach (`unveil` entries, the node's default
//!   system paths), signals and abstract sockets scoped to the task;
//! - [`namespace`]: private PID (with the task's own `/proc`) and IPC namespaces;
//! - [`privileges`]: the `no_new_privs` flag;
//! - [`Containment`]: one task's plan, carried on the shim's command line, and
//!   [`Prepared::apply`], the steps the task's process takes between fork and exec (joining
//!   its cgroup first);
//! - `sys`: the system calls, each behind a small safe function ([`wharf_nolibc`]'s
//!   `open_beneath`, `mkdirat` and `getdents` for [`dirs`], which the static shim shares).
//!
//! Signals are not sent here: wharf-exec owns every signal to a task's processes, so a kill by
//! cgroup takes the sending as a function ([`TaskCgroup::kill_all`]).

#[cfg(not(target_os = "linux"))]
compile_error!(
    "wharf-isolate contains tasks with Linux system calls (cgroups, Landlock, namespaces)"
);

pub mod cgroup;
mod containment;
pub mod cpuset;
pub mod dirs;
mod error;
pub mod host;
pub mod landlock;
pub mod namespace;
pub mod privileges;
mod sys;
pub mod users;

pub use cgroup::{CgroupOptions, CgroupParent, Cgroups, TaskCgroup};
pub use containment::{BindMount, Containment, ContainmentFailure, ContainmentStep, Prepared};
pub use cpuset::CpuSet;
pub use error::IsolateError;
pub use host::Host;
