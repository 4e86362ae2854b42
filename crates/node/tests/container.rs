//! The container driver through the real agent: registered and healthy, its images listed,
//! pulled and removed through the API and the CLI, and the example job run by `wharf run`.

// Real processes on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::Method;
use std::path::Path;
use std::process::Command;

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

    // `wharf wipe` (when the agent is dropped) does not unmount container roots yet: the
    // test takes down what it made.
    drop(agent);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for point in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
        if point.starts_with(&dir.path().display().to_string()) {
            let _ = Command::new("umount").arg("-l").arg(point).status();
        }
    }
}
