//! The isolated `exec` driver through the real agent: registered as `exec`, healthy on this
//! host, and a job's task contained end to end (its own user, its directories only), seen
//! live by the probe while the agent is down, and reattached after the agent is killed and
//! started over.

// Real processes on the real clock: these tests start programs and measure bounds in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::Method;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use wharf_state::ClientStatus;

fn exec_task(name: &str, script: &str) -> String {
    format!(
        "[[group.task]]\nname = \"{name}\"\ndriver = \"exec\"\nresources = {{ cpu = 200, memory = 64 }}\n\
         config = {{ command = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_task_runs_contained_through_the_agent_and_keeps_its_user_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    // Workload users reach their directories by absolute paths.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();

    let health: serde_json::Value = client.json(Method::GET, "/v1/health", None).await.unwrap();
    assert_eq!(health["drivers"]["exec"]["health"], "healthy", "{health}");

    // The agent's own files are out of reach; the task's directory is its own.
    let canary = agent.data_dir.join("canary");
    std::fs::write(&canary, "the agent's").unwrap();
    let script = format!(
        "id -u > $WHARF_TASK_DIR/local/uid; cat {} || echo refused; exec sleep 600",
        canary.display()
    );
    let id = submit(&client, &job("boxed", "service", &exec_task("boxed", &script))).await.unwrap();
    until(&client, &id, "running", |d| d.state.client_status == ClientStatus::Running).await;
    let task_dir = agent.data_dir.join(format!("allocs/{id}/boxed"));
    let uid = read_pid(&task_dir.join("local/uid"));
    assert!((80_000..=89_999).contains(&uid), "{uid}");
    let stdout = task_dir.join("logs/boxed.stdout.0");
    eventually("the task tried the canary", || {
        std::fs::read_to_string(&stdout).is_ok_and(|s| s.contains("refused"))
    });

    // Killed, the agent leaves the task running: the probe, reading the store, sees it live.
    let (data_dir, config) = agent.kill9();
    let offline = Command::new(WHARF)
        .args(["--address", "127.0.0.1:9", "alloc", "list", "--probe", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&offline.stdout), format!("{id}\n"), "{offline:?}");

    // Started over, the agent reattaches, and a new task gets another user.
    let mut agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    until(&client, &id, "reattached", |d| d.state.client_status == ClientStatus::Running).await;
    let other =
        submit(&client, &job("other", "batch", &exec_task("other", "id -u"))).await.unwrap();
    until(&client, &other, "done", |d| d.done).await;
    let logs = agent.cli(&["alloc", "logs", &other, "other"]);
    let other_uid: i32 = String::from_utf8_lossy(&logs.stdout).trim().parse().unwrap();
    assert_ne!(other_uid, uid);

    let stop = agent.cli(&["alloc", "stop", &id, "--wait", "20s"]);
    assert!(stop.status.success(), "{stop:?}");
    assert!(agent.terminate().success());
}

/// `examples/isolated.toml` runs as its comments say, and shows what it can and cannot reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_isolated_example_runs_and_shows_what_its_task_cannot_reach() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/isolated.toml");
    let spec = std::fs::read_to_string(example).unwrap();
    let id = submit(&client, &spec).await.unwrap();
    let done = until(&client, &id, "done", |d| d.done).await;
    assert_eq!(done.state.client_status, ClientStatus::Complete, "{done:?}");
    let logs = agent.cli(&["alloc", "logs", &id, "probe"]);
    let out = String::from_utf8_lossy(&logs.stdout);
    let line = |label: &str| {
        out.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("{label}: {out}"))
    };
    assert!(line("who:").contains("uid=8"), "{out}");
    assert!(line("my pid:").starts_with("my pid:     1 "), "{out}");
    assert!(line("unveiled:").contains("PRETTY_NAME") || line("unveiled:").contains("NAME"));
    for denied in ["data dir:", "passwd:", "tmp:"] {
        assert!(line(denied).contains("Permission denied"), "{out}");
    }
    assert_eq!(line("task dir:"), "task dir:   wrote local/hello.txt");
    assert!(agent.terminate().success());
}
