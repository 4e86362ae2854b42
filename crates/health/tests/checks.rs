//! Running a task's checks under tokio's paused clock, over the fake network and task: Nomad's
//! checks hook and check watcher cases (`client/allocrunner/checks_hook_test.go`,
//! `client/serviceregistration/checks/client_test.go`, `client/serviceregistration/watcher_test.go`)
//! through wharf's `TaskChecks`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use wharf_health::fake::{Answer, FakeControl, FakeTransport};
use wharf_health::{CheckBook, CheckIo, TaskChecks, plans};
use wharf_state::{AllocatedPort, Allocation, CheckStatus, DesiredStatus, Timestamp, spec};

const HTTP: u16 = 20_001;
const ADMIN: u16 = 20_002;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// An allocation of one task `web` whose service `web` has `checks` (TOML check blocks),
/// holding ports `http` and `admin`.
fn allocation(checks: &str, with_ports: bool) -> Allocation {
    let doc = format!(
        "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
         [group.network.port.http]\n[group.network.port.admin]\n\
         [[group.task]]\nname = \"web\"\ndriver = \"mock\"\n\
         [[group.task.service]]\nname = \"web\"\nport = \"http\"\n{checks}"
    );
    let ports = [("http", HTTP), ("admin", ADMIN)]
        .into_iter()
        .filter(|_| with_ports)
        .map(|(label, value)| AllocatedPort {
            label: label.into(),
            value,
            host_ip: [127, 0, 0, 1].into(),
        })
        .collect();
    Allocation {
        id: "a1".into(),
        job: spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}")),
        task_group: "g".into(),
        desired_status: DesiredStatus::Run,
        modify_index: 1,
        deployment_id: None,
        ports,
    }
}

fn http_check(name: &str, path: &str, extra: &str) -> String {
    format!(
        "[[group.task.service.check]]\nname = \"{name}\"\ntype = \"http\"\npath = \"{path}\"\n\
         interval = \"1s\"\ntimeout = \"1s\"\n{extra}"
    )
}

struct Running {
    book: Arc<CheckBook>,
    net: Arc<FakeTransport>,
    control: Arc<FakeControl>,
    checks: TaskChecks,
}

fn start(alloc: &Allocation, net: Arc<FakeTransport>) -> Running {
    let book = Arc::new(CheckBook::new(alloc));
    let control = Arc::new(FakeControl::new());
    let io = CheckIo {
        transport: net.clone(),
        control: control.clone(),
        now: Arc::new(|| Timestamp(7)),
    };
    let task = &alloc.job.groups[0].tasks[0];
    let checks = TaskChecks::start(&task.name, plans(alloc, task), book.clone(), io);
    Running { book, net, control, checks }
}

fn statuses(book: &CheckBook) -> Vec<(String, CheckStatus)> {
    book.statuses().into_iter().map(|(id, status)| (id.check, status)).collect()
}

fn last_output(book: &CheckBook, check: &str) -> String {
    book.states()
        .into_iter()
        .find(|s| s.check == check)
        .and_then(|s| s.last)
        .map(|r| r.output)
        .unwrap_or_default()
}

async fn elapse(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

/// `TestCheckHook_Checks_ResultsSet`: an ok, a failing and a hanging http check give one
/// passing and two critical results; once stopped, the checks run no more.
#[tokio::test(start_paused = true)]
async fn checks_results_set() {
    let checks = [
        http_check("check-ok", "/", ""),
        http_check("check-error", "/fail", ""),
        "[[group.task.service.check]]\nname = \"check-hang\"\ntype = \"tcp\"\nport = \"admin\"\ninterval = \"1s\"\ntimeout = \"1s\"\n".to_owned(),
    ]
    .concat();
    let net = Arc::new(FakeTransport::new());
    net.answer(addr(HTTP), Answer::Status(200));
    net.answer_path(addr(HTTP), "/fail", Answer::Body(500, "500 problem".into()));
    net.answer(addr(ADMIN), Answer::Hang);
    let alloc = allocation(&checks, true);
    let running = start(&alloc, net.clone());
    assert!(
        statuses(&running.book).iter().all(|(_, s)| *s == CheckStatus::Pending),
        "pending before the first run"
    );
    elapse(3).await;
    assert_eq!(
        statuses(&running.book),
        [
            ("check-error".into(), CheckStatus::Critical),
            ("check-hang".into(), CheckStatus::Critical),
            ("check-ok".into(), CheckStatus::Passing),
        ]
    );
    assert_eq!(last_output(&running.book, "check-ok"), "HTTP GET /: 200 R");
    assert_eq!(last_output(&running.book, "check-error"), "HTTP GET /fail: 500 R\n500 problem");
    assert_eq!(
        last_output(&running.book, "check-hang"),
        "TCP connect 127.0.0.1:20002: no connection within 1s"
    );

    running.checks.stop();
    let hits = net.hits(addr(HTTP));
    elapse(10).await;
    assert_eq!(net.hits(addr(HTTP)), hits, "no run after stop");
}

/// Checks run on their interval (the next run an interval after the last ended), each bounded
/// by its timeout, whatever the service does.
#[tokio::test(start_paused = true)]
async fn checks_run_on_their_interval_with_bounded_timeouts() {
    let checks = [
        "[[group.task.service.check]]\nname = \"fast\"\ntype = \"tcp\"\ninterval = \"2s\"\ntimeout = \"1s\"\n",
        "[[group.task.service.check]]\nname = \"slow\"\ntype = \"tcp\"\nport = \"admin\"\ninterval = \"2s\"\ntimeout = \"3s\"\n",
    ]
    .concat();
    let net = Arc::new(FakeTransport::new());
    net.answer(addr(HTTP), Answer::Status(200));
    net.answer(addr(ADMIN), Answer::Hang);
    let alloc = allocation(&checks, true);
    let _running = start(&alloc, net.clone());
    elapse(100).await;
    // 2s apart: 50 runs, give or take the first delay.
    let fast = net.hits(addr(HTTP));
    assert!((49..=51).contains(&fast), "{fast} runs of the fast check in 100s");
    // A run that times out takes its 3s, then the 2s interval: 5s apart.
    let slow = net.hits(addr(ADMIN));
    assert!((19..=21).contains(&slow), "{slow} runs of the hanging check in 100s");
}

/// `TestChecker_Do_TCP` and the http cases of `TestChecker_Do_HTTP`: refused connections,
/// warnings (429), and a port the allocation does not hold.
#[tokio::test(start_paused = true)]
async fn results_say_what_happened() {
    let checks = [
        http_check("busy", "/", ""),
        "[[group.task.service.check]]\nname = \"refused\"\ntype = \"tcp\"\nport = \"admin\"\ninterval = \"1s\"\ntimeout = \"1s\"\n".to_owned(),
    ]
    .concat();
    let net = Arc::new(FakeTransport::new());
    net.answer(addr(HTTP), Answer::Status(429));
    let alloc = allocation(&checks, true);
    let running = start(&alloc, net.clone());
    elapse(2).await;
    let state = |name: &str| running.book.states().into_iter().find(|s| s.check == name).unwrap();
    assert_eq!(state("busy").status, CheckStatus::Warning);
    assert_eq!(state("busy").last.unwrap().status_code, Some(429));
    assert_eq!(state("refused").status, CheckStatus::Critical);
    assert_eq!(
        state("refused").last.unwrap().output,
        "TCP connect 127.0.0.1:20002: connection refused"
    );
    assert_eq!(state("refused").last.unwrap().time, Timestamp(7), "stamped by the injected clock");

    let unplaced = allocation(&http_check("lost", "/", ""), false);
    let running = start(&unplaced, net);
    elapse(2).await;
    let lost = running.book.states().remove(0);
    assert_eq!(lost.status, CheckStatus::Critical);
    assert!(lost.last.unwrap().output.contains("holds no port \"http\""));
}

/// `TestScript_Exec_Codes` and `TestScript_Exec_TimeoutCritical`: script checks run through
/// the task's exec: exit 0 passes, 1 warns, others (9000 too) fail, an exec that fails is
/// critical with its error; a script that never ends is critical once its timeout (and the
/// exec's grace) has passed.
#[tokio::test(start_paused = true)]
async fn script_checks_run_in_the_task() {
    let checks = "[[group.task.service.check]]\nname = \"script\"\ntype = \"script\"\ncommand = \"/bin/check\"\nargs = [\"-q\"]\ninterval = \"2s\"\ntimeout = \"1s\"\n";
    let alloc = allocation(checks, true);
    let running = start(&alloc, Arc::new(FakeTransport::new()));
    for (code, output, want) in [
        (1, "output", CheckStatus::Warning),
        (0, "fine", CheckStatus::Passing),
        (2, "bad", CheckStatus::Critical),
        (0, "fine again", CheckStatus::Passing),
        (9000, "error9000", CheckStatus::Critical),
    ] {
        running.control.script_exits(code, output);
        elapse(3).await;
        assert_eq!(statuses(&running.book)[0].1, want, "exit {code}");
        assert_eq!(last_output(&running.book, "script"), output);
    }
    running.control.script_fails("some error");
    elapse(3).await;
    assert_eq!(statuses(&running.book)[0].1, CheckStatus::Critical);
    assert_eq!(last_output(&running.book, "script"), "cannot run the script: some error");
    assert_eq!(
        running.control.execs()[0],
        ("web".to_owned(), vec!["/bin/check".to_owned(), "-q".to_owned()])
    );
    running.control.script_hangs();
    elapse(10).await;
    assert_eq!(statuses(&running.book)[0].1, CheckStatus::Critical);
    assert_eq!(last_output(&running.book, "script"), "the script did not end within 1s");
}

/// `TestScript_Exec_Cancel`: stopping the checks while a script runs abandons it at once:
/// no result is recorded for it and no other run starts.
#[tokio::test(start_paused = true)]
async fn script_exec_cancel() {
    let checks = "[[group.task.service.check]]\nname = \"script\"\ntype = \"script\"\ncommand = \"/bin/check\"\ninterval = \"1s\"\ntimeout = \"1h\"\n";
    let alloc = allocation(checks, true);
    let running = start(&alloc, Arc::new(FakeTransport::new()));
    running.control.script_hangs();
    elapse(2).await;
    assert_eq!(running.control.execs().len(), 1, "blocked in its first run");
    running.checks.stop();
    elapse(3600 * 3).await;
    assert_eq!(running.control.execs().len(), 1);
    assert_eq!(statuses(&running.book)[0].1, CheckStatus::Pending, "nothing recorded");
}

/// `TestCheckWatcher_Unhealthy`: a check that always fails restarts its task exactly once,
/// with a reason that names it, after `limit` failures past the grace; the checks of that run
/// of the task then stop (the task's next start brings new ones).
#[tokio::test(start_paused = true)]
async fn check_restart_restarts_once() {
    let alloc = allocation(
        &http_check("alive", "/", "check_restart = { limit = 3, grace = \"5s\" }\n"),
        true,
    );
    let running = start(&alloc, Arc::new(FakeTransport::new()));
    elapse(60).await;
    assert_eq!(
        running.control.restarts(),
        [("web".to_owned(), "healthcheck: check \"alive\" unhealthy".to_owned())]
    );
    let hits = running.net.hits(addr(HTTP));
    // Failures from 5s on, 1s apart: restarted at the third, about 8s in.
    assert!((7..=9).contains(&hits), "{hits} runs before the restart");
    elapse(60).await;
    assert_eq!(running.net.hits(addr(HTTP)), hits, "the loop ended with the restart");
}

/// `TestCheckWatcher_Healthy` and `TestCheckWatcher_HealthyWarning`: passing checks, and
/// warnings with ignore_warnings, never restart the task.
#[tokio::test(start_paused = true)]
async fn healthy_and_ignored_warnings_never_restart() {
    let checks = [
        http_check("alive", "/", "check_restart = { limit = 1, grace = \"0s\" }\n"),
        "[[group.task.service.check]]\nname = \"slow\"\ntype = \"script\"\ncommand = \"x\"\ninterval = \"1s\"\ntimeout = \"1s\"\ncheck_restart = { limit = 1, grace = \"0s\", ignore_warnings = true }\n".to_owned(),
    ]
    .concat();
    let net = Arc::new(FakeTransport::new());
    net.answer(addr(HTTP), Answer::Status(204));
    let alloc = allocation(&checks, true);
    let running = start(&alloc, net);
    running.control.script_exits(1, "warming up");
    elapse(120).await;
    assert_eq!(running.control.restarts(), []);
    assert_eq!(
        statuses(&running.book),
        [("alive".into(), CheckStatus::Passing), ("slow".into(), CheckStatus::Warning)]
    );
}

/// `TestCheckWatcher_Flapping`: a check that recovers before its limit starts counting again.
#[tokio::test(start_paused = true)]
async fn flapping_never_restarts() {
    let alloc = allocation(
        &http_check("alive", "/", "check_restart = { limit = 3, grace = \"0s\" }\n"),
        true,
    );
    let net = Arc::new(FakeTransport::new());
    let running = start(&alloc, net.clone());
    for _ in 0..10 {
        net.answer(addr(HTTP), Answer::Status(500));
        elapse(2).await;
        net.answer(addr(HTTP), Answer::Status(200));
        elapse(2).await;
    }
    assert_eq!(running.control.restarts(), []);
}

/// `TestCheckWatcher_Unwatch`: checks stopped before they fail enough never restart the task.
#[tokio::test(start_paused = true)]
async fn stopped_checks_never_restart() {
    let alloc = allocation(
        &http_check("alive", "/", "check_restart = { limit = 1, grace = \"3s\" }\n"),
        true,
    );
    let running = start(&alloc, Arc::new(FakeTransport::new()));
    elapse(2).await;
    drop(running.checks);
    elapse(60).await;
    assert_eq!(running.control.restarts(), []);
}

/// `TestCheckWatcher_MultipleChecks`: several failing checks of one task restart it once; a
/// passing one never does.
#[tokio::test(start_paused = true)]
async fn multiple_checks_restart_once() {
    let checks = [
        http_check("c1", "/", "check_restart = { limit = 1, grace = \"0s\" }\n"),
        http_check("c2", "/two", "check_restart = { limit = 1, grace = \"0s\" }\n"),
        "[[group.task.service.check]]\nname = \"c3\"\ntype = \"tcp\"\nport = \"admin\"\ninterval = \"1s\"\ntimeout = \"1s\"\ncheck_restart = { limit = 1, grace = \"0s\" }\n".to_owned(),
    ]
    .concat();
    let net = Arc::new(FakeTransport::new());
    net.answer(addr(ADMIN), Answer::Status(200));
    let alloc = allocation(&checks, true);
    let running = start(&alloc, net);
    elapse(30).await;
    let restarts = running.control.restarts();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(restarts[0].1.contains("\"c1\"") || restarts[0].1.contains("\"c2\""), "{restarts:?}");
}

/// `TestCheckWatcher_Deadlock`: many tasks failing at once are each restarted once; a restart
/// never holds up the others.
#[tokio::test(start_paused = true)]
async fn many_tasks_restart_without_blocking_each_other() {
    let alloc = allocation(
        &http_check("alive", "/", "check_restart = { limit = 1, grace = \"0s\" }\n"),
        true,
    );
    let net = Arc::new(FakeTransport::new());
    let controls: Vec<Arc<FakeControl>> = (0..20).map(|_| Arc::new(FakeControl::new())).collect();
    let task = &alloc.job.groups[0].tasks[0];
    let _running: Vec<TaskChecks> = controls
        .iter()
        .map(|control| {
            let io = CheckIo {
                transport: net.clone(),
                control: control.clone(),
                now: Arc::new(|| Timestamp(0)),
            };
            TaskChecks::start(&task.name, plans(&alloc, task), Arc::new(CheckBook::new(&alloc)), io)
        })
        .collect();
    let all = async {
        for control in &controls {
            control.restarted(1).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all).await.expect("every task restarted");
    assert!(controls.iter().all(|c| c.restarts().len() == 1));
}
