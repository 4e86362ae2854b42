//! Start ordering by notification (`wait_ready`): a task starts only once the tasks it names
//! have said `READY=1` on their notify sockets, an allocation whose task waited past its
//! `wait_deadline` fails with a reason naming the task that never said it, and an agent
//! restart neither forgets a `READY=1` heard before it nor misses one said after it. On the
//! mock driver and the in-memory store under tokio's paused clock; the datagrams are real,
//! sent by the test to the socket each task is handed, as the task would.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wharf_alloc::{AllocRunner, AllocRunnerConfig};
use wharf_driver::mock::MockDriver;
use wharf_state::{
    AllocState, Allocation, ClientStatus, DesiredStatus, TaskEventKind, TaskStatus, Timestamp, spec,
};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::TokioClock;

const LIMIT: Duration = Duration::from_secs(3600);
const T0: u64 = 1_000_000;

struct Harness {
    driver: MockDriver,
    store: MemoryStore,
    alloc: Allocation,
    dir: tempfile::TempDir,
}

impl Harness {
    /// Tasks `db` and `cache`, each with a notify socket, and `web` waiting on `web_waits`.
    fn new(web_waits: &str) -> Harness {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
             [[group.task]]\nname = \"web\"\ndriver = \"mock\"\n{web_waits}\n\
             [[group.task]]\nname = \"db\"\ndriver = \"mock\"\nnotify_socket = true\n\
             [[group.task]]\nname = \"cache\"\ndriver = \"mock\"\nnotify_socket = true\n"
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        Harness {
            driver: MockDriver::new(),
            store: MemoryStore::new(),
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

    fn runner(&self, alloc: Allocation) -> AllocRunner {
        AllocRunner::new(
            AllocRunnerConfig::new(alloc, Arc::new(self.store.clone()), self.dir.path().join("a1"))
                .with_driver(Arc::new(self.driver.clone()))
                .with_clock(Arc::new(TokioClock::starting_at(Timestamp(T0))))
                .with_poststop_timeout(Duration::from_secs(60)),
        )
        .unwrap()
    }

    fn start(&self) -> AllocRunner {
        let runner = self.runner(self.alloc.clone());
        let running = runner.clone();
        tokio::spawn(async move { running.run().await });
        runner
    }

    /// Says `READY=1` on `task`'s notify socket, as the task would.
    fn say_ready(&self, task: &str) {
        let socket = self.dir.path().join("a1").join(task).join("notify.sock");
        send(&socket, "STATUS=serving\nREADY=1\n");
    }
}

fn send(socket: &Path, datagram: &str) {
    let client = UnixDatagram::unbound().unwrap();
    client
        .send_to(datagram.as_bytes(), socket)
        .unwrap_or_else(|e| panic!("sending to {}: {e}", socket.display()));
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
                panic!("the runner is gone and never {what}");
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

fn both_running(state: &AllocState) -> bool {
    status(state, "db") == TaskStatus::Running && status(state, "cache") == TaskStatus::Running
}

/// `web` stays pending while `db` runs without saying it is ready, and starts once it does.
#[tokio::test(start_paused = true)]
async fn a_task_waits_until_the_named_task_says_ready() {
    let h = Harness::new("wait_ready = [\"db\"]");
    let runner = h.start();
    until(&runner, "db running", both_running).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let state = runner.state();
    assert_eq!(status(&state, "web"), TaskStatus::Pending, "held until db says READY=1");
    assert!(state.task_states["db"].ready_at.is_none());
    h.say_ready("db");
    let state = until(&runner, "web running", |s| status(s, "web") == TaskStatus::Running).await;
    let ready_at = state.task_states["db"].ready_at.expect("db's READY=1 is recorded");
    let started = state.task_states["web"].started_at.unwrap();
    assert!(started >= ready_at && (ready_at.0 - T0) / 1000 == 20, "{ready_at:?} {started:?}");
    assert_eq!(state.client_status, ClientStatus::Running);
    runner.destroy().await;
}

/// A task still waiting for `READY=1` at its `wait_deadline` fails the allocation; the reason
/// names the task that never said it.
#[tokio::test(start_paused = true)]
async fn no_ready_within_the_wait_deadline_fails_the_allocation_naming_the_task() {
    let h = Harness::new("wait_ready = [\"db\", \"cache\"]\nwait_deadline = \"30s\"");
    let runner = h.start();
    until(&runner, "db running", both_running).await;
    h.say_ready("db");
    let state = until(&runner, "failed", |s| s.client_status == ClientStatus::Failed).await;
    let web = &state.task_states["web"];
    assert!(web.failed && web.started_at.is_none(), "web never started: {web:#?}");
    let reason = web.events.iter().find_map(|e| match &e.kind {
        TaskEventKind::SetupFailure { error } => Some((error.clone(), e.time)),
        _ => None,
    });
    let (reason, at) = reason.unwrap_or_else(|| panic!("no failure event: {:#?}", web.events));
    assert_eq!(
        reason,
        "task \"cache\" did not say READY=1 within the wait_deadline of 30s of task \"web\""
    );
    assert_eq!((at.0 - T0) / 1000, 30, "at the deadline");
    runner.destroy().await;
}

/// The agent restarts between `db`'s READY=1 and `cache`'s: the restored allocation still
/// knows `db` is ready, binds `cache`'s socket again, hears it there, and starts `web`.
#[tokio::test(start_paused = true)]
async fn ready_heard_before_an_agent_restart_is_kept_and_ready_after_it_is_heard() {
    let h = Harness::new("wait_ready = [\"db\", \"cache\"]");
    let first = h.start();
    until(&first, "db running", both_running).await;
    h.say_ready("db");
    until(&first, "db ready", |s| s.task_states["db"].ready_at.is_some()).await;
    first.shutdown().await;
    drop(first);

    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    let second = h.runner(stored.alloc.clone());
    second.restore(&stored).await.unwrap();
    let running = second.clone();
    tokio::spawn(async move { running.run().await });
    let state = second.state();
    assert!(state.task_states["db"].ready_at.is_some(), "db's READY=1 survived the restart");
    assert_eq!(status(&state, "web"), TaskStatus::Pending);
    h.say_ready("cache");
    let state = until(&second, "web running", |s| status(s, "web") == TaskStatus::Running).await;
    assert!(state.task_states["cache"].ready_at.is_some());
    assert_eq!(h.driver.start_count("a1", "db"), 1, "db was reattached, not started again");
    assert_eq!(h.driver.start_count("a1", "web"), 1);
    second.destroy().await;
}
