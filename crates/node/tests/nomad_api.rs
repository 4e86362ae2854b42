//! Nomad's HTTP API on a real agent, driven by python-nomad's own calls (`nomad/*.py`): jobs
//! registered, listed and stopped, allocations and their task events, the node, the agent,
//! files, logs, restarts and signals, blocking queries and the token, each checked for the
//! values the job produced. Plus what python-nomad cannot send: the fs endpoints' confinement
//! (`..`, absolute paths, a link out of the allocation directory, a FIFO), and the headers
//! Nomad's Go client requires of every query.

// Real processes on the real clock: these tests start programs and wait in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

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

/// Runs the script `nomad/<name>` against `address` with `token`; returns its `ok` lines.
fn run_script(name: &str, address: &str, token: &str) -> Vec<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/nomad").join(name);
    let address = format!("http://{}", address.trim_start_matches("http://"));
    let output = Command::new(python())
        .arg(&script)
        .env("NOMAD_ADDR", address)
        .env("NOMAD_TOKEN", token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().filter_map(|l| l.strip_prefix("ok ")).map(str::to_owned).collect()
}

#[test]
fn python_nomad_drives_an_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let checked = run_script("agent_client.py", &agent.address, &agent.token);
    let expected = [
        "token refused",
        "vault refused",
        "job.register_job",
        "jobs.get_jobs",
        "job.get_job",
        "job.get_allocations",
        "job.register_job unchanged",
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

/// The fs endpoints read the allocation's directory and nothing else: `..` is refused, an
/// absolute path is the allocation's, a link a task made (to a file or a directory outside)
/// is not followed, a FIFO is refused rather than opened for a read that would hang, and the
/// task's secrets are not read.
#[tokio::test(flavor = "multi_thread")]
async fn fs_endpoints_are_confined_to_the_allocation_directory() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let script = "cd \"$WHARF_ALLOC_DIR\" && ln -s /etc/passwd link && ln -s / rootlink && mkfifo fifo \
                  && echo s3cret > \"$WHARF_SECRETS_DIR/token\" && echo done > done && sleep 60";
    let id =
        submit(&agent.client(), &job("confined", "service", &sh_task("t", script))).await.unwrap();
    let get = |endpoint: &str, path: &str| {
        raw_request(&agent.address, "GET", &format!("/v1/client/fs/{endpoint}/{id}?path={path}"))
    };
    eventually("the task's files are there", || get("cat", "alloc/done").status == 200);
    assert_eq!(get("cat", "alloc/done").body, "done\n");
    let table = [
        ("cat", "../../../../etc/passwd", 403, "would leave the allocation's directory"),
        ("cat", "alloc/../../../etc/passwd", 403, "would leave the allocation's directory"),
        ("ls", "..", 403, "would leave the allocation's directory"),
        ("cat", "/etc/passwd", 404, "no such file"),
        ("cat", "alloc/link", 403, "not opened"),
        ("readat", "alloc/link", 403, "not opened"),
        ("stat", "alloc/link", 403, "not opened"),
        ("cat", "alloc/rootlink/etc/passwd", 403, "not opened"),
        ("ls", "alloc/rootlink", 403, "not opened"),
        ("cat", "alloc/fifo", 403, "not opened"),
        ("stream", "alloc/fifo", 403, "not opened"),
        ("cat", "t/secrets/token", 403, "Reading secret files is not allowed"),
    ];
    for (endpoint, path, status, words) in table {
        let answer = get(endpoint, path);
        assert_eq!(answer.status, status, "{endpoint} {path}: {}", answer.body);
        assert!(answer.body.contains(words), "{endpoint} {path}: {}", answer.body);
        assert!(!answer.body.contains("root:"), "{endpoint} {path} read the host's file");
    }
    // The listing shows the links as links, without following them.
    let listing: serde_json::Value = serde_json::from_str(&get("ls", "alloc").body).unwrap();
    let modes: std::collections::BTreeMap<&str, &str> = listing
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["Name"].as_str().unwrap(), f["FileMode"].as_str().unwrap()))
        .collect();
    assert!(modes["link"].starts_with('L') && modes["rootlink"].starts_with('L'), "{modes:?}");
    assert!(modes["fifo"].starts_with('p'), "{modes:?}");
}

/// Nomad's Go client refuses a query answer without `X-Nomad-Index` and
/// `X-Nomad-LastContact`; every query here has them, and a missing token is Nomad's 403.
#[test]
fn every_query_carries_nomads_headers() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let address = agent.address.trim_start_matches("http://").to_owned();
    let fetch = |target: &str, token: Option<&str>| {
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(LIMIT)).unwrap();
        let auth = token.map(|t| format!("X-Nomad-Token: {t}\r\n")).unwrap_or_default();
        write!(
            stream,
            "GET {target} HTTP/1.1\r\nHost: {address}\r\n{auth}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    for target in [
        "/v1/jobs",
        "/v1/allocations",
        "/v1/nodes",
        "/v1/agent/self",
        "/v1/status/leader",
        "/v1/jobs?index=1&wait=1s",
    ] {
        let answer = fetch(target, Some(&agent.token));
        let head = answer.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{target}: {head}");
        for name in ["x-nomad-index: ", "x-nomad-knownleader: true", "x-nomad-lastcontact: 0"] {
            assert!(head.contains(name), "{target} lacks {name}: {head}");
        }
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
        assert!(!body.contains("_status\""), "{target} answered with wharf's shape: {body}");
    }
    for token in [None, Some("wrong")] {
        let answer = fetch("/v1/jobs", token);
        assert!(answer.starts_with("HTTP/1.1 403"), "{token:?}: {answer}");
        assert!(answer.ends_with("\r\n\r\nPermission denied"), "{token:?}: {answer}");
    }
    // wharf's own list is still wharf's for wharf's clients.
    let own = raw_request(&agent.address, "GET", "/v1/allocations");
    assert_eq!((own.status, own.body.as_str()), (200, "[]"));
}

/// Reads `/v1/event/stream` frames from `index` until `done` holds of what was read (bounded).
fn read_events(
    address: &str,
    token: &str,
    index: u64,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    use std::io::{BufRead, Write};
    let address = address.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    // HTTP/1.0: the body comes as it is, without chunks, until the server closes.
    write!(stream, "GET /v1/event/stream?topic=Allocation&index={index} HTTP/1.0\r\nX-Nomad-Token: {token}\r\n\r\n").unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut frames = Vec::new();
    let mut in_body = false;
    let deadline = std::time::Instant::now() + LIMIT;
    while !done(&frames) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream never had what was waited for: {frames:?}"
        );
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended: {frames:?}");
        if !in_body {
            in_body = line == "\r\n";
            continue;
        }
        let frame: serde_json::Value = serde_json::from_str(&line).unwrap();
        if frame != serde_json::json!({}) {
            frames.push(frame);
        }
    }
    frames
}

/// The times (milliseconds) of the task events of allocation `id` in the last frame that shows it.
fn event_times(frames: &[serde_json::Value], id: &str) -> Vec<u64> {
    let last = frames
        .iter()
        .flat_map(|f| f["Events"].as_array().unwrap())
        .rfind(|e| e["Key"] == id)
        .unwrap();
    let mut times: Vec<u64> = last["Payload"]["Allocation"]["TaskStates"]["t"]["Events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Time"].as_u64().unwrap() / 1_000_000)
        .collect();
    times.dedup();
    times
}

fn indexes_of(frames: &[serde_json::Value], id: &str) -> Vec<u64> {
    frames
        .iter()
        .flat_map(|f| f["Events"].as_array().unwrap())
        .filter(|e| e["Key"] == id)
        .map(|e| e["Index"].as_u64().unwrap())
        .collect()
}

fn client_status(frames: &[serde_json::Value], id: &str) -> String {
    frames
        .iter()
        .flat_map(|f| f["Events"].as_array().unwrap())
        .rfind(|e| e["Key"] == id)
        .map(|e| e["Payload"]["Allocation"]["ClientStatus"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// A subscriber that resumes from the last index it saw, after the agent restarted, gets every
/// later event once and none twice: the indexes of the two streams are disjoint, increasing,
/// and together they are every task event's time.
#[tokio::test(flavor = "multi_thread")]
async fn event_stream_resumes_exactly_once_across_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let id = submit(&agent.client(), &job("events", "service", &sh_task("t", "sleep 60")))
        .await
        .unwrap();
    let before = read_events(&agent.address, &agent.token, 0, |frames| {
        client_status(frames, &id) == "running"
    });
    let last = *indexes_of(&before, &id).last().unwrap();
    // Killed outright: what it streamed is all on disk already.
    let (data_dir, config) = agent.kill9();
    let agent = AgentProcess::launch(data_dir, config);
    agent
        .client()
        .call(hyper::Method::POST, format!("/v1/allocations/{id}/stop").as_str(), None)
        .await
        .unwrap();
    // Complete, and every event the allocation shows has come as an event of its own.
    let after = read_events(&agent.address, &agent.token, last, |frames| {
        client_status(frames, &id) == "complete"
            && indexes_of(frames, &id).last() == event_times(frames, &id).last()
    });
    let (first, second) = (indexes_of(&before, &id), indexes_of(&after, &id));
    assert!(second.iter().all(|i| *i > last), "{first:?} then {second:?}");
    let mut all = first.clone();
    all.extend(&second);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "an index came twice or out of order: {all:?}");
    assert_eq!(all, event_times(&after, &id), "every task event's time, once");
}

/// `wharf job list|status|stop` find a job's allocations by the job's id, whichever API
/// submitted them.
#[tokio::test(flavor = "multi_thread")]
async fn wharf_job_commands_take_a_job_id() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let spec = job("newcomer", "service", &sh_task("t", "sleep 60"));
    let first = submit(&agent.client(), &spec).await.unwrap();
    let second = submit(&agent.client(), &spec).await.unwrap();
    let text = |out: std::process::Output| {
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    eventually("both running", || text(agent.cli(&["job", "list"])).contains("running=2"));
    let list = text(agent.cli(&["job", "list"]));
    assert!(list.lines().any(|l| l.starts_with("newcomer") && l.contains(" running ")), "{list}");
    let status = text(agent.cli(&["job", "status", "newcomer"]));
    assert!(
        status.contains(&first) && status.contains(&second) && status.contains("t=running"),
        "{status}"
    );
    let missing = agent.cli(&["job", "status", "nobody"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("no job \"nobody\" on this node (jobs: newcomer)")
    );
    // A job id stands for its allocation where one is asked for, if it has one alone.
    let ambiguous = agent.cli(&["alloc", "status", "newcomer"]);
    assert_eq!(ambiguous.status.code(), Some(2), "{ambiguous:?}");
    assert!(String::from_utf8_lossy(&ambiguous.stderr).contains("see `wharf job status newcomer`"));
    let solo = submit(&agent.client(), &job("solo", "batch", &sh_task("t", "true"))).await.unwrap();
    assert!(text(agent.cli(&["alloc", "status", "solo"])).contains(&solo));
    let stopped = text(agent.cli(&["job", "stop", "newcomer"]));
    assert!(stopped.contains("stopping 2 allocation(s)"), "{stopped}");
    eventually("both complete", || {
        let lines: serde_json::Value =
            serde_json::from_str(&text(agent.cli(&["--json", "job", "list"]))).unwrap();
        let newcomer =
            lines.as_array().unwrap().iter().find(|l| l["id"] == "newcomer").unwrap().clone();
        newcomer["status"] == "dead" && newcomer["allocations"]["complete"] == 2
    });
}
