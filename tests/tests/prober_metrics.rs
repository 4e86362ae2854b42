//! The fleet's metrics (the pool's and the scheduler's, as `wharf fleet` serves them at
//! `/v1/metrics`) pass Prometheus' own linter, with every series present: workers in several
//! states, a boot outcome, a disappeared instance, work placed and refused. Needs promtool
//! (`apt-get install prometheus`); without it the test fails and says so.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::{FleetStore, MemoryStore, Replica, Scheduler, SchedulerConfig, Submission};
use wharf_prober::*;
use wharf_tests::promtool::check_metrics;

/// A cloud that lists what the test put there.
#[derive(Debug, Default)]
struct Listed(Mutex<Vec<Instance>>);

#[async_trait::async_trait]
impl InstanceSet for Listed {
    async fn create(&self, _: &InstanceType, _: &Tags, _: &str) -> Result<Instance, ProberError> {
        Err(ProberError::Quota { detail: "a fixed fleet".into() })
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(self.0.lock().clone())
    }
    async fn destroy(&self, _: &InstanceId) -> Result<(), ProberError> {
        Ok(())
    }
    async fn set_tags(&self, _: &InstanceId, _: &Tags) -> Result<(), ProberError> {
        Ok(())
    }
}

fn instance(id: &str) -> Instance {
    Instance {
        id: id.into(),
        address: Some("10.0.0.1:22".into()),
        remote_user: "root".into(),
        tags: Tags::new(),
        host_key: None,
        runner_args: String::new(),
    }
}

#[test]
fn the_fleets_metrics_pass_promtool() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let clock = Arc::new(FakeClock::new(Moment::from_origin(Duration::from_secs(1_000))));
    let cloud = Arc::new(Listed::default());
    for id in ["w-1", "w-2", "w-3"] {
        cloud.0.lock().push(instance(id));
    }
    let new_executor: NewExecutor = Arc::new(|instance: &Instance| {
        let script = ScriptedExecutor::new(&instance.id.0);
        script.exact("true", Reply::ok(""));
        // w-3 fails its run probe; the others run nothing.
        let list = if instance.id.0 == "w-3" { Reply::fail(1, "no") } else { Reply::ok("") };
        script.exact("wharf alloc list --probe", list);
        script.containing(" run --detach", Reply::fail(1, "refused"));
        Arc::new(script) as Arc<dyn Executor>
    });
    let config = PoolConfig {
        worker: WorkerConfig { boot_probe_command: "true".into(), ..WorkerConfig::default() },
        ..PoolConfig::default()
    };
    let pool = Pool::new(config, clock.clone(), cloud.clone(), new_executor).unwrap();
    let scheduler = runtime.block_on(async {
        let store = Arc::new(MemoryStore::new());
        let me = Replica { name: "test".into(), address: "127.0.0.1:1".into() };
        let term = store.campaign(&me).await.unwrap();
        Scheduler::take_over(pool.clone(), SchedulerConfig::default(), store, term).await.unwrap()
    });
    runtime.block_on(async {
        pool.sync().await.unwrap();
        for _ in 0..20 {
            clock.advance(Duration::from_secs(1));
            pool.probe_due().await;
        }
        scheduler.submit(Submission::new("work-1", "{}")).await.unwrap();
        scheduler.step().await;
        // w-2 vanishes from the list.
        cloud.0.lock().retain(|i| i.id.0 != "w-2");
        clock.advance(Duration::from_secs(1));
        pool.sync().await.unwrap();
    });
    let text = format!("{}{}", pool.metrics(), scheduler.metrics());
    assert!(text.contains("outcome=\"disappeared\""), "{text}");
    if let Err(problems) = check_metrics(&text) {
        panic!("{problems}\nin:\n{text}");
    }
}
