//! Store scenario: durable state changes per second, with group commit and with the naive
//! one-commit-per-change baseline, for 1 and for 32 concurrent writers.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use std::time::Instant;
use wharf_state::TaskState;
use wharf_store::{RedbStore, StateStore, StoreOptions};

const FULL_CHANGES: usize = 20_000;

/// One measurement: throughput and how many commits (fsyncs) it took.
struct Measured {
    changes_per_second: f64,
    commits_per_thousand: f64,
}

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let one_per_commit = StoreOptions { max_writes_per_commit: 1, ..StoreOptions::default() };
    let mut rows = Vec::new();
    for writers in [1, 32] {
        // A lone writer waits for every fsync, so it gets fewer changes to keep the run short.
        let changes = effort.scaled(if writers == 1 { FULL_CHANGES / 10 } else { FULL_CHANGES });
        let (mut grouped, mut naive) = (Vec::new(), Vec::new());
        for _ in 0..effort.runs {
            grouped.push(measure(&runtime, writers, changes, StoreOptions::default()));
            naive.push(measure(&runtime, writers, changes, one_per_commit.clone()));
        }
        let rates = |m: &[Measured]| m.iter().map(|m| m.changes_per_second).collect();
        let plural = if writers == 1 { "" } else { "s" };
        rows.push(Row {
            name: format!("store: durable changes/s, {writers} writer{plural}"),
            unit: "/s",
            better: Better::Higher,
            samples: rates(&grouped),
            baseline: Some(("one commit per change".into(), rates(&naive))),
            target: (writers == 32).then(|| Target::parse("≥ 20,000/s and ≥ 10x")).transpose()?,
        });
        if writers > 1 {
            let commits = |m: &[Measured]| m.iter().map(|m| m.commits_per_thousand).collect();
            rows.push(Row {
                name: format!("store: commits (fsyncs) per 1,000 changes, {writers} writers"),
                unit: "",
                better: Better::Lower,
                samples: commits(&grouped),
                baseline: Some(("one commit per change".into(), commits(&naive))),
                target: None,
            });
        }
    }
    Ok(rows)
}

/// Opens a fresh store on the disk the agent would use (not tmpfs) and has `writers` tasks
/// make `changes` durable task-state writes between them.
fn measure(
    runtime: &tokio::runtime::Runtime,
    writers: usize,
    changes: usize,
    options: StoreOptions,
) -> Measured {
    let dir = crate::scratch::dir("wharf-bench-store");
    let store = RedbStore::open_with(dir.join("state.redb"), options).unwrap();
    let per_writer = changes.div_ceil(writers);
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut state = TaskState::new();
                    for i in 0..per_writer {
                        state.restarts = i as u64;
                        store.put_task_state("bench", &format!("t{w}"), &state).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let stats = store.stats();
    Measured {
        changes_per_second: (per_writer * writers) as f64 / elapsed,
        commits_per_thousand: stats.commits as f64 * 1000.0 / stats.writes as f64,
    }
}
