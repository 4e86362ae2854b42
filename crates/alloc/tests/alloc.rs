//! The alloc runner's behaviour, on the mock driver and the in-memory store under tokio's
//! paused clock. Timings are virtual and exact; order is read from event timestamps.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use wharf_alloc::{
    AllocError, AllocHook, AllocHookContext, AllocRunner, AllocRunnerConfig, SpareDirs,
};
use wharf_driver::mock::MockDriver;
use wharf_state::{
    AllocState, Allocation, ClientStatus, DesiredStatus, Signal, TaskEventKind, TaskState,
    TaskStatus, Timestamp, spec,
};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::TokioClock;

const LIMIT: Duration = Duration::from_secs(24 * 3600);
const T0: u64 = 1_000_000;

/// Records which hooks ran, in order, with the modify index they saw.
#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    called: tokio::sync::Notify,
    fail_prerun: bool,
}

impl Recorder {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }
    fn record(&self, what: &str, ctx: &AllocHookContext<'_>) {
        self.calls.lock().push(format!("{what}:{}", ctx.alloc.modify_index));
        self.called.notify_one();
    }
    /// Waits until a hook call `call` has been recorded.
    async fn seen(&self, call: &str) {
        let wait = async {
            while !self.calls().iter().any(|c| c == call) {
                self.called.notified().await;
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .unwrap_or_else(|_| panic!("never saw {call}: {:?}", self.calls()));
    }
}

#[async_trait::async_trait]
impl AllocHook for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn prerun(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        self.record("prerun", &ctx);
        if self.fail_prerun {
            return Err(AllocError::Hook {
                hook: "recorder".into(),
                reason: "network unavailable".into(),
            });
        }
        Ok(())
    }
    async fn postrun(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        self.record("postrun", &ctx);
        Ok(())
    }
    async fn update(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        self.record("update", &ctx);
        Ok(())
    }
    async fn destroy(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        self.record("destroy", &ctx);
        Ok(())
    }
    async fn shutdown(&self, ctx: AllocHookContext<'_>) {
        self.record("shutdown", &ctx);
    }
    async fn prekill(&self, ctx: AllocHookContext<'_>) {
        self.record("prekill", &ctx);
    }
}

struct Harness {
    driver: MockDriver,
    store: MemoryStore,
    recorder: Arc<Recorder>,
    alloc: Allocation,
    dir: tempfile::TempDir,
}

impl Harness {
    /// A job of `job_type` whose group has `tasks` (TOML `[[group.task]]` blocks).
    fn new(job_type: &str, tasks: &str) -> Harness {
        Harness::with_recorder(job_type, tasks, Recorder::default())
    }

    fn with_recorder(job_type: &str, tasks: &str, recorder: Recorder) -> Harness {
        let doc =
            format!("[job]\nid = \"j\"\ntype = \"{job_type}\"\n[group]\nname = \"g\"\n{tasks}");
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        Harness {
            driver: MockDriver::new(),
            store: MemoryStore::new(),
            recorder: Arc::new(recorder),
            alloc: Allocation {
                id: "a1".into(),
                job,
                task_group: "g".into(),
                desired_status: DesiredStatus::Run,
                modify_index: 1,
                deployment_id: None,
                ports: Vec::new(),
            },
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self, alloc: Allocation) -> AllocRunnerConfig {
        AllocRunnerConfig::new(alloc, Arc::new(self.store.clone()), self.dir.path().join("a1"))
            .with_driver(Arc::new(self.driver.clone()))
            .with_clock(Arc::new(TokioClock::starting_at(Timestamp(T0))))
            .with_hook(self.recorder.clone())
            .with_poststop_timeout(Duration::from_secs(60))
    }

    fn runner(&self) -> AllocRunner {
        AllocRunner::new(self.config(self.alloc.clone())).unwrap()
    }

    fn start(&self) -> AllocRunner {
        let runner = self.runner();
        spawn_run(&runner);
        runner
    }
}

fn spawn_run(runner: &AllocRunner) {
    let runner = runner.clone();
    tokio::spawn(async move { runner.run().await });
}

fn task(name: &str, extra: &str) -> String {
    format!("[[group.task]]\nname = \"{name}\"\ndriver = \"mock\"\n{extra}\n")
}

async fn until(runner: &AllocRunner, what: &str, done: impl Fn(&AllocState) -> bool) -> AllocState {
    let mut watch = runner.subscribe();
    let wait = async {
        loop {
            let state = watch.borrow_and_update().clone();
            if done(&state) {
                return state;
            }
            if watch.changed().await.is_err() {
                panic!("the runner is gone and never {what}: {:#?}", runner.state());
            }
        }
    };
    tokio::time::timeout(LIMIT, wait)
        .await
        .unwrap_or_else(|_| panic!("never {what}: {:#?}", runner.state()))
}

fn status(state: &AllocState, task: &str) -> TaskStatus {
    state.task_states[task].status
}

/// When the task's first event of `title` happened, in seconds after the start.
fn at(state: &AllocState, task: &str, title: &str) -> Option<u64> {
    first(&state.task_states[task], title).map(|t| (t.0 - T0) / 1000)
}

fn first(state: &TaskState, title: &str) -> Option<Timestamp> {
    state.events.iter().find(|e| e.kind.title() == title).map(|e| e.time)
}

fn kinds(state: &AllocState, task: &str) -> Vec<TaskEventKind> {
    state.task_states[task].events.iter().map(|e| e.kind.clone()).collect()
}

async fn finished(runner: &AllocRunner) -> AllocState {
    tokio::time::timeout(LIMIT, runner.wait()).await.expect("the allocation finishes");
    runner.state()
}

#[tokio::test(start_paused = true)]
async fn construction_checks_the_group_and_the_drivers() {
    let h = Harness::new("batch", &task("web", ""));
    let mut alloc = h.alloc.clone();
    alloc.task_group = "db".into();
    let err = AllocRunner::new(h.config(alloc)).unwrap_err();
    assert!(err.to_string().contains("task group \"db\""), "{err}");

    let h = Harness::new("batch", "[[group.task]]\nname = \"web\"\ndriver = \"docker\"\n");
    let err = AllocRunner::new(h.config(h.alloc.clone())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "task web uses driver \"docker\", which this node does not have (it has: mock)"
    );
    assert_eq!(h.driver.start_count("a1", "web"), 0, "nothing runs at construction");
}

#[tokio::test(start_paused = true)]
async fn a_batch_allocation_completes_and_runs_its_hooks() {
    let h = Harness::new("batch", &task("web", "config = { run_for = \"5s\" }"));
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(
        (state.client_status, state.client_description.as_str()),
        (ClientStatus::Complete, "All tasks have completed")
    );
    assert_eq!(state.task_states["web"].finished_at, Some(Timestamp(T0 + 5000)));
    assert_eq!(h.recorder.calls(), ["prerun:1", "prekill:1", "postrun:1"]);
    assert!(h.dir.path().join("a1/alloc/data").is_dir(), "the alloc dir hook built the shared dir");
    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(stored.alloc, h.alloc);
    assert_eq!(stored.tasks["web"].state.as_ref(), Some(&state.task_states["web"]));
}

#[tokio::test(start_paused = true)]
async fn spare_directories_become_the_allocation_and_task_directories() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task("web", "config = { run_for = \"1s\" }"),
            task("db", "config = { run_for = \"1s\" }")
        ),
    );
    let spare_root = h.dir.path().join("spare");
    let spares = Arc::new(SpareDirs::open(&spare_root, 2).unwrap());
    assert!(spares.wait_full(Duration::from_secs(10)), "never filled: {:?}", spares.ready());
    let inodes = |prefix: &str| -> Vec<u64> {
        std::fs::read_dir(&spare_root)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.metadata().unwrap().ino())
            .collect()
    };
    let (alloc_shells, task_shells) = (inodes("alloc-"), inodes("task-"));
    let runner =
        AllocRunner::new(h.config(h.alloc.clone()).with_spare_dirs(spares.clone())).unwrap();
    spawn_run(&runner);
    let state = finished(&runner).await;
    assert_eq!(state.client_status, ClientStatus::Complete, "{state:#?}");

    let root = h.dir.path().join("a1");
    let ino = |path: &std::path::Path| std::fs::metadata(path).unwrap().ino();
    assert!(alloc_shells.contains(&ino(&root)), "the allocation's directory is a shell");
    for name in ["web", "db"] {
        let dir = root.join(name);
        assert!(task_shells.contains(&ino(&dir)), "{name}'s directory is a shell");
        let secrets = std::fs::metadata(dir.join("secrets")).unwrap().permissions().mode();
        assert_eq!(secrets & 0o777, 0o700);
        assert!(dir.join("local").is_dir() && dir.join("logs").is_dir());
    }
    assert!(root.join("alloc/data").is_dir() && root.join("alloc/tmp").is_dir());
}

#[tokio::test(start_paused = true)]
async fn client_status_follows_the_tasks() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("a", "config = { run_for = \"10s\" }"),
            task("b", "config = { start_block_for = \"3s\" }")
        ),
    );
    let runner = h.start();
    let running = until(&runner, "running", |s| s.client_status == ClientStatus::Running).await;
    assert_eq!(running.client_description, "Tasks are running");
    let state = until(&runner, "a restarting", |s| s.task_states["a"].restarts == 1).await;
    assert_eq!(state.client_status, ClientStatus::Running);
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn prestart_tasks_finish_before_main_tasks_start() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task("init", "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"5s\" }"),
            task("main", "config = { run_for = \"2s\" }")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(at(&state, "init", "Terminated"), Some(5));
    assert_eq!(at(&state, "main", "Started"), Some(5), "main started the moment init succeeded");
    assert_eq!(state.client_status, ClientStatus::Complete);
}

#[tokio::test(start_paused = true)]
async fn main_tasks_wait_for_prestart_sidecars_to_run_and_sidecars_die_with_them() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task(
                "proxy",
                "lifecycle = { hook = \"prestart\", sidecar = true }\nconfig = { start_block_for = \"3s\" }"
            ),
            task("main", "config = { run_for = \"4s\" }")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(at(&state, "proxy", "Started"), Some(3));
    assert_eq!(at(&state, "main", "Started"), Some(3));
    assert!(
        kinds(&state, "proxy").contains(&TaskEventKind::MainTasksDead),
        "{:?}",
        kinds(&state, "proxy")
    );
    assert_eq!(at(&state, "proxy", "Killed"), Some(7));
    assert_eq!(
        state.client_status,
        ClientStatus::Complete,
        "a killed sidecar does not fail the allocation"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_prestart_task_fails_the_allocation_and_main_never_starts() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task(
                "init",
                "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"1s\", exit_code = 2 }\nrestart = { attempts = 0 }"
            ),
            task("main", "config = { run_for = \"1s\" }")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(h.driver.start_count("a1", "main"), 0);
    assert!(kinds(&state, "main").contains(&TaskEventKind::SiblingFailed { task: "init".into() }));
    assert_eq!(status(&state, "main"), TaskStatus::Dead);
}

#[tokio::test(start_paused = true)]
async fn poststart_tasks_start_once_main_tasks_run() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task("main", "config = { run_for = \"10s\", start_block_for = \"2s\" }"),
            task("warm", "lifecycle = { hook = \"poststart\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(at(&state, "main", "Started"), Some(2));
    assert_eq!(at(&state, "warm", "Started"), Some(2));
    assert_eq!(state.client_status, ClientStatus::Complete);
}

#[tokio::test(start_paused = true)]
async fn poststop_tasks_run_only_after_every_other_task_is_dead_even_on_failure() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}{}",
            task(
                "main",
                "config = { run_for = \"4s\", exit_code = 1 }\nrestart = { attempts = 0 }"
            ),
            task(
                "side",
                "lifecycle = { hook = \"poststart\", sidecar = true }\nkill_timeout = \"3s\"\nconfig = { kill_after = \"1m\" }"
            ),
            task("cleanup", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(
        at(&state, "side", "Killed"),
        Some(7),
        "killed at its 3s timeout after main failed at 4s"
    );
    assert_eq!(at(&state, "cleanup", "Started"), Some(7));
    assert!(state.task_states["cleanup"].successful());
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        !kinds(&state, "cleanup").iter().any(|k| matches!(
            k,
            TaskEventKind::SiblingFailed { .. } | TaskEventKind::Killing { .. }
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_task_kills_its_siblings_naming_it() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("db", "config = { run_for = \"3s\", exit_code = 1 }\nrestart = { attempts = 0 }"),
            task("web", "config = {}")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    let web = kinds(&state, "web");
    assert!(web.contains(&TaskEventKind::SiblingFailed { task: "db".into() }), "{web:?}");
    assert!(!state.task_states["web"].failed, "the killed sibling itself did not fail");
    assert_eq!(at(&state, "web", "Killed"), Some(3));
}

#[tokio::test(start_paused = true)]
async fn a_dead_leader_kills_the_others() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task("leader", "leader = true\nconfig = { run_for = \"2s\" }"),
            task("helper", "config = {}")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert!(kinds(&state, "helper").contains(&TaskEventKind::LeaderDead));
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(at(&state, "helper", "Killed"), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_failed_leader_is_reported_as_a_failed_sibling() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}",
            task(
                "leader",
                "leader = true\nconfig = { run_for = \"2s\", exit_code = 3 }\nrestart = { attempts = 0 }"
            ),
            task("helper", "config = {}")
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert!(
        kinds(&state, "helper").contains(&TaskEventKind::SiblingFailed { task: "leader".into() })
    );
    assert_eq!(state.client_status, ClientStatus::Failed);
}

#[tokio::test(start_paused = true)]
async fn kill_order_is_leader_then_main_tasks_then_sidecars() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}{}{}",
            task("leader", "leader = true\nconfig = { kill_after = \"3s\" }"),
            task("a", "config = { kill_after = \"2s\" }"),
            task("b", "config = { kill_after = \"1s\" }"),
            task(
                "side",
                "lifecycle = { hook = \"prestart\", sidecar = true }\nconfig = { kill_after = \"1s\" }"
            )
        ),
    );
    let runner = h.start();
    until(&runner, "all running", |s| {
        s.task_states.values().all(|t| t.status == TaskStatus::Running)
    })
    .await;
    let stop = h.alloc.clone();
    runner.update(Allocation { desired_status: DesiredStatus::Stop, modify_index: 2, ..stop });
    let state = finished(&runner).await;
    let killing = |t: &str| at(&state, t, "Killing").unwrap();
    let killed = |t: &str| at(&state, t, "Killed").unwrap();
    assert_eq!((killing("leader"), killed("leader")), (0, 3), "the leader alone first");
    assert_eq!((killing("a"), killing("b")), (3, 3), "then the other main tasks together");
    assert_eq!((killed("a"), killed("b")), (5, 4));
    assert_eq!((killing("side"), killed("side")), (5, 6), "sidecars last");
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(
        h.recorder.calls().iter().filter(|c| c.starts_with("prekill")).count(),
        2,
        "before the kill, and once all are dead"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_update_kills_the_tasks_and_poststop_still_runs() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("web", "config = {}"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    runner.update(Allocation {
        desired_status: DesiredStatus::Stop,
        modify_index: 2,
        ..h.alloc.clone()
    });
    let state = finished(&runner).await;
    assert_eq!(at(&state, "web", "Killed"), Some(10));
    assert_eq!(at(&state, "bye", "Started"), Some(10));
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert!(
        !h.recorder.calls().contains(&"update:2".to_owned()),
        "update hooks skip terminal updates"
    );
    assert_eq!(
        h.store.load_alloc("a1").await.unwrap().unwrap().alloc.desired_status,
        DesiredStatus::Stop,
        "the update is persisted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_newer_queued_update_replaces_an_older_one_and_stale_ones_are_dropped() {
    let h = Harness::new("service", &task("web", "config = {}"));
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    // Queued back to back, before the handler runs: only the newest is applied.
    for index in [2, 3] {
        runner.update(Allocation { modify_index: index, ..h.alloc.clone() });
    }
    runner.update(Allocation { modify_index: 1, ..h.alloc.clone() });
    h.recorder.seen("update:3").await;
    // Older than the one applied: dropped at once.
    runner.update(Allocation { modify_index: 2, ..h.alloc.clone() });
    runner.update(Allocation { modify_index: 4, ..h.alloc.clone() });
    h.recorder.seen("update:4").await;
    assert_eq!(
        h.recorder.calls().iter().filter(|c| c.starts_with("update")).cloned().collect::<Vec<_>>(),
        ["update:3", "update:4"]
    );
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn any_number_of_watchers_see_the_latest_state() {
    let h = Harness::new("batch", &task("web", "config = { run_for = \"5s\" }"));
    let runner = h.runner();
    let watchers: Vec<_> = (0..3).map(|_| runner.subscribe()).collect();
    spawn_run(&runner);
    let states = futures_like_join(watchers.into_iter().map(|mut w| async move {
        let _ = w.wait_for(|s| s.client_status == ClientStatus::Complete).await;
        w.borrow().clone()
    }))
    .await;
    assert!(states.iter().all(|s| s.client_status == ClientStatus::Complete));
    assert!(states.windows(2).all(|w| w[0] == w[1]));
}

async fn futures_like_join<
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
>(
    futures: impl Iterator<Item = F>,
) -> Vec<T> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn destroy_kills_waits_runs_hooks_and_deletes_everything_once() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("web", "config = { kill_after = \"2s\" }"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    let started = Instant::now();
    let (a, b) = tokio::join!(runner.destroy(), runner.destroy());
    let _ = (a, b);
    assert_eq!(started.elapsed(), Duration::from_secs(3), "2s to kill web, 1s of poststop");
    assert!(runner.is_destroyed() && runner.is_done());
    assert!(h.store.load_all().await.unwrap().allocs.is_empty());
    assert!(h.store.load_all().await.unwrap().problems.is_empty(), "no task record left behind");
    assert!(!h.dir.path().join("a1").exists(), "the alloc dir is gone");
    assert!(h.recorder.calls().contains(&"destroy:1".to_owned()));
    assert!(h.recorder.calls().contains(&"postrun:1".to_owned()));
    assert!(h.driver.running().is_empty());
}

#[tokio::test(start_paused = true)]
async fn destroy_before_run_starts_nothing_and_a_late_run_does_nothing() {
    let h = Harness::new("service", &task("web", "config = {}"));
    let runner = h.runner();
    runner.destroy().await;
    runner.run().await;
    assert_eq!(h.driver.start_count("a1", "web"), 0);
    assert!(
        h.store.load_all().await.unwrap().allocs.is_empty(),
        "a late run does not bring the records back"
    );
}

#[tokio::test(start_paused = true)]
async fn destroy_bounds_poststop_tasks() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("web", "config = {}"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = {}")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    let started = Instant::now();
    runner.destroy().await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(60),
        "the poststop task was killed at the bound"
    );
    assert!(runner.is_destroyed());
    assert!(h.driver.running().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_driver_that_hangs_on_stop_cannot_hang_destroy() {
    let h = Harness::new("service", &task("web", "config = { stop_hangs = true }"));
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    let started = Instant::now();
    runner.destroy().await;
    assert_eq!(started.elapsed(), Duration::from_secs(5) + wharf_task::STOP_GRACE);
    let state = runner.state();
    assert!(
        kinds(&state, "web").iter().any(|k| matches!(k, TaskEventKind::Killed { error: Some(_) }))
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_leaves_tasks_running_and_is_idempotent() {
    let h = Harness::new("service", &task("web", "config = {}"));
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    tokio::join!(runner.shutdown(), runner.shutdown());
    assert!(runner.is_done());
    assert_eq!(h.driver.running().len(), 1);
    let calls = h.recorder.calls();
    assert!(calls.contains(&"shutdown:1".to_owned()));
    assert!(!calls.iter().any(|c| c.starts_with("postrun")), "no postrun while shutting down");
    assert!(h.store.load_alloc("a1").await.unwrap().is_some(), "records stay for restore");
}

#[tokio::test(start_paused = true)]
async fn destroy_after_shutdown_and_shutdown_after_destroy_both_end() {
    let h = Harness::new("service", &task("web", "config = { run_for = \"1s\" }"));
    let runner = h.start();
    finished_or_running(&runner).await;
    runner.shutdown().await;
    runner.destroy().await;
    assert!(runner.is_destroyed());
    assert!(h.store.load_alloc("a1").await.unwrap().is_none());

    let h = Harness::new("service", &task("web", "config = {}"));
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    runner.destroy().await;
    runner.shutdown().await;
    assert!(
        !h.recorder.calls().iter().any(|c| c.starts_with("shutdown")),
        "destroy is a superset of shutdown"
    );
}

async fn finished_or_running(runner: &AllocRunner) {
    until(runner, "started", |s| s.client_status != ClientStatus::Pending).await;
}

#[tokio::test(start_paused = true)]
async fn restore_reattaches_and_keeps_the_deployment_status() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("init", "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"1s\" }"),
            task("web", "config = {}")
        ),
    );
    let mut alloc = h.alloc.clone();
    alloc.deployment_id = Some("d1".into());
    let first = AllocRunner::new(h.config(alloc.clone())).unwrap();
    spawn_run(&first);
    until(&first, "running", |s| status(s, "web") == TaskStatus::Running).await;
    first.set_health(true).await;
    first.shutdown().await;

    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(stored.deployment_status.as_ref().and_then(|d| d.healthy), Some(true));
    let second = AllocRunner::new(h.config(stored.alloc.clone())).unwrap();
    second.restore(&stored).await.unwrap();
    spawn_run(&second);
    let state = until(&second, "reattached", |s| {
        s.task_states["web"].events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    assert_eq!(h.driver.start_count("a1", "web"), 1, "not started again");
    assert_eq!(
        h.driver.start_count("a1", "init"),
        1,
        "the finished prestart task does not run again"
    );
    assert_eq!(state.deployment_status.and_then(|d| d.healthy), Some(true));
    assert_eq!(state.client_status, ClientStatus::Running);
    second.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_allocation_in_a_deployment_is_marked_unhealthy() {
    let h = Harness::new(
        "batch",
        &task("web", "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 0 }"),
    );
    let mut alloc = h.alloc.clone();
    alloc.deployment_id = Some("d1".into());
    let runner = AllocRunner::new(h.config(alloc)).unwrap();
    spawn_run(&runner);
    let state = finished(&runner).await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(state.deployment_status.as_ref().unwrap().healthy, Some(false));
    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(stored.deployment_status.unwrap().healthy, Some(false), "persisted");
}

#[tokio::test(start_paused = true)]
async fn prerun_failure_fails_every_task_and_skips_to_postrun() {
    let h = Harness::with_recorder(
        "service",
        &format!("{}{}", task("a", ""), task("b", "")),
        Recorder { fail_prerun: true, ..Default::default() },
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    for name in ["a", "b"] {
        let task = &state.task_states[name];
        assert!(task.failed && task.status == TaskStatus::Dead);
        assert!(
            matches!(&task.events.back().unwrap().kind, TaskEventKind::SetupFailure { error } if error.contains("network unavailable"))
        );
        assert_eq!(h.driver.start_count("a1", name), 0);
    }
    assert_eq!(h.recorder.calls().last().unwrap(), "postrun:1");
}

#[tokio::test(start_paused = true)]
async fn a_terminal_allocation_skips_prerun_and_starts_nothing() {
    let h = Harness::new("service", &task("web", ""));
    let stopped = Allocation { desired_status: DesiredStatus::Stop, ..h.alloc.clone() };
    let runner = AllocRunner::new(h.config(stopped)).unwrap();
    runner.run().await;
    assert_eq!(h.driver.start_count("a1", "web"), 0);
    let calls = h.recorder.calls();
    assert!(!calls.iter().any(|c| c.starts_with("prerun")), "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("postrun")));
}

#[tokio::test(start_paused = true)]
async fn restart_one_task() {
    let h = Harness::new(
        "service",
        &format!("{}{}", task("web", "config = {}"), task("db", "config = {}")),
    );
    let runner = h.start();
    until(&runner, "running", |s| {
        s.client_status == ClientStatus::Running && status(s, "db") == TaskStatus::Running
    })
    .await;
    runner.restart_task("web", "new config").await.unwrap();
    until(&runner, "web restarted", |s| {
        s.task_states["web"].restarts == 1 && status(s, "web") == TaskStatus::Running
    })
    .await;
    assert_eq!((h.driver.start_count("a1", "web"), h.driver.start_count("a1", "db")), (2, 1));
    let err = runner.restart_task("cache", "x").await.unwrap_err();
    assert_eq!(err.to_string(), "allocation a1 has no task \"cache\"");
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn restart_running_leaves_dead_tasks_alone() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("init", "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"1s\" }"),
            task("web", "config = {}")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    runner.restart_running("rotate").await.unwrap();
    until(&runner, "web restarted", |s| {
        s.task_states["web"].restarts == 1 && status(s, "web") == TaskStatus::Running
    })
    .await;
    assert_eq!(h.driver.start_count("a1", "init"), 1);
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn restart_all_runs_prestart_again_before_main() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("init", "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"2s\" }"),
            task("web", "config = {}")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    runner.restart_all("operator").await.unwrap();
    until(&runner, "both ran twice", |_| {
        h.driver.start_count("a1", "web") == 2 && h.driver.start_count("a1", "init") == 2
    })
    .await;
    let state = until(&runner, "web running", |s| status(s, "web") == TaskStatus::Running).await;
    let web_second_start = state.task_states["web"]
        .events
        .iter()
        .rfind(|e| e.kind == TaskEventKind::Started)
        .unwrap()
        .time;
    // web first started at 2s, after init; the restart came 10s later, at 12s; web then
    // waited for init's second 2s run.
    assert_eq!(at(&state, "init", "Restart Signaled"), Some(12));
    assert_eq!(web_second_start, Timestamp(T0 + 14_000));
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn signals_go_to_one_task_or_all_with_every_failure_reported() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}{}",
            task("a", "config = {}"),
            task("b", "config = { signal_error = \"not allowed\" }"),
            task("c", "config = {}")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| s.task_states.values().all(|t| t.status == TaskStatus::Running))
        .await;
    runner.signal(Some("a"), Signal::Hup).await.unwrap();
    let err = runner.signal(None, Signal::Usr1).await.unwrap_err();
    match &err {
        AllocError::Tasks(failures) => {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].0, "b");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("b: task b: not allowed"), "{err}");
    let sent: Vec<Signal> = h.driver.signals_sent().iter().map(|(_, s)| *s).collect();
    assert_eq!(sent, [Signal::Hup, Signal::Usr1, Signal::Usr1]);
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn exec_capabilities_and_usage() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("a", "config = { exec_stdout = \"hi\", memory_bytes = 100 }"),
            task("b", "config = { memory_bytes = 50 }")
        ),
    );
    let runner = h.start();
    until(&runner, "running", |s| s.task_states.values().all(|t| t.status == TaskStatus::Running))
        .await;
    let out = runner.exec("a", &["echo".into()], Duration::from_secs(1)).await.unwrap();
    assert_eq!(out.stdout, b"hi");
    assert!(runner.capabilities("a").unwrap().exec);
    assert!(matches!(
        runner.exec("zz", &[], Duration::from_secs(1)).await,
        Err(AllocError::UnknownTask { .. })
    ));
    let usage = runner.usage().await;
    assert_eq!(
        (usage.total.memory_rss_bytes, usage.total.processes, usage.tasks.len()),
        (150, 2, 2)
    );
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_status_can_be_forced() {
    let h = Harness::new("service", &task("web", "config = {}"));
    let runner = h.start();
    until(&runner, "running", |s| s.client_status == ClientStatus::Running).await;
    runner.set_client_status(ClientStatus::Lost, "node lost contact");
    let state = runner.state();
    assert_eq!(
        (state.client_status, state.client_description.as_str()),
        (ClientStatus::Lost, "node lost contact")
    );
    assert!(state.task_states["web"].finished_at.is_some(), "terminal: finish times filled in");
    runner.destroy().await;
}

#[tokio::test(start_paused = true)]
async fn a_task_restarting_until_it_fails_settles_the_allocation() {
    // A task that restarts quickly makes bursts of events; the allocation still settles.
    let h = Harness::new(
        "batch",
        &task(
            "web",
            "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 3, delay = \"1s\", interval = \"1h\" }",
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(state.task_states["web"].restarts, 3);
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(h.driver.start_count("a1", "web"), 4);
}

/// A store that counts the allocation records written through it.
#[derive(Debug, Clone, Default)]
struct CountingStore {
    inner: MemoryStore,
    alloc_writes: Arc<std::sync::atomic::AtomicU64>,
}

impl CountingStore {
    fn alloc_writes(&self) -> u64 {
        self.alloc_writes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl StateStore for CountingStore {
    async fn write(&self, batch: wharf_store::WriteBatch) -> Result<(), wharf_store::StoreError> {
        self.inner.write(batch).await
    }
    async fn load_alloc(
        &self,
        alloc_id: &str,
    ) -> Result<Option<wharf_store::StoredAlloc>, wharf_store::StoreError> {
        self.inner.load_alloc(alloc_id).await
    }
    async fn load_all(&self) -> Result<wharf_store::Snapshot, wharf_store::StoreError> {
        self.inner.load_all().await
    }
    async fn put_allocation(&self, alloc: &Allocation) -> Result<(), wharf_store::StoreError> {
        self.alloc_writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.put_allocation(alloc).await
    }
}

#[tokio::test(start_paused = true)]
async fn an_allocation_its_caller_persisted_is_not_written_again_at_start() {
    let h = Harness::new("service", &task("web", "config = { run_for = \"1h\" }"));
    let store = CountingStore::default();
    let mut config = h.config(h.alloc.clone());
    config.store = Arc::new(store.clone());
    let runner = AllocRunner::new(config).unwrap();
    runner.persist().await.unwrap();
    assert_eq!(store.alloc_writes(), 1);
    runner.persist().await.unwrap();
    assert_eq!(store.alloc_writes(), 1, "the same version is not written twice");
    spawn_run(&runner);
    until(&runner, "web runs", |s| status(s, "web") == TaskStatus::Running).await;
    assert_eq!(store.alloc_writes(), 1, "the start did not write the record again");
    // A new version (a stop) is written.
    let mut stop = h.alloc.clone();
    stop.desired_status = DesiredStatus::Stop;
    stop.modify_index = 2;
    runner.update(stop);
    finished(&runner).await;
    assert_eq!(store.alloc_writes(), 2);
    let stored = store.load_all().await.unwrap();
    assert_eq!(stored.allocs[0].alloc.modify_index, 2);
}

/// The stored allocation, as a restarted agent would load it.
async fn stored(h: &Harness) -> wharf_store::StoredAlloc {
    h.store.load_alloc("a1").await.unwrap().expect("the allocation is stored")
}

/// A second runner for the stored allocation, restored, as a restarted agent builds it.
async fn restored(h: &Harness) -> (AllocRunner, Result<(), AllocError>) {
    let stored = stored(h).await;
    let runner = AllocRunner::new(h.config(stored.alloc.clone())).unwrap();
    let result = runner.restore(&stored).await;
    (runner, result)
}

/// Nomad's `TestAllocRunner_Restore_RunningTerminal`: the agent persisted a stop and died
/// before acting on it. The restored allocation's running task is killed in the usual order,
/// its poststop task runs, the run ends, and the allocation can be collected.
#[tokio::test(start_paused = true)]
async fn restore_running_terminal() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}{}",
            task("leader", "leader = true\nconfig = { run_for = \"1h\", kill_after = \"2s\" }"),
            task("web", "config = { run_for = \"1h\" }"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let first = h.start();
    until(&first, "running", |s| status(s, "web") == TaskStatus::Running).await;
    first.shutdown().await;
    assert_eq!(h.driver.running().len(), 2, "shutdown leaves the tasks running");
    let mut stopped = stored(&h).await.alloc;
    stopped.desired_status = DesiredStatus::Stop;
    stopped.modify_index += 1;
    h.store.put_allocation(&stopped).await.unwrap();

    let (second, restore) = restored(&h).await;
    restore.unwrap();
    let began = Instant::now();
    spawn_run(&second);
    let state = finished(&second).await;
    assert!(h.driver.running().is_empty(), "nothing of the stopped allocation runs on");
    assert_eq!(h.driver.start_count("a1", "web"), 1, "reattached, never started again");
    let killed = |t: &str| at(&state, t, "Killed").unwrap();
    assert!(killed("leader") <= killed("web"), "the usual kill order: the leader first");
    assert_eq!(began.elapsed(), Duration::from_secs(3), "2s to kill the leader, 1s of poststop");
    for name in ["leader", "web"] {
        let titles: Vec<_> = kinds(&state, name).iter().map(|k| k.title()).collect();
        assert_eq!(titles[titles.len() - 3..], ["Killing", "Terminated", "Killed"], "{name}");
    }
    assert_eq!(status(&state, "bye"), TaskStatus::Dead);
    assert!(at(&state, "bye", "Started").is_some(), "poststop ran");
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(second.lifecycle(), wharf_alloc::AllocRunnerState::Dead);
    second.destroy().await;
    assert!(h.store.load_all().await.unwrap().allocs.is_empty(), "collected");
}

/// A stopped allocation that never started anything starts nothing, not even its poststop
/// task: there is nothing to clean up after.
#[tokio::test(start_paused = true)]
async fn a_stopped_allocation_that_never_ran_starts_no_poststop_task() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("web", "config = {}"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let stopped = Allocation { desired_status: DesiredStatus::Stop, ..h.alloc.clone() };
    let runner = AllocRunner::new(h.config(stopped)).unwrap();
    runner.run().await;
    assert_eq!(h.driver.start_count("a1", "web") + h.driver.start_count("a1", "bye"), 0);
}

/// Nomad's `TestAllocRunner_Restore_CompletedBatch`, and an allocation-wide restart right
/// after restoring it: the completed batch allocation does not run again, its events are
/// unchanged, and the restart is refused with the allocation still complete. (Nomad's runner
/// keeps waiting for a restart it would refuse; wharf's run of a completed allocation ends.)
#[tokio::test(start_paused = true)]
async fn restore_completed_batch() {
    let h = Harness::new("batch", &task("web", "config = { run_for = \"2ms\" }"));
    let first = h.start();
    let done = finished(&first).await;
    assert_eq!(done.client_status, ClientStatus::Complete);
    assert!(matches!(first.restart_all("again").await, Err(AllocError::NotRestartable { .. })));
    first.shutdown().await;

    let (second, restore) = restored(&h).await;
    restore.unwrap();
    let refused = second.restart_all("operator").await.unwrap_err();
    assert!(matches!(refused, AllocError::NotRestartable { .. }), "{refused}");
    spawn_run(&second);
    let state = finished(&second).await;
    let refused = second.restart_all("operator").await.unwrap_err();
    assert_eq!(refused.to_string(), "allocation a1 cannot be restarted: it is ending");
    assert!(second.restart_running("operator").await.is_err());
    assert_eq!(state.client_status, ClientStatus::Complete, "still complete, not pending");
    assert_eq!(h.driver.start_count("a1", "web"), 1, "not run again");
    assert_eq!(state.task_states["web"].events, done.task_states["web"].events, "unchanged");
}

/// Nomad's `TestAllocRunner_Restore_MissingAllocDir` (GH-27933): a restored allocation whose
/// directory is gone fails, with an event that says why, rather than running in a directory
/// made anew; what still ran of it is destroyed.
#[tokio::test(start_paused = true)]
async fn restore_missing_alloc_dir() {
    let h = Harness::new(
        "service",
        &format!(
            "{}{}",
            task("web", "config = { run_for = \"1h\" }"),
            task("bye", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let first = h.start();
    until(&first, "running", |s| status(s, "web") == TaskStatus::Running).await;
    first.shutdown().await;
    let web = h.driver.running()[0].clone();
    std::fs::remove_dir_all(h.dir.path().join("a1")).unwrap();

    let (second, restore) = restored(&h).await;
    let error = restore.unwrap_err();
    assert!(matches!(error, AllocError::AllocDirMissing { .. }), "{error}");
    assert!(error.to_string().contains("is missing"), "{error}");
    assert!(h.driver.destroyed().contains(&web), "what still ran is destroyed");
    assert!(h.driver.running().is_empty());
    spawn_run(&second);
    let state = finished(&second).await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    for name in ["web", "bye"] {
        let task = &state.task_states[name];
        assert!(task.failed && task.status == TaskStatus::Dead, "{name}");
        assert!(
            task.events.iter().any(|e| matches!(&e.kind,
                TaskEventKind::FailedRestoring { error } if error.contains("is missing"))),
            "{name}: {:?}",
            task.events
        );
    }
    assert_eq!(h.driver.start_count("a1", "bye"), 0);
    assert!(!h.dir.path().join("a1").exists(), "the directory is not made again");
    second.destroy().await;
    assert!(h.store.load_all().await.unwrap().allocs.is_empty());
}

/// Nomad's `mock.LifecycleAlloc`: a batch job whose prestart sidecar exits 0 after a second,
/// with no restart attempts. A sidecar restarts on success even in a batch job, the policy
/// refuses, and the allocation fails instead of waiting forever.
#[tokio::test(start_paused = true)]
async fn a_batch_allocation_whose_prestart_sidecar_exits_fails() {
    let h = Harness::new(
        "batch",
        &format!(
            "[group.restart]\nattempts = 0\ninterval = \"10m\"\ndelay = \"1m\"\nmode = \"fail\"\n{}{}{}{}",
            task("web", "config = { run_for = \"1s\" }"),
            task(
                "side",
                "lifecycle = { hook = \"prestart\", sidecar = true }\nconfig = { run_for = \"1s\" }"
            ),
            task("init", "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"1s\" }"),
            task(
                "poststart",
                "lifecycle = { hook = \"poststart\" }\nconfig = { run_for = \"1s\" }"
            )
        ),
    );
    let runner = h.start();
    let state = finished(&runner).await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    let side = &state.task_states["side"];
    assert!(side.failed);
    assert!(side.events.iter().any(|e| matches!(&e.kind,
        TaskEventKind::NotRestarting { reason } if reason == "Policy allows no restarts")));
    assert_eq!(h.driver.start_count("a1", "web"), 0, "main never started");
    assert!(state.task_states.values().all(|t| t.status == TaskStatus::Dead));
}

/// Nomad's `TestAllocRunner_Update_Semantics`: an update with the same modify index as the
/// queued one replaces it, an older one is skipped, and once the run is over updates are
/// ignored.
#[tokio::test(start_paused = true)]
async fn update_semantics() {
    let h = Harness::new("service", &task("web", "config = { run_for = \"1h\" }"));
    let runner = h.runner();
    let upd1 = Allocation { modify_index: 2, ..h.alloc.clone() };
    let upd2 = Allocation { modify_index: 2, deployment_id: Some("d2".into()), ..h.alloc.clone() };
    runner.update(upd1.clone());
    runner.update(upd2.clone());
    runner.update(Allocation {
        modify_index: 1,
        deployment_id: Some("old".into()),
        ..h.alloc.clone()
    });
    spawn_run(&runner);
    h.recorder.seen("update:2").await;
    assert_eq!(runner.alloc(), upd2, "the same index replaced the queued copy; older skipped");
    runner.update(Allocation { desired_status: DesiredStatus::Stop, ..upd2.clone() });
    finished(&runner).await;
    let applied = runner.alloc();
    runner.update(Allocation { modify_index: 9, ..upd2 });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runner.alloc(), applied, "ignored once the run is over");
    assert_eq!(stored(&h).await.alloc, applied);
}

/// Whatever the runner applies, it writes: an update handed over with an unchanged modify
/// index (as Nomad's tests send) comes back after a restart.
#[tokio::test(start_paused = true)]
async fn an_applied_update_with_an_unchanged_index_is_persisted() {
    let h = Harness::new("service", &task("web", "config = { run_for = \"1h\" }"));
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    let same_index = Allocation { deployment_id: Some("d7".into()), ..h.alloc.clone() };
    runner.update(same_index.clone());
    h.recorder.seen("update:1").await;
    assert_eq!(runner.alloc(), same_index);
    runner.shutdown().await;
    assert_eq!(stored(&h).await.alloc, same_index, "a restart brings back what was applied");
}

/// An update made durable before the call returns: the agent acknowledges a stop only then.
#[tokio::test(start_paused = true)]
async fn a_durable_update_is_stored_when_it_returns_and_then_applied() {
    let h = Harness::new("service", &task("web", "config = { run_for = \"1h\" }"));
    let runner = h.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    let stop =
        Allocation { desired_status: DesiredStatus::Stop, modify_index: 2, ..h.alloc.clone() };
    runner.update_durably(stop.clone()).await.unwrap();
    assert_eq!(stored(&h).await.alloc, stop, "durable before the caller hears back");
    let state = finished(&runner).await;
    assert_eq!(status(&state, "web"), TaskStatus::Dead);
    assert!(h.driver.running().is_empty());
    // A stale one changes nothing.
    runner.update_durably(h.alloc.clone()).await.unwrap();
    assert_eq!(stored(&h).await.alloc, stop);

    let failing = Harness::new("service", &task("web", "config = { run_for = \"1h\" }"));
    let runner = failing.start();
    until(&runner, "running", |s| status(s, "web") == TaskStatus::Running).await;
    failing.store.fail_writes(Some("disk full"));
    let stop = Allocation {
        desired_status: DesiredStatus::Stop,
        modify_index: 2,
        ..failing.alloc.clone()
    };
    assert!(
        runner.update_durably(stop).await.is_err(),
        "a stop that is not durable is not acknowledged"
    );
    failing.store.fail_writes(None);
    runner.destroy().await;
}

/// The six-task allocation of Nomad's `TestAllocRunner_Lifecycle_Restart`, with its restart
/// policy (one attempt in ten minutes, 1ns delay, mode fail).
fn lifecycle_restart_harness(job_type: &str, main: &str, leader: bool) -> Harness {
    let lifecycle = |hook: &str, sidecar: bool| {
        format!("lifecycle = {{ hook = \"{hook}\", sidecar = {sidecar} }}\n")
    };
    let run =
        |secs: u32, code: u32| format!("config = {{ run_for = \"{secs}s\", exit_code = {code} }}");
    Harness::new(
        job_type,
        &format!(
            "[group.restart]\nattempts = 1\ninterval = \"10m\"\ndelay = \"1ns\"\nmode = \"fail\"\n{}{}{}{}{}{}",
            task("main", &format!("leader = {leader}\n{main}")),
            task("prestart-oneshot", &format!("{}{}", lifecycle("prestart", false), run(1, 0))),
            task("prestart-sidecar", &format!("{}{}", lifecycle("prestart", true), run(100, 0))),
            task("poststart-oneshot", &format!("{}{}", lifecycle("poststart", false), run(1, 0))),
            task("poststart-sidecar", &format!("{}{}", lifecycle("poststart", true), run(100, 0))),
            task("poststop", &format!("{}{}", lifecycle("poststop", false), run(1, 0))),
        ),
    )
}

/// Each task's status and restart count, by name.
fn statuses(state: &AllocState) -> Vec<(String, TaskStatus, u64)> {
    state.task_states.iter().map(|(n, t)| (n.clone(), t.status, t.restarts)).collect()
}

/// Nomad's `TestAllocRunner_Lifecycle_Restart`, every case: the action, then the status and
/// restart count each task settles at. Restarting the whole allocation counts one restart for
/// every task that runs again, dead ones included.
#[tokio::test(start_paused = true)]
async fn lifecycle_restart() {
    use TaskStatus::{Dead as D, Pending as P, Running as R};
    #[derive(Clone, Copy)]
    enum Act {
        RestartAll,
        RestartRunning,
        Stop,
        RestartTask(&'static str),
        /// Nothing: the main task's own exits drive the case.
        Wait,
        /// Wait for main to fail for good, then restart it: refused, it is not running.
        RestartFailedMain,
    }
    let running_main = "config = { run_for = \"100s\", exit_code = 0 }";
    let failing_main = "config = { run_for = \"2s\", exit_code = 1 }";
    let exiting_main = "config = { run_for = \"2s\", exit_code = 0 }";
    // main, prestart-oneshot, prestart-sidecar, poststart-oneshot, poststart-sidecar, poststop
    let all_restarted = [(R, 1), (D, 1), (R, 1), (D, 1), (R, 1), (P, 0)];
    let running_restarted = [(R, 1), (D, 0), (R, 1), (D, 0), (R, 1), (P, 0)];
    let all_dead_main_once = [(D, 1), (D, 0), (D, 0), (D, 0), (D, 0), (D, 0)];
    /// Each task's (status, restarts), in the order of `names` below.
    type Settled = [(TaskStatus, u64); 6];
    let cases: [(&str, &str, &str, bool, Act, Settled); 15] = [
        (
            "restart entire allocation",
            "service",
            running_main,
            false,
            Act::RestartAll,
            all_restarted,
        ),
        (
            "restart only running tasks",
            "service",
            running_main,
            false,
            Act::RestartRunning,
            running_restarted,
        ),
        (
            "batch job restart entire allocation",
            "batch",
            "config = { run_for = \"100s\", exit_code = 1 }",
            false,
            Act::RestartAll,
            all_restarted,
        ),
        (
            "batch job restart only running tasks",
            "batch",
            "config = { run_for = \"100s\", exit_code = 1 }",
            false,
            Act::RestartRunning,
            running_restarted,
        ),
        (
            "restart entire allocation with leader",
            "service",
            running_main,
            true,
            Act::RestartAll,
            all_restarted,
        ),
        ("stop from server", "service", running_main, false, Act::Stop, [(D, 0); 6]),
        (
            "restart main task",
            "service",
            running_main,
            false,
            Act::RestartTask("main"),
            [(R, 1), (D, 0), (R, 0), (D, 0), (R, 0), (P, 0)],
        ),
        (
            "restart leader main task",
            "service",
            running_main,
            true,
            Act::RestartTask("main"),
            [(R, 1), (D, 0), (R, 0), (D, 0), (R, 0), (P, 0)],
        ),
        (
            "main task fails and restarts once",
            "service",
            failing_main,
            false,
            Act::Wait,
            all_dead_main_once,
        ),
        (
            "leader main task fails and restarts once",
            "service",
            failing_main,
            true,
            Act::Wait,
            all_dead_main_once,
        ),
        (
            "main stopped unexpectedly and restarts once",
            "service",
            exiting_main,
            false,
            Act::Wait,
            all_dead_main_once,
        ),
        (
            "leader main stopped unexpectedly and restarts once",
            "service",
            exiting_main,
            true,
            Act::Wait,
            all_dead_main_once,
        ),
        (
            "failed main task cannot be restarted",
            "service",
            failing_main,
            false,
            Act::RestartFailedMain,
            all_dead_main_once,
        ),
        (
            "restart prestart-sidecar task",
            "service",
            running_main,
            false,
            Act::RestartTask("prestart-sidecar"),
            [(R, 0), (D, 0), (R, 1), (D, 0), (R, 0), (P, 0)],
        ),
        (
            "restart poststart-sidecar task",
            "service",
            running_main,
            false,
            Act::RestartTask("poststart-sidecar"),
            [(R, 0), (D, 0), (R, 0), (D, 0), (R, 1), (P, 0)],
        ),
    ];
    let names = [
        "main",
        "prestart-oneshot",
        "prestart-sidecar",
        "poststart-oneshot",
        "poststart-sidecar",
        "poststop",
    ];
    for (case, job_type, main, leader, act, expected) in cases {
        let h = lifecycle_restart_harness(job_type, main, leader);
        let runner = h.start();
        // Before: the one-shot tasks are dead and did not fail, the rest run, poststop waits,
        // and nothing has restarted.
        let before = [(R, 0), (D, 0), (R, 0), (D, 0), (R, 0), (P, 0)];
        until(&runner, &format!("{case}: in its initial state"), |s| {
            s.client_status == ClientStatus::Running
                && names.iter().zip(before).all(|(n, (status, restarts))| {
                    let t = &s.task_states[*n];
                    t.status == status && t.restarts == restarts && !t.failed
                })
        })
        .await;
        let result = match act {
            Act::RestartAll => runner.restart_all("restart signaled").await,
            Act::RestartRunning => runner.restart_running("restart signaled").await,
            Act::Stop => {
                runner.update(Allocation {
                    desired_status: DesiredStatus::Stop,
                    modify_index: 2,
                    ..h.alloc.clone()
                });
                Ok(())
            }
            Act::RestartTask(name) => runner.restart_task(name, "restart signaled").await,
            Act::Wait => Ok(()),
            Act::RestartFailedMain => {
                until(&runner, &format!("{case}: main failed for good"), |s| {
                    s.task_states["main"].failed
                })
                .await;
                let refused = runner.restart_task("main", "restart signaled").await;
                assert_eq!(refused.unwrap_err().to_string(), "task main is not running", "{case}");
                Ok(())
            }
        };
        result.unwrap_or_else(|e| panic!("{case}: {e}"));
        let want: Vec<(String, TaskStatus, u64)> = names
            .iter()
            .zip(expected)
            .map(|(n, (status, restarts))| ((*n).to_owned(), status, restarts))
            .collect();
        let settled = |s: &AllocState| {
            let mut got = statuses(s);
            got.sort_by_key(|(n, _, _)| names.iter().position(|m| m == n));
            got == want
        };
        let state = until(&runner, &format!("{case}: settled as {want:?}"), settled).await;
        for (name, task) in &state.task_states {
            if task.status == D {
                assert!(task.started_at.is_some() && task.finished_at.is_some(), "{case}: {name}");
                assert!(task.events.len() >= 2, "{case}: {name}");
            }
        }
        runner.destroy().await;
    }
}

/// The allocation's event stream: every event of every task, in the order recorded (so in
/// time order, and lifecycle order across tasks), and each task's state ring is the tail of
/// that task's part of the stream.
#[tokio::test(start_paused = true)]
async fn the_event_stream_has_every_task_event_in_order() {
    let h = Harness::new(
        "batch",
        &format!(
            "{}{}{}",
            task("init", "lifecycle = { hook = \"prestart\" }\nconfig = { run_for = \"1s\" }"),
            task(
                "main",
                "config = { run_for = \"1s\", exit_code = 1 }\nrestart = { attempts = 6, delay = \"1s\", interval = \"1h\" }"
            ),
            task("cleanup", "lifecycle = { hook = \"poststop\" }\nconfig = { run_for = \"1s\" }")
        ),
    );
    let runner = h.runner();
    let mut events = runner.events();
    spawn_run(&runner);
    let state = finished(&runner).await;
    let mut stream = Vec::new();
    while let Ok(recorded) = events.try_recv() {
        assert_eq!(recorded.alloc_id, "a1");
        stream.push((recorded.task, recorded.event));
    }
    assert!(stream.windows(2).all(|w| w[0].1.time <= w[1].1.time), "in time order");
    for (name, task_state) in &state.task_states {
        let of_task: Vec<_> =
            stream.iter().filter(|(t, _)| t == name).map(|(_, e)| e.clone()).collect();
        let ring: Vec<_> = task_state.events.iter().cloned().collect();
        assert!(of_task.len() >= ring.len(), "{name}");
        assert_eq!(
            of_task[of_task.len() - ring.len()..],
            ring[..],
            "{name}'s ring ends the stream"
        );
    }
    let main_events = stream.iter().filter(|(t, _)| t == "main").count();
    assert!(main_events > 10, "more than a ring holds: {main_events}");
    // Lifecycle order shows across tasks: init ends before main starts, cleanup starts last.
    let position = |task: &str, title: &str| {
        stream.iter().position(|(t, e)| t == task && e.kind.title() == title).unwrap()
    };
    assert!(position("init", "Terminated") < position("main", "Started"));
    assert!(position("main", "Not Restarting") < position("cleanup", "Started"));
}
