//! Issue 32's job features end to end, through the `wharf` binary. Host volumes: the node's
//! config offers directories by name, admission refuses a group asking for one the node does
//! not have (or for writing one it offers read-only) with 409 naming it, and a raw_exec task
//! finds its mount's path in `WHARF_VOLUME_<NAME>`. Artifacts: the example job's archive is
//! fetched and unpacked before its task starts.

// Real processes on the real clock: the tests start and kill agents.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use wharf_node::client::ClientError;
use wharf_state::ClientStatus;

fn group_volume(name: &str, source: &str, read_only: bool) -> String {
    format!(
        "[group.volume.{name}]\ntype = \"host\"\nsource = \"{source}\"\nread_only = {read_only}\n"
    )
}

fn mount(volume: &str, read_only: bool) -> String {
    format!(
        "[[group.task.volume_mount]]\nvolume = \"{volume}\"\ndestination = \"/srv/{volume}\"\nread_only = {read_only}\n"
    )
}

async fn refused(client: &wharf_node::client::Client, spec: &str, phrase: &str) {
    match submit(client, spec).await {
        Err(ClientError::Api { status, message }) => {
            assert_eq!(status.as_u16(), 409, "{message}");
            assert!(message.contains(phrase), "{message}");
        }
        other => panic!("expected a 409 naming {phrase:?}: {other:?}"),
    }
}

#[tokio::test]
async fn host_volumes_are_checked_at_admission_and_reach_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("volumes/data");
    let certs = dir.path().join("volumes/certs");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::write(certs.join("ca.pem"), "CA\n").unwrap();
    let config = format!(
        "[host_volume.data]\npath = \"{}\"\n[host_volume.certs]\npath = \"{}\"\nread_only = true\n",
        data.display(),
        certs.display()
    );
    let agent = AgentProcess::start(dir.path(), &config);
    let client = agent.client();

    let unknown = job(
        "unknown",
        "batch",
        &format!(
            "{}{}{}",
            group_volume("db", "pgdata", false),
            sh_task("t", "exit 0"),
            mount("db", false)
        ),
    );
    refused(&client, &unknown, "group.volume.db: the node has no host volume \"pgdata\"").await;
    let writes_read_only = job(
        "rw",
        "batch",
        &format!(
            "{}{}{}",
            group_volume("certs", "certs", false),
            sh_task("t", "exit 0"),
            mount("certs", false)
        ),
    );
    refused(&client, &writes_read_only, "host volume \"certs\" is read-only").await;

    let script = "cat \"$WHARF_VOLUME_CERTS/ca.pem\" > \"$WHARF_VOLUME_DATA/copied\"";
    let uses = job(
        "uses",
        "batch",
        &format!(
            "{}{}{}{}{}",
            group_volume("data", "data", false),
            group_volume("certs", "certs", true),
            sh_task("t", script),
            mount("data", false),
            mount("certs", true)
        ),
    );
    let id = submit(&client, &uses).await.unwrap();
    let detail = until(&client, &id, "complete", |d| d.state.client_status.is_terminal()).await;
    assert_eq!(detail.state.client_status, ClientStatus::Complete, "{:?}", detail.state);
    assert_eq!(std::fs::read_to_string(data.join("copied")).unwrap(), "CA\n");
}

#[test]
fn the_artifact_example_unpacks_before_its_task_starts() {
    shim_beside_wharf();
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/artifact.toml");
    let run = std::process::Command::new(WHARF)
        .args(["--address", "127.0.0.1:9", "run"])
        .arg(&example)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        stdout.contains("show         Task Setup           Downloaded 1 artifact(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("==> allocation complete"), "{stdout}");
}
