//! Service health beside the alloc runner: the hooks that run wharf-health's checks and
//! trackers for one allocation (wharf-health is re-exported as this crate's `health`).
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
//! Both hooks share one [`HealthMonitor`]. They see and touch the alloc runner only through
//! [`WatchedRunner`], a narrow trait the runner implements (its state, its tasks' names and
//! stages, recording health, task events, exec and restart), and hold it through a weak
//! reference, so a runner that is dropped is not kept alive by its own hooks. The unit tests
//! below drive the hooks on a fake of that trait under tokio's paused clock; the end-to-end
//! cases on a real runner are in `tests/health.rs`.
//!
//! The health watch is one [`WatchState`]: not begun, begun (with the watcher running now,
//! if any), or closed once the run is over or the agent leaves:
//!
//! | state | prerun | update | postrun, destroy, shutdown |
//! |---|---|---|---|
//! | not begun | begun: start watching | begun: start watching | closed |
//! | begun | nothing (an update came first) | abandon the watcher, start over | closed: the watcher takes a last look |
//! | closed | nothing starts | nothing starts | closed |

use crate::error::AllocError;
use crate::hooks::{AllocHook, AllocHookContext};
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
use wharf_state::spec::Stage;
use wharf_state::{
    AllocState, AllocatedPort, Allocation, ClientStatus, HealthCheck, Service, Task, TaskEvent,
    TaskEventKind,
};
use wharf_task::{HookContext, TaskError, TaskHook, WallClock};

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

/// The alloc runner as the health hooks reach it: all they read of it and all they do to it.
/// The alloc runner implements it; the tests below implement a fake.
#[async_trait::async_trait]
pub(crate) trait WatchedRunner: fmt::Debug + Send + Sync + Sized + 'static {
    /// A reference to the runner that does not keep it alive.
    type Weak: Clone + fmt::Debug + Send + Sync + 'static;

    /// The runner, unless it is gone.
    fn upgrade(weak: &Self::Weak) -> Option<Self>;

    /// The allocation's state, as the runner's watchers see it.
    fn state(&self) -> AllocState;

    /// A watcher of that state.
    fn subscribe(&self) -> watch::Receiver<AllocState>;

    /// Whether the allocation, as last updated, is being stopped.
    fn stopping(&self) -> bool;

    /// Each task's name and stage, in the group's order.
    fn tasks(&self) -> Vec<(String, Stage)>;

    /// Records the allocation's health and why, persisted before any watcher sees it.
    async fn record_health(&self, healthy: bool, description: Option<String>);

    /// Forgets the allocation's health (its deployment changed), persisted, so that it is
    /// judged again.
    async fn clear_health(&self);

    /// Records `event` on `task`.
    async fn emit_event(&self, task: &str, event: TaskEvent);

    /// Runs a command in a running task (a script check).
    async fn exec(
        &self,
        task: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, AllocError>;

    /// Restarts a running task as a failure, counted by its restart policy (check_restart).
    async fn restart_failed(&self, task: &str, reason: &str) -> Result<(), AllocError>;
}

/// Services, checks and the health watch of one allocation, shared by its two hooks.
#[derive(Debug)]
pub(crate) struct HealthMonitor<R: WatchedRunner> {
    alloc_id: String,
    book: Arc<CheckBook>,
    config: HealthConfig,
    runner: R::Weak,
    /// The runner's clock, for check results and events.
    clock: Arc<dyn WallClock>,
    /// The tasks that run, with what they put in place.
    running: Mutex<BTreeMap<String, Running>>,
    /// The health watch.
    watching: Mutex<Watching>,
}

/// What a running task put in place: its services (and the ports they were resolved
/// against) in the catalog, and its checks, which stop when this is dropped.
#[derive(Debug)]
struct Running {
    registered: (Vec<Service>, Vec<AllocatedPort>),
    _checks: Option<TaskChecks>,
}

/// The health watch's bookkeeping (Nomad's health hook state).
#[derive(Debug)]
struct Watching {
    /// The deployment the allocation's health is about.
    deployment_id: Option<String>,
    state: WatchState,
}

/// Where the health watch stands (the table in the module docs).
#[derive(Debug)]
enum WatchState {
    /// Neither prerun nor an update has come yet.
    NotBegun,
    /// Prerun or an update has begun watching (Nomad's `ranOnce`), so a prerun after an update
    /// does nothing. The watcher running now, if one was started: none is for an allocation
    /// that nobody judges or that is judged already.
    Begun(Option<Watcher>),
    /// The run is over or the agent leaves: no watcher starts any more.
    Closed,
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

impl<R: WatchedRunner> HealthMonitor<R> {
    /// The monitor of `alloc`, whose runner is `runner`, taking the time from `clock`.
    pub(crate) fn new(
        alloc: &Allocation,
        config: HealthConfig,
        runner: R::Weak,
        clock: Arc<dyn WallClock>,
    ) -> Arc<HealthMonitor<R>> {
        Arc::new(HealthMonitor {
            alloc_id: alloc.id.clone(),
            book: Arc::new(CheckBook::new(alloc)),
            config,
            runner,
            clock,
            running: Mutex::new(BTreeMap::new()),
            watching: Mutex::new(Watching {
                deployment_id: alloc.deployment_id.clone(),
                state: WatchState::NotBegun,
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
            let clock = self.clock.clone();
            let io = CheckIo {
                transport: self.config.transport.clone(),
                control: Arc::new(RunnerControl::<R>(self.runner.clone())),
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

    /// Takes the allocation's services out of the catalog before its tasks are stopped (the
    /// group's shutdown delay); their checks go on until each task stops.
    pub(crate) fn services_leave(&self) {
        self.config.catalog.deregister_alloc(&self.alloc_id);
    }

    /// Ends everything of the allocation: the watcher (after a last look), checks, catalog
    /// entries.
    fn all_stopped(&self) {
        let previous = std::mem::replace(&mut self.watching.lock().state, WatchState::Closed);
        if let WatchState::Begun(Some(watcher)) = previous {
            watcher.end.send_replace(Some(WatcherEnd::LastLook));
        }
        self.running.lock().clear();
        self.config.catalog.deregister_alloc(&self.alloc_id);
    }

    /// Starts watching `alloc`'s health, unless nobody judges it (batch jobs, `manual`) or it
    /// is judged already.
    fn start_watching(self: &Arc<Self>, alloc: &Allocation) -> Result<(), AllocError> {
        let Some(runner) = R::upgrade(&self.runner) else { return Ok(()) };
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
        if let WatchState::Closed = watching.state {
            return Ok(());
        }
        let done = tokio::spawn(watch_health(self.clone(), HealthTracker::new(strategy), ended));
        let watcher = WatchState::Begun(Some(Watcher { end, done }));
        if let WatchState::Begun(Some(replaced)) = std::mem::replace(&mut watching.state, watcher) {
            replaced.end.send_replace(Some(WatcherEnd::Abandon));
        }
        Ok(())
    }
}

impl Watching {
    /// An update begins the watch over (nothing changes once it is closed); returns the
    /// watcher that ran until now, for the update to abandon.
    fn begin_again(&mut self) -> Option<Watcher> {
        match std::mem::replace(&mut self.state, WatchState::Begun(None)) {
            WatchState::NotBegun => None,
            WatchState::Begun(current) => current,
            WatchState::Closed => {
                self.state = WatchState::Closed;
                None
            }
        }
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
pub(crate) struct ServiceHook<R: WatchedRunner>(pub(crate) Arc<HealthMonitor<R>>);

#[async_trait::async_trait]
impl<R: WatchedRunner> TaskHook for ServiceHook<R> {
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
struct RunnerControl<R: WatchedRunner>(R::Weak);

impl<R: WatchedRunner> fmt::Debug for RunnerControl<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RunnerControl")
    }
}

#[async_trait::async_trait]
impl<R: WatchedRunner> TaskControl for RunnerControl<R> {
    async fn exec(
        &self,
        task: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, String> {
        let runner = R::upgrade(&self.0).ok_or("the allocation is gone")?;
        runner.exec(task, command, timeout).await.map_err(|e| e.to_string())
    }

    async fn restart(&self, task: &str, reason: &str) -> Result<(), String> {
        let runner = R::upgrade(&self.0).ok_or("the allocation is gone")?;
        runner.restart_failed(task, reason).await.map_err(|e| e.to_string())
    }
}

/// The alloc hook that judges the allocation's health.
#[derive(Debug)]
pub(crate) struct HealthHook<R: WatchedRunner>(pub(crate) Arc<HealthMonitor<R>>);

#[async_trait::async_trait]
impl<R: WatchedRunner> AllocHook for HealthHook<R> {
    fn name(&self) -> &str {
        "alloc_health_watcher"
    }

    async fn prerun(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        {
            let mut watching = self.0.watching.lock();
            match watching.state {
                // An update came first and is watching already.
                WatchState::Begun(_) => return Ok(()),
                WatchState::NotBegun => watching.state = WatchState::Begun(None),
                // Stays closed: watching will not start.
                WatchState::Closed => {}
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
            let deployment =
                std::mem::replace(&mut watching.deployment_id, ctx.alloc.deployment_id.clone());
            (watching.begin_again(), deployment)
        };
        if let Some(watcher) = previous {
            watcher.end.send_replace(Some(WatcherEnd::Abandon));
            // A verdict it was recording is written before the health is looked at again.
            let _ = watcher.done.await;
        }
        if deployment != ctx.alloc.deployment_id
            && let Some(runner) = R::upgrade(&health.runner)
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
async fn watch_health<R: WatchedRunner>(
    health: Arc<HealthMonitor<R>>,
    mut tracker: HealthTracker,
    mut ended: watch::Receiver<Option<WatcherEnd>>,
) {
    let origin = Instant::now();
    let mut checks = health.book.subscribe();
    let Some(mut states) = R::upgrade(&health.runner).map(|r| r.subscribe()) else { return };
    let mut last_look = false;
    loop {
        if *ended.borrow() == Some(WatcherEnd::Abandon) {
            return;
        }
        let Some(runner) = R::upgrade(&health.runner) else { return };
        let wake_at = match look(&runner, &health.book, &mut tracker, origin.elapsed()) {
            Progress::Judged(verdict) => {
                // Boxed: the watcher's future, held while the allocation is judged, keeps
                // only what waiting takes.
                Box::pin(judge(&health, &runner, verdict)).await;
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
fn look<R: WatchedRunner>(
    runner: &R,
    book: &CheckBook,
    tracker: &mut HealthTracker,
    now: Duration,
) -> Progress {
    let state = runner.state();
    let stopping = runner.stopping();
    let names = runner.tasks();
    let tasks = names
        .iter()
        .filter_map(|(name, stage)| {
            let task_state = state.task_states.get(name)?;
            Some(TaskView { name, stage: *stage, state: task_state })
        })
        .collect();
    let snapshot = Snapshot {
        stopping,
        failed: matches!(state.client_status, ClientStatus::Failed | ClientStatus::Lost),
        tasks,
        checks: book.views(),
    };
    tracker.observe(&snapshot, now)
}

/// Records `verdict` in the deployment status; an unhealthy one also on the tasks that caused
/// it.
async fn judge<R: WatchedRunner>(health: &HealthMonitor<R>, runner: &R, verdict: Verdict) {
    if runner.state().deployment_status.is_some_and(|d| d.healthy.is_some()) {
        // Set meanwhile by someone else (an operator): theirs stands.
        return;
    }
    match verdict {
        Verdict::Healthy => {
            tracing::info!(alloc_id = %health.alloc_id, "allocation is healthy");
            runner.record_health(true, None).await;
        }
        Verdict::Unhealthy { reason, task_events } => {
            tracing::warn!(alloc_id = %health.alloc_id, %reason, "allocation is unhealthy");
            for (task, _) in runner.tasks() {
                if let Some(message) = task_events.get(&task) {
                    let kind = TaskEventKind::AllocUnhealthy { message: message.clone() };
                    runner.emit_event(&task, TaskEvent::new(health.clock.now(), kind)).await;
                }
            }
            runner.record_health(false, Some(reason)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::path::Path;
    use std::sync::Weak;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use wharf_health::fake::{Answer, FakeTransport};
    use wharf_state::{CheckStatus, DeploymentStatus, TaskState, TaskStatus, Timestamp, spec};
    use wharf_task::TokioClock;
    use wharf_task::hooks::TaskDirs;

    /// Longer than any test waits on the paused clock.
    const LIMIT: Duration = Duration::from_secs(24 * 3600);
    const UPDATE: &str = "[group.update]\nmin_healthy_time = \"10s\"\nhealthy_deadline = \"1m\"\n";
    const PORT: u16 = 20_001;

    /// An alloc runner as the health hooks see it: state the test sets, and a log of what the
    /// hooks did to it.
    #[derive(Debug)]
    struct FakeRunner {
        alloc: Mutex<Allocation>,
        state: watch::Sender<AllocState>,
        /// How many times a watcher looked at the tasks.
        looks: watch::Sender<usize>,
        recorded: Mutex<Vec<(bool, Option<String>)>>,
        cleared: AtomicUsize,
        events: Mutex<Vec<(String, TaskEventKind)>>,
        execs: Mutex<Vec<(String, Vec<String>)>>,
        restarts: Mutex<Vec<(String, String)>>,
        restarted: tokio::sync::Notify,
    }

    #[derive(Debug, Clone)]
    struct Fake(Arc<FakeRunner>);

    #[async_trait::async_trait]
    impl WatchedRunner for Fake {
        type Weak = Weak<FakeRunner>;

        fn upgrade(weak: &Weak<FakeRunner>) -> Option<Fake> {
            weak.upgrade().map(Fake)
        }

        fn state(&self) -> AllocState {
            self.0.state.borrow().clone()
        }

        fn subscribe(&self) -> watch::Receiver<AllocState> {
            self.0.state.subscribe()
        }

        fn stopping(&self) -> bool {
            self.0.alloc.lock().server_terminal()
        }

        fn tasks(&self) -> Vec<(String, Stage)> {
            self.0.looks.send_modify(|looks| *looks += 1);
            let alloc = self.0.alloc.lock();
            alloc.group().unwrap().tasks.iter().map(|t| (t.name.clone(), t.stage())).collect()
        }

        async fn record_health(&self, healthy: bool, description: Option<String>) {
            self.0.recorded.lock().push((healthy, description.clone()));
            self.0.state.send_modify(|state| {
                let status = state.deployment_status.get_or_insert_with(Default::default);
                status.healthy = Some(healthy);
                status.description = description;
            });
        }

        async fn clear_health(&self) {
            self.0.cleared.fetch_add(1, Ordering::SeqCst);
            self.0.state.send_modify(|state| {
                if let Some(status) = &mut state.deployment_status {
                    status.healthy = None;
                    status.description = None;
                }
            });
        }

        async fn emit_event(&self, task: &str, event: TaskEvent) {
            self.0.events.lock().push((task.to_owned(), event.kind));
        }

        async fn exec(
            &self,
            task: &str,
            command: &[String],
            _timeout: Duration,
        ) -> Result<ExecResult, AllocError> {
            self.0.execs.lock().push((task.to_owned(), command.to_vec()));
            Ok(ExecResult {
                stdout: b"broken".to_vec(),
                stderr: Vec::new(),
                exit: ExitResult::code(2),
            })
        }

        async fn restart_failed(&self, task: &str, reason: &str) -> Result<(), AllocError> {
            self.0.restarts.lock().push((task.to_owned(), reason.to_owned()));
            self.0.restarted.notify_one();
            Ok(())
        }
    }

    /// One task `web` holding port `http`, in a job of `job_type` with `group_extra` in its
    /// group and `task_extra` in the task.
    fn alloc(job_type: &str, group_extra: &str, task_extra: &str) -> Allocation {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"{job_type}\"\n[group]\nname = \"g\"\n\
             [group.network.port.http]\n{group_extra}\n\
             [[group.task]]\nname = \"web\"\ndriver = \"mock\"\n{task_extra}"
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        let mut alloc = Allocation::new("a1", job, "g");
        alloc.ports = vec![AllocatedPort {
            label: "http".into(),
            value: PORT,
            host_ip: [127, 0, 0, 1].into(),
        }];
        alloc
    }

    /// A service `web` on port `http` with tags `tags` and an http check.
    fn service(tags: &str) -> String {
        format!(
            "[[group.task.service]]\nname = \"web\"\nport = \"http\"\ntags = [\"{tags}\"]\n\
             [[group.task.service.check]]\nname = \"alive\"\ntype = \"http\"\npath = \"/health\"\n\
             interval = \"1s\"\ntimeout = \"1s\"\n"
        )
    }

    /// The hooks of one allocation on a fake runner.
    struct Setup {
        runner: Fake,
        monitor: Arc<HealthMonitor<Fake>>,
        catalog: Arc<ServiceCatalog>,
        net: Arc<FakeTransport>,
    }

    impl Setup {
        fn new(alloc: Allocation) -> Setup {
            let catalog = Arc::new(ServiceCatalog::new());
            let net = Arc::new(FakeTransport::new());
            let names = alloc.group().unwrap().tasks.iter().map(|t| t.name.clone());
            let runner = Fake(Arc::new(FakeRunner {
                state: watch::channel(AllocState::pending(names)).0,
                alloc: Mutex::new(alloc.clone()),
                looks: watch::channel(0).0,
                recorded: Mutex::new(Vec::new()),
                cleared: AtomicUsize::new(0),
                events: Mutex::new(Vec::new()),
                execs: Mutex::new(Vec::new()),
                restarts: Mutex::new(Vec::new()),
                restarted: tokio::sync::Notify::new(),
            }));
            let config = HealthConfig { catalog: catalog.clone(), transport: net.clone() };
            let clock = Arc::new(TokioClock::starting_at(Timestamp(1_000_000)));
            let monitor = HealthMonitor::new(&alloc, config, Arc::downgrade(&runner.0), clock);
            Setup { runner, monitor, catalog, net }
        }

        fn alloc(&self) -> Allocation {
            self.runner.0.alloc.lock().clone()
        }

        fn health_hook(&self) -> HealthHook<Fake> {
            HealthHook(self.monitor.clone())
        }

        fn service_hook(&self) -> ServiceHook<Fake> {
            ServiceHook(self.monitor.clone())
        }

        async fn prerun(&self) {
            let alloc = self.alloc();
            self.health_hook().prerun(ctx(&alloc)).await.unwrap();
        }

        async fn update(&self, alloc: Allocation) {
            *self.runner.0.alloc.lock() = alloc.clone();
            self.health_hook().update(ctx(&alloc)).await.unwrap();
        }

        async fn postrun(&self) {
            let alloc = self.alloc();
            self.health_hook().postrun(ctx(&alloc)).await.unwrap();
        }

        /// Sets task `web`'s state; watchers are told only if `notify`.
        fn set_web(&self, status: TaskStatus, failed: bool, notify: bool) {
            self.runner.0.state.send_if_modified(|state| {
                state
                    .task_states
                    .insert("web".into(), TaskState { status, failed, ..TaskState::new() });
                notify
            });
        }

        fn recorded(&self) -> Vec<(bool, Option<String>)> {
            self.runner.0.recorded.lock().clone()
        }

        /// Waits until the watcher has looked at the allocation once, and so waits for a
        /// change (on this single-threaded runtime, it runs on to its wait before the test
        /// runs again).
        async fn first_look(&self) {
            let mut looks = self.runner.0.looks.subscribe();
            let looked = looks.wait_for(|looks| *looks > 0);
            tokio::time::timeout(LIMIT, looked).await.expect("never looked").unwrap();
        }

        /// The watcher running now, if any.
        fn watcher(&self) -> Option<tokio::task::Id> {
            match &self.monitor.watching.lock().state {
                WatchState::Begun(Some(watcher)) => Some(watcher.done.id()),
                _ => None,
            }
        }

        /// Waits for a verdict; returns how long it took on the paused clock.
        async fn verdict(&self) -> (bool, Option<String>, Duration) {
            let started = Instant::now();
            let mut state = self.runner.0.state.subscribe();
            let judged = state
                .wait_for(|s| s.deployment_status.as_ref().is_some_and(|d| d.healthy.is_some()));
            tokio::time::timeout(LIMIT, judged).await.expect("never judged").unwrap();
            let (healthy, reason) = self.recorded().pop().unwrap();
            (healthy, reason, started.elapsed())
        }

        /// Calls `phase` of the service hook for task `web` of the allocation as it is now.
        async fn service_phase(&self, phase: &str) {
            let alloc = self.alloc();
            let task = alloc.group().unwrap().tasks[0].clone();
            let dirs = TaskDirs::new(Path::new("/nonexistent/a1"), "web");
            let env = BTreeMap::new();
            let ctx = HookContext { alloc: &alloc, task: &task, dirs: &dirs, env: &env };
            let hook = self.service_hook();
            match phase {
                "poststart" => hook.poststart(ctx).await.unwrap(),
                "update" => hook.update(ctx).await,
                "exited" => hook.exited(ctx, &ExitResult::code(0)).await,
                "shutdown" => hook.shutdown(ctx).await,
                other => panic!("no phase {other}"),
            }
        }

        /// Waits until the task's check has a result other than pending.
        async fn check_ran(&self) -> CheckStatus {
            let mut runs = self.monitor.book.subscribe();
            let ran = runs.wait_for(|runs| *runs > 0);
            tokio::time::timeout(LIMIT, ran).await.expect("the check never ran").unwrap();
            self.monitor.book.states()[0].status
        }
    }

    fn ctx(alloc: &Allocation) -> AllocHookContext<'_> {
        AllocHookContext { alloc, alloc_root: Path::new("/nonexistent/a1") }
    }

    /// `TestHealthHook_SetHealth_healthy` at the hook: a running task with no checks is
    /// healthy once it has run for min_healthy_time, with no event.
    #[tokio::test(start_paused = true)]
    async fn a_running_allocation_is_healthy_after_min_healthy_time() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        s.set_web(TaskStatus::Running, false, true);
        s.prerun().await;
        assert_eq!(s.verdict().await, (true, None, Duration::from_secs(10)));
        assert!(s.runner.0.events.lock().is_empty());
        assert_eq!(s.recorded().len(), 1, "judged once");
    }

    /// `TestHealthHook_SetHealth_unhealthy` at the hook: a task not running by the deadline
    /// makes the allocation unhealthy then, with the reason and an event on that task.
    #[tokio::test(start_paused = true)]
    async fn a_task_not_running_by_the_deadline_is_unhealthy_with_an_event_on_it() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        s.prerun().await;
        let message = "Task not running by healthy_deadline of 1m0s";
        let reason =
            format!("not healthy by its healthy_deadline of 1m0s; task \"web\": {message}");
        assert_eq!(s.verdict().await, (false, Some(reason), Duration::from_secs(60)));
        assert_eq!(
            *s.runner.0.events.lock(),
            [("web".to_owned(), TaskEventKind::AllocUnhealthy { message: message.into() })]
        );
    }

    /// An allocation whose health is set (restored after an agent restart) is not watched;
    /// nor are batch jobs, or `health_check = "manual"`.
    #[tokio::test(start_paused = true)]
    async fn which_allocations_are_watched() {
        let manual = "[group.update]\nhealth_check = \"manual\"\n";
        for (job_type, group, judged_before, watched) in [
            ("service", UPDATE, false, true),
            ("service", UPDATE, true, false),
            ("batch", UPDATE, false, false),
            ("service", manual, false, false),
        ] {
            let s = Setup::new(alloc(job_type, group, ""));
            if judged_before {
                s.runner.0.state.send_modify(|state| {
                    state.deployment_status =
                        Some(DeploymentStatus { healthy: Some(true), ..Default::default() });
                });
            }
            s.prerun().await;
            assert_eq!(s.watcher().is_some(), watched, "{job_type} {group} {judged_before}");
        }
    }

    /// Nomad's `ranOnce`: a prerun after an update starts no second watcher; an update after
    /// prerun replaces the watcher, and the allocation is still judged once.
    #[tokio::test(start_paused = true)]
    async fn prerun_and_update_begin_the_watch_once() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        s.update(s.alloc()).await;
        let by_update = s.watcher();
        assert!(by_update.is_some());
        s.prerun().await;
        assert_eq!(s.watcher(), by_update, "prerun after an update");

        let s = Setup::new(alloc("service", UPDATE, ""));
        s.set_web(TaskStatus::Running, false, true);
        s.prerun().await;
        let by_prerun = s.watcher();
        s.update(s.alloc()).await;
        assert!(s.watcher().is_some() && s.watcher() != by_prerun, "the update starts over");
        assert_eq!(s.verdict().await, (true, None, Duration::from_secs(10)));
        assert_eq!(s.recorded().len(), 1, "the abandoned watcher never judges");
    }

    /// When the run ends, the watcher takes a last look and records a verdict the allocation
    /// has earned by then (a task that failed), even with no change to wake it.
    #[tokio::test(start_paused = true)]
    async fn the_last_look_records_a_verdict_earned_by_then() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        s.set_web(TaskStatus::Running, false, true);
        s.prerun().await;
        s.first_look().await;
        s.set_web(TaskStatus::Dead, true, false);
        s.postrun().await;
        let (healthy, _, took) = s.verdict().await;
        assert_eq!((healthy, took), (false, Duration::ZERO));
    }

    /// An update abandons the watcher at once, with no verdict: one that would judge the
    /// allocation is not left to do so once the update decides nobody judges it any more.
    #[tokio::test(start_paused = true)]
    async fn an_update_abandons_the_watcher_without_a_verdict() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        s.set_web(TaskStatus::Running, false, true);
        s.prerun().await;
        s.first_look().await;
        s.set_web(TaskStatus::Dead, true, false);
        s.update(alloc("service", "[group.update]\nhealth_check = \"manual\"\n", "")).await;
        assert_eq!(s.watcher(), None, "nobody judges the allocation now");
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(s.recorded(), [], "no verdict");
    }

    /// Nomad's `ClearHealth`: an update to another deployment clears the health the old one
    /// was given and judges the new one; an update within the deployment keeps it.
    #[tokio::test(start_paused = true)]
    async fn a_new_deployment_clears_the_health_and_is_judged_again() {
        let mut first = alloc("service", UPDATE, "");
        first.deployment_id = Some("d1".into());
        let s = Setup::new(first.clone());
        s.set_web(TaskStatus::Running, false, true);
        s.prerun().await;
        assert!(s.verdict().await.0);
        s.update(first.clone()).await;
        assert_eq!(s.runner.0.cleared.load(Ordering::SeqCst), 0, "same deployment");
        assert_eq!(s.watcher(), None, "judged already: no watcher");

        let mut second = first;
        second.deployment_id = Some("d2".into());
        s.update(second).await;
        assert_eq!(s.runner.0.cleared.load(Ordering::SeqCst), 1);
        assert!(s.watcher().is_some(), "the new deployment is watched");
        assert_eq!(s.verdict().await, (true, None, Duration::from_secs(10)));
    }

    /// Once the run is over (or the agent leaves), neither prerun nor an update starts a
    /// watcher.
    #[tokio::test(start_paused = true)]
    async fn a_closed_watch_starts_no_watcher() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        s.postrun().await;
        s.prerun().await;
        s.update(s.alloc()).await;
        assert!(matches!(s.monitor.watching.lock().state, WatchState::Closed));
    }

    /// The hooks hold the runner weakly: a runner that is gone is not watched, and checks
    /// that reach for it are told so.
    #[tokio::test(start_paused = true)]
    async fn a_runner_that_is_gone_is_not_watched() {
        let s = Setup::new(alloc("service", UPDATE, ""));
        let weak = Arc::downgrade(&s.runner.0);
        let alloc = s.alloc();
        let Setup { runner, monitor, .. } = s;
        drop(runner);
        assert!(weak.upgrade().is_none(), "the hooks keep no runner alive");
        HealthHook(monitor.clone()).prerun(ctx(&alloc)).await.unwrap();
        let control = RunnerControl::<Fake>(weak);
        let exec = control.exec("web", &["/bin/check".into()], Duration::from_secs(1)).await;
        assert_eq!(exec.unwrap_err(), "the allocation is gone");
        let restart = control.restart("web", "check").await;
        assert_eq!(restart.unwrap_err(), "the allocation is gone");
    }

    /// A task's services are in the catalog and its checks run from poststart until it
    /// exits; then its results go back to pending.
    #[tokio::test(start_paused = true)]
    async fn services_are_listed_while_the_task_runs() {
        let s = Setup::new(alloc("service", UPDATE, &service("v1")));
        s.net.answer(SocketAddr::from(([127, 0, 0, 1], PORT)), Answer::Status(200));
        s.service_phase("poststart").await;
        assert_eq!(s.catalog.list().len(), 1);
        assert_eq!(s.check_ran().await, CheckStatus::Passing);
        s.service_phase("exited").await;
        assert!(s.catalog.is_empty());
        assert_eq!(s.monitor.book.states()[0].status, CheckStatus::Pending);
    }

    /// The agent leaving takes the services out of the catalog but keeps the results: the
    /// task runs on.
    #[tokio::test(start_paused = true)]
    async fn shutdown_keeps_the_check_results() {
        let s = Setup::new(alloc("service", UPDATE, &service("v1")));
        s.net.answer(SocketAddr::from(([127, 0, 0, 1], PORT)), Answer::Status(200));
        s.service_phase("poststart").await;
        assert_eq!(s.check_ran().await, CheckStatus::Passing);
        s.service_phase("shutdown").await;
        assert!(s.catalog.is_empty());
        assert_eq!(s.monitor.book.states()[0].status, CheckStatus::Passing);
    }

    /// An update puts a running task's changed services in place; a task that is not running
    /// gets nothing registered by an update.
    #[tokio::test(start_paused = true)]
    async fn an_update_puts_changed_services_in_place() {
        let s = Setup::new(alloc("service", UPDATE, &service("v1")));
        s.service_phase("update").await;
        assert!(s.catalog.is_empty(), "not running: nothing to update");
        s.service_phase("poststart").await;
        *s.runner.0.alloc.lock() = alloc("service", UPDATE, &service("v2"));
        s.service_phase("update").await;
        let listed = s.catalog.list();
        assert_eq!((listed.len(), listed[0].tags.clone()), (1, vec!["v2".to_owned()]));
    }

    /// Script checks run through the runner's exec, and check_restart restarts the task
    /// through the runner, as a failure naming the check.
    #[tokio::test(start_paused = true)]
    async fn script_checks_and_check_restart_go_through_the_runner() {
        let task = "[[group.task.service]]\nname = \"web\"\n\
            [[group.task.service.check]]\nname = \"script\"\ntype = \"script\"\n\
            command = \"/bin/check\"\ninterval = \"1s\"\ntimeout = \"1s\"\n\
            check_restart = { limit = 1 }\n";
        let s = Setup::new(alloc("service", UPDATE, task));
        s.service_phase("poststart").await;
        assert_eq!(s.check_ran().await, CheckStatus::Critical);
        let restarted = s.runner.0.restarted.notified();
        tokio::time::timeout(LIMIT, restarted).await.expect("never restarted");
        assert_eq!(s.runner.0.execs.lock()[0], ("web".to_owned(), vec!["/bin/check".to_owned()]));
        assert_eq!(
            s.runner.0.restarts.lock()[0],
            ("web".to_owned(), "healthcheck: check \"script\" unhealthy".to_owned())
        );
    }
}
