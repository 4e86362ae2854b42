//! The driver plugin interface: how wharf starts, watches, stops and reattaches to tasks.
//!
//! A [`Driver`] runs tasks of one kind (processes, containers, VMs). The task runner
//! (wharf-task) calls it and nothing else to touch a task, so the lifecycle logic never knows
//! whether a task is a process. Drivers are object-safe (`Arc<dyn Driver>`) so other
//! orchestrators can bring their own; [`DriverRegistry`] holds them by name.
//!
//! What the interface promises, driver by driver:
//! - [`Driver::start_task`] returns a [`TaskHandle`]: serialisable, versioned, and everything
//!   [`Driver::recover_task`] needs to reattach after the agent restarts.
//! - [`Driver::wait_task`] may be called any number of times, before or after the task exits.
//! - [`DriverError`] tells the caller what to do: a fatal error is never retried, a retryable
//!   one may be, an unsupported operation is not an error of the task.
//!
//! This crate owns no OS process API: spawning and signalling processes is wharf-exec's job.
//! With the `mock` feature, [`mock::MockDriver`] scripts a task's behaviour from its config,
//! deterministically under tokio's paused clock.

mod error;
#[cfg(feature = "mock")]
pub mod mock;
mod registry;
mod types;

pub use error::DriverError;
pub use registry::DriverRegistry;
pub use types::{
    Capabilities, DriverEvent, ExecResult, ExitResult, Fingerprint, FsIsolation, Health, LogConfig,
    ResourceUsage, RunState, TASK_HANDLE_VERSION, TaskConfig, TaskHandle, TaskId, TaskInfo,
    UsageSource,
};

use std::time::Duration;
use wharf_state::Signal;

/// A driver plugin. Every method that takes a [`TaskId`] fails with
/// [`DriverError::TaskNotFound`] for a task the driver does not know.
#[async_trait::async_trait]
pub trait Driver: Send + Sync + std::fmt::Debug + 'static {
    /// The name job specs use, such as `raw_exec`.
    fn name(&self) -> &str;

    /// What the driver can do.
    fn capabilities(&self) -> Capabilities;

    /// Whether the driver can run tasks on this node, and what it found.
    async fn fingerprint(&self) -> Fingerprint;

    /// Checks a task's driver config before anything is started; the error names the field.
    fn validate_config(
        &self,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DriverError>;

    /// Starts a task. A returned handle means the task runs (or ran).
    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError>;

    /// Reattaches to a task started by an earlier agent. Fails if the task no longer exists
    /// and its outcome cannot be learned.
    async fn recover_task(&self, handle: &TaskHandle) -> Result<(), DriverError>;

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

    /// What the driver knows about the task now.
    async fn inspect_task(&self, task_id: &TaskId) -> Result<TaskInfo, DriverError>;

    /// Sends a signal to the task.
    async fn signal_task(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError>;

    /// Runs a command in the task's context, cut off after `timeout`.
    async fn exec_task(
        &self,
        task_id: &TaskId,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, DriverError>;

    /// The task's current resource usage.
    async fn task_stats(&self, task_id: &TaskId) -> Result<ResourceUsage, DriverError>;

    /// Messages the driver has for tasks' event logs (such as progress). A receiver that lags
    /// loses the oldest messages, never blocks the driver.
    fn events(&self) -> tokio::sync::broadcast::Receiver<DriverEvent>;
}
