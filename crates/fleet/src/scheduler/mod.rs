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
//!   written off while it is on its way. Lost work, and work that ended `failed`, is placed
//!   again as its reschedule policy says (see [`reschedule`](crate::reschedule)),
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
//! The decisions are pure: the scheduler's books and a snapshot of the pool (its workers, its
//! creates in flight, the time) go in; the starts, the questions, the stops and the creates
//! come out, with the books updated, and are tested as a table. So are the decisions after a
//! start's result and an outcome's answer. [`Scheduler::step`] takes the snapshot, decides
//! under one short lock and carries the decisions out, so tests also drive it step by step on
//! a fake clock with scripted workers; [`Scheduler::run`] is the same on real time. While
//! `run` drives the scheduler, a submission with nothing queued ahead of it is placed as it is
//! recorded (`Books::place`: the free slots, nothing else), so its record and its start's
//! decision share one commit and the start leaves without waiting for the loop; the rest of a
//! step (judging, reconciling, creating workers) stays with the loop.
//!
//! Inside, this module is the I/O shell; the rest is pure or on its own:
//! - `books`: the `Books` (work, queue, backoffs, counters), and what a start's result
//!   and an outcome's answer change in them;
//! - `decide`: a step's decision over the books, one function per pass;
//! - `judge`: the verdicts on a start's result and an outcome's answer, as tables;
//! - `snapshot`: what a step sees of the pool;
//! - `journal`: the writer that makes the books' changes durable, in order, under the term;
//! - `config`: [`SchedulerConfig`] and the limits of a journal entry.

mod books;
mod config;
mod decide;
mod journal;
mod judge;
mod snapshot;

pub(crate) use books::Books;
pub(crate) use config::MAX_CHANGES_PER_ENTRY;
pub use config::SchedulerConfig;
pub(crate) use snapshot::Snapshot;

use crate::error::FleetError;
use crate::store::{Change, FleetStore, Term};
use books::{Decisions, Entry, Launch};
use config::limit;
use journal::{Durable, write_journal};
use judge::{OutcomeAnswer, StartResult, WorkerStanding};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};
use wharf_prober::{Clock, InstanceId, Pool, ProberError};
use wharf_state::Timestamp;
use wharf_state::fleet::{ATTEMPT_SEPARATOR, Placement, WorkPhase, WorkPhaseName, parse_runner_id};
use wharf_state::reschedule::ReschedulePolicy;
use wharf_state::resources::Amount;

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
    /// Whether [`Scheduler::run`] drives the scheduler; then a submission with no work queued
    /// ahead of it is placed as it is recorded.
    looping: AtomicBool,
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
                looping: AtomicBool::new(false),
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

    /// Queues `submission`, and returns once its record is durable; with the loop running and
    /// nothing queued, already placed in that same record. The id must be printable
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
        // With the loop running and nothing queued, the submission is placed in the step that
        // records it: its record and its start share a commit, and the start leaves without
        // waiting for the loop to wake. The tests' own steps keep placing in `step`.
        let place_now = self.shared.looping.load(Ordering::Acquire)
            && self.shared.inner.lock().queue.is_empty();
        let snapshot = place_now.then(|| Snapshot::of(&self.shared.pool, now));
        let (placement, placed, sequence) = {
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
            let placed = match &snapshot {
                Some(snapshot) if books.queue.len() == 1 => {
                    Some(books.place(snapshot, &self.shared.config))
                }
                _ => None,
            };
            (placement, placed, self.journal(&mut books))
        };
        self.durable(sequence).await?;
        info!(work = %id, "work queued");
        let started = placed.as_ref().is_some_and(|d| !d.launches.is_empty() && !d.more);
        if let Some(decisions) = placed {
            self.carry_out(decisions, sequence, |future| {
                tokio::spawn(future);
            });
        }
        if !started {
            // Placed nowhere, or not tried: the loop's full step decides, says why the work
            // waits, and creates a worker for it if one is wanted.
            self.shared.wake.notify_one();
        }
        self.notify();
        Ok(self.get(&id).unwrap_or(placement))
    }

    /// One piece of work.
    pub fn get(&self, id: &str) -> Option<Placement> {
        self.shared.inner.lock().entries.get(id).map(|e| e.placement.clone())
    }

    /// What work `id`'s runner reads on its standard input (its job spec, for a fleet of
    /// agents): what tells its job apart. Empty for adopted work.
    pub fn payload(&self, id: &str) -> Option<Arc<str>> {
        self.shared.inner.lock().entries.get(id).map(|e| e.payload.clone())
    }

    /// Why queued work `id` waits: the reason the last step placed it nowhere (no worker has
    /// room, or none has what it needs, with the most any has), or its reschedule delay.
    pub fn waiting_reason(&self, id: &str) -> Option<String> {
        let books = self.shared.inner.lock();
        let entry = books.entries.get(id)?;
        (entry.placement.phase == WorkPhase::Queued).then(|| entry.waiting.clone()).flatten()
    }

    /// What the work placed on each worker needs, by worker (work that is starting or running;
    /// adopted work counts as needing nothing).
    pub fn usage(&self) -> BTreeMap<String, Amount> {
        let books = self.shared.inner.lock();
        let mut usage: BTreeMap<String, Amount> = BTreeMap::new();
        for entry in books.entries.values() {
            if let WorkPhase::Starting { worker } | WorkPhase::Running { worker } =
                &entry.placement.phase
            {
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
                WorkPhase::Queued => {
                    entry.placement.stop_requested = true;
                    books.queue.retain(|queued| queued != id);
                    books.finish(id, WorkPhase::Cancelled, now, &self.shared.config);
                    None
                }
                WorkPhase::Starting { .. } | WorkPhase::Running { .. } => {
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
        self.shared.looping.store(true, Ordering::Release);
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
        self.shared.looping.store(false, Ordering::Release);
        if !self.acting() {
            warn!(
                term = self.shared.term.number(),
                "the scheduler stops: its term is over or its writes fail"
            );
        }
    }

    /// Whether [`Scheduler::run`] drives this scheduler now.
    #[cfg(test)]
    pub(crate) fn looping(&self) -> bool {
        self.shared.looping.load(Ordering::Acquire)
    }

    /// Makes [`Scheduler::run`] return.
    pub fn stop_running(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }

    /// Counts of work by phase, and the counters, in Prometheus text format.
    pub fn metrics(&self) -> String {
        let inner = self.shared.inner.lock();
        let mut by_phase: BTreeMap<WorkPhaseName, u64> = BTreeMap::new();
        for entry in inner.entries.values() {
            *by_phase.entry(entry.placement.phase.name()).or_insert(0) += 1;
        }
        let mut out = String::new();
        let c = &inner.counters;
        let _ = writeln!(out, "# HELP wharf_fleet_work Work the scheduler knows, by phase.");
        let _ = writeln!(out, "# TYPE wharf_fleet_work gauge");
        for phase in WorkPhaseName::ALL {
            let n = by_phase.get(&phase).copied().unwrap_or(0);
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
        for phase in WorkPhaseName::ALL.into_iter().filter(|phase| phase.is_final()) {
            let n = c.finished.get(&phase).copied().unwrap_or(0);
            let _ = writeln!(out, "wharf_fleet_finished_total{{phase=\"{phase}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP wharf_fleet_start_latency_seconds From submission to an acknowledged start."
        );
        let _ = writeln!(out, "# TYPE wharf_fleet_start_latency_seconds summary");
        let _ = writeln!(out, "wharf_fleet_start_latency_seconds_sum {}", c.start_latency_sum);
        let _ = writeln!(out, "wharf_fleet_start_latency_seconds_count {}", c.start_latency_count);
        let now = self.now();
        let cost: f64 = inner.entries.values().map(|e| e.placement.total_cost(now)).sum();
        let _ = writeln!(
            out,
            "# HELP wharf_fleet_work_cost The worker time of the work kept, at its workers' hourly \
             prices: every attempt's, up to now."
        );
        let _ = writeln!(out, "# TYPE wharf_fleet_work_cost gauge");
        let _ = writeln!(out, "wharf_fleet_work_cost {cost}");
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

    /// Starts one attempt and records how the start went ([`Books::after_start`]).
    async fn start(&self, launch: Launch) {
        let shared = &self.shared;
        let Launch { id, runner_id, worker, payload } = launch;
        let result = shared.pool.start_runner(&worker, &runner_id, payload.as_bytes()).await;
        let now = self.now();
        let after = {
            let mut books = shared.inner.lock();
            let result = StartResult::of(result);
            let after = books.after_start(&id, &runner_id, &worker, result, now, &shared.config);
            if after.changed {
                self.journal(&mut books);
            }
            after
        };
        if !after.changed {
            return;
        }
        if after.forget_runner
            && let Err(e) = shared.pool.close_runner(&worker, &runner_id).await
        {
            debug!(work = %id, %worker, error = %e, "cannot forget the refused start");
        }
        self.notify();
        shared.wake.notify_one();
    }

    /// Asks the worker how an attempt it no longer lists ended, and records the answer
    /// ([`Books::after_outcome`]).
    async fn ask_outcome(&self, id: String, worker: InstanceId) {
        let shared = &self.shared;
        let Some(runner_id) = self.get(&id).map(|p| p.runner_id()) else { return };
        let answer = shared.pool.runner_outcome(&worker, &runner_id).await;
        let view = shared.pool.workers().into_iter().find(|w| w.id == worker);
        let standing = WorkerStanding::of(view.as_ref(), &runner_id);
        let answer = OutcomeAnswer { answer: answer.map_err(|e| e.to_string()), standing };
        let now = self.now();
        {
            let mut books = shared.inner.lock();
            let changed =
                books.after_outcome(&id, &runner_id, &worker, answer, now, &shared.config);
            if !changed {
                return;
            }
            self.journal(&mut books);
        }
        self.notify();
        shared.wake.notify_one();
    }
}
