//! The worker state machine as data: a [`Record`] and its pure transitions.
//!
//! A record is everything a worker's decisions read and write: its [`State`], idle behaviour,
//! the moments that drive the timeouts (appeared, last probed, last busy, last changed), and
//! the runners it knows. Each transition is a method that takes what happened (a
//! [`ProbeReport`], an operator's request, a listing), the time and the [`Rules`], changes the
//! record, and appends the [`Effect`]s that follow (destroy, save tags, count an outcome) for
//! the owner to carry out. No transition does I/O or reads a clock, so each is tested as a
//! table; [`Worker`](super::Worker) is the shell that runs the commands and applies them.
//!
//! The probe's rules, after Arvados' `probeAndUpdate`:
//! - a run probe saying `broken`, or a stale lock held longer than `stale_run_lock`, drains a
//!   worker whose behaviour is `run` and counts its boot as failed;
//! - a failed probe, or an unbooted worker with no work, is shut down once the time from its
//!   last success to this probe's *start* reaches the booting (unknown, booting) or probe
//!   (idle, running) timeout: at least one probe always starts after the timeout. Never for
//!   `hold`, never while the fleet brake holds;
//! - after a passed probe, if the record changed while the probe ran (a runner started, a
//!   sync), the runners are left alone and the next probe catches up;
//! - listed runners are adopted or moved from starting to running; running ones not listed
//!   ended; a first pass of both probes makes the worker idle (or running), once.
//!
//! A runner that left the list (it ended, or a kill succeeded) is kept as awaiting its outcome
//! when [`Timeouts::outcome_hold`] is set: the worker is not shut down for idleness (drained,
//! or idle too long) until the pool's user says the outcome is in
//! ([`Record::outcome_collected`]) or the hold runs out, since asking a runner how work ended
//! needs the worker. Shutdowns for brokenness, on request and kills are not held.

use super::{BootOutcome, Effect, IdleBehavior, ProbeOutcome, State, WorkerSpec, WorkerView};
use crate::Tag;
use crate::clock::Moment;
use crate::config::Timeouts;
use crate::instance::{Instance, Tags};
use crate::resources::Resources;
use crate::runner_list::RunnerList;
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{debug, info, warn};
use wharf_state::duration::Formatted;

/// What the transitions are told besides the time: the timeouts, the tag prefix, and whether
/// the fleet brake holds shutdowns of unresponsive workers.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// The state machine's timeouts.
    pub timeouts: &'a Timeouts,
    /// Prefix of the tag keys the prober writes.
    pub tag_prefix: &'a str,
    /// The fleet brake is engaged.
    pub brake_engaged: bool,
}

/// A runner the worker knows of (started here, or found by a run probe).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runner {
    /// Tells this runner from a later one with the same id.
    pub generation: u64,
    /// Being killed since (with TERM repeated), if it is.
    pub kill: Option<Kill>,
    /// Killing it was given up: it is unkillable.
    pub given_up: bool,
}

/// A kill in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    /// Why it is killed.
    pub reason: String,
    /// When the next TERM is due.
    pub next_signal: Moment,
    /// When killing it is given up.
    pub give_up_at: Moment,
}

/// What one probe found, for [`Record::after_probe`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeReport {
    /// When the probe started.
    pub started: Moment,
    /// The record's `updated` when the probe started: a later change voids the runner list.
    pub updated: Moment,
    /// The state when the probe started.
    pub initial: State,
    /// The worker is booted: it was idle or running, or its boot probe passed (or a concurrent
    /// probe saw it boot) and the runner is in place.
    pub booted: bool,
    /// The boot probe reached the worker (it answered, even if with a failure).
    pub contacted: bool,
    /// Why the boot probe or the runner deployment failed.
    pub boot_error: Option<String>,
    /// The run probe, if it ran.
    pub run: Option<RunReport>,
}

impl ProbeReport {
    /// A report of a probe of `record` starting at `started` that has found nothing yet.
    pub fn start(record: &Record, started: Moment) -> ProbeReport {
        ProbeReport {
            started,
            updated: record.updated,
            initial: record.state,
            booted: record.state.is_booted(),
            contacted: false,
            boot_error: None,
            run: None,
        }
    }
}

/// What the run probe found.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// The parsed list, or why the probe failed.
    pub result: Result<RunnerList, String>,
    /// How long it took.
    pub took: Duration,
}

/// Everything a worker's decisions read and write. See the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Where it is in its life.
    pub state: State,
    /// What it does when it has no work.
    pub idle_behavior: IdleBehavior,
    /// The instance as last listed.
    pub instance: Instance,
    /// Its instance type's name.
    pub instance_type: String,
    /// When it appeared.
    pub appeared: Moment,
    /// Its last successful probe (its appearance, before the first).
    pub probed: Moment,
    /// Its last change that a probe result must not overwrite.
    pub updated: Moment,
    /// When work was last seen or started on it.
    pub busy: Moment,
    /// When a destroy was last issued.
    pub destroyed: Option<Moment>,
    /// When a probe first reached it.
    pub first_contact: Option<Moment>,
    /// The runner it last started (or one it was found running, if it started none).
    pub last_runner: Option<String>,
    /// Runners running.
    pub running: BTreeMap<String, Runner>,
    /// Runners whose start command is running.
    pub starting: BTreeMap<String, Runner>,
    /// Runners that left the list whose outcome the pool's user has not said is in, each with
    /// the moment its hold on an idle shutdown ends.
    pub awaiting_outcome: BTreeMap<String, Moment>,
    /// The boot outcome was counted.
    pub boot_outcome_reported: bool,
    /// The time to ready was observed.
    pub time_to_ready_reported: bool,
    /// Since when the run probe has reported a stale lock, if it does.
    pub stale_run_lock_since: Option<Moment>,
    /// The last probe failed.
    pub last_probe_failed: bool,
    /// Why, if it did.
    pub last_error: Option<String>,
    /// The last runner generation handed out.
    pub generation: u64,
    /// What it has for work, once its runner has said.
    pub resources: Option<Resources>,
    /// When its runner was last asked what it has, if it was.
    pub resources_asked: Option<Moment>,
}

impl Record {
    /// The record of a worker for `spec`, appearing at `now`.
    pub fn new(spec: WorkerSpec, now: Moment) -> Record {
        Record {
            state: spec.state,
            idle_behavior: spec.idle_behavior,
            instance: spec.instance,
            instance_type: spec.instance_type,
            appeared: now,
            probed: now,
            updated: now,
            busy: now,
            destroyed: None,
            first_contact: None,
            last_runner: None,
            running: BTreeMap::new(),
            starting: BTreeMap::new(),
            awaiting_outcome: BTreeMap::new(),
            boot_outcome_reported: false,
            time_to_ready_reported: false,
            stale_run_lock_since: None,
            last_probe_failed: false,
            last_error: None,
            generation: 0,
            resources: None,
            resources_asked: None,
        }
    }

    /// Records a runner found (or started) with id `id` as running, with a new generation.
    pub fn add_running(&mut self, id: &str) {
        let runner = self.new_runner();
        self.running.insert(id.to_owned(), runner);
    }

    fn new_runner(&mut self) -> Runner {
        self.generation += 1;
        Runner { generation: self.generation, ..Runner::default() }
    }

    fn busy_with(&self) -> usize {
        self.running.len() + self.starting.len()
    }

    /// A snapshot at `now`, for listings and metrics.
    pub fn view(&self, now: Moment) -> WorkerView {
        WorkerView {
            id: self.instance.id.clone(),
            address: self.instance.address.clone(),
            instance_type: self.instance_type.clone(),
            state: self.state,
            idle_behavior: self.idle_behavior,
            running: self.running.keys().cloned().collect(),
            starting: self.starting.keys().cloned().collect(),
            awaiting_outcome: self.awaiting_outcome.keys().cloned().collect(),
            last_runner: self.last_runner.clone(),
            probe_age: now.since(self.probed),
            idle_for: now.since(self.busy),
            last_probe_failed: self.last_probe_failed,
            last_error: self.last_error.clone(),
            resources: self.resources,
        }
    }

    /// For the fleet brake: `None` if the worker is not booted, else whether it is failing
    /// (its last probe failed, or it passed none for longer than `silent`).
    pub fn failing(&self, now: Moment, silent: Duration) -> Option<bool> {
        self.state.is_booted().then(|| self.last_probe_failed || now.since(self.probed) > silent)
    }

    /// Applies what a probe found. See the [module docs](self) for the rules.
    pub fn after_probe(
        &mut self,
        mut report: ProbeReport,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) -> ProbeOutcome {
        if report.contacted {
            self.first_contact.get_or_insert(report.started);
        }
        let mut error = report.boot_error.take();
        let (mut ok, mut listed, mut broken) = (false, Vec::new(), false);
        if let Some(run) = report.run.take() {
            fx.push(Effect::RunProbe { ok: run.result.is_ok(), took: run.took });
            match run.result {
                Ok(list) => {
                    ok = true;
                    // The stale-lock timer is kept whether or not the list says broken.
                    let stale_too_long = self.stale_too_long(&list.stale, now, rules);
                    broken = list.broken || stale_too_long;
                    listed = list.running;
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        self.last_probe_failed = !ok || !report.booted;
        self.last_error = error.clone();
        if broken && self.idle_behavior == IdleBehavior::Run {
            info!(worker = %self.instance.id, "run probe reported broken instance");
            self.report_boot_outcome(BootOutcome::Failure, fx);
            self.set_idle_behavior(IdleBehavior::Drain, now, rules, fx);
        }
        if !ok || (!report.booted && listed.is_empty() && self.running.is_empty()) {
            self.probe_failed(&report, error, now, rules, fx);
            return ProbeOutcome::Failed;
        }
        self.probe_passed(listed, &report, now, rules, fx);
        ProbeOutcome::Passed
    }

    /// Whether the stale lines of a run probe make the worker broken: a stale lock held longer
    /// than the timeout does. Keeps the timer.
    fn stale_too_long(&mut self, stale: &[String], now: Moment, rules: &Rules<'_>) -> bool {
        if stale.is_empty() {
            self.stale_run_lock_since = None;
            return false;
        }
        info!(worker = %self.instance.id, ?stale, "run probe reported a stale run lock");
        let since = *self.stale_run_lock_since.get_or_insert(now);
        let held = now.since(since);
        let too_long = held > rules.timeouts.stale_run_lock;
        if too_long {
            warn!(worker = %self.instance.id, ?held, "stale run lock held too long; reporting broken");
        }
        too_long
    }

    fn probe_failed(
        &mut self,
        report: &ProbeReport,
        error: Option<String>,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) {
        if self.state == State::Shutdown && self.updated > report.updated {
            // Shut down while the probe ran: nothing to add.
            return;
        }
        // Measured from the probe's start, so a slow failure cannot shut down a worker that
        // came back before the timeout: one more probe always starts after it.
        let unresponsive = report.started.since(self.probed);
        if self.shutdown_if_broken(unresponsive, now, rules, fx) && !report.booted {
            self.report_boot_outcome(BootOutcome::Failure, fx);
            info!(
                worker = %self.instance.id,
                waited = %Formatted(unresponsive),
                error = %error.unwrap_or_default(),
                "boot failed"
            );
        }
    }

    fn probe_passed(
        &mut self,
        listed: Vec<String>,
        report: &ProbeReport,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) {
        self.probed = now;
        if report.updated != self.updated {
            // Changed while the probe ran: `running` may hold a runner that had not started
            // when the list was made. The next probe catches up.
            debug!(worker = %self.instance.id, "skipping worker state update due to probe/sync race");
            return;
        }
        if let Some(first) = listed.first() {
            self.busy = now;
            // Work found here that this prober never started: any of it will do.
            self.last_runner.get_or_insert_with(|| first.clone());
        } else if !self.running.is_empty() {
            // It stopped being busy somewhere between the last probe and now; now is the
            // first moment that can be used.
            self.busy = now;
        }
        let mut changed = self.update_running(&listed, now, rules, fx);
        if report.booted && matches!(self.state, State::Unknown | State::Booting) {
            if self.state == State::Booting && !self.time_to_ready_reported {
                self.time_to_ready_reported = true;
                let since = self.first_contact.unwrap_or(report.started);
                fx.push(Effect::TimeToReady(now.since(since)));
            }
            self.state = State::Idle;
            changed = true;
        }
        if !changed {
            return;
        }
        if self.state == State::Unknown {
            info!(worker = %self.instance.id, running = self.running.len(), "run probe succeeded, but boot probe is still failing");
        }
        let busy = self.busy_with();
        if self.state == State::Idle && busy > 0 {
            self.state = State::Running;
        } else if self.state == State::Running && busy == 0 {
            self.state = State::Idle;
        }
        self.updated = now;
        if report.booted && matches!(report.initial, State::Unknown | State::Booting) {
            self.report_boot_outcome(BootOutcome::Success, fx);
            info!(worker = %self.instance.id, running = self.running.len(), state = %self.state, "probes succeeded, instance is in service");
        }
        fx.push(Effect::Notify);
    }

    /// Makes the running runners match a probe's `listed` ids: listed runners being started
    /// move to running, unknown ones are adopted, running ones not listed ended (and await
    /// their outcome). Starting ones not listed stay: they may not have started yet. Returns
    /// whether anything changed.
    fn update_running(
        &mut self,
        listed: &[String],
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) -> bool {
        let mut changed = false;
        for id in listed {
            // Listed after all (a probe that raced its start): it has not ended.
            self.awaiting_outcome.remove(id);
            if self.running.contains_key(id) {
                continue;
            }
            if let Some(runner) = self.starting.remove(id) {
                self.running.insert(id.clone(), runner);
            } else {
                info!(worker = %self.instance.id, runner = %id, "runner detected");
                self.add_running(id);
            }
            changed = true;
        }
        let gone: Vec<String> =
            self.running.keys().filter(|id| !listed.contains(id)).cloned().collect();
        for id in gone {
            self.runner_left(&id, now, rules, fx);
            changed = true;
        }
        changed
    }

    /// A running runner left the list (it ended, or was killed): it is closed, and awaits its
    /// outcome for at most [`Timeouts::outcome_hold`].
    fn runner_left(&mut self, id: &str, now: Moment, rules: &Rules<'_>, fx: &mut Vec<Effect>) {
        if !self.running.contains_key(id) {
            return;
        }
        self.close_runner(id, now, fx);
        let hold = rules.timeouts.outcome_hold;
        if !hold.is_zero() {
            self.awaiting_outcome.insert(id.to_owned(), now + hold);
        }
    }

    /// The pool's user has the outcome of runner `id`, or wants none: it no longer holds the
    /// worker, which is shut down now if that was all that kept it. Returns whether the
    /// outcome was awaited.
    pub fn outcome_collected(
        &mut self,
        id: &str,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) -> bool {
        if self.awaiting_outcome.remove(id).is_none() {
            return false;
        }
        debug!(worker = %self.instance.id, runner = %id, "runner outcome collected");
        self.shutdown_if_idle(now, rules, fx);
        true
    }

    /// Whether a runner's outcome still holds an idle shutdown at `now`.
    fn awaits_outcome(&self, now: Moment) -> bool {
        self.awaiting_outcome.values().any(|until| *until > now)
    }

    /// Lets go of the runners whose hold ran out by `now`: their outcome was not collected in
    /// time, and the worker no longer waits for it.
    fn end_outcome_holds(&mut self, now: Moment) {
        let worker = &self.instance.id;
        self.awaiting_outcome.retain(|id, until| {
            let holds = *until > now;
            if !holds {
                warn!(%worker, runner = %id, "the runner's outcome was not collected in time; the worker no longer waits for it");
            }
            holds
        });
    }

    /// Forgets a runner that ended: records its exit, and a running worker with nothing left
    /// turns idle.
    pub fn close_runner(&mut self, id: &str, now: Moment, fx: &mut Vec<Effect>) {
        if self.running.remove(id).is_none() {
            return;
        }
        info!(worker = %self.instance.id, runner = %id, "runner ended");
        self.updated = now;
        fx.push(Effect::RunnerExited(id.to_owned(), now));
        if self.state == State::Running && self.busy_with() == 0 {
            self.state = State::Idle;
        }
    }

    /// Counts the boot outcome, once per worker.
    pub fn report_boot_outcome(&mut self, outcome: BootOutcome, fx: &mut Vec<Effect>) {
        if !self.boot_outcome_reported {
            self.boot_outcome_reported = true;
            fx.push(Effect::BootOutcome(outcome));
        }
    }

    /// Shuts the worker down if it has been unresponsive for `unresponsive`: longer than the
    /// booting timeout while unknown or booting, the probe timeout after. Never for `hold`,
    /// never while the brake holds. Returns whether it did.
    fn shutdown_if_broken(
        &mut self,
        unresponsive: Duration,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) -> bool {
        if self.idle_behavior == IdleBehavior::Hold {
            return false;
        }
        let new = matches!(self.state, State::Unknown | State::Booting);
        let timeouts = rules.timeouts;
        let threshold = if new { timeouts.booting } else { timeouts.probe };
        if unresponsive < threshold {
            return false;
        }
        if rules.brake_engaged {
            warn!(worker = %self.instance.id, unresponsive_for = %Formatted(unresponsive), "instance unresponsive, but the fleet brake holds shutdowns");
            return false;
        }
        warn!(worker = %self.instance.id, unresponsive_for = %Formatted(unresponsive), state = %self.state, "{}instance unresponsive, shutting down", if new { "new " } else { "" });
        self.shut_down(now, fx);
        true
    }

    /// Whether the worker should be shut down now for being idle (too long, or drained), as
    /// Arvados' `eligibleForShutdown`, except that an unknown worker with work is never, nor
    /// one whose ended runner's outcome is still awaited.
    pub fn eligible_for_shutdown(&self, now: Moment, rules: &Rules<'_>) -> bool {
        if self.idle_behavior == IdleBehavior::Hold || self.awaits_outcome(now) {
            return false;
        }
        let draining = self.idle_behavior == IdleBehavior::Drain;
        let booting = rules.timeouts.booting;
        match self.state {
            State::Booting => draining,
            State::Idle => draining || now.since(self.busy) >= rules.timeouts.idle,
            State::Running => {
                draining && self.running.values().chain(self.starting.values()).all(|r| r.given_up)
            }
            // Never shut down an unknown worker with work, whatever its boot probe says.
            State::Unknown => {
                self.busy_with() == 0
                    && now.since(self.appeared) >= booting
                    && now.since(self.probed) >= booting
                    && !rules.brake_engaged
            }
            State::Shutdown => false,
        }
    }

    /// Shuts the worker down if it is idle too long or drained with nothing left, and no
    /// ended runner's outcome is awaited (holds that ran out are let go); returns whether it
    /// did.
    pub fn shutdown_if_idle(
        &mut self,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) -> bool {
        self.end_outcome_holds(now);
        if !self.eligible_for_shutdown(now, rules) {
            return false;
        }
        info!(worker = %self.instance.id, state = %self.state, idle_for = %Formatted(now.since(self.busy)), idle_behavior = %self.idle_behavior, "shutdown worker");
        self.report_boot_outcome(BootOutcome::Aborted, fx);
        self.shut_down(now, fx);
        true
    }

    fn shut_down(&mut self, now: Moment, fx: &mut Vec<Effect>) {
        self.updated = now;
        self.destroyed = Some(now);
        self.state = State::Shutdown;
        fx.push(Effect::Notify);
        fx.push(Effect::Destroy);
    }

    /// An operator's (or a scheduler's) shutdown: refused, with the reason, for `hold` and for
    /// states other than booting and idle.
    pub fn request_shutdown(&mut self, now: Moment, fx: &mut Vec<Effect>) -> Result<(), String> {
        if self.idle_behavior == IdleBehavior::Hold {
            return Err("its idle behavior is hold".into());
        }
        if !matches!(self.state, State::Booting | State::Idle) {
            return Err(format!("it is {}", self.state));
        }
        self.report_boot_outcome(BootOutcome::Aborted, fx);
        self.shut_down(now, fx);
        Ok(())
    }

    /// Destroys the instance whatever its state or behaviour (an operator's kill).
    pub fn kill_instance(&mut self, reason: &str, now: Moment, fx: &mut Vec<Effect>) {
        if self.state == State::Shutdown {
            return;
        }
        warn!(worker = %self.instance.id, reason, "killing instance");
        self.report_boot_outcome(BootOutcome::Aborted, fx);
        self.shut_down(now, fx);
    }

    /// Destroys a shut-down instance again (it is still listed after the shutdown timeout).
    pub fn destroy_again(&mut self, now: Moment, fx: &mut Vec<Effect>) {
        self.destroyed = Some(now);
        fx.push(Effect::Destroy);
    }

    /// Sets the idle behaviour, saves it in the instance's tags, and shuts the worker down if
    /// that makes it eligible.
    pub fn set_idle_behavior(
        &mut self,
        idle_behavior: IdleBehavior,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) {
        info!(worker = %self.instance.id, %idle_behavior, "set idle behavior");
        self.idle_behavior = idle_behavior;
        self.save_tags(rules, fx);
        self.shutdown_if_idle(now, rules, fx);
    }

    /// Queues a tag update if the instance's tags do not already say its type and behaviour.
    fn save_tags(&mut self, rules: &Rules<'_>, fx: &mut Vec<Effect>) {
        let want = [
            (Tag::InstanceType.key(rules.tag_prefix), self.instance_type.clone()),
            (Tag::IdleBehavior.key(rules.tag_prefix), self.idle_behavior.as_str().to_owned()),
        ];
        let mut tags: Tags = self.instance.tags.clone();
        let mut save = false;
        for (key, value) in want {
            if tags.get(&key) != Some(&value) {
                tags.insert(key, value);
                save = true;
            }
        }
        if save {
            self.instance.tags = tags.clone();
            fx.push(Effect::SaveTags(tags));
        }
    }

    /// Takes a fresh listing of the instance (from a sync): keeps its address and host key
    /// current, marks the record changed if the listing changed, and saves tags that drifted.
    pub fn sync_instance(
        &mut self,
        instance: Instance,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) {
        // An unchanged listing changes nothing a probe result could overwrite: counting it as
        // a change would discard every probe that overlaps a sync.
        if self.instance != instance {
            self.instance = instance;
            self.updated = now;
        }
        self.save_tags(rules, fx);
    }

    /// Begins starting runner `id`: the worker is `running` from now. Returns the runner's
    /// generation, for [`Record::start_ended`], or why the worker takes no such work.
    pub fn begin_start(&mut self, id: &str, fx: &mut Vec<Effect>) -> Result<u64, String> {
        if self.idle_behavior != IdleBehavior::Run || !self.state.is_booted() {
            return Err(format!("it is {} with idle behavior {}", self.state, self.idle_behavior));
        }
        if self.running.contains_key(id) || self.starting.contains_key(id) {
            return Err(format!("runner {id} is already there"));
        }
        let runner = self.new_runner();
        let generation = runner.generation;
        // A new runner under the id: the outcome command would now say how this one goes.
        self.awaiting_outcome.remove(id);
        self.starting.insert(id.to_owned(), runner);
        if self.state != State::Running {
            self.state = State::Running;
            fx.push(Effect::Notify);
        }
        Ok(generation)
    }

    /// The start command of runner `id` (of `generation`) returned, however: the runner is
    /// counted as running, since it might have started; the next probe is the judge. If a
    /// probe or a close moved or dropped it meanwhile, it is left as it is.
    pub fn start_ended(&mut self, id: &str, generation: u64, now: Moment) {
        if self.starting.get(id).map(|r| r.generation) == Some(generation)
            && let Some(runner) = self.starting.remove(id)
        {
            self.updated = now;
            self.busy = now;
            self.running.insert(id.to_owned(), runner);
            self.last_runner = Some(id.to_owned());
        }
    }

    /// Begins killing runner `id` (TERM now, again every `signal`, given up after `term`);
    /// false if the worker does not know it. A kill already under way is left as it is.
    pub fn begin_kill(&mut self, id: &str, reason: &str, now: Moment, term: Duration) -> bool {
        let runner = match self.running.get_mut(id) {
            Some(runner) => runner,
            None => match self.starting.get_mut(id) {
                Some(runner) => runner,
                None => return false,
            },
        };
        if runner.kill.is_none() {
            runner.kill =
                Some(Kill { reason: reason.to_owned(), next_signal: now, give_up_at: now + term });
        }
        true
    }

    /// The runners due a TERM now (their next one is then one `signal` away). Runners past
    /// their kill deadline are given up on, which drains the worker unless it is on hold.
    pub fn kills_due(
        &mut self,
        now: Moment,
        rules: &Rules<'_>,
        fx: &mut Vec<Effect>,
    ) -> Vec<String> {
        let mut due = Vec::new();
        let mut gave_up = Vec::new();
        for (id, runner) in self.running.iter_mut().chain(self.starting.iter_mut()) {
            let Some(kill) = runner.kill.as_mut() else { continue };
            if runner.given_up {
                continue;
            }
            if now >= kill.give_up_at {
                runner.given_up = true;
                gave_up.push((id.clone(), kill.reason.clone()));
            } else if now >= kill.next_signal {
                kill.next_signal = now + rules.timeouts.signal;
                due.push(id.clone());
            }
        }
        for (id, reason) in gave_up {
            if self.idle_behavior == IdleBehavior::Hold {
                warn!(worker = %self.instance.id, runner = %id, reason, "unkillable runner, but worker has idle behavior hold");
            } else {
                warn!(worker = %self.instance.id, runner = %id, reason, "unkillable runner, draining worker");
                self.set_idle_behavior(IdleBehavior::Drain, now, rules, fx);
            }
        }
        due
    }

    /// A kill of runner `id` succeeded: it is gone, and awaits its outcome as one that ended.
    pub fn killed(&mut self, id: &str, now: Moment, rules: &Rules<'_>, fx: &mut Vec<Effect>) {
        info!(worker = %self.instance.id, runner = %id, "runner killed");
        self.starting.remove(id);
        self.runner_left(id, now, rules, fx);
        fx.push(Effect::Notify);
    }

    /// Abandons every runner (the instance is gone).
    pub fn abandon_runners(&mut self) {
        for id in self.running.keys().chain(self.starting.keys()) {
            info!(worker = %self.instance.id, runner = %id, "runner abandoned");
        }
        self.running.clear();
        self.starting.clear();
        self.awaiting_outcome.clear();
    }
}
