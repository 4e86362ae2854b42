//! What differs between cgroup v1 and v2, behind one trait: a [`CgroupManager`] per version
//! (`super::v1::V1Manager`, `super::v2::V2Manager`), as youki's libcgroups has one manager per
//! hierarchy behind its `CgroupManager` trait. The version is chosen once, when the node's
//! [`super::Cgroups`] detects the host; from then on the node's cgroups and every
//! [`super::TaskCgroup`] hold that manager and ask it wherever the versions differ: where the
//! parent's partitions and the task cgroups live, which file a process joins through, how
//! limits are written, how a cgroup is frozen or killed at once, where the OOM count and the
//! stats are. What is the same on both (locking the parent, the books of reserved cores,
//! adoption, orphans, the freeze-kill's steps, the files kept open) is written once, in the
//! modules that hold the manager and in `super::files`.
//!
//! Also here: the values both versions speak of ([`Version`], [`Controller`], [`OomRecord`]),
//! and one task's directories and open files as a manager sees them ([`TaskDirs`]).

use super::files::OpenFiles;
use super::limits::Limits;
use super::stats::{self, CgroupStats};
use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which cgroup hierarchy a host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// The legacy hierarchy: one mount per controller (or group of controllers).
    V1,
    /// The unified hierarchy.
    V2,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        })
    }
}

/// What a task's cgroup says of the kernel's OOM killer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomRecord {
    /// It killed a process of the task.
    Killed,
    /// It killed none.
    NotKilled,
    /// The kernel counts no OOM kills (v1 before Linux 4.13): nobody can tell.
    NotCounted,
}

/// A cgroup controller wharf uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Controller {
    /// Memory limits, accounting and OOM.
    Memory,
    /// CPU weight and quota (v2: also CPU accounting).
    Cpu,
    /// v1's CPU accounting.
    Cpuacct,
    /// Reserved cores.
    Cpuset,
    /// The process limit.
    Pids,
    /// v1's freezer, for kills nothing escapes.
    Freezer,
}

impl Controller {
    /// Its name, as v1's mount options and v2's `cgroup.controllers` write it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Cpuset => "cpuset",
            Controller::Pids => "pids",
            Controller::Freezer => "freezer",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Controller> {
        [
            Controller::Memory,
            Controller::Cpu,
            Controller::Cpuacct,
            Controller::Cpuset,
            Controller::Pids,
            Controller::Freezer,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}

/// The names `share` and `reserve` are the partitions; a task cgroup's name has a `.`.
pub(crate) const SHARE: &str = "share";
pub(crate) const RESERVE: &str = "reserve";

/// Where the parent goes in one hierarchy, as the node's options place it.
#[derive(Debug, Clone)]
pub(crate) struct ParentSite {
    /// The controllers of the hierarchy that wharf uses.
    pub(crate) controllers: Vec<Controller>,
    /// The agent's own cgroup in the hierarchy.
    pub(crate) own: PathBuf,
    /// Where the parent's path starts: the agent's own cgroup, or the hierarchy's root.
    pub(crate) base: PathBuf,
    /// The parent.
    pub(crate) parent: PathBuf,
}

/// Each hierarchy's controllers and the parent directory in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) controllers: Vec<Controller>,
    pub(crate) parent: PathBuf,
}

/// Where reserved and shared cores are written, where the cpuset controller can keep the books.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CpusetDirs {
    pub(crate) share: PathBuf,
    pub(crate) reserve: PathBuf,
}

impl CpusetDirs {
    /// The partitions under `parent`.
    pub(crate) fn under(parent: &Path) -> CpusetDirs {
        CpusetDirs { share: parent.join(SHARE), reserve: parent.join(RESERVE) }
    }
}

/// A manager just set up: the parent made and locked in each hierarchy.
pub(crate) struct Opened {
    pub(crate) manager: Arc<dyn CgroupManager>,
    /// The locks on the parents, held while the node's cgroups live.
    pub(crate) locks: Vec<OwnedFd>,
    /// The cores tasks may reserve and share (none where no cpuset keeps the books).
    pub(crate) usable: CpuSet,
}

/// One directory of a task's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskDir {
    pub(crate) controllers: Vec<Controller>,
    pub(crate) path: PathBuf,
    /// False for the shared cpuset a v1 task without reserved cores joins: not the task's to
    /// remove.
    pub(crate) owned: bool,
}

/// One task run's cgroup as a manager sees it: its directories, its reserved cores and the
/// files it keeps open. Clones share the directories and the files.
#[derive(Debug, Clone)]
pub(crate) struct TaskDirs {
    pub(crate) name: Arc<str>,
    pub(crate) dirs: Arc<[TaskDir]>,
    pub(crate) cores: Option<CpuSet>,
    pub(crate) files: Arc<OpenFiles>,
}

impl TaskDirs {
    pub(crate) fn dir(&self, controller: Controller) -> Option<&Path> {
        self.dirs.iter().find(|d| d.controllers.contains(&controller)).map(|d| d.path.as_path())
    }

    /// The directory of `controller`, or an error naming what is missing.
    pub(crate) fn need(&self, controller: Controller) -> Result<&Path, IsolateError> {
        self.dir(controller).ok_or_else(|| IsolateError::Unavailable {
            reason: format!("no {} controller for cgroup {}", controller.name(), self.name),
        })
    }

    /// The figures both versions read alike: processes (`pids.current`) and CFS periods
    /// (`cpu.stat`), with the texts of `memory.stat` and `cpu.stat` for the rest.
    pub(crate) fn common_stats(&self) -> Result<CommonStats, IsolateError> {
        let memory = self.need(Controller::Memory)?;
        let cpu = self.need(Controller::Cpu)?;
        let pids = self.need(Controller::Pids)?;
        let mut stats = CgroupStats::default();
        let memory_stat = self.files.read(&memory.join("memory.stat"))?;
        let cpu_stat = self.files.read(&cpu.join("cpu.stat"))?;
        stats.processes = self.files.number(&pids.join("pids.current"))?;
        stats.cpu_periods = stats::field(&cpu_stat, "nr_periods").unwrap_or(0);
        stats.cpu_throttled_periods = stats::field(&cpu_stat, "nr_throttled").unwrap_or(0);
        Ok(CommonStats { stats, memory: memory.to_owned(), memory_stat, cpu_stat })
    }
}

/// [`TaskDirs::common_stats`]: the figures read so far, and what the version reads on from.
#[derive(Debug)]
pub(crate) struct CommonStats {
    pub(crate) stats: CgroupStats,
    pub(crate) memory: PathBuf,
    pub(crate) memory_stat: String,
    pub(crate) cpu_stat: String,
}

/// One cgroup version's ways: its layout of the parent and of the task cgroups, and the files
/// a task's cgroup is joined, limited, frozen, killed, counted and measured through.
pub(crate) trait CgroupManager: std::fmt::Debug + Send + Sync {
    /// The hierarchy it drives.
    fn version(&self) -> Version;

    /// Each hierarchy's controllers and the parent in it (v2: one).
    fn places(&self) -> &[Place];

    /// The partitions of reserved and shared cores, if the cpuset controller can keep them.
    fn cpuset(&self) -> Option<&CpusetDirs>;

    /// The directories whose children are task cgroups.
    fn task_holders(&self) -> Vec<PathBuf>;

    /// The directories the task cgroup `name` has (whether or not they exist), one per
    /// hierarchy, in a partition of reserved cores if `reserved`.
    fn task_dirs(&self, name: &str, reserved: bool) -> Vec<TaskDir>;

    /// The file of each directory that a process joins the cgroup through by writing `0`.
    fn join_file(&self) -> &'static str;

    /// The controller whose directory's `cgroup.procs` lists every process of the task.
    fn procs_controller(&self) -> Controller;

    /// Writes a new task cgroup's limits.
    fn apply(&self, task: &TaskDirs, limits: &Limits) -> Result<(), IsolateError>;

    /// The file that kills every process of a cgroup at once, if the kernel has one.
    fn kill_file(&self) -> Option<&'static str>;

    /// Freezes (`frozen`) or thaws the cgroup whose processes are listed in `dir`.
    fn set_frozen(&self, files: &OpenFiles, dir: &Path, frozen: bool) -> Result<(), IsolateError>;

    /// Whether the freeze of the cgroup listed in `dir` has taken: none of its processes runs.
    fn is_frozen(&self, files: &OpenFiles, dir: &Path) -> bool;

    /// The memory controller's file with the count of OOM kills (`oom_kill`).
    fn oom_file(&self) -> &'static str;

    /// What the task has used.
    fn stats(&self, task: &TaskDirs) -> Result<CgroupStats, IsolateError>;
}
