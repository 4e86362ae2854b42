//! raw_exec tasks in cgroups of their own, on this host's real cgroups (v1 or v2, whichever it
//! runs; `cargo xtask cgroup2` runs them on a v2 kernel too): limits, OOM, a fork bomb, a CPU
//! quota measured from the kernel's accounting, kills nothing escapes, adoption after a
//! restart, removal after destroy. Every test works under a cgroup parent of its own, which a
//! guard kills and removes whatever happens; every wait is bounded.
//!
//! Nomad's counterparts: the executor's `TestExecutor_IsolationAndConstraints` and
//! `TestExecutor_CgroupPaths` (limits applied, the task in its cgroup, the cgroup gone after
//! shutdown), its OOM reporting (`ExitResult.OOMKilled`), and `TestExecutor_Start_Kill` /
//! `TestExecutor_cleanupChildProcesses` for kills that reach every process of the task.

mod common;

use common::*;
use std::time::Duration;
use tokio::time::timeout;
use wharf_driver::{Driver, DriverError, ExitResult, TaskConfig, TaskHandle, UsageSource};
use wharf_exec::RawExecDriver;
use wharf_isolate::cgroup::Version;
use wharf_state::Signal;
use wharf_state::spec::Resources;

async fn wait(driver: &RawExecDriver, handle: &TaskHandle) -> ExitResult {
    timeout(LIMIT, driver.wait_task(handle.id())).await.expect("the task never exited").unwrap()
}

fn pid_of(handle: &TaskHandle) -> i32 {
    handle.driver_state.value()["task_pid"].as_i64().unwrap() as i32
}

fn with_resources(mut config: TaskConfig, cpu: u32, memory: u32) -> TaskConfig {
    config.resources = Resources { cpu, memory, memory_max: None, cores: 0 };
    config
}

fn hard_limited(mut config: TaskConfig) -> TaskConfig {
    config.driver_config.insert("cpu_hard_limit".into(), true.into());
    config
}

/// The directory of the task's cgroup that holds `controller`'s files: in that controller's
/// hierarchy on v1, the task's one directory on v2 (below `share`: these tasks reserve no
/// cores).
fn cgroup_dir(
    scratch: &CgroupScratch,
    handle: &TaskHandle,
    controller: &str,
) -> std::path::PathBuf {
    let name = handle.driver_state.value()["cgroup"]["name"].as_str().unwrap().to_owned();
    let parents = scratch.cgroups().parents();
    match scratch.cgroups().version() {
        Version::V1 => parents
            .into_iter()
            .find(|p| p.components().any(|c| c.as_os_str() == controller))
            .unwrap()
            .join(name),
        Version::V2 => parents[0].join("share").join(name),
    }
}

#[tokio::test]
async fn a_task_runs_in_its_own_cgroup_with_its_limits_and_leaves_none_behind() {
    let scratch = CgroupScratch::new(Some(128));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    let fifo = root.path().join("up");
    mkfifo(&fifo);
    let script = format!("sleep 60 & echo $! > {}; wait", fifo.display());
    let config = with_resources(shell(root.path(), "limited", &script), 700, 48);
    let handle = driver.start_task(config).await.unwrap();
    let child: i32 = read_fifo(&fifo).trim().parse().unwrap();

    assert_eq!(handle.driver_state.value()["cgroup"]["name"], "a1.limited.00000000");
    let memory = cgroup_dir(&scratch, &handle, "memory");
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).unwrap().trim().to_owned();
    let cpu = cgroup_dir(&scratch, &handle, "cpu");
    match scratch.cgroups().version() {
        Version::V1 => {
            assert_eq!(read(memory.join("memory.limit_in_bytes")), (48u64 << 20).to_string());
            assert_eq!(read(cpu.join("cpu.shares")), "700");
        }
        Version::V2 => {
            assert_eq!(read(memory.join("memory.max")), (48u64 << 20).to_string());
            // 700 shares on runc's scale.
            assert_eq!(read(cpu.join("cpu.weight")), "27");
        }
    }
    assert_eq!(read(cgroup_dir(&scratch, &handle, "pids").join("pids.max")), "128");
    for pid in [pid_of(&handle), child] {
        for line in cgroup_lines(pid).unwrap() {
            assert!(line.ends_with("/a1.limited.00000000"), "{pid}: {line}");
        }
    }
    // The shim is not in the task's cgroup: its own memory and kill are not the task's.
    let shim = handle.driver_state.value()["shim_pid"].as_i64().unwrap() as i32;
    assert!(cgroup_lines(shim).unwrap().iter().all(|l| !l.contains("a1.limited")));
    let info = driver.inspect_task(handle.id()).await.unwrap();
    assert_eq!(info.attributes["cgroup"], "a1.limited.00000000");

    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Term).await.unwrap();
    driver.destroy_task(handle.id(), false).await.unwrap();
    assert!(!memory.exists(), "the cgroup is removed after destroy");
    assert!(!alive(child));
}

#[tokio::test]
async fn a_task_past_its_memory_limit_is_reported_oom_killed() {
    let scratch = CgroupScratch::new(Some(64));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    // `tail` keeps its last line, and /dev/zero has none: it grows until the kernel kills it.
    let config = with_resources(shell(root.path(), "hungry", "tail /dev/zero"), 100, 16);
    let handle = driver.start_task(config).await.unwrap();
    let exit = wait(&driver, &handle).await;
    assert!(exit.oom_killed, "{exit:?}");
    assert!(!exit.successful());
    driver.destroy_task(handle.id(), false).await.unwrap();

    // A task that exits on its own is not called OOM-killed.
    let handle = driver
        .start_task(with_resources(shell(root.path(), "fine", "exit 3"), 100, 16))
        .await
        .unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(3));
    driver.destroy_task(handle.id(), false).await.unwrap();
}

#[tokio::test]
async fn a_fork_bomb_is_held_by_the_pids_limit_and_the_node_stays_well() {
    const PIDS: u64 = 24;
    let scratch = CgroupScratch::new(Some(PIDS));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    let fifo = root.path().join("armed");
    mkfifo(&fifo);
    // A quota keeps the bomb's spinning from taking the shared machine's CPU. The main process
    // outlives it: when a task's main process exits, the shim kills what it left.
    let bomb = format!("echo go > {}; b() {{ b | b & }}; b; sleep 600", fifo.display());
    let config = hard_limited(with_resources(shell(root.path(), "bomb", &bomb), 200, 64));
    let handle = driver.start_task(config).await.unwrap();
    assert_eq!(read_fifo(&fifo).trim(), "go");
    let pids = cgroup_dir(&scratch, &handle, "pids");
    // It reaches its limit and is refused further forks.
    let mut refused = 0;
    for _ in 0..2_000 {
        refused = std::fs::read_to_string(pids.join("pids.events"))
            .ok()
            .and_then(|t| t.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()))
            .unwrap_or(0);
        if refused > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused > 0, "the bomb never hit its pids limit");
    let current: u64 =
        std::fs::read_to_string(pids.join("pids.current")).unwrap().trim().parse().unwrap();
    assert!(current <= PIDS, "{current} processes");

    // Another task starts, forks and finishes as usual meanwhile.
    let other = driver.start_task(shell(root.path(), "other", "echo $(echo fine)")).await.unwrap();
    assert_eq!(wait(&driver, &other).await, ExitResult::code(0));
    let out = std::fs::read_to_string(other.config.logs.dir.join("other.stdout.0")).unwrap();
    assert_eq!(out, "fine\n");
    driver.destroy_task(other.id(), false).await.unwrap();

    // The bomb goes whole, at once.
    timeout(LIMIT, driver.stop_task(handle.id(), Duration::ZERO, Signal::Kill))
        .await
        .unwrap()
        .unwrap();
    driver.destroy_task(handle.id(), false).await.unwrap();
    assert!(!pids.exists());
}

#[tokio::test]
async fn a_busy_loop_under_a_hard_limit_uses_no_more_than_its_share() {
    let scratch = CgroupScratch::new(Some(64));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    // 400 MHz of 2000 MHz cores: a fifth of a core, 20 ms of each 100 ms.
    let config =
        hard_limited(with_resources(shell(root.path(), "busy", "while :; do :; done"), 400, 32));
    let handle = driver.start_task(config).await.unwrap();
    let used = || async {
        let usage = driver.task_stats(handle.id()).await.unwrap();
        assert_eq!(usage.source, UsageSource::Cgroup);
        usage
    };
    let before = used().await;
    #[allow(clippy::disallowed_methods)] // The measurement's own wall clock.
    let started = std::time::Instant::now();
    // The window of the measurement, not an ordering: a couple of seconds of the loop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = used().await;
    let wall = started.elapsed();
    let share = (after.cpu_time - before.cpu_time).as_secs_f64() / wall.as_secs_f64();
    assert!(share <= 0.2 * 1.1, "the loop used {share:.3} of a core, its quota is 0.2");
    assert!(share > 0.02, "the loop barely ran ({share:.3} of a core)");
    assert!(after.cpu_throttled_periods > before.cpu_throttled_periods, "{after:?}");
    driver.stop_task(handle.id(), Duration::from_secs(1), Signal::Term).await.unwrap();
    driver.destroy_task(handle.id(), false).await.unwrap();
}

#[tokio::test]
async fn a_process_that_escaped_the_tasks_group_dies_with_its_cgroup() {
    let scratch = CgroupScratch::new(Some(64));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    let fifo = root.path().join("escaped");
    mkfifo(&fifo);
    // The main process ignores SIGTERM; its grandchild leaves the session and the group.
    let script = format!(
        "trap '' TERM; setsid sh -c 'sleep 600 & echo $! > {}' ; sleep 600",
        fifo.display()
    );
    let handle = driver.start_task(shell(root.path(), "escape", &script)).await.unwrap();
    let escaped: i32 = read_fifo(&fifo).trim().parse().unwrap();
    assert!(cgroup_lines(escaped).unwrap().iter().all(|l| l.ends_with("/a1.escape.00000000")));

    // The shim dies first, as if it crashed: only the cgroup still knows the escaped process.
    let shim = handle.driver_state.value()["shim_pid"].as_i64().unwrap() as i32;
    // SAFETY: kill takes plain integers; the shim is this test's task's, still running.
    assert_eq!(unsafe { libc::kill(shim, libc::SIGKILL) }, 0);
    let exit = wait(&driver, &handle).await;
    assert!(exit.error.is_some(), "{exit:?}");
    assert!(alive(escaped), "nothing has killed the escaped process yet");

    driver.destroy_task(handle.id(), true).await.unwrap();
    wait_gone(escaped);
    assert!(!cgroup_dir(&scratch, &handle, "memory").exists());
}

#[tokio::test]
async fn a_stop_kills_the_whole_cgroup_at_the_timeout() {
    let scratch = CgroupScratch::new(Some(64));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    let fifo = root.path().join("ready");
    mkfifo(&fifo);
    let script =
        format!("trap '' TERM; setsid sleep 600 & echo $! > {}; sleep 600", fifo.display());
    let handle = driver.start_task(shell(root.path(), "stubborn", &script)).await.unwrap();
    let escaped: i32 = read_fifo(&fifo).trim().parse().unwrap();
    timeout(LIMIT, driver.stop_task(handle.id(), Duration::from_millis(200), Signal::Term))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::signalled(libc::SIGKILL));
    wait_gone(escaped);
    driver.destroy_task(handle.id(), false).await.unwrap();
}

#[tokio::test]
async fn a_new_driver_adopts_a_running_tasks_cgroup() {
    let mut scratch = CgroupScratch::new(Some(64));
    let root = tempfile::tempdir().unwrap();
    let (handle, stale) = {
        let driver = scratch.driver();
        let handle = driver.start_task(shell(root.path(), "long", "sleep 600")).await.unwrap();
        // A run that ended, whose agent died before destroying it.
        let stale = driver.start_task(shell(root.path(), "short", "exit 0")).await.unwrap();
        wait(&driver, &stale).await;
        (handle, stale)
    };
    let stale_dir = cgroup_dir(&scratch, &stale, "memory");
    assert!(stale_dir.exists());
    scratch.restart();
    let driver = scratch.driver();
    driver.recover_task(&handle).await.unwrap();
    assert_eq!(
        wharf_exec::remove_orphan_cgroups(scratch.cgroups()),
        vec!["a1.short.00000000".to_owned()]
    );
    assert!(!stale_dir.exists());
    let usage = driver.task_stats(handle.id()).await.unwrap();
    // The shell and its sleep.
    assert_eq!(usage.source, UsageSource::Cgroup);
    assert!(usage.processes >= 1, "{usage:?}");

    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Term).await.unwrap();
    driver.destroy_task(handle.id(), false).await.unwrap();
    assert!(!cgroup_dir(&scratch, &handle, "memory").exists());
}

#[tokio::test]
async fn without_cgroups_tasks_run_plain_and_a_hard_limit_is_refused() {
    let driver =
        driver().with_cgroups(wharf_exec::TaskCgroups::Off { reason: "turned off".into() });
    let root = tempfile::tempdir().unwrap();
    let handle = driver.start_task(shell(root.path(), "plain", "exit 0")).await.unwrap();
    assert!(handle.driver_state.value().get("cgroup").is_none());
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    match driver.start_task(hard_limited(shell(root.path(), "capped", "exit 0"))).await {
        Err(DriverError::InvalidConfig { field, reason }) => {
            assert_eq!(field, "config.cpu_hard_limit");
            assert!(reason.contains("turned off"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// A cgroup that holds the main process alone is killed through that process's pidfd (no
/// freeze); the task ends by SIGKILL, and its cgroup is empty and removed after destroy.
#[tokio::test]
async fn a_lone_main_process_is_killed_without_a_freeze() {
    let scratch = CgroupScratch::new(Some(64));
    let driver = scratch.driver();
    let root = tempfile::tempdir().unwrap();
    let handle = driver
        .start_task(config(
            root.path(),
            "lone",
            serde_json::json!({"command": "sleep", "args": ["600"]}),
        ))
        .await
        .unwrap();
    let procs = cgroup_dir(&scratch, &handle, "freezer").join("cgroup.procs");
    assert_eq!(std::fs::read_to_string(&procs).unwrap().trim(), pid_of(&handle).to_string());
    timeout(LIMIT, driver.stop_task(handle.id(), Duration::ZERO, Signal::Kill))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(wait(&driver, &handle).await, ExitResult::signalled(libc::SIGKILL));
    let (state, thawed) = match scratch.cgroups().version() {
        Version::V1 => ("freezer.state", "THAWED"),
        Version::V2 => ("cgroup.freeze", "0"),
    };
    let freezer = cgroup_dir(&scratch, &handle, "freezer").join(state);
    assert_eq!(std::fs::read_to_string(freezer).unwrap().trim(), thawed);
    driver.destroy_task(handle.id(), false).await.unwrap();
    assert!(!procs.exists());
}
