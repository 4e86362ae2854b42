//! What a raw_exec [`wharf_driver::TaskHandle`] carries in `driver_state`: everything
//! recovery needs, and nothing it would have to trust blindly.
//!
//! ```json
//! {"version": 1, "boot_id": "…", "shim_pid": 4242, "shim_start_ticks": 912345,
//!  "task_pid": 4243, "task_start_ticks": 912346,
//!  "run_dir": "/data/allocs/a1/web/.raw_exec/a1_web_00000000", "work_dir": "/data/allocs/a1/web",
//!  "cgroup": {"name": "a1.web.00000000", "cores": "2"}}
//! ```
//!
//! `cgroup` is there when the task runs in a cgroup of its own (version 2; version 1 handles,
//! written before tasks had cgroups, are still read): its name, and the cores it reserved, so
//! a restarted agent gives them to nobody else. `user` is there for an `exec` task: the
//! workload user it runs as (its lease is kept by wharf-isolate's journal, not here);
//! `pid_namespace` when the task is pid 1 of a namespace of its own, whose signals the driver
//! then completes (see `RawExecDriver::signal_group`).
//!
//! A pid alone names whichever process holds that number now; with its start time (ticks since
//! boot, from `/proc/<pid>/stat`) and the boot id it names one process for good. Handles are
//! read back from disk, so [`ShimState::from_value`] checks every field and refuses, rather
//! than guesses at, anything odd: a pid of 0, 1 or below would make `kill` reach far more
//! than one task.

use crate::error::ExecError;
use crate::sys::{self, Pid, ProcStat};
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use wharf_driver::DriverState;
use wharf_isolate::CpuSet;

/// The version of [`ShimState`]'s shape.
pub(crate) const DRIVER_STATE_VERSION: u32 = 2;
/// The oldest version still read.
const OLDEST_DRIVER_STATE_VERSION: u32 = 1;

/// The driver's part of a task handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShimState {
    /// [`DRIVER_STATE_VERSION`] when written.
    pub(crate) version: u32,
    /// The boot the pids below belong to.
    pub(crate) boot_id: String,
    /// The shim, the task's parent.
    pub(crate) shim_pid: i64,
    /// The shim's start time, in clock ticks since boot.
    pub(crate) shim_start_ticks: u64,
    /// The task's main process, also its process group and session id.
    pub(crate) task_pid: i64,
    /// Its start time, in clock ticks since boot.
    pub(crate) task_start_ticks: u64,
    /// The shim's directory: exit record and diagnostics.
    pub(crate) run_dir: PathBuf,
    /// The task's working directory (for exec).
    pub(crate) work_dir: PathBuf,
    /// The task's cgroup, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cgroup: Option<CgroupState>,
    /// The workload user (uid and gid) an `exec` task runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<u32>,
    /// Whether the task's main process is the first of a PID namespace of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) pid_namespace: bool,
}

/// What a handle records of a task's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CgroupState {
    /// Its name under the node's cgroup parent.
    pub(crate) name: String,
    /// The cores it reserved, in the kernel's list format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cores: Option<String>,
}

impl ShimState {
    /// As stored in the handle.
    pub(crate) fn to_state(&self) -> DriverState {
        // Plain fields and string keys: it always writes as JSON.
        DriverState::from_serialize(self).unwrap_or_default()
    }

    /// Reads a handle's driver state, checking every field.
    pub(crate) fn from_state(state: &DriverState) -> Result<ShimState, ExecError> {
        ShimState::from_value(&state.value())
    }

    /// Reads a handle's driver state, checking every field.
    pub(crate) fn from_value(value: &serde_json::Value) -> Result<ShimState, ExecError> {
        let bad = |reason: String| ExecError::BadHandle { reason };
        let version = value
            .get("version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad("no version in the driver state".into()))?;
        let readable = u64::from(OLDEST_DRIVER_STATE_VERSION)..=u64::from(DRIVER_STATE_VERSION);
        if !readable.contains(&version) {
            return Err(bad(format!(
                "driver state version {version}; this wharf reads versions \
                 {OLDEST_DRIVER_STATE_VERSION} to {DRIVER_STATE_VERSION}"
            )));
        }
        let state = ShimState::deserialize(value).map_err(|e| bad(e.to_string()))?;
        for (what, pid) in [("shim_pid", state.shim_pid), ("task_pid", state.task_pid)] {
            if Pid::new(pid).is_none() {
                return Err(bad(format!("{what} {pid} is not a process a task can have")));
            }
        }
        for (what, dir) in [("run_dir", &state.run_dir), ("work_dir", &state.work_dir)] {
            if !dir.is_absolute() {
                return Err(bad(format!("{what} {} is not absolute", dir.display())));
            }
        }
        if let Some(cores) = state.cgroup.as_ref().and_then(|c| c.cores.as_ref()) {
            CpuSet::parse(cores).map_err(|e| bad(format!("cgroup cores: {e}")))?;
        }
        Ok(state)
    }

    /// The shim's identity.
    pub(crate) fn shim(&self) -> Identity {
        Identity { pid: Pid::new(self.shim_pid), start_ticks: self.shim_start_ticks }
    }

    /// The cores the task's cgroup reserved.
    pub(crate) fn cores(&self) -> Option<CpuSet> {
        CpuSet::parse(self.cgroup.as_ref()?.cores.as_deref()?).ok()
    }

    /// The task's main process's identity.
    pub(crate) fn task(&self) -> Identity {
        Identity { pid: Pid::new(self.task_pid), start_ticks: self.task_start_ticks }
    }
}

/// One process, for good: a pid and the time it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    /// `None` only for states that failed validation; such identities match nothing.
    pub(crate) pid: Option<Pid>,
    pub(crate) start_ticks: u64,
}

impl Identity {
    /// A pidfd for this very process if it still exists (running, or exited and not yet
    /// reaped); `None` if its pid is free or belongs to another process now. The pidfd is
    /// opened before the start time is checked, so once the check passes it cannot refer to a
    /// later holder of the pid.
    pub(crate) fn open(&self) -> Result<Option<OwnedFd>, ExecError> {
        let Some(pid) = self.pid else { return Ok(None) };
        let pidfd = match sys::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
            Err(source) => return Err(ExecError::Sys { call: "pidfd_open", source }),
        };
        Ok(self.is_current().then_some(pidfd))
    }

    /// Whether the process holding this pid now is this one (alive or a zombie).
    pub(crate) fn is_current(&self) -> bool {
        self.pid
            .and_then(|pid| ProcStat::read(pid.get()))
            .is_some_and(|stat| stat.start_ticks == self.start_ticks)
    }

    /// Whether this very process runs (exists and has not exited).
    pub(crate) fn is_running(&self) -> bool {
        self.pid
            .and_then(|pid| ProcStat::read(pid.get()))
            .is_some_and(|stat| stat.start_ticks == self.start_ticks && !stat.is_dead())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> serde_json::Value {
        json!({
            "version": 1, "boot_id": "b", "shim_pid": 100, "shim_start_ticks": 5,
            "task_pid": 101, "task_start_ticks": 6, "run_dir": "/r", "work_dir": "/w",
            "cgroup": {"name": "a.t.0", "cores": "1-2"}
        })
    }

    fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
        let mut state = good();
        state[field] = value;
        state
    }

    #[test]
    fn a_written_state_reads_back() {
        let state = ShimState::from_value(&good()).unwrap();
        assert_eq!(ShimState::from_state(&state.to_state()).unwrap(), state);
        assert_eq!(state.cores().unwrap().to_string(), "1-2");
    }

    #[test]
    fn version_1_states_without_a_cgroup_still_read() {
        let mut old = good();
        old["version"] = json!(1);
        old.as_object_mut().unwrap().remove("cgroup");
        let state = ShimState::from_value(&old).unwrap();
        assert_eq!((state.cgroup, state.version), (None, 1));
    }

    #[test]
    fn garbage_states_are_refused_with_a_reason() {
        let mut missing = good();
        missing.as_object_mut().unwrap().remove("task_pid");
        let mut extra = good();
        extra["surprise"] = json!(1);
        for (value, reason) in [
            (json!(null), "no version"),
            (json!("text"), "no version"),
            (json!([1, 2]), "no version"),
            (with("version", json!(3)), "driver state version 3"),
            (with("version", json!(0)), "driver state version 0"),
            (with("cgroup", json!({"name": "x", "cores": "a-b"})), "cgroup cores"),
            (with("cgroup", json!({"name": "x", "more": 1})), "unknown field `more`"),
            (with("version", json!("1")), "no version"),
            (missing, "missing field `task_pid`"),
            (extra, "unknown field `surprise`"),
            (with("shim_pid", json!(0)), "shim_pid 0"),
            (with("shim_pid", json!(1)), "shim_pid 1"),
            (with("task_pid", json!(-5)), "task_pid -5"),
            (with("task_pid", json!(1u64 << 40)), "task_pid 1099511627776"),
            (with("task_pid", json!("42")), "invalid type"),
            (with("shim_start_ticks", json!(-1)), "invalid value"),
            (with("run_dir", json!("relative")), "run_dir relative is not absolute"),
            (with("work_dir", json!("")), "work_dir  is not absolute"),
        ] {
            match ShimState::from_value(&value) {
                Err(ExecError::BadHandle { reason: r }) => {
                    assert!(r.contains(reason), "{value}: {r}")
                }
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn identities_match_only_their_own_process() {
        let me = ProcStat::read(sys::getpid()).unwrap();
        let pid = Pid::new(sys::getpid().into());
        let mine = Identity { pid, start_ticks: me.start_ticks };
        assert!(mine.is_current() && mine.is_running());
        assert!(mine.open().unwrap().is_some());
        let impostor = Identity { pid, start_ticks: me.start_ticks + 1 };
        assert!(!impostor.is_current() && !impostor.is_running());
        assert!(impostor.open().unwrap().is_none());
        let nobody = Identity { pid: None, start_ticks: 0 };
        assert!(nobody.open().unwrap().is_none());
    }
}
