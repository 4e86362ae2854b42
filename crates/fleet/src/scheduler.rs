//! The [`Scheduler`]: places work on the pool's workers, follows it until it ends, and writes
//! every change to its [`FleetStore`] before anyone hears of it.
//!
//! Work is a [`Submission`]: an id, a payload the runner reads on stdin when it starts, what it
//! needs of a worker and its reschedule policy. The scheduler keeps a queue in submission order
//! and, whenever the pool changes or work arrives, puts queued work on a worker that takes work
//! (`idle` or `running`, idle behaviour `run`, fewer than [`SchedulerConfig::per_worker_limit`]
//! runners) and has what it needs, the best fit (see [`placement`](crate::placement)); work
//! that fits nowhere waits with its reason ([`Scheduler::waiting_reason`]). From then on the
//! workers' run probes are the truth:
//!
//! - a start the runner acknowledged is `running`; one that failed cleanly (the command ran
//!   and refused) is tried again on another worker, up to [`SchedulerConfig::max_start_attempts`],
//!   and the worker that refused gets no work for [`SchedulerConfig::start_failure_backoff`];
//!   one whose answer was lost (a timeout, a dropped connection) may have started, so it counts
//!   as running until a probe says otherwise;
//! - work a probe no longer lists has ended: the runner is asked how
//!   ([`RunnerConfig::outcome_args`](wharf_prober::RunnerConfig)), and work the runner never
//!   received after a start that was not acknowledged goes back to the queue. The worker
//!   keeps the runner as awaiting its outcome, which holds its idle shutdown (a drained worker
//!   goes as soon as it is idle) for at most [`Timeouts::outcome_hold`](wharf_prober::Timeouts):
//!   the scheduler asks again while a question fails and the worker still waits, and tells the
//!   pool once the answer is durable, or that it wants none
//!   ([`Pool::outcome_collected`]);
//! - work on a worker that is shut down or gone is lost; but work the worker's last probe saw
//!   end before it went (a drained worker goes as soon as it is idle) has ended, and the
//!   worker is asked how, and work whose worker is being asked is judged by the answer, never
//!   written off while it is on its way. Lost work, and work that ended
//!   `failed`, is placed again as its reschedule policy says (see [`reschedule`]),
//!   as a new attempt under its own runner id; otherwise it stays `lost` (or `ended`). An
//!   attempt that was written off and is found running again is stopped;
//! - work a probe finds that the scheduler does not know is adopted as running, so nothing is
//!   started twice and nothing is killed by mistake.
//!
//! **Nothing is lost.** Every change to a placement is journalled to the store in order, under
//! the scheduler's [`Term`]: a submission or a stop is answered only once it is durable, and a
//! start or a stop is sent to a worker only once the decision behind it is durable and while
//! the term [holds](Term::holds). A scheduler that starts over (the process restarted, or
//! another replica took over) loads the records and carries on: work that was starting counts
//! as possibly running until a probe says, work in the queue keeps its place. If a write fails
//! or the term is lost, the scheduler stops acting; [`Scheduler::run`] returns.
//!
//! The placement decision is pure: the scheduler's books and a snapshot of the pool (its
//! workers, its creates in flight, the time) go in; the starts, the questions, the stops and
//! the creates come out, with the books updated, and are tested as a table. [`Scheduler::step`]
//! takes the snapshot, decides under one short lock and carries the decisions out, so tests
//! also drive it step by step on a fake clock with scripted workers; [`Scheduler::run`] is the
//! same on real time.

use crate::FleetError;
use crate::placement::{Placer, Slot};
use crate::reschedule;
use crate::store::{Change, FleetStore, Term};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};
use wharf_prober::{
    Clock, IdleBehavior, InstanceId, InstanceView, Moment, Pool, ProberError, State, WorkerView,
};
use wharf_state::Timestamp;
use wharf_state::fleet::{
    ATTEMPT_SEPARATOR, Attempt, Phase, Placement, RescheduleEvent, WorkRecord, parse_runner_id,
};
use wharf_state::reschedule::ReschedulePolicy;
use wharf_state::resources::Amount;

/// A count limit as configured: 0 means no limit.
fn limit(configured: usize) -> usize {
    if configured == 0 { usize::MAX } else { configured }
}

/// Most changes one journal entry carries: what a commit may. An entry is what one decision
/// changed and is committed whole, never split; a step that would change more stops there,
/// and the next step (at once) goes on.
pub(crate) const MAX_CHANGES_PER_ENTRY: usize = crate::store::MAX_CHANGES_PER_COMMIT;

/// The most changes one record's decision makes: the record, and the oldest finished record
/// it pushes out.
const CHANGES_PER_DECISION: usize = 2;

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
    /// The wall-clock time at the pool clock's origin: records carry wall-clock times, so that
    /// another process reads them right.
    pub wall_origin: Timestamp,
}

impl SchedulerConfig {
    /// Whether work refused `attempts` times may be tried again.
    fn may_retry(&self, attempts: u32) -> bool {
        self.max_start_attempts == 0 || attempts < self.max_start_attempts
    }

    /// The wall-clock time of `moment`.
    pub fn wall(&self, moment: Moment) -> Timestamp {
        self.wall_origin.saturating_add(moment.since_origin())
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
            wall_origin: Timestamp(0),
        }
    }
}

/// Work to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// Its id: printable ASCII without spaces, without `__` (attempts use it), and new.
    pub id: String,
    /// What the runner reads on its standard input when an attempt starts.
    pub payload: String,
    /// What it needs of a worker.
    pub needs: Amount,
    /// How it is placed again after it is lost or fails.
    pub reschedule: ReschedulePolicy,
}

impl Submission {
    /// Work `id` with `payload`, needing nothing in particular and never rescheduled.
    pub fn new(id: impl Into<String>, payload: impl Into<String>) -> Submission {
        Submission {
            id: id.into(),
            payload: payload.into(),
            needs: Amount::ZERO,
            reschedule: ReschedulePolicy::DISABLED,
        }
    }

    /// The same, rescheduled by `policy`.
    pub fn with_reschedule(mut self, policy: ReschedulePolicy) -> Submission {
        self.reschedule = policy;
        self
    }

    /// The same, needing `needs` of a worker.
    pub fn with_needs(mut self, needs: Amount) -> Submission {
        self.needs = needs;
        self
    }
}

#[derive(Debug)]
struct Entry {
    placement: Placement,
    payload: Arc<str>,
    /// An outcome query for it is in flight.
    asking: bool,
    /// An unacknowledged start an earlier term left: its command may still be on its way to
    /// the worker until [`Books::inherited_grace_until`].
    inherited_start: bool,
    /// This scheduler asked the worker to stop it (a stop is sent once a worker lists it).
    stop_sent: bool,
    /// Queued: why the last step placed it nowhere.
    waiting: Option<String>,
}

impl Entry {
    fn new(placement: Placement, payload: Arc<str>) -> Entry {
        Entry {
            placement,
            payload,
            asking: false,
            inherited_start: false,
            stop_sent: false,
            waiting: None,
        }
    }

    fn record(&self) -> WorkRecord {
        WorkRecord { placement: self.placement.clone(), payload: self.payload.to_string() }
    }
}

#[derive(Debug, Default)]
struct Counters {
    submitted: u64,
    started: u64,
    start_refusals: u64,
    adopted: u64,
    rescheduled: u64,
    stopped_after_lost: u64,
    finished: BTreeMap<&'static str, u64>,
    /// Submit to acknowledged start, for work started here.
    start_latency_sum: f64,
    start_latency_count: u64,
}

/// The scheduler's books: every piece of work it knows, the queue, and the workers backing
/// off after a refused start. [`Books::decide`] is the pure decision over them; every change
/// to an entry is marked, for the journal.
#[derive(Debug, Default)]
pub(crate) struct Books {
    entries: HashMap<String, Entry>,
    queue: VecDeque<String>,
    finished: VecDeque<String>,
    backoff: HashMap<InstanceId, Timestamp>,
    counters: Counters,
    /// Entries changed (or forgotten) since the journal last took the changes.
    changed: BTreeSet<String>,
    /// The sequence number of the last changes sent to the journal.
    sequence: u64,
    /// Until then, an unacknowledged start an earlier term left is not judged by its absence
    /// from the worker: its command may still be running (each ends at its deadline, even
    /// after the process that ran it is gone).
    inherited_grace_until: Option<Timestamp>,
}

/// A start the scheduler decided on.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) id: String,
    pub(crate) runner_id: String,
    pub(crate) worker: InstanceId,
    payload: Arc<str>,
}

/// What one step decided, to be carried out outside the lock.
#[derive(Debug, Default)]
pub(crate) struct Decisions {
    /// Work to start, and where.
    pub(crate) launches: Vec<Launch>,
    /// Work a worker no longer lists: ask it how that ended (work id, worker).
    pub(crate) ask: Vec<(String, InstanceId)>,
    /// Runner ids written off that a worker still runs: stop them.
    pub(crate) stop: Vec<String>,
    /// Runner ids whose stop was asked (before a take-over, or before a worker listed them)
    /// and not yet sent to the worker that runs them.
    pub(crate) stop_asked: Vec<String>,
    /// Runners that left a worker's list whose outcome the books have, or do not want (the
    /// worker, runner id): the worker need not wait for the question any longer.
    pub(crate) collected: Vec<(InstanceId, String)>,
    /// Workers to create, to keep the minimum.
    pub(crate) creates: usize,
    /// Instance types to create one of each, for work no worker has room for.
    pub(crate) creates_for_work: Vec<String>,
    /// A placement changed: subscribers should hear of it.
    pub(crate) changed: bool,
    /// The step stopped at its budget of changes: the next one goes on at once.
    pub(crate) more: bool,
}

/// How an attempt ended, as the scheduler learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    /// The runner said how (`complete ...`, `failed ...`).
    Ended { worker: String, outcome: String },
    /// Its worker went, or forgot it.
    Lost { worker: String, reason: String },
}

/// Where the journal stands: every change up to a sequence number is durable, or writing
/// failed and nothing more will be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Durable {
    Upto(u64),
    Failed(String),
}

#[derive(Debug)]
struct Shared {
    pool: Pool,
    clock: Arc<dyn Clock>,
    config: SchedulerConfig,
    store: Arc<dyn FleetStore>,
    term: Term,
    inner: Mutex<Books>,
    /// Changes in order, to the writer; their sequence numbers count from 1.
    journal: mpsc::UnboundedSender<(u64, Vec<Change>)>,
    durable: watch::Receiver<Durable>,
    wake: tokio::sync::Notify,
    changed: watch::Sender<u64>,
    stopping: AtomicBool,
}

/// Places work on a [`Pool`]'s workers. Cheap to clone: clones share the scheduler.
#[derive(Debug, Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    /// Takes over as the scheduler of `pool` under `term`: loads every record from `store`
    /// and carries on from them (queued work keeps its order; work that was starting counts
    /// as possibly running). Records the store cannot read are logged, never overwritten.
    pub async fn take_over(
        pool: Pool,
        config: SchedulerConfig,
        store: Arc<dyn FleetStore>,
        term: Term,
    ) -> Result<Scheduler, FleetError> {
        let loaded = store.load_all().await?;
        for (key, why) in &loaded.problems {
            warn!(key, why, "a fleet record cannot be read; it is left as it is");
        }
        let mut books = Books::from_records(loaded.records, &config);
        // A start command outlives the process that sent it by its deadline at most (it runs
        // under `timeout` on the worker), and `timeout` kills a second after that.
        let grace = pool.worker_config().command_deadline + Duration::from_secs(2);
        books.inherited_grace_until = Some(config.wall(pool.clock().now()).saturating_add(grace));
        info!(
            term = term.number(),
            work = books.entries.len(),
            queued = books.queue.len(),
            "scheduler taking over"
        );
        let (journal, writes) = mpsc::unbounded_channel();
        // What the load changed (starts in flight counted as running) stands record by record:
        // it goes in entries of its own, within the budget of one.
        for chunk in books.take_changes().chunks(MAX_CHANGES_PER_ENTRY) {
            books.sequence += 1;
            let _ = journal.send((books.sequence, chunk.to_vec()));
        }
        let (durable_sender, durable) = watch::channel(Durable::Upto(0));
        tokio::spawn(write_journal(store.clone(), term.clone(), writes, durable_sender));
        Ok(Scheduler {
            shared: Arc::new(Shared {
                clock: pool.clock().clone(),
                pool,
                config,
                store,
                term,
                inner: Mutex::new(books),
                journal,
                durable,
                wake: tokio::sync::Notify::new(),
                changed: watch::Sender::new(0),
                stopping: AtomicBool::new(false),
            }),
        })
    }

    /// The pool it places work on.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// How it places work.
    pub fn config(&self) -> &SchedulerConfig {
        &self.shared.config
    }

    /// The term it acts under.
    pub fn term(&self) -> &Term {
        &self.shared.term
    }

    /// The store it writes.
    pub fn store(&self) -> &Arc<dyn FleetStore> {
        &self.shared.store
    }

    /// A subscription to changes of any placement: `changed().await` returns once something
    /// changed since the receiver last looked.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    fn notify(&self) {
        self.shared.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn now(&self) -> Timestamp {
        self.shared.config.wall(self.shared.clock.now())
    }

    /// Sends the changes marked in `books` to the journal; returns the sequence number to
    /// wait for (that of the last changes sent, if there are none now).
    fn journal(&self, books: &mut Books) -> u64 {
        let changes = books.take_changes();
        debug_assert!(
            changes.len() <= MAX_CHANGES_PER_ENTRY,
            "a journal entry of {} changes: decisions must stay within their budget",
            changes.len()
        );
        if !changes.is_empty() {
            books.sequence += 1;
            // A closed journal has failed already; waiting on it says so.
            let _ = self.shared.journal.send((books.sequence, changes));
        }
        books.sequence
    }

    /// Waits until every change up to `sequence` is durable.
    async fn durable(&self, sequence: u64) -> Result<(), FleetError> {
        let mut durable = self.shared.durable.clone();
        let state = durable
            .wait_for(|d| {
                matches!(d, Durable::Failed(_)) || matches!(d, Durable::Upto(n) if *n >= sequence)
            })
            .await
            .map_err(|_| FleetError::Store {
                operation: "commit",
                detail: "the journal writer stopped".into(),
            })?
            .clone();
        match state {
            Durable::Failed(detail) => {
                Err(FleetError::NotLeading { detail: format!("writes failed: {detail}") })
            }
            Durable::Upto(_) => Ok(()),
        }
    }

    /// Whether the scheduler may act now: its term holds and its writes succeed.
    pub fn acting(&self) -> bool {
        self.shared.term.holds() && !matches!(*self.shared.durable.borrow(), Durable::Failed(_))
    }

    /// Queues `submission`, and returns once its record is durable. The id must be printable
    /// ASCII without spaces (the runner-list grammar carries it), without `__`, and new.
    pub async fn submit(&self, submission: Submission) -> Result<Placement, FleetError> {
        let id = submission.id.clone();
        let refuse = |reason: String| FleetError::Submit { id: id.clone(), reason };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refuse("an id must be printable ASCII without spaces".into()));
        }
        if id.contains(ATTEMPT_SEPARATOR) {
            return Err(refuse(format!(
                "{ATTEMPT_SEPARATOR:?} is reserved: it separates a reschedule's attempt number"
            )));
        }
        let prefix = &self.shared.pool.worker_config().cluster_prefix;
        if !id.starts_with(prefix.as_str()) {
            return Err(refuse(format!("ids of this cluster start with {prefix:?}")));
        }
        if !self.acting() {
            return Err(FleetError::NotLeading { detail: "this scheduler's term is over".into() });
        }
        let now = self.now();
        let (placement, sequence) = {
            let mut books = self.shared.inner.lock();
            if books.entries.contains_key(&id) {
                return Err(refuse("that id is taken".into()));
            }
            if books.queue.len() >= limit(self.shared.config.max_queued) {
                return Err(FleetError::QueueFull { id, limit: self.shared.config.max_queued });
            }
            let placement = Placement::queued(&id, now, submission.needs, submission.reschedule);
            let entry = Entry::new(placement.clone(), submission.payload.into());
            books.entries.insert(id.clone(), entry);
            books.queue.push_back(id.clone());
            books.counters.submitted += 1;
            books.touch(&id);
            (placement, self.journal(&mut books))
        };
        self.durable(sequence).await?;
        info!(work = %id, "work queued");
        self.shared.wake.notify_one();
        self.notify();
        Ok(self.get(&id).unwrap_or(placement))
    }

    /// One piece of work.
    pub fn get(&self, id: &str) -> Option<Placement> {
        self.shared.inner.lock().entries.get(id).map(|e| e.placement.clone())
    }

    /// Why queued work `id` waits: the reason the last step placed it nowhere (no worker has
    /// room, or none has what it needs, with the most any has), or its reschedule delay.
    pub fn waiting_reason(&self, id: &str) -> Option<String> {
        let books = self.shared.inner.lock();
        let entry = books.entries.get(id)?;
        (entry.placement.phase == Phase::Queued).then(|| entry.waiting.clone()).flatten()
    }

    /// What the work placed on each worker needs, by worker (work that is starting or running;
    /// adopted work counts as needing nothing).
    pub fn usage(&self) -> BTreeMap<String, Amount> {
        let books = self.shared.inner.lock();
        let mut usage: BTreeMap<String, Amount> = BTreeMap::new();
        for entry in books.entries.values() {
            if let Phase::Starting { worker } | Phase::Running { worker } = &entry.placement.phase {
                let total = usage.entry(worker.clone()).or_insert(Amount::ZERO);
                *total = *total + entry.placement.needs;
            }
        }
        usage
    }

    /// All work it knows, oldest first.
    pub fn list(&self) -> Vec<Placement> {
        let mut all: Vec<Placement> =
            self.shared.inner.lock().entries.values().map(|e| e.placement.clone()).collect();
        all.sort_by(|a, b| (a.submitted, &a.id).cmp(&(b.submitted, &b.id)));
        all
    }

    /// Stops work, once the stop is durable: queued work is cancelled, started work is killed
    /// on its worker (and ends as the runner reports once the probes stop listing it). Either
    /// way it is never placed or rescheduled again. Final work is left as it is.
    pub async fn stop(&self, id: &str, reason: &str) -> Result<Placement, FleetError> {
        let now = self.now();
        let (running, sequence) = {
            let mut books = self.shared.inner.lock();
            let books = &mut *books;
            let entry =
                books.entries.get_mut(id).ok_or_else(|| FleetError::UnknownWork(id.to_owned()))?;
            let runner_id = entry.placement.runner_id();
            let running = match entry.placement.phase {
                Phase::Queued => {
                    entry.placement.stop_requested = true;
                    books.queue.retain(|queued| queued != id);
                    books.finish(id, Phase::Cancelled, now, &self.shared.config);
                    None
                }
                Phase::Starting { .. } | Phase::Running { .. } => {
                    entry.placement.stop_requested = true;
                    entry.stop_sent = true;
                    books.touch(id);
                    Some(runner_id)
                }
                _ => None,
            };
            (running, self.journal(books))
        };
        self.durable(sequence).await?;
        if let Some(runner_id) = running {
            self.send_stop(id, &runner_id, reason).await;
        }
        self.notify();
        self.get(id).ok_or_else(|| FleetError::UnknownWork(id.to_owned()))
    }

    /// Asks the worker that runs `runner_id` to stop it; if none lists it yet, the stop is sent
    /// again once one does.
    async fn send_stop(&self, id: &str, runner_id: &str, reason: &str) {
        if self.acting() && self.shared.pool.kill_runner(runner_id, reason).await {
            return;
        }
        debug!(work = %id, "no worker lists it (yet); stopping it when one does");
        if let Some(entry) = self.shared.inner.lock().entries.get_mut(id)
            && entry.placement.runner_id() == runner_id
        {
            entry.stop_sent = false;
        }
    }

    /// Reconciles the work with the workers, then starts what fits; waits for those starts and
    /// for the outcome queries it made. Returns how many starts it made. The deterministic step
    /// tests use; [`Scheduler::run`] does the same without waiting.
    pub async fn step(&self) -> usize {
        let (decisions, sequence) = self.decide();
        let launched = decisions.launches.len();
        let mut work = tokio::task::JoinSet::new();
        self.carry_out(decisions, sequence, |future| {
            work.spawn(future);
        });
        while work.join_next().await.is_some() {}
        // What the starts and the answers changed is durable before the step returns.
        let sequence = self.journal(&mut self.shared.inner.lock());
        let _ = self.durable(sequence).await;
        launched
    }

    /// Runs on real time until [`Scheduler::stop_running`], until its term is lost, or until a
    /// write fails: a step whenever the pool changes, work arrives or a start ends, and at
    /// least once a second.
    pub async fn run(&self) {
        let mut pool_changes = self.shared.pool.subscribe();
        let mut durable = self.shared.durable.clone();
        while !self.shared.stopping.load(Ordering::Acquire) && self.acting() {
            let (decisions, sequence) = self.decide();
            if decisions.more {
                self.shared.wake.notify_one();
            }
            self.carry_out(decisions, sequence, |future| {
                tokio::spawn(future);
            });
            tokio::select! {
                _ = pool_changes.changed() => {}
                () = self.shared.wake.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = self.shared.term.lost() => {}
                _ = durable.wait_for(|d| matches!(d, Durable::Failed(_))) => {}
            }
        }
        if !self.acting() {
            warn!(
                term = self.shared.term.number(),
                "the scheduler stops: its term is over or its writes fail"
            );
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
        for phase in Phase::NAMES {
            let n = by_phase.get(phase).copied().unwrap_or(0);
            let _ = writeln!(out, "wharf_fleet_work{{phase=\"{phase}\"}} {n}");
        }
        let totals = [
            ("submitted", "Work submitted.", c.submitted),
            ("started", "Starts a worker acknowledged.", c.started),
            ("start_refusals", "Starts a worker refused.", c.start_refusals),
            ("adopted", "Work found running that was not started here.", c.adopted),
            ("rescheduled", "Attempts placed again after one was lost or failed.", c.rescheduled),
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
    /// the pool and the time go into [`Books::decide`], which is pure. Returns the decisions
    /// and the journal's sequence number they must wait for.
    fn decide(&self) -> (Decisions, u64) {
        let shared = &self.shared;
        let snapshot = Snapshot::of(&shared.pool, self.now());
        let (decisions, sequence) = {
            let mut books = shared.inner.lock();
            let decisions = books.decide(&snapshot, &shared.config);
            (decisions, self.journal(&mut books))
        };
        if decisions.changed {
            self.notify();
        }
        (decisions, sequence)
    }

    /// Starts, asks and stops as decided, each once the decisions are durable and while the
    /// term holds; `spawn` runs each call (detached, or in a set the caller waits on).
    fn carry_out(
        &self,
        decisions: Decisions,
        sequence: u64,
        mut spawn: impl FnMut(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>),
    ) {
        for launch in decisions.launches {
            let scheduler = self.clone();
            spawn(Box::pin(async move {
                if scheduler.ready(sequence).await {
                    scheduler.start(launch).await;
                }
            }));
        }
        for (id, worker) in decisions.ask {
            let scheduler = self.clone();
            spawn(Box::pin(async move {
                if scheduler.ready(sequence).await {
                    scheduler.ask_outcome(id, worker).await;
                }
            }));
        }
        for runner_id in decisions.stop_asked {
            let scheduler = self.clone();
            spawn(Box::pin(async move {
                if scheduler.ready(sequence).await {
                    let (id, _) = parse_runner_id(&runner_id);
                    info!(runner = %runner_id, "sending a stop asked earlier");
                    scheduler.send_stop(id, &runner_id, "stopped through the fleet").await;
                }
            }));
        }
        for runner_id in decisions.stop {
            let scheduler = self.clone();
            spawn(Box::pin(async move {
                if scheduler.ready(sequence).await
                    && scheduler.shared.pool.kill_runner(&runner_id, "it was written off").await
                {
                    info!(runner = %runner_id, "stopping work that was written off");
                    scheduler.shared.inner.lock().counters.stopped_after_lost += 1;
                }
            }));
        }
        for (worker, runner_id) in decisions.collected {
            let scheduler = self.clone();
            spawn(Box::pin(async move {
                if scheduler.ready(sequence).await {
                    debug!(%worker, runner = %runner_id, "its outcome is in the books");
                    if let Err(e) =
                        scheduler.shared.pool.outcome_collected(&worker, &runner_id).await
                    {
                        debug!(%worker, runner = %runner_id, error = %e, "cannot let the worker go");
                    }
                }
            }));
        }
        // Creates return at once; the pool runs them and tells its subscribers how they went.
        if self.acting() {
            for instance_type in &decisions.creates_for_work {
                match self.shared.pool.create(instance_type) {
                    Ok(_) => info!(instance_type, "creating a worker for work that fits nowhere"),
                    Err(e) => {
                        debug!(instance_type, error = %e, "cannot create a worker for waiting work");
                        break;
                    }
                }
            }
        }
        if decisions.creates > 0 && self.acting() {
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
    }

    /// Waits for the journal up to `sequence`; true if the scheduler may then act.
    async fn ready(&self, sequence: u64) -> bool {
        self.durable(sequence).await.is_ok() && self.shared.term.holds()
    }

    /// Starts one attempt and records how the start went.
    async fn start(&self, launch: Launch) {
        let shared = &self.shared;
        let Launch { id, runner_id, worker, payload } = launch;
        let result = shared.pool.start_runner(&worker, &runner_id, payload.as_bytes()).await;
        let now = self.now();
        let mut refused = false;
        {
            let mut books = shared.inner.lock();
            let books = &mut *books;
            let Some(entry) = books.entries.get_mut(&id) else { return };
            if entry.placement.phase != (Phase::Starting { worker: worker.0.clone() })
                || entry.placement.runner_id() != runner_id
            {
                return;
            }
            match result {
                Ok(()) => {
                    info!(work = %id, %worker, "work started");
                    entry.placement.phase = Phase::Running { worker: worker.0.clone() };
                    entry.placement.confirmed = true;
                    entry.placement.started = Some(now);
                    let latency = now.since(entry.placement.submitted).as_secs_f64();
                    books.counters.started += 1;
                    books.counters.start_latency_sum += latency;
                    books.counters.start_latency_count += 1;
                }
                // The worker changed before the command ran: nothing happened there.
                Err(ProberError::NotAllowed { reason, .. }) => {
                    debug!(work = %id, %worker, reason, "worker no longer takes work; requeued");
                    entry.placement.starts -= 1;
                    entry.placement.phase = Phase::Queued;
                    books.queue.push_front(id.clone());
                }
                // The command ran and refused: it did not start.
                Err(e @ ProberError::CommandFailed { .. }) => {
                    warn!(work = %id, %worker, error = %e, "start refused");
                    refused = true;
                    books.counters.start_refusals += 1;
                    books.backoff.insert(
                        worker.clone(),
                        now.saturating_add(shared.config.start_failure_backoff),
                    );
                    if !shared.config.may_retry(entry.placement.starts) {
                        let reason =
                            format!("refused {} times; the last time: {e}", entry.placement.starts);
                        books.finish(&id, Phase::Failed { reason }, now, &shared.config);
                    } else {
                        entry.placement.phase = Phase::Queued;
                        books.queue.push_front(id.clone());
                    }
                }
                // The command never reached the worker (an id or path it cannot carry).
                Err(e @ ProberError::Unquotable { .. }) => {
                    books.finish(&id, Phase::Failed { reason: e.to_string() }, now, &shared.config);
                }
                Err(ProberError::UnknownWorker(_)) => {
                    entry.placement.starts -= 1;
                    entry.placement.phase = Phase::Queued;
                    books.queue.push_front(id.clone());
                }
                // The answer was lost: it may have started. The probes will tell.
                Err(e) => {
                    warn!(work = %id, %worker, error = %e, "start unconfirmed; the next probe decides");
                    entry.placement.phase = Phase::Running { worker: worker.0.clone() };
                }
            }
            books.touch(&id);
            self.journal(books);
        }
        if refused && let Err(e) = shared.pool.close_runner(&worker, &runner_id).await {
            debug!(work = %id, %worker, error = %e, "cannot forget the refused start");
        }
        self.notify();
        shared.wake.notify_one();
    }

    /// Asks the worker how an attempt it no longer lists ended.
    async fn ask_outcome(&self, id: String, worker: InstanceId) {
        let shared = &self.shared;
        let Some(runner_id) = self.get(&id).map(|p| p.runner_id()) else { return };
        let answer = shared.pool.runner_outcome(&worker, &runner_id).await;
        let not_ended = matches!(&answer, Ok(Some(line))
            if matches!(line.split(' ').next(), Some("pending" | "running")));
        let view = shared.pool.workers().into_iter().find(|w| w.id == worker);
        // Asked because its worker went after its last probe: what still runs went with it.
        let worker_out = view.as_ref().is_none_or(|w| w.state == State::Shutdown);
        // A question that failed is asked again while the worker waits for the answer.
        let ask_again = answer.is_err()
            && view.as_ref().is_some_and(|w| {
                w.state != State::Shutdown && w.awaiting_outcome.contains(&runner_id)
            });
        let now = self.now();
        let mut guard = shared.inner.lock();
        let books = &mut *guard;
        let Some(entry) = books.entries.get_mut(&id) else { return };
        entry.asking = false;
        if entry.placement.phase != (Phase::Running { worker: worker.0.clone() })
            || entry.placement.runner_id() != runner_id
        {
            return;
        }
        let confirmed = entry.placement.confirmed;
        let worker = worker.0;
        let end = match answer {
            Ok(None) => AttemptEnd::Ended { worker, outcome: "ended".into() },
            Ok(Some(line)) if line == "unknown" && confirmed => {
                AttemptEnd::Lost { worker, reason: "its worker no longer knows it".into() }
            }
            Ok(Some(line)) if line == "unknown" => {
                // The start never arrived: it can go elsewhere.
                if shared.config.may_retry(entry.placement.starts) {
                    info!(work = %id, %worker, "unconfirmed start never arrived; requeued");
                    entry.placement.phase = Phase::Queued;
                    books.queue.push_front(id.clone());
                    books.touch(&id);
                } else {
                    let reason =
                        format!("no start reached a worker in {} attempts", entry.placement.starts);
                    books.finish(&id, Phase::Failed { reason }, now, &shared.config);
                }
                self.journal(books);
                drop(guard);
                self.notify();
                shared.wake.notify_one();
                return;
            }
            Ok(Some(_)) if not_ended && !worker_out => {
                // Not ended after all (the probe raced its start): the next probe lists it.
                return;
            }
            Err(e) if ask_again => {
                debug!(work = %id, %worker, error = %e, "cannot learn how the work ended yet; asking again");
                return;
            }
            Ok(Some(_)) if not_ended => {
                // Still there, on a worker taken out of service: it went with its worker.
                let reason = format!("worker {worker} was shut down");
                AttemptEnd::Lost { worker, reason }
            }
            Ok(Some(line)) => AttemptEnd::Ended { worker, outcome: line },
            Err(e) if confirmed => AttemptEnd::Ended {
                worker,
                outcome: format!("ended; the worker cannot say how: {e}"),
            },
            Err(e) => AttemptEnd::Lost {
                worker,
                reason: format!(
                    "its start was not acknowledged and the worker cannot say whether it ran: {e}"
                ),
            },
        };
        books.end_attempt(&id, end, now, &shared.config);
        self.journal(books);
        drop(guard);
        self.notify();
        shared.wake.notify_one();
    }
}

/// Writes the journal's changes in order, each commit under `term`, and tells how far it got.
/// The first failure ends it: the scheduler may not act on what it cannot persist.
async fn write_journal(
    store: Arc<dyn FleetStore>,
    term: Term,
    mut writes: mpsc::UnboundedReceiver<(u64, Vec<Change>)>,
    durable: watch::Sender<Durable>,
) {
    let mut pending: Vec<(u64, Vec<Change>)> = Vec::new();
    loop {
        if pending.is_empty() {
            match writes.recv().await {
                Some(first) => pending.push(first),
                None => return,
            }
        }
        while let Ok(more) = writes.try_recv() {
            pending.push(more);
        }
        // Whole entries, as many as fit in one commit; a record's later change replaces its
        // earlier one in place, so it never goes before it.
        let mut batch: Vec<Change> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut upto = 0;
        let mut taken = 0;
        for (sequence, changes) in &pending {
            if batch.len() + changes.len() > MAX_CHANGES_PER_ENTRY && !batch.is_empty() {
                break;
            }
            for change in changes {
                match at.get(change.id()) {
                    Some(&index) => batch[index] = change.clone(),
                    None => {
                        at.insert(change.id().to_owned(), batch.len());
                        batch.push(change.clone());
                    }
                }
            }
            upto = *sequence;
            taken += 1;
        }
        pending.drain(..taken);
        if let Err(e) = store.commit(&term, batch).await {
            warn!(term = term.number(), error = %e, "the fleet's journal cannot be written");
            durable.send_replace(Durable::Failed(e.to_string()));
            return;
        }
        durable.send_replace(Durable::Upto(upto));
    }
}

/// One instance of the smallest type that fits each piece of work no worker had room for, as
/// Arvados' scheduler creates for containers it cannot place; less the instances of that type
/// already on their way (creates in flight, workers not yet booted). Nothing for work that no
/// type fits, or when no type says what it has.
fn creates_for_work(unplaced: &[Amount], snapshot: &Snapshot) -> Vec<String> {
    if snapshot.types.is_empty() {
        return Vec::new();
    }
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for needs in unplaced {
        if let Some((name, _)) =
            snapshot.types.iter().find(|(_, has)| has.shortfall(needs).is_none())
        {
            *wanted.entry(name).or_default() += 1;
        }
    }
    let mut creates = Vec::new();
    for (name, count) in wanted {
        let coming = snapshot.creating.get(name).copied().unwrap_or(0)
            + snapshot
                .workers
                .values()
                .filter(|v| {
                    v.instance_type == name && matches!(v.state, State::Unknown | State::Booting)
                })
                .count();
        creates.extend(std::iter::repeat_n(name.to_owned(), count.saturating_sub(coming)));
    }
    creates
}

/// What the scheduler sees of the pool at one moment: every worker, the creates in flight,
/// the time, and whether the pool has listed its instances yet.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) workers: HashMap<InstanceId, WorkerView>,
    /// Creates in flight, by instance type.
    pub(crate) creating: HashMap<String, usize>,
    pub(crate) now: Timestamp,
    pub(crate) loaded: bool,
    /// The instance types that say what an instance has, smallest first.
    pub(crate) types: Vec<(String, Amount)>,
}

impl Snapshot {
    fn of(pool: &Pool, now: Timestamp) -> Snapshot {
        let mut types: Vec<(String, Amount)> = pool
            .instance_types()
            .iter()
            .filter_map(|it| {
                let r = it.resources?;
                let has = Amount { cpu_mhz: r.cpu_mhz, memory_mb: r.memory_mb, cores: r.cores };
                Some((it.name.clone(), has))
            })
            .collect();
        types.sort_by_key(|(name, has)| (has.memory_mb, has.cpu_mhz, has.cores, name.clone()));
        let mut snapshot = Snapshot {
            workers: HashMap::new(),
            creating: HashMap::new(),
            now,
            loaded: pool.loaded(),
            types,
        };
        for instance in pool.instances() {
            match instance {
                InstanceView::Worker(view) => {
                    snapshot.workers.insert(view.id.clone(), *view);
                }
                InstanceView::Creating { instance_type, .. } => {
                    *snapshot.creating.entry(instance_type).or_default() += 1;
                }
            }
        }
        snapshot
    }
}

impl Books {
    /// The books of a scheduler that takes over: queued work in the order it was submitted,
    /// finished work in the order it finished.
    fn from_records(records: Vec<WorkRecord>, config: &SchedulerConfig) -> Books {
        let mut books = Books::default();
        let mut queued = Vec::new();
        let mut finished = Vec::new();
        for WorkRecord { placement, payload } in records {
            let id = placement.id.clone();
            match &placement.phase {
                Phase::Queued => queued.push((placement.submitted, id.clone())),
                phase if phase.is_final() => {
                    finished.push((placement.finished.unwrap_or(placement.submitted), id.clone()))
                }
                _ => {}
            }
            let mut entry = Entry::new(placement, payload.into());
            // A start in flight when the last scheduler stopped may have arrived: it counts as
            // running there until a probe says otherwise.
            if let Phase::Starting { worker } = &entry.placement.phase {
                entry.placement.phase = Phase::Running { worker: worker.clone() };
                books.changed.insert(id.clone());
            }
            entry.inherited_start = matches!(entry.placement.phase, Phase::Running { .. })
                && !entry.placement.confirmed;
            books.entries.insert(id, entry);
        }
        queued.sort();
        finished.sort();
        books.queue = queued.into_iter().map(|(_, id)| id).collect();
        books.finished = finished.into_iter().map(|(_, id)| id).collect();
        books.forget_oldest(config);
        books
    }

    /// Whether one more record's decision fits in the journal entry being made.
    fn has_room(&self) -> bool {
        self.changed.len() + CHANGES_PER_DECISION <= MAX_CHANGES_PER_ENTRY
    }

    /// Marks entry `id` changed: its revision goes up and the journal takes it.
    fn touch(&mut self, id: &str) {
        if let Some(entry) = self.entries.get_mut(id) {
            entry.placement.revision += 1;
        }
        self.changed.insert(id.to_owned());
    }

    /// The changes marked since the last call: each changed entry as it is now, and the
    /// entries forgotten since.
    pub(crate) fn take_changes(&mut self) -> Vec<Change> {
        let changed = std::mem::take(&mut self.changed);
        changed
            .into_iter()
            .map(|id| match self.entries.get(&id) {
                Some(entry) => Change::Put(entry.record()),
                None => Change::Delete(id),
            })
            .collect()
    }

    /// Decides, from a snapshot of the pool, what to start where, whom to ask how work
    /// ended, what to stop and how many workers to create; updates the books to match. Pure:
    /// the snapshot carries the time, and the caller carries the decisions out.
    pub(crate) fn decide(&mut self, snapshot: &Snapshot, config: &SchedulerConfig) -> Decisions {
        let Snapshot { workers: views, creating, now, loaded, .. } = snapshot;
        let now = *now;
        let creating: usize = creating.values().sum();
        let mut decisions = Decisions::default();
        if !loaded {
            // Until the pool has listed its instances once (a scheduler that just took over),
            // a worker missing from it may simply not be known yet: nothing is judged.
            return decisions;
        }
        let mut changed = false;

        // Work believed running: still listed, gone with its worker, or ended.
        let running: Vec<(String, String)> = self
            .entries
            .values()
            .filter_map(|e| match &e.placement.phase {
                Phase::Running { worker } => Some((e.placement.id.clone(), worker.clone())),
                _ => None,
            })
            .collect();
        for (id, worker) in running {
            if !self.has_room() {
                decisions.more = true;
                break;
            }
            let worker_id = InstanceId(worker.clone());
            let Some((runner_id, asking)) =
                self.entries.get(&id).map(|e| (e.placement.runner_id(), e.asking))
            else {
                continue;
            };
            let lost = match views.get(&worker_id) {
                // Unlisted before its worker went: the question in flight says how it ended.
                None if asking => continue,
                None => Some(format!("worker {worker} disappeared")),
                // Shut down while it last listed the work (or its start): the work went with it.
                // A worker its last probe found without the work, such as a drained worker shut
                // down for being idle, ran it to its end first: it is asked below how it ended.
                Some(view)
                    if view.state == State::Shutdown
                        && (view.running.contains(&runner_id)
                            || view.starting.contains(&runner_id)) =>
                {
                    Some(format!("worker {worker} was shut down"))
                }
                Some(_) => None,
            };
            if let Some(reason) = lost {
                warn!(work = %id, %worker, reason, "work lost");
                self.end_attempt(&id, AttemptEnd::Lost { worker, reason }, now, config);
                changed = true;
                continue;
            }
            let view = &views[&worker_id];
            // A worker whose run probe has not passed yet (a scheduler that just took over sees
            // every worker so) lists nothing: its silence says nothing about the work.
            if !matches!(view.state, State::Idle | State::Running | State::Shutdown) {
                continue;
            }
            let Some(entry) = self.entries.get_mut(&id) else { continue };
            if view.running.contains(&runner_id) {
                if entry.placement.stop_requested && !entry.stop_sent {
                    entry.stop_sent = true;
                    decisions.stop_asked.push(runner_id);
                }
                if !entry.placement.confirmed {
                    entry.placement.confirmed = true;
                    entry.inherited_start = false;
                    entry.placement.started.get_or_insert(now);
                    self.touch(&id);
                    changed = true;
                }
            } else if entry.inherited_start
                && !entry.placement.confirmed
                && self.inherited_grace_until.is_some_and(|until| now < until)
            {
                // Its start command may still be on its way: its absence says nothing yet.
            } else if !view.starting.contains(&runner_id) && !entry.asking {
                entry.asking = true;
                decisions.ask.push((id, worker_id));
            }
        }

        // Work the workers run that is not (or no longer) ours to run.
        'listed: for view in views.values().filter(|v| v.state != State::Shutdown) {
            for runner_id in &view.running {
                if !self.has_room() {
                    decisions.more = true;
                    break 'listed;
                }
                let (id, attempt) = parse_runner_id(runner_id);
                let worker = view.id.0.clone();
                match self.entries.get_mut(id) {
                    None => {
                        info!(work = %id, %worker, "adopting work found running");
                        let mut placement =
                            Placement::queued(id, now, Amount::ZERO, ReschedulePolicy::DISABLED);
                        placement.phase = Phase::Running { worker };
                        placement.started = Some(now);
                        placement.adopted = true;
                        placement.confirmed = true;
                        placement.attempt = attempt;
                        let entry = Entry::new(placement, Arc::from(""));
                        self.entries.insert(id.to_owned(), entry);
                        self.counters.adopted += 1;
                        self.touch(id);
                        changed = true;
                    }
                    Some(entry) if attempt < entry.placement.attempt => {
                        // An attempt that was written off and rescheduled.
                        decisions.stop.push(runner_id.clone());
                    }
                    Some(entry) if attempt > entry.placement.attempt => {
                        warn!(work = %id, %worker, attempt, known = entry.placement.attempt, "a later attempt than the records know runs");
                    }
                    Some(entry) => match &entry.placement.phase {
                        Phase::Lost { .. } | Phase::Cancelled | Phase::Failed { .. } => {
                            decisions.stop.push(runner_id.clone());
                        }
                        Phase::Queued => {
                            // Its start was thought lost, but it arrived after all.
                            info!(work = %id, %worker, "queued work found running");
                            self.queue.retain(|queued| queued != id);
                            entry.placement.phase = Phase::Running { worker };
                            entry.placement.confirmed = true;
                            entry.placement.not_before = None;
                            entry.placement.started.get_or_insert(now);
                            self.touch(id);
                            changed = true;
                        }
                        Phase::Running { worker: placed } | Phase::Starting { worker: placed }
                            if *placed != worker =>
                        {
                            warn!(work = %id, %worker, placed_on = %placed, "work runs on a worker it was not placed on");
                        }
                        _ => {}
                    },
                }
            }
        }

        // Runners that ended and await their outcome: the work still running on that worker
        // under that id is (or is about to be) asked; any other's outcome is in the books, or
        // not wanted (an attempt written off, work forgotten).
        for view in views.values() {
            for runner_id in &view.awaiting_outcome {
                let (id, _) = parse_runner_id(runner_id);
                let asked = self.entries.get(id).is_some_and(|entry| {
                    entry.placement.runner_id() == *runner_id
                        && entry.placement.phase == (Phase::Running { worker: view.id.0.clone() })
                });
                if !asked {
                    decisions.collected.push((view.id.clone(), runner_id.clone()));
                }
            }
        }

        // Each worker that takes work: its runners and what the work placed there needs. A
        // worker counts every start through it as running until a probe says otherwise, so its
        // view is the load, plus the starts decided but not yet begun; work it no longer lists
        // has ended and takes no room. One pass over the books per step; each placement then
        // updates the counts it changes.
        let mut used: HashMap<&str, Amount> = HashMap::new();
        let mut unlisted_starts: HashMap<&str, usize> = HashMap::new();
        for entry in self.entries.values() {
            let (worker, starting) = match &entry.placement.phase {
                Phase::Starting { worker } => (worker.as_str(), true),
                Phase::Running { worker } => (worker.as_str(), false),
                _ => continue,
            };
            let total = used.entry(worker).or_insert(Amount::ZERO);
            *total = *total + entry.placement.needs;
            if starting
                && let Some(view) = views.get(&InstanceId(worker.to_owned()))
                && !view
                    .running
                    .iter()
                    .chain(&view.starting)
                    .any(|r| *r == entry.placement.runner_id())
            {
                *unlisted_starts.entry(worker).or_default() += 1;
            }
        }
        let slots: Vec<Slot> = views
            .values()
            .filter(|v| {
                matches!(v.state, State::Idle | State::Running)
                    && v.idle_behavior == IdleBehavior::Run
                    && self.backoff.get(&v.id).is_none_or(|until| *until <= now)
            })
            .map(|v| {
                let listed: BTreeSet<&String> = v.running.iter().chain(&v.starting).collect();
                let worker = v.id.0.as_str();
                Slot {
                    worker: v.id.clone(),
                    count: listed.len() + unlisted_starts.get(worker).copied().unwrap_or(0),
                    has: v.resources.map(|r| Amount {
                        cpu_mhz: r.cpu_mhz,
                        memory_mb: r.memory_mb,
                        cores: r.cores,
                    }),
                    used: used.get(worker).copied().unwrap_or(Amount::ZERO),
                }
            })
            .collect();
        drop((used, unlisted_starts));
        let mut placer = Placer::new(slots, limit(config.per_worker_limit));
        let mut waiting = VecDeque::new();
        let mut unplaced: Vec<Amount> = Vec::new();
        while let Some(id) = self.queue.pop_front() {
            if !self.has_room() {
                // The rest keeps its place in the queue for the next step.
                waiting.push_back(id);
                waiting.extend(self.queue.drain(..));
                decisions.more = true;
                break;
            }
            let Some(entry) = self.entries.get_mut(&id) else { continue };
            if let Some(at) = entry.placement.not_before.filter(|at| *at > now) {
                entry.waiting = Some(format!("rescheduled; not placed before {at}"));
                waiting.push_back(id);
                continue;
            }
            let worker = match placer.place(&entry.placement.needs) {
                Ok(worker) => worker,
                Err(why) => {
                    entry.waiting = Some(why);
                    unplaced.push(entry.placement.needs);
                    waiting.push_back(id);
                    if placer.any_room() {
                        continue;
                    }
                    // Full everywhere: the rest waits for the same reason.
                    let why = entry.waiting.clone();
                    for rest in self.queue.drain(..) {
                        if let Some(entry) = self.entries.get_mut(&rest) {
                            entry.waiting.clone_from(&why);
                            unplaced.push(entry.placement.needs);
                        }
                        waiting.push_back(rest);
                    }
                    break;
                }
            };
            entry.waiting = None;
            entry.placement.phase = Phase::Starting { worker: worker.0.clone() };
            entry.placement.starts += 1;
            entry.placement.not_before = None;
            let launch = Launch {
                runner_id: entry.placement.runner_id(),
                id: id.clone(),
                worker,
                payload: entry.payload.clone(),
            };
            decisions.launches.push(launch);
            self.touch(&id);
            changed = true;
        }
        self.queue = waiting;
        decisions.creates_for_work = creates_for_work(&unplaced, snapshot);

        // Creates in flight count: they become workers.
        let live = views.values().filter(|v| v.state != State::Shutdown).count() + creating;
        decisions.creates = config.min_workers.saturating_sub(live);
        self.backoff.retain(|_, until| *until > now);
        decisions.changed = changed;
        decisions
    }

    /// The current attempt of `id` ended: it is placed again if its policy allows (and no
    /// stop was asked), else the work is final.
    pub(crate) fn end_attempt(
        &mut self,
        id: &str,
        end: AttemptEnd,
        now: Timestamp,
        config: &SchedulerConfig,
    ) {
        let Some(entry) = self.entries.get_mut(id) else { return };
        let placement = &mut entry.placement;
        let (worker, failed, phase) = match end {
            AttemptEnd::Ended { worker, outcome } => {
                let failed = outcome.starts_with("failed");
                (worker.clone(), failed, Phase::Ended { worker, outcome })
            }
            AttemptEnd::Lost { worker, reason } => {
                (worker.clone(), true, Phase::Lost { worker, reason })
            }
        };
        let how = phase.attempt_outcome().unwrap_or_default();
        let events: Vec<&RescheduleEvent> = placement.reschedules().collect();
        let next = if failed && !placement.stop_requested {
            reschedule::decide(&placement.reschedule, &events, now)
        } else {
            None
        };
        let Some((at, delay)) = next else {
            self.finish(id, phase, now, config);
            return;
        };
        info!(work = %id, %worker, attempt = placement.attempt + 1, delay = ?delay, "rescheduling");
        placement.history.push(Attempt {
            attempt: placement.attempt,
            runner_id: placement.runner_id(),
            worker: Some(worker),
            started: placement.started,
            finished: now,
            outcome: how.clone(),
            rescheduled: placement.rescheduled.take(),
        });
        reschedule::prune(&placement.reschedule, &mut placement.history, now);
        placement.attempt += 1;
        placement.rescheduled = Some(RescheduleEvent { at: now, delay, reason: how });
        placement.phase = Phase::Queued;
        placement.not_before = Some(at);
        placement.started = None;
        placement.confirmed = false;
        placement.starts = 0;
        self.queue.push_back(id.to_owned());
        self.counters.rescheduled += 1;
        self.touch(id);
    }

    /// Puts work in a final phase, and forgets the oldest finished work beyond the limit.
    fn finish(&mut self, id: &str, phase: Phase, now: Timestamp, config: &SchedulerConfig) {
        let Some(entry) = self.entries.get_mut(id) else { return };
        *self.counters.finished.entry(phase.name()).or_insert(0) += 1;
        entry.placement.phase = phase;
        entry.placement.finished = Some(now);
        entry.placement.not_before = None;
        self.touch(id);
        self.finished.push_back(id.to_owned());
        self.forget_oldest(config);
    }

    /// Forgets the oldest finished work beyond the limit.
    fn forget_oldest(&mut self, config: &SchedulerConfig) {
        while self.finished.len() > limit(config.max_finished) {
            let Some(old) = self.finished.pop_front() else { break };
            if self.entries.get(&old).is_some_and(|e| e.placement.phase.is_final()) {
                self.entries.remove(&old);
                self.changed.insert(old);
            }
        }
    }
}

#[cfg(test)]
impl Books {
    /// Books holding `work` in these phases; queued work is queued in this order.
    pub(crate) fn holding(work: &[(&str, Phase)], now: Timestamp) -> Books {
        let mut books = Books::default();
        for (id, phase) in work {
            let mut placement =
                Placement::queued(id, now, Amount::ZERO, ReschedulePolicy::DISABLED);
            placement.phase = phase.clone();
            if *phase == Phase::Queued {
                books.queue.push_back((*id).to_owned());
            }
            let entry = Entry::new(placement, Arc::from("spec"));
            books.entries.insert((*id).to_owned(), entry);
        }
        books
    }

    /// Marks a stop of `id` asked but not yet sent to a worker (as after a take-over).
    pub(crate) fn stop_asked(&mut self, id: &str) {
        let entry = self.entries.get_mut(id).expect("work in the books");
        entry.placement.stop_requested = true;
        entry.stop_sent = false;
    }

    /// Marks `id`'s start as left unacknowledged by an earlier term, to be judged from `until`.
    pub(crate) fn inherit_start(&mut self, id: &str, until: Timestamp) {
        self.entries.get_mut(id).expect("work in the books").inherited_start = true;
        self.inherited_grace_until = Some(until);
    }

    /// Makes work `id` need `needs` of a worker.
    pub(crate) fn needing(&mut self, id: &str, needs: Amount) {
        self.entries.get_mut(id).expect("work in the books").placement.needs = needs;
    }

    /// Why queued work `id` was placed nowhere, as the last decision found.
    pub(crate) fn waiting(&self, id: &str) -> Option<String> {
        self.entries.get(id).and_then(|e| e.waiting.clone())
    }

    /// Where work `id` is.
    pub(crate) fn phase(&self, id: &str) -> Option<Phase> {
        self.entries.get(id).map(|e| e.placement.phase.clone())
    }

    /// Makes `worker` take no work until `until`, as after a refused start.
    pub(crate) fn back_off(&mut self, worker: &str, until: Timestamp) {
        self.backoff.insert(worker.into(), until);
    }
}
