//! Service health beside the alloc runner: the hooks that run wharf-health's checks and
//! trackers for one allocation (re-exported as [`crate::health`]).
//!
//! - `ServiceHook`, a task hook: when a task starts (or is reattached after an agent
//!   restart), its services go into the node's [`ServiceCatalog`] and its checks start
//!   ([`TaskChecks`]); before it is killed (prekill), when it exits, stops or the agent shuts
//!   down, they leave the catalog and the checks stop (and, but for a shutdown, which leaves
//!   the task running, its check results go back to pending). An update of the allocation
//!   that changes a running task's services puts them in place again, without restarting the
//!   task (Nomad's in-place service updates). A check_restart restarts the task through its
//!   task runner as a failure, so the restart policy counts it, with an event that names the
//!   check. The task's services are read from the allocation as last updated.
//! - `HealthHook`, an alloc hook: from prerun it watches the allocation with a
//!   [`HealthTracker`] (woken by task state changes, check status changes and the tracker's
//!   own deadlines), and records the verdict in the deployment status, persisted; an
//!   unhealthy verdict also leaves an `Alloc Unhealthy` event on each task that caused it.
//!   An allocation whose health is already set (restored after an agent restart) is not
//!   judged again, as in Nomad; batch jobs and `health_check = "manual"` are never judged.
//!   An update starts the watch over (its deadline too) with the updated allocation, and an
//!   update to another deployment clears the health first, so the new deployment is judged
//!   (Nomad's health hook `Update` and `ClearHealth`).
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
use wharf_state::{
    AllocatedPort, Allocation, ClientStatus, HealthCheck, Service, Task, TaskEvent, TaskEventKind,
};
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
pub(crate) struct HealthMonitor {
    alloc_id: String,
    book: Arc<CheckBook>,
    config: HealthConfig,
    runner: WeakRunner,
    /// The tasks that run, with what they put in place.
    running: Mutex<BTreeMap<String, Running>>,
    /// The health watcher.
    watching: Mutex<Watching>,
}

/// What a running task put in place: its services (and the ports they were resolved
/// against) in the catalog, and its checks, which stop when this is dropped.
#[derive(Debug)]
struct Running {
    registered: (Vec<Service>, Vec<AllocatedPort>),
    _checks: Option<TaskChecks>,
}

/// The health watcher's bookkeeping (Nomad's health hook state).
#[derive(Debug, Default)]
struct Watching {
    /// Prerun or an update has started watching (Nomad's `ranOnce`): a prerun after an update
    /// does nothing.
    begun: bool,
    /// The run is over or the agent leaves: no watcher starts any more.
    closed: bool,
    /// The deployment the allocation's health is about.
    deployment_id: Option<String>,
    /// The watcher running now.
    current: Option<Watcher>,
}

/// A running health watcher.
#[derive(Debug)]
struct Watcher {
    end: watch::Sender<Option<WatcherEnd>>,
    done: tokio::task::JoinHandle<()>,
}

/// How a watcher is told to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatcherEnd {
    /// After one last look, which still records a verdict the allocation has earned by then
    /// (a task that failed for good): the run is over.
    LastLook,
    /// At once, with no verdict: a new watcher takes over (the allocation was updated).
    Abandon,
}

impl HealthMonitor {
    pub(crate) fn new(
        alloc: &wharf_state::Allocation,
        config: HealthConfig,
        runner: WeakRunner,
    ) -> Arc<HealthMonitor> {
        Arc::new(HealthMonitor {
            alloc_id: alloc.id.clone(),
            book: Arc::new(CheckBook::new(alloc)),
            config,
            runner,
            running: Mutex::new(BTreeMap::new()),
            watching: Mutex::new(Watching {
                deployment_id: alloc.deployment_id.clone(),
                ..Watching::default()
            }),
        })
    }

    /// The allocation's checks and their latest results.
    pub(crate) fn book(&self) -> &CheckBook {
        &self.book
    }

    /// Puts `task`'s services in the catalog and starts its checks.
    fn task_started(&self, alloc: &Allocation, task: &Task) {
        if task.services.is_empty() {
            return;
        }
        for service in &task.services {
            let port = service.port.as_deref().and_then(|label| alloc.port(label));
            self.config.catalog.register(
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
                self.book.clone(),
            );
        }
        let plans = wharf_health::plans(alloc, task);
        let checks = (!plans.is_empty()).then(|| {
            let clock = self.runner.clock();
            let io = CheckIo {
                transport: self.config.transport.clone(),
                control: Arc::new(RunnerControl(self.runner.clone())),
                now: Arc::new(move || clock.now()),
            };
            TaskChecks::start(&task.name, plans, self.book.clone(), io)
        });
        let registered = (task.services.clone(), alloc.ports.clone());
        self.running.lock().insert(task.name.clone(), Running { registered, _checks: checks });
    }

    /// Takes `task`'s services out of the catalog and stops its checks; false if it had
    /// nothing in place.
    fn task_left(&self, task: &str) -> bool {
        let removed = self.running.lock().remove(task).is_some();
        self.config.catalog.deregister_task(&self.alloc_id, task);
        removed
    }

    /// `task` stopped: its services and checks go, and its results go back to pending.
    fn task_stopped(&self, task: &str) {
        if self.task_left(task) {
            self.book.reset_task(task);
        }
    }

    /// `task` was updated while it runs: if its services changed, they are put in place again.
    fn task_updated(&self, alloc: &Allocation, task: &Task) {
        let unchanged = match self.running.lock().get(&task.name) {
            None => return,
            Some(running) => running.registered == (task.services.clone(), alloc.ports.clone()),
        };
        if !unchanged {
            tracing::debug!(alloc_id = %self.alloc_id, task = %task.name, "services updated");
            self.task_left(&task.name);
            self.task_started(alloc, task);
        }
    }

    /// Ends everything of the allocation: the watcher (after a last look), checks, catalog
    /// entries.
    fn all_stopped(&self) {
        let watcher = {
            let mut watching = self.watching.lock();
            watching.closed = true;
            watching.current.take()
        };
        if let Some(watcher) = watcher {
            watcher.end.send_replace(Some(WatcherEnd::LastLook));
        }
        self.running.lock().clear();
        self.config.catalog.deregister_alloc(&self.alloc_id);
    }

    /// Starts watching `alloc`'s health, unless nobody judges it (batch jobs, `manual`) or it
    /// is judged already.
    fn start_watching(self: &Arc<HealthMonitor>, alloc: &Allocation) -> Result<(), AllocError> {
        let Some(runner) = self.runner.upgrade() else { return Ok(()) };
        let group = alloc.group()?;
        let Some(strategy) = alloc.job.health_strategy(group) else { return Ok(()) };
        if strategy.health_check == HealthCheck::Manual {
            return Ok(());
        }
        if runner.state().deployment_status.is_some_and(|d| d.healthy.is_some()) {
            tracing::debug!(alloc_id = %self.alloc_id, "health already set; not watching");
            return Ok(());
        }
        let (end, ended) = watch::channel(None);
        let mut watching = self.watching.lock();
        if watching.closed {
            return Ok(());
        }
        let done = tokio::spawn(watch_health(self.clone(), HealthTracker::new(strategy), ended));
        if let Some(replaced) = watching.current.replace(Watcher { end, done }) {
            replaced.end.send_replace(Some(WatcherEnd::Abandon));
        }
        Ok(())
    }
}

/// A task's definition as the allocation has it now: an update may have changed its
/// services since its task runner was made.
fn current_task<'a>(ctx: &HookContext<'a>) -> &'a Task {
    ctx.alloc
        .group()
        .ok()
        .and_then(|group| group.tasks.iter().find(|t| t.name == ctx.task.name))
        .unwrap_or(ctx.task)
}

/// The task hook that registers a task's services and runs its checks while it runs.
#[derive(Debug)]
pub(crate) struct ServiceHook(pub(crate) Arc<HealthMonitor>);

#[async_trait::async_trait]
impl TaskHook for ServiceHook {
    fn name(&self) -> &str {
        "services"
    }

    async fn poststart(&self, ctx: HookContext<'_>) -> Result<(), TaskError> {
        self.0.task_started(ctx.alloc, current_task(&ctx));
        Ok(())
    }

    async fn update(&self, ctx: HookContext<'_>) {
        self.0.task_updated(ctx.alloc, current_task(&ctx));
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
        // The task keeps running while the agent is away: its results are not cleared.
        self.0.task_left(&ctx.task.name);
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
pub(crate) struct HealthHook(pub(crate) Arc<HealthMonitor>);

#[async_trait::async_trait]
impl AllocHook for HealthHook {
    fn name(&self) -> &str {
        "alloc_health_watcher"
    }

    async fn prerun(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        {
            let mut watching = self.0.watching.lock();
            if std::mem::replace(&mut watching.begun, true) {
                // An update came first and is watching already.
                return Ok(());
            }
        }
        self.0.start_watching(ctx.alloc)
    }

    /// Nomad's health hook `Update`: the watcher starts over with the updated allocation, and
    /// a new deployment clears the health the old one was given, so it is judged again.
    async fn update(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        let health = &self.0;
        health.book.update(ctx.alloc);
        let (previous, deployment) = {
            let mut watching = health.watching.lock();
            watching.begun = true;
            let deployment =
                std::mem::replace(&mut watching.deployment_id, ctx.alloc.deployment_id.clone());
            (watching.current.take(), deployment)
        };
        if let Some(watcher) = previous {
            watcher.end.send_replace(Some(WatcherEnd::Abandon));
            // A verdict it was recording is written before the health is looked at again.
            let _ = watcher.done.await;
        }
        if deployment != ctx.alloc.deployment_id
            && let Some(runner) = health.runner.upgrade()
        {
            tracing::debug!(alloc_id = %health.alloc_id, "new deployment; health cleared");
            runner.clear_health().await;
        }
        health.start_watching(ctx.alloc)
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
/// deadlines, until it is judged, or told to end (see [`WatcherEnd`]).
async fn watch_health(
    health: Arc<HealthMonitor>,
    mut tracker: HealthTracker,
    mut ended: watch::Receiver<Option<WatcherEnd>>,
) {
    let origin = Instant::now();
    let mut checks = health.book.subscribe();
    let Some(mut states) = health.runner.upgrade().map(|r| r.subscribe()) else { return };
    let mut last_look = false;
    loop {
        if *ended.borrow() == Some(WatcherEnd::Abandon) {
            return;
        }
        let Some(runner) = health.runner.upgrade() else { return };
        let wake_at = match look(&runner, &health.book, &mut tracker, origin.elapsed()) {
            Progress::Judged(verdict) => {
                // Boxed: the watcher's future, held while the allocation is judged, keeps
                // only what waiting takes.
                Box::pin(judge(&runner, verdict)).await;
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
            ending = ended.wait_for(Option::is_some) => match ending.map(|e| *e) {
                Ok(Some(WatcherEnd::LastLook)) => last_look = true,
                _ => return,
            },
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
        checks: book.views(),
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
