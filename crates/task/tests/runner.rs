//! The task runner's behaviour, on the mock driver and the in-memory store under tokio's
//! paused clock: every timing below is exact virtual time, not a sleep.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use wharf_driver::mock::MockDriver;
use wharf_driver::{Driver, ExitResult};
use wharf_state::{
    Allocation, DesiredStatus, Signal, TaskEvent, TaskEventKind, TaskState, TaskStatus, Timestamp,
    spec,
};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::{
    PrestartResponse, TaskError, TaskHook, TaskRunner, TaskRunnerConfig, TaskRunnerState,
    TokioClock,
};

/// Long enough for anything a test waits for; a test that reaches it has hung.
const LIMIT: Duration = Duration::from_secs(24 * 3600);

struct Harness {
    driver: MockDriver,
    store: MemoryStore,
    changed: Arc<Notify>,
    alloc: Allocation,
    dir: tempfile::TempDir,
}

impl Harness {
    /// An allocation of a job with one task, written as TOML lines of `[[group.task]]`.
    fn new(job_type: &str, task: &str) -> Harness {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"{job_type}\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"mock\"\n{task}\n"
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        let alloc = Allocation {
            id: "a1".into(),
            job,
            task_group: "g".into(),
            desired_status: DesiredStatus::Run,
            modify_index: 1,
            deployment_id: None,
            ports: Vec::new(),
        };
        Harness {
            driver: MockDriver::new(),
            store: MemoryStore::new(),
            changed: Arc::new(Notify::new()),
            alloc,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn runner_with(&self, hooks: Vec<Arc<dyn TaskHook>>, max_kill_timeout: Duration) -> TaskRunner {
        let task = self.alloc.job.groups[0].tasks[0].clone();
        let driver = Arc::new(self.driver.clone());
        let store = Arc::new(self.store.clone());
        let mut config = TaskRunnerConfig::new(
            self.alloc.clone(),
            task,
            driver,
            store,
            self.dir.path().join("a1"),
        )
        .with_clock(Arc::new(TokioClock::starting_at(Timestamp(1_000_000))))
        .with_max_kill_timeout(max_kill_timeout)
        .with_state_changed(self.changed.clone());
        config.hooks = hooks;
        TaskRunner::new(config)
    }

    fn runner(&self) -> TaskRunner {
        self.runner_with(Vec::new(), Duration::from_secs(30))
    }

    /// Builds a runner, opens its gate and runs it in the background.
    fn start(&self) -> TaskRunner {
        let runner = self.runner();
        runner.set_start_gate(true);
        spawn_run(&runner);
        runner
    }

    async fn until(
        &self,
        runner: &TaskRunner,
        what: &str,
        done: impl Fn(&TaskState) -> bool,
    ) -> TaskState {
        let wait = async {
            loop {
                let state = runner.state();
                if done(&state) {
                    return state;
                }
                self.changed.notified().await;
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .unwrap_or_else(|_| panic!("never {what}: {:#?}", runner.state()))
    }

    async fn stored(&self) -> Option<TaskState> {
        self.stored_task().await.and_then(|t| t.state)
    }

    /// What the store holds for the task. The runner writes no allocation record (that is
    /// the alloc runner's job), so the test writes one to read the task's records back.
    async fn stored_task(&self) -> Option<wharf_store::StoredTask> {
        self.store.put_allocation(&self.alloc).await.unwrap();
        let stored = self.store.load_alloc("a1").await.unwrap().unwrap();
        stored.tasks.get("t").cloned()
    }
}

fn spawn_run(runner: &TaskRunner) -> tokio::task::JoinHandle<()> {
    let runner = runner.clone();
    tokio::spawn(async move { runner.run().await })
}

fn titles(state: &TaskState) -> Vec<&'static str> {
    state.events.iter().map(|e| e.kind.title()).collect()
}

fn dead(state: &TaskState) -> bool {
    state.status == TaskStatus::Dead
}

fn running(state: &TaskState) -> bool {
    state.status == TaskStatus::Running
}

/// Waits (bounded) until the runner's own lifecycle is `wanted`.
async fn until_lifecycle(runner: &TaskRunner, wanted: TaskRunnerState) {
    let reached = tokio::time::timeout(LIMIT, runner.wait_lifecycle(|s| s == wanted))
        .await
        .unwrap_or_else(|_| panic!("the runner never reached {wanted:?}"));
    assert_eq!(reached, wanted);
}

#[test]
fn the_run_future_can_be_spawned_on_any_thread() {
    fn assert_send<T: Send>(_: &T) {}
    let h = Harness::new("batch", "");
    let runner = h.runner();
    assert_send(&runner.run());
    assert_send(&runner.kill(None));
}

#[tokio::test(start_paused = true)]
async fn a_batch_task_that_exits_0_is_done() {
    let h = Harness::new("batch", "config = { run_for = \"5s\" }");
    let started = Instant::now();
    let runner = h.start();
    let state = h.until(&runner, "dead", dead).await;
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(!state.failed);
    assert_eq!(titles(&state), ["Received", "Task Setup", "Started", "Terminated"]);
    assert_eq!(state.started_at, Some(Timestamp(1_000_000)));
    assert_eq!(state.finished_at, Some(Timestamp(1_005_000)));
    assert_eq!(h.stored().await.as_ref(), Some(&state), "the store holds what the runner reports");
    // It waits to be released by the alloc runner; kill releases it without new events.
    runner.kill(None).await;
    assert!(runner.is_finished());
    assert_eq!(titles(&runner.state()), titles(&state));
}

#[tokio::test(start_paused = true)]
async fn a_failing_service_task_restarts_by_policy_then_fails() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 2, delay = \"10s\", interval = \"5m\" }",
    );
    let started = Instant::now();
    let runner = h.start();
    let state = h.until(&runner, "dead", dead).await;
    assert!(state.failed);
    assert_eq!(state.restarts, 2);
    assert_eq!(h.driver.start_count("a1", "t"), 3);
    // Three runs of 1s and two delays of 10s plus up to 25% jitter.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(23) && elapsed <= Duration::from_secs(28),
        "{elapsed:?}"
    );
    let last = state.events.back().unwrap();
    assert!(last.fails_task);
    assert_eq!(
        last.kind,
        TaskEventKind::NotRestarting {
            reason: "Exceeded allowed attempts 2 in interval 5m0s".into()
        }
    );
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_service_task_that_exits_0_is_restarted() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\" }\nrestart = { attempts = 1, delay = \"5s\", interval = \"1m\" }",
    );
    let runner = h.start();
    let state = h.until(&runner, "dead", dead).await;
    assert_eq!((state.restarts, state.failed), (1, true), "a service is not meant to exit");
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn fatal_start_errors_are_not_retried() {
    let h = Harness::new("service", "config = { start_error = \"image not found\" }");
    let runner = h.start();
    let state = h.until(&runner, "dead", dead).await;
    assert!(state.failed);
    assert_eq!(h.driver.start_count("a1", "t"), 1);
    assert_eq!(titles(&state), ["Received", "Task Setup", "Driver Failure", "Not Restarting"]);
    assert_eq!(
        state.events[2].kind,
        TaskEventKind::DriverFailure { error: "image not found".into() }
    );
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn retryable_start_errors_are_retried_and_can_succeed() {
    let h = Harness::new(
        "service",
        "config = { start_error = \"busy\", start_error_retryable = true, start_error_count = 1 }\nrestart = { delay = \"5s\" }",
    );
    let runner = h.start();
    let state = h.until(&runner, "running", running).await;
    assert_eq!(h.driver.start_count("a1", "t"), 2);
    assert_eq!(
        titles(&state),
        ["Received", "Task Setup", "Driver Failure", "Restarting", "Task Setup", "Started"]
    );
    assert!(!state.failed);
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn invalid_driver_config_fails_validation_without_starting() {
    let h = Harness::new("service", "config = { run_for = \"soon\" }");
    let runner = h.start();
    let state = h.until(&runner, "dead", dead).await;
    assert!(state.failed);
    assert_eq!(h.driver.start_count("a1", "t"), 0);
    assert!(
        matches!(&state.events[2].kind, TaskEventKind::FailedValidation { error } if error.contains("invalid duration"))
    );
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn kill_sends_the_kill_signal_and_reports_killing_then_killed() {
    let h = Harness::new("service", "kill_signal = \"SIGINT\"\nconfig = { kill_after = \"2s\" }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    let started = Instant::now();
    runner.kill(Some(TaskEvent::new(Timestamp(0), TaskEventKind::LeaderDead))).await;
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    let state = runner.state();
    assert!(dead(&state) && !state.failed);
    let tail: Vec<_> = state.events.iter().rev().take(4).rev().map(|e| e.kind.clone()).collect();
    assert_eq!(
        tail,
        [
            TaskEventKind::LeaderDead,
            TaskEventKind::Killing { signal: Signal::Int, kill_timeout: Duration::from_secs(5) },
            TaskEventKind::Terminated {
                exit_code: 0,
                signal: Some(2),
                oom_killed: false,
                message: None
            },
            TaskEventKind::Killed { error: None },
        ]
    );
    assert!(runner.is_finished());
}

#[tokio::test(start_paused = true)]
async fn a_task_that_ignores_the_signal_is_killed_at_its_timeout_capped_by_the_node() {
    // kill_timeout 60s, but the node caps it at 10s.
    let h = Harness::new("service", "kill_timeout = \"60s\"\nconfig = { kill_after = \"1h\" }");
    let runner = h.runner_with(Vec::new(), Duration::from_secs(10));
    runner.set_start_gate(true);
    spawn_run(&runner);
    h.until(&runner, "running", running).await;
    let started = Instant::now();
    runner.kill(None).await;
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    let state = runner.state();
    assert!(
        state.events.iter().any(|e| e.kind
            == TaskEventKind::Killing {
                signal: Signal::Int,
                kill_timeout: Duration::from_secs(10)
            }),
        "Nomad's default signal, and the node's cap"
    );
    assert!(
        state
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { signal: Some(9), .. }))
    );
}

#[tokio::test(start_paused = true)]
async fn a_driver_that_never_stops_is_escalated_and_the_task_reported_dead() {
    let h = Harness::new("service", "config = { stop_hangs = true }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    let started = Instant::now();
    runner.kill(None).await;
    // The 5s kill timeout, the grace, then the forced destroy.
    assert_eq!(started.elapsed(), Duration::from_secs(5) + wharf_task::STOP_GRACE);
    let state = runner.state();
    assert!(dead(&state));
    let killed = state.events.back().unwrap();
    assert!(
        matches!(&killed.kind, TaskEventKind::Killed { error: Some(e) } if e.contains("did not finish stopping")),
        "{killed:?}"
    );
    assert_eq!(h.driver.destroyed().len(), 1, "forced destroy");
    assert!(h.driver.running().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_user_restart_is_immediate_and_does_not_count() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1h\", exit_code = 1 }\nrestart = { attempts = 1, delay = \"10s\", interval = \"24h\" }",
    );
    let runner = h.start();
    h.until(&runner, "running", running).await;
    for i in 0..3 {
        let started = Instant::now();
        runner.restart("config changed", false).await.unwrap();
        h.until(&runner, "restarted", |s| running(s) && h.driver.start_count("a1", "t") == i + 2)
            .await;
        assert_eq!(started.elapsed(), Duration::ZERO, "no restart delay");
    }
    let state = runner.state();
    assert_eq!(state.restarts, 3);
    assert!(
        state
            .events
            .iter()
            .any(|e| e.kind == TaskEventKind::RestartSignaled { reason: "config changed".into() })
    );
    // The policy's one attempt is still there: the first failure restarts, the second fails.
    let state = h.until(&runner, "dead", dead).await;
    assert_eq!(h.driver.start_count("a1", "t"), 5);
    assert!(state.failed);
    runner.kill(None).await;
}

/// Restart requests that arrive before the runner acts on the first are one pending request
/// (the latest's `failure` wins): the task restarts once, and each request is recorded.
#[tokio::test(start_paused = true)]
async fn restart_requests_made_together_restart_the_task_once() {
    let h = Harness::new("batch", "config = { run_for = \"10s\" }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    // Neither call lets the run loop in between: both are pending when it wakes.
    runner.restart("first", false).await.unwrap();
    runner.restart("second", false).await.unwrap();
    let state = h.until(&runner, "dead", dead).await;
    assert_eq!(h.driver.start_count("a1", "t"), 2, "one restart: {:?}", titles(&state));
    assert_eq!(state.restarts, 1);
    let signaled = state.events.iter().filter(|e| e.kind.title() == "Restart Signaled").count();
    assert_eq!(signaled, 2, "{:?}", titles(&state));
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn restart_and_signal_need_a_running_task() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    let runner = h.start();
    h.until(&runner, "dead", dead).await;
    assert!(matches!(runner.restart("x", false).await, Err(TaskError::NotRunning { .. })));
    assert!(matches!(runner.signal(Signal::Hup, "x").await, Err(TaskError::NotRunning { .. })));
    assert!(matches!(
        runner.exec(&["true".into()], Duration::from_secs(1)).await,
        Err(TaskError::NotRunning { .. })
    ));
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn signal_exec_and_usage_reach_the_driver() {
    let h = Harness::new("service", "config = { exec_stdout = \"pong\", memory_bytes = 777 }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    runner.signal(Signal::Usr1, "reload").await.unwrap();
    assert_eq!(h.driver.signals_sent().last().unwrap().1, Signal::Usr1);
    assert!(
        runner.state().events.iter().any(|e| e.kind
            == TaskEventKind::Signaling { signal: Signal::Usr1, reason: "reload".into() })
    );
    let exec = runner.exec(&["ping".into()], Duration::from_secs(1)).await.unwrap();
    assert_eq!(exec.stdout, b"pong");
    assert_eq!(runner.usage().await.unwrap().memory_rss_bytes, 777);
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_signal_is_reported() {
    let h = Harness::new("service", "config = { signal_error = \"no such process\" }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    let err = runner.signal(Signal::Hup, "x").await.unwrap_err();
    assert!(err.to_string().contains("no such process"), "{err}");
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn the_task_waits_for_its_gate() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    let runner = h.runner();
    spawn_run(&runner);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(h.driver.start_count("a1", "t"), 0);
    assert_eq!(runner.state().status, TaskStatus::Pending);
    runner.set_start_gate(true);
    h.until(&runner, "dead", dead).await;
    assert_eq!(h.driver.start_count("a1", "t"), 1);
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_kill_before_the_gate_opens_never_starts_the_task() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    let runner = h.runner();
    spawn_run(&runner);
    runner
        .kill(Some(TaskEvent::new(
            Timestamp(0),
            TaskEventKind::SiblingFailed { task: "init".into() },
        )))
        .await;
    let state = runner.state();
    assert!(dead(&state) && !state.failed);
    assert_eq!(h.driver.start_count("a1", "t"), 0);
    assert_eq!(titles(&state), ["Received", "Sibling Task Failed"]);
}

/// The handle a stop clears, and what the stop noted, are written by the commit that records
/// the death: a stop costs the store two writes (the death, then the run's completion after
/// the stop hooks), not three.
#[tokio::test(start_paused = true)]
async fn a_stop_writes_the_released_handle_with_the_death() {
    let h = Harness::new("service", "config = { run_for = \"1h\" }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    let before = h.store.write_count();
    runner.kill(None).await;
    assert_eq!(h.store.write_count() - before, 2, "the death with the handle, then completion");
    let stored = h.stored_task().await.unwrap();
    let state = stored.state.unwrap();
    assert!(dead(&state));
    assert_eq!(titles(&state)[3..], ["Killing", "Terminated", "Killed"]);
    let local = wharf_task::local_state::LocalState::decode(&stored.local_state.unwrap()).unwrap();
    assert!(local.handle.is_none(), "the released handle is written with the death");
    assert!(local.run_complete);
}

/// A run that ends and is restarted: the restart's commit writes the released handle.
#[tokio::test(start_paused = true)]
async fn a_restart_writes_the_released_handle_with_the_restart() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { delay = \"1m\", attempts = 5, interval = \"1h\" }",
    );
    let runner = h.start();
    h.until(&runner, "restarting", |s| s.restarts == 1).await;
    let stored = h.stored_task().await.unwrap();
    assert_eq!(titles(&stored.state.unwrap()).last(), Some(&"Restarting"));
    let local = wharf_task::local_state::LocalState::decode(&stored.local_state.unwrap()).unwrap();
    assert!(local.handle.is_none(), "the ended run's handle is not kept across the delay");
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_kill_during_the_restart_delay_ends_it_at_once() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { delay = \"1m\", attempts = 5, interval = \"1h\" }",
    );
    let runner = h.start();
    h.until(&runner, "restarting", |s| s.restarts == 1).await;
    let started = Instant::now();
    runner.kill(None).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(dead(&runner.state()));
    assert_eq!(h.driver.start_count("a1", "t"), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_leaves_the_task_running_with_its_handle_persisted() {
    let h = Harness::new("service", "config = { run_for = \"1h\" }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    runner.shutdown();
    runner.wait_finished().await;
    assert_eq!(h.driver.running().len(), 1, "the task still runs");
    assert!(h.driver.stops().is_empty());
    let stored = h.stored_task().await.unwrap();
    assert_eq!(stored.state.unwrap().status, TaskStatus::Running);
    let local = wharf_task::local_state::LocalState::decode(&stored.local_state.unwrap()).unwrap();
    assert_eq!(local.handle.unwrap().id(), &h.driver.running()[0]);
}

#[tokio::test(start_paused = true)]
async fn restore_reattaches_to_a_running_task() {
    let h = Harness::new(
        "batch",
        "config = { run_for = \"100s\", exit_code = 3 }\nrestart = { attempts = 0 }",
    );
    let first = h.start();
    h.until(&first, "running", running).await;
    first.shutdown();
    first.wait_finished().await;

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    spawn_run(&second);
    let state = h.until(&second, "dead", dead).await;
    assert_eq!(h.driver.start_count("a1", "t"), 1, "reattached, not started again");
    let kinds: Vec<_> = state.events.iter().map(|e| e.kind.clone()).collect();
    assert!(kinds.contains(&TaskEventKind::Reattached));
    assert!(kinds.contains(&TaskEventKind::Terminated {
        exit_code: 3,
        signal: None,
        oom_killed: false,
        message: None
    }));
    second.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn restore_reports_the_real_exit_of_a_task_that_ended_while_away() {
    let h = Harness::new(
        "batch",
        "config = { run_for = \"10s\", exit_code = 7 }\nrestart = { attempts = 0 }",
    );
    let first = h.start();
    h.until(&first, "running", running).await;
    first.shutdown();
    first.wait_finished().await;
    tokio::time::sleep(Duration::from_secs(60)).await; // The agent is away; the task ends.
    assert!(h.driver.running().is_empty());

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    spawn_run(&second);
    let state = h.until(&second, "dead", dead).await;
    assert!(
        state
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { exit_code: 7, .. }))
    );
    assert!(state.failed, "exit 7 with no restarts allowed fails the task");
    second.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_restore_destroys_reports_and_restarts_by_policy() {
    let h = Harness::new(
        "service",
        "config = { recover_error = \"executor gone\" }\nrestart = { attempts = 1, delay = \"5s\" }",
    );
    let first = h.start();
    h.until(&first, "running", running).await;
    first.shutdown();
    first.wait_finished().await;
    let old = h.driver.running()[0].clone();
    h.driver.forget_all();

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    assert!(
        second
            .state()
            .events
            .iter()
            .any(|e| e.kind == TaskEventKind::FailedRestoring { error: "executor gone".into() })
    );
    second.set_start_gate(true);
    spawn_run(&second);
    let state = h.until(&second, "running again", |s| running(s) && s.restarts == 1).await;
    assert_eq!(h.driver.start_count("a1", "t"), 2);
    assert_ne!(h.driver.running()[0], old, "a new run");
    assert!(!state.failed);
    second.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_restore_with_no_attempts_left_fails_the_task() {
    let h = Harness::new("service", "config = {}\nrestart = { attempts = 0 }");
    let first = h.start();
    h.until(&first, "running", running).await;
    first.shutdown();
    first.wait_finished().await;
    h.driver.forget_all();

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    spawn_run(&second);
    let state = h.until(&second, "dead", dead).await;
    assert!(state.failed);
    assert_eq!(h.driver.start_count("a1", "t"), 1);
    assert_eq!(
        titles(&state)[titles(&state).len() - 2..],
        ["Failed Restoring Task", "Not Restarting"]
    );
    second.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_completed_run_is_not_run_again_after_restore() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    let first = h.start();
    h.until(&first, "dead", dead).await;
    first.kill(None).await;

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    second.set_start_gate(true);
    second.run().await;
    assert_eq!(h.driver.start_count("a1", "t"), 1);
    assert!(dead(&second.state()));
}

#[tokio::test(start_paused = true)]
async fn unreadable_local_state_is_an_error_not_a_panic() {
    let h = Harness::new("batch", "");
    let runner = h.runner();
    let stored =
        wharf_store::StoredTask { state: None, local_state: Some(b"\xff garbage".to_vec()) };
    let err = runner.restore(Some(&stored)).await.unwrap_err();
    assert!(matches!(err, TaskError::BadLocalState { .. }), "{err}");
}

/// Adds `FOO` once, keeps a counter in its state, and declares itself done.
#[derive(Debug, Default)]
struct CountingHook {
    calls: std::sync::atomic::AtomicU32,
    fail: bool,
}

#[async_trait::async_trait]
impl TaskHook for CountingHook {
    fn name(&self) -> &str {
        "counting"
    }

    async fn prestart(
        &self,
        _ctx: wharf_task::HookContext<'_>,
        previous: Option<&serde_json::Value>,
    ) -> Result<PrestartResponse, TaskError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail {
            return Err(TaskError::Hook { hook: "counting".into(), reason: "vault sealed".into() });
        }
        assert!(previous.is_none(), "a done hook is never called again");
        Ok(PrestartResponse {
            env: [("FOO".to_owned(), "bar".to_owned())].into(),
            state: Some(serde_json::json!({"n": 1})),
            done: true,
            events: vec![TaskEventKind::HookMessage {
                hook: "counting".into(),
                message: "ready".into(),
            }],
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_done_prestart_hook_is_skipped_but_its_env_kept() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 1, delay = \"1s\" }",
    );
    let hook = Arc::new(CountingHook::default());
    let runner = h.runner_with(vec![hook.clone()], Duration::from_secs(30));
    runner.set_start_gate(true);
    spawn_run(&runner);
    h.until(&runner, "dead", dead).await;
    assert_eq!(hook.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    let configs = h.driver.started();
    assert_eq!(configs.len(), 2);
    assert!(configs.iter().all(|c| c.env["FOO"] == "bar"));
    let local = h.stored_task().await.unwrap().local_state.unwrap();
    let local = wharf_task::local_state::LocalState::decode(&local).unwrap();
    assert!(local.hooks["counting"].done);
    assert!(runner.state().events.iter().any(
        |e| matches!(&e.kind, TaskEventKind::HookMessage { message, .. } if message == "ready")
    ));
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_prestart_hook_is_retried_by_policy() {
    let h = Harness::new("service", "config = {}\nrestart = { attempts = 1, delay = \"1s\" }");
    let hook = Arc::new(CountingHook { fail: true, ..Default::default() });
    let runner = h.runner_with(vec![hook.clone()], Duration::from_secs(30));
    runner.set_start_gate(true);
    spawn_run(&runner);
    let state = h.until(&runner, "dead", dead).await;
    assert_eq!(hook.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(h.driver.start_count("a1", "t"), 0);
    assert!(state.failed);
    assert!(state.events.iter().any(|e| matches!(&e.kind, TaskEventKind::HookFailed { hook, error } if hook == "counting" && error.contains("vault sealed"))));
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn the_task_gets_its_directories_and_environment() {
    let h = Harness::new(
        "batch",
        "env = { DATA = \"${WHARF_ALLOC_DIR}/data\" }\nconfig = { run_for = \"1s\", messages = [\"${WHARF_TASK_NAME} at ${DATA}\"] }",
    );
    let mut events = h.driver.events();
    let runner = h.start();
    h.until(&runner, "dead", dead).await;
    let config = &h.driver.started()[0];
    let alloc_dir = h.dir.path().join("a1/alloc");
    assert_eq!(config.env["WHARF_ALLOC_ID"], "a1");
    assert_eq!(config.env["WHARF_JOB_ID"], "j");
    assert_eq!(config.env["WHARF_GROUP_NAME"], "g");
    assert_eq!(config.env["WHARF_TASK_NAME"], "t");
    assert_eq!(config.env["DATA"], format!("{}/data", alloc_dir.display()));
    assert_eq!(events.recv().await.unwrap().message, format!("t at {}/data", alloc_dir.display()));
    use std::os::unix::fs::PermissionsExt;
    let dirs = runner.dirs();
    for dir in [&dirs.alloc_dir, &dirs.local_dir, &dirs.logs_dir] {
        assert!(dir.is_dir(), "{}", dir.display());
    }
    assert_eq!(std::fs::metadata(&dirs.secrets_dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(config.logs.dir, dirs.logs_dir);
    assert_eq!(config.task_dir, h.dir.path().join("a1/t"));
    runner.kill(None).await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_does_not_stop_the_task() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    h.store.fail_writes(Some("disk full"));
    let runner = h.start();
    let state = h.until(&runner, "dead", dead).await;
    assert!(!state.failed);
    let snapshot = h.store.load_all().await.unwrap();
    assert!(
        snapshot.allocs.is_empty() && snapshot.problems.is_empty(),
        "nothing reached the store while it failed"
    );
    // Once the store heals, the next write carries everything that happened meanwhile.
    h.store.fail_writes(None);
    runner.kill(None).await;
    assert_eq!(h.stored_task().await.unwrap().state.as_ref(), Some(&runner.state()));
}

#[tokio::test(start_paused = true)]
async fn mark_failed_dead_fails_a_task_that_never_ran() {
    let h = Harness::new("service", "");
    let runner = h.runner();
    runner
        .mark_failed_dead(TaskEvent::new(
            Timestamp(0),
            TaskEventKind::SetupFailure { error: "no alloc dir".into() },
        ))
        .await;
    runner.set_start_gate(true);
    runner.run().await;
    let state = runner.state();
    assert!(dead(&state) && state.failed);
    assert_eq!(h.driver.start_count("a1", "t"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_poststop_task_finishes_without_waiting_to_be_released() {
    let h = Harness::new(
        "service",
        "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }",
    );
    let runner = h.runner();
    runner.set_start_gate(true);
    runner.run().await;
    assert!(dead(&runner.state()) && !runner.state().failed);
}

#[tokio::test(start_paused = true)]
async fn a_dead_task_runs_again_when_the_allocation_restarts() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    let runner = h.start();
    h.until(&runner, "dead", dead).await;
    assert!(runner.rerun());
    h.until(&runner, "dead again", |s| dead(s) && h.driver.start_count("a1", "t") == 2).await;
    runner.kill(None).await;
    assert!(!runner.rerun(), "a released task does not run again");
}

/// The state-change notification coalesces: every change of the task's state notifies, and
/// changes that nobody waited for leave exactly one wake-up pending, not one each.
#[tokio::test(start_paused = true)]
async fn change_notifications_coalesce() {
    let h = Harness::new("batch", "config = { run_for = \"1s\" }");
    let runner = h.runner();
    let mut events = runner.events();
    runner.set_start_gate(true);
    let run = spawn_run(&runner);
    // Nobody waits on the notification while the task starts, runs and dies: the test
    // follows the event stream instead.
    let mut seen = Vec::new();
    let terminated = tokio::time::timeout(LIMIT, async {
        loop {
            let kind = events.recv().await.unwrap().event.kind;
            seen.push(kind.title());
            if matches!(kind, TaskEventKind::Terminated { .. }) {
                break;
            }
        }
    });
    terminated.await.expect("the task never terminated");
    runner.kill(None).await;
    tokio::time::timeout(LIMIT, run).await.expect("the run never ended").unwrap();
    assert!(seen.len() >= 3, "many changes: {seen:?}");
    // Many changes happened; exactly one wake-up is pending, then none.
    let first = tokio::time::timeout(Duration::from_secs(1), h.changed.notified()).await;
    assert!(first.is_ok(), "the changes left no wake-up pending");
    assert!(tokio::time::timeout(Duration::from_secs(1), h.changed.notified()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn kill_timeout_and_max_kill_timeout_rows() {
    // (task kill_timeout, node max, kill_after, expected stop time)
    let rows = [(5, 30, 1, 1), (5, 30, 60, 5), (60, 10, 60, 10), (2, 30, 3, 2)];
    for (timeout, max, after, expected) in rows {
        let h = Harness::new(
            "service",
            &format!("kill_timeout = \"{timeout}s\"\nconfig = {{ kill_after = \"{after}s\" }}"),
        );
        let runner = h.runner_with(Vec::new(), Duration::from_secs(max));
        runner.set_start_gate(true);
        spawn_run(&runner);
        h.until(&runner, "running", running).await;
        let started = Instant::now();
        runner.kill(None).await;
        assert_eq!(started.elapsed(), Duration::from_secs(expected), "row {timeout} {max} {after}");
    }
}

#[tokio::test(start_paused = true)]
async fn wait_results_from_a_driver_that_lost_the_task_count_as_failures() {
    let h = Harness::new("service", "config = {}\nrestart = { attempts = 0 }");
    let runner = h.start();
    h.until(&runner, "running", running).await;
    let id = h.driver.running()[0].clone();
    h.driver
        .exit_task(&id, ExitResult { exit_code: 0, signal: None, oom_killed: true, error: None });
    let state = h.until(&runner, "dead", dead).await;
    assert!(state.failed);
    assert!(
        state
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { oom_killed: true, .. }))
    );
    runner.kill(None).await;
    assert!(h.driver.destroyed().contains(&id), "each ended run is freed in the driver");
    let _ = h.driver.inspect_task(&id).await.unwrap_err();
}

#[tokio::test(start_paused = true)]
async fn prestart_hooks_are_written_with_the_start_in_one_commit() {
    let h = Harness::new("service", "config = { run_for = \"1h\" }");
    let hook = Arc::new(CountingHook::default());
    let runner = h.runner_with(vec![hook.clone()], Duration::from_secs(30));
    runner.set_start_gate(true);
    spawn_run(&runner);
    h.until(&runner, "running", running).await;
    // The hook's event, its done flag and the Started event with the handle: one write.
    assert_eq!(h.store.write_count(), 1);
    let stored = h.stored_task().await.unwrap();
    let titles: Vec<_> = stored.state.unwrap().events.iter().map(|e| e.kind.title()).collect();
    assert!(
        titles.contains(&"Task Setup")
            && titles.contains(&"Task Hook Message")
            && titles.contains(&"Started"),
        "{titles:?}"
    );
    let local = wharf_task::local_state::LocalState::decode(&stored.local_state.unwrap()).unwrap();
    assert!(local.hooks["counting"].done && local.handle.is_some());
    runner.kill(None).await;
}

/// Nomad's `TestTaskRunner_Restore_Dead`: a task restored dead, before its run was complete,
/// waits for an allocation-wide restart and can run again. Once it is killed, its run is
/// complete and the mark persisted, so a runner restored after that refuses to run it again,
/// before and after its run begins, and a restart finds nothing running.
#[tokio::test(start_paused = true)]
async fn restore_dead() {
    let h = Harness::new("batch", "config = { run_for = \"2s\" }");
    let first = h.start();
    h.until(&first, "dead", dead).await;
    first.shutdown();
    first.wait_finished().await;

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    second.set_start_gate(true);
    spawn_run(&second);
    until_lifecycle(&second, TaskRunnerState::Running).await;
    assert!(second.rerun(), "a dead task whose run is not complete can run again");
    h.until(&second, "started again", |_| h.driver.start_count("a1", "t") == 2).await;
    second.kill(None).await;
    assert!(second.is_finished());

    let third = h.runner();
    third.restore(h.stored_task().await.as_ref()).await.unwrap();
    assert!(!third.rerun(), "refused from the persisted mark, before the run begins");
    third.set_start_gate(true);
    spawn_run(&third);
    until_lifecycle(&third, TaskRunnerState::Finished).await;
    assert!(!third.rerun());
    assert!(matches!(third.restart("again", false).await, Err(TaskError::NotRunning { .. })));
    assert_eq!(h.driver.start_count("a1", "t"), 2, "never started a third time");
    assert!(dead(&third.state()), "and still dead, not pending");
}

/// Right after a restore a task reported running is known to its runner before the run loop
/// adopts it, so a signal or a restart reaches it instead of failing as not running.
#[tokio::test(start_paused = true)]
async fn restart_and_signal_right_after_restore_reach_the_reattached_task() {
    let h = Harness::new("service", "config = { run_for = \"1h\" }");
    let first = h.start();
    h.until(&first, "running", running).await;
    first.shutdown();
    first.wait_finished().await;
    let old = h.driver.running()[0].clone();

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    second.signal(Signal::Usr1, "reload").await.unwrap();
    second.restart("requested", false).await.unwrap();
    second.set_start_gate(true);
    spawn_run(&second);
    let state = h.until(&second, "restarted", |s| running(s) && s.restarts == 1).await;
    assert_eq!(
        h.driver.signals_sent().first(),
        Some(&(old.clone(), Signal::Usr1)),
        "the signal reached the reattached task"
    );
    assert!(h.driver.stops().contains(&old), "the reattached task was restarted");
    assert_eq!(h.driver.start_count("a1", "t"), 2);
    assert!(titles(&state).contains(&"Reattached"));
    second.kill(None).await;
}

/// Nomad's `TestTaskRunner_RestartSignalTask_NotRunning`: a task that has not started is not
/// waited for; signal and restart answer at once that it is not running.
#[tokio::test(start_paused = true)]
async fn restart_signal_task_not_running() {
    let h = Harness::new("batch", "config = { run_for = \"0s\" }");
    let runner = h.runner();
    spawn_run(&runner); // The gate stays closed: the task is pending.
    until_lifecycle(&runner, TaskRunnerState::Running).await;
    let asked = Instant::now();
    assert!(matches!(runner.signal(Signal::Quit, "x").await, Err(TaskError::NotRunning { .. })));
    assert!(matches!(runner.restart("x", false).await, Err(TaskError::NotRunning { .. })));
    assert_eq!(asked.elapsed(), Duration::ZERO, "answered without waiting");
    runner.set_start_gate(true);
    let state = h.until(&runner, "dead", dead).await;
    assert!(!state.failed);
    assert_eq!(titles(&state), ["Received", "Task Setup", "Started", "Terminated"]);
    runner.kill(None).await;
}

/// A task of an allocation restarted as a whole runs again as a counted restart, with a
/// Restarting event, though not against its policy.
#[tokio::test(start_paused = true)]
async fn a_rerun_counts_as_a_restart_with_its_event() {
    let h = Harness::new(
        "service",
        "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"1s\" }\nrestart = { attempts = 0 }",
    );
    let runner = h.start();
    h.until(&runner, "dead", dead).await;
    assert!(runner.rerun());
    let state = h.until(&runner, "dead again", |s| dead(s) && s.restarts == 1).await;
    assert!(!state.failed, "policy attempts 0 does not refuse a requested restart");
    assert_eq!(
        titles(&state)[titles(&state).len() - 4..],
        ["Restarting", "Task Setup", "Started", "Terminated"]
    );
    runner.kill(None).await;
}

/// The event stream carries every event, in order, where the state's ring keeps the last ten:
/// a task that restarts eight times records far more than ten.
#[tokio::test(start_paused = true)]
async fn the_event_stream_loses_nothing_the_ring_drops() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 8, delay = \"1s\", interval = \"1h\" }",
    );
    let runner = h.runner();
    let mut events = runner.events();
    runner.set_start_gate(true);
    spawn_run(&runner);
    let state = h.until(&runner, "dead", dead).await;
    runner.kill(None).await;
    let mut seen = Vec::new();
    while let Ok(recorded) = events.try_recv() {
        assert_eq!((recorded.alloc_id.as_str(), recorded.task.as_str()), ("a1", "t"));
        seen.push(recorded.event);
    }
    // Received, then per run: (setup, started, terminated, restarting) ... and the last
    // run's not restarting.
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.title()).collect();
    assert_eq!(kinds.first(), Some(&"Received"));
    assert_eq!(kinds.iter().filter(|k| **k == "Started").count(), 9);
    assert_eq!(kinds.iter().filter(|k| **k == "Restarting").count(), 8);
    assert_eq!(kinds.last(), Some(&"Not Restarting"));
    assert!(seen.len() > state.events.len(), "{} events", seen.len());
    // The ring holds the stream's last events, in the same order.
    let tail = &seen[seen.len() - state.events.len()..];
    assert_eq!(tail, state.events.iter().cloned().collect::<Vec<_>>().as_slice());
    assert!(seen.windows(2).all(|pair| pair[0].time <= pair[1].time), "in order");
}

/// A listener that falls more than the buffer behind is told how many events it lost, then
/// goes on with the newest; a listener that kept up lost nothing.
#[tokio::test(start_paused = true)]
async fn a_slow_listener_is_told_it_lagged() {
    let h = Harness::new(
        "service",
        "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 8, delay = \"1s\", interval = \"1h\" }",
    );
    let stream = wharf_task::EventStream::new(4);
    let config = wharf_task::TaskRunnerConfig::new(
        h.alloc.clone(),
        h.alloc.job.groups[0].tasks[0].clone(),
        Arc::new(h.driver.clone()),
        Arc::new(h.store.clone()),
        h.dir.path().join("a1"),
    )
    .with_clock(Arc::new(TokioClock::starting_at(Timestamp(1_000_000))))
    .with_state_changed(h.changed.clone())
    .with_events(stream.clone());
    let runner = TaskRunner::new(config);
    let mut slow = stream.subscribe();
    let mut keeping_up = stream.subscribe();
    let counted = tokio::spawn(async move {
        let mut count = 0;
        while keeping_up.recv().await.is_ok() {
            count += 1;
        }
        count
    });
    runner.set_start_gate(true);
    spawn_run(&runner);
    h.until(&runner, "dead", dead).await;
    runner.kill(None).await;
    let missed = match slow.recv().await {
        Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => missed,
        other => panic!("the slow listener was not told it lagged: {other:?}"),
    };
    let mut rest = 0;
    while slow.try_recv().is_ok() {
        rest += 1;
    }
    assert_eq!(rest, 4, "it goes on with the buffered events");
    drop((stream, runner));
    let total = tokio::time::timeout(LIMIT, counted).await.unwrap().unwrap();
    assert_eq!(missed + rest, total, "lost and kept add up to every event");
}
