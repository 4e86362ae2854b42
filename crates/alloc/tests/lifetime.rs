//! How an allocation's life is bounded and wound down: the group's `max_run_duration`, and the
//! group's and tasks' `shutdown_delay`. On the mock driver and the in-memory store under
//! tokio's paused clock; times are read from event timestamps, in seconds after the start.

use std::sync::Arc;
use std::time::Duration;
use wharf_alloc::{AllocRunner, AllocRunnerConfig};
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
        let config = AllocRunnerConfig::new(
            alloc.clone(),
            Arc::new(MemoryStore::new()),
            dir.path().join("a1"),
        )
        .with_driver(Arc::new(MockDriver::new()))
        .with_clock(Arc::new(TokioClock::starting_at(Timestamp(T0))));
        Harness { alloc, config, _dir: dir }
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
