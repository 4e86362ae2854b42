//! Your own cloud and your own way of reaching machines under wharf's worker pool: an
//! in-memory `InstanceSet` and an `Executor` that plays a machine running wharf's runner. The
//! pool creates a worker, probes it until it is idle, starts work on it, and sees it run.
//!
//! `cargo run -p wharf-prober --example custom_cloud`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::{sync::Arc, sync::Mutex, time::Duration};
use wharf_prober::{Executor, Instance, InstanceId, InstanceSet, InstanceType, Output, Pool};
use wharf_prober::{PoolConfig, ProberError, State, SystemClock, Tags};

/// A cloud whose instances exist in memory.
#[derive(Debug, Default)]
struct Cloud(Mutex<Vec<Instance>>);

#[wharf_prober::async_trait]
impl InstanceSet for Cloud {
    async fn create(&self, _: &InstanceType, t: &Tags, _: &str) -> Result<Instance, ProberError> {
        let mut instances = self.0.lock().unwrap();
        let id = InstanceId(format!("vm-{}", instances.len() + 1));
        let instance = Instance::new(id, "127.0.0.1:22").with_tags(t.clone());
        instances.push(instance.clone());
        Ok(instance)
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(self.0.lock().unwrap().clone())
    }
    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError> {
        self.0.lock().unwrap().retain(|i| &i.id != id);
        Ok(())
    }
    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        for instance in self.0.lock().unwrap().iter_mut().filter(|i| &i.id == id) {
            instance.tags = tags.clone();
        }
        Ok(())
    }
}

/// A machine that runs wharf's runner: `run ... --id <id>` starts work, the list shows it.
#[derive(Debug, Default)]
struct Machine(Mutex<Vec<String>>);

#[wharf_prober::async_trait]
impl Executor for Machine {
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
async fn main() -> Result<(), ProberError> {
    let config = PoolConfig { probe_interval: Duration::from_millis(50), ..PoolConfig::default() };
    let executor = Arc::new(|_: &Instance| Arc::new(Machine::default()) as Arc<dyn Executor>);
    let pool =
        Pool::new(config, Arc::new(SystemClock::new()), Arc::new(Cloud::default()), executor)?;
    let running = pool.clone();
    tokio::spawn(async move { running.run().await });

    let id = pool.create("small")?.finished().await?; // booting, then idle once probed
    pool.wait_for_worker(&id, |w| w.state == State::Idle).await.expect("the worker is there");
    pool.start_runner(&id, "work-1", b"{}").await?;
    let worker = pool.wait_for_worker(&id, |w| w.running == ["work-1"]).await.expect("it runs");
    println!("{id} is {} with {:?}", worker.state, worker.running);
    Ok(())
}
