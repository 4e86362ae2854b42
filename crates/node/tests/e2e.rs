//! End-to-end tests that drive the real `wharf` binary: an agent process with its own data
//! dir and port, talked to over HTTP and through the CLI, killed and restarted.

// Real processes on the real clock: these tests start programs and measure bounds in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::{Method, StatusCode};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use wharf_node::api::{AllocDetail, AllocSummary};
use wharf_node::client::{Client, ClientError};
use wharf_state::{ClientStatus, TaskEventKind, TaskStatus};
use wharf_tests::proc_stat::ProcStat;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_run_read_logs_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let spec = job(
        "web",
        "service",
        &sh_task(
            "web",
            "trap 'echo bye; exit 0' INT; echo started; while true; do sleep 0.1; done",
        ),
    );
    let id = submit(&client, &spec).await.unwrap();
    until(&client, &id, "running", |d| d.state.client_status == ClientStatus::Running).await;

    let list: Vec<AllocSummary> = client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].tasks["web"], TaskStatus::Running);

    let log_file = agent.data_dir.join(format!("allocs/{id}/web/logs/web.stdout.0"));
    eventually("the task printed", || std::fs::metadata(&log_file).is_ok_and(|m| m.len() > 0));
    let logs =
        client.call(Method::GET, &format!("/v1/allocations/{id}/logs/web"), None).await.unwrap();
    assert_eq!(&logs[..], b"started\n");

    // The CLI shows the same, and stops it.
    let status = agent.cli(&["alloc", "status", &id[..8]]);
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains("web"), "{status:?}");
    let stop = agent.cli(&["alloc", "stop", &id[..8]]);
    assert!(stop.status.success(), "{stop:?}");
    let detail = until(&client, &id, "stopped", |d| d.done).await;
    assert_eq!(detail.state.client_status, ClientStatus::Complete);
    let logs = agent.cli(&["alloc", "logs", &id, "web"]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "started\nbye\n");
    // Read where asked: the driver reads the task's files; a follow of a dead task ends after
    // what is there.
    for (query, want) in [
        ("offset=8", "bye\n"),
        ("tail=4", "bye\n"),
        ("follow=true&tail=4", "bye\n"),
        ("follow=true&offset=8", "bye\n"),
        ("follow=true&offset=0", "started\nbye\n"),
        ("follow=true", ""),
    ] {
        let path = format!("/v1/allocations/{id}/logs/web?{query}");
        let logs = client.call(Method::GET, &path, None).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&logs), want, "{query}");
    }

    let metrics = client.call(Method::GET, "/v1/metrics", None).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.contains("wharf_task_starts_total 1\n"), "{metrics}");
    assert!(metrics.contains("wharf_allocs{status=\"complete\"} 1\n"), "{metrics}");
    if let Err(problems) = wharf_tests::promtool::check_metrics(&metrics) {
        panic!("the agent's metrics fail Prometheus' linter: {problems}\nin:\n{metrics}");
    }
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_reattaches_and_learns_how_tasks_ended() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let forever = submit(
        &client,
        &job(
            "forever",
            "service",
            &sh_task("t", "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 1000"),
        ),
    )
    .await
    .unwrap();
    let brief_task = format!(
        "{}restart = {{ attempts = 0 }}\n",
        sh_task(
            "t",
            "echo $$ > \"$WHARF_TASK_DIR/pid\"; while [ ! -e \"$WHARF_TASK_DIR/go\" ]; do sleep 0.05; done; exit 7"
        )
    );
    let brief = submit(&client, &job("brief", "batch", &brief_task)).await.unwrap();
    for id in [&forever, &brief] {
        until(&client, id, "running", |d| d.state.client_status == ClientStatus::Running).await;
    }
    let allocs_dir = agent.data_dir.join("allocs");
    let pid_file = |id: &str| allocs_dir.join(format!("{id}/t/pid"));
    let forever_pid = read_pid(&pid_file(&forever));
    let brief_pid = read_pid(&pid_file(&brief));
    let brief_go = allocs_dir.join(format!("{brief}/t/go"));

    let (data_dir, config) = agent.kill9();
    assert!(alive(forever_pid) && alive(brief_pid), "tasks outlive the agent");
    // While the agent is away, the brief task ends with exit code 7.
    std::fs::write(&brief_go, "").unwrap();
    eventually("the brief task ended", || !alive(brief_pid));

    let agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    let detail = until(&client, &forever, "reattached", |d| {
        d.state.task_states["t"].events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    assert_eq!(detail.state.client_status, ClientStatus::Running);
    assert_eq!(read_pid(&pid_file(&forever)), forever_pid, "the same process, not a second copy");
    assert!(alive(forever_pid));
    let started = detail.state.task_states["t"]
        .events
        .iter()
        .filter(|e| e.kind == TaskEventKind::Started)
        .count();
    assert_eq!(started, 1, "started once, ever");

    let brief_detail = until(&client, &brief, "finished", |d| d.done).await;
    assert_eq!(brief_detail.state.client_status, ClientStatus::Failed);
    assert!(
        brief_detail.state.task_states["t"]
            .events
            .iter()
            .any(|e| matches!(e.kind, TaskEventKind::Terminated { exit_code: 7, .. })),
        "{:?}",
        brief_detail.state.task_states["t"].events
    );
    client.call(Method::POST, &format!("/v1/allocations/{forever}/stop"), None).await.unwrap();
    until(&client, &forever, "stopped", |d| d.done).await;
    assert!(!alive(forever_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_lists_live_allocations_stale_ones_and_a_broken_node() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let live = submit(
        &client,
        &job(
            "live",
            "service",
            &sh_task("t", "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 1000"),
        ),
    )
    .await
    .unwrap();
    let gone = submit(
        &client,
        &job(
            "gone",
            "service",
            &sh_task("t", "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 1000"),
        ),
    )
    .await
    .unwrap();
    for id in [&live, &gone] {
        until(&client, id, "running", |d| d.state.client_status == ClientStatus::Running).await;
    }
    let probe = agent.cli(&["alloc", "list", "--probe"]);
    let mut lines: Vec<String> =
        String::from_utf8_lossy(&probe.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    let mut want = vec![live.clone(), gone.clone()];
    want.sort();
    assert_eq!(lines, want, "{probe:?}");
    // Probes that overlap (a prober that restarted and its successor) answer alike: none
    // reports the healthy node broken.
    let answers: Vec<String> = futures_util::future::join_all(
        (0..32).map(|_| client.call(Method::GET, "/v1/probe", None)),
    )
    .await
    .into_iter()
    .map(|answer| String::from_utf8_lossy(&answer.unwrap()).into_owned())
    .collect();
    assert!(answers.iter().all(|a| !a.contains("broken")), "{answers:?}");

    // With the agent gone, the probe reads the store: a task that died meanwhile is stale.
    let allocs_dir = agent.data_dir.join("allocs");
    let pid = |id: &str| {
        let file = allocs_dir.join(format!("{id}/t/pid"));
        read_pid(&file)
    };
    let (live_pid, gone_pid) = (pid(&live), pid(&gone));
    let (data_dir, config) = agent.kill9();
    // The task's parent is its shim, which records the exit once the task is gone: until it
    // has exited too, the task's end is not known and the probe rightly lists it as running.
    let shim = ProcStat::of(gone_pid).expect("the task's stat").parent;
    let killed = Command::new("kill").args(["-KILL", &gone_pid.to_string()]).status().unwrap();
    assert!(killed.success());
    eventually("the task and its shim are gone", || !alive(gone_pid) && !alive(shim));
    let offline = Command::new(WHARF)
        .args(["--address", "127.0.0.1:9", "alloc", "list", "--probe", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(offline.status.success(), "{offline:?}");
    let mut lines: Vec<String> =
        String::from_utf8_lossy(&offline.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    let mut want = vec![live.clone(), format!("{gone} stale")];
    want.sort();
    assert_eq!(lines, want, "{offline:?}");

    // Back up: the agent reconciles; then stop what still runs.
    let agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    for id in [&live, &gone] {
        client.call(Method::POST, &format!("/v1/allocations/{id}/stop"), None).await.unwrap();
        until(&client, id, "stopped", |d| d.done).await;
    }
    assert!(!alive(live_pid));
    drop(agent);

    // A node with no healthy driver cannot take work.
    let dir = tempfile::tempdir().unwrap();
    let broken = AgentProcess::start(
        dir.path(),
        "[drivers.raw_exec]\nenabled = false\n[drivers.exec]\nenabled = false\n\
         [drivers.container]\nenabled = false\n",
    );
    let probe = broken.cli(&["alloc", "list", "--probe"]);
    assert_eq!(String::from_utf8_lossy(&probe.stdout), "broken\n", "{probe:?}");
    assert!(probe.status.success());
}

/// wharf-prober's default runner commands are wharf's own: a worker configured with them
/// (only the program's path set) starts work on a real agent, sees it in its run probe, asks
/// how it is doing, stops it and learns how it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probers_default_runner_commands_drive_a_real_agent() {
    use std::sync::Arc;
    use wharf_prober::*;
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let executor = LocalExecutor::new("node")
        .with_env("WHARF_ADDR", &agent.address)
        .with_env("WHARF_TOKEN", TOKEN);
    let config = WorkerConfig {
        boot_probe_command: "true".into(),
        runner: RunnerConfig { command: WHARF.into(), ..RunnerConfig::default() },
        ..WorkerConfig::default()
    };
    let instance = Instance {
        id: "node".into(),
        address: None,
        remote_user: "root".into(),
        tags: Tags::new(),
        host_key: None,
        runner_args: String::new(),
    };
    let worker = Worker::new(
        WorkerSpec {
            instance,
            instance_type: "local".into(),
            state: State::Booting,
            idle_behavior: IdleBehavior::Run,
        },
        Arc::new(executor),
        Arc::new(config.prepare().unwrap()),
        Arc::new(SystemClock::new()),
        Arc::new(Brake::default()),
    );
    assert_eq!(worker.probe_and_update().await, ProbeOutcome::Passed);
    assert_eq!(worker.state(), State::Idle);

    let spec = job("runner-job", "service", &sh_task("t", "exec sleep 1000"));
    worker.start_runner("runner-job", spec.as_bytes()).await.unwrap();
    let client = agent.client();
    until(&client, "runner-job", "running", |d| d.state.client_status == ClientStatus::Running)
        .await;
    assert_eq!(worker.probe_and_update().await, ProbeOutcome::Passed);
    assert_eq!(worker.view().running, ["runner-job"]);
    let outcome = worker.runner_outcome("runner-job").await.unwrap().map(|o| o.to_string());
    assert_eq!(outcome.as_deref(), Some("running"));

    assert!(worker.kill_runner("runner-job", "test"));
    let deadline = std::time::Instant::now() + LIMIT;
    while !worker.view().running.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the runner was never stopped");
        worker.kill_due().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = worker.runner_outcome("runner-job").await.unwrap().unwrap().to_string();
    assert!(outcome.starts_with("complete") || outcome.starts_with("failed"), "{outcome}");
    let outcome = worker.runner_outcome("never-there").await.unwrap().map(|o| o.to_string());
    assert_eq!(outcome.as_deref(), Some("unknown"));
    assert_eq!(worker.probe_and_update().await, ProbeOutcome::Passed);
    assert_eq!(worker.state(), State::Idle);
}

/// An agent that accepts connections but never answers (stopped with SIGSTOP) does not hang
/// the run probe: past its own deadline it answers from the store, which the frozen agent
/// holds, so the node reports itself broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_agent_does_not_hang_the_run_probe() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), "");
    let pid = agent.child.id().to_string();
    let signal = |name: &str| {
        let sent = Command::new("kill").args([name, &pid]).status().unwrap();
        assert!(sent.success(), "kill {name} {pid}");
    };
    signal("-STOP");
    let config = agent.config.display().to_string();
    // Bounded: a probe that hangs fails the test (and the stopped agent is killed with it).
    let probe = agent.cli_within(&["alloc", "list", "--probe", "--config", &config]);
    signal("-CONT");
    assert!(probe.status.success(), "{probe:?}");
    assert_eq!(String::from_utf8_lossy(&probe.stdout), "broken\n", "{probe:?}");
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "max_body_bytes = 4096\n");
    let client = agent.client();
    let valid = job("ok", "batch", &sh_task("t", "true"));
    let cases: Vec<(&str, Vec<u8>, StatusCode, &str)> = vec![
        (
            "malformed",
            b"[job\nid = ".to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "TOML parse error",
        ),
        (
            "unknown field",
            valid.replace("type = ", "colour = \"red\"\ntype = ").into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown field `colour`",
        ),
        (
            "traversal",
            valid.replace("name = \"t\"", "name = \"../etc\"").into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "group.task[0].name",
        ),
        (
            "missing command",
            job("x", "batch", "[[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\nconfig = {}\n")
                .into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "command",
        ),
        (
            "unknown driver",
            valid.replace("raw_exec", "docker").into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown driver \"docker\"",
        ),
        (
            "oversized",
            format!("{valid}#{}", "x".repeat(8192)).into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than the limit of 4096 bytes",
        ),
        ("not utf-8", vec![0xff, 0xfe, 0x00], StatusCode::BAD_REQUEST, "not UTF-8"),
    ];
    for (case, body, status, phrase) in cases {
        match client.call(Method::POST, "/v1/allocations", Some(("application/toml", body))).await {
            Err(ClientError::Api { status: got, message }) => {
                assert_eq!(got, status, "{case}: {message}");
                assert!(message.contains(phrase), "{case}: {message:?} lacks {phrase:?}");
            }
            other => panic!("{case}: {other:?}"),
        }
    }
    for (token, status) in
        [(None, StatusCode::UNAUTHORIZED), (Some("wrong-token-wrong-token"), StatusCode::FORBIDDEN)]
    {
        let client = Client::new(&agent.address, token.map(str::to_owned));
        match client.call(Method::GET, "/v1/allocations", None).await {
            Err(ClientError::Api { status: got, message }) => assert_eq!(got, status, "{message}"),
            other => panic!("{token:?}: {other:?}"),
        }
        assert!(
            client.call(Method::GET, "/v1/health", None).await.is_ok(),
            "health needs no token"
        );
    }
    let not_found = client.call(Method::GET, "/v1/allocations/nope", None).await;
    assert!(matches!(not_found, Err(ClientError::Api { status: StatusCode::NOT_FOUND, .. })));
    let bad_signal = client
        .call(
            Method::POST,
            "/v1/allocations/nope/signal",
            Some(("application/json", b"{}".to_vec())),
        )
        .await;
    assert!(matches!(bad_signal, Err(ClientError::Api { status, .. }) if status.is_client_error()));

    // Nothing was persisted, and the agent still works.
    let list: Vec<AllocSummary> = client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    assert!(list.is_empty());
    let id = submit(&client, &valid).await.unwrap();
    until(&client, &id, "finished", |d| d.done).await;
    let (data_dir, _) = agent.kill9();
    let allocs: Vec<_> = std::fs::read_dir(data_dir.join("allocs")).unwrap().collect();
    assert_eq!(allocs.len(), 1, "only the valid allocation has a directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_the_oldest_finished_allocations_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "[gc]\nmax_allocs = 2\ninterval = \"100ms\"\n");
    let client = agent.client();
    let running =
        submit(&client, &job("svc", "service", &sh_task("t", "exec sleep 1000"))).await.unwrap();
    let mut finished = Vec::new();
    for i in 0..4 {
        let id =
            submit(&client, &job(&format!("b{i}"), "batch", &sh_task("t", "true"))).await.unwrap();
        until(&client, &id, "finished", |d| d.done).await;
        finished.push(id);
    }
    let wait = async {
        loop {
            let list: Vec<AllocSummary> =
                client.json(Method::GET, "/v1/allocations", None).await.unwrap();
            if list.len() == 3 {
                return list;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let list = tokio::time::timeout(LIMIT, wait).await.expect("gc ran");
    let ids: Vec<&str> = list.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(
        ids,
        [running.as_str(), finished[2].as_str(), finished[3].as_str()],
        "the two oldest finished are gone"
    );
    for gone in &finished[..2] {
        assert!(!agent.data_dir.join("allocs").join(gone).exists(), "its directory is gone");
    }
    for kept in [&running, &finished[2], &finished[3]] {
        assert!(agent.data_dir.join("allocs").join(kept).exists());
    }
    let detail: AllocDetail =
        client.json(Method::GET, &format!("/v1/allocations/{running}"), None).await.unwrap();
    assert_eq!(
        detail.state.client_status,
        ClientStatus::Running,
        "running allocations are never collected"
    );
    client.call(Method::POST, &format!("/v1/allocations/{running}/stop"), None).await.unwrap();
    until(&client, &running, "stopped", |d| d.done).await;
}

#[test]
fn run_works_with_no_agent_and_validate_checks_files() {
    shim_beside_wharf();
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let wharf = |args: &[&str], file: &str| {
        Command::new(WHARF)
            .args(args)
            .arg(examples.join(file))
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let run = wharf(&["--address", "127.0.0.1:9", "run"], "hello.toml");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(stdout.contains("==> allocation complete"), "{stdout}");
    for line in [
        "prepare      Terminated",
        "main         Started",
        "heartbeat    Leader Task Dead",
        "cleanup      Terminated",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    let failing = wharf(&["--address", "127.0.0.1:9", "run"], "failing.toml");
    assert_eq!(failing.status.code(), Some(1), "{failing:?}");
    let output = String::from_utf8_lossy(&failing.stdout);
    assert_eq!(output.matches("flaky        Restarting").count(), 2, "{output}");
    assert_eq!(output.matches("flaky        Not Restarting").count(), 1, "{output}");

    let ok = wharf(&["validate"], "service.toml");
    assert!(ok.status.success(), "{ok:?}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[job]\nid = \"x\"\ntype = \"batch\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"a b\"\ndriver = \"raw_exec\"\n").unwrap();
    let invalid = wharf(&["validate"], bad.to_str().unwrap());
    assert_eq!(invalid.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&invalid.stderr).contains("group.task[0].name"), "{invalid:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_names_allocations_finds_agents_by_data_dir_and_wipes_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let data_dir = agent.data_dir.clone();
    let forever = job(
        "forever",
        "service",
        &sh_task("t", "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 1000"),
    );

    // No address given: the one the agent announced in its data directory is used.
    let outcome = cli_in(&data_dir, &["alloc", "outcome", "fleet-1"], "");
    assert_eq!(String::from_utf8_lossy(&outcome.stdout), "unknown\n", "{outcome:?}");
    let run = cli_in(&data_dir, &["run", "--detach", "-", "--id", "fleet-1"], &forever);
    assert!(run.status.success(), "{run:?}");
    assert_eq!(String::from_utf8_lossy(&run.stdout), "fleet-1\n");
    // The same job under the same id again: accepted, nothing new started.
    let again = cli_in(&data_dir, &["run", "--detach", "-", "--id", "fleet-1"], &forever);
    assert!(again.status.success(), "{again:?}");
    let other = job("other", "batch", &sh_task("t", "true"));
    let taken = cli_in(&data_dir, &["run", "--detach", "-", "--id", "fleet-1"], &other);
    assert_eq!(taken.status.code(), Some(2), "{taken:?}");
    assert!(String::from_utf8_lossy(&taken.stderr).contains("already exists"), "{taken:?}");
    let bad = cli_in(&data_dir, &["run", "--detach", "-", "--id", "../x"], &other);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let allocs: Vec<AllocSummary> =
        client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    assert_eq!(allocs.len(), 1);
    until(&client, "fleet-1", "running", |d| d.state.client_status == ClientStatus::Running).await;
    let outcome = cli_in(&data_dir, &["alloc", "outcome", "fleet-1"], "");
    assert_eq!(String::from_utf8_lossy(&outcome.stdout), "running\n", "{outcome:?}");

    let done = cli_in(&data_dir, &["run", "--detach", "-", "--id", "fleet-2"], &other);
    assert!(done.status.success(), "{done:?}");
    until(&client, "fleet-2", "complete", |d| d.done).await;
    let outcome = cli_in(&data_dir, &["alloc", "outcome", "fleet-2"], "");
    assert!(String::from_utf8_lossy(&outcome.stdout).starts_with("complete "), "{outcome:?}");

    // Wipe: the agent and its task die, the directory goes.
    let pid_file = data_dir.join("allocs/fleet-1/t/pid");
    let task_pid = read_pid(&pid_file);
    let agent_pid = agent.child.id() as i32;
    let wipe = cli_in(&data_dir, &["wipe"], "");
    assert!(wipe.status.success(), "{wipe:?}");
    assert!(
        String::from_utf8_lossy(&wipe.stdout).contains("agent killed, tasks destroyed: 1"),
        "{wipe:?}"
    );
    eventually("the agent is gone", || !alive(agent_pid));
    assert!(!alive(task_pid), "the task outlived the wipe");
    assert!(!data_dir.exists());
    // Nothing there any more: the probe has nothing to say, and says so without failing.
    let probe = cli_in(&data_dir, &["alloc", "list", "--probe"], "");
    assert!(probe.status.success(), "{probe:?}");
    assert_eq!(String::from_utf8_lossy(&probe.stdout), "");
}

/// A machine destroyed right after it was made: its agent has not announced itself in its
/// data directory yet (here it is held just before it becomes the agent, as `setsid` is in the
/// fleet's loopback instances), so the agent file does not name it. The wipe finds it by its
/// command line and kills it, and leaves the agent of another directory alone.
#[test]
fn a_wipe_kills_an_agent_that_has_not_announced_itself_yet() {
    /// A process killed and reaped when dropped, whatever the test did.
    struct Held(std::process::Child);
    impl Drop for Held {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let about_to_start = |data_dir: &Path| {
        std::fs::create_dir_all(data_dir).unwrap();
        let child = Command::new("sh")
            .args(["-c", "kill -STOP $$; exec \"$@\"", "sh", WHARF, "--data-dir"])
            .arg(data_dir)
            .args(["agent", "--address", "127.0.0.1:0"])
            .spawn()
            .unwrap();
        Held(child)
    };
    let data_dir = dir.path().join("data");
    let starting = about_to_start(&data_dir);
    let other = about_to_start(&dir.path().join("other"));
    assert!(!data_dir.join("agent.json").exists());

    let wipe = cli_in(&data_dir, &["wipe"], "");
    assert!(wipe.status.success(), "{wipe:?}");
    assert!(String::from_utf8_lossy(&wipe.stdout).contains("agent killed"), "{wipe:?}");
    let (starting_pid, other_pid) = (starting.0.id() as i32, other.0.id() as i32);
    eventually("the starting agent is killed", || !alive(starting_pid));
    assert!(!data_dir.exists());
    assert!(alive(other_pid), "the other directory's agent was killed");
}
