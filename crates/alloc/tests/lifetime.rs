//! How an allocation's life is bounded and wound down: the group's `max_run_duration`, and the
//! group's and tasks' `shutdown_delay`. On the mock driver and the in-memory store under
//! tokio's paused clock; times are read from event timestamps, in seconds after the start.

use std::sync::Arc;
use std::time::Duration;
use wharf_alloc::health::{ServiceCatalog, TcpTransport};
use wharf_alloc::{AllocRunner, AllocRunnerConfig, HealthConfig};
use wharf_driver::mock::MockDriver;
use wharf_state::{
    AllocState, Allocation, ClientStatus, TaskEventKind, TaskStatus, Timestamp, spec,
};
use wharf_store::MemoryStore;
use wharf_task::TokioClock;

const LIMIT: Duration = Duration::from_secs(24 * 3600);
const T0: u64 = 1_000_000;

struct Harness {
    alloc: Allocation,
    catalog: Arc<ServiceCatalog>,
    config: AllocRunnerConfig,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A job of `job_type` whose group has the settings `group` and then `tasks`.
    fn new(job_type: &str, group: &str, tasks: &[String]) -> Harness {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"{job_type}\"\n[group]\nname = \"g\"\n{group}\n{}",
            tasks.concat()
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        let alloc = Allocation::new("a1", job, "g");
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(ServiceCatalog::new());
        let health =
            HealthConfig { catalog: catalog.clone(), transport: Arc::new(TcpTransport::new()) };
        let config = AllocRunnerConfig::new(
            alloc.clone(),
            Arc::new(MemoryStore::new()),
            dir.path().join("a1"),
        )
        .with_driver(Arc::new(MockDriver::new()))
        .with_clock(Arc::new(TokioClock::starting_at(Timestamp(T0))))
        .with_health(health);
        Harness { alloc, catalog, config, _dir: dir }
    }

    fn start(&self) -> AllocRunner {
        let runner = AllocRunner::new(self.config.clone()).unwrap();
        let running = runner.clone();
        tokio::spawn(async move { running.run().await });
        runner
    }
}

fn task(name: &str, extra: &str) -> String {
    format!("[[group.task]]\nname = \"{name}\"\ndriver = \"mock\"\n{extra}\n")
}

async fn until(runner: &AllocRunner, what: &str, done: impl Fn(&AllocState) -> bool) {
    let mut watch = runner.subscribe();
    let wait = watch.wait_for(|state| done(state));
    match tokio::time::timeout(LIMIT, wait).await {
        Ok(Ok(_)) => {}
        _ => panic!("never {what}: {:#?}", runner.state()),
    }
}

async fn finished(runner: &AllocRunner) -> AllocState {
    tokio::time::timeout(LIMIT, runner.wait()).await.expect("the allocation finishes");
    runner.state()
}

/// When the task's first event of `title` happened, in seconds after the start.
fn at(state: &AllocState, task: &str, title: &str) -> Option<u64> {
    let events = &state.task_states[task].events;
    events.iter().find(|e| e.kind.title() == title).map(|e| (e.time.0 - T0) / 1000)
}

fn running(state: &AllocState, task: &str) -> bool {
    state.task_states[task].status == TaskStatus::Running
}

fn exceeded(limit: u64) -> TaskEventKind {
    TaskEventKind::MaxRunDurationExceeded { max_run_duration: Duration::from_secs(limit) }
}

fn kinds(state: &AllocState, task: &str) -> Vec<TaskEventKind> {
    state.task_states[task].events.iter().map(|e| e.kind.clone()).collect()
}

#[tokio::test(start_paused = true)]
async fn alloc_runner_max_run_duration_stops_expired_alloc() {
    let h = Harness::new("service", "max_run_duration = \"10s\"", &[task("web", "config = {}")]);
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(at(&state, "web", "Max Run Duration Exceeded"), Some(10));
    assert_eq!(at(&state, "web", "Killed"), Some(10));
    assert!(kinds(&state, "web").contains(&exceeded(10)));
    let event = state.task_states["web"].events.iter().find(|e| e.kind == exceeded(10)).unwrap();
    assert_eq!(event.kind.to_string(), "allocation exceeded max_run_duration of 10s");
    assert_eq!(state.client_status, ClientStatus::Complete);
}

#[tokio::test(start_paused = true)]
async fn alloc_runner_max_run_duration_skips_poststop_tasks() {
    let h = Harness::new(
        "batch",
        "max_run_duration = \"10s\"",
        &[
            task("work", "config = { run_for = \"1h\" }"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }"),
        ],
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(at(&state, "work", "Killed"), Some(10));
    assert_eq!(at(&state, "bye", "Started"), None, "the poststop task never runs");
    assert_eq!(state.task_states["bye"].status, TaskStatus::Dead);
    assert!(state.task_states["bye"].started_at.is_none());
}

#[tokio::test(start_paused = true)]
async fn alloc_runner_max_run_duration_update_extends_running_alloc() {
    let h = Harness::new("service", "max_run_duration = \"10s\"", &[task("web", "config = {}")]);
    let runner = h.start();
    until(&runner, "running", |s| running(s, "web")).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut update = h.alloc.clone();
    update.modify_index += 1;
    update.job.groups[0].max_run_duration = Some(Duration::from_secs(30));
    runner.update(update);
    let state = finished(&runner).await;
    assert_eq!(at(&state, "web", "Killed"), Some(30), "counted from the start, not the update");
    assert!(kinds(&state, "web").contains(&exceeded(30)));
}

#[tokio::test(start_paused = true)]
async fn an_update_can_remove_the_limit_and_a_finished_run_is_not_held_by_it() {
    let h = Harness::new("batch", "max_run_duration = \"10s\"", &[task("work", "config = {}")]);
    let runner = h.start();
    until(&runner, "running", |s| running(s, "work")).await;
    let mut update = h.alloc.clone();
    update.modify_index += 1;
    update.job.groups[0].max_run_duration = None;
    runner.update(update);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(running(&runner.state(), "work"), "no limit any more: {:#?}", runner.state());

    let h = Harness::new(
        "batch",
        "max_run_duration = \"1h\"",
        &[task("work", "config = { run_for = \"2s\" }")],
    );
    let runner = h.start();
    let started = tokio::time::Instant::now();
    let state = finished(&runner).await;
    assert_eq!(started.elapsed(), Duration::from_secs(2), "the run ends with its tasks");
    assert!(!kinds(&state, "work").contains(&exceeded(3600)));
    assert_eq!(state.client_status, ClientStatus::Complete);
}

/// The task's services, as a service block.
const SERVICE: &str = "[[group.task.service]]\nname = \"svc\"\n";

fn stop(h: &Harness, runner: &AllocRunner) {
    let mut update = h.alloc.clone();
    update.modify_index += 1;
    update.desired_status = wharf_state::DesiredStatus::Stop;
    runner.update(update);
}

fn listed(h: &Harness) -> Vec<String> {
    h.catalog.list().into_iter().map(|e| e.task).collect()
}

/// Nomad's `TestAllocRunner_TaskGroup_ShutdownDelay`: on a stop, the group's services leave
/// the catalog at once, and no task is sent its signal before the delay has passed.
#[tokio::test(start_paused = true)]
async fn alloc_runner_task_group_shutdown_delay() {
    let h = Harness::new(
        "service",
        "shutdown_delay = \"5s\"",
        &[
            task("follower1", &format!("config = {{}}\n{SERVICE}")),
            task("leader", &format!("leader = true\nconfig = {{}}\n{SERVICE}")),
        ],
    );
    let runner = h.start();
    until(&runner, "running", |s| running(s, "follower1") && running(s, "leader")).await;
    assert_eq!(listed(&h).len(), 2);
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop(&h, &runner);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(listed(&h), Vec::<String>::new(), "the services left at the stop");
    let state = runner.state();
    assert!(running(&state, "leader") && running(&state, "follower1"), "{state:#?}");
    assert_eq!(at(&state, "leader", "Killing"), None, "no signal during the delay");
    let state = finished(&runner).await;
    assert_eq!(at(&state, "leader", "Killing"), Some(15));
    assert!(at(&state, "follower1", "Killing") >= Some(15));
    assert!(at(&state, "follower1", "Killed") >= at(&state, "leader", "Killed"));
}

/// Nomad's `TestTaskRunner_ShutdownDelay`, on a whole runner so the catalog is real: the
/// task's service leaves the catalog, then its delay passes, then it is sent its signal.
#[tokio::test(start_paused = true)]
async fn task_runner_shutdown_delay() {
    let h = Harness::new(
        "service",
        "",
        &[task("web", &format!("shutdown_delay = \"3s\"\nconfig = {{}}\n{SERVICE}"))],
    );
    let runner = h.start();
    until(&runner, "running", |s| running(s, "web")).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop(&h, &runner);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(listed(&h).is_empty(), "the service left before the delay");
    assert!(running(&runner.state(), "web"));
    let state = finished(&runner).await;
    assert_eq!(at(&state, "web", "Waiting for shutdown delay"), Some(10));
    assert_eq!(at(&state, "web", "Killing"), Some(13));
    let waiting = kinds(&state, "web")
        .into_iter()
        .find(|k| matches!(k, TaskEventKind::WaitingShutdownDelay { .. }))
        .unwrap();
    assert_eq!(waiting.to_string(), "Waiting for shutdown_delay of 3s before killing the task");
}

/// A restart waits out the task's delay too, with its service out of the catalog meanwhile,
/// and puts the service back once the task runs again.
#[tokio::test(start_paused = true)]
async fn task_runner_shutdown_delay_applies_to_restarts() {
    let h = Harness::new(
        "service",
        "",
        &[task("web", &format!("shutdown_delay = \"4s\"\nconfig = {{}}\n{SERVICE}"))],
    );
    let runner = h.start();
    until(&runner, "running", |s| running(s, "web")).await;
    let restarting = runner.clone();
    tokio::spawn(async move { restarting.restart_task("web", "test").await.unwrap() });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(listed(&h).is_empty(), "out of the catalog during the delay");
    until(&runner, "restarted", |s| s.task_states["web"].restarts == 1 && running(s, "web")).await;
    let state = runner.state();
    assert_eq!(at(&state, "web", "Waiting for shutdown delay"), Some(0));
    assert_eq!(at(&state, "web", "Killing"), Some(4));
    assert_eq!(listed(&h), ["web"], "back in the catalog once it runs again");
}

/// No delay is waited when nothing runs any more: a group whose tasks have all ended is not
/// held back by its shutdown delay.
#[tokio::test(start_paused = true)]
async fn a_group_shutdown_delay_does_not_hold_a_finished_allocation() {
    let h = Harness::new(
        "batch",
        "shutdown_delay = \"30s\"",
        &[task("work", "config = { run_for = \"2s\" }")],
    );
    let runner = h.start();
    let started = tokio::time::Instant::now();
    let state = finished(&runner).await;
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(state.client_status, ClientStatus::Complete);
}
