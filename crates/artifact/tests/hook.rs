//! The artifact hook in a task runner (mock driver, in-memory store): what Nomad's
//! `artifact_hook_test.go` asks of it, and that artifacts are fetched once, not again after a
//! restart of the task or a restore after an agent restart.

mod common;

use common::{Route, Server};
use std::sync::Arc;
use std::time::Duration;
use wharf_artifact::{ArtifactHook, Fetcher, Limits};
use wharf_driver::mock::MockDriver;
use wharf_state::{Allocation, TaskEventKind, TaskState, TaskStatus, Timestamp, spec};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::{
    HookContext, TaskDirs, TaskError, TaskHook, TaskRunner, TaskRunnerConfig, TokioClock,
};

const LIMIT: Duration = Duration::from_secs(60);

fn alloc(task: &str) -> Allocation {
    let doc = format!(
        "[job]\nid = \"j\"\ntype = \"batch\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"t\"\ndriver = \"mock\"\n{task}\n"
    );
    let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
    Allocation::new("a1", job, "g")
}

fn hook() -> Arc<ArtifactHook> {
    Arc::new(ArtifactHook::new(Arc::new(Fetcher::new(Limits::default()).unwrap())))
}

fn artifact_block(source: &str) -> String {
    format!("[[group.task.artifact]]\nsource = \"{source}\"\n")
}

/// Calls the hook's prestart the way the task runner does.
async fn prestart(
    hook: &ArtifactHook,
    alloc: &Allocation,
    root: &std::path::Path,
) -> Result<wharf_task::PrestartResponse, TaskError> {
    let task = &alloc.job.groups[0].tasks[0];
    let dirs = TaskDirs::new(root, &task.name);
    dirs.create_own().unwrap();
    let env = [("WHARF_TASK_DIR".to_owned(), dirs.task_dir.display().to_string())].into();
    hook.prestart(HookContext { alloc, task, dirs: &dirs, env: &env }, None).await
}

/// Nomad's `TestTaskRunner_ArtifactHook_Recoverable`: a failed download is an error the
/// restart policy may retry, with its own event.
#[tokio::test]
async fn artifact_hook_recoverable() {
    let server = Server::start().await;
    let root = tempfile::tempdir().unwrap();
    let alloc = alloc(&artifact_block(&server.url("/missing.bin")));
    let error = prestart(&hook(), &alloc, root.path()).await.unwrap_err();
    let TaskError::HookEvent { hook, event: TaskEventKind::ArtifactDownloadFailed { error } } =
        error
    else {
        panic!("not an artifact event: {error:?}");
    };
    assert_eq!(hook, "artifacts");
    assert!(error.contains("404"), "{error}");
}

/// Nomad's `TestTaskRunner_ArtifactHook_PartialDone`: of two artifacts the first is fetched and
/// the second fails; the retry fetches only the second, and then the hook is done.
#[tokio::test]
async fn artifact_hook_partial_done() {
    let server = Server::start().await;
    server.route("/one.txt", Route::Body(b"1".to_vec()));
    let root = tempfile::tempdir().unwrap();
    let alloc = alloc(&format!(
        "{}{}",
        artifact_block(&server.url("/one.txt")),
        artifact_block(&server.url("/two.txt"))
    ));
    let hook = hook();
    assert!(prestart(&hook, &alloc, root.path()).await.is_err());
    assert_eq!((server.hits("/one.txt"), server.hits("/two.txt")), (1, 1));
    server.route("/two.txt", Route::Body(b"2".to_vec()));
    let response = prestart(&hook, &alloc, root.path()).await.unwrap();
    assert!(response.done, "done once every artifact is in place");
    assert_eq!(
        (server.hits("/one.txt"), server.hits("/two.txt")),
        (1, 2),
        "one is not fetched again"
    );
    let local = root.path().join("t/local");
    assert_eq!(std::fs::read_to_string(local.join("one.txt")).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(local.join("two.txt")).unwrap(), "2");
}

/// Nomad's `TestTaskRunner_ArtifactHook_ConcurrentDownloadSuccess`, where wharf fetches one
/// after another: every artifact of a task is in place, each fetched once.
#[tokio::test]
async fn artifact_hook_download_success_many() {
    let server = Server::start().await;
    let mut blocks = String::new();
    for i in 0..5 {
        server.route(&format!("/f{i}"), Route::Body(format!("{i}").into_bytes()));
        blocks.push_str(&format!(
            "[[group.task.artifact]]\nsource = \"{}\"\ndestination = \"local/f{i}.txt\"\nmode = \"file\"\n",
            server.url(&format!("/f{i}"))
        ));
    }
    let root = tempfile::tempdir().unwrap();
    let response = prestart(&hook(), &alloc(&blocks), root.path()).await.unwrap();
    assert!(response.done);
    for i in 0..5 {
        let text = std::fs::read_to_string(root.path().join(format!("t/local/f{i}.txt"))).unwrap();
        assert_eq!(text, format!("{i}"));
        assert_eq!(server.hits(&format!("/f{i}")), 1);
    }
}

/// Variables in the source and destination are those of the task's environment.
#[tokio::test]
async fn artifact_hook_interpolates_the_environment() {
    let root = tempfile::tempdir().unwrap();
    let files = root.path().join("alloc/data");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("x.txt"), "x").unwrap();
    let alloc = alloc(&format!(
        "env = {{ SRC = \"{}\" }}\n[[group.task.artifact]]\nsource = \"${{SRC}}/x.txt\"\n\
         destination = \"local/${{WHARF_TASK_DIR_NAME}}\"\n",
        files.display()
    ));
    // The hook sees the environment the runner built; here, the variables the test gives.
    let task = &alloc.job.groups[0].tasks[0];
    let dirs = TaskDirs::new(root.path(), "t");
    dirs.create_own().unwrap();
    let env = [
        ("SRC".to_owned(), files.display().to_string()),
        ("WHARF_TASK_DIR_NAME".to_owned(), "in".to_owned()),
    ]
    .into();
    hook()
        .prestart(HookContext { alloc: &alloc, task, dirs: &dirs, env: &env }, None)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(root.path().join("t/local/in/x.txt")).unwrap(), "x");
}

fn runner(
    alloc: &Allocation,
    store: &MemoryStore,
    driver: &MockDriver,
    root: &std::path::Path,
    hook: Arc<ArtifactHook>,
) -> TaskRunner {
    let task = alloc.job.groups[0].tasks[0].clone();
    let config = TaskRunnerConfig::new(
        alloc.clone(),
        task,
        Arc::new(driver.clone()),
        Arc::new(store.clone()),
        root,
    )
    .with_clock(Arc::new(TokioClock::starting_at(Timestamp(1_000_000))))
    .with_hook(hook);
    let runner = TaskRunner::new(config);
    runner.set_start_gate(true);
    runner
}

async fn until(runner: &TaskRunner, what: &str, done: impl Fn(&TaskState) -> bool) -> TaskState {
    let mut events = runner.events();
    let wait = async {
        loop {
            let state = runner.state();
            if done(&state) {
                return state;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), events.recv()).await;
        }
    };
    tokio::time::timeout(LIMIT, wait)
        .await
        .unwrap_or_else(|_| panic!("never {what}: {:#?}", runner.state()))
}

fn titles(state: &TaskState) -> Vec<&'static str> {
    state.events.iter().map(|e| e.kind.title()).collect()
}

/// A failed download is a "Failed Artifact Download" event, and the restart policy applies:
/// here one attempt more, then the task fails.
#[tokio::test]
async fn a_failed_download_is_an_event_and_the_restart_policy_applies() {
    let server = Server::start().await;
    let root = tempfile::tempdir().unwrap();
    let alloc = alloc(&format!(
        "restart = {{ attempts = 1, delay = \"100ms\", interval = \"10m\", mode = \"fail\" }}\n{}",
        artifact_block(&server.url("/gone.tar.gz"))
    ));
    let (store, driver) = (MemoryStore::new(), MockDriver::new());
    let runner = runner(&alloc, &store, &driver, root.path(), hook());
    let run = runner.clone();
    tokio::spawn(async move { run.run().await });
    let state = until(&runner, "dead", |s| s.status == TaskStatus::Dead).await;
    assert!(state.failed, "{state:#?}");
    let failed = titles(&state).iter().filter(|t| **t == "Failed Artifact Download").count();
    assert_eq!(failed, 2, "{:?}", titles(&state));
    assert!(titles(&state).contains(&"Restarting"));
    assert!(!titles(&state).contains(&"Started"));
    assert_eq!(server.hits("/gone.tar.gz"), 2);
}

/// Nothing is fetched again: not when the task restarts, not after the agent restarts and
/// the task, restored, restarts again.
#[tokio::test]
async fn artifacts_are_not_fetched_again_after_a_restart_or_a_restore() {
    let server = Server::start().await;
    server.route("/app.txt", Route::Body(b"app".to_vec()));
    let root = tempfile::tempdir().unwrap();
    let alloc = alloc(&format!(
        "config = {{ run_for = \"50ms\", exit_code = 1 }}\n\
         restart = {{ attempts = 20, delay = \"10ms\", interval = \"10m\", mode = \"fail\" }}\n{}",
        artifact_block(&server.url("/app.txt"))
    ));
    // Counted by restarts: the state keeps only its last events.
    let started = |s: &TaskState| s.restarts + 1;
    let (store, driver) = (MemoryStore::new(), MockDriver::new());
    store.put_allocation(&alloc).await.unwrap();
    let first = runner(&alloc, &store, &driver, root.path(), hook());
    let run = first.clone();
    tokio::spawn(async move { run.run().await });
    until(&first, "started twice", |s| started(s) >= 2).await;
    assert_eq!(server.hits("/app.txt"), 1, "a restart does not fetch again");

    // The agent restarts: a new runner, a new hook, the same store and directory.
    first.shutdown();
    tokio::time::timeout(LIMIT, first.wait_finished()).await.unwrap();
    let before = started(&first.state());
    let stored = store.load_alloc("a1").await.unwrap().unwrap();
    let second = runner(&alloc, &store, &driver, root.path(), hook());
    second.restore(stored.tasks.get("t")).await.unwrap();
    let run = second.clone();
    tokio::spawn(async move { run.run().await });
    until(&second, "started twice more", |s| started(s) >= before + 2).await;
    second.kill(None).await;
    assert_eq!(server.hits("/app.txt"), 1, "a restore does not fetch again");
    assert_eq!(std::fs::read_to_string(root.path().join("t/local/app.txt")).unwrap(), "app");
}
