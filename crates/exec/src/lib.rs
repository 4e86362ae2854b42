#![doc = include_str!("../README.md")]
//!
//! ## Inside
//!
//! Modules, in the order a task meets them:
//! - [`config`]: the task's `config` block (`command`, `args`, `work_dir`) and how the command
//!   is found (the task's `PATH`);
//! - `launch`: starting a shim on the `posix_spawn` fast path, its start report, the watcher
//!   that learns the exit;
//! - [`shim`]: the shim itself (the `wharf-shim` binary is one line around [`shim::main`]), with
//!   its size-rotated log files, on [`wharf_nolibc`]'s system calls; `protocol`: what agent and
//!   shim say to each other (command line, start report, exit record);
//! - `handle`: the versioned `driver_state` of a [`wharf_driver::TaskHandle`] and the identity
//!   checks (pid plus start time, pidfds) that keep a reused pid from ever being signalled;
//! - `raw_exec`: [`RawExecDriver`], the [`wharf_driver::Driver`] implementation;
//! - `exec` and `stats`: commands run in a task's context, and its usage from `/proc`;
//! - [`process`]: the one kill of a process that is not a task (an agent wiped with its node);
//! - `sys`: the system calls, and all of the crate's `unsafe` code but the calls into it that
//!   carry a safety contract (the shim's entry point closes inherited descriptors);
//! - `output`: reading a task's output back (`Driver::task_logs`);
//! - [`housekeeping`]: what is freed after a task has ended, on one thread of the lowest
//!   priority, so that it never competes with tasks' starts and stops;
//! - `task_cgroups`: [`TaskCgroups`], the node's cgroups as the drivers use them: a cgroup per
//!   task with its limits, kills by cgroup (this crate sends the signals, wharf-isolate writes
//!   the cgroup files), stats and OOM kills from it, and the sweep of orphaned cgroups.
//! - `isolation` and `isolated`: the `exec` driver ([`ExecDriver`], after Nomad's exec2): a
//!   [`RawExecDriver`] that leases each task a workload user, hands it its directories, and
//!   asks the shim's child to contain it (cgroup, user, `no_new_privs`, Landlock, PID and IPC
//!   namespaces) with a [`wharf_isolate::Containment`]; its config block ([`ExecConfig`]) and
//!   node settings ([`ExecOptions`]).
//!
//! What this crate does not do: the containment system calls and cgroup files (wharf-isolate's;
//! raw_exec tasks see the node's files and run as the agent's user) and persistence (the task
//! runner stores the handle; this crate only writes into each run's directory). Without a
//! cgroup manager, raw_exec tasks run as plain processes (no limits, `oom_killed` always
//! false) and `exec` starts none.
//!
//! Environment: a task gets exactly [`wharf_driver::TaskConfig::env`], nothing inherited from
//! the agent. A bare command is looked up in that `PATH`, or in [`config::DEFAULT_PATH`] if
//! it has none (the default is not added to the task's environment).
//!
//! Reaping: the agent reaps only the shims it spawned and the commands of `exec_task`, each by
//! its pid; the shim reaps the task and everything it leaves behind. Nothing calls
//! `waitpid(-1)` in the agent. A shim's exit means the task's whole process tree is gone.
//!
//! Tokio: the driver needs a runtime with I/O and time enabled (pidfds and pipes are watched
//! with `AsyncFd`); the shim has no runtime at all.

#[cfg(not(target_os = "linux"))]
compile_error!("wharf-exec runs tasks with Linux system calls (pidfds, signalfd, subreapers)");

pub mod config;
mod error;
mod exec;
mod handle;
pub mod housekeeping;
mod isolated;
mod isolation;
mod launch;
mod output;
pub mod process;
mod protocol;
mod raw_exec;
pub mod shim;
mod stats;
mod sys;
mod task_cgroups;

pub use config::RawExecConfig;
pub use error::ExecError;
pub use exec::OUTPUT_LIMIT;
pub use protocol::SHIM_NAME;
pub use raw_exec::{DRIVER_NAME, EXEC_RUNS_DIR, RUNS_DIR, RawExecDriver, RawExecOptions};
pub use task_cgroups::{TaskCgroups, destroy_cgroups, remove_orphan_cgroups};

pub use isolated::ExecDriver;
pub use isolation::{EXEC_DRIVER_NAME, ExecConfig, ExecOptions, NamespaceMode};
/// The driver interface this crate implements, so that a user of raw_exec alone needs no
/// other wharf dependency: `wharf_exec::driver::{Driver, TaskConfig}`.
pub use wharf_driver as driver;
