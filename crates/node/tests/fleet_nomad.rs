//! Nomad's HTTP API on a real `wharf fleet` with loopback workers (real agents on this host),
//! driven by python-nomad's own calls (`nomad/fleet_server.py`): jobs registered, listed and
//! stopped as fleet work, allocations with their workers' task states, the workers as nodes,
//! the fleet as a server, and the client node's calls forwarded to the worker that runs the
//! allocation, and the event stream; each checked for the values the job produced.

// Real processes on the real clock: these tests start programs and wait in real time.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use wharf_tests::fleet::Fleet;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// Any single wait; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);

/// The Python of the virtual environment python-nomad is installed in (`.ci/run` makes it):
/// `$WHARF_PYTHON_NOMAD`, or `target/python-nomad/bin/python` in the workspace.
fn python() -> PathBuf {
    let python = std::env::var_os("WHARF_PYTHON_NOMAD").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/python-nomad/bin/python")
    });
    let found = Command::new(&python).args(["-c", "import nomad, requests"]).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "python-nomad is missing at {}: install it with `python3 -m venv target/python-nomad && \
         target/python-nomad/bin/pip install python-nomad==2.1.0` (Debian: apt-get install python3-venv), \
         as .ci/run does, or point WHARF_PYTHON_NOMAD at a Python that has it",
        python.display()
    );
    python
}

#[test]
fn python_nomad_drives_a_fleet() {
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
    let dir = tempfile::tempdir().unwrap();
    let settings =
        "probe_interval = \"200ms\"\nsync_interval = \"1s\"\n[loopback]\ninstances = 1\n";
    let fleet = Fleet::start(Path::new(WHARF), dir.path(), settings, "info", LIMIT).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/nomad/fleet_server.py");
    let address = format!("http://{}", fleet.address().trim_start_matches("http://"));
    let output = Command::new(python())
        .arg(&script)
        .env("NOMAD_ADDR", address)
        .env("NOMAD_TOKEN", fleet.token().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "fleet_server.py failed:\n{stdout}\n{}\nthe fleet's log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        fleet.log_tail(40)
    );
    let checked: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("ok ")).collect();
    let expected = [
        "token refused",
        "vault refused",
        "job.register_job",
        "jobs.get_jobs",
        "job.get_allocations",
        "validate.validate_job",
        "allocations.get_allocations",
        "allocation.get_allocation",
        "node.get_node",
        "agent.get_agent",
        "client.cat.read_file",
        "client.ls.list_files",
        "client.stream_logs.stream",
        "client.allocation.signal_allocation",
        "client.allocation.restart_allocation",
        "event.stream.get_stream",
        "blocking query",
        "job.deregister_job",
    ];
    assert_eq!(checked, expected);
}
