//! Pool behaviour on a fake clock, a fake cloud and scripted executors: creates and their
//! throttling, sync, the probe schedule and its concurrency bound, the fleet brake, operator
//! actions and metrics. One end-to-end case runs the loopback instance set with real local
//! processes.

use crate::executor::{Executor, Output};
use crate::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const BOOT: &str = "bootprobe";
const LIST: &str = "crunch-run --list";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// What the fake cloud answers to the next create.
#[derive(Debug, Clone)]
enum CreateReply {
    Ok,
    Quota,
    Capacity(CapacityScope),
    RateLimited(Duration),
}

#[derive(Debug, Default)]
struct CloudState {
    next: u64,
    live: Vec<Instance>,
    replies: Vec<CreateReply>,
    destroyed: Vec<InstanceId>,
    tag_writes: Vec<(InstanceId, Tags)>,
    init_commands: Vec<String>,
}

#[derive(Debug, Default)]
struct FakeCloud {
    state: Mutex<CloudState>,
    /// When set, a create waits here after the instance appears in the list.
    gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// Destroyed instances leave the list at once (else they stay, as a slow cloud's do).
    vanish_on_destroy: std::sync::atomic::AtomicBool,
}

impl FakeCloud {
    fn add_listed(&self, id: &str, tags: &[(&str, &str)]) {
        let tags = tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        self.state.lock().live.push(Instance {
            id: id.into(),
            address: Some("10.0.0.1:22".into()),
            remote_user: "root".into(),
            tags,
            host_key: None,
            runner_args: String::new(),
        });
    }

    fn remove_listed(&self, id: &str) {
        self.state.lock().live.retain(|i| i.id.0 != id);
    }
}

#[async_trait::async_trait]
impl InstanceSet for FakeCloud {
    async fn create(
        &self,
        instance_type: &InstanceType,
        tags: &Tags,
        init_command: &str,
    ) -> Result<Instance, ProberError> {
        let reply = {
            let mut state = self.state.lock();
            state.init_commands.push(init_command.to_owned());
            if state.replies.is_empty() { CreateReply::Ok } else { state.replies.remove(0) }
        };
        match reply {
            CreateReply::Ok => {}
            CreateReply::Quota => return Err(ProberError::Quota { detail: "quota".into() }),
            CreateReply::Capacity(scope) => {
                return Err(ProberError::Capacity {
                    scope,
                    detail: format!("no {}", instance_type.name),
                });
            }
            CreateReply::RateLimited(retry_after) => {
                return Err(ProberError::RateLimited { retry_after });
            }
        }
        let instance = {
            let mut state = self.state.lock();
            state.next += 1;
            let instance = Instance {
                id: InstanceId(format!("i-{}", state.next)),
                address: Some("10.0.0.2:22".into()),
                remote_user: "root".into(),
                tags: tags.clone(),
                host_key: None,
                runner_args: String::new(),
            };
            state.live.push(instance.clone());
            instance
        };
        let gate = self.gate.lock().clone();
        if let Some(gate) = gate {
            let _ = gate.acquire().await;
        }
        Ok(instance)
    }

    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(self.state.lock().live.clone())
    }

    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError> {
        let mut state = self.state.lock();
        state.destroyed.push(id.clone());
        if self.vanish_on_destroy.load(Ordering::Relaxed) {
            state.live.retain(|i| &i.id != id);
        }
        Ok(())
    }

    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        let mut state = self.state.lock();
        state.tag_writes.push((id.clone(), tags.clone()));
        if let Some(instance) = state.live.iter_mut().find(|i| &i.id == id) {
            instance.tags = tags.clone();
        }
        Ok(())
    }
}

struct Harness {
    clock: Arc<FakeClock>,
    cloud: Arc<FakeCloud>,
    pool: Pool,
    executors: Arc<Mutex<HashMap<String, ScriptedExecutor>>>,
    runtime: tokio::runtime::Runtime,
}

fn pool_config() -> PoolConfig {
    PoolConfig {
        worker: WorkerConfig {
            boot_probe_command: BOOT.into(),
            runner: RunnerConfig {
                command: "crunch-run".into(),
                list_args: "--list".into(),
                // crunch-run cannot say what a worker has.
                resources_args: None,
                ..RunnerConfig::default()
            },
            tag_prefix: "t-".into(),
            // Idle workers stay, so the tables see probing rather than idle shutdowns.
            timeouts: Timeouts { idle: secs(86_400), ..Timeouts::default() },
            ..WorkerConfig::default()
        },
        probe_interval: secs(10),
        max_instances: 10,
        max_concurrent_creates: 2,
        ..PoolConfig::default()
    }
}

fn harness_with(config: PoolConfig) -> Harness {
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(1_000))));
    let cloud = Arc::new(FakeCloud::default());
    let executors: Arc<Mutex<HashMap<String, ScriptedExecutor>>> = Arc::default();
    let made = executors.clone();
    let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
        let script = ScriptedExecutor::new(&instance.id.0);
        script.exact(BOOT, Reply::ok(""));
        script.exact(LIST, Reply::ok(""));
        made.lock().insert(instance.id.0.clone(), script.clone());
        Arc::new(script) as Arc<dyn Executor>
    });
    let pool = Pool::new(config, clock.clone(), cloud.clone(), new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    Harness { clock, cloud, pool, executors, runtime }
}

fn harness() -> Harness {
    harness_with(pool_config())
}

impl Harness {
    /// Creates an instance and waits for the cloud's answer.
    fn create(&self, instance_type: &str) -> Result<InstanceId, ProberError> {
        self.runtime.block_on(async { self.pool.create(instance_type)?.finished().await })
    }

    fn script(&self, id: &str) -> ScriptedExecutor {
        self.executors.lock().get(id).cloned().unwrap()
    }

    /// Advances the clock in one-second steps for `total`, probing what falls due.
    fn run_for(&self, total: Duration) -> usize {
        let mut probed = 0;
        for _ in 0..total.as_secs() {
            self.clock.advance(secs(1));
            probed += self.runtime.block_on(self.pool.probe_due());
        }
        probed
    }

    fn state_of(&self, id: &str) -> State {
        self.pool.workers().into_iter().find(|w| w.id.0 == id).map(|w| w.state).unwrap()
    }
}

#[test]
fn a_created_instance_boots_and_becomes_idle() {
    let h = harness();
    let mut changes = h.pool.subscribe();
    let id = h.create("small").unwrap();
    assert!(changes.has_changed().unwrap(), "a subscriber hears of the new worker");
    changes.mark_unchanged();
    assert_eq!(h.state_of(&id.0), State::Booting);
    let cloud = h.cloud.state.lock();
    let tags = &cloud.live[0].tags;
    assert_eq!(tags.get("t-InstanceType").map(String::as_str), Some("small"));
    assert_eq!(tags.get("t-IdleBehavior").map(String::as_str), Some("run"));
    let secret = tags.get("t-InstanceSecret").unwrap().clone();
    assert_eq!(secret.len(), 40);
    assert!(cloud.init_commands[0].contains(&secret), "the init command stores the secret");
    drop(cloud);
    h.run_for(secs(10));
    assert_eq!(h.state_of(&id.0), State::Idle);
    assert!(changes.has_changed().unwrap(), "and of it becoming idle");
    assert!(h.pool.metrics().contains("wharf_prober_boot_outcomes_total{outcome=\"success\"} 1"));
}

/// A created instance is probed as soon as its create returns, not at a tick up to an interval
/// later, and while it boots again after half its age (at least 250 ms): one that boots in half
/// a second is in service then, with a probe interval of 10 s. Once booted, the interval holds.
#[test]
fn a_created_instance_is_probed_at_once_and_often_while_it_boots() {
    let h = harness();
    let id = h.create("small").unwrap();
    let not_yet = Reply::fail(1, "not yet");
    h.script(&id.0).on(Match::Exact(BOOT.into()), [not_yet.clone(), not_yet, Reply::ok("")]);
    let probe_after = |wait: Duration| {
        h.clock.advance(wait);
        h.runtime.block_on(h.pool.probe_due())
    };
    let ms = Duration::from_millis;
    assert_eq!(probe_after(Duration::ZERO), 1, "probed without waiting");
    assert_eq!(h.state_of(&id.0), State::Booting);
    assert_eq!(probe_after(ms(249)), 0);
    assert_eq!(probe_after(ms(1)), 1, "again after the shortest wait");
    assert_eq!(probe_after(ms(250)), 1);
    assert_eq!(h.state_of(&id.0), State::Idle, "in service half a second after its create");
    let boot_probes =
        |h: &Harness| h.script(&id.0).calls().iter().filter(|call| call.command == BOOT).count();
    assert_eq!(boot_probes(&h), 3);
    // Booted: the last wait planned while booting, then one interval apart.
    assert_eq!(probe_after(ms(250)), 1);
    assert_eq!(probe_after(secs(9)), 0);
    assert_eq!(probe_after(ms(1_400)), 1, "an interval (with its jitter) later");
    assert_eq!(boot_probes(&h), 3, "no boot probe once booted");
}

/// The wait between probes of a booting worker grows with its age, so a slow boot (minutes)
/// costs a handful of probes more than at the interval alone, never more than one per
/// 250 ms, and never less than one per interval.
#[test]
fn a_booting_worker_is_probed_again_after_half_its_age_within_bounds() {
    let cases = [
        (Duration::ZERO, Duration::from_millis(250)),
        (Duration::from_millis(300), Duration::from_millis(250)),
        (secs(1), Duration::from_millis(500)),
        (secs(8), secs(4)),
        (secs(60), secs(10)),
    ];
    for (booting_for, wait) in cases {
        assert_eq!(
            crate::pool::reprobe_while_booting(booting_for, secs(10)),
            wait,
            "{booting_for:?}"
        );
    }
    assert_eq!(
        crate::pool::reprobe_while_booting(secs(1), Duration::from_millis(100)),
        Duration::from_millis(100),
        "an interval shorter than the shortest wait is the wait"
    );
}

struct CreateCase {
    name: &'static str,
    /// Cloud replies to the creates, in order.
    replies: Vec<CreateReply>,
    /// Creates attempted, with the type and whether each should succeed.
    creates: Vec<(&'static str, Result<(), &'static str>)>,
    /// Clock advance before the last create.
    wait_before_last: Duration,
}

#[test]
fn create_throttling_table() {
    let ok = Ok(());
    let cases = vec![
        CreateCase {
            name: "quota refusal with no instances holds creates for the TTL",
            replies: vec![CreateReply::Quota],
            creates: vec![("a", Err("instance quota reached")), ("a", Err("at quota"))],
            wait_before_last: secs(30),
        },
        CreateCase {
            name: "quota refusal expires after the TTL",
            replies: vec![CreateReply::Quota],
            creates: vec![("a", Err("instance quota reached")), ("a", ok)],
            wait_before_last: secs(61),
        },
        CreateCase {
            name: "quota refusal with instances holds until fewer exist",
            replies: vec![CreateReply::Ok, CreateReply::Ok, CreateReply::Quota],
            creates: vec![("a", ok), ("a", ok), ("a", Err("quota")), ("a", Err("at quota"))],
            wait_before_last: secs(3600),
        },
        CreateCase {
            name: "capacity refusal holds that type only",
            replies: vec![CreateReply::Capacity(CapacityScope::InstanceType)],
            creates: vec![("a", Err("no capacity")), ("b", ok), ("a", Err("at capacity"))],
            wait_before_last: secs(10),
        },
        CreateCase {
            name: "capacity refusal for every type holds all",
            replies: vec![CreateReply::Capacity(CapacityScope::AllTypes)],
            creates: vec![("a", Err("no capacity")), ("b", Err("at capacity"))],
            wait_before_last: secs(10),
        },
        CreateCase {
            name: "capacity hold expires",
            replies: vec![CreateReply::Capacity(CapacityScope::InstanceType)],
            creates: vec![("a", Err("no capacity")), ("a", ok)],
            wait_before_last: secs(61),
        },
        CreateCase {
            name: "rate limit holds creates until the cloud's retry time",
            replies: vec![CreateReply::RateLimited(secs(5))],
            creates: vec![("a", Err("rate limit")), ("a", Err("rate limited"))],
            wait_before_last: secs(4),
        },
        CreateCase {
            name: "rate limit passes",
            replies: vec![CreateReply::RateLimited(secs(5))],
            creates: vec![("a", Err("rate limit")), ("a", ok)],
            wait_before_last: secs(5),
        },
    ];
    for case in cases {
        let mut config = pool_config();
        config.max_instances = 2 + usize::from(case.name.contains("fewer"));
        let h = harness_with(config);
        h.cloud.state.lock().replies = case.replies.clone();
        let last = case.creates.len() - 1;
        for (i, (instance_type, want)) in case.creates.iter().enumerate() {
            if i == last {
                h.clock.advance(case.wait_before_last);
            }
            let got = h.create(instance_type);
            match (want, got) {
                (Ok(()), Ok(_)) => {}
                (Err(text), Err(e)) => {
                    assert!(e.to_string().contains(text), "{}: create {i}: {e}", case.name)
                }
                (want, got) => panic!("{}: create {i}: want {want:?}, got {got:?}", case.name),
            }
        }
    }
}

#[test]
fn a_hard_instance_limit_holds_creates() {
    let mut config = pool_config();
    config.max_instances = 1;
    let h = harness_with(config);
    h.create("a").unwrap();
    let err = h.create("a").unwrap_err();
    assert_eq!(err.to_string(), "not creating an instance of type \"a\": at max instances (1)");
    assert!(matches!(
        err,
        ProberError::CreateHeld { reason: HoldReason::MaxInstances { limit: 1 }, .. }
    ));
    assert!(h.pool.at_quota());
}

#[test]
fn quota_hold_clears_when_a_sync_sees_fewer_instances() {
    let h = harness();
    h.cloud.state.lock().replies = vec![CreateReply::Ok, CreateReply::Ok, CreateReply::Quota];
    for _ in 0..2 {
        h.create("a").unwrap();
    }
    assert!(h.create("a").is_err());
    assert!(h.pool.at_quota());
    h.cloud.remove_listed("i-1");
    h.clock.advance(secs(1));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert!(!h.pool.at_quota());
}

/// Lets the background creates run until the cloud has received `creates` of them in all.
async fn cloud_saw(cloud: &FakeCloud, creates: usize) {
    for _ in 0..10_000 {
        if cloud.state.lock().init_commands.len() >= creates {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the cloud never saw {creates} creates");
}

#[test]
fn creates_in_flight_are_bounded_and_a_listed_pending_create_is_booting() {
    let h = harness();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *h.cloud.gate.lock() = Some(gate.clone());
    h.runtime.block_on(async {
        let first = h.pool.create("a").unwrap();
        let second = h.pool.create("a").unwrap();
        // Two creates in flight: the third is held, and says why.
        let err = h.pool.create("a").unwrap_err();
        assert!(
            matches!(
                err,
                ProberError::CreateHeld { reason: HoldReason::CreatesInFlight { limit: 2 }, .. }
            ),
            "{err}"
        );
        cloud_saw(&h.cloud, 2).await;
        let pending: Vec<State> = h.pool.instances().iter().map(InstanceView::state).collect();
        assert_eq!(pending, [State::Booting, State::Booting]);
        assert!(h.pool.instances().iter().all(|i| i.id().is_none()), "no id yet");
        // A sync lists the pending instances: recognised by their secret, so booting, and
        // shown once each.
        h.pool.sync().await.unwrap();
        let states: Vec<State> = h.pool.workers().iter().map(|w| w.state).collect();
        assert_eq!(states, [State::Booting, State::Booting]);
        assert!(h.pool.instances().iter().all(|i| i.id().is_some()), "each shown once");
        gate.add_permits(2);
        first.finished().await.unwrap();
        second.finished().await.unwrap();
    });
    assert_eq!(h.pool.workers().len(), 2);
    assert_eq!(h.pool.instances().len(), 2);
}

#[test]
fn sync_adopts_disowns_and_retries_destroys() {
    let h = harness();
    h.cloud.add_listed("old-1", &[("t-IdleBehavior", "hold"), ("t-InstanceType", "big")]);
    h.cloud.add_listed("old-2", &[("t-IdleBehavior", "bogus")]);
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert!(h.pool.loaded());
    let views = h.pool.workers();
    assert_eq!(views[0].state, State::Unknown);
    assert_eq!(views[0].idle_behavior, IdleBehavior::Hold, "hold survives a restart");
    assert_eq!(views[0].instance_type, "big");
    assert_eq!(views[1].idle_behavior, IdleBehavior::Run, "an unreadable tag means run");

    // old-2 is killed; still listed after the shutdown timeout, it is destroyed again.
    h.runtime.block_on(h.pool.kill_instance(&"old-2".into(), "test")).unwrap();
    assert_eq!(h.cloud.state.lock().destroyed.len(), 1);
    h.clock.advance(secs(5));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert_eq!(h.cloud.state.lock().destroyed.len(), 1, "not before the shutdown timeout");
    h.clock.advance(secs(10));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert_eq!(h.cloud.state.lock().destroyed.len(), 2);

    // Gone from the list: dropped, counted as disappeared.
    h.cloud.remove_listed("old-2");
    h.clock.advance(secs(1));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert_eq!(h.pool.workers().len(), 1);
    let metrics = h.pool.metrics();
    assert!(
        metrics.contains("wharf_prober_instances_disappeared_total{state=\"shutdown\"} 1"),
        "{metrics}"
    );
}

#[test]
fn every_worker_is_probed_at_its_interval() {
    let h = harness();
    for i in 0..200 {
        h.cloud.add_listed(&format!("w-{i:03}"), &[]);
    }
    h.runtime.block_on(h.pool.sync()).unwrap();
    let probed = h.run_for(secs(100));
    // 200 workers every 10 s for 100 s: 10 probes each, give or take one at the edges.
    assert!((1_800..=2_200).contains(&probed), "{probed} probes");
    for (id, script) in h.executors.lock().iter() {
        let n = script.call_count();
        // Unknown workers get the boot probe too on their first round.
        assert!((9..=12).contains(&n), "{id} was probed {n} times");
    }
    assert_eq!(h.pool.count_workers().get(&State::Idle), Some(&200));
    let metrics = h.pool.metrics();
    assert!(metrics.contains("wharf_prober_probe_age_seconds_max "), "{metrics}");
}

#[derive(Debug)]
struct Counting {
    in_flight: AtomicUsize,
    most: AtomicUsize,
}

#[async_trait::async_trait]
impl Executor for Counting {
    async fn execute(
        &self,
        _command: &str,
        _stdin: &[u8],
        _deadline: Duration,
    ) -> Result<Output, ProberError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(Output { stdout: Vec::new(), stderr: Vec::new(), status: Some(0) })
    }
}

#[test]
fn concurrent_probes_are_bounded() {
    let counting = Arc::new(Counting { in_flight: AtomicUsize::new(0), most: AtomicUsize::new(0) });
    let shared = counting.clone();
    let mut config = pool_config();
    config.max_concurrent_probes = 3;
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(1_000))));
    let cloud = Arc::new(FakeCloud::default());
    for i in 0..50 {
        cloud.add_listed(&format!("w-{i}"), &[]);
    }
    let new_executor: NewExecutor =
        Arc::new(move |_: &Instance| shared.clone() as Arc<dyn Executor>);
    let pool = Pool::new(config, clock.clone(), cloud, new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    runtime.block_on(pool.sync()).unwrap();
    clock.advance(secs(10));
    assert_eq!(runtime.block_on(pool.probe_due()), 50);
    assert_eq!(counting.most.load(Ordering::SeqCst), 3);
}

fn fleet(h: &Harness, n: usize) {
    for i in 0..n {
        h.cloud.add_listed(&format!("w-{i}"), &[]);
    }
    h.runtime.block_on(h.pool.sync()).unwrap();
    h.run_for(secs(10));
    assert_eq!(h.pool.count_workers().get(&State::Idle), Some(&n));
}

#[test]
fn the_fleet_brake_holds_shutdowns_during_an_outage() {
    let h = harness();
    fleet(&h, 10);
    for script in h.executors.lock().values() {
        script.exact(LIST, Reply::Unreachable);
    }
    h.run_for(secs(15 * 60));
    assert!(h.pool.brake().engaged());
    assert!(h.pool.brake().reason().contains("10 of 10 booted workers fail"));
    assert!(h.cloud.state.lock().destroyed.is_empty(), "no worker destroyed");
    assert!(h.pool.metrics().contains("wharf_prober_fleet_brake_engaged 1"));
    // The network comes back: the brake releases and nothing was lost.
    for script in h.executors.lock().values() {
        script.exact(LIST, Reply::ok(""));
    }
    h.run_for(secs(20));
    assert!(!h.pool.brake().engaged());
    assert_eq!(h.pool.count_workers().get(&State::Idle), Some(&10));
}

#[test]
fn without_an_outage_a_lone_broken_worker_is_destroyed() {
    let h = harness();
    fleet(&h, 10);
    h.script("w-3").exact(LIST, Reply::Timeout);
    h.run_for(secs(11 * 60));
    assert!(!h.pool.brake().engaged());
    assert_eq!(h.cloud.state.lock().destroyed, [InstanceId::from("w-3")]);
}

#[test]
fn workers_whose_probes_hang_count_as_failing_for_the_brake() {
    // An outage in which 9 of 10 hosts freeze: their probes hang, in flight, and say nothing
    // until the pool's bound abandons them minutes later. The tenth fails its probes at once.
    // Counting only failed probes, the brake would see one broken worker and shut it down.
    let h = harness();
    fleet(&h, 10);
    for i in 1..10 {
        h.script(&format!("w-{i}")).exact(LIST, Reply::Hang);
    }
    h.script("w-0").exact(LIST, Reply::Unreachable);
    let probed_before = h.script("w-0").call_count();
    // Probes are spawned as the real-time loop spawns them, so the hanging ones stay in
    // flight while the clock moves; each step lets the ones that can finish do so.
    for _ in 0..11 * 60 {
        h.clock.advance(secs(1));
        h.runtime.block_on(async {
            h.pool.spawn_due();
            for _ in 0..64 {
                tokio::task::yield_now().await;
            }
        });
    }
    // The tenth was probed all along (about once per 10 s interval), and failed each time.
    let probes = h.script("w-0").call_count() - probed_before;
    assert!(probes >= 60, "w-0 was probed {probes} times");
    assert!(h.pool.brake().engaged());
    let reason = h.pool.brake().reason();
    assert!(reason.contains("10 of 10 booted workers fail"), "{reason}");
    assert!(h.cloud.state.lock().destroyed.is_empty(), "no worker destroyed");
    assert_ne!(h.state_of("w-0"), State::Shutdown);
}

#[test]
fn operator_actions() {
    let h = harness();
    fleet(&h, 3);
    let block = |f: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), ProberError>> + '_>,
    >| { h.runtime.block_on(f).map_err(|e| e.to_string()) };
    assert_eq!(
        block(Box::pin(h.pool.set_idle_behavior(&"w-0".into(), IdleBehavior::Hold))),
        Ok(())
    );
    assert_eq!(
        block(Box::pin(h.pool.shutdown(&"w-0".into()))),
        Err("worker w-0 cannot shut down: its idle behavior is hold".into())
    );
    assert_eq!(
        block(Box::pin(h.pool.set_idle_behavior(&"w-1".into(), IdleBehavior::Drain))),
        Ok(())
    );
    assert_eq!(h.state_of("w-1"), State::Shutdown, "an idle worker drains at once");
    assert_eq!(block(Box::pin(h.pool.shutdown(&"w-2".into()))), Ok(()));
    assert_eq!(
        block(Box::pin(h.pool.kill_instance(&"nope".into(), "x"))),
        Err("no worker \"nope\"".into())
    );
    let cloud = h.cloud.state.lock();
    assert_eq!(cloud.destroyed, [InstanceId::from("w-1"), InstanceId::from("w-2")]);
    let drained = cloud.tag_writes.iter().find(|(id, _)| id.0 == "w-1").unwrap();
    assert_eq!(drained.1.get("t-IdleBehavior").map(String::as_str), Some("drain"));
}

#[test]
fn runners_start_and_are_killed_through_the_pool() {
    let h = harness();
    fleet(&h, 1);
    let script = h.script("w-0");
    script.containing(" run --detach - --id ", Reply::ok(""));
    script.containing(" alloc stop --exact --wait 1s ", Reply::ok(""));
    let id = InstanceId::from("w-0");
    h.runtime.block_on(h.pool.start_runner(&id, "zzzzz-1", b"{}")).unwrap();
    assert_eq!(h.state_of("w-0"), State::Running);
    assert!(h.runtime.block_on(h.pool.kill_runner("zzzzz-1", "cancelled")));
    assert!(!h.runtime.block_on(h.pool.kill_runner("zzzzz-9", "cancelled")));
    assert_eq!(h.state_of("w-0"), State::Idle);
    assert!(h.pool.exited().contains_key("zzzzz-1"));
    h.pool.forget_runner("zzzzz-1");
    assert!(h.pool.exited().is_empty());
}

#[test]
fn metrics_use_the_reference_names() {
    let h = harness();
    fleet(&h, 2);
    let metrics = h.pool.metrics();
    for line in [
        "wharf_prober_instances{category=\"idle\"} 2",
        "wharf_prober_workers{state=\"idle\"} 2",
        "wharf_prober_boot_outcomes_total{outcome=\"success\"} 2",
        "wharf_prober_boot_outcomes_total{outcome=\"failure\"} 0",
        "wharf_prober_instances_run_probe_duration_seconds_count{outcome=\"success\"} 2",
        "wharf_prober_probe_age_seconds_median ",
        "wharf_prober_runners_running 0",
        "wharf_prober_fleet_brake_engaged 0",
        "wharf_prober_probes_total{result=\"passed\"} 2",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
}

#[test]
fn bad_pool_configuration_is_refused() {
    type Change = fn(&mut PoolConfig);
    let cases: Vec<(Change, &str)> = vec![
        (|c| c.probe_interval = Duration::ZERO, "probe_interval: must be more than zero"),
        (|c| c.sync_interval = Duration::ZERO, "sync_interval: must be more than zero"),
        (
            |c| c.brake.max_failing_share = 1.5,
            "brake.max_failing_share: 1.5 is not between 0 and 1",
        ),
        (
            |c| c.worker.runner.directory = "relative".into(),
            "runner.directory: \"relative\" is not an absolute path",
        ),
        (
            |c| c.worker.command_deadline = Duration::ZERO,
            "command_deadline: must be more than zero",
        ),
    ];
    for (change, want) in cases {
        let mut config = pool_config();
        change(&mut config);
        let new_executor: NewExecutor =
            Arc::new(|i: &Instance| Arc::new(ScriptedExecutor::new(&i.id.0)) as Arc<dyn Executor>);
        let err = Pool::new(
            config,
            Arc::new(FakeClock::default()),
            Arc::new(FakeCloud::default()),
            new_executor,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), format!("invalid prober configuration: {want}"));
    }
}

#[test]
fn loopback_instances_boot_deploy_and_run_end_to_end() {
    let root = tempfile::tempdir().unwrap();
    let runner_dir = root.path().join("runners");
    let instances = root.path().join("instances");
    // The runner lists the ids in the `work` file of the instance's directory.
    let binary = b"#!/bin/sh\n[ \"$1\" = --list ] && cat \"$WHARF_INSTANCE_DIR/work\"\n".to_vec();
    let config = PoolConfig {
        worker: WorkerConfig {
            boot_probe_command: "test -f \"$WHARF_INSTANCE_DIR/booted\"".into(),
            runner: RunnerConfig {
                binary: Some(binary.into()),
                directory: runner_dir.display().to_string(),
                list_args: "--list".into(),
                resources_args: None,
                ..RunnerConfig::default()
            },
            ..WorkerConfig::default()
        },
        init_command: "touch booted work".into(),
        secret_path: "secret".into(),
        ..PoolConfig::default()
    };
    let set = Arc::new(LoopbackInstanceSet::new(LoopbackConfig {
        root: instances.clone(),
        max_instances: 2,
        address: None,
        host_key: None,
        remote_user: "root".into(),
        init_deadline: secs(20),
        destroy_command: "rm work".into(),
    }));
    let for_executor = set.clone();
    let new_executor: NewExecutor = Arc::new(move |i: &Instance| for_executor.local_executor(i));
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(1))));
    let pool = Pool::new(config, clock.clone(), set.clone(), new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let create = |pool: &Pool| runtime.block_on(async { pool.create("local")?.finished().await });
    let id = create(&pool).unwrap();
    let dir = set.dir(&id);
    assert_eq!(std::fs::read_to_string(dir.join("secret")).unwrap().len(), 40);
    std::fs::write(dir.join("work"), "wharf-1\n").unwrap();
    clock.advance(secs(10));
    runtime.block_on(pool.probe_due());
    let view = &pool.workers()[0];
    assert_eq!(view.state, State::Running, "{view:?}");
    assert_eq!(view.running, ["wharf-1"]);
    assert_eq!(std::fs::read_dir(&runner_dir).unwrap().count(), 1, "one deployed binary");
    // Quota of the loopback set.
    let second = create(&pool).unwrap();
    let err = create(&pool).unwrap_err();
    assert!(matches!(err, ProberError::Quota { .. } | ProberError::CreateHeld { .. }), "{err}");
    // Destroying runs the destroy command first; one that fails keeps the instance (and its
    // directory) for the next attempt.
    std::fs::remove_file(set.dir(&second).join("work")).unwrap();
    runtime.block_on(pool.kill_instance(&second, "test")).unwrap();
    assert!(set.dir(&second).exists());
    assert_eq!(runtime.block_on(set.list()).unwrap().len(), 2);
    runtime.block_on(pool.kill_instance(&id, "test")).unwrap();
    assert!(!dir.exists());
    assert_eq!(runtime.block_on(set.list()).unwrap().len(), 1);
}

#[test]
fn idle_workers_are_shut_down_on_their_schedule_unless_held() {
    let mut config = pool_config();
    config.worker.timeouts.idle = secs(60);
    let h = harness_with(config);
    h.cloud.add_listed("w-run", &[]);
    h.cloud.add_listed("w-hold", &[("t-IdleBehavior", "hold")]);
    h.runtime.block_on(h.pool.sync()).unwrap();
    h.run_for(secs(50));
    assert_eq!(h.state_of("w-run"), State::Idle);
    h.run_for(secs(30));
    assert_eq!(h.state_of("w-run"), State::Shutdown);
    assert_eq!(h.state_of("w-hold"), State::Idle);
    assert_eq!(h.cloud.state.lock().destroyed, [InstanceId::from("w-run")]);
    assert!(h.pool.metrics().contains("wharf_prober_boot_outcomes_total{outcome=\"success\"} 2"));
}

/// A cloud and an executor that never answer.
#[derive(Debug)]
struct Silent;

#[async_trait::async_trait]
impl InstanceSet for Silent {
    async fn create(&self, _: &InstanceType, _: &Tags, _: &str) -> Result<Instance, ProberError> {
        std::future::pending().await
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        std::future::pending().await
    }
    async fn destroy(&self, _: &InstanceId) -> Result<(), ProberError> {
        std::future::pending().await
    }
    async fn set_tags(&self, _: &InstanceId, _: &Tags) -> Result<(), ProberError> {
        std::future::pending().await
    }
}

#[async_trait::async_trait]
impl Executor for Silent {
    async fn execute(&self, _: &str, _: &[u8], _: Duration) -> Result<Output, ProberError> {
        std::future::pending().await
    }
}

#[test]
fn a_silent_cloud_or_executor_cannot_hang_the_pool() {
    let mut config = pool_config();
    config.cloud_deadline = Duration::from_millis(50);
    config.worker.command_deadline = Duration::from_millis(20);
    config.worker.deploy_deadline = Duration::from_millis(20);
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(1_000))));
    let new_executor: NewExecutor = Arc::new(|_: &Instance| Arc::new(Silent) as Arc<dyn Executor>);
    let pool = Pool::new(config.clone(), clock.clone(), Arc::new(Silent), new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let err = runtime.block_on(pool.sync()).unwrap_err();
    assert_eq!(err.to_string(), "list call on worker cloud did not finish within 50ms");
    let err = runtime.block_on(async { pool.create("a")?.finished().await }).unwrap_err();
    assert!(matches!(err, ProberError::Timeout { .. }), "{err}");

    // An executor that ignores its deadlines: the probe is abandoned at the pool's bound.
    let cloud = Arc::new(FakeCloud::default());
    cloud.add_listed("w-0", &[]);
    let new_executor: NewExecutor = Arc::new(|_: &Instance| Arc::new(Silent) as Arc<dyn Executor>);
    let pool = Pool::new(config, clock.clone(), cloud, new_executor).unwrap();
    runtime.block_on(pool.sync()).unwrap();
    clock.advance(secs(10));
    assert_eq!(runtime.block_on(pool.probe_due()), 1);
    assert!(pool.metrics().contains("wharf_prober_probes_total{result=\"failed\"} 1"));
    assert!(!pool.workers()[0].state.eq(&State::Shutdown));
}

#[test]
fn instances_of_a_type_out_of_service_are_drained_unless_held() {
    let mut config = pool_config();
    config.instance_types = vec![InstanceType::new("small")];
    let h = harness_with(config);
    h.cloud.add_listed("w-small", &[("t-InstanceType", "small")]);
    h.cloud.add_listed("w-gone", &[("t-InstanceType", "retired")]);
    h.cloud.add_listed("w-held", &[("t-InstanceType", "retired"), ("t-IdleBehavior", "hold")]);
    h.runtime.block_on(h.pool.sync()).unwrap();
    let behaviors: Vec<(String, IdleBehavior)> =
        h.pool.workers().into_iter().map(|w| (w.id.0, w.idle_behavior)).collect();
    assert_eq!(
        behaviors,
        [
            ("w-gone".to_owned(), IdleBehavior::Drain),
            ("w-held".to_owned(), IdleBehavior::Hold),
            ("w-small".to_owned(), IdleBehavior::Run),
        ]
    );
    // The next sync saves the drain in its tag; it is shut down the round after its probe
    // shows it idle.
    h.clock.advance(secs(1));
    h.runtime.block_on(h.pool.sync()).unwrap();
    h.run_for(secs(20));
    assert_eq!(h.state_of("w-gone"), State::Shutdown);
    let cloud = h.cloud.state.lock();
    assert_eq!(cloud.destroyed, [InstanceId::from("w-gone")]);
    let tags = cloud.tag_writes.iter().find(|(id, _)| id.0 == "w-gone").map(|(_, t)| t.clone());
    assert_eq!(tags.unwrap().get("t-IdleBehavior").map(String::as_str), Some("drain"));
}

/// Arvados' `TestNodeCreateThrottle`: with `max_concurrent_creates` creates in flight the next
/// one is held (and says why); a limit of 0 is no limit, as `MaxConcurrentInstanceCreateOps: 0`
/// and `MaxInstances: 0` are in Arvados' configuration. The probe bound takes 0 the same way.
#[test]
fn node_create_throttle() {
    // (max_concurrent_creates, creates that start before one is held)
    for (limit, started) in [(1, 1), (2, 2), (0, 5)] {
        let mut config = pool_config();
        config.max_concurrent_creates = limit;
        config.max_instances = 0;
        config.max_concurrent_probes = 0;
        let h = harness_with(config);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *h.cloud.gate.lock() = Some(gate.clone());
        h.runtime.block_on(async {
            let mut creates = Vec::new();
            for _ in 0..started {
                creates.push(h.pool.create("a").unwrap());
            }
            assert_eq!(h.pool.instances().len(), started, "limit {limit}");
            if limit > 0 {
                let err = h.pool.create("a").unwrap_err();
                assert!(
                    matches!(
                        err,
                        ProberError::CreateHeld {
                            reason: HoldReason::CreatesInFlight { limit: l }, ..
                        } if l == limit
                    ),
                    "limit {limit}: {err}"
                );
            }
            cloud_saw(&h.cloud, started).await;
            assert!(!h.pool.at_quota());
            gate.add_permits(started);
            for create in creates {
                create.finished().await.unwrap();
            }
        });
        h.run_for(secs(10));
        assert_eq!(h.pool.count_workers().get(&State::Idle), Some(&started), "limit {limit}");
    }
}

/// The type rule ("not in `instance_types`, so drain") is for instances an earlier prober
/// left; what this pool creates runs, whether its create returned first or a list showed it.
#[test]
fn instances_this_pool_created_are_not_drained_for_their_type() {
    let mut config = pool_config();
    config.instance_types = vec![InstanceType::new("small")];
    let h = harness_with(config);
    let id = h.create("big").unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *h.cloud.gate.lock() = Some(gate.clone());
    h.runtime.block_on(async {
        let second = h.pool.create("big").unwrap();
        cloud_saw(&h.cloud, 2).await;
        h.pool.sync().await.unwrap();
        gate.add_permits(1);
        second.finished().await.unwrap();
    });
    let views = h.pool.workers();
    assert_eq!(views.len(), 2);
    for view in views {
        assert_eq!(view.idle_behavior, IdleBehavior::Run, "{} was created here", view.id);
    }
    h.run_for(secs(10));
    assert_eq!(h.state_of(&id.0), State::Idle);
}

/// As Arvados' sync: a shut-down instance still listed is destroyed again only once more than
/// `timeouts.shutdown` has passed, and an instance is gone once a list that began at or
/// after its last change does not show it.
#[test]
fn sync_boundaries_are_strict() {
    let h = harness();
    h.cloud.add_listed("w-1", &[]);
    h.runtime.block_on(h.pool.sync()).unwrap();
    h.runtime.block_on(h.pool.kill_instance(&"w-1".into(), "test")).unwrap();
    h.clock.advance(secs(10));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert_eq!(h.cloud.state.lock().destroyed.len(), 1, "not at exactly the timeout");
    h.clock.advance(Duration::from_millis(1));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert_eq!(h.cloud.state.lock().destroyed.len(), 2, "after it");

    // Listed by one sync, missing from the next one at the same instant: gone.
    h.cloud.add_listed("w-2", &[]);
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert!(h.pool.workers().iter().any(|w| w.id.0 == "w-2"));
    h.cloud.remove_listed("w-2");
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert!(h.pool.workers().iter().all(|w| w.id.0 != "w-2"));
}

fn of_type<'a>(views: &'a [InstanceView], instance_type: &str) -> Vec<&'a InstanceView> {
    views.iter().filter(|v| v.instance_type() == instance_type).collect()
}

use crate::capacity::typed;

/// Arvados' `TestCreateUnallocShutdown`: creates show in `instances()` before the cloud
/// answers; the init command stores the secret, then runs the configured one; hold refuses a
/// shutdown; booting workers shut down on request and leave with the list; run puts a held
/// worker back, and drain shuts it down at once. Subscribers hear of each.
#[test]
fn create_unalloc_shutdown() {
    let mut config = pool_config();
    config.instance_types = vec![
        typed("a1s", "a1.small", false, "a"),
        typed("a2m", "a2.medium", false, "a"),
        typed("a2l", "a2.large", false, "a"),
    ];
    config.max_concurrent_creates = 0;
    config.init_command = "echo 'instance init command goes here'".into();
    let h = harness_with(config);
    h.cloud.vanish_on_destroy.store(true, Ordering::Relaxed);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *h.cloud.gate.lock() = Some(gate.clone());
    let mut notify = h.pool.subscribe();
    let mut notify2 = h.pool.subscribe();
    let count = |t: &str| of_type(&h.pool.instances(), t).len();
    assert!(h.pool.instances().is_empty());
    h.runtime.block_on(async {
        for t in ["a2m", "a1s", "a2m", "a2l"] {
            h.pool.create(t).unwrap();
        }
        // Shown before the cloud answers.
        assert_eq!((count("a1s"), count("a2m"), count("a2l")), (1, 2, 1));
        cloud_saw(&h.cloud, 4).await;
        gate.add_permits(4);
        for _ in 0..1_000 {
            if h.pool.workers().len() == 4 {
                break;
            }
            tokio::time::timeout(Duration::from_secs(5), notify.changed()).await.unwrap().unwrap();
        }
    });
    assert_eq!(h.pool.workers().len(), 4);
    let init = h.cloud.state.lock().init_commands[0].clone();
    let secret = init
        .strip_prefix("umask 0177 && printf %s ")
        .and_then(|rest| {
            rest.strip_suffix(
                " >/var/run/wharf-instance-secret && echo 'instance init command goes here'",
            )
        })
        .unwrap_or_else(|| panic!("{init}"));
    assert!(secret.len() == 40 && secret.bytes().all(|b| b.is_ascii_hexdigit()), "{init}");

    // Admin hold: a shutdown is refused, and instances() says hold.
    let held = of_type(&h.pool.instances(), "a2l")[0].id().unwrap().clone();
    h.runtime.block_on(h.pool.set_idle_behavior(&held, IdleBehavior::Hold)).unwrap();
    let refused = h.runtime.block_on(h.pool.shutdown(&held)).unwrap_err();
    assert!(matches!(refused, ProberError::NotAllowed { .. }), "{refused}");
    assert_eq!(of_type(&h.pool.instances(), "a2l")[0].idle_behavior(), IdleBehavior::Hold);

    // Both a2m workers, then the a1s one: shut down, gone at the next sync.
    for (n, t) in [(1, "a2m"), (0, "a2m"), (0, "a1s")] {
        let id = of_type(&h.pool.instances(), t)[0].id().unwrap().clone();
        notify2.mark_unchanged();
        h.runtime.block_on(h.pool.shutdown(&id)).unwrap();
        assert!(notify2.has_changed().unwrap(), "subscribers hear of the shutdown");
        h.clock.advance(secs(1));
        h.runtime.block_on(h.pool.sync()).unwrap();
        assert_eq!(count(t), n);
    }
    assert_eq!(count("a1s"), 0);

    // Back in service, then drained: shut down at once (it is not busy).
    h.runtime.block_on(h.pool.set_idle_behavior(&held, IdleBehavior::Run)).unwrap();
    assert_eq!(of_type(&h.pool.instances(), "a2l")[0].idle_behavior(), IdleBehavior::Run);
    h.runtime.block_on(h.pool.set_idle_behavior(&held, IdleBehavior::Drain)).unwrap();
    assert_eq!(of_type(&h.pool.instances(), "a2l")[0].state(), State::Shutdown);
    h.clock.advance(secs(1));
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert!(h.pool.instances().is_empty());
}

/// Arvados' `TestInstanceQuotaGroup`: a capacity refusal scoped to a quota group holds every
/// type of the group (not its preemptible group); one scoped to a type holds that provider
/// type of that kind (preemptible) only.
#[test]
fn instance_quota_group() {
    let mut config = pool_config();
    config.instance_types = vec![
        typed("A1", "a1", false, "a"),
        typed("A1p", "a1", true, "a-p"),
        typed("A2", "a2", false, "a"),
        typed("B3", "b3", false, "b"),
        typed("B3p", "b3", true, "b-p"),
        typed("B4", "b4", false, "b"),
        typed("B4p", "b4", true, "b-p"),
    ];
    let h = harness_with(config);
    h.cloud.state.lock().replies = vec![
        CreateReply::Capacity(CapacityScope::QuotaGroup),
        CreateReply::Capacity(CapacityScope::InstanceType),
    ];
    let err = h.create("A1").unwrap_err();
    assert!(matches!(err, ProberError::Capacity { scope: CapacityScope::QuotaGroup, .. }));
    assert!(h.pool.at_capacity("A1"));
    let err = h.create("B4p").unwrap_err();
    assert!(matches!(err, ProberError::Capacity { scope: CapacityScope::InstanceType, .. }));
    assert!(h.pool.at_capacity("B4p"));
    for (t, held) in [
        ("A1", true),
        ("A1p", false),
        ("A2", true),
        ("B3", false),
        ("B3p", false),
        ("B4", false),
        ("B4p", true),
    ] {
        assert_eq!(h.pool.at_capacity(t), held, "{t}");
    }
    for (t, created) in [
        ("A2", false),
        ("B3", true),
        ("B3p", true),
        ("B4", true),
        ("B4p", false),
        ("A2", false),
        ("A1", false),
        ("A1p", true),
    ] {
        let got = h.create(t);
        assert_eq!(got.is_ok(), created, "{t}: {got:?}");
        if let Err(e) = got {
            assert!(
                matches!(e, ProberError::CreateHeld { reason: HoldReason::Capacity { .. }, .. }),
                "{t}: {e}"
            );
        }
    }
}

/// Arvados' `TestResumeAfterRestart`: a new pool on the same cloud finds the instances of the
/// one before it; a worker put on hold stays on hold, and one whose type was removed from the
/// configuration is drained.
#[test]
fn resume_after_restart() {
    let mut config = pool_config();
    config.instance_types =
        ["type1", "type2", "type3", "type4"].iter().map(|t| InstanceType::new(t)).collect();
    config.max_concurrent_creates = 0;
    let h = harness_with(config.clone());
    for t in ["type1", "type1", "type2", "type4"] {
        h.create(t).unwrap();
    }
    h.run_for(secs(10));
    let views = h.pool.instances();
    assert!(views.iter().all(|v| v.state() == State::Idle), "{views:?}");
    let held = of_type(&views, "type2")[0].id().unwrap().clone();
    h.runtime.block_on(h.pool.set_idle_behavior(&held, IdleBehavior::Hold)).unwrap();
    let saved = h.cloud.state.lock().live.iter().find(|i| i.id == held).unwrap().tags.clone();
    assert_eq!(saved.get("t-IdleBehavior").map(String::as_str), Some("hold"));
    h.pool.stop();

    // A new pool, with type4 gone from the configuration.
    config.instance_types.retain(|t| t.name != "type4");
    let executors = h.executors.clone();
    let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
        let script = ScriptedExecutor::new(&instance.id.0);
        script.exact(BOOT, Reply::ok(""));
        script.exact(LIST, Reply::ok(""));
        executors.lock().insert(instance.id.0.clone(), script.clone());
        Arc::new(script) as Arc<dyn Executor>
    });
    let pool2 = Pool::new(config, h.clock.clone(), h.cloud.clone(), new_executor).unwrap();
    h.runtime.block_on(pool2.sync()).unwrap();
    for _ in 0..10 {
        h.clock.advance(secs(1));
        h.runtime.block_on(pool2.probe_due());
    }
    let views = pool2.instances();
    assert_eq!(views.len(), 4, "{views:?}");
    for view in &views {
        let want = match view.instance_type() {
            "type2" => IdleBehavior::Hold,
            "type4" => IdleBehavior::Drain,
            _ => IdleBehavior::Run,
        };
        assert_eq!(view.idle_behavior(), want, "{view:?}");
    }
    assert_eq!(of_type(&views, "type2")[0].id(), Some(&held));
}

/// Arvados' `TestDrain`: only a worker whose idle behaviour is run takes work.
#[test]
fn drain() {
    let h = harness();
    fleet(&h, 3);
    for (id, behavior, started) in [
        ("w-0", IdleBehavior::Hold, false),
        ("w-1", IdleBehavior::Drain, false),
        ("w-2", IdleBehavior::Run, true),
    ] {
        let id = InstanceId::from(id);
        h.script(&id.0).containing(" run --detach - --id ", Reply::ok(""));
        h.runtime.block_on(h.pool.set_idle_behavior(&id, behavior)).unwrap();
        let result = h.runtime.block_on(h.pool.start_runner(&id, "testcontainer", b"{}"));
        assert_eq!(result.is_ok(), started, "{behavior}: {result:?}");
        if let Err(e) = result {
            assert!(matches!(e, ProberError::NotAllowed { .. }), "{e}");
        }
    }
}

/// Arvados' `TestRateLimitError`, through the pool: when a rate-limit, quota or capacity hold
/// ends, subscribers hear at once (at the pool's next step), not at the next sync.
#[test]
fn hold_offs_wake_subscribers_when_they_end() {
    // (the cloud's refusal, how long it holds creates)
    let cases = [
        (CreateReply::RateLimited(secs(5)), secs(5)),
        (CreateReply::Quota, secs(60)),
        (CreateReply::Capacity(CapacityScope::InstanceType), secs(60)),
    ];
    for (reply, hold) in cases {
        let h = harness();
        h.cloud.state.lock().replies = vec![reply.clone()];
        let mut changes = h.pool.subscribe();
        h.create("a").unwrap_err();
        assert!(h.create("a").is_err(), "{reply:?} holds");
        changes.mark_unchanged();
        h.clock.advance(hold - Duration::from_millis(1));
        h.runtime.block_on(h.pool.probe_due());
        assert!(!changes.has_changed().unwrap(), "{reply:?}: still held");
        h.clock.advance(Duration::from_millis(1));
        h.runtime.block_on(h.pool.probe_due());
        assert!(changes.has_changed().unwrap(), "{reply:?}: subscribers hear the hold ended");
        h.create("a").unwrap();
    }
}

/// The same on real time, with the pool's own loop: the subscriber hears when a 300 ms rate
/// limit ends, long before the next sync (a minute away).
#[test]
fn a_rate_limit_wakes_subscribers_on_real_time() {
    let cloud = Arc::new(FakeCloud::default());
    cloud.state.lock().replies = vec![CreateReply::RateLimited(Duration::from_millis(300))];
    let new_executor: NewExecutor =
        Arc::new(|i: &Instance| Arc::new(ScriptedExecutor::new(&i.id.0)) as Arc<dyn Executor>);
    let config = PoolConfig { sync_interval: secs(60), ..pool_config() };
    let pool = Pool::new(config, Arc::new(SystemClock::new()), cloud, new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let running = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run().await }
        });
        let mut changes = pool.subscribe();
        let err = pool.create("a").unwrap().finished().await.unwrap_err();
        assert!(matches!(err, ProberError::RateLimited { .. }), "{err}");
        changes.borrow_and_update();
        // Each word from the pool is a chance to create again; the hold ends in 300 ms, and
        // without word of it the next one would come with the sync, a minute away.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let created = loop {
            match pool.create("a") {
                Ok(creating) => break creating,
                Err(ProberError::CreateHeld { reason: HoldReason::RateLimit { .. }, .. }) => {}
                Err(e) => panic!("{e}"),
            }
            tokio::time::timeout_at(deadline, changes.changed())
                .await
                .expect("no word of the end of the hold")
                .unwrap();
        };
        created.finished().await.unwrap();
        pool.stop();
        running.await.unwrap();
    });
}

#[test]
fn probe_now_probes_a_worker_out_of_turn() {
    let h = harness();
    fleet(&h, 2);
    h.script("w-1").exact(LIST, Reply::ok("zzzzz-1\n"));
    let outcome = h.runtime.block_on(h.pool.probe_now(&"w-1".into())).unwrap();
    assert_eq!(outcome, ProbeOutcome::Passed);
    assert_eq!(h.state_of("w-1"), State::Running);
    assert_eq!(h.state_of("w-0"), State::Idle);
    let err = h.runtime.block_on(h.pool.probe_now(&"nope".into())).unwrap_err();
    assert!(matches!(err, ProberError::UnknownWorker(_)), "{err}");
}

/// `wait_for_worker` answers once the worker is as asked, with how it was then, and `None`
/// for a worker the pool does not have (or no longer has).
#[test]
fn waiting_for_a_worker_sees_it_reach_the_state_asked_for() {
    let h = harness();
    let id = h.create("small").unwrap();
    let (idle, _) = h.runtime.block_on(async {
        tokio::join!(h.pool.wait_for_worker(&id, |w| w.state == State::Idle), async {
            for _ in 0..10 {
                h.clock.advance(secs(1));
                h.pool.probe_due().await;
            }
        })
    });
    let idle = idle.expect("the worker is there");
    assert_eq!((idle.id, idle.state), (id.clone(), State::Idle));
    let unknown = InstanceId::from("w-none");
    assert_eq!(h.runtime.block_on(h.pool.wait_for_worker(&unknown, |_| true)), None);
}

/// A price the cloud reports (a spot market's) replaces the configured one wherever the pool
/// tells a type's price: the type itself, the list of types, and the price metric of the
/// workers of that type. A type not configured cannot be priced.
#[test]
fn a_price_the_cloud_reports_replaces_the_configured_one() {
    let mut config = pool_config();
    let hourly = |amount| Price::per_hour(amount).unwrap();
    config.instance_types = vec![
        InstanceType { preemptible: true, ..InstanceType::new("spot") }.with_price(hourly(0.0104)),
        InstanceType::new("on-demand").with_price(hourly(0.0416)),
    ];
    let h = harness_with(config);
    h.create("spot").unwrap();
    let price_metric = |h: &Harness| {
        let metrics = h.pool.metrics();
        let lines = metrics.lines().filter(|l| l.starts_with("wharf_prober_instances_price{"));
        lines.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>()
    };
    assert_eq!(h.pool.instance_type("spot").price, Some(hourly(0.0104)));
    assert_eq!(price_metric(&h), 0.0104);

    assert!(h.pool.set_price("spot", hourly(0.0031)));
    assert_eq!(h.pool.instance_type("spot").price, Some(hourly(0.0031)));
    let prices: Vec<_> =
        h.pool.instance_types().into_iter().map(|it| (it.name, it.price)).collect();
    assert_eq!(
        prices,
        [("spot".to_owned(), Some(hourly(0.0031))), ("on-demand".to_owned(), Some(hourly(0.0416)))]
    );
    assert_eq!(price_metric(&h), 0.0031);

    assert!(!h.pool.set_price("gpu", hourly(1.0)), "a type not configured is not priced");
    assert_eq!(h.pool.instance_type("gpu").price, None);
}
