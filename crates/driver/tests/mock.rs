//! The mock driver does what its config scripts, on tokio's paused clock.

use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;
use wharf_driver::mock::MockDriver;
use wharf_driver::{
    Driver, DriverError, DriverRegistry, ExitResult, LogConfig, RunState, TaskConfig, TaskId,
};
use wharf_state::Signal;

fn config(task: &str, driver_config: serde_json::Value) -> TaskConfig {
    TaskConfig {
        id: TaskId::new("a1", task, 0),
        alloc_id: "a1".into(),
        job_id: "j".into(),
        group: "g".into(),
        task_name: task.into(),
        env: BTreeMap::new(),
        task_dir: "/nonexistent/a1/t".into(),
        alloc_dir: "/nonexistent/a1/alloc".into(),
        logs: LogConfig { dir: "/nonexistent".into(), max_files: 2, max_file_bytes: 1024 },
        resources: Default::default(),
        driver_config: driver_config.as_object().cloned().unwrap(),
        mounts: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_runs_for_its_time_and_exits_with_its_code() {
    let driver = MockDriver::new();
    let started = Instant::now();
    let handle = driver
        .start_task(config("t", serde_json::json!({"run_for": "5s", "exit_code": 3})))
        .await
        .unwrap();
    assert_eq!(driver.inspect_task(handle.id()).await.unwrap().state, RunState::Running);
    let exit = driver.wait_task(handle.id()).await.unwrap();
    assert_eq!(exit, ExitResult::code(3));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    // Waiting again after the exit answers at once with the same result.
    assert_eq!(driver.wait_task(handle.id()).await.unwrap(), ExitResult::code(3));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn stop_honours_kill_after_and_the_timeout() {
    let driver = MockDriver::new();
    // Exits 2s after the signal: within a 5s timeout, by the signal.
    let polite =
        driver.start_task(config("polite", serde_json::json!({"kill_after": "2s"}))).await.unwrap();
    let started = Instant::now();
    driver.stop_task(polite.id(), Duration::from_secs(5), Signal::Int).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(driver.wait_task(polite.id()).await.unwrap(), ExitResult::signalled(2));

    // Ignores the signal for 60s: killed at the 5s timeout.
    let stubborn = driver
        .start_task(config("stubborn", serde_json::json!({"kill_after": "60s"})))
        .await
        .unwrap();
    let started = Instant::now();
    driver.stop_task(stubborn.id(), Duration::from_secs(5), Signal::Term).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(driver.wait_task(stubborn.id()).await.unwrap(), ExitResult::signalled(9));
    assert_eq!(
        driver.signals_sent(),
        [
            (polite.id().clone(), Signal::Int),
            (stubborn.id().clone(), Signal::Term),
            (stubborn.id().clone(), Signal::Kill)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_stop_never_returns() {
    let driver = MockDriver::new();
    let handle =
        driver.start_task(config("t", serde_json::json!({"stop_hangs": true}))).await.unwrap();
    let stop = driver.stop_task(handle.id(), Duration::from_secs(1), Signal::Term);
    assert!(tokio::time::timeout(Duration::from_secs(3600), stop).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn start_errors_are_fatal_or_retryable_and_can_pass() {
    let driver = MockDriver::new();
    let fatal = driver
        .start_task(config("f", serde_json::json!({"start_error": "no such image"})))
        .await
        .unwrap_err();
    assert!(!fatal.is_retryable());
    assert_eq!(fatal.to_string(), "no such image");

    let flaky = serde_json::json!({"start_error": "busy", "start_error_retryable": true, "start_error_count": 2});
    for _ in 0..2 {
        assert!(driver.start_task(config("r", flaky.clone())).await.unwrap_err().is_retryable());
    }
    driver.start_task(config("r", flaky)).await.unwrap();
    assert_eq!(driver.start_count("a1", "r"), 3);

    let started = Instant::now();
    driver.start_task(config("slow", serde_json::json!({"start_block_for": "7s"}))).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn bad_config_names_the_field() {
    let driver = MockDriver::new();
    let bad = serde_json::json!({"run_for": "soon"});
    let err = driver.validate_config(bad.as_object().unwrap()).unwrap_err();
    assert!(
        matches!(&err, DriverError::InvalidConfig { reason, .. } if reason.contains("invalid duration")),
        "{err}"
    );
    let unknown = serde_json::json!({"bogus": 1});
    let err = driver.validate_config(unknown.as_object().unwrap()).unwrap_err();
    assert!(
        matches!(&err, DriverError::InvalidConfig { field, .. } if field == "config.bogus"),
        "{err}"
    );
    assert!(driver.start_task(config("t", bad)).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn recovery_reattaches_known_tasks_and_fails_for_lost_ones() {
    let driver = MockDriver::new();
    let handle = driver
        .start_task(config("t", serde_json::json!({"run_for": "10s", "exit_code": 4})))
        .await
        .unwrap();
    // The same driver after an "agent restart": the task is still there and ends as scripted.
    driver.recover_task(&handle).await.unwrap();
    assert_eq!(driver.wait_task(handle.id()).await.unwrap(), ExitResult::code(4));

    driver.forget_all();
    assert!(matches!(driver.recover_task(&handle).await, Err(DriverError::TaskNotFound { .. })));
    let broken = driver
        .start_task(config("b", serde_json::json!({"recover_error": "socket gone"})))
        .await
        .unwrap();
    driver.forget_all();
    assert_eq!(driver.recover_task(&broken).await.unwrap_err().to_string(), "socket gone");
}

#[tokio::test(start_paused = true)]
async fn signals_exec_stats_messages_and_destroy() {
    let driver = MockDriver::new();
    let mut events = driver.events();
    let handle = driver
        .start_task(config(
            "t",
            serde_json::json!({"messages": ["pulling"], "exec_stdout": "ok", "exec_exit_code": 2, "memory_bytes": 4096}),
        ))
        .await
        .unwrap();
    assert_eq!(events.recv().await.unwrap().message, "pulling");
    driver.signal_task(handle.id(), Signal::Hup).await.unwrap();
    let exec =
        driver.exec_task(handle.id(), &["true".into()], Duration::from_secs(1)).await.unwrap();
    assert_eq!((exec.stdout.as_slice(), exec.exit.exit_code), (&b"ok"[..], 2));
    assert_eq!(driver.task_stats(handle.id()).await.unwrap().memory_rss_bytes, 4096);

    assert!(
        driver.destroy_task(handle.id(), false).await.is_err(),
        "a running task is not destroyed without force"
    );
    driver.destroy_task(handle.id(), true).await.unwrap();
    assert!(matches!(
        driver.inspect_task(handle.id()).await,
        Err(DriverError::TaskNotFound { .. })
    ));

    let failing =
        driver.start_task(config("s", serde_json::json!({"signal_error": "nope"}))).await.unwrap();
    assert_eq!(
        driver.signal_task(failing.id(), Signal::Usr1).await.unwrap_err().to_string(),
        "nope"
    );
}

#[test]
fn the_registry_finds_drivers_by_name() {
    let registry = DriverRegistry::new()
        .with(std::sync::Arc::new(MockDriver::new()))
        .with(std::sync::Arc::new(MockDriver::named("other")));
    assert_eq!(registry.names().collect::<Vec<_>>(), ["mock", "other"]);
    assert_eq!(registry.get("other").unwrap().name(), "other");
    assert!(registry.get("docker").is_none());
}

#[test]
fn handles_round_trip_through_json_with_their_version() {
    let handle = wharf_driver::TaskHandle {
        version: wharf_driver::TASK_HANDLE_VERSION,
        driver: "mock".into(),
        config: config("t", serde_json::json!({"run_for": "1s"})),
        driver_state: serde_json::json!({"pid": 42}).into(),
    };
    let json = serde_json::to_vec(&handle).unwrap();
    assert_eq!(serde_json::from_slice::<wharf_driver::TaskHandle>(&json).unwrap(), handle);
}
