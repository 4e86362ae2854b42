//! A start that its caller gives up on (the future is dropped while the shim has not yet
//! reported) leaves nothing running and no zombie.
//!
//! This is its own test binary so that the shim it abandons is the only child this process
//! has: the test finds it among its children, since the driver no longer says which it is.

mod common;

use common::*;
use std::future::Future;
use std::time::Duration;
use wharf_driver::Driver;

/// The children of this process, from every thread's list.
fn own_children() -> Vec<i32> {
    let mut children = Vec::new();
    for thread in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let list = std::fs::read_to_string(thread.path().join("children")).unwrap_or_default();
        children.extend(list.split_whitespace().map(|p| p.parse::<i32>().unwrap()));
    }
    children
}

/// Live processes working in `dir`.
fn processes_in(dir: &std::path::Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == dir))
        .filter(|pid| alive(*pid))
        .collect()
}

#[tokio::test]
async fn an_abandoned_start_leaves_nothing_running() {
    let root = tempfile::tempdir().unwrap();
    let driver = driver();
    let config = shell(root.path(), "abandoned", "sleep 600; exit 3");
    let task_dir = config.task_dir.clone();
    assert_eq!(own_children(), Vec::<i32>::new());

    // Polled once, the start spawns the shim and waits for its report; then it is dropped, as
    // by a caller that gave up.
    let mut start = Box::pin(driver.start_task(config));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    if let std::task::Poll::Ready(result) = start.as_mut().poll(&mut context) {
        panic!("the start finished at once: {result:?}");
    }
    drop(start);

    // The shim stays our child until the driver reaps it, which cannot happen before this
    // test yields: waiting on it here is race-free.
    let shims = own_children();
    assert_eq!(shims.len(), 1, "{shims:?}");
    wait_gone(shims[0]);
    assert_eq!(processes_in(&task_dir), Vec::<i32>::new(), "an abandoned task still runs");

    // The driver reaps the shim in the background: no zombie is left either.
    let reaped = async {
        while !own_children().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(LIMIT, reaped).await.expect("the abandoned shim was never reaped");
}
