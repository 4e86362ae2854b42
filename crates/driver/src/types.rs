//! The values that cross the driver interface.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;
use wharf_state::Timestamp;
use wharf_state::spec::Resources;

/// Identifies one run of a task: `<alloc_id>/<task>/<run>`. Every restart gets a new one, so
/// an old run's late messages never land on the new run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub String);

impl TaskId {
    /// The id of run number `run` of `task` in `alloc_id`.
    pub fn new(alloc_id: &str, task: &str, run: u64) -> TaskId {
        TaskId(format!("{alloc_id}/{task}/{run:08x}"))
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a task's output goes and how much of it is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogConfig {
    /// The directory for `<task>.stdout.N` and `<task>.stderr.N`.
    pub dir: PathBuf,
    /// Files kept per stream, the current one included.
    pub max_files: u32,
    /// Size at which a file is rotated, in bytes.
    pub max_file_bytes: u64,
}

impl LogConfig {
    /// Files kept per stream unless configured: 10, as in Nomad.
    pub const DEFAULT_MAX_FILES: u32 = 10;
    /// Rotation size unless configured: 10 MiB, as in Nomad.
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 << 20;

    /// Output in `dir`, with the default limits.
    pub fn in_dir(dir: impl Into<PathBuf>) -> LogConfig {
        LogConfig {
            dir: dir.into(),
            max_files: LogConfig::DEFAULT_MAX_FILES,
            max_file_bytes: LogConfig::DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// Everything a driver needs to start a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskConfig {
    /// This run's id.
    pub id: TaskId,
    /// The allocation it belongs to.
    pub alloc_id: String,
    /// The job's id.
    pub job_id: String,
    /// The task group's name.
    pub group: String,
    /// The task's name.
    pub task_name: String,
    /// The environment, fully interpolated.
    pub env: BTreeMap<String, String>,
    /// The task's own directory (working directory for process drivers).
    pub task_dir: PathBuf,
    /// The directory shared by the allocation's tasks.
    pub alloc_dir: PathBuf,
    /// Where output goes.
    pub logs: LogConfig,
    /// What the task may use.
    pub resources: Resources,
    /// The task's `config` block, for the driver to interpret.
    pub driver_config: serde_json::Map<String, serde_json::Value>,
    /// The node's directories the task mounts (its `volume_mount`s, resolved by the task
    /// runner): process drivers open them to the task, a driver with a file system of its
    /// own mounts each at its `destination`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A directory of the node a task mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// The group's name for the volume.
    pub volume: String,
    /// The node's directory.
    pub source: PathBuf,
    /// Where the task asked to see it.
    pub destination: String,
    /// Whether the task may only read it.
    #[serde(default)]
    pub read_only: bool,
}

impl TaskConfig {
    /// The first run of task `task_name` of allocation `alloc_id`, in `task_dir`, laid out as
    /// wharf's task runner lays it out: the allocation's shared directory is `alloc` beside the
    /// task directory, output goes to `logs/` in it with the default limits. The job id and
    /// group are empty, the environment and the driver's config block too, resources default.
    ///
    /// ```
    /// use wharf_driver::TaskConfig;
    ///
    /// let config = TaskConfig::new("a1", "web", "/srv/allocs/a1/web")
    ///     .with_driver_config("command", "/bin/echo")
    ///     .with_env("GREETING", "hello");
    /// assert_eq!(config.id.to_string(), "a1/web/00000001");
    /// assert_eq!(config.alloc_dir, std::path::Path::new("/srv/allocs/a1/alloc"));
    /// ```
    pub fn new(alloc_id: &str, task_name: &str, task_dir: impl Into<PathBuf>) -> TaskConfig {
        let task_dir = task_dir.into();
        let alloc_dir = task_dir.parent().unwrap_or(&task_dir).join("alloc");
        TaskConfig {
            id: TaskId::new(alloc_id, task_name, 1),
            alloc_id: alloc_id.to_owned(),
            job_id: String::new(),
            group: String::new(),
            task_name: task_name.to_owned(),
            env: BTreeMap::new(),
            logs: LogConfig::in_dir(task_dir.join("logs")),
            task_dir,
            alloc_dir,
            resources: Resources::default(),
            driver_config: serde_json::Map::new(),
            mounts: Vec::new(),
        }
    }

    /// The same task's run number `run` (each run has its own [`TaskId`]).
    pub fn with_run(mut self, run: u64) -> TaskConfig {
        self.id = TaskId::new(&self.alloc_id, &self.task_name, run);
        self
    }

    /// Sets `key` of the driver's config block.
    pub fn with_driver_config(
        mut self,
        key: impl Into<String>,
        value: impl Into<serde_json::Value>,
    ) -> TaskConfig {
        self.driver_config.insert(key.into(), value.into());
        self
    }

    /// Sets an environment variable of the task.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> TaskConfig {
        self.env.insert(name.into(), value.into());
        self
    }
}

/// The version of [`TaskHandle`]'s shape.
pub const TASK_HANDLE_VERSION: u32 = 1;

/// What a driver hands back from [`crate::Driver::start_task`]: persisted by the task runner,
/// and all [`crate::Driver::recover_task`] needs after the agent restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskHandle {
    /// [`TASK_HANDLE_VERSION`] when written.
    pub version: u32,
    /// The driver that made it.
    pub driver: String,
    /// The config the task was started with.
    pub config: TaskConfig,
    /// The driver's own reattach data, such as a pid and start time.
    pub driver_state: DriverState,
}

impl TaskHandle {
    /// A handle from driver `driver` for a task started with `config`, with no reattach data
    /// of the driver's own (set [`TaskHandle::driver_state`] for that).
    pub fn new(driver: &str, config: TaskConfig) -> TaskHandle {
        TaskHandle {
            version: TASK_HANDLE_VERSION,
            driver: driver.to_owned(),
            config,
            driver_state: DriverState::default(),
        }
    }

    /// The run it belongs to.
    pub fn id(&self) -> &TaskId {
        &self.config.id
    }
}

/// A driver's own reattach data in a [`TaskHandle`]: JSON, held as its text. A handle lives as
/// long as its task, and the text takes a fraction of the memory of a parsed tree (a few
/// hundred bytes against a few KiB for a map of ten fields). Stored and sent as the JSON it
/// holds, so records are the same as with a parsed value.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DriverState(Box<serde_json::value::RawValue>);

impl DriverState {
    /// `value` as JSON; an error if it cannot be written as JSON (a map with keys that are not
    /// strings).
    pub fn from_serialize<T: Serialize + ?Sized>(
        value: &T,
    ) -> Result<DriverState, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(DriverState)
    }

    /// Reads it as a `T`.
    pub fn to_deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// Parsed into a JSON value, for reading fields by name.
    pub fn value(&self) -> serde_json::Value {
        // Parsed from JSON it was written as, so it reads back.
        serde_json::from_str(self.0.get()).unwrap_or(serde_json::Value::Null)
    }

    /// Its JSON text.
    pub fn as_json(&self) -> &str {
        self.0.get()
    }
}

impl Default for DriverState {
    /// JSON `null`: no reattach data.
    fn default() -> DriverState {
        DriverState::from(serde_json::Value::Null)
    }
}

impl From<serde_json::Value> for DriverState {
    fn from(value: serde_json::Value) -> DriverState {
        DriverState(
            serde_json::value::to_raw_value(&value).expect("a JSON value always writes as JSON"),
        )
    }
}

impl PartialEq for DriverState {
    fn eq(&self, other: &DriverState) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for DriverState {}

impl fmt::Debug for DriverState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitResult {
    /// The exit code (0 when killed by a signal).
    pub exit_code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Whether the kernel killed it for memory.
    pub oom_killed: bool,
    /// Set when the driver could not learn the outcome properly.
    pub error: Option<String>,
}

impl ExitResult {
    /// A plain exit with `code`.
    pub fn code(exit_code: i32) -> ExitResult {
        ExitResult { exit_code, signal: None, oom_killed: false, error: None }
    }

    /// Death by `signal`.
    pub fn signalled(signal: i32) -> ExitResult {
        ExitResult { exit_code: 0, signal: Some(signal), oom_killed: false, error: None }
    }

    /// Exit code 0, no signal, no error.
    pub fn successful(&self) -> bool {
        self.exit_code == 0 && self.signal.is_none() && self.error.is_none() && !self.oom_killed
    }
}

/// What a driver can do beyond the required methods. The default is nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Capabilities {
    /// Signals can be sent to tasks ([`crate::Driver::signal_task`]).
    pub send_signals: bool,
    /// Commands can be run inside tasks ([`crate::Driver::exec_task`]).
    pub exec: bool,
    /// Tasks' output can be read back ([`crate::Driver::task_logs`]).
    #[serde(default)]
    pub logs: bool,
    /// How tasks are kept apart from the node's filesystem.
    pub fs_isolation: FsIsolation,
}

/// Filesystem isolation a driver gives its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsIsolation {
    /// Tasks see the node's filesystem.
    #[default]
    None,
    /// Tasks are chrooted into their task directory.
    Chroot,
    /// Tasks run in their own image.
    Image,
    /// Tasks see only the paths opened ("unveiled") to them, as Nomad's exec2 driver does with
    /// Landlock.
    Unveil,
}

/// Whether a driver can run tasks here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Ready.
    Healthy,
    /// Present but not working.
    Unhealthy,
    /// Not found on this node.
    Undetected,
}

/// A driver's report on itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Whether it can run tasks.
    pub health: Health,
    /// Why, for people.
    pub description: String,
    /// What it found, such as versions.
    pub attributes: BTreeMap<String, String>,
}

/// A task's state as its driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// The driver cannot tell.
    Unknown,
    /// Running.
    Running,
    /// Exited.
    Exited,
}

/// What [`crate::Driver::inspect_task`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The run.
    pub id: TaskId,
    /// Running, exited or unknown.
    pub state: RunState,
    /// How it ended, once it has.
    pub exit: Option<ExitResult>,
    /// Driver-specific details, such as the pid.
    pub attributes: BTreeMap<String, String>,
}

/// The outcome of [`crate::Driver::exec_task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// What the command wrote to stdout.
    pub stdout: Vec<u8>,
    /// What it wrote to stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub exit: ExitResult,
}

/// A task's resource usage.
///
/// Drivers that count a task's processes one by one (from `/proc`) give CPU time, RSS and the
/// process count; drivers whose tasks have a cgroup give every figure, as its kernel accounting
/// says ([`UsageSource::Cgroup`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ResourceUsage {
    /// CPU time used (user plus system) by all of the task's processes.
    pub cpu_time: Duration,
    /// Resident memory of all of the task's processes, in bytes.
    pub memory_rss_bytes: u64,
    /// How many processes the task has (with a cgroup: processes and threads).
    pub processes: u32,
    /// When it was measured, if the driver knows.
    pub at: Option<Timestamp>,
    /// CPU time in user mode.
    #[serde(default)]
    pub cpu_user: Duration,
    /// CPU time in the kernel.
    #[serde(default)]
    pub cpu_system: Duration,
    /// CFS periods in which a CPU quota held the task back.
    #[serde(default)]
    pub cpu_throttled_periods: u64,
    /// How long it was held back.
    #[serde(default)]
    pub cpu_throttled: Duration,
    /// Page cache charged to the task, in bytes.
    #[serde(default)]
    pub memory_cache_bytes: u64,
    /// Swap, in bytes.
    #[serde(default)]
    pub memory_swap_bytes: u64,
    /// The most memory the task has had at once, in bytes.
    #[serde(default)]
    pub memory_max_usage_bytes: u64,
    /// Where the figures come from.
    #[serde(default)]
    pub source: UsageSource,
}

/// How a driver measured a task's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageSource {
    /// Summed over the task's processes from `/proc`: CPU time, RSS and processes only.
    #[default]
    Proc,
    /// The task's cgroup: every figure.
    Cgroup,
}

impl std::ops::AddAssign<&ResourceUsage> for ResourceUsage {
    /// Adds another task's usage: counts add up, the later measurement time is kept, and the
    /// source is left as it is (the caller knows what the sum is of).
    fn add_assign(&mut self, other: &ResourceUsage) {
        self.cpu_time += other.cpu_time;
        self.memory_rss_bytes += other.memory_rss_bytes;
        self.processes = self.processes.saturating_add(other.processes);
        self.cpu_user += other.cpu_user;
        self.cpu_system += other.cpu_system;
        self.cpu_throttled_periods += other.cpu_throttled_periods;
        self.cpu_throttled += other.cpu_throttled;
        self.memory_cache_bytes += other.memory_cache_bytes;
        self.memory_swap_bytes += other.memory_swap_bytes;
        self.memory_max_usage_bytes += other.memory_max_usage_bytes;
        self.at = self.at.max(other.at);
    }
}

/// A message from a driver for a task's event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverEvent {
    /// The run it is about.
    pub task_id: TaskId,
    /// The text.
    pub message: String,
    /// Driver-specific details.
    pub annotations: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A handle's driver state is written and read back as the JSON object it holds, so
    /// records written with a parsed value read the same.
    #[test]
    fn driver_state_is_stored_as_the_json_it_holds() {
        let config = TaskConfig::new("a1", "web", "/tmp/a1/web");
        let mut handle = TaskHandle::new("raw_exec", config);
        handle.driver_state =
            json!({"pid": 42, "dirs": ["/a", "/b"], "nested": {"x": null}}).into();
        let text = serde_json::to_string(&handle).unwrap();
        let written: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            written["driver_state"],
            json!({"pid": 42, "dirs": ["/a", "/b"], "nested": {"x": null}})
        );
        let read: TaskHandle = serde_json::from_str(&text).unwrap();
        assert_eq!(read, handle);
        assert_eq!(read.driver_state.value()["pid"], 42);
        #[derive(Deserialize)]
        struct Pid {
            pid: u32,
        }
        assert_eq!(read.driver_state.to_deserialize::<Pid>().unwrap().pid, 42);
        assert_eq!(TaskHandle::new("raw_exec", read.config).driver_state.as_json(), "null");
    }
}
