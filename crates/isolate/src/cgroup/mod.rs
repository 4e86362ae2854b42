//! Every task in a cgroup of its own: limits from its `resources`, accounting, OOM detection,
//! and a kill that nothing in the cgroup escapes. cgroup v1 and v2 both, detected at start.
//!
//! [`Cgroups`] is the node's cgroups (the drivers share them): it finds the hierarchy, makes
//! and locks the parent, keeps the books of reserved cores, and makes, adopts and removes the
//! task cgroups under the parent. A [`TaskCgroup`] (module `task`) is one task run's cgroup:
//! the files its process joins it through ([`TaskCgroup::join_files`], a step of
//! [`crate::Containment`]), its kill, its stats and its OOM record.
//!
//! What differs between v1 and v2 is a manager per version behind one trait (module
//! `manager`): `v1::V1Manager` (a parent in each controller's hierarchy) and `v2::V2Manager`
//! (one directory per cgroup, in a `share` or `reserve` partition). The version is chosen once,
//! in [`Cgroups::open_with`], from what `detect` finds; the node's cgroups and every task
//! cgroup then ask their manager, and the file work both versions share is `files`'.
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
//! What this module does not do: start or signal processes (the driver's shim starts them; a
//! process joins between fork and exec, through [`crate::Containment`]; a kill hands each pid
//! to the caller, see [`TaskCgroup::kill_all`]) or decide what a task may have (the node
//! admits it, the task spec says what it gets).
//!
//! The v1 code runs against this host's real cgroups in this crate's tests; the v2 code against
//! a fake cgroupfs tree here, and on a real v2 kernel in `tests/cgroup_v2.rs`, which
//! `cargo xtask cgroup2` runs in a virtual machine.

mod detect;
mod files;
mod limits;
mod manager;
mod partition;
mod stats;
mod task;
mod v1;
mod v2;

pub use limits::{CpuQuota, DEFAULT_CFS_PERIOD_US, Limits, NodeCpu};
pub use manager::{Controller, OomRecord, Version};
pub use stats::{CgroupStats, Measured};
pub use task::TaskCgroup;

use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use manager::{CgroupManager, ParentSite, RESERVE, SHARE};
use parking_lot::Mutex;
use partition::Partition;
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use v1::V1Manager;
use v2::V2Manager;

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

/// How long removal retries a cgroup whose last processes are still exiting.
const REMOVE_LIMIT: Duration = Duration::from_secs(2);

/// The node's task cgroups. Shared by the drivers (`Arc`); every method takes `&self`.
#[derive(Debug)]
pub struct Cgroups {
    /// The version's manager: the parents, the partitions, the files that differ.
    manager: Arc<dyn CgroupManager>,
    options: CgroupOptions,
    partition: Mutex<Partition>,
    /// The task cgroups this manager made or adopted.
    live: Mutex<HashSet<String>>,
    /// The locks on the parents, held while the manager lives.
    _locks: Vec<OwnedFd>,
}

impl Cgroups {
    /// Finds this host's hierarchy and sets up the parent: the start of an agent.
    ///
    /// Open it before the agent starts any process. On cgroup v2, a parent below the agent's
    /// own cgroup needs that cgroup emptied, so every process in it moves to a leaf `agent`:
    /// a child between its fork and its join of a task cgroup is among them, and could be
    /// moved out of the cgroup it has just joined.
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
        let sites: Vec<ParentSite> = layout
            .hierarchies
            .iter()
            .map(|hierarchy| {
                let base = if base_of { hierarchy.own.clone() } else { hierarchy.mount.clone() };
                ParentSite {
                    controllers: hierarchy.controllers.clone(),
                    own: hierarchy.own.clone(),
                    parent: base.join(&relative),
                    base,
                }
            })
            .collect();
        // The one place the version is chosen: everything that differs is the manager's.
        let opened = match layout.version {
            Version::V1 => V1Manager::open(&sites, &options.reserved_cores)?,
            Version::V2 => V2Manager::open(&sites, &options.reserved_cores)?,
        };
        let cgroups = Cgroups {
            manager: opened.manager,
            partition: Mutex::new(Partition::new(opened.usable)),
            live: Mutex::new(HashSet::new()),
            options,
            _locks: opened.locks,
        };
        cgroups.seed_reservations()?;
        if cgroups.options.sweep_siblings {
            cgroups.sweep_siblings();
        }
        Ok(cgroups)
    }

    /// Removes what agents that are gone left of their parents (see
    /// [`CgroupOptions::sweep_siblings`]): their task cgroups that hold no process, and the
    /// parents once empty. A sibling some agent holds is left alone; task cgroups with
    /// processes in them stay (the kernel refuses to remove them), for their agent's return.
    fn sweep_siblings(&self) {
        for place in self.manager.places() {
            let Some(above) = place.parent.parent() else { continue };
            // Held for the sweep, so no agent makes its parent here meanwhile (see `open_with`).
            let _sweeping = match files::lock_above(above) {
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
        self.manager.version()
    }

    /// The parent directories, one per hierarchy.
    pub fn parents(&self) -> Vec<&Path> {
        self.manager.places().iter().map(|p| p.parent.as_path()).collect()
    }

    /// The directories at `relative` (from a hierarchy's root) in every cgroup hierarchy
    /// mounted on this host (see [`mount_points`]) that exist and are not one of the node's
    /// [`parents`](Cgroups::parents): what a container runtime, which makes a cgroup's path in
    /// every hierarchy, made outside the node's. Told apart by device and inode, as a hierarchy
    /// mounted twice shows one directory under two names.
    pub fn made_outside_parents(&self, relative: &Path) -> Result<Vec<PathBuf>, IsolateError> {
        let identity = |path: &Path| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        let own: Vec<_> = self.parents().into_iter().filter_map(identity).collect();
        Ok(mount_points()?
            .into_iter()
            .map(|mount| mount.join(relative))
            .filter(|dir| identity(dir).is_some_and(|id| !own.contains(&id)))
            .collect())
    }

    /// Whether tasks can reserve cores here (the cpuset controller is usable).
    pub fn can_reserve_cores(&self) -> bool {
        self.manager.cpuset().is_some()
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
                if self.manager.cpuset().is_none() {
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
        for dir in task.dirs.dirs.iter().filter(|d| d.owned) {
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
            Some(cores) if self.manager.cpuset().is_some() => {
                let kept = self.partition.lock().restore(&name, cores);
                self.write_partition()?;
                Some(kept)
            }
            _ => None,
        };
        let task = self.task_at(&name, cores);
        if let Some(missing) = task.dirs.dirs.iter().find(|d| !d.path.is_dir()) {
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
        task.dirs.files.close();
        self.remove_dirs(task)?;
        self.release_cores(task.name());
        self.live.lock().remove(task.name());
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
            let cores = self.manager.cpuset().and_then(|dirs| {
                let cpus = files::read_text(&dirs.reserve.join(&name).join("cpuset.cpus")).ok()?;
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
        for place in self.manager.places() {
            for partition in [RESERVE, SHARE] {
                files::remove_dir(&place.parent.join(partition))?;
            }
            files::remove_dir(&place.parent)?;
        }
        Ok(())
    }

    /// The names of the task cgroups under the parent.
    fn task_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .manager
            .task_holders()
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
        let dirs = self.manager.task_dirs(name, cores.is_some());
        TaskCgroup::new(name, dirs, cores, Arc::clone(&self.manager))
    }

    fn remove_dirs(&self, task: &TaskCgroup) -> Result<(), IsolateError> {
        for dir in task.dirs.dirs.iter().filter(|d| d.owned) {
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
        let Some(dirs) = self.manager.cpuset() else { return Ok(()) };
        let (shared, reserved) = {
            let partition = self.partition.lock();
            (partition.shared(), partition.reserved())
        };
        files::write(&dirs.share.join("cpuset.cpus"), &shared.to_string())?;
        files::write(&dirs.reserve.join("cpuset.cpus"), &reserved.to_string())
    }

    /// Reads the reservations of task cgroups that are still there from an earlier agent, so
    /// their cores stay theirs until they are adopted or removed as orphans.
    fn seed_reservations(&self) -> Result<(), IsolateError> {
        let Some(dirs) = self.manager.cpuset() else { return Ok(()) };
        let entries = std::fs::read_dir(&dirs.reserve).into_iter().flatten().flatten();
        for entry in entries {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if !is_task_name(&name) {
                continue;
            }
            if let Ok(cpus) = files::read_text(&entry.path().join("cpuset.cpus"))
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
        for place in self.manager.places() {
            for dir in [place.parent.join(RESERVE), place.parent.join(SHARE), place.parent.clone()]
            {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// Where every cgroup hierarchy of this host (v1 and v2) is mounted from its root, as
/// `/proc/self/mountinfo` says now: the places a container runtime makes a cgroup's path.
pub fn mount_points() -> Result<Vec<PathBuf>, IsolateError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(IsolateError::io("/proc/self/mountinfo"))?;
    Ok(detect::mount_points(&mountinfo))
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
