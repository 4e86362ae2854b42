//! `wharf_exec::process::kill_if` on real processes. In its own test binary: the library's
//! unit tests exercise the shim's reaping, which may take any child of the test process.

use std::process::Child;
use std::time::{Duration, Instant};
use wharf_exec::process::kill_if;

/// Kills the child if the test fails before it does.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn kills_only_the_program_it_is_told() {
    #[allow(clippy::disallowed_methods)] // The test needs a process to kill.
    let mut child = Reaped(std::process::Command::new("sleep").arg("1000").spawn().unwrap());
    let pid = child.0.id();
    // Its command line shows once the kernel has finished the exec.
    #[allow(clippy::disallowed_methods)] // A bound on a poll.
    let deadline = Instant::now() + Duration::from_secs(10);
    let cmdline = format!("/proc/{pid}/cmdline");
    while std::fs::read(&cmdline).unwrap_or_default() != b"sleep\x001000\x00" {
        #[allow(clippy::disallowed_methods)]
        let late = Instant::now() > deadline;
        assert!(!late, "sleep never showed its command line");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!kill_if(pid, |cmd| cmd.contains("agent"), Duration::from_secs(5)).unwrap());
    assert!(child.0.try_wait().unwrap().is_none(), "another program was killed");
    assert!(kill_if(pid, |cmd| cmd == "sleep 1000", Duration::from_secs(5)).unwrap());
    assert!(child.0.wait().unwrap().code().is_none(), "it died of a signal");
}
