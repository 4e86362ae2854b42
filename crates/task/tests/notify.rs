//! The notify socket (`notify_socket = true`): the task finds a unix datagram socket in
//! `NOTIFY_SOCKET`, its `READY=1` is recorded once in its state and persisted, other lines are
//! ignored, and an agent restart neither forgets readiness heard nor stops hearing it (the
//! restored runner binds the socket again at the same path). On the mock driver and the
//! in-memory store under tokio's paused clock; the datagrams are real, sent by the test as
//! the task would.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use wharf_driver::FsIsolation;
use wharf_driver::mock::MockDriver;
use wharf_state::{
    Allocation, DesiredStatus, TaskEventKind, TaskState, TaskStatus, Timestamp, spec,
};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::{TaskRunner, TaskRunnerConfig, TokioClock};

const LIMIT: Duration = Duration::from_secs(24 * 3600);

struct Harness {
    driver: MockDriver,
    store: MemoryStore,
    changed: Arc<Notify>,
    alloc: Allocation,
    dir: tempfile::TempDir,
}

impl Harness {
    fn new(task: &str) -> Harness {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n[[group.task]]\n\
             name = \"t\"\ndriver = \"mock\"\nconfig = {{ run_for = \"1h\" }}\n{task}\n"
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        Harness {
            driver: MockDriver::new(),
            store: MemoryStore::new(),
            changed: Arc::new(Notify::new()),
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

    fn runner(&self) -> TaskRunner {
        let task = self.alloc.job.groups[0].tasks[0].clone();
        let config = TaskRunnerConfig::new(
            self.alloc.clone(),
            task,
            Arc::new(self.driver.clone()),
            Arc::new(self.store.clone()),
            self.dir.path().join("a1"),
        )
        .with_clock(Arc::new(TokioClock::starting_at(Timestamp(1_000_000))))
        .with_state_changed(self.changed.clone());
        TaskRunner::new(config)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("a1/t/notify.sock")
    }

    async fn until(&self, runner: &TaskRunner, what: &str, done: impl Fn(&TaskState) -> bool) {
        let wait = async {
            while !done(&runner.state()) {
                self.changed.notified().await;
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .unwrap_or_else(|_| panic!("never {what}: {:#?}", runner.state()));
    }

    /// What the store holds for the task (the test writes the allocation record, which is
    /// the alloc runner's job, to read the task's records back).
    async fn stored_task(&self) -> Option<wharf_store::StoredTask> {
        self.store.put_allocation(&self.alloc).await.unwrap();
        let stored = self.store.load_alloc("a1").await.unwrap().unwrap();
        stored.tasks.get("t").cloned()
    }

    async fn stored(&self) -> TaskState {
        self.stored_task().await.and_then(|t| t.state).unwrap()
    }

    /// Sends `datagram` to the task's notify socket, as the task would.
    fn send(&self, datagram: &str) {
        let client = UnixDatagram::unbound().unwrap();
        client.send_to(datagram.as_bytes(), self.socket()).unwrap();
    }

    /// Sends `datagrams` in order and returns once the runner has read every one: a unix
    /// datagram stays charged to its sender's queue (`SIOCOUTQ`) until it is read, and the
    /// runner reads the next only once it has acted on the one before.
    async fn send_and_see_read(&self, datagrams: &[&str]) {
        let client = UnixDatagram::unbound().unwrap();
        for datagram in datagrams {
            client.send_to(datagram.as_bytes(), self.socket()).unwrap();
        }
        for _ in 0..100_000 {
            let mut queued: libc::c_int = 0;
            // SAFETY: SIOCOUTQ writes one int through the pointer, which outlives the call.
            let code = unsafe { libc::ioctl(client.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
            assert_eq!(code, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
            if queued == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the runner never read {datagrams:?}");
    }
}

fn running(state: &TaskState) -> bool {
    state.status == TaskStatus::Running
}

fn ready_messages(state: &TaskState) -> usize {
    let said = |kind: &TaskEventKind| matches!(kind, TaskEventKind::HookMessage { hook, .. } if hook == "notify_socket");
    state.events.iter().filter(|e| said(&e.kind)).count()
}

fn start(runner: &TaskRunner) {
    runner.set_start_gate(true);
    let running = runner.clone();
    tokio::spawn(async move { running.run().await });
}

#[tokio::test(start_paused = true)]
async fn a_task_saying_ready_on_its_notify_socket_is_ready_once_and_persisted() {
    let h = Harness::new("notify_socket = true");
    let runner = h.runner();
    start(&runner);
    h.until(&runner, "running", running).await;
    let started = h.driver.started();
    assert_eq!(
        started[0].env.get("NOTIFY_SOCKET").map(PathBuf::from),
        Some(h.socket()),
        "the task is told where its socket is"
    );
    assert!(runner.state().ready_at.is_none());
    // Lines other than READY=1 are skipped; datagrams arrive in order.
    h.send("STATUS=warming up\nMAINPID=42");
    h.send("STATUS=done\nREADY=1\n");
    h.until(&runner, "ready", |s| s.ready_at.is_some()).await;
    let state = runner.state();
    assert_eq!(ready_messages(&state), 1);
    assert_eq!(h.stored().await.ready_at, state.ready_at, "readiness is persisted");
    runner.kill(None).await;
    assert!(!h.socket().exists(), "a dead task's socket is removed");
}

/// A driver whose task runs in a root of its own (an image) cannot show it the socket's
/// path: the start fails saying so, rather than leave its waiters to their deadline.
#[tokio::test(start_paused = true)]
async fn a_task_in_a_root_of_its_own_cannot_have_a_notify_socket() {
    let mut h = Harness::new("notify_socket = true");
    h.driver = MockDriver::new().with_fs_isolation(FsIsolation::Image);
    let runner = h.runner();
    start(&runner);
    h.until(&runner, "failed", |state| state.failed).await;
    let said = format!("{:?}", runner.state().events);
    assert!(said.contains("notify_socket: the task runs in a root of its own"), "{said}");
    assert!(h.driver.started().is_empty(), "never started");
    assert!(!h.socket().exists());
}

#[tokio::test(start_paused = true)]
async fn a_task_without_notify_socket_gets_none() {
    let h = Harness::new("");
    let runner = h.runner();
    start(&runner);
    h.until(&runner, "running", running).await;
    assert!(!h.driver.started()[0].env.contains_key("NOTIFY_SOCKET"));
    assert!(!h.socket().exists());
    runner.kill(None).await;
}

/// The agent restarts while the task runs: the restored runner binds the socket again at the
/// path the task holds, and hears the task's READY=1 there.
#[tokio::test(start_paused = true)]
async fn ready_said_after_an_agent_restart_is_heard_by_the_restored_runner() {
    let h = Harness::new("notify_socket = true");
    let first = h.runner();
    start(&first);
    h.until(&first, "running", running).await;
    first.shutdown();
    first.wait_finished().await;
    drop(first);

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    second.set_start_gate(true);
    let running_second = second.clone();
    tokio::spawn(async move { running_second.run().await });
    assert_eq!(h.driver.start_count("a1", "t"), 1, "reattached, not started again");
    h.send("READY=1");
    h.until(&second, "ready after the restart", |s| s.ready_at.is_some()).await;
    second.kill(None).await;
}

/// Readiness heard before the agent restarted is in the restored state: nothing needs to be
/// heard again.
#[tokio::test(start_paused = true)]
async fn ready_heard_before_an_agent_restart_is_kept() {
    let h = Harness::new("notify_socket = true");
    let first = h.runner();
    start(&first);
    h.until(&first, "running", running).await;
    h.send("READY=1");
    h.until(&first, "ready", |s| s.ready_at.is_some()).await;
    let ready_at = first.state().ready_at;
    first.shutdown();
    first.wait_finished().await;
    drop(first);

    let second = h.runner();
    second.restore(h.stored_task().await.as_ref()).await.unwrap();
    assert_eq!(second.state().ready_at, ready_at);
    second.set_start_gate(true);
    let running_second = second.clone();
    tokio::spawn(async move { running_second.run().await });
    h.until(&second, "still running", running).await;
    // Later, the task says it again: once the runner has read that (and the line after it),
    // readiness is still the first's, heard once.
    tokio::time::advance(Duration::from_secs(60)).await;
    h.send_and_see_read(&["READY=1", "STATUS=serving"]).await;
    let state = second.state();
    assert_eq!(state.ready_at, ready_at, "the first READY=1 counts");
    assert_eq!(ready_messages(&state), 1, "and is told once");
    second.kill(None).await;
}
