//! What a task runner is built from: [`TaskRunnerConfig`], with the defaults of what it
//! limits (the kill timeout's cap, log rotation). The runner itself is in the runner module.

use crate::clock::{SystemClock, WallClock};
use crate::events::EventStream;
use crate::hooks::TaskHook;
use crate::template::{MemorySources, TemplateSources};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use wharf_driver::{Driver, LogConfig};
use wharf_state::volume::HostVolume;
use wharf_state::{Allocation, Task};
use wharf_store::StateStore;

/// Log rotation limits for a task's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Files kept per stream.
    pub max_files: u32,
    /// Size at which a file is rotated.
    pub max_file_bytes: u64,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            max_files: LogConfig::DEFAULT_MAX_FILES,
            max_file_bytes: LogConfig::DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// The cap on a task's `kill_timeout` unless the node sets one.
pub const DEFAULT_MAX_KILL_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a task runner (`TaskRunner::new`) is built from: [`TaskRunnerConfig::new`]
/// takes what has no default, the `with_` methods change the rest.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskRunnerConfig {
    /// The allocation the task belongs to, shared with whoever else holds it (the alloc
    /// runner and its other task runners share one).
    pub alloc: Arc<Allocation>,
    /// The task, as in the allocation's group.
    pub task: Task,
    /// The driver named by the task.
    pub driver: Arc<dyn Driver>,
    /// Where state is persisted.
    pub store: Arc<dyn StateStore>,
    /// Where event timestamps come from. Default: the system's clock.
    pub clock: Arc<dyn WallClock>,
    /// The allocation's directory: `<data dir>/allocs/<alloc id>`.
    pub alloc_root: PathBuf,
    /// Hooks run after the built-in ones. Default: none.
    pub hooks: Vec<Arc<dyn TaskHook>>,
    /// The node-wide cap on `kill_timeout`. Default: [`DEFAULT_MAX_KILL_TIMEOUT`].
    pub max_kill_timeout: Duration,
    /// Log rotation limits. Default: 10 files of 10 MiB per stream.
    pub logs: LogLimits,
    /// Notified (coalescing) after every state change, for whoever coordinates several task
    /// runners (the alloc runner). Default: a notification of its own.
    pub state_changed: Arc<Notify>,
    /// Where every recorded event goes. Default: a stream of its own; the alloc runner gives
    /// its task runners one shared stream.
    pub events: EventStream,
    /// What the task's templates read (services, variables). Default: empty sources.
    pub template_sources: Arc<dyn TemplateSources>,
    /// The node's host volumes, by name, that the task's `volume_mount`s resolve against.
    /// Default: none.
    pub host_volumes: Arc<BTreeMap<String, HostVolume>>,
}

impl TaskRunnerConfig {
    /// A runner of `task` of `alloc` through `driver`, persisting through `store`, with its
    /// directory under `alloc_root` (`<alloc_root>/<task>`), and defaults for the rest.
    pub fn new(
        alloc: impl Into<Arc<Allocation>>,
        task: Task,
        driver: Arc<dyn Driver>,
        store: Arc<dyn StateStore>,
        alloc_root: impl Into<PathBuf>,
    ) -> TaskRunnerConfig {
        TaskRunnerConfig {
            alloc: alloc.into(),
            task,
            driver,
            store,
            clock: Arc::new(SystemClock),
            alloc_root: alloc_root.into(),
            hooks: Vec::new(),
            max_kill_timeout: DEFAULT_MAX_KILL_TIMEOUT,
            logs: LogLimits::default(),
            state_changed: Arc::new(Notify::new()),
            events: EventStream::default(),
            template_sources: MemorySources::new(),
            host_volumes: Arc::default(),
        }
    }

    /// Resolves the task's volume mounts against the node's `volumes`.
    pub fn with_host_volumes(
        mut self,
        volumes: Arc<BTreeMap<String, HostVolume>>,
    ) -> TaskRunnerConfig {
        self.host_volumes = volumes;
        self
    }

    /// Takes event timestamps from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn WallClock>) -> TaskRunnerConfig {
        self.clock = clock;
        self
    }

    /// Adds a hook, run after the built-in ones and those added before.
    pub fn with_hook(mut self, hook: Arc<dyn TaskHook>) -> TaskRunnerConfig {
        self.hooks.push(hook);
        self
    }

    /// Caps the task's `kill_timeout`.
    pub fn with_max_kill_timeout(mut self, max: Duration) -> TaskRunnerConfig {
        self.max_kill_timeout = max;
        self
    }

    /// Sets the log rotation limits.
    pub fn with_logs(mut self, logs: LogLimits) -> TaskRunnerConfig {
        self.logs = logs;
        self
    }

    /// Notifies `state_changed` (coalescing) after every change of the task's state.
    pub fn with_state_changed(mut self, state_changed: Arc<Notify>) -> TaskRunnerConfig {
        self.state_changed = state_changed;
        self
    }

    /// Lets the task's templates read services and variables from `sources`.
    pub fn with_template_sources(mut self, sources: Arc<dyn TemplateSources>) -> TaskRunnerConfig {
        self.template_sources = sources;
        self
    }

    /// Sends every recorded event to `events`.
    pub fn with_events(mut self, events: EventStream) -> TaskRunnerConfig {
        self.events = events;
        self
    }
}
