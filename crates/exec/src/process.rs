//! Ending a process that is not a task: an agent being wiped with its node.
//!
//! wharf-exec is the crate that signals processes, so the one other kill the node needs (the
//! agent of a loopback instance, when the fleet destroys that instance) lives here too, with
//! the same care over identity: the process is pinned by a pidfd before its command line is
//! checked, so a number reused by an unrelated process is never signalled.

use crate::sys::{self, Pid};
use std::io;
use std::time::{Duration, Instant};

/// Kills process `pid` with SIGKILL if its command line (arguments joined by spaces) passes
/// `expected`, and waits until it is gone, at most `timeout`. Returns false if no such process
/// runs or it is another program; an error if it would not die in time.
pub fn kill_if(pid: u32, expected: impl Fn(&str) -> bool, timeout: Duration) -> io::Result<bool> {
    let Some(pid) = Pid::new(i64::from(pid)) else {
        return Ok(false);
    };
    let pidfd = match sys::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
        Err(e) => return Err(e),
    };
    let cmdline = match std::fs::read(format!("/proc/{}/cmdline", pid.get())) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let cmdline: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    // The pidfd was open while the command line was read: this is the process checked.
    if sys::pidfd_exited(&pidfd)? || !expected(&cmdline.join(" ")) {
        return Ok(false);
    }
    sys::pidfd_signal(&pidfd, libc::SIGKILL)?;
    #[allow(clippy::disallowed_methods)] // A bound on a wait, not a measurement of time.
    let deadline = Instant::now() + timeout;
    loop {
        if sys::pidfd_exited(&pidfd)? {
            return Ok(true);
        }
        #[allow(clippy::disallowed_methods)]
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "process {} did not exit within {} of SIGKILL",
                    pid.get(),
                    wharf_state::duration::Formatted(timeout)
                ),
            ));
        }
        sys::pidfd_wait(&pidfd, left.min(Duration::from_millis(100)))?;
    }
}
