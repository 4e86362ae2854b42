//! Runs a program in a forked child that applies a containment first, as the shim does, and
//! reports what it printed and how it ended.
//!
//! The fork happens in a thread of its own: a PID namespace made before it belongs to that
//! thread's children only, and the test harness's other threads are left alone. The child
//! calls only what is safe after a fork in a multi-threaded process (`apply` allocates
//! nothing; everything else is a plain system call on prepared memory).

#![allow(dead_code)] // Each test binary uses part of it.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;
use wharf_isolate::{Containment, ContainmentFailure};

/// The most a contained program may take.
const LIMIT: Duration = Duration::from_secs(20);

/// How a contained program ended and what it printed.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Its exit code, if it exited.
    pub(crate) code: Option<i32>,
    /// The signal that ended it, if one did.
    pub(crate) signal: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// Set if containment failed before the program ran.
    pub(crate) failure: Option<ContainmentFailure>,
}

impl Outcome {
    /// Whether it exited with 0.
    pub(crate) fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn read_all(fd: OwnedFd) -> Vec<u8> {
    let mut bytes = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut bytes).unwrap();
    bytes
}

/// Runs `argv` (an absolute program first) under `containment`, with `PATH=/usr/bin:/bin` and
/// `env`, in the current directory.
pub(crate) fn run(containment: &Containment, argv: &[&str], env: &[(&str, &str)]) -> Outcome {
    let containment = containment.clone();
    let argv: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let envp: Vec<CString> = std::iter::once("PATH=/usr/bin:/bin".to_owned())
        .chain(env.iter().map(|(k, v)| format!("{k}={v}")))
        .map(|e| CString::new(e).unwrap())
        .collect();
    std::thread::spawn(move || run_here(&containment, &argv, &envp)).join().unwrap()
}

// The test plays the shim: it forks the child that contains itself, signals it if it
// overruns, and reaps it.
#[allow(clippy::disallowed_methods)]
fn run_here(containment: &Containment, argv: &[CString], envp: &[CString]) -> Outcome {
    let prepared = containment.prepare().expect("prepare");
    let pointers = |strings: &[CString]| -> Vec<*const libc::c_char> {
        strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
    };
    let (argv_p, envp_p) = (pointers(argv), pointers(envp));
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (report_r, report_w) = pipe();
    prepared.before_fork().expect("before_fork");
    // SAFETY: the child only makes system calls on memory prepared above and calls `apply`,
    // which allocates nothing, then executes or exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain system calls on open descriptors and prepared, NUL-terminated strings.
        unsafe {
            libc::dup2(out_w.as_raw_fd(), 1);
            libc::dup2(err_w.as_raw_fd(), 2);
            if let Err(failure) = prepared.apply() {
                let bytes = failure.encode();
                libc::write(report_w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                libc::_exit(126);
            }
            libc::execve(argv_p[0], argv_p.as_ptr(), envp_p.as_ptr());
            libc::_exit(127);
        }
    }
    drop((out_w, err_w, report_w));
    // SAFETY: `pid` is our child, not yet reaped, so the pidfd is certainly its.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int;
    assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    // SAFETY: just made, owned by nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let mut poll = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, LIMIT.as_millis() as i32) };
    if ready == 0 {
        // SAFETY: our unreaped child; the signal cannot reach another process.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: `status` is writable; `pid` is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(ready != 0, "{argv:?} ran longer than {LIMIT:?}");
    let failure = ContainmentFailure::decode(&read_all(report_r));
    Outcome {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        stdout: String::from_utf8_lossy(&read_all(out_r)).into_owned(),
        stderr: String::from_utf8_lossy(&read_all(err_r)).into_owned(),
        failure,
    }
}

/// The node's default system paths as rules (skipped where missing).
pub(crate) fn defaults() -> Vec<wharf_isolate::landlock::Rule> {
    wharf_isolate::landlock::default_unveils().iter().map(|u| u.rule(true)).collect()
}

/// A uid for tests, far from any real account; `n` tells tests apart.
pub(crate) fn test_user(n: u32) -> wharf_isolate::users::Ugid {
    wharf_isolate::users::Ugid::new(1_900_000_000 + n).unwrap()
}

/// Fails with what to do if the tests do not run as root.
pub(crate) fn require_root() {
    assert!(
        wharf_isolate::users::running_as_root(),
        "these tests switch users, make namespaces and mount /proc: run them as root"
    );
}
