//! Scheduler behaviour on a fake clock, a static set of hosts and fake runners that keep the
//! work they were given: placement and queueing, refused and unconfirmed starts, outcomes,
//! lost workers and work found again, adoption, stops, and bad submissions.

use crate::*;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use wharf_prober::*;
use wharf_state::Timestamp;
use wharf_state::reschedule::ReschedulePolicy;
use wharf_state::resources::Amount;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// How a fake runner answers the next start.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Start {
    Ok,
    Refuse,
    /// The answer is lost, but the work started.
    LostAnswerStarted,
    /// The answer is lost, and the work never arrived.
    LostAnswerNotStarted,
}

#[derive(Debug, Default)]
struct RunnerState {
    reachable: bool,
    running: BTreeSet<String>,
    outcomes: HashMap<String, String>,
    starts: VecDeque<Start>,
    stdin: BTreeMap<String, Vec<u8>>,
    kills: Vec<String>,
    /// What its resources command prints; `None`: it fails (a runner that cannot say).
    resources: Option<String>,
    /// Its outcome command never answers in time (an agent that hangs), though it lists.
    outcome_hangs: bool,
    /// Outcome commands it was sent.
    outcome_asks: usize,
}

/// A host whose runner keeps the work it is given until told it ended.
#[derive(Debug, Default)]
struct FakeRunner {
    name: String,
    state: Mutex<RunnerState>,
}

impl FakeRunner {
    fn end(&self, id: &str, outcome: &str) {
        let mut state = self.state.lock();
        assert!(state.running.remove(id), "{id} was not running on {}", self.name);
        state.outcomes.insert(id.to_owned(), outcome.to_owned());
    }
}

fn last_word(command: &str) -> String {
    command.rsplit(' ').next().unwrap_or_default().trim_matches('\'').to_owned()
}

#[async_trait::async_trait]
impl Executor for FakeRunner {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        let mut state = self.state.lock();
        let worker = self.name.clone();
        if !state.reachable {
            return Err(ProberError::Timeout { worker, what: command.into(), deadline });
        }
        let ok = |stdout: String| {
            Ok(Output { stdout: stdout.into_bytes(), stderr: Vec::new(), status: Some(0) })
        };
        let words: Vec<&str> = command.split(' ').collect();
        match words.get(1).copied() {
            _ if command == "bootprobe" => ok(String::new()),
            Some("list") => ok(state.running.iter().map(|id| format!("{id}\n")).collect()),
            Some("start") => {
                let id = last_word(command);
                match state.starts.pop_front().unwrap_or(Start::Ok) {
                    Start::Ok => {
                        state.stdin.insert(id.clone(), stdin.to_vec());
                        state.running.insert(id);
                        ok(String::new())
                    }
                    Start::Refuse => Ok(Output {
                        stdout: Vec::new(),
                        stderr: b"no room here".to_vec(),
                        status: Some(3),
                    }),
                    Start::LostAnswerStarted => {
                        state.running.insert(id);
                        Err(ProberError::Timeout { worker, what: command.into(), deadline })
                    }
                    Start::LostAnswerNotStarted => {
                        Err(ProberError::Timeout { worker, what: command.into(), deadline })
                    }
                }
            }
            Some("resources") => match &state.resources {
                Some(line) => ok(line.clone()),
                None => Err(ProberError::Exec { worker, detail: "cannot say".into() }),
            },
            Some("outcome") => {
                state.outcome_asks += 1;
                if state.outcome_hangs {
                    return Err(ProberError::Timeout { worker, what: command.into(), deadline });
                }
                let id = last_word(command);
                ok(state.outcomes.get(&id).cloned().unwrap_or_else(|| "unknown".into()) + "\n")
            }
            Some("kill") => {
                let id = last_word(command);
                state.running.remove(&id);
                state.outcomes.insert(id.clone(), "complete stopped".into());
                state.kills.push(id);
                ok(String::new())
            }
            _ => Err(ProberError::Exec { worker, detail: format!("unexpected {command:?}") }),
        }
    }
}

/// A scheduler over `pool` that leads `store` in a new term.
async fn take_over(pool: &Pool, config: SchedulerConfig, store: Arc<MemoryStore>) -> Scheduler {
    let me = Replica { name: "test".into(), address: "127.0.0.1:1".into() };
    let term = store.campaign(&me).await.unwrap();
    Scheduler::take_over(pool.clone(), config, store, term).await.unwrap()
}

struct Harness {
    clock: Arc<FakeClock>,
    hosts: BTreeMap<String, Arc<FakeRunner>>,
    pool: Pool,
    scheduler: Scheduler,
    store: Arc<MemoryStore>,
    config: SchedulerConfig,
    runtime: tokio::runtime::Runtime,
}

const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// Hosts whose destroy also ends their runner, as destroying a loopback instance wipes its
/// agent: nothing on them answers any more.
#[derive(Debug)]
struct Wiping {
    set: StaticInstanceSet,
    hosts: BTreeMap<String, Arc<FakeRunner>>,
}

#[async_trait::async_trait]
impl InstanceSet for Wiping {
    async fn create(
        &self,
        instance_type: &InstanceType,
        tags: &Tags,
        init_command: &str,
    ) -> Result<Instance, ProberError> {
        self.set.create(instance_type, tags, init_command).await
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        self.set.list().await
    }
    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError> {
        if let Some(host) = self.hosts.get(&id.0) {
            host.state.lock().reachable = false;
        }
        self.set.destroy(id).await
    }
    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        self.set.set_tags(id, tags).await
    }
}

fn harness(hosts: &[&str], scheduling: SchedulerConfig) -> Harness {
    harness_with(hosts, scheduling, Duration::ZERO, false)
}

/// A harness whose workers await the outcome of ended work for `outcome_hold`, and whose
/// destroys end the host's runner if `destroy_wipes`.
fn harness_with(
    hosts: &[&str],
    scheduling: SchedulerConfig,
    outcome_hold: Duration,
    destroy_wipes: bool,
) -> Harness {
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(1))));
    let runners: BTreeMap<String, Arc<FakeRunner>> = hosts
        .iter()
        .map(|name| {
            let runner = FakeRunner { name: (*name).to_owned(), ..FakeRunner::default() };
            runner.state.lock().reachable = true;
            ((*name).to_owned(), Arc::new(runner))
        })
        .collect();
    let set = StaticInstanceSet::new(
        StaticConfig {
            hosts: hosts
                .iter()
                .map(|name| StaticHost {
                    name: (*name).to_owned(),
                    address: format!("{name}:22"),
                    remote_user: "root".into(),
                    host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAbc".into(),
                    runner_args: String::new(),
                })
                .collect(),
            rejoin_after: secs(300),
        },
        clock.clone(),
    )
    .unwrap();
    let set: Arc<dyn InstanceSet> = if destroy_wipes {
        Arc::new(Wiping { set, hosts: runners.clone() })
    } else {
        Arc::new(set)
    };
    let for_executor = runners.clone();
    let new_executor: NewExecutor =
        Arc::new(move |i: &Instance| for_executor[&i.id.0].clone() as Arc<dyn Executor>);
    let config = PoolConfig {
        worker: WorkerConfig {
            boot_probe_command: "bootprobe".into(),
            runner: RunnerConfig {
                command: "runner".into(),
                list_args: "list".into(),
                start_args: "start".into(),
                kill_args: "kill".into(),
                outcome_args: Some("outcome".into()),
                resources_args: Some("resources".into()),
                ..RunnerConfig::default()
            },
            timeouts: Timeouts {
                booting: secs(60),
                probe: secs(60),
                idle: secs(1_000_000),
                outcome_hold,
                ..Timeouts::default()
            },
            ..WorkerConfig::default()
        },
        probe_interval: PROBE_INTERVAL,
        ..PoolConfig::default()
    };
    let pool = Pool::new(config, clock.clone(), set, new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = Arc::new(MemoryStore::new());
    let scheduler = runtime.block_on(take_over(&pool, scheduling.clone(), store.clone()));
    let h = Harness { clock, hosts: runners, pool, scheduler, store, config: scheduling, runtime };
    h.runtime.block_on(h.pool.sync()).unwrap();
    h.probe();
    h
}

impl Harness {
    /// One probe round: every worker is due once per interval.
    fn probe(&self) {
        self.clock.advance(PROBE_INTERVAL);
        self.runtime.block_on(self.pool.probe_due());
    }

    fn step(&self) -> usize {
        self.runtime.block_on(self.scheduler.step())
    }

    /// Host `name` stops answering until its probes time out and it is shut down; then a step.
    fn cut_off(&self, name: &str) {
        self.host(name).state.lock().reachable = false;
        for _ in 0..8 {
            self.probe();
        }
        self.step();
    }

    /// Host `name`, out of service, answers again and rejoins after the rejoin time; then a
    /// probe and a step.
    fn rejoin(&self, name: &str) {
        self.runtime.block_on(self.pool.sync()).unwrap();
        self.host(name).state.lock().reachable = true;
        self.clock.advance(secs(300));
        self.runtime.block_on(self.pool.sync()).unwrap();
        self.probe();
        self.step();
    }

    fn host(&self, name: &str) -> &FakeRunner {
        &self.hosts[name]
    }

    fn phase(&self, id: &str) -> WorkPhase {
        self.scheduler.get(id).unwrap().phase
    }

    fn submit(&self, id: &str) {
        let submission = Submission::new(id, format!("spec of {id}"));
        self.runtime.block_on(self.scheduler.submit(submission)).unwrap();
    }

    /// A new scheduler takes over from the same store, as after a restart of the fleet or a
    /// failover; the old one's term is over.
    fn take_over(&mut self) {
        // Whoever leads loses its term first, as a lapsed lease ends it: a campaign waits for
        // as long as another replica leads.
        self.store.lapse();
        let (pool, config, store) = (&self.pool, self.config.clone(), self.store.clone());
        self.scheduler = self.runtime.block_on(take_over(pool, config, store));
    }

    fn placement(&self, id: &str) -> Placement {
        self.scheduler.get(id).unwrap_or_else(|| panic!("no work {id}"))
    }

    fn submit_err(&self, id: &str) -> FleetError {
        let submission = Submission::new(id, format!("spec of {id}"));
        self.runtime.block_on(self.scheduler.submit(submission)).unwrap_err()
    }

    fn running_on(&self, name: &str) -> Vec<String> {
        self.host(name).state.lock().running.iter().cloned().collect()
    }
}

fn running(worker: &str) -> WorkPhase {
    WorkPhase::Running { worker: worker.into() }
}

fn config(per_worker_limit: usize) -> SchedulerConfig {
    SchedulerConfig {
        per_worker_limit,
        start_failure_backoff: secs(30),
        ..SchedulerConfig::default()
    }
}

#[test]
fn work_goes_to_the_least_loaded_worker_with_room_and_waits_for_room() {
    let h = harness(&["h1", "h2"], config(2));
    assert!(h.pool.workers().iter().all(|w| w.state == State::Idle));
    for id in ["a", "b", "c", "d", "e"] {
        h.submit(id);
    }
    assert_eq!(h.step(), 4);
    // Spread: each idle worker got one before either got a second.
    assert_eq!(h.running_on("h1"), ["a", "c"]);
    assert_eq!(h.running_on("h2"), ["b", "d"]);
    assert_eq!(h.phase("a"), running("h1"));
    assert_eq!(h.phase("e"), WorkPhase::Queued);
    assert_eq!(h.host("h1").state.lock().stdin["a"], b"spec of a");
    let a = h.scheduler.get("a").unwrap();
    assert!(a.confirmed && a.started.is_some() && a.starts == 1, "{a:?}");
    // Full everywhere: nothing more starts.
    assert_eq!(h.step(), 0);

    // `c` ends on h1: the probe sees it gone, the runner says how, and `e` takes its place.
    h.host("h1").end("c", "complete all tasks finished");
    h.probe();
    assert_eq!(h.step(), 1);
    assert_eq!(
        h.phase("c"),
        WorkPhase::Ended { worker: "h1".into(), outcome: "complete all tasks finished".into() }
    );
    assert!(h.scheduler.get("c").unwrap().finished.is_some());
    assert_eq!(h.phase("e"), running("h1"));
    let metrics = h.scheduler.metrics();
    assert!(metrics.contains("wharf_fleet_work{phase=\"running\"} 4"), "{metrics}");
    assert!(metrics.contains("wharf_fleet_finished_total{phase=\"ended\"} 1"), "{metrics}");
    assert!(metrics.contains("wharf_fleet_start_latency_seconds_count 5"), "{metrics}");
}

#[test]
fn the_payload_of_work_is_kept_and_outlives_a_take_over() {
    let mut h = harness(&["h1"], config(1));
    h.submit("a");
    assert_eq!(h.scheduler.payload("a").as_deref(), Some("spec of a"));
    assert_eq!(h.scheduler.payload("b"), None);
    h.take_over();
    assert_eq!(h.scheduler.payload("a").as_deref(), Some("spec of a"));
}

#[test]
fn workers_on_hold_or_draining_get_no_work() {
    let h = harness(&["h1", "h2", "h3"], config(4));
    h.runtime.block_on(h.pool.set_idle_behavior(&"h1".into(), IdleBehavior::Hold)).unwrap();
    h.runtime.block_on(h.pool.set_idle_behavior(&"h2".into(), IdleBehavior::Drain)).unwrap();
    for id in ["a", "b"] {
        h.submit(id);
    }
    h.step();
    assert_eq!(h.running_on("h3"), ["a", "b"]);
    assert!(h.running_on("h1").is_empty() && h.running_on("h2").is_empty());
}

/// A drained worker goes once its work has ended; the work ended, so it is recorded as ended
/// with the outcome its worker's runner reports, never as lost with its worker. Here the pool
/// shuts the worker down (its next probe round) before the scheduler has looked at it since
/// the probe that saw the work end: the order a loaded fleet sees when its probes run ahead of
/// its steps.
#[test]
fn a_drained_worker_shut_down_after_its_work_ended_records_the_end_not_a_loss() {
    let h = harness(&["h1", "h2"], config(1));
    h.submit("a");
    h.submit("b");
    h.step();
    assert_eq!((h.phase("a"), h.phase("b")), (running("h1"), running("h2")));
    h.runtime.block_on(h.pool.set_idle_behavior(&"h1".into(), IdleBehavior::Drain)).unwrap();
    h.host("h1").end("a", "complete all tasks finished");
    // The probe that sees `a` end leaves h1 idle; the next round shuts the drained worker down.
    h.probe();
    h.probe();
    let h1 = h.pool.workers().into_iter().find(|w| w.id.0 == "h1").unwrap();
    assert_eq!(h1.state, State::Shutdown, "{h1:?}");
    h.step();
    assert_eq!(
        h.phase("a"),
        WorkPhase::Ended { worker: "h1".into(), outcome: "complete all tasks finished".into() }
    );
    assert_eq!(h.phase("b"), running("h2"));
    let metrics = h.scheduler.metrics();
    assert!(metrics.contains("wharf_fleet_finished_total{phase=\"lost\"} 0"), "{metrics}");
}

/// The worker at `name`, as the pool shows it.
fn worker(h: &Harness, name: &str) -> WorkerView {
    h.pool.workers().into_iter().find(|w| w.id.0 == name).expect("a worker of the pool")
}

/// A drained worker whose last work ended is kept until the fleet has its agent's answer on
/// how it ended, then shut down at once: the outcome is the runner's, not "cannot say", though
/// the destroy ends the agent (as a loopback instance's wipe does).
#[test]
fn a_drained_worker_waits_for_the_outcome_of_its_last_work_then_shuts_down() {
    let h = harness_with(&["h1", "h2"], config(1), secs(60), true);
    h.submit("a");
    h.submit("b");
    h.step();
    assert_eq!((h.phase("a"), h.phase("b")), (running("h1"), running("h2")));
    h.runtime.block_on(h.pool.set_idle_behavior(&"h1".into(), IdleBehavior::Drain)).unwrap();
    h.host("h1").end("a", "failed exit status 3");
    // The probe that sees `a` end leaves h1 idle; the next round would have shut the drained
    // worker down, but its outcome is awaited.
    h.probe();
    h.probe();
    let h1 = worker(&h, "h1");
    assert_eq!(
        (h1.state, h1.awaiting_outcome.as_slice()),
        (State::Idle, ["a".to_owned()].as_slice())
    );
    // The step asks; the one after finds the answer in the books and lets the worker go.
    h.step();
    assert_eq!(
        h.phase("a"),
        WorkPhase::Ended { worker: "h1".into(), outcome: "failed exit status 3".into() }
    );
    assert_eq!(h.host("h1").state.lock().outcome_asks, 1);
    h.step();
    let h1 = worker(&h, "h1");
    assert_eq!(h1.state, State::Shutdown, "{h1:?}");
    assert!(h1.awaiting_outcome.is_empty(), "{h1:?}");
    assert!(!h.host("h1").state.lock().reachable, "the destroy ended its runner");
    assert_eq!(h.phase("b"), running("h2"));
    let metrics = h.scheduler.metrics();
    assert!(metrics.contains("wharf_fleet_finished_total{phase=\"lost\"} 0"), "{metrics}");
}

/// A drained worker whose agent never says how its last work ended is asked again while it
/// waits, and shut down when the hold runs out; the work then ended, how no one can say.
#[test]
fn a_drained_worker_whose_agent_never_answers_is_shut_down_after_the_hold() {
    let hold = secs(60);
    let h = harness_with(&["h1"], config(1), hold, true);
    h.submit("a");
    h.step();
    h.runtime.block_on(h.pool.set_idle_behavior(&"h1".into(), IdleBehavior::Drain)).unwrap();
    h.host("h1").end("a", "complete");
    h.host("h1").state.lock().outcome_hangs = true;
    h.probe();
    for asked in 1..=3 {
        h.step();
        assert_eq!(h.phase("a"), running("h1"), "no answer yet, after {asked} questions");
        assert_eq!(h.host("h1").state.lock().outcome_asks, asked);
        assert_eq!(worker(&h, "h1").state, State::Idle);
    }
    // Probe rounds until the hold has run out: the last one shuts the worker down.
    for _ in 0..(hold.as_secs() / PROBE_INTERVAL.as_secs()) {
        assert_eq!(worker(&h, "h1").state, State::Idle);
        h.probe();
    }
    assert_eq!(worker(&h, "h1").state, State::Shutdown);
    h.step();
    match h.phase("a") {
        WorkPhase::Ended { worker, outcome } => {
            assert_eq!(worker, "h1");
            assert!(outcome.starts_with("ended; the worker cannot say how"), "{outcome}");
        }
        other => panic!("{other:?}"),
    }
}

/// A shut-down worker whose last probe did not list the work, but whose runner says it still
/// runs (the probe raced its start): it went with its worker, and is lost at once rather than
/// asked about again at every step until the worker leaves the pool.
#[test]
fn work_still_running_on_a_worker_shut_down_without_listing_it_is_lost_with_it() {
    let h = harness(&["h1"], config(1));
    h.submit("a");
    h.step();
    h.runtime.block_on(h.pool.set_idle_behavior(&"h1".into(), IdleBehavior::Drain)).unwrap();
    {
        let mut runner = h.host("h1").state.lock();
        runner.running.remove("a");
        runner.outcomes.insert("a".into(), "running".into());
    }
    h.probe();
    h.probe();
    h.step();
    match h.phase("a") {
        WorkPhase::Lost { worker, reason } => {
            assert_eq!((worker.as_str(), reason.as_str()), ("h1", "worker h1 was shut down"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_refused_start_goes_to_another_worker_and_fails_after_the_last_attempt() {
    let h = harness(&["h1", "h2"], SchedulerConfig { max_start_attempts: 2, ..config(4) });
    h.host("h1").state.lock().starts.push_back(Start::Refuse);
    h.submit("a");
    h.step();
    assert_eq!(h.phase("a"), WorkPhase::Queued, "requeued after the refusal");
    assert_eq!(h.scheduler.get("a").unwrap().starts, 1);
    // h1 is backed off; the refused start is forgotten there, so it is idle, not running.
    assert_eq!(h.pool.workers()[0].state, State::Idle);
    h.step();
    assert_eq!(h.phase("a"), running("h2"));

    // Refused by both: it fails with the reason.
    h.host("h2").state.lock().starts.push_back(Start::Refuse);
    h.submit("b");
    h.step();
    assert_eq!(h.phase("b"), WorkPhase::Queued);
    // Both are backed off now: it waits.
    h.step();
    assert_eq!(h.phase("b"), WorkPhase::Queued);
    h.clock.advance(secs(31));
    h.host("h1").state.lock().starts.push_back(Start::Refuse);
    h.step();
    match h.phase("b") {
        WorkPhase::Failed { reason } => {
            assert!(
                reason.contains("refused 2 times") && reason.contains("no room here"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The backoff ends: h1 takes work again.
    h.clock.advance(secs(31));
    h.submit("c");
    h.step();
    assert_eq!(h.phase("c"), running("h1"));
    assert!(h.scheduler.metrics().contains("wharf_fleet_start_refusals_total 3"));
}

#[test]
fn an_unconfirmed_start_is_judged_by_the_next_probe() {
    let h = harness(&["h1"], config(4));
    h.host("h1")
        .state
        .lock()
        .starts
        .extend([Start::LostAnswerStarted, Start::LostAnswerNotStarted]);
    h.submit("arrived");
    h.step();
    let placement = h.scheduler.get("arrived").unwrap();
    assert_eq!(placement.phase, running("h1"));
    assert!(!placement.confirmed);
    h.submit("vanished");
    h.step();
    assert!(!h.scheduler.get("vanished").unwrap().confirmed);
    h.probe();
    h.step();
    // Listed: it runs. Not listed and unknown to the runner: it never arrived; back in the
    // queue and started again.
    assert!(h.scheduler.get("arrived").unwrap().confirmed);
    h.step();
    let vanished = h.scheduler.get("vanished").unwrap();
    assert_eq!((vanished.phase.clone(), vanished.starts), (running("h1"), 2), "{vanished:?}");
    assert!(vanished.confirmed);
    assert_eq!(h.running_on("h1"), ["arrived", "vanished"]);
}

#[test]
fn a_lost_worker_loses_its_work_and_work_found_again_is_stopped() {
    let h = harness(&["h1", "h2"], config(1));
    h.submit("a");
    h.submit("b");
    h.step();
    assert_eq!((h.phase("a"), h.phase("b")), (running("h1"), running("h2")));
    // h1 stops answering: past the probe timeout it is shut down and its work is lost; h2's
    // work is untouched.
    h.cut_off("h1");
    match h.phase("a") {
        WorkPhase::Lost { worker, reason } => {
            assert_eq!(worker, "h1");
            assert!(reason.contains("shut down") || reason.contains("disappeared"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.phase("b"), running("h2"));
    assert!(h.scheduler.metrics().contains("wharf_fleet_finished_total{phase=\"lost\"} 1"));
    // Its host is out of service: the next sync drops the worker.
    h.runtime.block_on(h.pool.sync()).unwrap();
    assert_eq!(h.pool.workers().len(), 1);

    // h1 comes back after the rejoin time, still running `a`: it is stopped there.
    h.rejoin("h1");
    assert_eq!(h.host("h1").state.lock().kills, ["a"]);
    assert!(h.running_on("h1").is_empty());
    assert!(matches!(h.phase("a"), WorkPhase::Lost { .. }), "stays lost");
    assert!(h.scheduler.metrics().contains("wharf_fleet_stopped_after_lost_total 1"));
}

#[test]
fn work_found_running_is_adopted_not_started_again() {
    let h = harness(&["h1"], config(2));
    h.host("h1").state.lock().running.insert("from-before".into());
    h.probe();
    h.step();
    let adopted = h.scheduler.get("from-before").unwrap();
    assert!(adopted.adopted && adopted.confirmed, "{adopted:?}");
    assert_eq!(adopted.phase, running("h1"));
    // It counts against the limit.
    h.submit("a");
    h.submit("b");
    h.step();
    assert_eq!(h.phase("b"), WorkPhase::Queued);
    // Submitting an adopted id is refused, and nothing starts twice.
    let again = Submission::new("from-before", "");
    assert!(h.runtime.block_on(h.scheduler.submit(again)).is_err());
    assert_eq!(h.host("h1").state.lock().stdin.len(), 1);
}

#[test]
fn stop_cancels_queued_work_and_kills_running_work() {
    let h = harness(&["h1"], config(1));
    h.submit("a");
    h.submit("b");
    h.step();
    let b = h.runtime.block_on(h.scheduler.stop("b", "operator")).unwrap();
    assert_eq!(b.phase, WorkPhase::Cancelled);
    h.runtime.block_on(h.scheduler.stop("a", "operator")).unwrap();
    assert_eq!(h.host("h1").state.lock().kills, ["a"]);
    h.probe();
    h.step();
    assert_eq!(
        h.phase("a"),
        WorkPhase::Ended { worker: "h1".into(), outcome: "complete stopped".into() }
    );
    assert!(h.running_on("h1").is_empty(), "b never started");
    assert!(matches!(
        h.runtime.block_on(h.scheduler.stop("nope", "x")),
        Err(FleetError::UnknownWork(_))
    ));
}

#[test]
fn bad_submissions_are_refused_with_the_reason() {
    let h = harness(&["h1"], SchedulerConfig { max_queued: 1, ..config(1) });
    let refused = |id: &str| {
        let submission = Submission::new(id, "");
        h.runtime.block_on(h.scheduler.submit(submission)).unwrap_err().to_string()
    };
    assert!(refused("").contains("printable"));
    assert!(refused("a b").contains("printable"));
    h.submit("a");
    assert!(refused("a").contains("taken"));
    assert!(refused("b").contains("queue is full (1 waiting)"));
    assert!(refused("a__2").contains("reserved"));
}

#[test]
fn finished_work_is_forgotten_oldest_first_beyond_the_limit() {
    let h = harness(&["h1"], SchedulerConfig { max_finished: 2, ..config(1) });
    for id in ["a", "b", "c"] {
        h.submit(id);
        h.runtime.block_on(h.scheduler.stop(id, "x")).unwrap();
    }
    // Stopped while queued (or starting): all three finish; the oldest is forgotten.
    h.probe();
    h.step();
    h.probe();
    h.step();
    let ids: Vec<String> = h.scheduler.list().into_iter().map(|p| p.id).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(!ids.contains(&"a".to_owned()), "{ids:?}");
}

#[test]
fn a_per_worker_limit_of_zero_is_no_limit() {
    let h = harness(&["h1"], SchedulerConfig { per_worker_limit: 0, ..config(1) });
    for i in 0..8 {
        h.submit(&format!("w{i}"));
    }
    h.step();
    h.probe();
    assert_eq!(h.running_on("h1").len(), 8);
}

/// A cloud whose creates wait until released, counting them.
#[derive(Debug, Default)]
struct SlowCloud {
    creates: std::sync::atomic::AtomicUsize,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl InstanceSet for SlowCloud {
    async fn create(&self, _: &InstanceType, _: &Tags, _: &str) -> Result<Instance, ProberError> {
        self.creates.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.release.notified().await;
        Err(ProberError::Quota { detail: "released".into() })
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(Vec::new())
    }
    async fn destroy(&self, _: &InstanceId) -> Result<(), ProberError> {
        Ok(())
    }
    async fn set_tags(&self, _: &InstanceId, _: &Tags) -> Result<(), ProberError> {
        Ok(())
    }
}

/// Creates return at once and count toward `min_workers` while in flight: steps taken while
/// the cloud is slow ask for no more.
#[test]
fn creates_in_flight_count_toward_the_minimum() {
    let cloud = Arc::new(SlowCloud::default());
    let new_executor: NewExecutor =
        Arc::new(|i: &Instance| Arc::new(ScriptedExecutor::new(&i.id.0)) as Arc<dyn Executor>);
    let pool_config =
        PoolConfig { max_concurrent_creates: 0, cloud_deadline: secs(1), ..PoolConfig::default() };
    let clock = Arc::new(FakeClock::new(Moment::from_origin(secs(1))));
    let pool = Pool::new(pool_config, clock, cloud.clone(), new_executor).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let config = SchedulerConfig { min_workers: 2, ..config(1) };
        let scheduler = take_over(&pool, config, Arc::new(MemoryStore::new())).await;
        // Nothing is created before the pool knows what exists.
        scheduler.step().await;
        assert_eq!(cloud.creates.load(std::sync::atomic::Ordering::SeqCst), 0);
        pool.sync().await.unwrap();
        for _ in 0..3 {
            scheduler.step().await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(cloud.creates.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(pool.instances().len(), 2, "both shown while in flight");
        cloud.release.notify_waiters();
    });
}

/// A worker as the scheduler sees it.
fn worker_view(id: &str, state: State, idle: IdleBehavior, running: &[&str]) -> WorkerView {
    WorkerView {
        id: id.into(),
        address: None,
        instance_type: String::new(),
        state,
        idle_behavior: idle,
        running: running.iter().map(|s| (*s).to_owned()).collect(),
        starting: Vec::new(),
        awaiting_outcome: Vec::new(),
        last_runner: None,
        probe_age: Duration::ZERO,
        idle_for: Duration::ZERO,
        last_probe_failed: false,
        last_error: None,
        resources: None,
    }
}

/// The same worker, awaiting the outcome of these runners that left its list.
fn awaiting(mut view: WorkerView, runners: &[&str]) -> WorkerView {
    view.awaiting_outcome = runners.iter().map(|s| (*s).to_owned()).collect();
    view
}

/// The same worker, saying it has `has` for work.
fn having(mut view: WorkerView, has: Amount) -> WorkerView {
    view.resources =
        Some(Resources { cpu_mhz: has.cpu_mhz, memory_mb: has.memory_mb, cores: has.cores });
    view
}

/// The scheduler's decision alone, as a table: its books and a snapshot of the pool in;
/// starts, questions, stops, creates and the new phases out. No pool, no runtime.
#[test]
fn decide_table() {
    use crate::scheduler::{Books, Snapshot};
    use IdleBehavior::{Drain, Hold, Run};
    use State::{Booting, Idle, Running, Shutdown};
    let now = Timestamp(1_000_000);
    let lost = |worker: &str, reason: &str| WorkPhase::Lost {
        worker: worker.into(),
        reason: reason.into(),
    };
    /// A case: the work (id and phase), the workers, creates in flight, and what must follow.
    struct Case {
        name: &'static str,
        work: Vec<(&'static str, WorkPhase)>,
        workers: Vec<WorkerView>,
        creating: usize,
        /// The type of those creates.
        creating_type: &'static str,
        /// What each piece of work needs, where not nothing.
        needs: Vec<(&'static str, Amount)>,
        /// Instance types that say what they have.
        types: Vec<(&'static str, Amount)>,
        backoff: Option<&'static str>,
        /// Whether the pool has listed its instances yet.
        loaded: bool,
        config: SchedulerConfig,
        launches: &'static [(&'static str, &'static str)],
        asks: &'static [&'static str],
        stops: &'static [&'static str],
        /// Runners whose outcome the worker need not wait for any longer.
        collected: &'static [&'static str],
        creates: usize,
        creates_for_work: &'static [&'static str],
        /// Types held for capacity.
        held: &'static [&'static str],
        phases: Vec<(&'static str, WorkPhase)>,
        /// Queued work and a phrase of why it waits.
        waits: Vec<(&'static str, &'static str)>,
    }
    let case = |name| Case {
        name,
        work: Vec::new(),
        workers: Vec::new(),
        creating: 0,
        creating_type: "small",
        needs: Vec::new(),
        types: Vec::new(),
        backoff: None,
        loaded: true,
        config: config(2),
        launches: &[],
        asks: &[],
        stops: &[],
        collected: &[],
        creates: 0,
        creates_for_work: &[],
        held: &[],
        phases: Vec::new(),
        waits: Vec::new(),
    };
    let starting = |w: &str| WorkPhase::Starting { worker: w.into() };
    let big = Amount { cpu_mhz: 16_000, memory_mb: 32_768, cores: 8 };
    let small = Amount { cpu_mhz: 4_000, memory_mb: 4_096, cores: 2 };
    let medium = Amount { cpu_mhz: 8_000, memory_mb: 16_384, cores: 4 };
    let mb = |memory_mb: u64| Amount { cpu_mhz: 0, memory_mb, cores: 0 };
    let typed = |mut view: WorkerView, instance_type: &str| {
        view.instance_type = instance_type.into();
        view
    };
    let cases = vec![
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![worker_view("w1", Idle, Run, &[])],
            launches: &[("a", "w1")],
            phases: vec![("a", starting("w1"))],
            ..case("queued work goes to an idle worker")
        },
        Case {
            work: vec![("a", WorkPhase::Queued), ("b", WorkPhase::Queued)],
            workers: vec![
                worker_view("w1", Running, Run, &["x"]),
                worker_view("w2", Idle, Run, &[]),
            ],
            launches: &[("a", "w2"), ("b", "w1")],
            ..case("the least loaded first, then the next")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![worker_view("w1", Running, Run, &["x", "y"])],
            phases: vec![("a", WorkPhase::Queued)],
            waits: vec![("a", "every worker that takes work runs its limit of 2")],
            ..case("no room anywhere: stays queued")
        },
        Case {
            work: vec![("a", WorkPhase::Queued), ("b", WorkPhase::Queued)],
            workers: vec![
                having(worker_view("big", Idle, Run, &[]), big),
                having(worker_view("small", Idle, Run, &[]), small),
            ],
            needs: vec![("a", mb(1_024)), ("b", mb(20_000))],
            launches: &[("a", "small"), ("b", "big")],
            ..case("best fit: each to the worker it leaves least free")
        },
        Case {
            work: vec![("a", WorkPhase::Queued), ("b", WorkPhase::Queued)],
            workers: vec![having(worker_view("w1", Idle, Run, &[]), small)],
            needs: vec![("a", mb(8_192))],
            launches: &[("b", "w1")],
            phases: vec![("a", WorkPhase::Queued)],
            waits: vec![("a", "no worker has 8192 MB free; largest free 4096 MB")],
            ..case("work that fits nowhere waits with its reason; smaller work behind it goes")
        },
        Case {
            work: vec![("a", WorkPhase::Queued), ("b", WorkPhase::Queued)],
            workers: vec![having(worker_view("w1", Idle, Run, &[]), small)],
            needs: vec![("a", mb(8_192)), ("b", mb(30_000))],
            types: vec![("small", small), ("large", big)],
            creates_for_work: &["large", "large"],
            ..case("with types that say what they have, the smallest that fits is created for each")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![having(worker_view("w1", Idle, Run, &[]), small)],
            needs: vec![("a", mb(8_192))],
            types: vec![("small", small), ("medium", medium), ("large", big)],
            held: &["medium"],
            creates_for_work: &["large"],
            ..case("a type held for capacity is passed over for the next that fits")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![
                having(worker_view("w1", Idle, Run, &[]), small),
                typed(worker_view("w2", Booting, Run, &[]), "large"),
            ],
            needs: vec![("a", mb(8_192))],
            types: vec![("small", small), ("medium", medium), ("large", big)],
            ..case(
                "an instance on its way of another type that fits counts for the work (a fallback booting when the hold ended)",
            )
        },
        Case {
            work: vec![("a", WorkPhase::Queued), ("b", WorkPhase::Queued)],
            workers: vec![
                having(worker_view("w1", Idle, Run, &[]), small),
                typed(worker_view("w2", Booting, Run, &[]), "medium"),
            ],
            needs: vec![("a", mb(8_192)), ("b", mb(20_000))],
            types: vec![("small", small), ("medium", medium), ("large", big)],
            creates_for_work: &["large"],
            ..case("the instance on its way goes to the work it fits; the larger work gets its own")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![having(worker_view("w1", Idle, Run, &[]), small)],
            needs: vec![("a", mb(8_192))],
            types: vec![("small", small), ("medium", medium), ("large", big)],
            held: &["medium", "large"],
            creates_for_work: &["medium"],
            ..case("when every type that fits is held, the smallest that fits is asked for")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![having(worker_view("w1", Idle, Run, &[]), small)],
            needs: vec![("a", mb(2_048))],
            types: vec![("small", small)],
            launches: &[("a", "w1")],
            ..case("work that fits a worker creates nothing")
        },
        Case {
            work: vec![("a", WorkPhase::Queued), ("b", WorkPhase::Queued)],
            workers: vec![having(worker_view("w1", Idle, Run, &[]), small)],
            needs: vec![("a", mb(8_192)), ("b", mb(8_192))],
            types: vec![("small", small), ("large", big)],
            creating: 1,
            creating_type: "large",
            creates_for_work: &["large"],
            ..case("a create in flight of the type work needs counts toward it")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![
                worker_view("w1", Idle, Hold, &[]),
                worker_view("w2", Booting, Run, &[]),
                worker_view("w3", Shutdown, Run, &[]),
            ],
            phases: vec![("a", WorkPhase::Queued)],
            ..case("held, booting and shut-down workers take none")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![worker_view("w1", Idle, Run, &[])],
            backoff: Some("w1"),
            phases: vec![("a", WorkPhase::Queued)],
            ..case("a worker backing off after a refusal takes none")
        },
        Case {
            work: vec![("a", running("w1"))],
            workers: vec![worker_view("w1", Idle, Run, &[])],
            asks: &["a"],
            phases: vec![("a", running("w1"))],
            ..case("running work no longer listed: its worker is asked how it ended")
        },
        Case {
            work: vec![("a", running("w1")), ("b", WorkPhase::Queued)],
            loaded: false,
            phases: vec![("a", running("w1")), ("b", WorkPhase::Queued)],
            ..case("before the pool has listed its instances nothing is judged or placed")
        },
        Case {
            work: vec![("a", running("w1")), ("b", running("w2"))],
            workers: vec![
                worker_view("w1", State::Unknown, Run, &[]),
                worker_view("w2", Booting, Run, &[]),
            ],
            phases: vec![("a", running("w1")), ("b", running("w2"))],
            ..case("work on a worker not probed yet (after a take-over) waits for its probe")
        },
        Case {
            work: vec![("a", running("w1")), ("b", running("w2"))],
            workers: vec![worker_view("w1", Shutdown, Run, &["a"])],
            phases: vec![
                ("a", lost("w1", "worker w1 was shut down")),
                ("b", lost("w2", "worker w2 disappeared")),
            ],
            ..case("work on a shut-down or vanished worker is lost")
        },
        Case {
            work: vec![("a", running("w1"))],
            workers: vec![worker_view("w1", Shutdown, Run, &[])],
            asks: &["a"],
            phases: vec![("a", running("w1"))],
            ..case("work a worker no longer listed before it was shut down is asked how it ended")
        },
        Case {
            work: vec![("a", running("w1"))],
            workers: vec![awaiting(worker_view("w1", Idle, Drain, &[]), &["a"])],
            asks: &["a"],
            ..case("work whose runner awaits its outcome: asked, and the worker kept waiting")
        },
        Case {
            work: vec![
                ("a", WorkPhase::Ended { worker: "w1".into(), outcome: "complete".into() }),
                ("b", WorkPhase::Queued),
                ("c", running("w2")),
            ],
            workers: vec![
                awaiting(worker_view("w1", Idle, Drain, &[]), &["a", "b", "gone", "c"]),
                worker_view("w2", Running, Run, &["c"]),
            ],
            launches: &[("b", "w2")],
            collected: &["a", "b", "gone", "c"],
            ..case("runners whose outcome is in the books, or not wanted, are let go")
        },
        Case {
            work: vec![("a", lost("w1", "gone"))],
            workers: vec![worker_view("w1", Running, Run, &["a"])],
            stops: &["a"],
            ..case("lost work found running again is stopped")
        },
        Case {
            work: vec![("a", WorkPhase::Queued)],
            workers: vec![worker_view("w1", Running, Run, &["a", "z"])],
            phases: vec![("a", running("w1")), ("z", running("w1"))],
            ..case("queued work found running runs there; unknown work is adopted")
        },
        Case {
            workers: vec![worker_view("w1", Idle, Run, &[]), worker_view("w2", Shutdown, Run, &[])],
            creating: 1,
            config: SchedulerConfig { min_workers: 3, ..config(2) },
            creates: 1,
            ..case("the minimum counts live workers and creates in flight")
        },
    ];
    for case in cases {
        let name = case.name;
        let mut books = Books::holding(&case.work, now);
        for (id, needs) in &case.needs {
            books.needing(id, *needs);
        }
        if let Some(worker) = case.backoff {
            books.back_off(worker, now.saturating_add(secs(10)));
        }
        let snapshot = Snapshot {
            workers: case.workers.into_iter().map(|v| (v.id.clone(), v)).collect(),
            creating: [(case.creating_type.to_owned(), case.creating)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            now,
            loaded: case.loaded,
            types: case.types.iter().map(|(name, has)| ((*name).to_owned(), *has)).collect(),
            held: case.held.iter().map(|name| (*name).to_owned()).collect(),
            prices: Default::default(),
        };
        let decisions = books.decide(&snapshot, &case.config);
        let launches: Vec<(String, String)> =
            decisions.launches.iter().map(|l| (l.id.clone(), l.worker.0.clone())).collect();
        let want: Vec<(String, String)> =
            case.launches.iter().map(|(i, w)| ((*i).to_owned(), (*w).to_owned())).collect();
        assert_eq!(launches, want, "{name}: launches");
        let asks: Vec<&str> = decisions.ask.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(asks, case.asks, "{name}: asks");
        assert_eq!(decisions.stop, case.stops, "{name}: stops");
        let collected: Vec<&str> = decisions.collected.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(collected, case.collected, "{name}: outcomes collected");
        assert_eq!(decisions.creates, case.creates, "{name}: creates");
        assert_eq!(decisions.creates_for_work, case.creates_for_work, "{name}: creates for work");
        for (id, phrase) in case.waits {
            let why = books.waiting(id).unwrap_or_default();
            assert!(why.contains(phrase), "{name}: {id} waits because {why:?}, not {phrase:?}");
        }
        for (id, phase) in case.phases {
            assert_eq!(books.phase(id), Some(phase), "{name}: {id}");
        }
    }
}

/// While its worker is asked how work ended, the work is not written off when the worker is
/// shut down or vanishes meanwhile: the answer decides (a drained worker goes as soon as it is
/// idle, which may be before the answer comes back). Nor is it asked twice.
#[test]
fn work_being_asked_about_is_not_written_off_before_the_answer() {
    use crate::scheduler::{Books, Snapshot};
    let now = Timestamp(1_000_000);
    let snapshot = |workers: Vec<WorkerView>| Snapshot {
        workers: workers.into_iter().map(|v| (v.id.clone(), v)).collect(),
        creating: HashMap::new(),
        now,
        loaded: true,
        types: Vec::new(),
        held: Default::default(),
        prices: Default::default(),
    };
    let mut books = Books::holding(&[("a", running("w1"))], now);
    let idle = worker_view("w1", State::Idle, IdleBehavior::Drain, &[]);
    let first = books.decide(&snapshot(vec![idle]), &config(2));
    let asks: Vec<&str> = first.ask.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(asks, ["a"]);
    let shut_down = worker_view("w1", State::Shutdown, IdleBehavior::Drain, &[]);
    for (name, workers) in [("shut down", vec![shut_down]), ("vanished", Vec::new())] {
        let decisions = books.decide(&snapshot(workers), &config(2));
        assert!(decisions.ask.is_empty(), "{name}: asked again");
        assert_eq!(books.phase("a"), Some(running("w1")), "{name}");
    }
}

/// Each attempt placed on a worker whose type has a price keeps that price, whether it was
/// started there or found running there; a worker of a type without one prices nothing.
#[test]
fn attempts_keep_the_hourly_price_of_their_workers_type() {
    use crate::scheduler::{Books, Snapshot};
    let now = Timestamp(1_000_000);
    let typed = |mut view: WorkerView, instance_type: &str| {
        view.instance_type = instance_type.into();
        view
    };
    let snapshot = Snapshot {
        workers: [
            typed(worker_view("w1", State::Idle, IdleBehavior::Run, &[]), "large"),
            typed(worker_view("w2", State::Running, IdleBehavior::Hold, &["z"]), "large"),
            typed(worker_view("w3", State::Running, IdleBehavior::Hold, &["y"]), "unpriced"),
        ]
        .into_iter()
        .map(|v| (v.id.clone(), v))
        .collect(),
        creating: HashMap::new(),
        now,
        loaded: true,
        types: Vec::new(),
        held: Default::default(),
        prices: [("large".to_owned(), 192_000)].into_iter().collect(),
    };
    let mut books = Books::holding(&[("a", WorkPhase::Queued)], now);
    let decisions = books.decide(&snapshot, &config(2));
    assert!(decisions.changed);
    for (id, worker, price) in
        [("a", "w1", Some(192_000)), ("z", "w2", Some(192_000)), ("y", "w3", None)]
    {
        let placement = books.placement(id).unwrap_or_else(|| panic!("no work {id}"));
        assert_eq!(placement.phase.worker(), Some(worker), "{id}");
        assert_eq!(placement.price_micros_per_hour, price, "{id}");
    }
}

/// What a scheduler that took over does with what its predecessor left half done, as a table:
/// a stop that was asked (and acknowledged) but never reached the worker is sent once a worker
/// lists the work, and only once; a start left unacknowledged is not judged by its absence
/// from the worker until its command has surely ended, then its worker is asked.
#[test]
fn take_over_table() {
    use crate::scheduler::{Books, Snapshot};
    use IdleBehavior::Run;
    use State::Running;
    let now = Timestamp(1_000_000);
    let later = now.saturating_add(secs(30));
    /// What the predecessor left: a stop asked but not sent, or a start not acknowledged.
    #[derive(Clone, Copy)]
    enum Left {
        Stop,
        Start,
    }
    use Left::{Start, Stop};
    // (name, what was left, what the worker lists, the time, stops sent, asks)
    type Row = (
        &'static str,
        Left,
        &'static [&'static str],
        Timestamp,
        &'static [&'static str],
        &'static [&'static str],
    );
    let cases: Vec<Row> = vec![
        ("a stop asked is sent once the worker lists the work", Stop, &["a"], now, &["a"], &[]),
        ("not before: no worker lists it yet", Stop, &[], now, &[], &["a"]),
        ("an inherited start is not judged within the grace", Start, &[], now, &[], &[]),
        ("after the grace its worker is asked", Start, &[], later, &[], &["a"]),
        ("an inherited start found running is confirmed", Start, &["a"], now, &[], &[]),
    ];
    for (name, setup, listed, at, stops, asks) in cases {
        let mut books = Books::holding(&[("a", running("w1"))], now);
        match setup {
            Stop => books.stop_asked("a"),
            Start => books.inherit_start("a", later),
        }
        let workers = [worker_view("w1", Running, Run, listed)];
        let snapshot = Snapshot {
            workers: workers.into_iter().map(|v| (v.id.clone(), v)).collect(),
            creating: HashMap::new(),
            now: at,
            loaded: true,
            types: Vec::new(),
            held: Default::default(),
            prices: Default::default(),
        };
        let decisions = books.decide(&snapshot, &config(2));
        assert_eq!(decisions.stop_asked, stops, "{name}: stops");
        let asked: Vec<&str> = decisions.ask.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(asked, asks, "{name}: asks");
        // Decided once: the next step sends no stop again.
        let again = books.decide(&snapshot, &config(2));
        assert!(again.stop_asked.is_empty(), "{name}: a stop sent twice");
    }
}

/// Every change reaches the store before it is acknowledged or acted on, and a scheduler
/// that takes over from the store carries on: queued work keeps its order, work that was
/// starting counts as running until a probe says otherwise, running work is not started
/// again, and finished work keeps its outcome.
#[test]
fn a_scheduler_that_takes_over_from_the_store_carries_on_and_starts_nothing_twice() {
    let mut h = harness(&["h1"], config(2));
    for id in ["a", "b", "c", "d", "e"] {
        h.submit(id);
    }
    let stored = |h: &Harness, id: &str| {
        h.runtime.block_on(h.store.load(id)).unwrap().map(|r| r.placement.phase)
    };
    assert_eq!(stored(&h, "e"), Some(WorkPhase::Queued), "acknowledged only once durable");
    h.step();
    h.runtime.block_on(h.scheduler.stop("b", "operator")).unwrap();
    h.host("h1").end("a", "complete all tasks finished");
    h.probe();
    h.step();
    assert_eq!(stored(&h, "a"), Some(h.phase("a")));
    let before: Vec<Placement> = h.scheduler.list();

    // The old scheduler's term ends; its writes are refused from now on.
    let old = h.scheduler.clone();
    h.take_over();
    assert!(!old.acting());
    let refused = h.runtime.block_on(old.submit(Submission::new("late", "")));
    assert!(matches!(refused, Err(FleetError::NotLeading { .. })), "{refused:?}");
    assert_eq!(h.scheduler.list(), before, "the same books, from the store");

    // `c` and `d` took the places of `a` and `b`, `e` waits; nothing starts twice.
    assert_eq!((h.phase("c"), h.phase("d")), (running("h1"), running("h1")));
    assert_eq!(h.phase("e"), WorkPhase::Queued);
    h.probe();
    h.step();
    assert_eq!(h.phase("e"), WorkPhase::Queued, "still no room");
    h.host("h1").end("c", "complete all tasks finished");
    h.probe();
    h.step();
    assert_eq!(h.phase("e"), running("h1"));
    let stdin = h.host("h1").state.lock().stdin.clone();
    assert_eq!(stdin.keys().collect::<Vec<_>>(), ["a", "b", "c", "d", "e"], "each started once");
    assert!(matches!(h.phase("a"), WorkPhase::Ended { .. }));
}

/// Nomad's `TestServiceSched_Reschedule_Later` and `_OnceNow` through the fleet: work lost
/// with its worker waits out its policy's delay, is placed again as a new attempt on another
/// worker under its own runner id, and the history says what happened. When the lost worker
/// comes back running the old attempt, that attempt (and only it) is stopped. Once the policy
/// allows no more attempts, the work stays lost.
#[test]
fn lost_work_is_rescheduled_by_its_policy_and_the_old_attempt_is_stopped() {
    let h = harness(&["h1", "h2"], config(1));
    let policy = ReschedulePolicy {
        attempts: 1,
        interval: secs(3600),
        delay: secs(30),
        ..ReschedulePolicy::defaults_for(wharf_state::JobType::Batch)
    };
    let submission = Submission::new("a", "spec of a").with_reschedule(policy);
    h.runtime.block_on(h.scheduler.submit(submission)).unwrap();
    h.step();
    assert_eq!(h.phase("a"), running("h1"));
    // h2 is busy with other work, so the reschedule must wait for room too.
    h.cut_off("h1");
    let waiting = h.placement("a");
    assert_eq!((waiting.phase.clone(), waiting.attempt), (WorkPhase::Queued, 2), "{waiting:?}");
    let event = waiting.rescheduled.clone().expect("a reschedule event");
    assert_eq!(event.delay, secs(30));
    assert!(event.reason.contains("lost: worker h1"), "{event:?}");
    assert_eq!(waiting.not_before, Some(event.at.saturating_add(secs(30))));
    assert_eq!(waiting.history.len(), 1);
    assert_eq!(waiting.history[0].runner_id, "a");
    // Not before its delay.
    h.clock.advance(secs(20));
    h.step();
    assert_eq!(h.phase("a"), WorkPhase::Queued);
    h.clock.advance(secs(11));
    h.step();
    assert_eq!(h.phase("a"), running("h2"));
    assert_eq!(h.running_on("h2"), ["a__2"]);
    assert!(h.scheduler.metrics().contains("wharf_fleet_rescheduled_total 1"));

    // h1 comes back still running the first attempt: that one is stopped.
    h.rejoin("h1");
    assert_eq!(h.host("h1").state.lock().kills, ["a"]);
    assert_eq!(h.running_on("h2"), ["a__2"], "the new attempt runs on");

    // The second attempt is lost too: one attempt per hour was allowed, so it stays lost.
    h.cut_off("h2");
    let lost = h.placement("a");
    assert!(matches!(&lost.phase, WorkPhase::Lost { worker, .. } if worker == "h2"), "{lost:?}");
    assert_eq!(lost.attempt, 2);
}

/// Work that ended `failed` is rescheduled like lost work; work that completed, and work an
/// operator stopped, is not.
#[test]
fn failed_work_is_rescheduled_and_stopped_or_complete_work_is_not() {
    let h = harness(&["h1"], config(4));
    let policy = ReschedulePolicy {
        delay: secs(5),
        ..ReschedulePolicy::defaults_for(wharf_state::JobType::Batch)
    };
    for id in ["fails", "completes", "stopped"] {
        let submission = Submission::new(id, "").with_reschedule(policy);
        h.runtime.block_on(h.scheduler.submit(submission)).unwrap();
    }
    h.step();
    h.host("h1").end("fails", "failed task t exited 1");
    h.host("h1").end("completes", "complete all tasks finished");
    h.runtime.block_on(h.scheduler.stop("stopped", "operator")).unwrap();
    h.probe();
    h.step();
    assert_eq!(h.placement("fails").attempt, 2);
    assert_eq!(h.phase("fails"), WorkPhase::Queued);
    assert!(matches!(h.phase("completes"), WorkPhase::Ended { .. }));
    assert!(matches!(h.phase("stopped"), WorkPhase::Ended { .. }));
    h.clock.advance(secs(6));
    h.step();
    assert_eq!(h.phase("fails"), running("h1"));
    assert!(h.running_on("h1").contains(&"fails__2".to_owned()));
}

/// Placement by resources through the pool: each worker's runner says what it has at its first
/// probe; work goes to the worker it fits best, what fits nowhere waits and says why, and once
/// work ends its room is given to what waits. A host whose runner cannot say is placed on by
/// count alone.
#[test]
fn work_is_placed_by_what_workers_have_and_waits_with_a_reason() {
    let mut h = harness(&["big", "small"], config(4));
    h.host("big").state.lock().resources = Some("cpu_mhz=16000 memory_mb=32768 cores=8".into());
    h.host("small").state.lock().resources = Some("cpu_mhz=4000 memory_mb=4096 cores=2".into());
    // Their first probe was in the harness, before they could say: ask again a minute on.
    h.clock.advance(RESOURCES_RETRY);
    h.probe();
    let has = |name: &str| h.pool.workers().into_iter().find(|w| w.id.0 == name).unwrap().resources;
    assert_eq!(has("small").map(|r| r.memory_mb), Some(4096));
    let submit = |id: &str, memory_mb: u64| {
        let needs = Amount { cpu_mhz: 500, memory_mb, cores: 0 };
        let submission = Submission::new(id, "").with_needs(needs);
        h.runtime.block_on(h.scheduler.submit(submission)).unwrap();
    };
    submit("tiny", 1_000);
    submit("large", 20_000);
    submit("huge", 40_000);
    submit("medium", 3_500);
    h.step();
    assert_eq!(h.phase("tiny"), running("small"));
    assert_eq!(h.phase("large"), running("big"));
    assert_eq!(h.phase("huge"), WorkPhase::Queued);
    assert_eq!(
        h.scheduler.waiting_reason("huge").as_deref(),
        Some("no worker has 40000 MB free; largest free 12768 MB")
    );
    // `medium` does not fit beside `tiny` on the small worker: it goes to the big one.
    assert_eq!(h.phase("medium"), running("big"));
    assert_eq!(h.scheduler.waiting_reason("medium"), None);

    h.host("big").end("large", "complete all tasks finished");
    h.host("big").end("medium", "complete all tasks finished");
    submit("later", 30_000);
    h.probe();
    h.step();
    assert_eq!(
        h.phase("later"),
        WorkPhase::Queued,
        "until the ends are known, their room is taken"
    );
    assert!(matches!(h.phase("large"), WorkPhase::Ended { .. }));
    h.step();
    assert_eq!(h.phase("later"), running("big"), "room given back by work that ended");
    let why = h.scheduler.waiting_reason("huge").unwrap();
    assert!(why.contains("no worker has 40000 MB free"), "{why}");
    h.take_over();
    assert_eq!(h.phase("huge"), WorkPhase::Queued, "what it needs survives a take-over");
    assert_eq!(h.placement("huge").needs.memory_mb, 40_000);
}

/// Nomad's `TestServiceSched_Reschedule_MultipleNow`: with `attempts = 3` in 30 minutes and a
/// constant 5s delay, work that keeps failing is placed again three times, each attempt under
/// its own id with one more reschedule behind it and the attempt before it in its history
/// (its worker and how it ended); the fourth failure is final.
#[test]
fn reschedule_multiple_now() {
    let h = harness(&["h1", "h2"], config(4));
    let policy = ReschedulePolicy {
        attempts: 3,
        interval: secs(30 * 60),
        delay: secs(5),
        delay_function: wharf_state::DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    };
    h.runtime
        .block_on(h.scheduler.submit(Submission::new("a", "").with_reschedule(policy)))
        .unwrap();
    h.step();
    for attempt in 1..=4u32 {
        let placement = h.placement("a");
        let worker = placement.phase.worker().expect("placed").to_owned();
        assert_eq!(
            (placement.attempt, placement.runner_id()),
            (attempt, wharf_state::fleet::runner_id("a", attempt))
        );
        assert_eq!(placement.reschedules().count(), attempt as usize - 1);
        h.host(&worker).end(&placement.runner_id(), "failed task t exited 1");
        h.probe();
        h.step();
        let after = h.placement("a");
        if attempt == 4 {
            assert!(
                matches!(&after.phase, WorkPhase::Ended { outcome, .. } if outcome.starts_with("failed")),
                "{after:?}"
            );
            break;
        }
        assert_eq!((after.phase.clone(), after.attempt), (WorkPhase::Queued, attempt + 1));
        let previous = after.history.last().expect("the attempt before");
        assert_eq!(
            (previous.attempt, previous.worker.as_deref()),
            (attempt, Some(worker.as_str()))
        );
        assert!(previous.outcome.contains("failed task t exited 1"), "{previous:?}");
        h.clock.advance(secs(6));
        h.step();
    }
    assert_eq!(h.placement("a").history.len(), 3, "attempts 1 to 3, all within the interval");
}

/// A scheduler whose writes fail stops acting: no start goes out for a decision that is not
/// durable, and submissions are refused rather than acknowledged.
#[test]
fn a_scheduler_whose_writes_fail_starts_nothing_and_acknowledges_nothing() {
    let h = harness(&["h1"], config(4));
    h.submit("a");
    h.store.fail_writes(Some("disk full"));
    h.submit_err("b");
    h.step();
    assert!(h.running_on("h1").is_empty(), "nothing started");
    assert!(!h.scheduler.acting());
    h.store.fail_writes(None);
    assert!(h.runtime.block_on(h.store.load("a")).unwrap().is_some());
}

/// A step's changes go to the store in one commit, whole, within what one commit may carry:
/// a step that would change more records stops at its budget, leaves the rest in order, and
/// the next step goes on. No decision is ever split across commits.
#[test]
fn a_step_changes_at_most_one_commits_worth_and_the_next_goes_on() {
    use crate::scheduler::{Books, MAX_CHANGES_PER_ENTRY, Snapshot};
    let now = Timestamp(1_000_000);
    let ids: Vec<String> = (0..250).map(|n| format!("w{n:03}")).collect();
    let work: Vec<(&str, WorkPhase)> =
        ids.iter().map(|id| (id.as_str(), WorkPhase::Queued)).collect();
    let mut books = Books::holding(&work, now);
    let workers = [worker_view("h1", State::Idle, IdleBehavior::Run, &[])];
    let snapshot = Snapshot {
        workers: workers.into_iter().map(|v| (v.id.clone(), v)).collect(),
        creating: HashMap::new(),
        now,
        loaded: true,
        types: Vec::new(),
        held: Default::default(),
        prices: Default::default(),
    };
    let mut launched = Vec::new();
    let mut steps = 0;
    loop {
        steps += 1;
        let decisions = books.decide(&snapshot, &config(0));
        let changes = books.take_changes();
        assert!(changes.len() <= MAX_CHANGES_PER_ENTRY, "step {steps}: {}", changes.len());
        assert_eq!(changes.len(), decisions.launches.len(), "step {steps}: one change a start");
        launched.extend(decisions.launches.into_iter().map(|l| l.id));
        if !decisions.more {
            break;
        }
        assert!(steps < 10, "the steps never finish");
    }
    assert_eq!(launched, ids, "every piece of work placed once, in queue order");
    assert_eq!(steps, 3, "250 starts at {} a step", MAX_CHANGES_PER_ENTRY - 2);

    // The same for work lost with its worker: written off a budget at a time.
    let running: Vec<(&str, WorkPhase)> =
        ids.iter().map(|id| (id.as_str(), running("gone"))).collect();
    let mut books = Books::holding(&running, now);
    let mut lost = 0;
    for step in 1..10 {
        let decisions = books.decide(&snapshot, &config(0));
        let changes = books.take_changes();
        assert!(changes.len() <= MAX_CHANGES_PER_ENTRY, "step {step}: {}", changes.len());
        lost += changes
            .iter()
            .filter(|c| matches!(c, Change::Put(r) if r.placement.phase.is_final()))
            .count();
        if !decisions.more {
            break;
        }
    }
    assert_eq!(lost, 250);
}

/// Through the store: 250 submissions on one worker start in commits the memory store takes
/// (it refuses more than etcd would), and a scheduler that takes over 150 starts in flight
/// writes what it makes of them (running, until a probe says) in entries that fit too.
#[test]
fn many_decisions_at_once_fit_in_the_stores_commits() {
    let mut h = harness(&["h1"], config(0));
    for n in 0..250 {
        h.submit(&format!("w{n:03}"));
    }
    for _ in 0..5 {
        h.step();
    }
    assert!(h.scheduler.acting(), "a commit was refused");
    assert_eq!(h.running_on("h1").len(), 250);

    // 150 starts in flight when the last scheduler stopped, as its records say.
    let me = Replica { name: "before".into(), address: "127.0.0.1:1".into() };
    h.store.lapse();
    let term = h.runtime.block_on(h.store.campaign(&me)).unwrap();
    let starting: Vec<Change> = (250..400)
        .map(|n| {
            let id = format!("w{n:03}");
            let mut placement =
                Placement::queued(&id, Timestamp(1), Amount::ZERO, ReschedulePolicy::DISABLED);
            placement.phase = WorkPhase::Starting { worker: "h1".into() };
            Change::Put(WorkRecord { placement, payload: format!("spec of {id}") })
        })
        .collect();
    for chunk in starting.chunks(50) {
        h.runtime.block_on(h.store.commit(&term, chunk.to_vec())).unwrap();
    }
    h.take_over();
    h.step();
    assert!(h.scheduler.acting(), "the take-over's writes were refused");
    assert_eq!(h.placement("w399").phase, running("h1"), "a start in flight counts as running");
}

/// With the loop running and nothing queued ahead, a submission is placed in the commit that
/// records it: when `submit` returns, the store already holds it placed, and its start is on
/// its way without a step of the loop. Work that finds no room waits in the queue, in order,
/// for the loop's steps.
#[test]
fn a_lone_submission_is_placed_in_the_commit_that_records_it() {
    let h = harness(&["h1"], config(1));
    let scheduler = h.scheduler.clone();
    let looping = h.runtime.spawn(async move { scheduler.run().await });
    h.runtime.block_on(async {
        for _ in 0..1000 {
            if h.scheduler.looping() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the loop never started");
    });
    let stored_phase = |id: &str| {
        let loaded = h.runtime.block_on(h.store.load_all()).unwrap();
        loaded.records.into_iter().find(|r| r.placement.id == id).unwrap().placement.phase
    };

    h.submit("a");
    let placed = stored_phase("a");
    assert!(
        matches!(&placed, WorkPhase::Starting { worker } | WorkPhase::Running { worker } if worker == "h1"),
        "placed in the submission's own commit: {placed:?}"
    );
    h.runtime.block_on(async {
        for _ in 0..1000 {
            if h.phase("a") == running("h1") {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("a never started: {:?}", h.phase("a"));
    });
    assert_eq!(h.running_on("h1"), ["a"]);

    // h1 is full: b waits, and so does c behind it, each recorded as queued.
    h.submit("b");
    h.submit("c");
    assert_eq!((stored_phase("b"), stored_phase("c")), (WorkPhase::Queued, WorkPhase::Queued));
    assert_eq!(h.running_on("h1"), ["a"]);

    h.scheduler.stop_running();
    h.runtime.block_on(looping).unwrap();
    assert!(!h.scheduler.looping());
}
