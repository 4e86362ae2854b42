//! The container driver beside its peer, Debian's `podman` (with runc, from a local store),
//! in the same run and on the same busybox image: start-to-running latency (p50 and p99) of
//! `start_task` against `podman run -d`, a hundred containers started, and the private memory
//! each running container costs (wharf: its shim and waiter; podman: its conmon).
//!
//! Needs root, runc, overlayfs and writable cgroups for wharf, and podman for the baseline;
//! without them the scenario fails, saying so.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;
use wharf_container::{ContainerDriver, ContainerOptions};
use wharf_driver::{Driver, TaskHandle};
use wharf_exec::TaskCgroups;
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, CpuSet};

const FULL_CONTAINERS: usize = 100;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let root = crate::scratch::dir("wharf-bench-container");
    let archive = root.join("busybox.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/container-image.sh");
    let made = Command::new("sh").arg(&script).arg(&archive).output().map_err(|e| e.to_string())?;
    if !made.status.success() {
        return Err(format!("cannot make the image: {}", String::from_utf8_lossy(&made.stderr)));
    }
    let podman = Podman::new(&root)?;
    podman.run(&["load", "--quiet", "--input", &archive.display().to_string()])?;
    let options = CgroupOptions {
        parent: CgroupParent::Absolute(format!("wharf-bench-container-{}", std::process::id())),
        pids_max: Some(1024),
        reserved_cores: CpuSet::new(),
        cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: 2000 },
        sweep_siblings: false,
    };
    let cgroups = Arc::new(
        Cgroups::open(options)
            .map_err(|e| format!("the container scenario needs root and writable cgroups: {e}"))?,
    );
    let measured = measure(effort, &root, &archive, &podman, &cgroups);
    if let Err(e) = wharf_exec::destroy_cgroups(&cgroups) {
        eprintln!("cannot remove the bench's cgroups: {e}");
    }
    measured
}

/// The runs of the scenario, its containers in `cgroups`.
fn measure(
    effort: Effort,
    root: &Path,
    archive: &Path,
    podman: &Podman,
    cgroups: &Arc<Cgroups>,
) -> Result<Vec<Row>, String> {
    let mut container_options = ContainerOptions::new(root.join("wharf"));
    container_options.waiter =
        Some(crate::exec::built("wharf-container", "wharf-container-waiter")?);
    let driver = ContainerDriver::new(
        container_options,
        Default::default(),
        TaskCgroups::On(cgroups.clone()),
    )
    .map_err(|e| e.to_string())?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let image = format!("docker-archive:{}", archive.display());
    let count = effort.scaled(FULL_CONTAINERS).max(2);
    let (mut ours_p50, mut ours_p99, mut theirs_p50, mut theirs_p99) =
        (vec![], vec![], vec![], vec![]);
    let (mut ours_kib, mut theirs_kib, mut hundred, mut theirs_hundred) =
        (vec![], vec![], vec![], vec![]);
    for run in 0..effort.runs {
        crate::exec::settle();
        let (ours, theirs, handles, total) = runtime.block_on(async {
            // The image's first use (import and unpack) is not a start: done before timing.
            let warm = start(&driver, root, &image, &format!("warm{run}")).await?;
            driver.destroy_task(warm.0.id(), true).await.map_err(|e| e.to_string())?;
            let (mut ours, mut theirs, mut handles) = (Vec::new(), Vec::new(), Vec::new());
            let mut failure = None;
            for i in 0..count {
                match start(&driver, root, &image, &format!("c{run}-{i}")).await {
                    Ok((handle, ms)) => {
                        ours.push(ms);
                        handles.push(handle);
                    }
                    Err(error) => failure = Some(error),
                }
                match podman.start(&format!("wharf-bench-{run}-{i}")) {
                    Ok(ms) => theirs.push(ms),
                    Err(error) => failure = failure.or(Some(error)),
                }
                if let Some(error) = failure {
                    // Nothing of a failed run is left running.
                    for handle in &handles {
                        let _ = driver.destroy_task(handle.id(), true).await;
                    }
                    return Err(error);
                }
            }
            let total = ours.iter().sum::<f64>() / 1000.0;
            Ok::<_, String>((ours, theirs, handles, total))
        })?;
        hundred.push(total);
        theirs_hundred.push(theirs.iter().sum::<f64>() / 1000.0);
        ours_p50.push(crate::exec::percentile(&ours, 0.50));
        ours_p99.push(crate::exec::percentile(&ours, 0.99));
        theirs_p50.push(crate::exec::percentile(&theirs, 0.50));
        theirs_p99.push(crate::exec::percentile(&theirs, 0.99));
        ours_kib.push(runtime.block_on(per_container_kib(&driver, &handles))?);
        theirs_kib.push(podman.conmon_kib(count)?);
        runtime.block_on(async {
            for handle in &handles {
                let _ = driver.destroy_task(handle.id(), true).await;
            }
        });
        podman.remove_all()?;
    }
    drop(driver);
    let full = count == FULL_CONTAINERS;
    Ok(vec![
        Row {
            name: "container: start-to-running latency, p50".into(),
            unit: "ms",
            better: Better::Lower,
            samples: ours_p50,
            baseline: Some(("podman run -d (runc)".into(), theirs_p50)),
            target: Some(Target::parse("≤ 100 ms and ≥ 1x podman run -d (runc)")?),
        },
        Row {
            name: "container: start-to-running latency, p99".into(),
            unit: "ms",
            better: Better::Lower,
            samples: ours_p99,
            baseline: Some(("podman run -d (runc)".into(), theirs_p99)),
            target: None,
        },
        Row {
            name: format!(
                "container: {count} containers started one after another, time in starts"
            ),
            unit: "s",
            better: Better::Lower,
            samples: hundred,
            baseline: Some(("podman run -d (runc)".into(), theirs_hundred)),
            target: None,
        },
        Row {
            name: "container: private memory per running container (wharf: shim + waiter)".into(),
            unit: "KiB",
            better: Better::Lower,
            samples: ours_kib,
            baseline: Some(("podman's conmon".into(), theirs_kib)),
            target: full.then(|| Target::parse("≥ 1x podman's conmon")).transpose()?,
        },
    ])
}

/// Starts a long-running container; its handle and the milliseconds `start_task` took.
async fn start(
    driver: &ContainerDriver,
    root: &Path,
    image: &str,
    name: &str,
) -> Result<(TaskHandle, f64), String> {
    let mut config = crate::exec::task(root, name, "", &[]);
    config.driver_config = serde_json::json!({"image": image, "command": "sleep", "args": ["600"]})
        .as_object()
        .cloned()
        .unwrap();
    let started = Instant::now();
    let handle =
        driver.start_task(config).await.map_err(|e| format!("a container did not start: {e}"))?;
    Ok((handle, started.elapsed().as_secs_f64() * 1000.0))
}

/// The mean private memory of the shim and the waiter of each container.
async fn per_container_kib(
    driver: &ContainerDriver,
    handles: &[TaskHandle],
) -> Result<f64, String> {
    let mut total = 0.0;
    for handle in handles {
        let info = driver.inspect_task(handle.id()).await.map_err(|e| e.to_string())?;
        for key in ["shim_pid", "pid"] {
            let pid: u32 = info.attributes[key].parse().map_err(|e| format!("{key}: {e}"))?;
            total += crate::peers::private_kib(pid)?;
        }
    }
    Ok(total / handles.len() as f64)
}

/// podman with a store of its own under the bench's scratch directory, runc and cgroupfs.
struct Podman {
    args: Vec<String>,
    /// Its storage, which its overlay driver mounts over itself.
    root: PathBuf,
}

impl Podman {
    fn new(root: &Path) -> Result<Podman, String> {
        let program = PathBuf::from("/usr/bin/podman");
        if !program.exists() {
            return Err(
                "the container scenario measures podman beside wharf: apt-get install podman"
                    .into(),
            );
        }
        let dir = root.join("podman");
        let args = vec![
            format!("--root={}", dir.join("root").display()),
            // podman refuses a run root longer than 50 characters.
            format!("--runroot=/tmp/wharf-bench-podman-{}", std::process::id()),
            "--runtime=runc".into(),
            "--cgroup-manager=cgroupfs".into(),
            "--events-backend=file".into(),
            "--storage-driver=overlay".into(),
        ];
        Ok(Podman { args, root: dir.join("root") })
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("/usr/bin/podman")
            .args(&self.args)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "podman {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `podman run -d` of the same container; the milliseconds until it returned (running).
    fn start(&self, name: &str) -> Result<f64, String> {
        let started = Instant::now();
        // podman raises the open-file and process limits by default, which this host refuses
        // (wharf's containers keep the node's): the same modest ones as the node's defaults.
        self.run(&[
            "run",
            "--detach",
            "--network=host",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=1024:1024",
            "--name",
            name,
            "busybox:latest",
            "sleep",
            "600",
        ])?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }

    /// The mean private memory of podman's conmon processes, which must be `count`.
    fn conmon_kib(&self, count: usize) -> Result<f64, String> {
        let mut kib = Vec::new();
        for pid in wharf_tests::proc_stat::pids() {
            let Ok(pid) = u32::try_from(pid) else { continue };
            if std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "conmon")
            {
                kib.push(crate::peers::private_kib(pid)?);
            }
        }
        if kib.len() < count {
            return Err(format!(
                "found {} conmon processes for {count} podman containers",
                kib.len()
            ));
        }
        Ok(kib.iter().sum::<f64>() / kib.len() as f64)
    }

    fn remove_all(&self) -> Result<(), String> {
        self.run(&["rm", "--force", "--all", "--time", "0"]).map(drop)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--force", "--all", "--time", "0"]);
        // Its storage stays mounted over itself after the last container: unmounted here, or
        // the scratch directory could not be removed.
        let _ = self.run(&["system", "reset", "--force"]);
        let overlay = self.root.join("overlay");
        let _ = Command::new("umount")
            .arg("--lazy")
            .arg(overlay)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(format!("/tmp/wharf-bench-podman-{}", std::process::id()));
    }
}
