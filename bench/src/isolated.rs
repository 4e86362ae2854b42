//! The isolated `exec` driver: how long a start takes until the task runs, with everything a
//! task under `exec` gets (a workload user leased in the journal, its directories handed over,
//! a cgroup with its memory and CPU limits, private PID and IPC namespaces with its own
//! `/proc`, the node's default Landlock rules, `no_new_privs`), beside raw_exec starting the
//! same task in a cgroup with the same limits, measured in turns so both see the same load.
//! Both start the driver's own static shim, which takes every containment step `exec` asks for.
//!
//! Beside them, the floor under what the containment adds: the same steps taken by a bare
//! process with nothing around them (see [`containment_floor_ms`]), which is what the kernel
//! takes for them.
//!
//! Needs root and writable cgroups, as the driver does; without them the scenario fails,
//! saying so.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use wharf_driver::{Driver, LogConfig, TaskConfig, TaskId};
use wharf_exec::{ExecDriver, ExecOptions, RawExecDriver, RawExecOptions, TaskCgroups};
use wharf_isolate::landlock::{Access, Mode, Rule};
use wharf_isolate::namespace::Namespaces;
use wharf_isolate::users::Ugid;
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, Containment, ContainmentFailure};
use wharf_isolate::{CpuSet, Prepared};
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
    let (mut added, mut floor) = (Vec::new(), Vec::new());
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
        let floor_ms = containment_floor_ms(&root, starts)?;
        floor.push(crate::exec::percentile(&floor_ms, 0.50));
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
            name: "exec (isolated): the same containment's steps alone, in a bare process (the floor under the row above), p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: floor,
            baseline: None,
            target: None,
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

/// The workload user the floor's processes switch to (one of the default range's).
const FLOOR_USER: u32 = 89_999;

/// Milliseconds each of `count` bare processes takes for the containment steps a task of
/// [`task`] gets under `exec`: its parent makes the PID namespace (as the shim does just before
/// its clone), and it takes every other step (the IPC namespace, the node's default Landlock
/// rules and the task's, the workload user, `no_new_privs`; no `/proc` of its own, as none of
/// these rules reaches `/proc`) through [`Prepared::apply`], the calls the shim makes, then
/// exits. No driver, shim or program runs around them, so this is the kernel's part of the
/// containment: what it adds to a start can come down to it, never below. (The process is a
/// fork of this one, whose first writes to its pages are copies the shim's small child does
/// not make: if anything, the floor is a little high.)
fn containment_floor_ms(root: &Path, count: usize) -> Result<Vec<f64>, String> {
    let config = task(root, "floor");
    let all = Mode::ALL.access();
    let mut rules = wharf_isolate::landlock::default_rules();
    rules.push(Rule::new(&config.task_dir, all.without(Access::REMOVE_DIR)));
    for managed in ["local", "secrets"] {
        rules.push(Rule::new(config.task_dir.join(managed), all));
    }
    rules.push(Rule { if_exists: true, ..Rule::new(&config.alloc_dir, all) });
    let containment = Containment {
        user: Ugid::new(FLOOR_USER),
        no_new_privs: true,
        landlock: Some(rules),
        namespaces: Namespaces { pid: true, ipc: true },
        ..Containment::default()
    };
    let prepared = containment.prepare().map_err(|e| format!("cannot prepare the floor: {e}"))?;
    (0..count).map(|_| contained_once(&containment, &prepared)).collect()
}

/// What the child of [`stand_in_shim`] reports when its containment failed, before the failure.
const FAILED: u64 = u64::MAX;

/// Forks a stand-in for the shim, which forks one process contained by `prepared`; returns
/// the milliseconds the containment took them.
fn contained_once(containment: &Containment, prepared: &Prepared) -> Result<f64, String> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `pipe2` made both descriptors, and nothing else owns them.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: this process has other threads, so the child calls only what is safe after a
    // fork: `stand_in_shim` makes system calls and allocates nothing, then the child exits.
    let shim = match unsafe { libc::fork() } {
        -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            stand_in_shim(prepared, writer.as_raw_fd());
            // SAFETY: ends the child without running anything of the parent's.
            unsafe { libc::_exit(0) }
        }
        shim => shim,
    };
    drop(writer);
    let mut reader = std::fs::File::from(reader);
    let mut report = Vec::new();
    let read = reader.read_to_end(&mut report);
    let mut status = 0;
    // SAFETY: `shim` is this process's child, waited for once.
    unsafe { libc::waitpid(shim, &mut status, 0) };
    read.map_err(|e| format!("cannot read the floor's report: {e}"))?;
    let (nanos, failure) =
        report.split_at_checked(8).ok_or("the floor's process reported nothing")?;
    match u64::from_le_bytes(nanos.try_into().unwrap()) {
        FAILED => Err(match ContainmentFailure::decode(failure) {
            Some(failure) => {
                format!("the floor's containment failed: {}", failure.describe(containment))
            }
            None => "the floor's containment failed, and its report is unreadable".into(),
        }),
        nanos => Ok(nanos as f64 / 1e6),
    }
}

/// In the forked stand-in: makes the PID namespace, forks the task's process, which is
/// contained and writes to `report` how long both took (or [`FAILED`] and the failure), and
/// waits for it. Allocates nothing.
fn stand_in_shim(prepared: &Prepared, report: i32) {
    let started = Instant::now();
    if prepared.before_fork().is_err() {
        write_all(report, &FAILED.to_le_bytes());
        return;
    }
    let before_fork = started.elapsed();
    // SAFETY: as in `contained_once`; this process has one thread.
    match unsafe { libc::fork() } {
        -1 => write_all(report, &FAILED.to_le_bytes()),
        0 => {
            let contained = Instant::now();
            match prepared.apply() {
                Ok(()) => {
                    let nanos = (before_fork + contained.elapsed()).as_nanos() as u64;
                    write_all(report, &nanos.to_le_bytes());
                }
                Err(failure) => {
                    write_all(report, &FAILED.to_le_bytes());
                    write_all(report, &failure.encode());
                }
            }
            // SAFETY: ends the task's process without running anything of its parent's.
            unsafe { libc::_exit(0) }
        }
        task => {
            let mut status = 0;
            // SAFETY: `task` is this process's child, waited for once.
            unsafe { libc::waitpid(task, &mut status, 0) };
        }
    }
}

/// Writes `bytes` to `fd` whole (a pipe takes these few at once); no allocation.
fn write_all(fd: i32, bytes: &[u8]) {
    // SAFETY: `bytes` is valid for its length; `fd` is open.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}
