//! One task under wharf's task runner, without the alloc runner: a service task that keeps
//! failing is restarted by its policy (a delay with jitter, attempts within an interval), then
//! failed, with every event printed as it is recorded and the state persisted in a store.
//!
//! `cargo run -p wharf-task --example restarts`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::sync::Arc;
use wharf_driver::mock::MockDriver;
use wharf_state::{Allocation, Job, JobType, RestartOverrides, Task, TaskGroup};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::{TaskRunner, TaskRunnerConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Exits 1 after 50ms; two restarts within a minute, 100ms apart (plus up to 25% jitter).
    let task = Task::new("flaky", "mock")
        .with_config("run_for", "50ms")
        .with_config("exit_code", 1)
        .with_restart(RestartOverrides {
            attempts: Some(2),
            delay: Some(std::time::Duration::from_millis(100)),
            interval: Some(std::time::Duration::from_secs(60)),
            ..RestartOverrides::default()
        });
    let job = Job::new("hello", JobType::Service, TaskGroup::new("g", [task.clone()]));
    let alloc = Allocation::new("a1", job, "g");
    let store = MemoryStore::new();
    let dir = tempfile::tempdir()?;
    let config = TaskRunnerConfig::new(
        alloc.clone(),
        task,
        Arc::new(MockDriver::new()),
        Arc::new(store.clone()),
        dir.path().join("a1"),
    );
    let runner = TaskRunner::new(config);
    let mut events = runner.events();
    runner.set_start_gate(true);
    let run = tokio::spawn({
        let runner = runner.clone();
        async move { runner.run().await }
    });
    loop {
        let recorded = events.recv().await?;
        println!(
            "{} {}: {}",
            recorded.event.time,
            recorded.event.kind.title(),
            recorded.event.kind
        );
        if recorded.event.fails_task {
            break;
        }
    }
    runner.kill(None).await; // release the dead task; its run ends
    run.await?;
    let state = runner.state();
    assert!(state.failed && state.restarts == 2, "{state:?}");
    store.put_allocation(&alloc).await?;
    let stored = store.load_alloc("a1").await?.expect("stored").tasks["flaky"].state.clone();
    assert_eq!(stored, Some(state), "what the store holds is what the runner reports");
    Ok(())
}
