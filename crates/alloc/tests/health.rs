//! Services, checks, check_restart and allocation health beside the alloc runner: Nomad's
//! health hook cases (its `TestHealthHook_*` tests, named in each test's doc) and the rule
//! that a judged allocation is not judged again after a restore, on the mock driver, the
//! in-memory store and the fake network, under tokio's paused clock. The health hooks' own
//! unit tests, on a fake runner, are in `src/health_hooks.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use wharf_alloc::{AllocRunner, AllocRunnerConfig, HealthConfig};
use wharf_driver::mock::MockDriver;
use wharf_health::ServiceCatalog;
use wharf_health::fake::{Answer, FakeTransport};
use wharf_state::{
    AllocState, AllocatedPort, Allocation, CheckStatus, ClientStatus, DesiredStatus, HealthCheck,
    TaskEventKind, TaskStatus, Timestamp, spec,
};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::TokioClock;

const LIMIT: Duration = Duration::from_secs(24 * 3600);
const T0: u64 = 1_000_000;
const PORT: u16 = 20_001;

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], PORT))
}

struct Harness {
    driver: MockDriver,
    store: MemoryStore,
    net: Arc<FakeTransport>,
    catalog: Arc<ServiceCatalog>,
    alloc: Allocation,
    dir: tempfile::TempDir,
}

impl Harness {
    /// A job of `job_type` with `group_extra` in its group (an update block) and one task
    /// `web` with `task_extra` (its config, services and checks), holding port `http`.
    fn new(job_type: &str, group_extra: &str, task_extra: &str) -> Harness {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"{job_type}\"\n[group]\nname = \"g\"\n\
             [group.network.port.http]\n{group_extra}\n\
             [[group.task]]\nname = \"web\"\ndriver = \"mock\"\n{task_extra}"
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        Harness {
            driver: MockDriver::new(),
            store: MemoryStore::new(),
            net: Arc::new(FakeTransport::new()),
            catalog: Arc::new(ServiceCatalog::new()),
            alloc: Allocation {
                id: "a1".into(),
                job,
                task_group: "g".into(),
                desired_status: DesiredStatus::Run,
                modify_index: 1,
                deployment_id: None,
                ports: vec![AllocatedPort {
                    label: "http".into(),
                    value: PORT,
                    host_ip: [127, 0, 0, 1].into(),
                }],
            },
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn runner(&self, alloc: Allocation) -> AllocRunner {
        self.runner_on(alloc, Arc::new(self.store.clone()))
    }

    fn runner_on(&self, alloc: Allocation, store: Arc<dyn StateStore>) -> AllocRunner {
        AllocRunner::new(
            AllocRunnerConfig::new(alloc, store, self.dir.path().join("a1"))
                .with_driver(Arc::new(self.driver.clone()))
                .with_clock(Arc::new(TokioClock::starting_at(Timestamp(T0))))
                .with_poststop_timeout(Duration::from_secs(60))
                .with_health(HealthConfig {
                    catalog: self.catalog.clone(),
                    transport: self.net.clone(),
                }),
        )
        .unwrap()
    }

    fn start(&self) -> AllocRunner {
        let runner = self.runner(self.alloc.clone());
        spawn_run(&runner);
        runner
    }
}

fn spawn_run(runner: &AllocRunner) {
    let runner = runner.clone();
    tokio::spawn(async move { runner.run().await });
}

const UPDATE: &str = "[group.update]\nmin_healthy_time = \"10s\"\nhealthy_deadline = \"1m\"\n";

/// A service `web` on port `http` with an http check (and `check_extra` in it).
fn service(check_extra: &str) -> String {
    format!(
        "[[group.task.service]]\nname = \"web\"\nport = \"http\"\ntags = [\"v1\"]\n\
         [[group.task.service.check]]\nname = \"alive\"\ntype = \"http\"\npath = \"/health\"\n\
         interval = \"1s\"\ntimeout = \"1s\"\n{check_extra}"
    )
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

fn healthy(state: &AllocState) -> Option<bool> {
    state.deployment_status.as_ref().and_then(|d| d.healthy)
}

/// Seconds after the start.
fn secs_since_start(time: Option<Timestamp>) -> Option<u64> {
    time.map(|t| (t.0 - T0) / 1000)
}

async fn elapse(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

/// `TestHealthHook_SetHealth_healthy`: a running task whose check passes is healthy once both
/// have been so for min_healthy_time; the verdict is persisted, with no unhealthy events.
#[tokio::test(start_paused = true)]
async fn set_health_healthy() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Status(200));
    let runner = h.start();
    let state = until(&runner, "healthy", |s| healthy(s).is_some()).await;
    assert_eq!(healthy(&state), Some(true));
    let at = secs_since_start(state.deployment_status.as_ref().unwrap().timestamp).unwrap();
    assert!((10..=11).contains(&at), "healthy {at}s in: the check's first run, then 10s");
    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(stored.deployment_status, state.deployment_status, "persisted");
    assert!(!state.task_states["web"].events.iter().any(|e| e.kind.title() == "Alloc Unhealthy"));
    let requests = h.net.requests(addr());
    assert!(requests.iter().all(|r| r.target == "/health" && r.method == "GET"));
    runner.destroy().await;
}

/// `TestHealthHook_SetHealth_unhealthy`: a check that fails keeps the allocation from being
/// healthy; at healthy_deadline it is unhealthy, with the reason in the deployment status and
/// an `Alloc Unhealthy` event on the task.
#[tokio::test(start_paused = true)]
async fn set_health_unhealthy() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Body(503, "warming up".into()));
    let runner = h.start();
    elapse(30).await;
    assert_eq!(healthy(&runner.state()), None, "not healthy, not yet unhealthy");
    let state = until(&runner, "judged", |s| healthy(s).is_some()).await;
    let status = state.deployment_status.unwrap();
    assert_eq!(status.healthy, Some(false));
    assert_eq!(secs_since_start(status.timestamp), Some(60), "at the deadline");
    assert_eq!(
        status.description.as_deref(),
        Some(
            "not healthy by its healthy_deadline of 1m0s; task \"web\": Services not healthy by deadline: web"
        )
    );
    let events: Vec<&TaskEventKind> =
        state.task_states["web"].events.iter().map(|e| &e.kind).collect();
    assert!(
        events.contains(&&TaskEventKind::AllocUnhealthy {
            message: "Services not healthy by deadline: web".into()
        }),
        "{events:?}"
    );
    let checks = runner.checks();
    assert_eq!(checks[0].status, CheckStatus::Critical);
    assert_eq!(checks[0].last.as_ref().unwrap().output, "HTTP GET /health: 503 R\nwarming up");
    runner.destroy().await;
}

/// `TestHealthHook_BatchNoop` and `TestHealthHook_System`: batch jobs are never judged; system
/// jobs are, like services. `health_check = "manual"` leaves it to an operator, and
/// `"task_states"` ignores the checks.
#[tokio::test(start_paused = true)]
async fn which_allocations_are_judged() {
    for (job_type, group, want) in [
        ("batch", UPDATE, None),
        ("sysbatch", UPDATE, None),
        ("system", UPDATE, Some(false)),
        ("service", "[group.update]\nhealth_check = \"manual\"\n", None),
        (
            "service",
            "[group.update]\nhealth_check = \"task_states\"\nmin_healthy_time = \"5s\"\n",
            Some(true),
        ),
    ] {
        let h = Harness::new(job_type, group, &service(""));
        let runner = h.start();
        elapse(400).await;
        assert_eq!(healthy(&runner.state()), want, "{job_type} {group}");
        runner.destroy().await;
    }
}

/// The deployment status is persisted and restored with the allocation (as Nomad's alloc
/// runner does in `persistDeploymentStatus` and `Restore`): an allocation judged before an
/// agent restart is not judged again after it, even if its checks now fail; its checks do
/// run again.
#[tokio::test(start_paused = true)]
async fn a_judged_allocation_is_not_judged_again_after_a_restore() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Status(200));
    let first = h.start();
    let judged = until(&first, "healthy", |s| healthy(s) == Some(true)).await;
    first.shutdown().await;
    assert!(h.catalog.is_empty(), "the agent leaving takes its services out");

    h.net.answer(addr(), Answer::Status(500));
    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    let second = h.runner(stored.alloc.clone());
    second.restore(&stored).await.unwrap();
    spawn_run(&second);
    until(&second, "reattached", |s| {
        s.task_states["web"].events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    let before = h.net.hits(addr());
    elapse(120).await;
    assert!(h.net.hits(addr()) > before + 100, "the checks resumed");
    assert_eq!(second.checks()[0].status, CheckStatus::Critical);
    assert_eq!(second.state().deployment_status, judged.deployment_status, "the verdict stands");
    assert_eq!(h.catalog.list()[0].health, CheckStatus::Critical);
    second.destroy().await;
}

/// A stopped allocation gets no health (Nomad's tracker marks it stopped); its services leave
/// the catalog before its task is killed, and the checks stop.
#[tokio::test(start_paused = true)]
async fn services_leave_the_catalog_before_the_kill() {
    let h = Harness::new(
        "service",
        UPDATE,
        &format!("kill_timeout = \"20s\"\nconfig = {{ kill_after = \"5s\" }}\n{}", service("")),
    );
    h.net.answer(addr(), Answer::Status(200));
    let runner = h.start();
    until(&runner, "running", |s| s.task_states["web"].status == TaskStatus::Running).await;
    let listed = h.catalog.list();
    assert_eq!(listed.len(), 1);
    let entry = &listed[0];
    assert_eq!(
        (
            entry.name.as_str(),
            entry.address,
            entry.port,
            entry.tags.as_slice(),
            entry.task.as_str()
        ),
        ("web", Some([127, 0, 0, 1].into()), Some(PORT), &["v1".to_owned()][..], "web")
    );
    elapse(3).await;
    runner.update(Allocation {
        desired_status: DesiredStatus::Stop,
        modify_index: 2,
        ..h.alloc.clone()
    });
    let killing = until(&runner, "killing", |s| {
        s.task_states["web"].events.iter().any(|e| e.kind.title() == "Killing")
    })
    .await;
    assert_eq!(killing.task_states["web"].status, TaskStatus::Running, "the task still runs");
    assert!(h.catalog.is_empty(), "its service is gone already");
    let hits = h.net.hits(addr());
    tokio::time::timeout(LIMIT, runner.wait()).await.unwrap();
    assert_eq!(h.net.hits(addr()), hits, "no check after the kill began");
    assert_eq!(healthy(&runner.state()), None, "a stopped allocation gets no health");
    // `TestCheckHook_Checks_ResultsSet`'s end: a killed task's results are gone, as Nomad's
    // checks hook purges them before the kill.
    let check = runner.checks().remove(0);
    assert_eq!((check.status, check.last), (CheckStatus::Pending, None));
}

/// check_restart (Nomad's watcher calling `Restart(..., failure = true)`): a task whose check
/// keeps failing is restarted through its restart policy, with an event that names the check;
/// once the policy's attempts are used up the task fails, and so does the allocation's health.
#[tokio::test(start_paused = true)]
async fn check_restart_restarts_the_task_through_its_restart_policy() {
    let task = format!(
        "restart = {{ attempts = 1, interval = \"10m\", delay = \"2s\", mode = \"fail\" }}\n{}",
        service("check_restart = { limit = 3, grace = \"5s\" }\n")
    );
    let h = Harness::new(
        "service",
        "[group.update]\nmin_healthy_time = \"10s\"\nhealthy_deadline = \"5m\"\n",
        &task,
    );
    h.net.answer(addr(), Answer::Status(500));
    let runner = h.start();
    let state = until(&runner, "failed", |s| s.task_states["web"].failed).await;
    let web = &state.task_states["web"];
    let kinds: Vec<&TaskEventKind> = web.events.iter().map(|e| &e.kind).collect();
    let signaled =
        TaskEventKind::RestartSignaled { reason: "healthcheck: check \"alive\" unhealthy".into() };
    assert!(kinds.contains(&&signaled), "{kinds:#?}");
    assert!(
        kinds.iter().any(|k| matches!(k, TaskEventKind::NotRestarting { reason } if reason.contains("Exceeded allowed attempts 1"))),
        "{kinds:#?}"
    );
    assert_eq!(web.restarts, 1);
    assert_eq!(h.driver.start_count("a1", "web"), 2);
    let state = until(&runner, "judged", |s| healthy(s).is_some()).await;
    assert_eq!(healthy(&state), Some(false));
    assert_eq!(state.client_status, ClientStatus::Failed);
}

/// Nomad's check_restart rule (`checkRestart.apply` in its check watcher): a failing result
/// within `grace` of the start is not counted; after it, failures in a row are, a passing
/// result resets the count, and the `limit`-th failure in a row restarts the task, once. The
/// cases, in order, on one task (limit 3, grace 20s, a check every second):
/// - grace: failing from the start until 15s, all within the grace: no restart;
/// - `TestCheckWatcher_Flapping`: after the grace, two failures in a row (one short of the
///   limit), then passes: no restart;
/// - `TestCheckWatcher_Unhealthy`: three failures in a row: the task is restarted exactly once.
///
/// Each answer changes half a second off the checks' beat, so each window holds a known
/// number of results (the test counts the requests to be sure).
#[tokio::test(start_paused = true)]
async fn check_restart_waits_for_grace_and_limit() {
    let task = format!(
        "restart = {{ attempts = 2, interval = \"10m\", delay = \"2s\", mode = \"fail\" }}\n{}",
        service("check_restart = { limit = 3, grace = \"20s\" }\n")
    );
    let h = Harness::new("service", UPDATE, &task);
    let runner = h.start();
    let requests = || h.net.requests(addr()).len();
    let starts = || (h.driver.start_count("a1", "web"), runner.state().task_states["web"].restarts);

    // Grace: nothing answers (critical) until 15s.
    elapse(15).await;
    assert_eq!(starts(), (1, 0), "failures within the grace");
    assert!(requests() >= 14, "the check ran, and was refused, {} times", requests());
    h.net.answer(addr(), Answer::Status(200));
    elapse(60).await;
    assert_eq!(h.driver.start_count("a1", "web"), 1);
    assert_eq!(runner.state().task_states["web"].restarts, 0);

    // TestCheckWatcher_Flapping: two failures after the grace, then passes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = requests();
    h.net.answer(addr(), Answer::Status(500));
    elapse(2).await;
    assert_eq!(requests() - before, 2, "two failing results");
    assert_eq!(runner.checks()[0].status, CheckStatus::Critical);
    h.net.answer(addr(), Answer::Status(200));
    elapse(30).await;
    assert_eq!(runner.checks()[0].status, CheckStatus::Passing);
    assert_eq!(starts(), (1, 0), "one short of the limit, then a pass: no restart");

    // TestCheckWatcher_Unhealthy: three failures in a row restart the task; its next run has a
    // grace of its own, in which the check passes again.
    let before = requests();
    h.net.answer(addr(), Answer::Status(500));
    elapse(3).await;
    assert_eq!(requests() - before, 3, "three failing results");
    // At the third failure, not later.
    let state = runner.state();
    let signaled =
        TaskEventKind::RestartSignaled { reason: "healthcheck: check \"alive\" unhealthy".into() };
    assert!(state.task_states["web"].events.iter().any(|e| e.kind == signaled));
    elapse(5).await;
    assert_eq!(starts(), (2, 1));
    h.net.answer(addr(), Answer::Status(200));
    elapse(60).await;
    assert_eq!(starts(), (2, 1), "restarted once");
    runner.destroy().await;
}

/// Script checks run inside the task through the driver's exec.
#[tokio::test(start_paused = true)]
async fn script_checks_run_through_the_drivers_exec() {
    let task = "config = { exec_stdout = \"all good\", exec_exit_code = 1 }\n\
        [[group.task.service]]\nname = \"web\"\n\
        [[group.task.service.check]]\nname = \"script\"\ntype = \"script\"\ncommand = \"/bin/check\"\n\
        interval = \"2s\"\ntimeout = \"1s\"\n";
    let h = Harness::new("service", UPDATE, task);
    let runner = h.start();
    elapse(5).await;
    let check = runner.checks().remove(0);
    assert_eq!(
        (check.status, check.last.unwrap().output),
        (CheckStatus::Warning, "all good".to_owned())
    );
    assert_eq!(h.catalog.list()[0].health, CheckStatus::Warning);
    assert_eq!(h.catalog.list()[0].port, None, "a service without a port");
    runner.destroy().await;
    assert!(h.catalog.is_empty());
}

/// A store whose deployment status writes wait until the test lets them through.
#[derive(Debug, Clone, Default)]
struct GatedStore {
    inner: MemoryStore,
    writing: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl StateStore for GatedStore {
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
    async fn put_deployment_status(
        &self,
        alloc_id: &str,
        status: &wharf_state::DeploymentStatus,
    ) -> Result<(), wharf_store::StoreError> {
        self.writing.notify_one();
        self.release.notified().await;
        self.inner.put_deployment_status(alloc_id, status).await
    }
}

/// The deployment status is persisted before anyone is told of it (as Nomad's alloc runner's
/// `SetHealth` does): no watcher sees a verdict the store does not hold, so a verdict someone
/// was told of survives a crash and is not judged again.
#[tokio::test(start_paused = true)]
async fn health_is_durable_before_anyone_sees_it() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Status(200));
    let store = GatedStore::default();
    let runner = h.runner_on(h.alloc.clone(), Arc::new(store.clone()));
    spawn_run(&runner);
    tokio::time::timeout(LIMIT, store.writing.notified()).await.expect("health is written");
    elapse(5).await;
    assert_eq!(healthy(&runner.state()), None, "not seen while the write is under way");
    store.release.notify_one();
    let state = until(&runner, "healthy", |s| healthy(s).is_some()).await;
    let stored = store.inner.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(stored.deployment_status, state.deployment_status);
    runner.destroy().await;
}

/// Seconds since the start of the test's clock.
fn now_secs(start: tokio::time::Instant) -> u64 {
    start.elapsed().as_secs()
}

/// `TestHealthHook_PrerunUpdatePostrun`: updates while the allocation is watched are applied
/// one after the other without error, and each starts the watch over (Nomad's health hook
/// cancels its tracker and makes a new one): health comes min_healthy_time after the last.
#[tokio::test(start_paused = true)]
async fn prerun_update_postrun() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Status(200));
    let start = tokio::time::Instant::now();
    let runner = h.start();
    elapse(4).await;
    for index in [2, 3] {
        runner.update(Allocation { modify_index: index, ..h.alloc.clone() });
        elapse(2).await;
    }
    let state = until(&runner, "healthy", |s| healthy(s).is_some()).await;
    assert_eq!(healthy(&state), Some(true));
    assert!(
        now_secs(start) >= 16,
        "judged {}s in, before 10s after the last update",
        now_secs(start)
    );
    assert_eq!(state.deployment_status.unwrap().modify_index, 1, "one verdict, written once");
    // Postrun: the run ends and so does everything of it.
    runner.update(Allocation {
        desired_status: DesiredStatus::Stop,
        modify_index: 4,
        ..h.alloc.clone()
    });
    tokio::time::timeout(LIMIT, runner.wait()).await.unwrap();
    assert!(h.catalog.is_empty());
}

/// `TestHealthHook_UpdatePrerunPostrun`: an update queued before the run may reach the hook
/// before prerun does; either way one watcher judges the allocation, once, as the update
/// says: here its `health_check = "task_states"` makes a failing check not matter.
#[tokio::test(start_paused = true)]
async fn update_prerun_postrun() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Status(500));
    let runner = h.runner(h.alloc.clone());
    let mut updated = h.alloc.clone();
    updated.modify_index = 2;
    updated.deployment_id = Some("d1".into());
    updated.job.groups[0].update.as_mut().unwrap().health_check = HealthCheck::TaskStates;
    runner.update(updated);
    spawn_run(&runner);
    let state = until(&runner, "healthy", |s| healthy(s).is_some()).await;
    assert_eq!(healthy(&state), Some(true), "{:?}", state.deployment_status);
    assert_eq!(state.deployment_status.unwrap().modify_index, 1, "one verdict, written once");
    assert_eq!(runner.checks()[0].status, CheckStatus::Critical);
    runner.destroy().await;
}

/// `TestHealthHook_Postrun`: an allocation stopped before it ran has only its postrun: no
/// prerun, no watcher, no health, and its run ends.
#[tokio::test(start_paused = true)]
async fn postrun_without_prerun() {
    let h = Harness::new("service", UPDATE, &service(""));
    let runner = h.runner(Allocation { desired_status: DesiredStatus::Stop, ..h.alloc.clone() });
    spawn_run(&runner);
    tokio::time::timeout(LIMIT, runner.wait()).await.unwrap();
    elapse(120).await;
    assert_eq!(healthy(&runner.state()), None);
    assert_eq!(h.driver.start_count("a1", "web"), 0);
    assert!(h.catalog.is_empty());
}

/// Nomad's health hook `Update` with a new deployment id (`ClearHealth`): the health the old
/// deployment was given is cleared, durably, and the allocation is judged again for the new
/// one, here unhealthy at its deadline since its check now fails.
#[tokio::test(start_paused = true)]
async fn a_new_deployment_is_judged_again() {
    let h = Harness::new("service", UPDATE, &service(""));
    h.net.answer(addr(), Answer::Status(200));
    let alloc = Allocation { deployment_id: Some("d1".into()), ..h.alloc.clone() };
    let runner = h.runner(alloc.clone());
    spawn_run(&runner);
    until(&runner, "healthy", |s| healthy(s) == Some(true)).await;

    // The same deployment again: the verdict stands.
    runner.update(Allocation { modify_index: 2, ..alloc.clone() });
    elapse(70).await;
    assert_eq!(healthy(&runner.state()), Some(true));

    h.net.answer(addr(), Answer::Status(500));
    runner.update(Allocation {
        modify_index: 3,
        deployment_id: Some("d2".into()),
        ..alloc.clone()
    });
    let cleared = until(&runner, "cleared", |s| healthy(s).is_none()).await;
    let stored = h.store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(stored.deployment_status, cleared.deployment_status, "cleared durably");
    let state = until(&runner, "judged again", |s| healthy(s).is_some()).await;
    let status = state.deployment_status.unwrap();
    assert_eq!(status.healthy, Some(false));
    assert!(status.description.unwrap().contains("Services not healthy by deadline: web"));
    assert_eq!(h.driver.start_count("a1", "web"), 1, "the task ran on");
    runner.destroy().await;
}

/// `TestCheckHook_Checks_UpdateSet`: an update that changes a running task's checks (a check's
/// path fixed, a check added) and its service's tags puts them in place without restarting the
/// task: the changed and the new check start pending, then run as now defined.
#[tokio::test(start_paused = true)]
async fn checks_update_set() {
    let checks = |hang_path: &str, extra: &str| {
        format!(
            "[[group.task.service]]\nname = \"web\"\nport = \"http\"\ntags = [\"v1\"]\n\
             {ok}{error}{hang}{extra}",
            ok = check_block("check-ok", "/"),
            error = check_block("check-error", "/fail"),
            hang = check_block("check-hang", hang_path),
        )
    };
    let h = Harness::new("service", UPDATE, &checks("/hang", ""));
    h.net.answer(addr(), Answer::Status(200));
    h.net.answer_path(addr(), "/fail", Answer::Body(500, "500 problem".into()));
    h.net.answer_path(addr(), "/hang", Answer::Hang);
    let runner = h.start();
    elapse(5).await;
    assert_eq!(tally(&runner), (1, 2, 0), "initial set: passing, failing, pending");

    let mut updated = h.alloc.clone();
    updated.modify_index = 2;
    let doc = format!(
        "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
         [group.network.port.http]\n{UPDATE}\n\
         [[group.task]]\nname = \"web\"\ndriver = \"mock\"\n{}",
        checks("/", &check_block("check-error-2", "/fail")).replace("[\"v1\"]", "[\"v2\"]")
    );
    updated.job = spec::parse_toml(&doc).unwrap();
    runner.update(updated);
    elapse(5).await;
    assert_eq!(tally(&runner), (2, 2, 0), "updated set: passing, failing, pending");
    assert_eq!(h.driver.start_count("a1", "web"), 1, "not restarted");
    assert_eq!(h.catalog.list()[0].tags, ["v2"]);
    runner.destroy().await;
    assert!(runner.checks().iter().all(|c| c.status == CheckStatus::Pending && c.last.is_none()));
}

/// An http check block named `name` asking for `path`.
fn check_block(name: &str, path: &str) -> String {
    format!(
        "[[group.task.service.check]]\nname = \"{name}\"\ntype = \"http\"\npath = \"{path}\"\n\
         interval = \"1s\"\ntimeout = \"1s\"\n"
    )
}

/// How many of the allocation's checks pass, fail and wait.
fn tally(runner: &AllocRunner) -> (usize, usize, usize) {
    let checks = runner.checks();
    let count = |status| checks.iter().filter(|c| c.status == status).count();
    (count(CheckStatus::Passing), count(CheckStatus::Critical), count(CheckStatus::Pending))
}

/// Nomad's `Test_serviceHook_Update_beforePoststart`: an update that reaches a task before it
/// has started registers nothing; the task registers its services when it starts, as the
/// update left them.
#[tokio::test(start_paused = true)]
async fn service_hook_update_before_poststart() {
    let h = Harness::new(
        "service",
        UPDATE,
        &format!("config = {{ start_block_for = \"10s\" }}\n{}", service("")),
    );
    h.net.answer(addr(), Answer::Status(200));
    let runner = h.start();
    elapse(2).await;
    let mut updated = Allocation { modify_index: 2, ..h.alloc.clone() };
    updated.job.groups[0].tasks[0].services[0].tags = vec!["v2".into()];
    runner.update(updated);
    elapse(2).await;
    assert!(h.catalog.is_empty(), "not started yet: nothing registered");
    until(&runner, "running", |s| s.task_states["web"].status == TaskStatus::Running).await;
    let listed = listed(&h.catalog).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].tags, ["v2"], "registered as the update left it");
    runner.destroy().await;
}

/// The catalog once something is in it: services are registered right after their task's
/// start is recorded (its poststart hooks), which the catalog has no notification for.
async fn listed(catalog: &ServiceCatalog) -> Vec<wharf_state::ServiceEntry> {
    for _ in 0..1000 {
        if !catalog.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    catalog.list()
}
