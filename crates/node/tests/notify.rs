//! Readiness by notification through the real agent, with real tasks: a task with
//! `notify_socket = true` says `READY=1` with python3 on the socket in its `NOTIFY_SOCKET`,
//! under raw_exec and under exec (whose workload user reaches the socket in its directory),
//! and the task waiting on it (`wait_ready`) starts then, even when the agent was killed with
//! SIGKILL and started over in between; a task that never says it fails the allocation at
//! the deadline, with the reason.

// Real processes on the real clock: the tests start agents and tasks.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use wharf_state::{ClientStatus, TaskEventKind, TaskStatus};

/// Says READY=1 on its notify socket once `local/go` exists in its directory, then stays.
const SAYS_READY_ON_GO: &str = "import os, socket, time
go = os.path.join(os.environ['WHARF_TASK_DIR'], 'local', 'go')
while not os.path.exists(go):
    time.sleep(0.02)
ready = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
ready.sendto(b'STATUS=serving\\nREADY=1\\n', os.environ['NOTIFY_SOCKET'])
time.sleep(600)
";

fn python3() -> &'static str {
    let python = "/usr/bin/python3";
    assert!(
        std::path::Path::new(python).exists(),
        "{python} is missing: install Debian's python3 (the test's task says READY=1 with it)"
    );
    python
}

/// `db` (on `driver`, with a notify socket, running `script`) and `web`, which waits for it.
fn waiting_job(id: &str, driver: &str, script: &str, deadline: &str) -> String {
    let db = format!(
        "[[group.task]]\nname = \"db\"\ndriver = \"{driver}\"\nnotify_socket = true\n\
         resources = {{ cpu = 200, memory = 128 }}\n\
         config = {{ command = \"{}\", args = [\"-c\", {script:?}] }}\n",
        python3()
    );
    let web = format!(
        "{}wait_ready = [\"db\"]\nwait_deadline = \"{deadline}\"\n",
        sh_task("web", "exec sleep 600")
    );
    job(id, "service", &format!("{db}{web}"))
}

async fn says_ready_after_an_agent_restart(driver: &str) {
    let dir = tempfile::tempdir().unwrap();
    // An exec task's workload user reaches its directory by its absolute path.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let spec = waiting_job("notify", driver, SAYS_READY_ON_GO, "60s");
    let id = submit(&client, &spec).await.unwrap();
    let detail = until(&client, &id, "db running", |d| {
        d.state.task_states["db"].status == TaskStatus::Running
    })
    .await;
    assert_eq!(detail.state.task_states["web"].status, TaskStatus::Pending);
    let task_dir = agent.data_dir.join(format!("allocs/{id}/db"));
    assert!(task_dir.join("notify.sock").exists());

    // Killed, the agent leaves db running; started over, it reattaches and binds db's socket
    // again, where db says READY=1.
    let (data_dir, config) = agent.kill9();
    let agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    until(&client, &id, "reattached", |d| {
        d.state.task_states["db"].events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    std::fs::write(task_dir.join("local/go"), "").unwrap();
    let detail = until(&client, &id, "web running", |d| {
        d.state.task_states["web"].status == TaskStatus::Running
    })
    .await;
    let ready_at = detail.state.task_states["db"].ready_at.expect("db's READY=1 is recorded");
    assert!(detail.state.task_states["web"].started_at.unwrap() >= ready_at);
    assert_eq!(detail.state.client_status, ClientStatus::Running);
    let stop = agent.cli(&["alloc", "stop", &id, "--wait", "20s"]);
    assert!(stop.status.success(), "{stop:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_exec_task_says_ready_after_an_agent_restart_and_its_waiter_starts() {
    says_ready_after_an_agent_restart("raw_exec").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_task_says_ready_from_its_sandbox_and_its_waiter_starts() {
    says_ready_after_an_agent_restart("exec").await;
}

/// A task that never says READY=1 leaves its waiter to fail at the deadline, and the
/// allocation with it, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ready_within_the_deadline_fails_the_allocation_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let spec = waiting_job("silent", "raw_exec", "import time; time.sleep(600)", "2s");
    let id = submit(&client, &spec).await.unwrap();
    let detail =
        until(&client, &id, "failed", |d| d.state.client_status == ClientStatus::Failed).await;
    let web = &detail.state.task_states["web"];
    assert!(web.started_at.is_none(), "web never started");
    let said = web.events.iter().any(|e| {
        e.kind
            == TaskEventKind::SetupFailure {
                error: "task \"db\" did not say READY=1 within the wait_deadline of 2s of task \
                        \"web\""
                    .into(),
            }
    });
    assert!(said, "{:#?}", web.events);
}

/// `wharf validate` accepts examples/notify.toml and names the field of a `wait_ready` on a
/// task without a notify socket.
#[test]
fn validate_takes_the_example_and_names_a_wait_for_a_task_without_a_socket() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/notify.toml");
    let out = std::process::Command::new(WHARF).args(["validate", example]).output().unwrap();
    assert!(out.status.success(), "{out:?}");

    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.toml");
    let tasks = format!(
        "{}{}wait_ready = [\"db\"]\n",
        sh_task("db", "exec sleep 600"),
        sh_task("web", "exec sleep 600")
    );
    std::fs::write(&spec, job("bad", "service", &tasks)).unwrap();
    let out = std::process::Command::new(WHARF)
        .args(["validate", spec.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("group.task[1].wait_ready")
            && text.contains("task \"db\" does not set notify_socket = true"),
        "{text}"
    );
}
