//! The scheduler's books ([`Books`]): every piece of work it knows, the queue, the workers
//! backing off, and the counters; what changed since the journal last looked. Everything here
//! is pure: the time comes in as an argument, and the I/O shell (the parent module) carries
//! out what the books decide.
//!
//! The decisions over the books: a step's, from a snapshot of the pool, in the sibling
//! `decide` module ([`Books::decide`]); after a start command and after an outcome question,
//! here ([`Books::after_start`], [`Books::after_outcome`]), by the verdicts of the sibling
//! `judge` module. Every change to an entry is marked ([`Books::touch`]) for the journal.

use super::config::{CHANGES_PER_DECISION, MAX_CHANGES_PER_ENTRY, SchedulerConfig, limit};
use super::judge::{
    AttemptEnd, OutcomeAnswer, OutcomeVerdict, StartResult, StartVerdict, WorkerStanding,
    judge_outcome, judge_start,
};
use crate::reschedule;
use crate::store::Change;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tracing::{debug, info, warn};
use wharf_prober::InstanceId;
use wharf_state::Timestamp;
use wharf_state::fleet::{
    Attempt, Placement, RescheduleEvent, WorkPhase, WorkPhaseName, WorkRecord,
};
#[cfg(test)]
use wharf_state::reschedule::ReschedulePolicy;
#[cfg(test)]
use wharf_state::resources::Amount;

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) placement: Placement,
    pub(super) payload: Arc<str>,
    /// An outcome query for it is in flight.
    pub(super) asking: bool,
    /// An unacknowledged start an earlier term left: its command may still be on its way to
    /// the worker until [`Books::inherited_grace_until`].
    pub(super) inherited_start: bool,
    /// This scheduler asked the worker to stop it (a stop is sent once a worker lists it).
    pub(super) stop_sent: bool,
    /// Queued: why the last step placed it nowhere.
    pub(super) waiting: Option<String>,
}

impl Entry {
    pub(super) fn new(placement: Placement, payload: Arc<str>) -> Entry {
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
pub(super) struct Counters {
    pub(super) submitted: u64,
    pub(super) started: u64,
    pub(super) start_refusals: u64,
    pub(super) adopted: u64,
    pub(super) rescheduled: u64,
    pub(super) stopped_after_lost: u64,
    pub(super) finished: BTreeMap<WorkPhaseName, u64>,
    /// Submit to acknowledged start, for work started here.
    pub(super) start_latency_sum: f64,
    pub(super) start_latency_count: u64,
}

/// The scheduler's books: every piece of work it knows, the queue, and the workers backing
/// off after a refused start. [`Books::decide`] is the pure decision over them; every change
/// to an entry is marked, for the journal.
#[derive(Debug, Default)]
pub(crate) struct Books {
    pub(super) entries: HashMap<String, Entry>,
    pub(super) queue: VecDeque<String>,
    pub(super) finished: VecDeque<String>,
    pub(super) backoff: HashMap<InstanceId, Timestamp>,
    pub(super) counters: Counters,
    /// Entries changed (or forgotten) since the journal last took the changes.
    pub(super) changed: BTreeSet<String>,
    /// The sequence number of the last changes sent to the journal.
    pub(super) sequence: u64,
    /// Until then, an unacknowledged start an earlier term left is not judged by its absence
    /// from the worker: its command may still be running (each ends at its deadline, even
    /// after the process that ran it is gone).
    pub(super) inherited_grace_until: Option<Timestamp>,
}

/// A start the scheduler decided on.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) id: String,
    pub(crate) runner_id: String,
    pub(crate) worker: InstanceId,
    pub(super) payload: Arc<str>,
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

impl Books {
    /// The books of a scheduler that takes over: queued work in the order it was submitted,
    /// finished work in the order it finished.
    pub(super) fn from_records(records: Vec<WorkRecord>, config: &SchedulerConfig) -> Books {
        let mut books = Books::default();
        let mut queued = Vec::new();
        let mut finished = Vec::new();
        for WorkRecord { placement, payload } in records {
            let id = placement.id.clone();
            match &placement.phase {
                WorkPhase::Queued => queued.push((placement.submitted, id.clone())),
                phase if phase.is_final() => {
                    finished.push((placement.finished.unwrap_or(placement.submitted), id.clone()))
                }
                _ => {}
            }
            let mut entry = Entry::new(placement, payload.into());
            // A start in flight when the last scheduler stopped may have arrived: it counts as
            // running there until a probe says otherwise.
            if let WorkPhase::Starting { worker } = &entry.placement.phase {
                entry.placement.phase = WorkPhase::Running { worker: worker.clone() };
                books.changed.insert(id.clone());
            }
            entry.inherited_start = matches!(entry.placement.phase, WorkPhase::Running { .. })
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
    pub(super) fn has_room(&self) -> bool {
        self.changed.len() + CHANGES_PER_DECISION <= MAX_CHANGES_PER_ENTRY
    }

    /// Marks entry `id` changed: its revision goes up and the journal takes it.
    pub(super) fn touch(&mut self, id: &str) {
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
            AttemptEnd::Ended { worker, outcome, failed } => {
                (worker.clone(), failed, WorkPhase::Ended { worker, outcome })
            }
            AttemptEnd::Lost { worker, reason } => {
                (worker.clone(), true, WorkPhase::Lost { worker, reason })
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
            price_micros_per_hour: placement.price_micros_per_hour.take(),
        });
        reschedule::prune(&placement.reschedule, &mut placement.history, now);
        placement.attempt += 1;
        placement.rescheduled = Some(RescheduleEvent { at: now, delay, reason: how });
        placement.phase = WorkPhase::Queued;
        placement.not_before = Some(at);
        placement.started = None;
        placement.confirmed = false;
        placement.starts = 0;
        self.queue.push_back(id.to_owned());
        self.counters.rescheduled += 1;
        self.touch(id);
    }

    /// Puts work in a final phase, and forgets the oldest finished work beyond the limit.
    pub(super) fn finish(
        &mut self,
        id: &str,
        phase: WorkPhase,
        now: Timestamp,
        config: &SchedulerConfig,
    ) {
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

/// What the books made of a start command's result: the shell forgets a refused start on
/// its worker, and tells subscribers when the books changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AfterStart {
    /// The books changed.
    pub(crate) changed: bool,
    /// The worker refused it: the pool may forget the runner.
    pub(crate) forget_runner: bool,
}

impl Books {
    /// Puts `id` back at the front of the queue, as it was before its start was decided;
    /// `uncount` the start if nothing of it reached a worker. The caller marks the change.
    fn requeue(&mut self, id: &str, uncount: bool) {
        let Some(entry) = self.entries.get_mut(id) else { return };
        if uncount {
            entry.placement.starts -= 1;
        }
        entry.placement.phase = WorkPhase::Queued;
        self.queue.push_front(id.to_owned());
    }

    /// Records how the start of `runner_id` (work `id`) on `worker` went, as [`judge_start`]
    /// says; nothing if the work moved on meanwhile.
    pub(crate) fn after_start(
        &mut self,
        id: &str,
        runner_id: &str,
        worker: &InstanceId,
        result: StartResult,
        now: Timestamp,
        config: &SchedulerConfig,
    ) -> AfterStart {
        let Some(entry) = self.entries.get(id) else { return AfterStart::default() };
        if entry.placement.phase != (WorkPhase::Starting { worker: worker.0.clone() })
            || entry.placement.runner_id() != runner_id
        {
            return AfterStart::default();
        }
        let starts = entry.placement.starts;
        let mut forget_runner = false;
        match judge_start(result.clone(), starts, config.may_retry(starts)) {
            StartVerdict::Running => {
                info!(work = %id, %worker, "work started");
                if let Some(entry) = self.entries.get_mut(id) {
                    entry.placement.phase = WorkPhase::Running { worker: worker.0.clone() };
                    entry.placement.confirmed = true;
                    entry.placement.started = Some(now);
                    let latency = now.since(entry.placement.submitted).as_secs_f64();
                    self.counters.started += 1;
                    self.counters.start_latency_sum += latency;
                    self.counters.start_latency_count += 1;
                }
            }
            StartVerdict::Requeue { uncount } => {
                if let StartResult::WorkerChanged { reason } = &result {
                    debug!(work = %id, %worker, reason, "worker no longer takes work; requeued");
                }
                self.requeue(id, uncount);
            }
            verdict @ (StartVerdict::RefusedRequeue | StartVerdict::RefusedFail { .. }) => {
                if let StartResult::Refused { error } = &result {
                    warn!(work = %id, %worker, error, "start refused");
                }
                forget_runner = true;
                self.counters.start_refusals += 1;
                let until = now.saturating_add(config.start_failure_backoff);
                self.backoff.insert(worker.clone(), until);
                match verdict {
                    StartVerdict::RefusedFail { reason } => {
                        self.finish(id, WorkPhase::Failed { reason }, now, config)
                    }
                    _ => self.requeue(id, false),
                }
            }
            StartVerdict::Fail { reason } => {
                self.finish(id, WorkPhase::Failed { reason }, now, config);
            }
            StartVerdict::Unconfirmed => {
                if let StartResult::Unconfirmed { error } = &result {
                    warn!(work = %id, %worker, error, "start unconfirmed; the next probe decides");
                }
                if let Some(entry) = self.entries.get_mut(id) {
                    entry.placement.phase = WorkPhase::Running { worker: worker.0.clone() };
                }
            }
        }
        self.touch(id);
        AfterStart { changed: true, forget_runner }
    }

    /// Records the answer to how `runner_id` (work `id`), which `worker` no longer lists,
    /// ended, as [`judge_outcome`] says. Returns whether the books changed; nothing changes if
    /// the work moved on meanwhile, or if the answer says to wait.
    pub(crate) fn after_outcome(
        &mut self,
        id: &str,
        runner_id: &str,
        worker: &InstanceId,
        answer: OutcomeAnswer,
        now: Timestamp,
        config: &SchedulerConfig,
    ) -> bool {
        let OutcomeAnswer { answer, standing } = answer;
        let Some(entry) = self.entries.get_mut(id) else { return false };
        entry.asking = false;
        if entry.placement.phase != (WorkPhase::Running { worker: worker.0.clone() })
            || entry.placement.runner_id() != runner_id
        {
            return false;
        }
        let (confirmed, starts) = (entry.placement.confirmed, entry.placement.starts);
        let asked_again = answer.is_err() && standing == WorkerStanding::Waits;
        let failure = answer.as_ref().err().cloned();
        let verdict =
            judge_outcome(answer, &worker.0, standing, confirmed, starts, config.may_retry(starts));
        match verdict {
            OutcomeVerdict::Wait => {
                if let (true, Some(error)) = (asked_again, failure) {
                    debug!(work = %id, %worker, error, "cannot learn how the work ended yet; asking again");
                }
                return false;
            }
            OutcomeVerdict::Requeue => {
                info!(work = %id, %worker, "unconfirmed start never arrived; requeued");
                self.requeue(id, false);
                self.touch(id);
            }
            OutcomeVerdict::Fail { reason } => {
                self.finish(id, WorkPhase::Failed { reason }, now, config);
            }
            OutcomeVerdict::End(end) => self.end_attempt(id, end, now, config),
        }
        true
    }
}

#[cfg(test)]
impl Books {
    /// Books holding `work` in these phases; queued work is queued in this order.
    pub(crate) fn holding(work: &[(&str, WorkPhase)], now: Timestamp) -> Books {
        let mut books = Books::default();
        for (id, phase) in work {
            let mut placement =
                Placement::queued(id, now, Amount::ZERO, ReschedulePolicy::DISABLED);
            placement.phase = phase.clone();
            if *phase == WorkPhase::Queued {
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
    pub(crate) fn phase(&self, id: &str) -> Option<WorkPhase> {
        self.entries.get(id).map(|e| e.placement.phase.clone())
    }

    /// Work `id` as the books keep it.
    pub(crate) fn placement(&self, id: &str) -> Option<&Placement> {
        self.entries.get(id).map(|e| &e.placement)
    }

    /// Makes `worker` take no work until `until`, as after a refused start.
    pub(crate) fn back_off(&mut self, worker: &str, until: Timestamp) {
        self.backoff.insert(worker.into(), until);
    }
}
