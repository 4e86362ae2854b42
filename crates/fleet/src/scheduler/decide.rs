//! A step's decision over the books ([`Books::decide`]): pure, from a snapshot of the pool
//! (its workers, its creates in flight, the time). One function per pass, in this order:
//!
//! 1. [`Books::judge_running`]: work believed running is still listed, went with its worker
//!    (lost), or left the list (its worker is asked how it ended);
//! 2. [`Books::reconcile_listed`]: work a worker runs that the books do not expect there is
//!    adopted, found again, or stopped (an attempt written off);
//! 3. [`Books::release_outcomes`]: runners whose outcome the books have, or do not want, no
//!    longer hold their worker;
//! 4. [`Books::place_queued`]: queued work goes, in order, on the workers with room
//!    ([`Books::slots`] counts their load), and what fits nowhere asks for a create
//!    ([`creates_for_work`]); the minimum of workers is kept.
//!
//! Each pass stops at the step's budget of changes ([`Books::has_room`]): what it did not get
//! to waits for the next step, which comes at once (`Decisions::more`).

use super::books::{Books, Decisions, Entry, Launch};
use super::config::{SchedulerConfig, limit};
use super::judge::AttemptEnd;
use super::snapshot::Snapshot;
use crate::placement::{Placer, Slot};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tracing::{info, warn};
use wharf_prober::{IdleBehavior, InstanceId, State, WorkerView};
use wharf_state::Timestamp;
use wharf_state::fleet::{Placement, WorkPhase, parse_runner_id};
use wharf_state::reschedule::ReschedulePolicy;
use wharf_state::resources::Amount;

impl Books {
    /// Decides, from a snapshot of the pool, what to start where, whom to ask how work
    /// ended, what to stop and how many workers to create; updates the books to match. Pure:
    /// the snapshot carries the time, and the caller carries the decisions out.
    pub(crate) fn decide(&mut self, snapshot: &Snapshot, config: &SchedulerConfig) -> Decisions {
        let mut decisions = Decisions::default();
        if !snapshot.loaded {
            // Until the pool has listed its instances once (a scheduler that just took over),
            // a worker missing from it may simply not be known yet: nothing is judged.
            return decisions;
        }
        let (views, now) = (&snapshot.workers, snapshot.now);
        self.judge_running(views, now, config, &mut decisions);
        self.reconcile_listed(views, now, &mut decisions);
        self.release_outcomes(views, &mut decisions);
        let slots = self.slots(views, now);
        let unplaced = self.place_queued(slots, now, config, &mut decisions);
        self.price_attempts(snapshot, &mut decisions);
        decisions.creates_for_work = creates_for_work(&unplaced, snapshot);

        // Creates in flight count: they become workers.
        let creating: usize = snapshot.creating.values().sum();
        let live = views.values().filter(|v| v.state != State::Shutdown).count() + creating;
        decisions.creates = config.min_workers.saturating_sub(live);
        self.backoff.retain(|_, until| *until > now);
        decisions
    }

    /// Places the queue on the workers' free slots and prices what it placed, and nothing
    /// else: the step a submission takes at once when no work waits ahead of it (see
    /// `Scheduler::submit`). Judging work, reconciling it with the workers and creating
    /// workers stay with the full step, [`Books::decide`].
    pub(crate) fn place(&mut self, snapshot: &Snapshot, config: &SchedulerConfig) -> Decisions {
        let mut decisions = Decisions::default();
        if !snapshot.loaded {
            return decisions;
        }
        let slots = self.slots(&snapshot.workers, snapshot.now);
        self.place_queued(slots, snapshot.now, config, &mut decisions);
        self.price_attempts(snapshot, &mut decisions);
        decisions
    }

    /// Work believed running: still listed, gone with its worker, or ended.
    fn judge_running(
        &mut self,
        views: &HashMap<InstanceId, WorkerView>,
        now: Timestamp,
        config: &SchedulerConfig,
        decisions: &mut Decisions,
    ) {
        let running: Vec<(String, String)> = self
            .entries
            .values()
            .filter_map(|e| match &e.placement.phase {
                WorkPhase::Running { worker } => Some((e.placement.id.clone(), worker.clone())),
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
                decisions.changed = true;
                continue;
            }
            let view = &views[&worker_id];
            // A worker whose run probe has not passed yet (a scheduler that just took over sees
            // every worker so) lists nothing: its silence says nothing about the work.
            if !matches!(view.state, State::Idle | State::Running | State::Shutdown) {
                continue;
            }
            let grace = self.inherited_grace_until;
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
                    decisions.changed = true;
                }
            } else if entry.inherited_start
                && !entry.placement.confirmed
                && grace.is_some_and(|until| now < until)
            {
                // Its start command may still be on its way: its absence says nothing yet.
            } else if !view.starting.contains(&runner_id) && !entry.asking {
                entry.asking = true;
                decisions.ask.push((id, worker_id));
            }
        }
    }

    /// Work the workers run that is not (or no longer) ours to run.
    fn reconcile_listed(
        &mut self,
        views: &HashMap<InstanceId, WorkerView>,
        now: Timestamp,
        decisions: &mut Decisions,
    ) {
        for view in views.values().filter(|v| v.state != State::Shutdown) {
            for runner_id in &view.running {
                if !self.has_room() {
                    decisions.more = true;
                    return;
                }
                self.reconcile_one(view, runner_id, now, decisions);
            }
        }
    }

    /// Runner `runner_id`, listed by the worker of `view`, against the books.
    fn reconcile_one(
        &mut self,
        view: &WorkerView,
        runner_id: &str,
        now: Timestamp,
        decisions: &mut Decisions,
    ) {
        let (id, attempt) = parse_runner_id(runner_id);
        let worker = view.id.0.clone();
        match self.entries.get_mut(id) {
            None => {
                info!(work = %id, %worker, "adopting work found running");
                let mut placement =
                    Placement::queued(id, now, Amount::ZERO, ReschedulePolicy::DISABLED);
                placement.phase = WorkPhase::Running { worker };
                placement.started = Some(now);
                placement.adopted = true;
                placement.confirmed = true;
                placement.attempt = attempt;
                let entry = Entry::new(placement, Arc::from(""));
                self.entries.insert(id.to_owned(), entry);
                self.counters.adopted += 1;
                self.touch(id);
                decisions.changed = true;
            }
            Some(entry) if attempt < entry.placement.attempt => {
                // An attempt that was written off and rescheduled.
                decisions.stop.push(runner_id.to_owned());
            }
            Some(entry) if attempt > entry.placement.attempt => {
                warn!(work = %id, %worker, attempt, known = entry.placement.attempt, "a later attempt than the records know runs");
            }
            Some(entry) => match &entry.placement.phase {
                WorkPhase::Lost { .. } | WorkPhase::Cancelled | WorkPhase::Failed { .. } => {
                    decisions.stop.push(runner_id.to_owned());
                }
                WorkPhase::Queued => {
                    // Its start was thought lost, but it arrived after all.
                    info!(work = %id, %worker, "queued work found running");
                    entry.placement.phase = WorkPhase::Running { worker };
                    entry.placement.confirmed = true;
                    entry.placement.not_before = None;
                    entry.placement.started.get_or_insert(now);
                    self.queue.retain(|queued| queued != id);
                    self.touch(id);
                    decisions.changed = true;
                }
                WorkPhase::Running { worker: placed } | WorkPhase::Starting { worker: placed }
                    if *placed != worker =>
                {
                    warn!(work = %id, %worker, placed_on = %placed, "work runs on a worker it was not placed on");
                }
                _ => {}
            },
        }
    }

    /// Runners that ended and await their outcome: the work still running on that worker
    /// under that id is (or is about to be) asked; any other's outcome is in the books, or
    /// not wanted (an attempt written off, work forgotten).
    fn release_outcomes(&self, views: &HashMap<InstanceId, WorkerView>, decisions: &mut Decisions) {
        for view in views.values() {
            for runner_id in &view.awaiting_outcome {
                let (id, _) = parse_runner_id(runner_id);
                let asked = self.entries.get(id).is_some_and(|entry| {
                    entry.placement.runner_id() == *runner_id
                        && entry.placement.phase
                            == (WorkPhase::Running { worker: view.id.0.clone() })
                });
                if !asked {
                    decisions.collected.push((view.id.clone(), runner_id.clone()));
                }
            }
        }
    }

    /// Each worker that takes work: its runners and what the work placed there needs. A
    /// worker counts every start through it as running until a probe says otherwise, so its
    /// view is the load, plus the starts decided but not yet begun; work it no longer lists
    /// has ended and takes no room. One pass over the books per step; each placement then
    /// updates the counts it changes.
    fn slots(&self, views: &HashMap<InstanceId, WorkerView>, now: Timestamp) -> Vec<Slot> {
        let mut used: HashMap<&str, Amount> = HashMap::new();
        let mut unlisted_starts: HashMap<&str, usize> = HashMap::new();
        for entry in self.entries.values() {
            let (worker, starting) = match &entry.placement.phase {
                WorkPhase::Starting { worker } => (worker.as_str(), true),
                WorkPhase::Running { worker } => (worker.as_str(), false),
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
        views
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
                    has: v.resources.map(Amount::from),
                    used: used.get(worker).copied().unwrap_or(Amount::ZERO),
                }
            })
            .collect()
    }

    /// Gives each attempt placed on a worker (started here, or adopted) the hourly price of
    /// that worker's instance type, once, so that its cost can be told after the worker is
    /// gone.
    fn price_attempts(&mut self, snapshot: &Snapshot, decisions: &mut Decisions) {
        if snapshot.prices.is_empty() {
            return;
        }
        let unpriced: Vec<(String, u64)> = self
            .entries
            .values()
            .filter(|entry| entry.placement.price_micros_per_hour.is_none())
            .filter_map(|entry| {
                let worker = entry.placement.phase.worker()?;
                let view = snapshot.workers.get(&InstanceId(worker.to_owned()))?;
                let price = snapshot.prices.get(&view.instance_type)?;
                let placed = matches!(
                    entry.placement.phase,
                    WorkPhase::Starting { .. } | WorkPhase::Running { .. }
                );
                placed.then(|| (entry.placement.id.clone(), *price))
            })
            .collect();
        for (id, price) in unpriced {
            if !self.changed.contains(&id) && !self.has_room() {
                // The rest is priced by the next step, within its own budget.
                decisions.more = true;
                break;
            }
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.placement.price_micros_per_hour = Some(price);
            }
            self.touch(&id);
            decisions.changed = true;
        }
    }

    /// Queued work, in order, on the `slots` with room; returns what each piece that fits
    /// nowhere needs.
    fn place_queued(
        &mut self,
        slots: Vec<Slot>,
        now: Timestamp,
        config: &SchedulerConfig,
        decisions: &mut Decisions,
    ) -> Vec<Amount> {
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
            entry.placement.phase = WorkPhase::Starting { worker: worker.0.clone() };
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
            decisions.changed = true;
        }
        self.queue = waiting;
        unplaced
    }
}

/// One instance of the smallest type that fits each piece of work no worker had room for, as
/// Arvados' scheduler creates for containers it cannot place, unless an instance already on
/// its way (a create in flight, a worker not yet booted) fits it: each such instance is
/// counted for one piece of work, the smallest that fits for the largest work first, whatever
/// type it was created as. Nothing for work that no type fits, or when no type says what it
/// has.
///
/// A type the cloud has no capacity for now is passed over for the next one that fits, as
/// Arvados falls back to a dearer type rather than let the work wait; when every type that
/// fits is held, the smallest is asked for and the pool refuses it until its hold ends.
fn creates_for_work(unplaced: &[Amount], snapshot: &Snapshot) -> Vec<String> {
    if snapshot.types.is_empty() {
        return Vec::new();
    }
    let has = |name: &str| snapshot.types.iter().find(|(n, _)| n == name).map(|(_, has)| *has);
    let booting =
        snapshot.workers.values().filter(|v| matches!(v.state, State::Unknown | State::Booting));
    let mut coming: Vec<Amount> = booting
        .filter_map(|v| has(&v.instance_type))
        .chain(
            snapshot
                .creating
                .iter()
                .flat_map(|(name, n)| has(name).map(|a| (a, *n)))
                .flat_map(|(a, n)| std::iter::repeat_n(a, n)),
        )
        .collect();
    // Smallest first, so that the first that fits is the smallest that does.
    coming.sort_by_key(|has| (has.memory_mb, has.cpu_mhz, has.cores));
    let mut needs: Vec<&Amount> = unplaced.iter().collect();
    needs.sort_by_key(|needs| std::cmp::Reverse((needs.memory_mb, needs.cpu_mhz, needs.cores)));
    let mut creates = Vec::new();
    for needs in needs {
        if let Some(at) = coming.iter().position(|has| has.shortfall(needs).is_none()) {
            coming.remove(at);
            continue;
        }
        let mut fitting = snapshot.types.iter().filter(|(_, has)| has.shortfall(needs).is_none());
        let smallest = fitting.next();
        let choice = smallest
            .into_iter()
            .chain(fitting)
            .find(|(name, _)| !snapshot.held.contains(name))
            .or(smallest);
        if let Some((name, _)) = choice {
            creates.push(name.clone());
        }
    }
    creates.sort();
    creates
}
