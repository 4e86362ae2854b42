//! End-to-end tests of `wharf fleet` on loopback workers: real agents on this host, each with
//! its own data directory, created and destroyed by the fleet's pool.

// Real processes on the real clock: these tests start programs and poll within real bounds.
#![allow(clippy::disallowed_methods)]

use hyper::{Method, StatusCode};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use wharf_node::client::{Client, ClientError};
use wharf_node::fleet::api::{FleetAlloc, FleetWorker};
use wharf_tests::fleet::Fleet;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// Any single wait in these tests; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);

/// A fleet probing fast enough for tests, with `extra` settings.
struct FleetProcess(Fleet);

impl FleetProcess {
    fn start(dir: &Path, extra: &str) -> FleetProcess {
        let shim = Path::new(WHARF).with_file_name("wharf-shim");
        assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
        let settings = format!("probe_interval = \"200ms\"\nsync_interval = \"1s\"\n{extra}");
        FleetProcess(Fleet::start(Path::new(WHARF), dir, &settings, "info", LIMIT).unwrap())
    }

    /// A client presenting the token the fleet keeps in its data directory.
    fn client(&self) -> Client {
        Client::new(self.0.address(), Some(self.0.token().unwrap()))
    }

    /// `wharf fleet ARGS`, reaching this fleet at its address with the token it reads in the
    /// fleet's data directory.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(WHARF)
            .arg("fleet")
            .args(args)
            .env("WHARF_FLEET_ADDR", self.0.address())
            .env("WHARF_DATA_DIR", self.0.data_dir())
            .env_remove("WHARF_TOKEN")
            .output()
            .unwrap()
    }
}

async fn workers(client: &Client) -> Vec<FleetWorker> {
    client.json(Method::GET, "/v1/workers", None).await.unwrap()
}

/// Polls the workers until `check` holds.
async fn until_workers(client: &Client, what: &str, check: impl Fn(&[FleetWorker]) -> bool) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let list = workers(client).await;
        if check(&list) {
            return;
        }
        assert!(Instant::now() < deadline, "never {what}: {list:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Follows an allocation (long-polling) until `check` holds.
async fn until_alloc(
    client: &Client,
    id: &str,
    what: &str,
    check: impl Fn(&FleetAlloc) -> bool,
) -> FleetAlloc {
    let wait = async {
        let mut version = None;
        loop {
            let path = match version {
                Some(v) => format!("/v1/allocations/{id}?after={v}&wait=5s"),
                None => format!("/v1/allocations/{id}"),
            };
            let alloc: FleetAlloc = client.json(Method::GET, &path, None).await.unwrap();
            if check(&alloc) {
                return alloc;
            }
            version = Some(alloc.version);
        }
    };
    tokio::time::timeout(LIMIT, wait).await.unwrap_or_else(|_| panic!("never {what}"))
}

async fn submit(client: &Client, spec: &str) -> Result<FleetAlloc, ClientError> {
    let body = client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.as_bytes().to_vec())))
        .await?;
    Ok(serde_json::from_slice(&body).unwrap())
}

fn job(id: &str, kind: &str, script: &str) -> String {
    format!(
        "[job]\nid = \"{id}\"\ntype = \"{kind}\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
         config = {{ command = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

fn status_of(error: ClientError) -> StatusCode {
    match error {
        ClientError::Api { status, .. } => status,
        other => panic!("expected an API error, got {other}"),
    }
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_workers_run_allocations_and_end_with_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let fleet =
        FleetProcess::start(dir.path(), "per_worker_limit = 1\n[loopback]\ninstances = 2\n");
    let client = fleet.client();
    until_workers(&client, "two idle workers", |w| {
        w.len() == 2 && w.iter().all(|w| w.state == "idle")
    })
    .await;

    // Alone on its embedded store, the fleet leads.
    let status = fleet.cli(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("(leader)") && text.contains("Store    = redb ("), "{status:?}");

    // Each worker's agent said what it has; work that fits on none waits and says why.
    let listed = workers(&client).await;
    let has = listed[0].resources.expect("the agent said what it has");
    assert!(has.memory_mb > 0 && has.cpu_mhz > 0, "{listed:?}");
    assert_eq!(listed[0].free, Some(has), "nothing placed yet");
    let too_big = job("too-big", "batch", "true").replace(
        "[[group.task]]\nname = \"t\"",
        "[[group.task]]\nname = \"t\"\nresources = { memory = 99999999 }",
    );
    let waiting = submit(&client, &too_big).await.unwrap();
    let waiting =
        until_alloc(&client, &waiting.id, "a reason to wait", |a| a.waiting.is_some()).await;
    let why = waiting.waiting.clone().unwrap();
    assert!(why.starts_with("no worker has 99999999 MB free; largest free "), "{why}");
    let out = fleet.cli(&["workers"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("MEMORY USED/ALL") && text.contains(&format!("0/{} MB", has.memory_mb)),
        "{text}"
    );
    client.call(Method::POST, &format!("/v1/allocations/{}/stop", waiting.id), None).await.unwrap();

    // A batch allocation, followed by the CLI to its end.
    let spec = dir.path().join("batch.toml");
    std::fs::write(&spec, job("batch", "batch", "echo hi")).unwrap();
    let run = fleet.cli(&["submit", spec.to_str().unwrap()]);
    assert!(run.status.success(), "{run:?}");
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(out.contains(" running on loopback-"), "{out}");
    assert!(out.contains(" ended on loopback-") && out.contains(": complete"), "{out}");

    // One allocation per worker: the third waits until one ends, then takes its place.
    let forever = job("forever", "service", "exec sleep 1000");
    let a = submit(&client, &forever).await.unwrap();
    let b = submit(&client, &forever).await.unwrap();
    let c = submit(&client, &forever).await.unwrap();
    let a = until_alloc(&client, &a.id, "a runs", |x| x.phase == "running").await;
    let b = until_alloc(&client, &b.id, "b runs", |x| x.phase == "running").await;
    assert_ne!(a.worker, b.worker, "spread over the idle workers");
    // An operator's probe, out of turn.
    let probe = fleet.cli(&["probe", a.worker.as_deref().unwrap()]);
    assert!(probe.status.success(), "{probe:?}");
    let c = until_alloc(&client, &c.id, "c is queued", |x| x.phase == "queued").await;
    client.call(Method::POST, &format!("/v1/allocations/{}/stop", a.id), None).await.unwrap();
    let stopped = until_alloc(&client, &a.id, "a ends", FleetAlloc::is_final).await;
    assert_eq!(stopped.phase, "ended", "{stopped:?}");
    let c = until_alloc(&client, &c.id, "c runs", |x| x.phase == "running").await;
    assert_eq!(c.worker, a.worker, "c took a's place");

    // Killing a worker loses what ran there: a service is rescheduled (Nomad's defaults: the
    // first time after 30s) as attempt 2, with the lost attempt in its history. The fleet
    // makes a new worker to keep two.
    let b_worker = b.worker.clone().unwrap();
    let b_task = fleet.0.data_dir().join(format!("instances/{b_worker}/data/allocs/{}", b.id));
    assert!(b_task.exists());
    client.call(Method::POST, &format!("/v1/workers/{b_worker}/kill"), None).await.unwrap();
    let lost = until_alloc(&client, &b.id, "b is rescheduled", |x| x.attempt == 2).await;
    assert_eq!((lost.phase.as_str(), lost.runner_id.clone()), ("queued", format!("{}__2", b.id)));
    let first = &lost.history[0];
    assert!(first.outcome.starts_with("lost: ") && first.outcome.contains(&b_worker), "{lost:?}");
    assert_eq!(first.worker.as_deref(), Some(b_worker.as_str()));
    assert!(lost.not_before.is_some(), "{lost:?}");
    // `wharf fleet status` shows the history: the lost attempt, then the one waiting.
    let status = fleet.cli(&["status", &b.id]);
    assert!(status.status.success(), "{status:?}");
    let out = String::from_utf8_lossy(&status.stdout);
    let rows: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("ATTEMPT")).skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].starts_with("1 ") && rows[0].contains(&b_worker) && rows[0].contains("lost: "),
        "{out}"
    );
    assert!(rows[1].starts_with("2 ") && rows[1].contains(&format!("{}__2", b.id)), "{out}");
    assert!(rows[1].contains("queued, not before "), "{out}");
    until_workers(&client, "a replacement worker", |w| {
        w.iter().filter(|w| w.state == "idle" || w.state == "running").count() == 2
            && w.iter().all(|w| w.id != b_worker)
    })
    .await;
    // Once the killed worker has left the pool, its instance (and its node) is destroyed; the
    // lost attempt alone says nothing of when the destroy ends.
    assert!(!b_task.exists(), "the killed worker's node was wiped");
    let metrics =
        String::from_utf8(client.call(Method::GET, "/v1/metrics", None).await.unwrap().to_vec())
            .unwrap();
    assert!(metrics.contains("wharf_fleet_rescheduled_total 1"), "{metrics}");
    assert!(metrics.contains("wharf_prober_instances{"), "{metrics}");
    if let Err(problems) = wharf_tests::promtool::check_metrics(&metrics) {
        panic!("the fleet's metrics fail Prometheus' linter: {problems}\nin:\n{metrics}");
    }

    // A clean stop destroys the loopback instances: no agent or task of them survives.
    let instances = fleet.0.data_dir().join("instances");
    let instances_name = instances.display().to_string();
    assert!(!processes_mentioning(&instances_name).is_empty(), "agents run under {instances_name}");
    let status = fleet.0.terminate(LIMIT).unwrap();
    assert!(status.success(), "{status:?}");
    let kept: Vec<_> = walkdir_names(&instances);
    assert!(kept.is_empty(), "instance files left after a clean stop: {kept:?}");
    let left = processes_mentioning(&instances_name);
    assert!(left.is_empty(), "left running: {left:?}");
}

/// A job with `driver = "container"` through the fleet: placed on a loopback worker, whose
/// agent runs the image under runc; it completes, its output is the container's, and the
/// fleet's clean stop leaves neither instance files nor a mount behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_job_runs_on_a_loopback_worker_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/container-image.sh");
    let made = Command::new("sh").arg(&script).arg(&archive).output().unwrap();
    assert!(made.status.success(), "{made:?} (the script needs busybox-static and tar)");
    std::fs::create_dir(dir.path().join("fleet")).unwrap();
    let fleet = FleetProcess::start(&dir.path().join("fleet"), "[loopback]\ninstances = 1\n");
    let client = fleet.client();
    let spec = format!(
        "[job]\nid = \"boxed\"\ntype = \"batch\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"t\"\ndriver = \"container\"\n\
         config = {{ image = \"docker-archive:{}\", command = \"/bin/sh\", \
         args = [\"-c\", \"echo in a container; id -u; echo done > /alloc/done\"] }}\n",
        archive.display()
    );
    let alloc = submit(&client, &spec).await.unwrap();
    let done = until_alloc(&client, &alloc.id, "it ends", FleetAlloc::is_final).await;
    assert_eq!((done.phase.as_str(), done.attempt), ("ended", 1), "{done:?}");
    assert!(done.outcome.as_deref().unwrap_or_default().contains("complete"), "{done:?}");
    let worker = done.worker.clone().expect("placed on a worker");
    let alloc_dir =
        fleet.0.data_dir().join(format!("instances/{worker}/data/allocs/{}", done.runner_id));
    let out = std::fs::read_to_string(alloc_dir.join("t/logs/t.stdout.0")).unwrap();
    assert_eq!(out, "in a container\n0\n");
    assert_eq!(std::fs::read_to_string(alloc_dir.join("alloc/done")).unwrap(), "done\n");

    let instances = fleet.0.data_dir().join("instances");
    let status = fleet.0.terminate(LIMIT).unwrap();
    assert!(status.success(), "{status:?}");
    let kept = walkdir_names(&instances);
    assert!(kept.is_empty(), "instance files left after a clean stop: {kept:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = dir.path().canonicalize().unwrap().display().to_string();
    let left: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&root))
        .collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
}

/// The fleet's variables reach its workers: a template on a loopback worker renders from a
/// variable set with `wharf fleet var put` (the worker's own set is replaced by the fleet's)
/// and renders again when it changes there; the worker's agent keeps the fleet's copy and
/// refuses an older one; the fleet keeps its variables across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_variables_reach_its_workers_templates_and_follow_changes() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetProcess::start(dir.path(), "[loopback]\ninstances = 1\n");
    let client = fleet.client();
    let stdout = |output: std::process::Output| {
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(stdout(fleet.cli(&["var", "put", "app/db", "user=ann"])), "user=ann\n");
    let refused = fleet.cli(&["var", "put", "../x", "a=b"]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("../x"), "{refused:?}");

    let script = "while true; do cat local/db.conf > $WHARF_ALLOC_DIR/seen.new; \
                  mv $WHARF_ALLOC_DIR/seen.new $WHARF_ALLOC_DIR/seen; sleep 0.05; done";
    let spec = job("tpl", "service", script)
        + "[[group.task.template]]\n\
           data = '{{ with nomadVar \"app/db\" }}user={{ .user }}{{ end }}'\n\
           destination = \"local/db.conf\"\nchange_mode = \"noop\"\n";
    let alloc = submit(&client, &spec).await.unwrap();
    let running =
        until_alloc(&client, &alloc.id, "it runs", |a| a.phase.as_str() == "running").await;
    let worker = running.worker.clone().expect("placed on a worker");
    let agent_dir = fleet.0.data_dir().join(format!("instances/{worker}/data"));
    let seen = agent_dir.join(format!("allocs/{}/alloc/seen", running.runner_id));
    let read = || std::fs::read_to_string(&seen).unwrap_or_default();
    let eventually = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = Instant::now() + LIMIT;
        while !check() {
            assert!(Instant::now() < deadline, "never {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    eventually("the template rendered the fleet's variable", &|| read() == "user=ann");

    assert_eq!(stdout(fleet.cli(&["var", "put", "app/db", "user=bob"])), "user=bob\n");
    eventually("the template rendered the change", &|| read() == "user=bob");

    // The worker's agent holds the fleet's set, and refuses a copy older than it.
    let worker_cli = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = Command::new(WHARF)
            .arg("--data-dir")
            .arg(&agent_dir)
            .args(args)
            .env_remove("WHARF_TOKEN")
            .env_remove("WHARF_ADDR")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    assert_eq!(stdout(worker_cli(&["var", "get", "app/db"], "")), "user=bob\n");
    let generation = {
        let file = std::fs::read_to_string(agent_dir.join("variables.json")).unwrap();
        let file: serde_json::Value = serde_json::from_str(&file).unwrap();
        file["source_generation"].as_str().unwrap().to_owned()
    };
    let stale = format!(
        r#"{{"source_index": 1, "generation": "{generation}", "variables": {{"stale": {{"k": "v"}}}}}}"#
    );
    let kept = stdout(worker_cli(&["var", "sync"], &stale));
    assert!(kept.starts_with("kept:"), "{kept}");
    assert_eq!(stdout(worker_cli(&["var", "list"], "")), "app/db\n");
    // A variable set on the worker alone goes with the fleet's next copy.
    stdout(worker_cli(&["var", "put", "local/only", "x=1"], ""));
    assert_eq!(stdout(fleet.cli(&["var", "put", "app/db", "user=cy"])), "user=cy\n");
    eventually("the template rendered the fleet's next copy", &|| read() == "user=cy");
    assert_eq!(stdout(worker_cli(&["var", "list"], "")), "app/db\n");

    let status = fleet.0.terminate(LIMIT).unwrap();
    assert!(status.success(), "{status:?}");
    let fleet = FleetProcess::start(dir.path(), "[loopback]\ninstances = 1\n");
    assert_eq!(stdout(fleet.cli(&["var", "get", "app/db"])), "user=cy\n");
    assert_eq!(stdout(fleet.cli(&["var", "list"])), "app/db\n");
    let status = fleet.0.terminate(LIMIT).unwrap();
    assert!(status.success(), "{status:?}");
}

/// `wharf fleet status ID` of batch work whose every attempt failed: the rescheduled attempt
/// and the last one each say when they ended and how, in the table and in the JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_when_and_how_every_attempt_ended() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetProcess::start(dir.path(), "[loopback]\ninstances = 1\n");
    let client = fleet.client();
    // Batch work is placed again once when it fails (after 5s, by default), and not again.
    let spec = job("fails", "batch", "exit 3") + "restart = { attempts = 0 }\n";
    let alloc = submit(&client, &spec).await.unwrap();
    let done = until_alloc(&client, &alloc.id, "it fails twice", FleetAlloc::is_final).await;
    assert_eq!((done.phase.as_str(), done.attempt), ("ended", 2), "{done:?}");

    let out = fleet.cli(&["status", &alloc.id, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let shown: Vec<FleetAlloc> = serde_json::from_slice(&out.stdout).unwrap();
    let shown = &shown[0];
    let first = &shown.history[0];
    assert!(first.outcome.starts_with("ended: failed"), "{shown:?}");
    let finished = shown.finished.clone().expect("the last attempt's end, in the JSON");
    let outcome = shown.outcome.clone().expect("how the last attempt ended, in the JSON");
    assert!(outcome.starts_with("ended: failed"), "{outcome}");
    assert_eq!(Some(outcome.strip_prefix("ended: ").unwrap()), shown.detail.as_deref());
    assert!(first.finished < finished, "{shown:?}");

    let out = fleet.cli(&["status", &alloc.id]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("ATTEMPT")).collect();
    assert_eq!(rows.len(), 3, "{text}");
    // ATTEMPT, RUNNER ID, WORKER, STARTED, ENDED, COST ("-": a loopback worker has no
    // price), then OUTCOME (which has spaces).
    let ended_column = |row: &str| row.split_whitespace().nth(4).unwrap_or_default().to_owned();
    let cost_column = |row: &str| row.split_whitespace().nth(5).unwrap_or_default().to_owned();
    let outcome_column = |row: &str| row.split_whitespace().skip(6).collect::<Vec<_>>().join(" ");
    let header: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(header[5..], ["ENDED", "COST", "OUTCOME"], "{text}");
    assert_eq!([cost_column(rows[1]), cost_column(rows[2])], ["-", "-"], "{text}");
    assert_eq!(ended_column(rows[1]), first.finished, "{text}");
    assert_eq!(outcome_column(rows[1]), first.outcome, "{text}");
    assert_eq!(ended_column(rows[2]), finished, "{text}");
    assert_eq!(outcome_column(rows[2]), outcome, "{text}");
}

/// A job id is enough: `wharf fleet status JOB`, `allocs`, `job list|status` and `stop JOB`
/// find the allocations submitted with that job's spec, and no other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_id_finds_shows_and_stops_the_allocations_of_its_submissions() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetProcess::start(dir.path(), "[loopback]\ninstances = 1\n");
    let client = fleet.client();
    let spec = dir.path().join("newcomer.toml");
    std::fs::write(&spec, job("newcomer", "service", "sleep 60")).unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let out = fleet.cli(&["submit", "--detach", spec.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
        ids.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let other = submit(&client, &job("other", "batch", "exit 0")).await.unwrap();
    assert_eq!(other.job.as_deref(), Some("other"), "{other:?}");
    for id in &ids {
        until_alloc(&client, id, "running", |a| a.phase.as_str() == "running").await;
    }

    let out = fleet.cli(&["status", "newcomer", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let shown: Vec<FleetAlloc> = serde_json::from_slice(&out.stdout).unwrap();
    let shown_ids: Vec<&str> = shown.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(shown_ids, ids, "{shown:?}");
    assert!(shown.iter().all(|a| a.job.as_deref() == Some("newcomer")), "{shown:?}");
    assert!(shown.iter().all(|a| a.group.as_deref() == Some("g")), "{shown:?}");
    let out = fleet.cli(&["status", "newcomer"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ID     = newcomer\nStatus = running\n"), "{text}");
    assert!(ids.iter().all(|id| text.contains(&format!("Allocation {id} (g)"))), "{text}");
    assert_eq!(text.matches("ATTEMPT").count(), 2, "{text}");
    assert!(!text.contains(&other.id), "{text}");

    let out = fleet.cli(&["allocs"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for id in &ids {
        let line = text.lines().find(|l| l.starts_with(id.as_str())).unwrap_or_default();
        assert_eq!(line.split_whitespace().nth(1), Some("newcomer"), "{text}");
    }
    let out = fleet.cli(&["job", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(jobs[0]["id"], "newcomer", "{jobs}");
    assert_eq!(jobs[0]["status"], "running", "{jobs}");
    assert_eq!(jobs[0]["allocations"]["running"], 2, "{jobs}");
    assert_eq!(jobs[1]["id"], "other", "{jobs}");

    let out = fleet.cli(&["status", "nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains(r#"no allocation or job "nosuch""#), "{error}");
    assert!(error.contains("(jobs: newcomer, other)"), "{error}");

    let out = fleet.cli(&["stop", "newcomer"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "job \"newcomer\": stopping 2 allocation(s)\n"
    );
    for id in &ids {
        until_alloc(&client, id, "stopped", FleetAlloc::is_final).await;
    }
    let out = fleet.cli(&["job", "status", "newcomer", "--json"]);
    let shown: Vec<FleetAlloc> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown.iter().all(|a| a.outcome.is_some()), "{shown:?}");
    let out = fleet.cli(&["job", "stop", "newcomer"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "job \"newcomer\": stopping 0 allocation(s)\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetProcess::start(dir.path(), "[loopback]\ninstances = 1\n");
    let client = fleet.client();
    let bad_spec = submit(&client, "[job]\nid = \"x\"\n").await.unwrap_err();
    assert_eq!(status_of(bad_spec), StatusCode::UNPROCESSABLE_ENTITY);
    let spec = job("named", "batch", "true").into_bytes();
    let named = |id: &str| {
        let path = format!("/v1/allocations?id={id}");
        let (client, spec) = (client.clone(), spec.clone());
        async move { client.call(Method::POST, &path, Some(("application/toml", spec))).await }
    };
    named("mine-1").await.unwrap();
    assert_eq!(status_of(named("mine-1").await.unwrap_err()), StatusCode::CONFLICT);
    assert_eq!(status_of(named("..%2Fx").await.unwrap_err()), StatusCode::BAD_REQUEST);
    let unknown = client.call(Method::GET, "/v1/allocations/nope", None).await.unwrap_err();
    assert_eq!(status_of(unknown), StatusCode::NOT_FOUND);
    let no_worker = client.call(Method::POST, "/v1/workers/nope/hold", None).await.unwrap_err();
    assert_eq!(status_of(no_worker), StatusCode::NOT_FOUND);
    let no_probe = client.call(Method::POST, "/v1/workers/nope/probe", None).await.unwrap_err();
    assert_eq!(status_of(no_probe), StatusCode::NOT_FOUND);
    let bad_action = client.call(Method::POST, "/v1/workers/nope/explode", None).await.unwrap_err();
    assert_eq!(status_of(bad_action), StatusCode::BAD_REQUEST);
    let big = vec![b'#'; 2 << 20];
    let too_big =
        client.call(Method::POST, "/v1/allocations", Some(("application/toml", big))).await;
    assert_eq!(status_of(too_big.unwrap_err()), StatusCode::PAYLOAD_TOO_LARGE);
    // The server closes a connection whose body it refused to read; a new client does not
    // pick that connection from its pool.
    let client = fleet.client();
    let allocs: Vec<FleetAlloc> = client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    assert_eq!(allocs.len(), 1, "only the good submission: {allocs:?}");
    until_alloc(&client, "mine-1", "mine-1 completes", |a| a.phase == "ended").await;

    // A configuration that cannot work is refused before anything starts.
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[loopback]\ninstances = 0\n").unwrap();
    let refused =
        Command::new(WHARF).args(["fleet", "--config", config.to_str().unwrap()]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("loopback.instances"), "{refused:?}");
}

/// The fleet's API is never open: with no token configured, the fleet makes one at its first
/// start and keeps it in its data directory, readable by its user alone. No token is a 401, a
/// wrong one a 403, on every call but the health check; `wharf fleet` commands find the token
/// through `--data-dir`, `WHARF_DATA_DIR` or the default data directory, and a token given
/// wins. A token configured later wins, and the kept one is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_api_requires_the_token_it_keeps_and_its_commands_find_it_in_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetProcess::start(dir.path(), "[loopback]\ninstances = 1\n");
    let data_dir = fleet.0.data_dir().to_owned();
    let file = wharf_node::api_token::FLEET.path(&data_dir);
    assert_eq!(file, data_dir.join("fleet-token"));
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", file.display());
    let token = fleet.0.token().unwrap();
    assert!(token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");

    let address = fleet.0.address();
    let anonymous = Client::new(address, None);
    let wrong = Client::new(address, Some("not-the-fleets-token-0123".into()));
    let spec = job("refused", "batch", "true").into_bytes();
    let calls = [
        (Method::GET, "/v1/workers", None),
        (Method::GET, "/v1/allocations", None),
        (Method::POST, "/v1/allocations", Some(("application/toml", spec.clone()))),
        (Method::POST, "/v1/allocations/refused/stop", None),
        (Method::POST, "/v1/workers/loopback-1/drain", None),
        (Method::GET, "/v1/metrics", None),
        (Method::GET, "/v1/status", None),
    ];
    for (method, path, body) in calls {
        let refused = anonymous.call(method.clone(), path, body.clone()).await.unwrap_err();
        assert_eq!(status_of(refused), StatusCode::UNAUTHORIZED, "{method} {path}");
        let refused = wrong.call(method.clone(), path, body).await.unwrap_err();
        assert_eq!(status_of(refused), StatusCode::FORBIDDEN, "{method} {path}");
    }
    anonymous.call(Method::GET, "/v1/health", None).await.unwrap();
    let client = fleet.client();
    let allocs: Vec<FleetAlloc> = client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    assert!(allocs.is_empty(), "nothing refused was taken: {allocs:?}");
    until_workers(&client, "an idle worker", |w| w.len() == 1 && w[0].state == "idle").await;

    // The commands: no token anywhere they look is a 401 that says where they looked.
    let elsewhere = tempfile::tempdir().unwrap();
    let command = |args: &[&str], env: &[(&str, &std::ffi::OsStr)]| {
        Command::new(WHARF)
            .args(args)
            .current_dir(elsewhere.path())
            .env("WHARF_FLEET_ADDR", address)
            .env_remove("WHARF_DATA_DIR")
            .env_remove("WHARF_TOKEN")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let refused = command(&["fleet", "workers"], &[]);
    assert!(!refused.status.success(), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    for phrase in ["requires a token", "give the fleet's token", "wharf-fleet/fleet-token"] {
        assert!(stderr.contains(phrase), "{phrase:?} in {stderr}");
    }
    let dir_flag = ["--data-dir", data_dir.to_str().unwrap(), "fleet", "workers"];
    let in_env = [("WHARF_DATA_DIR", data_dir.as_os_str())];
    // The default data directory, ./wharf-fleet, is this fleet's (through a link).
    std::os::unix::fs::symlink(&data_dir, elsewhere.path().join("wharf-fleet")).unwrap();
    for (case, out) in [
        ("--data-dir", command(&dir_flag, &[])),
        ("WHARF_DATA_DIR", command(&["fleet", "workers"], &in_env)),
        ("the default data directory", command(&["fleet", "workers"], &[])),
    ] {
        assert!(out.status.success(), "{case}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("loopback-") && stdout.contains(" idle "), "{case}: {stdout}");
    }
    let wrong_flag =
        command(&["--token", "not-the-fleets-token-0123", "fleet", "workers"], &in_env);
    assert!(!wrong_flag.status.success(), "a token given wins: {wrong_flag:?}");
    assert!(String::from_utf8_lossy(&wrong_flag.stderr).contains("not valid"), "{wrong_flag:?}");

    // Started again over the same directory with a token configured: that one, and no other.
    let status = fleet.0.terminate(LIMIT).unwrap();
    assert!(status.success(), "{status:?}");
    let configured = "the-configured-token-0123";
    let settings = format!("token = \"{configured}\"\n[loopback]\ninstances = 1\n");
    let fleet = FleetProcess::start(dir.path(), &settings);
    assert!(!file.exists(), "the kept token is removed when one is configured");
    let kept = Client::new(fleet.0.address(), Some(token));
    let refused = kept.call(Method::GET, "/v1/workers", None).await.unwrap_err();
    assert_eq!(status_of(refused), StatusCode::FORBIDDEN);
    Client::new(fleet.0.address(), Some(configured.into()))
        .call(Method::GET, "/v1/workers", None)
        .await
        .unwrap();
}

/// The loopback agents are the fleet's own: the WHARF_ADDR and WHARF_TOKEN in the fleet's
/// environment are the fleet's address and token (as they are `wharf agent`'s), and do not
/// reach its agents. Each agent makes a token of its own, kept in its data directory inside
/// the fleet's, requires it of every caller, and the fleet's commands on it read it there: the
/// workers come up as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_agents_each_keep_their_own_token_and_ignore_the_fleets_settings() {
    let dir = tempfile::tempdir().unwrap();
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
    let settings =
        "probe_interval = \"200ms\"\nsync_interval = \"1s\"\n[loopback]\ninstances = 2\n";
    // An address that was free a moment ago: the fleet takes it, and an agent that took it
    // too could not start.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let free = free.to_string();
    let fleet_token = "the-fleets-own-token-0123";
    let env = [("WHARF_ADDR", free.as_str()), ("WHARF_TOKEN", fleet_token)];
    let fleet = FleetProcess(
        Fleet::start_with_env(Path::new(WHARF), dir.path(), settings, "info", LIMIT, &env).unwrap(),
    );
    assert_eq!(fleet.0.address(), free, "the fleet listens where WHARF_ADDR says");
    let anonymous = Client::new(fleet.0.address(), None);
    let refused = anonymous.call(Method::GET, "/v1/workers", None).await.unwrap_err();
    assert_eq!(status_of(refused), StatusCode::UNAUTHORIZED, "the fleet requires WHARF_TOKEN");
    assert!(fleet.0.token().is_err(), "given a token, the fleet keeps none of its own");
    let client = Client::new(fleet.0.address(), Some(fleet_token.into()));
    until_workers(&client, "two idle workers", |w| {
        w.len() == 2 && w.iter().all(|w| w.state == "idle")
    })
    .await;

    let mut tokens = Vec::new();
    for worker in workers(&client).await {
        let data = fleet.0.data_dir().join(format!("instances/{}/data", worker.id));
        let file = wharf_node::agent_token::path(&data);
        let mode = std::fs::symlink_metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
        let token = wharf_node::agent_token::read(&data).unwrap().unwrap();
        assert_ne!(token, fleet_token, "{} took the fleet's token", worker.id);
        let agent = wharf_node::agent_file::AgentFile::read(&data).unwrap().unwrap();
        assert_ne!(agent.address, format!("http://{free}"));
        let refused = Client::new(&agent.address, None)
            .call(Method::GET, "/v1/allocations", None)
            .await
            .unwrap_err();
        assert_eq!(status_of(refused), StatusCode::UNAUTHORIZED, "{} is open", worker.id);
        let wrong = Client::new(&agent.address, Some(fleet_token.into()));
        let refused = wrong.call(Method::GET, "/v1/allocations", None).await.unwrap_err();
        assert_eq!(status_of(refused), StatusCode::FORBIDDEN, "{}", worker.id);
        Client::new(&agent.address, Some(token.clone()))
            .call(Method::GET, "/v1/allocations", None)
            .await
            .unwrap();
        tokens.push(token);
    }
    assert_ne!(tokens[0], tokens[1], "each agent has its own token");

    // Work runs through the runner commands, which present each agent's own token.
    let spec = job("through-the-runner", "batch", "echo hi");
    let alloc = client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.into_bytes())))
        .await
        .unwrap();
    let alloc: FleetAlloc = serde_json::from_slice(&alloc).unwrap();
    let done = until_alloc(&client, &alloc.id, "it ends", FleetAlloc::is_final).await;
    assert!(done.detail.as_deref().is_some_and(|d| d.starts_with("complete")), "{done:?}");
}

/// `wharf fleet` takes the global `--address`, `--data-dir` and `--token` as `wharf agent`
/// does: a flag over its environment variable, which is over the file's `bind`, `data_dir` and
/// `token`; and `wharf fleet --help` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_address_data_dir_and_token_flags_environment_and_file() {
    let dir = tempfile::tempdir().unwrap();
    // A port that is taken: the fleet fails if it still listens where the file says.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let config = dir.path().join("fleet.toml");
    std::fs::write(
        &config,
        format!(
            "bind = \"{taken}\"\ndata_dir = {:?}\ntoken = \"the-files-token-0123456\"\n\
             probe_interval = \"200ms\"\n[loopback]\ninstances = 1\n",
            dir.path().join("from-file").display().to_string()
        ),
    )
    .unwrap();
    let start = |env: &[(&str, &str)], args: &[&str]| {
        let mut command = Command::new(WHARF);
        command
            .args(args)
            .arg("fleet")
            .arg("--config")
            .arg(&config)
            .env_remove("WHARF_ADDR")
            .env_remove("WHARF_DATA_DIR")
            .env_remove("WHARF_TOKEN")
            .envs(env.iter().copied());
        wharf_tests::announce::spawn_announcing(&mut command, "fleet ready", LIMIT, None)
    };
    let (flag_dir, env_dir) = (dir.path().join("flag"), dir.path().join("env"));
    let (flag_dir, env_dir) = (flag_dir.to_str().unwrap(), env_dir.to_str().unwrap());
    let (flag_token, env_token) = ("the-flags-token-0123", "the-envs-token-01234");
    let flags = ["--address", "127.0.0.1:0", "--data-dir", flag_dir, "--token", flag_token];
    let environment = |address| {
        [("WHARF_ADDR", address), ("WHARF_DATA_DIR", env_dir), ("WHARF_TOKEN", env_token)]
    };
    let (free_env, taken_env) = (environment("127.0.0.1:0"), environment(taken.as_str()));
    /// What a case sets, and the data directory and token the fleet must then use.
    struct Case<'a> {
        name: &'a str,
        env: &'a [(&'a str, &'a str)],
        flags: &'a [&'a str],
        data_dir: &'a str,
        token: &'a str,
    }
    let cases = [
        Case { name: "the flags", env: &[], flags: &flags, data_dir: flag_dir, token: flag_token },
        Case {
            name: "the environment",
            env: &free_env,
            flags: &[],
            data_dir: env_dir,
            token: env_token,
        },
        Case {
            name: "the flags over the environment",
            env: &taken_env,
            flags: &flags,
            data_dir: flag_dir,
            token: flag_token,
        },
    ];
    for Case { name: case, env, flags: args, data_dir, token } in cases {
        let (mut child, address) = start(env, args).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_ne!(address, taken, "{case}");
        assert!(Path::new(data_dir).join("fleet.redb").exists(), "{case}: data in {data_dir}");
        for other in [flag_dir, env_dir] {
            assert_eq!(Path::new(other).exists(), other == data_dir, "{case}: {other}");
        }
        let anonymous = Client::new(&address, None);
        let refused = anonymous.call(Method::GET, "/v1/workers", None).await.unwrap_err();
        assert_eq!(status_of(refused), StatusCode::UNAUTHORIZED, "{case}");
        for other in ["the-files-token-0123456", "the-envs-token-01234", "the-flags-token-0123"] {
            let result = Client::new(&address, Some(other.into()))
                .call(Method::GET, "/v1/workers", None)
                .await;
            assert_eq!(result.is_ok(), other == token, "{case}: {other}: {result:?}");
        }
        // Its worker up (no create under way), a clean stop leaves nothing in its directory.
        let client = Client::new(&address, Some(token.into()));
        until_workers(&client, "an idle worker", |w| w.len() == 1 && w[0].state == "idle").await;
        let status = wharf_tests::announce::terminate(&mut child, LIMIT).unwrap();
        assert!(status.success(), "{case}: {status:?}");
        std::fs::remove_dir_all(data_dir).unwrap();
    }
    assert!(!dir.path().join("from-file").exists(), "the file's data_dir was never used");
    let from_file = start(&[], &[]).map(|(mut child, _)| {
        let _ = wharf_tests::announce::terminate(&mut child, LIMIT);
    });
    let refused = from_file.expect_err("the file's address is taken");
    assert!(refused.contains(&format!("cannot listen on {taken}")), "{refused}");

    let help = Command::new(WHARF).args(["fleet", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    for phrase in [
        "a flag overrides its environment variable (WHARF_ADDR, WHARF_DATA_DIR, WHARF_TOKEN)",
        "which overrides the --config file",
        "set the file's `bind`, `data_dir` and `token`",
    ] {
        assert!(help.contains(phrase), "{phrase:?} in {help}");
    }
}

/// Every path under `dir`, for a failure message.
fn walkdir_names(dir: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        names.push(entry.path().display().to_string());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            names.extend(walkdir_names(&entry.path()));
        }
    }
    names
}
