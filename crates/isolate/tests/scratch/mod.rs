//! What the cgroup tests share: a manager under a parent of the test's own (killed and removed
//! when dropped, whatever happened), processes started in a cgroup, bounded waits.

#![allow(dead_code, unreachable_pub, clippy::disallowed_methods)] // Each test binary uses its own part.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use wharf_isolate::cgroup::{Limits, NodeCpu};
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, Containment, CpuSet, TaskCgroup};
use wharf_state::spec::Resources;

pub const MIB: u64 = 1 << 20;

/// A manager under a parent of this test's own, destroyed (tasks killed, cgroups removed)
/// when dropped, whatever happened.
pub struct Scratch {
    pub cgroups: Option<Cgroups>,
    pub name: String,
}

impl Scratch {
    /// What an agent's restart does to its manager: the old one goes (with its lock), a new
    /// one opens the same parent.
    pub fn restart(&mut self) {
        self.cgroups = None;
        self.cgroups = Some(Cgroups::open(options(&self.name)).unwrap());
    }
}

impl std::ops::Deref for Scratch {
    type Target = Cgroups;

    fn deref(&self) -> &Cgroups {
        self.cgroups.as_ref().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // A restart that failed left no manager: a new one cleans up, once the lock is free.
        if self.cgroups.is_none() {
            self.cgroups = Cgroups::open(options(&self.name)).ok();
        }
        if let Some(cgroups) = &self.cgroups
            && let Err(error) = cgroups.destroy_all(&mut sigkill)
        {
            // A test that failed already says so; a clean-up that fails is a failure too.
            if std::thread::panicking() {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("cannot clean up {}: {error}", self.name);
                }
            } else {
                panic!("cannot clean up {}: {error}", self.name);
            }
        }
    }
}

pub fn sigkill(pid: i32) -> std::io::Result<()> {
    // SAFETY: kill takes plain integers; the pid was read from a frozen test cgroup.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub fn options(parent: &str) -> CgroupOptions {
    CgroupOptions {
        parent: CgroupParent::Absolute(parent.into()),
        pids_max: Some(64),
        reserved_cores: CpuSet::new(),
        cpu: NodeCpu { mhz_per_core: 2000 },
        sweep_siblings: false,
    }
}

pub fn scratch() -> Scratch {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "wharf-test-isolate-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let cgroups = Cgroups::open(options(&name)).unwrap_or_else(|e| {
        panic!(
            "these tests need writable cgroups (run as root on a host with cgroup v1 or v2): {e}"
        )
    });
    Scratch { cgroups: Some(cgroups), name }
}

pub fn limits(scratch: &Scratch, memory: u32, hard_limit: Option<u64>) -> Limits {
    scratch.limits(&Resources { cpu: 500, memory, memory_max: None, cores: 0 }, hard_limit)
}

/// Starts `sh -c script` inside `cgroup`, joined between fork and exec as the shim does it.
pub fn spawn_in(cgroup: &TaskCgroup, script: &str) -> Child {
    let containment = Containment { cgroup: cgroup.procs_files(), ..Containment::default() };
    let prepared = containment.prepare().unwrap();
    let mut command = Command::new("/bin/sh");
    command.args(["-c", script]).stdin(Stdio::null()).stdout(Stdio::piped());
    // SAFETY: `apply` only writes to descriptors that are already open.
    unsafe {
        command.pre_exec(move || {
            prepared.apply().map_err(|failure| std::io::Error::from_raw_os_error(failure.errno))
        });
    }
    command.spawn().unwrap()
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The directory of `cgroup` in the hierarchy whose mount is named `controller`.
pub fn dir_of(cgroup: &TaskCgroup, controller: &str) -> PathBuf {
    cgroup
        .dirs()
        .into_iter()
        .find(|d| d.components().any(|c| c.as_os_str() == controller))
        .unwrap_or_else(|| panic!("no {controller} directory in {:?}", cgroup.dirs()))
        .to_owned()
}

/// Waits for a child with a bound, killing it if the bound passes.
pub fn wait(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..2000 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("the child did not exit within 20 s");
}

/// Reads the first line the child writes: how the tests wait for it to reach a point.
pub fn first_line(child: &mut Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    line.trim().to_owned()
}
