//! The task runner: one task of an allocation from start to death.
//!
//! ```text
//! restore? ──> [wait for start gate] ──> prestart hooks ──> driver start ──> poststart hooks
//!                   ^                                                            │
//!                   │  restart (delay, interruptible)        wait: exit | kill | restart | shutdown
//!                   └──────────────── restart tracker <──────────────────────────┘
//!                                          │ done / fail / killed
//!                                          v
//!                               dead ──> [wait: alloc-wide restart | kill | shutdown] ──> stop hooks
//! ```
//!
//! Every step records an event and persists the task state through the store, so a restarted
//! agent sees exactly what happened. The runner talks to the task only through its
//! [`Driver`], and every wait on the driver is bounded: a driver that never finishes stopping a
//! task is escalated to a forced destroy, and the task is reported dead with an error event.
//!
//! Kill stops the task for good; shutdown (the agent exiting) leaves it running with its handle
//! persisted, for the next agent to reattach.
//!
//! # What the runner knows, and its locks
//!
//! What is fixed when the runner is built (the task, its driver, store, hooks, directories,
//! limits) is plain data. Everything that changes as it lives is one [`RunnerFacts`] value (see
//! [`crate::facts`]), each fact in one field: its lifecycle, the allocation, the task's state,
//! its local state (whose driver handle is the one record of which task runs), what a restore
//! left, the start gate, the restart and rerun requests, the restart count. A decision that
//! needs several facts reads them in one look. Every change wakes every waiter (the run loop
//! waiting for its gate, a wind-down, a restart or a rerun; a caller waiting for a reattach or
//! the run's end), and each looks again for what it needs.
//!
//! Locks, outermost first; none is taken while a later one is held:
//!
//! 1. `persist`, a tokio mutex held across the store's write: one persist at a time, so the
//!    store never goes back to an older state.
//! 2. `facts`, a parking_lot mutex inside [`Watched`], never held across an `.await` (its
//!    closures do not call back into the runner).
//! 3. The event stream's sender, taken under `facts` so the stream's order is the state's.

use crate::clock::WallClock;
use crate::config::{LogLimits, TaskRunnerConfig};
use crate::env::{self, EnvIdentity, EnvPaths};
use crate::error::TaskError;
use crate::events::{EventStream, RecordedEvent};
use crate::facts::{Change, RestartRequest, Restored, RunnerFacts, WindDown};
use crate::hooks::{HOOK_TIMEOUT, HookContext, TaskDirHook, TaskDirs, TaskHook};
use crate::lifecycle::{TaskRunnerAction, TaskRunnerEvent, TaskRunnerState};
use crate::local_state::{HookState, LocalState};
use crate::notify;
use crate::restart::{Decision, Outcome, RestartTracker};
use crate::template::{TaskLifecycle, TemplateHook};
use crate::watched::Watched;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use wharf_driver::{
    Driver, DriverError, ExecResult, ExitResult, FsIsolation, LogConfig, LogFrom, LogReader,
    LogStream, LogTarget, ResourceUsage, TaskConfig, TaskId,
};
use wharf_state::spec::Stage;
use wharf_state::{Allocation, Signal, Task, TaskEvent, TaskEventKind, TaskState, TaskStatus};
use wharf_store::{StateStore, StoredTask, WriteBatch};

/// Extra time a driver gets beyond the kill timeout to finish stopping a task.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The longest a forced destroy may take before the task is given up on.
pub const DESTROY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest to wait for a stopped task's exit result.
pub const EXIT_RESULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a driver may take to start a task; past it the start counts as a retryable
/// failure.
pub const START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a restart, signal or exec of a task reported running waits for the runner to
/// reattach to it after a restore, before answering that it is not running.
pub const REATTACH_WAIT: Duration = Duration::from_secs(5);

/// Runs one task. Cheap to clone; clones control the same runner.
#[derive(Debug, Clone)]
pub struct TaskRunner {
    shared: Arc<Shared>,
}

/// What the runner is built with, and its [`RunnerFacts`] (see the module docs for its locks).
#[derive(Debug)]
struct Shared {
    task: Task,
    stage: Stage,
    driver: Arc<dyn Driver>,
    store: Arc<dyn StateStore>,
    clock: Arc<dyn WallClock>,
    hooks: Vec<Arc<dyn TaskHook>>,
    dirs: TaskDirs,
    logs: LogLimits,
    kill_timeout: Duration,
    /// The node's host volumes, for the task's mounts.
    host_volumes: Arc<BTreeMap<String, wharf_state::volume::HostVolume>>,
    /// When the runner was built: the restart tracker's clock.
    origin: tokio::time::Instant,
    /// The alloc runner's notification of a change of the task's state.
    state_changed: Arc<Notify>,
    events: EventStream,
    /// Serialises persists, so the store never goes back to an older state.
    persist: tokio::sync::Mutex<()>,
    /// Everything that changes as the runner lives, under one lock.
    facts: Watched<RunnerFacts>,
    /// What listens on the task's notify socket (`notify_socket`), while it does.
    notify_listener: parking_lot::Mutex<Option<Listening>>,
}

/// A listener on the notify socket, ended when dropped.
#[derive(Debug)]
struct Listening(tokio::task::AbortHandle);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The runner as its template hook reaches it: weakly, since the runner holds the hook.
#[derive(Debug)]
struct WeakRunner(std::sync::Weak<Shared>);

impl WeakRunner {
    fn get(&self) -> Option<TaskRunner> {
        self.0.upgrade().map(|shared| TaskRunner { shared })
    }
}

#[async_trait::async_trait]
impl TaskLifecycle for WeakRunner {
    async fn restart(&self, reason: &str) -> Result<(), TaskError> {
        let runner = self.get().ok_or(TaskError::NotRunning { task: String::new() })?;
        runner.restart(reason, false).await
    }

    async fn signal(&self, signal: Signal, reason: &str) -> Result<(), TaskError> {
        let runner = self.get().ok_or(TaskError::NotRunning { task: String::new() })?;
        runner.signal(signal, reason).await
    }

    async fn exec(&self, command: &[String], timeout: Duration) -> Result<ExecResult, TaskError> {
        let runner = self.get().ok_or(TaskError::NotRunning { task: String::new() })?;
        runner.exec(command, timeout).await
    }

    async fn emit(&self, event: TaskEventKind) {
        if let Some(runner) = self.get() {
            runner.emit_event(runner.event(event)).await;
        }
    }

    async fn kill(&self, event: TaskEventKind) {
        if let Some(runner) = self.get() {
            runner.kill(Some(runner.event(event).failing())).await;
        }
    }

    async fn wind_down(&self) {
        // A runner that is gone has wound down.
        if let Some(runner) = self.get() {
            runner.wind_down_requested().await;
        }
    }
}

/// A hook call that cannot fail, as one that can.
fn infallible<'a>(
    call: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), TaskError>> + Send + 'a>> {
    Box::pin(async move {
        call.await;
        Ok(())
    })
}

/// The hook phases run after prestart. Poststart and stop failures are recorded as events;
/// the others cannot fail. None of them stops the task, and each call is bounded.
#[derive(Debug, Clone, Copy)]
enum HookPhase<'a> {
    Poststart,
    Prekill,
    Exited(&'a ExitResult),
    Update,
    Stop,
    Shutdown,
}

/// How waiting on a running task ended.
enum Waited {
    Exited(ExitResult),
    Killed,
    Restart(RestartRequest),
    Shutdown,
}

/// How one run of the task ended.
enum RunEnded {
    /// It ran (or failed to start); the outcome goes to the restart tracker.
    Outcome(Outcome),
    /// It was killed before it started.
    KilledBeforeStart,
    /// The agent is shutting down; the task is left as it is.
    Shutdown,
}

/// How the restart loop, or the whole run, ended.
enum LoopEnd {
    /// The task is dead.
    Dead,
    /// The agent is shutting down; the task is left as it is.
    Shutdown,
}

/// What a dead task's runner was asked for while it waited to be released.
enum AfterDeath {
    WindDown(WindDown),
    Rerun,
}

impl TaskRunner {
    /// Builds a runner; nothing runs until [`TaskRunner::run`].
    pub fn new(config: TaskRunnerConfig) -> TaskRunner {
        let stage = config.task.stage();
        let group = config.alloc.group().ok().cloned();
        let policy = match &group {
            Some(group) => config.alloc.job.restart_policy(group, &config.task),
            None => wharf_state::RestartPolicy::defaults_for(config.alloc.job.job_type),
        };
        let seed = config
            .alloc
            .id
            .bytes()
            .chain(config.task.name.bytes())
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        let tracker = RestartTracker::new(policy, config.alloc.job.job_type, stage, seed);
        let dirs = TaskDirs::new(&config.alloc_root, &config.task.name);
        let mut hooks: Vec<Arc<dyn TaskHook>> = vec![Arc::new(TaskDirHook)];
        let templates = TemplateHook::for_task(&config.task, config.template_sources.clone());
        if let Some(templates) = &templates {
            hooks.push(templates.clone());
        }
        hooks.extend(config.hooks);
        let kill_timeout = config.task.kill_timeout.min(config.max_kill_timeout);
        // A fresh task is received with its first change (unless a restore replaces its
        // state), so that the event is in the stream, in order, for whoever listens by then.
        let facts = RunnerFacts::new(config.alloc, tracker);
        let runner = TaskRunner {
            shared: Arc::new(Shared {
                stage,
                driver: config.driver,
                store: config.store,
                clock: config.clock,
                hooks,
                dirs,
                logs: config.logs,
                kill_timeout,
                host_volumes: config.host_volumes,
                origin: tokio::time::Instant::now(),
                state_changed: config.state_changed,
                events: config.events,
                persist: tokio::sync::Mutex::new(()),
                facts: Watched::new(facts),
                notify_listener: parking_lot::Mutex::new(None),
                task: config.task,
            }),
        };
        if let Some(templates) = templates {
            templates.attach(Arc::new(WeakRunner(Arc::downgrade(&runner.shared))));
        }
        runner
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.shared.task.name
    }

    /// The task.
    pub fn task(&self) -> &Task {
        &self.shared.task
    }

    /// Where the task stands in the group's start order.
    pub fn stage(&self) -> Stage {
        self.shared.stage
    }

    /// Whether it is the group's leader.
    pub fn is_leader(&self) -> bool {
        self.shared.task.leader
    }

    /// Its directories.
    pub fn dirs(&self) -> &TaskDirs {
        &self.shared.dirs
    }

    /// A snapshot of its state.
    pub fn state(&self) -> TaskState {
        self.shared.facts.read(|facts| facts.task.clone())
    }

    /// The driver running it.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.shared.driver
    }

    /// Lets the task start (the lifecycle gate). Closing it again holds back later restarts.
    pub fn set_start_gate(&self, open: bool) {
        self.shared.facts.update(|facts| facts.gate_open = open);
    }

    /// Where the runner's own life stands (see [`crate::lifecycle`]).
    pub fn lifecycle(&self) -> TaskRunnerState {
        self.shared.facts.read(|facts| facts.lifecycle)
    }

    /// Waits until [`TaskRunner::lifecycle`] is one that `reached` accepts, and returns it.
    pub async fn wait_lifecycle(
        &self,
        reached: impl Fn(TaskRunnerState) -> bool,
    ) -> TaskRunnerState {
        self.shared
            .facts
            .wait_until(|facts| reached(facts.lifecycle).then_some(facts.lifecycle))
            .await
    }

    /// Whether the run loop has returned (or will never run).
    pub fn is_finished(&self) -> bool {
        self.lifecycle() == TaskRunnerState::Finished
    }

    /// A listener of every event the runner records from now on, in order (see
    /// [`crate::events`]); with a stream shared by an allocation's runners, theirs too.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<RecordedEvent> {
        self.shared.events.subscribe()
    }

    /// Waits until the run loop has returned (or will never run).
    pub async fn wait_finished(&self) {
        self.wait_lifecycle(|state| state == TaskRunnerState::Finished).await;
    }

    /// Applies `event` to the lifecycle; returns what to do about it.
    fn step(&self, event: TaskRunnerEvent) -> TaskRunnerAction {
        self.shared.facts.update(|facts| {
            let (next, action) = facts.lifecycle.on(event);
            facts.lifecycle = next;
            action
        })
    }

    /// Waits until the runner is asked to kill its task or to leave it; says which.
    async fn wind_down_requested(&self) -> WindDown {
        self.shared.facts.wait_until(|facts| facts.wind_down()).await
    }

    /// Loads the task's persisted state and reattaches to its task if one was running.
    /// Call before [`TaskRunner::run`]. `stored` is what the store holds for this task.
    pub async fn restore(&self, stored: Option<&StoredTask>) -> Result<(), TaskError> {
        let s = &self.shared;
        let Some(stored) = stored else { return Ok(()) };
        if let Some(state) = &stored.state {
            s.facts.update(|facts| {
                facts.task = state.clone();
                facts.received_unrecorded = false;
            });
        }
        let mut local = match &stored.local_state {
            Some(bytes) => LocalState::decode(bytes)
                .map_err(|reason| TaskError::BadLocalState { task: s.task.name.clone(), reason })?,
            None => LocalState::default(),
        };
        // The handle is the record of the running task: it goes back only once the driver has
        // recovered the task.
        let handle = local.handle.take();
        let running = s.facts.update(|facts| {
            facts.local = local;
            facts.task.status == TaskStatus::Running
        });
        let Some(handle) = handle else {
            if running {
                // Running with no handle: whatever ran is unknown to us now.
                self.lost("no driver handle was saved").await;
            }
            return Ok(());
        };
        match s.driver.recover_task(&handle).await {
            Ok(()) => {
                tracing::info!(alloc_id = %self.alloc_id(), task = %s.task.name, task_id = %handle.id(), "reattached to task");
                // Known at once, so a restart or signal right after the restore reaches it.
                s.facts.update(|facts| {
                    facts.local.handle = Some(handle);
                    facts.restored = Restored::Reattached;
                });
                // The task still holds the socket's path: it is bound again there.
                if let Err(error) = self.listen_for_ready() {
                    tracing::warn!(alloc_id = %self.alloc_id(), task = %s.task.name, %error, "could not bind the notify socket again; the task's READY=1 will not be heard");
                }
            }
            Err(error) => {
                tracing::warn!(alloc_id = %self.alloc_id(), task = %s.task.name, %error, "could not reattach to task");
                let _ =
                    tokio::time::timeout(DESTROY_TIMEOUT, s.driver.destroy_task(handle.id(), true))
                        .await;
                // The handle stays out of the local state, which is written without it.
                self.persist_local().await;
                self.lost(&error.to_string()).await;
            }
        }
        Ok(())
    }

    /// Binds the task's notify socket, if it has one and nothing listens on it yet, and
    /// listens there for `READY=1` for as long as the runner runs.
    fn listen_for_ready(&self) -> Result<(), TaskError> {
        let s = &self.shared;
        if !s.task.notify_socket {
            return Ok(());
        }
        let mut listening = s.notify_listener.lock();
        if listening.as_ref().is_some_and(|l| !l.0.is_finished()) {
            return Ok(());
        }
        let socket = notify::bind(&notify::socket_path(&s.dirs.task_dir))?;
        let runner = WeakRunner(Arc::downgrade(&self.shared));
        let listener = tokio::spawn(async move {
            loop {
                let heard = notify::next_ready(&socket).await;
                let Some(runner) = runner.get() else { return };
                match heard {
                    Ok(()) => runner.mark_ready().await,
                    Err(error) => {
                        tracing::warn!(alloc_id = %runner.alloc_id(), task = %runner.name(), %error, "the notify socket failed; READY=1 is no longer heard");
                        return;
                    }
                }
            }
        });
        *listening = Some(Listening(listener.abort_handle()));
        Ok(())
    }

    /// Records, once, that the task said `READY=1`.
    async fn mark_ready(&self) {
        if self.shared.facts.read(|facts| facts.task.ready_at.is_some()) {
            return;
        }
        tracing::info!(alloc_id = %self.alloc_id(), task = %self.name(), "the task said READY=1");
        let event = self.event(TaskEventKind::HookMessage {
            hook: "notify_socket".into(),
            message: "the task said READY=1".into(),
        });
        let now = self.now();
        self.commit(|state| {
            state.state.ready_at.get_or_insert(now);
            state.append_event(event);
        })
        .await;
    }

    /// Records that the task was lost while the agent was away; the run loop then restarts it
    /// by policy or fails it.
    async fn lost(&self, error: &str) {
        self.commit(|state| {
            state.append_event(
                self.event(TaskEventKind::FailedRestoring { error: error.to_owned() }),
            )
        })
        .await;
        let outcome = Outcome::Exited(ExitResult {
            exit_code: 0,
            signal: None,
            oom_killed: false,
            error: Some(format!("task lost while the agent was away: {error}")),
        });
        self.shared.facts.update(|facts| facts.restored = Restored::Lost(outcome));
    }

    /// Runs the task until it is dead and released, or until shutdown. Returns at once if
    /// the run was already claimed (by an earlier call, or by a kill before it).
    pub async fn run(&self) {
        if self.step(TaskRunnerEvent::Run) == TaskRunnerAction::RunLoop {
            self.run_claimed().await;
        }
    }

    /// The body of [`TaskRunner::run`], for whoever claimed the run.
    ///
    /// The run's future lives as long as the task runs, so it holds only what waiting takes:
    /// every step that does more (starts, hooks, stops, writes) is boxed, and its state lives
    /// on the heap only while it runs.
    async fn run_claimed(&self) {
        let s = &self.shared;
        if s.facts.read(|facts| facts.received_unrecorded) {
            // Received as the run begins; written with the next commit.
            self.note(|_| {});
        }
        let (complete, restored_dead) =
            s.facts.read(|facts| (facts.local.run_complete, facts.restored_dead()));
        let ending = if complete {
            LoopEnd::Dead
        } else {
            // A task restored dead has only the end of its run left.
            let looped = if restored_dead { LoopEnd::Dead } else { self.main_loop().await };
            match looped {
                LoopEnd::Dead => Box::pin(self.after_death()).await,
                LoopEnd::Shutdown => LoopEnd::Shutdown,
            }
        };
        // Nothing more is listened for; a dead task's socket goes with it.
        drop(s.notify_listener.lock().take());
        if let LoopEnd::Shutdown = ending {
            Box::pin(self.on_shutdown()).await;
        } else if s.task.notify_socket {
            let _ = std::fs::remove_file(notify::socket_path(&s.dirs.task_dir));
        }
        self.step(TaskRunnerEvent::RunEnded);
    }

    /// Starts, watches and restarts the task until it is dead, or until shutdown.
    async fn main_loop(&self) -> LoopEnd {
        let s = &self.shared;
        loop {
            let lost = s.facts.update(RunnerFacts::take_lost);
            let outcome = match lost {
                Some(outcome) => outcome,
                None => match self.run_once().await {
                    RunEnded::Outcome(outcome) => outcome,
                    RunEnded::KilledBeforeStart => break,
                    RunEnded::Shutdown => return LoopEnd::Shutdown,
                },
            };
            let decision =
                s.facts.update(|facts| facts.restarts.decide(&outcome, s.origin.elapsed()));
            match decision {
                Decision::Restart { delay, reason } => {
                    match Box::pin(self.restart_delay(delay, reason)).await {
                        None => {}
                        Some(WindDown::Kill) => break,
                        Some(WindDown::Shutdown) => return LoopEnd::Shutdown,
                    }
                }
                Decision::Fail { reason } => {
                    let event = self.event(TaskEventKind::NotRestarting { reason }).failing();
                    Box::pin(self.commit(|state| state.append_event(event))).await;
                    break;
                }
                Decision::Done | Decision::Killed => break,
            }
        }
        LoopEnd::Dead
    }

    /// Records a restart and waits out its delay, unless the runner is asked to wind down
    /// first.
    async fn restart_delay(&self, delay: Duration, reason: String) -> Option<WindDown> {
        let event = self.event(TaskEventKind::Restarting { delay, reason });
        self.commit(|state| {
            state.append_event(event);
            state.set_status(TaskStatus::Pending, self.now());
        })
        .await;
        tokio::select! {
            () = tokio::time::sleep(delay) => None,
            wind_down = self.wind_down_requested() => Some(wind_down),
        }
    }

    /// One run: wait for the gate, prepare, start (or adopt a recovered task), wait for it.
    async fn run_once(&self) -> RunEnded {
        let s = &self.shared;
        let reattached = s.facts.update(RunnerFacts::take_reattached);
        let task_id = match reattached {
            Some(id) => {
                let event = self.event(TaskEventKind::Reattached);
                Box::pin(self.commit(|state| {
                    state.append_event(event);
                    state.set_status(TaskStatus::Running, self.now());
                }))
                .await;
                id
            }
            None => {
                // A wind-down comes before the gate.
                let wind_down = s
                    .facts
                    .wait_until(|facts| match facts.wind_down() {
                        Some(wind_down) => Some(Some(wind_down)),
                        None => facts.gate_open.then_some(None),
                    })
                    .await;
                match wind_down {
                    Some(WindDown::Kill) => return RunEnded::KilledBeforeStart,
                    Some(WindDown::Shutdown) => return RunEnded::Shutdown,
                    None => {}
                }
                match Box::pin(self.start()).await {
                    Ok(id) => id,
                    Err(outcome) => return RunEnded::Outcome(outcome),
                }
            }
        };
        Box::pin(self.poststart()).await;
        let waited = self.wait(&task_id).await;
        Box::pin(self.after_wait(waited, task_id)).await
    }

    /// What follows a wait on the running task: the exit recorded, or the task stopped, and
    /// its driver resources released.
    async fn after_wait(&self, waited: Waited, task_id: TaskId) -> RunEnded {
        let outcome = match waited {
            Waited::Shutdown => return RunEnded::Shutdown,
            Waited::Exited(exit) => {
                self.record_exit(&exit).await;
                Outcome::Exited(exit)
            }
            Waited::Killed => {
                self.stop_task(&task_id).await;
                Outcome::Killed
            }
            Waited::Restart(request) => {
                self.stop_task(&task_id).await;
                Outcome::RestartRequested { failure: request.failure }
            }
        };
        self.release(&task_id);
        RunEnded::Outcome(outcome)
    }

    /// Prestart hooks, then the driver. On failure, the events are recorded and the outcome
    /// for the restart tracker returned.
    async fn start(&self) -> Result<TaskId, Outcome> {
        let s = &self.shared;
        let alloc = s.facts.read(|facts| facts.alloc.clone());
        let base_env = env::build(
            EnvIdentity {
                alloc_id: &alloc.id,
                alloc_name: &format!("{}.{}[0]", alloc.job.id, alloc.task_group),
                job_id: &alloc.job.id,
                group: &alloc.task_group,
                task: &s.task.name,
            },
            EnvPaths {
                alloc_dir: &s.dirs.alloc_dir,
                task_dir: &s.dirs.task_dir,
                secrets_dir: &s.dirs.secrets_dir,
            },
            &alloc.ports,
            &s.task.env,
        );
        let (mounts, base_env) = match self.resolve_mounts(&alloc, base_env) {
            Ok(resolved) => resolved,
            Err(error) => {
                let event = self.event(TaskEventKind::SetupFailure { error }).failing();
                self.commit(|state| state.append_event(event)).await;
                return Err(Outcome::StartFailed { retryable: false });
            }
        };
        let env = match self.prestart(&alloc, base_env).await {
            Ok(env) => env,
            Err((hook, error)) => {
                let kind = match error {
                    TaskError::Template { message } => TaskEventKind::Template { message },
                    TaskError::HookEvent { event, .. } => event,
                    error => TaskEventKind::HookFailed { hook, error: error.to_string() },
                };
                let event = self.event(kind);
                self.commit(|state| state.append_event(event)).await;
                return Err(Outcome::StartFailed { retryable: true });
            }
        };
        let mut env = env;
        let own_root = matches!(
            s.driver.capabilities().fs_isolation,
            FsIsolation::Image | FsIsolation::Chroot
        );
        if s.task.notify_socket && own_root {
            // The socket's path is the node's: in a root of the task's own it names nothing.
            let event = self.event(TaskEventKind::SetupFailure {
                error: "notify_socket: the task runs in a root of its own, where the notify \
                        socket's path does not exist; wait for it with wait_healthy and a check"
                    .into(),
            });
            self.commit(|state| state.append_event(event.failing())).await;
            return Err(Outcome::StartFailed { retryable: false });
        }
        if let Err(error) = self.listen_for_ready() {
            let event = self.event(TaskEventKind::SetupFailure {
                error: format!("the notify socket: {error}"),
            });
            self.commit(|state| state.append_event(event.failing())).await;
            return Err(Outcome::StartFailed { retryable: false });
        }
        if s.task.notify_socket {
            let path = notify::socket_path(&s.dirs.task_dir);
            env.insert(notify::NOTIFY_SOCKET_ENV.to_owned(), path.display().to_string());
        }
        let driver_config = env::interpolate_config(&s.task.config, &env);
        if let Err(error) = s.driver.validate_config(&driver_config) {
            return Err(self.start_failed(error).await);
        }
        let run = s.facts.update(|facts| {
            facts.local.runs += 1;
            facts.local.runs
        });
        let config = TaskConfig {
            id: TaskId::new(&alloc.id, &s.task.name, run),
            alloc_id: alloc.id.clone(),
            job_id: alloc.job.id.clone(),
            group: alloc.task_group.clone(),
            task_name: s.task.name.clone(),
            env,
            task_dir: s.dirs.task_dir.clone(),
            alloc_dir: s.dirs.alloc_dir.clone(),
            logs: LogConfig {
                dir: s.dirs.logs_dir.clone(),
                max_files: s.logs.max_files,
                max_file_bytes: s.logs.max_file_bytes,
            },
            resources: s.task.resources,
            driver_config,
            mounts,
        };
        let handle = match tokio::time::timeout(START_TIMEOUT, s.driver.start_task(config)).await {
            Ok(Ok(handle)) => handle,
            Ok(Err(error)) => return Err(self.start_failed(error).await),
            Err(_) => {
                let reason = format!(
                    "the driver did not start the task within {}",
                    wharf_state::duration::Formatted(START_TIMEOUT)
                );
                return Err(self.start_failed(DriverError::Retryable { reason }).await);
            }
        };
        let id = handle.id().clone();
        s.facts.update(|facts| facts.local.handle = Some(handle));
        let event = self.event(TaskEventKind::Started);
        self.commit_with_local(|state| {
            state.append_event(event);
            state.set_status(TaskStatus::Running, self.now());
        })
        .await;
        Ok(id)
    }

    /// The task's volume mounts resolved against the node's host volumes, and the environment
    /// with each mount's path as `WHARF_VOLUME_<NAME>`.
    fn resolve_mounts(
        &self,
        alloc: &Allocation,
        mut env: BTreeMap<String, String>,
    ) -> Result<(Vec<wharf_driver::Mount>, BTreeMap<String, String>), String> {
        let s = &self.shared;
        if s.task.volume_mounts.is_empty() {
            return Ok((Vec::new(), env));
        }
        let group = alloc.group().map_err(|e| e.to_string())?;
        let resolved =
            wharf_state::volume::resolve(&group.volumes, &s.task.volume_mounts, &s.host_volumes)
                .map_err(|e| format!("volume_mount: {e}"))?;
        let mounts = resolved
            .into_iter()
            .map(|m| {
                env.insert(
                    wharf_state::volume::env_name(&m.volume),
                    m.source.display().to_string(),
                );
                wharf_driver::Mount {
                    volume: m.volume,
                    source: m.source,
                    destination: m.destination,
                    read_only: m.read_only,
                }
            })
            .collect();
        Ok((mounts, env))
    }

    async fn start_failed(&self, error: DriverError) -> Outcome {
        let retryable = error.is_retryable();
        let kind = match &error {
            DriverError::InvalidConfig { .. } => {
                TaskEventKind::FailedValidation { error: error.to_string() }
            }
            _ => TaskEventKind::DriverFailure { error: error.to_string() },
        };
        let event = self.event(kind);
        self.commit(|state| state.append_event(event)).await;
        Outcome::StartFailed { retryable }
    }

    /// Runs the prestart hooks that are not done. Returns the environment they built, or the
    /// failing hook's name and error. Their events and state are written with the start
    /// that follows (one commit rather than one per hook, on the path every start takes): if
    /// the agent dies before that, the task had not started, and the hooks run again, as they
    /// must be able to after a crash in the middle of one anyway.
    async fn prestart(
        &self,
        alloc: &Allocation,
        mut env: BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, (String, TaskError)> {
        let s = &self.shared;
        for hook in &s.hooks {
            let name = hook.name().to_owned();
            let saved =
                s.facts.read(|facts| facts.local.hooks.get(&name).cloned().unwrap_or_default());
            if saved.done {
                env.extend(saved.env);
                continue;
            }
            let ctx = HookContext { alloc, task: &s.task, dirs: &s.dirs, env: &env };
            let timeout = hook.prestart_timeout(ctx);
            let response = match tokio::time::timeout(
                timeout,
                hook.prestart(ctx, saved.data.as_ref()),
            )
            .await
            {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => return Err((name, error)),
                Err(_) => {
                    return Err((
                        name.clone(),
                        TaskError::Hook { hook: name, reason: "timed out".into() },
                    ));
                }
            };
            for kind in response.events {
                let event = self.event(kind);
                self.note(|state| state.append_event(event));
            }
            env.extend(response.env.clone());
            if response.done || response.state.is_some() {
                let saved =
                    HookState { done: response.done, data: response.state, env: response.env };
                s.facts.update(|facts| facts.local.hooks.insert(name, saved));
            }
        }
        Ok(env)
    }

    async fn poststart(&self) {
        self.run_hooks(HookPhase::Poststart).await;
    }

    /// Runs every hook's `phase`, each call bounded by [`HOOK_TIMEOUT`]. A poststart or stop
    /// hook that fails or times out becomes a `HookFailed` event; the next hook still runs.
    async fn run_hooks(&self, phase: HookPhase<'_>) {
        let alloc = self.shared.facts.read(|facts| facts.alloc.clone());
        let env = self.hook_env();
        for hook in &self.shared.hooks {
            let ctx = self.ctx(&alloc, &env);
            let (call, recorded) = match phase {
                HookPhase::Poststart => (hook.poststart(ctx), true),
                HookPhase::Stop => (hook.stop(ctx), true),
                HookPhase::Prekill => (infallible(hook.prekill(ctx)), false),
                HookPhase::Exited(exit) => (infallible(hook.exited(ctx, exit)), false),
                HookPhase::Update => (infallible(hook.update(ctx)), false),
                HookPhase::Shutdown => (infallible(hook.shutdown(ctx)), false),
            };
            let error = match tokio::time::timeout(HOOK_TIMEOUT, call).await {
                Ok(Ok(())) => continue,
                _ if !recorded => continue,
                Ok(Err(error)) => error.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            let event =
                self.event(TaskEventKind::HookFailed { hook: hook.name().to_owned(), error });
            self.commit(|state| state.append_event(event)).await;
        }
    }

    /// The environment hooks see: the running task's, kept in its handle (one copy of it,
    /// not two), or else the last run's.
    fn hook_env(&self) -> BTreeMap<String, String> {
        self.shared.facts.read(|facts| match &facts.local.handle {
            Some(handle) => handle.config.env.clone(),
            None => facts.last_env.clone(),
        })
    }

    fn ctx<'a>(
        &'a self,
        alloc: &'a Allocation,
        env: &'a BTreeMap<String, String>,
    ) -> HookContext<'a> {
        HookContext { alloc, task: &self.shared.task, dirs: &self.shared.dirs, env }
    }

    /// Waits for the task to exit, or for a kill, restart or shutdown request.
    async fn wait(&self, task_id: &TaskId) -> Waited {
        let s = &self.shared;
        // A wind-down comes before a restart request, and both before the task's exit.
        let asked = s.facts.wait_until(|facts| match facts.wind_down() {
            Some(WindDown::Kill) => Some(Waited::Killed),
            Some(WindDown::Shutdown) => Some(Waited::Shutdown),
            None => facts.restart.take().map(Waited::Restart),
        });
        tokio::select! {
            biased;
            asked = asked => asked,
            result = s.driver.wait_task(task_id) => Waited::Exited(result.unwrap_or_else(|error| ExitResult {
                exit_code: 0,
                signal: None,
                oom_killed: false,
                error: Some(format!("lost track of the task: {error}")),
            })),
        }
    }

    async fn record_exit(&self, exit: &ExitResult) {
        let event = self.event(TaskEventKind::Terminated {
            exit_code: exit.exit_code,
            signal: exit.signal,
            oom_killed: exit.oom_killed,
            message: exit.error.clone(),
        });
        self.commit(|state| state.append_event(event)).await;
        self.exited_hooks(exit).await;
    }

    async fn exited_hooks(&self, exit: &ExitResult) {
        self.run_hooks(HookPhase::Exited(exit)).await;
    }

    /// The task's `shutdown_delay`, waited out between the prekill hooks (its services have
    /// left the catalog) and the kill signal, so that clients stop coming before it stops.
    async fn shutdown_delay(&self) {
        let Some(delay) = self.shared.task.shutdown_delay.filter(|d| !d.is_zero()) else {
            return;
        };
        let event = self.event(TaskEventKind::WaitingShutdownDelay { delay });
        self.commit(|state| state.append_event(event)).await;
        tokio::time::sleep(delay).await;
    }

    /// Stops a running task: prekill hooks, the kill signal, the timeout, and escalation to a
    /// forced destroy if the driver does not finish. Always returns, bounded.
    async fn stop_task(&self, task_id: &TaskId) {
        let s = &self.shared;
        self.run_hooks(HookPhase::Prekill).await;
        self.shutdown_delay().await;
        let signal = s.task.kill_signal;
        // Noted, not waited on: written with the end of the stop (see `release`). An agent that
        // dies before then finds the stop in the allocation's record and kills again.
        let event = self.event(TaskEventKind::Killing { signal, kill_timeout: s.kill_timeout });
        self.note(|state| state.append_event(event));
        let stopped = tokio::time::timeout(
            s.kill_timeout + STOP_GRACE,
            s.driver.stop_task(task_id, s.kill_timeout, signal),
        )
        .await;
        let mut error = match stopped {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(format!("stopping failed: {error}")),
            Err(_) => Some(format!(
                "the driver did not finish stopping the task within {}",
                wharf_state::duration::Formatted(s.kill_timeout + STOP_GRACE)
            )),
        };
        if let Some(stop_error) = &error {
            tracing::warn!(alloc_id = %self.alloc_id(), task = %s.task.name, error = %stop_error, "escalating to a forced destroy");
            match tokio::time::timeout(DESTROY_TIMEOUT, s.driver.destroy_task(task_id, true)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(destroy)) => {
                    error = Some(format!(
                        "{stop_error}; forced destroy failed: {destroy}; resources may have leaked"
                    ))
                }
                Err(_) => {
                    error = Some(format!(
                        "{stop_error}; forced destroy did not finish; resources may have leaked"
                    ))
                }
            }
        }
        let exit =
            match tokio::time::timeout(EXIT_RESULT_TIMEOUT, s.driver.wait_task(task_id)).await {
                Ok(Ok(exit)) => Some(exit),
                _ => None,
            };
        let mut events = Vec::new();
        if let Some(exit) = &exit {
            events.push(self.event(TaskEventKind::Terminated {
                exit_code: exit.exit_code,
                signal: exit.signal,
                oom_killed: exit.oom_killed,
                message: exit.error.clone(),
            }));
        }
        events.push(self.event(TaskEventKind::Killed { error }));
        // Written by the `release` that follows every stop, in one commit with the cleared handle.
        self.note(|state| events.into_iter().for_each(|e| state.append_event(e)));
        if let Some(exit) = &exit {
            self.exited_hooks(exit).await;
        }
    }

    /// Forgets a run that has ended: the driver frees it and the handle is cleared.
    ///
    /// Not written here: every way out of a run commits next (the restart, the failure, or the
    /// death the run loop records), and that one commit writes the cleared handle and what a
    /// stop noted with it. A crash before it leaves the handle of a task that has ended, as a
    /// crash just after the task's exit does, and a restore finds it ended the same way.
    fn release(&self, task_id: &TaskId) {
        let s = &self.shared;
        s.facts.update(|facts| {
            if let Some(handle) = facts.local.handle.take() {
                facts.last_env = handle.config.env;
            }
            facts.local_unwritten = true;
        });
        // What the driver frees now (a cgroup, a run directory) is housekeeping for a run that
        // has ended: the task's death is recorded without waiting for it. An agent that stops
        // before it is done leaves orphans its successor removes.
        let (driver, id) = (s.driver.clone(), task_id.clone());
        let (alloc_id, task) = (self.alloc_id().to_owned(), s.task.name.clone());
        tokio::spawn(async move {
            if let Ok(Err(error)) =
                tokio::time::timeout(DESTROY_TIMEOUT, driver.destroy_task(&id, false)).await
            {
                tracing::debug!(%alloc_id, %task, %error, "driver could not free the task");
            }
        });
    }

    /// The task is dead: record it, then wait for an allocation-wide restart, a kill (the alloc
    /// runner releases dead tasks once they are all dead) or shutdown.
    async fn after_death(&self) -> LoopEnd {
        let s = &self.shared;
        loop {
            self.commit(|state| state.set_status(TaskStatus::Dead, self.now())).await;
            let released =
                s.stage == Stage::Poststop || self.lifecycle() == TaskRunnerState::Killing;
            if released {
                break;
            }
            // A wind-down comes before a rerun.
            let asked = s
                .facts
                .wait_until(|facts| match facts.wind_down() {
                    Some(wind_down) => Some(AfterDeath::WindDown(wind_down)),
                    None => std::mem::take(&mut facts.rerun).then_some(AfterDeath::Rerun),
                })
                .await;
            match asked {
                AfterDeath::WindDown(WindDown::Kill) => break,
                AfterDeath::WindDown(WindDown::Shutdown) => return LoopEnd::Shutdown,
                AfterDeath::Rerun => {
                    // Run again as part of an allocation-wide restart: a restart like any
                    // other, counted and recorded, though not against the policy.
                    let event = self.event(TaskEventKind::Restarting {
                        delay: Duration::ZERO,
                        reason: "Restart requested".into(),
                    });
                    self.commit(|state| {
                        state.append_event(event);
                        state.set_status(TaskStatus::Pending, self.now());
                    })
                    .await;
                    if let LoopEnd::Shutdown = self.main_loop().await {
                        return LoopEnd::Shutdown;
                    }
                }
            }
        }
        self.stop_hooks().await;
        s.facts.update(|facts| facts.local.run_complete = true);
        self.persist_local().await;
        LoopEnd::Dead
    }

    async fn stop_hooks(&self) {
        self.run_hooks(HookPhase::Stop).await;
    }

    async fn on_shutdown(&self) {
        self.persist_local().await;
        self.run_hooks(HookPhase::Shutdown).await;
    }

    /// Stops the task for good and waits (bounded by the runner's own limits) until its run
    /// has ended. `event`, if any, is recorded first when the task is not yet dead (such as
    /// "Sibling Task Failed").
    pub async fn kill(&self, event: Option<TaskEvent>) {
        let s = &self.shared;
        let alive = s.facts.read(RunnerFacts::may_record_kill);
        if let Some(event) = event.filter(|_| alive) {
            self.commit(|state| state.append_event(event)).await;
        }
        match self.step(TaskRunnerEvent::Kill) {
            // Killed before it ran: the kill runs it to its end here, and a later `run` returns.
            TaskRunnerAction::RunToEnd => Box::pin(self.run_claimed()).await,
            TaskRunnerAction::AwaitFinished => self.wait_finished().await,
            TaskRunnerAction::Ignore | TaskRunnerAction::RunLoop => {}
        }
    }

    /// Marks a task that never ran as failed and dead, as when the allocation's setup failed,
    /// and ends its runner (a later `run` returns at once).
    pub async fn mark_failed_dead(&self, event: TaskEvent) {
        self.commit(|state| {
            state.append_event(event.failing());
            state.set_status(TaskStatus::Dead, self.now());
        })
        .await;
        self.kill(None).await;
    }

    /// Gives up a task restored from the store that cannot run here any more (its
    /// allocation's directory is gone): destroys whatever of it still runs, records `event` as
    /// the failure, and ends the runner.
    pub async fn abandon(&self, event: TaskEvent) {
        let s = &self.shared;
        let reattached = s.facts.update(|facts| {
            facts.take_lost();
            facts.take_reattached()
        });
        if let Some(id) = reattached {
            let destroyed =
                tokio::time::timeout(DESTROY_TIMEOUT, s.driver.destroy_task(&id, true)).await;
            if !matches!(destroyed, Ok(Ok(()))) {
                tracing::warn!(alloc_id = %self.alloc_id(), task = %s.task.name, "could not destroy an abandoned task; it may still run");
            }
            s.facts.update(|facts| facts.local.handle = None);
        }
        self.commit_with_local(|_| {}).await;
        self.mark_failed_dead(event).await;
    }

    /// Leaves the task running and makes [`TaskRunner::run`] return, with everything restore
    /// needs persisted.
    pub fn shutdown(&self) {
        self.step(TaskRunnerEvent::Shutdown);
    }

    /// The id of the task that runs now. A task reported running that the runner has not
    /// reattached to yet (just after a restore) is waited for, up to [`REATTACH_WAIT`].
    async fn running_task(&self) -> Result<TaskId, TaskError> {
        let s = &self.shared;
        let not_running = || TaskError::NotRunning { task: s.task.name.clone() };
        let (current, may_wait) =
            s.facts.read(|facts| (facts.running_task(), facts.may_wait_for_reattach()));
        if let Some(id) = current {
            return Ok(id);
        }
        if !may_wait {
            return Err(not_running());
        }
        let reattached = s.facts.wait_until(|facts| facts.running_task());
        tokio::time::timeout(REATTACH_WAIT, reattached).await.map_err(|_| not_running())
    }

    /// Restarts the running task. A restart that is not a `failure` does not count against
    /// the restart policy and happens at once.
    pub async fn restart(&self, reason: &str, failure: bool) -> Result<(), TaskError> {
        let s = &self.shared;
        self.running_task().await?;
        let event = self.event(TaskEventKind::RestartSignaled { reason: reason.to_owned() });
        self.commit(|state| state.append_event(event)).await;
        s.facts.update(|facts| facts.restart = Some(RestartRequest { failure }));
        Ok(())
    }

    /// Runs a dead task again, as part of restarting the whole allocation. Returns false if
    /// the task is not waiting for that (still running, or released).
    pub fn rerun(&self) -> bool {
        let s = &self.shared;
        let at = s.clock.now();
        s.facts.update(|facts| {
            if !facts.awaits_rerun() {
                return false;
            }
            // Pending at once, so whoever coordinates start gates sees it before the loop wakes.
            facts.set_status(TaskStatus::Pending, at, &s.task.name);
            facts.rerun = true;
            true
        })
    }

    /// Sends a signal to the running task.
    pub async fn signal(&self, signal: Signal, reason: &str) -> Result<(), TaskError> {
        let s = &self.shared;
        let id = self.running_task().await?;
        let event = self.event(TaskEventKind::Signaling { signal, reason: reason.to_owned() });
        self.commit(|state| state.append_event(event)).await;
        s.driver
            .signal_task(&id, signal)
            .await
            .map_err(|source| TaskError::Driver { task: s.task.name.clone(), source })
    }

    /// Runs a command in the running task.
    pub async fn exec(
        &self,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, TaskError> {
        let id = self.running_task().await?;
        let s = &self.shared;
        match tokio::time::timeout(timeout + STOP_GRACE, s.driver.exec_task(&id, command, timeout))
            .await
        {
            Ok(result) => {
                result.map_err(|source| TaskError::Driver { task: s.task.name.clone(), source })
            }
            Err(_) => Err(TaskError::Driver {
                task: s.task.name.clone(),
                source: DriverError::other("exec did not finish in time"),
            }),
        }
    }

    /// The running task's resource usage.
    pub async fn usage(&self) -> Result<ResourceUsage, TaskError> {
        let id = self.current_id()?;
        let s = &self.shared;
        s.driver
            .task_stats(&id)
            .await
            .map_err(|source| TaskError::Driver { task: s.task.name.clone(), source })
    }

    /// Opens one stream of the task's captured output through its driver (capability `logs`):
    /// while it runs, after it has ended, and after an agent restart alike.
    pub async fn logs(
        &self,
        stream: LogStream,
        from: LogFrom,
    ) -> Result<Box<dyn LogReader>, TaskError> {
        let s = &self.shared;
        let target = LogTarget {
            alloc_id: self.alloc_id(),
            task_name: s.task.name.clone(),
            dir: s.dirs.logs_dir.clone(),
        };
        s.driver
            .task_logs(&target, stream, from)
            .await
            .map_err(|source| TaskError::Driver { task: s.task.name.clone(), source })
    }

    /// Records an event from outside the runner, such as the alloc runner's.
    pub async fn emit_event(&self, event: TaskEvent) {
        self.commit(|state| state.append_event(event)).await;
    }

    /// Applies an allocation update and runs the update hooks.
    pub async fn update(&self, alloc: impl Into<Arc<Allocation>>) {
        let alloc = alloc.into();
        self.shared.facts.update(|facts| facts.alloc = alloc);
        self.run_hooks(HookPhase::Update).await;
    }

    fn current_id(&self) -> Result<TaskId, TaskError> {
        self.shared
            .facts
            .read(RunnerFacts::running_task)
            .ok_or_else(|| TaskError::NotRunning { task: self.shared.task.name.clone() })
    }

    fn alloc_id(&self) -> String {
        self.shared.facts.read(|facts| facts.alloc.id.clone())
    }

    fn now(&self) -> wharf_state::Timestamp {
        self.shared.clock.now()
    }

    fn event(&self, kind: TaskEventKind) -> TaskEvent {
        TaskEvent::new(self.now(), kind)
    }

    /// Changes the task state and persists it (persists are serialised, so the store never
    /// goes back), then tells the alloc runner.
    async fn commit(&self, change: impl FnOnce(&mut Change<'_>)) {
        self.persist(change, false).await;
    }

    /// Changes the task state in memory only (the next commit writes it), and tells the alloc
    /// runner.
    fn note(&self, change: impl FnOnce(&mut Change<'_>)) {
        self.shared.facts.update(|facts| self.apply(facts, change));
        self.shared.state_changed.notify_one();
    }

    /// Applies `change` to the task state and sends the events it recorded to the stream,
    /// under the facts' lock (which the caller holds) so the stream's order is the state's.
    fn apply(&self, facts: &mut RunnerFacts, change: impl FnOnce(&mut Change<'_>)) {
        let s = &self.shared;
        let mut events = Vec::new();
        let mut edit = Change {
            state: &mut facts.task,
            events: &mut events,
            alloc_id: &facts.alloc.id,
            task: &s.task.name,
        };
        if std::mem::take(&mut facts.received_unrecorded) {
            edit.append_event(TaskEvent::new(s.clock.now(), TaskEventKind::Received));
        }
        change(&mut edit);
        if !events.is_empty() {
            s.events.send(&facts.alloc.id, &s.task.name, events);
        }
    }

    /// As [`TaskRunner::commit`], with the local state in the same atomic write.
    async fn commit_with_local(&self, change: impl FnOnce(&mut Change<'_>)) {
        self.persist(change, true).await;
    }

    async fn persist_local(&self) {
        self.persist(|_| {}, true).await;
    }

    async fn persist(&self, change: impl FnOnce(&mut Change<'_>), with_local: bool) {
        let s = &self.shared;
        let _order = s.persist.lock().await;
        // The state after the change and the local state, taken in one look.
        let (alloc_id, state, local) = s.facts.update(|facts| {
            self.apply(facts, change);
            let with_local = std::mem::take(&mut facts.local_unwritten) || with_local;
            let local = with_local.then(|| facts.local.encode());
            (facts.alloc.id.clone(), facts.task.clone(), local)
        });
        let wrote_local = local.is_some();
        let batch =
            WriteBatch::new().put_task_state(&alloc_id, &s.task.name, &state).and_then(|batch| {
                let Some(local) = local else { return Ok(batch) };
                let local = local.map_err(|e| wharf_store::StoreError::Encode {
                    what: "task local state".into(),
                    source: e,
                })?;
                batch.put_task_local_state(&alloc_id, &s.task.name, &local)
            });
        let result = match batch {
            Ok(batch) => s.store.write(batch).await,
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            // The state stays current in memory; the next successful write persists it.
            if wrote_local {
                s.facts.update(|facts| facts.local_unwritten = true);
            }
            tracing::error!(alloc_id = %alloc_id, task = %s.task.name, %error, "persisting task state failed");
        }
        s.state_changed.notify_one();
    }
}
