//! Start ordering by readiness (`wait_healthy`): a task starts only once the tasks it names
//! pass their checks, and an allocation whose task waited past its `wait_deadline` fails with
//! a reason naming the task waited for. On the mock driver, the in-memory store and the fake
//! network, under tokio's paused clock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use wharf_alloc::{AllocRunner, AllocRunnerConfig, HealthConfig};
use wharf_driver::mock::MockDriver;
use wharf_health::ServiceCatalog;
use wharf_health::fake::{Answer, FakeTransport};
use wharf_state::{
    AllocState, AllocatedPort, Allocation, ClientStatus, DesiredStatus, TaskEventKind, TaskStatus,
    Timestamp, spec,
};
use wharf_store::MemoryStore;
use wharf_task::TokioClock;

const LIMIT: Duration = Duration::from_secs(3600);
const T0: u64 = 1_000_000;
const PORT: u16 = 20_002;

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], PORT))
}

/// Task `db` with an http check on port `db`, and task `web` waiting for it with `web_extra`.
fn runner(net: &Arc<FakeTransport>, dir: &tempfile::TempDir, web_extra: &str) -> AllocRunner {
    let doc = format!(
        "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
         [group.network.port.db]\n\
         [[group.task]]\nname = \"web\"\ndriver = \"mock\"\nwait_healthy = [\"db\"]\n{web_extra}\n\
         [[group.task]]\nname = \"db\"\ndriver = \"mock\"\n\
         [[group.task.service]]\nname = \"db\"\nport = \"db\"\n\
         [[group.task.service.check]]\nname = \"alive\"\ntype = \"http\"\npath = \"/health\"\n\
         interval = \"1s\"\ntimeout = \"1s\"\n"
    );
    let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
    let alloc = Allocation {
        id: "a1".into(),
        job,
        task_group: "g".into(),
        desired_status: DesiredStatus::Run,
        modify_index: 1,
        deployment_id: None,
        ports: vec![AllocatedPort {
            label: "db".into(),
            value: PORT,
            host_ip: [127, 0, 0, 1].into(),
        }],
    };
    let runner = AllocRunner::new(
        AllocRunnerConfig::new(alloc, Arc::new(MemoryStore::new()), dir.path().join("a1"))
            .with_driver(Arc::new(MockDriver::new()))
            .with_clock(Arc::new(TokioClock::starting_at(Timestamp(T0))))
            .with_poststop_timeout(Duration::from_secs(60))
            .with_health(HealthConfig {
                catalog: Arc::new(ServiceCatalog::new()),
                transport: net.clone(),
            }),
    )
    .unwrap();
    let running = runner.clone();
    tokio::spawn(async move { running.run().await });
    runner
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

fn secs_since_start(time: Option<Timestamp>) -> Option<u64> {
    time.map(|t| (t.0 - T0) / 1000)
}

/// `web` stays pending while `db` runs with a failing check, and starts once the check passes.
#[tokio::test(start_paused = true)]
async fn a_task_waits_until_the_named_tasks_check_passes() {
    let net = Arc::new(FakeTransport::new());
    let dir = tempfile::tempdir().unwrap();
    net.answer(addr(), Answer::Status(503));
    let runner = runner(&net, &dir, "");
    until(&runner, "db running", |s| status(s, "db") == TaskStatus::Running).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let state = runner.state();
    assert_eq!(status(&state, "web"), TaskStatus::Pending, "held while db's check fails");
    assert!(net.hits(addr()) >= 10, "db's check ran meanwhile: {}", net.hits(addr()));
    net.answer(addr(), Answer::Status(200));
    let state = until(&runner, "web running", |s| status(s, "web") == TaskStatus::Running).await;
    let started = secs_since_start(state.task_states["web"].started_at).unwrap();
    assert!((20..=22).contains(&started), "web started {started}s in, once the check passed");
    assert_eq!(state.client_status, ClientStatus::Running);
    runner.destroy().await;
}

/// A task still waiting at its `wait_deadline` fails the allocation; the reason names the task
/// it waited for.
#[tokio::test(start_paused = true)]
async fn the_wait_deadline_fails_the_allocation_naming_the_task() {
    let net = Arc::new(FakeTransport::new());
    let dir = tempfile::tempdir().unwrap();
    net.answer(addr(), Answer::Status(503));
    let runner = runner(&net, &dir, "wait_deadline = \"30s\"");
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
        "task \"db\" was not healthy within the wait_deadline of 30s of task \"web\""
    );
    assert_eq!(secs_since_start(Some(at)), Some(30), "at the deadline");
    assert_eq!(status(&state, "db"), TaskStatus::Dead, "db is killed with the allocation");
    runner.destroy().await;
}

/// A task that waits for nobody starts as before; one whose wait ended before its deadline is
/// not failed when the deadline passes.
#[tokio::test(start_paused = true)]
async fn a_passed_wait_is_not_failed_at_the_deadline() {
    let net = Arc::new(FakeTransport::new());
    let dir = tempfile::tempdir().unwrap();
    net.answer(addr(), Answer::Status(200));
    let runner = runner(&net, &dir, "wait_deadline = \"30s\"");
    until(&runner, "web running", |s| status(s, "web") == TaskStatus::Running).await;
    net.answer(addr(), Answer::Status(503));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let state = runner.state();
    assert_eq!(status(&state, "web"), TaskStatus::Running);
    assert_eq!(state.client_status, ClientStatus::Running);
    runner.destroy().await;
}
