//! The task runner on the real raw_exec driver and the redb store: real processes, a real
//! state file, and an "agent restart" (a new runner, driver and store on the same file).

// Real processes on the real clock.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use wharf_exec::RawExecDriver;
use wharf_state::{Allocation, DesiredStatus, TaskEventKind, TaskState, TaskStatus, spec};
use wharf_store::{RedbStore, StateStore};
use wharf_task::{TaskRunner, TaskRunnerConfig};
use wharf_tests::proc_stat::ProcStat;

const LIMIT: Duration = Duration::from_secs(30);

/// wharf-exec builds its shim beside the test binaries' target directory.
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let shim = exe.parent().and_then(Path::parent).map(|dir| dir.join("wharf-shim")).unwrap();
    assert!(
        shim.is_file(),
        "{} is missing: build the whole workspace (`cargo test --workspace` does) so wharf-exec's shim exists",
        shim.display()
    );
    shim
}

struct Node {
    dir: tempfile::TempDir,
    alloc: Allocation,
}

impl Node {
    fn new(script: &str, extra: &str) -> Node {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"batch\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n{extra}\nconfig = {{ command = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
        );
        let alloc = Allocation {
            id: "a1".into(),
            job: spec::parse_toml(&doc).unwrap(),
            task_group: "g".into(),
            desired_status: DesiredStatus::Run,
            modify_index: 1,
            deployment_id: None,
            ports: Vec::new(),
        };
        Node { dir: tempfile::tempdir().unwrap(), alloc }
    }

    /// A runner with a fresh driver and store on this node's state file, as a new agent has.
    async fn runner(&self) -> (TaskRunner, RedbStore, Arc<Notify>) {
        let store = RedbStore::open(self.dir.path().join("state.redb")).unwrap();
        store.put_allocation(&self.alloc).await.unwrap();
        let changed = Arc::new(Notify::new());
        let runner = TaskRunner::new(
            TaskRunnerConfig::new(
                self.alloc.clone(),
                self.alloc.job.groups[0].tasks[0].clone(),
                Arc::new(RawExecDriver::with_shim(shim())),
                Arc::new(store.clone()),
                self.dir.path().join("allocs/a1"),
            )
            .with_state_changed(changed.clone()),
        );
        (runner, store, changed)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join("allocs/a1/t").join(name)
    }
}

impl Drop for Node {
    /// A test that fails half-way would leave its task running (and its shim, which ends with
    /// it): kill it, if the pid it wrote is still that task's.
    fn drop(&mut self) {
        let pid =
            std::fs::read_to_string(self.file("pid")).ok().and_then(|t| t.trim().parse().ok());
        if let Some(pid) = pid {
            let ours = |cmdline: &str| cmdline.contains("$WHARF_TASK_DIR/pid");
            let _ = wharf_exec::process::kill_if(pid, ours, Duration::from_secs(5));
        }
    }
}

async fn until(
    runner: &TaskRunner,
    changed: &Notify,
    what: &str,
    done: impl Fn(&TaskState) -> bool,
) -> TaskState {
    let wait = async {
        loop {
            let state = runner.state();
            if done(&state) {
                return state;
            }
            changed.notified().await;
        }
    };
    tokio::time::timeout(LIMIT, wait)
        .await
        .unwrap_or_else(|_| panic!("never {what}: {:?}", runner.state()))
}

/// The pid a task wrote to `path`, once the whole number is there: the shell creates the file
/// before it writes to it.
async fn written_pid(path: &std::path::Path) -> i32 {
    let deadline = Instant::now() + LIMIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "{} never held a pid: {text:?}", path.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn alive(pid: i32) -> bool {
    ProcStat::of(pid).is_some_and(|stat| !stat.is_dead())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_task_runs_and_its_exit_is_persisted() {
    let node = Node::new(
        "echo \"$WHARF_TASK_NAME in $WHARF_ALLOC_ID\"; exit 3",
        "restart = { attempts = 0 }",
    );
    let (runner, store, changed) = node.runner().await;
    runner.set_start_gate(true);
    let run = tokio::spawn({
        let runner = runner.clone();
        async move { runner.run().await }
    });
    let state = until(&runner, &changed, "dead", |s| s.status == TaskStatus::Dead).await;
    assert!(state.failed);
    assert!(
        state
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { exit_code: 3, .. }))
    );
    runner.kill(None).await;
    run.await.unwrap();
    // Once the run is over, everything it reported is durable.
    let stored = store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(
        stored.tasks["t"].state.as_ref(),
        Some(&runner.state()),
        "the state file holds what the runner reports"
    );
    assert_eq!(std::fs::read_to_string(node.file("logs/t.stdout.0")).unwrap(), "t in a1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ignores_its_kill_signal_is_killed_at_its_timeout() {
    let node = Node::new(
        "trap '' INT TERM; echo $$ > \"$WHARF_TASK_DIR/pid\"; while true; do sleep 0.05; done",
        "kill_timeout = \"1s\"",
    );
    let (runner, _store, changed) = node.runner().await;
    runner.set_start_gate(true);
    tokio::spawn({
        let runner = runner.clone();
        async move { runner.run().await }
    });
    until(&runner, &changed, "running", |s| s.status == TaskStatus::Running).await;
    let pid = written_pid(&node.file("pid")).await;
    let started = Instant::now();
    runner.kill(None).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(1) && took < Duration::from_millis(1500), "{took:?}");
    assert!(!alive(pid));
    let state = runner.state();
    assert!(
        state
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { signal: Some(9), .. }))
    );
    assert_eq!(state.events.back().unwrap().kind, TaskEventKind::Killed { error: None });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_reattaches_to_the_same_process_and_learns_its_exit() {
    let node = Node::new(
        "echo $$ > \"$WHARF_TASK_DIR/pid\"; while [ ! -e \"$WHARF_TASK_DIR/go\" ]; do sleep 0.05; done; exit 5",
        "restart = { attempts = 0 }",
    );
    let first_pid = {
        let (runner, store, changed) = node.runner().await;
        runner.set_start_gate(true);
        let run = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run().await }
        });
        until(&runner, &changed, "running", |s| s.status == TaskStatus::Running).await;
        let pid = written_pid(&node.file("pid")).await;
        runner.shutdown();
        run.await.unwrap();
        // The old agent is gone: its runner and store close the file.
        drop((runner, store));
        pid
    };
    assert!(alive(first_pid), "shutdown leaves the task running");

    let (runner, store, changed) = node.runner().await;
    let stored = store.load_alloc("a1").await.unwrap().unwrap();
    runner.restore(stored.tasks.get("t")).await.unwrap();
    tokio::spawn({
        let runner = runner.clone();
        async move { runner.run().await }
    });
    until(&runner, &changed, "reattached", |s| {
        s.events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(node.file("pid")).unwrap().trim().parse::<i32>().unwrap(),
        first_pid
    );
    std::fs::write(node.file("go"), "").unwrap();
    let state = until(&runner, &changed, "dead", |s| s.status == TaskStatus::Dead).await;
    assert!(
        state
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { exit_code: 5, .. }))
    );
    let started = state.events.iter().filter(|e| e.kind == TaskEventKind::Started).count();
    assert_eq!(started, 1, "never started twice");
    runner.kill(None).await;
}
