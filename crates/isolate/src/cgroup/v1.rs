//! The cgroup v1 manager: one hierarchy per controller (or group of co-mounted controllers),
//! a parent in each, and a task's cgroup as one directory in each.
//!
//! ```text
//! <hierarchy>/<parent>/<alloc>.<task>.<run>       memory, cpu, cpuacct, pids, freezer
//! <cpuset>/<parent>/share                          tasks without reserved cores
//! <cpuset>/<parent>/reserve/<alloc>.<task>.<run>   a task's reserved cores
//! ```
//!
//! The books of reserved cores are kept where cpuset is alone in its hierarchy: then a task
//! without reserved cores joins the shared cpuset, which is not its own to remove. A new v1
//! cpuset starts with no CPUs and no memory nodes, so every one made gets its parent's. A
//! process joins through `tasks` (one thread, see [`crate::TaskCgroup::join_files`]); kills
//! freeze through the freezer, whose `cgroup.procs` lists the task's processes.

use super::files::{self, OpenFiles};
use super::limits::Limits;
use super::manager::{
    CgroupManager, Controller, CpusetDirs, Opened, ParentSite, Place, RESERVE, TaskDir, TaskDirs,
    Version,
};
use super::stats::{self, CgroupStats};
use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The v1 hierarchies' parents, and the partitions if cpuset keeps them.
#[derive(Debug)]
pub(crate) struct V1Manager {
    places: Vec<Place>,
    cpuset: Option<CpusetDirs>,
}

impl V1Manager {
    /// Makes and locks the parent in each hierarchy, and the partitions where cpuset is alone
    /// in its hierarchy; the cores in `kept` stay the node's.
    pub(crate) fn open(sites: &[ParentSite], kept: &CpuSet) -> Result<Opened, IsolateError> {
        let mut locks = Vec::new();
        let mut cpuset = None;
        let mut usable = CpuSet::new();
        for site in sites {
            let has_cpuset = site.controllers.contains(&Controller::Cpuset);
            locks.push(files::make_and_lock_parent(&site.base, &site.parent, has_cpuset)?);
            // cpuset alone in its hierarchy can keep the books.
            if has_cpuset && site.controllers.len() == 1 {
                let dirs = CpusetDirs::under(&site.parent);
                for dir in [&dirs.share, &dirs.reserve] {
                    files::make_dirs(&site.parent, dir, true)?;
                }
                usable =
                    files::usable_cores(&site.parent, &site.own, "cpuset.effective_cpus", kept)?;
                cpuset = Some(dirs);
            }
        }
        let places = sites
            .iter()
            .map(|site| Place {
                controllers: site.controllers.clone(),
                parent: site.parent.clone(),
            })
            .collect();
        Ok(Opened { manager: Arc::new(V1Manager { places, cpuset }), locks, usable })
    }

    /// Whether `place` is the cpuset hierarchy that keeps the books.
    fn is_partitioned(place: &Place) -> bool {
        place.controllers == [Controller::Cpuset]
    }
}

impl CgroupManager for V1Manager {
    fn version(&self) -> Version {
        Version::V1
    }

    fn places(&self) -> &[Place] {
        &self.places
    }

    fn cpuset(&self) -> Option<&CpusetDirs> {
        self.cpuset.as_ref()
    }

    fn task_holders(&self) -> Vec<PathBuf> {
        self.places
            .iter()
            .map(|place| {
                if V1Manager::is_partitioned(place) {
                    place.parent.join(RESERVE)
                } else {
                    place.parent.clone()
                }
            })
            .collect()
    }

    fn task_dirs(&self, name: &str, reserved: bool) -> Vec<TaskDir> {
        let mut dirs = Vec::new();
        for place in &self.places {
            let path = match &self.cpuset {
                Some(cpuset) if V1Manager::is_partitioned(place) => {
                    if reserved {
                        cpuset.reserve.join(name)
                    } else {
                        // Tasks without reserved cores share one cpuset.
                        dirs.push(TaskDir {
                            controllers: place.controllers.clone(),
                            path: cpuset.share.clone(),
                            owned: false,
                        });
                        continue;
                    }
                }
                _ => place.parent.join(name),
            };
            dirs.push(TaskDir { controllers: place.controllers.clone(), path, owned: true });
        }
        dirs
    }

    /// `tasks`, which moves the writing thread, the whole of a process with one thread.
    /// `cgroup.procs` would move the thread group, which on v1 takes the kernel's lock on
    /// every thread group for writing (`cgroup_threadgroup_rwsem`) and waits out an RCU grace
    /// period for it whenever no other migration came just before: a few milliseconds on an
    /// idle machine, ten and more on a busy one, in every start.
    fn join_file(&self) -> &'static str {
        "tasks"
    }

    fn procs_controller(&self) -> Controller {
        Controller::Freezer
    }

    fn apply(&self, task: &TaskDirs, limits: &Limits) -> Result<(), IsolateError> {
        let memory = task.need(Controller::Memory)?;
        let cpu = task.need(Controller::Cpu)?;
        let pids = task.need(Controller::Pids)?;
        let write = files::write;
        write(&memory.join("memory.limit_in_bytes"), &limits.memory_max.to_string())?;
        // No swap on top (where swap is accounted): the limit means what it says.
        files::write_if_present(
            &memory.join("memory.memsw.limit_in_bytes"),
            &limits.memory_max.to_string(),
        )?;
        if let Some(low) = limits.memory_low {
            write(&memory.join("memory.soft_limit_in_bytes"), &low.to_string())?;
        }
        write(&cpu.join("cpu.shares"), &limits.cpu_shares.to_string())?;
        if let Some(quota) = limits.cpu_quota {
            write(&cpu.join("cpu.cfs_period_us"), &quota.period_us.to_string())?;
            write(&cpu.join("cpu.cfs_quota_us"), &quota.quota_us.to_string())?;
        }
        if let Some(max) = limits.pids_max {
            write(&pids.join("pids.max"), &max.to_string())?;
        }
        // A v1 cpuset of the task's own starts empty: it gets memory nodes, and its reserved
        // cores or else its parent's.
        if let Some(cpuset) =
            task.dirs.iter().find(|d| d.owned && d.controllers.contains(&Controller::Cpuset))
        {
            let above = cpuset.path.parent().unwrap_or(&cpuset.path);
            write(
                &cpuset.path.join("cpuset.mems"),
                files::read_text(&above.join("cpuset.mems"))?.trim(),
            )?;
            let cpus = match &task.cores {
                Some(cores) => cores.to_string(),
                None => files::read_text(&above.join("cpuset.cpus"))?.trim().to_owned(),
            };
            write(&cpuset.path.join("cpuset.cpus"), &cpus)?;
        }
        Ok(())
    }

    /// None: v1 has no `cgroup.kill`.
    fn kill_file(&self) -> Option<&'static str> {
        None
    }

    fn set_frozen(&self, files: &OpenFiles, dir: &Path, frozen: bool) -> Result<(), IsolateError> {
        files.write(&dir.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" })
    }

    fn is_frozen(&self, files: &OpenFiles, dir: &Path) -> bool {
        files.read(&dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
    }

    /// `memory.oom_control`, whose `oom_kill` count came with Linux 4.13.
    fn oom_file(&self) -> &'static str {
        "memory.oom_control"
    }

    fn stats(&self, task: &TaskDirs) -> Result<CgroupStats, IsolateError> {
        let common = task.common_stats()?;
        let (memory, memory_stat, cpu_stat) =
            (&common.memory, &common.memory_stat, &common.cpu_stat);
        let mut stats = common.stats;
        stats.memory_rss = stats::field(memory_stat, "rss").unwrap_or(0);
        stats.memory_cache = stats::field(memory_stat, "cache").unwrap_or(0);
        if let Some(swap) = stats::field(memory_stat, "swap") {
            stats.memory_swap = swap;
            stats.measured.swap = true;
        }
        stats.memory_max_usage = task.files.number(&memory.join("memory.max_usage_in_bytes"))?;
        stats.measured.max_usage = true;
        let cpuacct = task.need(Controller::Cpuacct)?;
        stats.cpu_total = Duration::from_nanos(task.files.number(&cpuacct.join("cpuacct.usage"))?);
        let path = cpuacct.join("cpuacct.usage_all");
        let (user, system) = stats::usage_all(&task.files.read(&path)?).ok_or_else(|| {
            IsolateError::Unreadable { path, reason: "not `cpu user system` lines".into() }
        })?;
        stats.cpu_user = Duration::from_nanos(user);
        stats.cpu_system = Duration::from_nanos(system);
        stats.cpu_throttled =
            Duration::from_nanos(stats::field(cpu_stat, "throttled_time").unwrap_or(0));
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(places: &[(&[Controller], &str)], partitioned: bool) -> V1Manager {
        let places: Vec<Place> = places
            .iter()
            .map(|(controllers, parent)| Place {
                controllers: controllers.to_vec(),
                parent: PathBuf::from(parent),
            })
            .collect();
        let cpuset = partitioned.then(|| CpusetDirs::under(Path::new("/c/cpuset/w")));
        V1Manager { places, cpuset }
    }

    /// Where a task's cgroup goes, one row per case: the hierarchies (cpuset alone, keeping the
    /// books, or co-mounted), whether the task reserved cores, and each hierarchy's directory
    /// with whether it is the task's own.
    #[test]
    fn task_dirs_table() {
        use Controller::*;
        let apart: &[(&[Controller], &str)] = &[
            (&[Memory], "/c/memory/w"),
            (&[Cpu, Cpuacct], "/c/cpu/w"),
            (&[Cpuset], "/c/cpuset/w"),
        ];
        let together: &[(&[Controller], &str)] =
            &[(&[Memory, Cpuset], "/c/memory/w"), (&[Cpu, Cpuacct], "/c/cpu/w")];
        type Row<'a> = (&'a [(&'a [Controller], &'a str)], bool, bool, &'a [(&'a str, bool)]);
        let rows: [Row<'_>; 4] = [
            (
                apart,
                true,
                false,
                &[
                    ("/c/memory/w/a.t.0", true),
                    ("/c/cpu/w/a.t.0", true),
                    ("/c/cpuset/w/share", false),
                ],
            ),
            (
                apart,
                true,
                true,
                &[
                    ("/c/memory/w/a.t.0", true),
                    ("/c/cpu/w/a.t.0", true),
                    ("/c/cpuset/w/reserve/a.t.0", true),
                ],
            ),
            (together, false, false, &[("/c/memory/w/a.t.0", true), ("/c/cpu/w/a.t.0", true)]),
            (together, false, true, &[("/c/memory/w/a.t.0", true), ("/c/cpu/w/a.t.0", true)]),
        ];
        for (places, partitioned, reserved, expected) in rows {
            let manager = manager(places, partitioned);
            let dirs: Vec<(String, bool)> = manager
                .task_dirs("a.t.0", reserved)
                .into_iter()
                .map(|d| (d.path.display().to_string(), d.owned))
                .collect();
            let expected: Vec<(String, bool)> =
                expected.iter().map(|(p, owned)| (p.to_string(), *owned)).collect();
            assert_eq!(dirs, expected, "{places:?} reserved={reserved}");
        }
        let holders = manager(apart, true).task_holders();
        assert_eq!(
            holders,
            [
                PathBuf::from("/c/memory/w"),
                PathBuf::from("/c/cpu/w"),
                PathBuf::from("/c/cpuset/w/reserve")
            ]
        );
    }
}
