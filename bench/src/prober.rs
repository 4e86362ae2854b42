//! Prober scenarios: the CPU a pool of 10,000 workers costs when each is probed every 10 s
//! (scripted executors, real time, process CPU from getrusage over the window), and run
//! probes per second against one local sshd over persistent connections, beside the same
//! probes each on a fresh connection.
//!
//! OpenSSH forks a session process and execs the login shell for every channel; on a small
//! machine, where sshd shares the cores with the prober, that bounds the second figure. The
//! third row shows the prober's own CPU per SSH probe, which is what the prober can change.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use nix::sys::resource::{UsageWho, getrusage};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_prober::ssh::{parse_private_key, parse_public_key};
use wharf_prober::*;
use wharf_tests::proc_stat::{self, ProcStat};
use wharf_tests::sshd::Sshd;

const WORKERS: usize = 10_000;
const INTERVAL: Duration = Duration::from_secs(10);

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let mut rows = pool_cpu(effort)?;
    rows.extend(sshd_probes(effort)?);
    Ok(rows)
}

/// Lists a fixed fleet.
#[derive(Debug)]
struct Fleet(Vec<Instance>);

#[async_trait::async_trait]
impl InstanceSet for Fleet {
    async fn create(&self, _: &InstanceType, _: &Tags, _: &str) -> Result<Instance, ProberError> {
        Err(ProberError::Quota { detail: "fixed fleet".into() })
    }
    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(self.0.clone())
    }
    async fn destroy(&self, _: &InstanceId) -> Result<(), ProberError> {
        Ok(())
    }
    async fn set_tags(&self, _: &InstanceId, _: &Tags) -> Result<(), ProberError> {
        Ok(())
    }
}

fn cpu_time() -> Duration {
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

fn pool_cpu(effort: Effort) -> Result<Vec<Row>, String> {
    let workers = effort.scaled(WORKERS);
    // The quick run shortens the cycle so it still sees every worker probed.
    let interval = if effort.scale < 1.0 { Duration::from_millis(500) } else { INTERVAL };
    let (mut cpu, mut rates, mut capacity) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..effort.runs.min(3) {
        let (share, rate) = measure_pool(workers, interval);
        cpu.push(share);
        rates.push(rate);
        // A core's time over one interval, divided by the CPU time one worker's probe took.
        let cpu_per_probe = share / 100.0 / rate;
        capacity.push(1.0 / cpu_per_probe / interval.as_secs_f64());
    }
    Ok(vec![
        Row {
            name: format!(
                "prober: CPU to probe {workers} workers every {interval:?} (scripted executor, process CPU over one real-time cycle)"
            ),
            unit: "% of a core",
            better: Better::Lower,
            samples: cpu,
            baseline: None,
            target: Some(Target::parse("≤ 25%")?),
        },
        // Not a speed: the schedule asks for workers ÷ interval probes a second. The row shows
        // the pool keeps to it under that load.
        Row {
            name: format!(
                "prober: probes per second kept to the schedule, {workers} workers every {interval:?} (asked: workers ÷ interval)"
            ),
            unit: "/s",
            better: Better::Higher,
            samples: rates,
            baseline: None,
            target: Some(Target::parse(&format!(
                "{:.0}/s",
                workers as f64 / interval.as_secs_f64()
            ))?),
        },
        Row {
            name: format!(
                "prober: capacity, workers one core can probe every {interval:?} (a core's time over the measured CPU per probe)"
            ),
            unit: "workers",
            better: Better::Higher,
            samples: capacity,
            baseline: None,
            target: None,
        },
    ])
}

/// Runs a pool of `workers` for one warm-up cycle and one measured cycle; returns the CPU
/// share of one core and the probes per second over the measured cycle.
fn measure_pool(workers: usize, interval: Duration) -> (f64, f64) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let instances: Vec<Instance> = (0..workers)
        .map(|i| Instance {
            id: InstanceId(format!("w-{i:05}")),
            address: Some("10.0.0.1:22".into()),
            remote_user: "root".into(),
            tags: Tags::new(),
            host_key: None,
            runner_args: String::new(),
        })
        .collect();
    let config = PoolConfig {
        worker: WorkerConfig {
            boot_probe_command: "true".into(),
            // The probe rows measure the run probe alone.
            runner: RunnerConfig {
                command: "wharf".into(),
                resources_args: None,
                ..RunnerConfig::default()
            },
            timeouts: Timeouts { idle: Duration::from_secs(86_400), ..Timeouts::default() },
            ..WorkerConfig::default()
        },
        probe_interval: interval,
        sync_interval: Duration::from_secs(3600),
        max_instances: workers + 1,
        ..PoolConfig::default()
    };
    let new_executor: NewExecutor = Arc::new(|instance: &Instance| {
        let script = ScriptedExecutor::new(&instance.id.0);
        script.exact("true", Reply::ok(""));
        script.exact("wharf alloc list --probe", Reply::ok("alloc-1\n"));
        Arc::new(script) as Arc<dyn Executor>
    });
    let pool =
        Pool::new(config, Arc::new(SystemClock::new()), Arc::new(Fleet(instances)), new_executor)
            .unwrap();
    let passed = |pool: &Pool| -> f64 {
        let metrics = pool.metrics();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("wharf_prober_probes_total{result=\"passed\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    runtime.block_on(async {
        let runner = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run().await }
        });
        // Warm-up: the first sync and the first cycle, which spreads the workers.
        tokio::time::sleep(interval + interval / 10).await;
        let (cpu_before, probes_before) = (cpu_time(), passed(&pool));
        let started = Instant::now();
        tokio::time::sleep(interval).await;
        let wall = started.elapsed().as_secs_f64();
        let (cpu_after, probes_after) = (cpu_time(), passed(&pool));
        pool.stop();
        let _ = tokio::time::timeout(Duration::from_secs(10), runner).await;
        let share = (cpu_after - cpu_before).as_secs_f64() / wall * 100.0;
        (share, (probes_after - probes_before) / wall)
    })
}

fn sshd_probes(effort: Effort) -> Result<Vec<Row>, String> {
    let sshd =
        Sshd::start().map_err(|e| format!("the prober benchmark needs a local sshd: {e}"))?;
    let window = Duration::from_secs_f64((5.0 * effort.scale).max(0.5));
    let connections = 32;
    let (mut persistent, mut fresh, mut client, mut server) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..effort.runs {
        let measured = probe_rate(&sshd, connections, window, false)?;
        persistent.push(measured.rate);
        client.push(measured.client.as_secs_f64() * 1e6);
        server.push(measured.server.as_secs_f64() * 1e6);
        fresh.push(probe_rate(&sshd, connections, window, true)?.rate);
    }
    Ok(vec![Row {
        name: format!(
            "prober: run probes/s against one local sshd, {connections} workers on persistent connections"
        ),
        unit: "/s",
        better: Better::Higher,
        samples: persistent,
        baseline: Some(("a new connection per probe".into(), fresh)),
        target: Some(Target::parse("≥ 2,000/s")?),
    },
    Row {
        name: "prober: sshd's CPU per run probe (its session fork and the remote shell; for comparison)".into(),
        unit: "µs",
        better: Better::Lower,
        samples: server,
        baseline: None,
        target: None,
    },
    Row {
        name: "prober: its own CPU per SSH run probe (client side; sshd and the remote shell excluded)".into(),
        unit: "µs",
        better: Better::Lower,
        samples: client,
        baseline: None,
        target: None,
    }])
}

/// What one SSH measurement found.
struct Measured {
    /// Probes per second.
    rate: f64,
    /// This process's CPU per probe.
    client: Duration,
    /// sshd's CPU per probe (its connection processes and the sessions they reaped).
    server: Duration,
}

/// CPU time of the sshd listening as `pid` and of its connection processes, including the
/// session processes they have reaped, from /proc (clock ticks of 10 ms).
fn sshd_cpu(pid: u32) -> Duration {
    let Ok(sshd) = i32::try_from(pid) else { return Duration::ZERO };
    let ticks: u64 = proc_stat::pids()
        .filter_map(|pid| Some((pid, ProcStat::of(pid)?)))
        .filter(|(pid, stat)| *pid == sshd || stat.parent == sshd)
        .map(|(_, stat)| stat.cpu_ticks + stat.reaped_children_ticks)
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The probes of one SSH measurement.
#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    /// The first failed probe's outcome and the worker's error.
    first_failure: Option<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.first_failure = self.first_failure.take().or(other.first_failure);
    }

    /// The probes that passed, when none failed: a failed probe fails the row rather than
    /// lowering its rate.
    fn passed(&self) -> Result<u64, String> {
        match &self.first_failure {
            None if self.failed == 0 => Ok(self.passed),
            first => Err(format!(
                "{} of {} SSH probes failed (the first: {})",
                self.failed,
                self.passed + self.failed,
                first.as_deref().unwrap_or("unknown")
            )),
        }
    }
}

/// Probes `workers` idle workers over SSH in a loop for `window`.
fn probe_rate(
    sshd: &Sshd,
    workers: usize,
    window: Duration,
    reconnect: bool,
) -> Result<Measured, String> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let key = Arc::new(parse_private_key(&sshd.client_key).map_err(|e| e.to_string())?);
    let host_key = parse_public_key(&sshd.host_key).map_err(|e| e.to_string())?;
    let config = Arc::new(
        WorkerConfig {
            runner: RunnerConfig {
                command: "true".into(),
                list_args: "--list".into(),
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
    let workers: Vec<(Arc<Worker>, Arc<SshExecutor>)> = (0..workers)
        .map(|i| {
            let executor = Arc::new(SshExecutor::new(
                &format!("w{i}"),
                SshTarget {
                    address: Some(sshd.address.clone()),
                    user: sshd.user.clone(),
                    host_key: Some(host_key.clone()),
                },
                key.clone(),
            ));
            let worker = Arc::new(Worker::new(
                WorkerSpec {
                    instance: Instance {
                        id: InstanceId(format!("w{i}")),
                        address: Some(sshd.address.clone()),
                        remote_user: "root".into(),
                        tags: Tags::new(),
                        host_key: None,
                        runner_args: String::new(),
                    },
                    instance_type: "bench".into(),
                    state: State::Idle,
                    idle_behavior: IdleBehavior::Hold,
                },
                executor.clone(),
                config.clone(),
                clock.clone(),
                brake.clone(),
            ));
            (worker, executor)
        })
        .collect();
    runtime.block_on(async {
        // Connect every worker before the window opens.
        for (worker, _) in &workers {
            if worker.probe_and_update().await != ProbeOutcome::Passed {
                return Err(format!("a warm-up probe failed: {:?}", worker.view().last_error));
            }
        }
        let started = Instant::now();
        let cpu_before = cpu_time();
        let server_before = sshd_cpu(sshd.pid());
        let tasks: Vec<_> = workers
            .iter()
            .map(|(worker, executor)| {
                let (worker, executor) = (worker.clone(), executor.clone());
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    while started.elapsed() < window {
                        if reconnect {
                            executor.close().await;
                        }
                        match worker.probe_and_update().await {
                            ProbeOutcome::Passed => tally.passed += 1,
                            outcome => {
                                tally.failed += 1;
                                if tally.first_failure.is_none() {
                                    let error = worker.view().last_error;
                                    tally.first_failure = Some(format!("{outcome:?}: {error:?}"));
                                }
                            }
                        }
                        let _ = worker.take_effects();
                    }
                    tally
                })
            })
            .collect();
        let mut tally = Tally::default();
        for task in tasks {
            tally.add(task.await.map_err(|e| e.to_string())?);
        }
        let total = tally.passed()?;
        let cpu = cpu_time() - cpu_before;
        let server = sshd_cpu(sshd.pid()).saturating_sub(server_before);
        let probes = total.max(1) as u32;
        Ok(Measured {
            rate: total as f64 / started.elapsed().as_secs_f64(),
            client: cpu / probes,
            server: server / probes,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failed_ssh_probe_fails_the_rate() {
        let mut tally = Tally { passed: 10, ..Tally::default() };
        tally.add(Tally { passed: 5, ..Tally::default() });
        assert_eq!(tally.passed(), Ok(15));
        tally.add(Tally { passed: 3, failed: 1, first_failure: Some("Failed: refused".into()) });
        let error = tally.passed().unwrap_err();
        assert!(error.starts_with("1 of 19 SSH probes failed"), "{error}");
        assert!(error.contains("Failed: refused"), "{error}");
    }
}
