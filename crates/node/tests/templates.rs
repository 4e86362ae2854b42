//! Templates end to end: the real agent renders a task's template from a variable set with
//! `wharf var put`, feeds an `env = true` template into its environment, and signals the real
//! process when the variable changes; the variables outlive the agent.

// Real processes on the real clock: these tests start programs and wait in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;

fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const TASK: &str = r#"
[[group.task]]
name = "app"
driver = "raw_exec"
kill_timeout = "1s"
config = { command = "/bin/sh", args = ["-c", "echo \"$DB_USER $(cat local/db.conf)\" > $WHARF_ALLOC_DIR/seen; trap 'cat local/db.conf > $WHARF_ALLOC_DIR/hup' HUP; while true; do sleep 0.05; done"] }

[[group.task.template]]
data = '{{ with nomadVar "app/db" }}user={{ .user }}{{ end }}'
destination = "local/db.conf"
change_mode = "signal"
change_signal = "SIGHUP"
splay = "0s"

[[group.task.template]]
data = 'DB_USER={{ key "app/db/user" }}'
destination = "secrets/db.env"
env = true
change_mode = "noop"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_renders_from_a_variable_and_signals_the_task_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), "");
    assert_eq!(stdout(&agent.cli(&["var", "put", "app/db", "user=ann"])), "user=ann\n");
    let id = submit(&agent.client(), &job("tpl", "service", TASK)).await.unwrap();
    let alloc_dir = agent.data_dir.join("allocs").join(&id).join("alloc");
    let read = |file: &str| std::fs::read_to_string(alloc_dir.join(file)).unwrap_or_default();
    eventually("the task saw its template and environment", || read("seen") == "ann user=ann\n");

    agent.cli(&["var", "put", "app/db", "user=bob"]);
    eventually("the task was signalled with the new file", || read("hup") == "user=bob");

    assert_eq!(stdout(&agent.cli(&["var", "get", "app/db"])), "user=bob\n");
    assert_eq!(stdout(&agent.cli(&["var", "list", "app/"])), "app/db\n");
    let refused = agent.cli(&["var", "put", "../x", "a=b"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("../x"), "{refused:?}");

    // The variables are the node's, kept across agent restarts.
    agent.terminate();
    let agent = AgentProcess::launch(agent.data_dir.clone(), agent.config.clone());
    assert_eq!(stdout(&agent.cli(&["var", "get", "app/db"])), "user=bob\n");
}

/// `examples/template.toml` runs as its comments say: its templates render before the task
/// starts, one into a file it reads, one into its environment.
#[test]
fn the_template_example_runs() {
    shim_beside_wharf();
    let dir = tempfile::tempdir().unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/template.toml");
    let data = dir.path().join("data").display().to_string();
    let run = std::process::Command::new(WHARF)
        .args(["--address", "127.0.0.1:9", "--data-dir", &data, "run", "--id", "tpl1", example])
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let log = dir.path().join("data/allocs/tpl1/main/logs/main.stdout.0");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    for line in [
        "task: main",
        "greeting: HELLO FROM A TEMPLATE",
        "colours: red and green and blue",
        r#"as json: ["red","green","blue"]"#,
        "mode: batch",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
}

/// `wharf validate` names the template field that is wrong.
#[test]
fn validate_names_the_template_field() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.toml");
    let body = "[[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\nconfig = { command = \"/bin/true\" }\n\
                [[group.task.template]]\ndata = \"x\"\ndestination = \"../../etc/passwd\"\n";
    std::fs::write(&spec, job("bad", "batch", body)).unwrap();
    let out = std::process::Command::new(WHARF)
        .args(["validate", spec.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        said.contains("group.task[0].template[0].destination") && said.contains("escapes"),
        "{said}"
    );
}
