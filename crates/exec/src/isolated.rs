//! [`ExecDriver`]: the isolated `exec` driver, raw_exec's shim, launch and reattach with each
//! task contained (module `isolation` decides how; wharf-isolate makes the system calls).
//!
//! It is a [`RawExecDriver`] with an isolation set: every method of the driver trait is that
//! driver's, which branches where `exec` differs (its name, capabilities, fingerprint, config
//! block, the containment of a start, no `exec_task`). This type gives it its own name and
//! constructor.

use crate::isolation::ExecOptions;
use crate::isolation::Isolation;
use crate::raw_exec::{RawExecDriver, RawExecOptions};
use crate::task_cgroups::TaskCgroups;
use std::time::Duration;
use tokio::sync::broadcast;
use wharf_driver::{
    Capabilities, Driver, DriverError, DriverEvent, ExecResult, ExitResult, Fingerprint, LogFrom,
    LogReader, LogStream, LogTarget, ResourceUsage, TaskConfig, TaskHandle, TaskId, TaskInfo,
};
use wharf_state::Signal;

/// The isolated `exec` driver, after Nomad's exec2: each task as a workload user of its own,
/// with `no_new_privs`, Landlock, private PID and IPC namespaces and its cgroup's limits.
/// Linux only, as root.
#[derive(Debug)]
pub struct ExecDriver {
    inner: RawExecDriver,
}

impl ExecDriver {
    /// A driver with raw_exec's `options` (shim, timeouts) and the node's `exec` settings. It
    /// checks nothing yet: what the node lacks shows in [`Driver::fingerprint`] and fails each
    /// start with a clear error. Without [`ExecDriver::with_cgroups`] it starts no task.
    pub fn new(options: RawExecOptions, exec: ExecOptions) -> ExecDriver {
        ExecDriver { inner: RawExecDriver::new(options).with_isolation(Isolation::new(exec)) }
    }

    /// The driver with its tasks' cgroups from `cgroups`; `exec` refuses to start tasks
    /// without one.
    pub fn with_cgroups(self, cgroups: TaskCgroups) -> ExecDriver {
        ExecDriver { inner: self.inner.with_cgroups(cgroups) }
    }

    /// Whether, and under which manager, its tasks get cgroups.
    pub fn task_cgroups(&self) -> &TaskCgroups {
        self.inner.task_cgroups()
    }

    /// The shim program this driver starts: by default raw_exec's static shim, which takes
    /// every containment step too.
    pub fn shim_path(&self) -> &std::path::Path {
        self.inner.shim_path()
    }
}

#[async_trait::async_trait]
impl Driver for ExecDriver {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn fingerprint(&self) -> Fingerprint {
        self.inner.fingerprint().await
    }

    fn validate_config(
        &self,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DriverError> {
        self.inner.validate_config(config)
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        self.inner.start_task(config).await
    }

    async fn recover_task(&self, handle: &TaskHandle) -> Result<(), DriverError> {
        self.inner.recover_task(handle).await
    }

    async fn wait_task(&self, task_id: &TaskId) -> Result<ExitResult, DriverError> {
        self.inner.wait_task(task_id).await
    }

    async fn stop_task(
        &self,
        task_id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        self.inner.stop_task(task_id, timeout, signal).await
    }

    async fn destroy_task(&self, task_id: &TaskId, force: bool) -> Result<(), DriverError> {
        self.inner.destroy_task(task_id, force).await
    }

    async fn inspect_task(&self, task_id: &TaskId) -> Result<TaskInfo, DriverError> {
        self.inner.inspect_task(task_id).await
    }

    async fn signal_task(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        self.inner.signal_task(task_id, signal).await
    }

    async fn exec_task(
        &self,
        task_id: &TaskId,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, DriverError> {
        self.inner.exec_task(task_id, command, timeout).await
    }

    async fn task_stats(&self, task_id: &TaskId) -> Result<ResourceUsage, DriverError> {
        self.inner.task_stats(task_id).await
    }

    async fn task_logs(
        &self,
        target: &LogTarget,
        stream: LogStream,
        from: LogFrom,
    ) -> Result<Box<dyn LogReader>, DriverError> {
        self.inner.task_logs(target, stream, from).await
    }

    fn events(&self) -> broadcast::Receiver<DriverEvent> {
        self.inner.events()
    }
}
