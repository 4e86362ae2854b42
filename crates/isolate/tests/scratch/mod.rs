//! What the cgroup tests share: a manager under a parent of the test's own (killed and removed
//! when dropped, whatever happened), processes started in a cgroup, bounded waits.

#![allow(dead_code, unreachable_pub, clippy::disallowed_methods)] // Each test binary uses its own part.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;
use wharf_isolate::cgroup::{Limits, NodeCpu};
use wharf_isolate::{
    CgroupOptions, CgroupParent, Cgroups, Containment, CpuSet, IsolateError, TaskCgroup,
};
use wharf_state::spec::Resources;

pub const MIB: u64 = 1 << 20;

/// A manager under a parent of this test's own, destroyed (tasks killed, cgroups removed)
/// when dropped, whatever happened.
pub struct Scratch {
    pub cgroups: Option<Cgroups>,
    pub name: String,
    /// The parent is `name` below this process's own cgroup, not below each hierarchy's root.
    pub under_own: bool,
}

impl Scratch {
    /// What an agent's restart does to its manager: the old one goes (with its lock), a new
    /// one opens the same parent.
    pub fn restart(&mut self) {
        self.cgroups = None;
        self.cgroups = Some(self.open().unwrap());
    }

    /// Opens a manager on the parent. One below this process's own cgroup may move every
    /// process of that cgroup to a leaf (cgroup v2), which an agent does before it starts any:
    /// here other tests start theirs at any time, so the two never overlap.
    fn open(&self) -> Result<Cgroups, IsolateError> {
        if self.under_own {
            let _no_starts = STARTS.write().unwrap_or_else(PoisonError::into_inner);
            Cgroups::open(self.options())
        } else {
            Cgroups::open(self.options())
        }
    }

    fn options(&self) -> CgroupOptions {
        let mut options = options(&self.name);
        if self.under_own {
            options.parent = CgroupParent::UnderOwn(self.name.clone());
        }
        options
    }
}

impl Scratch {
    /// [`Cgroups::create`], killing what a lost run left in the cgroup with SIGKILL.
    pub fn create(&self, task_id: &str, limits: &Limits) -> Result<TaskCgroup, IsolateError> {
        self.cgroups.as_ref().unwrap().create(task_id, limits, &mut sigkill)
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
            self.cgroups = self.open().ok();
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

/// A manager under a parent of this test's own, below each hierarchy's root.
pub fn scratch() -> Scratch {
    open_scratch(false)
}

/// A manager under a parent of this test's own, below this process's own cgroup in each
/// hierarchy (the kind of parent an agent has by default).
pub fn scratch_under_own() -> Scratch {
    open_scratch(true)
}

fn open_scratch(under_own: bool) -> Scratch {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "wharf-test-isolate-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let mut scratch = Scratch { cgroups: None, name, under_own };
    scratch.cgroups = Some(scratch.open().unwrap_or_else(|e| {
        panic!(
            "these tests need writable cgroups (run as root on a host with cgroup v1 or v2): {e}"
        )
    }));
    scratch
}

pub fn limits(scratch: &Scratch, memory: u32, hard_limit: Option<u64>) -> Limits {
    scratch.limits(&Resources { cpu: 500, memory, memory_max: None, cores: 0 }, hard_limit)
}

/// Held (shared) by a process start from its fork until it has joined its cgroup, and
/// (exclusively) by the opening of a manager below this process's own cgroup, whose move of
/// that cgroup's processes would take a child out of the cgroup it has just joined.
static STARTS: RwLock<()> = RwLock::new(());

/// Starts `sh -c script` inside `cgroup`, joined between fork and exec as the shim does it.
pub fn spawn_in(cgroup: &TaskCgroup, script: &str) -> Child {
    let _starting = STARTS.read().unwrap_or_else(PoisonError::into_inner);
    let containment = Containment { cgroup: cgroup.join_files(), ..Containment::default() };
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

/// Reads the first line the child writes, waiting at most 20 s for it: how the tests wait for
/// a child to reach a point.
pub fn first_line(child: &mut Child) -> String {
    use std::io::BufRead;
    use std::os::fd::AsRawFd;
    let stdout = child.stdout.as_mut().unwrap();
    let mut poll = libc::pollfd { fd: stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for a descriptor the child handle keeps open.
    let ready = unsafe { libc::poll(&mut poll, 1, 20_000) };
    if ready != 1 {
        let _ = child.kill();
        panic!("the child wrote nothing within 20 s");
    }
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
    line.trim().to_owned()
}
