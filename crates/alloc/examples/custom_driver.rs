//! Your own driver under wharf's alloc runner, on the in-memory store: a prestart task and a
//! main task whose "processes" are timers, run in lifecycle order, with every event printed.
//!
//! `cargo run -p wharf-alloc --example custom_driver`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::{collections::HashMap, sync::Arc, sync::Mutex, time::Duration};
use wharf_alloc::driver::{
    Driver, DriverError, ExitResult, Signal, TaskConfig, TaskHandle, TaskId,
};
use wharf_alloc::state::{Allocation, ClientStatus, Job, JobType, LifecycleHook, Task, TaskGroup};
use wharf_alloc::{AllocRunner, AllocRunnerConfig, store::MemoryStore};

/// Tasks that last `config.millis` and exit 0.
#[derive(Debug, Default)]
struct Timers(Mutex<HashMap<TaskId, Duration>>);

#[wharf_alloc::async_trait]
impl Driver for Timers {
    fn name(&self) -> &str {
        "timer"
    }
    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        let millis = config.driver_config.get("millis").and_then(|m| m.as_u64());
        let lasts = millis.ok_or_else(|| DriverError::invalid_config("config.millis", "needed"))?;
        self.0.lock().unwrap().insert(config.id.clone(), Duration::from_millis(lasts));
        Ok(TaskHandle::new(self.name(), config))
    }
    async fn wait_task(&self, id: &TaskId) -> Result<ExitResult, DriverError> {
        let lasts = self.0.lock().unwrap().get(id).copied();
        tokio::time::sleep(lasts.ok_or_else(|| DriverError::not_found(id))?).await;
        Ok(ExitResult::code(0))
    }
    async fn stop_task(&self, id: &TaskId, _: Duration, _: Signal) -> Result<(), DriverError> {
        self.0.lock().unwrap().insert(id.clone(), Duration::ZERO);
        Ok(())
    }
    async fn destroy_task(&self, id: &TaskId, _force: bool) -> Result<(), DriverError> {
        self.0.lock().unwrap().remove(id);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let init = Task::new("init", "timer")
        .with_config("millis", 20)
        .with_lifecycle(LifecycleHook::Prestart, false);
    let main = Task::new("main", "timer").with_config("millis", 50);
    let job = Job::new("hello", JobType::Batch, TaskGroup::new("web", [init, main]));
    let (alloc, store) = (Allocation::new("a1", job, "web"), Arc::new(MemoryStore::new()));
    let dir = std::env::temp_dir().join(format!("wharf-example-{}", std::process::id()));
    let config = AllocRunnerConfig::new(alloc, store, dir).with_driver(Arc::new(Timers::default()));
    let runner = AllocRunner::new(config)?;
    let mut events = runner.events(); // every event from now on, in order
    runner.run().await;
    while let Ok(e) = events.try_recv() {
        println!("{} {:<5} {}: {}", e.event.time, e.task, e.event.kind.title(), e.event.kind);
    }
    let state = runner.state();
    println!("allocation {}: {}", state.client_status, state.client_description);
    assert_eq!(state.client_status, ClientStatus::Complete);
    runner.destroy().await; // removes its directory and its records
    Ok(())
}
