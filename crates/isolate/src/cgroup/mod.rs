//! Every task in a cgroup of its own: limits from its `resources`, accounting, OOM detection,
//! and a kill that nothing in the cgroup escapes. cgroup v1 and v2 both, detected at start.
//!
//! [`Cgroups`] is the node's one manager (the drivers share it): it finds the hierarchy, makes
//! and locks the parent, keeps the books of reserved cores, and makes, adopts and removes the
//! task cgroups under the parent. A [`TaskCgroup`] is one task run's cgroup: the files its
//! process joins it through ([`TaskCgroup::join_files`], a step of [`crate::Containment`]), its
//! kill, its stats and its OOM record.
//!
//! ```text
//! v1: <hierarchy>/<parent>/<alloc>.<task>.<run>       memory, cpu, cpuacct, pids, freezer
//!     <cpuset>/<parent>/share                          tasks without reserved cores
//!     <cpuset>/<parent>/reserve/<alloc>.<task>.<run>   a task's reserved cores
//! v2: <root>/<parent>/share/<alloc>.<task>.<run>       every controller in one directory
//!     <root>/<parent>/reserve/<alloc>.<task>.<run>
//! ```
//!
//! The parent is by default a `wharf` child of the agent's own cgroup (in each v1 hierarchy,
//! wherever the agent is in it), or a path the node configures. One agent owns a parent: it
//! holds a lock on it (`flock` on the directory) for as long as it runs, because it removes
//! whatever task cgroup under it it does not know ([`Cgroups::remove_orphans`]).
//!
//! Killing: v2 writes `cgroup.kill` (Linux 5.14); otherwise the cgroup is frozen (v1's
//! freezer, v2's `cgroup.freeze`), every process in it is sent SIGKILL while none can fork,
//! and it is thawed so they die. The signal itself is the caller's to send (wharf-exec owns
//! every signal to a task's processes): [`TaskCgroup::kill_all`] hands it each pid, and a
//! frozen process keeps its pid, so the pid names the process it was read for. (v1's freezer
//! holds even a killed process until the thaw; v2's lets a fatal signal through, so there a
//! process killed meanwhile leaves the freeze to exit.)
//!
//! What this module does not do: start processes (the driver's shim does; a process joins
//! between fork and exec, through [`crate::Containment`]) or decide what a task may have (the node admits it, the task
//! spec says what it gets).
//!
//! The v1 code runs against this host's real cgroups in this crate's tests; the v2 code against
//! a fake cgroupfs tree here, and on a real v2 kernel in `tests/cgroup_v2.rs`, which
//! `cargo xtask cgroup2` runs in a virtual machine.

mod detect;
mod limits;
mod partition;
mod stats;

pub use limits::{CpuQuota, DEFAULT_CFS_PERIOD_US, Limits, NodeCpu};
pub use stats::{CgroupStats, Measured};

use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use parking_lot::Mutex;
use partition::Partition;
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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
    fn v1_name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Cpuset => "cpuset",
            Controller::Pids => "pids",
            Controller::Freezer => "freezer",
        }
    }

    fn from_v1_name(name: &str) -> Option<Controller> {
        [
            Controller::Memory,
            Controller::Cpu,
            Controller::Cpuacct,
            Controller::Cpuset,
            Controller::Pids,
            Controller::Freezer,
        ]
        .into_iter()
        .find(|c| c.v1_name() == name)
    }
}

/// Where the task cgroups go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupParent {
    /// A path below the agent's own cgroup (in each v1 hierarchy, wherever the agent is in it).
    UnderOwn(String),
    /// A path from each hierarchy's root, such as `/wharf`.
    Absolute(String),
}

impl Default for CgroupParent {
    /// A `wharf` child of the agent's own cgroup.
    fn default() -> Self {
        CgroupParent::UnderOwn("wharf".into())
    }
}

/// How the manager runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupOptions {
    /// Where the task cgroups go.
    pub parent: CgroupParent,
    /// Every task's process limit (`pids.max`); `None` for no limit.
    pub pids_max: Option<u64>,
    /// Cores the node keeps for itself: no task runs on them.
    pub reserved_cores: CpuSet,
    /// The speed of the node's cores, for CPU quotas.
    pub cpu: NodeCpu,
    /// Whether the parent's siblings are parents of other agents like it (the node's default
    /// layout, `wharf/<node>`): then what killed agents left in those no agent holds is removed
    /// (task cgroups without processes, and the parents once empty).
    pub sweep_siblings: bool,
}

/// How long a freeze may take before the kill goes ahead on what was read.
const FREEZE_LIMIT: Duration = Duration::from_secs(1);
/// How long a parent's lock is waited for: a process forked by the agent that held it keeps a
/// copy of its descriptor (and so the lock) until it executes its program.
const LOCK_LIMIT: Duration = Duration::from_millis(500);
/// How long removal retries a cgroup whose last processes are still exiting.
const REMOVE_LIMIT: Duration = Duration::from_secs(2);

/// The node's task cgroups. Shared by the drivers (`Arc`); every method takes `&self`.
#[derive(Debug)]
pub struct Cgroups {
    version: Version,
    /// Each hierarchy's controllers and the parent directory in it.
    places: Vec<Place>,
    /// Where reserved and shared cores are written, if the cpuset controller can be used.
    cpuset: Option<CpusetDirs>,
    /// v2's `cgroup.kill` is there (Linux 5.14).
    kill_file: bool,
    options: CgroupOptions,
    partition: Mutex<Partition>,
    /// The task cgroups this manager made or adopted.
    live: Mutex<HashSet<String>>,
    /// The locks on the parents, held while the manager lives.
    _locks: Vec<OwnedFd>,
}

#[derive(Debug, Clone)]
struct Place {
    controllers: Vec<Controller>,
    parent: PathBuf,
}

#[derive(Debug, Clone)]
struct CpusetDirs {
    share: PathBuf,
    reserve: PathBuf,
}

/// The names `share` and `reserve` are the partitions; a task cgroup's name has a `.`.
const SHARE: &str = "share";
const RESERVE: &str = "reserve";

impl Cgroups {
    /// Finds this host's hierarchy and sets up the parent: the start of an agent.
    pub fn open(options: CgroupOptions) -> Result<Cgroups, IsolateError> {
        let read = |path: &str| std::fs::read_to_string(path).map_err(IsolateError::io(path));
        Cgroups::open_with(&read("/proc/self/mountinfo")?, &read("/proc/self/cgroup")?, options)
    }

    /// [`Cgroups::open`] from the texts of `/proc/self/mountinfo` and `/proc/self/cgroup`, so a
    /// fake cgroupfs tree can stand in for the kernel's.
    pub fn open_with(
        mountinfo: &str,
        proc_cgroup: &str,
        options: CgroupOptions,
    ) -> Result<Cgroups, IsolateError> {
        let layout = detect::layout(mountinfo, proc_cgroup, |dir| {
            std::fs::read_to_string(dir.join("cgroup.controllers")).ok()
        })?;
        let (base_of, relative) = match &options.parent {
            CgroupParent::UnderOwn(path) => (true, checked_relative(path)?),
            CgroupParent::Absolute(path) => (false, checked_relative(path)?),
        };
        let mut places = Vec::new();
        for hierarchy in &layout.hierarchies {
            let base = if base_of { hierarchy.own.clone() } else { hierarchy.mount.clone() };
            places.push((hierarchy, base.clone(), base.join(&relative)));
        }
        let mut locks = Vec::new();
        let mut cpuset = None;
        let mut usable = CpuSet::new();
        for (hierarchy, base, parent) in &places {
            let cpuset_v1 = hierarchy.controllers.contains(&Controller::Cpuset)
                && layout.version == Version::V1;
            // The directory above is locked while the parent is made and locked, as a sweep
            // of siblings locks it: an agent starting beside this one then either sees the
            // parent locked or does not see it yet, never made but unlocked (and so removed).
            let above = parent.parent().filter(|above| above.starts_with(base)).unwrap_or(base);
            make_dirs(base, above, cpuset_v1)?;
            let making = lock_above(above)?;
            make_dirs(base, parent, cpuset_v1)?;
            locks.push(lock_parent(parent)?);
            drop(making);
            // cpuset alone in its hierarchy (v1), or v2's one hierarchy, can keep the books.
            let partitions = hierarchy.controllers.contains(&Controller::Cpuset)
                && (layout.version == Version::V2 || hierarchy.controllers.len() == 1);
            let dirs = CpusetDirs { share: parent.join(SHARE), reserve: parent.join(RESERVE) };
            if partitions || layout.version == Version::V2 {
                let offered =
                    read_text(&hierarchy.own.join("cgroup.controllers")).unwrap_or_default();
                for dir in [&dirs.share, &dirs.reserve] {
                    make_dirs(parent, dir, layout.version == Version::V1)?;
                    if layout.version == Version::V2 {
                        enable_controllers(base, dir, &offered)?;
                    }
                }
            }
            if partitions {
                let effective = match layout.version {
                    Version::V1 => "cpuset.effective_cpus",
                    Version::V2 => "cpuset.cpus.effective",
                };
                // A parent made just now may not show it yet in a fake tree; its own cgroup's is
                // the same set.
                let path = [parent.join(effective), hierarchy.own.join(effective)]
                    .into_iter()
                    .find(|p| p.exists())
                    .unwrap_or_else(|| parent.join(effective));
                let cpus = read_text(&path)?;
                usable = CpuSet::parse(&cpus)
                    .map_err(|reason| IsolateError::Unreadable { path, reason })?
                    .difference(&options.reserved_cores);
                cpuset = Some(dirs);
            }
        }
        let kill_file = layout.version == Version::V2
            && places.first().is_some_and(|(_, _, parent)| parent.join("cgroup.kill").exists());
        let manager = Cgroups {
            version: layout.version,
            places: places
                .into_iter()
                .map(|(hierarchy, _, parent)| Place {
                    controllers: hierarchy.controllers.clone(),
                    parent,
                })
                .collect(),
            cpuset,
            kill_file,
            partition: Mutex::new(Partition::new(usable)),
            live: Mutex::new(HashSet::new()),
            options,
            _locks: locks,
        };
        manager.seed_reservations()?;
        if manager.options.sweep_siblings {
            manager.sweep_siblings();
        }
        Ok(manager)
    }

    /// Removes what agents that are gone left of their parents (see
    /// [`CgroupOptions::sweep_siblings`]): their task cgroups that hold no process, and the
    /// parents once empty. A sibling some agent holds is left alone; task cgroups with
    /// processes in them stay (the kernel refuses to remove them), for their agent's return.
    fn sweep_siblings(&self) {
        for place in &self.places {
            let Some(above) = place.parent.parent() else { continue };
            // Held for the sweep, so no agent makes its parent here meanwhile (see `open_with`).
            let _sweeping = match lock_above(above) {
                Ok(lock) => lock,
                Err(error) => {
                    tracing::warn!(%error, "cannot sweep beside the cgroup parent");
                    continue;
                }
            };
            let siblings = std::fs::read_dir(above).into_iter().flatten().flatten();
            for sibling in siblings.filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                let dir = sibling.path();
                if dir == place.parent {
                    continue;
                }
                let Ok(lock) = crate::sys::open_dir(&dir) else { continue };
                if !crate::sys::try_lock_exclusive(lock.as_fd()).unwrap_or(false) {
                    continue;
                }
                // Its tasks' cgroups that hold no process (the kernel refuses to remove the
                // others: tasks that outlived their agent, for it to take back), then the rest.
                for holder in [dir.clone(), dir.join(SHARE), dir.join(RESERVE)] {
                    let entries = std::fs::read_dir(&holder).into_iter().flatten().flatten();
                    for entry in entries {
                        if entry.file_name().to_str().is_some_and(is_task_name) {
                            let _ = std::fs::remove_dir(entry.path());
                        }
                    }
                }
                for empty in [dir.join(RESERVE), dir.join(SHARE), dir.clone()] {
                    let _ = std::fs::remove_dir(empty);
                }
            }
        }
    }

    /// Which hierarchy the host runs.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The parent directories, one per hierarchy.
    pub fn parents(&self) -> Vec<&Path> {
        self.places.iter().map(|p| p.parent.as_path()).collect()
    }

    /// Whether tasks can reserve cores here (the cpuset controller is usable).
    pub fn can_reserve_cores(&self) -> bool {
        self.cpuset.is_some()
    }

    /// The cores tasks without a reservation run on now.
    pub fn shared_cores(&self) -> CpuSet {
        self.partition.lock().shared()
    }

    /// The limits a task with `resources` gets. `hard_limit_period_us` is set when its driver
    /// config asks for `cpu_hard_limit`.
    pub fn limits(
        &self,
        resources: &wharf_state::spec::Resources,
        hard_limit_period_us: Option<u64>,
    ) -> Limits {
        Limits::new(resources, self.options.cpu, hard_limit_period_us, self.options.pids_max)
    }

    /// Makes the cgroup of task run `task_id` with `limits`. Until it is removed, its name is
    /// this manager's, and no orphan sweep touches it.
    ///
    /// A cgroup of that name may be there already: a run whose agent died before it saved the
    /// run's handle is started again under the same id. Whatever that lost run left in it is
    /// killed first (`kill` sends SIGKILL to one pid, as for [`TaskCgroup::kill_all`]), so
    /// the new run counts, limits and kills its own processes only.
    pub fn create(
        &self,
        task_id: &str,
        limits: &Limits,
        kill: &mut dyn FnMut(i32) -> io::Result<()>,
    ) -> Result<TaskCgroup, IsolateError> {
        let name = cgroup_name(task_id);
        if !self.live.lock().insert(name.clone()) {
            return Err(IsolateError::Invalid {
                what: format!("cgroup {name}"),
                reason: "is in use by another run of the task".into(),
            });
        }
        let made = self.make(&name, limits, kill);
        if made.is_err() {
            self.release_cores(&name);
            self.live.lock().remove(&name);
        }
        made
    }

    fn make(
        &self,
        name: &str,
        limits: &Limits,
        kill: &mut dyn FnMut(i32) -> io::Result<()>,
    ) -> Result<TaskCgroup, IsolateError> {
        let cores = match limits.cores {
            0 => None,
            count => {
                if self.cpuset.is_none() {
                    return Err(IsolateError::Unavailable {
                        reason:
                            "the cpuset controller is not usable here, so no cores can be reserved"
                                .into(),
                    });
                }
                let cores = self.partition.lock().reserve(name, count)?;
                self.write_partition()?;
                Some(cores)
            }
        };
        let task = self.task_at(name, cores);
        let mut left_over = false;
        for dir in task.dirs.iter().filter(|d| d.owned) {
            match std::fs::create_dir(&dir.path) {
                Ok(()) => {}
                // A run that crashed before its handle was saved left it: take it over.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => left_over = true,
                Err(e) => {
                    let error = IsolateError::Io { path: dir.path.clone(), source: e };
                    let _ = self.remove_dirs(&task);
                    return Err(error);
                }
            }
        }
        if left_over {
            match task.kill_all(kill) {
                Ok(0) => {}
                Ok(killed) => {
                    tracing::warn!(cgroup = %name, killed, "killed what a lost run of the task left in its cgroup")
                }
                // Left as it is, for the next orphan sweep.
                Err(error) => return Err(error),
            }
        }
        if let Err(error) = task.apply(limits) {
            let _ = self.remove_dirs(&task);
            return Err(error);
        }
        Ok(task)
    }

    /// Takes back the cgroup of a task that ran under an earlier agent: its directories must
    /// still be there. `cores` are the cores it reserved, as recorded.
    pub fn adopt(&self, task_id: &str, cores: Option<&CpuSet>) -> Result<TaskCgroup, IsolateError> {
        let name = cgroup_name(task_id);
        let cores = match cores {
            Some(cores) if self.cpuset.is_some() => {
                let kept = self.partition.lock().restore(&name, cores);
                self.write_partition()?;
                Some(kept)
            }
            _ => None,
        };
        let task = self.task_at(&name, cores);
        if let Some(missing) = task.dirs.iter().find(|d| !d.path.is_dir()) {
            self.release_cores(&name);
            return Err(IsolateError::Io {
                path: missing.path.clone(),
                source: io::ErrorKind::NotFound.into(),
            });
        }
        self.live.lock().insert(name);
        Ok(task)
    }

    /// Removes a task's cgroup once its processes are gone (retrying briefly while the last
    /// ones exit), and gives back its cores. Removing one that is gone already succeeds.
    pub fn remove(&self, task: &TaskCgroup) -> Result<(), IsolateError> {
        task.files.close();
        self.remove_dirs(task)?;
        self.release_cores(&task.name);
        self.live.lock().remove(&*task.name);
        Ok(())
    }

    /// Kills and removes every task cgroup under the parent that this manager neither made nor
    /// adopted: what an agent that died left of tasks that are gone. Call it once restore has
    /// adopted the tasks that still run. `kill` sends SIGKILL to one pid. Returns the names
    /// removed; one that cannot be removed is logged and left for the next sweep.
    pub fn remove_orphans(&self, kill: &mut dyn FnMut(i32) -> io::Result<()>) -> Vec<String> {
        let mut removed = Vec::new();
        for name in self.task_names() {
            if self.live.lock().contains(&name) {
                continue;
            }
            let cores = self.cpuset.as_ref().and_then(|dirs| {
                let cpus = read_text(&dirs.reserve.join(&name).join("cpuset.cpus")).ok()?;
                CpuSet::parse(&cpus).ok()
            });
            let task = self.task_at(&name, cores.filter(|c| !c.is_empty()));
            let result = task.kill_all(kill).and_then(|_| self.remove_dirs(&task));
            match result {
                Ok(()) => {
                    self.release_cores(&name);
                    removed.push(name);
                }
                Err(error) => {
                    tracing::warn!(cgroup = %name, %error, "cannot remove an orphaned task cgroup")
                }
            }
        }
        removed
    }

    /// Kills and removes every task cgroup under the parent, then the partitions and the parent
    /// itself: what a node that is wiped (or a test that is done) leaves behind.
    pub fn destroy_all(
        &self,
        kill: &mut dyn FnMut(i32) -> io::Result<()>,
    ) -> Result<(), IsolateError> {
        self.live.lock().clear();
        self.remove_orphans(kill);
        if let Some(left) = self.task_names().first() {
            return Err(IsolateError::Invalid {
                what: format!("cgroup {left}"),
                reason: "could not be removed".into(),
            });
        }
        for place in &self.places {
            for partition in [RESERVE, SHARE] {
                remove_dir(&place.parent.join(partition))?;
            }
            remove_dir(&place.parent)?;
        }
        Ok(())
    }

    /// The names of the task cgroups under the parent.
    fn task_names(&self) -> Vec<String> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for place in &self.places {
            match self.version {
                Version::V1 if place.controllers == [Controller::Cpuset] => {
                    dirs.push(place.parent.join(RESERVE));
                }
                Version::V1 => dirs.push(place.parent.clone()),
                Version::V2 => {
                    dirs.push(place.parent.join(SHARE));
                    dirs.push(place.parent.join(RESERVE));
                }
            }
        }
        let mut names: Vec<String> = dirs
            .iter()
            .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| is_task_name(name))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The task cgroup `name` would have: its directories, whether or not they exist.
    fn task_at(&self, name: &str, cores: Option<CpuSet>) -> TaskCgroup {
        let mut dirs = Vec::new();
        for place in &self.places {
            let path = match (self.version, &self.cpuset) {
                (Version::V1, Some(cpuset)) if place.controllers == [Controller::Cpuset] => {
                    match &cores {
                        Some(_) => cpuset.reserve.join(name),
                        // Tasks without reserved cores share one cpuset.
                        None => {
                            dirs.push(TaskDir {
                                controllers: place.controllers.clone(),
                                path: cpuset.share.clone(),
                                owned: false,
                            });
                            continue;
                        }
                    }
                }
                (Version::V1, _) => place.parent.join(name),
                (Version::V2, _) => {
                    place.parent.join(if cores.is_some() { RESERVE } else { SHARE }).join(name)
                }
            };
            dirs.push(TaskDir { controllers: place.controllers.clone(), path, owned: true });
        }
        TaskCgroup {
            name: name.into(),
            version: self.version,
            kill_file: self.kill_file,
            dirs: dirs.into(),
            cores,
            files: Arc::default(),
        }
    }

    fn remove_dirs(&self, task: &TaskCgroup) -> Result<(), IsolateError> {
        for dir in task.dirs.iter().filter(|d| d.owned) {
            let mut wait = Duration::from_millis(1);
            let mut waited = Duration::ZERO;
            loop {
                match std::fs::remove_dir(&dir.path) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // Its last processes are still exiting.
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && waited < REMOVE_LIMIT => {
                        std::thread::sleep(wait);
                        waited += wait;
                        wait = (wait * 2).min(Duration::from_millis(100));
                    }
                    Err(e) => return Err(IsolateError::Io { path: dir.path.clone(), source: e }),
                }
            }
        }
        Ok(())
    }

    fn release_cores(&self, name: &str) {
        if self.partition.lock().release(name)
            && let Err(error) = self.write_partition()
        {
            tracing::warn!(%error, "cannot give reserved cores back to the shared set");
        }
    }

    /// Writes the books to the cpusets: `reserve` grows before a task's own cpuset is written
    /// and shrinks after it is gone; `share` is everything else.
    fn write_partition(&self) -> Result<(), IsolateError> {
        let Some(dirs) = &self.cpuset else { return Ok(()) };
        let (shared, reserved) = {
            let partition = self.partition.lock();
            (partition.shared(), partition.reserved())
        };
        write(&dirs.share.join("cpuset.cpus"), &shared.to_string())?;
        write(&dirs.reserve.join("cpuset.cpus"), &reserved.to_string())
    }

    /// Reads the reservations of task cgroups that are still there from an earlier agent, so
    /// their cores stay theirs until they are adopted or removed as orphans.
    fn seed_reservations(&self) -> Result<(), IsolateError> {
        let Some(dirs) = &self.cpuset else { return Ok(()) };
        let entries = std::fs::read_dir(&dirs.reserve).into_iter().flatten().flatten();
        for entry in entries {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if !is_task_name(&name) {
                continue;
            }
            if let Ok(cpus) = read_text(&entry.path().join("cpuset.cpus"))
                && let Ok(cores) = CpuSet::parse(&cpus)
            {
                self.partition.lock().restore(&name, &cores);
            }
        }
        self.write_partition()
    }
}

impl Drop for Cgroups {
    /// An agent that leaves no task behind leaves no cgroup: an empty parent goes with it.
    fn drop(&mut self) {
        if !self.task_names().is_empty() {
            return;
        }
        for place in &self.places {
            for dir in [place.parent.join(RESERVE), place.parent.join(SHARE), place.parent.clone()]
            {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// One directory of a task's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TaskDir {
    controllers: Vec<Controller>,
    path: PathBuf,
    /// False for the shared cpuset a v1 task without reserved cores joins: not the task's to
    /// remove.
    owned: bool,
}

/// One task run's cgroup. Clones share its name, directories and the files they keep open:
/// a driver holds one for each running task, and its exit watcher another.
#[derive(Debug, Clone)]
pub struct TaskCgroup {
    name: Arc<str>,
    version: Version,
    kill_file: bool,
    dirs: Arc<[TaskDir]>,
    cores: Option<CpuSet>,
    files: Arc<OpenFiles>,
}

/// The files of a task's cgroup its stats, OOM record and kills use, kept open once used:
/// opening a cgroup file again costs ten to thirty times reading it again (the lookups through
/// kernfs), and a metrics scrape reads every running task's, a stop of many tasks freezes each.
/// A read from offset 0 makes the kernel write such a file afresh. Not `cgroup.procs`, whose
/// v1 listing is kept per open file ([`TaskCgroup::pids`]). Closed when the cgroup is removed.
#[derive(Debug, Default)]
struct OpenFiles(Mutex<Vec<(PathBuf, Access, std::fs::File)>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

impl OpenFiles {
    /// Runs `with` on `path` opened for `access`, opening it the first time.
    fn with<T>(
        &self,
        path: &Path,
        access: Access,
        with: impl FnOnce(&std::fs::File) -> io::Result<T>,
    ) -> Result<T, IsolateError> {
        let mut files = self.0.lock();
        let index = match files.iter().position(|(p, a, _)| p == path && *a == access) {
            Some(index) => index,
            None => {
                let file = match access {
                    Access::Read => std::fs::File::open(path),
                    Access::Write => std::fs::OpenOptions::new().write(true).open(path),
                }
                .map_err(IsolateError::io(path))?;
                files.push((path.to_owned(), access, file));
                files.len() - 1
            }
        };
        with(&files[index].2).map_err(IsolateError::io(path))
    }

    /// The whole of `path` as the kernel writes it now.
    fn read(&self, path: &Path) -> Result<String, IsolateError> {
        use std::os::unix::fs::FileExt;
        let bytes = self.with(path, Access::Read, |file| {
            // Reading from offset 0 makes the kernel write the file afresh.
            let mut bytes = Vec::with_capacity(1024);
            let mut chunk = [0u8; 4096];
            loop {
                let n = file.read_at(&mut chunk, bytes.len() as u64)?;
                if n == 0 {
                    return Ok(bytes);
                }
                bytes.extend_from_slice(&chunk[..n]);
            }
        })?;
        String::from_utf8(bytes).map_err(|_| IsolateError::Unreadable {
            path: path.to_owned(),
            reason: "not text".into(),
        })
    }

    /// Writes `value` to `path` in one call.
    fn write(&self, path: &Path, value: &str) -> Result<(), IsolateError> {
        use std::os::unix::fs::FileExt;
        self.with(path, Access::Write, |file| file.write_at(value.as_bytes(), 0).map(drop))
    }

    fn number(&self, path: &Path) -> Result<u64, IsolateError> {
        let text = self.read(path)?;
        stats::number(&text).ok_or_else(|| IsolateError::Unreadable {
            path: path.to_owned(),
            reason: format!("{:?} is not a number", text.trim()),
        })
    }

    fn close(&self) {
        self.0.lock().clear();
    }
}

impl TaskCgroup {
    /// Its name: `<alloc>.<task>.<run>` of the task run's id.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hierarchy it is in.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The cores reserved for it, if any.
    pub fn cores(&self) -> Option<&CpuSet> {
        self.cores.as_ref()
    }

    /// Its directories, one per hierarchy (v2: one).
    pub fn dirs(&self) -> Vec<&Path> {
        self.dirs.iter().map(|d| d.path.as_path()).collect()
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
        let file = match self.version {
            Version::V1 => "tasks",
            Version::V2 => "cgroup.procs",
        };
        self.dirs.iter().map(|d| d.path.join(file)).collect()
    }

    fn dir(&self, controller: Controller) -> Option<&Path> {
        self.dirs.iter().find(|d| d.controllers.contains(&controller)).map(|d| d.path.as_path())
    }

    /// The directory of `controller`, or an error naming what is missing.
    fn need(&self, controller: Controller) -> Result<&Path, IsolateError> {
        self.dir(controller).ok_or_else(|| IsolateError::Unavailable {
            reason: format!("no {} controller for cgroup {}", controller.v1_name(), self.name),
        })
    }

    /// The directory whose `cgroup.procs` lists every process of the task.
    fn procs_dir(&self) -> Result<&Path, IsolateError> {
        match self.version {
            Version::V1 => self.need(Controller::Freezer),
            Version::V2 => self.need(Controller::Memory),
        }
    }

    fn apply(&self, limits: &Limits) -> Result<(), IsolateError> {
        let memory = self.need(Controller::Memory)?;
        let cpu = self.need(Controller::Cpu)?;
        let pids = self.need(Controller::Pids)?;
        match self.version {
            Version::V1 => {
                write(&memory.join("memory.limit_in_bytes"), &limits.memory_max.to_string())?;
                // No swap on top (where swap is accounted): the limit means what it says.
                write_if_present(
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
                // A v1 cpuset of the task's own starts empty: it gets memory nodes, and its
                // reserved cores or else its parent's.
                if let Some(cpuset) = self
                    .dirs
                    .iter()
                    .find(|d| d.owned && d.controllers.contains(&Controller::Cpuset))
                {
                    let above = cpuset.path.parent().unwrap_or(&cpuset.path);
                    write(
                        &cpuset.path.join("cpuset.mems"),
                        read_text(&above.join("cpuset.mems"))?.trim(),
                    )?;
                    let cpus = match &self.cores {
                        Some(cores) => cores.to_string(),
                        None => read_text(&above.join("cpuset.cpus"))?.trim().to_owned(),
                    };
                    write(&cpuset.path.join("cpuset.cpus"), &cpus)?;
                }
            }
            Version::V2 => {
                write(&memory.join("memory.max"), &limits.memory_max.to_string())?;
                write_if_present(&memory.join("memory.swap.max"), "0")?;
                if let Some(low) = limits.memory_low {
                    write(&memory.join("memory.low"), &low.to_string())?;
                }
                write(&cpu.join("cpu.weight"), &limits.cpu_weight().to_string())?;
                if let Some(quota) = limits.cpu_quota {
                    write(
                        &cpu.join("cpu.max"),
                        &format!("{} {}", quota.quota_us, quota.period_us),
                    )?;
                }
                if let Some(max) = limits.pids_max {
                    write(&pids.join("pids.max"), &max.to_string())?;
                }
                if let Some(cores) = &self.cores {
                    write(&memory.join("cpuset.cpus"), &cores.to_string())?;
                }
            }
        }
        Ok(())
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
        if !self.kill_file {
            return self.kill_all_frozen(kill);
        }
        let dir = self.procs_dir()?;
        // An empty cgroup (or one that is gone) has nothing to kill.
        if self.pids()?.is_empty() {
            return Ok(0);
        }
        self.files.write(&dir.join("cgroup.kill"), "1")?;
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
        let (state, frozen, thawed) = match self.version {
            Version::V1 => ("freezer.state", "FROZEN", "THAWED"),
            Version::V2 => ("cgroup.freeze", "1", "0"),
        };
        self.files.write(&dir.join(state), frozen)?;
        if !self.wait_frozen(dir) {
            tracing::warn!(cgroup = %self.name, "the cgroup did not freeze in time; killing what it holds anyway");
        }
        let pids = self.pids();
        let mut sent = 0;
        for pid in pids.iter().flatten().copied().filter(|pid| *pid > 1) {
            match kill(pid) {
                Ok(()) => sent += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    tracing::warn!(cgroup = %self.name, pid, error = %e, "cannot kill a process of the cgroup")
                }
            }
        }
        // Thawed, the processes take their SIGKILL.
        self.files.write(&dir.join(state), thawed)?;
        pids.map(|_| sent)
    }

    /// Waits (bounded) until the freeze has taken: no process of the cgroup runs.
    fn wait_frozen(&self, dir: &Path) -> bool {
        let is_frozen = || match self.version {
            Version::V1 => {
                self.files.read(&dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
            }
            Version::V2 => self
                .files
                .read(&dir.join("cgroup.events"))
                .is_ok_and(|events| stats::field(&events, "frozen") == Some(1)),
        };
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
        let memory = self.need(Controller::Memory)?;
        let (file, text) = match self.version {
            Version::V1 => {
                ("memory.oom_control", self.files.read(&memory.join("memory.oom_control"))?)
            }
            Version::V2 => ("memory.events", self.files.read(&memory.join("memory.events"))?),
        };
        let record = match stats::field(&text, "oom_kill") {
            Some(0) => OomRecord::NotKilled,
            Some(_) => OomRecord::Killed,
            None => OomRecord::NotCounted,
        };
        if record == OomRecord::NotCounted {
            tracing::debug!(cgroup = %self.name, file, "the kernel counts no OOM kills here");
        }
        Ok(record)
    }

    /// What the task has used (see [`CgroupStats`] for where each figure comes from).
    pub fn stats(&self) -> Result<CgroupStats, IsolateError> {
        let memory = self.need(Controller::Memory)?;
        let cpu = self.need(Controller::Cpu)?;
        let pids = self.need(Controller::Pids)?;
        let mut stats = CgroupStats::default();
        let memory_stat = self.files.read(&memory.join("memory.stat"))?;
        let cpu_stat = self.files.read(&cpu.join("cpu.stat"))?;
        stats.processes = self.files.number(&pids.join("pids.current"))?;
        stats.cpu_periods = stats::field(&cpu_stat, "nr_periods").unwrap_or(0);
        stats.cpu_throttled_periods = stats::field(&cpu_stat, "nr_throttled").unwrap_or(0);
        match self.version {
            Version::V1 => {
                stats.memory_rss = stats::field(&memory_stat, "rss").unwrap_or(0);
                stats.memory_cache = stats::field(&memory_stat, "cache").unwrap_or(0);
                if let Some(swap) = stats::field(&memory_stat, "swap") {
                    stats.memory_swap = swap;
                    stats.measured.swap = true;
                }
                stats.memory_max_usage =
                    self.files.number(&memory.join("memory.max_usage_in_bytes"))?;
                stats.measured.max_usage = true;
                let cpuacct = self.need(Controller::Cpuacct)?;
                stats.cpu_total =
                    Duration::from_nanos(self.files.number(&cpuacct.join("cpuacct.usage"))?);
                let path = cpuacct.join("cpuacct.usage_all");
                let (user, system) =
                    stats::usage_all(&self.files.read(&path)?).ok_or_else(|| {
                        IsolateError::Unreadable {
                            path,
                            reason: "not `cpu user system` lines".into(),
                        }
                    })?;
                stats.cpu_user = Duration::from_nanos(user);
                stats.cpu_system = Duration::from_nanos(system);
                stats.cpu_throttled =
                    Duration::from_nanos(stats::field(&cpu_stat, "throttled_time").unwrap_or(0));
            }
            Version::V2 => {
                stats.memory_rss = stats::field(&memory_stat, "anon").unwrap_or(0);
                stats.memory_cache = stats::field(&memory_stat, "file").unwrap_or(0);
                if let Ok(swap) = self.files.number(&memory.join("memory.swap.current")) {
                    stats.memory_swap = swap;
                    stats.measured.swap = true;
                }
                if let Ok(peak) = self.files.number(&memory.join("memory.peak")) {
                    stats.memory_max_usage = peak;
                    stats.measured.max_usage = true;
                }
                let micros = |key| Duration::from_micros(stats::field(&cpu_stat, key).unwrap_or(0));
                stats.cpu_total = micros("usage_usec");
                stats.cpu_user = micros("user_usec");
                stats.cpu_system = micros("system_usec");
                stats.cpu_throttled = micros("throttled_usec");
            }
        }
        Ok(stats)
    }
}

/// Locks a directory, waiting briefly for a holder that is only a child of an agent on its
/// way to exec (it keeps a copy of the descriptor until then). `None`: still held after that,
/// by a live agent.
fn lock_dir(dir: &Path) -> Result<Option<OwnedFd>, IsolateError> {
    let lock = crate::sys::open_dir(dir).map_err(IsolateError::io(dir))?;
    let mut wait = Duration::from_millis(1);
    let mut waited = Duration::ZERO;
    while !crate::sys::try_lock_exclusive(lock.as_fd()).map_err(IsolateError::io(dir))? {
        if waited >= LOCK_LIMIT {
            return Ok(None);
        }
        std::thread::sleep(wait);
        waited += wait;
        wait = (wait * 2).min(Duration::from_millis(100));
    }
    Ok(Some(lock))
}

/// Locks the parent for this manager.
fn lock_parent(parent: &Path) -> Result<OwnedFd, IsolateError> {
    lock_dir(parent)?.ok_or_else(|| IsolateError::ParentInUse { path: parent.to_owned() })
}

/// Locks the directory above the parent, while an agent makes its parent there or sweeps it.
fn lock_above(above: &Path) -> Result<OwnedFd, IsolateError> {
    lock_dir(above)?.ok_or_else(|| IsolateError::Invalid {
        what: above.display().to_string(),
        reason: "stays locked: another wharf agent is making or sweeping its cgroup parent here"
            .into(),
    })
}

/// The cgroup name of a task run's id: `<alloc>/<task>/<run>` becomes `<alloc>.<task>.<run>`,
/// with anything but letters, digits, `-` and `_` replaced by `_`. A name always holds a `.`,
/// so it is never `share` or `reserve`.
pub fn cgroup_name(task_id: &str) -> String {
    let name: String = task_id
        .chars()
        .take(200)
        .map(|c| match c {
            '/' => '.',
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => c,
            _ => '_',
        })
        .collect();
    if name.contains('.') && !name.starts_with('.') { name } else { format!("task.{name}") }
}

fn is_task_name(name: &str) -> bool {
    name.contains('.')
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// A configured parent path as relative components; `..`, `.` and empty names refused.
fn checked_relative(path: &str) -> Result<PathBuf, IsolateError> {
    let invalid = |reason: &str| IsolateError::Invalid {
        what: format!("cgroup parent {path:?}"),
        reason: reason.into(),
    };
    if path.contains(['\n', '\0']) {
        return Err(invalid("contains a newline or NUL"));
    }
    let mut relative = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => relative.push(name),
            _ => return Err(invalid("may hold only plain names, no `.` or `..`")),
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(invalid("names no cgroup below the root"));
    }
    Ok(relative)
}

/// Makes `dir` and the directories between `base` and it. For v1 cpusets, a new directory
/// gets its parent's CPUs and memory nodes (it starts with none, and could hold no task).
fn make_dirs(base: &Path, dir: &Path, cpuset_v1: bool) -> Result<(), IsolateError> {
    let Ok(below) = dir.strip_prefix(base) else {
        return Err(IsolateError::Invalid {
            what: dir.display().to_string(),
            reason: format!("is not below {}", base.display()),
        });
    };
    let mut current = base.to_path_buf();
    for component in below.components() {
        let parent = current.clone();
        current.push(component);
        match std::fs::create_dir(&current) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(IsolateError::Io { path: current, source: e }),
        }
        if cpuset_v1 {
            for file in ["cpuset.mems", "cpuset.cpus"] {
                if read_text(&current.join(file))?.trim().is_empty() {
                    write(&current.join(file), read_text(&parent.join(file))?.trim())?;
                }
            }
        }
    }
    Ok(())
}

/// v2: hands the controllers wharf uses down from `base` to `dir`, level by level: the
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

/// v2: the agent's own cgroup, for a process in `cgroup`. A process in a leaf [`AGENT_LEAF`]
/// is an agent that moved there, or was started there after a restart (as systemd's
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

/// Moves every process of the v2 cgroup `dir` into its leaf [`AGENT_LEAF`] (made if needed).
/// A process that exits meanwhile is skipped.
fn evacuate(dir: &Path) -> Result<(), IsolateError> {
    let leaf = dir.join(AGENT_LEAF);
    match std::fs::create_dir(&leaf) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(IsolateError::Io { path: leaf, source: e });
        }
        _ => {}
    }
    let procs = read_text(&dir.join("cgroup.procs"))?;
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

fn read_text(path: &Path) -> Result<String, IsolateError> {
    std::fs::read_to_string(path).map_err(IsolateError::io(path))
}

fn write(path: &Path, value: &str) -> Result<(), IsolateError> {
    std::fs::write(path, value).map_err(IsolateError::io(path))
}

/// Writes a file the kernel may not have (swap accounting is optional).
fn write_if_present(path: &Path, value: &str) -> Result<(), IsolateError> {
    if path.exists() { write(path, value) } else { Ok(()) }
}

fn remove_dir(path: &Path) -> Result<(), IsolateError> {
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(IsolateError::Io { path: path.to_owned(), source: e })
        }
        _ => Ok(()),
    }
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
}
