#![doc = include_str!("../README.md")]
//!
//! What the interface promises, driver by driver:
//! - [`Driver::start_task`] returns a [`TaskHandle`]: serialisable, versioned, and everything
//!   [`Driver::recover_task`] needs to reattach after the agent restarts.
//! - [`Driver::wait_task`] may be called any number of times, before or after the task exits.
//! - [`DriverError`] tells the caller what to do: a fatal error is never retried, a retryable
//!   one may be, an unsupported operation is not an error of the task.
//! - What [`Driver::capabilities`] says no to answers [`DriverError::Unsupported`]; the
//!   trait's defaults do exactly that, so a driver implements only what it can do.
//!
//! This crate owns no OS process API: spawning and signalling processes is wharf-exec's job.

mod error;
mod logs;
#[cfg(feature = "mock")]
pub mod mock;
mod registry;
mod types;

pub use error::DriverError;
pub use logs::{LogFrom, LogReader, LogStream, LogTarget};
pub use registry::DriverRegistry;
pub use types::{
    Capabilities, DriverEvent, DriverState, ExecResult, ExitResult, Fingerprint, FsIsolation,
    Health, LogConfig, Mount, ResourceUsage, RunState, TASK_HANDLE_VERSION, TaskConfig, TaskHandle,
    TaskId, TaskInfo, UsageSource,
};

/// The attribute that implementations of [`Driver`] (and [`LogReader`]) put on their `impl`
/// block: the trait's methods are async and the trait is object-safe.
pub use async_trait::async_trait;
/// The state model the interface is written in (a task's `resources`, timestamps), in the
/// version this crate was built with.
pub use wharf_state as state;
/// The signal names of [`Driver::stop_task`] and [`Driver::signal_task`].
pub use wharf_state::Signal;
/// The JSON crate of a task's driver `config` block ([`TaskConfig::driver_config`]).
pub use wharf_state::serde_json;

use std::time::Duration;

/// A driver plugin. Every method that takes a [`TaskId`] fails with
/// [`DriverError::TaskNotFound`] for a task the driver does not know.
///
/// Five methods are required: [`name`](Driver::name), [`start_task`](Driver::start_task),
/// [`wait_task`](Driver::wait_task), [`stop_task`](Driver::stop_task) and
/// [`destroy_task`](Driver::destroy_task). The others have defaults for a driver that can do
/// no more: no capabilities, healthy, every config accepted, and
/// [`DriverError::Unsupported`] for recover, inspect, signal, exec, stats and logs. A task
/// whose driver cannot recover it after an agent restart is treated as lost (restarted by
/// policy, or failed).
#[async_trait::async_trait]
pub trait Driver: Send + Sync + std::fmt::Debug + 'static {
    /// The name job specs use, such as `raw_exec`.
    fn name(&self) -> &str;

    /// What the driver can do. Default: nothing beyond the required methods.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Whether the driver can run tasks on this node, and what it found. Default: healthy.
    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            health: Health::Healthy,
            description: "ready".into(),
            attributes: Default::default(),
        }
    }

    /// Checks a task's driver config before anything is started; the error names the field.
    /// Default: every config is accepted.
    fn validate_config(
        &self,
        _config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    /// Starts a task. A returned handle means the task runs (or ran).
    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError>;

    /// Reattaches to a task started by an earlier agent. Fails if the task no longer exists
    /// and its outcome cannot be learned. Default: unsupported.
    async fn recover_task(&self, _handle: &TaskHandle) -> Result<(), DriverError> {
        Err(DriverError::unsupported(self.name(), "recover"))
    }

    /// Waits for the task to exit and returns how it ended; returns at once if it already has.
    async fn wait_task(&self, task_id: &TaskId) -> Result<ExitResult, DriverError>;

    /// Sends `signal`, waits up to `timeout`, then kills the task for good. Returns once the
    /// task is gone.
    async fn stop_task(
        &self,
        task_id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError>;

    /// Forgets the task and frees what the driver holds for it. Refuses a running task unless
    /// `force`, which kills it first.
    async fn destroy_task(&self, task_id: &TaskId, force: bool) -> Result<(), DriverError>;

    /// What the driver knows about the task now. Default: unsupported.
    async fn inspect_task(&self, _task_id: &TaskId) -> Result<TaskInfo, DriverError> {
        Err(DriverError::unsupported(self.name(), "inspect"))
    }

    /// Sends a signal to the task (capability `send_signals`). Default: unsupported.
    async fn signal_task(&self, _task_id: &TaskId, _signal: Signal) -> Result<(), DriverError> {
        Err(DriverError::unsupported(self.name(), "signals"))
    }

    /// Runs a command in the task's context, cut off after `timeout` (capability `exec`).
    /// Default: unsupported.
    async fn exec_task(
        &self,
        _task_id: &TaskId,
        _command: &[String],
        _timeout: Duration,
    ) -> Result<ExecResult, DriverError> {
        Err(DriverError::unsupported(self.name(), "exec"))
    }

    /// The task's current resource usage. Default: unsupported.
    async fn task_stats(&self, _task_id: &TaskId) -> Result<ResourceUsage, DriverError> {
        Err(DriverError::unsupported(self.name(), "stats"))
    }

    /// Opens one stream of a task's captured output, at `from` (capability `logs`). It works
    /// for a task that runs, one that has ended and one an earlier agent started, as long as
    /// the output is kept. What the driver finds that it did not write is refused with
    /// [`DriverError::Refused`], never followed. Default: unsupported.
    async fn task_logs(
        &self,
        _target: &LogTarget,
        _stream: LogStream,
        _from: LogFrom,
    ) -> Result<Box<dyn LogReader>, DriverError> {
        Err(DriverError::unsupported(self.name(), "logs"))
    }

    /// Messages the driver has for tasks' event logs (such as progress). A receiver that lags
    /// loses the oldest messages, never blocks the driver. Default: a stream that has ended.
    fn events(&self) -> tokio::sync::broadcast::Receiver<DriverEvent> {
        tokio::sync::broadcast::channel(1).1
    }
}
