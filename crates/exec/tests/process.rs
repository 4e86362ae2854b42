//! `wharf_exec::process::kill_if` on real processes. In its own test binary: the library's
//! unit tests exercise the shim's reaping, which may take any child of the test process.

use std::time::Duration;
use wharf_exec::process::kill_if;

#[test]
fn kills_only_the_program_it_is_told() {
    #[allow(clippy::disallowed_methods)] // The test needs a process to kill.
    let mut child = std::process::Command::new("sleep").arg("1000").spawn().unwrap();
    let pid = child.id();
    assert!(!kill_if(pid, |cmd| cmd.contains("agent"), Duration::from_secs(5)).unwrap());
    assert!(child.try_wait().unwrap().is_none(), "another program was killed");
    assert!(kill_if(pid, |cmd| cmd == "sleep 1000", Duration::from_secs(5)).unwrap());
    assert!(child.wait().unwrap().code().is_none(), "it died of a signal");
}
