//! Arvados' dispatcher management API on a real fleet (`wharf fleet`, one loopback worker):
//! the instance list with Arvados' field names, and the hold, drain, run and kill actions by
//! `instance_id`. Named after Arvados' own tests of it (lib/dispatchcloud/dispatcher_test.go).

use hyper::{Method, StatusCode};
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;
use wharf_node::client::{Client, ClientError};
use wharf_node::fleet::api::FleetWorker;
use wharf_node::fleet::arvados::{ArvadosInstance, ArvadosInstances};
use wharf_tests::fleet::Fleet;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// Any single wait in these tests; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);
const INSTANCES: &str = "/arvados/v1/dispatch/instances";

fn start(dir: &Path) -> Fleet {
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
    let settings =
        "probe_interval = \"200ms\"\nsync_interval = \"1s\"\n[loopback]\ninstances = 1\n";
    Fleet::start(Path::new(WHARF), dir, settings, "info", LIMIT).unwrap()
}

fn status_of(error: ClientError) -> StatusCode {
    match error {
        ClientError::Api { status, .. } => status,
        other => panic!("expected an API error, got {other}"),
    }
}

async fn instances(client: &Client) -> Vec<ArvadosInstance> {
    let answer: ArvadosInstances = client.json(Method::GET, INSTANCES, None).await.unwrap();
    answer.items
}

/// Polls the Arvados instance list until `check` holds.
async fn until(
    client: &Client,
    what: &str,
    check: impl Fn(&[ArvadosInstance]) -> bool,
) -> Vec<ArvadosInstance> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let list = instances(client).await;
        if check(&list) {
            return list;
        }
        assert!(Instant::now() < deadline, "never {what}: {list:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn post(client: &Client, path: &str) -> Result<(), ClientError> {
    client.call(Method::POST, path, None).await.map(drop)
}

/// Arvados' TestManagementAPI_Permissions: no token is a 401, a wrong one a 403, on the list
/// and on every action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_api_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = start(dir.path());
    let anonymous = Client::new(fleet.address(), None);
    let wrong = Client::new(fleet.address(), Some("not-the-fleets-token-0123".into()));
    let paths = [
        (Method::GET, INSTANCES.to_owned()),
        (Method::POST, format!("{INSTANCES}/hold?instance_id=loopback-1")),
        (Method::POST, format!("{INSTANCES}/kill?instance_id=loopback-1")),
    ];
    for (method, path) in paths {
        let refused = anonymous.call(method.clone(), path.as_str(), None).await.unwrap_err();
        assert_eq!(status_of(refused), StatusCode::UNAUTHORIZED, "{method} {path}");
        let refused = wrong.call(method.clone(), path.as_str(), None).await.unwrap_err();
        assert_eq!(status_of(refused), StatusCode::FORBIDDEN, "{method} {path}");
    }
}

/// Arvados' TestManagementAPI_Instances: the worker listed with Arvados' fields; then what it
/// runs, and the idle behaviours and the kill by `instance_id`, seen in both APIs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_api_instances() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = start(dir.path());
    let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
    let list =
        until(&client, "an idle worker", |l| l.len() == 1 && l[0].worker_state == "idle").await;
    let worker = &list[0];
    assert!(!worker.instance.is_empty());
    assert_eq!(worker.idle_behavior, "run");
    assert_eq!(worker.price, 0.0, "a loopback worker's type has no price");
    assert_eq!(worker.arvados_instance_type, worker.provider_instance_type);
    assert_eq!(worker.last_container_uuid, "");
    assert!(worker.running_container_uuids.is_empty());
    let busy = &worker.last_busy;
    assert!(busy.len() == 24 && busy.ends_with('Z') && busy.as_bytes()[10] == b'T', "{busy}");
    let id = worker.instance.clone();

    // Work on it shows as Arvados shows a container.
    let spec = "[job]\nid = \"arv\"\ntype = \"service\"\n[group]\nname = \"g\"\n[[group.task]]\n\
                name = \"t\"\ndriver = \"raw_exec\"\nconfig = { command = \"/bin/sh\", args = [\"-c\", \"sleep 600\"] }\n";
    client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.as_bytes().to_vec())))
        .await
        .unwrap();
    let list = until(&client, "the allocation running", |l| {
        l.len() == 1 && l[0].running_container_uuids.len() == 1
    })
    .await;
    // The same runner as wharf's own API names on the worker.
    let workers: Vec<FleetWorker> = client.json(Method::GET, "/v1/workers", None).await.unwrap();
    assert_eq!(list[0].running_container_uuids, workers[0].allocations);
    assert_eq!(list[0].worker_state, "running");
    assert_eq!(list[0].last_container_uuid, list[0].running_container_uuids[0]);

    post(&client, &format!("{INSTANCES}/hold?instance_id={id}")).await.unwrap();
    until(&client, "held", |l| l[0].idle_behavior == "hold").await;
    let workers: Vec<FleetWorker> = client.json(Method::GET, "/v1/workers", None).await.unwrap();
    assert_eq!(workers[0].idle_behavior.to_string(), "hold");
    post(&client, &format!("{INSTANCES}/run?instance_id={id}")).await.unwrap();
    until(&client, "run again", |l| l[0].idle_behavior == "run").await;

    let missing = post(&client, &format!("{INSTANCES}/hold")).await.unwrap_err();
    assert_eq!(status_of(missing), StatusCode::BAD_REQUEST);
    let unknown =
        post(&client, &format!("{INSTANCES}/drain?instance_id=i-nosuch")).await.unwrap_err();
    assert_eq!(status_of(unknown), StatusCode::NOT_FOUND);
    let action = post(&client, &format!("{INSTANCES}/reboot?instance_id={id}")).await.unwrap_err();
    assert_eq!(status_of(action), StatusCode::NOT_FOUND);

    post(&client, &format!("{INSTANCES}/kill?instance_id={id}&reason=test")).await.unwrap();
    until(&client, "the killed worker gone or shutting down", |l| {
        l.iter().all(|w| w.instance != id || w.worker_state == "shutdown")
    })
    .await;
}
