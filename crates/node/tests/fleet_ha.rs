//! Three `wharf fleet` replicas on one etcd (a real one on 127.0.0.1, from Debian's
//! `etcd-server`; without it these tests fail and say what to install) and one set of loopback
//! workers they share. One leads; the others answer reads from the store and forward the rest.
//!
//! When the leader is killed with SIGKILL, or frozen with SIGSTOP (a leader cut off), another
//! takes over within the lease's TTL (a little more, for the election's round trips), adopts
//! the work running on the workers without starting any of it again, and places new work; a
//! frozen leader that wakes up has lost its term and follows.

// Real processes on the real clock: the tests start, freeze and kill fleets, and poll within
// bounds.
#![allow(clippy::disallowed_methods)]

use hyper::Method;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use wharf_node::client::{ApiPath, Client, ClientError};
use wharf_node::fleet::api::{FleetAlloc, FleetStatus, FleetWorker};
use wharf_tests::etcd::Etcd;
use wharf_tests::fleet::Fleet;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// The lease each replica holds; a replica that stops renewing it loses its place this long
/// after its last renewal.
const LEASE: Duration = Duration::from_secs(3);
/// Any single wait; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);
/// The token the replicas share: a follower forwards requests to the leader with it.
const TOKEN: &str = "the-replicas-shared-token";

/// Three replicas and what they share. Dropped: every fleet is killed and the shared loopback
/// workers are wiped with everything they ran.
struct Replicas {
    fleets: Vec<Option<Fleet>>,
    shared: tempfile::TempDir,
    _etcd: Etcd,
    _dirs: Vec<tempfile::TempDir>,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for fleet in self.fleets.iter_mut() {
            drop(fleet.take());
        }
        for instance in
            std::fs::read_dir(self.shared.path().join("instances")).into_iter().flatten().flatten()
        {
            let data = instance.path().join("data");
            let _ = Command::new(WHARF).arg("--data-dir").arg(data).arg("wipe").output();
        }
    }
}

impl Replicas {
    /// Starts etcd and three replicas over two shared loopback workers, and waits until one
    /// leads and both workers are idle.
    async fn start() -> Replicas {
        let shim = Path::new(WHARF).with_file_name("wharf-shim");
        assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
        let etcd = Etcd::start(LIMIT).unwrap_or_else(|e| panic!("{e}"));
        let shared = tempfile::tempdir().unwrap();
        let mut dirs = Vec::new();
        let mut fleets = Vec::new();
        for i in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let settings = format!(
                "token = {TOKEN:?}\nper_worker_limit = 4\nprobe_interval = \"200ms\"\n\
                 sync_interval = \"1s\"\n\
                 [loopback]\ninstances = 2\nroot = {root:?}\n\
                 [runner]\ndirectory = {runner:?}\n\
                 [store]\nbackend = \"etcd\"\nendpoints = [\"{endpoint}\"]\nprefix = \"/ha\"\n\
                 lease_ttl = \"{lease}s\"\nreplica = \"r{i}\"\n",
                root = shared.path().join("instances").display().to_string(),
                runner = shared.path().join("runner").display().to_string(),
                endpoint = etcd.endpoint(),
                lease = LEASE.as_secs(),
            );
            fleets.push(Some(
                Fleet::start(Path::new(WHARF), dir.path(), &settings, "info", LIMIT).unwrap(),
            ));
            dirs.push(dir);
        }
        let replicas = Replicas { fleets, shared, _etcd: etcd, _dirs: dirs };
        let leader = replicas.leader(None).await;
        replicas
            .until("two idle workers", async || {
                let workers: Vec<FleetWorker> =
                    replicas.client(leader).json(Method::GET, "/v1/workers", None).await.ok()?;
                (workers.iter().filter(|w| w.state == "idle").count() == 2).then_some(())
            })
            .await;
        replicas
    }

    fn fleet(&self, i: usize) -> &Fleet {
        self.fleets[i].as_ref().expect("a replica that runs")
    }

    fn client(&self, i: usize) -> Client {
        Client::new(self.fleet(i).address(), Some(TOKEN.into()))
    }

    async fn status(&self, i: usize) -> Option<FleetStatus> {
        self.client(i).json(Method::GET, "/v1/status", None).await.ok()
    }

    /// Polls `check` until it returns something, within [`LIMIT`].
    async fn until<T>(&self, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = (0..3)
                    .filter_map(|i| {
                        self.fleets[i].as_ref().map(|f| format!("r{i}:\n{}", f.log_tail(30)))
                    })
                    .collect();
                panic!("never {what}\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The replica that leads (other than `not`), once one says so.
    async fn leader(&self, not: Option<usize>) -> usize {
        self.until("a replica leads", async || {
            for i in (0..3).filter(|i| Some(*i) != not && self.fleets[*i].is_some()) {
                if self.status(i).await.is_some_and(|s| s.role == "leader") {
                    return Some(i);
                }
            }
            None
        })
        .await
    }

    /// Submits a service through replica `via` until one is acknowledged (while an election is
    /// under way, replicas answer 503).
    async fn submit(&self, via: usize, id: &str) -> FleetAlloc {
        let spec = format!(
            "[job]\nid = \"{id}\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
             [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
             config = {{ command = \"/bin/sleep\", args = [\"1000\"] }}\n"
        );
        let path = ApiPath::v1(["allocations"]).query("id", id);
        self.until(&format!("{id} acknowledged"), async || {
            let body = Some(("application/toml", spec.clone().into_bytes()));
            match self.client(via).call(Method::POST, &path, body).await {
                Ok(body) => Some(serde_json::from_slice(&body).unwrap()),
                Err(ClientError::Api { status, .. }) if status == 503 => None,
                Err(e) => panic!("submitting {id}: {e}"),
            }
        })
        .await
    }

    /// Waits until replica `via` shows allocation `id` running.
    async fn running(&self, via: usize, id: &str) -> FleetAlloc {
        self.until(&format!("{id} running"), async || {
            let path = ApiPath::v1(["allocations", id]);
            let alloc: FleetAlloc = self.client(via).json(Method::GET, path, None).await.ok()?;
            assert!(!alloc.is_final(), "{alloc:?}");
            (alloc.phase == "running").then_some(alloc)
        })
        .await
    }

    /// Which workers' agents run allocation `id` (each agent asked directly).
    fn agents_running(&self, id: &str) -> Vec<String> {
        let mut on = Vec::new();
        for instance in std::fs::read_dir(self.shared.path().join("instances")).unwrap().flatten() {
            let data: PathBuf = instance.path().join("data");
            let out = Command::new(WHARF)
                .arg("--data-dir")
                .arg(&data)
                .args(["alloc", "list", "--probe"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).lines().any(|l| l == id) {
                on.push(instance.file_name().to_string_lossy().into_owned());
            }
        }
        on
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.fleet(i).pid().to_string();
        let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(sent.success(), "kill {signal} {pid}");
    }
}

/// Checks that the work placed before a failover runs on as it did: on the same worker, in
/// its first attempt, on one agent only.
async fn runs_on_as_before(replicas: &Replicas, via: usize, before: &[FleetAlloc]) {
    for alloc in before {
        let now = replicas.running(via, &alloc.id).await;
        assert_eq!((now.worker.as_deref(), now.attempt), (alloc.worker.as_deref(), 1), "{now:?}");
        let on = replicas.agents_running(&alloc.id);
        assert_eq!(on.len(), 1, "{} runs on {on:?}", alloc.id);
    }
}

/// Followers that follow log no error: a follower's campaign waits for as long as another
/// replica leads, and nothing cuts it short (a per-call timeout of the etcd client used to,
/// with an ERROR about every 6 s). Watched for longer than that, while work goes through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_that_follow_log_no_error() {
    /// Longer than the old period of the error.
    const WATCH: Duration = Duration::from_secs(10);
    let replicas = Replicas::start().await;
    let watched = Instant::now();
    let leader = replicas.leader(None).await;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    replicas.submit(followers[0], "while-following").await;
    replicas.running(followers[1], "while-following").await;
    let errors = |i: usize| -> Vec<String> {
        let log = replicas.fleet(i).log_tail(usize::MAX);
        log.lines().filter(|l| l.contains("ERROR")).map(str::to_owned).collect()
    };
    // Each follower's log is read through the whole watch: an error fails the test as it comes.
    while watched.elapsed() < WATCH {
        for &i in &followers {
            let found = errors(i);
            assert!(
                found.is_empty(),
                "r{i} logged errors while it followed:\n{}",
                found.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for &i in &followers {
        let status = replicas.status(i).await.unwrap();
        assert_eq!(status.role, "follower", "r{i}");
        assert_eq!(status.leader.map(|l| l.name), Some(format!("r{leader}")), "r{i}");
        let found = errors(i);
        assert!(found.is_empty(), "r{i} logged errors while it followed:\n{}", found.join("\n"));
    }
    assert_eq!(replicas.leader(None).await, leader, "the leader never changed");
}

/// A Nomad job registered through the leader, with its allocation once it runs.
async fn register_nomad_job(replicas: &Replicas, via: usize, id: &str) -> serde_json::Value {
    let job = serde_json::json!({"Job": {"ID": id, "TaskGroups": [{
        "Name": "g", "Count": 1,
        "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {
            "command": "/bin/sleep", "args": ["1000"]}}],
    }]}});
    let body = Some(("application/json", job.to_string().into_bytes()));
    replicas.client(via).call(Method::PUT, "/v1/jobs", body).await.unwrap();
    job_allocation(replicas, via, id, "running", |status| status == "running").await
}

/// Job `id`'s one allocation as replica `via` shows it, once its client status is `wanted`.
async fn job_allocation(
    replicas: &Replicas,
    via: usize,
    id: &str,
    what: &str,
    wanted: fn(&str) -> bool,
) -> serde_json::Value {
    let path = format!("/v1/job/{id}/allocations");
    replicas
        .until(&format!("{id}'s allocation {what} on r{via}"), async || {
            let allocs: Vec<serde_json::Value> =
                replicas.client(via).json(Method::GET, &path, None).await.ok()?;
            assert!(allocs.len() <= 1, "{allocs:?}");
            allocs.into_iter().find(|a| a["ClientStatus"].as_str().is_some_and(wanted))
        })
        .await
}

/// A Nomad job registered through the leader is kept in the shared store: the next leader
/// lists it and its allocation, and stops and purges it.
async fn the_next_leader_serves_the_nomad_job(
    replicas: &Replicas,
    next: usize,
    id: &str,
    alloc: &serde_json::Value,
) {
    let client = replicas.client(next);
    let job: serde_json::Value =
        client.json(Method::GET, &format!("/v1/job/{id}"), None).await.unwrap();
    assert_eq!((job["ID"].as_str(), job["Stop"].as_bool()), (Some(id), Some(false)), "{job}");
    let jobs: Vec<serde_json::Value> = client.json(Method::GET, "/v1/jobs", None).await.unwrap();
    assert!(jobs.iter().any(|j| j["ID"] == id), "{jobs:?}");
    let now = job_allocation(replicas, next, id, "running", |status| status == "running").await;
    assert_eq!(now["ID"], alloc["ID"], "the same allocation, adopted: {now}");

    client.call(Method::DELETE, &format!("/v1/job/{id}"), None).await.unwrap();
    let job: serde_json::Value =
        client.json(Method::GET, &format!("/v1/job/{id}"), None).await.unwrap();
    assert_eq!(job["Stop"], true, "{job}");
    let ended = |status: &str| !matches!(status, "pending" | "running");
    job_allocation(replicas, next, id, "ended", ended).await;
    client.call(Method::DELETE, &format!("/v1/job/{id}?purge=true"), None).await.unwrap();
    let gone = client.call(Method::GET, &format!("/v1/job/{id}"), None).await;
    assert!(matches!(gone, Err(ClientError::Api { status, .. }) if status == 404), "{gone:?}");
    let jobs: Vec<serde_json::Value> = client.json(Method::GET, "/v1/jobs", None).await.unwrap();
    assert!(jobs.is_empty(), "{jobs:?}");
}

/// The leader is killed: another takes over within the lease, adopts the work (the fleet's and
/// a Nomad job's) without running any of it twice, and serves the Nomad job registered through
/// the old leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_its_lease_and_nothing_is_lost_or_run_twice() {
    let mut replicas = Replicas::start().await;
    let leader = replicas.leader(None).await;
    let follower = (leader + 1) % 3;
    // A follower forwards a submission to the leader, and reads it back from the store.
    let mut before = Vec::new();
    for id in ["kept-1", "kept-2"] {
        replicas.submit(follower, id).await;
        before.push(replicas.running(follower, id).await);
    }
    let status = replicas.status(follower).await.unwrap();
    assert_eq!((status.role.as_str(), status.store.backend.as_str()), ("follower", "etcd"));
    assert_eq!(status.leader.map(|l| l.name), Some(format!("r{leader}")));
    assert_eq!(status.replicas.len(), 3, "{:?}", status.replicas);
    let nomad_alloc = register_nomad_job(&replicas, leader, "nomad-kept").await;

    let killed = Instant::now();
    replicas.fleets[leader].take().unwrap().kill();
    let next = replicas.leader(Some(leader)).await;
    let took = killed.elapsed();
    assert!(took < LEASE + Duration::from_secs(2), "a new leader after {took:?}");
    replicas.submit(next, "after").await;
    replicas.running(next, "after").await;
    runs_on_as_before(&replicas, next, &before).await;
    assert_eq!(replicas.agents_running("after").len(), 1);
    let nomad_alloc_id = nomad_alloc["ID"].as_str().unwrap();
    assert_eq!(replicas.agents_running(nomad_alloc_id).len(), 1, "{nomad_alloc}");
    the_next_leader_serves_the_nomad_job(&replicas, next, "nomad-kept", &nomad_alloc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_loses_its_term_and_follows_when_it_wakes() {
    let replicas = Replicas::start().await;
    let leader = replicas.leader(None).await;
    replicas.submit(leader, "kept").await;
    let before = vec![replicas.running(leader, "kept").await];

    // Frozen, as a leader cut off from etcd would be: it renews nothing, and another leads.
    replicas.signal(leader, "-STOP");
    let frozen = Instant::now();
    let next = replicas.leader(Some(leader)).await;
    let took = frozen.elapsed();
    assert!(took < LEASE + Duration::from_secs(2), "a new leader after {took:?}");
    replicas.submit(next, "meanwhile").await;
    replicas.running(next, "meanwhile").await;

    // It wakes up past its lease: it acts no more, and follows.
    replicas.signal(leader, "-CONT");
    replicas
        .until("the old leader follows", async || {
            let status = replicas.status(leader).await?;
            (status.role == "follower"
                && status.leader.is_some_and(|l| l.name == format!("r{next}")))
            .then_some(())
        })
        .await;
    // What it is asked now goes to the new leader.
    replicas.submit(leader, "through-the-old").await;
    replicas.running(next, "through-the-old").await;
    runs_on_as_before(&replicas, next, &before).await;
    for id in ["meanwhile", "through-the-old"] {
        assert_eq!(replicas.agents_running(id).len(), 1, "{id}");
    }
}

/// Nomad's API through a follower: each call goes to the leader, which keeps the job and
/// places its work; the answers come back in Nomad's words (a refusal is text, not the
/// fleet's JSON), and a client node's call comes back from the worker through both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_calls_to_a_follower_are_answered_by_the_leader() {
    let replicas = Replicas::start().await;
    let leader = replicas.leader(None).await;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let job = serde_json::json!({"Job": {"ID": "via-follower", "TaskGroups": [{
        "Name": "g", "Count": 1,
        "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {
            "command": "/bin/sh", "args": ["-c", "echo hello-via-follower; exec sleep 1000"]}}],
    }]}});
    let body = Some(("application/json", job.to_string().into_bytes()));
    let registered = replicas.client(followers[0]).call(Method::PUT, "/v1/jobs", body).await;
    let registered: serde_json::Value = serde_json::from_slice(&registered.unwrap()).unwrap();
    assert!(registered["EvalID"].as_str().is_some_and(|e| !e.is_empty()), "{registered}");
    let on_leader: serde_json::Value =
        replicas.client(leader).json(Method::GET, "/v1/job/via-follower", None).await.unwrap();
    assert_eq!(on_leader["ID"], "via-follower");
    // Nomad's list (a Nomad parameter), through the other follower.
    let alloc = replicas
        .until("the job's allocation running", async || {
            let path = "/v1/allocations?prefix=";
            let allocs: Vec<serde_json::Value> =
                replicas.client(followers[1]).json(Method::GET, path, None).await.ok()?;
            allocs
                .into_iter()
                .find(|a| a["JobID"] == "via-follower" && a["ClientStatus"] == "running")
        })
        .await;
    let id = alloc["ID"].as_str().unwrap().to_owned();
    let path = format!("/v1/client/fs/logs/{id}?task=t&type=stdout&plain=true");
    replicas
        .until("the task's log through a follower", async || {
            let log = replicas.client(followers[1]).call(Method::GET, &path, None).await.ok()?;
            String::from_utf8_lossy(&log).contains("hello-via-follower\n").then_some(())
        })
        .await;
    match replicas.client(followers[0]).call(Method::GET, "/v1/job/no-such-job", None).await {
        Err(ClientError::Api { status, message }) => {
            assert_eq!((status.as_u16(), message.as_str()), (404, "404 Not Found: job not found"));
        }
        other => panic!("a job no one registered: {other:?}"),
    }
    let path = "/v1/job/via-follower?purge=true";
    replicas.client(followers[0]).call(Method::DELETE, path, None).await.unwrap();
    let gone = replicas.client(leader).call(Method::GET, "/v1/job/via-follower", None).await;
    assert!(matches!(gone, Err(ClientError::Api { status, .. }) if status == 404), "{gone:?}");
}
