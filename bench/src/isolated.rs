//! The isolated `exec` driver: how long a start takes until the task runs, with everything a
//! task under `exec` gets (a workload user leased in the journal, its directories handed over,
//! a cgroup with its memory and CPU limits, private PID and IPC namespaces with its own
//! `/proc`, the node's default Landlock rules, `no_new_privs`), beside raw_exec starting the
//! same task in a cgroup with the same limits, measured in turns so both see the same load.
//! Both start the driver's own static shim, which takes every containment step `exec` asks for.
//!
//! Needs root and writable cgroups, as the driver does; without them the scenario fails,
//! saying so.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use wharf_driver::{Driver, LogConfig, TaskConfig, TaskId};
use wharf_exec::{ExecDriver, ExecOptions, RawExecDriver, RawExecOptions, TaskCgroups};
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, CpuSet};
use wharf_state::spec::Resources;

const FULL_STARTS: usize = 1_000;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let options = CgroupOptions {
        parent: CgroupParent::Absolute(format!("wharf-bench-{}", std::process::id())),
        pids_max: Some(1024),
        reserved_cores: CpuSet::new(),
        cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: 2000 },
        sweep_siblings: false,
    };
    let cgroups =
        Arc::new(Cgroups::open(options).map_err(|e| {
            format!("the isolated exec scenarios need root and writable cgroups: {e}")
        })?);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (mut exec_p50, mut exec_p99, mut raw_p50, mut raw_p99) = (vec![], vec![], vec![], vec![]);
    let mut added = Vec::new();
    for run in 0..effort.runs {
        let root = crate::scratch::dir("wharf-bench-isolated");
        // Workload users reach their directories by absolute paths.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        crate::exec::settle();
        let raw_options = RawExecOptions::default();
        let exec = ExecDriver::new(raw_options.clone(), ExecOptions::new(root.join("users")))
            .with_cgroups(TaskCgroups::On(cgroups.clone()));
        let raw = RawExecDriver::new(raw_options).with_cgroups(TaskCgroups::On(cgroups.clone()));
        let starts = effort.scaled(FULL_STARTS);
        let (exec_ms, raw_ms) = runtime.block_on(async {
            let (mut exec_ms, mut raw_ms) = (Vec::new(), Vec::new());
            for i in 0..starts {
                exec_ms.push(start_ms(&exec, task(&root, &format!("e{run}-{i}"))).await);
                raw_ms.push(start_ms(&raw, task(&root, &format!("r{run}-{i}"))).await);
            }
            (exec_ms, raw_ms)
        });
        // Start by start, what the containment adds: the two starts of a turn saw about the
        // same load, so the median of their differences holds up where the machine is busy.
        let differences: Vec<f64> = exec_ms.iter().zip(&raw_ms).map(|(e, r)| e - r).collect();
        added.push(crate::exec::percentile(&differences, 0.50));
        exec_p50.push(crate::exec::percentile(&exec_ms, 0.50));
        exec_p99.push(crate::exec::percentile(&exec_ms, 0.99));
        raw_p50.push(crate::exec::percentile(&raw_ms, 0.50));
        raw_p99.push(crate::exec::percentile(&raw_ms, 0.99));
    }
    if let Err(e) = wharf_exec::destroy_cgroups(&cgroups) {
        eprintln!("cannot remove the bench's cgroups: {e}");
    }
    let baseline = "raw_exec, same task and cgroup limits";
    Ok(vec![
        Row {
            name: "exec (isolated) with limits: start-to-running latency, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: exec_p50,
            baseline: Some((baseline.into(), raw_p50)),
            target: Some(Target::parse("≤ 3 ms")?),
        },
        Row {
            name: "exec (isolated): what the containment adds to a start (median of exec minus raw_exec, turn by turn)".into(),
            unit: "ms",
            better: Better::Lower,
            samples: added,
            baseline: None,
            target: Some(Target::parse("≤ 0.1 ms")?),
        },
        Row {
            name: "exec (isolated) with limits: start-to-running latency, p99".into(),
            unit: "ms",
            better: Better::Lower,
            samples: exec_p99,
            baseline: Some((baseline.into(), raw_p99)),
            target: None,
        },
    ])
}

/// A task directory laid out as the task runner makes it, for a task running `/bin/true` with
/// a memory limit and a CPU share.
fn task(root: &Path, name: &str) -> TaskConfig {
    let alloc = root.join(name);
    let dir = alloc.join("task");
    for sub in ["local", "secrets", "logs"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::create_dir_all(alloc.join("alloc/data")).unwrap();
    TaskConfig {
        id: TaskId::new(name, "task", 0),
        alloc_id: name.into(),
        job_id: "bench".into(),
        group: "g".into(),
        task_name: "task".into(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        alloc_dir: alloc.join("alloc"),
        logs: LogConfig { dir: dir.join("logs"), max_files: 2, max_file_bytes: 1 << 20 },
        task_dir: dir,
        resources: Resources { cpu: 100, memory: 64, memory_max: Some(128), cores: 0 },
        driver_config: serde_json::json!({"command": "/bin/true"}).as_object().cloned().unwrap(),
        mounts: Vec::new(),
    }
}

/// Milliseconds from the call to `start_task` until it returns (the task has executed its
/// program); then the task is waited for and destroyed, untimed.
async fn start_ms(driver: &dyn Driver, config: TaskConfig) -> f64 {
    let started = Instant::now();
    let handle = driver.start_task(config).await.unwrap();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    driver.wait_task(handle.id()).await.unwrap();
    driver.destroy_task(handle.id(), true).await.unwrap();
    ms
}
