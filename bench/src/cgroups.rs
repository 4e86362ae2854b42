//! Cgroup scenarios: a raw_exec start with a cgroup (against the same start without one, in the
//! same run), reading the stats of a thousand running tasks from their cgroups, and stopping a
//! thousand tasks by cgroup.
//!
//! Real tasks in real cgroups, under a parent of the bench's own that is removed at the end.
//! On a host where cgroups cannot be written the scenarios fail, saying why.

use crate::Effort;
use crate::exec::{finish, percentile, settle, shim, start_all, stop_all, task};
use crate::report::{Better, Row};
use crate::target::Target;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_driver::Driver;
use wharf_exec::{RawExecDriver, TaskCgroups};
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, CpuSet};
use wharf_state::Signal;

const FULL_STARTS: usize = 1_000;
const FULL_TASKS: usize = 1_000;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let shim = shim()?;
    let host = wharf_isolate::Host::detect().map_err(|e| format!("cannot read the host: {e}"))?;
    let options = CgroupOptions {
        parent: CgroupParent::Absolute(format!("wharf-bench-{}", std::process::id())),
        pids_max: Some(4096),
        reserved_cores: CpuSet::new(),
        cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: host.mhz_per_core },
        sweep_siblings: false,
    };
    let cgroups =
        Arc::new(Cgroups::open(options).map_err(|e| {
            format!("the cgroup scenarios need writable cgroups (run as root): {e}")
        })?);
    if let Err(e) = RawExecDriver::raise_fd_limit() {
        eprintln!("cannot raise the descriptor limit: {e}");
    }
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let contained =
        Arc::new(RawExecDriver::with_shim(&shim).with_cgroups(TaskCgroups::On(cgroups.clone())));
    let plain = Arc::new(
        RawExecDriver::with_shim(&shim)
            .with_cgroups(TaskCgroups::Off { reason: "the bench's baseline".into() }),
    );
    let (mut start, mut start_plain, mut stats, mut stats_first, mut stop, mut stop_plain) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for run in 0..effort.runs {
        let scratch = crate::scratch::dir("wharf-bench-cgroups");
        let root = scratch.as_path();
        settle();
        let (with, without) = runtime.block_on(async {
            let mut with = Vec::new();
            let mut without = Vec::new();
            // Interleaved, so both see the same machine.
            for i in 0..effort.scaled(FULL_STARTS) {
                without.push(
                    start_ms(&plain, task(root, &format!("plain{run}-{i}"), "/bin/true", &[]))
                        .await,
                );
                with.push(
                    start_ms(&contained, task(root, &format!("cg{run}-{i}"), "/bin/true", &[]))
                        .await,
                );
            }
            (with, without)
        });
        start.push(percentile(&with, 0.5));
        start_plain.push(percentile(&without, 0.5));

        let tasks = effort.scaled(FULL_TASKS);
        let ([first, again], stop_s) = runtime.block_on(many_tasks(&contained, root, run, tasks));
        stats_first.push(first);
        stats.push(again);
        stop.push(stop_s);
        settle();
        let (_, stop_s) = runtime.block_on(many_tasks(&plain, root, run + 1000, tasks));
        stop_plain.push(stop_s);
    }
    drop(contained);
    if let Err(e) = wharf_exec::destroy_cgroups(&cgroups) {
        eprintln!("cannot remove the bench's cgroups: {e}");
    }
    let tasks = effort.scaled(FULL_TASKS);
    let full = tasks == FULL_TASKS;
    Ok(vec![
        Row {
            name: "cgroups: raw_exec start-to-running latency with a cgroup, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: start,
            baseline: Some(("the same start without a cgroup".into(), start_plain)),
            target: Some(Target::parse("≤ 1.5 ms")?),
        },
        Row {
            name: format!(
                "cgroups: stats of {tasks} running tasks, read from their cgroups (each scrape)"
            ),
            unit: "ms",
            better: Better::Lower,
            samples: stats,
            baseline: None,
            target: full.then(|| Target::parse("≤ 50 ms")).transpose()?,
        },
        Row {
            name: format!(
                "cgroups: stats of {tasks} running tasks, the first read (each task's files opened)"
            ),
            unit: "ms",
            better: Better::Lower,
            samples: stats_first,
            baseline: None,
            target: None,
        },
        Row {
            name: format!(
                "cgroups: stop {tasks} tasks by cgroup (all at once, until every shim is gone)"
            ),
            unit: "s",
            better: Better::Lower,
            samples: stop,
            baseline: Some(("SIGKILL to each task's process group, no cgroups".into(), stop_plain)),
            target: full.then(|| Target::parse("≤ 0.3 s")).transpose()?,
        },
    ])
}

/// Milliseconds from the call to `start_task` until it returns (the task runs); the task is
/// then waited for and destroyed, cgroup and all, outside the timing.
async fn start_ms(driver: &RawExecDriver, config: wharf_driver::TaskConfig) -> f64 {
    let started = Instant::now();
    let handle = driver.start_task(config).await.unwrap();
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    finish(driver, &handle).await;
    elapsed
}

/// Starts `tasks` sleep tasks, then times reading every one's stats (one after the other, as
/// a metrics scrape does; twice: the first read, and the next) and stopping them all at once
/// with SIGKILL: by cgroup if the driver gives its tasks cgroups, to their process groups if
/// not.
async fn many_tasks(
    driver: &Arc<RawExecDriver>,
    root: &std::path::Path,
    run: usize,
    tasks: usize,
) -> ([f64; 2], f64) {
    let configs: Vec<_> =
        (0..tasks).map(|i| task(root, &format!("many{run}-{i}"), "sleep", &["600"])).collect();
    let handles = start_all(driver, configs).await;

    // A node's metrics are scraped again and again: the first read opens each task's files,
    // every read after reuses them. Both are timed.
    let mut stats_ms = [0.0; 2];
    for pass in &mut stats_ms {
        let started = Instant::now();
        for handle in &handles {
            driver.task_stats(handle.id()).await.unwrap();
        }
        *pass = started.elapsed().as_secs_f64() * 1000.0;
    }

    let started = Instant::now();
    stop_all(driver, &handles, Duration::ZERO, Signal::Kill).await;
    let stop_s = started.elapsed().as_secs_f64();
    for handle in &handles {
        finish(driver, handle).await;
    }
    (stats_ms, stop_s)
}
