//! Fleet scenarios, with a real `wharf fleet` process over loopback workers (real agents on
//! this host): the time from a submission through the fleet's API until the worker's agent
//! reports the allocation running (its task started), with the embedded store (redb) and with a real etcd on 127.0.0.1 (Debian's
//! `etcd-server`); what a fleet of 100 loopback workers costs the fleet process (memory, CPU)
//! once they are all idle and probed every 5 s; and how many placement decisions per second
//! the scheduler's best fit makes at 1,000 workers and 10,000 queued allocations.

use crate::Effort;
use crate::report::{Better, Row};
use crate::scratch::Storage;
use crate::target::Target;
use hyper::Method;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use wharf_fleet::placement::{Placer, Slot};
use wharf_node::agent_file::AgentFile;
use wharf_node::client::Client;
use wharf_node::fleet::api::{FleetAlloc, FleetWorker};
use wharf_state::ClientStatus;
use wharf_state::resources::Amount;
use wharf_tests::etcd::Etcd;
use wharf_tests::proc_stat::ProcStat;

/// The token fleet replicas on etcd share (they must be given one).
const ETCD_TOKEN: &str = "wharf-bench-etcd-fleet";
use wharf_tests::fleet::Fleet;

pub(crate) const FULL_LATENCY_SAMPLES: usize = 50;
const FULL_WORKERS: usize = 100;
/// How long the idle fleet's CPU use is sampled.
const FULL_WINDOW: Duration = Duration::from_secs(30);
/// How long a submission may take to run on a worker.
const WAIT_LIMIT: Duration = Duration::from_secs(60);
/// /proc reports CPU time in USER_HZ, 100 per second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// A fleet and a client of its API.
struct FleetProcess {
    fleet: Fleet,
    client: Client,
}

impl FleetProcess {
    /// Starts a fleet with `settings` in a new scratch directory on the disk.
    fn start(wharf: &Path, settings: &str) -> FleetProcess {
        FleetProcess::start_in(wharf, settings, crate::scratch::dir("wharf-bench-fleet"))
    }

    /// Starts a fleet with `settings` in `dir` (its loopback workers' agents keep their data
    /// below it).
    fn start_in(wharf: &Path, settings: &str, dir: PathBuf) -> FleetProcess {
        // The fleet's own progress, and only warnings from the rest (the loopback agents
        // inherit this), so logging does not weigh on the figures.
        let filter = "warn,wharf_node::fleet=info";
        let fleet = Fleet::start(wharf, &dir, settings, filter, Duration::from_secs(60)).unwrap();
        // The token the fleet made and keeps in its data directory, or the one replicas on
        // etcd must share, given in their settings.
        let token = fleet.token().unwrap_or_else(|_| ETCD_TOKEN.to_owned());
        let client = Client::new(fleet.address(), Some(token));
        FleetProcess { fleet, client }
    }

    async fn until_idle(&self, count: usize, limit: Duration) -> Duration {
        let started = Instant::now();
        loop {
            // A replica on etcd answers 503 until it leads.
            let workers: Vec<FleetWorker> =
                self.client.json(Method::GET, "/v1/workers", None).await.unwrap_or_default();
            if workers.iter().filter(|w| w.state == "idle").count() >= count {
                return started.elapsed();
            }
            assert!(started.elapsed() < limit, "{count} workers never all idle: {workers:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn terminate(self) {
        if let Err(error) = self.fleet.terminate(Duration::from_secs(60)) {
            eprintln!("the fleet did not stop cleanly: {error}");
        }
    }
}

/// The process's CPU time so far, its own and its reaped children's, in seconds (none for a
/// process gone).
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let seconds = |ticks: u64| ticks as f64 / TICKS_PER_SECOND;
    ProcStat::of(pid)
        .map_or((0.0, 0.0), |stat| (seconds(stat.cpu_ticks), seconds(stat.reaped_children_ticks)))
}

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let wharf = crate::exec::built("wharf-node", "wharf")?;
    crate::exec::std_shim()?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let samples = effort.scaled(FULL_LATENCY_SAMPLES).max(3);
    let etcd = Etcd::start(Duration::from_secs(30))
        .map_err(|e| format!("the fleet's etcd rows need etcd: {e}"))?;
    let etcd_store =
        format!("[store]\nbackend = \"etcd\"\nendpoints = [\"{}\"]\n", etcd.endpoint());
    let stores = [("redb", String::new()), ("etcd", etcd_store)];
    let mut latency_rows = Vec::new();
    for (store, settings) in &stores {
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for run in 0..effort.runs.min(3) {
            // A fresh prefix per run: each fleet starts from an empty store.
            let settings =
                settings.replace("[store]\n", &format!("[store]\nprefix = \"/bench/{run}\"\n"));
            let mut latencies = runtime.block_on(submit_latencies(&wharf, samples, &settings))?;
            latencies.sort_by(f64::total_cmp);
            p50.push(latencies[latencies.len() / 2]);
            p99.push(latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]);
        }
        let target = if *store == "redb" { "≤ 8 ms" } else { "≤ 15 ms" };
        latency_rows.push((*store, p50, p99, target));
    }
    let failovers: Vec<f64> = (0..effort.runs.min(3))
        .map(|run| runtime.block_on(failover_seconds(&wharf, &etcd, run)))
        .collect::<Result<_, _>>()?;
    drop(etcd);
    let decisions: Vec<f64> = (0..effort.runs).map(|_| placements_per_second()).collect();
    let workers = effort.scaled(FULL_WORKERS).max(2);
    let window = FULL_WINDOW.mul_f64(effort.scale.max(0.1));
    let scale = runtime.block_on(idle_fleet(&wharf, workers, window))?;
    let row = |name: String, unit, better, samples, target: Option<&str>| {
        Ok::<_, String>(Row {
            name,
            unit,
            better,
            samples,
            baseline: None,
            target: target.map(Target::parse).transpose()?,
        })
    };
    let mut rows = Vec::new();
    for (store, p50, p99, target) in latency_rows {
        let name = |p: &str| format!("fleet ({store}): submit to running on a worker, {p}");
        rows.push(row(name("p50"), "ms", Better::Lower, p50, Some(target))?);
        rows.push(row(name("p99"), "ms", Better::Lower, p99, None)?);
    }
    if !failovers.is_empty() {
        let name = format!(
            "fleet (etcd, 3 replicas, {}s lease): leader SIGKILL to the new leader's first placement",
            FAILOVER_LEASE.as_secs()
        );
        rows.push(row(name, "s", Better::Lower, failovers, None)?);
    }
    rows.push(row(
        format!(
            "fleet: placement decisions, {PLACEMENT_WORKERS} workers × {PLACEMENT_QUEUED} queued"
        ),
        "decisions/s",
        Better::Higher,
        decisions,
        Some("≥ 5,000/s"),
    )?);
    for made in [
        row(
            format!("fleet: {workers} loopback workers created until all idle"),
            "s",
            Better::Lower,
            vec![scale.boot.as_secs_f64()],
            (workers == FULL_WORKERS).then_some("≤ 10 s"),
        ),
        row(
            format!("fleet: {workers} idle workers, fleet private memory"),
            "MiB",
            Better::Lower,
            vec![scale.fleet_mib],
            None,
        ),
        row(
            format!("fleet: {workers} idle workers, fleet CPU (own)"),
            "% of a core",
            Better::Lower,
            vec![scale.fleet_cpu],
            None,
        ),
        row(
            format!("fleet: {workers} idle workers, probe commands' CPU"),
            "% of a core",
            Better::Lower,
            vec![scale.probe_cpu],
            None,
        ),
        row(
            format!("fleet: {workers} idle workers, private memory per agent"),
            "MiB",
            Better::Lower,
            vec![scale.agent_mib],
            None,
        ),
    ] {
        rows.push(made?);
    }
    Ok(rows)
}

/// The lease of the failover scenario's replicas (the default is 5 s).
const FAILOVER_LEASE: Duration = Duration::from_secs(3);

/// The replica that says it leads, among `replicas`.
async fn leader_of(replicas: &[Option<FleetProcess>]) -> Result<usize, String> {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        for (i, replica) in replicas.iter().enumerate() {
            let Some(replica) = replica else { continue };
            let status: Option<serde_json::Value> =
                replica.client.json(Method::GET, "/v1/status", None).await.ok();
            if status.is_some_and(|s| s["role"] == "leader") {
                return Ok(i);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no replica led within {WAIT_LIMIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three replicas on `etcd` over two shared loopback workers: the leader is killed with
/// SIGKILL, and the time is taken until a submission through another replica runs, placed by
/// the new leader.
async fn failover_seconds(wharf: &Path, etcd: &Etcd, run: usize) -> Result<f64, String> {
    let shared = crate::scratch::dir("wharf-bench-failover");
    let settings = format!(
        "token = {ETCD_TOKEN:?}\nprobe_interval = \"200ms\"\nsync_interval = \"1s\"\n[loopback]\ninstances = 2\nroot = {:?}\n\
         [runner]\ndirectory = {:?}\n[store]\nbackend = \"etcd\"\nendpoints = [\"{}\"]\n\
         prefix = \"/bench-failover/{run}\"\nlease_ttl = \"{}s\"\n",
        shared.join("instances").display().to_string(),
        shared.join("runner").display().to_string(),
        etcd.endpoint(),
        FAILOVER_LEASE.as_secs(),
    );
    let mut replicas: Vec<Option<FleetProcess>> =
        (0..3).map(|_| Some(FleetProcess::start(wharf, &settings))).collect();
    let first = leader_of(&replicas).await?;
    replicas[first].as_ref().unwrap().until_idle(2, Duration::from_secs(120)).await;
    let killed = Instant::now();
    replicas[first].take().unwrap().fleet.kill();
    let next = leader_of(&replicas).await?;
    let client = replicas[next].as_ref().unwrap().client.clone();
    let spec = "[job]\nid = \"after\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
                [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
                config = { command = \"/bin/sleep\", args = [\"1000\"] }\n";
    let mut alloc: FleetAlloc = loop {
        let body = Some(("application/toml", spec.as_bytes().to_vec()));
        match client.call(Method::POST, "/v1/allocations", body).await {
            Ok(body) => break serde_json::from_slice(&body).map_err(|e| e.to_string())?,
            Err(_) if killed.elapsed() < WAIT_LIMIT => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("no submission taken after the failover: {e}")),
        }
    };
    while alloc.phase != "running" {
        if alloc.is_final() || killed.elapsed() > WAIT_LIMIT {
            return Err(format!("not placed after the failover: {alloc:?}"));
        }
        let path = format!("/v1/allocations/{}?after={}&wait=10s", alloc.id, alloc.version);
        alloc = client.json(Method::GET, &path, None).await.map_err(|e| e.to_string())?;
    }
    let seconds = killed.elapsed().as_secs_f64();
    for replica in replicas.into_iter().flatten() {
        replica.terminate();
    }
    // With a shared store the workers are the fleet's, not a replica's: wipe them here.
    for instance in std::fs::read_dir(shared.join("instances")).into_iter().flatten().flatten() {
        let data = instance.path().join("data");
        #[allow(clippy::disallowed_methods)] // Ending what the scenario started.
        let _ = std::process::Command::new(wharf).arg("--data-dir").arg(data).arg("wipe").output();
    }
    Ok(seconds)
}

const PLACEMENT_WORKERS: usize = 1_000;
const PLACEMENT_QUEUED: usize = 10_000;

/// Best fit for 10,000 queued allocations of mixed sizes over 1,000 workers of three sizes,
/// counts updated as each is placed (as the scheduler does within a step); decisions per
/// second, those that wait counted too.
fn placements_per_second() -> f64 {
    let sizes = [(4_000, 8_192, 2), (16_000, 32_768, 8), (64_000, 262_144, 32)];
    let slots: Vec<Slot> = (0..PLACEMENT_WORKERS)
        .map(|i| {
            let (cpu_mhz, memory_mb, cores) = sizes[i % sizes.len()];
            Slot {
                worker: wharf_prober::InstanceId(format!("w-{i:04}")),
                count: i % 3,
                has: Some(Amount { cpu_mhz, memory_mb, cores }),
                used: Amount::ZERO,
            }
        })
        .collect();
    let needs: Vec<Amount> = (0..PLACEMENT_QUEUED as u64)
        .map(|i| Amount { cpu_mhz: 100 + (i % 7) * 250, memory_mb: 128 + (i % 11) * 512, cores: 0 })
        .collect();
    let mut placer = Placer::new(slots, 64);
    let started = Instant::now();
    let mut placed = 0;
    for needs in &needs {
        placed += usize::from(placer.place(needs).is_ok());
    }
    let seconds = started.elapsed().as_secs_f64();
    assert!(placed > 0, "nothing placed");
    PLACEMENT_QUEUED as f64 / seconds
}

/// Submits `samples` service allocations one after another through the fleet's API, with the
/// store `store` configures (the embedded one if empty), and times each until the agent of
/// the worker the fleet placed it on reports it running.
pub(crate) async fn submit_latencies(
    wharf: &Path,
    samples: usize,
    store: &str,
) -> Result<Vec<f64>, String> {
    let disk = Storage::Disk;
    Ok(submit_latencies_beside_the_agents(wharf, samples, store, 0, disk).await?.through_the_fleet)
}

/// Milliseconds from each submission until running on a worker: through the fleet, and then
/// (`straight` of them) sent by the bench to the last worker's agent through its API, the same
/// task on the same host in the same run: the share of the agent alone.
pub(crate) struct SubmitLatencies {
    pub(crate) through_the_fleet: Vec<f64>,
    pub(crate) straight_to_the_agent: Vec<f64>,
}

/// [`submit_latencies`], and `straight` submissions to a worker's agent as well, with the
/// fleet's data and its workers' on `storage`.
pub(crate) async fn submit_latencies_beside_the_agents(
    wharf: &Path,
    samples: usize,
    store: &str,
    straight: usize,
    storage: Storage,
) -> Result<SubmitLatencies, String> {
    let fleet = FleetProcess::start_in(
        wharf,
        &format!(
            "token = {ETCD_TOKEN:?}\nper_worker_limit = {samples}\nprobe_interval = \"1s\"\n\
             [loopback]\ninstances = 2\n{store}"
        ),
        crate::scratch::dir_on(storage, "wharf-bench-fleet")?,
    );
    fleet.until_idle(2, Duration::from_secs(120)).await;
    let spec = "[job]\nid = \"sleeper\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
                [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
                config = { command = \"/bin/sleep\", args = [\"1000\"] }\n";
    let mut latencies = Vec::with_capacity(samples);
    let mut ids = Vec::with_capacity(samples);
    let mut agents: HashMap<String, Client> = HashMap::new();
    for _ in 0..samples {
        let started = Instant::now();
        let body = fleet
            .client
            .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.into())))
            .await
            .map_err(|e| format!("the fleet refused a submission: {e}"))?;
        let mut alloc: FleetAlloc = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        // Placed and acknowledged by a worker's agent...
        while alloc.phase != "running" {
            if alloc.is_final() || started.elapsed() > WAIT_LIMIT {
                return Err(format!("not placed within {WAIT_LIMIT:?}: {alloc:?}"));
            }
            let path = format!("/v1/allocations/{}?after={}&wait=10s", alloc.id, alloc.version);
            alloc = fleet.client.json(Method::GET, &path, None).await.map_err(|e| e.to_string())?;
        }
        // ...and running there, as that agent reports.
        let worker = alloc.worker.clone().ok_or_else(|| format!("running nowhere: {alloc:?}"))?;
        let agent = match agents.get(&worker) {
            Some(agent) => agent.clone(),
            None => {
                let data = fleet.fleet.data_dir().join("instances").join(&worker).join("data");
                AgentFile::read(&data)?
                    .ok_or_else(|| format!("worker {worker} announces no agent"))?;
                // At the address it announced, with the token it keeps beside it.
                let agent = Client::of_data_dir(&data, None);
                agents.insert(worker, agent.clone());
                agent
            }
        };
        crate::node::wait_for(&agent, &alloc.id, ClientStatus::Running).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        ids.push((alloc.id, agent));
    }
    for (id, _) in &ids {
        let path = format!("/v1/allocations/{id}/stop");
        let _ = fleet.client.call(Method::POST, &path, None).await;
    }
    // Once the fleet's work is down (the agent has room for as many again), the same task
    // straight to a worker's agent.
    let mut straight_latencies = Vec::with_capacity(straight);
    if straight > 0 {
        for (id, agent) in &ids {
            crate::node::wait_for(agent, id, ClientStatus::Complete).await?;
        }
        let agent = &ids.last().ok_or("no sample through the fleet")?.1;
        let mut straight_ids = Vec::with_capacity(straight);
        for _ in 0..straight {
            let started = Instant::now();
            let id = crate::node::submit(agent).await?;
            crate::node::wait_for(agent, &id, ClientStatus::Running).await?;
            straight_latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            straight_ids.push(id);
        }
        for id in &straight_ids {
            let _ = agent.call(Method::POST, &format!("/v1/allocations/{id}/stop"), None).await;
        }
    }
    fleet.terminate();
    Ok(SubmitLatencies { through_the_fleet: latencies, straight_to_the_agent: straight_latencies })
}

struct IdleFleet {
    boot: Duration,
    fleet_mib: f64,
    fleet_cpu: f64,
    probe_cpu: f64,
    agent_mib: f64,
}

/// Starts a fleet of `workers` loopback workers, waits until all are idle, then measures the
/// fleet over `window` of steady probing.
async fn idle_fleet(wharf: &Path, workers: usize, window: Duration) -> Result<IdleFleet, String> {
    let fleet = FleetProcess::start(
        wharf,
        &format!("probe_interval = \"5s\"\n[loopback]\ninstances = {workers}\n"),
    );
    let boot = fleet.until_idle(workers, Duration::from_secs(600)).await;
    let pid = fleet.fleet.pid();
    let (own_before, children_before) = cpu_seconds(pid);
    tokio::time::sleep(window).await;
    let (own_after, children_after) = cpu_seconds(pid);
    let seconds = window.as_secs_f64();
    let instances = fleet.fleet.data_dir().join("instances");
    let mut agents = Vec::new();
    for instance in std::fs::read_dir(&instances).map_err(|e| format!("{instances:?}: {e}"))? {
        let data = instance.map_err(|e| e.to_string())?.path().join("data");
        agents.push(AgentFile::read(&data)?.ok_or_else(|| format!("no agent in {data:?}"))?.pid);
    }
    if agents.len() != workers {
        return Err(format!("{} agents for {workers} idle workers", agents.len()));
    }
    let mut agent_kib = 0.0;
    for agent in &agents {
        agent_kib += crate::peers::private_kib(*agent)?;
    }
    let result = IdleFleet {
        boot,
        fleet_mib: crate::peers::private_kib(pid)? / 1024.0,
        fleet_cpu: (own_after - own_before) / seconds * 100.0,
        probe_cpu: (children_after - children_before) / seconds * 100.0,
        agent_mib: agent_kib / 1024.0 / agents.len().max(1) as f64,
    };
    fleet.terminate();
    Ok(result)
}
