//! The `exec` driver's isolation: the node's settings ([`ExecOptions`], as exec2's plugin
//! config), a task's `config` block ([`ExecConfig`]: raw_exec's fields plus `unveil`,
//! `pid_mode`, `ipc_mode`), and, per start, the task's workload user, directories and
//! [`Containment`] (wharf-isolate makes every containment system call; this module decides
//! what to ask for).
//!
//! What a task under `exec` may reach (Landlock rules):
//!
//! | path | rights |
//! |---|---|
//! | the node's defaults ([`landlock::default_unveils`]), if `unveil_defaults` | mostly `rx` and `r`, skipped where missing |
//! | the node's `unveil_paths` | as given; must exist, and reach nothing guarded ([`check_unveil`]) |
//! | the task directory | everything but removing or renaming directories |
//! | each directory in it when the task starts (`local/`, `secrets/`, ...), except `logs/` | everything |
//! | the allocation directory | everything |
//! | the task's `unveil` entries, if `unveil_by_task` | as given; must exist, and reach nothing guarded |
//! | the node's host volumes the task mounts (`volume_mount`) | `rx` if read-only, else everything |
//!
//! Host volumes are also bound at their `destination` in a mount namespace of the task's own
//! (a read-only one remounted read-only, so writes fail there whatever Landlock allows on the
//! way up): a relative destination lies in the task directory, whose missing directories are
//! made (following no link), and an absolute one must be an existing directory of the node,
//! which the task alone then sees covered. The Landlock rule follows the volume's directory
//! to its destination, since a bind shows the same directory.
//!
//! The rule on the task directory itself lacks `REMOVE_DIR` so that the task cannot move
//! `logs/` or `secrets/` aside and put something else in their place: the shim and the agent,
//! running as root, write and read there. Files directly in the task directory are the task's
//! to create, change and delete. The driver's run records (exit records, the shim's
//! diagnostics) are kept beside the task directory, where the task cannot reach
//! (`../.exec/<task>/`, see [`crate::EXEC_RUNS_DIR`]).
//!
//! Directories: the task directory and its subdirectories (as above) are handed to the
//! workload user, and so is what the agent made below them before the start (directories,
//! and regular files with a single link: rendered templates, artifacts; not `logs/`), the
//! task directory is made private to it (mode 0700), and the allocation
//! directory and its subdirectories are made writable by every task of the allocation, each
//! its own files only (mode 1777, as `/tmp`). Tasks write in both, and may have put a link in
//! place of any entry: every entry is opened without following a link, and changed through
//! its descriptor ([`wharf_isolate::dirs`]), so a link is left alone rather than followed.
//!
//! Environment: the task's, plus `HOME` (the task directory) and `TMPDIR` (its `local/`, or
//! the task directory) when the task does not set them, since the usual fallbacks (the
//! password database, `/tmp`) are out of reach.

use crate::config::{RawExecConfig, deserialize_block};
use crate::protocol::SHIM_NAME;
use crate::task_cgroups::TaskCgroups;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wharf_driver::{DriverError, Health, TaskConfig};
use wharf_isolate::dirs::OpenDir;
use wharf_isolate::landlock::{self, Access, Mode, Rule, Unveil};
use wharf_isolate::namespace::Namespaces;
use wharf_isolate::users::{self, Ugid, UgidRange, UserPool};
use wharf_isolate::{BindMount, Containment, IsolateError};

/// The name job specs use for the isolated driver.
pub const EXEC_DRIVER_NAME: &str = "exec";

/// Whether a task gets a namespace of its own, as Nomad's exec driver names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceMode {
    /// A namespace of the task's own.
    Private,
    /// The node's.
    Host,
}

impl NamespaceMode {
    fn private(self) -> bool {
        self == NamespaceMode::Private
    }
}

/// The node's settings for the `exec` driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOptions {
    /// The journal of workload-user leases (by default `<data_dir>/workload-users`).
    pub users_file: PathBuf,
    /// The ids workload users are taken from.
    pub users: UgidRange,
    /// Open the system paths of [`landlock::default_unveils`] to every task.
    pub unveil_defaults: bool,
    /// More paths for every task.
    pub unveil_paths: Vec<Unveil>,
    /// Let tasks name paths of their own (`config.unveil`). exec2 defaults this to false;
    /// wharf to true, because whoever may submit jobs may also use raw_exec, which runs them
    /// as root. A node that turns raw_exec off to contain its submitters turns this off too.
    pub unveil_by_task: bool,
    /// A task's PID namespace when its config does not say.
    pub default_pid_mode: NamespaceMode,
    /// A task's IPC namespace when its config does not say.
    pub default_ipc_mode: NamespaceMode,
    /// The node's data directory, which no `unveil` entry may reach (`None`: a driver used
    /// without a node).
    pub data_dir: Option<PathBuf>,
}

impl ExecOptions {
    /// The defaults, with the lease journal at `users_file`: Nomad's range 80,000 to 89,999,
    /// the default paths, tasks may unveil, private PID and IPC namespaces (as Nomad's exec
    /// driver).
    pub fn new(users_file: impl Into<PathBuf>) -> ExecOptions {
        ExecOptions {
            users_file: users_file.into(),
            users: UgidRange::DEFAULT,
            unveil_defaults: true,
            unveil_paths: Vec::new(),
            unveil_by_task: true,
            default_pid_mode: NamespaceMode::Private,
            default_ipc_mode: NamespaceMode::Private,
            data_dir: None,
        }
    }

    /// Refuses a node `unveil_paths` entry that reaches what no task may: the data directory, the programs this node runs as root (this
    /// executable and the `wharf-shim` beside it), or `/proc/1` where tasks run in the host's
    /// PID namespace by default. Each start checks again, with the driver's own shim and the
    /// task's PID namespace. The error names the entry by its index.
    pub fn check_unveil_paths(&self) -> Result<(), String> {
        let binaries = node_binaries(None);
        let host_pid = self.default_pid_mode == NamespaceMode::Host;
        for (index, unveil) in self.unveil_paths.iter().enumerate() {
            check_unveil(unveil, host_pid, self.data_dir.as_deref(), &binaries)
                .map_err(|reason| format!("drivers.exec.unveil_paths[{index}]: {reason}"))?;
        }
        Ok(())
    }
}

/// An `exec` task's `config` block.
///
/// | field | meaning |
/// |---|---|
/// | `command`, `args` | as for raw_exec ([`RawExecConfig`]) |
/// | `work_dir` | as for raw_exec, and somewhere the task may reach: its directory, the allocation's, or an unveiled path |
/// | `unveil` | more paths for this task, `"<mode>:<path>"` with a mode of `r`, `w`, `x`, `c` (exec2's form); needs the node's `unveil_by_task` |
/// | `pid_mode`, `ipc_mode` | `"private"` or `"host"`; default: the node's |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// The fields raw_exec reads.
    pub process: RawExecConfig,
    /// The task's own paths.
    pub unveil: Vec<Unveil>,
    /// Its PID namespace, if it chooses.
    pub pid_mode: Option<NamespaceMode>,
    /// Its IPC namespace, if it chooses.
    pub ipc_mode: Option<NamespaceMode>,
}

/// The fields `exec` reads beyond raw_exec's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IsolationFields {
    #[serde(default)]
    unveil: Vec<String>,
    #[serde(default)]
    pid_mode: Option<NamespaceMode>,
    #[serde(default)]
    ipc_mode: Option<NamespaceMode>,
}

impl ExecConfig {
    /// Reads and checks a `config` block; the error names the field (`config.unveil[1]`).
    pub fn parse(
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ExecConfig, DriverError> {
        let mut process = config.clone();
        let mut own = serde_json::Map::new();
        for field in ["unveil", "pid_mode", "ipc_mode"] {
            if let Some(value) = process.remove(field) {
                own.insert(field.to_owned(), value);
            }
        }
        let process = RawExecConfig::parse(&process)?;
        let fields: IsolationFields = deserialize_block(&own)?;
        let unveil = fields
            .unveil
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                Unveil::parse(entry).map_err(|e| {
                    let reason = match e {
                        IsolateError::Unveil { reason, .. } => reason,
                        other => other.to_string(),
                    };
                    DriverError::invalid_config(format!("config.unveil[{index}]"), reason)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExecConfig { process, unveil, pid_mode: fields.pid_mode, ipc_mode: fields.ipc_mode })
    }
}

/// The `exec` driver's isolation state: its settings and the node's workload users.
#[derive(Debug)]
pub(crate) struct Isolation {
    options: ExecOptions,
    /// The programs the node runs as root, which no task may change.
    binaries: Vec<PathBuf>,
    /// Opened on first use, and again after a failure (a journal that could not be opened is
    /// reported by the fingerprint and each start until it can be).
    pool: parking_lot::Mutex<Option<Arc<UserPool>>>,
    /// The node's default rules as this host has them, and when they were looked up
    /// ([`Isolation::default_rules`]).
    default_rules: parking_lot::Mutex<Option<(tokio::time::Instant, Arc<Vec<Rule>>)>>,
    /// A directory found, with every one above it, to let workload users through, and when
    /// ([`Isolation::check_passable`]): the tasks' directories share it.
    passable: parking_lot::Mutex<Option<(tokio::time::Instant, PathBuf)>>,
}

/// What a start needs from the isolation: the containment, and the environment to add.
#[derive(Debug)]
pub(crate) struct Contained {
    pub(crate) containment: Containment,
    pub(crate) user: Ugid,
    pub(crate) env: BTreeMap<String, String>,
}

impl Isolation {
    pub(crate) fn new(options: ExecOptions) -> Isolation {
        Isolation {
            options,
            binaries: node_binaries(None),
            pool: parking_lot::Mutex::new(None),
            default_rules: parking_lot::Mutex::new(None),
            passable: parking_lot::Mutex::new(None),
        }
    }

    /// The same isolation, for a driver that starts tasks under the shim at `shim`.
    pub(crate) fn with_shim(self, shim: &Path) -> Isolation {
        Isolation { binaries: node_binaries(Some(shim)), ..self }
    }

    /// Refuses the task's `unveil` entries that the node does not allow, or that reach what
    /// no task may ([`check_unveil`]); the error names the entry.
    pub(crate) fn check_task_unveils(&self, exec: &ExecConfig) -> Result<(), DriverError> {
        if !exec.unveil.is_empty() && !self.options.unveil_by_task {
            return Err(DriverError::invalid_config(
                "config.unveil",
                "this node does not let tasks unveil paths (drivers.exec.unveil_by_task = false)",
            ));
        }
        let host_pid = self.host_pid(exec);
        let data_dir = self.options.data_dir.as_deref();
        for (index, unveil) in exec.unveil.iter().enumerate() {
            check_unveil(unveil, host_pid, data_dir, &self.binaries).map_err(|reason| {
                DriverError::invalid_config(format!("config.unveil[{index}]"), reason)
            })?;
        }
        Ok(())
    }

    /// Whether the task runs in the host's PID namespace.
    fn host_pid(&self, exec: &ExecConfig) -> bool {
        exec.pid_mode.unwrap_or(self.options.default_pid_mode) == NamespaceMode::Host
    }

    /// The node's workload users, opening the journal if it is not open yet.
    pub(crate) fn pool(&self) -> Result<Arc<UserPool>, IsolateError> {
        let mut pool = self.pool.lock();
        if let Some(pool) = &*pool {
            return Ok(pool.clone());
        }
        let opened = Arc::new(UserPool::open(&self.options.users_file, self.options.users)?);
        *pool = Some(opened.clone());
        Ok(opened)
    }

    /// The Landlock rules of the node's default paths ([`landlock::default_rules`]), looked
    /// up again at every fingerprint and once the last look is [`DEFAULT_RULES_FRESH`] old,
    /// so a path that appears later reaches the tasks started after that. A path that goes
    /// away in between is skipped at the start (the rules say `if_exists`).
    fn default_rules(&self) -> Arc<Vec<Rule>> {
        let now = tokio::time::Instant::now();
        let mut cached = self.default_rules.lock();
        if let Some((looked, rules)) = &*cached
            && now.duration_since(*looked) < DEFAULT_RULES_FRESH
        {
            return rules.clone();
        }
        let rules = Arc::new(landlock::default_rules());
        *cached = Some((now, rules.clone()));
        rules
    }

    /// What this node offers the driver now.
    fn probe(&self) -> Probe {
        Probe {
            root: users::running_as_root(),
            landlock: landlock::abi().map_err(|e| e.to_string()),
            namespaces: Namespaces { pid: true, ipc: true }
                .check_supported()
                .map_err(|e| e.to_string()),
            users: self.pool().map(|pool| pool.range()).map_err(|e| e.to_string()),
            unveil_paths: self.options.unveil_paths.iter().try_for_each(|u| {
                std::fs::metadata(&u.path).map(drop).map_err(|e| format!("{u}: {e}"))?;
                let host_pid = self.options.default_pid_mode == NamespaceMode::Host;
                check_unveil(u, host_pid, self.options.data_dir.as_deref(), &self.binaries)
                    .map_err(|reason| format!("{u}: {reason}"))
            }),
        }
    }

    /// Whether tasks can be contained here, and why not; what was found goes into
    /// `attributes`. Tasks under `exec` need a cgroup each, which `cgroups` tells.
    pub(crate) fn fingerprint(
        &self,
        attributes: &mut BTreeMap<String, String>,
        cgroups: &TaskCgroups,
    ) -> (Health, String) {
        let options = &self.options;
        attributes
            .insert("driver.exec.unveil.defaults".into(), options.unveil_defaults.to_string());
        attributes.insert("driver.exec.unveil.tasks".into(), options.unveil_by_task.to_string());
        attributes.insert(
            "driver.exec.users".into(),
            format!("{}-{}", options.users.min(), options.users.max()),
        );
        let probe = self.probe();
        // The host's paths may have changed since the last look.
        self.default_rules.lock().take();
        self.passable.lock().take();
        if let Ok(abi) = &probe.landlock {
            attributes.insert("driver.exec.landlock_abi".into(), abi.to_string());
        }
        match (probe.judge(), cgroups) {
            ((Health::Healthy, _), TaskCgroups::Off { reason }) => {
                (Health::Unhealthy, format!("exec needs a cgroup for every task: {reason}"))
            }
            (verdict, _) => verdict,
        }
    }

    /// Gets a task ready to start under containment: checks its `unveil` entries, leases its
    /// workload user, prepares its directories (module docs) and builds its [`Containment`].
    pub(crate) fn prepare(
        &self,
        config: &TaskConfig,
        exec: &ExecConfig,
    ) -> Result<Contained, DriverError> {
        self.check_task_unveils(exec)?;
        // The node's paths reach every task; this one's PID namespace decides about /proc/1.
        let host_pid = self.host_pid(exec);
        for (index, unveil) in self.options.unveil_paths.iter().enumerate() {
            let data_dir = self.options.data_dir.as_deref();
            check_unveil(unveil, host_pid, data_dir, &self.binaries).map_err(|reason| {
                DriverError::other(format!("drivers.exec.unveil_paths[{index}]: {reason}"))
            })?;
        }
        for (index, unveil) in exec.unveil.iter().enumerate() {
            if let Err(e) = std::fs::metadata(&unveil.path) {
                return Err(DriverError::invalid_config(
                    format!("config.unveil[{index}]"),
                    format!("{}: {e}", unveil.path.display()),
                ));
            }
        }
        if let Some(work_dir) = &exec.process.work_dir {
            let defaults =
                if self.options.unveil_defaults { landlock::default_unveils() } else { Vec::new() };
            let unveiled = defaults.iter().chain(&self.options.unveil_paths).chain(&exec.unveil);
            let reachable = [config.task_dir.as_path(), config.alloc_dir.as_path()]
                .into_iter()
                .chain(unveiled.map(|u| u.path.as_path()));
            check_work_dir(&config.task_dir.join(work_dir), reachable)?;
        }
        let pool = self.pool().map_err(|e| {
            DriverError::other(format!("the workload-user journal cannot be used: {e}"))
        })?;
        let user = pool.acquire(&config.task_dir).map_err(|e| match e {
            // Tasks end and allocations are collected: a later start may find one free.
            IsolateError::UsersExhausted { .. } => DriverError::Retryable { reason: e.to_string() },
            e => DriverError::other(e),
        })?;
        let subdirs = self.prepare_dirs(config, user).map_err(DriverError::other)?;
        let mounts = bind_mounts(config)?;

        let mut rules = Vec::new();
        if self.options.unveil_defaults {
            rules.extend(self.default_rules().iter().cloned());
        }
        rules.extend(self.options.unveil_paths.iter().map(|u| u.rule(false)));
        rules.push(Rule::new(&config.task_dir, Mode::ALL.access().without(Access::REMOVE_DIR)));
        rules.extend(subdirs.into_iter().map(|dir| Rule::new(dir, Mode::ALL.access())));
        // A driver used without an alloc runner may have no allocation directory.
        rules.push(Rule { if_exists: true, ..Rule::new(&config.alloc_dir, Mode::ALL.access()) });
        rules.extend(exec.unveil.iter().map(|u| u.rule(false)));
        // Host volumes: the node offered them, the task mounts them, as read-only as asked.
        rules.extend(config.mounts.iter().map(|mount| {
            let mode = if mount.read_only { Mode::READ_EXECUTE } else { Mode::ALL };
            Rule::new(&mount.source, mode.access())
        }));
        let namespaces = Namespaces {
            pid: exec.pid_mode.unwrap_or(self.options.default_pid_mode).private(),
            ipc: exec.ipc_mode.unwrap_or(self.options.default_ipc_mode).private(),
        };
        let containment = Containment {
            // Joined as the driver's cgroup for the task says.
            cgroup: Vec::new(),
            user: Some(user),
            no_new_privs: true,
            landlock: Some(rules),
            namespaces,
            mounts,
        };

        let mut env = BTreeMap::new();
        if !config.env.contains_key("HOME") {
            env.insert("HOME".to_owned(), config.task_dir.display().to_string());
        }
        if !config.env.contains_key("TMPDIR") {
            let local = config.task_dir.join("local");
            let tmp = if local.is_dir() { local } else { config.task_dir.clone() };
            env.insert("TMPDIR".to_owned(), tmp.display().to_string());
        }
        Ok(Contained { containment, user, env })
    }

    /// Hands the task directory and its subdirectories to `user`, opens the allocation
    /// directory to all of the allocation's tasks; returns the subdirectories the task may
    /// manage in full.
    fn prepare_dirs(&self, config: &TaskConfig, user: Ugid) -> Result<Vec<PathBuf>, IsolateError> {
        self.check_passable(&config.task_dir)?;
        let logs =
            std::path::absolute(&config.logs.dir).unwrap_or_else(|_| config.logs.dir.clone());
        // The task may write in its directory and in the allocation's: everything below them
        // is reached through the open directories, without following a link it put there.
        let task_dir = OpenDir::open(&config.task_dir)?;
        let subdirs: Vec<OpenDir> =
            task_dir.subdirs()?.into_iter().filter(|dir| dir.path() != logs).collect();
        let mut owned = vec![&task_dir];
        owned.extend(&subdirs);
        users::hand_over(&owned, user)?;
        // What the agent made for the task before it started (rendered templates, fetched
        // artifacts, mount points) is the task's too, however private its mode.
        let handed =
            task_dir
                .hand_over_below(user.get(), user.get(), MAX_HANDED_OVER, &|path| path == logs)?;
        if handed > 0 {
            tracing::debug!(task_dir = %config.task_dir.display(), handed, "gave the agent's files in the task directory to its user");
        }
        task_dir.set_mode(0o700)?;
        if config.alloc_dir.is_dir() {
            let alloc_dir = OpenDir::open(&config.alloc_dir)?;
            alloc_dir.set_mode(0o1777)?;
            for dir in alloc_dir.subdirs()? {
                dir.set_mode(0o1777)?;
            }
        }
        Ok(subdirs.iter().map(|dir| dir.path().to_owned()).collect())
    }

    /// The task reaches its directories by absolute paths, as its workload user: every
    /// directory above `task_dir` must let others through. The directory above its
    /// allocation's, which all tasks share, is looked at again once [`DEFAULT_RULES_FRESH`]
    /// has passed (a task that meets a directory closed since then fails to start, by the
    /// kernel's word rather than this one's).
    fn check_passable(&self, task_dir: &Path) -> Result<(), IsolateError> {
        let now = tokio::time::Instant::now();
        let known = self
            .passable
            .lock()
            .clone()
            .filter(|(looked, _)| now.duration_since(*looked) < DEFAULT_RULES_FRESH)
            .map(|(_, dir)| dir);
        for dir in task_dir.ancestors().skip(1) {
            if known.as_deref() == Some(dir) {
                return Ok(());
            }
            let mode = std::fs::metadata(dir)
                .map_err(|source| IsolateError::Io { path: dir.to_owned(), source })?
                .permissions()
                .mode();
            if mode & 0o001 == 0 {
                return Err(IsolateError::Io {
                    path: dir.to_owned(),
                    source: std::io::Error::other(format!(
                        "workload users cannot pass through it (mode {:o}); make it 0711 or 0755",
                        mode & 0o7777
                    )),
                });
            }
        }
        if let Some(shared) = task_dir.ancestors().nth(2) {
            *self.passable.lock() = Some((now, shared.to_owned()));
        }
        Ok(())
    }
}

/// How long the node's default rules are used before the host's paths are looked up again.
const DEFAULT_RULES_FRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// The most entries of a task directory looked at, at a start, for what to hand to its user:
/// as many as an artifact may unpack.
const MAX_HANDED_OVER: usize = 100_000;

/// What a node offers the `exec` driver, as [`Isolation::probe`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Probe {
    /// Whether the agent runs as root.
    pub(crate) root: bool,
    /// The Landlock ABI, or why there is none.
    pub(crate) landlock: Result<u32, String>,
    /// Whether PID, mount and IPC namespaces can be made.
    pub(crate) namespaces: Result<(), String>,
    /// The workload users' range, or why their journal cannot be used.
    pub(crate) users: Result<UgidRange, String>,
    /// Whether the node's `unveil_paths` all exist.
    pub(crate) unveil_paths: Result<(), String>,
}

impl Probe {
    /// The driver's health, following exec2's fingerprint: what the kernel or the agent's
    /// privileges lack is `Undetected` (this node cannot run it at all), what a setting or a
    /// file breaks is `Unhealthy` (fixable here).
    pub(crate) fn judge(&self) -> (Health, String) {
        let lacking = if !self.root {
            Some("exec needs root: it switches each task to a workload user".to_owned())
        } else if let Err(reason) = &self.landlock {
            Some(reason.clone())
        } else {
            self.namespaces.as_ref().err().cloned()
        };
        if let Some(reason) = lacking {
            return (Health::Undetected, reason);
        }
        if let Err(reason) = &self.users {
            return (
                Health::Unhealthy,
                format!("the workload-user journal cannot be used: {reason}"),
            );
        }
        if let Err(reason) = &self.unveil_paths {
            return (Health::Unhealthy, format!("a node unveil path cannot be used: {reason}"));
        }
        let abi = self.landlock.as_ref().map_or(0, |abi| *abi);
        (Health::Healthy, format!("exec: ready (Landlock ABI {abi})"))
    }
}

/// Refuses an `unveil` entry that reaches what no task may, whatever its owner's rights there:
///
/// | guarded | refused modes | why |
/// |---|---|---|
/// | the node's data directory | any | the agent's state and token, and every allocation's files, where root works |
/// | the programs the node runs as root (the agent's executable, the shim) | `w`, `c` | a task that changes one runs its code as root |
/// | `/proc/1`, for a task in the host's PID namespace | any | the host's init (in a PID namespace of the task's own, `/proc/1` is the task) |
///
/// An entry reaches a guarded path if either lies in the other (so `r:/` reaches them all), as
/// written (`.` and `..` resolved) or as the kernel resolves it (symbolic links followed,
/// where the path exists). An entry under `/proc/self` is taken for the `/proc` its rule opens.
/// The error names the entry's path, the guarded path, and why.
pub(crate) fn check_unveil(
    unveil: &Unveil,
    host_pid: bool,
    data_dir: Option<&Path>,
    binaries: &[PathBuf],
) -> Result<(), String> {
    let writes = unveil.mode.write || unveil.mode.create;
    let mut guards: Vec<(&Path, &str, &str)> = Vec::new();
    if let Some(dir) = data_dir {
        guards.push((
            dir,
            "the node's data directory",
            "the agent's state and every allocation's files are there, and root works in them",
        ));
    }
    if writes {
        for binary in binaries {
            guards.push((
                binary,
                "a program the node runs as root",
                "a task may read or execute it (r, x), never change it (w, c)",
            ));
        }
    }
    if host_pid {
        guards.push((
            Path::new("/proc/1"),
            "the host's init",
            "the task runs in the host's PID namespace (pid_mode = \"host\"); in one of its \
             own, /proc/1 is the task itself",
        ));
    }
    let reached = path_forms(&unveil.rule(false).path);
    for (guarded, what, why) in guards {
        let overlaps = path_forms(guarded)
            .iter()
            .any(|g| reached.iter().any(|r| r.starts_with(g) || g.starts_with(r)));
        if overlaps {
            return Err(format!(
                "{} overlaps {what} ({}): {why}",
                unveil.path.display(),
                guarded.display()
            ));
        }
    }
    Ok(())
}

/// `path` as written (made absolute, `.` and `..` resolved), and as the kernel resolves it
/// if it exists.
fn path_forms(path: &Path) -> Vec<PathBuf> {
    use std::path::Component;
    let mut written = PathBuf::new();
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                written.pop();
            }
            Component::CurDir => {}
            other => written.push(other),
        }
    }
    let mut forms = vec![written];
    forms.extend(std::fs::canonicalize(path).ok());
    forms
}

/// The programs the node runs as root: this executable, the shim (`shim`), and the
/// `wharf-shim` beside this executable, which a driver may start. An in-memory shim
/// (`/proc/self/fd/...`) is no file a task could reach.
fn node_binaries(shim: Option<&Path>) -> Vec<PathBuf> {
    let exe = std::env::current_exe().ok();
    let beside = exe.as_ref().and_then(|exe| Some(exe.parent()?.join(SHIM_NAME)));
    let mut binaries: Vec<PathBuf> = exe
        .into_iter()
        .chain(shim.map(Path::to_owned))
        .chain(beside)
        .filter(|path| !path.starts_with("/proc/self"))
        .collect();
    binaries.dedup();
    binaries
}

/// Refuses a working directory the task could not use: one outside every path its rules give
/// it (exec2 refuses a `work_dir` outside the allocation unless tasks may unveil paths, and then
/// unveils it for the task; here the task or the node unveils it, which says what the task may
/// do there). Paths are compared as the kernel resolves them, so `..` and symbolic links
/// neither hide nor forge a way in. The default, the task directory, needs no check.
fn check_work_dir<'a>(
    work_dir: &Path,
    mut reachable: impl Iterator<Item = &'a Path>,
) -> Result<(), DriverError> {
    let refused = |reason: String| DriverError::invalid_config("config.work_dir", reason);
    let dir = std::fs::canonicalize(work_dir)
        .map_err(|e| refused(format!("{}: {e}", work_dir.display())))?;
    if reachable.any(|path| std::fs::canonicalize(path).is_ok_and(|path| dir.starts_with(path))) {
        Ok(())
    } else {
        Err(refused(format!(
            "{} is outside what the task may reach (its directory, the allocation's directory \
             and the paths unveiled to it); unveil it to work there",
            dir.display()
        )))
    }
}

/// The task's host volumes as bind mounts at their destinations (module docs): a relative
/// destination's directories made in the task directory, an absolute one checked.
fn bind_mounts(config: &TaskConfig) -> Result<Vec<BindMount>, DriverError> {
    let mut binds = Vec::with_capacity(config.mounts.len());
    for mount in &config.mounts {
        let field = || format!("volume_mount {:?}: destination", mount.volume);
        let destination = Path::new(&mount.destination);
        // The destination is named by its canonical path (a link already there is followed
        // now, as the node's configuration or the task directory had it): the task's
        // containment refuses a link on the way when it mounts, so one that appears after this
        // check is refused rather than followed.
        let at = if destination.is_absolute() {
            match std::fs::metadata(destination).and_then(|meta| {
                let canonical = std::fs::canonicalize(destination)?;
                Ok((meta, canonical))
            }) {
                Ok((meta, canonical)) if meta.is_dir() => canonical,
                Ok(_) => {
                    return Err(DriverError::invalid_config(
                        field(),
                        format!("{} is not a directory", destination.display()),
                    ));
                }
                Err(e) => {
                    return Err(DriverError::invalid_config(
                        field(),
                        format!(
                            "{}: {e} (under exec an absolute destination must be a directory of \
                             the node; a relative one is made in the task directory)",
                            destination.display()
                        ),
                    ));
                }
            }
        } else {
            let mut dir = OpenDir::open(&config.task_dir).map_err(DriverError::other)?;
            for part in destination.components() {
                let std::path::Component::Normal(name) = part else {
                    return Err(DriverError::invalid_config(
                        field(),
                        format!("{} must stay in the task directory", mount.destination),
                    ));
                };
                dir = dir.make_dir(name, 0o755).map_err(DriverError::other)?;
            }
            if dir.path() == config.task_dir {
                return Err(DriverError::invalid_config(field(), "must name a directory"));
            }
            let relative = dir.path().strip_prefix(&config.task_dir).map_err(DriverError::other)?;
            std::fs::canonicalize(&config.task_dir).map_err(DriverError::other)?.join(relative)
        };
        binds.push(BindMount {
            source: mount.source.clone(),
            destination: at,
            read_only: mount.read_only,
        });
    }
    Ok(binds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<ExecConfig, DriverError> {
        ExecConfig::parse(value.as_object().unwrap())
    }

    #[test]
    fn exec_configs_parse_or_name_the_bad_field() {
        let config = parse(json!({
            "command": "cat", "args": ["/etc/passwd"], "unveil": ["r:/etc/passwd"],
            "pid_mode": "host", "ipc_mode": "private"
        }))
        .unwrap();
        assert_eq!(config.process.command, "cat");
        assert_eq!(config.unveil, [Unveil::parse("r:/etc/passwd").unwrap()]);
        assert_eq!(config.pid_mode, Some(NamespaceMode::Host));
        assert_eq!(config.ipc_mode, Some(NamespaceMode::Private));
        let plain = parse(json!({"command": "env"})).unwrap();
        assert_eq!((plain.unveil.len(), plain.pid_mode, plain.ipc_mode), (0, None, None));
        for (config, field) in [
            (json!({}), "config.command"),
            (json!({"command": "env", "unveil": "r:/etc"}), "config.unveil"),
            (json!({"command": "env", "unveil": ["r:/etc", "/etc"]}), "config.unveil[1]"),
            (json!({"command": "env", "unveil": ["q:/etc"]}), "config.unveil[0]"),
            (json!({"command": "env", "unveil": ["r:etc"]}), "config.unveil[0]"),
            (json!({"command": "env", "pid_mode": "shared"}), "config.pid_mode"),
            (json!({"command": "env", "ipc_mode": 1}), "config.ipc_mode"),
            (json!({"command": "env", "user": "root"}), "config.user"),
        ] {
            match parse(config.clone()) {
                Err(DriverError::InvalidConfig { field: f, .. }) => {
                    assert_eq!(f, field, "{config}")
                }
                other => panic!("{config}: {other:?}"),
            }
        }
    }

    /// The default rules are this host's paths, once each as they resolve, each with a file's
    /// rights where it is a file; a path missing here has no rule (a task's process would
    /// only look for it in vain).
    #[test]
    fn the_default_rules_are_the_hosts_paths_cut_to_their_kind() {
        let isolation = Isolation::new(ExecOptions::new("/nonexistent/users"));
        let rules = isolation.default_rules();
        let defaults = landlock::default_unveils();
        let mut present: Vec<PathBuf> =
            defaults.iter().filter_map(|u| std::fs::canonicalize(&u.path).ok()).collect();
        present.sort();
        present.dedup();
        assert_eq!(rules.len(), present.len(), "{rules:?}");
        for rule in rules.iter() {
            assert!(rule.if_exists, "{rule:?}");
            let dir = rule.path.is_dir();
            let file_only = rule.access.intersection(Access::FILE) == rule.access;
            assert!(dir || file_only, "{rule:?}");
            assert!(!dir || rule.access.intersection(Access::READ_DIR) != Access::NONE, "{rule:?}");
        }
        assert!(Arc::ptr_eq(&rules, &isolation.default_rules()), "looked up once");
    }

    /// The default rules are used for a while, then looked up again.
    #[tokio::test(start_paused = true)]
    async fn the_default_rules_are_looked_up_again_once_stale() {
        let isolation = Isolation::new(ExecOptions::new("/nonexistent/users"));
        let first = isolation.default_rules();
        tokio::time::advance(DEFAULT_RULES_FRESH / 2).await;
        assert!(Arc::ptr_eq(&first, &isolation.default_rules()), "still fresh");
        tokio::time::advance(DEFAULT_RULES_FRESH).await;
        let again = isolation.default_rules();
        assert!(!Arc::ptr_eq(&first, &again), "looked up again");
        assert_eq!(first, again, "the same host, the same rules");
    }

    /// exec2's `Test_doFingerprint_*`: not root, a missing kernel feature, then what breaks
    /// on this node, each named.
    #[test]
    fn the_fingerprint_names_what_is_missing() {
        let ready = Probe {
            root: true,
            landlock: Ok(7),
            namespaces: Ok(()),
            users: Ok(UgidRange::DEFAULT),
            unveil_paths: Ok(()),
        };
        let cases = [
            (ready.clone(), Health::Healthy, "exec: ready (Landlock ABI 7)"),
            (Probe { root: false, ..ready.clone() }, Health::Undetected, "exec needs root"),
            (
                Probe {
                    landlock: Err("Landlock is not built into this kernel".into()),
                    ..ready.clone()
                },
                Health::Undetected,
                "Landlock is not built into this kernel",
            ),
            (
                Probe { namespaces: Err("pid namespaces: max 0".into()), ..ready.clone() },
                Health::Undetected,
                "pid namespaces",
            ),
            (
                Probe {
                    users: Err("/d/workload-users: Permission denied".into()),
                    ..ready.clone()
                },
                Health::Unhealthy,
                "the workload-user journal cannot be used: /d/workload-users",
            ),
            (
                Probe { unveil_paths: Err("r:/srv: No such file".into()), ..ready.clone() },
                Health::Unhealthy,
                "a node unveil path cannot be used: r:/srv",
            ),
            // Without root, the rest is not even looked at.
            (
                Probe { root: false, users: Err("x".into()), ..ready.clone() },
                Health::Undetected,
                "exec needs root",
            ),
        ];
        for (probe, health, reason) in cases {
            let (h, description) = probe.judge();
            assert_eq!(h, health, "{probe:?}");
            assert!(description.starts_with(reason), "{probe:?}: {description}");
        }
    }

    /// Entries that reach the node's data directory, a program it runs as root, or the host's
    /// `/proc/1`, as written, through `..` or through a link; and their neighbours, which pass.
    #[test]
    fn unveil_entries_that_reach_the_node_itself_are_refused_naming_the_path() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let data = root.join("data");
        std::fs::create_dir_all(data.join("allocs")).unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/wharf"), "").unwrap();
        std::os::unix::fs::symlink(&data, root.join("data-link")).unwrap();
        let binaries = [root.join("bin/wharf")];
        let at = |path: &str| format!("{}/{path}", root.display());
        let data_dir = format!("overlaps the node's data directory ({})", data.display());
        let binary = format!("overlaps a program the node runs as root ({})", at("bin/wharf"));
        let init = "overlaps the host's init (/proc/1)".to_owned();
        // (entry, host PID namespace, what the error says, or None for a pass)
        let cases = [
            (format!("r:{}", data.display()), false, Some(&data_dir)),
            (format!("rwc:{}", at("data/allocs")), false, Some(&data_dir)),
            (format!("r:{}", root.display()), false, Some(&data_dir)),
            ("r:/".to_owned(), false, Some(&data_dir)),
            (format!("r:{}", at("bin/../data/allocs")), false, Some(&data_dir)),
            (format!("r:{}", at("data-link/allocs")), false, Some(&data_dir)),
            (format!("r:{}", at("database")), false, None),
            (format!("rwc:{}", at("data/../other")), false, None),
            (format!("rx:{}", at("bin")), false, None),
            (format!("r:{}", at("bin/wharf")), false, None),
            (format!("rw:{}", at("bin/wharf")), false, Some(&binary)),
            (format!("c:{}", at("bin")), false, Some(&binary)),
            ("r:/proc".to_owned(), true, Some(&init)),
            ("r:/proc/1/status".to_owned(), true, Some(&init)),
            ("r:/proc/self/status".to_owned(), true, Some(&init)),
            ("r:/proc/cpuinfo".to_owned(), true, None),
            ("r:/proc".to_owned(), false, None),
            ("r:/proc/self/status".to_owned(), false, None),
        ];
        for (entry, host_pid, refused) in cases {
            let unveil = Unveil::parse(&entry).unwrap();
            let checked = check_unveil(&unveil, host_pid, Some(&data), &binaries);
            match (refused, checked) {
                (None, Ok(())) => {}
                (Some(reason), Err(error)) => {
                    let path = entry.split_once(':').unwrap().1;
                    assert!(error.starts_with(&format!("{path} {reason}")), "{entry}: {error}");
                }
                (refused, checked) => {
                    panic!("{entry} (host PID {host_pid}): {checked:?}, expected {refused:?}")
                }
            }
        }
    }

    /// A task directory laid out as the task runner makes it, under a searchable root.
    fn task_config(root: &Path, driver_config: serde_json::Value) -> TaskConfig {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let task_dir = root.join("a1/web");
        for dir in
            ["a1/alloc/data", "a1/alloc/logs", "a1/web/local", "a1/web/secrets", "a1/web/logs"]
        {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        TaskConfig {
            id: wharf_driver::TaskId::new("a1", "web", 1),
            alloc_id: "a1".into(),
            job_id: "j".into(),
            group: "g".into(),
            task_name: "web".into(),
            env: BTreeMap::from([("HOME".to_owned(), "/set/by/the/task".to_owned())]),
            alloc_dir: root.join("a1/alloc"),
            logs: wharf_driver::LogConfig {
                dir: task_dir.join("logs"),
                max_files: 2,
                max_file_bytes: 1024,
            },
            task_dir,
            resources: Default::default(),
            driver_config: driver_config.as_object().cloned().unwrap(),
            mounts: Vec::new(),
        }
    }

    #[test]
    fn a_start_hands_the_task_its_directories_and_nothing_of_the_drivers() {
        use std::os::unix::fs::MetadataExt;
        assert!(users::running_as_root(), "this test changes owners: run it as root");
        let root = tempfile::tempdir().unwrap();
        let config =
            task_config(root.path(), json!({"command": "env", "unveil": ["r:/etc/passwd"]}));
        let task_dir = config.task_dir.clone();
        // A link an earlier run left: neither followed nor given a rule.
        std::os::unix::fs::symlink("/etc", task_dir.join("etc-link")).unwrap();
        let mut options = ExecOptions::new(root.path().join("workload-users"));
        options.users = UgidRange::new(1_900_000_200, 1_900_000_209).unwrap();
        options.default_pid_mode = NamespaceMode::Host;
        let isolation = Isolation::new(options);
        let exec = ExecConfig::parse(&config.driver_config).unwrap();
        let contained = isolation.prepare(&config, &exec).unwrap();

        let user = contained.user.get();
        assert!((1_900_000_200..=1_900_000_209).contains(&user));
        let meta = |path: &Path| std::fs::symlink_metadata(path).unwrap();
        for (path, uid, mode) in [
            (task_dir.clone(), user, 0o700),
            (task_dir.join("local"), user, 0o755),
            (task_dir.join("secrets"), user, 0o755),
            (task_dir.join("logs"), 0, 0o755),
            (config.alloc_dir.clone(), 0, 0o1777),
            (config.alloc_dir.join("data"), 0, 0o1777),
        ] {
            let m = meta(&path);
            assert_eq!((m.uid(), m.mode() & 0o7777), (uid, mode), "{}", path.display());
        }
        assert_eq!(meta(Path::new("/etc")).uid(), 0);

        let containment = &contained.containment;
        assert_eq!(containment.user, Some(contained.user));
        assert!(containment.no_new_privs);
        assert_eq!(containment.namespaces, Namespaces { pid: false, ipc: true });
        let rules = containment.landlock.as_ref().unwrap();
        let rule = |path: &Path| rules.iter().find(|r| r.path == path).map(|r| r.access);
        assert_eq!(rule(&task_dir), Some(Mode::ALL.access().without(Access::REMOVE_DIR)));
        assert_eq!(rule(&task_dir.join("local")), Some(Mode::ALL.access()));
        assert_eq!(rule(&task_dir.join("secrets")), Some(Mode::ALL.access()));
        assert_eq!(rule(&config.alloc_dir), Some(Mode::ALL.access()));
        assert_eq!(rule(Path::new("/etc/passwd")), Some(Mode::READ.access()));
        assert_eq!(rule(Path::new("/usr/bin")), Some(Mode::READ_EXECUTE.access()));
        for private in [task_dir.join("logs"), task_dir.join("etc-link"), "/tmp".into()] {
            assert_eq!(rule(&private), None, "{}", private.display());
        }
        assert_eq!(
            contained.env,
            BTreeMap::from([("TMPDIR".to_owned(), task_dir.join("local").display().to_string())])
        );

        // The next run of the same task gets the same user.
        let again = isolation.prepare(&config, &exec).unwrap();
        assert_eq!(again.user, contained.user);
    }

    #[test]
    fn starts_that_cannot_be_contained_say_why() {
        assert!(users::running_as_root(), "this test changes owners: run it as root");
        let root = tempfile::tempdir().unwrap();
        let config = task_config(root.path(), json!({"command": "env"}));
        let prepare = |options: ExecOptions, unveil: &[&str]| {
            let mut exec = ExecConfig::parse(&config.driver_config).unwrap();
            exec.unveil = unveil.iter().map(|u| Unveil::parse(u).unwrap()).collect();
            Isolation::new(options).prepare(&config, &exec)
        };
        let options = ExecOptions::new(root.path().join("workload-users"));
        let refused = ExecOptions { unveil_by_task: false, ..options.clone() };
        let node = ExecOptions { data_dir: Some(root.path().to_owned()), ..options.clone() };
        let data_dir = format!("r:{}", root.path().join("a1/alloc/data").display());
        for (options, unveil, field, reason) in [
            (refused, &["r:/etc"][..], "config.unveil", "unveil_by_task = false"),
            (
                options.clone(),
                &["r:/etc", "r:/nonexistent"][..],
                "config.unveil[1]",
                "/nonexistent",
            ),
            (node, &["r:/etc", &data_dir][..], "config.unveil[1]", "the node's data directory"),
        ] {
            match prepare(options, unveil) {
                Err(DriverError::InvalidConfig { field: f, reason: r }) => {
                    assert_eq!(f, field);
                    assert!(r.contains(reason), "{r}");
                }
                other => panic!("{other:?}"),
            }
        }
        let no_journal = ExecOptions::new(root.path().join("missing/workload-users"));
        let error = prepare(no_journal, &[]).unwrap_err().to_string();
        assert!(error.contains("workload-user journal cannot be used"), "{error}");

        // A directory above the task's that workload users cannot pass through.
        std::fs::set_permissions(root.path().join("a1"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let error = prepare(options, &[]).unwrap_err().to_string();
        assert!(error.contains("workload users cannot pass through it (mode 700)"), "{error}");
    }

    /// The directories above the allocations' are looked at once for all of them (until
    /// the look is stale); an allocation's own directory at each of its tasks' starts.
    #[test]
    fn each_start_looks_at_its_allocations_directory_and_the_ones_above_once() {
        assert!(users::running_as_root(), "this test changes owners: run it as root");
        let root = tempfile::tempdir().unwrap();
        let first = task_config(root.path(), json!({"command": "env"}));
        let exec = ExecConfig::parse(&first.driver_config).unwrap();
        let isolation = Isolation::new(ExecOptions::new(root.path().join("workload-users")));
        isolation.prepare(&first, &exec).unwrap();
        assert_eq!(
            isolation.passable.lock().as_ref().map(|(_, dir)| dir.clone()),
            Some(root.path().to_owned())
        );

        let a2 = root.path().join("a2");
        for dir in ["alloc", "web/local", "web/logs"] {
            std::fs::create_dir_all(a2.join(dir)).unwrap();
        }
        let second = TaskConfig {
            id: wharf_driver::TaskId::new("a2", "web", 1),
            alloc_id: "a2".into(),
            alloc_dir: a2.join("alloc"),
            logs: wharf_driver::LogConfig { dir: a2.join("web/logs"), ..first.logs.clone() },
            task_dir: a2.join("web"),
            ..first.clone()
        };
        let mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        // The shared directory closed since: not looked at again while the look is fresh.
        mode(root.path(), 0o700);
        isolation.prepare(&second, &exec).unwrap();
        mode(&a2, 0o700);
        let error = isolation.prepare(&second, &exec).unwrap_err().to_string();
        assert!(error.contains("a2: workload users cannot pass through it"), "{error}");
        mode(&a2, 0o755);
        mode(root.path(), 0o755);
        isolation.prepare(&second, &exec).unwrap();
    }
}
