//! Task cgroups as the drivers use them: which tasks get a cgroup, and the signals a kill by
//! cgroup needs (wharf-isolate owns the cgroup files, this crate every signal to a task).
//!
//! A driver is given [`TaskCgroups`]: the node's [`Cgroups`] manager, or the reason there is
//! none (then tasks run as plain processes, and the driver says so once in the log). For each
//! task it asks [`TaskCgroups::cgroup_for`] for a cgroup with the task's limits, passes the
//! cgroup's files to join it through to the shim (the first step of a
//! [`wharf_isolate::Containment`]), whose child joins it between clone and exec, and later
//! kills ([`kill_cgroup`]), measures ([`usage`]) and removes it.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use wharf_driver::{DriverError, ResourceUsage, TaskConfig, UsageSource};
use wharf_isolate::cgroup::CgroupStats;
use wharf_isolate::{Cgroups, IsolateError, TaskCgroup};

use crate::handle::Identity;
use crate::sys::{self, Pid};

/// Whether a driver's tasks get cgroups, and from which manager.
#[derive(Debug, Clone)]
pub enum TaskCgroups {
    /// Each task in a cgroup of its own, under the node's manager.
    On(Arc<Cgroups>),
    /// Plain processes, and why (cgroups not writable here, or turned off).
    Off {
        /// Why, for the log and the fingerprint.
        reason: String,
    },
}

impl Default for TaskCgroups {
    fn default() -> Self {
        TaskCgroups::Off { reason: "no cgroup manager was given to the driver".into() }
    }
}

impl TaskCgroups {
    /// The node's cgroup manager, if tasks get cgroups.
    pub fn manager(&self) -> Option<&Arc<Cgroups>> {
        match self {
            TaskCgroups::On(cgroups) => Some(cgroups),
            TaskCgroups::Off { .. } => None,
        }
    }

    /// A description for a fingerprint: `cgroup v1 under /sys/fs/cgroup/...`, or why none.
    pub fn describe(&self) -> String {
        match self {
            TaskCgroups::On(cgroups) => format!(
                "cgroup {} under {}",
                cgroups.version(),
                cgroups.parents().first().map(|p| p.display().to_string()).unwrap_or_default()
            ),
            TaskCgroups::Off { reason } => format!("none: {reason}"),
        }
    }

    /// The cgroup for a task about to start, with the limits of its resources; `None` if it
    /// runs uncontained. `hard_limit_period` is set when the task asks for `cpu_hard_limit`,
    /// which cannot be honoured without a cgroup: that is an error naming the field. A kernel
    /// that refuses the cgroup for lack of permission makes the task run uncontained (said once
    /// in the log, through `warned`); any other failure fails the start.
    pub(crate) fn cgroup_for(
        &self,
        config: &TaskConfig,
        hard_limit_period: Option<u64>,
        warned: &AtomicBool,
    ) -> Result<Option<TaskCgroup>, DriverError> {
        let no_cgroup = |reason: &str| {
            if hard_limit_period.is_some() {
                return Err(DriverError::invalid_config(
                    "config.cpu_hard_limit",
                    format!("needs a cgroup, which this node cannot give: {reason}"),
                ));
            }
            if !warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(%reason, "tasks run without cgroups: no limits, no OOM reports, stats from /proc");
            }
            Ok(None)
        };
        let cgroups = match self {
            TaskCgroups::On(cgroups) => cgroups,
            TaskCgroups::Off { reason } => return no_cgroup(reason),
        };
        let limits = cgroups.limits(&config.resources, hard_limit_period);
        match cgroups.create(&config.id.0, &limits, &mut kill_frozen) {
            Ok(cgroup) => Ok(Some(cgroup)),
            Err(error @ IsolateError::NotEnoughCores { .. }) => {
                Err(DriverError::Retryable { reason: error.to_string() })
            }
            Err(error) if error.is_permission() => no_cgroup(&error.to_string()),
            Err(error) => {
                Err(DriverError::other(format!("cannot make the task's cgroup: {error}")))
            }
        }
    }
}

/// SIGKILL to a process read from a frozen cgroup. Frozen, it cannot fork, and under v1's
/// freezer cannot exit either, so its pid is its own until the thaw: the pidfd opened now is
/// for that very process. (v2's freeze lets a fatal signal through: a process another sender
/// killed meanwhile may exit, but its pid is handed out again only once the kernel's pid
/// counter has come round, not in the moment between the read and this open.)
fn kill_frozen(pid: i32) -> io::Result<()> {
    let pid = Pid::new(pid.into()).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let pidfd = sys::pidfd_open(pid)?;
    sys::pidfd_signal(&pidfd, libc::SIGKILL)
}

/// Kills every process of a task's cgroup, escaped ones included. `main` is the task's main
/// process, whose shim is alive.
///
/// When the cgroup holds the main process alone, as most tasks' do, it is killed through its
/// identity-checked pidfd, without freezing the cgroup: a child it forks meanwhile is a
/// descendant of the shim, which kills whatever the task left when its main process dies, and
/// the cgroup is killed whole again when the task is destroyed. Otherwise the cgroup is frozen
/// and killed on tokio's blocking pool: a freeze may wait (bounded) for its processes to stop.
pub(crate) async fn kill_cgroup(cgroup: &TaskCgroup, main: &Identity) -> Result<(), DriverError> {
    let failed = |e: &dyn std::fmt::Display| {
        DriverError::other(format!("cannot kill the task's cgroup: {e}"))
    };
    let pids = cgroup.pids().map_err(|e| failed(&e))?;
    if let ([only], Some(pid)) = (pids.as_slice(), main.pid)
        && *only == pid.get()
        && let Some(pidfd) = main.open()?
    {
        return match sys::pidfd_signal(&pidfd, libc::SIGKILL) {
            Err(e) if e.raw_os_error() != Some(libc::ESRCH) => Err(failed(&e)),
            _ => Ok(()),
        };
    }
    let cgroup = cgroup.clone();
    tokio::task::spawn_blocking(move || cgroup.kill_all(&mut kill_frozen))
        .await
        .map_err(|e| failed(&e))?
        .map(drop)
        .map_err(|e| failed(&e))
}

/// Kills what is left in a task's cgroup and removes it, on tokio's blocking pool (a freeze,
/// and a removal while the last processes exit, wait a little), logging what fails: the
/// orphan sweep of the next agent start tries again.
pub(crate) async fn discard(cgroups: Arc<Cgroups>, cgroup: TaskCgroup) {
    let name = cgroup.name().to_owned();
    let result = tokio::task::spawn_blocking(move || discard_now(&cgroups, &cgroup)).await;
    let error = match result {
        Ok(Ok(())) => return,
        Ok(Err(error)) => error.to_string(),
        Err(error) => error.to_string(),
    };
    tracing::warn!(cgroup = %name, %error, "cannot remove the task's cgroup");
}

/// [`discard`] on the calling thread, for a start that failed: its cgroup holds at most the
/// task's process, which never ran its program.
pub(crate) fn discard_now(cgroups: &Cgroups, cgroup: &TaskCgroup) -> Result<(), IsolateError> {
    cgroup.kill_all(&mut kill_frozen).and_then(|_| cgroups.remove(cgroup))
}

/// Kills and removes the task cgroups under the node's parent that no driver made or adopted:
/// what tasks an earlier agent lost track of left. The node calls it once its allocations are
/// restored. Returns the names removed.
pub fn remove_orphan_cgroups(cgroups: &Cgroups) -> Vec<String> {
    cgroups.remove_orphans(&mut kill_frozen)
}

/// Kills every task under the node's cgroup parent and removes every cgroup there, the parent
/// included: a node being wiped.
pub fn destroy_cgroups(cgroups: &Cgroups) -> Result<(), IsolateError> {
    cgroups.destroy_all(&mut kill_frozen)
}

/// A cgroup's stats as the driver interface reports usage.
pub(crate) fn usage(stats: &CgroupStats) -> ResourceUsage {
    ResourceUsage {
        cpu_time: stats.cpu_total,
        memory_rss_bytes: stats.memory_rss,
        processes: u32::try_from(stats.processes).unwrap_or(u32::MAX),
        at: None,
        cpu_user: stats.cpu_user,
        cpu_system: stats.cpu_system,
        cpu_throttled_periods: stats.cpu_throttled_periods,
        cpu_throttled: stats.cpu_throttled,
        memory_cache_bytes: stats.memory_cache,
        memory_swap_bytes: stats.memory_swap,
        memory_max_usage_bytes: stats.memory_max_usage,
        source: UsageSource::Cgroup,
    }
}
