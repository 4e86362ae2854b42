//! Service health beside the alloc runner: the hooks that run wharf-health's checks and
//! trackers for one allocation (re-exported as [`crate::health`]).
//!
//! - `ServiceHook`, a task hook: when a task starts (or is reattached after an agent
//!   restart), its services go into the node's [`ServiceCatalog`] and its checks start
//!   ([`TaskChecks`]); before it is killed (prekill), when it exits, stops or the agent shuts
//!   down, they leave the catalog and the checks stop. A check_restart restarts the task
//!   through its task runner as a failure, so the restart policy counts it, with an event that
//!   names the check.
//! - `HealthHook`, an alloc hook: from prerun it watches the allocation with a
//!   [`HealthTracker`] (woken by task state changes, check status changes and the tracker's
//!   own deadlines), and records the verdict in the deployment status, persisted; an
//!   unhealthy verdict also leaves an `Alloc Unhealthy` event on each task that caused it.
//!   An allocation whose health is already set (restored after an agent restart) is not
//!   judged again, as in Nomad; batch jobs and `health_check = "manual"` are never judged.
//!
//! Neither hook holds the runner: both reach it through a weak reference, so a runner that is
//! dropped is not kept alive by its own hooks.

use crate::AllocError;
use crate::hooks::{AllocHook, AllocHookContext};
use crate::runner::{AllocRunner, WeakRunner};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use wharf_driver::{ExecResult, ExitResult};
use wharf_health::tracker::{HealthTracker, Progress, Snapshot, TaskView, Verdict};
use wharf_health::{
    CheckBook, CheckIo, Registration, ServiceCatalog, TaskChecks, TaskControl, TcpTransport,
    Transport,
};
use wharf_state::{ClientStatus, HealthCheck, TaskEvent, TaskEventKind};
use wharf_task::{HookContext, TaskError, TaskHook};

/// What the alloc runner needs for its services' health: the node's catalog and how checks
/// reach the network.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// Where the allocation's services are listed while their tasks run.
    pub catalog: Arc<ServiceCatalog>,
    /// How http and tcp checks reach services.
    pub transport: Arc<dyn Transport>,
}

impl Default for HealthConfig {
    /// A catalog of its own and real TCP connections.
    fn default() -> Self {
        HealthConfig {
            catalog: Arc::new(ServiceCatalog::new()),
            transport: Arc::new(TcpTransport::new()),
        }
    }
}

/// The health parts of one alloc runner, shared by its two hooks.
#[derive(Debug)]
pub(crate) struct Health {
    alloc_id: String,
    book: Arc<CheckBook>,
    config: HealthConfig,
    runner: WeakRunner,
    /// The running checks of each task that runs.
    running: Mutex<BTreeMap<String, TaskChecks>>,
    /// Raised to end the health watcher.
    stop_watching: watch::Sender<bool>,
}

impl Health {
    pub(crate) fn new(
        alloc: &wharf_state::Allocation,
        config: HealthConfig,
        runner: WeakRunner,
    ) -> Arc<Health> {
        Arc::new(Health {
            alloc_id: alloc.id.clone(),
            book: Arc::new(CheckBook::new(alloc)),
            config,
            runner,
            running: Mutex::new(BTreeMap::new()),
            stop_watching: watch::channel(false).0,
        })
    }

    /// The allocation's checks and their latest results.
    pub(crate) fn book(&self) -> &CheckBook {
        &self.book
    }

    /// Takes `task`'s services out of the catalog and stops its checks.
    fn task_stopped(&self, task: &str) {
        self.running.lock().remove(task);
        self.config.catalog.deregister_task(&self.alloc_id, task);
    }

    /// Ends everything of the allocation: watcher, checks, catalog entries.
    fn all_stopped(&self) {
        self.stop_watching.send_replace(true);
        self.running.lock().clear();
        self.config.catalog.deregister_alloc(&self.alloc_id);
    }
}

/// The task hook that registers a task's services and runs its checks while it runs.
#[derive(Debug)]
pub(crate) struct ServiceHook(pub(crate) Arc<Health>);

#[async_trait::async_trait]
impl TaskHook for ServiceHook {
    fn name(&self) -> &str {
        "services"
    }

    async fn poststart(&self, ctx: HookContext<'_>) -> Result<(), TaskError> {
        let health = &self.0;
        let (alloc, task) = (ctx.alloc, ctx.task);
        if task.services.is_empty() {
            return Ok(());
        }
        for service in &task.services {
            let port = service.port.as_deref().and_then(|label| alloc.port(label));
            health.config.catalog.register(
                Registration {
                    alloc_id: alloc.id.clone(),
                    job_id: alloc.job.id.clone(),
                    group: alloc.task_group.clone(),
                    task: task.name.clone(),
                    name: service.name.clone(),
                    address: port.map(|p| p.host_ip),
                    port: port.map(|p| p.value),
                    tags: service.tags.clone(),
                },
                health.book.clone(),
            );
        }
        let plans = wharf_health::plans(alloc, task);
        if !plans.is_empty() {
            let clock = health.runner.clock();
            let io = CheckIo {
                transport: health.config.transport.clone(),
                control: Arc::new(RunnerControl(health.runner.clone())),
                now: Arc::new(move || clock.now()),
            };
            let checks = TaskChecks::start(&task.name, plans, health.book.clone(), io);
            health.running.lock().insert(task.name.clone(), checks);
        }
        Ok(())
    }

    async fn prekill(&self, ctx: HookContext<'_>) {
        self.0.task_stopped(&ctx.task.name);
    }

    async fn exited(&self, ctx: HookContext<'_>, _exit: &ExitResult) {
        self.0.task_stopped(&ctx.task.name);
    }

    async fn stop(&self, ctx: HookContext<'_>) -> Result<(), TaskError> {
        self.0.task_stopped(&ctx.task.name);
        Ok(())
    }

    async fn shutdown(&self, ctx: HookContext<'_>) {
        self.0.task_stopped(&ctx.task.name);
    }
}

/// Script checks and check_restart, through the alloc runner's task runners.
struct RunnerControl(WeakRunner);

impl fmt::Debug for RunnerControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RunnerControl")
    }
}

#[async_trait::async_trait]
impl TaskControl for RunnerControl {
    async fn exec(
        &self,
        task: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, String> {
        let runner = self.0.upgrade().ok_or("the allocation is gone")?;
        runner.exec(task, command, timeout).await.map_err(|e| e.to_string())
    }

    async fn restart(&self, task: &str, reason: &str) -> Result<(), String> {
        let runner = self.0.upgrade().ok_or("the allocation is gone")?;
        runner.restart_task_failed(task, reason).await.map_err(|e| e.to_string())
    }
}

/// The alloc hook that judges the allocation's health.
#[derive(Debug)]
pub(crate) struct HealthHook(pub(crate) Arc<Health>);

#[async_trait::async_trait]
impl AllocHook for HealthHook {
    fn name(&self) -> &str {
        "alloc_health_watcher"
    }

    async fn prerun(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        let health = self.0.clone();
        let Some(runner) = health.runner.upgrade() else { return Ok(()) };
        let group = ctx.alloc.group()?;
        let Some(strategy) = ctx.alloc.job.health_strategy(group) else { return Ok(()) };
        if strategy.health_check == HealthCheck::Manual {
            return Ok(());
        }
        if runner.state().deployment_status.is_some_and(|d| d.healthy.is_some()) {
            tracing::debug!(alloc_id = %health.alloc_id, "health already set; not watching");
            return Ok(());
        }
        health.stop_watching.send_replace(false);
        tokio::spawn(watch_health(health, HealthTracker::new(strategy)));
        Ok(())
    }

    async fn postrun(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        self.0.all_stopped();
        Ok(())
    }

    async fn destroy(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        self.0.all_stopped();
        Ok(())
    }

    async fn shutdown(&self, _ctx: AllocHookContext<'_>) {
        self.0.all_stopped();
    }
}

/// Looks at the allocation on every change of its tasks or checks, and at the tracker's
/// deadlines, until it is judged or stopped. When the hook ends the watch (the run is over,
/// the agent leaves, the allocation is destroyed), one last look still records a verdict the
/// allocation has earned by then, such as a task that failed for good.
async fn watch_health(health: Arc<Health>, mut tracker: HealthTracker) {
    let origin = Instant::now();
    let mut stop = health.stop_watching.subscribe();
    let mut checks = health.book.subscribe();
    let Some(mut states) = health.runner.upgrade().map(|r| r.subscribe()) else { return };
    let mut last_look = false;
    loop {
        let Some(runner) = health.runner.upgrade() else { return };
        let wake_at = match look(&runner, &health.book, &mut tracker, origin.elapsed()) {
            Progress::Judged(verdict) => {
                judge(&runner, verdict).await;
                return;
            }
            Progress::Stopped => return,
            Progress::Waiting { wake_at } => wake_at,
        };
        drop(runner);
        if last_look {
            return;
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => last_look = true,
            changed = states.changed() => if changed.is_err() { return },
            _ = checks.changed() => {}
            () = tokio::time::sleep_until(origin + wake_at) => {}
        }
    }
}

/// One look at the allocation.
fn look(
    runner: &AllocRunner,
    book: &CheckBook,
    tracker: &mut HealthTracker,
    now: Duration,
) -> Progress {
    let state = runner.state();
    let alloc = runner.alloc();
    let tasks = runner
        .tasks()
        .iter()
        .filter_map(|t| {
            let task_state = state.task_states.get(t.name())?;
            Some(TaskView { name: t.name(), stage: t.stage(), state: task_state })
        })
        .collect();
    let snapshot = Snapshot {
        stopping: alloc.server_terminal(),
        failed: matches!(state.client_status, ClientStatus::Failed | ClientStatus::Lost),
        tasks,
        checks: book.statuses(),
    };
    tracker.observe(&snapshot, now)
}

/// Records `verdict` in the deployment status; an unhealthy one also on the tasks that caused
/// it.
async fn judge(runner: &AllocRunner, verdict: Verdict) {
    if runner.state().deployment_status.is_some_and(|d| d.healthy.is_some()) {
        // Set meanwhile by someone else (an operator): theirs stands.
        return;
    }
    match verdict {
        Verdict::Healthy => {
            tracing::info!(alloc_id = %runner.id(), "allocation is healthy");
            runner.record_health(true, None).await;
        }
        Verdict::Unhealthy { reason, task_events } => {
            tracing::warn!(alloc_id = %runner.id(), %reason, "allocation is unhealthy");
            for task in runner.tasks() {
                if let Some(message) = task_events.get(task.name()) {
                    let kind = TaskEventKind::AllocUnhealthy { message: message.clone() };
                    task.emit_event(TaskEvent::new(runner.now(), kind)).await;
                }
            }
            runner.record_health(false, Some(reason)).await;
        }
    }
}
