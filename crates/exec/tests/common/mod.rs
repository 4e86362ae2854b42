//! What the raw_exec tests share: task configs in temporary directories, and bounded waits on
//! real processes and FIFOs.

#![allow(dead_code, unreachable_pub)] // Each test binary uses its own part of this module.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use wharf_driver::{LogConfig, TaskConfig, TaskId};
use wharf_exec::RawExecDriver;

/// Every wait in these tests gives up after this long.
pub const LIMIT: Duration = Duration::from_secs(20);

/// The shim built with std, which the isolated `exec` driver starts.
pub const SHIM: &str = env!("CARGO_BIN_EXE_wharf-shim");

/// A raw_exec driver as a user gets it: with the static shim the crate carries.
pub fn driver() -> RawExecDriver {
    RawExecDriver::new(wharf_exec::RawExecOptions::default())
}

/// A task directory (with `logs/`) under `root`.
pub fn task_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    dir
}

/// A task running `sh -c script` in its own directory under `root`.
pub fn shell(root: &Path, name: &str, script: &str) -> TaskConfig {
    config(root, name, serde_json::json!({"command": "/bin/sh", "args": ["-c", script]}))
}

/// A task with this driver config, in its own directory under `root`.
pub fn config(root: &Path, name: &str, driver_config: serde_json::Value) -> TaskConfig {
    let dir = task_dir(root, name);
    TaskConfig {
        id: TaskId::new("a1", name, 0),
        alloc_id: "a1".into(),
        job_id: "j".into(),
        group: "g".into(),
        task_name: name.into(),
        env: BTreeMap::from([
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("WHARF_TEST".to_owned(), "yes".to_owned()),
        ]),
        alloc_dir: root.join("alloc"),
        logs: LogConfig { dir: dir.join("logs"), max_files: 3, max_file_bytes: 1 << 20 },
        task_dir: dir,
        resources: Default::default(),
        driver_config: driver_config.as_object().cloned().unwrap(),
        mounts: Vec::new(),
    }
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Reads a FIFO until its writer closes it, waiting at most [`LIMIT`] for that. Opening a
/// FIFO blocks until a writer opens it too, so this is how a task tells the test it reached a
/// point in its script: no sleeping, no polling.
pub fn read_fifo(path: &Path) -> String {
    let (tx, rx) = mpsc::channel();
    let path = path.to_owned();
    std::thread::spawn(move || {
        let mut text = String::new();
        let result = std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut text));
        let _ = tx.send(result.map(|_| text));
    });
    rx.recv_timeout(LIMIT).expect("the task never wrote to its FIFO").unwrap()
}

/// Writes `text` into a FIFO once a reader has it open, waiting at most [`LIMIT`].
pub fn write_fifo(path: &Path, text: &str) {
    let (tx, rx) = mpsc::channel();
    let (path, text) = (path.to_owned(), text.to_owned());
    std::thread::spawn(move || {
        let result = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
        let _ = tx.send(result);
    });
    rx.recv_timeout(LIMIT).expect("the task never opened its FIFO").unwrap()
}

/// Whether a process with this pid exists (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

/// Waits (at most [`LIMIT`]) for the process `pid`, which need not be our child, to exit.
pub fn wait_gone(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        // ESRCH is "no such process": gone. Anything else (EMFILE, EPERM, ...) says nothing
        // about the process, so it must not pass for its end.
        let error = std::io::Error::last_os_error();
        assert_eq!(error.raw_os_error(), Some(libc::ESRCH), "pidfd_open({pid}) failed: {error}");
        return;
    }
    let mut fds = [libc::pollfd { fd: fd as i32, events: libc::POLLIN, revents: 0 }];
    // SAFETY: `fds` is a valid array of one pollfd.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, LIMIT.as_millis() as i32) };
    // SAFETY: `fd` is ours to close.
    unsafe { libc::close(fd as i32) };
    assert_eq!(ready, 1, "process {pid} still runs after {LIMIT:?}");
}

/// The start time of `pid` in clock ticks since boot.
pub fn start_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    fields[19].parse().unwrap()
}

/// A cgroup manager under a parent of the test's own, killed and removed when dropped, even
/// when the test fails. The node's cores are taken to run at 2000 MHz.
pub struct CgroupScratch {
    cgroups: Option<std::sync::Arc<wharf_isolate::Cgroups>>,
    parent: String,
    pids_max: Option<u64>,
}

impl CgroupScratch {
    pub fn new(pids_max: Option<u64>) -> CgroupScratch {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let parent = format!(
            "wharf-test-exec-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let cgroups = Some(std::sync::Arc::new(open_cgroups(&parent, pids_max)));
        CgroupScratch { cgroups, parent, pids_max }
    }

    pub fn cgroups(&self) -> &std::sync::Arc<wharf_isolate::Cgroups> {
        self.cgroups.as_ref().unwrap()
    }

    /// What an agent's restart does: the old manager goes (and its lock), a new one opens
    /// the same parent. Every driver of the old one must be gone first.
    pub fn restart(&mut self) {
        let old = self.cgroups.take().unwrap();
        assert_eq!(std::sync::Arc::strong_count(&old), 1, "the old manager is still in use");
        drop(old);
        self.cgroups = Some(std::sync::Arc::new(open_cgroups(&self.parent, self.pids_max)));
    }

    /// A driver whose tasks get cgroups from this manager.
    pub fn driver(&self) -> RawExecDriver {
        driver().with_cgroups(wharf_exec::TaskCgroups::On(self.cgroups().clone()))
    }
}

fn options(parent: &str, pids_max: Option<u64>) -> wharf_isolate::CgroupOptions {
    wharf_isolate::CgroupOptions {
        parent: wharf_isolate::CgroupParent::Absolute(parent.into()),
        pids_max,
        reserved_cores: wharf_isolate::CpuSet::new(),
        cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: 2000 },
        sweep_siblings: false,
    }
}

fn open_cgroups(parent: &str, pids_max: Option<u64>) -> wharf_isolate::Cgroups {
    wharf_isolate::Cgroups::open(options(parent, pids_max)).unwrap_or_else(|e| {
        panic!("these tests need writable cgroups (root on a host with cgroup v1 or v2): {e}")
    })
}

impl Drop for CgroupScratch {
    fn drop(&mut self) {
        // A restart that failed left no manager: a new one cleans up, once the lock is free.
        if self.cgroups.is_none() {
            self.cgroups = wharf_isolate::Cgroups::open(options(&self.parent, self.pids_max))
                .ok()
                .map(std::sync::Arc::new);
        }
        if let Some(cgroups) = &self.cgroups
            && let Err(error) = wharf_exec::destroy_cgroups(cgroups)
        {
            assert!(std::thread::panicking(), "cannot clean up cgroup {}: {error}", self.parent);
        }
    }
}

/// The lines of `/proc/<pid>/cgroup` for the controllers wharf uses, or `None` if the process
/// is gone.
pub fn cgroup_lines(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let used = ["memory", "cpu", "cpuacct", "pids", "freezer"];
    let v1: Vec<String> = text
        .lines()
        .filter(|l| used.contains(&l.split(':').nth(1).unwrap_or_default()))
        .map(str::to_owned)
        .collect();
    // A v2 host has one line, `0::/path`.
    Some(if v1.is_empty() { text.lines().map(str::to_owned).collect() } else { v1 })
}

impl CgroupScratch {
    /// An `exec` driver whose tasks get cgroups from this manager, under the driver's own
    /// (static) shim.
    pub fn exec_driver(&self, options: wharf_exec::ExecOptions) -> wharf_exec::ExecDriver {
        self.exec_driver_on(options, wharf_exec::RawExecOptions::default())
    }

    /// The same under the `wharf-shim` program, the shim built with std.
    pub fn exec_driver_with_std_shim(
        &self,
        options: wharf_exec::ExecOptions,
    ) -> wharf_exec::ExecDriver {
        let raw = wharf_exec::RawExecOptions {
            shim_path: Some(SHIM.into()),
            ..wharf_exec::RawExecOptions::default()
        };
        self.exec_driver_on(options, raw)
    }

    fn exec_driver_on(
        &self,
        options: wharf_exec::ExecOptions,
        raw: wharf_exec::RawExecOptions,
    ) -> wharf_exec::ExecDriver {
        wharf_exec::ExecDriver::new(raw, options)
            .with_cgroups(wharf_exec::TaskCgroups::On(self.cgroups().clone()))
    }
}

/// `exec` settings for a test: its journal under `root`, and workload users from a range of
/// its own (`n` tells tests apart), so tests running side by side never share a uid.
pub fn exec_options(root: &Path, n: u32) -> wharf_exec::ExecOptions {
    let mut options = wharf_exec::ExecOptions::new(root.join("workload-users"));
    let min = 1_900_100_000 + n * 100;
    options.users = wharf_isolate::users::UgidRange::new(min, min + 99).unwrap();
    options
}

/// A temporary directory that workload users can pass through (mode 0755), as a node's data
/// directory must be.
pub fn searchable_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Makes a FIFO at `path` that any user may open.
pub fn mkfifo_for_anyone(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    mkfifo(path);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}
