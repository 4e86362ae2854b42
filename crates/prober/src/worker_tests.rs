//! Behaviour tables for the worker state machine, on a fake clock and a scripted executor.
//!
//! Each probe case sets up one worker (state, idle behaviour, how long ago it was last probed
//! and busy, which runners it knows), scripts what each command answers, runs one
//! `probe_and_update` and checks the state, the runners, the idle behaviour and the effects.
//! The cases follow the situations the reference's comments describe, plus its known defects.

use crate::executor::{Executor, Match, Output};
use crate::worker::test_support::Setup;
use crate::*;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const BOOT: &str = "bootprobe";
const LIST: &str = "crunch-run --list";
const BINARY: &[u8] = b"#!/bin/sh\necho runner\n";
const MIN: Duration = Duration::from_secs(60);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn config(deploy: bool) -> Arc<Prepared> {
    Arc::new(worker_config(deploy).prepare().unwrap())
}

fn worker_config(deploy: bool) -> WorkerConfig {
    WorkerConfig {
        timeouts: Timeouts {
            booting: 10 * MIN,
            probe: 10 * MIN,
            idle: MIN,
            stale_run_lock: secs(5),
            signal: secs(5),
            term: 2 * MIN,
            shutdown: secs(10),
            outcome_hold: Duration::ZERO,
        },
        boot_probe_command: BOOT.into(),
        runner: RunnerConfig {
            command: "crunch-run".into(),
            binary: deploy.then(|| RunnerBinary::Bytes(Arc::from(BINARY))),
            directory: "/tmp/wr".into(),
            list_args: "--list".into(),
            start_args: "--detach".into(),
            kill_args: "--kill 15".into(),
            outcome_args: None,
            resources_args: None,
        },
        cluster_prefix: "zzzzz-".into(),
        tag_prefix: "t-".into(),
        command_deadline: secs(20),
        deploy_deadline: secs(60),
    }
}

fn deployment() -> Deployment {
    config(true).deployment().unwrap().clone()
}

fn check_command() -> String {
    format!("sha256sum {}", quote("p", &deployment().path).unwrap())
}

fn hash_line() -> String {
    let d = deployment();
    format!("{}  {}\n", d.sha256, d.path)
}

/// An executor that runs a hook on each call before answering from the script: lets a case
/// change the worker while its probe is in flight.
#[derive(Debug)]
struct Hooked {
    script: ScriptedExecutor,
    worker: OnceLock<Arc<Worker>>,
    clock: Arc<FakeClock>,
    hook: Hook,
}

/// Runs on every command a hooked worker sends: (worker, command, its fake clock).
type Hook = fn(&Worker, &str, &FakeClock);

#[async_trait::async_trait]
impl Executor for Hooked {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        if let Some(worker) = self.worker.get() {
            (self.hook)(worker, command, &self.clock);
        }
        self.script.execute(command, stdin, deadline).await
    }
}

struct Harness {
    clock: Arc<FakeClock>,
    script: ScriptedExecutor,
    worker: Arc<Worker>,
    brake: Arc<Brake>,
}

fn harness_with(
    state: State,
    idle: IdleBehavior,
    deploy: bool,
    user: &str,
    hook: Option<Hook>,
) -> Harness {
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(100_000))));
    let script = ScriptedExecutor::new("w1");
    let brake = Arc::new(Brake::default());
    let mut tags = Tags::new();
    tags.insert("t-InstanceType".into(), "small".into());
    tags.insert("t-IdleBehavior".into(), idle.as_str().into());
    let spec = WorkerSpec {
        instance: Instance {
            id: "w1".into(),
            address: Some("127.0.0.1:22".into()),
            remote_user: user.into(),
            tags,
            host_key: None,
            runner_args: String::new(),
        },
        instance_type: "small".into(),
        state,
        idle_behavior: idle,
    };
    let hooked = hook.map(|hook| {
        Arc::new(Hooked {
            script: script.clone(),
            worker: OnceLock::new(),
            clock: clock.clone(),
            hook,
        })
    });
    let executor: Arc<dyn Executor> = match &hooked {
        Some(h) => h.clone(),
        None => Arc::new(script.clone()),
    };
    let worker =
        Arc::new(Worker::new(spec, executor, config(deploy), clock.clone(), brake.clone()));
    if let Some(h) = hooked {
        let _ = h.worker.set(worker.clone());
    }
    Harness { clock, script, worker, brake }
}

fn harness(state: State, idle: IdleBehavior) -> Harness {
    harness_with(state, idle, false, "root", None)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

/// A kind of effect, for tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fx {
    Destroy,
    Tags,
    Success,
    Failure,
    Aborted,
    Ready,
    Exited,
}

fn kinds(effects: &[Effect]) -> Vec<Fx> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Destroy => Some(Fx::Destroy),
            Effect::SaveTags(_) => Some(Fx::Tags),
            Effect::BootOutcome(BootOutcome::Success) => Some(Fx::Success),
            Effect::BootOutcome(BootOutcome::Failure) => Some(Fx::Failure),
            Effect::BootOutcome(BootOutcome::Aborted) => Some(Fx::Aborted),
            Effect::BootOutcome(BootOutcome::Disappeared) => None,
            Effect::TimeToReady(_) => Some(Fx::Ready),
            Effect::RunnerExited(..) => Some(Fx::Exited),
            Effect::RunProbe { .. } | Effect::Notify => None,
        })
        .collect()
}

struct ProbeCase {
    name: &'static str,
    state: State,
    idle: IdleBehavior,
    setup: Setup,
    boot: Reply,
    list: Reply,
    brake: bool,
    want_state: State,
    want_running: &'static [&'static str],
    want_idle: IdleBehavior,
    want_effects: &'static [Fx],
    want_outcome: ProbeOutcome,
}

impl Default for ProbeCase {
    fn default() -> ProbeCase {
        ProbeCase {
            name: "",
            state: State::Idle,
            idle: IdleBehavior::Run,
            setup: Setup::default(),
            boot: Reply::ok(""),
            list: Reply::ok(""),
            brake: false,
            want_state: State::Idle,
            want_running: &[],
            want_idle: IdleBehavior::Run,
            want_effects: &[],
            want_outcome: ProbeOutcome::Passed,
        }
    }
}

fn ago(probed: Duration) -> Setup {
    Setup { probed_ago: probed, busy_ago: probed, appeared_ago: probed, ..Setup::default() }
}

fn ago_running(probed: Duration, running: Vec<&'static str>) -> Setup {
    Setup { running, ..ago(probed) }
}

#[test]
fn probe_and_update_table() {
    use IdleBehavior::{Drain, Hold};
    use ProbeOutcome::Failed;
    use State::*;
    let fail = || Reply::fail(1, "nope");
    let cases = vec![
        // Unknown: both probes run; the state leaves unknown only when both pass.
        ProbeCase {
            name: "unknown, both probes fail",
            state: Unknown,
            boot: fail(),
            list: fail(),
            want_state: Unknown,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, boot probe fails, run probe shows nothing",
            state: Unknown,
            boot: fail(),
            want_state: Unknown,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, boot timeout exceeded, boot probe fails, nothing runs: shut down",
            state: Unknown,
            setup: ago(11 * MIN),
            boot: fail(),
            want_state: Shutdown,
            want_effects: &[Fx::Destroy, Fx::Failure],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, boot probe fails, but one runner is running",
            state: Unknown,
            boot: fail(),
            list: Reply::ok("zzzzz-1\n"),
            want_state: Unknown,
            want_running: &["zzzzz-1"],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, boot timeout exceeded, boot probe fails, runner running: kept",
            state: Unknown,
            setup: ago(11 * MIN),
            boot: fail(),
            list: Reply::ok("zzzzz-1\n"),
            want_state: Unknown,
            want_running: &["zzzzz-1"],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, both probes pass, nothing runs: idle",
            state: Unknown,
            want_state: Idle,
            want_effects: &[Fx::Success],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, both probes pass, a runner runs: running",
            state: Unknown,
            list: Reply::ok("zzzzz-1\n"),
            want_state: Running,
            want_running: &["zzzzz-1"],
            want_effects: &[Fx::Success],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "unknown, boot probe passes, run probe fails",
            state: Unknown,
            list: fail(),
            want_state: Unknown,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        // Booting: the run probe runs only after the boot probe passed.
        ProbeCase {
            name: "booting, boot probe fails",
            state: Booting,
            boot: fail(),
            want_state: Booting,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, boot probe has no address yet",
            state: Booting,
            boot: Reply::NoAddress,
            want_state: Booting,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, boot probe passes, run probe fails",
            state: Booting,
            list: fail(),
            want_state: Booting,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, boot timeout exceeded, boot probe fails: shut down, failure",
            state: Booting,
            setup: ago(10 * MIN),
            boot: fail(),
            want_state: Shutdown,
            want_effects: &[Fx::Destroy, Fx::Failure],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, boot timeout exceeded, run probe fails: shut down",
            state: Booting,
            setup: ago(11 * MIN),
            list: fail(),
            want_state: Shutdown,
            want_effects: &[Fx::Destroy],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, just under the boot timeout, boot probe fails: kept",
            state: Booting,
            setup: ago(10 * MIN - secs(1)),
            boot: fail(),
            want_state: Booting,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, both probes pass: idle, time to ready, success",
            state: Booting,
            want_state: Idle,
            want_effects: &[Fx::Ready, Fx::Success],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, both pass, a runner already runs: running",
            state: Booting,
            list: Reply::ok("zzzzz-1\n"),
            want_state: Running,
            want_running: &["zzzzz-1"],
            want_effects: &[Fx::Ready, Fx::Success],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, boot probe hangs and is cut at its deadline",
            state: Booting,
            boot: Reply::Timeout,
            want_state: Booting,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, changed host key past the boot timeout: shut down",
            state: Booting,
            setup: ago(11 * MIN),
            boot: Reply::HostKeyChanged,
            want_state: Shutdown,
            want_effects: &[Fx::Destroy, Fx::Failure],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, drain, boot timeout exceeded: shut down",
            state: Booting,
            idle: Drain,
            want_idle: Drain,
            setup: ago(11 * MIN),
            boot: fail(),
            want_state: Shutdown,
            want_effects: &[Fx::Destroy, Fx::Failure],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        // Idle and running: only the run probe.
        ProbeCase {
            name: "idle, run probe fails under the probe timeout: kept",
            list: fail(),
            setup: ago(5 * MIN),
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle, probe timeout exceeded, run probe fails: shut down",
            list: fail(),
            setup: ago(10 * MIN),
            want_state: Shutdown,
            want_effects: &[Fx::Destroy],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle, probe timeout exceeded, run probe hangs: shut down",
            list: Reply::Timeout,
            setup: ago(11 * MIN),
            want_state: Shutdown,
            want_effects: &[Fx::Destroy],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle, hold, probe timeout exceeded: hold never shuts down",
            idle: Hold,
            want_idle: Hold,
            list: fail(),
            setup: ago(60 * MIN),
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle, probe timeout exceeded, fleet brake engaged: kept",
            list: Reply::Unreachable,
            setup: ago(11 * MIN),
            brake: true,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting, boot timeout exceeded, fleet brake engaged: kept",
            state: Booting,
            boot: Reply::Unreachable,
            setup: ago(11 * MIN),
            brake: true,
            want_state: Booting,
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle, run probe shows a runner: running",
            list: Reply::ok("zzzzz-1\n"),
            want_state: Running,
            want_running: &["zzzzz-1"],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle, another cluster's runner is ignored",
            list: Reply::ok("yyyyy-1\nyyyyy-2 stale\n"),
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "running, run probe shows nothing: idle, runner exited",
            state: Running,
            setup: ago_running(secs(10), vec!["zzzzz-1"]),
            want_state: Idle,
            want_effects: &[Fx::Exited],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "running, one of two runners ends",
            state: Running,
            setup: ago_running(secs(10), vec!["zzzzz-1", "zzzzz-2"]),
            list: Reply::ok("zzzzz-2\n"),
            want_state: Running,
            want_running: &["zzzzz-2"],
            want_effects: &[Fx::Exited],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "running, run probe fails under the probe timeout: kept",
            state: Running,
            setup: ago_running(5 * MIN, vec!["zzzzz-1"]),
            list: fail(),
            want_state: Running,
            want_running: &["zzzzz-1"],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "running, probe timeout exceeded: shut down",
            state: Running,
            setup: ago_running(11 * MIN, vec!["zzzzz-1"]),
            list: fail(),
            want_state: Shutdown,
            want_running: &["zzzzz-1"],
            want_effects: &[Fx::Destroy],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "running, hold, probe timeout exceeded: kept",
            state: Running,
            idle: Hold,
            want_idle: Hold,
            setup: ago_running(11 * MIN, vec!["zzzzz-1"]),
            list: fail(),
            want_state: Running,
            want_running: &["zzzzz-1"],
            want_outcome: Failed,
            ..ProbeCase::default()
        },
        // Broken: drain (only from run), boot outcome failure.
        ProbeCase {
            name: "idle reports broken: drained and shut down at once",
            list: Reply::ok("broken\n"),
            want_state: Shutdown,
            want_idle: Drain,
            want_effects: &[Fx::Failure, Fx::Tags, Fx::Destroy],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "idle on hold reports broken: left alone",
            idle: Hold,
            want_idle: Hold,
            list: Reply::ok("broken\n"),
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "running reports broken: drained, kept while work runs",
            state: Running,
            setup: ago_running(secs(10), vec!["zzzzz-1"]),
            list: Reply::ok("zzzzz-1\nbroken\n"),
            want_state: Running,
            want_running: &["zzzzz-1"],
            want_idle: Drain,
            want_effects: &[Fx::Failure, Fx::Tags],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "booting reports broken after booting: drained, shut down",
            state: Booting,
            list: Reply::ok("broken\n"),
            want_state: Shutdown,
            want_idle: Drain,
            // Drained while still booting: shut down before the state could become idle.
            want_effects: &[Fx::Failure, Fx::Tags, Fx::Destroy],
            ..ProbeCase::default()
        },
        ProbeCase {
            name: "first stale lock is not broken",
            list: Reply::ok("zzzzz-1 stale\n"),
            ..ProbeCase::default()
        },
    ];
    assert!(cases.len() >= 35);
    let runtime = rt();
    for case in cases {
        let h = harness(case.state, case.idle);
        h.worker.set_up(&case.setup);
        h.script.exact(BOOT, case.boot.clone());
        h.script.exact(LIST, case.list.clone());
        if case.brake {
            h.brake.set(Some("test".into()));
        }
        let outcome = runtime.block_on(h.worker.probe_and_update());
        let view = h.worker.view();
        assert_eq!(outcome, case.want_outcome, "{}: outcome", case.name);
        assert_eq!(view.state, case.want_state, "{}: state", case.name);
        assert_eq!(view.running, case.want_running, "{}: running", case.name);
        assert_eq!(view.idle_behavior, case.want_idle, "{}: idle behavior", case.name);
        assert_eq!(kinds(&h.worker.take_effects()), case.want_effects, "{}: effects", case.name);
        let commands: Vec<String> = h.script.calls().into_iter().map(|c| c.command).collect();
        let boot_ran = commands.iter().any(|c| c == BOOT);
        assert_eq!(
            boot_ran,
            matches!(case.state, Unknown | Booting),
            "{}: boot probe ran: {commands:?}",
            case.name
        );
        if case.state == Booting && !matches!(case.boot, Reply::Exit { status: 0, .. }) {
            assert!(!commands.iter().any(|c| c == LIST), "{}: run probe ran", case.name);
        }
    }
}

#[test]
fn stale_lock_held_too_long_counts_as_broken() {
    // (seconds after the first stale line, list output, idle behaviour afterwards)
    let steps: &[(u64, &str, IdleBehavior)] = &[
        (0, "zzzzz-1 stale\n", IdleBehavior::Run),
        (5, "zzzzz-1 stale\n", IdleBehavior::Run),
        (6, "zzzzz-1 stale\n", IdleBehavior::Drain),
    ];
    let runtime = rt();
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&ago_running(secs(1), vec!["zzzzz-2"]));
    let mut last = 0;
    for (at, output, want) in steps {
        h.clock.advance(secs(at - last));
        last = *at;
        h.script.exact(LIST, Reply::ok(&format!("zzzzz-2\n{output}")));
        runtime.block_on(h.worker.probe_and_update());
        assert_eq!(h.worker.idle_behavior(), *want, "after {at}s of stale lock");
    }
}

#[test]
fn stale_lock_timer_restarts_when_the_lock_clears() {
    let runtime = rt();
    let h = harness(State::Idle, IdleBehavior::Run);
    for (advance, output) in
        [(0, "zzzzz-1 stale\n"), (4, ""), (4, "zzzzz-1 stale\n"), (4, "zzzzz-1 stale\n")]
    {
        h.clock.advance(secs(advance));
        h.script.exact(LIST, Reply::ok(output));
        runtime.block_on(h.worker.probe_and_update());
    }
    // 4 s of stale since the lock reappeared: under the 5 s timeout, so not broken.
    assert_eq!(h.worker.idle_behavior(), IdleBehavior::Run);
}

struct DeployCase {
    name: &'static str,
    state: State,
    boot: Reply,
    /// Replies of the checksum command in turn (before the copy, after it).
    checks: Vec<Reply>,
    install: Reply,
    want_state: State,
    want_installed: bool,
    want_error: Option<&'static str>,
}

#[test]
fn runner_deployment_table() {
    let present = Reply::ok(&hash_line());
    let absent = Reply::fail(1, "sha256sum: No such file or directory");
    let cases = vec![
        DeployCase {
            name: "binary absent: copied, verified, idle",
            state: State::Booting,
            boot: Reply::ok(""),
            checks: vec![absent.clone(), present.clone()],
            install: Reply::ok(""),
            want_state: State::Idle,
            want_installed: true,
            want_error: None,
        },
        DeployCase {
            name: "binary present with the right hash: not copied",
            state: State::Booting,
            boot: Reply::ok(""),
            checks: vec![present.clone()],
            install: Reply::fail(1, "must not run"),
            want_state: State::Idle,
            want_installed: false,
            want_error: None,
        },
        DeployCase {
            name: "wrong hash on the worker: copied again",
            state: State::Booting,
            boot: Reply::ok(""),
            checks: vec![Reply::ok(&format!("{}  x\n", "0".repeat(64))), present.clone()],
            install: Reply::ok(""),
            want_state: State::Idle,
            want_installed: true,
            want_error: None,
        },
        DeployCase {
            name: "copy fails: boot counts as failed",
            state: State::Booting,
            boot: Reply::ok(""),
            checks: vec![absent.clone()],
            install: Reply::fail(1, "No space left on device"),
            want_state: State::Booting,
            want_installed: true,
            want_error: Some("No space left on device"),
        },
        DeployCase {
            name: "copy hangs: cut at the deploy deadline, boot failed",
            state: State::Booting,
            boot: Reply::ok(""),
            checks: vec![absent.clone()],
            install: Reply::Timeout,
            want_state: State::Booting,
            want_installed: true,
            want_error: Some("did not finish within 1m0s"),
        },
        DeployCase {
            name: "checksum wrong after the copy: boot failed",
            state: State::Booting,
            boot: Reply::ok(""),
            checks: vec![absent.clone(), absent.clone()],
            install: Reply::ok(""),
            want_state: State::Booting,
            want_installed: true,
            want_error: Some("after the copy"),
        },
        DeployCase {
            name: "booting, boot probe fails: no copy",
            state: State::Booting,
            boot: Reply::fail(1, ""),
            checks: vec![absent.clone()],
            install: Reply::ok(""),
            want_state: State::Booting,
            want_installed: false,
            want_error: None,
        },
        DeployCase {
            name: "unknown, boot probe fails: copied anyway so the run probe can see work",
            state: State::Unknown,
            boot: Reply::fail(1, ""),
            checks: vec![absent.clone(), present.clone()],
            install: Reply::ok(""),
            want_state: State::Unknown,
            want_installed: true,
            want_error: None,
        },
    ];
    let runtime = rt();
    for case in cases {
        let h = harness_with(case.state, IdleBehavior::Run, true, "root", None);
        h.script.exact(BOOT, case.boot.clone());
        h.script.on(Match::Exact(check_command()), case.checks.clone());
        h.script.containing("cat >", case.install.clone());
        let program = quote("p", &deployment().path).unwrap();
        h.script.exact(&format!("{program} --list"), Reply::ok(""));
        runtime.block_on(h.worker.probe_and_update());
        let view = h.worker.view();
        assert_eq!(view.state, case.want_state, "{}", case.name);
        let installs: Vec<_> =
            h.script.calls().into_iter().filter(|c| c.command.contains("cat >")).collect();
        assert_eq!(!installs.is_empty(), case.want_installed, "{}", case.name);
        // A check reads the whole binary: deploy work, under the deploy's deadline.
        for check in h.script.calls().into_iter().filter(|c| c.command == check_command()) {
            assert_eq!(check.deadline, secs(60), "{}: the checksum's deadline", case.name);
        }
        for install in &installs {
            assert_eq!(install.stdin, BINARY, "{}: the binary goes on stdin", case.name);
            assert!(install.command.contains("mv -f"), "{}: {}", case.name, install.command);
            assert!(install.command.contains(&deployment().sha256), "{}", case.name);
        }
        if let Some(text) = case.want_error {
            let error = view.last_error.unwrap_or_default();
            assert!(error.contains(text), "{}: error {error:?}", case.name);
        }
    }
}

#[test]
fn non_root_workers_get_sudo() {
    let runtime = rt();
    let h = harness_with(State::Booting, IdleBehavior::Run, true, "crunch", None);
    h.script.exact(BOOT, Reply::ok(""));
    h.script.on(Match::Exact(check_command()), [Reply::fail(1, ""), Reply::ok(&hash_line())]);
    h.script.containing("sudo sh -c", Reply::ok(""));
    let program = quote("p", &deployment().path).unwrap();
    h.script.exact(&format!("sudo {program} --list"), Reply::ok(""));
    runtime.block_on(h.worker.probe_and_update());
    assert_eq!(h.worker.state(), State::Idle, "{:?}", h.script.calls());
}

#[test]
fn a_probe_in_flight_makes_the_next_one_return_at_once() {
    fn probe_again(worker: &Worker, command: &str, _: &FakeClock) {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        if command == LIST {
            // The second probe must finish on its first poll, without waiting for the first.
            let mut second = std::pin::pin!(worker.probe_and_update());
            let poll = second.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert_eq!(poll, Poll::Ready(ProbeOutcome::AlreadyProbing));
        }
    }
    let runtime = rt();
    let h = harness_with(State::Idle, IdleBehavior::Run, false, "root", Some(probe_again));
    h.script.exact(LIST, Reply::ok(""));
    assert_eq!(runtime.block_on(h.worker.probe_and_update()), ProbeOutcome::Passed);
    assert_eq!(h.script.call_count(), 1);
    assert!(!h.worker.is_probing());
}

#[test]
fn a_change_during_the_probe_leaves_the_runners_alone() {
    // A sync (or a start) touches the worker while the run probe is in flight: the probe's
    // list may predate it, so the result is not applied.
    fn touch(worker: &Worker, command: &str, _: &FakeClock) {
        if command == LIST {
            worker.touch();
        }
    }
    let runtime = rt();
    let h = harness_with(State::Idle, IdleBehavior::Run, false, "root", Some(touch));
    h.script.exact(LIST, Reply::ok("zzzzz-1\n"));
    assert_eq!(runtime.block_on(h.worker.probe_and_update()), ProbeOutcome::Passed);
    let view = h.worker.view();
    assert_eq!(view.state, State::Idle);
    assert!(view.running.is_empty());
    assert_eq!(view.probe_age, Duration::ZERO, "the probe still counts as a success");
}

#[test]
fn a_boot_probe_failure_after_a_concurrent_success_counts_as_booted() {
    // Another probe (or the pool) saw the worker booted while this boot probe failed.
    fn mark_booted(worker: &Worker, command: &str, _: &FakeClock) {
        if command == BOOT {
            worker.set_up(&Setup::default());
            worker.force_state(State::Idle);
        }
    }
    let runtime = rt();
    let h = harness_with(State::Booting, IdleBehavior::Run, true, "root", Some(mark_booted));
    h.script.exact(BOOT, Reply::fail(1, "still booting"));
    let program = quote("p", &deployment().path).unwrap();
    h.script.exact(&format!("{program} --list"), Reply::ok(""));
    runtime.block_on(h.worker.probe_and_update());
    let commands: Vec<String> = h.script.calls().into_iter().map(|c| c.command).collect();
    assert!(!commands.iter().any(|c| c.contains("sha256sum")), "no copy: {commands:?}");
    assert!(commands.iter().any(|c| c.ends_with("--list")), "run probe ran: {commands:?}");
    assert_eq!(h.worker.state(), State::Idle);
}

#[test]
fn boot_outcome_is_reported_once() {
    let runtime = rt();
    let h = harness(State::Booting, IdleBehavior::Run);
    h.script.exact(BOOT, Reply::ok(""));
    h.script.exact(LIST, Reply::ok(""));
    runtime.block_on(h.worker.probe_and_update());
    // Broken later, then idle timeout, then killed: no further outcome.
    h.script.exact(LIST, Reply::ok("broken\n"));
    runtime.block_on(h.worker.probe_and_update());
    h.worker.kill_instance("operator");
    let outcomes: Vec<Fx> = kinds(&h.worker.take_effects())
        .into_iter()
        .filter(|k| matches!(k, Fx::Success | Fx::Failure | Fx::Aborted))
        .collect();
    assert_eq!(outcomes, [Fx::Success]);
}

#[test]
fn time_to_ready_is_measured_from_first_contact_and_reported_once() {
    let runtime = rt();
    let h = harness(State::Booting, IdleBehavior::Run);
    h.script.on(Match::Exact(BOOT.into()), [Reply::Unreachable, Reply::fail(1, "starting")]);
    h.script.exact(LIST, Reply::ok(""));
    runtime.block_on(h.worker.probe_and_update()); // not reached: no contact yet
    h.clock.advance(secs(10));
    runtime.block_on(h.worker.probe_and_update()); // reached, boot probe fails: first contact
    h.clock.advance(secs(10));
    h.script.exact(BOOT, Reply::ok(""));
    runtime.block_on(h.worker.probe_and_update());
    h.clock.advance(secs(10));
    runtime.block_on(h.worker.probe_and_update());
    let ready: Vec<Duration> = h
        .worker
        .take_effects()
        .into_iter()
        .filter_map(|e| match e {
            Effect::TimeToReady(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(ready, [secs(10)]);
}

struct IdleCase {
    name: &'static str,
    state: State,
    idle: IdleBehavior,
    setup: Setup,
    given_up: bool,
    want: bool,
}

#[test]
fn shutdown_if_idle_table() {
    use IdleBehavior::{Drain, Hold, Run};
    use State::*;
    let idle_for = |d| Setup { busy_ago: d, ..Setup::default() };
    let cases = vec![
        IdleCase {
            name: "booting, run",
            state: Booting,
            idle: Run,
            setup: Setup::default(),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "booting, drain",
            state: Booting,
            idle: Drain,
            setup: Setup::default(),
            given_up: false,
            want: true,
        },
        IdleCase {
            name: "booting, hold",
            state: Booting,
            idle: Hold,
            setup: Setup::default(),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "idle under the idle timeout",
            state: Idle,
            idle: Run,
            setup: idle_for(secs(59)),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "idle at the idle timeout",
            state: Idle,
            idle: Run,
            setup: idle_for(MIN),
            given_up: false,
            want: true,
        },
        IdleCase {
            name: "idle, hold, long idle",
            state: Idle,
            idle: Hold,
            setup: idle_for(60 * MIN),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "idle, drain, just busy",
            state: Idle,
            idle: Drain,
            setup: idle_for(Duration::ZERO),
            given_up: false,
            want: true,
        },
        IdleCase {
            name: "running, run",
            state: Running,
            idle: Run,
            setup: Setup { running: vec!["zzzzz-1"], ..idle_for(60 * MIN) },
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "running, drain, runner alive",
            state: Running,
            idle: Drain,
            setup: Setup { running: vec!["zzzzz-1"], ..Setup::default() },
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "running, drain, every runner given up",
            state: Running,
            idle: Drain,
            setup: Setup { running: vec!["zzzzz-1"], ..Setup::default() },
            given_up: true,
            want: true,
        },
        IdleCase {
            name: "running, drain, a starting runner not given up",
            state: Running,
            idle: Drain,
            setup: Setup { starting: vec!["zzzzz-1"], ..Setup::default() },
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "unknown, young",
            state: Unknown,
            idle: Run,
            setup: ago(MIN),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "unknown, past the boot timeout, nothing runs",
            state: Unknown,
            idle: Run,
            setup: ago(11 * MIN),
            given_up: false,
            want: true,
        },
        IdleCase {
            name: "unknown, past the boot timeout, a runner runs: never",
            state: Unknown,
            idle: Run,
            setup: ago_running(11 * MIN, vec!["zzzzz-1"]),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "unknown, hold, old",
            state: Unknown,
            idle: Hold,
            setup: ago(60 * MIN),
            given_up: false,
            want: false,
        },
        IdleCase {
            name: "shutdown",
            state: Shutdown,
            idle: Drain,
            setup: Setup::default(),
            given_up: false,
            want: false,
        },
    ];
    let runtime = rt();
    for case in cases {
        let h = harness(case.state, case.idle);
        h.worker.set_up(&case.setup);
        if case.given_up {
            for id in &case.setup.running {
                assert!(h.worker.kill_runner(id, "test"));
            }
            h.script.containing("--kill", Reply::fail(1, "still there"));
            h.clock.advance(2 * MIN);
            runtime.block_on(h.worker.kill_due());
            for id in &case.setup.running {
                assert!(h.worker.given_up(id), "{}", case.name);
            }
        }
        // Giving up drains, which applies the same rule at once.
        let shut = h.worker.shutdown_if_idle() || h.worker.state() == Shutdown && case.given_up;
        assert_eq!(shut, case.want, "{}", case.name);
        let effects = kinds(&h.worker.take_effects());
        assert_eq!(effects.contains(&Fx::Destroy), case.want, "{}: {effects:?}", case.name);
        if case.want {
            assert_eq!(h.worker.state(), Shutdown, "{}", case.name);
        }
    }
}

#[test]
fn kill_repeats_term_then_gives_up_and_drains() {
    let runtime = rt();
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&ago_running(Duration::ZERO, vec!["zzzzz-1"]));
    h.script.exact("crunch-run --kill 15 zzzzz-1", Reply::fail(1, "still running"));
    assert!(!h.worker.kill_runner("zzzzz-9", "no such runner"));
    assert!(h.worker.kill_runner("zzzzz-1", "cancelled"));
    assert!(h.worker.kill_runner("zzzzz-1", "cancelled twice"), "idempotent");
    // (advance, signals sent by kill_due, idle behaviour after)
    let steps: &[(Duration, usize, IdleBehavior)] = &[
        (Duration::ZERO, 1, IdleBehavior::Run), // first TERM at once
        (secs(1), 0, IdleBehavior::Run),        // not yet due again
        (secs(4), 1, IdleBehavior::Run),        // 5 s after the first
        (secs(5), 1, IdleBehavior::Run),
        (2 * MIN, 0, IdleBehavior::Drain), // gave up: drain
        (secs(5), 0, IdleBehavior::Drain), // no more signals
    ];
    for (i, (advance, sent, idle)) in steps.iter().enumerate() {
        h.clock.advance(*advance);
        assert_eq!(runtime.block_on(h.worker.kill_due()), *sent, "step {i}");
        assert_eq!(h.worker.idle_behavior(), *idle, "step {i}");
    }
    assert!(h.worker.given_up("zzzzz-1"));
    // Draining with every runner given up: shut down while still running.
    assert_eq!(h.worker.state(), State::Shutdown);
    assert!(kinds(&h.worker.take_effects()).contains(&Fx::Destroy));
}

#[test]
fn unkillable_runner_on_hold_does_not_drain() {
    let runtime = rt();
    let h = harness(State::Running, IdleBehavior::Hold);
    h.worker.set_up(&ago_running(Duration::ZERO, vec!["zzzzz-1"]));
    h.script.containing("--kill", Reply::Timeout);
    h.worker.kill_runner("zzzzz-1", "cancelled");
    runtime.block_on(h.worker.kill_due());
    h.clock.advance(3 * MIN);
    runtime.block_on(h.worker.kill_due());
    assert!(h.worker.given_up("zzzzz-1"));
    assert_eq!(h.worker.idle_behavior(), IdleBehavior::Hold);
    assert!(!h.worker.shutdown_if_idle());
}

#[test]
fn a_successful_kill_closes_the_runner() {
    let runtime = rt();
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&ago_running(Duration::ZERO, vec!["zzzzz-1"]));
    h.script.exact("crunch-run --kill 15 zzzzz-1", Reply::ok(""));
    h.worker.kill_runner("zzzzz-1", "cancelled");
    assert_eq!(runtime.block_on(h.worker.kill_due()), 1);
    let view = h.worker.view();
    assert_eq!(view.state, State::Idle);
    assert!(view.running.is_empty());
    assert!(kinds(&h.worker.take_effects()).contains(&Fx::Exited));
}

struct StartCase {
    name: &'static str,
    state: State,
    idle: IdleBehavior,
    id: &'static str,
    reply: Reply,
    want_ok: bool,
    want_state: State,
    want_running: &'static [&'static str],
}

#[test]
fn start_runner_table() {
    use IdleBehavior::{Drain, Hold, Run};
    let cases = vec![
        StartCase {
            name: "idle, run: started",
            state: State::Idle,
            idle: Run,
            id: "zzzzz-1",
            reply: Reply::ok(""),
            want_ok: true,
            want_state: State::Running,
            want_running: &["zzzzz-1"],
        },
        StartCase {
            name: "start command fails: still counted until a probe says otherwise",
            state: State::Idle,
            idle: Run,
            id: "zzzzz-1",
            reply: Reply::fail(1, "lock held"),
            want_ok: false,
            want_state: State::Running,
            want_running: &["zzzzz-1"],
        },
        StartCase {
            name: "start hangs: cut, still counted",
            state: State::Idle,
            idle: Run,
            id: "zzzzz-1",
            reply: Reply::Timeout,
            want_ok: false,
            want_state: State::Running,
            want_running: &["zzzzz-1"],
        },
        StartCase {
            name: "drain refuses work",
            state: State::Idle,
            idle: Drain,
            id: "zzzzz-1",
            reply: Reply::ok(""),
            want_ok: false,
            want_state: State::Idle,
            want_running: &[],
        },
        StartCase {
            name: "hold refuses work",
            state: State::Idle,
            idle: Hold,
            id: "zzzzz-1",
            reply: Reply::ok(""),
            want_ok: false,
            want_state: State::Idle,
            want_running: &[],
        },
        StartCase {
            name: "booting refuses work",
            state: State::Booting,
            idle: Run,
            id: "zzzzz-1",
            reply: Reply::ok(""),
            want_ok: false,
            want_state: State::Booting,
            want_running: &[],
        },
        StartCase {
            name: "a NUL in the id is refused",
            state: State::Idle,
            idle: Run,
            id: "zzzzz-\0",
            reply: Reply::ok(""),
            want_ok: false,
            want_state: State::Idle,
            want_running: &[],
        },
    ];
    let runtime = rt();
    for case in cases {
        let h = harness(case.state, case.idle);
        h.script.containing("--detach", case.reply.clone());
        let result = runtime.block_on(h.worker.start_runner(case.id, b"{\"config\":1}"));
        assert_eq!(result.is_ok(), case.want_ok, "{}: {result:?}", case.name);
        let view = h.worker.view();
        assert_eq!(view.state, case.want_state, "{}", case.name);
        assert_eq!(view.running, case.want_running, "{}", case.name);
        assert!(view.starting.is_empty(), "{}", case.name);
    }
}

#[test]
fn a_hostile_runner_id_stays_one_word() {
    let runtime = rt();
    let h = harness(State::Idle, IdleBehavior::Run);
    h.script.containing("--detach", Reply::ok(""));
    let id = "zzzzz-1'; touch /tmp/pwned; echo '";
    runtime.block_on(h.worker.start_runner(id, b"")).unwrap();
    let call = h.script.calls().pop().unwrap();
    assert_eq!(call.command, format!("crunch-run --detach {}", quote("id", id).unwrap()));
    assert_eq!(call.command, "crunch-run --detach 'zzzzz-1'\\''; touch /tmp/pwned; echo '\\'''");
}

/// An instance's own runner arguments (where the runner finds what it drives on that host)
/// come first in every runner command there: list, start, kill, outcome, resources.
#[test]
fn an_instances_runner_args_come_first_in_every_runner_command() {
    let runtime = rt();
    let script = ScriptedExecutor::new("w1");
    let mut config = worker_config(false);
    config.runner.outcome_args = Some("--outcome".into());
    config.runner.resources_args = Some("--resources".into());
    let instance = Instance {
        runner_args: "--data-dir '/srv/my node'".into(),
        ..Instance::new(InstanceId::from("w1"), "127.0.0.1:22")
    };
    let spec = WorkerSpec {
        instance,
        instance_type: "small".into(),
        state: State::Idle,
        idle_behavior: IdleBehavior::Run,
    };
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(100_000))));
    let worker = Worker::new(
        spec,
        Arc::new(script.clone()),
        Arc::new(config.prepare().unwrap()),
        clock,
        Arc::new(Brake::default()),
    );
    let prefix = "crunch-run --data-dir '/srv/my node' ";
    script.exact(&format!("{prefix}--list"), Reply::ok("zzzzz-1\n"));
    script.exact(&format!("{prefix}--resources"), Reply::ok("cpu_mhz=1 memory_mb=1 cores=1\n"));
    script.exact(&format!("{prefix}--detach zzzzz-2"), Reply::ok(""));
    script.exact(&format!("{prefix}--outcome zzzzz-1"), Reply::ok("running\n"));
    script.exact(&format!("{prefix}--kill 15 zzzzz-1"), Reply::ok(""));
    assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
    runtime.block_on(worker.start_runner("zzzzz-2", b"")).unwrap();
    let outcome = runtime.block_on(worker.runner_outcome("zzzzz-1")).unwrap();
    assert_eq!(outcome.map(|o| o.to_string()).as_deref(), Some("running"));
    assert!(worker.kill_runner("zzzzz-1", "test"));
    assert_eq!(runtime.block_on(worker.kill_due()), 1);
    let calls: Vec<String> = script.calls().into_iter().map(|c| c.command).collect();
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(calls.iter().all(|c| c.starts_with(prefix)), "{calls:?}");
}

#[test]
fn a_probe_moves_a_listed_starting_runner_to_running_and_keeps_unlisted_ones() {
    let runtime = rt();
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&Setup { starting: vec!["zzzzz-1", "zzzzz-2"], ..Setup::default() });
    h.script.exact(LIST, Reply::ok("zzzzz-1\n"));
    runtime.block_on(h.worker.probe_and_update());
    let view = h.worker.view();
    assert_eq!(view.running, ["zzzzz-1"]);
    assert_eq!(view.starting, ["zzzzz-2"]);
    assert_eq!(view.state, State::Running);
    assert_eq!(view.last_runner.as_deref(), Some("zzzzz-1"));
}

/// Once a worker's run probe passes, its runner is asked what the worker has for work, until
/// it answers (a minute apart after a failure); the view shows the answer, and later probes
/// do not ask again.
#[test]
fn a_worker_learns_its_resources_once_its_run_probe_passes() {
    let runtime = rt();
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(100_000))));
    let script = ScriptedExecutor::new("w1");
    let mut asking = worker_config(false);
    asking.runner.resources_args = Some("--resources".into());
    let prepared = asking.prepare().unwrap();
    let instance = Instance::new(InstanceId::from("w1"), "127.0.0.1:22");
    let spec = WorkerSpec {
        instance,
        instance_type: "small".into(),
        state: State::Idle,
        idle_behavior: IdleBehavior::Run,
    };
    let brake = Arc::new(Brake::default());
    let worker =
        Worker::new(spec, Arc::new(script.clone()), Arc::new(prepared), clock.clone(), brake);
    let asked = || script.calls().iter().filter(|c| c.command.ends_with("--resources")).count();
    script.exact(LIST, Reply::ok(""));
    script.exact("crunch-run --resources", Reply::fail(1, "no agent"));
    runtime.block_on(worker.probe_and_update());
    assert_eq!((asked(), worker.view().resources), (1, None), "a failure is asked again");
    script.exact("crunch-run --resources", Reply::ok("cpu_mhz=8000 memory_mb=4096 cores=2\n"));
    clock.advance(secs(10));
    runtime.block_on(worker.probe_and_update());
    assert_eq!(asked(), 1, "not again within a minute");
    clock.advance(RESOURCES_RETRY);
    runtime.block_on(worker.probe_and_update());
    let known = Resources { cpu_mhz: 8000, memory_mb: 4096, cores: 2 };
    assert_eq!((asked(), worker.view().resources), (2, Some(known)));
    clock.advance(secs(10));
    runtime.block_on(worker.probe_and_update());
    assert_eq!(asked(), 2, "known: not asked again");
    assert_eq!(worker.view().state, State::Idle);
}

#[test]
fn close_runner_turns_the_last_one_idle() {
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&ago_running(Duration::ZERO, vec!["zzzzz-1", "zzzzz-2"]));
    h.worker.close_runner("zzzzz-1");
    assert_eq!(h.worker.state(), State::Running);
    h.worker.close_runner("zzzzz-unknown");
    h.worker.close_runner("zzzzz-2");
    assert_eq!(h.worker.state(), State::Idle);
    let exits: Vec<String> = h
        .worker
        .take_effects()
        .into_iter()
        .filter_map(|e| match e {
            Effect::RunnerExited(id, _) => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(exits, ["zzzzz-1", "zzzzz-2"]);
}

#[test]
fn idle_behavior_is_saved_in_tags_only_when_it_changes() {
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&ago_running(Duration::ZERO, vec!["zzzzz-1"]));
    h.worker.set_idle_behavior(IdleBehavior::Run);
    assert!(h.worker.take_effects().is_empty(), "same behaviour: no tag write");
    h.worker.set_idle_behavior(IdleBehavior::Hold);
    let effects = h.worker.take_effects();
    let Some(Effect::SaveTags(tags)) = effects.first() else { panic!("{effects:?}") };
    assert_eq!(tags.get("t-IdleBehavior").map(String::as_str), Some("hold"));
    assert_eq!(tags.get("t-InstanceType").map(String::as_str), Some("small"));
}

#[test]
fn shutdown_on_request_table() {
    use IdleBehavior::{Hold, Run};
    let cases = [
        (State::Idle, Run, Ok(())),
        (State::Booting, Run, Ok(())),
        (State::Idle, Hold, Err("worker w1 cannot shut down: its idle behavior is hold")),
        (State::Running, Run, Err("worker w1 cannot shut down: it is running")),
        (State::Unknown, Run, Err("worker w1 cannot shut down: it is unknown")),
    ];
    for (state, idle, want) in cases {
        let h = harness(state, idle);
        let got = h.worker.shutdown().map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(str::to_owned), "{state} {idle}");
        if want.is_ok() {
            assert_eq!(kinds(&h.worker.take_effects()), [Fx::Aborted, Fx::Destroy]);
        }
    }
}

#[test]
fn kill_instance_ignores_hold() {
    let h = harness(State::Running, IdleBehavior::Hold);
    h.worker.kill_instance("operator");
    assert_eq!(h.worker.state(), State::Shutdown);
}

/// Polls a future that must finish without waiting (everything it awaits is scripted).
fn finish_now<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a scripted future waited"),
    }
}

#[test]
fn a_probe_during_a_start_moves_the_runner_and_the_start_leaves_it_alone() {
    // A start racing a probe: while the start command runs, a probe lists the runner and
    // moves it from starting to running; the start must not add it again or reset it.
    fn probe_during_start(worker: &Worker, command: &str, _: &FakeClock) {
        if command.contains("--detach") {
            assert_eq!(finish_now(worker.probe_and_update()), ProbeOutcome::Passed);
            assert_eq!(worker.view().running, ["zzzzz-1"], "the probe moved it");
        }
    }
    let runtime = rt();
    let h = harness_with(State::Idle, IdleBehavior::Run, false, "root", Some(probe_during_start));
    h.script.containing("--detach", Reply::ok(""));
    h.script.exact(LIST, Reply::ok("zzzzz-1\n"));
    runtime.block_on(h.worker.start_runner("zzzzz-1", b"")).unwrap();
    let view = h.worker.view();
    assert_eq!(view.running, ["zzzzz-1"]);
    assert!(view.starting.is_empty());
    assert_eq!(view.state, State::Running);
}

#[test]
fn a_shutdown_during_a_failing_probe_is_not_repeated() {
    // Shut down while the probe ran: the failed probe adds no second destroy.
    fn shut_down(worker: &Worker, command: &str, clock: &FakeClock) {
        if command == LIST {
            clock.advance(secs(1));
            worker.kill_instance("operator");
        }
    }
    let runtime = rt();
    let h = harness_with(State::Idle, IdleBehavior::Run, false, "root", Some(shut_down));
    h.worker.set_up(&ago(11 * MIN));
    h.script.exact(LIST, Reply::fail(1, "gone"));
    assert_eq!(runtime.block_on(h.worker.probe_and_update()), ProbeOutcome::Failed);
    assert_eq!(kinds(&h.worker.take_effects()), [Fx::Aborted, Fx::Destroy]);
}

#[test]
fn a_slow_failing_probe_is_judged_from_its_start() {
    // Last success 9 min 59 s before the probe starts; the probe takes two minutes and fails.
    // Measured from its start the worker was unresponsive for less than the 10 min timeout,
    // so it stays, and the next probe (started after the timeout) decides.
    fn slow(_: &Worker, command: &str, clock: &FakeClock) {
        if command == LIST {
            clock.advance(2 * MIN);
        }
    }
    let runtime = rt();
    let h = harness_with(State::Idle, IdleBehavior::Run, false, "root", Some(slow));
    h.worker.set_up(&ago(10 * MIN - secs(1)));
    h.script.exact(LIST, Reply::Timeout);
    runtime.block_on(h.worker.probe_and_update());
    assert_eq!(h.worker.state(), State::Idle);
    runtime.block_on(h.worker.probe_and_update());
    assert_eq!(h.worker.state(), State::Shutdown);
}

#[test]
fn the_end_of_work_counts_as_busy_until_now() {
    // A running worker whose work ended is idle from the probe that saw it end, not from the
    // last probe that saw it busy.
    let runtime = rt();
    let h = harness(State::Running, IdleBehavior::Run);
    h.worker.set_up(&ago_running(10 * MIN, vec!["zzzzz-1"]));
    h.script.exact(LIST, Reply::ok(""));
    runtime.block_on(h.worker.probe_and_update());
    assert_eq!(h.worker.state(), State::Idle);
    h.clock.advance(secs(59));
    assert!(!h.worker.shutdown_if_idle());
    h.clock.advance(secs(1));
    assert!(h.worker.shutdown_if_idle());
}

#[test]
fn a_sync_with_an_unchanged_listing_does_not_void_a_probe_in_flight() {
    // The pool syncs every worker often; a listing that changed nothing must not make the
    // probes that overlap it count for nothing (a worker would take several probes to boot).
    fn resync(worker: &Worker, command: &str, clock: &FakeClock) {
        if command == LIST {
            clock.advance(secs(1));
            worker.sync_instance(worker.instance());
        }
    }
    let runtime = rt();
    let h = harness_with(State::Idle, IdleBehavior::Run, false, "root", Some(resync));
    h.script.exact(LIST, Reply::ok("zzzzz-1\n"));
    assert_eq!(runtime.block_on(h.worker.probe_and_update()), ProbeOutcome::Passed);
    let view = h.worker.view();
    assert_eq!((view.state, view.running), (State::Running, vec!["zzzzz-1".to_owned()]));
}

/// One row of Arvados' `TestProbeAndUpdate`.
struct Trial {
    comment: &'static str,
    /// How long ago the worker appeared, was last probed, busy and changed.
    age: Duration,
    state: State,
    running: bool,
    starting: bool,
    boot: Reply,
    deploy: Reply,
    run: Reply,
    run_deployed: Reply,
    deploy_runner: Option<&'static [u8]>,
    expect_stdin: &'static [u8],
    expect_state: State,
    expect_running: usize,
}

impl Default for Trial {
    /// As Arvados' zero values: every command succeeds, the run probe lists nothing.
    fn default() -> Trial {
        Trial {
            comment: "",
            age: Duration::ZERO,
            state: State::Unknown,
            running: false,
            starting: false,
            boot: Reply::ok(""),
            deploy: Reply::ok(""),
            run: Reply::ok(""),
            run_deployed: Reply::ok(""),
            deploy_runner: None,
            expect_stdin: b"",
            expect_state: State::Unknown,
            expect_running: 0,
        }
    }
}

/// Arvados' `TestProbeAndUpdate` (worker_test.go), every row, through the public API: a worker
/// built on a record of the trial's age and runners, probed once over a scripted executor. A
/// boot timeout of a minute, a probe timeout of a second.
///
/// The one difference in the setup: after copying the runner, wharf checks its sha256 on the
/// worker, so the script answers that check with "absent" before the copy and the right
/// hash after it (Arvados' stub executor fails its md5 check every time and never checks again).
#[test]
fn probe_and_update() {
    use State::*;
    let fail = || Reply::fail(1, "command failed\n");
    let container = || Reply::ok("zzzzz-dz642-abcdefghijklmno\n");
    let boot_timeout = MIN;
    let probe_timeout = secs(1);
    let elf: &'static [u8] = b"ELF";
    let trials = vec![
        Trial {
            comment: "Unknown, probes fail",
            boot: fail(),
            run: fail(),
            expect_state: Unknown,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot probe fails, but one container is running",
            boot: fail(),
            run: container(),
            expect_state: Unknown,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot probe fails, previously running container has exited",
            running: true,
            boot: fail(),
            expect_state: Unknown,
            expect_running: 0,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot timeout exceeded, boot probe fails",
            age: boot_timeout + secs(1),
            boot: fail(),
            run: fail(),
            expect_state: Shutdown,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot timeout exceeded, boot probe succeeds but crunch-run fails",
            age: boot_timeout * 2,
            run: fail(),
            expect_state: Shutdown,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot timeout exceeded, boot probe fails but crunch-run succeeds",
            age: boot_timeout * 2,
            boot: fail(),
            expect_state: Shutdown,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot timeout exceeded, boot probe fails but container is running",
            age: boot_timeout * 2,
            boot: fail(),
            run: container(),
            expect_state: Unknown,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot probe fails, deployRunner succeeds, container is running",
            boot: fail(),
            run: fail(),
            run_deployed: container(),
            deploy_runner: Some(elf),
            expect_stdin: elf,
            expect_state: Unknown,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot timeout exceeded, boot probe fails but deployRunner succeeds and container is running",
            age: boot_timeout * 2,
            boot: fail(),
            run: fail(),
            run_deployed: container(),
            deploy_runner: Some(elf),
            expect_stdin: elf,
            expect_state: Unknown,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Unknown, boot timeout exceeded, boot probe fails but deployRunner succeeds and no container is running",
            age: boot_timeout * 2,
            boot: fail(),
            run: fail(),
            deploy_runner: Some(elf),
            expect_stdin: elf,
            expect_state: Shutdown,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe fails, run probe fails",
            state: Booting,
            boot: fail(),
            run: fail(),
            expect_state: Booting,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe fails, run probe succeeds (but isn't expected to be called)",
            state: Booting,
            boot: fail(),
            expect_state: Booting,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe succeeds, run probe fails",
            state: Booting,
            run: fail(),
            expect_state: Booting,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe succeeds, run probe succeeds",
            state: Booting,
            expect_state: Idle,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe succeeds, run probe succeeds, container is running",
            state: Booting,
            run: container(),
            expect_state: Running,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot timeout exceeded",
            state: Booting,
            age: boot_timeout * 2,
            run: fail(),
            expect_state: Shutdown,
            ..Trial::default()
        },
        Trial {
            comment: "Idle, probe timeout exceeded, one container running",
            state: Idle,
            age: probe_timeout * 2,
            run: container(),
            expect_state: Running,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Idle, probe timeout exceeded, one container running, probe fails",
            state: Idle,
            age: probe_timeout * 2,
            running: true,
            run: fail(),
            expect_state: Shutdown,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Idle, probe timeout exceeded, nothing running, probe fails",
            state: Idle,
            age: probe_timeout * 2,
            run: fail(),
            expect_state: Shutdown,
            ..Trial::default()
        },
        Trial {
            comment: "Running, one container still running",
            state: Running,
            running: true,
            run: container(),
            expect_state: Running,
            expect_running: 1,
            ..Trial::default()
        },
        Trial {
            comment: "Running, container has exited",
            state: Running,
            running: true,
            expect_state: Idle,
            expect_running: 0,
            ..Trial::default()
        },
        Trial {
            comment: "Running, probe timeout exceeded, nothing running, new container being started",
            state: Running,
            age: probe_timeout * 2,
            starting: true,
            expect_state: Running,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe succeeds, deployRunner succeeds, run probe succeeds",
            state: Booting,
            deploy_runner: Some(elf),
            expect_stdin: elf,
            run: fail(),
            run_deployed: container(),
            expect_running: 1,
            expect_state: Running,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe succeeds, deployRunner fails",
            state: Booting,
            deploy_runner: Some(elf),
            deploy: fail(),
            expect_stdin: elf,
            expect_state: Booting,
            ..Trial::default()
        },
        Trial {
            comment: "Booting, boot probe succeeds, deployRunner skipped, run probe succeeds",
            state: Booting,
            deploy_runner: None,
            deploy: fail(),
            expect_state: Idle,
            ..Trial::default()
        },
    ];
    assert_eq!(trials.len(), 25, "every row of the reference's table");
    let runtime = rt();
    for (index, trial) in trials.into_iter().enumerate() {
        let name = format!("trial {index}: {}", trial.comment);
        let config = WorkerConfig {
            timeouts: Timeouts {
                booting: boot_timeout,
                probe: probe_timeout,
                ..Timeouts::default()
            },
            boot_probe_command: "bootprobe".into(),
            runner: RunnerConfig {
                command: "crunch-run".into(),
                binary: trial.deploy_runner.map(|bytes| RunnerBinary::Bytes(Arc::from(bytes))),
                directory: "/var/run/arvados".into(),
                list_args: "--list".into(),
                ..RunnerConfig::default()
            },
            cluster_prefix: "zzzzz-".into(),
            ..WorkerConfig::default()
        }
        .prepare()
        .unwrap();
        let script = ScriptedExecutor::new("w1");
        script.exact("bootprobe", trial.boot);
        script.exact("crunch-run --list", trial.run);
        script.containing("cat >\"$tmp\"", trial.deploy);
        if let Some(deployment) = config.deployment() {
            let path = quote("p", &deployment.path).unwrap();
            script.exact(&format!("{path} --list"), trial.run_deployed);
            let hash = format!("{}  {}\n", deployment.sha256, deployment.path);
            script.on(
                Match::Exact(format!("sha256sum {path}")),
                [Reply::fail(1, "No such file or directory"), Reply::ok(&hash)],
            );
        }
        let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(100_000))));
        let spec = WorkerSpec {
            instance: Instance {
                id: "w1".into(),
                address: Some("10.0.0.1:22".into()),
                remote_user: "root".into(),
                tags: Tags::new(),
                host_key: None,
                runner_args: String::new(),
            },
            instance_type: "small".into(),
            state: trial.state,
            idle_behavior: IdleBehavior::Run,
        };
        let mut record = Record::new(spec, clock.now() - trial.age);
        if trial.running {
            record.add_running("zzzzz-dz642-abcdefghijklmno");
        }
        if trial.starting {
            record.starting.insert("zzzzz-dz642-bcdefghijklmnop".into(), Runner::default());
        }
        let worker = Worker::with_record(
            record,
            Arc::new(script.clone()),
            Arc::new(config),
            clock,
            Arc::new(Brake::default()),
        );
        runtime.block_on(worker.probe_and_update());
        let record = worker.record();
        assert_eq!(record.state, trial.expect_state, "{name}");
        assert_eq!(record.running.len(), trial.expect_running, "{name}");
        let stdin: Vec<u8> = script.calls().into_iter().flat_map(|call| call.stdin).collect();
        assert_eq!(stdin, trial.expect_stdin, "{name}");
    }
}

/// The probe's decision alone, as a table: a record, what the probe found, and the time; the
/// new record and the effects. No executor, no runtime.
#[test]
fn after_probe_table() {
    use IdleBehavior::{Drain, Hold, Run};
    use State::*;
    let timeouts = Timeouts { booting: 10 * MIN, probe: 10 * MIN, ..Timeouts::default() };
    let now = Moment::from_origin(secs(100_000));
    let listed = |ids: &[&str], broken: bool, stale: &[&str]| RunReport {
        result: Ok(crate::runner_list::RunnerList {
            running: ids.iter().map(|s| (*s).to_owned()).collect(),
            stale: stale.iter().map(|s| (*s).to_owned()).collect(),
            broken,
            ..Default::default()
        }),
        took: secs(1),
    };
    let failed = || RunReport { result: Err("unreachable".into()), took: secs(20) };

    /// A case: how the record is set up, what the probe found, and what must follow.
    struct Case {
        name: &'static str,
        state: State,
        idle: IdleBehavior,
        /// Last success this long before the probe started.
        probed_ago: Duration,
        running: &'static [&'static str],
        booted: bool,
        contacted: bool,
        run: Option<RunReport>,
        brake: bool,
        /// The record changed while the probe ran.
        raced: bool,
        /// The probe started this long before it ended.
        took: Duration,
        want_state: State,
        want_idle: IdleBehavior,
        want_running: &'static [&'static str],
        want_effects: &'static [Fx],
        want_outcome: ProbeOutcome,
    }
    let case = |name, state, run| Case {
        name,
        state,
        idle: Run,
        probed_ago: secs(10),
        running: &[],
        booted: state.is_booted(),
        contacted: false,
        run,
        brake: false,
        raced: false,
        took: secs(1),
        want_state: state,
        want_idle: Run,
        want_running: &[],
        want_effects: &[],
        want_outcome: ProbeOutcome::Passed,
    };
    let cases = vec![
        Case {
            want_effects: &[Fx::Ready, Fx::Success],
            booted: true,
            contacted: true,
            want_state: Idle,
            ..case(
                "booting, both probes pass: idle, ready, success",
                Booting,
                Some(listed(&[], false, &[])),
            )
        },
        Case {
            want_state: Running,
            want_running: &["zzzzz-1"],
            ..case(
                "idle, a runner listed: adopted, running",
                Idle,
                Some(listed(&["zzzzz-1"], false, &[])),
            )
        },
        Case {
            running: &["zzzzz-1"],
            want_state: Idle,
            want_effects: &[Fx::Exited],
            ..case(
                "running, nothing listed: the runner ended",
                Running,
                Some(listed(&[], false, &[])),
            )
        },
        Case {
            running: &["zzzzz-1"],
            raced: true,
            want_state: Running,
            want_running: &["zzzzz-1"],
            ..case(
                "changed while probing: runners left alone",
                Running,
                Some(listed(&[], false, &[])),
            )
        },
        Case {
            probed_ago: 10 * MIN - secs(1),
            want_outcome: ProbeOutcome::Failed,
            ..case("idle, fails just under the probe timeout: kept", Idle, Some(failed()))
        },
        Case {
            probed_ago: 10 * MIN,
            want_state: Shutdown,
            want_effects: &[Fx::Destroy],
            want_outcome: ProbeOutcome::Failed,
            ..case("idle, fails at the probe timeout: shut down", Idle, Some(failed()))
        },
        Case {
            // The last success was 9 min 50 s before the probe started, which took 30 s.
            probed_ago: 10 * MIN - secs(10),
            took: secs(30),
            want_outcome: ProbeOutcome::Failed,
            ..case("judged from the probe's start, not its end: kept", Idle, Some(failed()))
        },
        Case {
            probed_ago: 11 * MIN,
            brake: true,
            want_outcome: ProbeOutcome::Failed,
            ..case("past the probe timeout, brake engaged: kept", Idle, Some(failed()))
        },
        Case {
            probed_ago: 11 * MIN,
            idle: Hold,
            want_idle: Hold,
            want_outcome: ProbeOutcome::Failed,
            ..case("past the probe timeout, hold: kept", Idle, Some(failed()))
        },
        Case {
            probed_ago: 11 * MIN,
            want_state: Shutdown,
            want_effects: &[Fx::Destroy, Fx::Failure],
            want_outcome: ProbeOutcome::Failed,
            ..case("booting past the boot timeout: shut down, boot failed", Booting, None)
        },
        Case {
            probed_ago: 11 * MIN,
            want_running: &["zzzzz-1"],
            ..case(
                "unknown, boot failing, work listed past the timeout: kept",
                Unknown,
                Some(listed(&["zzzzz-1"], false, &[])),
            )
        },
        Case {
            want_state: Shutdown,
            want_idle: Drain,
            // The boot outcome was counted as a failure: shutting down adds no second one.
            want_effects: &[Fx::Failure, Fx::Tags, Fx::Destroy],
            ..case("idle reports broken: drained, shut down", Idle, Some(listed(&[], true, &[])))
        },
        Case {
            idle: Hold,
            want_idle: Hold,
            ..case("hold reports broken: left alone", Idle, Some(listed(&[], true, &[])))
        },
        Case {
            ..case("a first stale lock is not broken", Idle, Some(listed(&[], false, &["zzzzz-9"])))
        },
    ];
    for case in cases {
        let spec = WorkerSpec {
            instance: Instance {
                id: "w1".into(),
                address: None,
                remote_user: "root".into(),
                tags: Tags::new(),
                host_key: None,
                runner_args: String::new(),
            },
            instance_type: "small".into(),
            state: case.state,
            idle_behavior: case.idle,
        };
        let started = now - case.took;
        let mut record = Record::new(spec, started - case.probed_ago);
        for id in case.running {
            record.add_running(id);
        }
        let mut report = ProbeReport::start(&record, started);
        report.booted = case.booted;
        report.contacted = case.contacted;
        report.run = case.run;
        if case.raced {
            record.updated = started + secs(1);
        }
        let rules = Rules { timeouts: &timeouts, tag_prefix: "t-", brake_engaged: case.brake };
        let mut fx = Vec::new();
        let outcome = record.after_probe(report, now, &rules, &mut fx);
        let name = case.name;
        assert_eq!(outcome, case.want_outcome, "{name}");
        assert_eq!(record.state, case.want_state, "{name}");
        assert_eq!(record.idle_behavior, case.want_idle, "{name}");
        let running: Vec<&str> = record.running.keys().map(String::as_str).collect();
        assert_eq!(running, case.want_running, "{name}");
        assert_eq!(kinds(&fx), case.want_effects, "{name}");
        if outcome == ProbeOutcome::Passed && !case.raced {
            assert_eq!(record.probed, now, "{name}: a pass is a success at its end");
        }
    }
}

/// A runner that left the list holds the worker's idle shutdown until its outcome is
/// collected, or the hold runs out; as a table of what happens to a worker running one runner,
/// step by step. No executor, no runtime.
#[test]
fn an_ended_runner_holds_the_idle_shutdown_until_its_outcome_is_in_table() {
    use IdleBehavior::{Drain, Run};
    use State::{Idle, Running, Shutdown};
    const RUNNER: &str = "zzzzz-1";
    /// What happens to the worker, in order.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// The clock moves on.
        Wait(Duration),
        /// A run probe passes, listing these.
        Probe(&'static [&'static str]),
        /// A run probe fails, its last success long past the probe timeout.
        ProbeFailsLong,
        /// A kill of the runner succeeded.
        Killed,
        /// The pool's user says the runner's outcome is in; whether it was awaited.
        Collected(bool),
        /// The pool's idle check (each probe round makes one); whether it shut down.
        IdleCheck(bool),
        /// An operator or a scheduler asks for a shutdown; whether it was done.
        Requested(bool),
    }
    struct Case {
        name: &'static str,
        idle: IdleBehavior,
        hold: Duration,
        steps: Vec<Step>,
        want_state: State,
        want_awaiting: &'static [&'static str],
    }
    use Step::*;
    let cases = vec![
        Case {
            name: "drained, ended: kept while its outcome is awaited",
            idle: Drain,
            hold: MIN,
            steps: vec![Probe(&[]), IdleCheck(false), Wait(MIN - secs(1)), IdleCheck(false)],
            want_state: Idle,
            want_awaiting: &[RUNNER],
        },
        Case {
            name: "drained, ended, its outcome collected: shut down at once",
            idle: Drain,
            hold: MIN,
            steps: vec![Probe(&[]), IdleCheck(false), Wait(secs(2)), Collected(true)],
            want_state: Shutdown,
            want_awaiting: &[],
        },
        Case {
            name: "drained, ended, the hold runs out: shut down without the outcome",
            idle: Drain,
            hold: MIN,
            steps: vec![Probe(&[]), Wait(MIN), IdleCheck(true), Collected(false)],
            want_state: Shutdown,
            want_awaiting: &[],
        },
        Case {
            name: "no hold configured: a drained worker goes as soon as it is idle",
            idle: Drain,
            hold: Duration::ZERO,
            steps: vec![Probe(&[]), IdleCheck(true)],
            want_state: Shutdown,
            want_awaiting: &[],
        },
        Case {
            name: "idle past the idle timeout, outcome awaited: kept until it is in",
            idle: Run,
            hold: 3 * MIN,
            steps: vec![
                Probe(&[]),
                Wait(2 * MIN),
                IdleCheck(false),
                Collected(true),
                Collected(false),
            ],
            want_state: Shutdown,
            want_awaiting: &[],
        },
        Case {
            name: "killed: awaits its outcome as one that ended",
            idle: Drain,
            hold: MIN,
            steps: vec![Killed, IdleCheck(false)],
            want_state: Idle,
            want_awaiting: &[RUNNER],
        },
        Case {
            name: "listed again after a probe missed it: running, nothing awaited",
            idle: Drain,
            hold: MIN,
            steps: vec![Probe(&[]), Wait(secs(10)), Probe(&[RUNNER]), IdleCheck(false)],
            want_state: Running,
            want_awaiting: &[],
        },
        Case {
            name: "an outcome that was not awaited changes nothing",
            idle: Run,
            hold: MIN,
            steps: vec![Collected(false)],
            want_state: Running,
            want_awaiting: &[],
        },
        Case {
            name: "unresponsive past the probe timeout: shut down, the hold does not keep it",
            idle: Drain,
            hold: 60 * MIN,
            steps: vec![Probe(&[]), ProbeFailsLong],
            want_state: Shutdown,
            want_awaiting: &[RUNNER],
        },
        Case {
            name: "a shutdown asked for is not held",
            idle: Run,
            hold: MIN,
            steps: vec![Probe(&[]), IdleCheck(false), Requested(true)],
            want_state: Shutdown,
            want_awaiting: &[RUNNER],
        },
    ];
    for case in cases {
        let name = case.name;
        let timeouts = Timeouts {
            booting: 10 * MIN,
            probe: 10 * MIN,
            idle: MIN,
            outcome_hold: case.hold,
            ..Timeouts::default()
        };
        let rules = Rules { timeouts: &timeouts, tag_prefix: "t-", brake_engaged: false };
        let spec = WorkerSpec {
            instance: Instance {
                id: "w1".into(),
                address: None,
                remote_user: "root".into(),
                tags: Tags::new(),
                host_key: None,
                runner_args: String::new(),
            },
            instance_type: "small".into(),
            state: Running,
            idle_behavior: case.idle,
        };
        let mut now = Moment::from_origin(secs(100_000));
        let mut record = Record::new(spec, now);
        record.add_running(RUNNER);
        let mut fx = Vec::new();
        for (index, step) in case.steps.iter().enumerate() {
            let at = format!("{name}: step {index} ({step:?})");
            match *step {
                Wait(d) => now = now + d,
                Probe(ids) => {
                    let mut report = ProbeReport::start(&record, now);
                    report.run = Some(RunReport {
                        result: Ok(crate::runner_list::RunnerList {
                            running: ids.iter().map(|s| (*s).to_owned()).collect(),
                            ..Default::default()
                        }),
                        took: Duration::ZERO,
                    });
                    let outcome = record.after_probe(report, now, &rules, &mut fx);
                    assert_eq!(outcome, ProbeOutcome::Passed, "{at}");
                }
                ProbeFailsLong => {
                    now = now + 11 * MIN;
                    let mut report = ProbeReport::start(&record, now);
                    report.run =
                        Some(RunReport { result: Err("unreachable".into()), took: secs(1) });
                    record.after_probe(report, now, &rules, &mut fx);
                }
                Killed => record.killed(RUNNER, now, &rules, &mut fx),
                Collected(want) => {
                    let awaited = record.outcome_collected(RUNNER, now, &rules, &mut fx);
                    assert_eq!(awaited, want, "{at}");
                }
                IdleCheck(want) => {
                    assert_eq!(record.shutdown_if_idle(now, &rules, &mut fx), want, "{at}");
                }
                Requested(want) => {
                    assert_eq!(record.request_shutdown(now, &mut fx).is_ok(), want, "{at}");
                }
            }
        }
        assert_eq!(record.state, case.want_state, "{name}");
        let awaiting: Vec<&str> = record.awaiting_outcome.keys().map(String::as_str).collect();
        assert_eq!(awaiting, case.want_awaiting, "{name}");
        assert_eq!(record.view(now).awaiting_outcome, case.want_awaiting, "{name}: its view");
        let destroys = kinds(&fx).iter().filter(|f| **f == Fx::Destroy).count();
        assert_eq!(destroys, usize::from(case.want_state == Shutdown), "{name}: {fx:?}");
    }
}

/// As Arvados (#20471): the last runner is the one this prober last started; one found
/// running stands in only while it has started none.
#[test]
fn the_last_runner_is_the_last_one_started_here() {
    let timeouts = Timeouts::default();
    let rules = Rules { timeouts: &timeouts, tag_prefix: "t-", brake_engaged: false };
    let spec = WorkerSpec {
        instance: Instance {
            id: "w1".into(),
            address: None,
            remote_user: "root".into(),
            tags: Tags::new(),
            host_key: None,
            runner_args: String::new(),
        },
        instance_type: "small".into(),
        state: State::Idle,
        idle_behavior: IdleBehavior::Run,
    };
    let mut now = Moment::from_origin(secs(1_000));
    let mut record = Record::new(spec, now);
    let mut fx = Vec::new();
    let mut probe = |record: &mut Record, now: Moment, ids: &[&str]| {
        let mut report = ProbeReport::start(record, now);
        report.run = Some(RunReport {
            result: Ok(crate::runner_list::RunnerList {
                running: ids.iter().map(|s| (*s).to_owned()).collect(),
                ..Default::default()
            }),
            took: Duration::ZERO,
        });
        record.after_probe(report, now, &rules, &mut fx);
    };
    probe(&mut record, now, &["zzzzz-found"]);
    assert_eq!(record.last_runner.as_deref(), Some("zzzzz-found"));
    let generation = record.begin_start("zzzzz-mine", &mut Vec::new()).unwrap();
    now = now + secs(1);
    record.start_ended("zzzzz-mine", generation, now);
    assert_eq!(record.last_runner.as_deref(), Some("zzzzz-mine"));
    now = now + secs(10);
    probe(&mut record, now, &["zzzzz-found", "zzzzz-mine"]);
    assert_eq!(record.last_runner.as_deref(), Some("zzzzz-mine"));
}
