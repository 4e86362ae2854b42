//! End-to-end tests of `wharf fleet` over real hosts: each host is a network namespace made
//! by the test (`wharf_tests::netns`), joined to this one by a veth pair, running its own sshd
//! and its own node agent at the default address. The fleet runs as the real `wharf` binary
//! with static hosts: it deploys itself to every host over SSH, probes them, places
//! allocations, and follows them until they end. The tests cut hosts off by setting their
//! link down.
//!
//! They need root, iproute2 and OpenSSH, and fail (not skip) without them.

// Real processes on the real clock: these tests start programs (the fleet, agents in the
// namespaces, the CLI there) and measure bounds in real time.
#![allow(clippy::disallowed_methods)]

use hyper::Method;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use wharf_node::client::Client;
use wharf_node::fleet::api::{FleetAlloc, FleetWorker};
use wharf_tests::fleet::Fleet;
use wharf_tests::netns::{ClientKey, Host};

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// `timeouts.probe` of every fleet here: a worker failing its probes this long is shut down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Any single wait in these tests; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(30);

/// Hosts `h1`, `h2`, ... (namespaces with sshd and an agent each) and a fleet over them.
/// Dropped, the fleet is killed first, then every host with everything running in it.
struct Cluster {
    fleet: Fleet,
    client: Client,
    hosts: Vec<Host>,
    _key: ClientKey,
    dir: tempfile::TempDir,
    /// The sha256 of the `wharf` binary the fleet started with.
    wharf_sha256: String,
}

impl Cluster {
    /// Starts `count` hosts and a fleet that runs at most `per_worker_limit` allocations on
    /// each, and waits until every host is an idle worker.
    async fn start(count: usize, per_worker_limit: usize) -> Cluster {
        wharf_tests::netns::check_requirements().unwrap_or_else(|e| panic!("{e}"));
        let shim = Path::new(WHARF).with_file_name("wharf-shim");
        assert!(
            shim.exists(),
            "{} is missing: build the workspace (`cargo build -p wharf-node -p wharf-exec`) so wharf-exec's shim sits beside wharf",
            shim.display()
        );
        let dir = wharf_tests::netns::scratch_dir("fleet")
            .unwrap_or_else(|e| panic!("cannot make a scratch directory: {e}"));
        let key = ClientKey::generate().unwrap_or_else(|e| panic!("cannot make a client key: {e}"));
        let mut hosts = Vec::new();
        for _ in 0..count {
            let mut host = Host::start(&key.public_key)
                .unwrap_or_else(|e| panic!("cannot set up a test host: {e}"));
            start_agent(&mut host);
            hosts.push(host);
        }
        for host in &hosts {
            wait_agent_ready(host);
        }
        let mut config = format!(
            "per_worker_limit = {per_worker_limit}\n\
             probe_interval = \"300ms\"\n\
             sync_interval = \"1s\"\n\
             command_deadline = \"2s\"\n\
             [timeouts]\n\
             booting = \"30s\"\n\
             probe = \"{probe}s\"\n\
             [brake]\n\
             max_failing_share = 0.5\n\
             min_failing = 2\n\
             [runner]\n\
             directory = {runner:?}\n\
             [static]\n\
             identity = {identity:?}\n\
             rejoin_after = \"10m\"\n",
            probe = PROBE_TIMEOUT.as_secs(),
            runner = dir.path().join("runner").display().to_string(),
            identity = key.private_key_path().display().to_string(),
        );
        for (index, host) in hosts.iter().enumerate() {
            // Each host's agent keeps its own token in its data directory, where the runner
            // reads it.
            config.push_str(&format!(
                "[[static.host]]\nname = \"h{}\"\naddress = {:?}\nuser = {:?}\nhost_key = {:?}\n\
                 agent_data_dir = {:?}\n",
                index + 1,
                host.ssh_address,
                host.user,
                host.host_key.trim(),
                agent_data_dir(host).display().to_string(),
            ));
        }
        let sum = Command::new("sha256sum").arg(WHARF).output().unwrap();
        assert!(sum.status.success(), "sha256sum {WHARF}: {sum:?}");
        let wharf_sha256 =
            String::from_utf8_lossy(&sum.stdout).split_whitespace().next().unwrap().to_owned();
        let fleet = Fleet::start(Path::new(WHARF), dir.path(), &config, "info", LIMIT).unwrap();
        let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
        let cluster = Cluster { fleet, client, hosts, _key: key, dir, wharf_sha256 };
        cluster
            .until("every host booted as an idle worker", LIMIT, async || {
                let workers = cluster.workers().await;
                (workers.len() == count && workers.iter().all(|w| w.state == "idle")).then_some(())
            })
            .await;
        cluster
    }

    fn host(&self, worker: &str) -> &Host {
        let index: usize = worker
            .strip_prefix('h')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no host behind worker {worker:?}"));
        &self.hosts[index - 1]
    }

    /// What happened, for a failure message: the workers, the allocations, the brake, and the
    /// end of the fleet's log.
    async fn context(&self) -> String {
        let get = async |path: &str| match self.client.call(Method::GET, path, None).await {
            Ok(body) => String::from_utf8_lossy(&body).into_owned(),
            Err(e) => format!("(GET {path} failed: {e})"),
        };
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                format!("h{}: namespace {} at {} via {}", i + 1, h.namespace, h.address, h.link)
            })
            .collect();
        format!(
            "hosts:\n{}\nworkers: {}\nallocations: {}\nhealth: {}\nfleet log (end):\n{}",
            hosts.join("\n"),
            get("/v1/workers").await,
            get("/v1/allocations").await,
            get("/v1/health").await,
            self.fleet.log_tail(40),
        )
    }

    /// Polls `check` until it returns something, within `limit`; then panics naming `what`
    /// with the context.
    async fn until<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if Instant::now() > deadline {
                panic!("never {what} (waited {limit:?})\n{}", self.context().await);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn workers(&self) -> Vec<FleetWorker> {
        self.client.json(Method::GET, "/v1/workers", None).await.expect("GET /v1/workers")
    }

    async fn worker(&self, id: &str) -> Option<FleetWorker> {
        self.workers().await.into_iter().find(|w| w.id == id)
    }

    async fn alloc(&self, id: &str) -> FleetAlloc {
        self.client.json(Method::GET, &format!("/v1/allocations/{id}"), None).await.unwrap()
    }

    async fn health(&self) -> serde_json::Value {
        self.client.json(Method::GET, "/v1/health", None).await.expect("GET /v1/health")
    }

    async fn submit(&self, spec: &str) -> String {
        let body = self
            .client
            .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.into())))
            .await
            .expect("submit a job");
        let alloc: FleetAlloc = serde_json::from_slice(&body).unwrap();
        alloc.id
    }

    async fn post(&self, path: &str) {
        if let Err(e) = self.client.call(Method::POST, path, None).await {
            panic!("POST {path}: {e}\n{}", self.context().await);
        }
    }

    /// Follows the allocation (with the API's blocking query) until `done` holds.
    async fn wait_alloc(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(&FleetAlloc) -> bool,
    ) -> FleetAlloc {
        let deadline = Instant::now() + LIMIT;
        let mut path = format!("/v1/allocations/{id}");
        loop {
            let alloc: FleetAlloc = self.client.json(Method::GET, &path, None).await.unwrap();
            if done(&alloc) {
                return alloc;
            }
            if Instant::now() > deadline {
                panic!("allocation {id} never {what}: {alloc:?}\n{}", self.context().await);
            }
            path = format!("/v1/allocations/{id}?after={}&wait=2s", alloc.version);
        }
    }

    async fn wait_running(&self, id: &str) -> FleetAlloc {
        self.wait_alloc(id, "running", |a| a.phase == "running" || a.is_final()).await
    }

    /// What the agent of the host behind `worker` says of allocation `id` (`running`,
    /// `complete ...`, `unknown`), asked through the CLI inside that host's namespace.
    fn agent_outcome(&self, worker: &str, id: &str) -> String {
        let host = self.host(worker);
        let mut command = host.command(WHARF);
        command.arg("--data-dir").arg(agent_data_dir(host)).args(["alloc", "outcome", id]);
        let out = command.output().unwrap();
        assert!(out.status.success(), "wharf alloc outcome {id} on {worker}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The body of a Nomad call on the fleet (its token is accepted there as Nomad's).
    async fn nomad_get(&self, path: &str) -> String {
        match self.client.call(Method::GET, path, None).await {
            Ok(body) => String::from_utf8_lossy(&body).into_owned(),
            Err(e) => panic!("GET {path}: {e}\n{}", self.context().await),
        }
    }

    /// The items of variable `path` as the agent behind `worker` holds it (`name=value`
    /// lines), or nothing while it has none there.
    fn agent_variable(&self, worker: &str, path: &str) -> String {
        let host = self.host(worker);
        let mut command = host.command(WHARF);
        command.arg("--data-dir").arg(agent_data_dir(host)).args(["var", "get", path]);
        let out = command.output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits until the agent behind `worker` says allocation `id` runs: the fleet calls it
    /// running once the start was acknowledged, which may be before the agent started its
    /// task.
    async fn agent_runs(&self, worker: &str, id: &str) {
        let what = format!("the agent of {worker} running {id}");
        self.until(&what, LIMIT, async || {
            (self.agent_outcome(worker, id) == "running").then_some(())
        })
        .await;
    }
}

/// Where the host's agent keeps its data (and its token): in the host's scratch directory.
fn agent_data_dir(host: &Host) -> std::path::PathBuf {
    host.scratch().join("data")
}

/// Starts the host's agent inside its namespace, at the default address (the namespace's
/// own 127.0.0.1:4747), with its data in [`agent_data_dir`] and a token of its own there.
fn start_agent(host: &mut Host) {
    let config = host.scratch().join("node.toml");
    let data_dir = agent_data_dir(host);
    std::fs::write(&config, format!("data_dir = {:?}\n", data_dir.display().to_string())).unwrap();
    let mut command = host.command(WHARF);
    command.args(["agent", "--config"]).arg(&config).env("RUST_LOG", "info").env("NO_COLOR", "1");
    host.spawn("agent", command).unwrap_or_else(|e| panic!("cannot start an agent: {e}"));
}

/// Waits until the host's agent has announced itself in its data directory.
fn wait_agent_ready(host: &Host) {
    let announced = host.scratch().join("data/agent.json");
    let deadline = Instant::now() + LIMIT;
    while !announced.exists() {
        assert!(
            Instant::now() < deadline,
            "the agent in {} never wrote {}:\n{}",
            host.namespace,
            announced.display(),
            host.log("agent")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn job(id: &str, kind: &str, tasks: &str) -> String {
    format!("[job]\nid = \"{id}\"\ntype = \"{kind}\"\n[group]\nname = \"g\"\n{tasks}")
}

fn sh_task(name: &str, script: &str) -> String {
    format!(
        "[[group.task]]\nname = \"{name}\"\ndriver = \"raw_exec\"\nconfig = {{ command = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

/// A service rescheduled 5s after it is lost (Nomad's shortest delay; the default is 30s); it
/// says `up` on its standard output.
fn service(id: &str) -> String {
    let group =
        format!("reschedule = {{ delay = \"5s\" }}\n{}", sh_task("t", "echo up; exec sleep 1000"));
    job(id, "service", &group)
}

fn gone_or_shut_down(worker: Option<&FleetWorker>) -> bool {
    worker.is_none_or(|w| w.state == "shutdown")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_deploys_runs_work_on_its_hosts_and_drains_a_busy_one() {
    let cluster = Cluster::start(2, 2).await;

    // The fleet put its own binary on the hosts (they share this filesystem), addressed by
    // its sha256.
    let deployed: Vec<String> = std::fs::read_dir(cluster.dir.path().join("runner"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(deployed, [format!("runner~{}", cluster.wharf_sha256)]);

    // The fleet's variables reach every host's agent, over SSH.
    let items = serde_json::json!({ "items": { "user": "ann" } });
    let put: serde_json::Value =
        cluster.client.json(Method::PUT, "/v1/var/app/db", Some(items)).await.unwrap();
    assert_eq!(put["items"]["user"], "ann", "{put}");
    for worker in ["h1", "h2"] {
        let what = format!("the agent of {worker} holding the fleet's variables");
        cluster
            .until(&what, LIMIT, async || {
                (cluster.agent_variable(worker, "app/db") == "user=ann").then_some(())
            })
            .await;
    }

    // Batch work is placed, runs on a host's agent, and ends complete.
    let mut batch = Vec::new();
    for i in 0..3 {
        batch.push(cluster.submit(&job(&format!("b{i}"), "batch", &sh_task("t", "sleep 1"))).await);
    }
    for id in &batch {
        let alloc = cluster.wait_alloc(id, "finished", FleetAlloc::is_final).await;
        assert_eq!(alloc.phase, "ended", "{alloc:?}");
        assert!(alloc.detail.as_deref().is_some_and(|d| d.starts_with("complete")), "{alloc:?}");
        let worker = alloc.worker.as_deref().expect("the worker it ran on");
        let outcome = cluster.agent_outcome(worker, id);
        assert!(outcome.starts_with("complete"), "the agent of {worker} says {outcome:?}");
    }

    // Drain a busy worker: it keeps its work and takes no more.
    let first = cluster.submit(&service("first")).await;
    let alloc = cluster.wait_running(&first).await;
    assert_eq!(alloc.phase, "running", "{alloc:?}");
    let drained = alloc.worker.clone().unwrap();
    let other = if drained == "h1" { "h2" } else { "h1" };
    cluster.agent_runs(&drained, &first).await;
    cluster.post(&format!("/v1/workers/{drained}/drain")).await;
    let drain_sent = Instant::now();
    // Once a probe has passed after the drain, the pool has looked at the worker since: it
    // is still in service.
    let worker = cluster
        .until("a probe of the drained worker after the drain", LIMIT, async || {
            cluster.worker(&drained).await.filter(|w| {
                w.last_probe_seconds + 0.05 < drain_sent.elapsed().as_secs_f64()
                    || w.state != "running"
            })
        })
        .await;
    assert_eq!(
        (worker.state.as_str(), worker.idle_behavior.as_str()),
        ("running", "drain"),
        "{worker:?}"
    );
    assert_eq!(worker.allocations, [first.as_str()], "{worker:?}");

    // New work goes to the other worker, and what does not fit there waits.
    let second = cluster.submit(&service("second")).await;
    let third = cluster.submit(&service("third")).await;
    let waiting = cluster.submit(&service("waiting")).await;
    for id in [&second, &third] {
        let alloc = cluster.wait_running(id).await;
        assert_eq!((alloc.phase.as_str(), alloc.worker.as_deref()), ("running", Some(other)));
    }
    let alloc = cluster.alloc(&waiting).await;
    assert_eq!(alloc.phase, "queued", "the draining worker took no new work: {alloc:?}");

    // Its work ends: the drained worker is shut down (taken out of service).
    cluster.post(&format!("/v1/allocations/{first}/stop")).await;
    let alloc = cluster.wait_alloc(&first, "stopped", FleetAlloc::is_final).await;
    assert_eq!(alloc.phase, "ended", "{alloc:?}");
    cluster
        .until("the drained worker shut down", LIMIT, async || {
            gone_or_shut_down(cluster.worker(&drained).await.as_ref()).then_some(())
        })
        .await;
    let alloc = cluster.alloc(&waiting).await;
    assert_eq!(alloc.phase, "queued", "nothing was placed on the drained worker: {alloc:?}");

    // Room on the other worker: the waiting work starts there.
    cluster.post(&format!("/v1/allocations/{second}/stop")).await;
    let alloc = cluster.wait_running(&waiting).await;
    assert_eq!((alloc.phase.as_str(), alloc.worker.as_deref()), ("running", Some(other)));
    cluster.agent_runs(other, &waiting).await;

    // Nomad's client calls on the fleet reach the agent of the host that runs the allocation,
    // over SSH alone: its files, its log and its stats.
    let log = format!("/v1/client/fs/cat/{waiting}?path=alloc/logs/t.stdout.0");
    cluster
        .until("the service's output through the fleet", LIMIT, async || {
            (cluster.nomad_get(&log).await == "up\n").then_some(())
        })
        .await;
    let plain = format!("/v1/client/fs/logs/{waiting}?task=t&type=stdout&plain=true&origin=start");
    assert_eq!(cluster.nomad_get(&plain).await, "up\n");
    let listing = cluster.nomad_get(&format!("/v1/client/fs/ls/{waiting}?path=/")).await;
    let entries: Vec<serde_json::Value> = serde_json::from_str(&listing).unwrap();
    let names: Vec<&str> = entries.iter().filter_map(|e| e["Name"].as_str()).collect();
    assert!(names.contains(&"alloc") && names.contains(&"t"), "{listing}");
    let stats = cluster.nomad_get(&format!("/v1/client/allocation/{waiting}/stats")).await;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert!(stats["Tasks"]["t"].is_object(), "{stats}");
    // The allocation as Nomad shows it carries its task states, read through the relay too.
    let shown = cluster.nomad_get(&format!("/v1/allocation/{waiting}")).await;
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["TaskStates"]["t"]["State"], "running", "{shown}");
    assert_eq!(shown["ClientStatus"], "running", "{shown}");
    // Its node's HTTPAddr is the fleet's, which relays the client calls sent there.
    let node = cluster.nomad_get(&format!("/v1/node/{other}")).await;
    let node: serde_json::Value = serde_json::from_str(&node).unwrap();
    let fleet_address = cluster.fleet.address().trim_start_matches("http://");
    assert_eq!(node["HTTPAddr"], fleet_address, "{node}");
    assert!(node["Drivers"]["raw_exec"].is_object(), "the agent's drivers: {node}");
    let missing = format!("/v1/client/fs/cat/{waiting}?path=alloc/no-such-file");
    match cluster.client.call(Method::GET, &missing, None).await {
        Err(wharf_node::client::ClientError::Api { status, .. }) => assert_eq!(status, 404),
        other => panic!("GET {missing}: {other:?}"),
    }
}

/// Submits one service per host (with a per-worker limit of 1, one lands on each) and
/// returns the allocation on each worker.
async fn one_service_per_host(cluster: &Cluster) -> BTreeMap<String, String> {
    let mut ids = Vec::new();
    for i in 0..cluster.hosts.len() {
        ids.push(cluster.submit(&service(&format!("s{i}"))).await);
    }
    let mut on = BTreeMap::new();
    for id in ids {
        let alloc = cluster.wait_running(&id).await;
        assert_eq!(alloc.phase, "running", "{alloc:?}");
        let worker = alloc.worker.unwrap();
        cluster.agent_runs(&worker, &id).await;
        assert!(on.insert(worker, id).is_none(), "two allocations on one worker");
    }
    on
}

/// Nomad's `TestServiceSched_NodeDown` and `TestServiceSched_Reschedule_Later` over real
/// hosts: a host whose link goes down is shut down, and the service it ran is rescheduled by
/// its `reschedule` block (after its delay, once a worker has room) as attempt 2, under its
/// own runner id, with the lost attempt in its history. The other hosts keep their work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_is_shut_down_and_its_work_rescheduled_while_the_rest_keeps_running() {
    let cluster = Cluster::start(3, 1).await;
    let on = one_service_per_host(&cluster).await;

    let cut = "h2";
    cluster.host(cut).set_link(false).unwrap();
    let lost = &on[cut];
    let alloc = cluster.wait_alloc(lost, "rescheduled", |a| a.attempt == 2).await;
    assert_eq!(alloc.phase, "queued", "every other worker is full: {alloc:?}");
    let first = &alloc.history[0];
    assert_eq!(first.worker.as_deref(), Some(cut), "{alloc:?}");
    assert!(first.outcome.starts_with("lost: worker h2"), "{alloc:?}");
    assert_eq!(alloc.runner_id, format!("{lost}__2"));
    cluster
        .until("the cut-off worker shut down", LIMIT, async || {
            gone_or_shut_down(cluster.worker(cut).await.as_ref()).then_some(())
        })
        .await;
    // The fleet wrote it off; the host itself did not die and still runs it.
    assert_eq!(cluster.agent_outcome(cut, lost), "running");

    // The other hosts kept their work, and the brake stayed off (one of three failing).
    for (worker, id) in on.iter().filter(|(w, _)| *w != cut) {
        let alloc = cluster.alloc(id).await;
        assert_eq!((alloc.phase.as_str(), alloc.worker.as_deref()), ("running", Some(&**worker)));
        assert_eq!(cluster.agent_outcome(worker, id), "running");
        let state = cluster.worker(worker).await.map(|w| w.state.to_string());
        assert_eq!(state.as_deref(), Some("running"), "{worker}");
    }
    let health = cluster.health().await;
    assert_eq!(health["brake_engaged"], false, "{health}");

    // Room on h1: the second attempt starts there, under its own id.
    cluster.post(&format!("/v1/allocations/{}/stop", on["h1"])).await;
    let alloc = cluster.wait_running(lost).await;
    assert_eq!((alloc.phase.as_str(), alloc.worker.as_deref()), ("running", Some("h1")));
    cluster.agent_runs("h1", &format!("{lost}__2")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_most_hosts_off_engages_the_brake_instead_of_shutting_them_down() {
    let cluster = Cluster::start(4, 1).await;
    let on = one_service_per_host(&cluster).await;

    let cut = ["h1", "h2", "h3"];
    for worker in cut {
        cluster.host(worker).set_link(false).unwrap();
    }
    let health = cluster
        .until("the brake engaged", LIMIT, async || {
            let health = cluster.health().await;
            (health["brake_engaged"] == true).then_some(health)
        })
        .await;
    let reason = health["brake_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("3 of 4"), "{health}");

    // Nothing may be shut down or written off while the brake holds. An absence can only be
    // seen by watching for a while: three probe timeouts is well past the moment the cut-off
    // workers would have been shut down without the brake.
    let window = Instant::now() + 3 * PROBE_TIMEOUT;
    while Instant::now() < window {
        let workers = cluster.workers().await;
        let allocs: Vec<FleetAlloc> =
            cluster.client.json(Method::GET, "/v1/allocations", None).await.unwrap();
        let health = cluster.health().await;
        let held = workers.len() == 4
            && workers.iter().all(|w| w.state != "shutdown")
            && allocs.iter().all(|a| a.phase == "running")
            && health["brake_engaged"] == true;
        if !held {
            panic!("the brake did not hold\n{}", cluster.context().await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The cut-off workers did fail their probes past the timeout: only the brake kept them.
    for worker in cut {
        let w = cluster.worker(worker).await.unwrap();
        assert!(
            w.last_probe_seconds > PROBE_TIMEOUT.as_secs_f64() && w.last_error.is_some(),
            "{w:?}"
        );
    }

    // Links back: probes pass again, the brake releases, the work is still there.
    for worker in cut {
        cluster.host(worker).set_link(true).unwrap();
    }
    cluster
        .until("the brake released and every worker back in service", LIMIT, async || {
            let health = cluster.health().await;
            let workers = cluster.workers().await;
            let back = health["brake_engaged"] == false
                && workers.len() == 4
                && workers.iter().all(|w| {
                    matches!(w.state.as_str(), "idle" | "running") && w.last_error.is_none()
                });
            back.then_some(())
        })
        .await;
    for (worker, id) in &on {
        let alloc = cluster.alloc(id).await;
        assert_eq!((alloc.phase.as_str(), alloc.worker.as_deref()), ("running", Some(&**worker)));
        assert_eq!(cluster.agent_outcome(worker, id), "running");
        let w = cluster.worker(worker).await.unwrap();
        assert_eq!((w.state.as_str(), &w.allocations), ("running", &vec![id.clone()]), "{w:?}");
    }
}
