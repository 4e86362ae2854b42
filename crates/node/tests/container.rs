//! The container driver through the real agent: registered and healthy, its images listed,
//! pulled and removed through the API and the CLI, and the example job run by `wharf run`.

// Real processes on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::Method;
use std::path::Path;
use std::process::Command;
use wharf_state::ClientStatus;

/// The example's busybox archive, made by the example's own script.
fn make_image(path: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/container-image.sh");
    let made = Command::new("sh").arg(&script).arg(path).output().unwrap();
    assert!(made.status.success(), "{made:?} (the script needs busybox-static and tar)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_example_runs_through_the_agent_and_its_image_is_managed() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    make_image(&archive);
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();

    let health: serde_json::Value = client.json(Method::GET, "/v1/health", None).await.unwrap();
    assert_eq!(health["drivers"]["container"]["health"], "healthy", "{health}");
    let node: serde_json::Value = client.json(Method::GET, "/v1/node", None).await.unwrap();
    assert!(node.to_string().contains("container"), "{node}");

    let reference = format!("docker-archive:{}", archive.display());
    let pulled = agent.cli(&["image", "pull", &reference]);
    assert!(pulled.status.success(), "{pulled:?}");
    let listed = agent.cli(&["image", "list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&reference), "{listed:?}");

    let removed = agent.cli(&["image", "rm", &reference]);
    assert!(removed.status.success(), "{removed:?}");
    let images: Vec<serde_json::Value> =
        client.json(Method::GET, "/v1/images", None).await.unwrap();
    assert!(images.is_empty(), "{images:?}");
    let again = agent.cli(&["image", "rm", &reference]);
    assert!(!again.status.success());

    // The example's start stores the image again; while its allocation is kept, the image
    // stays.
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/container.toml"),
    )
    .unwrap();
    let spec = dir.path().join("container.toml");
    std::fs::write(
        &spec,
        example.replace("/var/tmp/wharf-busybox.tar", &archive.display().to_string()),
    )
    .unwrap();
    let run = agent.cli_within(&["run", spec.to_str().unwrap(), "--id", "box1"]);
    assert!(run.status.success(), "{run:?}");
    let task_dir = agent.data_dir.join("allocs/box1/hello");
    let out = std::fs::read_to_string(task_dir.join("logs/hello.stdout.0")).unwrap();
    assert!(out.starts_with("hello from a container\nuid=0(root)"), "{out}");
    assert_eq!(
        std::fs::read_to_string(agent.data_dir.join("allocs/box1/alloc/done")).unwrap(),
        "done\n"
    );

    let images: Vec<serde_json::Value> =
        client.json(Method::GET, "/v1/images", None).await.unwrap();
    assert_eq!(images.len(), 1, "{images:?}");
    let refused = agent.cli(&["image", "rm", &reference]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("in use"), "{refused:?}");

    // `wharf wipe` (when the agent is dropped) leaves no mount behind.
    let data_dir = agent.data_dir.clone();
    drop(agent);
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    assert!(!data_dir.exists());
}

/// The mount points at or under `dir`, as this host's mount table lists them.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap().display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|point| point.starts_with(&dir))
        .map(str::to_owned)
        .collect()
}

/// What runc keeps for the containers under `root`: `(id, init pid, status)`.
fn runc_list(root: &Path) -> Vec<(String, i32, String)> {
    let out = Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .output()
        .expect("runc runs (apt-get install runc)");
    assert!(out.status.success(), "{out:?}");
    let list: Option<Vec<serde_json::Value>> = serde_json::from_slice(&out.stdout).unwrap();
    list.unwrap_or_default()
        .iter()
        .map(|c| {
            let pid = c["pid"].as_i64().unwrap() as i32;
            (c["id"].as_str().unwrap().to_owned(), pid, c["status"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// `wharf wipe` of a node whose container still runs: the runtime deletes the container (its
/// init dies), its root is unmounted, runc keeps no state for it, no process of the node is
/// left, nothing is mounted under the data directory, and the directory is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_leaves_no_container_process_mount_or_runtime_state() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    make_image(&archive);
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let data_dir = agent.data_dir.clone();
    let spec = job(
        "boxed",
        "service",
        &format!(
            "[[group.task]]\nname = \"t\"\ndriver = \"container\"\n\
             config = {{ image = \"docker-archive:{}\", command = \"sleep\", args = [\"1000\"] }}\n",
            archive.display()
        ),
    );
    let id = submit(&client, &spec).await.unwrap();
    until(&client, &id, "running", |d| d.state.client_status == ClientStatus::Running).await;

    let runtime_root = data_dir.join("container/runtime");
    let containers = runc_list(&runtime_root);
    assert_eq!(containers.len(), 1, "{containers:?}");
    let (container_id, init_pid, status) = containers[0].clone();
    assert_eq!(status, "running");
    assert!(alive(init_pid));
    assert!(!mounts_under(&data_dir).is_empty(), "the container's root is mounted");
    let wipe = cli_in(&data_dir, &["wipe"], "");
    assert!(wipe.status.success(), "{wipe:?}");
    assert!(
        String::from_utf8_lossy(&wipe.stdout).contains("agent killed, tasks destroyed: 1"),
        "{wipe:?}"
    );
    assert!(!alive(init_pid), "the container's init outlived the wipe");
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    assert!(!data_dir.exists());
    let data_name = data_dir.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&data_name))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(!runtime_root.join(&container_id).exists(), "runc's state of {container_id} left");
}

/// A container task of `image` running `script` under `sh -c`, with `extra` config entries.
fn container_task(image: &Path, script: &str, extra: &str) -> String {
    format!(
        "[[group.task]]\nname = \"t\"\ndriver = \"container\"\n\
         config = {{ image = \"docker-archive:{}\", command = \"/bin/sh\", args = [\"-c\", {script:?}]{extra} }}\n",
        image.display()
    )
}

/// The references of the images the agent stores.
async fn image_references(client: &wharf_node::client::Client) -> Vec<String> {
    let images: Vec<serde_json::Value> =
        client.json(Method::GET, "/v1/images", None).await.unwrap();
    images.iter().map(|i| i["reference"].as_str().unwrap().to_owned()).collect()
}

/// Images go with the finished allocations, through the agent's own GC loop: once the
/// allocation that ran an image is collected, the image is removed, while an image a running
/// allocation uses stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_gc_removes_an_image_with_the_last_allocation_that_used_it() {
    let dir = tempfile::tempdir().unwrap();
    let (finished_image, running_image) = (dir.path().join("a.tar"), dir.path().join("b.tar"));
    make_image(&finished_image);
    std::fs::copy(&finished_image, &running_image).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let agent = AgentProcess::start(
        dir.path(),
        &format!(
            "[gc]\nmax_allocs = 0\ninterval = \"200ms\"\n\
             [drivers.container]\nallowed_mount_dirs = [{:?}]\n",
            shared.display().to_string()
        ),
    );
    let client = agent.client();

    let running = job("running", "service", &container_task(&running_image, "exec sleep 1000", ""));
    let running = submit(&client, &running).await.unwrap();
    until(&client, &running, "running", |d| d.state.client_status == ClientStatus::Running).await;

    // The finished allocation says it ran through a host directory: the GC removes the rest.
    let mount = format!(
        ", mounts = [{{ source = {:?}, target = \"/shared\" }}]",
        shared.display().to_string()
    );
    let finished = job(
        "finished",
        "batch",
        &container_task(&finished_image, "echo ran > /shared/ran", &mount),
    );
    let finished = submit(&client, &finished).await.unwrap();
    let deadline = std::time::Instant::now() + LIMIT;
    let finished_ref = format!("docker-archive:{}", finished_image.display());
    let running_ref = format!("docker-archive:{}", running_image.display());
    loop {
        let collected = matches!(
            client.call(Method::GET, &format!("/v1/allocations/{finished}"), None).await,
            Err(wharf_node::client::ClientError::Api { status, .. }) if status == hyper::StatusCode::NOT_FOUND
        );
        let images = image_references(&client).await;
        if collected && !images.contains(&finished_ref) {
            // The same collection kept the running allocation's image.
            assert_eq!(images, std::slice::from_ref(&running_ref));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the finished allocation and its image were never collected: {images:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read_to_string(shared.join("ran")).unwrap(), "ran\n");
    assert!(!agent.data_dir.join("allocs").join(&finished).exists());
    let still = until(&client, &running, "still running", |d| !d.done).await;
    assert_eq!(still.state.client_status, ClientStatus::Running);
}
