//! [`RawExecDriver`]: the [`Driver`] trait over shims and real processes.
//!
//! The driver keeps one entry per task it started or recovered: the task's identities (pid and
//! start time of the task and of its shim), its run directory, and a `watch` channel that a
//! background watcher fills with the [`ExitResult`] once the shim exits. Every method works the
//! same for fresh and recovered tasks; only reaping differs (the driver reaps the shims it
//! spawned, nothing else).
//!
//! Signals go to the task's process group through a pidfd of its main process, opened and then
//! checked against the recorded start time: a pid that now belongs to another process is never
//! signalled.
//!
//! With a cgroup manager ([`TaskCgroups::On`]) every task runs in a cgroup of its own
//! (module `task_cgroups`): made with the task's limits before the shim starts, joined by the task
//! between clone and exec, killed whole at the end of a stop (so processes that left the
//! task's group die too), read for stats and for OOM kills, adopted after an agent restart, and
//! removed at destroy.

use crate::config::{RawExecConfig, check_env, resolve_command, resolve_work_dir};
use crate::error::ExecError;
use crate::handle::{CgroupState, DRIVER_STATE_VERSION, ShimState};
use crate::housekeeping;
use crate::isolation::{EXEC_DRIVER_NAME, ExecConfig, Isolation};
use crate::launch::{self, Watch};
use crate::protocol::{SHIM_LOG, SHIM_NAME, ShimArgs, StartReport, StartStep};
use crate::sys::{self, Pid, ProcStat};
use crate::task_cgroups::{self, TaskCgroups};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use wharf_driver::{
    Capabilities, Driver, DriverError, DriverEvent, ExecResult, ExitResult, Fingerprint,
    FsIsolation, Health, LogFrom, LogReader, LogStream, LogTarget, ResourceUsage, RunState,
    TASK_HANDLE_VERSION, TaskConfig, TaskHandle, TaskId, TaskInfo,
};
use wharf_isolate::TaskCgroup;
use wharf_state::Signal;
use wharf_state::duration::Formatted;

/// The name job specs use for this driver.
pub const DRIVER_NAME: &str = "raw_exec";
/// The directory, inside a task directory, that holds one run directory per run.
pub const RUNS_DIR: &str = ".raw_exec";
/// The directory beside the task directories (in the allocation's directory) where the `exec`
/// driver keeps the run directories of each task, `<EXEC_RUNS_DIR>/<task>/<run>`: out of the
/// reach of the tasks, which write their own directories as workload users.
pub const EXEC_RUNS_DIR: &str = ".exec";

/// How the driver runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawExecOptions {
    /// The shim program. Default: raw_exec starts the static shim this crate carries (from a
    /// sealed in-memory file); the isolated `exec` driver, and raw_exec where that static
    /// shim is not to be had, start `wharf-shim` in the directory of the current executable.
    pub shim_path: Option<PathBuf>,
    /// How long a shim may take to report that its task started.
    pub start_timeout: Duration,
    /// After the SIGKILL that ends a stop, how long the task may take to be gone before
    /// `stop_task` gives up with an error (it waits for every process of the task).
    pub kill_grace: Duration,
}

impl Default for RawExecOptions {
    fn default() -> Self {
        RawExecOptions {
            shim_path: None,
            start_timeout: Duration::from_secs(10),
            kill_grace: Duration::from_secs(10),
        }
    }
}

/// The raw_exec driver: runs a task's command as a plain process (no file system isolation, the
/// agent's user) under a shim that outlives the agent, in a cgroup of its own where the node
/// can give one. Linux only (it needs pidfds, Linux 5.3 or later).
#[derive(Debug)]
pub struct RawExecDriver {
    shim: PathBuf,
    /// This boot's id, read once: it cannot change while the agent runs.
    boot_id: String,
    options: RawExecOptions,
    cgroups: TaskCgroups,
    /// Whether the log has said that tasks run without cgroups.
    said_uncontained: AtomicBool,
    /// Set for the isolated `exec` driver ([`crate::ExecDriver`]): each task contained.
    isolation: Option<Isolation>,
    tasks: Mutex<HashMap<TaskId, Arc<Task>>>,
    events: broadcast::Sender<DriverEvent>,
}

/// What the driver knows of one task.
#[derive(Debug)]
struct Task {
    alloc_id: String,
    name: String,
    env: SavedEnv,
    state: ShimState,
    /// Its cgroup, if it has one.
    cgroup: Option<TaskCgroup>,
    exit: watch::Receiver<Option<ExitResult>>,
}

impl Task {
    fn exited(&self) -> Option<ExitResult> {
        self.exit.borrow().clone()
    }

    async fn wait(&self) -> ExitResult {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or_else(|| launch::unknown_exit(String::new())),
            Err(_) => launch::unknown_exit("the driver stopped watching the task".into()),
        }
    }

    fn span(&self) -> tracing::Span {
        task_span(&self.alloc_id, &self.name)
    }

    /// Makes the task's span when called: the exit watcher makes it only once the task has
    /// ended, so that a running task does not hold one.
    fn later_span(&self) -> impl FnOnce() -> tracing::Span + Send + 'static {
        let (alloc_id, name) = (self.alloc_id.clone(), self.name.clone());
        move || task_span(&alloc_id, &name)
    }
}

fn task_span(alloc_id: &str, name: &str) -> tracing::Span {
    tracing::info_span!("raw_exec", alloc_id = %alloc_id, task = %name)
}

/// A task's environment in one allocation, kept for the rare `exec` into the running task:
/// `NAME=value` entries, each ended by a NUL (which neither a name nor a value holds).
#[derive(Debug)]
struct SavedEnv(Box<str>);

impl SavedEnv {
    fn new(env: &BTreeMap<String, String>) -> SavedEnv {
        let mut block = String::new();
        // An entry a start would refuse (from a handle of unknown origin) is left out rather
        // than let it split wrongly.
        for (name, value) in
            env.iter().filter(|(n, v)| !n.contains(['=', '\0']) && !v.contains('\0'))
        {
            block.push_str(name);
            block.push('=');
            block.push_str(value);
            block.push('\0');
        }
        SavedEnv(block.into_boxed_str())
    }

    fn to_map(&self) -> BTreeMap<String, String> {
        self.0
            .split_terminator('\0')
            .filter_map(|entry| entry.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect()
    }
}

impl RawExecDriver {
    /// A driver with `options`. It checks nothing yet: a missing shim shows in
    /// [`Driver::fingerprint`] and fails each start with a clear error.
    pub fn new(options: RawExecOptions) -> RawExecDriver {
        let shim = options
            .shim_path
            .clone()
            .or_else(crate::shim::static_shim)
            .unwrap_or_else(default_shim_path);
        let (events, _) = broadcast::channel(64);
        let boot_id = sys::boot_id().unwrap_or_default();
        RawExecDriver {
            shim,
            boot_id,
            options,
            cgroups: TaskCgroups::default(),
            said_uncontained: AtomicBool::new(false),
            isolation: None,
            tasks: Mutex::default(),
            events,
        }
    }

    /// The driver with its tasks in cgroups from `cgroups`, or as plain processes. Without
    /// cgroups the log says so once, with the reason.
    pub fn with_cgroups(self, cgroups: TaskCgroups) -> RawExecDriver {
        if let TaskCgroups::Off { reason } = &cgroups {
            if self.isolation.is_some() {
                tracing::warn!(%reason, "exec has no cgroups for its tasks and refuses to start them");
            } else {
                tracing::warn!(%reason, "raw_exec runs tasks without cgroups: no limits, no OOM reports, stats from /proc");
            }
        }
        self.with_cgroups_unannounced(cgroups)
    }

    /// As [`with_cgroups`](Self::with_cgroups), for a driver built on this one (the container
    /// driver), which says itself what running without cgroups means for its tasks.
    pub fn with_cgroups_unannounced(mut self, cgroups: TaskCgroups) -> RawExecDriver {
        if matches!(cgroups, TaskCgroups::Off { .. }) {
            self.said_uncontained.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.cgroups = cgroups;
        self
    }

    /// Whether, and under which manager, its tasks get cgroups.
    pub fn task_cgroups(&self) -> &TaskCgroups {
        &self.cgroups
    }

    /// The same driver, containing each task as `isolation` says: the `exec` driver.
    pub(crate) fn with_isolation(mut self, isolation: Isolation) -> RawExecDriver {
        self.isolation = Some(isolation.with_shim(&self.shim));
        self
    }

    /// A driver with default options and the shim at `path`.
    pub fn with_shim(path: impl Into<PathBuf>) -> RawExecDriver {
        RawExecDriver::new(RawExecOptions { shim_path: Some(path.into()), ..Default::default() })
    }

    /// Raises the process's soft limit on open descriptors to its hard limit and returns it.
    /// Each running task holds one descriptor in the agent (its shim's pidfd), so an agent
    /// that runs many tasks calls this once at startup; the usual soft default of 1,024 would
    /// stop it near a thousand tasks.
    pub fn raise_fd_limit() -> Result<u64, ExecError> {
        sys::raise_fd_limit().map_err(|source| ExecError::Sys { call: "setrlimit", source })
    }

    /// The shim program this driver starts.
    pub fn shim_path(&self) -> &Path {
        &self.shim
    }

    fn task(&self, id: &TaskId) -> Result<Arc<Task>, DriverError> {
        self.tasks
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| DriverError::TaskNotFound { task_id: id.clone() })
    }

    fn event(&self, task_id: &TaskId, message: String) {
        let _ = self.events.send(DriverEvent {
            task_id: task_id.clone(),
            message,
            annotations: BTreeMap::new(),
        });
    }

    /// Sends `signal` to the task's process group. `Ok(false)` if the main process has
    /// exited (or its pid is another process's now): nothing was sent.
    fn signal_group(task: &Task, signal: i32) -> Result<bool, DriverError> {
        let identity = task.state.task();
        let (Some(pidfd), Some(pid)) = (identity.open()?, identity.pid) else {
            return Ok(false);
        };
        match sys::pidfd_kill_group(&pidfd, pid, signal) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
            Err(source) => return Err(ExecError::Sys { call: "kill", source }.into()),
        }
        // The first process of a PID namespace gets only the signals it has a handler for:
        // one it neither catches nor ignores, and whose default is to end the process, would
        // be dropped, where any other process would die of it. So it dies as others would.
        if task.state.pid_namespace
            && sys::ends_by_default(signal)
            && sys::SignalDisposition::read(pid.get()).is_some_and(|d| !d.handles(signal))
        {
            match sys::pidfd_signal(&pidfd, libc::SIGKILL) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => return Err(ExecError::Sys { call: "kill", source }.into()),
            }
        }
        Ok(true)
    }

    fn register(&self, id: TaskId, task: Task) {
        self.tasks.lock().insert(id, Arc::new(task));
    }
}

impl RawExecDriver {
    /// What `start_task` checks before it starts anything: the task's config block, its
    /// environment and name, its working directory and program, and that it is not running.
    fn check_start(&self, config: &TaskConfig) -> Result<StartChecked, DriverError> {
        let (raw, exec) = match self.isolation {
            Some(_) => {
                let exec = ExecConfig::parse(&config.driver_config)?;
                (exec.process.clone(), Some(exec))
            }
            None => (RawExecConfig::parse(&config.driver_config)?, None),
        };
        check_env(&config.env)?;
        let name = &config.task_name;
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(DriverError::invalid_config(
                "task_name",
                format!("{name:?} cannot name log files"),
            ));
        }
        let work_dir = resolve_work_dir(&config.task_dir, raw.work_dir.as_deref())?;
        let program = resolve_command("config.command", &raw.command, &config.env, &work_dir)?;
        if self.tasks.lock().get(&config.id).is_some_and(|t| t.exited().is_none()) {
            return Err(DriverError::other(format!("task {} is already running", config.id)));
        }
        Ok(StartChecked { raw, exec, work_dir, program })
    }

    /// The error for a start the shim reported as failed: [`start_failure`], and under exec a
    /// program the workload user may not execute is the task's config's fault.
    fn start_failure(&self, step: StartStep, errno: i32, message: String) -> DriverError {
        match (&self.isolation, step, errno) {
            (Some(_), StartStep::Spawn, libc::EACCES) => DriverError::invalid_config(
                "config.command",
                format!(
                    "{message}: under exec a program must be executable by the task's workload \
                     user and lie in a path unveiled with x"
                ),
            ),
            _ => start_failure(step, errno, message),
        }
    }

    /// The cgroup a recovered task's handle records, taken back from the node's manager. A
    /// task whose cgroup cannot be found runs on without one (stops then go to its process
    /// group), which the log says.
    fn adopt_cgroup(&self, id: &TaskId, state: &ShimState) -> Option<TaskCgroup> {
        let recorded = state.cgroup.as_ref()?;
        let adopted = match self.cgroups.manager() {
            Some(cgroups) => {
                cgroups.adopt(&id.0, state.cores().as_ref()).map_err(|e| e.to_string())
            }
            None => Err("cgroups are not in use now".to_owned()),
        };
        adopted
            .map_err(|error| {
                tracing::warn!(task_id = %id, cgroup = %recorded.name, %error, "cannot take back the task's cgroup");
            })
            .ok()
    }
}

/// What a start has checked and resolved before it starts anything.
struct StartChecked {
    raw: RawExecConfig,
    exec: Option<ExecConfig>,
    work_dir: PathBuf,
    program: PathBuf,
}

/// The shim's command line for a task: its run and working directories, its log files, its
/// containment (`containment`, the cgroup's files included) and its program.
fn shim_args(
    config: &TaskConfig,
    raw: &RawExecConfig,
    run_dir: &Path,
    work_dir: &Path,
    program: PathBuf,
    containment: wharf_isolate::Containment,
) -> Result<ShimArgs, DriverError> {
    Ok(ShimArgs {
        run_dir: run_dir.to_owned(),
        work_dir: work_dir.to_owned(),
        // The shim moves into the working directory, so a relative path would move too.
        log_dir: std::path::absolute(&config.logs.dir)
            .map_err(io_error("resolve", &config.logs.dir))?,
        log_name: config.task_name.as_str().into(),
        max_file_bytes: config.logs.max_file_bytes,
        max_files: config.logs.max_files.max(1),
        containment,
        program,
        arg0: raw.command.clone().into(),
        args: raw.args.iter().map(Into::into).collect(),
    })
}

/// A new task's cgroup until the task is known to run: dropped before, it kills whatever
/// joined the cgroup and removes it.
struct CgroupGuard<'a> {
    cgroups: &'a TaskCgroups,
    cgroup: Option<TaskCgroup>,
}

impl CgroupGuard<'_> {
    /// The task runs: the cgroup is its now.
    fn keep(mut self) {
        self.cgroup = None;
    }
}

impl Drop for CgroupGuard<'_> {
    fn drop(&mut self) {
        if let (Some(cgroups), Some(cgroup)) = (self.cgroups.manager(), self.cgroup.take())
            && let Err(error) = task_cgroups::discard_now(cgroups, &cgroup)
        {
            tracing::warn!(cgroup = %cgroup.name(), %error, "cannot remove the task's cgroup");
        }
    }
}

/// `wharf-shim` beside the current executable (or a bare name if that cannot be known).
fn default_shim_path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(SHIM_NAME)))
        .unwrap_or_else(|| PathBuf::from(SHIM_NAME))
}

/// A run's directory: `<task_dir>/.raw_exec/<run>` for raw_exec, and for the isolated driver
/// `<task_dir>/../.exec/<task>/<run>`, where `<run>` is the task id with anything odd
/// replaced by `_`.
fn run_dir(config: &TaskConfig, isolated: bool) -> Result<PathBuf, DriverError> {
    let runs = match (isolated, config.task_dir.parent()) {
        (false, _) => config.task_dir.join(RUNS_DIR),
        (true, Some(parent)) => parent.join(EXEC_RUNS_DIR).join(&config.task_name),
        (true, None) => {
            return Err(DriverError::invalid_config("task_dir", "exec cannot run a task in /"));
        }
    };
    let name: String = config
        .id
        .0
        .chars()
        .take(200)
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    Ok(runs.join(if name.is_empty() { "_".into() } else { name }))
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExecError {
    let path = path.to_owned();
    move |source| ExecError::Io { action, path, source }
}

/// What a failed start report means, for people: the shim (which has no error texts) names
/// the step; the path and the error's text are added here.
fn failure_message(step: StartStep, errno: i32, message: String, args: &ShimArgs) -> String {
    let error = std::io::Error::from_raw_os_error(errno);
    match step {
        StartStep::Spawn => format!("{message} {}: {error}", args.program.display()),
        StartStep::WorkDir => format!("{message} {}: {error}", args.work_dir.display()),
        StartStep::Setup | StartStep::Confine if errno != 0 => format!("{message}: {error}"),
        StartStep::Setup | StartStep::Confine => message,
    }
}

/// The error for a start the shim reported as failed.
fn start_failure(step: StartStep, errno: i32, message: String) -> DriverError {
    let transient = matches!(errno, libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE);
    match step {
        _ if transient => DriverError::Retryable { reason: message },
        StartStep::Spawn => match errno {
            libc::E2BIG => DriverError::invalid_config("config.args", message),
            libc::ENOENT
            | libc::EACCES
            | libc::ENOEXEC
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::ELOOP
            | libc::ENAMETOOLONG
            | libc::EPERM => DriverError::invalid_config("config.command", message),
            _ => DriverError::other(message),
        },
        StartStep::WorkDir => DriverError::invalid_config("config.work_dir", message),
        StartStep::Setup | StartStep::Confine => DriverError::other(message),
    }
}

#[async_trait::async_trait]
impl Driver for RawExecDriver {
    fn name(&self) -> &str {
        if self.isolation.is_some() { EXEC_DRIVER_NAME } else { DRIVER_NAME }
    }

    fn capabilities(&self) -> Capabilities {
        match self.isolation {
            // A command run inside the task would have to be contained as the task is.
            Some(_) => Capabilities {
                send_signals: true,
                exec: false,
                logs: true,
                fs_isolation: FsIsolation::Unveil,
            },
            None => Capabilities {
                send_signals: true,
                exec: true,
                logs: true,
                fs_isolation: FsIsolation::None,
            },
        }
    }

    async fn fingerprint(&self) -> Fingerprint {
        let mut attributes = BTreeMap::new();
        let name = self.name();
        attributes.insert(format!("driver.{name}.shim"), self.shim.display().to_string());
        attributes.insert(format!("driver.{name}.cgroups"), self.cgroups.describe());
        if let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
            attributes.insert("kernel.release".to_owned(), release.trim().to_owned());
        }
        let (health, description) = if !cfg!(target_os = "linux") {
            (Health::Undetected, "raw_exec runs on Linux only".to_owned())
        } else if !self.shim.is_file() || !sys::executable(&self.shim) {
            (Health::Unhealthy, ExecError::ShimMissing { path: self.shim.clone() }.to_string())
        } else if let Err(e) = Pid::new(sys::getpid().into())
            .ok_or_else(|| std::io::Error::other("running as pid 1"))
            .and_then(sys::pidfd_open)
        {
            (Health::Unhealthy, format!("pidfds do not work here (Linux 5.3 or later needed): {e}"))
        } else if let Some(isolation) = &self.isolation {
            isolation.fingerprint(&mut attributes, &self.cgroups)
        } else {
            (Health::Healthy, "raw_exec: ready".to_owned())
        };
        Fingerprint { health, description, attributes }
    }

    fn validate_config(
        &self,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DriverError> {
        match &self.isolation {
            Some(isolation) => isolation.check_task_unveils(&ExecConfig::parse(config)?),
            None => RawExecConfig::parse(config).map(drop),
        }
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        let StartChecked { raw, exec, work_dir, program } = self.check_start(&config)?;
        let name = &config.task_name;

        // Each system call here shows in the start latency: the shim makes the run directory
        // (after it has reported the start), the agent only checks the log directory.
        let run_dir = run_dir(&config, self.isolation.is_some())?;
        if !config.logs.dir.is_dir() {
            std::fs::create_dir_all(&config.logs.dir)
                .map_err(io_error("create", &config.logs.dir))?;
        }
        let log = run_dir.join(SHIM_LOG);
        // The exec driver's workload user, directories and containment (module `isolation`).
        let contained = match (&self.isolation, &exec) {
            (Some(isolation), Some(exec)) => Some(isolation.prepare(&config, exec)?),
            _ => None,
        };
        // From here on, an error (or this future being dropped) drops the guard, which kills
        // whatever joined the cgroup and removes it.
        let cgroup = CgroupGuard {
            cgroups: &self.cgroups,
            cgroup: self.cgroups.cgroup_for(
                &config,
                raw.hard_limit_period(),
                &self.said_uncontained,
            )?,
        };
        if contained.is_some() && cgroup.cgroup.is_none() {
            return Err(DriverError::other(format!(
                "exec needs a cgroup for every task, and this node cannot give one ({})",
                self.cgroups.describe()
            )));
        }
        let user = contained.as_ref().map(|c| c.user.get());
        let (containment, env) = match contained {
            Some(contained) => {
                let mut env = config.env.clone();
                env.extend(contained.env);
                (contained.containment, env)
            }
            None => (wharf_isolate::Containment::default(), config.env.clone()),
        };
        let containment = wharf_isolate::Containment {
            cgroup: cgroup.cgroup.as_ref().map(TaskCgroup::join_files).unwrap_or_default(),
            ..containment
        };
        let args = shim_args(&config, &raw, &run_dir, &work_dir, program, containment)?;

        // From here on, an error (or this future being dropped) drops `launched`, which makes
        // the shim kill its task, if it started one, and reaps the shim.
        let launched = launch::spawn_shim(&self.shim, &args, &env)?;
        let shim_pid = launched.pid();
        // The shim is our unreaped child: its /proc entry is there even if it has exited.
        let shim_start_ticks = ProcStat::read(shim_pid.get()).map_or(0, |s| s.start_ticks);
        let (task_pid, task_start_ticks) =
            match launched.report(self.options.start_timeout, &log).await? {
                StartReport::Started { pid, start_ticks } => (pid, start_ticks),
                StartReport::Failed { step, errno, message } => {
                    launched.reap_failed().await;
                    let message = failure_message(step, errno, message, &args);
                    return Err(self.start_failure(step, errno, message));
                }
            };
        let state = ShimState {
            version: DRIVER_STATE_VERSION,
            boot_id: self.boot_id.clone(),
            shim_pid: shim_pid.get().into(),
            shim_start_ticks,
            task_pid: task_pid.into(),
            task_start_ticks,
            run_dir: run_dir.clone(),
            work_dir,
            cgroup: cgroup.cgroup.as_ref().map(|c| CgroupState {
                name: c.name().to_owned(),
                cores: c.cores().map(ToString::to_string),
            }),
            user,
            pid_namespace: args.containment.namespaces.pid,
        };
        let (exit_tx, exit) = watch::channel(None);
        let task = Task {
            alloc_id: config.alloc_id.clone(),
            name: name.clone(),
            env: SavedEnv::new(&config.env),
            state: state.clone(),
            cgroup: cgroup.cgroup.clone(),
            exit,
        };
        let span = task.span();
        let later_span = task.later_span();
        let watched = launched.started().and_then(|shim_pidfd| {
            let watch = Watch {
                shim_pidfd,
                own_child: Some(shim_pid),
                run_dir,
                task: state.task(),
                cgroup: task.cgroup.clone(),
            };
            launch::watch(watch, exit_tx, later_span)
        });
        if let Err(e) = watched {
            // Nobody could learn how the task ends: take it down rather than leave it unowned.
            launch::kill_orphan(&state.task());
            launch::abandon(shim_pid);
            return Err(e.into());
        }
        cgroup.keep();
        span.in_scope(|| tracing::info!(pid = task_pid, shim_pid = state.shim_pid, "task started"));
        self.register(config.id.clone(), task);
        Ok(TaskHandle {
            version: TASK_HANDLE_VERSION,
            driver: self.name().to_owned(),
            config,
            driver_state: state.to_state(),
        })
    }

    async fn recover_task(&self, handle: &TaskHandle) -> Result<(), DriverError> {
        let id = handle.id();
        if handle.driver != self.name() {
            return Err(ExecError::BadHandle {
                reason: format!("it was made by driver {:?}", handle.driver),
            }
            .into());
        }
        if handle.version == 0 || handle.version > TASK_HANDLE_VERSION {
            return Err(ExecError::BadHandle {
                reason: format!("handle version {} is not one this wharf reads", handle.version),
            }
            .into());
        }
        let state = ShimState::from_state(&handle.driver_state)?;
        if self.tasks.lock().contains_key(id) {
            return Ok(());
        }
        let cgroup = self.adopt_cgroup(id, &state);
        let (exit_tx, exit) = watch::channel(None);
        let task = Task {
            alloc_id: handle.config.alloc_id.clone(),
            name: handle.config.task_name.clone(),
            env: SavedEnv::new(&handle.config.env),
            state: state.clone(),
            cgroup,
            exit,
        };
        let span = task.span();
        let same_boot = !self.boot_id.is_empty() && self.boot_id == state.boot_id;
        // The shim, if it is still the recorded process. Its pidfd then stays bound to it.
        let shim = if same_boot { state.shim().open()? } else { None };
        let shim_running = match &shim {
            Some(pidfd) => !sys::pidfd_exited(pidfd)
                .map_err(|source| ExecError::Sys { call: "poll", source })?,
            None => false,
        };
        if let (true, Some(pidfd)) = (shim_running, shim) {
            let watch = Watch {
                shim_pidfd: pidfd,
                own_child: None,
                run_dir: state.run_dir.clone(),
                task: state.task(),
                cgroup: task.cgroup.clone(),
            };
            launch::watch(watch, exit_tx, task.later_span())?;
            span.in_scope(|| tracing::info!(pid = state.task_pid, "reattached to a running task"));
            self.register(id.clone(), task);
            self.event(id, "reattached to the running task".into());
            return Ok(());
        }
        // The shim is gone: its exit record says how the task ended.
        match launch::read_exit_record(&state.run_dir) {
            Ok(mut result) => {
                launch::note_oom(&mut result, task.cgroup.as_ref());
                span.in_scope(|| {
                    tracing::info!(?result, "the task exited while the agent was away")
                });
                exit_tx.send_replace(Some(result.clone()));
                self.register(id.clone(), task);
                self.event(id, "the task exited while the agent was away".into());
                Ok(())
            }
            Err(reason) => {
                // No record: the shim died, or the handle's processes are someone else's now.
                // A main process that is still the recorded one is an orphan: kill its group.
                let killed = same_boot && launch::kill_orphan(&state.task());
                // Nothing of it may run on in its cgroup; no handle will own the cgroup now.
                if let (Some(cgroups), Some(cgroup)) = (self.cgroups.manager(), &task.cgroup) {
                    task_cgroups::discard(cgroups.clone(), cgroup.clone()).await;
                }
                span.in_scope(|| tracing::warn!(%reason, killed, "cannot recover the task"));
                Err(DriverError::other(format!(
                    "task {id} is gone: its shim (pid {}) no longer runs and left no exit \
                     record ({reason}){}",
                    state.shim_pid,
                    if killed { "; its orphaned processes were killed" } else { "" }
                )))
            }
        }
    }

    async fn wait_task(&self, task_id: &TaskId) -> Result<ExitResult, DriverError> {
        let task = self.task(task_id)?;
        Ok(task.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        let task = self.task(task_id)?;
        if task.exited().is_some() {
            return Ok(());
        }
        if signal != Signal::Kill {
            RawExecDriver::signal_group(&task, signal.number())?;
            if tokio::time::timeout(timeout, task.wait()).await.is_ok() {
                return Ok(());
            }
            tracing::info!(
                alloc_id = %task.alloc_id,
                task = %task.name,
                ?timeout,
                "the task outlived its kill timeout; sending SIGKILL"
            );
            self.event(
                task_id,
                format!(
                    "the task outlived its kill timeout of {}; sent SIGKILL",
                    Formatted(timeout)
                ),
            );
        }
        match &task.cgroup {
            // Everything in the cgroup, processes that left the task's group included.
            Some(cgroup) => task_cgroups::kill_cgroup(cgroup, &task.state.task()).await?,
            None => drop(RawExecDriver::signal_group(&task, libc::SIGKILL)?),
        }
        tokio::time::timeout(self.options.kill_grace, task.wait()).await.map(drop).map_err(|_| {
            DriverError::other(format!(
                "task {task_id} is still there {} after SIGKILL",
                Formatted(self.options.kill_grace)
            ))
        })
    }

    async fn destroy_task(&self, task_id: &TaskId, force: bool) -> Result<(), DriverError> {
        let task = self.task(task_id)?;
        if task.exited().is_none() {
            if !force {
                return Err(DriverError::other(format!(
                    "task {task_id} is still running; stop it first, or destroy with force"
                )));
            }
            self.stop_task(task_id, Duration::ZERO, Signal::Kill).await?;
        }
        if self.tasks.lock().remove(task_id).is_none() {
            // Another destroy of the same run took it first, and frees it.
            return Ok(());
        }
        // The task has ended: what is left is housekeeping (see `housekeeping`).
        let cgroup = self.cgroups.manager().cloned().zip(task.cgroup.clone());
        let run_dir = task.state.run_dir.clone();
        let (alloc_id, name) = (task.alloc_id.clone(), task.name.clone());
        let freed = housekeeping::run(move || {
            if let Some((cgroups, cgroup)) = cgroup
                && let Err(error) = task_cgroups::discard_now(&cgroups, &cgroup)
            {
                let cgroup = cgroup.name();
                tracing::warn!(%alloc_id, task = %name, %cgroup, %error, "cannot remove the task's cgroup");
            }
            match std::fs::remove_dir_all(&run_dir) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    let run_dir = run_dir.display();
                    tracing::warn!(%alloc_id, task = %name, %run_dir, %error, "cannot remove the run directory");
                }
                _ => {}
            }
        })
        .await;
        if freed.is_none() {
            tracing::warn!(alloc_id = %task.alloc_id, task = %task.name, "freeing the task failed");
        }
        Ok(())
    }

    async fn inspect_task(&self, task_id: &TaskId) -> Result<TaskInfo, DriverError> {
        let task = self.task(task_id)?;
        let exit = task.exited();
        let mut attributes = BTreeMap::new();
        attributes.insert("pid".to_owned(), task.state.task_pid.to_string());
        attributes.insert("shim_pid".to_owned(), task.state.shim_pid.to_string());
        attributes.insert("run_dir".to_owned(), task.state.run_dir.display().to_string());
        attributes.insert("work_dir".to_owned(), task.state.work_dir.display().to_string());
        if let Some(cgroup) = &task.cgroup {
            attributes.insert("cgroup".to_owned(), cgroup.name().to_owned());
        }
        if let Some(user) = task.state.user {
            attributes.insert("user".to_owned(), user.to_string());
        }
        Ok(TaskInfo {
            id: task_id.clone(),
            state: if exit.is_some() { RunState::Exited } else { RunState::Running },
            exit,
            attributes,
        })
    }

    async fn signal_task(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        let task = self.task(task_id)?;
        let exited = || DriverError::other(format!("task {task_id} has exited"));
        if task.exited().is_some() {
            return Err(exited());
        }
        if RawExecDriver::signal_group(&task, signal.number())? { Ok(()) } else { Err(exited()) }
    }

    async fn exec_task(
        &self,
        task_id: &TaskId,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, DriverError> {
        if self.isolation.is_some() {
            return Err(DriverError::Unsupported {
                driver: EXEC_DRIVER_NAME.to_owned(),
                operation: "exec",
            });
        }
        let task = self.task(task_id)?;
        if task.exited().is_some() {
            return Err(DriverError::other(format!("task {task_id} has exited")));
        }
        crate::exec::run(&task.env.to_map(), &task.state.work_dir, command, timeout).await
    }

    async fn task_logs(
        &self,
        target: &LogTarget,
        stream: LogStream,
        from: LogFrom,
    ) -> Result<Box<dyn LogReader>, DriverError> {
        // Both drivers' shims write the same files; a task run by either reads back alike.
        crate::output::open(target, stream, from).await
    }

    async fn task_stats(&self, task_id: &TaskId) -> Result<ResourceUsage, DriverError> {
        let task = self.task(task_id)?;
        if task.exited().is_some() {
            return Ok(ResourceUsage::default());
        }
        match &task.cgroup {
            Some(cgroup) => cgroup
                .stats()
                .map(|stats| task_cgroups::usage(&stats))
                .map_err(|e| DriverError::other(format!("cannot read the task's cgroup: {e}"))),
            None => Ok(crate::stats::usage(&task.state.shim())),
        }
    }

    fn events(&self) -> broadcast::Receiver<DriverEvent> {
        self.events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::SavedEnv;
    use std::collections::BTreeMap;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_saved_environment_reads_back_as_it_was_given() {
        let env = env(&[
            ("PATH", "/usr/bin:/bin"),
            ("EMPTY", ""),
            ("EQUALS", "a=b=c"),
            ("UNICODE", "ünï"),
        ]);
        assert_eq!(SavedEnv::new(&env).to_map(), env);
        assert!(SavedEnv::new(&BTreeMap::new()).to_map().is_empty());
    }

    #[test]
    fn entries_no_start_would_take_are_left_out() {
        let env = env(&[("A=B", "1"), ("NUL\0", "2"), ("VALUE", "3\0"), ("KEPT", "4")]);
        let kept = SavedEnv::new(&env).to_map();
        assert_eq!(kept.into_iter().collect::<Vec<_>>(), [("KEPT".to_owned(), "4".to_owned())]);
    }
}
