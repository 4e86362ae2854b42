//! The worker: one cloud instance, its [`Executor`], and its state machine.
//!
//! A worker is `unknown` (found by a list, not created by us, not yet probed), `booting`
//! (created by us), `idle`, `running` or `shutdown` (destroy issued). Beside the state it has
//! an [`IdleBehavior`]: `run` (take work; shut down when idle too long), `hold` (never shut
//! down, take no work) or `drain` (take no work; shut down as soon as idle, while booting, or
//! while running once every runner has given up being killed).
//!
//! The decisions are pure and live in [`record`]: a [`Record`] and its transitions, tested as
//! tables. [`Worker`] is the thin shell around one record: it runs the commands a state calls
//! for, feeds what they found to the record under a short `parking_lot` lock (never held
//! across I/O), and queues the [`Effect`]s that follow (destroy, save tags, count an outcome)
//! for its owner, the pool, to take with [`Worker::take_effects`].
//!
//! [`Worker::probe_and_update`] runs, as Arvados' `probeAndUpdate` does: for `unknown` the boot
//! probe and the run probe; for `booting` the boot probe, then the run probe if it passed; for
//! `idle` and `running` the run probe; for `shutdown` nothing. A passing boot probe is
//! followed by the runner deployment; an unknown worker gets the deployment even when its
//! boot probe fails, so its run probe can see work left by an earlier prober, and a failed
//! copy counts as a failed boot. A boot probe that fails while a concurrent probe already saw
//! the worker booted counts as passed. Then [`Record::after_probe`] decides.
//!
//! The fixes over the reference: every command has a deadline (a hung probe ends and counts as
//! failed, and its remote command is stopped); an `unknown` worker whose run probe shows work
//! is never shut down for its boot probe failing or for its age; a pool-wide brake ([`Brake`])
//! stops shutdowns for brokenness when too many workers fail at once.

pub mod record;

use crate::ProberError;
use crate::clock::{Clock, Moment};
use crate::config::Prepared;
use crate::executor::Executor;
use crate::instance::{Instance, InstanceId, Tags};
use crate::invocation::RunnerInvocation;
use crate::quote::quote;
use crate::resources::Resources;
use crate::runner_list;
use crate::runner_outcome::RunnerOutcome;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{debug, info, warn};

pub use record::{Kill, ProbeReport, Record, Rules, RunReport, Runner};

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

    /// Whether the worker is booted: idle or running.
    pub fn is_booted(self) -> bool {
        matches!(self, State::Idle | State::Running)
    }

    /// The lowercase name: the one spelling of it, which `Display` prints and `FromStr` reads.
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
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for State {
    type Err = ProberError;

    fn from_str(name: &str) -> Result<State, ProberError> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
            .ok_or_else(|| ProberError::UnknownName { what: "worker state", name: name.to_owned() })
    }
}

impl PartialEq<&str> for State {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
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
    /// Every idle behaviour.
    pub const ALL: [IdleBehavior; 3] = [IdleBehavior::Run, IdleBehavior::Hold, IdleBehavior::Drain];

    /// The lowercase name, as saved in the instance's tag: the one spelling of it, which
    /// `Display` prints and `FromStr` reads.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleBehavior::Run => "run",
            IdleBehavior::Hold => "hold",
            IdleBehavior::Drain => "drain",
        }
    }
}

impl fmt::Display for IdleBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for IdleBehavior {
    type Err = ProberError;

    fn from_str(name: &str) -> Result<IdleBehavior, ProberError> {
        IdleBehavior::ALL.into_iter().find(|behavior| behavior.as_str() == name).ok_or_else(|| {
            ProberError::UnknownName { what: "idle behaviour", name: name.to_owned() }
        })
    }
}

impl PartialEq<&str> for IdleBehavior {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
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
    /// Runners that left its list whose outcome its user has not said is in: they hold its
    /// idle shutdown (see [`Timeouts::outcome_hold`](crate::Timeouts)).
    pub awaiting_outcome: Vec<String>,
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
    /// What it has for work, once its runner has said (see [`Resources`]).
    pub resources: Option<Resources>,
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

/// How long after a failed question a worker's runner is asked again what it has.
pub const RESOURCES_RETRY: Duration = Duration::from_secs(60);

/// One worker: an instance, its executor and its state machine.
pub struct Worker {
    id: InstanceId,
    executor: Arc<dyn Executor>,
    config: Arc<Prepared>,
    clock: Arc<dyn Clock>,
    brake: Arc<Brake>,
    probing: AtomicBool,
    inner: Mutex<Slot>,
}

/// The record, and the effects its transitions queued for the owner.
#[derive(Debug)]
struct Slot {
    record: Record,
    effects: Vec<Effect>,
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
        let record = Record::new(spec, clock.now());
        Worker::with_record(record, executor, config, clock, brake)
    }

    /// A worker that goes on from `record` (its history, runners and timers as they are).
    pub fn with_record(
        record: Record,
        executor: Arc<dyn Executor>,
        config: Arc<Prepared>,
        clock: Arc<dyn Clock>,
        brake: Arc<Brake>,
    ) -> Worker {
        Worker {
            id: record.instance.id.clone(),
            executor,
            config,
            clock,
            brake,
            probing: AtomicBool::new(false),
            inner: Mutex::new(Slot { record, effects: Vec::new() }),
        }
    }

    /// Runs a transition of the record under the lock, with the time and the rules, and
    /// queues its effects.
    fn decide<T>(
        &self,
        transition: impl FnOnce(&mut Record, Moment, &Rules<'_>, &mut Vec<Effect>) -> T,
    ) -> T {
        let now = self.clock.now();
        let rules = Rules {
            timeouts: &self.config.timeouts,
            tag_prefix: &self.config.tag_prefix,
            brake_engaged: self.brake.engaged(),
        };
        let mut slot = self.inner.lock();
        let Slot { record, effects } = &mut *slot;
        transition(record, now, &rules, effects)
    }

    /// The instance id.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }

    /// A copy of the record.
    pub fn record(&self) -> Record {
        self.inner.lock().record.clone()
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.inner.lock().record.state
    }

    /// The current idle behaviour.
    pub fn idle_behavior(&self) -> IdleBehavior {
        self.inner.lock().record.idle_behavior
    }

    /// Whether a probe is in flight.
    pub fn is_probing(&self) -> bool {
        self.probing.load(Ordering::Acquire)
    }

    /// Whether the last probe failed.
    pub fn last_probe_failed(&self) -> bool {
        self.inner.lock().record.last_probe_failed
    }

    /// For the fleet brake: `None` if it is not booted, else whether it is failing (its last
    /// probe failed, or it passed none for longer than `silent`).
    pub fn failing(&self, silent: Duration) -> Option<bool> {
        let now = self.clock.now();
        self.inner.lock().record.failing(now, silent)
    }

    /// Time since the last successful probe (or since appearing).
    pub fn probe_age(&self) -> Duration {
        let now = self.clock.now();
        now.since(self.inner.lock().record.probed)
    }

    /// The effects queued since the last call, oldest first.
    pub fn take_effects(&self) -> Vec<Effect> {
        std::mem::take(&mut self.inner.lock().effects)
    }

    /// A snapshot.
    pub fn view(&self) -> WorkerView {
        let now = self.clock.now();
        self.inner.lock().record.view(now)
    }

    /// When the worker last changed in a way a probe result must not overwrite.
    pub fn updated_at(&self) -> Moment {
        self.inner.lock().record.updated
    }

    /// The executor (for retargeting after a sync).
    pub fn executor(&self) -> &Arc<dyn Executor> {
        &self.executor
    }

    /// The instance as last listed.
    pub fn instance(&self) -> Instance {
        self.inner.lock().record.instance.clone()
    }

    /// When a destroy was last issued.
    pub fn destroyed_at(&self) -> Option<Moment> {
        self.inner.lock().record.destroyed
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
        let (mut report, remote_user) = {
            let slot = self.inner.lock();
            let report = ProbeReport::start(&slot.record, self.clock.now());
            (report, slot.record.instance.remote_user.clone())
        };
        if report.initial == State::Shutdown {
            return ProbeOutcome::NotProbed;
        }
        if !report.booted {
            self.boot(&mut report, &remote_user).await;
        }
        if report.booted || report.initial == State::Unknown {
            report.run = Some(self.probe_running().await);
        }
        let passed = report.run.as_ref().is_some_and(|run| run.result.is_ok());
        if passed && self.resources_due() {
            self.probe_resources().await;
        }
        self.decide(|record, now, rules, fx| record.after_probe(report, now, rules, fx))
    }

    /// The boot phase of a probe: the boot probe, then the runner deployment where it is due.
    async fn boot(&self, report: &mut ProbeReport, remote_user: &str) {
        match self.probe_booted().await {
            Ok(()) => {
                report.booted = true;
                report.contacted = true;
            }
            Err(e) => {
                report.contacted = e.reached_worker();
                report.boot_error = Some(e.to_string());
            }
        }
        let mut copy = report.booted || report.initial == State::Unknown;
        // A concurrent probe (or a sync) may have seen it boot meanwhile.
        if !report.booted && self.state().is_booted() {
            report.booted = true;
            copy = false;
        }
        if copy && let Err(e) = self.deploy_runner(remote_user).await {
            warn!(worker = %self.id, error = %e, "cannot copy the runner binary");
            report.booted = false;
            report.boot_error = Some(e.to_string());
        }
        if report.booted {
            info!(worker = %self.id, "instance booted; will run the run probe");
        }
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

    /// Whether to ask the runner what the worker has: not known yet, and not asked within
    /// [`RESOURCES_RETRY`] (a runner that cannot say costs one command a minute).
    fn resources_due(&self) -> bool {
        let now = self.clock.now();
        let mut slot = self.inner.lock();
        let record = &mut slot.record;
        let due = self.config.runner.resources_args.is_some()
            && record.resources.is_none()
            && record.resources_asked.is_none_or(|at| now.since(at) >= RESOURCES_RETRY);
        if due {
            record.resources_asked = Some(now);
        }
        due
    }

    /// Asks the runner what the worker has for work, and keeps the answer; a failure is
    /// logged and asked again after [`RESOURCES_RETRY`].
    async fn probe_resources(&self) {
        let Some(args) = &self.config.runner.resources_args else { return };
        let result: Result<Resources, ProberError> = async {
            let command = self.runner_command(args, None)?;
            let out = self
                .executor
                .execute(&command, &[], self.config.command_deadline)
                .await?
                .checked(&self.id.0, &command)?;
            Resources::parse(&String::from_utf8_lossy(&out.stdout))
                .map_err(|detail| ProberError::Exec { worker: self.id.0.clone(), detail })
        }
        .await;
        match result {
            Ok(resources) => {
                info!(worker = %self.id, %resources, "worker resources");
                self.inner.lock().record.resources = Some(resources);
            }
            Err(e) => warn!(worker = %self.id, error = %e, "cannot learn the worker's resources"),
        }
    }

    async fn probe_running(&self) -> RunReport {
        let started = self.clock.now();
        let result: Result<_, ProberError> = async {
            let command = self.runner_command(&self.config.runner.list_args, None)?;
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
        RunReport {
            result: result.map_err(|e| e.to_string()),
            took: self.clock.now().since(started),
        }
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
        // Hashing the binary is deploy work: it reads the whole binary (80 MB and more), which
        // a loaded machine may take longer over than a probe's command deadline allows.
        let deadline = self.config.deploy_deadline;
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

    /// Records another destroy attempt (a retry by the pool).
    pub fn destroy_again(&self) {
        self.decide(|record, now, _, fx| record.destroy_again(now, fx));
    }

    /// Shuts the worker down on request: refused for `hold` and for states other than
    /// booting and idle.
    pub fn shutdown(&self) -> Result<(), ProberError> {
        self.decide(|record, now, _, fx| record.request_shutdown(now, fx)).map_err(|reason| {
            ProberError::NotAllowed { worker: self.id.0.clone(), action: "shut down", reason }
        })
    }

    /// Destroys the instance whatever its state or behaviour (an operator's kill).
    pub fn kill_instance(&self, reason: &str) {
        self.decide(|record, now, _, fx| record.kill_instance(reason, now, fx));
    }

    /// Shuts the worker down if it is idle too long or draining with nothing left; returns
    /// whether it did.
    pub fn shutdown_if_idle(&self) -> bool {
        self.decide(|record, now, rules, fx| record.shutdown_if_idle(now, rules, fx))
    }

    /// Sets the idle behaviour, saves it in the instance's tags, and shuts the worker down if
    /// that makes it eligible.
    pub fn set_idle_behavior(&self, idle_behavior: IdleBehavior) {
        self.decide(|record, now, rules, fx| {
            record.set_idle_behavior(idle_behavior, now, rules, fx)
        });
    }

    /// Takes a fresh listing of the instance (from a sync): keeps its address and host key
    /// current, marks the worker updated if the listing changed, and saves tags that drifted.
    pub fn sync_instance(&self, instance: Instance) {
        self.decide(|record, now, rules, fx| record.sync_instance(instance, now, rules, fx));
    }

    /// Forgets a runner that ended: records its exit and turns a running worker with nothing
    /// left idle.
    pub fn close_runner(&self, id: &str) {
        self.decide(|record, now, _, fx| record.close_runner(id, now, fx));
    }

    /// The pool's user has the outcome of runner `id` (or wants none): it no longer holds an
    /// idle shutdown, which happens now if that was all that held it. Returns whether the
    /// outcome was awaited.
    pub fn outcome_collected(&self, id: &str) -> bool {
        self.decide(|record, now, rules, fx| record.outcome_collected(id, now, rules, fx))
    }

    /// Reports an outcome on the worker's behalf (the pool's `disappeared`), at most once.
    pub fn report_outcome(&self, outcome: BootOutcome) {
        self.decide(|record, _, _, fx| record.report_boot_outcome(outcome, fx));
    }

    /// Starts runner `id` with `stdin` (its configuration). The worker is `running` from the
    /// moment this is called; whatever the start command returns, the runner is then counted
    /// as running, since it might have started: the next probe is the judge.
    pub async fn start_runner(&self, id: &str, stdin: &[u8]) -> Result<(), ProberError> {
        let quoted = quote("runner id", id)?;
        let generation =
            self.decide(|record, _, _, fx| record.begin_start(id, fx)).map_err(|reason| {
                ProberError::NotAllowed {
                    worker: self.id.0.clone(),
                    action: "start a runner",
                    reason,
                }
            })?;
        let command = self.runner_command(&self.config.runner.start_args, Some(&quoted));
        let result = match command {
            Ok(command) => self
                .executor
                .execute(&command, stdin, self.config.command_deadline)
                .await
                .and_then(|out| out.checked(&self.id.0, &command)),
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            warn!(worker = %self.id, runner = %id, error = %e, "start failed; the runner might have started anyway");
        }
        self.decide(|record, now, _, _| record.start_ended(id, generation, now));
        result.map(|_| ())
    }

    /// `[sudo ]<runner> [<instance's runner args> ]<args>[ <quoted id>]` for this worker.
    fn runner_command(&self, args: &str, quoted_id: Option<&str>) -> Result<String, ProberError> {
        let invocation = RunnerInvocation::of(&self.config, &self.inner.lock().record.instance)?;
        let mut command = invocation.command(args);
        if let Some(id) = quoted_id {
            command.push(' ');
            command.push_str(id);
        }
        Ok(command)
    }

    /// Asks the runner how work `id` ended, with
    /// [`RunnerConfig::outcome_args`](crate::RunnerConfig): the first line it prints, parsed
    /// ([`RunnerOutcome`]), or `None` if the runner has no such command.
    pub async fn runner_outcome(&self, id: &str) -> Result<Option<RunnerOutcome>, ProberError> {
        let Some(args) = &self.config.runner.outcome_args else {
            return Ok(None);
        };
        let command = self.runner_command(args, Some(&quote("runner id", id)?))?;
        let out = self
            .executor
            .execute(&command, &[], self.config.command_deadline)
            .await?
            .checked(&self.id.0, &command)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line: String =
            text.lines().next().unwrap_or_default().trim().chars().take(1000).collect();
        Ok(Some(RunnerOutcome::parse(&line)))
    }

    /// Begins killing runner `id`: TERM now, again every [`Timeouts::signal`](crate::Timeouts),
    /// giving up after [`Timeouts::term`](crate::Timeouts). Returns false if the worker does
    /// not know the runner. Calling it again for a runner being killed changes nothing.
    pub fn kill_runner(&self, id: &str, reason: &str) -> bool {
        let term = self.config.timeouts.term;
        self.decide(|record, now, _, _| record.begin_kill(id, reason, now, term))
    }

    /// Sends the TERM signals that are due and gives up on runners past their deadline (which
    /// drains the worker unless it is on hold). Returns how many signals it sent.
    pub async fn kill_due(&self) -> usize {
        let due = self.decide(|record, now, rules, fx| record.kills_due(now, rules, fx));
        let mut sent = 0;
        for id in due {
            let command = quote("runner id", &id).and_then(|quoted| {
                self.runner_command(&self.config.runner.kill_args, Some(&quoted))
            });
            let Ok(command) = command else { continue };
            sent += 1;
            match self.executor.execute(&command, &[], self.config.command_deadline).await {
                Ok(out) if out.success() => {
                    self.decide(|record, now, rules, fx| record.killed(&id, now, rules, fx));
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

    /// Abandons every runner (the instance is gone) and closes the executor.
    pub async fn close(&self) {
        self.inner.lock().record.abandon_runners();
        self.executor.close().await;
    }
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

    impl Setup {
        /// Applies the setup to `record` at `now`.
        pub(crate) fn apply(&self, record: &mut Record, now: Moment) {
            record.probed = now - self.probed_ago;
            record.busy = now - self.busy_ago;
            record.appeared = now - self.appeared_ago;
            record.updated = now - self.probed_ago.max(self.busy_ago);
            for id in &self.running {
                record.add_running(id);
            }
            for id in &self.starting {
                record.add_running(id);
                if let Some(runner) = record.running.remove(*id) {
                    record.starting.insert((*id).to_owned(), runner);
                }
            }
        }
    }

    impl Worker {
        pub(crate) fn set_up(&self, setup: &Setup) {
            let now = self.clock.now();
            setup.apply(&mut self.inner.lock().record, now);
        }

        /// Marks the worker changed now, as a sync or a start would.
        pub(crate) fn touch(&self) {
            let now = self.clock.now();
            self.inner.lock().record.updated = now + Duration::from_millis(1);
        }

        pub(crate) fn force_state(&self, state: State) {
            self.inner.lock().record.state = state;
        }

        pub(crate) fn given_up(&self, id: &str) -> bool {
            let slot = self.inner.lock();
            let record = &slot.record;
            record.running.get(id).or(record.starting.get(id)).is_some_and(|r| r.given_up)
        }
    }
}
