//! The [`Scheduler`]: places work on the pool's workers and follows it until it ends.
//!
//! Work is an id and a payload (the runner reads it on stdin when it starts). The scheduler
//! keeps a queue in submission order and, whenever the pool changes or work arrives, puts the
//! head of the queue on the least-loaded worker that takes work (`idle` or `running`, idle
//! behaviour `run`, fewer than [`SchedulerConfig::per_worker_limit`] runners), the idle ones
//! first since their load is zero. From then on the workers' run probes are the truth:
//!
//! - a start the runner acknowledged is `running`; one that failed cleanly (the command ran
//!   and refused) is tried again on another worker, up to [`SchedulerConfig::max_start_attempts`],
//!   and the worker that refused gets no work for [`SchedulerConfig::start_failure_backoff`];
//!   one whose answer was lost (a timeout, a dropped connection) may have started, so it counts
//!   as running until a probe says otherwise;
//! - work a probe no longer lists has ended: the runner is asked how
//!   ([`RunnerConfig::outcome_args`](wharf_prober::RunnerConfig)), and work the runner never received
//!   after a start that was not acknowledged goes back to the queue;
//! - work on a worker that is shut down or gone is `lost`; if that worker comes back still
//!   running it, it is stopped there, since it was written off;
//! - work a probe finds that the scheduler did not start (a restart of the dispatcher) is
//!   adopted as running, so nothing is started twice and nothing is killed by mistake.
//!
//! The placement decision is pure: the scheduler's books and a snapshot of the pool (its
//! workers, its creates in flight, the time) go in; the starts, the questions, the stops and
//! the creates come out, with the books updated, and are tested as a table. [`Scheduler::step`]
//! takes the snapshot, decides under one short lock and carries the decisions out, so tests
//! also drive it step by step on a fake clock with scripted workers; [`Scheduler::run`] is the
//! same on real time.

use crate::FleetError;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{debug, info, warn};
use wharf_prober::{
    Clock, IdleBehavior, InstanceId, InstanceView, Moment, Pool, ProberError, State, WorkerView,
};

/// A count limit as configured: 0 means no limit.
fn limit(configured: usize) -> usize {
    if configured == 0 { usize::MAX } else { configured }
}

/// How the scheduler places work. A limit of 0 means no limit, as in the pool's configuration.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// At most this many runners on one worker (those it found there count too).
    pub per_worker_limit: usize,
    /// Work whose start was refused this many times fails.
    pub max_start_attempts: u32,
    /// A worker that refused a start gets no work for this long.
    pub start_failure_backoff: Duration,
    /// At most this much work waits in the queue; more is refused.
    pub max_queued: usize,
    /// Finished work is remembered (for status queries) up to this many, oldest forgotten first.
    pub max_finished: usize,
    /// Keep at least this many workers: ask the pool for more when fewer exist.
    pub min_workers: usize,
    /// The instance type of those creates.
    pub instance_type: String,
}

impl SchedulerConfig {
    /// Whether work refused `attempts` times may be tried again.
    fn may_retry(&self, attempts: u32) -> bool {
        self.max_start_attempts == 0 || attempts < self.max_start_attempts
    }
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            per_worker_limit: 4,
            max_start_attempts: 3,
            start_failure_backoff: Duration::from_secs(30),
            max_queued: 10_000,
            max_finished: 10_000,
            min_workers: 0,
            instance_type: String::new(),
        }
    }
}

/// Where a piece of work is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for a worker with room.
    Queued,
    /// Its start command is running on a worker.
    Starting {
        /// The worker.
        worker: InstanceId,
    },
    /// Running on a worker (or, until a probe says, possibly running).
    Running {
        /// The worker.
        worker: InstanceId,
    },
    /// It ran and ended; `outcome` is what the runner said about it.
    Ended {
        /// The worker it ran on.
        worker: InstanceId,
        /// The runner's outcome line (`complete ...`, `failed ...`), or `ended`.
        outcome: String,
    },
    /// Its worker was shut down or disappeared while it ran, or stopped knowing it.
    Lost {
        /// The worker it ran on.
        worker: InstanceId,
        /// What happened.
        reason: String,
    },
    /// It could not be started.
    Failed {
        /// The last refusal.
        reason: String,
    },
    /// Stopped while it was still queued.
    Cancelled,
}

impl Phase {
    /// The phase's name: `queued`, `starting`, `running`, `ended`, `lost`, `failed`, `cancelled`.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Starting { .. } => "starting",
            Phase::Running { .. } => "running",
            Phase::Ended { .. } => "ended",
            Phase::Lost { .. } => "lost",
            Phase::Failed { .. } => "failed",
            Phase::Cancelled => "cancelled",
        }
    }

    /// Whether the work is done with, one way or another.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Phase::Ended { .. } | Phase::Lost { .. } | Phase::Failed { .. } | Phase::Cancelled
        )
    }

    /// The worker it is on (or was last on).
    pub fn worker(&self) -> Option<&InstanceId> {
        match self {
            Phase::Starting { worker }
            | Phase::Running { worker }
            | Phase::Ended { worker, .. }
            | Phase::Lost { worker, .. } => Some(worker),
            Phase::Queued | Phase::Failed { .. } | Phase::Cancelled => None,
        }
    }
}

const PHASES: [&str; 7] = ["queued", "starting", "running", "ended", "lost", "failed", "cancelled"];

/// One piece of work, as the scheduler knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Its id (the runner's id for it).
    pub id: String,
    /// Where it is.
    pub phase: Phase,
    /// When it was submitted (or adopted).
    pub submitted: Moment,
    /// When a worker acknowledged its start (or a probe first listed it).
    pub started: Option<Moment>,
    /// When it reached a final phase.
    pub finished: Option<Moment>,
    /// Start attempts so far.
    pub attempts: u32,
    /// Found running by a probe rather than started here.
    pub adopted: bool,
    /// Its start was acknowledged, or a probe listed it: it certainly reached the worker.
    pub confirmed: bool,
}

impl Placement {
    /// Work `id`, submitted at `now` and queued.
    fn queued(id: &str, now: Moment) -> Placement {
        Placement {
            id: id.to_owned(),
            phase: Phase::Queued,
            submitted: now,
            started: None,
            finished: None,
            attempts: 0,
            adopted: false,
            confirmed: false,
        }
    }
}

#[derive(Debug)]
struct Entry {
    placement: Placement,
    payload: Arc<[u8]>,
    /// An outcome query for it is in flight.
    asking: bool,
}

#[derive(Debug, Default)]
struct Counters {
    submitted: u64,
    started: u64,
    start_refusals: u64,
    adopted: u64,
    stopped_after_lost: u64,
    finished: BTreeMap<&'static str, u64>,
    /// Submit to acknowledged start, for work started here.
    start_latency_sum: f64,
    start_latency_count: u64,
}

/// The scheduler's books: every piece of work it knows, the queue, and the workers backing
/// off after a refused start. [`Books::decide`] is the pure decision over them.
#[derive(Debug, Default)]
pub(crate) struct Books {
    entries: HashMap<String, Entry>,
    queue: VecDeque<String>,
    finished: VecDeque<String>,
    backoff: HashMap<InstanceId, Moment>,
    counters: Counters,
}

/// A start the scheduler decided on.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) id: String,
    pub(crate) worker: InstanceId,
    payload: Arc<[u8]>,
}

/// What one step decided, to be carried out outside the lock.
#[derive(Debug, Default)]
pub(crate) struct Decisions {
    /// Work to start, and where.
    pub(crate) launches: Vec<Launch>,
    /// Work a worker no longer lists: ask it how that ended.
    pub(crate) ask: Vec<(String, InstanceId)>,
    /// Work written off that a worker still runs: stop it.
    pub(crate) stop: Vec<String>,
    /// Workers to create, to keep the minimum.
    pub(crate) creates: usize,
    /// A placement changed: subscribers should hear of it.
    pub(crate) changed: bool,
}

#[derive(Debug)]
struct Shared {
    pool: Pool,
    clock: Arc<dyn Clock>,
    config: SchedulerConfig,
    inner: Mutex<Books>,
    wake: tokio::sync::Notify,
    changed: tokio::sync::watch::Sender<u64>,
    stopping: AtomicBool,
}

/// Places work on a [`Pool`]'s workers. Cheap to clone: clones share the scheduler.
#[derive(Debug, Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    /// A scheduler over `pool`, reading time from the pool's clock.
    pub fn new(pool: Pool, config: SchedulerConfig) -> Result<Scheduler, FleetError> {
        Ok(Scheduler {
            shared: Arc::new(Shared {
                clock: pool.clock().clone(),
                pool,
                config,
                inner: Mutex::default(),
                wake: tokio::sync::Notify::new(),
                changed: tokio::sync::watch::Sender::new(0),
                stopping: AtomicBool::new(false),
            }),
        })
    }

    /// The pool it places work on.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// A subscription to changes of any placement: `changed().await` returns once something
    /// changed since the receiver last looked.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    fn notify(&self) {
        self.shared.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Queues work `id` with `payload`. The id must be printable ASCII without spaces (the
    /// runner-list grammar carries it) and new.
    pub fn submit(&self, id: &str, payload: Vec<u8>) -> Result<Placement, FleetError> {
        let refuse = |reason: String| FleetError::Submit { id: id.to_owned(), reason };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refuse("an id must be printable ASCII without spaces".into()));
        }
        let prefix = &self.shared.pool.worker_config().cluster_prefix;
        if !id.starts_with(prefix.as_str()) {
            return Err(refuse(format!("ids of this cluster start with {prefix:?}")));
        }
        let now = self.shared.clock.now();
        let placement = {
            let mut inner = self.shared.inner.lock();
            if inner.entries.contains_key(id) {
                return Err(refuse("that id is taken".into()));
            }
            if inner.queue.len() >= limit(self.shared.config.max_queued) {
                return Err(FleetError::QueueFull {
                    id: id.to_owned(),
                    limit: self.shared.config.max_queued,
                });
            }
            let placement = Placement::queued(id, now);
            inner.entries.insert(
                id.to_owned(),
                Entry { placement: placement.clone(), payload: payload.into(), asking: false },
            );
            inner.queue.push_back(id.to_owned());
            inner.counters.submitted += 1;
            placement
        };
        info!(work = %id, "work queued");
        self.shared.wake.notify_one();
        self.notify();
        Ok(placement)
    }

    /// One piece of work.
    pub fn get(&self, id: &str) -> Option<Placement> {
        self.shared.inner.lock().entries.get(id).map(|e| e.placement.clone())
    }

    /// All work it knows, oldest first.
    pub fn list(&self) -> Vec<Placement> {
        let mut all: Vec<Placement> =
            self.shared.inner.lock().entries.values().map(|e| e.placement.clone()).collect();
        all.sort_by(|a, b| (a.submitted, &a.id).cmp(&(b.submitted, &b.id)));
        all
    }

    /// Stops work: queued work is cancelled, started work is killed on its worker (and ends
    /// as the runner reports once the probes stop listing it). Final work is left as it is.
    pub async fn stop(&self, id: &str, reason: &str) -> Result<Placement, FleetError> {
        let now = self.shared.clock.now();
        let running = {
            let mut inner = self.shared.inner.lock();
            let inner = &mut *inner;
            let entry =
                inner.entries.get_mut(id).ok_or_else(|| FleetError::UnknownWork(id.to_owned()))?;
            match entry.placement.phase {
                Phase::Queued => {
                    inner.queue.retain(|queued| queued != id);
                    inner.finish(id, Phase::Cancelled, now, &self.shared.config);
                    false
                }
                Phase::Starting { .. } | Phase::Running { .. } => true,
                _ => false,
            }
        };
        if running && !self.shared.pool.kill_runner(id, reason).await {
            debug!(work = %id, "no worker lists it (yet); stopping it when one does");
        }
        self.notify();
        self.get(id).ok_or_else(|| FleetError::UnknownWork(id.to_owned()))
    }

    /// Reconciles the work with the workers, then starts what fits; waits for those starts and
    /// for the outcome queries it made. Returns how many starts it made. The deterministic step
    /// tests use; [`Scheduler::run`] does the same without waiting.
    pub async fn step(&self) -> usize {
        let decisions = self.decide();
        let launched = decisions.launches.len();
        let mut work = tokio::task::JoinSet::new();
        self.carry_out(decisions, |future| {
            work.spawn(future);
        });
        while work.join_next().await.is_some() {}
        launched
    }

    /// Runs on real time until [`Scheduler::stop_running`]: a step whenever the pool changes,
    /// work arrives or a start ends, and at least once a second.
    pub async fn run(&self) {
        let mut pool_changes = self.shared.pool.subscribe();
        while !self.shared.stopping.load(Ordering::Acquire) {
            let decisions = self.decide();
            self.carry_out(decisions, |future| {
                tokio::spawn(future);
            });
            tokio::select! {
                _ = pool_changes.changed() => {}
                () = self.shared.wake.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Makes [`Scheduler::run`] return.
    pub fn stop_running(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }

    /// Counts of work by phase, and the counters, in Prometheus text format.
    pub fn metrics(&self) -> String {
        let inner = self.shared.inner.lock();
        let mut by_phase: BTreeMap<&'static str, u64> = BTreeMap::new();
        for entry in inner.entries.values() {
            *by_phase.entry(entry.placement.phase.name()).or_insert(0) += 1;
        }
        let mut out = String::new();
        let c = &inner.counters;
        let _ = writeln!(out, "# HELP wharf_fleet_work Work the scheduler knows, by phase.");
        let _ = writeln!(out, "# TYPE wharf_fleet_work gauge");
        for phase in PHASES {
            let n = by_phase.get(phase).copied().unwrap_or(0);
            let _ = writeln!(out, "wharf_fleet_work{{phase=\"{phase}\"}} {n}");
        }
        let totals = [
            ("submitted", "Work submitted.", c.submitted),
            ("started", "Starts a worker acknowledged.", c.started),
            ("start_refusals", "Starts a worker refused.", c.start_refusals),
            ("adopted", "Work found running that was not started here.", c.adopted),
            (
                "stopped_after_lost",
                "Work written off as lost, found and stopped.",
                c.stopped_after_lost,
            ),
        ];
        for (name, help, value) in totals {
            let _ = writeln!(out, "# HELP wharf_fleet_{name}_total {help}");
            let _ = writeln!(out, "# TYPE wharf_fleet_{name}_total counter");
            let _ = writeln!(out, "wharf_fleet_{name}_total {value}");
        }
        let _ = writeln!(out, "# HELP wharf_fleet_finished_total Work that reached a final phase.");
        let _ = writeln!(out, "# TYPE wharf_fleet_finished_total counter");
        for phase in ["ended", "lost", "failed", "cancelled"] {
            let n = c.finished.get(phase).copied().unwrap_or(0);
            let _ = writeln!(out, "wharf_fleet_finished_total{{phase=\"{phase}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP wharf_fleet_start_latency_seconds From submission to an acknowledged start."
        );
        let _ = writeln!(out, "# TYPE wharf_fleet_start_latency_seconds summary");
        let _ = writeln!(out, "wharf_fleet_start_latency_seconds_sum {}", c.start_latency_sum);
        let _ = writeln!(out, "wharf_fleet_start_latency_seconds_count {}", c.start_latency_count);
        out
    }

    /// Looks at every worker and every piece of work, and decides what to do: a snapshot of
    /// the pool and the time go into [`Books::decide`], which is pure.
    fn decide(&self) -> Decisions {
        let shared = &self.shared;
        let snapshot = Snapshot::of(&shared.pool, shared.clock.now());
        let decisions = shared.inner.lock().decide(&snapshot, &shared.config);
        if decisions.changed {
            self.notify();
        }
        decisions
    }

    /// Starts, asks and stops as decided; `spawn` runs each call (detached, or in a set the
    /// caller waits on).
    fn carry_out(
        &self,
        decisions: Decisions,
        mut spawn: impl FnMut(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>),
    ) {
        for launch in decisions.launches {
            let scheduler = self.clone();
            spawn(Box::pin(async move { scheduler.start(launch).await }));
        }
        for (id, worker) in decisions.ask {
            let scheduler = self.clone();
            spawn(Box::pin(async move { scheduler.ask_outcome(id, worker).await }));
        }
        for id in decisions.stop {
            let scheduler = self.clone();
            spawn(Box::pin(async move {
                if scheduler.shared.pool.kill_runner(&id, "it was written off").await {
                    info!(work = %id, "stopping work that was written off");
                    scheduler.shared.inner.lock().counters.stopped_after_lost += 1;
                }
            }));
        }
        // Creates return at once; the pool runs them and tells its subscribers how they went.
        for _ in 0..decisions.creates {
            match self.shared.pool.create(&self.shared.config.instance_type) {
                Ok(_) => info!("creating a worker to keep the minimum"),
                Err(ProberError::CreateHeld { reason, .. }) => {
                    debug!(%reason, "create held");
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "cannot create a worker");
                    break;
                }
            }
        }
    }

    /// Starts one piece of work and records how the start went.
    async fn start(&self, launch: Launch) {
        let shared = &self.shared;
        let Launch { id, worker, payload } = launch;
        let result = shared.pool.start_runner(&worker, &id, &payload).await;
        let now = shared.clock.now();
        let mut refused = false;
        {
            let mut inner = shared.inner.lock();
            let inner = &mut *inner;
            let Some(entry) = inner.entries.get_mut(&id) else { return };
            if entry.placement.phase != (Phase::Starting { worker: worker.clone() }) {
                return;
            }
            match result {
                Ok(()) => {
                    info!(work = %id, %worker, "work started");
                    entry.placement.phase = Phase::Running { worker: worker.clone() };
                    entry.placement.confirmed = true;
                    entry.placement.started = Some(now);
                    let latency = now.since(entry.placement.submitted).as_secs_f64();
                    inner.counters.started += 1;
                    inner.counters.start_latency_sum += latency;
                    inner.counters.start_latency_count += 1;
                }
                // The worker changed before the command ran: nothing happened there.
                Err(ProberError::NotAllowed { reason, .. }) => {
                    debug!(work = %id, %worker, reason, "worker no longer takes work; requeued");
                    entry.placement.attempts -= 1;
                    entry.placement.phase = Phase::Queued;
                    inner.queue.push_front(id.clone());
                }
                // The command ran and refused: it did not start.
                Err(e @ ProberError::CommandFailed { .. }) => {
                    warn!(work = %id, %worker, error = %e, "start refused");
                    refused = true;
                    inner.counters.start_refusals += 1;
                    inner.backoff.insert(worker.clone(), now + shared.config.start_failure_backoff);
                    if !shared.config.may_retry(entry.placement.attempts) {
                        let reason = format!(
                            "refused {} times; the last time: {e}",
                            entry.placement.attempts
                        );
                        inner.finish(&id, Phase::Failed { reason }, now, &shared.config);
                    } else {
                        entry.placement.phase = Phase::Queued;
                        inner.queue.push_front(id.clone());
                    }
                }
                // The command never reached the worker (an id or path it cannot carry).
                Err(e @ (ProberError::Unquotable { .. } | ProberError::UnknownWorker(_))) => {
                    entry.placement.phase = Phase::Queued;
                    if matches!(e, ProberError::Unquotable { .. }) {
                        inner.finish(
                            &id,
                            Phase::Failed { reason: e.to_string() },
                            now,
                            &shared.config,
                        );
                    } else {
                        entry.placement.attempts -= 1;
                        inner.queue.push_front(id.clone());
                    }
                }
                // The answer was lost: it may have started. The probes will tell.
                Err(e) => {
                    warn!(work = %id, %worker, error = %e, "start unconfirmed; the next probe decides");
                    entry.placement.phase = Phase::Running { worker: worker.clone() };
                }
            }
        }
        if refused && let Err(e) = shared.pool.close_runner(&worker, &id).await {
            debug!(work = %id, %worker, error = %e, "cannot forget the refused start");
        }
        self.notify();
        shared.wake.notify_one();
    }

    /// Asks the worker how work it no longer lists ended.
    async fn ask_outcome(&self, id: String, worker: InstanceId) {
        let shared = &self.shared;
        let answer = shared.pool.runner_outcome(&worker, &id).await;
        let now = shared.clock.now();
        let mut guard = shared.inner.lock();
        let inner = &mut *guard;
        let Some(entry) = inner.entries.get_mut(&id) else { return };
        entry.asking = false;
        if entry.placement.phase != (Phase::Running { worker: worker.clone() }) {
            return;
        }
        let confirmed = entry.placement.confirmed;
        let phase = match answer {
            Ok(None) => Phase::Ended { worker, outcome: "ended".into() },
            Ok(Some(line)) if line == "unknown" && confirmed => {
                Phase::Lost { worker, reason: "its worker no longer knows it".into() }
            }
            Ok(Some(line)) if line == "unknown" => {
                // The start never arrived: it can go elsewhere.
                info!(work = %id, %worker, "unconfirmed start never arrived; requeued");
                if !shared.config.may_retry(entry.placement.attempts) {
                    Phase::Failed {
                        reason: format!(
                            "no start reached a worker in {} attempts",
                            entry.placement.attempts
                        ),
                    }
                } else {
                    entry.placement.phase = Phase::Queued;
                    inner.queue.push_front(id);
                    drop(guard);
                    self.notify();
                    shared.wake.notify_one();
                    return;
                }
            }
            Ok(Some(line)) if matches!(line.split(' ').next(), Some("pending" | "running")) => {
                // Not ended after all (the probe raced its start): the next probe lists it.
                return;
            }
            Ok(Some(line)) => Phase::Ended { worker, outcome: line },
            Err(e) if confirmed => {
                Phase::Ended { worker, outcome: format!("ended; the worker cannot say how: {e}") }
            }
            Err(e) => Phase::Lost {
                worker,
                reason: format!(
                    "its start was not acknowledged and the worker cannot say whether it ran: {e}"
                ),
            },
        };
        info!(work = %id, phase = phase.name(), "work finished");
        inner.finish(&id, phase, now, &shared.config);
        drop(guard);
        self.notify();
    }
}

/// What the scheduler sees of the pool at one moment: every worker, the creates in flight,
/// and the time.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) workers: HashMap<InstanceId, WorkerView>,
    pub(crate) creating: usize,
    pub(crate) now: Moment,
}

impl Snapshot {
    fn of(pool: &Pool, now: Moment) -> Snapshot {
        let mut snapshot = Snapshot { workers: HashMap::new(), creating: 0, now };
        for instance in pool.instances() {
            match instance {
                InstanceView::Worker(view) => {
                    snapshot.workers.insert(view.id.clone(), view);
                }
                InstanceView::Creating { .. } => snapshot.creating += 1,
            }
        }
        snapshot
    }
}

impl Books {
    /// Decides, from a snapshot of the pool, what to start where, whom to ask how work
    /// ended, what to stop and how many workers to create; updates the books to match. Pure:
    /// the snapshot carries the time, and the caller carries the decisions out.
    pub(crate) fn decide(&mut self, snapshot: &Snapshot, config: &SchedulerConfig) -> Decisions {
        let Snapshot { workers: views, creating, now } = snapshot;
        let (now, creating) = (*now, *creating);
        let mut decisions = Decisions::default();
        let mut changed = false;

        // Work believed running: still listed, gone with its worker, or ended.
        let running: Vec<(String, InstanceId)> = self
            .entries
            .values()
            .filter_map(|e| match &e.placement.phase {
                Phase::Running { worker } => Some((e.placement.id.clone(), worker.clone())),
                _ => None,
            })
            .collect();
        for (id, worker) in running {
            let lost = match views.get(&worker) {
                None => Some(format!("worker {worker} disappeared")),
                Some(view) if view.state == State::Shutdown => {
                    Some(format!("worker {worker} was shut down"))
                }
                Some(_) => None,
            };
            if let Some(reason) = lost {
                warn!(work = %id, %worker, reason, "work lost");
                self.finish(&id, Phase::Lost { worker, reason }, now, config);
                changed = true;
                continue;
            }
            let view = &views[&worker];
            let Some(entry) = self.entries.get_mut(&id) else { continue };
            if view.running.contains(&id) {
                if !entry.placement.confirmed {
                    entry.placement.confirmed = true;
                    entry.placement.started.get_or_insert(now);
                    changed = true;
                }
            } else if !view.starting.contains(&id) && !entry.asking {
                entry.asking = true;
                decisions.ask.push((id, worker));
            }
        }

        // Work the workers run that is not (or no longer) ours to run.
        for view in views.values().filter(|v| v.state != State::Shutdown) {
            for id in &view.running {
                match self.entries.get_mut(id) {
                    None => {
                        info!(work = %id, worker = %view.id, "adopting work found running");
                        let placement = Placement {
                            phase: Phase::Running { worker: view.id.clone() },
                            started: Some(now),
                            adopted: true,
                            confirmed: true,
                            ..Placement::queued(id, now)
                        };
                        let entry = Entry { placement, payload: Arc::from([]), asking: false };
                        self.entries.insert(id.clone(), entry);
                        self.counters.adopted += 1;
                        changed = true;
                    }
                    Some(entry) => match &entry.placement.phase {
                        Phase::Lost { .. } | Phase::Cancelled | Phase::Failed { .. } => {
                            decisions.stop.push(id.clone());
                        }
                        Phase::Queued => {
                            // Its start was thought lost, but it arrived after all.
                            info!(work = %id, worker = %view.id, "queued work found running");
                            self.queue.retain(|queued| queued != id);
                            entry.placement.phase = Phase::Running { worker: view.id.clone() };
                            entry.placement.confirmed = true;
                            entry.placement.started.get_or_insert(now);
                            changed = true;
                        }
                        Phase::Running { worker } | Phase::Starting { worker }
                            if *worker != view.id =>
                        {
                            warn!(work = %id, worker = %view.id, placed_on = %worker, "work runs on a worker it was not placed on");
                        }
                        _ => {}
                    },
                }
            }
        }

        // Room on each worker that takes work. A worker counts every start through it as
        // running until a probe says otherwise, so its view is the load, plus the starts
        // decided but not yet begun; work it no longer lists has ended and takes no room.
        let mut load: HashMap<&InstanceId, BTreeSet<&str>> = HashMap::new();
        for view in views.values() {
            let ids = load.entry(&view.id).or_default();
            ids.extend(view.running.iter().chain(&view.starting).map(String::as_str));
        }
        for entry in self.entries.values() {
            if let Phase::Starting { worker } = &entry.placement.phase
                && let Some(ids) = load.get_mut(worker)
            {
                ids.insert(&entry.placement.id);
            }
        }
        let mut room: Vec<(usize, &InstanceId)> = views
            .values()
            .filter(|v| {
                matches!(v.state, State::Idle | State::Running)
                    && v.idle_behavior == IdleBehavior::Run
                    && self.backoff.get(&v.id).is_none_or(|until| *until <= now)
            })
            .map(|v| (load.get(&v.id).map_or(0, BTreeSet::len), &v.id))
            .filter(|(n, _)| *n < limit(config.per_worker_limit))
            .collect();
        let mut launches = Vec::new();
        while !self.queue.is_empty() {
            let Some((slot, _)) = room.iter().enumerate().min_by(|a, b| a.1.cmp(b.1)) else {
                break;
            };
            let Some(id) = self.queue.pop_front() else { break };
            let worker = room[slot].1.clone();
            room[slot].0 += 1;
            if room[slot].0 >= limit(config.per_worker_limit) {
                room.swap_remove(slot);
            }
            let Some(entry) = self.entries.get_mut(&id) else { continue };
            entry.placement.phase = Phase::Starting { worker: worker.clone() };
            entry.placement.attempts += 1;
            launches.push(Launch { id, worker, payload: entry.payload.clone() });
            changed = true;
        }
        decisions.launches = launches;

        // Creates in flight count: they become workers.
        let live = views.values().filter(|v| v.state != State::Shutdown).count() + creating;
        decisions.creates = config.min_workers.saturating_sub(live);
        self.backoff.retain(|_, until| *until > now);
        decisions.changed = changed;
        decisions
    }

    /// Puts work in a final phase, and forgets the oldest finished work beyond the limit.
    fn finish(&mut self, id: &str, phase: Phase, now: Moment, config: &SchedulerConfig) {
        let Some(entry) = self.entries.get_mut(id) else { return };
        *self.counters.finished.entry(phase.name()).or_insert(0) += 1;
        entry.placement.phase = phase;
        entry.placement.finished = Some(now);
        self.finished.push_back(id.to_owned());
        while self.finished.len() > limit(config.max_finished) {
            let Some(old) = self.finished.pop_front() else { break };
            if self.entries.get(&old).is_some_and(|e| e.placement.phase.is_final()) {
                self.entries.remove(&old);
            }
        }
    }
}

#[cfg(test)]
impl Books {
    /// Books holding `work` in these phases; queued work is queued in this order.
    pub(crate) fn holding(work: &[(&str, Phase)], now: Moment) -> Books {
        let mut books = Books::default();
        for (id, phase) in work {
            let placement = Placement { phase: phase.clone(), ..Placement::queued(id, now) };
            if *phase == Phase::Queued {
                books.queue.push_back((*id).to_owned());
            }
            let entry = Entry { placement, payload: Arc::from(&b"spec"[..]), asking: false };
            books.entries.insert((*id).to_owned(), entry);
        }
        books
    }

    /// Where work `id` is.
    pub(crate) fn phase(&self, id: &str) -> Option<Phase> {
        self.entries.get(id).map(|e| e.placement.phase.clone())
    }

    /// Makes `worker` take no work until `until`, as after a refused start.
    pub(crate) fn back_off(&mut self, worker: &str, until: Moment) {
        self.backoff.insert(worker.into(), until);
    }
}
