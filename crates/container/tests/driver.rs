//! The container driver against real runc, overlayfs and cgroups: cases of Nomad's docker
//! driver tests (drivers/docker/driver_test.go) that apply without a daemon, each named after
//! its test, and wharf's own.

mod common;

use common::*;
use std::time::Duration;
use wharf_driver::{Driver, DriverError};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// TestDockerDriver_Start_Wait: a started container runs until it is stopped, then waits.
#[test]
fn docker_driver_start_wait() {
    let node = Node::new("start-wait");
    let layout = fixture_layout(&node.dir.path().join("layout"));
    runtime().block_on(async {
        let driver = node.driver();
        let config = config(node.dir.path(), "web", serde_json::json!({
            "image": layout.reference("busybox"), "command": "/bin/sh", "args": ["-c", "echo hello; exec sleep 1000"],
        }));
        let handle = driver.start_task(config.clone()).await.unwrap();
        let info = driver.inspect_task(handle.id()).await.unwrap();
        assert_eq!(info.state, wharf_driver::RunState::Running);
        driver.stop_task(handle.id(), Duration::from_secs(1), wharf_driver::Signal::Term).await.unwrap();
        let exit = tokio::time::timeout(LIMIT, driver.wait_task(handle.id())).await.unwrap().unwrap();
        assert!(!exit.successful(), "{exit:?}");
        assert_eq!(stdout(&config), "hello\n");
        driver.destroy_task(handle.id(), false).await.unwrap();
        let _: Option<DriverError> = None;
    });
}
