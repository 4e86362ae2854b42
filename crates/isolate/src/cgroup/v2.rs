//! The cgroup v2 manager: one unified hierarchy, every controller in one directory per cgroup.
//!
//! ```text
//! <root>/<parent>/share/<alloc>.<task>.<run>       tasks without reserved cores
//! <root>/<parent>/reserve/<alloc>.<task>.<run>     a task's reserved cores
//! ```
//!
//! Every task cgroup is in one of the two partitions, so that the books of reserved cores are
//! two cpusets side by side. A cgroup hands controllers down (`cgroup.subtree_control`) only
//! while it holds no process itself, so the agent's own processes move to a leaf `agent` of
//! their cgroup first, as a delegated systemd service does (`DelegateSubgroup=`). A process
//! joins through `cgroup.procs`; a cgroup is killed at once through `cgroup.kill` (Linux
//! 5.14), else frozen through `cgroup.freeze`.

use super::files::{self, OpenFiles};
use super::limits::Limits;
use super::manager::{
    CgroupManager, Controller, CpusetDirs, Opened, ParentSite, Place, RESERVE, SHARE, TaskDir,
    TaskDirs, Version,
};
use super::stats::{self, CgroupStats};
use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The unified hierarchy's parent, its partitions, and whether the kernel has `cgroup.kill`.
#[derive(Debug)]
pub(crate) struct V2Manager {
    places: Vec<Place>,
    cpuset: Option<CpusetDirs>,
    /// `cgroup.kill` is there (Linux 5.14).
    kill_file: bool,
}

impl V2Manager {
    /// Makes and locks the parent, makes its partitions and hands the controllers wharf uses
    /// down to them; the cores in `kept` stay the node's.
    pub(crate) fn open(sites: &[ParentSite], kept: &CpuSet) -> Result<Opened, IsolateError> {
        let mut locks = Vec::new();
        let mut cpuset = None;
        let mut usable = CpuSet::new();
        for site in sites {
            locks.push(files::make_and_lock_parent(&site.base, &site.parent, false)?);
            let dirs = CpusetDirs::under(&site.parent);
            let offered =
                files::read_text(&site.own.join("cgroup.controllers")).unwrap_or_default();
            for dir in [&dirs.share, &dirs.reserve] {
                files::make_dirs(&site.parent, dir, false)?;
                enable_controllers(&site.base, dir, &offered)?;
            }
            if site.controllers.contains(&Controller::Cpuset) {
                usable =
                    files::usable_cores(&site.parent, &site.own, "cpuset.cpus.effective", kept)?;
                cpuset = Some(dirs);
            }
        }
        let kill_file = sites.first().is_some_and(|site| site.parent.join("cgroup.kill").exists());
        let places = sites
            .iter()
            .map(|site| Place {
                controllers: site.controllers.clone(),
                parent: site.parent.clone(),
            })
            .collect();
        let manager = V2Manager { places, cpuset, kill_file };
        Ok(Opened { manager: Arc::new(manager), locks, usable })
    }
}

impl CgroupManager for V2Manager {
    fn version(&self) -> Version {
        Version::V2
    }

    fn places(&self) -> &[Place] {
        &self.places
    }

    fn cpuset(&self) -> Option<&CpusetDirs> {
        self.cpuset.as_ref()
    }

    fn task_holders(&self) -> Vec<PathBuf> {
        let partitions = |place: &Place| [place.parent.join(SHARE), place.parent.join(RESERVE)];
        self.places.iter().flat_map(partitions).collect()
    }

    fn task_dirs(&self, name: &str, reserved: bool) -> Vec<TaskDir> {
        let partition = if reserved { RESERVE } else { SHARE };
        self.places
            .iter()
            .map(|place| TaskDir {
                controllers: place.controllers.clone(),
                path: place.parent.join(partition).join(name),
                owned: true,
            })
            .collect()
    }

    fn join_file(&self) -> &'static str {
        "cgroup.procs"
    }

    fn procs_controller(&self) -> Controller {
        Controller::Memory
    }

    fn apply(&self, task: &TaskDirs, limits: &Limits) -> Result<(), IsolateError> {
        let memory = task.need(Controller::Memory)?;
        let cpu = task.need(Controller::Cpu)?;
        let pids = task.need(Controller::Pids)?;
        let write = files::write;
        write(&memory.join("memory.max"), &limits.memory_max.to_string())?;
        files::write_if_present(&memory.join("memory.swap.max"), "0")?;
        if let Some(low) = limits.memory_low {
            write(&memory.join("memory.low"), &low.to_string())?;
        }
        write(&cpu.join("cpu.weight"), &limits.cpu_weight().to_string())?;
        if let Some(quota) = limits.cpu_quota {
            write(&cpu.join("cpu.max"), &format!("{} {}", quota.quota_us, quota.period_us))?;
        }
        if let Some(max) = limits.pids_max {
            write(&pids.join("pids.max"), &max.to_string())?;
        }
        if let Some(cores) = &task.cores {
            write(&memory.join("cpuset.cpus"), &cores.to_string())?;
        }
        Ok(())
    }

    fn kill_file(&self) -> Option<&'static str> {
        self.kill_file.then_some("cgroup.kill")
    }

    fn set_frozen(&self, files: &OpenFiles, dir: &Path, frozen: bool) -> Result<(), IsolateError> {
        files.write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
    }

    fn is_frozen(&self, files: &OpenFiles, dir: &Path) -> bool {
        files
            .read(&dir.join("cgroup.events"))
            .is_ok_and(|events| stats::field(&events, "frozen") == Some(1))
    }

    fn oom_file(&self) -> &'static str {
        "memory.events"
    }

    fn stats(&self, task: &TaskDirs) -> Result<CgroupStats, IsolateError> {
        let common = task.common_stats()?;
        let (memory, memory_stat, cpu_stat) =
            (&common.memory, &common.memory_stat, &common.cpu_stat);
        let mut stats = common.stats;
        stats.memory_rss = stats::field(memory_stat, "anon").unwrap_or(0);
        stats.memory_cache = stats::field(memory_stat, "file").unwrap_or(0);
        if let Ok(swap) = task.files.number(&memory.join("memory.swap.current")) {
            stats.memory_swap = swap;
            stats.measured.swap = true;
        }
        if let Ok(peak) = task.files.number(&memory.join("memory.peak")) {
            stats.memory_max_usage = peak;
            stats.measured.max_usage = true;
        }
        let micros = |key| Duration::from_micros(stats::field(cpu_stat, key).unwrap_or(0));
        stats.cpu_total = micros("usage_usec");
        stats.cpu_user = micros("user_usec");
        stats.cpu_system = micros("system_usec");
        stats.cpu_throttled = micros("throttled_usec");
        Ok(stats)
    }
}

/// Hands the controllers wharf uses down from `base` to `dir`, level by level: the
/// `cgroup.subtree_control` of `base`, of every directory between, and of `dir`, whose children
/// are tasks' cgroups.
fn enable_controllers(base: &Path, dir: &Path, offered: &str) -> Result<(), IsolateError> {
    let wanted: Vec<&str> = offered
        .split_whitespace()
        .filter(|c| matches!(*c, "memory" | "cpu" | "pids" | "cpuset"))
        .collect();
    let change = wanted.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
    let mut current = base.to_path_buf();
    let below = dir.strip_prefix(base).unwrap_or(Path::new(""));
    let mut levels = vec![current.clone()];
    for component in below.components() {
        current.push(component);
        levels.push(current.clone());
    }
    for level in levels {
        let path = level.join("cgroup.subtree_control");
        let mut written = std::fs::write(&path, &change);
        // v2 lets a cgroup hand its controllers down only while it holds no process itself,
        // and the agent's own cgroup holds the agent. As a delegated systemd unit does
        // (`DelegateSubgroup=`), its processes move to a leaf of their own beside the task
        // cgroups, and the cgroup is asked again: more than once, as a process forked while
        // they moved stays behind.
        for _ in 0..EVACUATIONS {
            if !written.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
                || level != base
            {
                break;
            }
            evacuate(&level)?;
            written = std::fs::write(&path, &change);
        }
        if let Err(e) = written {
            return Err(if e.raw_os_error() == Some(libc::EBUSY) {
                IsolateError::Unavailable {
                    reason: format!(
                        "{} holds processes, so cgroup v2 cannot hand its controllers to a child; \
                         run the agent in a cgroup of its own, or set `cgroups.parent` to a \
                         path outside its cgroup",
                        level.display()
                    ),
                }
            } else {
                IsolateError::Io { path, source: e }
            });
        }
    }
    Ok(())
}

/// The leaf a v2 cgroup's own processes move to, so that it can hand controllers down.
const AGENT_LEAF: &str = "agent";
/// How many times the agent's cgroup is emptied into the leaf before it is taken to be in use.
const EVACUATIONS: usize = 3;

/// The agent's own cgroup, for a process in `cgroup`. A process in a leaf [`AGENT_LEAF`] is an
/// agent that moved there, or was started there after a restart (as systemd's
/// `DelegateSubgroup=agent` does): the cgroup above the leaf is its own, the one its parent is
/// below and whose controllers it hands down, so it finds its parent, and its tasks' cgroups,
/// again.
pub(crate) fn agent_cgroup(cgroup: &Path, mount: &Path) -> PathBuf {
    match cgroup.parent() {
        Some(above)
            if cgroup.file_name() == Some(AGENT_LEAF.as_ref()) && above.starts_with(mount) =>
        {
            above.to_owned()
        }
        _ => cgroup.to_owned(),
    }
}

/// Moves every process of the cgroup `dir` into its leaf [`AGENT_LEAF`] (made if needed). A
/// process that exits meanwhile is skipped. The kernel moves a process from wherever it is by
/// then, so this runs before the agent starts any (see [`super::Cgroups::open`]).
fn evacuate(dir: &Path) -> Result<(), IsolateError> {
    let leaf = dir.join(AGENT_LEAF);
    match std::fs::create_dir(&leaf) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(IsolateError::Io { path: leaf, source: e });
        }
        _ => {}
    }
    let procs = files::read_text(&dir.join("cgroup.procs"))?;
    let target = leaf.join("cgroup.procs");
    for pid in procs.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .and_then(|mut f| std::io::Write::write_all(&mut f, pid.as_bytes()))
        {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            result => result.map_err(IsolateError::io(&target))?,
        }
    }
    tracing::info!(from = %dir.display(), to = %leaf.display(), "moved the agent's cgroup's processes to a leaf, so the cgroup can hand controllers to the task cgroups");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evacuating_moves_each_process_to_the_leaf() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), "41\n42\n").unwrap();
        std::fs::create_dir(dir.path().join(AGENT_LEAF)).unwrap();
        // The kernel's file exists in a new cgroup; a fake one must be made.
        std::fs::write(dir.path().join(AGENT_LEAF).join("cgroup.procs"), "").unwrap();
        evacuate(dir.path()).unwrap();
        // A fake file keeps the last write: each pid is written on its own.
        let written = std::fs::read_to_string(dir.path().join("agent/cgroup.procs")).unwrap();
        assert_eq!(written, "42");
        assert!(evacuate(&dir.path().join("missing")).is_err());
    }

    /// Where a task's cgroup goes, one row per case: whether it reserved cores, and its one
    /// directory, which is always its own.
    #[test]
    fn task_dirs_table() {
        let places = vec![Place {
            controllers: vec![Controller::Memory, Controller::Cpu, Controller::Pids],
            parent: PathBuf::from("/c/w"),
        }];
        let manager = V2Manager { places, cpuset: None, kill_file: false };
        let rows = [(false, "/c/w/share/a.t.0"), (true, "/c/w/reserve/a.t.0")];
        for (reserved, path) in rows {
            let dirs = manager.task_dirs("a.t.0", reserved);
            assert_eq!(dirs.len(), 1, "reserved={reserved}");
            assert_eq!((dirs[0].path.as_path(), dirs[0].owned), (Path::new(path), true));
        }
        assert_eq!(
            manager.task_holders(),
            [PathBuf::from("/c/w/share"), PathBuf::from("/c/w/reserve")]
        );
        assert_eq!(manager.kill_file(), None);
        let with_kill = V2Manager { kill_file: true, ..manager };
        assert_eq!(with_kill.kill_file(), Some("cgroup.kill"));
    }
}
