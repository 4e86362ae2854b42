//! A driver whose tasks do what their config says, for tests of the task and alloc runners.
//!
//! Every field of the task's `config` block is optional:
//!
//! | field | effect |
//! |---|---|
//! | `run_for = "5s"` | the task exits by itself after this long; absent: it runs until stopped |
//! | `exit_code = 1`, `exit_signal = 9` | how it exits by itself |
//! | `start_error = "..."` | starting fails with this message |
//! | `start_error_retryable = true` | ... as a retryable error (default: fatal) |
//! | `start_error_count = 2` | ... only for the first 2 starts of this task, then it starts |
//! | `start_block_for = "1s"` | starting takes this long |
//! | `kill_after = "10s"` | after the stop signal the task takes this long to exit (force-killed at the stop timeout) |
//! | `stop_hangs = true` | stopping never returns, as a wedged driver would |
//! | `signal_error = "..."` | sending a signal fails with this message |
//! | `exec_stdout`, `exec_stderr`, `exec_exit_code` | what exec returns |
//! | `recover_error = "..."` | reattaching after a restart fails with this message |
//! | `messages = ["..."]` | driver messages sent when the task starts |
//! | `memory_bytes = 1024` | what stats report |
//!
//! All waiting is done with tokio's timer, so tests under a paused clock are deterministic.
//! A [`MockDriver`] keeps its tasks in memory: a test that "restarts the agent" reuses the
//! same driver, and its tasks are still there, as real processes would be.

use crate::{
    Capabilities, Driver, DriverError, DriverEvent, ExecResult, ExitResult, Fingerprint,
    FsIsolation, Health, ResourceUsage, RunState, TASK_HANDLE_VERSION, TaskConfig, TaskHandle,
    TaskId, TaskInfo,
};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use wharf_state::Signal;
use wharf_state::duration::serde_str;

/// A task's scripted behaviour, read from its `config` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockConfig {
    /// Exit by itself after this long.
    #[serde(default, with = "serde_str::option")]
    pub run_for: Option<Duration>,
    /// Exit code when it exits by itself.
    #[serde(default)]
    pub exit_code: i32,
    /// Signal when it exits by itself.
    #[serde(default)]
    pub exit_signal: Option<i32>,
    /// Starting fails with this message.
    #[serde(default)]
    pub start_error: Option<String>,
    /// The start error is retryable.
    #[serde(default)]
    pub start_error_retryable: bool,
    /// Only the first this many starts fail.
    #[serde(default)]
    pub start_error_count: Option<u32>,
    /// Starting takes this long.
    #[serde(default, with = "serde_str::option")]
    pub start_block_for: Option<Duration>,
    /// After the stop signal, exit this long later.
    #[serde(default, with = "serde_str::option")]
    pub kill_after: Option<Duration>,
    /// Stopping never returns.
    #[serde(default)]
    pub stop_hangs: bool,
    /// Signalling fails with this message.
    #[serde(default)]
    pub signal_error: Option<String>,
    /// What exec writes to stdout.
    #[serde(default)]
    pub exec_stdout: String,
    /// What exec writes to stderr.
    #[serde(default)]
    pub exec_stderr: String,
    /// Exec's exit code.
    #[serde(default)]
    pub exec_exit_code: i32,
    /// Reattaching fails with this message.
    #[serde(default)]
    pub recover_error: Option<String>,
    /// Driver messages sent at start.
    #[serde(default)]
    pub messages: Vec<String>,
    /// Memory reported by stats.
    #[serde(default)]
    pub memory_bytes: u64,
}

impl MockConfig {
    /// Reads a task's config block; the error names the field.
    pub fn parse(
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<MockConfig, DriverError> {
        MockConfig::deserialize(serde_json::Value::Object(config.clone())).map_err(|e| {
            let message = e.to_string();
            let field = message
                .split('`')
                .nth(1)
                .filter(|_| message.starts_with("unknown field"))
                .map_or_else(|| "config".to_owned(), |f| format!("config.{f}"));
            DriverError::invalid_config(field, message)
        })
    }
}

/// The scripted driver. Clones share the same tasks.
#[derive(Debug, Clone)]
pub struct MockDriver {
    name: String,
    fs_isolation: FsIsolation,
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<DriverEvent>,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: HashMap<TaskId, MockTask>,
    /// Start attempts per `<alloc>/<task>`, for `start_error_count`.
    starts: HashMap<String, u32>,
    signals: Vec<(TaskId, Signal)>,
    execs: Vec<(TaskId, Vec<String>)>,
    started: Vec<TaskConfig>,
    stops: Vec<TaskId>,
    destroyed: Vec<TaskId>,
}

#[derive(Debug)]
struct MockTask {
    config: MockConfig,
    exit: watch::Sender<Option<ExitResult>>,
}

impl Default for MockDriver {
    fn default() -> Self {
        MockDriver::named("mock")
    }
}

impl MockDriver {
    /// A mock driver registered as `mock`.
    pub fn new() -> MockDriver {
        MockDriver::default()
    }

    /// A mock driver registered under another name.
    pub fn named(name: &str) -> MockDriver {
        MockDriver {
            name: name.to_owned(),
            fs_isolation: FsIsolation::None,
            inner: Arc::default(),
            events: broadcast::channel(256).0,
        }
    }

    /// The same driver, saying its tasks see the filesystem as `fs_isolation` has it.
    pub fn with_fs_isolation(mut self, fs_isolation: FsIsolation) -> MockDriver {
        self.fs_isolation = fs_isolation;
        self
    }

    /// Every command run through [`Driver::exec_task`], in order.
    pub fn execs(&self) -> Vec<(TaskId, Vec<String>)> {
        self.inner.lock().execs.clone()
    }

    /// Every signal sent through [`Driver::signal_task`] or [`Driver::stop_task`], in order.
    pub fn signals_sent(&self) -> Vec<(TaskId, Signal)> {
        self.inner.lock().signals.clone()
    }

    /// The config of every task started, in order.
    pub fn started(&self) -> Vec<TaskConfig> {
        self.inner.lock().started.clone()
    }

    /// Every task [`Driver::stop_task`] was called for, in order.
    pub fn stops(&self) -> Vec<TaskId> {
        self.inner.lock().stops.clone()
    }

    /// Every task destroyed, in order.
    pub fn destroyed(&self) -> Vec<TaskId> {
        self.inner.lock().destroyed.clone()
    }

    /// Tasks that have not exited.
    pub fn running(&self) -> Vec<TaskId> {
        let inner = self.inner.lock();
        let mut ids: Vec<_> = inner
            .tasks
            .iter()
            .filter(|(_, t)| t.exit.borrow().is_none())
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// How many times a task of `alloc_id` named `task` was started.
    pub fn start_count(&self, alloc_id: &str, task: &str) -> u32 {
        self.inner.lock().starts.get(&format!("{alloc_id}/{task}")).copied().unwrap_or(0)
    }

    /// Makes a running task exit now, as a crash would.
    pub fn exit_task(&self, task_id: &TaskId, result: ExitResult) {
        self.finish(task_id, result);
    }

    /// Forgets every task, as a node reboot would: recovery then fails.
    pub fn forget_all(&self) {
        self.inner.lock().tasks.clear();
    }

    fn finish(&self, task_id: &TaskId, result: ExitResult) {
        if let Some(task) = self.inner.lock().tasks.get(task_id) {
            task.exit.send_if_modified(|exit| {
                let first = exit.is_none();
                if first {
                    *exit = Some(result);
                }
                first
            });
        }
    }

    fn exit_receiver(
        &self,
        task_id: &TaskId,
    ) -> Result<(MockConfig, watch::Receiver<Option<ExitResult>>), DriverError> {
        let inner = self.inner.lock();
        let task = inner
            .tasks
            .get(task_id)
            .ok_or_else(|| DriverError::TaskNotFound { task_id: task_id.clone() })?;
        Ok((task.config.clone(), task.exit.subscribe()))
    }

    /// Registers a running task and, if it exits by itself, its timer.
    fn launch(&self, id: TaskId, config: MockConfig) {
        let (exit, _) = watch::channel(None);
        let run_for = config.run_for;
        let natural_exit = match config.exit_signal {
            Some(signal) => ExitResult::signalled(signal),
            None => ExitResult::code(config.exit_code),
        };
        self.inner.lock().tasks.insert(id.clone(), MockTask { config, exit });
        if let Some(run_for) = run_for {
            let driver = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(run_for).await;
                driver.finish(&id, natural_exit);
            });
        }
    }
}

#[async_trait::async_trait]
impl Driver for MockDriver {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            send_signals: true,
            exec: true,
            logs: false,
            fs_isolation: self.fs_isolation,
        }
    }

    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            health: Health::Healthy,
            description: "mock driver".into(),
            attributes: BTreeMap::new(),
        }
    }

    fn validate_config(
        &self,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DriverError> {
        MockConfig::parse(config).map(|_| ())
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        let mock = MockConfig::parse(&config.driver_config)?;
        if let Some(block) = mock.start_block_for {
            tokio::time::sleep(block).await;
        }
        let attempt = {
            let mut inner = self.inner.lock();
            let count = inner
                .starts
                .entry(format!("{}/{}", config.alloc_id, config.task_name))
                .or_default();
            *count += 1;
            *count
        };
        if let Some(reason) = &mock.start_error
            && mock.start_error_count.is_none_or(|failing| attempt <= failing)
        {
            let reason = reason.clone();
            return Err(if mock.start_error_retryable {
                DriverError::Retryable { reason }
            } else {
                DriverError::Other { reason }
            });
        }
        for message in &mock.messages {
            let _ = self.events.send(DriverEvent {
                task_id: config.id.clone(),
                message: message.clone(),
                annotations: BTreeMap::new(),
            });
        }
        self.launch(config.id.clone(), mock);
        self.inner.lock().started.push(config.clone());
        Ok(TaskHandle {
            version: TASK_HANDLE_VERSION,
            driver: self.name.clone(),
            config,
            driver_state: serde_json::json!({ "mock": true }).into(),
        })
    }

    async fn recover_task(&self, handle: &TaskHandle) -> Result<(), DriverError> {
        if self.inner.lock().tasks.contains_key(handle.id()) {
            return Ok(());
        }
        let mock = MockConfig::parse(&handle.config.driver_config)?;
        match &mock.recover_error {
            Some(reason) => Err(DriverError::other(reason)),
            None => Err(DriverError::TaskNotFound { task_id: handle.id().clone() }),
        }
    }

    async fn wait_task(&self, task_id: &TaskId) -> Result<ExitResult, DriverError> {
        let (_, mut exit) = self.exit_receiver(task_id)?;
        let result = exit
            .wait_for(Option::is_some)
            .await
            .map_err(|_| DriverError::other("task record dropped"))?;
        result.clone().ok_or_else(|| DriverError::other("task record lost its exit"))
    }

    async fn stop_task(
        &self,
        task_id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        let (config, exit) = self.exit_receiver(task_id)?;
        {
            let mut inner = self.inner.lock();
            inner.stops.push(task_id.clone());
            inner.signals.push((task_id.clone(), signal));
        }
        if config.stop_hangs {
            std::future::pending::<()>().await;
        }
        if exit.borrow().is_some() {
            return Ok(());
        }
        let grace = config.kill_after.unwrap_or(Duration::ZERO);
        if grace <= timeout {
            tokio::time::sleep(grace).await;
            self.finish(task_id, ExitResult::signalled(signal.number()));
        } else {
            tokio::time::sleep(timeout).await;
            self.inner.lock().signals.push((task_id.clone(), Signal::Kill));
            self.finish(task_id, ExitResult::signalled(Signal::Kill.number()));
        }
        Ok(())
    }

    async fn destroy_task(&self, task_id: &TaskId, force: bool) -> Result<(), DriverError> {
        let (_, exit) = self.exit_receiver(task_id)?;
        if exit.borrow().is_none() {
            if !force {
                return Err(DriverError::other(format!(
                    "task {task_id} is running; stop it or destroy with force"
                )));
            }
            self.finish(task_id, ExitResult::signalled(Signal::Kill.number()));
        }
        let mut inner = self.inner.lock();
        inner.tasks.remove(task_id);
        inner.destroyed.push(task_id.clone());
        Ok(())
    }

    async fn inspect_task(&self, task_id: &TaskId) -> Result<TaskInfo, DriverError> {
        let (_, exit) = self.exit_receiver(task_id)?;
        let exit = exit.borrow().clone();
        let state = if exit.is_some() { RunState::Exited } else { RunState::Running };
        Ok(TaskInfo { id: task_id.clone(), state, exit, attributes: BTreeMap::new() })
    }

    async fn signal_task(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        let (config, _) = self.exit_receiver(task_id)?;
        if let Some(reason) = config.signal_error {
            return Err(DriverError::other(reason));
        }
        self.inner.lock().signals.push((task_id.clone(), signal));
        Ok(())
    }

    async fn exec_task(
        &self,
        task_id: &TaskId,
        command: &[String],
        _timeout: Duration,
    ) -> Result<ExecResult, DriverError> {
        let (config, _) = self.exit_receiver(task_id)?;
        self.inner.lock().execs.push((task_id.clone(), command.to_vec()));
        Ok(ExecResult {
            stdout: config.exec_stdout.into_bytes(),
            stderr: config.exec_stderr.into_bytes(),
            exit: ExitResult::code(config.exec_exit_code),
        })
    }

    async fn task_stats(&self, task_id: &TaskId) -> Result<ResourceUsage, DriverError> {
        let (config, exit) = self.exit_receiver(task_id)?;
        let running = exit.borrow().is_none();
        Ok(ResourceUsage {
            cpu_time: Duration::ZERO,
            memory_rss_bytes: if running { config.memory_bytes } else { 0 },
            processes: u32::from(running),
            ..ResourceUsage::default()
        })
    }

    fn events(&self) -> broadcast::Receiver<DriverEvent> {
        self.events.subscribe()
    }
}
