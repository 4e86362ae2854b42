//! The alloc runner: an allocation's tasks, started in lifecycle order and watched together.
//!
//! [`AllocRunner::run`] runs the prerun hooks, every task runner, and the postrun hooks. Beside
//! it, two loops live as long as the run: one reacts to task state changes (kill decisions,
//! lifecycle gates, the allocation's status for its watchers), one applies updates. Task
//! runners report changes through one shared, coalescing notification, so a burst of events
//! costs one pass.
//!
//! Reacting to task states (poststop tasks take no part): a failed task kills the others
//! (`SiblingFailed`); a dead leader kills the others (`LeaderDead`); when only sidecars are left
//! they are killed (`MainTasksDead`). Kill order: prekill hooks, the leader alone, the other
//! main and ephemeral tasks together, then the sidecars; poststop tasks are never killed and run
//! once everything else is dead.
//!
//! The runner's own life (pending, running, killing, ending, dead, shutting down, destroying)
//! is one [`AllocRunnerState`], changed only through its transition table in
//! [`crate::lifecycle`]; run, kill, shutdown, destroy and allocation-wide restarts all go
//! through it.
//!
//! Alloc hooks run through [`crate::hooks`]' one loop, each phase with its policy (the table
//! there). The health hooks see this runner only as their `WatchedRunner`, which it
//! implements at the end of this file.
//!
//! Every wait here ends: task runners bound their own kills, and destroy bounds how long it
//! lets poststop tasks run before killing them too.

use crate::coordinator::{Coordinator, LifecyclePhase};
use crate::error::AllocError;
use crate::health_hooks::{HealthConfig, HealthHook, HealthMonitor, ServiceHook, WatchedRunner};
use crate::hooks::{self, AllocDirHook, AllocHook, AllocHookContext, AllocHookPhase};
use crate::lifecycle::{AllocRunnerAction, AllocRunnerEvent, AllocRunnerState};
use crate::max_run;
use crate::readiness::{self, Readiness};
use crate::spare_dirs::SpareDirs;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use wharf_driver::{
    Capabilities, DriverRegistry, ExecResult, LogFrom, LogReader, LogStream, ResourceUsage,
};
use wharf_state::spec::Stage;
use wharf_state::{
    AllocState, Allocation, CheckState, ClientStatus, DeploymentStatus, Signal, TaskEvent,
    TaskEventKind, TaskState, TaskStatus,
};
use wharf_store::{StateStore, StoredAlloc};
use wharf_task::events::DEFAULT_EVENT_BUFFER;
use wharf_task::{
    DEFAULT_MAX_KILL_TIMEOUT, EventStream, LogLimits, RecordedEvent, SystemClock, TaskError,
    TaskHook, TaskRunner, TaskRunnerConfig, TemplateSources, WallClock, Watched,
};

/// How long destroy lets poststop tasks run before killing them.
pub const DEFAULT_POSTSTOP_TIMEOUT: Duration = Duration::from_secs(300);

/// Everything an [`AllocRunner`] is built from: [`AllocRunnerConfig::new`] takes what has no
/// default, the `with_` methods change the rest.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AllocRunnerConfig {
    /// The allocation.
    pub alloc: Allocation,
    /// The node's drivers; each task's must be here. Default: none.
    pub drivers: DriverRegistry,
    /// Where state is persisted.
    pub store: Arc<dyn StateStore>,
    /// Where event timestamps come from. Default: the system's clock.
    pub clock: Arc<dyn WallClock>,
    /// The allocation's directory: `<data dir>/allocs/<alloc id>`.
    pub alloc_root: PathBuf,
    /// Alloc hooks run after the built-in alloc dir hook. Default: none.
    pub hooks: Vec<Arc<dyn AllocHook>>,
    /// Task hooks given to every task runner. Default: none.
    pub task_hooks: Vec<Arc<dyn TaskHook>>,
    /// The node-wide cap on `kill_timeout`. Default: [`DEFAULT_MAX_KILL_TIMEOUT`].
    pub max_kill_timeout: Duration,
    /// Log rotation limits for every task. Default: 10 files of 10 MiB per stream.
    pub logs: LogLimits,
    /// How long destroy lets poststop tasks run before killing them. Default:
    /// [`DEFAULT_POSTSTOP_TIMEOUT`].
    pub poststop_timeout: Duration,
    /// Ready-made directories for the alloc dir hook, if the node keeps them. Default: none.
    pub spare_dirs: Option<Arc<SpareDirs>>,
    /// How many events [`AllocRunner::events`] buffers for its slowest listener. Default:
    /// [`DEFAULT_EVENT_BUFFER`].
    pub event_buffer: usize,
    /// The node's service catalog and how checks reach the network. Default: a catalog of
    /// the runner's own and real TCP connections.
    pub health: HealthConfig,
    /// What the tasks' templates read (services, variables). Default: empty sources.
    pub template_sources: Option<Arc<dyn TemplateSources>>,
    /// The node's host volumes, by name, for the tasks' `volume_mount`s. Default: none.
    pub host_volumes: Arc<BTreeMap<String, wharf_state::volume::HostVolume>>,
}

impl AllocRunnerConfig {
    /// A runner of `alloc` persisting through `store`, in the directory `alloc_root`, with
    /// defaults for the rest. Add the drivers its tasks name with
    /// [`with_driver`](AllocRunnerConfig::with_driver).
    pub fn new(
        alloc: Allocation,
        store: Arc<dyn StateStore>,
        alloc_root: impl Into<PathBuf>,
    ) -> AllocRunnerConfig {
        AllocRunnerConfig {
            alloc,
            drivers: DriverRegistry::new(),
            store,
            clock: Arc::new(SystemClock),
            alloc_root: alloc_root.into(),
            hooks: Vec::new(),
            task_hooks: Vec::new(),
            max_kill_timeout: DEFAULT_MAX_KILL_TIMEOUT,
            logs: LogLimits::default(),
            poststop_timeout: DEFAULT_POSTSTOP_TIMEOUT,
            spare_dirs: None,
            event_buffer: DEFAULT_EVENT_BUFFER,
            health: HealthConfig::default(),
            template_sources: None,
            host_volumes: Arc::default(),
        }
    }

    /// Resolves the tasks' volume mounts against the node's `volumes`.
    pub fn with_host_volumes(
        mut self,
        volumes: Arc<BTreeMap<String, wharf_state::volume::HostVolume>>,
    ) -> AllocRunnerConfig {
        self.host_volumes = volumes;
        self
    }

    /// Adds a driver, under its [`Driver::name`](wharf_driver::Driver::name).
    pub fn with_driver(mut self, driver: Arc<dyn wharf_driver::Driver>) -> AllocRunnerConfig {
        self.drivers.register(driver);
        self
    }

    /// Uses the node's drivers.
    pub fn with_drivers(mut self, drivers: DriverRegistry) -> AllocRunnerConfig {
        self.drivers = drivers;
        self
    }

    /// Takes event timestamps from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn WallClock>) -> AllocRunnerConfig {
        self.clock = clock;
        self
    }

    /// Adds an alloc hook, run after the built-in one and those added before.
    pub fn with_hook(mut self, hook: Arc<dyn AllocHook>) -> AllocRunnerConfig {
        self.hooks.push(hook);
        self
    }

    /// Adds a task hook, given to every task runner.
    pub fn with_task_hook(mut self, hook: Arc<dyn TaskHook>) -> AllocRunnerConfig {
        self.task_hooks.push(hook);
        self
    }

    /// Caps every task's `kill_timeout`.
    pub fn with_max_kill_timeout(mut self, max: Duration) -> AllocRunnerConfig {
        self.max_kill_timeout = max;
        self
    }

    /// Sets the log rotation limits of every task.
    pub fn with_logs(mut self, logs: LogLimits) -> AllocRunnerConfig {
        self.logs = logs;
        self
    }

    /// Lets poststop tasks run this long during a destroy before they are killed.
    pub fn with_poststop_timeout(mut self, timeout: Duration) -> AllocRunnerConfig {
        self.poststop_timeout = timeout;
        self
    }

    /// Takes the allocation's directories from `spares` when it has them ready.
    pub fn with_spare_dirs(mut self, spares: Arc<SpareDirs>) -> AllocRunnerConfig {
        self.spare_dirs = Some(spares);
        self
    }

    /// Buffers this many events for the slowest listener of [`AllocRunner::events`].
    pub fn with_event_buffer(mut self, events: usize) -> AllocRunnerConfig {
        self.event_buffer = events;
        self
    }

    /// Lists the allocation's services in `health`'s catalog and reaches them through its
    /// transport.
    pub fn with_health(mut self, health: HealthConfig) -> AllocRunnerConfig {
        self.health = health;
        self
    }
}

/// Resource usage of an allocation's running tasks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocUsage {
    /// Each running task's usage.
    pub tasks: BTreeMap<String, ResourceUsage>,
    /// Their sum.
    pub total: ResourceUsage,
}

/// Runs one allocation. Cheap to clone; clones control the same runner.
#[derive(Debug, Clone)]
pub struct AllocRunner {
    shared: Arc<Shared>,
}

/// The allocation as applied, and which version of it the store holds. Every change the
/// runner applies is a new generation, written by the next persist: an update whose modify
/// index did not change is written all the same.
#[derive(Debug)]
struct Record {
    /// Shared with the task runners, which hold the version last applied to them.
    alloc: Arc<Allocation>,
    generation: u64,
    persisted: Option<u64>,
}

#[derive(Debug)]
struct Shared {
    id: String,
    record: Mutex<Record>,
    tasks: Vec<TaskRunner>,
    store: Arc<dyn StateStore>,
    clock: Arc<dyn WallClock>,
    alloc_root: PathBuf,
    hooks: Vec<Arc<dyn AllocHook>>,
    poststop_timeout: Duration,
    state_changed: Arc<Notify>,
    /// Every event the task runners record, in order.
    events: EventStream,
    state: watch::Sender<AllocState>,
    /// The runner's own lifecycle; changed only through [`AllocRunner::step`].
    lifecycle: watch::Sender<AllocRunnerState>,
    coordinator: Mutex<Coordinator>,
    /// Which tasks are done waiting for others' checks (`wait_healthy`).
    readiness: Readiness,
    deployment: Mutex<Option<DeploymentStatus>>,
    /// The deployment status last written to the store, so an unchanged one is not rewritten.
    persisted_deployment: Mutex<Option<DeploymentStatus>>,
    forced: Mutex<Option<(ClientStatus, String)>>,
    queued_update: Mutex<Option<Allocation>>,
    update_ready: Notify,
    /// Notified when an update was applied, for the wait on `max_run_duration`.
    update_applied: Notify,
    /// Raised once every task runner has finished, so the loops beside the run wind down.
    runners_finished: Watched<bool>,
    /// Held while deleting the allocation's records and while persisting it, so a persist
    /// never brings back a destroyed allocation.
    records: tokio::sync::Mutex<()>,
    /// Services, checks and allocation health (the health hooks).
    health: Arc<HealthMonitor<AllocRunner>>,
}

/// A reference to an alloc runner that does not keep it alive, for its own health hooks.
#[derive(Debug, Clone)]
pub(crate) struct WeakRunner(Weak<Shared>);

impl AllocRunner {
    /// Builds the runner and its task runners without running anything. Fails if the group is
    /// missing from the job or a task names a driver the node does not have.
    pub fn new(config: AllocRunnerConfig) -> Result<AllocRunner, AllocError> {
        let alloc = Arc::new(config.alloc);
        let group = alloc.group()?;
        let mut drivers = Vec::with_capacity(group.tasks.len());
        for task in &group.tasks {
            let driver = config.drivers.get(&task.driver).cloned().ok_or_else(|| {
                AllocError::UnknownDriver {
                    task: task.name.clone(),
                    driver: task.driver.clone(),
                    available: config.drivers.names().collect::<Vec<_>>().join(", "),
                }
            })?;
            drivers.push(driver);
        }
        // The health hooks reach the runner they belong to through a weak reference.
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            let runner = WeakRunner(weak.clone());
            let health = HealthMonitor::new(&alloc, config.health, runner, config.clock.clone());
            let state_changed = Arc::new(Notify::new());
            let events = EventStream::new(config.event_buffer);
            let mut task_hooks = config.task_hooks;
            task_hooks.push(Arc::new(ServiceHook(health.clone())));
            let tasks = group
                .tasks
                .iter()
                .zip(drivers)
                .map(|(task, driver)| {
                    let mut task_config = TaskRunnerConfig::new(
                        alloc.clone(),
                        task.clone(),
                        driver,
                        config.store.clone(),
                        config.alloc_root.clone(),
                    )
                    .with_clock(config.clock.clone())
                    .with_max_kill_timeout(config.max_kill_timeout)
                    .with_logs(config.logs)
                    .with_state_changed(state_changed.clone())
                    .with_events(events.clone())
                    .with_host_volumes(config.host_volumes.clone());
                    task_config.hooks = task_hooks.clone();
                    if let Some(sources) = &config.template_sources {
                        task_config = task_config.with_template_sources(sources.clone());
                    }
                    TaskRunner::new(task_config)
                })
                .collect();
            let mut hooks: Vec<Arc<dyn AllocHook>> = vec![
                Arc::new(AllocDirHook::new(config.spare_dirs)),
                Arc::new(HealthHook(health.clone())),
            ];
            hooks.extend(config.hooks);
            let initial = AllocState::pending(group.tasks.iter().map(|t| t.name.clone()));
            Shared {
                id: alloc.id.clone(),
                record: Mutex::new(Record { alloc: alloc.clone(), generation: 0, persisted: None }),
                tasks,
                store: config.store,
                clock: config.clock,
                alloc_root: config.alloc_root,
                hooks,
                poststop_timeout: config.poststop_timeout,
                state_changed,
                events,
                state: watch::channel(initial).0,
                lifecycle: watch::channel(AllocRunnerState::Pending).0,
                coordinator: Mutex::new(Coordinator::new()),
                readiness: Readiness::default(),
                deployment: Mutex::new(None),
                persisted_deployment: Mutex::new(None),
                forced: Mutex::new(None),
                queued_update: Mutex::new(None),
                update_ready: Notify::new(),
                update_applied: Notify::new(),
                runners_finished: Watched::new(false),
                records: tokio::sync::Mutex::new(()),
                health,
            }
        });
        Ok(AllocRunner { shared })
    }

    /// The allocation's id.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The allocation as of the latest update.
    pub fn alloc(&self) -> Allocation {
        (*self.shared.record.lock().alloc).clone()
    }

    /// The allocation as of the latest update, shared rather than copied.
    fn current(&self) -> Arc<Allocation> {
        self.shared.record.lock().alloc.clone()
    }

    /// Reads the allocation as of the latest update without copying it.
    pub fn with_alloc<R>(&self, read: impl FnOnce(&Allocation) -> R) -> R {
        read(&self.shared.record.lock().alloc)
    }

    /// Applies `alloc` as the allocation; a change is a new generation for the next persist.
    fn set_alloc(&self, alloc: Arc<Allocation>) {
        let mut record = self.shared.record.lock();
        if record.alloc != alloc {
            record.alloc = alloc;
            record.generation += 1;
        }
    }

    /// The allocation's directory.
    pub fn alloc_root(&self) -> &std::path::Path {
        &self.shared.alloc_root
    }

    /// The task runners, in the group's order.
    pub fn tasks(&self) -> &[TaskRunner] {
        &self.shared.tasks
    }

    /// The latest state: client status, task states, deployment status.
    pub fn state(&self) -> AllocState {
        self.shared.state.borrow().clone()
    }

    /// A watcher of the allocation's state: it always sees the latest, and any number may
    /// watch.
    pub fn subscribe(&self) -> watch::Receiver<AllocState> {
        self.shared.state.subscribe()
    }

    /// A listener of every task event recorded from now on, in the order recorded, with the
    /// task it is about: none lost to the task states' ten-event rings. A listener that falls
    /// more than [`AllocRunnerConfig::event_buffer`] events behind gets
    /// [`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged) with how many it
    /// missed, then the oldest still buffered. The stream ends (`RecvError::Closed`) once the
    /// runner and its task runners are dropped.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<RecordedEvent> {
        self.shared.events.subscribe()
    }

    /// Where the runner's own life stands (see [`crate::lifecycle`]).
    pub fn lifecycle(&self) -> AllocRunnerState {
        *self.shared.lifecycle.borrow()
    }

    /// A watcher of [`AllocRunner::lifecycle`]: it always sees the latest.
    pub fn watch_lifecycle(&self) -> watch::Receiver<AllocRunnerState> {
        self.shared.lifecycle.subscribe()
    }

    /// Applies `event` to the lifecycle; returns the state it was in and what to do.
    fn step(&self, event: AllocRunnerEvent) -> (AllocRunnerState, AllocRunnerAction) {
        let mut step = (AllocRunnerState::Pending, AllocRunnerAction::Ignore);
        self.shared.lifecycle.send_if_modified(|state| {
            let (next, action) = state.on(event);
            step = (*state, action);
            let moved = next != *state;
            *state = next;
            moved
        });
        tracing::trace!(alloc_id = %self.shared.id, ?event, from = ?step.0, action = ?step.1, "lifecycle");
        step
    }

    /// Waits until the lifecycle satisfies `reached`.
    async fn until(&self, reached: impl Fn(AllocRunnerState) -> bool) {
        let mut lifecycle = self.shared.lifecycle.subscribe();
        let _ = lifecycle.wait_for(|state| reached(*state)).await;
    }

    /// Whether the run is over (or will never begin).
    pub fn is_done(&self) -> bool {
        self.lifecycle().run_over()
    }

    /// Waits until the run is over (or will never begin).
    pub async fn wait(&self) {
        self.until(AllocRunnerState::run_over).await;
    }

    /// Whether [`AllocRunner::destroy`] has completed.
    pub fn is_destroyed(&self) -> bool {
        self.lifecycle() == AllocRunnerState::Destroyed
    }

    /// Loads every task's persisted state and reattaches to running tasks; the deployment
    /// status comes back too. Call before [`AllocRunner::run`].
    ///
    /// An allocation whose directory is gone (ephemeral storage lost with a reboot) cannot run
    /// here again: whatever of it still runs is destroyed, every task is marked failed with an
    /// event that says so, and [`AllocError::AllocDirMissing`] is returned. The runner can still
    /// be run (it starts nothing) and destroyed, so the allocation stays visible until it is
    /// collected. Its directory is not made again.
    pub async fn restore(&self, stored: &StoredAlloc) -> Result<(), AllocError> {
        let s = &self.shared;
        *s.deployment.lock() = stored.deployment_status.clone();
        *s.persisted_deployment.lock() = stored.deployment_status.clone();
        {
            let mut record = s.record.lock();
            if *record.alloc == stored.alloc {
                record.persisted = Some(record.generation);
            }
        }
        for task in &s.tasks {
            task.restore(stored.tasks.get(task.name())).await?;
        }
        // One stat, on restore only.
        let missing = match s.alloc_root.try_exists() {
            Ok(true) => None,
            Ok(false) => Some(AllocError::AllocDirMissing { path: s.alloc_root.clone() }),
            Err(source) => Some(AllocError::Io { path: s.alloc_root.clone(), source }),
        };
        if let Some(error) = missing {
            for task in &s.tasks {
                let kind = TaskEventKind::FailedRestoring {
                    error: format!("{error}; the allocation cannot run on this node again"),
                };
                task.abandon(TaskEvent::new(s.clock.now(), kind)).await;
            }
            self.publish();
            return Err(error);
        }
        self.publish();
        Ok(())
    }

    /// Runs the allocation until every task has finished (or the agent shuts down). Returns at
    /// once if called again, or after destroy or shutdown.
    ///
    /// The run's future lives as long as the allocation runs, so it holds only what waiting
    /// takes: every step that does more (hooks, kills, reactions, updates) is boxed, and
    /// its state lives on the heap only while it runs.
    pub async fn run(&self) {
        if self.step(AllocRunnerEvent::Run).1 != AllocRunnerAction::StartRun {
            return;
        }
        Box::pin(self.persist_alloc()).await;
        tokio::join!(
            self.run_tasks(),
            self.watch_task_states(),
            self.handle_updates(),
            self.enforce_max_run_duration(),
            self.enforce_wait_deadlines()
        );
        self.publish();
        self.step(AllocRunnerEvent::RunOver);
    }

    async fn run_tasks(&self) {
        let s = &self.shared;
        Box::pin(self.before_tasks()).await;
        self.apply_gates();
        let mut running = JoinSet::new();
        for task in &s.tasks {
            let task = task.clone();
            running.spawn(async move { task.run().await });
        }
        while running.join_next().await.is_some() {}
        s.runners_finished.set(true);
        if !self.lifecycle().shutting_down() {
            Box::pin(self.run_hooks(AllocHookPhase::Postrun, &self.current())).await;
        }
    }

    /// Stops the allocation once it has run as long as its group's `max_run_duration` allows
    /// (as an update may have changed it): its tasks are killed with an event that says why,
    /// and its poststop tasks are skipped.
    async fn enforce_max_run_duration(&self) {
        let s = &self.shared;
        let origin = s.tasks.iter().filter_map(|t| t.state().started_at).min();
        let origin = origin.unwrap_or_else(|| s.clock.now());
        let limit =
            || self.with_alloc(|alloc| alloc.group().ok().and_then(|group| group.max_run_duration));
        let spent = max_run::spent(s.clock.as_ref(), origin, limit, &s.update_applied);
        let max_run_duration = tokio::select! {
            limit = spent => limit,
            _ = s.runners_finished.wait_for(|done| *done) => return,
        };
        Box::pin(self.max_run_duration_exceeded(max_run_duration)).await;
    }

    async fn max_run_duration_exceeded(&self, max_run_duration: Duration) {
        let s = &self.shared;
        tracing::info!(alloc_id = %s.id, "allocation exceeded max_run_duration; stopping it");
        let mut skipping = JoinSet::new();
        for task in s.tasks.iter().filter(|t| t.stage() == Stage::Poststop) {
            let task = task.clone();
            skipping.spawn(async move { task.kill(None).await });
        }
        while skipping.join_next().await.is_some() {}
        self.kill(Some(TaskEventKind::MaxRunDurationExceeded { max_run_duration })).await;
    }

    /// Opens the gates of tasks whose `wait_healthy` tasks pass their checks, as the checks
    /// change, and fails the allocation when a task has waited past its `wait_deadline`.
    async fn enforce_wait_deadlines(&self) {
        let s = &self.shared;
        if s.tasks
            .iter()
            .all(|t| t.task().wait_healthy.is_empty() && t.task().wait_ready.is_empty())
        {
            return;
        }
        let started = tokio::time::Instant::now();
        let mut checks_changed = s.health.book().subscribe();
        loop {
            self.apply_gates();
            let checks = self.checks();
            let states: Vec<TaskState> = s.tasks.iter().map(TaskRunner::state).collect();
            let notified =
                readiness::notified_ready(s.tasks.iter().map(TaskRunner::name).zip(&states));
            let tasks = s.tasks.iter().map(TaskRunner::task).zip(states.iter().cloned());
            let next = match s.readiness.deadline(tasks, &checks, &notified, started.elapsed()) {
                Ok(Some(next)) => next,
                Ok(None) => return,
                Err(overdue) => {
                    let reason = overdue.reason();
                    tracing::warn!(alloc_id = %s.id, task = %overdue.task, waited_for = %overdue.waited_for, "{reason}");
                    if let Ok(task) = self.task(&overdue.task) {
                        let kind = TaskEventKind::SetupFailure { error: reason };
                        task.mark_failed_dead(TaskEvent::new(s.clock.now(), kind)).await;
                    }
                    continue;
                }
            };
            tokio::select! {
                () = tokio::time::sleep(next) => {}
                changed = checks_changed.changed() => if changed.is_err() { return },
                _ = s.runners_finished.wait_for(|done| *done) => return,
            }
        }
    }

    /// What comes before the task runners start: the kill of a stopped allocation, or the
    /// prerun hooks.
    async fn before_tasks(&self) {
        let s = &self.shared;
        if self.with_alloc(Allocation::server_terminal) {
            // Stopped, perhaps while the agent was away with tasks still running: they are
            // killed in the usual order and poststop tasks run after them, unless nothing of
            // the allocation ever ran (then there is nothing to clean up after).
            let ran = s
                .tasks
                .iter()
                .any(|t| t.stage() != Stage::Poststop && t.state().started_at.is_some());
            if !ran {
                for task in s.tasks.iter().filter(|t| t.stage() == Stage::Poststop) {
                    task.kill(None).await;
                }
            }
            self.kill(None).await;
        } else if self.state().client_status.is_terminal() {
            // Ended before the agent restarted: nothing starts again; the task runners only
            // finish what their restore left.
        } else {
            self.run_hooks(AllocHookPhase::Prerun, &self.current()).await;
        }
    }

    /// Runs the alloc hooks of `phase` on `alloc`, as the phase's policy says (the table in
    /// [`crate::hooks`]). A failure that fails the allocation (a prerun hook's) marks every
    /// task failed, so that none starts.
    async fn run_hooks(&self, phase: AllocHookPhase, alloc: &Allocation) {
        let s = &self.shared;
        let ctx = AllocHookContext { alloc, alloc_root: &s.alloc_root };
        if let Err(error) = hooks::run_hooks(&s.hooks, phase, ctx, &s.id).await {
            tracing::error!(alloc_id = %s.id, %error, "{phase} failed");
            for task in &s.tasks {
                let kind = TaskEventKind::SetupFailure {
                    error: format!("failed to set up the allocation: {error}"),
                };
                task.mark_failed_dead(TaskEvent::new(s.clock.now(), kind)).await;
            }
        }
    }

    /// Reacts to task state changes until the run is done, then once more.
    async fn watch_task_states(&self) {
        let s = &self.shared;
        loop {
            let finished = tokio::select! {
                () = s.state_changed.notified() => false,
                _ = s.runners_finished.wait_for(|done| *done) => true,
            };
            Box::pin(self.react()).await;
            if finished {
                break;
            }
        }
    }

    /// One pass over the task states: kill decisions, gates, release of dead tasks, and the
    /// allocation's state for its watchers.
    async fn react(&self) {
        let s = &self.shared;
        let states: Vec<(TaskRunner, TaskState)> =
            s.tasks.iter().map(|t| (t.clone(), t.state())).collect();
        let members = || states.iter().filter(|(t, _)| t.stage() != Stage::Poststop);
        let mut kill_event = None;
        for (task, state) in members().filter(|(_, state)| state.status == TaskStatus::Dead) {
            if state.failed {
                if kill_event.is_none() {
                    kill_event =
                        Some(TaskEventKind::SiblingFailed { task: task.name().to_owned() });
                }
            } else if task.is_leader() {
                kill_event = Some(TaskEventKind::LeaderDead);
            }
        }
        let live: Vec<&TaskRunner> = members()
            .filter(|(_, state)| state.status != TaskStatus::Dead)
            .map(|(t, _)| t)
            .collect();
        if kill_event.is_none() && !live.is_empty() && live.iter().all(|t| t.stage().is_sidecar()) {
            kill_event = Some(TaskEventKind::MainTasksDead);
        }
        if let Some(kind) = kill_event
            && !live.is_empty()
        {
            tracing::debug!(alloc_id = %s.id, event = kind.title(), "killing the allocation's tasks");
            self.kill(Some(kind)).await;
        }

        self.apply_gates();

        let all_dead = s
            .tasks
            .iter()
            .filter(|t| t.stage() != Stage::Poststop)
            .all(|t| t.state().status == TaskStatus::Dead);
        if all_dead && self.step(AllocRunnerEvent::AllDead).1 == AllocRunnerAction::ReleaseDeadTasks
        {
            self.run_hooks(AllocHookPhase::Prekill, &self.current()).await;
            // Dead tasks wait for an allocation-wide restart until released.
            let mut releasing = JoinSet::new();
            for task in s.tasks.iter().filter(|t| t.stage() != Stage::Poststop) {
                let task = task.clone();
                releasing.spawn(async move { task.kill(None).await });
            }
            while releasing.join_next().await.is_some() {}
        }
        self.publish();
        self.persist_deployment().await;
    }

    fn apply_gates(&self) {
        let s = &self.shared;
        let states: Vec<(Stage, TaskState)> =
            s.tasks.iter().map(|t| (t.stage(), t.state())).collect();
        let checks = self.checks();
        let notified = readiness::notified_ready(
            s.tasks.iter().map(TaskRunner::name).zip(states.iter().map(|(_, state)| state)),
        );
        let mut coordinator = s.coordinator.lock();
        let phase = coordinator.update(states.iter().map(|(stage, state)| (*stage, state)));
        for (task, (_, state)) in s.tasks.iter().zip(&states) {
            let open = coordinator.gate_open(task.stage())
                && s.readiness.may_start(task.task(), state, &checks, &notified);
            task.set_start_gate(open);
        }
        tracing::trace!(alloc_id = %s.id, ?phase, "lifecycle gates applied");
    }

    /// The lifecycle phase the allocation is in.
    pub fn phase(&self) -> LifecyclePhase {
        self.shared.coordinator.lock().phase()
    }

    /// Recomputes the allocation's state and tells watchers if it changed.
    fn publish(&self) {
        let s = &self.shared;
        let alloc = self.current();
        let task_states: BTreeMap<String, TaskState> =
            s.tasks.iter().map(|t| (t.name().to_owned(), t.state())).collect();
        let mut state = AllocState {
            client_status: ClientStatus::Pending,
            client_description: "No tasks have started".into(),
            task_states,
            deployment_status: s.deployment.lock().clone(),
        };
        if let Some((status, description)) = s.forced.lock().clone() {
            state.client_status = status;
            state.client_description = description;
        }
        state.settle(alloc.deployment_id.is_some(), s.clock.now());
        *s.deployment.lock() = state.deployment_status.clone();
        s.state.send_if_modified(|current| {
            let changed = *current != state;
            if changed {
                *current = state;
            }
            changed
        });
    }

    /// Kills the tasks, once: a kill already under way, or an allocation already ending,
    /// makes this a no-op (see [`crate::lifecycle`]).
    async fn kill(&self, event: Option<TaskEventKind>) {
        if self.step(AllocRunnerEvent::Kill).1 == AllocRunnerAction::KillTasks {
            self.kill_tasks(event).await;
        }
    }

    /// The group's `shutdown_delay`: when tasks still run, the allocation's services leave the
    /// catalog, then the delay passes before any task is sent its kill signal.
    async fn group_shutdown_delay(&self) {
        let s = &self.shared;
        let delay = self.with_alloc(|alloc| alloc.group().ok().and_then(|g| g.shutdown_delay));
        let Some(delay) = delay.filter(|d| !d.is_zero()) else { return };
        let running = s.tasks.iter().any(|t| t.state().status == TaskStatus::Running);
        if !running {
            return;
        }
        s.health.services_leave();
        tracing::debug!(alloc_id = %s.id, ?delay, "waiting out the group's shutdown_delay");
        tokio::time::sleep(delay).await;
    }

    /// Kills the tasks in order: prekill hooks, the leader alone, the other main and ephemeral
    /// tasks together, then the sidecars. Poststop tasks are left alone.
    async fn kill_tasks(&self, event: Option<TaskEventKind>) {
        let s = &self.shared;
        self.run_hooks(AllocHookPhase::Prekill, &self.current()).await;
        self.group_shutdown_delay().await;
        let stamped = || event.clone().map(|kind| TaskEvent::new(s.clock.now(), kind));
        let killable = || s.tasks.iter().filter(|t| t.stage() != Stage::Poststop);
        for leader in killable().filter(|t| t.is_leader()) {
            leader.kill(stamped()).await;
        }
        for sidecars in [false, true] {
            let mut killing = JoinSet::new();
            for task in killable().filter(|t| !t.is_leader() && t.stage().is_sidecar() == sidecars)
            {
                let (task, event) = (task.clone(), stamped());
                killing.spawn(async move { task.kill(event).await });
            }
            while killing.join_next().await.is_some() {}
        }
    }

    /// Queues an update of the allocation; it is applied (and written) in the background. A
    /// newer queued update replaces an older one, as does one with the same modify index; an
    /// update older than the queued or the current one is discarded. Once the run is over,
    /// updates are ignored.
    pub fn update(&self, alloc: Allocation) {
        let s = &self.shared;
        if self.is_done() {
            tracing::debug!(alloc_id = %s.id, "allocation finished; update ignored");
            return;
        }
        let current = self.with_alloc(|a| a.modify_index);
        let mut queued = s.queued_update.lock();
        let newest = queued.as_ref().map_or(current, |q| q.modify_index.max(current));
        if alloc.modify_index < newest {
            tracing::debug!(alloc_id = %s.id, discarded = alloc.modify_index, newest, "discarding an out-of-date update");
            return;
        }
        *queued = Some(alloc);
        drop(queued);
        s.update_ready.notify_one();
    }

    /// Applies `alloc` as [`AllocRunner::update`] does, but writes the allocation record
    /// durably before it returns, so that a stop acknowledged after this call survives a crash
    /// of the agent: a restored stopped allocation is killed. A stale update (older than the
    /// current one) changes nothing.
    pub async fn update_durably(&self, alloc: Allocation) -> Result<(), AllocError> {
        if alloc.modify_index < self.with_alloc(|a| a.modify_index) {
            return Ok(());
        }
        self.set_alloc(Arc::new(alloc.clone()));
        self.persist().await?;
        self.update(alloc);
        Ok(())
    }

    async fn handle_updates(&self) {
        let s = &self.shared;
        loop {
            tokio::select! {
                () = s.update_ready.notified() => {}
                _ = s.runners_finished.wait_for(|done| *done) => return,
            }
            let next = s.queued_update.lock().take();
            if let Some(update) = next {
                Box::pin(self.apply_update(update)).await;
            }
        }
    }

    async fn apply_update(&self, update: Allocation) {
        let s = &self.shared;
        if update.modify_index < self.with_alloc(|a| a.modify_index) {
            return;
        }
        let stopping = update.server_terminal();
        let update = Arc::new(update);
        self.set_alloc(update.clone());
        self.persist_alloc().await;
        if !update.server_terminal() {
            self.run_hooks(AllocHookPhase::Update, &update).await;
        }
        for task in &s.tasks {
            task.update(update.clone()).await;
        }
        if stopping {
            self.kill(None).await;
        }
        s.update_applied.notify_one();
        self.publish();
    }

    /// Stops every task, waits for the run to end (letting poststop tasks run, bounded),
    /// runs the destroy hooks and deletes the allocation's records. Idempotent; safe while
    /// `run` is in progress and after `shutdown` (which it waits for).
    pub async fn destroy(&self) {
        let s = &self.shared;
        loop {
            let (before, action) = self.step(AllocRunnerEvent::Destroy);
            match action {
                AllocRunnerAction::DestroyUnstarted => {
                    // Never ran: each kill ends its task runner without starting anything
                    // (and stops a task restored from a previous agent).
                    for task in &s.tasks {
                        task.kill(None).await;
                    }
                    break;
                }
                AllocRunnerAction::DestroyRun => {
                    if before == AllocRunnerState::Running {
                        self.kill_tasks(None).await;
                    }
                    let run_over = self.until(AllocRunnerState::run_over);
                    if tokio::time::timeout(s.poststop_timeout, run_over).await.is_err() {
                        tracing::warn!(alloc_id = %s.id, "poststop tasks did not finish in time; killing them");
                        for task in &s.tasks {
                            task.kill(None).await;
                        }
                        self.until(AllocRunnerState::run_over).await;
                    }
                    break;
                }
                AllocRunnerAction::DestroyRecords => break,
                AllocRunnerAction::AwaitShutDownThenDestroy => {
                    self.until(|state| !matches!(state, AllocRunnerState::ShuttingDown { .. }))
                        .await;
                }
                AllocRunnerAction::AwaitDestroyed => {
                    self.until(|state| state == AllocRunnerState::Destroyed).await;
                    return;
                }
                _ => return,
            }
        }
        self.publish();
        self.run_hooks(AllocHookPhase::Destroy, &self.current()).await;
        let _records = s.records.lock().await;
        if let Err(error) = s.store.delete_allocation(&s.id).await {
            tracing::error!(alloc_id = %s.id, %error, "deleting the allocation's records failed");
        }
        self.step(AllocRunnerEvent::DestroyDone);
    }

    /// Leaves every task running and ends the run, with everything restore needs persisted;
    /// then runs the shutdown hooks. Idempotent; does nothing once destroy has begun but wait
    /// for it.
    pub async fn shutdown(&self) {
        let s = &self.shared;
        match self.step(AllocRunnerEvent::Shutdown).1 {
            AllocRunnerAction::ShutDownUnstarted => {}
            AllocRunnerAction::ShutDownRun => {
                for task in &s.tasks {
                    task.shutdown();
                }
                self.until(AllocRunnerState::run_over).await;
            }
            AllocRunnerAction::AwaitShutDown => {
                self.until(|state| {
                    matches!(state, AllocRunnerState::ShutDown | AllocRunnerState::Destroyed)
                })
                .await;
                return;
            }
            AllocRunnerAction::AwaitDestroyed => {
                self.until(|state| state == AllocRunnerState::Destroyed).await;
                return;
            }
            _ => return,
        }
        self.run_hooks(AllocHookPhase::Shutdown, &self.current()).await;
        self.step(AllocRunnerEvent::ShutdownDone);
    }

    /// Forces the client status, such as `lost` when the node lost track of the allocation.
    pub fn set_client_status(&self, status: ClientStatus, description: &str) {
        *self.shared.forced.lock() = Some((status, description.to_owned()));
        self.publish();
    }

    /// Records the allocation's health in its deployment, persisted.
    pub async fn set_health(&self, healthy: bool) {
        self.record_health(healthy, None).await;
    }

    /// Records the allocation's health and why. It is written before watchers see it: health
    /// anyone was told of is health a restarted agent finds, and does not judge again.
    async fn record_health(&self, healthy: bool, description: Option<String>) {
        let mut status = self.shared.deployment.lock().clone().unwrap_or_default();
        status.healthy = Some(healthy);
        status.timestamp = Some(self.shared.clock.now());
        status.description = description;
        self.write_deployment(status).await;
    }

    /// Writes `status` as the deployment status, then publishes it.
    async fn write_deployment(&self, mut status: DeploymentStatus) {
        let s = &self.shared;
        status.modify_index += 1;
        {
            let _records = s.records.lock().await;
            if !self.is_destroyed() {
                match s.store.put_deployment_status(&s.id, &status).await {
                    Ok(()) => *s.persisted_deployment.lock() = Some(status.clone()),
                    Err(error) => {
                        tracing::error!(alloc_id = %s.id, %error, "persisting the allocation's health failed")
                    }
                }
            }
        }
        *s.deployment.lock() = Some(status);
        self.publish();
        // A status changed meanwhile (settled as failed) is written too.
        self.persist_deployment().await;
    }

    /// Every check of the allocation's services with its latest result; pending until it
    /// has run.
    pub fn checks(&self) -> Vec<CheckState> {
        self.shared.health.book().states()
    }

    /// How many times the allocation's checks have run.
    pub fn check_runs(&self) -> u64 {
        self.shared.health.book().runs()
    }

    fn task(&self, name: &str) -> Result<&TaskRunner, AllocError> {
        self.shared.tasks.iter().find(|t| t.name() == name).ok_or_else(|| AllocError::UnknownTask {
            alloc_id: self.shared.id.clone(),
            task: name.to_owned(),
        })
    }

    /// Restarts one running task (not counted against its restart policy).
    pub async fn restart_task(&self, name: &str, reason: &str) -> Result<(), AllocError> {
        Ok(self.task(name)?.restart(reason, false).await?)
    }

    /// Whether an allocation-wide restart may happen now: the runner is running (not pending,
    /// ending, shutting down or destroyed) and the allocation should run (neither stopped nor
    /// ended), as Nomad's `shouldRun` has it.
    fn check_restartable(&self) -> Result<(), AllocError> {
        let refuse = |reason: &str| AllocError::NotRestartable {
            alloc_id: self.shared.id.clone(),
            reason: reason.to_owned(),
        };
        if let AllocRunnerAction::Refuse(reason) = self.step(AllocRunnerEvent::RestartAll).1 {
            return Err(refuse(reason));
        }
        if self.with_alloc(Allocation::server_terminal) {
            return Err(refuse("it is stopped"));
        }
        let status = self.state().client_status;
        if status.is_terminal() {
            return Err(refuse(&format!("it is {status}")));
        }
        Ok(())
    }

    /// Restarts every running task; tasks that are not running are left alone.
    pub async fn restart_running(&self, reason: &str) -> Result<(), AllocError> {
        self.check_restartable()?;
        let mut errors = Vec::new();
        for task in self.shared.tasks.iter().filter(|t| t.state().status == TaskStatus::Running) {
            if let Err(error) = task.restart(reason, false).await {
                errors.push((task.name().to_owned(), error));
            }
        }
        collect(errors)
    }

    /// Restarts the whole allocation: the lifecycle starts over, running tasks restart and
    /// dead ones (that are not yet released) run again, prestart tasks first. Every task that
    /// runs again counts one restart.
    pub async fn restart_all(&self, reason: &str) -> Result<(), AllocError> {
        self.check_restartable()?;
        let mut errors = Vec::new();
        for task in self.shared.tasks.iter().filter(|t| t.stage() != Stage::Poststop) {
            match task.state().status {
                TaskStatus::Running => {
                    if let Err(error) = task.restart(reason, false).await {
                        errors.push((task.name().to_owned(), error));
                    }
                }
                TaskStatus::Dead => {
                    task.emit_event(TaskEvent::new(
                        self.shared.clock.now(),
                        TaskEventKind::RestartSignaled { reason: reason.to_owned() },
                    ))
                    .await;
                    if !task.rerun() {
                        errors.push((
                            task.name().to_owned(),
                            TaskError::NotRunning { task: task.name().to_owned() },
                        ));
                    }
                }
                TaskStatus::Pending => {}
            }
        }
        // Every task is pending or on its way there: start the lifecycle over.
        self.shared.coordinator.lock().reset();
        self.apply_gates();
        collect(errors)
    }

    /// Signals one task, or every running task when `task` is None; each task's failure is
    /// reported.
    pub async fn signal(&self, task: Option<&str>, signal: Signal) -> Result<(), AllocError> {
        let reason = "signal requested";
        if let Some(name) = task {
            return Ok(self.task(name)?.signal(signal, reason).await?);
        }
        let mut errors = Vec::new();
        for task in &self.shared.tasks {
            if let Err(error) = task.signal(signal, reason).await {
                errors.push((task.name().to_owned(), error));
            }
        }
        collect(errors)
    }

    /// Runs a command in a running task.
    pub async fn exec(
        &self,
        task: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, AllocError> {
        Ok(self.task(task)?.exec(command, timeout).await?)
    }

    /// Opens one stream of a task's captured output through its driver (capability `logs`).
    pub async fn logs(
        &self,
        task: &str,
        stream: LogStream,
        from: LogFrom,
    ) -> Result<Box<dyn LogReader>, AllocError> {
        Ok(self.task(task)?.logs(stream, from).await?)
    }

    /// What the task's driver can do.
    pub fn capabilities(&self, task: &str) -> Result<Capabilities, AllocError> {
        Ok(self.task(task)?.driver().capabilities())
    }

    /// Resource usage of every running task, and the sum.
    pub async fn usage(&self) -> AllocUsage {
        let mut usage = AllocUsage::default();
        for task in &self.shared.tasks {
            if let Ok(task_usage) = task.usage().await {
                usage.total += &task_usage;
                usage.tasks.insert(task.name().to_owned(), task_usage);
            }
        }
        // The sum has every figure only if every task's usage did.
        let cgroup = wharf_driver::UsageSource::Cgroup;
        if !usage.tasks.is_empty() && usage.tasks.values().all(|u| u.source == cgroup) {
            usage.total.source = cgroup;
        }
        usage
    }

    async fn persist_alloc(&self) {
        if let Err(error) = self.persist().await {
            tracing::error!(alloc_id = %self.shared.id, %error, "persisting the allocation failed");
        }
    }

    /// Writes the allocation record durably, unless this version of it is already stored.
    /// A caller that must know the allocation is durable before it answers (an agent
    /// accepting a submission) calls this before [`AllocRunner::run`], which then does not
    /// write it again.
    pub async fn persist(&self) -> Result<(), wharf_store::StoreError> {
        let s = &self.shared;
        let _records = s.records.lock().await;
        if self.is_destroyed() {
            return Ok(());
        }
        let (alloc, generation) = {
            let record = s.record.lock();
            if record.persisted == Some(record.generation) {
                return Ok(());
            }
            (record.alloc.clone(), record.generation)
        };
        s.store.put_allocation(&alloc).await?;
        s.record.lock().persisted = Some(generation);
        Ok(())
    }

    async fn persist_deployment(&self) {
        let s = &self.shared;
        let Some(deployment) = s.deployment.lock().clone() else { return };
        if s.persisted_deployment.lock().as_ref() == Some(&deployment) {
            return;
        }
        let _records = s.records.lock().await;
        if self.is_destroyed() {
            return;
        }
        match s.store.put_deployment_status(&s.id, &deployment).await {
            Ok(()) => *s.persisted_deployment.lock() = Some(deployment),
            Err(error) => {
                tracing::error!(alloc_id = %s.id, %error, "persisting the deployment status failed")
            }
        }
    }
}

fn collect(errors: Vec<(String, TaskError)>) -> Result<(), AllocError> {
    if errors.is_empty() { Ok(()) } else { Err(AllocError::Tasks(errors)) }
}

/// What the health hooks see of the runner and do to it; nothing else of it is theirs.
#[async_trait::async_trait]
impl WatchedRunner for AllocRunner {
    type Weak = WeakRunner;

    fn upgrade(weak: &WeakRunner) -> Option<AllocRunner> {
        weak.0.upgrade().map(|shared| AllocRunner { shared })
    }

    fn state(&self) -> AllocState {
        AllocRunner::state(self)
    }

    fn subscribe(&self) -> watch::Receiver<AllocState> {
        AllocRunner::subscribe(self)
    }

    fn stopping(&self) -> bool {
        self.with_alloc(Allocation::server_terminal)
    }

    fn tasks(&self) -> Vec<(String, Stage)> {
        self.shared.tasks.iter().map(|t| (t.name().to_owned(), t.stage())).collect()
    }

    async fn record_health(&self, healthy: bool, description: Option<String>) {
        AllocRunner::record_health(self, healthy, description).await;
    }

    /// Nomad's `ClearHealth`: the canary flag stays.
    async fn clear_health(&self) {
        let Some(mut status) = self.shared.deployment.lock().clone() else { return };
        if status.healthy.is_none() {
            return;
        }
        status.healthy = None;
        status.timestamp = None;
        status.description = None;
        self.write_deployment(status).await;
    }

    async fn emit_event(&self, task: &str, event: TaskEvent) {
        if let Ok(task) = self.task(task) {
            task.emit_event(event).await;
        }
    }

    async fn exec(
        &self,
        task: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, AllocError> {
        AllocRunner::exec(self, task, command, timeout).await
    }

    async fn restart_failed(&self, task: &str, reason: &str) -> Result<(), AllocError> {
        Ok(self.task(task)?.restart(reason, true).await?)
    }
}
