//! The [`Pool`]: every worker of an instance set, probed on its own schedule.
//!
//! The pool owns the workers and carries out what they decide (destroy, save tags, count
//! outcomes). Its jobs:
//! - **Create** instances in the background: [`Pool::create`] returns at once, the create
//!   shows in [`Pool::instances`] until the cloud answers, and subscribers hear how it went.
//!   Creates are held back ([`HoldReason`](crate::HoldReason), see [`capacity`](crate::capacity))
//!   at `max_instances`, at a quota the cloud reported (until fewer instances exist, or a TTL
//!   passes), while the type, its quota group or every type is at capacity, while the cloud's
//!   rate limit holds, or while `max_concurrent_creates` are in flight; when a hold ends,
//!   subscribers hear at once. Each create carries a secret tag so the instance is recognised
//!   as ours (`booting`) when a list shows it before the create returns.
//! - **Sync** with the instance list: new instances become workers (`booting` if their
//!   secret is a pending create, else `unknown`, with the idle behaviour from their tag),
//!   known ones get their listing (address, host key) and drifted tags fixed, destroyed ones
//!   still listed after the shutdown timeout are destroyed again, and workers missing from the
//!   list are dropped (boot outcome `disappeared`).
//! - **Probe** each worker every `probe_interval` from its own point in the cycle (spread by
//!   jitter at first sight), with at most `max_concurrent_probes` in flight. A worker whose
//!   previous probe is still running is skipped without using a slot. Unlike a single loop at
//!   a global rate, 10,000 workers are each still probed at their interval. An instance this
//!   pool created is probed as soon as its create returns, and while it boots again after
//!   half its age so far (at least 250 ms, at most the interval): its boot is seen when it
//!   ends, not at a later tick.
//! - **The fleet brake**: when more than `brake.max_failing_share` of the booted workers (and
//!   at least `brake.min_failing`) fail their last probe, no worker is destroyed for being
//!   unresponsive until that clears; the reason is logged and exported.
//!
//! Tests drive it step by step on a fake clock ([`Pool::probe_due`], [`Pool::sync`],
//! [`Pool::probe_now`]); [`Pool::run`] is the same loop on real time.

use crate::ProberError;
use crate::capacity::{Counts, Holds, InstanceType, Limits, Price, limit};
use crate::clock::{Clock, Moment};
use crate::config::{Prepared, WorkerConfig};
use crate::executor::Executor;
use crate::instance::{Instance, InstanceId, InstanceSet, Tag, Tags};
use crate::metrics::{self, Category, Counters, Gauges};
use crate::runner_outcome::RunnerOutcome;
use crate::worker::{
    BootOutcome, Brake, Effect, IdleBehavior, ProbeOutcome, State, Worker, WorkerSpec, WorkerView,
};
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{debug, info, warn};

/// Makes the executor for a newly seen instance.
pub type NewExecutor = Arc<dyn Fn(&Instance) -> Arc<dyn Executor> + Send + Sync>;

/// When the fleet brake engages.
#[derive(Debug, Clone, PartialEq)]
pub struct BrakeConfig {
    /// Engage when more than this share (0.0 to 1.0) of booted workers fail their probes.
    pub max_failing_share: f64,
    /// ... and at least this many fail (a small fleet can lose one or two on its own).
    pub min_failing: usize,
}

impl Default for BrakeConfig {
    fn default() -> BrakeConfig {
        BrakeConfig { max_failing_share: 0.5, min_failing: 3 }
    }
}

/// The pool's settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// What each worker is told.
    pub worker: WorkerConfig,
    /// Each worker is probed this often.
    pub probe_interval: Duration,
    /// At most this many probes run at once; 0: no limit.
    pub max_concurrent_probes: usize,
    /// The instance list is read this often (by [`Pool::run`]).
    pub sync_interval: Duration,
    /// Never more instances than this (created and creating); 0: no limit.
    pub max_instances: usize,
    /// At most this many creates in flight; 0: no limit.
    pub max_concurrent_creates: usize,
    /// After a quota refusal with no instances, creates wait this long.
    pub quota_error_ttl: Duration,
    /// After a capacity refusal, creates of that type (or its quota group, or all) wait this
    /// long.
    pub capacity_error_ttl: Duration,
    /// The fleet brake.
    pub brake: BrakeConfig,
    /// Run at boot on each created instance, after the line that stores its secret.
    pub init_command: String,
    /// Where the init command stores the instance's secret.
    pub secret_path: String,
    /// Seed of the probe jitter (fixed for reproducible simulations).
    pub seed: u64,
    /// Deadline of one cloud call (create, list, destroy, set tags).
    pub cloud_deadline: Duration,
    /// The instance types in service, by name: their provider types, preemptible kinds and
    /// quota groups. A listed instance of another type (one removed from the configuration)
    /// is drained unless it is on hold. Empty: every name is a type in service, its own
    /// provider type, in no quota group. Their prices are where the pool starts: the cloud's
    /// own prices ([`Pool::set_price`]) replace them at run time.
    pub instance_types: Vec<InstanceType>,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            worker: WorkerConfig::default(),
            probe_interval: Duration::from_secs(10),
            max_concurrent_probes: 256,
            sync_interval: Duration::from_secs(60),
            max_instances: 64,
            max_concurrent_creates: 1,
            quota_error_ttl: Duration::from_secs(60),
            capacity_error_ttl: Duration::from_secs(60),
            brake: BrakeConfig::default(),
            init_command: String::new(),
            secret_path: "/var/run/wharf-instance-secret".into(),
            seed: 0x9e37_79b9_7f4a_7c15,
            cloud_deadline: Duration::from_secs(120),
            instance_types: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    worker: Arc<Worker>,
    /// Tells this worker's schedule entries from those of an earlier worker with its id.
    generation: u64,
}

#[derive(Debug, Default)]
struct PoolState {
    workers: HashMap<InstanceId, Entry>,
    schedule: BinaryHeap<Reverse<(Moment, u64, InstanceId)>>,
    generation: u64,
    /// Creates in flight, by the secret they carry.
    creating: HashMap<String, PendingCreate>,
    exited: HashMap<String, Moment>,
    holds: Holds,
    rng: u64,
    brake_checked: Option<Moment>,
    loaded: bool,
}

/// A create in flight.
#[derive(Debug)]
struct PendingCreate {
    since: Moment,
    instance_type: InstanceType,
    /// The worker a list already showed for it, before the create returned.
    listed: Option<InstanceId>,
}

impl PoolState {
    /// Instances and creates in flight, each counted once.
    fn counts(&self) -> Counts {
        let creating = self.creating.values().filter(|c| c.listed.is_none()).count();
        Counts { instances: self.workers.len(), creating }
    }

    /// splitmix64: cheap, seeded, good enough for jitter.
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn random_below(&mut self, bound: Duration) -> Duration {
        let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 { Duration::ZERO } else { Duration::from_nanos(self.random() % nanos) }
    }
}

struct Shared {
    config: PoolConfig,
    worker_config: Arc<Prepared>,
    clock: Arc<dyn Clock>,
    instances: Arc<dyn InstanceSet>,
    new_executor: NewExecutor,
    brake: Arc<Brake>,
    limits: Limits,
    state: Mutex<PoolState>,
    counters: Mutex<Counters>,
    probes: tokio::sync::Semaphore,
    changed: tokio::sync::watch::Sender<u64>,
    /// Wakes [`Pool::run`] when a probe falls due sooner than it planned to look (a worker
    /// just created is probed at once).
    schedule_changed: tokio::sync::Notify,
    stopping: AtomicBool,
    stop: tokio::sync::Notify,
    /// Prices the cloud reported (a spot market's), by type name: they replace the
    /// configured ones. Read often (every view of a worker's price), written every few
    /// minutes.
    prices: parking_lot::RwLock<HashMap<String, Price>>,
}

/// Every worker of one instance set. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("workers", &self.shared.state.lock().workers.len()).finish()
    }
}

impl Pool {
    /// A pool over `instances`, making executors with `new_executor` and reading time from
    /// `clock`. Nothing runs until [`Pool::run`] (or the step methods) are called.
    pub fn new(
        config: PoolConfig,
        clock: Arc<dyn Clock>,
        instances: Arc<dyn InstanceSet>,
        new_executor: NewExecutor,
    ) -> Result<Pool, ProberError> {
        for (field, value) in
            [("probe_interval", config.probe_interval), ("sync_interval", config.sync_interval)]
        {
            if value.is_zero() {
                return Err(ProberError::Config {
                    field,
                    problem: "must be more than zero".into(),
                });
            }
        }
        if !(0.0..=1.0).contains(&config.brake.max_failing_share) {
            return Err(ProberError::Config {
                field: "brake.max_failing_share",
                problem: format!("{} is not between 0 and 1", config.brake.max_failing_share),
            });
        }
        let mut names = std::collections::BTreeSet::new();
        if let Some(twice) = config.instance_types.iter().find(|it| !names.insert(&it.name)) {
            return Err(ProberError::Config {
                field: "instance_types",
                problem: format!("{:?} is named twice", twice.name),
            });
        }
        let worker_config = Arc::new(config.worker.clone().prepare()?);
        let state = PoolState { rng: config.seed, ..PoolState::default() };
        let limits = Limits {
            max_instances: config.max_instances,
            max_concurrent_creates: config.max_concurrent_creates,
            quota_error_ttl: config.quota_error_ttl,
            capacity_error_ttl: config.capacity_error_ttl,
        };
        Ok(Pool {
            shared: Arc::new(Shared {
                probes: tokio::sync::Semaphore::new(
                    limit(config.max_concurrent_probes).min(tokio::sync::Semaphore::MAX_PERMITS),
                ),
                config,
                worker_config,
                clock,
                instances,
                new_executor,
                brake: Arc::new(Brake::default()),
                limits,
                state: Mutex::new(state),
                counters: Mutex::new(Counters::default()),
                changed: tokio::sync::watch::Sender::new(0),
                schedule_changed: tokio::sync::Notify::new(),
                stopping: AtomicBool::new(false),
                stop: tokio::sync::Notify::new(),
                prices: parking_lot::RwLock::default(),
            }),
        })
    }

    /// A subscription to changes a scheduler cares about (a worker appeared, booted, went
    /// idle, started or lost work, was shut down): `changed().await` on the receiver returns
    /// once something changed since it last looked. Changes coalesce, and none is lost to a
    /// subscriber that was busy when it happened.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    fn notify(&self) {
        self.shared.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether the first sync has completed.
    pub fn loaded(&self) -> bool {
        self.shared.state.lock().loaded
    }

    /// The fleet brake.
    pub fn brake(&self) -> &Brake {
        &self.shared.brake
    }

    /// Snapshots of every worker, by id.
    pub fn workers(&self) -> Vec<WorkerView> {
        let workers: Vec<Arc<Worker>> =
            self.shared.state.lock().workers.values().map(|e| e.worker.clone()).collect();
        let mut views: Vec<WorkerView> = workers.iter().map(|w| w.view()).collect();
        views.sort_by(|a, b| a.id.cmp(&b.id));
        views
    }

    /// Waits until worker `id` satisfies `until`, and returns it as it was then; `None` once the
    /// pool has no such worker. It may never get there: bound the wait with a timeout.
    pub async fn wait_for_worker(
        &self,
        id: &InstanceId,
        until: impl Fn(&WorkerView) -> bool,
    ) -> Option<WorkerView> {
        let mut changes = self.subscribe();
        loop {
            let worker = self.shared.state.lock().workers.get(id).map(|e| e.worker.clone())?;
            let view = worker.view();
            if until(&view) {
                return Some(view);
            }
            changes.changed().await.ok()?;
        }
    }

    /// Every instance of the pool: its workers, and the creates still in flight (which have
    /// no id yet), as Arvados' `Instances()` shows them. Workers come first, by id, then the
    /// creates, oldest first.
    pub fn instances(&self) -> Vec<InstanceView> {
        let mut views: Vec<InstanceView> =
            self.workers().into_iter().map(|view| InstanceView::Worker(Box::new(view))).collect();
        let state = self.shared.state.lock();
        let mut creating: Vec<(Moment, String)> = state
            .creating
            .values()
            .filter(|c| c.listed.is_none())
            .map(|c| (c.since, c.instance_type.name.clone()))
            .collect();
        drop(state);
        creating.sort();
        views.extend(
            creating
                .into_iter()
                .map(|(since, instance_type)| InstanceView::Creating { instance_type, since }),
        );
        views
    }

    /// How many workers are in each state.
    pub fn count_workers(&self) -> BTreeMap<State, usize> {
        let workers = self.worker_list();
        let mut counts = BTreeMap::new();
        for worker in workers {
            *counts.entry(worker.state()).or_insert(0) += 1;
        }
        counts
    }

    /// Runners that ended, with when (until forgotten).
    pub fn exited(&self) -> HashMap<String, Moment> {
        self.shared.state.lock().exited.clone()
    }

    /// Forgets that a runner ended.
    pub fn forget_runner(&self, id: &str) {
        self.shared.state.lock().exited.remove(id);
    }

    fn worker_list(&self) -> Vec<Arc<Worker>> {
        self.shared.state.lock().workers.values().map(|e| e.worker.clone()).collect()
    }

    fn worker(&self, id: &InstanceId) -> Result<Arc<Worker>, ProberError> {
        self.shared
            .state
            .lock()
            .workers
            .get(id)
            .map(|e| e.worker.clone())
            .ok_or_else(|| ProberError::UnknownWorker(id.0.clone()))
    }

    /// Whether creates are held for quota: the configured maximum, or a quota refusal of the
    /// cloud's that still holds.
    pub fn at_quota(&self) -> bool {
        let now = self.shared.clock.now();
        let state = self.shared.state.lock();
        state.holds.at_quota(state.counts(), &self.shared.limits, now)
    }

    /// Whether creates of `instance_type` are held for capacity (of the type, its quota group,
    /// or every type).
    pub fn at_capacity(&self, instance_type: &str) -> bool {
        let now = self.shared.clock.now();
        let it = self.instance_type(instance_type);
        self.shared.state.lock().holds.at_capacity(&it, now)
    }

    /// The configured instance types (empty: any type the caller names), each at its price
    /// now.
    pub fn instance_types(&self) -> Vec<InstanceType> {
        let prices = self.shared.prices.read();
        let types = self.shared.config.instance_types.iter().cloned();
        types.map(|it| priced(it, &prices)).collect()
    }

    /// The configured type named `name`, at its price now; without a configured list, a type
    /// of that name.
    pub fn instance_type(&self, name: &str) -> InstanceType {
        let configured = self.shared.config.instance_types.iter().find(|it| it.name == name);
        match configured {
            Some(it) => priced(it.clone(), &self.shared.prices.read()),
            None => InstanceType::new(name),
        }
    }

    /// Prices `instance_type` at `price` an hour from now on, in place of its configured
    /// price (for a spot market's, which moves): in workers' views, the metrics, and the
    /// price the scheduler gives new placements. `false` (and nothing changes) for a type not
    /// configured.
    pub fn set_price(&self, instance_type: &str, price: Price) -> bool {
        let types = &self.shared.config.instance_types;
        if !types.iter().any(|it| it.name == instance_type) {
            return false;
        }
        let before = self.shared.prices.write().insert(instance_type.to_owned(), price);
        if before != Some(price) {
            info!(instance_type, %price, "instance type priced");
        }
        true
    }

    /// Starts creating an instance of `instance_type` and returns at once; the cloud call runs
    /// in the background (on the current tokio runtime), and [`Pool::instances`] shows the
    /// create until it ends. The instance becomes a `booting` worker: when the create returns,
    /// or earlier if a list shows it (it carries this create's secret tag). Subscribers hear
    /// when the create starts and when it ends.
    ///
    /// Refused at once with [`ProberError::CreateHeld`] while a
    /// [`HoldReason`](crate::HoldReason) holds. A quota, capacity or rate-limit refusal from the
    /// cloud is remembered, so later creates wait; its end wakes subscribers. The returned
    /// [`Creating`] tells how the create ended, for callers who want to know; dropping it
    /// leaves the create running.
    pub fn create(&self, instance_type: &str) -> Result<Creating, ProberError> {
        let shared = &self.shared;
        let it = self.instance_type(instance_type);
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ProberError::Cloud {
            operation: "create",
            detail: "no tokio runtime to run the create on".into(),
        })?;
        let secret = random_secret()?;
        let prefix = &shared.worker_config.tag_prefix;
        let mut tags = Tags::new();
        tags.insert(Tag::InstanceType.key(prefix), it.name.clone());
        tags.insert(Tag::IdleBehavior.key(prefix), IdleBehavior::Run.as_str().to_owned());
        tags.insert(Tag::InstanceSecret.key(prefix), secret.clone());
        let secret_path = crate::quote("secret path", &shared.config.secret_path)?;
        let mut init = format!("umask 0177 && printf %s {secret} >{secret_path}");
        if !shared.config.init_command.trim().is_empty() {
            init = format!("{init} && {}", shared.config.init_command);
        }
        let now = shared.clock.now();
        {
            let mut state = shared.state.lock();
            let counts = state.counts();
            if let Err(reason) = state.holds.check(&it, counts, &shared.limits, now) {
                debug!(instance_type, %reason, "create held");
                return Err(ProberError::CreateHeld {
                    instance_type: instance_type.to_owned(),
                    reason,
                });
            }
            let pending = PendingCreate { since: now, instance_type: it.clone(), listed: None };
            state.creating.insert(secret.clone(), pending);
        }
        info!(instance_type, "creating an instance");
        self.notify();
        let (done, outcome) = tokio::sync::oneshot::channel();
        let pool = self.clone();
        runtime.spawn(async move {
            let result = pool.finish_create(secret, it, tags, init).await;
            let _ = done.send(result);
        });
        Ok(Creating { instance_type: instance_type.to_owned(), since: now, outcome })
    }

    /// The cloud call of a create, and what follows from its answer.
    async fn finish_create(
        &self,
        secret: String,
        it: InstanceType,
        tags: Tags,
        init: String,
    ) -> Result<InstanceId, ProberError> {
        let shared = &self.shared;
        let result = self.cloud("create", shared.instances.create(&it, &tags, &init)).await;
        let now = shared.clock.now();
        let mut state = shared.state.lock();
        state.creating.remove(&secret);
        let result = match result {
            Ok(instance) => {
                let id = instance.id.clone();
                if !state.workers.contains_key(&id) {
                    self.add_worker_locked(&mut state, instance, State::Booting, now);
                }
                Ok(id)
            }
            Err(e) => {
                if let Some(refusal) = e.refusal() {
                    let others = state.counts().total();
                    state.holds.refused(&refusal, &it, others, &shared.limits, now);
                }
                warn!(instance_type = it.name, error = %e, "create failed");
                Err(e)
            }
        };
        drop(state);
        // A worker appeared, or a create slot is free again.
        self.notify();
        result
    }

    fn add_worker_locked(
        &self,
        state: &mut PoolState,
        instance: Instance,
        initial: State,
        now: Moment,
    ) {
        let shared = &self.shared;
        let prefix = &shared.worker_config.tag_prefix;
        let mut idle_behavior = instance
            .tags
            .get(&Tag::IdleBehavior.key(prefix))
            .and_then(|v| v.parse::<IdleBehavior>().ok())
            .unwrap_or(IdleBehavior::Run);
        let instance_type =
            instance.tags.get(&Tag::InstanceType.key(prefix)).cloned().unwrap_or_default();
        // An instance of a type no longer configured was left by an earlier prober: it takes no
        // work and goes once idle. What this pool created (booting) is its own to run.
        let types = &shared.config.instance_types;
        if initial == State::Unknown
            && !types.is_empty()
            && !types.iter().any(|it| it.name == instance_type)
            && idle_behavior != IdleBehavior::Hold
        {
            warn!(worker = %instance.id, instance_type, "instance type is not in service; draining");
            idle_behavior = IdleBehavior::Drain;
        }
        let id = instance.id.clone();
        let executor = (shared.new_executor)(&instance);
        info!(worker = %id, state = %initial, %idle_behavior, instance_type, "instance appeared");
        let worker = Arc::new(Worker::new(
            WorkerSpec { instance, instance_type, state: initial, idle_behavior },
            executor,
            shared.worker_config.clone(),
            shared.clock.clone(),
            shared.brake.clone(),
        ));
        state.generation += 1;
        let generation = state.generation;
        // An instance this pool created is probed as soon as the cloud has answered: nothing
        // is gained by waiting, and its boot is seen as soon as it ends. Those a list found
        // have their first probes spread over one interval, so a fleet found at once (a
        // prober that restarted) is not probed at once.
        let first = match initial {
            State::Booting => now,
            _ => now + state.random_below(shared.config.probe_interval),
        };
        state.schedule.push(Reverse((first, generation, id.clone())));
        state.workers.insert(id, Entry { worker, generation });
        shared.schedule_changed.notify_one();
    }

    /// Reads the instance list and reconciles the workers with it. Returns the number of
    /// instances listed.
    pub async fn sync(&self) -> Result<usize, ProberError> {
        let shared = &self.shared;
        let threshold = shared.clock.now();
        if let Some(retry_after) = shared.state.lock().holds.list_held(threshold) {
            return Err(ProberError::RateLimited { retry_after });
        }
        let list = match self.cloud("list", shared.instances.list()).await {
            Ok(list) => list,
            Err(ProberError::RateLimited { retry_after }) => {
                shared.state.lock().holds.list_refused(retry_after, threshold);
                return Err(ProberError::RateLimited { retry_after });
            }
            Err(e) => return Err(e),
        };
        let now = shared.clock.now();
        let prefix = shared.worker_config.tag_prefix.clone();
        let timeout_shutdown = shared.worker_config.timeouts.shutdown;
        let mut seen = std::collections::HashSet::with_capacity(list.len());
        let mut known = Vec::new();
        let mut gone = Vec::new();
        {
            let mut state = shared.state.lock();
            for instance in &list {
                seen.insert(instance.id.clone());
                match state.workers.get(&instance.id) {
                    Some(entry) => known.push((entry.worker.clone(), instance.clone())),
                    None => {
                        // Ours if it carries the secret of a create still in flight.
                        let pending = instance
                            .tags
                            .get(&Tag::InstanceSecret.key(&prefix))
                            .and_then(|secret| state.creating.get_mut(secret));
                        let initial = match pending {
                            Some(pending) => {
                                pending.listed = Some(instance.id.clone());
                                State::Booting
                            }
                            None => State::Unknown,
                        };
                        self.add_worker_locked(&mut state, instance.clone(), initial, now);
                    }
                }
            }
            let missing: Vec<InstanceId> = state
                .workers
                .iter()
                .filter(|(id, entry)| !seen.contains(*id) && entry.worker.updated_at() <= threshold)
                .map(|(id, _)| id.clone())
                .collect();
            for id in missing {
                if let Some(entry) = state.workers.remove(&id) {
                    gone.push(entry.worker);
                }
            }
            let counts = state.counts();
            if state.holds.synced(counts) {
                info!(
                    instances = counts.instances,
                    "fewer instances than at the quota refusal; creates may go on"
                );
            }
            if !state.loaded {
                state.loaded = true;
                info!(instances = list.len(), "loaded initial instance list");
            }
        }
        for (worker, instance) in known {
            worker.executor().retarget(&instance);
            worker.sync_instance(instance);
            if worker.state() == State::Shutdown
                && worker.destroyed_at().is_some_and(|at| now.since(at) > timeout_shutdown)
            {
                info!(worker = %worker.id(), "instance still listed after shutdown; destroying again");
                worker.destroy_again();
            }
            self.apply(&worker).await;
        }
        for worker in gone {
            let last = worker.state();
            info!(worker = %worker.id(), state = %last, "instance disappeared in cloud");
            worker.report_outcome(BootOutcome::Disappeared);
            *shared.counters.lock().disappeared.entry(last).or_insert(0) += 1;
            self.apply(&worker).await;
            worker.close().await;
        }
        self.notify();
        Ok(list.len())
    }

    /// Runs a cloud call under the cloud deadline.
    async fn cloud<T>(
        &self,
        operation: &'static str,
        call: impl std::future::Future<Output = Result<T, ProberError>>,
    ) -> Result<T, ProberError> {
        let deadline = self.shared.config.cloud_deadline;
        tokio::time::timeout(deadline, call).await.unwrap_or_else(|_| {
            Err(ProberError::Timeout {
                worker: "cloud".into(),
                what: format!("{operation} call"),
                deadline,
            })
        })
    }

    /// Carries out what a worker decided.
    async fn apply(&self, worker: &Worker) {
        let effects = worker.take_effects();
        if effects.is_empty() {
            return;
        }
        let shared = &self.shared;
        let mut notify = false;
        for effect in effects {
            match effect {
                Effect::Destroy => {
                    let destroy = self.cloud("destroy", shared.instances.destroy(worker.id()));
                    if let Err(e) = destroy.await {
                        warn!(worker = %worker.id(), error = %e, "destroy failed; sync retries it");
                        shared.counters.lock().destroy_failures += 1;
                    }
                }
                Effect::SaveTags(tags) => {
                    let set_tags =
                        self.cloud("set_tags", shared.instances.set_tags(worker.id(), &tags));
                    if let Err(e) = set_tags.await {
                        warn!(worker = %worker.id(), error = %e, "error updating tags");
                    }
                }
                Effect::BootOutcome(outcome) => {
                    *shared.counters.lock().boot_outcomes.entry(outcome).or_insert(0) += 1;
                }
                Effect::TimeToReady(took) => shared.counters.lock().time_to_ready.observe(took),
                Effect::RunProbe { ok, took } => {
                    let mut counters = shared.counters.lock();
                    if ok { &mut counters.run_probe_ok } else { &mut counters.run_probe_fail }
                        .observe(took);
                }
                Effect::RunnerExited(id, at) => {
                    shared.state.lock().exited.insert(id, at);
                }
                Effect::Notify => notify = true,
            }
        }
        if notify {
            self.notify();
        }
    }

    /// When the next worker is due for a probe.
    pub fn next_due(&self) -> Option<Moment> {
        self.shared.state.lock().schedule.peek().map(|Reverse((due, _, _))| *due)
    }

    /// Takes the workers due now off the schedule and puts them back one interval later; tells
    /// subscribers if a create hold ended.
    fn take_due(&self) -> Vec<Arc<Worker>> {
        let shared = &self.shared;
        let now = shared.clock.now();
        let interval = shared.config.probe_interval;
        let mut state = shared.state.lock();
        let mut due = Vec::new();
        while let Some(Reverse((at, generation, _))) = state.schedule.peek() {
            if *at > now {
                break;
            }
            let (at, generation) = (*at, *generation);
            let Some(Reverse((_, _, id))) = state.schedule.pop() else { break };
            let Some(entry) = state.workers.get(&id) else { continue };
            if entry.generation != generation {
                continue;
            }
            let worker = entry.worker.clone();
            // The next probe one interval after this one was due, with a little jitter
            // either way; a pool that fell behind starts again from now. A worker still
            // booting is looked at again sooner.
            let jitter = state.random_below(interval / 16);
            let mut next = match worker.state() {
                State::Booting => now + reprobe_while_booting(worker.probe_age(), interval),
                _ => at + interval + jitter - interval / 32,
            };
            if next <= now {
                next = now + jitter;
            }
            state.schedule.push(Reverse((next, generation, id)));
            due.push(worker);
        }
        let holds_ended = state.holds.take_ended(now);
        drop(state);
        if holds_ended {
            // A scheduler waiting to create hears of it now, not at the next sync.
            info!("a create hold ended");
            self.notify();
        }
        self.update_brake(now, Duration::from_secs(1));
        due
    }

    /// Engages or releases the fleet brake from the workers' last probe results, unless it
    /// was done less than `gap` ago.
    fn update_brake(&self, now: Moment, gap: Duration) {
        let shared = &self.shared;
        {
            let mut state = shared.state.lock();
            if state.brake_checked.is_some_and(|at| now.since(at) < gap) {
                return;
            }
            state.brake_checked = Some(now);
        }
        // A probe that hangs until its deadline says nothing until then, but a worker that has
        // not passed one for two intervals (and a second) is failing all the same: counting it
        // lets the brake see an outage as it starts, not a deadline later.
        let silent = 2 * shared.config.probe_interval + Duration::from_secs(1);
        let (mut booted, mut failing) = (0usize, 0usize);
        for worker in self.worker_list() {
            if let Some(failed) = worker.failing(silent) {
                booted += 1;
                failing += usize::from(failed);
            }
        }
        let config = &shared.config.brake;
        let engage = failing >= config.min_failing
            && failing as f64 > config.max_failing_share * booted as f64;
        let reason = engage.then(|| {
            format!(
                "{failing} of {booted} booted workers fail their probes (more than {:.0}%): \
                 holding shutdowns of unresponsive workers",
                config.max_failing_share * 100.0
            )
        });
        if shared.brake.set(reason.clone()) {
            match reason {
                Some(reason) => warn!(failing, booted, "fleet brake engaged: {reason}"),
                None => info!(failing, booted, "fleet brake released"),
            }
        }
    }

    /// Looks after one worker: shuts it down if idle, sends due kill signals, probes it.
    async fn tend(&self, worker: Arc<Worker>) -> ProbeOutcome {
        if worker.state() == State::Shutdown {
            return ProbeOutcome::NotProbed;
        }
        if worker.shutdown_if_idle() {
            self.apply(&worker).await;
            return ProbeOutcome::NotProbed;
        }
        worker.kill_due().await;
        // A worker whose last probe failed may be shut down by this one: the brake must count
        // the failures of the others first, or in an outage the first workers past the probe
        // timeout go before a brake evaluated a moment earlier has seen the rest fail. An
        // engaged brake is the safe side and may be a second old.
        if worker.last_probe_failed() && !self.shared.brake.engaged() {
            self.update_brake(self.shared.clock.now(), Duration::from_millis(50));
        }
        let outcome = if worker.is_probing() {
            ProbeOutcome::AlreadyProbing
        } else {
            // Each command of a probe has its own deadline; this bound also holds for an
            // executor that ignores them.
            let config = &self.shared.worker_config;
            let bound = config.deploy_deadline + 4 * config.command_deadline;
            match self.shared.probes.acquire().await {
                Ok(_permit) => match tokio::time::timeout(bound, worker.probe_and_update()).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        warn!(worker = %worker.id(), ?bound, "probe overran every deadline; abandoned");
                        ProbeOutcome::Failed
                    }
                },
                Err(_) => ProbeOutcome::NotProbed,
            }
        };
        {
            let mut counters = self.shared.counters.lock();
            match outcome {
                ProbeOutcome::Passed => counters.probes[metrics::PASSED] += 1,
                ProbeOutcome::Failed => counters.probes[metrics::FAILED] += 1,
                ProbeOutcome::AlreadyProbing => counters.probes[metrics::SKIPPED] += 1,
                ProbeOutcome::NotProbed => {}
            }
        }
        self.apply(&worker).await;
        outcome
    }

    /// Probes every worker due now and waits for those probes; returns how many it looked
    /// after. The deterministic step the tests and simulations use.
    pub async fn probe_due(&self) -> usize {
        let due = self.take_due();
        let count = due.len();
        let mut tasks = tokio::task::JoinSet::new();
        for worker in due {
            let pool = self.clone();
            tasks.spawn(async move { pool.tend(worker).await });
        }
        while tasks.join_next().await.is_some() {}
        count
    }

    /// Spawns the probes due now without waiting for them (the real-time loop's step).
    pub(crate) fn spawn_due(&self) -> usize {
        let due = self.take_due();
        let count = due.len();
        for worker in due {
            let pool = self.clone();
            tokio::spawn(async move { pool.tend(worker).await });
        }
        count
    }

    /// Runs the pool on real time until [`Pool::stop`]: syncs every `sync_interval`, probes
    /// workers as they fall due. Must run inside a tokio runtime with timers.
    pub async fn run(&self) {
        let shared = &self.shared;
        let mut next_sync = shared.clock.now();
        while !shared.stopping.load(Ordering::Acquire) {
            let now = shared.clock.now();
            if now >= next_sync {
                if let Err(e) = self.sync().await {
                    warn!(error = %e, "sync failed");
                }
                next_sync = now + shared.config.sync_interval;
            }
            self.spawn_due();
            let now = shared.clock.now();
            let hold_ends = self.shared.state.lock().holds.next_end();
            let wake =
                [self.next_due(), hold_ends].into_iter().flatten().fold(next_sync, Moment::min);
            let wait = wake.since(now).clamp(Duration::from_millis(1), Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shared.schedule_changed.notified() => {}
                _ = shared.stop.notified() => {}
            }
        }
    }

    /// Makes [`Pool::run`] return.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.stop.notify_waiters();
    }

    /// Looks after worker `id` now, as its turn on the schedule would: shuts it down if it is
    /// idle too long, sends kill signals that are due, and probes it. For operators (a worker
    /// just fixed by hand) and tests. Its scheduled probes go on as before.
    pub async fn probe_now(&self, id: &InstanceId) -> Result<ProbeOutcome, ProberError> {
        let worker = self.worker(id)?;
        Ok(self.tend(worker).await)
    }

    /// Sets a worker's idle behaviour (saved in its tags); `drain` shuts an idle one down.
    pub async fn set_idle_behavior(
        &self,
        id: &InstanceId,
        idle_behavior: IdleBehavior,
    ) -> Result<(), ProberError> {
        let worker = self.worker(id)?;
        worker.set_idle_behavior(idle_behavior);
        self.apply(&worker).await;
        Ok(())
    }

    /// Shuts a booting or idle worker down (refused for `hold` and for busy workers).
    pub async fn shutdown(&self, id: &InstanceId) -> Result<(), ProberError> {
        let worker = self.worker(id)?;
        worker.shutdown()?;
        self.apply(&worker).await;
        Ok(())
    }

    /// Destroys an instance whatever its state or idle behaviour.
    pub async fn kill_instance(&self, id: &InstanceId, reason: &str) -> Result<(), ProberError> {
        let worker = self.worker(id)?;
        worker.kill_instance(reason);
        self.apply(&worker).await;
        Ok(())
    }

    /// Starts runner `runner` on worker `id` with `stdin`.
    pub async fn start_runner(
        &self,
        id: &InstanceId,
        runner: &str,
        stdin: &[u8],
    ) -> Result<(), ProberError> {
        let worker = self.worker(id)?;
        let result = worker.start_runner(runner, stdin).await;
        self.apply(&worker).await;
        result
    }

    /// Forgets runner `runner` on worker `id`: its start is known to have failed.
    pub async fn close_runner(&self, id: &InstanceId, runner: &str) -> Result<(), ProberError> {
        let worker = self.worker(id)?;
        worker.close_runner(runner);
        self.apply(&worker).await;
        Ok(())
    }

    /// Asks worker `id`'s runner how `runner` ended (see [`Worker::runner_outcome`]).
    pub async fn runner_outcome(
        &self,
        id: &InstanceId,
        runner: &str,
    ) -> Result<Option<RunnerOutcome>, ProberError> {
        self.worker(id)?.runner_outcome(runner).await
    }

    /// Says that the outcome of `runner`, which left worker `id`'s list, is in (or is not
    /// wanted): it no longer holds the worker's idle shutdown (see
    /// [`Timeouts::outcome_hold`](crate::Timeouts)), and a worker that only that kept is
    /// shut down now. Returns whether the outcome was awaited.
    pub async fn outcome_collected(
        &self,
        id: &InstanceId,
        runner: &str,
    ) -> Result<bool, ProberError> {
        let worker = self.worker(id)?;
        let awaited = worker.outcome_collected(runner);
        self.apply(&worker).await;
        Ok(awaited)
    }

    /// What every worker is told.
    pub fn worker_config(&self) -> &WorkerConfig {
        &self.shared.worker_config
    }

    /// The clock the pool reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.shared.clock
    }

    /// Begins killing runner `runner` wherever it runs; false if no worker knows it. The
    /// signals are sent as the worker's schedule comes round.
    pub async fn kill_runner(&self, runner: &str, reason: &str) -> bool {
        for worker in self.worker_list() {
            if worker.kill_runner(runner, reason) {
                worker.kill_due().await;
                self.apply(&worker).await;
                return true;
            }
        }
        false
    }

    /// The metrics in Prometheus text format.
    pub fn metrics(&self) -> String {
        let now = self.shared.clock.now();
        let mut gauges = Gauges {
            brake_engaged: self.shared.brake.engaged(),
            at_quota: self.at_quota(),
            ..Gauges::default()
        };
        let mut ages = Vec::new();
        for worker in self.worker_list() {
            let view = worker.view();
            *gauges.by_state.entry(view.state).or_insert(0) += 1;
            *gauges.by_category.entry(Category::of(&view)).or_insert(0) += 1;
            if let Some(price) = self.instance_type(&view.instance_type).price {
                *gauges.price_by_category.entry(Category::of(&view)).or_insert(0.0) +=
                    price.hourly();
            }
            gauges.runners_running += view.running.len() as u64;
            if view.state != State::Shutdown {
                ages.push(view.probe_age.as_secs_f64());
            }
        }
        let _ = now;
        ages.sort_by(f64::total_cmp);
        gauges.probe_age_max = ages.last().copied().unwrap_or(0.0);
        gauges.probe_age_median = ages.get(ages.len() / 2).copied().unwrap_or(0.0);
        metrics::render(&self.shared.counters.lock(), &gauges)
    }
}

/// One instance of the pool, as [`Pool::instances`] shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum InstanceView {
    /// A create in flight: the cloud has not answered, and no list has shown it yet.
    Creating {
        /// The type asked for.
        instance_type: String,
        /// When the create began.
        since: Moment,
    },
    /// A worker (boxed: a view is many times the size of a create in flight).
    Worker(Box<WorkerView>),
}

impl InstanceView {
    /// The instance id; `None` for a create in flight.
    pub fn id(&self) -> Option<&InstanceId> {
        match self {
            InstanceView::Creating { .. } => None,
            InstanceView::Worker(view) => Some(&view.id),
        }
    }

    /// The instance type.
    pub fn instance_type(&self) -> &str {
        match self {
            InstanceView::Creating { instance_type, .. } => instance_type,
            InstanceView::Worker(view) => &view.instance_type,
        }
    }

    /// The worker's state; `booting` for a create in flight.
    pub fn state(&self) -> State {
        match self {
            InstanceView::Creating { .. } => State::Booting,
            InstanceView::Worker(view) => view.state,
        }
    }

    /// The idle behaviour; `run` for a create in flight.
    pub fn idle_behavior(&self) -> IdleBehavior {
        match self {
            InstanceView::Creating { .. } => IdleBehavior::Run,
            InstanceView::Worker(view) => view.idle_behavior,
        }
    }
}

/// A create [`Pool::create`] began: what it is, and how it ends.
#[derive(Debug)]
pub struct Creating {
    instance_type: String,
    since: Moment,
    outcome: tokio::sync::oneshot::Receiver<Result<InstanceId, ProberError>>,
}

impl Creating {
    /// The type asked for.
    pub fn instance_type(&self) -> &str {
        &self.instance_type
    }

    /// When the create began.
    pub fn since(&self) -> Moment {
        self.since
    }

    /// Waits for the cloud's answer: the new instance's id, or why the create failed (the
    /// pool has logged it and learned from it already).
    pub async fn finished(self) -> Result<InstanceId, ProberError> {
        self.outcome.await.unwrap_or_else(|_| {
            Err(ProberError::Cloud {
                operation: "create",
                detail: "the create was abandoned: its runtime shut down".into(),
            })
        })
    }
}

/// The shortest wait between probes of a booting worker.
const MIN_BOOT_REPROBE: Duration = Duration::from_millis(250);

/// How soon a worker this pool created is probed again while it boots: after half the time it
/// has been booting, at least [`MIN_BOOT_REPROBE`] and at most `interval`. An instance that is
/// up in a second is seen within a fraction of a second more, not an interval later; one that
/// boots in minutes costs a handful of probes more than at the interval alone.
pub(crate) fn reprobe_while_booting(booting_for: Duration, interval: Duration) -> Duration {
    (booting_for / 2).clamp(MIN_BOOT_REPROBE.min(interval), interval)
}

/// 20 random bytes as hex, from the kernel.
fn random_secret() -> Result<String, ProberError> {
    use std::io::Read;
    let mut bytes = [0u8; 20];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(
        |e| ProberError::Cloud {
            operation: "create",
            detail: format!("cannot read /dev/urandom for the instance secret: {e}"),
        },
    )?;
    Ok(crate::config::hex(&bytes))
}

/// `it` at the price the cloud reported for it, if it did.
fn priced(mut it: InstanceType, prices: &HashMap<String, Price>) -> InstanceType {
    if let Some(price) = prices.get(&it.name) {
        it.price = Some(*price);
    }
    it
}
