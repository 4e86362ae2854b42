//! Node scenarios, through the agent's real HTTP API with raw_exec tasks: submit-to-running
//! latency, the agent's heap per running allocation (an agent in this process, measured with
//! the bench's counting allocator), and restore. The agent beside supervisord and s6 is in
//! `peers`.

use crate::Effort;
use crate::report::{Better, Row};
use crate::scratch::Storage;
use crate::target::Target;
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

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let shim = crate::exec::shim()?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let count = effort.scaled(FULL_ALLOCS);
    let (mut latencies, mut latencies_in_memory) = (Vec::new(), Vec::new());
    let records = effort.scaled(FULL_RECORDS);
    let (mut restore_records, mut overshoot, mut heap_kib, mut restore) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Each run starts a thousand real processes, and restores ten thousand records: three runs
    // are enough.
    for _ in 0..effort.runs.min(3) {
        let dir = crate::scratch::dir("wharf-bench-node");
        restore_records.push(runtime.block_on(restore_finished(config(&dir, &shim), records)));
        let dir = crate::scratch::dir("wharf-bench-node");
        overshoot.push(runtime.block_on(stop_overshoot(&dir, &shim))?);
        // What the scenarios before wrote (ten thousand records, a thousand task directories)
        // is flushed first, not measured as part of a submission's fsync.
        crate::exec::settle();
        // The same starts with the data directory on tmpfs too: what the disk costs a start.
        for (storage, latencies) in
            [(Storage::Disk, &mut latencies), (Storage::Memory, &mut latencies_in_memory)]
        {
            let dir = crate::scratch::dir_on(storage, "wharf-bench-node")?;
            latencies.extend(runtime.block_on(submit_latencies(
                config(&dir, &shim),
                effort.scaled(FULL_LATENCY_SAMPLES),
            ))?);
        }
        let dir = crate::scratch::dir("wharf-bench-node");
        let held = runtime.block_on(held_and_restored(config(&dir, &shim), count))?;
        heap_kib.push(held.heap_kib);
        restore.push(held.restore);
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    Ok(vec![
        Row {
            name: "node: submit to running through the API, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: vec![percentile(&latencies, 0.50)],
            baseline: None,
            target: Some(Target::parse("≤ 5 ms")?),
        },
        Row {
            name: "node: submit to running through the API, p99".into(),
            unit: "ms",
            better: Better::Lower,
            samples: vec![percentile(&latencies, 0.99)],
            baseline: None,
            target: Some(Target::parse("≤ 25 ms")?),
        },
        Row {
            name: "node: submit to running through the API, data directory on tmpfs, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: vec![percentile(&latencies_in_memory, 0.50)],
            baseline: Some((
                "the data directory on the disk".into(),
                vec![percentile(&latencies, 0.50)],
            )),
            target: None,
        },
        Row {
            name: format!(
                "node: agent heap per running allocation ({count} allocations, shims not counted)"
            ),
            unit: "KiB",
            better: Better::Lower,
            samples: heap_kib,
            baseline: None,
            target: Some(Target::parse("≤ 64 KiB")?),
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
            target: Some(Target::parse("≤ 100 ms")?),
        },
        Row {
            name: format!("node: restore of {count} allocations with running tasks"),
            unit: "ms",
            better: Better::Lower,
            samples: restore.iter().map(ms).collect(),
            baseline: None,
            target: (count == FULL_ALLOCS).then(|| Target::parse("≤ 200 ms")).transpose()?,
        },
    ])
}

/// A task asks for 100 MHz and 300 MiB unless its job says otherwise: the node declares room
/// for every allocation of a run, as an operator would for tasks that idle.
pub(crate) const NODE_CPU_MHZ: u64 = 1_000_000;
pub(crate) const NODE_MEMORY_MB: u64 = 1_000_000;

pub(crate) fn config(dir: &Path, shim: &Path) -> NodeConfig {
    let mut config = NodeConfig { data_dir: dir.join("data"), ..NodeConfig::default() };
    config.drivers.raw_exec.shim_path = Some(shim.to_owned());
    config.gc.max_allocs = usize::MAX;
    config.resources.cpu_total_compute = NODE_CPU_MHZ;
    config.resources.memory_total_mb = NODE_MEMORY_MB;
    config
}

const SLEEPER: &str = "[job]\nid = \"bench\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
    [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\nkill_timeout = \"5s\"\nconfig = { command = \"/bin/sleep\", args = [\"1000\"] }\n";

/// How long a bench waits for one allocation to reach a state.
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(60);

pub(crate) async fn submit(client: &Client) -> Result<String, String> {
    let bytes = client
        .call(
            Method::POST,
            "/v1/allocations",
            Some(("application/toml", SLEEPER.as_bytes().to_vec())),
        )
        .await
        .map_err(|e| format!("submission refused: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("submission's answer: {e}"))?;
    value["id"].as_str().map(str::to_owned).ok_or_else(|| format!("no id in {value}"))
}

/// Waits at most [`WAIT_LIMIT`] until allocation `id` is `wanted`; fails if it settles in
/// another state (its runner is done) or the wait runs out.
pub(crate) async fn wait_for(
    client: &Client,
    id: &str,
    wanted: ClientStatus,
) -> Result<(), String> {
    let deadline = Instant::now() + WAIT_LIMIT;
    let mut version = String::new();
    loop {
        let path = format!("/v1/allocations/{id}?after={version}&wait=10s");
        let detail: AllocDetail =
            client.json(Method::GET, &path, None).await.map_err(|e| format!("{id}: {e}"))?;
        if detail.state.client_status == wanted {
            return Ok(());
        }
        if detail.done || detail.state.client_status.is_terminal() {
            return Err(format!(
                "{id} is {:?} ({}), not {wanted:?}",
                detail.state.client_status, detail.state.client_description
            ));
        }
        if Instant::now() > deadline {
            return Err(format!("{id} not {wanted:?} within {WAIT_LIMIT:?}"));
        }
        version = detail.version;
    }
}

/// Milliseconds from each POST until the allocation's state says running.
async fn submit_latencies(config: NodeConfig, samples: usize) -> Result<Vec<f64>, String> {
    let (client, agent) = wharf_node::serve::embedded(config).await.map_err(|e| e.to_string())?;
    let mut latencies = Vec::with_capacity(samples);
    let mut ids = Vec::new();
    for _ in 0..samples {
        let started = Instant::now();
        let id = submit(&client).await?;
        wait_for(&client, &id, ClientStatus::Running).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        ids.push(id);
    }
    stop_all(&client, &ids).await?;
    agent.stop().await;
    Ok(latencies)
}

struct Held {
    restore: Duration,
    heap_kib: f64,
}

/// `count` allocations through the API of an agent in this process until all run, for the
/// heap it holds for them (the bench's counting allocator); a restart of the agent (restore);
/// then a stop of them all.
async fn held_and_restored(config: NodeConfig, count: usize) -> Result<Held, String> {
    let heap_before = crate::heap::live_bytes();
    let (client, agent) =
        wharf_node::serve::embedded(config.clone()).await.map_err(|e| e.to_string())?;
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(submit(&client).await?);
    }
    for id in &ids {
        wait_for(&client, id, ClientStatus::Running).await?;
    }
    let heap_kib = (crate::heap::live_bytes() - heap_before) as f64 / 1024.0 / count as f64;

    // Restart the agent: tasks keep running; the new agent restores and reattaches.
    agent.stop().await;
    let restarting = Instant::now();
    let restored =
        Agent::start(config, StartOptions::default()).await.map_err(|e| e.to_string())?;
    let restore = restarting.elapsed();
    for runner in restored.list() {
        crate::alloc::running(&runner).await?;
    }
    // Each stop returns once durable; sent together, they share the store's group commits.
    let mut stops = tokio::task::JoinSet::new();
    for id in ids {
        let agent = restored.clone();
        stops.spawn(async move { agent.stop(&id).await });
    }
    while let Some(stopped) = stops.join_next().await {
        stopped.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    }
    for runner in restored.list() {
        tokio::time::timeout(WAIT_LIMIT, runner.wait())
            .await
            .map_err(|_| format!("{} did not stop within {WAIT_LIMIT:?}", runner.id()))?;
    }
    restored.shutdown().await;
    Ok(Held { restore, heap_kib })
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

/// How long stopping a task that ignores SIGTERM takes beyond its kill timeout. The stop must
/// last at least the timeout and the task die of SIGKILL: a stop that returned early, or a
/// task that ended some other way, is an error for the row rather than a figure (as a
/// figure, an early return would score best).
async fn stop_overshoot(dir: &Path, shim: &Path) -> Result<Duration, String> {
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
        mounts: Vec::new(),
        driver_config: serde_json::json!({"command": "/bin/sh", "args": ["-c", "trap '' TERM; echo ready; exec sleep 1000"]})
            .as_object()
            .cloned()
            .unwrap(),
    };
    let handle =
        driver.start_task(config).await.map_err(|e| format!("starting the stubborn task: {e}"))?;
    let measured = async {
        // The trap is set once the shell printed: wait (bounded) for that line.
        let out = task_dir.join("logs/stubborn.stdout.0");
        let deadline = Instant::now() + WAIT_LIMIT;
        while std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) == 0 {
            if Instant::now() > deadline {
                return Err(format!("the stubborn task printed nothing within {WAIT_LIMIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let started = Instant::now();
        driver
            .stop_task(handle.id(), KILL_TIMEOUT, wharf_state::Signal::Term)
            .await
            .map_err(|e| format!("stopping the stubborn task: {e}"))?;
        let took = started.elapsed();
        let exit = tokio::time::timeout(WAIT_LIMIT, driver.wait_task(handle.id()))
            .await
            .map_err(|_| format!("the stubborn task's end unknown {WAIT_LIMIT:?} after its stop"))?
            .map_err(|e| format!("the stubborn task's end: {e}"))?;
        judge_kill(took, exit.signal)
    }
    .await;
    let _ = driver.destroy_task(handle.id(), true).await;
    measured
}

/// The figure of the kill-timeout row, from how long the stop took and the signal that ended
/// the task: the time past the timeout, or why there is none.
fn judge_kill(took: Duration, signal: Option<i32>) -> Result<Duration, String> {
    if took < KILL_TIMEOUT {
        return Err(format!(
            "the stop of a task that ignores SIGTERM returned after {took:?}, before its kill timeout of {KILL_TIMEOUT:?}"
        ));
    }
    if signal != Some(nix::libc::SIGKILL) {
        return Err(format!(
            "the task that ignores SIGTERM ended by {}, not by SIGKILL, when its kill timeout passed",
            signal.map_or("an exit, no signal".into(), |s| format!("signal {s}"))
        ));
    }
    Ok(took - KILL_TIMEOUT)
}

/// Stops every allocation and waits (bounded) until each has finished, complete.
async fn stop_all(client: &Client, ids: &[String]) -> Result<(), String> {
    for id in ids {
        let path = format!("/v1/allocations/{id}/stop");
        client.call(Method::POST, &path, None).await.map_err(|e| format!("{id}: {e}"))?;
    }
    for id in ids {
        wait_for(client, id, ClientStatus::Complete).await?;
    }
    Ok(())
}

/// The shims of this agent's tasks: `wharf-shim` processes whose command line names its data dir.
pub(crate) fn shim_pids(config: &NodeConfig) -> Vec<u32> {
    let data = config.data_dir.canonicalize().unwrap_or_else(|_| config.data_dir.clone());
    let data = data.display().to_string();
    wharf_tests::proc_stat::pids()
        .filter_map(|pid| u32::try_from(pid).ok())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_timeout_row_counts_only_a_stop_that_waited_and_killed() {
        let past = |ms| KILL_TIMEOUT + Duration::from_millis(ms);
        let kill = Some(nix::libc::SIGKILL);
        assert_eq!(judge_kill(past(3), kill), Ok(Duration::from_millis(3)));
        assert_eq!(judge_kill(KILL_TIMEOUT, kill), Ok(Duration::ZERO));
        let early = judge_kill(KILL_TIMEOUT - Duration::from_millis(1), kill).unwrap_err();
        assert!(early.contains("before its kill timeout"), "{early}");
        let termed = judge_kill(past(3), Some(nix::libc::SIGTERM)).unwrap_err();
        assert!(termed.contains("signal 15, not by SIGKILL"), "{termed}");
        let exited = judge_kill(past(3), None).unwrap_err();
        assert!(exited.contains("an exit"), "{exited}");
    }
}
