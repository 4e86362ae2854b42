//! `POST /v1/allocations/stop` and `wharf alloc stop ID...`: several allocations stopped in
//! one request, answered once every stop is durable, each id with its own outcome; an
//! acknowledged batch is carried out even when the agent is killed right after answering.

// Real processes on the real clock: the tests start and kill agents.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{AgentProcess, submit, until};
use hyper::{Method, StatusCode};
use wharf_node::api::StopManyResult;
use wharf_node::client::{ApiPath, Client, ClientError};
use wharf_state::{ClientStatus, DesiredStatus, TaskStatus};

/// One task that sleeps until it is killed.
const JOB: &str = "[job]\nid = \"sleeper\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
    [[group.task]]\nname = \"sleep\"\ndriver = \"raw_exec\"\n\
    config = { command = \"/bin/sleep\", args = [\"600\"] }\n";

/// Submits `count` sleepers and waits until each runs; their ids.
async fn running_sleepers(client: &Client, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..count {
        ids.push(submit(client, JOB).await.unwrap());
    }
    for id in &ids {
        until(client, id, "running", |d| d.state.client_status == ClientStatus::Running).await;
    }
    ids
}

async fn stop_many(client: &Client, ids: &[&str]) -> Result<StopManyResult, ClientError> {
    let body = serde_json::json!({ "ids": ids });
    client.json(Method::POST, ApiPath::v1(["allocations", "stop"]), Some(body)).await
}

/// Waits until `id` has ended, stopped: desired Stop, its task dead.
async fn ends_stopped(client: &Client, id: &str) {
    let detail = until(client, id, &format!("{id} ends"), |d| {
        assert_eq!(d.alloc.desired_status, DesiredStatus::Stop, "the stop of {id} was lost");
        d.done
    })
    .await;
    assert_eq!(detail.state.task_states["sleep"].status, TaskStatus::Dead, "{id}");
    assert_eq!(detail.state.client_status, ClientStatus::Complete, "{id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_stop_stops_every_id_and_names_the_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let ids = running_sleepers(&client, 4).await;
    let kept = &ids[3];

    // The batch: three known ids (one twice) and one unknown; the unknown fails nothing else.
    let asked = [ids[0].as_str(), "nothing", ids[1].as_str(), ids[2].as_str(), ids[0].as_str()];
    let result = stop_many(&client, &asked).await.unwrap();
    assert_eq!(result.stopped, ids[..3].to_vec(), "{result:?}");
    assert_eq!(result.unknown, vec!["nothing".to_owned()], "{result:?}");
    assert!(result.failed.is_empty(), "{result:?}");
    for id in &ids[..3] {
        ends_stopped(&client, id).await;
    }
    let detail = until(&client, kept, "listed", |_| true).await;
    assert_eq!(detail.state.client_status, ClientStatus::Running, "{kept} was not asked to stop");

    // A body that is not a list of ids is refused, and says what is wrong.
    for body in [serde_json::json!({}), serde_json::json!({ "ids": "x" })] {
        match client.json::<StopManyResult>(Method::POST, "/v1/allocations/stop", Some(body)).await
        {
            Err(ClientError::Api { status: StatusCode::BAD_REQUEST, message, .. }) => {
                assert!(message.contains("stop request"), "{message}");
            }
            other => panic!("a bad batch: {other:?}"),
        }
    }
    let result = stop_many(&client, &[kept]).await.unwrap();
    assert_eq!(result.stopped, vec![kept.clone()]);
    ends_stopped(&client, kept).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_stop_takes_several_ids() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let ids = running_sleepers(&client, 3).await;

    let stop = agent.cli(&["alloc", "stop", &ids[0], &ids[1], "--wait", "20s"]);
    assert!(stop.status.success(), "{stop:?}");
    assert_eq!(
        String::from_utf8_lossy(&stop.stdout),
        format!("stopped {}: complete\nstopped {}: complete\n", ids[0], ids[1]),
        "{stop:?}"
    );
    let detail = until(&client, &ids[2], "listed", |_| true).await;
    assert_eq!(detail.state.client_status, ClientStatus::Running, "{} was stopped", ids[2]);

    // An unknown id fails the command and is named, and the known one is stopped all the same.
    let stop = agent.cli(&["alloc", "stop", "--exact", &ids[2], "nothing"]);
    assert_eq!(stop.status.code(), Some(2), "{stop:?}");
    let stderr = String::from_utf8_lossy(&stop.stderr);
    assert!(stderr.contains("no allocation \"nothing\" on this node"), "{stop:?}");
    ends_stopped(&client, &ids[2]).await;
}

/// Follows `acknowledged_submissions_and_stops_survive_sigkill` (agent_crash.rs) for a batch:
/// the agent is killed as soon as it has answered, and the next one carries out every stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_batched_stop_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let ids = running_sleepers(&client, 12).await;
    let asked: Vec<&str> = ids.iter().map(String::as_str).collect();

    let result = stop_many(&client, &asked).await.unwrap();
    let (data_dir, config) = agent.kill9();
    assert_eq!(result.stopped, ids, "{result:?}");

    let agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    for id in &ids {
        ends_stopped(&client, id).await;
    }
}
