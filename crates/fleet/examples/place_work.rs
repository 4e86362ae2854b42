//! A scheduler over a pool of one machine: work is submitted, placed on the worker once it is
//! idle, and seen running there.
//!
//! `cargo run -p wharf-fleet --example place_work`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::{sync::Arc, sync::Mutex, time::Duration};
use wharf_fleet::{
    FleetStore, MemoryStore, Replica, Scheduler, SchedulerConfig, Submission, WorkPhase,
};
use wharf_prober::{Executor, Instance, InstanceId, InstanceSet, InstanceType, Output, Pool};
use wharf_prober::{PoolConfig, ProberError, SystemClock, Tags};

/// A cloud of one machine that is always there.
#[derive(Debug)]
struct OneMachine;

#[wharf_prober::async_trait]
impl InstanceSet for OneMachine {
    async fn create(&self, _: &InstanceType, _: &Tags, _: &str) -> Result<Instance, ProberError> {
        Err(ProberError::Quota { detail: "one machine only".into() })
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(vec![Instance::new(InstanceId("vm-1".into()), "127.0.0.1:22")])
    }
    async fn destroy(&self, _: &InstanceId) -> Result<(), ProberError> {
        Ok(())
    }
    async fn set_tags(&self, _: &InstanceId, _: &Tags) -> Result<(), ProberError> {
        Ok(())
    }
}

/// The machine's runner: `run ... --id <id>` starts work, the list shows it.
#[derive(Debug, Default)]
struct Runner(Mutex<Vec<String>>);

#[wharf_prober::async_trait]
impl Executor for Runner {
    async fn execute(&self, cmd: &str, _: &[u8], _: Duration) -> Result<Output, ProberError> {
        let mut work = self.0.lock().unwrap();
        if let Some((_, id)) = cmd.split_once("run --detach - --id ") {
            work.push(id.trim_matches('\'').to_owned());
        }
        let listed = cmd.ends_with("alloc list --probe");
        Ok(Output::exited(0, if listed { work.join("\n") } else { String::new() }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = PoolConfig { probe_interval: Duration::from_millis(50), ..PoolConfig::default() };
    let runner = Arc::new(Runner::default());
    let executor = Arc::new(move |_: &Instance| runner.clone() as Arc<dyn Executor>);
    let pool = Pool::new(config, Arc::new(SystemClock::new()), Arc::new(OneMachine), executor)?;
    // The records live in memory here; a fleet that must not lose them uses `LedgerStore`
    // (a redb file) or `EtcdStore`.
    let store = Arc::new(MemoryStore::new());
    let me = Replica { name: "example".into(), address: "127.0.0.1:4646".into() };
    let term = store.campaign(&me).await?;
    let scheduler =
        Scheduler::take_over(pool.clone(), SchedulerConfig::default(), store, term).await?;
    tokio::spawn({
        let pool = pool.clone();
        async move { pool.run().await }
    });
    tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.run().await }
    });

    scheduler.submit(Submission::new("work-1", "{}")).await?;
    let mut changes = scheduler.subscribe();
    let placement = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let placement = scheduler.get("work-1").expect("submitted");
            if matches!(placement.phase, WorkPhase::Running { .. }) {
                return placement;
            }
            changes.changed().await.expect("the scheduler runs");
        }
    })
    .await?;
    println!("work-1 is {} on {:?}", placement.phase.name(), placement.phase.worker());
    Ok(())
}
