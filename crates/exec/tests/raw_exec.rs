//! The raw_exec driver with real processes, real shims and real time.
//!
//! Ordering never relies on sleeping: a task tells the test it reached a point by writing to a
//! FIFO (opening one blocks until both ends are there), and every wait is bounded.

mod common;

use common::*;
use std::time::Duration;
use tokio::time::{Instant, timeout};
use wharf_driver::{Driver, DriverError, ExitResult, Health, RunState, TaskHandle};
use wharf_exec::{RawExecDriver, RawExecOptions};
use wharf_state::Signal;

async fn wait(driver: &RawExecDriver, handle: &TaskHandle) -> ExitResult {
    timeout(LIMIT, driver.wait_task(handle.id())).await.expect("the task never exited").unwrap()
}

fn pid_of(handle: &TaskHandle, field: &str) -> i32 {
    handle.driver_state.value()[field].as_i64().unwrap() as i32
}

#[tokio::test]
async fn exit_codes_and_signals_are_reported() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let cases = [
        ("exit 0", ExitResult::code(0)),
        ("exit 3", ExitResult::code(3)),
        ("exit 255", ExitResult::code(255)),
        ("kill -TERM $$", ExitResult::signalled(15)),
        ("kill -KILL $$", ExitResult::signalled(9)),
        ("test \"$WHARF_TEST\" = yes && test \"$(pwd)\" = \"$PWD_EXPECTED\"", ExitResult::code(0)),
    ];
    for (i, (script, expected)) in cases.into_iter().enumerate() {
        let name = format!("t{i}");
        let mut config = shell(root.path(), &name, script);
        let dir = config.task_dir.display().to_string();
        config.env.insert("PWD_EXPECTED".into(), dir);
        let handle = driver.start_task(config).await.unwrap();
        assert_eq!(wait(&driver, &handle).await, expected, "{script}");
        // Waiting again, even twice at once, gives the same answer.
        let (a, b) = tokio::join!(wait(&driver, &handle), wait(&driver, &handle));
        assert_eq!((a, b), (expected.clone(), expected.clone()), "{script}");
        let info = driver.inspect_task(handle.id()).await.unwrap();
        assert_eq!((info.state, info.exit), (RunState::Exited, Some(expected)));
        driver.destroy_task(handle.id(), false).await.unwrap();
    }
}

#[tokio::test]
async fn the_environment_is_exactly_the_tasks() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let handle = driver.start_task(shell(root.path(), "env", "env")).await.unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    let mut lines: Vec<String> =
        std::fs::read_to_string(handle.config.logs.dir.join("env.stdout.0"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
    lines.sort();
    // sh adds PWD (and sometimes SHLVL and _) itself; nothing comes from the test process.
    lines.retain(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="));
    assert_eq!(lines, ["PATH=/usr/local/bin:/usr/bin:/bin", "WHARF_TEST=yes"]);
}

#[tokio::test]
async fn a_task_has_only_stdin_stdout_and_stderr_open() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let handle = driver.start_task(shell(root.path(), "fds", "ls /proc/$$/fd")).await.unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    let listed = std::fs::read_to_string(handle.config.logs.dir.join("fds.stdout.0")).unwrap();
    assert_eq!(listed, "0\n1\n2\n");
}

#[tokio::test]
async fn output_is_captured_and_rotated() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let handle = driver
        .start_task(shell(root.path(), "logs", "echo out; echo err >&2; exit 4"))
        .await
        .unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(4));
    let logs = &handle.config.logs.dir;
    assert_eq!(std::fs::read_to_string(logs.join("logs.stdout.0")).unwrap(), "out\n");
    assert_eq!(std::fs::read_to_string(logs.join("logs.stderr.0")).unwrap(), "err\n");

    // 10-byte files, 3 kept: 45 bytes of output leave the last 25 in .2, .1 and .0.
    let mut config =
        shell(root.path(), "rot", "printf 0123456789abcdefghijABCDEFGHIJklmnopqrstKLMNO");
    config.logs.max_file_bytes = 10;
    config.logs.max_files = 3;
    let handle = driver.start_task(config).await.unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    let rot_logs = handle.config.logs.dir.clone();
    let read = |n: u32| std::fs::read_to_string(rot_logs.join(format!("rot.stdout.{n}")));
    assert_eq!(read(0).unwrap(), "KLMNO");
    assert_eq!(read(1).unwrap(), "klmnopqrst");
    assert_eq!(read(2).unwrap(), "ABCDEFGHIJ");
    assert!(read(3).is_err(), "only 3 files are kept");
}

#[tokio::test]
async fn a_task_that_ignores_sigterm_is_killed_at_its_timeout() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let config = shell(
        root.path(),
        "stubborn",
        "trap '' TERM; echo trapped > ready; while :; do sleep 1; done",
    );
    mkfifo(&config.task_dir.join("ready"));
    let ready = config.task_dir.join("ready");
    let handle = driver.start_task(config).await.unwrap();
    assert_eq!(read_fifo(&ready), "trapped\n");

    let mut events = driver.events();
    let kill_timeout = Duration::from_millis(500);
    let started = Instant::now();
    driver.stop_task(handle.id(), kill_timeout, Signal::Term).await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= kill_timeout && took < kill_timeout + Duration::from_millis(100),
        "stop took {took:?}, the deadline was {kill_timeout:?}"
    );
    assert_eq!(wait(&driver, &handle).await, ExitResult::signalled(9));
    assert!(!alive(pid_of(&handle, "task_pid")));
    let event = events.try_recv().unwrap();
    assert_eq!(&event.task_id, handle.id());
    assert!(event.message.contains("sent SIGKILL"), "{event:?}");
}

#[tokio::test]
async fn a_polite_task_stops_at_the_signal() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let handle = driver.start_task(shell(root.path(), "polite", "exec sleep 60")).await.unwrap();
    // A shell still starting may leave SIGINT to its child; the signal is for `sleep` itself.
    let comm = format!("/proc/{}/comm", pid_of(&handle, "task_pid"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep" {
        assert!(Instant::now() < deadline, "the task never became sleep");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    driver.stop_task(handle.id(), Duration::from_secs(10), Signal::Int).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(wait(&driver, &handle).await, ExitResult::signalled(2));
    // Stopping again is a no-op.
    driver.stop_task(handle.id(), Duration::from_secs(1), Signal::Term).await.unwrap();
}

#[tokio::test]
async fn stop_leaves_no_grandchild_behind() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    // One grandchild stays in the task's group but ignores SIGTERM; another leaves the group
    // and the session with setsid. Both must be gone when stop returns.
    let config = shell(
        root.path(),
        "family",
        "(trap '' TERM; exec sleep 600) & in_group=$!; \
         setsid sleep 600 & escaped=$!; \
         echo \"$in_group $escaped\" > pids; wait",
    );
    mkfifo(&config.task_dir.join("pids"));
    let pids_fifo = config.task_dir.join("pids");
    let handle = driver.start_task(config).await.unwrap();
    let pids: Vec<i32> =
        read_fifo(&pids_fifo).split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    let usage = driver.task_stats(handle.id()).await.unwrap();
    assert!(usage.processes >= 3, "{usage:?}");
    assert!(usage.memory_rss_bytes > 0, "{usage:?}");

    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Term).await.unwrap();
    for pid in pids {
        assert!(!alive(pid), "grandchild {pid} survived the stop");
    }
    assert_eq!(wait(&driver, &handle).await, ExitResult::signalled(15));
}

#[tokio::test]
async fn a_grandchild_left_behind_by_an_exited_task_is_killed() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let config = shell(root.path(), "daemon", "setsid sleep 600 & echo $! > pid; exit 0");
    mkfifo(&config.task_dir.join("pid"));
    let fifo = config.task_dir.join("pid");
    let handle = driver.start_task(config).await.unwrap();
    let pid: i32 = read_fifo(&fifo).trim().parse().unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    assert!(!alive(pid), "the background process {pid} outlived its task");
}

#[tokio::test]
async fn signals_exec_and_stats_reach_the_running_task() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let mut config = shell(root.path(), "svc", "sleep 600 & echo $! > ready; wait");
    config.env.insert("GREETING".into(), "hello".into());
    let dir = config.task_dir.clone();
    mkfifo(&dir.join("ready"));
    let handle = driver.start_task(config).await.unwrap();
    let sleep: i32 = read_fifo(&dir.join("ready")).trim().parse().unwrap();

    let info = driver.inspect_task(handle.id()).await.unwrap();
    assert_eq!(info.state, RunState::Running);
    assert_eq!(info.attributes["pid"], pid_of(&handle, "task_pid").to_string());

    // The shell (resident, it has run) and its sleep.
    let usage = driver.task_stats(handle.id()).await.unwrap();
    assert_eq!(usage.processes, 2, "{usage:?}");
    assert!(usage.memory_rss_bytes > 0);

    let command = ["sh", "-c", "echo $GREETING; pwd; echo oops >&2; exit 5"].map(String::from);
    let result = driver.exec_task(handle.id(), &command, LIMIT).await.unwrap();
    assert_eq!(String::from_utf8(result.stdout).unwrap(), format!("hello\n{}\n", dir.display()));
    assert_eq!(result.stderr, b"oops\n");
    assert_eq!(result.exit, ExitResult::code(5));

    let started = Instant::now();
    let slow = ["sleep", "600"].map(String::from);
    let result = driver.exec_task(handle.id(), &slow, Duration::from_millis(200)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(result.exit.signal, Some(9));
    assert!(result.exit.error.unwrap().contains("timed out"));

    let missing = ["no-such-program-anywhere"].map(String::from);
    match driver.exec_task(handle.id(), &missing, LIMIT).await {
        Err(DriverError::InvalidConfig { field, .. }) => assert_eq!(field, "command"),
        other => panic!("{other:?}"),
    }

    driver.signal_task(handle.id(), Signal::Usr1).await.unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::signalled(10));
    assert!(!alive(sleep));
    assert!(driver.signal_task(handle.id(), Signal::Usr1).await.is_err());
    assert_eq!(driver.task_stats(handle.id()).await.unwrap().processes, 0);
}

#[tokio::test]
async fn destroy_refuses_a_running_task_unless_forced_and_cleans_up() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let handle = driver.start_task(shell(root.path(), "d", "exec sleep 600")).await.unwrap();
    let run_dir =
        std::path::PathBuf::from(handle.driver_state.value()["run_dir"].as_str().unwrap());
    assert!(driver.destroy_task(handle.id(), false).await.is_err());
    driver.destroy_task(handle.id(), true).await.unwrap();
    assert!(!alive(pid_of(&handle, "task_pid")));
    assert!(!run_dir.exists());
    for result in [
        driver.wait_task(handle.id()).await.map(drop),
        driver.inspect_task(handle.id()).await.map(drop),
        driver.destroy_task(handle.id(), true).await,
    ] {
        assert!(matches!(result, Err(DriverError::TaskNotFound { .. })), "{result:?}");
    }
}

#[tokio::test]
async fn bad_commands_and_directories_are_invalid_config() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let plain = root.path().join("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let broken = root.path().join("broken.sh");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = plain.display().to_string();
    let broken = broken.display().to_string();
    let cases = [
        (serde_json::json!({}), "config.command", "missing field"),
        (serde_json::json!({"command": ""}), "config.command", "empty"),
        (
            serde_json::json!({"command": "/nonexistent/program"}),
            "config.command",
            "does not exist",
        ),
        (
            serde_json::json!({"command": "no-such-program-anywhere"}),
            "config.command",
            "not found in PATH",
        ),
        (serde_json::json!({"command": plain}), "config.command", "not executable"),
        (serde_json::json!({"command": "/tmp"}), "config.command", "is a directory"),
        (serde_json::json!({"command": broken}), "config.command", "No such file"),
        (serde_json::json!({"command": "true", "args": [1]}), "config.args[0]", "invalid type"),
        (
            serde_json::json!({"command": "true", "work_dir": "nope"}),
            "config.work_dir",
            "No such file",
        ),
        (
            serde_json::json!({"command": "true", "work_dir": plain}),
            "config.work_dir",
            "not a directory",
        ),
    ];
    for (i, (driver_config, field, reason)) in cases.into_iter().enumerate() {
        let config = config(root.path(), &format!("bad{i}"), driver_config.clone());
        match driver.start_task(config).await {
            Err(DriverError::InvalidConfig { field: f, reason: r }) => {
                assert_eq!(f, field, "{driver_config}");
                assert!(r.contains(reason), "{driver_config}: {r}");
            }
            other => panic!("{driver_config}: {other:?}"),
        }
    }
    let mut missing_dir = shell(root.path(), "nodir", "true");
    missing_dir.task_dir = root.path().join("does-not-exist");
    match driver.start_task(missing_dir).await {
        Err(DriverError::InvalidConfig { field, .. }) => assert_eq!(field, "task_dir"),
        other => panic!("{other:?}"),
    }
    // validate_config catches what it can without a task directory.
    let bad = serde_json::json!({"command": "x", "surprise": 1});
    match driver.validate_config(bad.as_object().unwrap()) {
        Err(DriverError::InvalidConfig { field, .. }) => assert_eq!(field, "config.surprise"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_missing_shim_is_a_clear_error_and_an_unhealthy_fingerprint() {
    let root = tempfile::tempdir().unwrap();
    let healthy = driver().fingerprint().await;
    assert_eq!(healthy.health, Health::Healthy, "{healthy:?}");

    let missing = root.path().join("no-shim-here");
    let driver = RawExecDriver::new(RawExecOptions {
        shim_path: Some(missing.clone()),
        ..Default::default()
    });
    let fingerprint = driver.fingerprint().await;
    assert_eq!(fingerprint.health, Health::Unhealthy);
    assert!(fingerprint.description.contains("no-shim-here"), "{fingerprint:?}");
    match driver.start_task(shell(root.path(), "t", "true")).await {
        Err(DriverError::Other { reason }) => {
            assert!(reason.contains(&missing.display().to_string()), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_new_driver_reattaches_to_a_running_task_and_learns_a_finished_ones_exit() {
    let root = tempfile::tempdir().unwrap();
    let first = driver();
    let running = first.start_task(shell(root.path(), "svc", "exec sleep 600")).await.unwrap();
    let config = shell(root.path(), "batch", "read line < go; exit 7");
    mkfifo(&config.task_dir.join("go"));
    let go = config.task_dir.join("go");
    let batch = first.start_task(config).await.unwrap();
    // The handles go through the store as JSON.
    let reload = |h: &TaskHandle| -> TaskHandle {
        serde_json::from_str(&serde_json::to_string(h).unwrap()).unwrap()
    };
    let (running, batch) = (reload(&running), reload(&batch));

    write_fifo(&go, "go\n");
    wait_gone(pid_of(&batch, "shim_pid"));

    let second = driver();
    second.recover_task(&running).await.unwrap();
    second.recover_task(&running).await.unwrap(); // Twice is harmless.
    second.recover_task(&batch).await.unwrap();
    assert_eq!(second.inspect_task(running.id()).await.unwrap().state, RunState::Running);
    assert_eq!(wait(&second, &batch).await, ExitResult::code(7));

    second.stop_task(running.id(), Duration::from_secs(5), Signal::Term).await.unwrap();
    assert_eq!(wait(&second, &running).await, ExitResult::signalled(15));
    assert!(!alive(pid_of(&running, "task_pid")));
}

#[tokio::test]
async fn a_forged_handle_never_signals_the_process_that_holds_its_pid() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let real = driver.start_task(shell(root.path(), "real", "exit 0")).await.unwrap();
    assert_eq!(wait(&driver, &real).await, ExitResult::code(0));
    // Without its run directory (and exit record) the handle names nothing that ran.
    driver.destroy_task(real.id(), false).await.unwrap();

    #[allow(clippy::disallowed_methods)] // The bystander whose pid the forged handles name.
    let mut bystander = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    let pid = bystander.id() as i32;
    let ticks = start_ticks(pid);
    let boot = real.driver_state.value()["boot_id"].clone();
    // (start ticks, boot id): the pid reused by another process, and the very process's
    // identity recorded in another boot (after a reboot every pid is someone else's).
    for (recorded_ticks, boot_id) in [(ticks + 1, boot), (ticks, "another-boot".into())] {
        let mut state = real.driver_state.value();
        state["shim_pid"] = pid.into();
        state["task_pid"] = pid.into();
        state["shim_start_ticks"] = recorded_ticks.into();
        state["task_start_ticks"] = recorded_ticks.into();
        state["boot_id"] = boot_id;
        let mut forged = real.clone();
        forged.driver_state = state.into();

        let fresh = common::driver();
        let error = fresh.recover_task(&forged).await.unwrap_err();
        assert!(error.to_string().contains("is gone"), "{error}");
        for result in [
            fresh.signal_task(forged.id(), Signal::Kill).await,
            fresh.stop_task(forged.id(), Duration::ZERO, Signal::Kill).await,
            fresh.destroy_task(forged.id(), true).await,
        ] {
            assert!(matches!(result, Err(DriverError::TaskNotFound { .. })), "{result:?}");
        }
        let state = &forged.driver_state;
        assert!(bystander.try_wait().unwrap().is_none(), "{state:?}: the bystander was signalled");
        assert!(alive(pid));
    }
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}

#[tokio::test]
async fn garbage_handles_are_errors_not_panics() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let real = driver.start_task(shell(root.path(), "t", "exit 0")).await.unwrap();
    wait(&driver, &real).await;
    let fresh = common::driver();
    let mut cases = Vec::new();
    for state in [
        serde_json::json!(null),
        serde_json::json!({"version": 99}),
        serde_json::json!({"version": 1, "shim_pid": -1}),
    ] {
        let mut handle = real.clone();
        handle.driver_state = state.into();
        cases.push(handle);
    }
    let mut other_driver = real.clone();
    other_driver.driver = "mock".into();
    cases.push(other_driver);
    let mut old = real.clone();
    old.version = 0;
    cases.push(old);
    for pid in [0, 1, -1] {
        let mut state = real.driver_state.value();
        state["shim_pid"] = pid.into();
        state["task_pid"] = pid.into();
        let mut handle = real.clone();
        handle.driver_state = state.into();
        cases.push(handle);
    }
    for handle in cases {
        match fresh.recover_task(&handle).await {
            Err(DriverError::Other { reason }) => {
                assert!(reason.contains("unusable raw_exec task handle"), "{reason}")
            }
            other => panic!("{:?}: {other:?}", handle.driver_state),
        }
    }
}

/// A field of `/proc/<pid>/smaps_rollup`, in KiB.
fn smaps_kib(pid: i32, field: &str) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    rollup
        .lines()
        .find_map(|line| line.strip_prefix(field)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {rollup}"))
}

/// The static shim, once its task runs and its output has been copied, holds a few pages it
/// wrote itself: one of data, one of the output buffer, and at most four of stack (the
/// kernel's copy of the arguments and environment, and frames a random distance below it).
/// Its whole private memory, program text included (which shims running side by side share),
/// stays small. The shim built with std held about 150 KiB it wrote and 540 KiB private in
/// all; the static one 28 to 32 KiB written before its child's stack was given back after the
/// exec and its rarely used buffers left the main path's frames.
#[tokio::test]
async fn a_running_shim_holds_a_few_pages_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let fifo = dir.path().join("ran");
    mkfifo(&fifo);
    let script = format!("echo up; echo > {}; exec sleep 600", fifo.display());
    let config = shell(dir.path(), "t", &script);
    let log = config.logs.dir.join("t.stdout.0");
    let handle = driver.start_task(config).await.unwrap();
    read_fifo(&fifo);
    let copied = Instant::now();
    while std::fs::read_to_string(&log).unwrap_or_default() != "up\n" {
        assert!(copied.elapsed() < LIMIT, "the shim never copied the output");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let shim = pid_of(&handle, "shim_pid");
    let written = smaps_kib(shim, "Anonymous:");
    let private = smaps_kib(shim, "Private_Clean:") + smaps_kib(shim, "Private_Dirty:");
    assert!(written <= 24, "the shim wrote {written} KiB");
    assert!(private <= 96, "the shim holds {private} KiB of private memory");
    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Kill).await.unwrap();
    wait(&driver, &handle).await;
}
