//! One task run's cgroup ([`TaskCgroup`]): the files its process joins it through, its
//! processes, a kill nothing in it escapes, its OOM record and its stats. Its directories come
//! from the node's cgroups (`super::Cgroups`), and what differs between v1 and v2 from the
//! manager it holds (`super::manager`).
//!
//! Killing: where the kernel has a file for it (v2's `cgroup.kill`, Linux 5.14) the cgroup is
//! killed at once; otherwise it is frozen (v1's freezer, v2's `cgroup.freeze`), every process
//! in it is sent SIGKILL while none can fork, and it is thawed so they die. The signal itself
//! is the caller's to send (wharf-exec owns every signal to a task's processes):
//! [`TaskCgroup::kill_all`] hands it each pid, and a frozen process keeps its pid, so the pid
//! names the process it was read for. (v1's freezer holds even a killed process until the
//! thaw; v2's lets a fatal signal through, so there a process killed meanwhile leaves the
//! freeze to exit.)

use super::limits::Limits;
use super::manager::{CgroupManager, Controller, OomRecord, TaskDir, TaskDirs, Version};
use super::stats::{self, CgroupStats};
use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a freeze may take before the kill goes ahead on what was read.
const FREEZE_LIMIT: Duration = Duration::from_secs(1);

/// One task run's cgroup. Clones share its name, directories and the files they keep open:
/// a driver holds one for each running task, and its exit watcher another.
#[derive(Debug, Clone)]
pub struct TaskCgroup {
    pub(crate) dirs: TaskDirs,
    manager: Arc<dyn CgroupManager>,
}

impl TaskCgroup {
    /// The cgroup `name` with the directories `dirs` (whether or not they exist yet).
    pub(crate) fn new(
        name: &str,
        dirs: Vec<TaskDir>,
        cores: Option<CpuSet>,
        manager: Arc<dyn CgroupManager>,
    ) -> TaskCgroup {
        let dirs = TaskDirs { name: name.into(), dirs: dirs.into(), cores, files: Arc::default() };
        TaskCgroup { dirs, manager }
    }

    /// Its name: `<alloc>.<task>.<run>` of the task run's id.
    pub fn name(&self) -> &str {
        &self.dirs.name
    }

    /// The hierarchy it is in.
    pub fn version(&self) -> Version {
        self.manager.version()
    }

    /// The cores reserved for it, if any.
    pub fn cores(&self) -> Option<&CpuSet> {
        self.dirs.cores.as_ref()
    }

    /// Its directories, one per hierarchy (v2: one).
    pub fn dirs(&self) -> Vec<&Path> {
        self.dirs.dirs.iter().map(|d| d.path.as_path()).collect()
    }

    /// The file of each of its directories that a process joins it through by writing `0`
    /// ([`crate::Containment::cgroup`]), between fork and exec while it has one thread.
    ///
    /// v1: `tasks`, which moves the writing thread, the whole of a process with one thread.
    /// `cgroup.procs` would move the thread group, which on v1 takes the kernel's lock on
    /// every thread group for writing (`cgroup_threadgroup_rwsem`) and waits out an RCU grace
    /// period for it whenever no other migration came just before: a few milliseconds on an
    /// idle machine, ten and more on a busy one, in every start. v2: `cgroup.procs`.
    pub fn join_files(&self) -> Vec<PathBuf> {
        let file = self.manager.join_file();
        self.dirs.dirs.iter().map(|d| d.path.join(file)).collect()
    }

    /// Writes the limits of a cgroup just made.
    pub(crate) fn apply(&self, limits: &Limits) -> Result<(), IsolateError> {
        self.manager.apply(&self.dirs, limits)
    }

    /// The directory whose `cgroup.procs` lists every process of the task.
    fn procs_dir(&self) -> Result<&Path, IsolateError> {
        self.dirs.need(self.manager.procs_controller())
    }

    /// The processes in it (thread group ids), as they are now.
    pub fn pids(&self) -> Result<Vec<i32>, IsolateError> {
        let path = self.procs_dir()?.join("cgroup.procs");
        // Opened afresh for every read, unlike the other files: v1 lists `cgroup.procs` once
        // per open file and serves that list again to every read that follows within a second
        // of the one before, so a kill that read it through a file kept open would miss what
        // joined or was forked since, and a removal would wait for processes long gone.
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // Gone: it holds nothing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            // Removed while it was read.
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(Vec::new()),
            Err(source) => return Err(IsolateError::Io { path, source }),
        };
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Kills every process in it, escaped ones included: `cgroup.kill` where the kernel has
    /// it, else freeze, `kill` each pid (SIGKILL, sent by the caller), thaw. Returns how many
    /// processes were handed to `kill` (0 with `cgroup.kill`, which does it all at once).
    pub fn kill_all(
        &self,
        kill: &mut dyn FnMut(i32) -> io::Result<()>,
    ) -> Result<usize, IsolateError> {
        let Some(kill_file) = self.manager.kill_file() else {
            return self.kill_all_frozen(kill);
        };
        let dir = self.procs_dir()?;
        // An empty cgroup (or one that is gone) has nothing to kill.
        if self.pids()?.is_empty() {
            return Ok(0);
        }
        self.dirs.files.write(&dir.join(kill_file), "1")?;
        Ok(0)
    }

    /// Kills every process in it as [`TaskCgroup::kill_all`] does where the kernel has no
    /// `cgroup.kill` (v1, and v2 before Linux 5.14): the cgroup is frozen, so that none of its
    /// processes can fork; each is handed to `kill`; the cgroup is thawed, and they take their
    /// SIGKILL. Returns how many were handed to `kill`.
    pub fn kill_all_frozen(
        &self,
        kill: &mut dyn FnMut(i32) -> io::Result<()>,
    ) -> Result<usize, IsolateError> {
        let dir = self.procs_dir()?;
        // An empty cgroup (or one that is gone) has nothing to kill.
        if self.pids()?.is_empty() {
            return Ok(0);
        }
        self.manager.set_frozen(&self.dirs.files, dir, true)?;
        if !self.wait_frozen(dir) {
            tracing::warn!(cgroup = %self.dirs.name, "the cgroup did not freeze in time; killing what it holds anyway");
        }
        let pids = self.pids();
        let mut sent = 0;
        for pid in pids.iter().flatten().copied().filter(|pid| *pid > 1) {
            match kill(pid) {
                Ok(()) => sent += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    tracing::warn!(cgroup = %self.dirs.name, pid, error = %e, "cannot kill a process of the cgroup")
                }
            }
        }
        // Thawed, the processes take their SIGKILL.
        self.manager.set_frozen(&self.dirs.files, dir, false)?;
        pids.map(|_| sent)
    }

    /// Waits (bounded) until the freeze has taken: no process of the cgroup runs.
    fn wait_frozen(&self, dir: &Path) -> bool {
        let is_frozen = || self.manager.is_frozen(&self.dirs.files, dir);
        // Frozen at once, as a sleeping process is; else a running one needs a CPU to reach
        // the freezer, which the first waits give it.
        for _ in 0..3 {
            if is_frozen() {
                return true;
            }
            std::thread::yield_now();
        }
        let mut wait = Duration::from_micros(100);
        let mut waited = Duration::ZERO;
        loop {
            if is_frozen() {
                return true;
            }
            if waited >= FREEZE_LIMIT {
                return false;
            }
            std::thread::sleep(wait);
            waited += wait;
            wait = (wait * 2).min(Duration::from_millis(50));
        }
    }

    /// Whether the kernel's OOM killer has killed a process in it: the `oom_kill` count of
    /// v1's `memory.oom_control` (Linux 4.13) or v2's `memory.events`. A kernel without the
    /// count gives [`OomRecord::NotCounted`]: whether a process of the task hit its limit
    /// (`memory.failcnt`) says nothing of how any process ended.
    pub fn oom_killed(&self) -> Result<OomRecord, IsolateError> {
        let memory = self.dirs.need(Controller::Memory)?;
        let file = self.manager.oom_file();
        let text = self.dirs.files.read(&memory.join(file))?;
        let record = match stats::field(&text, "oom_kill") {
            Some(0) => OomRecord::NotKilled,
            Some(_) => OomRecord::Killed,
            None => OomRecord::NotCounted,
        };
        if record == OomRecord::NotCounted {
            tracing::debug!(cgroup = %self.dirs.name, file, "the kernel counts no OOM kills here");
        }
        Ok(record)
    }

    /// What the task has used (see [`CgroupStats`] for where each figure comes from).
    pub fn stats(&self) -> Result<CgroupStats, IsolateError> {
        self.manager.stats(&self.dirs)
    }
}
