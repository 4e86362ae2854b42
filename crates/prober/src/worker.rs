//! The worker state machine: one cloud instance, probed over its [`Executor`].
//!
//! A worker is `unknown` (found by a list, not created by us, not yet probed), `booting`
//! (created by us), `idle`, `running` or `shutdown` (destroy issued). Beside the state it has
//! an [`IdleBehavior`]: `run` (take work; shut down when idle too long), `hold` (never shut
//! down, take no work) or `drain` (take no work; shut down as soon as idle, while booting, or
//! while running once every runner has given up being killed).
//!
//! [`Worker::probe_and_update`] is the heart, with the reference's rules:
//! - `unknown` gets the boot probe and the run probe; `booting` the boot probe, then the run
//!   probe if it passed; `idle` and `running` the run probe; `shutdown` nothing.
//! - Booting (or unknown), a passing boot probe is followed by the runner deployment; an
//!   unknown worker gets the deployment even when its boot probe fails, so its run probe can
//!   see work left by an earlier prober. A failed copy counts as a failed boot.
//! - A boot probe that fails while a concurrent probe already found the worker booted counts
//!   as passed.
//! - A run probe saying `broken` (or a stale lock held longer than
//!   [`Timeouts::stale_run_lock`](crate::Timeouts)) drains a worker whose behaviour is `run`
//!   and reports the boot as failed.
//! - A failed probe (or an unbooted worker with no work) shuts the worker down once the time
//!   from its last success to this probe's *start* reaches the booting or probe timeout, so at
//!   least one probe always starts after the timeout. Never for `hold`; never while the pool's
//!   fleet brake is engaged.
//! - After a successful probe, if the worker changed while the probe ran (a runner started, a
//!   sync), the result is dropped and the next probe catches up.
//! - The boot outcome is reported once per worker; the time from first contact to ready once.
//!
//! The fixes over the reference: every command has a deadline (a hung probe ends and counts as
//! failed); an `unknown` worker whose run probe shows work is never shut down for its boot probe
//! failing or for its age; a pool-wide brake ([`Brake`]) stops shutdowns for brokenness when
//! too many workers fail at once.
//!
//! Decisions are made under a short `parking_lot` lock that is never held across I/O; what
//! follows from them (destroy the instance, save tags, count a boot outcome) is queued as
//! [`Effect`]s that the owner (the pool) takes with [`Worker::take_effects`] and carries out.

use crate::clock::{Clock, Moment};
use crate::config::Prepared;
use crate::executor::Executor;
use crate::instance::{Instance, InstanceId, Tags};
use crate::quote::quote;
use crate::runner_list;
use crate::{ProberError, Tag};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{debug, info, warn};

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// Found by a list, not created by this prober; not yet probed successfully. Might be
    /// running work already.
    Unknown,
    /// Created by this prober, booting.
    Booting,
    /// Booted, nothing running.
    Idle,
    /// Running (or starting) work.
    Running,
    /// Destroy issued; no longer probed.
    Shutdown,
}

impl State {
    /// Every state, in order.
    pub const ALL: [State; 5] =
        [State::Unknown, State::Booting, State::Idle, State::Running, State::Shutdown];

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Booting => "booting",
            State::Idle => "idle",
            State::Running => "running",
            State::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a worker does when it has no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IdleBehavior {
    /// Take work; shut down after the idle timeout.
    Run,
    /// Take no new work and never shut down by itself.
    Hold,
    /// Take no new work; shut down as soon as nothing runs.
    Drain,
}

impl IdleBehavior {
    /// The lowercase name, as saved in the instance's tag.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleBehavior::Run => "run",
            IdleBehavior::Hold => "hold",
            IdleBehavior::Drain => "drain",
        }
    }

    /// Parses a tag value.
    pub fn parse(value: &str) -> Option<IdleBehavior> {
        match value {
            "run" => Some(IdleBehavior::Run),
            "hold" => Some(IdleBehavior::Hold),
            "drain" => Some(IdleBehavior::Drain),
            _ => None,
        }
    }
}

impl fmt::Display for IdleBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a worker's boot ended; counted once per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BootOutcome {
    /// It never booted, or reported itself broken.
    Failure,
    /// Both probes passed.
    Success,
    /// Shut down (idle, drained, asked) before an outcome.
    Aborted,
    /// Vanished from the instance list.
    Disappeared,
}

impl BootOutcome {
    /// Every outcome.
    pub const ALL: [BootOutcome; 4] = [
        BootOutcome::Failure,
        BootOutcome::Success,
        BootOutcome::Aborted,
        BootOutcome::Disappeared,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            BootOutcome::Failure => "failure",
            BootOutcome::Success => "success",
            BootOutcome::Aborted => "aborted",
            BootOutcome::Disappeared => "disappeared",
        }
    }
}

/// Something that follows from a worker's decision, for its owner to carry out.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Destroy the instance.
    Destroy,
    /// Replace the instance's tags with these.
    SaveTags(Tags),
    /// Count this boot outcome.
    BootOutcome(BootOutcome),
    /// Observe the time from first contact to ready.
    TimeToReady(Duration),
    /// A run probe finished (for the duration metric).
    RunProbe {
        /// It succeeded.
        ok: bool,
        /// How long it took.
        took: Duration,
    },
    /// This runner ended at this moment.
    RunnerExited(String, Moment),
    /// Something a scheduler cares about changed.
    Notify,
}

/// The fleet-wide brake: while engaged, no worker is shut down for being unresponsive.
///
/// The pool engages it when more than a configured share of booted workers fail their probes
/// at once, which is what a network outage or a broken credential looks like; judging each
/// worker alone would then destroy the whole fleet.
#[derive(Debug, Default)]
pub struct Brake {
    engaged: AtomicBool,
    reason: Mutex<String>,
}

impl Brake {
    /// Whether shutdowns for brokenness are held.
    pub fn engaged(&self) -> bool {
        self.engaged.load(Ordering::Relaxed)
    }

    /// Why it is engaged (empty when it is not).
    pub fn reason(&self) -> String {
        self.reason.lock().clone()
    }

    /// Engages it with `reason`, or releases it with `None`; returns whether it changed.
    pub fn set(&self, reason: Option<String>) -> bool {
        let engaged = reason.is_some();
        *self.reason.lock() = reason.unwrap_or_default();
        self.engaged.swap(engaged, Ordering::Relaxed) != engaged
    }
}

/// What the pool knows when it creates a worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The instance.
    pub instance: Instance,
    /// Its instance type name.
    pub instance_type: String,
    /// `Booting` if this prober created it, else `Unknown`.
    pub state: State,
    /// Its idle behaviour (from its tag, or `Run`).
    pub idle_behavior: IdleBehavior,
}

/// A runner the worker knows of (started by us, or found by a run probe).
#[derive(Debug, Clone)]
struct Runner {
    /// Tells this runner from a later one with the same id.
    generation: u64,
    kill: Option<Kill>,
    given_up: bool,
}

#[derive(Debug, Clone)]
struct Kill {
    reason: String,
    next_signal: Moment,
    give_up_at: Moment,
}

#[derive(Debug)]
struct Inner {
    state: State,
    idle_behavior: IdleBehavior,
    instance: Instance,
    instance_type: String,
    appeared: Moment,
    /// Last successful probe (the appearance, before the first).
    probed: Moment,
    /// Last change a probe result must not overwrite.
    updated: Moment,
    /// Last time work was seen or started.
    busy: Moment,
    destroyed: Option<Moment>,
    first_contact: Option<Moment>,
    last_runner: Option<String>,
    running: BTreeMap<String, Runner>,
    starting: BTreeMap<String, Runner>,
    boot_outcome_reported: bool,
    time_to_ready_reported: bool,
    stale_run_lock_since: Option<Moment>,
    last_probe_failed: bool,
    last_error: Option<String>,
    generation: u64,
    effects: Vec<Effect>,
}

/// A snapshot of a worker, for listings and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    /// The instance id.
    pub id: InstanceId,
    /// Its address.
    pub address: Option<String>,
    /// Its instance type.
    pub instance_type: String,
    /// Its state.
    pub state: State,
    /// Its idle behaviour.
    pub idle_behavior: IdleBehavior,
    /// Runners it runs.
    pub running: Vec<String>,
    /// Runners being started.
    pub starting: Vec<String>,
    /// The last runner it ran.
    pub last_runner: Option<String>,
    /// Time since its last successful probe (or since it appeared).
    pub probe_age: Duration,
    /// Time since it was last busy.
    pub idle_for: Duration,
    /// Whether its last probe failed.
    pub last_probe_failed: bool,
    /// The last probe error, if the last probe failed.
    pub last_error: Option<String>,
}

/// What [`Worker::probe_and_update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Another probe of this worker is in flight; nothing was done.
    AlreadyProbing,
    /// The worker is shut down; nothing was done.
    NotProbed,
    /// The probes passed.
    Passed,
    /// A probe failed (or an unbooted worker showed no work).
    Failed,
}

/// One worker: an instance, its executor and its state machine.
pub struct Worker {
    id: InstanceId,
    executor: Arc<dyn Executor>,
    config: Arc<Prepared>,
    clock: Arc<dyn Clock>,
    brake: Arc<Brake>,
    probing: AtomicBool,
    inner: Mutex<Inner>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish_non_exhaustive()
    }
}

/// Resets the probing flag when a probe ends, however it ends.
struct ProbingGuard<'a>(&'a AtomicBool);

impl Drop for ProbingGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Worker {
    /// A worker for `spec`, appearing now. `config` comes from
    /// [`WorkerConfig::prepare`](crate::WorkerConfig::prepare).
    pub fn new(
        spec: WorkerSpec,
        executor: Arc<dyn Executor>,
        config: Arc<Prepared>,
        clock: Arc<dyn Clock>,
        brake: Arc<Brake>,
    ) -> Worker {
        let now = clock.now();
        Worker {
            id: spec.instance.id.clone(),
            executor,
            config,
            clock,
            brake,
            probing: AtomicBool::new(false),
            inner: Mutex::new(Inner {
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
                boot_outcome_reported: false,
                time_to_ready_reported: false,
                stale_run_lock_since: None,
                last_probe_failed: false,
                last_error: None,
                generation: 0,
                effects: Vec::new(),
            }),
        }
    }

    /// The instance id.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.inner.lock().state
    }

    /// The current idle behaviour.
    pub fn idle_behavior(&self) -> IdleBehavior {
        self.inner.lock().idle_behavior
    }

    /// Whether a probe is in flight.
    pub fn is_probing(&self) -> bool {
        self.probing.load(Ordering::Acquire)
    }

    /// Whether the last probe failed.
    pub fn last_probe_failed(&self) -> bool {
        self.inner.lock().last_probe_failed
    }

    /// For the fleet brake, from one look at the worker: `None` if it is not booted (idle or
    /// running), else whether it is failing: its last probe failed, or it has passed none for
    /// longer than `silent`.
    pub fn failing(&self, silent: Duration) -> Option<bool> {
        let inner = self.inner.lock();
        matches!(inner.state, State::Idle | State::Running)
            .then(|| inner.last_probe_failed || self.clock.now().since(inner.probed) > silent)
    }

    /// Time since the last successful probe (or since appearing).
    pub fn probe_age(&self) -> Duration {
        let probed = self.inner.lock().probed;
        self.clock.now().since(probed)
    }

    /// The effects queued since the last call, oldest first.
    pub fn take_effects(&self) -> Vec<Effect> {
        std::mem::take(&mut self.inner.lock().effects)
    }

    /// A snapshot.
    pub fn view(&self) -> WorkerView {
        let now = self.clock.now();
        let inner = self.inner.lock();
        WorkerView {
            id: self.id.clone(),
            address: inner.instance.address.clone(),
            instance_type: inner.instance_type.clone(),
            state: inner.state,
            idle_behavior: inner.idle_behavior,
            running: inner.running.keys().cloned().collect(),
            starting: inner.starting.keys().cloned().collect(),
            last_runner: inner.last_runner.clone(),
            probe_age: now.since(inner.probed),
            idle_for: now.since(inner.busy),
            last_probe_failed: inner.last_probe_failed,
            last_error: inner.last_error.clone(),
        }
    }

    /// Runs the probes the current state calls for and updates the state from them. Returns
    /// at once if a probe of this worker is already in flight. Every command it runs has a
    /// deadline, so it returns within a bounded time.
    pub async fn probe_and_update(&self) -> ProbeOutcome {
        if self.probing.swap(true, Ordering::AcqRel) {
            debug!(worker = %self.id, "still waiting for last probe to finish");
            return ProbeOutcome::AlreadyProbing;
        }
        let _guard = ProbingGuard(&self.probing);
        self.probe_locked_out().await
    }

    async fn probe_locked_out(&self) -> ProbeOutcome {
        let (updated, initial_state, remote_user) = {
            let inner = self.inner.lock();
            (inner.updated, inner.state, inner.instance.remote_user.clone())
        };
        let mut booted = match initial_state {
            State::Shutdown => return ProbeOutcome::NotProbed,
            State::Idle | State::Running => true,
            State::Unknown | State::Booting => false,
        };
        let probe_start = self.clock.now();
        let mut boot_error: Option<ProberError> = None;

        if !booted {
            match self.probe_booted().await {
                Ok(()) => booted = true,
                Err(e) => boot_error = Some(e),
            }
            if boot_error.as_ref().is_none_or(ProberError::reached_worker) {
                let mut inner = self.inner.lock();
                inner.first_contact.get_or_insert(probe_start);
            }
            let mut should_copy = booted || initial_state == State::Unknown;
            if !booted {
                // A concurrent attempt (or a sync) may have seen it boot meanwhile.
                let inner = self.inner.lock();
                if matches!(inner.state, State::Running | State::Idle) {
                    booted = true;
                    should_copy = false;
                }
            }
            if should_copy && let Err(e) = self.deploy_runner(&remote_user).await {
                warn!(worker = %self.id, error = %e, "cannot copy the runner binary");
                booted = false;
                boot_error = Some(e);
            }
            if booted {
                info!(worker = %self.id, "instance booted; will run the run probe");
            }
        }

        let mut run: Option<RunProbe> = None;
        if booted || initial_state == State::Unknown {
            run = Some(self.probe_running(&remote_user).await);
        }

        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let mut listed: Vec<String> = Vec::new();
        let mut ok = false;
        let mut reported_broken = false;
        if let Some(run) = run {
            inner.effects.push(Effect::RunProbe { ok: run.result.is_ok(), took: run.took });
            match run.result {
                Ok(list) => {
                    ok = true;
                    listed = list.running;
                    reported_broken = list.broken;
                    if list.stale.is_empty() {
                        inner.stale_run_lock_since = None;
                    } else {
                        info!(worker = %self.id, stale = ?list.stale, "run probe reported a stale run lock");
                        match inner.stale_run_lock_since {
                            None => inner.stale_run_lock_since = Some(now),
                            Some(since)
                                if now.since(since) > self.config.timeouts.stale_run_lock =>
                            {
                                warn!(worker = %self.id, held = ?now.since(since), "stale run lock held too long; reporting broken");
                                reported_broken = true;
                            }
                            Some(_) => {}
                        }
                    }
                }
                Err(e) => {
                    boot_error.get_or_insert(e);
                }
            }
        }
        inner.last_probe_failed = !ok || !booted;
        inner.last_error = boot_error.as_ref().map(ToString::to_string);
        if reported_broken && inner.idle_behavior == IdleBehavior::Run {
            info!(worker = %self.id, "run probe reported broken instance");
            self.report_boot_outcome(&mut inner, BootOutcome::Failure);
            self.set_idle_behavior_locked(&mut inner, IdleBehavior::Drain);
        }

        if !ok || (!booted && listed.is_empty() && inner.running.is_empty()) {
            if inner.state == State::Shutdown && inner.updated > updated {
                // Shut down while the probe ran: nothing to add.
                return ProbeOutcome::Failed;
            }
            // Measured from the probe's start, so a slow failure cannot shut down a worker
            // that came back before the timeout: one more probe always starts after it.
            let dur = probe_start.since(inner.probed);
            if self.shutdown_if_broken(&mut inner, dur) && !booted {
                self.report_boot_outcome(&mut inner, BootOutcome::Failure);
                info!(
                    worker = %self.id,
                    waited = ?dur,
                    error = %boot_error.as_ref().map(ToString::to_string).unwrap_or_default(),
                    "boot failed"
                );
            }
            return ProbeOutcome::Failed;
        }

        inner.probed = now;
        if updated != inner.updated {
            // Changed while the probe ran: `running` may hold a runner that had not started
            // when the list was made. The next probe catches up.
            debug!(worker = %self.id, "skipping worker state update due to probe/sync race");
            return ProbeOutcome::Passed;
        }

        if let Some(first) = listed.first() {
            inner.busy = now;
            inner.last_runner = Some(first.clone());
        } else if !inner.running.is_empty() {
            // It stopped being busy somewhere between the last probe and now; now is the
            // first moment that can be used.
            inner.busy = now;
        }

        let mut changed = self.update_running(&mut inner, &listed, now);

        if booted && matches!(inner.state, State::Unknown | State::Booting) {
            if inner.state == State::Booting && !inner.time_to_ready_reported {
                inner.time_to_ready_reported = true;
                let since = inner.first_contact.unwrap_or(probe_start);
                inner.effects.push(Effect::TimeToReady(now.since(since)));
            }
            inner.state = State::Idle;
            changed = true;
        }
        if !changed {
            return ProbeOutcome::Passed;
        }
        if inner.state == State::Unknown {
            info!(worker = %self.id, running = inner.running.len(), "run probe succeeded, but boot probe is still failing");
        }
        let busy = inner.starting.len() + inner.running.len();
        if inner.state == State::Idle && busy > 0 {
            inner.state = State::Running;
        } else if inner.state == State::Running && busy == 0 {
            inner.state = State::Idle;
        }
        inner.updated = now;
        if booted && matches!(initial_state, State::Unknown | State::Booting) {
            self.report_boot_outcome(&mut inner, BootOutcome::Success);
            info!(worker = %self.id, running = inner.running.len(), state = %inner.state, "probes succeeded, instance is in service");
        }
        inner.effects.push(Effect::Notify);
        ProbeOutcome::Passed
    }

    async fn probe_booted(&self) -> Result<(), ProberError> {
        let command = match self.config.boot_probe_command.trim() {
            "" => "true",
            command => command,
        };
        let result = self
            .executor
            .execute(command, &[], self.config.command_deadline)
            .await
            .and_then(|out| out.checked(&self.id.0, command));
        match &result {
            Ok(_) => info!(worker = %self.id, "boot probe succeeded"),
            Err(e) if e.expected_while_booting() => {
                debug!(worker = %self.id, error = %e, "boot probe failed")
            }
            // Likely configuration (a key refused, a host key changed): say so now rather
            // than at the boot timeout.
            Err(e) => warn!(worker = %self.id, error = %e, "boot probe failed"),
        }
        result.map(|_| ())
    }

    async fn probe_running(&self, remote_user: &str) -> RunProbe {
        let started = self.clock.now();
        let result = async {
            let command = format!(
                "{}{} {}",
                sudo(remote_user),
                self.config.runner_program()?,
                self.config.runner.list_args
            );
            let out = self
                .executor
                .execute(&command, &[], self.config.command_deadline)
                .await?
                .checked(&self.id.0, &command)?;
            let list = runner_list::parse(&out.stdout, &self.config.cluster_prefix);
            if !list.malformed.is_empty() {
                warn!(worker = %self.id, lines = ?list.malformed, "run probe printed lines that fit no form of the runner-list grammar");
            }
            Ok(list)
        }
        .await;
        if let Err(e) = &result {
            warn!(worker = %self.id, error = %e, "run probe failed");
        }
        RunProbe { result, took: self.clock.now().since(started) }
    }

    /// Copies the runner binary unless the worker has it already: into a temp file beside
    /// the content-addressed path, checked, renamed into place, and checked again.
    async fn deploy_runner(&self, remote_user: &str) -> Result<(), ProberError> {
        let (Some(deployment), Some(binary)) =
            (self.config.deployment(), self.config.runner.binary.as_ref())
        else {
            return Ok(());
        };
        let path = quote("runner path", &deployment.path)?;
        let check = format!("sha256sum {path}");
        let deadline = self.config.command_deadline;
        let has = |out: &crate::Output| {
            out.success()
                && out.stdout.split(|b| *b == b' ').next() == Some(deployment.sha256.as_bytes())
        };
        if let Ok(out) = self.executor.execute(&check, &[], deadline).await
            && has(&out)
        {
            debug!(worker = %self.id, path = %deployment.path, "runner binary already there");
            return Ok(());
        }
        let directory = quote(
            "runner directory",
            deployment
                .path
                .rsplit_once('/')
                .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d }),
        )?;
        let script = format!(
            "set -e; dir={directory}; dst={path}; tmp=\"$dst.tmp.$$\"; \
             mkdir -p \"$dir\"; chmod 0755 \"$dir\"; \
             trap 'rm -f \"$tmp\"' EXIT; cat >\"$tmp\"; chmod 0755 \"$tmp\"; \
             sum=$(sha256sum \"$tmp\"); \
             if [ \"${{sum%% *}}\" != {hash} ]; then echo \"checksum mismatch: $sum\" >&2; exit 1; fi; \
             mv -f \"$tmp\" \"$dst\"; trap - EXIT",
            hash = deployment.sha256,
        );
        let command = if remote_user == "root" {
            script
        } else {
            format!("sudo sh -c {}", quote("install script", &script)?)
        };
        let binary = binary.load().await?;
        info!(worker = %self.id, path = %deployment.path, bytes = binary.len(), "installing runner binary on worker");
        self.executor
            .execute(&command, &binary, self.config.deploy_deadline)
            .await?
            .checked(&self.id.0, "install runner binary")?;
        let out = self.executor.execute(&check, &[], deadline).await?;
        if !has(&out) {
            return Err(ProberError::DeployMismatch {
                worker: self.id.0.clone(),
                path: deployment.path.clone(),
                expected: deployment.sha256.clone(),
                found: String::from_utf8_lossy(&out.stdout).chars().take(100).collect(),
            });
        }
        Ok(())
    }

    fn report_boot_outcome(&self, inner: &mut Inner, outcome: BootOutcome) {
        if inner.boot_outcome_reported {
            return;
        }
        inner.boot_outcome_reported = true;
        inner.effects.push(Effect::BootOutcome(outcome));
    }

    /// Shuts the worker down if it has been unresponsive for `dur`; returns whether it did.
    fn shutdown_if_broken(&self, inner: &mut Inner, dur: Duration) -> bool {
        if inner.idle_behavior == IdleBehavior::Hold {
            return false;
        }
        let new = matches!(inner.state, State::Unknown | State::Booting);
        let threshold = if new { self.config.timeouts.booting } else { self.config.timeouts.probe };
        if dur < threshold {
            return false;
        }
        if self.brake.engaged() {
            warn!(worker = %self.id, unresponsive_for = ?dur, reason = %self.brake.reason(), "instance unresponsive, but the fleet brake holds shutdowns");
            return false;
        }
        warn!(worker = %self.id, unresponsive_for = ?dur, state = %inner.state, "{}instance unresponsive, shutting down", if new { "new " } else { "" });
        self.shutdown_locked(inner);
        true
    }

    fn eligible_for_shutdown(&self, inner: &Inner, now: Moment) -> bool {
        if inner.idle_behavior == IdleBehavior::Hold {
            return false;
        }
        let draining = inner.idle_behavior == IdleBehavior::Drain;
        match inner.state {
            State::Booting => draining,
            State::Idle => draining || now.since(inner.busy) >= self.config.timeouts.idle,
            State::Running => {
                draining
                    && inner.running.values().chain(inner.starting.values()).all(|r| r.given_up)
            }
            // Never shut down an unknown worker with work, whatever its boot probe says.
            State::Unknown => {
                inner.running.is_empty()
                    && inner.starting.is_empty()
                    && now.since(inner.appeared) >= self.config.timeouts.booting
                    && now.since(inner.probed) >= self.config.timeouts.booting
                    && !self.brake.engaged()
            }
            State::Shutdown => false,
        }
    }

    /// Shuts the worker down if it is idle too long or draining with nothing left; returns
    /// whether it did.
    pub fn shutdown_if_idle(&self) -> bool {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        self.shutdown_if_idle_locked(&mut inner, now)
    }

    fn shutdown_if_idle_locked(&self, inner: &mut Inner, now: Moment) -> bool {
        if !self.eligible_for_shutdown(inner, now) {
            return false;
        }
        info!(worker = %self.id, state = %inner.state, idle_for = ?now.since(inner.busy), idle_behavior = %inner.idle_behavior, "shutdown worker");
        self.report_boot_outcome(inner, BootOutcome::Aborted);
        self.shutdown_locked(inner);
        true
    }

    fn shutdown_locked(&self, inner: &mut Inner) {
        let now = self.clock.now();
        inner.updated = now;
        inner.destroyed = Some(now);
        inner.state = State::Shutdown;
        inner.effects.push(Effect::Notify);
        inner.effects.push(Effect::Destroy);
    }

    /// Sets the idle behaviour, saves it in the instance's tags, and shuts the worker down if
    /// that makes it eligible.
    pub fn set_idle_behavior(&self, idle_behavior: IdleBehavior) {
        let mut inner = self.inner.lock();
        self.set_idle_behavior_locked(&mut inner, idle_behavior);
    }

    fn set_idle_behavior_locked(&self, inner: &mut Inner, idle_behavior: IdleBehavior) {
        info!(worker = %self.id, %idle_behavior, "set idle behavior");
        inner.idle_behavior = idle_behavior;
        self.save_tags(inner);
        let now = self.clock.now();
        self.shutdown_if_idle_locked(inner, now);
    }

    /// Queues a tag update if the instance's tags do not already say its type and behaviour.
    fn save_tags(&self, inner: &mut Inner) {
        let prefix = &self.config.tag_prefix;
        let want = [
            (Tag::InstanceType.key(prefix), inner.instance_type.clone()),
            (Tag::IdleBehavior.key(prefix), inner.idle_behavior.as_str().to_owned()),
        ];
        let mut tags = inner.instance.tags.clone();
        let mut save = false;
        for (key, value) in want {
            if tags.get(&key) != Some(&value) {
                tags.insert(key, value);
                save = true;
            }
        }
        if save {
            inner.instance.tags = tags.clone();
            inner.effects.push(Effect::SaveTags(tags));
        }
    }

    /// Takes a fresh listing of the instance (from a sync): keeps its address and host key
    /// current, marks the worker updated if the listing changed, and saves tags that drifted.
    pub fn sync_instance(&self, instance: Instance) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        // An unchanged listing changes nothing a probe result could overwrite: counting it as
        // a change would discard every probe that overlaps a sync.
        if inner.instance != instance {
            inner.instance = instance;
            inner.updated = now;
        }
        self.save_tags(&mut inner);
    }

    /// When the worker last changed in a way a probe result must not overwrite.
    pub fn updated_at(&self) -> Moment {
        self.inner.lock().updated
    }

    /// The executor (for retargeting after a sync).
    pub fn executor(&self) -> &Arc<dyn Executor> {
        &self.executor
    }

    /// The instance as last listed.
    pub fn instance(&self) -> Instance {
        self.inner.lock().instance.clone()
    }

    /// When a destroy was last issued.
    pub fn destroyed_at(&self) -> Option<Moment> {
        self.inner.lock().destroyed
    }

    /// Records another destroy attempt (a retry by the pool).
    pub fn destroy_again(&self) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.destroyed = Some(now);
        inner.effects.push(Effect::Destroy);
    }

    /// Shuts the worker down on request: refused for `hold` and for states other than
    /// booting and idle.
    pub fn shutdown(&self) -> Result<(), ProberError> {
        let mut inner = self.inner.lock();
        let refuse = |reason: String| ProberError::NotAllowed {
            worker: self.id.0.clone(),
            action: "shut down",
            reason,
        };
        if inner.idle_behavior == IdleBehavior::Hold {
            return Err(refuse("its idle behavior is hold".into()));
        }
        if !matches!(inner.state, State::Booting | State::Idle) {
            return Err(refuse(format!("it is {}", inner.state)));
        }
        self.report_boot_outcome(&mut inner, BootOutcome::Aborted);
        self.shutdown_locked(&mut inner);
        Ok(())
    }

    /// Destroys the instance whatever its state or behaviour (an operator's kill).
    pub fn kill_instance(&self, reason: &str) {
        let mut inner = self.inner.lock();
        if inner.state == State::Shutdown {
            return;
        }
        warn!(worker = %self.id, reason, "killing instance");
        self.report_boot_outcome(&mut inner, BootOutcome::Aborted);
        self.shutdown_locked(&mut inner);
    }

    /// Makes the list of running runners match a probe's `listed` ids: listed runners we
    /// started move from starting to running, unknown ones are adopted, running ones not
    /// listed are closed. Starting ones not listed stay: they may not have started yet.
    fn update_running(&self, inner: &mut Inner, listed: &[String], now: Moment) -> bool {
        let mut changed = false;
        for id in listed {
            if inner.running.contains_key(id) {
                continue;
            }
            if let Some(runner) = inner.starting.remove(id) {
                inner.running.insert(id.clone(), runner);
            } else {
                info!(worker = %self.id, runner = %id, "runner detected");
                inner.generation += 1;
                let generation = inner.generation;
                inner
                    .running
                    .insert(id.clone(), Runner { generation, kill: None, given_up: false });
            }
            changed = true;
        }
        let gone: Vec<String> =
            inner.running.keys().filter(|id| !listed.contains(id)).cloned().collect();
        for id in gone {
            self.close_runner_locked(inner, &id, now);
            changed = true;
        }
        changed
    }

    /// Forgets a runner that ended: records its exit and turns a running worker with nothing
    /// left idle.
    pub fn close_runner(&self, id: &str) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        self.close_runner_locked(&mut inner, id, now);
    }

    fn close_runner_locked(&self, inner: &mut Inner, id: &str, now: Moment) {
        if inner.running.remove(id).is_none() {
            return;
        }
        info!(worker = %self.id, runner = %id, "runner ended");
        inner.updated = now;
        inner.effects.push(Effect::RunnerExited(id.to_owned(), now));
        if inner.state == State::Running && inner.running.is_empty() && inner.starting.is_empty() {
            inner.state = State::Idle;
        }
    }

    /// Starts runner `id` with `stdin` (its configuration). The worker is `running` from the
    /// moment this is called; whatever the start command returns, the runner is then counted
    /// as running, since it might have started: the next probe is the judge.
    pub async fn start_runner(&self, id: &str, stdin: &[u8]) -> Result<(), ProberError> {
        let quoted = quote("runner id", id)?;
        let (generation, remote_user) = {
            let mut inner = self.inner.lock();
            if inner.idle_behavior != IdleBehavior::Run
                || !matches!(inner.state, State::Idle | State::Running)
            {
                return Err(ProberError::NotAllowed {
                    worker: self.id.0.clone(),
                    action: "start a runner",
                    reason: format!(
                        "it is {} with idle behavior {}",
                        inner.state, inner.idle_behavior
                    ),
                });
            }
            if inner.running.contains_key(id) || inner.starting.contains_key(id) {
                return Err(ProberError::NotAllowed {
                    worker: self.id.0.clone(),
                    action: "start a runner",
                    reason: format!("runner {id} is already there"),
                });
            }
            inner.generation += 1;
            let generation = inner.generation;
            inner
                .starting
                .insert(id.to_owned(), Runner { generation, kill: None, given_up: false });
            if inner.state != State::Running {
                inner.state = State::Running;
                inner.effects.push(Effect::Notify);
            }
            (generation, inner.instance.remote_user.clone())
        };
        let command = format!(
            "{}{} {} {quoted}",
            sudo(&remote_user),
            self.config.runner_program()?,
            self.config.runner.start_args
        );
        let result = self
            .executor
            .execute(&command, stdin, self.config.command_deadline)
            .await
            .and_then(|out| out.checked(&self.id.0, &command));
        if let Err(e) = &result {
            warn!(worker = %self.id, runner = %id, error = %e, "start failed; the runner might have started anyway");
        }
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        // A probe or a close may have moved or dropped it meanwhile: then leave it.
        if inner.starting.get(id).map(|r| r.generation) == Some(generation)
            && let Some(runner) = inner.starting.remove(id)
        {
            inner.updated = now;
            inner.busy = now;
            inner.running.insert(id.to_owned(), runner);
            inner.last_runner = Some(id.to_owned());
        }
        result.map(|_| ())
    }

    /// Asks the runner how work `id` ended, with [`RunnerConfig::outcome_args`](crate::RunnerConfig):
    /// the first line it prints, or `None` if the runner has no such command.
    pub async fn runner_outcome(&self, id: &str) -> Result<Option<String>, ProberError> {
        let Some(args) = &self.config.runner.outcome_args else {
            return Ok(None);
        };
        let quoted = quote("runner id", id)?;
        let remote_user = self.inner.lock().instance.remote_user.clone();
        let command =
            format!("{}{} {args} {quoted}", sudo(&remote_user), self.config.runner_program()?);
        let out = self
            .executor
            .execute(&command, &[], self.config.command_deadline)
            .await?
            .checked(&self.id.0, &command)?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(Some(text.lines().next().unwrap_or_default().trim().chars().take(1000).collect()))
    }

    /// Begins killing runner `id`: TERM now, again every [`Timeouts::signal`](crate::Timeouts),
    /// giving up after [`Timeouts::term`](crate::Timeouts). Returns false if the worker does
    /// not know the runner. Calling it again for a runner being killed changes nothing.
    pub fn kill_runner(&self, id: &str, reason: &str) -> bool {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let term = self.config.timeouts.term;
        let inner = &mut *inner;
        let runner = match inner.running.get_mut(id) {
            Some(runner) => runner,
            None => match inner.starting.get_mut(id) {
                Some(runner) => runner,
                None => return false,
            },
        };
        begin_kill(runner, reason, now, term);
        true
    }

    /// Sends the TERM signals that are due and gives up on runners past their deadline (which
    /// drains the worker unless it is on hold). Returns how many signals it sent.
    pub async fn kill_due(&self) -> usize {
        let now = self.clock.now();
        let (due, remote_user) = {
            let mut guard = self.inner.lock();
            let inner = &mut *guard;
            let mut due = Vec::new();
            let mut gave_up = Vec::new();
            let signal = self.config.timeouts.signal;
            for (id, runner) in inner.running.iter_mut().chain(inner.starting.iter_mut()) {
                let Some(kill) = runner.kill.as_mut() else { continue };
                if runner.given_up {
                    continue;
                }
                if now >= kill.give_up_at {
                    runner.given_up = true;
                    gave_up.push((id.clone(), kill.reason.clone()));
                } else if now >= kill.next_signal {
                    kill.next_signal = now + signal;
                    due.push(id.clone());
                }
            }
            for (id, reason) in gave_up {
                self.on_unkillable(inner, &id, &reason);
            }
            (due, inner.instance.remote_user.clone())
        };
        let mut sent = 0;
        for id in due {
            let Ok(quoted) = quote("runner id", &id) else { continue };
            let Ok(program) = self.config.runner_program() else { continue };
            let command = format!(
                "{}{program} {} {quoted}",
                sudo(&remote_user),
                self.config.runner.kill_args
            );
            sent += 1;
            match self.executor.execute(&command, &[], self.config.command_deadline).await {
                Ok(out) if out.success() => {
                    info!(worker = %self.id, runner = %id, "runner killed");
                    let now = self.clock.now();
                    let mut inner = self.inner.lock();
                    inner.starting.remove(&id);
                    self.close_runner_locked(&mut inner, &id, now);
                    inner.effects.push(Effect::Notify);
                }
                Ok(out) => {
                    let e = out.checked(&self.id.0, &command).err();
                    info!(worker = %self.id, runner = %id, error = ?e.map(|e| e.to_string()), "kill attempt failed; will repeat");
                }
                Err(e) => {
                    info!(worker = %self.id, runner = %id, error = %e, "kill attempt failed; will repeat")
                }
            }
        }
        sent
    }

    fn on_unkillable(&self, inner: &mut Inner, id: &str, reason: &str) {
        if inner.idle_behavior == IdleBehavior::Hold {
            warn!(worker = %self.id, runner = %id, reason, "unkillable runner, but worker has idle behavior hold");
            return;
        }
        warn!(worker = %self.id, runner = %id, reason, "unkillable runner, draining worker");
        self.set_idle_behavior_locked(inner, IdleBehavior::Drain);
    }

    /// Abandons every runner (the instance is gone) and closes the executor.
    pub async fn close(&self) {
        {
            let mut inner = self.inner.lock();
            for id in inner.running.keys().chain(inner.starting.keys()) {
                info!(worker = %self.id, runner = %id, "runner abandoned");
            }
            inner.running.clear();
            inner.starting.clear();
        }
        self.executor.close().await;
    }

    /// Reports an outcome on the worker's behalf (the pool's `disappeared`), at most once.
    pub fn report_outcome(&self, outcome: BootOutcome) {
        let mut inner = self.inner.lock();
        self.report_boot_outcome(&mut inner, outcome);
    }
}

fn begin_kill(runner: &mut Runner, reason: &str, now: Moment, term: Duration) {
    if runner.kill.is_none() {
        runner.kill =
            Some(Kill { reason: reason.to_owned(), next_signal: now, give_up_at: now + term });
    }
}

fn sudo(remote_user: &str) -> &'static str {
    if remote_user == "root" { "" } else { "sudo " }
}

struct RunProbe {
    result: Result<runner_list::RunnerList, ProberError>,
    took: Duration,
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Lets the tables set a worker's history directly.
    use super::*;

    /// Back-dates and fills a worker as a table case describes it.
    #[derive(Debug, Default, Clone)]
    pub(crate) struct Setup {
        pub(crate) probed_ago: Duration,
        pub(crate) busy_ago: Duration,
        pub(crate) appeared_ago: Duration,
        pub(crate) running: Vec<&'static str>,
        pub(crate) starting: Vec<&'static str>,
    }

    impl Worker {
        pub(crate) fn set_up(&self, setup: &Setup) {
            let now = self.clock.now();
            let mut inner = self.inner.lock();
            inner.probed = now - setup.probed_ago;
            inner.busy = now - setup.busy_ago;
            inner.appeared = now - setup.appeared_ago;
            inner.updated = now - setup.probed_ago.max(setup.busy_ago);
            for id in &setup.running {
                inner.generation += 1;
                let generation = inner.generation;
                inner
                    .running
                    .insert((*id).to_owned(), Runner { generation, kill: None, given_up: false });
            }
            for id in &setup.starting {
                inner.generation += 1;
                let generation = inner.generation;
                inner
                    .starting
                    .insert((*id).to_owned(), Runner { generation, kill: None, given_up: false });
            }
        }

        /// Marks the worker changed now, as a sync or a start would.
        pub(crate) fn touch(&self) {
            let now = self.clock.now();
            self.inner.lock().updated = now + Duration::from_millis(1);
        }

        pub(crate) fn force_state(&self, state: State) {
            self.inner.lock().state = state;
        }

        pub(crate) fn given_up(&self, id: &str) -> bool {
            let inner = self.inner.lock();
            inner.running.get(id).or(inner.starting.get(id)).is_some_and(|r| r.given_up)
        }
    }
}
