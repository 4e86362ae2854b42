//! Allocation health, Nomad's tracker cases (`client/allochealth/tracker_test.go`) as tables
//! over wharf's pure tracker: what it concludes from task states and check statuses, and when.

use std::time::Duration;
use wharf_health::CheckId;
use wharf_health::tracker::{CheckView, HealthTracker, Progress, Snapshot, TaskView, Verdict};
use wharf_state::service::{HealthCheck, OnUpdate, UpdateStrategy};
use wharf_state::spec::Stage;
use wharf_state::{CheckStatus, TaskState, TaskStatus};

const MIN: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(300);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn strategy(health_check: HealthCheck) -> UpdateStrategy {
    UpdateStrategy { health_check, min_healthy_time: MIN, healthy_deadline: DEADLINE }
}

fn state(status: TaskStatus) -> TaskState {
    TaskState { status, ..TaskState::new() }
}

fn check(task: &str, service: &str, status: CheckStatus) -> CheckView {
    CheckView::new(
        CheckId { task: task.into(), service: service.into(), check: "c".into() },
        status,
    )
}

/// A task as the tests write it: name, stage, state.
type Task<'a> = (&'a str, Stage, TaskState);

/// A snapshot of tasks and checks.
fn snapshot<'a>(tasks: &'a [Task<'a>], checks: &[CheckView]) -> Snapshot<'a> {
    Snapshot {
        stopping: false,
        failed: false,
        tasks: tasks
            .iter()
            .map(|(name, stage, state)| TaskView { name, stage: *stage, state })
            .collect(),
        checks: checks.to_vec(),
    }
}

fn healthy() -> Progress {
    Progress::Judged(Verdict::Healthy)
}

fn waiting(at: u64) -> Progress {
    Progress::Waiting { wake_at: secs(at) }
}

fn unhealthy_because(progress: &Progress) -> (&str, Vec<(&str, &str)>) {
    match progress {
        Progress::Judged(Verdict::Unhealthy { reason, task_events }) => {
            (reason, task_events.iter().map(|(t, m)| (t.as_str(), m.as_str())).collect())
        }
        other => panic!("expected unhealthy, got {other:?}"),
    }
}

/// `TestTracker_NomadChecks_Healthy`: a running task whose check goes from pending to passing
/// is healthy once the check has passed for min_healthy_time.
#[test]
fn nomad_checks_healthy() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    let pending = [check("web", "web", CheckStatus::Pending)];
    let passing = [check("web", "web", CheckStatus::Passing)];
    assert_eq!(tracker.observe(&snapshot(&tasks, &pending), secs(0)), waiting(300));
    assert_eq!(
        tracker.observe(&snapshot(&tasks, &pending), secs(10)),
        waiting(300),
        "tasks alone are not enough"
    );
    assert_eq!(tracker.observe(&snapshot(&tasks, &passing), secs(15)), waiting(25));
    assert_eq!(tracker.observe(&snapshot(&tasks, &passing), secs(25)), healthy());
    // Judged once and for all.
    let failing = [check("web", "web", CheckStatus::Critical)];
    assert_eq!(tracker.observe(&snapshot(&tasks, &failing), secs(26)), healthy());
}

/// `TestTracker_NomadChecks_Unhealthy`: a check that fails keeps the allocation from being
/// healthy, and at the deadline it is unhealthy, naming the service.
#[test]
fn nomad_checks_unhealthy() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    let failing =
        [check("web", "api", CheckStatus::Critical), check("web", "web", CheckStatus::Passing)];
    for at in [0, 10, 100, 299] {
        assert!(
            matches!(
                tracker.observe(&snapshot(&tasks, &failing), secs(at)),
                Progress::Waiting { .. }
            ),
            "at {at}s"
        );
    }
    let judged = tracker.observe(&snapshot(&tasks, &failing), secs(300));
    let (reason, events) = unhealthy_because(&judged);
    assert_eq!(events, [("web", "Services not healthy by deadline: api")]);
    assert_eq!(
        reason,
        "not healthy by its healthy_deadline of 5m0s; task \"web\": Services not healthy by deadline: api"
    );
}

/// `TestTracker_Checks_PendingPostStop_Healthy`: a poststop task waiting to run does not
/// hold health back.
#[test]
fn checks_pending_poststop_healthy() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [
        ("web", Stage::Main, state(TaskStatus::Running)),
        ("post", Stage::Poststop, state(TaskStatus::Pending)),
    ];
    tracker.observe(&snapshot(&tasks, &[]), secs(0));
    assert_eq!(tracker.observe(&snapshot(&tasks, &[]), secs(10)), healthy());
}

/// `TestTracker_Succeeded_PostStart_Healthy`: a poststart task that completed does not hold
/// health back; neither does a prestart task that completed.
#[test]
fn succeeded_poststart_healthy() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [
        ("init", Stage::PrestartEphemeral, state(TaskStatus::Dead)),
        ("web", Stage::Main, state(TaskStatus::Running)),
        ("post", Stage::PoststartEphemeral, state(TaskStatus::Dead)),
    ];
    tracker.observe(&snapshot(&tasks, &[]), secs(0));
    assert_eq!(tracker.observe(&snapshot(&tasks, &[]), secs(10)), healthy());
}

/// `TestTracker_ConsulChecks_HealthyToUnhealthy`: a check that fails within min_healthy_time
/// starts the wait over; it must pass for the whole of it.
#[test]
fn checks_healthy_to_unhealthy() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    let at = |status| [check("web", "web", status)];
    assert_eq!(tracker.observe(&snapshot(&tasks, &at(CheckStatus::Passing)), secs(0)), waiting(10));
    assert_eq!(
        tracker.observe(&snapshot(&tasks, &at(CheckStatus::Critical)), secs(5)),
        waiting(300)
    );
    assert_eq!(
        tracker.observe(&snapshot(&tasks, &at(CheckStatus::Critical)), secs(10)),
        waiting(300)
    );
    assert_eq!(
        tracker.observe(&snapshot(&tasks, &at(CheckStatus::Passing)), secs(12)),
        waiting(22)
    );
    assert_eq!(
        tracker.observe(&snapshot(&tasks, &at(CheckStatus::Warning)), secs(20)),
        waiting(300),
        "a warning does not pass"
    );
    assert_eq!(
        tracker.observe(&snapshot(&tasks, &at(CheckStatus::Passing)), secs(21)),
        waiting(31)
    );
    assert_eq!(tracker.observe(&snapshot(&tasks, &at(CheckStatus::Passing)), secs(31)), healthy());
}

/// `TestTracker_ConsulChecks_SlowCheckRegistration`: a check with no result yet is not
/// passing; once it passes, health follows.
#[test]
fn slow_check_registration() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    for at in 0..20 {
        let pending = [check("web", "web", CheckStatus::Pending)];
        assert!(matches!(
            tracker.observe(&snapshot(&tasks, &pending), secs(at)),
            Progress::Waiting { .. }
        ));
    }
    let passing = [check("web", "web", CheckStatus::Passing)];
    assert_eq!(tracker.observe(&snapshot(&tasks, &passing), secs(20)), waiting(30));
    assert_eq!(tracker.observe(&snapshot(&tasks, &passing), secs(30)), healthy());
}

/// `TestTracker_Healthy_IfBothTasksAndConsulChecksAreHealthy` and
/// `TestTracker_Checks_Healthy_Before_TaskHealth`: checks passing while a task is still
/// pending do not count; health needs both, checks counted from when every task runs.
#[test]
fn healthy_only_if_both_tasks_and_checks_are() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let passing = [check("web", "web", CheckStatus::Passing)];
    let starting = [
        ("web", Stage::Main, state(TaskStatus::Running)),
        ("web2", Stage::Main, state(TaskStatus::Pending)),
    ];
    for at in [0, 10, 40] {
        assert_eq!(
            tracker.observe(&snapshot(&starting, &passing), secs(at)),
            waiting(300),
            "at {at}s"
        );
    }
    let running = [
        ("web", Stage::Main, state(TaskStatus::Running)),
        ("web2", Stage::Main, state(TaskStatus::Running)),
    ];
    assert_eq!(tracker.observe(&snapshot(&running, &passing), secs(50)), waiting(60));
    assert_eq!(tracker.observe(&snapshot(&running, &passing), secs(59)), waiting(60));
    assert_eq!(tracker.observe(&snapshot(&running, &passing), secs(60)), healthy());
}

/// With `task_states`, checks do not count (Nomad's `UpdateStrategyHealthCheck_TaskStates`);
/// with checks, an allocation without any is judged on its tasks.
#[test]
fn task_states_ignores_checks() {
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    let failing = [check("web", "web", CheckStatus::Critical)];
    let mut tracker = HealthTracker::new(strategy(HealthCheck::TaskStates));
    assert_eq!(tracker.observe(&snapshot(&tasks, &failing), secs(0)), waiting(10));
    assert_eq!(tracker.observe(&snapshot(&tasks, &failing), secs(10)), healthy());
    let mut without_checks = HealthTracker::new(strategy(HealthCheck::Checks));
    without_checks.observe(&snapshot(&tasks, &[]), secs(0));
    assert_eq!(without_checks.observe(&snapshot(&tasks, &[]), secs(10)), healthy());
}

/// A task that restarts within min_healthy_time starts the wait over (Nomad compares the
/// tasks' latest start).
#[test]
fn a_restart_starts_the_wait_over() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::TaskStates));
    let running =
        |restarts| [("web", Stage::Main, TaskState { restarts, ..state(TaskStatus::Running) })];
    assert_eq!(tracker.observe(&snapshot(&running(0), &[]), secs(0)), waiting(10));
    assert_eq!(
        tracker.observe(&snapshot(&running(1), &[]), secs(8)),
        waiting(18),
        "restarted between looks"
    );
    let restarting =
        [("web", Stage::Main, TaskState { restarts: 2, ..state(TaskStatus::Pending) })];
    assert_eq!(tracker.observe(&snapshot(&restarting, &[]), secs(12)), waiting(300));
    assert_eq!(tracker.observe(&snapshot(&running(2), &[]), secs(13)), waiting(23));
    assert_eq!(tracker.observe(&snapshot(&running(2), &[]), secs(23)), healthy());
}

/// A failed or dead task, or a failed allocation, is unhealthy at once; a stopping
/// allocation gets no health (Nomad's `markAllocStopped`).
#[test]
fn terminal_states_and_stops() {
    let cases: Vec<(Vec<Task<'_>>, bool, &str)> = vec![
        (
            vec![("web", Stage::Main, TaskState { failed: true, ..state(TaskStatus::Dead) })],
            false,
            "task \"web\": Unhealthy because of failed task",
        ),
        (
            vec![
                ("web", Stage::Main, state(TaskStatus::Running)),
                ("side", Stage::PrestartSidecar, state(TaskStatus::Dead)),
            ],
            false,
            "task \"side\": Unhealthy because of dead task",
        ),
        (
            vec![(
                "init",
                Stage::PrestartEphemeral,
                TaskState { failed: true, ..state(TaskStatus::Dead) },
            )],
            false,
            "task \"init\": Unhealthy because of failed task",
        ),
        (vec![("web", Stage::Main, state(TaskStatus::Pending))], true, "the allocation failed"),
    ];
    for (tasks, failed, want) in cases {
        let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
        let mut snap = snapshot(&tasks, &[]);
        snap.failed = failed;
        let judged = tracker.observe(&snap, secs(1));
        assert_eq!(unhealthy_because(&judged).0, want);
    }
    let tasks = [("web", Stage::Main, TaskState { failed: true, ..state(TaskStatus::Dead) })];
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let mut stopping = snapshot(&tasks, &[]);
    stopping.stopping = true;
    assert_eq!(tracker.observe(&stopping, secs(1)), Progress::Stopped);
}

/// Nomad's `taskHealthState.event` messages at the deadline: a task that never ran, and one
/// that did not run long enough.
#[test]
fn deadline_reasons_per_task() {
    let mut tracker = HealthTracker::new(UpdateStrategy {
        health_check: HealthCheck::Checks,
        min_healthy_time: secs(10),
        healthy_deadline: secs(20),
    });
    let tasks = [
        ("web", Stage::Main, state(TaskStatus::Running)),
        ("db", Stage::Main, state(TaskStatus::Pending)),
    ];
    let judged = tracker.observe(&snapshot(&tasks, &[]), secs(20));
    let (reason, events) = unhealthy_because(&judged);
    assert_eq!(
        events,
        [
            ("db", "Task not running by healthy_deadline of 20s"),
            ("web", "Task not running for min_healthy_time of 10s by healthy_deadline of 20s"),
        ]
    );
    assert!(
        reason.starts_with("not healthy by its healthy_deadline of 20s; task \"db\""),
        "{reason}"
    );

    // Tasks healthy, checks passing but not for long enough: the reason says so.
    let mut late = HealthTracker::new(UpdateStrategy {
        health_check: HealthCheck::Checks,
        min_healthy_time: secs(10),
        healthy_deadline: secs(20),
    });
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    late.observe(&snapshot(&tasks, &[check("web", "web", CheckStatus::Critical)]), secs(0));
    late.observe(&snapshot(&tasks, &[check("web", "web", CheckStatus::Passing)]), secs(15));
    let judged =
        late.observe(&snapshot(&tasks, &[check("web", "web", CheckStatus::Passing)]), secs(20));
    assert_eq!(
        unhealthy_because(&judged).0,
        "not healthy by its healthy_deadline of 20s: its checks did not pass for min_healthy_time of 10s"
    );
}

/// A running task `web` with `checks`, looked at once and then `MIN` later: whether that makes
/// it healthy.
fn healthy_with(checks: &[CheckView]) -> bool {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    tracker.observe(&snapshot(&tasks, checks), secs(0));
    tracker.observe(&snapshot(&tasks, checks), MIN) == healthy()
}

fn with_on_update(mut check: CheckView, on_update: OnUpdate) -> CheckView {
    check.on_update = on_update;
    check
}

/// `TestTracker_NomadChecks_OnUpdate`: a healthiness check (`require_healthy`) must pass; a
/// readiness check (`on_update = "ignore"`) does not count, failing or not.
#[test]
fn nomad_checks_on_update() {
    let cases = [
        ("healthiness, passing", OnUpdate::RequireHealthy, CheckStatus::Passing, true),
        ("healthiness, failing", OnUpdate::RequireHealthy, CheckStatus::Critical, false),
        ("readiness, passing", OnUpdate::Ignore, CheckStatus::Passing, true),
        ("readiness, failing", OnUpdate::Ignore, CheckStatus::Critical, true),
    ];
    for (name, on_update, status, want) in cases {
        let checks = [with_on_update(check("web", "web", status), on_update)];
        assert_eq!(healthy_with(&checks), want, "{name}");
    }
}

/// `TestTracker_ConsulChecks_OnUpdate`: `ignore_warnings` lets a warning pass but not a
/// critical check; `ignore` lets anything pass.
#[test]
fn checks_on_update() {
    let cases = [
        ("require_healthy, passing", OnUpdate::RequireHealthy, CheckStatus::Passing, true),
        ("require_healthy, warning", OnUpdate::RequireHealthy, CheckStatus::Warning, false),
        ("ignore_warnings, warning", OnUpdate::IgnoreWarnings, CheckStatus::Warning, true),
        ("ignore_warnings, critical", OnUpdate::IgnoreWarnings, CheckStatus::Critical, false),
        ("ignore_warnings, passing", OnUpdate::IgnoreWarnings, CheckStatus::Passing, true),
        ("ignore_warnings, pending", OnUpdate::IgnoreWarnings, CheckStatus::Pending, false),
        ("ignore, critical", OnUpdate::Ignore, CheckStatus::Critical, true),
    ];
    for (name, on_update, status, want) in cases {
        let checks = [with_on_update(check("web", "web", status), on_update)];
        assert_eq!(healthy_with(&checks), want, "{name}");
    }
}

/// `TestTracker_evaluateConsulChecks`: no checks pass; a check with no result yet (not
/// registered, in Consul's terms) or a failing one, in any service, does not; every check
/// passing, or failing only where it does not count, does.
#[test]
fn evaluate_checks() {
    let pending = CheckStatus::Pending;
    let cases: Vec<(&str, Vec<CheckView>, bool)> = vec![
        ("no checks", vec![], true),
        (
            "missing check",
            vec![check("web", "s1", pending), check("web", "s2", CheckStatus::Passing)],
            false,
        ),
        (
            "failing check of another service",
            vec![
                check("web", "s1", CheckStatus::Passing),
                check("web", "s2", CheckStatus::Critical),
            ],
            false,
        ),
        (
            "passing checks",
            vec![
                check("web", "s1", CheckStatus::Passing),
                check("web", "s2", CheckStatus::Passing),
            ],
            true,
        ),
        (
            "on update ignore warn",
            vec![with_on_update(
                check("web", "s1", CheckStatus::Warning),
                OnUpdate::IgnoreWarnings,
            )],
            true,
        ),
        (
            "on update ignore critical",
            vec![
                with_on_update(check("web", "s1", CheckStatus::Critical), OnUpdate::Ignore),
                check("web", "s2", CheckStatus::Passing),
            ],
            true,
        ),
    ];
    for (name, checks, want) in cases {
        assert_eq!(healthy_with(&checks), want, "{name}");
    }
}

/// A check that does not count is not named at the deadline either: only those that keep
/// the allocation from being healthy are.
#[test]
fn deadline_names_only_the_checks_that_count() {
    let mut tracker = HealthTracker::new(strategy(HealthCheck::Checks));
    let tasks = [("web", Stage::Main, state(TaskStatus::Running))];
    let checks = [
        with_on_update(check("web", "ready", CheckStatus::Critical), OnUpdate::Ignore),
        check("web", "api", CheckStatus::Critical),
    ];
    tracker.observe(&snapshot(&tasks, &checks), secs(0));
    let judged = tracker.observe(&snapshot(&tasks, &checks), DEADLINE);
    assert_eq!(unhealthy_because(&judged).1, [("web", "Services not healthy by deadline: api")]);
}
