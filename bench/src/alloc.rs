//! Alloc runner scenario: start 1,000 one-task allocations on the mock driver (with the redb
//! store the agent uses) and measure the time until every one runs and the memory each
//! running alloc runner adds.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_alloc::{AllocRunner, AllocRunnerConfig};
use wharf_driver::DriverRegistry;
use wharf_driver::mock::MockDriver;
use wharf_state::{Allocation, ClientStatus, DesiredStatus, spec};
use wharf_store::{RedbStore, StateStore};

const FULL_ALLOCS: usize = 1000;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let allocs = effort.scaled(FULL_ALLOCS);
    let (mut seconds, mut per_runner) = (Vec::new(), Vec::new());
    for _ in 0..effort.runs {
        let (elapsed, bytes) = runtime.block_on(start_all(allocs))?;
        seconds.push(elapsed.as_secs_f64() * 1000.0);
        per_runner.push(bytes / 1024.0);
    }
    Ok(vec![
        Row {
            name: format!("alloc: {allocs} one-task allocations (mock driver) to all running"),
            unit: "ms",
            better: Better::Lower,
            samples: seconds,
            baseline: None,
            target: None,
        },
        Row {
            name: "alloc: heap per running alloc runner (with its task runner and tasks)".into(),
            unit: "KiB",
            better: Better::Lower,
            samples: per_runner,
            baseline: None,
            target: Some(Target::parse("≤ 64 KiB")?),
        },
    ])
}

async fn start_all(count: usize) -> Result<(Duration, f64), String> {
    let dir = crate::scratch::dir("wharf-bench-alloc");
    let store: Arc<dyn StateStore> = Arc::new(RedbStore::open(dir.join("state.redb")).unwrap());
    let drivers = DriverRegistry::new().with(Arc::new(MockDriver::new()));
    let job = spec::parse_toml(
        "[job]\nid = \"bench\"\ntype = \"service\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"mock\"\n",
    )
    .unwrap();
    let before = crate::heap::live_bytes();
    let started = Instant::now();
    let runners: Vec<AllocRunner> = (0..count)
        .map(|i| {
            let alloc = Allocation {
                id: format!("bench-{i}"),
                job: job.clone(),
                task_group: "g".into(),
                desired_status: DesiredStatus::Run,
                modify_index: 1,
                deployment_id: None,
                ports: Vec::new(),
            };
            AllocRunner::new(
                AllocRunnerConfig::new(alloc, store.clone(), dir.join(format!("allocs/bench-{i}")))
                    .with_drivers(drivers.clone()),
            )
            .unwrap()
        })
        .collect();
    for runner in &runners {
        let runner = runner.clone();
        tokio::spawn(async move { runner.run().await });
    }
    for runner in &runners {
        running(runner).await?;
    }
    let elapsed = started.elapsed();
    let grown = (crate::heap::live_bytes() - before) as f64 / count as f64;
    for runner in &runners {
        runner.destroy().await;
    }
    Ok((elapsed, grown))
}

/// How long a bench waits for one allocation to run.
pub(crate) const RUNNING_LIMIT: Duration = Duration::from_secs(60);

/// Waits at most [`RUNNING_LIMIT`] until `runner`'s allocation runs; fails if it settles in
/// another state, or its runner ends first.
pub(crate) async fn running(runner: &AllocRunner) -> Result<(), String> {
    let mut watch = runner.subscribe();
    let settled = tokio::time::timeout(
        RUNNING_LIMIT,
        watch.wait_for(|s| {
            s.client_status == ClientStatus::Running || s.client_status.is_terminal()
        }),
    )
    .await;
    match settled {
        Ok(Ok(state)) if state.client_status == ClientStatus::Running => Ok(()),
        Ok(Ok(state)) => Err(format!(
            "{} is {:?} ({}), not running",
            runner.id(),
            state.client_status,
            state.client_description
        )),
        Ok(Err(_)) => Err(format!("{}: its runner ended before it ran", runner.id())),
        Err(_) => Err(format!("{} not running within {RUNNING_LIMIT:?}", runner.id())),
    }
}
