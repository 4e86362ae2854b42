//! raw_exec scenarios: how long a start takes until the task runs, how much memory a shim
//! costs, and starting then stopping a thousand `sleep` tasks.
//!
//! Figures come from real processes. The shim is the static one raw_exec starts by default
//! (built by wharf-exec's build script, always optimised, whatever the bench's profile).

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_driver::{Driver, LogConfig, TaskConfig, TaskHandle, TaskId};
use wharf_exec::{RawExecDriver, SHIM_NAME};
use wharf_state::Signal;

const FULL_STARTS: usize = 1_000;
const FULL_TASKS: usize = 1_000;
/// Starts in flight at once in the many-tasks scenario, as many alloc runners would make them.
const CONCURRENCY: usize = 16;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let shim = shim()?;
    // A thousand tasks hold a thousand pidfds, as an agent's would.
    if let Err(e) = RawExecDriver::raise_fd_limit() {
        eprintln!("cannot raise the descriptor limit: {e}");
    }
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let driver = Arc::new(RawExecDriver::with_shim(&shim));
    let (mut p50, mut p99, mut spawn_p50, mut spawn_p99) = (vec![], vec![], vec![], vec![]);
    let (mut shim_kib, mut start_all, mut stop_all, mut shims_mib, mut heap_kib) =
        (vec![], vec![], vec![], vec![], vec![]);
    for run in 0..effort.runs {
        // Each run gets a fresh directory (a node does not pile up thousands of old task
        // directories in one place) and starts on a settled disk: what the previous run's
        // thousand tasks wrote (fsynced exit records) is flushed first, not measured.
        let scratch = crate::scratch::dir("wharf-bench-exec");
        let root = scratch.as_path();
        settle();
        let starts = effort.scaled(FULL_STARTS);
        let latencies = runtime.block_on(start_latencies(&driver, root, run, starts));
        p50.push(percentile(&latencies, 0.50));
        p99.push(percentile(&latencies, 0.99));
        let spawns = bare_spawn_latencies(starts);
        spawn_p50.push(percentile(&spawns, 0.50));
        spawn_p99.push(percentile(&spawns, 0.99));

        shim_kib.push(runtime.block_on(one_shim_memory(&driver, root, run))?);

        let tasks = effort.scaled(FULL_TASKS);
        let many = runtime.block_on(many_tasks(&driver, root, run, tasks));
        start_all.push(many.start_seconds);
        stop_all.push(many.stop_seconds);
        shims_mib.push(many.shims_private_mib);
        heap_kib.push(many.heap_kib_per_task);
    }
    let tasks = effort.scaled(FULL_TASKS);
    Ok(vec![
        Row {
            name: "exec: start-to-running latency, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: p50,
            baseline: None,
            target: Some(Target::parse("≤ 0.6 ms")?),
        },
        Row {
            name: "exec: start-to-running latency, p99".into(),
            unit: "ms",
            better: Better::Lower,
            samples: p99,
            baseline: None,
            target: None,
        },
        // For scale: one posix_spawn of the task's program alone (it returns once the program
        // is executed). A start holds two (the shim's and the task's), the shim's setup and
        // the report.
        Row {
            name: "exec: reference: bare posix_spawn of /bin/true, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: spawn_p50,
            baseline: None,
            target: None,
        },
        Row {
            name: "exec: reference: bare posix_spawn of /bin/true, p99".into(),
            unit: "ms",
            better: Better::Lower,
            samples: spawn_p99,
            baseline: None,
            target: None,
        },
        Row {
            name: "exec: private memory of one shim".into(),
            unit: "KiB",
            better: Better::Lower,
            samples: shim_kib,
            baseline: None,
            target: Some(Target::parse("≤ 1,024 KiB")?),
        },
        Row {
            name: format!("exec: start {tasks} sleep tasks ({CONCURRENCY} at a time)"),
            unit: "s",
            better: Better::Lower,
            samples: start_all,
            baseline: None,
            target: (tasks == FULL_TASKS).then(|| Target::parse("≤ 2 s")).transpose()?,
        },
        Row {
            name: format!("exec: stop {tasks} tasks (SIGTERM, all at once)"),
            unit: "s",
            better: Better::Lower,
            samples: stop_all,
            baseline: None,
            target: None,
        },
        Row {
            name: format!("exec: private memory of {tasks} shims"),
            unit: "MiB",
            better: Better::Lower,
            samples: shims_mib,
            baseline: None,
            target: None,
        },
        Row {
            name: "exec: driver heap per running task (its records and the handle it returns)"
                .into(),
            unit: "KiB",
            better: Better::Lower,
            samples: heap_kib,
            baseline: None,
            target: None,
        },
    ])
}

/// The shim raw_exec starts, and so the one to measure: the static shim the driver carries,
/// held in memory by this process.
pub(crate) fn shim() -> Result<PathBuf, String> {
    Ok(RawExecDriver::new(wharf_exec::RawExecOptions::default()).shim_path().to_owned())
}

/// The shim built with std, which the isolated driver starts: built now with this bench's
/// profile when cargo runs the bench (a no-op if it is up to date), and found beside the
/// bench's executable.
pub(crate) fn std_shim() -> Result<PathBuf, String> {
    built("wharf-exec", SHIM_NAME)
}

/// Binary `bin` of `package`, built with this bench's profile when cargo runs the bench, and
/// found beside the bench's executable.
pub(crate) fn built(package: &str, bin: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the bench binary: {e}"))?;
    if let Ok(cargo) = std::env::var("CARGO") {
        let mut command = std::process::Command::new(cargo);
        command.args(["build", "--quiet", "--package", package, "--bin", bin]);
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let status = command.status().map_err(|e| format!("cannot build {bin}: {e}"))?;
        if !status.success() {
            return Err(format!("building {bin} failed ({status})"));
        }
    }
    let path = exe.with_file_name(bin);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} is missing; build it with cargo build -p {package}", path.display()))
    }
}

/// Flushes every file system's dirty data (`sync`), so that it is not written during a timing.
pub(crate) fn settle() {
    let _ = std::process::Command::new("sync").status();
}

pub(crate) fn task(root: &Path, name: &str, command: &str, args: &[&str]) -> TaskConfig {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    TaskConfig {
        id: TaskId::new("bench", name, 0),
        alloc_id: "bench".into(),
        job_id: "bench".into(),
        group: "g".into(),
        task_name: name.into(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        alloc_dir: root.join("alloc"),
        logs: LogConfig { dir: dir.join("logs"), max_files: 2, max_file_bytes: 1 << 20 },
        task_dir: dir,
        resources: Default::default(),
        mounts: Vec::new(),
        driver_config: serde_json::json!({"command": command, "args": args})
            .as_object()
            .cloned()
            .unwrap(),
    }
}

/// Milliseconds from the call to `start_task` until it returns: the task has executed its
/// program and the handle is ready.
async fn start_latencies(
    driver: &RawExecDriver,
    root: &Path,
    run: usize,
    starts: usize,
) -> Vec<f64> {
    let mut latencies = Vec::with_capacity(starts);
    for i in 0..starts {
        let config = task(root, &format!("lat{run}-{i}"), "/bin/true", &[]);
        let started = Instant::now();
        let handle = driver.start_task(config).await.unwrap();
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        finish(driver, &handle).await;
    }
    latencies
}

/// The same measure for a bare spawn of the task's program (std's `spawn` returns once the
/// child has executed it): what the shim adds is the difference.
fn bare_spawn_latencies(starts: usize) -> Vec<f64> {
    (0..starts)
        .map(|_| {
            let started = Instant::now();
            let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            child.wait().unwrap();
            elapsed
        })
        .collect()
}

pub(crate) async fn finish(driver: &RawExecDriver, handle: &TaskHandle) {
    driver.wait_task(handle.id()).await.unwrap();
    driver.destroy_task(handle.id(), true).await.unwrap();
}

/// Private memory (clean plus dirty) of one shim running a `sleep`, in KiB, sampled once the
/// shim has its log files open and has written to them: the shim opens them after it reports
/// the start, so a sample taken when the start returns could miss what they cost.
async fn one_shim_memory(driver: &RawExecDriver, root: &Path, run: usize) -> Result<f64, String> {
    let name = format!("mem{run}");
    let config = task(root, &name, "/bin/sh", &["-c", "echo out; echo err >&2; exec sleep 600"]);
    let logs = config.logs.dir.clone();
    let handle = driver.start_task(config).await.map_err(|e| format!("starting {name}: {e}"))?;
    let written = written_logs(&logs, &name, LOG_LIMIT).await;
    let kib = written.map(|()| private_kib(shim_pid(&handle)));
    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Term).await.unwrap();
    finish(driver, &handle).await;
    kib
}

/// How long a bench waits for a task's first output to reach its log files.
const LOG_LIMIT: Duration = Duration::from_secs(10);

/// Waits (at most `limit`) until task `name`'s stdout and stderr files in `logs` exist and
/// hold what it wrote.
async fn written_logs(logs: &Path, name: &str, limit: Duration) -> Result<(), String> {
    let files = ["stdout", "stderr"].map(|stream| logs.join(format!("{name}.{stream}.0")));
    let deadline = Instant::now() + limit;
    while !files.iter().all(|f| std::fs::metadata(f).is_ok_and(|m| m.len() > 0)) {
        if Instant::now() > deadline {
            return Err(format!(
                "task {name} wrote nothing to {} and its stderr file within {limit:?}",
                files[0].display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

fn shim_pid(handle: &TaskHandle) -> i64 {
    handle.driver_state.value()["shim_pid"].as_i64().unwrap()
}

/// `Private_Clean + Private_Dirty` of a process, in KiB, from `/proc/<pid>/smaps_rollup`.
fn private_kib(pid: i64) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

struct Many {
    start_seconds: f64,
    stop_seconds: f64,
    shims_private_mib: f64,
    heap_kib_per_task: f64,
}

/// Starts `tasks` sleep tasks, [`CONCURRENCY`] at a time, then stops them all at once.
async fn many_tasks(driver: &Arc<RawExecDriver>, root: &Path, run: usize, tasks: usize) -> Many {
    // Counted from before the configs, which the starts consume.
    let heap_before = crate::heap::live_bytes();
    let configs: Vec<TaskConfig> =
        (0..tasks).map(|i| task(root, &format!("many{run}-{i}"), "sleep", &["600"])).collect();
    let started = Instant::now();
    let handles = start_all(driver, configs).await;
    let start_seconds = started.elapsed().as_secs_f64();
    let heap_kib_per_task =
        (crate::heap::live_bytes() - heap_before) as f64 / 1024.0 / tasks as f64;
    let shims_private_mib = handles.iter().map(|h| private_kib(shim_pid(h))).sum::<f64>() / 1024.0;

    let started = Instant::now();
    stop_all(driver, &handles, Duration::from_secs(5), Signal::Term).await;
    let stop_seconds = started.elapsed().as_secs_f64();
    for handle in &handles {
        finish(driver, handle).await;
    }
    Many { start_seconds, stop_seconds, shims_private_mib, heap_kib_per_task }
}

/// Starts every task, [`CONCURRENCY`] at a time, as many alloc runners would.
pub(crate) async fn start_all(
    driver: &Arc<RawExecDriver>,
    configs: Vec<TaskConfig>,
) -> Vec<TaskHandle> {
    let mut lanes = Vec::new();
    let per_lane = configs.len().div_ceil(CONCURRENCY).max(1);
    for lane in configs.chunks(per_lane) {
        let (driver, lane) = (driver.clone(), lane.to_vec());
        lanes.push(tokio::spawn(async move {
            let mut handles = Vec::with_capacity(lane.len());
            for config in lane {
                handles.push(driver.start_task(config).await.unwrap());
            }
            handles
        }));
    }
    let mut handles = Vec::with_capacity(configs.len());
    for lane in lanes {
        handles.extend(lane.await.unwrap());
    }
    handles
}

/// Stops every task at once, and returns when all are gone.
pub(crate) async fn stop_all(
    driver: &Arc<RawExecDriver>,
    handles: &[TaskHandle],
    timeout: Duration,
    signal: Signal,
) {
    let stops: Vec<_> = handles
        .iter()
        .map(|h| {
            let (driver, id) = (driver.clone(), h.id().clone());
            tokio::spawn(async move { driver.stop_task(&id, timeout, signal).await.unwrap() })
        })
        .collect();
    for stop in stops {
        stop.await.unwrap();
    }
}

pub(crate) fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_shim_is_sampled_only_once_both_its_log_files_hold_output() {
        let logs = tempfile::tempdir().unwrap();
        let (out, err) = (logs.path().join("t.stdout.0"), logs.path().join("t.stderr.0"));
        // No wait is needed to learn that a file is missing or empty: the limit is zero.
        let ready = || written_logs(logs.path(), "t", Duration::ZERO);
        let error = ready().await.unwrap_err();
        assert!(error.contains("t.stdout.0"), "{error}");
        std::fs::write(&out, "out\n").unwrap();
        assert!(ready().await.is_err(), "stdout alone is not enough");
        std::fs::write(&err, "").unwrap();
        assert!(ready().await.is_err(), "an empty stderr file is not written to");
        std::fs::write(&err, "err\n").unwrap();
        assert_eq!(ready().await, Ok(()));
    }
}
