//! The store on its own: allocations and task states written by concurrent writers (who share
//! fsyncs), read back after the file is closed and opened again, as an agent does on restart.
//!
//! `cargo run -p wharf-store --example store`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::sync::Arc;
use wharf_state::{Allocation, Job, JobType, Task, TaskGroup, TaskState, TaskStatus, Timestamp};
use wharf_store::{RedbStore, StateStore};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.redb");
    let store = Arc::new(RedbStore::open(&path)?);

    // A hundred allocations written at once: each write returns once it is durable.
    let mut writers = tokio::task::JoinSet::new();
    for n in 0..100 {
        let store = store.clone();
        writers.spawn(async move {
            let group = TaskGroup::new("web", [Task::new("main", "raw_exec")]);
            let alloc =
                Allocation::new(format!("a{n}"), Job::new("hello", JobType::Service, group), "web");
            store.put_allocation(&alloc).await?;
            let mut state = TaskState::new();
            state
                .set_status(TaskStatus::Running, Timestamp(1_700_000_000_000))
                .expect("pending to running");
            store.put_task_state(&alloc.id, "main", &state).await
        });
    }
    while let Some(written) = writers.join_next().await {
        written??;
    }
    let commits = store.stats().commits;
    drop(store);

    // What a restarted agent restores from.
    let snapshot = RedbStore::open(&path)?.load_all().await?;
    let running = snapshot
        .allocs
        .iter()
        .filter(|a| a.tasks["main"].state.as_ref().is_some_and(|s| s.status == TaskStatus::Running))
        .count();
    assert_eq!((snapshot.allocs.len(), running), (100, 100));
    assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);
    println!("200 writes in {commits} commits; {running} running tasks restored");
    Ok(())
}
