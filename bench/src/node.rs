//! Node scenarios, through the agent's real HTTP API with raw_exec tasks: submit-to-running
//! latency, 1,000 allocations to all running and all stopped (beside supervisord and s6 doing
//! the same with 1,000 processes), the agent's memory per running allocation, and restore.

use crate::Effort;
use crate::peers::{self, PeerRun};
use crate::report::{Better, Row};
use hyper::Method;
use std::path::Path;
use std::time::{Duration, Instant};
use wharf_node::agent::{Agent, StartOptions};
use wharf_node::api::AllocDetail;
use wharf_node::client::Client;
use wharf_node::config::NodeConfig;
use wharf_state::ClientStatus;

const FULL_LATENCY_SAMPLES: usize = 200;
const FULL_ALLOCS: usize = 1000;
const FULL_RECORDS: usize = 10_000;
/// The kill timeout of the task that ignores SIGTERM.
const KILL_TIMEOUT: Duration = Duration::from_millis(500);

pub(crate) fn run(effort: Effort) -> Vec<Row> {
    let shim = match crate::exec::shim() {
        Ok(shim) => shim,
        Err(error) => {
            eprintln!("node scenarios skipped: {error}");
            return Vec::new();
        }
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let count = effort.scaled(FULL_ALLOCS);
    let mut latencies = Vec::new();
    let mut fleet = Fleet::default();
    let records = effort.scaled(FULL_RECORDS);
    let (mut restore_records, mut overshoot) = (Vec::new(), Vec::new());
    // Each run starts 3,000 real processes (wharf, supervisord, s6): three runs are enough.
    for _ in 0..effort.runs.min(3) {
        let dir = crate::scratch::dir("wharf-bench-node");
        restore_records.push(runtime.block_on(restore_finished(config(&dir, &shim), records)));
        let dir = crate::scratch::dir("wharf-bench-node");
        overshoot.push(runtime.block_on(stop_overshoot(&dir, &shim)));
        let dir = crate::scratch::dir("wharf-bench-node");
        // What the scenarios before wrote (ten thousand records, a thousand task directories)
        // is flushed first, not measured as part of a submission's fsync.
        crate::exec::settle();
        latencies.extend(
            runtime.block_on(submit_latencies(
                config(&dir, &shim),
                effort.scaled(FULL_LATENCY_SAMPLES),
            )),
        );
        let dir = crate::scratch::dir("wharf-bench-node");
        fleet.add(runtime.block_on(many(config(&dir, &shim), count)));
        let peer_dir = crate::scratch::dir("wharf-bench-peer");
        fleet.supervisord.push(peers::supervisord(&peer_dir, count));
        let peer_dir = crate::scratch::dir("wharf-bench-peer");
        fleet.s6.push(peers::s6(&peer_dir, count));
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let mut rows = vec![
        Row {
            name: "node: submit to running through the API, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: vec![percentile(&latencies, 0.50)],
            baseline: None,
            target: Some("≤ 5 ms".into()),
        },
        Row {
            name: "node: submit to running through the API, p99".into(),
            unit: "ms",
            better: Better::Lower,
            samples: vec![percentile(&latencies, 0.99)],
            baseline: None,
            target: Some("≤ 25 ms".into()),
        },
        Row {
            name: format!(
                "node: agent heap per running allocation ({count} allocations, shims not counted)"
            ),
            unit: "KiB",
            better: Better::Lower,
            samples: fleet.heap_kib.clone(),
            baseline: None,
            target: Some("≤ 64 KiB".into()),
        },
        Row {
            name: format!("node: restore of {records} finished allocations (records only)"),
            unit: "ms",
            better: Better::Lower,
            samples: restore_records.iter().map(ms).collect(),
            baseline: None,
            target: None,
        },
        Row {
            name: format!(
                "exec: stop of a task that ignores SIGTERM, past its {}ms kill timeout",
                KILL_TIMEOUT.as_millis()
            ),
            unit: "ms",
            better: Better::Lower,
            samples: overshoot.iter().map(ms).collect(),
            baseline: None,
            target: Some("≤ 100 ms".into()),
        },
        Row {
            name: format!("node: restore of {count} allocations with running tasks"),
            unit: "ms",
            better: Better::Lower,
            samples: fleet.restore.iter().map(ms).collect(),
            baseline: None,
            target: (count == FULL_ALLOCS).then(|| "≤ 200 ms".into()),
        },
    ];
    for (peer, runs) in [("supervisord", &fleet.supervisord), ("s6", &fleet.s6)] {
        let peer_runs: Vec<PeerRun> = match runs.iter().cloned().collect::<Result<Vec<_>, _>>() {
            Ok(runs) => runs,
            Err(error) => {
                eprintln!("{peer} not measured: {error}");
                continue;
            }
        };
        rows.push(Row {
            name: format!("{count} processes: start until all reported running"),
            unit: "ms",
            better: Better::Lower,
            samples: fleet.start.iter().map(ms).collect(),
            baseline: Some((peer.into(), peer_runs.iter().map(|r| ms(&r.start)).collect())),
            target: None,
        });
        rows.push(Row {
            name: format!("{count} processes: stop until all reported down"),
            unit: "ms",
            better: Better::Lower,
            samples: fleet.stop.iter().map(ms).collect(),
            baseline: Some((peer.into(), peer_runs.iter().map(|r| ms(&r.stop)).collect())),
            target: None,
        });
        rows.push(Row {
            name: format!("{count} processes: memory the supervisor adds (wharf: agent heap for them plus shims; peers: private memory)"),
            unit: "MiB",
            better: Better::Lower,
            samples: fleet.supervisor_mib.clone(),
            baseline: Some((
                peer.into(),
                peer_runs.iter().map(|r| r.memory_kib / 1024.0).collect(),
            )),
            target: None,
        });
    }
    rows
}

#[derive(Default)]
struct Fleet {
    start: Vec<Duration>,
    stop: Vec<Duration>,
    restore: Vec<Duration>,
    heap_kib: Vec<f64>,
    supervisor_mib: Vec<f64>,
    supervisord: Vec<Result<PeerRun, String>>,
    s6: Vec<Result<PeerRun, String>>,
}

impl Fleet {
    fn add(&mut self, run: Many) {
        self.start.push(run.start);
        self.stop.push(run.stop);
        self.restore.push(run.restore);
        self.heap_kib.push(run.heap_kib);
        self.supervisor_mib.push(run.supervisor_mib);
    }
}

fn config(dir: &Path, shim: &Path) -> NodeConfig {
    let mut config = NodeConfig { data_dir: dir.join("data"), ..NodeConfig::default() };
    config.drivers.raw_exec.shim_path = Some(shim.to_owned());
    config.gc.max_allocs = usize::MAX;
    config
}

const SLEEPER: &str = "[job]\nid = \"bench\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
    [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\nkill_timeout = \"5s\"\nconfig = { command = \"/bin/sleep\", args = [\"1000\"] }\n";

async fn submit(client: &Client) -> String {
    let bytes = client
        .call(
            Method::POST,
            "/v1/allocations",
            Some(("application/toml", SLEEPER.as_bytes().to_vec())),
        )
        .await
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    value["id"].as_str().unwrap().to_owned()
}

async fn wait_for(client: &Client, id: &str, done: impl Fn(&AllocDetail) -> bool) {
    let mut version = String::new();
    loop {
        let detail: AllocDetail = client
            .json(Method::GET, &format!("/v1/allocations/{id}?after={version}&wait=30s"), None)
            .await
            .unwrap();
        if done(&detail) {
            return;
        }
        version = detail.version;
    }
}

fn running(detail: &AllocDetail) -> bool {
    detail.state.client_status == ClientStatus::Running
}

/// Milliseconds from each POST until the allocation's state says running.
async fn submit_latencies(config: NodeConfig, samples: usize) -> Vec<f64> {
    let (client, agent) = wharf_node::serve::embedded(config).await.unwrap();
    let mut latencies = Vec::with_capacity(samples);
    let mut ids = Vec::new();
    for _ in 0..samples {
        let started = Instant::now();
        let id = submit(&client).await;
        wait_for(&client, &id, running).await;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        ids.push(id);
    }
    stop_all(&client, &ids).await;
    agent.stop().await;
    latencies
}

struct Many {
    start: Duration,
    stop: Duration,
    restore: Duration,
    heap_kib: f64,
    supervisor_mib: f64,
}

/// `count` allocations through the API until all run; the agent's heap and the shims' memory;
/// a restart of the agent (restore); then stop them all.
async fn many(config: NodeConfig, count: usize) -> Many {
    let heap_before = crate::heap::live_bytes();
    let (client, agent) = wharf_node::serve::embedded(config.clone()).await.unwrap();
    let started = Instant::now();
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(submit(&client).await);
    }
    for id in &ids {
        wait_for(&client, id, running).await;
    }
    let start = started.elapsed();
    let heap_kib = (crate::heap::live_bytes() - heap_before).max(0) as f64 / 1024.0 / count as f64;
    let shims: f64 = shim_pids(&config).into_iter().map(peers::private_kib).sum();
    // The agent runs inside this bench process, whose own memory holds earlier scenarios too:
    // count what the agent holds for these allocations (heap) plus the shims' private memory.
    let supervisor_mib = (heap_kib * count as f64 + shims) / 1024.0;

    // Restart the agent: tasks keep running; the new agent restores and reattaches.
    agent.stop().await;
    let restarting = Instant::now();
    let restored = Agent::start(config, StartOptions::default()).await.unwrap();
    let restore = restarting.elapsed();
    for runner in restored.list() {
        let _ = runner.subscribe().wait_for(|s| s.client_status == ClientStatus::Running).await;
    }

    let stopping = Instant::now();
    // Each stop returns once durable; sent together, they share the store's group commits.
    let mut stops = tokio::task::JoinSet::new();
    for id in ids {
        let agent = restored.clone();
        stops.spawn(async move { agent.stop(&id).await });
    }
    while let Some(stopped) = stops.join_next().await {
        stopped.unwrap().unwrap();
    }
    for runner in restored.list() {
        runner.wait().await;
    }
    let stop = stopping.elapsed();
    restored.shutdown().await;
    Many { start, stop, restore, heap_kib, supervisor_mib }
}

/// Writes `count` finished allocations into a fresh store, then times an agent's start.
async fn restore_finished(config: NodeConfig, count: usize) -> Duration {
    std::fs::create_dir_all(&config.data_dir).unwrap();
    {
        let store = wharf_store::RedbStore::open(config.store_path()).unwrap();
        let job = wharf_state::spec::parse_toml(SLEEPER).unwrap();
        let mut dead = wharf_state::TaskState::new();
        dead.set_status(wharf_state::TaskStatus::Dead, wharf_state::Timestamp(1)).unwrap();
        let mut writes = tokio::task::JoinSet::new();
        for i in 0..count {
            let (store, job, dead) = (store.clone(), job.clone(), dead.clone());
            writes.spawn(async move {
                let alloc = wharf_state::Allocation {
                    id: format!("record-{i}"),
                    job,
                    task_group: "g".into(),
                    desired_status: wharf_state::DesiredStatus::Run,
                    modify_index: 1,
                    deployment_id: None,
                    ports: Vec::new(),
                };
                let batch = wharf_store::WriteBatch::new()
                    .put_allocation(&alloc)
                    .unwrap()
                    .put_task_state(&alloc.id, "t", &dead)
                    .unwrap();
                wharf_store::StateStore::write(&store, batch).await.unwrap();
            });
        }
        while writes.join_next().await.is_some() {}
    }
    let started = Instant::now();
    let agent = Agent::start(config, StartOptions::default()).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(agent.list().len(), count);
    agent.shutdown().await;
    elapsed
}

/// How long stopping a task that ignores SIGTERM takes beyond its kill timeout.
async fn stop_overshoot(dir: &Path, shim: &Path) -> Duration {
    use wharf_driver::Driver;
    let driver = wharf_exec::RawExecDriver::with_shim(shim);
    let task_dir = dir.join("task");
    std::fs::create_dir_all(task_dir.join("logs")).unwrap();
    let config = wharf_driver::TaskConfig {
        id: wharf_driver::TaskId::new("bench", "stubborn", 1),
        alloc_id: "bench".into(),
        job_id: "bench".into(),
        group: "g".into(),
        task_name: "stubborn".into(),
        env: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        task_dir: task_dir.clone(),
        alloc_dir: dir.to_owned(),
        logs: wharf_driver::LogConfig { dir: task_dir.join("logs"), max_files: 2, max_file_bytes: 1 << 20 },
        resources: Default::default(),
        driver_config: serde_json::json!({"command": "/bin/sh", "args": ["-c", "trap '' TERM; echo ready; exec sleep 1000"]})
            .as_object()
            .cloned()
            .unwrap(),
    };
    let handle = driver.start_task(config).await.unwrap();
    // The trap is set once the shell printed: wait for that line.
    let out = task_dir.join("logs/stubborn.stdout.0");
    while std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    driver.stop_task(handle.id(), KILL_TIMEOUT, wharf_state::Signal::Term).await.unwrap();
    let overshoot = started.elapsed().saturating_sub(KILL_TIMEOUT);
    let _ = driver.destroy_task(handle.id(), true).await;
    overshoot
}

async fn stop_all(client: &Client, ids: &[String]) {
    for id in ids {
        client.call(Method::POST, &format!("/v1/allocations/{id}/stop"), None).await.unwrap();
    }
    for id in ids {
        wait_for(client, id, |d| d.done).await;
    }
}

/// The shims of this agent's tasks: `wharf-shim` processes whose command line names its data dir.
fn shim_pids(config: &NodeConfig) -> Vec<u32> {
    let data = config.data_dir.canonicalize().unwrap_or_else(|_| config.data_dir.clone());
    let data = data.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.contains(wharf_exec::SHIM_NAME) && cmdline.contains(&data)
        })
        .collect()
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}
