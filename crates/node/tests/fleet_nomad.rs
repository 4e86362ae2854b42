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
    // Two workers, one allocation each: every call reaches the worker that runs its allocation.
    let settings = "probe_interval = \"200ms\"\nsync_interval = \"1s\"\nper_worker_limit = 1\n\
                    [loopback]\ninstances = 2\n";
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

/// One HTTP/1.1 request to `address`, with `X-Nomad-Token: token` if given; the status line's
/// code, the head (lowercase) and the body.
fn request(
    address: &str,
    method: &str,
    target: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let auth = token.map(|t| format!("X-Nomad-Token: {t}\r\n")).unwrap_or_default();
    request_with(address, method, target, &auth, body)
}

/// One HTTP/1.1 request to `address` with the header lines `headers` (each ending in CRLF; a
/// JSON body's type unless they give one).
fn request_with(
    address: &str,
    method: &str,
    target: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let address = address.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let json = if headers.to_ascii_lowercase().contains("content-type:") {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    write!(
        stream,
        "{method} {target} HTTP/1.1\r\nHost: {address}\r\n{headers}{json}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// Nomad's Go client refuses a query answer without `X-Nomad-Index` and
/// `X-Nomad-LastContact`: every Nomad query on the fleet has them; a missing or wrong token is
/// Nomad's 403; the fleet's own list stays the fleet's for its own clients, and work its own
/// API took shows as an allocation of a job made from its spec; and work the
/// fleet cannot place yet is a pending allocation on no node, whose client calls are refused
/// saying so.
#[test]
fn fleet_queries_carry_nomads_headers_and_unplaced_work_is_on_no_node() {
    let dir = tempfile::tempdir().unwrap();
    let settings =
        "probe_interval = \"200ms\"\nsync_interval = \"1s\"\n[loopback]\ninstances = 1\n";
    let fleet = Fleet::start(Path::new(WHARF), dir.path(), settings, "info", LIMIT).unwrap();
    let token = fleet.token().unwrap();
    let address = fleet.address().to_owned();
    for target in [
        "/v1/jobs",
        "/v1/allocations",
        "/v1/nodes",
        "/v1/agent/self",
        "/v1/status/leader",
        "/v1/jobs?index=1&wait=1s",
    ] {
        let (status, head, body) = request(&address, "GET", target, Some(&token), "");
        assert_eq!(status, 200, "{target}: {head}\n{body}");
        for name in ["x-nomad-index: ", "x-nomad-knownleader: true", "x-nomad-lastcontact: 0"] {
            assert!(head.contains(name), "{target} lacks {name}: {head}");
        }
    }
    for token in [None, Some("wrong")] {
        let (status, _, body) = request(&address, "GET", "/v1/jobs", token, "");
        assert_eq!((status, body.as_str()), (403, "Permission denied"), "{token:?}");
    }
    // The fleet's own list, for the fleet's clients (wharf's bearer token, no Nomad parameter).
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, _, body) = request_with(&address, "GET", "/v1/allocations", &bearer, "");
    assert_eq!((status, body.as_str()), (200, "[]"));
    // Work the fleet's own API took shows to Nomad's clients too, with a job made from its spec.
    let spec = "[job]\nid = \"own\"\ntype = \"batch\"\n[group]\nname = \"g\"\n\
                [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
                config = { command = \"/bin/true\" }\n";
    let toml = format!("{bearer}Content-Type: application/toml\r\n");
    let (status, _, body) = request_with(&address, "POST", "/v1/allocations?id=own-1", &toml, spec);
    assert_eq!(status, 201, "{body}");
    let (_, _, body) = request(&address, "GET", "/v1/allocation/own-1", Some(&token), "");
    let own: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((&own["JobID"], &own["TaskGroup"]), (&"own".into(), &"g".into()), "{body}");
    assert_eq!(
        (&own["Job"]["Type"], &own["Name"]),
        (&"batch".into(), &"own.g[0]".into()),
        "{body}"
    );
    // More memory than any worker has: queued, pending, on no node.
    let job = serde_json::json!({"Job": {"ID": "huge", "Type": "batch", "TaskGroups": [{
        "Name": "g", "Count": 1,
        "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"},
                   "Resources": {"CPU": 100, "MemoryMB": 100_000_000}}],
    }]}});
    let (status, _, body) = request(&address, "PUT", "/v1/jobs", Some(&token), &job.to_string());
    assert_eq!(status, 200, "{body}");
    let (_, _, body) = request(&address, "GET", "/v1/job/huge/allocations", Some(&token), "");
    let allocs: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(allocs.len(), 1, "{body}");
    let id = allocs[0]["ID"].as_str().unwrap();
    assert_eq!(allocs[0]["ClientStatus"], "pending", "{body}");
    assert_eq!(allocs[0]["NodeID"], "", "{body}");
    let (status, _, body) =
        request(&address, "GET", &format!("/v1/client/fs/ls/{id}?path=/"), Some(&token), "");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("runs on no node (queued)"), "{body}");
    let (status, _, body) =
        request(&address, "GET", "/v1/client/fs/ls/no-such-alloc?path=/", Some(&token), "");
    assert_eq!((status, body.as_str()), (404, "alloc not found"));
    let (status, _, body) = request(&address, "GET", "/v1/client/stats", Some(&token), "");
    assert_eq!(status, 400, "{body}");
    assert!(body.starts_with("node_id:"), "{body}");
    // What comes from the request never names a path of the fleet's own: an operation the
    // agent does not serve, a node that is no worker.
    let (status, _, body) =
        request(&address, "GET", &format!("/v1/client/fs/..%2Fv1%2Fnode/{id}"), Some(&token), "");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no client fs operation"), "{body}");
    for node in ["..%2F..%2Fetc", "%2Froot", "loopback-999"] {
        let path = format!("/v1/client/stats?node_id={node}");
        let (status, _, body) = request(&address, "GET", &path, Some(&token), "");
        assert_eq!(status, 404, "{node}: {body}");
        assert!(body.contains("not found"), "{node}: {body}");
    }
    // Stopped while queued: complete, desired stop.
    let (status, _, body) =
        request(&address, "DELETE", "/v1/job/huge?purge=true", Some(&token), "");
    assert_eq!(status, 200, "{body}");
    let (_, _, body) = request(&address, "GET", &format!("/v1/allocation/{id}"), Some(&token), "");
    let alloc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&alloc["ClientStatus"], &alloc["DesiredStatus"]),
        (&"complete".into(), &"stop".into()),
        "{body}"
    );
    let (status, _, _) = request(&address, "GET", "/v1/job/huge", Some(&token), "");
    assert_eq!(status, 404);
}

/// A fleet whose data directory holds the job records an earlier fleet kept there (before
/// they moved to its store) takes them into the store at its first term: the job is served,
/// and the directory is renamed so that they are taken once.
#[test]
fn job_records_an_earlier_fleet_kept_on_disk_are_taken_into_the_store() {
    let dir = tempfile::tempdir().unwrap();
    // The fleet's data directory, as `Fleet::start` names it.
    let data_dir = dir.path().join("fleet");
    let jobs = data_dir.join("nomad/jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let record = serde_json::json!({
        "job": {"ID": "old", "Name": "old", "Type": "batch", "Namespace": "default",
                "TaskGroups": [{"Name": "g", "Count": 0, "Tasks": []}]},
        "version": 2, "created": 1000, "modified": 2000, "stopped": true,
        "allocs": [], "evals": [{"id": "e1", "triggered_by": "job-register", "at": 1000}],
    });
    // The file's name is the job id's bytes in hex.
    std::fs::write(jobs.join("6f6c64.json"), record.to_string()).unwrap();
    let settings =
        "probe_interval = \"200ms\"\nsync_interval = \"1s\"\n[loopback]\ninstances = 1\n";
    let fleet = Fleet::start(Path::new(WHARF), dir.path(), settings, "info", LIMIT).unwrap();
    let token = fleet.token().unwrap();
    // The worker is up before the fleet is stopped: a stop while its agent still starts
    // could leave that agent behind.
    let worker_ready = || {
        let (_, _, body) = request(fleet.address(), "GET", "/v1/nodes", Some(&token), "");
        body.contains("\"Status\":\"ready\"")
    };
    let deadline = std::time::Instant::now() + LIMIT;
    while !worker_ready() {
        assert!(std::time::Instant::now() < deadline, "the loopback worker never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _, body) = request(fleet.address(), "GET", "/v1/job/old", Some(&token), "");
    assert_eq!(status, 200, "{body}");
    let job: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&job["ID"], &job["Version"], &job["Stop"]),
        (&"old".into(), &2.into(), &true.into())
    );
    assert!(!jobs.exists(), "the old records' directory is renamed once taken");
    assert!(data_dir.join("nomad/jobs.imported/6f6c64.json").exists());

    // Restarted over the same store, the fleet still serves it: from the store.
    fleet.terminate(LIMIT).unwrap();
    let fleet = Fleet::start(Path::new(WHARF), dir.path(), settings, "info", LIMIT).unwrap();
    let (status, _, body) = request(fleet.address(), "GET", "/v1/job/old", Some(&token), "");
    assert_eq!(status, 200, "{body}");
    fleet.terminate(LIMIT).unwrap();
}
