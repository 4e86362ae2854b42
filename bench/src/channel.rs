//! The probe channel beside the command per probe (`--only channel`): run probes per second
//! against one local sshd, with `wharf` as the runner and a real agent answering, each probe a
//! request on the worker's long-lived channel or a command in a session of its own; the
//! worker's CPU per probe (sshd and everything under it, the agent), which is what a probe
//! costs the machine it watches; and the fleet's submit-to-running latency with its starts
//! over the channel and as commands, beside the same task submitted straight to the worker's
//! agent (the agent's share of it).

use crate::Effort;
use crate::report::{Better, Row};
use crate::scratch::Storage;
use crate::target::Target;
use nix::sys::resource::{UsageWho, getrusage};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_prober::ssh::{parse_private_key, parse_public_key};
use wharf_prober::*;
use wharf_tests::proc_stat::{self, ProcStat};
use wharf_tests::sshd::Sshd;

const WORKERS: usize = 32;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let wharf = crate::exec::built("wharf-node", "wharf")?;
    crate::exec::std_shim()?;
    let mut rows = probe_rows(&wharf, effort)?;
    rows.extend(fleet_rows(&wharf, effort)?);
    Ok(rows)
}

/// What one window of probes found.
struct Measured {
    rate: f64,
    /// CPU per probe on the worker: sshd, its sessions and what runs in them, and the agent.
    worker: WorkerCpu,
    /// CPU per probe in this process.
    prober: Duration,
}

fn probe_rows(wharf: &Path, effort: Effort) -> Result<Vec<Row>, String> {
    let sshd = Sshd::start()
        .map_err(|e| format!("the probe channel benchmark needs a local sshd: {e}"))?;
    let agent = Agent::start(wharf)?;
    let window = Duration::from_secs_f64((5.0 * effort.scale).max(0.5));
    let (mut channel, mut command) = (Vec::new(), Vec::new());
    for _ in 0..effort.runs {
        channel.push(probe_window(&sshd, wharf, &agent, window, true)?);
        command.push(probe_window(&sshd, wharf, &agent, window, false)?);
    }
    let rate = |m: &[Measured]| m.iter().map(|m| m.rate).collect::<Vec<_>>();
    let micros = |m: &[Measured], f: fn(&Measured) -> Duration| {
        m.iter().map(|m| f(m).as_secs_f64() * 1e6).collect::<Vec<_>>()
    };
    Ok(vec![
        Row {
            name: format!(
                "prober: run probes/s against one local sshd, {WORKERS} workers over the probe channel (wharf runner, real agent)"
            ),
            unit: "/s",
            better: Better::Higher,
            samples: rate(&channel),
            baseline: Some(("a command per probe (same runner)".into(), rate(&command))),
            target: Some(Target::parse("≥ 2,000/s")?),
        },
        Row {
            name: "prober: the worker's CPU per run probe over the probe channel (sshd, channel server, agent)".into(),
            unit: "µs",
            better: Better::Lower,
            samples: micros(&channel, |m| m.worker.total()),
            baseline: Some(("a command per probe".into(), micros(&command, |m| m.worker.total()))),
            target: Some(Target::parse("≤ 300 µs")?),
        },
        Row {
            name: "prober: of which sshd (relaying the channel; for a command, its session, shell and the wharf CLI)".into(),
            unit: "µs",
            better: Better::Lower,
            samples: micros(&channel, |m| m.worker.sshd),
            baseline: Some(("a command per probe".into(), micros(&command, |m| m.worker.sshd))),
            target: None,
        },
        Row {
            name: "prober: of which the channel server (`wharf probe-channel`)".into(),
            unit: "µs",
            better: Better::Lower,
            samples: micros(&channel, |m| m.worker.runner),
            baseline: None,
            target: None,
        },
        Row {
            name: "prober: of which the agent (its /v1/probe)".into(),
            unit: "µs",
            better: Better::Lower,
            samples: micros(&channel, |m| m.worker.agent),
            baseline: Some(("a command per probe".into(), micros(&command, |m| m.worker.agent))),
            target: None,
        },
        Row {
            name: "prober: its own CPU per run probe over the probe channel".into(),
            unit: "µs",
            better: Better::Lower,
            samples: micros(&channel, |m| m.prober),
            baseline: Some(("a command per probe".into(), micros(&command, |m| m.prober))),
            target: None,
        },
    ])
}

/// A `wharf agent` of its own data dir, on a port the kernel picks; killed when dropped.
struct Agent {
    child: std::process::Child,
    data_dir: PathBuf,
    _scratch: PathBuf,
}

impl Agent {
    fn start(wharf: &Path) -> Result<Agent, String> {
        let scratch = crate::scratch::dir("wharf-bench-channel");
        let data_dir = scratch.join("data");
        #[allow(clippy::disallowed_methods)] // The benchmark's own agent, ended when dropped.
        let child = std::process::Command::new(wharf)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["agent", "--address", "127.0.0.1:0"])
            .env_remove("WHARF_TOKEN")
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", wharf.display()))?;
        let agent = Agent { child, data_dir, _scratch: scratch };
        let started = Instant::now();
        while !agent.data_dir.join("agent.json").exists() {
            if started.elapsed() > Duration::from_secs(30) {
                return Err("the benchmark's agent never announced itself".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(agent)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn own_cpu() -> Duration {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
            };
            tv(usage.user_time()) + tv(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Where a worker's CPU goes: sshd (with its sessions, and the commands they ran and reaped),
/// the runner processes living under it (the channel servers), and the agent.
#[derive(Debug, Clone, Copy, Default)]
struct WorkerCpu {
    sshd: Duration,
    runner: Duration,
    agent: Duration,
}

impl WorkerCpu {
    fn total(&self) -> Duration {
        self.sshd + self.runner + self.agent
    }

    fn since(&self, before: &WorkerCpu) -> WorkerCpu {
        WorkerCpu {
            sshd: self.sshd.saturating_sub(before.sshd),
            runner: self.runner.saturating_sub(before.runner),
            agent: self.agent.saturating_sub(before.agent),
        }
    }
}

/// The CPU of `sshd` and every process under it, living or reaped by one that lives, and of
/// `agent` (clock ticks of 10 ms).
fn worker_cpu(sshd: u32, agent: u32) -> WorkerCpu {
    let mut processes: Vec<(u32, u32, bool, u64)> = Vec::new();
    for pid in proc_stat::pids() {
        let (Some(stat), Ok(pid)) = (ProcStat::of(pid), u32::try_from(pid)) else { continue };
        let parent = u32::try_from(stat.parent).unwrap_or(0);
        let ticks = stat.cpu_ticks + stat.reaped_children_ticks;
        processes.push((pid, parent, stat.name == "wharf", ticks));
    }
    let mut inside: Vec<u32> = vec![sshd];
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, parent, _, _) in &processes {
            if inside.contains(parent) && !inside.contains(pid) {
                inside.push(*pid);
                grew = true;
            }
        }
    }
    let mut cpu = WorkerCpu::default();
    let ticks = |t: u64| Duration::from_millis(t * 10);
    for (pid, _, runner, t) in &processes {
        if *pid == agent {
            cpu.agent += ticks(*t);
        } else if inside.contains(pid) {
            match runner {
                true => cpu.runner += ticks(*t),
                false => cpu.sshd += ticks(*t),
            }
        }
    }
    cpu
}

/// Probes `WORKERS` workers of one sshd in a loop for `window`, over the channel or not.
fn probe_window(
    sshd: &Sshd,
    wharf: &Path,
    agent: &Agent,
    window: Duration,
    over_channel: bool,
) -> Result<Measured, String> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let key = Arc::new(parse_private_key(&sshd.client_key).map_err(|e| e.to_string())?);
    let host_key = parse_public_key(&sshd.host_key).map_err(|e| e.to_string())?;
    let program = quote("wharf", &wharf.display().to_string()).map_err(|e| e.to_string())?;
    let data_dir =
        quote("data dir", &agent.data_dir.display().to_string()).map_err(|e| e.to_string())?;
    let config = Arc::new(
        WorkerConfig {
            runner: RunnerConfig {
                command: program,
                resources_args: None,
                ..RunnerConfig::default()
            },
            ..WorkerConfig::default()
        }
        .prepare()
        .map_err(|e| e.to_string())?,
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let brake = Arc::new(Brake::default());
    let mut channels = Vec::new();
    let workers: Vec<Arc<Worker>> = (0..WORKERS)
        .map(|i| {
            let instance = Instance {
                id: InstanceId(format!("w{i}")),
                address: Some(sshd.address.clone()),
                remote_user: "root".into(),
                tags: Tags::new(),
                host_key: None,
                runner_args: format!("--data-dir {data_dir}"),
            };
            let ssh = Arc::new(SshExecutor::new(
                &instance.id.0,
                SshTarget {
                    address: Some(sshd.address.clone()),
                    user: sshd.user.clone(),
                    host_key: Some(host_key.clone()),
                },
                key.clone(),
            ));
            let executor: Arc<dyn Executor> = if over_channel {
                let channel = ChannelConfig::for_runner(&config, &instance).unwrap();
                let channel = Arc::new(ChannelExecutor::new(&instance, ssh.clone(), ssh, channel));
                channels.push(channel.clone());
                channel
            } else {
                ssh
            };
            Arc::new(Worker::new(
                WorkerSpec {
                    instance,
                    instance_type: "bench".into(),
                    state: State::Idle,
                    idle_behavior: IdleBehavior::Hold,
                },
                executor,
                config.clone(),
                clock.clone(),
                brake.clone(),
            ))
        })
        .collect();
    let measured = runtime.block_on(async {
        for worker in &workers {
            if worker.probe_and_update().await != ProbeOutcome::Passed {
                return Err(format!("a warm-up probe failed: {:?}", worker.view().last_error));
            }
        }
        let (sshd_pid, agent_pid) = (sshd.pid(), agent.child.id());
        let (started, prober_before, worker_before) =
            (Instant::now(), own_cpu(), worker_cpu(sshd_pid, agent_pid));
        let tasks: Vec<_> = workers
            .iter()
            .map(|worker| {
                let worker = worker.clone();
                tokio::spawn(async move {
                    let (mut passed, mut failed) = (0u64, None);
                    while started.elapsed() < window {
                        match worker.probe_and_update().await {
                            ProbeOutcome::Passed => passed += 1,
                            outcome => {
                                failed =
                                    Some(format!("{outcome:?}: {:?}", worker.view().last_error));
                                break;
                            }
                        }
                        let _ = worker.take_effects();
                    }
                    (passed, failed)
                })
            })
            .collect();
        let mut total = 0;
        for task in tasks {
            match task.await.map_err(|e| e.to_string())? {
                (_, Some(failure)) => return Err(format!("a probe failed: {failure}")),
                (passed, None) => total += passed,
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let spent = worker_cpu(sshd_pid, agent_pid).since(&worker_before);
        let prober_cpu = own_cpu() - prober_before;
        let probes = total.max(1) as u32;
        Ok(Measured {
            rate: total as f64 / seconds,
            worker: WorkerCpu {
                sshd: spent.sshd / probes,
                runner: spent.runner / probes,
                agent: spent.agent / probes,
            },
            prober: prober_cpu / probes,
        })
    })?;
    for channel in &channels {
        let stats = channel.stats();
        if stats.opened != 1 || stats.fell_back != 0 {
            return Err(format!("a probe channel did not carry every probe: {stats:?}"));
        }
    }
    runtime.block_on(async {
        for worker in &workers {
            worker.close().await;
        }
    });
    Ok(measured)
}

fn fleet_rows(wharf: &Path, effort: Effort) -> Result<Vec<Row>, String> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let samples = effort.scaled(crate::fleet::FULL_LATENCY_SAMPLES).max(3);
    let median = |mut latencies: Vec<f64>| {
        latencies.sort_by(f64::total_cmp);
        latencies[latencies.len() / 2]
    };
    let (mut channel, mut straight, mut command) = (Vec::new(), Vec::new(), Vec::new());
    let (mut channel_in_memory, mut straight_in_memory) = (Vec::new(), Vec::new());
    for _ in 0..effort.runs.min(3) {
        // The same starts with the data on the disk and on tmpfs: what the disk costs them.
        for (storage, channel, straight) in [
            (Storage::Disk, &mut channel, &mut straight),
            (Storage::Memory, &mut channel_in_memory, &mut straight_in_memory),
        ] {
            let measured = runtime.block_on(crate::fleet::submit_latencies_beside_the_agents(
                wharf, samples, "", samples, storage,
            ))?;
            channel.push(median(measured.through_the_fleet));
            straight.push(median(measured.straight_to_the_agent));
        }
        let settings = "[runner]\nchannel = false\n";
        command.push(median(
            runtime.block_on(crate::fleet::submit_latencies(wharf, samples, settings))?,
        ));
    }
    Ok(vec![
        Row {
            name: "fleet (redb): submit to running on a worker, starts over the probe channel, p50"
                .into(),
            unit: "ms",
            better: Better::Lower,
            samples: channel.clone(),
            baseline: Some(("starts as commands (timeout and the wharf CLI)".into(), command)),
            target: Some(Target::parse("≤ 4 ms")?),
        },
        Row {
            name: "fleet (redb): the same task submitted straight to that worker's agent (its \
                   API), p50: the agent's share of the row above"
                .into(),
            unit: "ms",
            better: Better::Lower,
            samples: straight.clone(),
            baseline: None,
            target: None,
        },
        // What the disk costs: the same two, every data directory (the fleet's, its workers'
        // agents') on tmpfs.
        Row {
            name: "fleet (redb): the same, starts over the probe channel, the fleet's and its \
                   workers' data on tmpfs, p50"
                .into(),
            unit: "ms",
            better: Better::Lower,
            samples: channel_in_memory,
            baseline: Some(("the same on the disk".into(), channel)),
            target: None,
        },
        Row {
            name: "fleet (redb): the same task straight to that worker's agent, its data on \
                   tmpfs, p50"
                .into(),
            unit: "ms",
            better: Better::Lower,
            samples: straight_in_memory,
            baseline: Some(("the same on the disk".into(), straight)),
            target: None,
        },
    ])
}
