//! Fencing that reaches the workers: a fleet leader that lost its term while paused, just
//! before it sent a start, cannot start work its successor has placed elsewhere meanwhile.
//!
//! Two replicas of `wharf fleet` run in this process on a real etcd (Debian's `etcd-server`;
//! without it the test fails and says what to install), over two loopback workers whose agents
//! are real `wharf agent` processes. The first leader's executors are wrapped so that its first
//! start is held after the leader decided it, wrote it down and checked its term: the moment a
//! pause (a stop signal, a stalled VM, a long collection) would catch it. Its lease is revoked
//! in etcd, the second replica leads, asks the worker the start was for (which tells that agent
//! the new term), and places the work on the other worker. Then the held start goes on, under
//! the old term: the agent refuses it, and the work runs once.

// Real processes on the real clock: the agents are real, and the test polls within bounds.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};
use wharf_fleet::{Submission, Term};
use wharf_node::fleet::config::FleetConfig;
use wharf_node::fleet::{ExecutorLayer, Fleet};
use wharf_prober::{Executor, IdleBehavior, Instance, InstanceId, Output, ProberError};
use wharf_tests::etcd::Etcd;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// Any single wait; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);

/// Holds the first start it sees until released, and hands its result to the test.
#[derive(Debug, Default)]
struct StartGate {
    /// The worker the held start is for, once one is held.
    held: parking_lot::Mutex<Option<InstanceId>>,
    arrived: Notify,
    release: Notify,
    result: parking_lot::Mutex<Option<oneshot::Sender<Result<Output, String>>>>,
}

/// One worker's executor, with the gate in front of it.
#[derive(Debug)]
struct Gated {
    worker: InstanceId,
    inner: Arc<dyn Executor>,
    gate: Arc<StartGate>,
}

#[async_trait::async_trait]
impl Executor for Gated {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        let first_start = command.contains(" run --detach ") && {
            let mut held = self.gate.held.lock();
            held.is_none() && held.replace(self.worker.clone()).is_none()
        };
        if !first_start {
            return self.inner.execute(command, stdin, deadline).await;
        }
        self.gate.arrived.notify_one();
        self.gate.release.notified().await;
        let result = self.inner.execute(command, stdin, deadline).await;
        if let Some(report) = self.gate.result.lock().take() {
            let _ = report.send(result.as_ref().map(Output::clone).map_err(|e| e.to_string()));
        }
        result
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}

fn config(dir: &Path, shared: &Path, etcd: &Etcd, name: &str) -> FleetConfig {
    let text = format!(
        "bind = \"127.0.0.1:0\"\ndata_dir = {data:?}\nper_worker_limit = 4\n\
         token = \"the-replicas-shared-token\"\n\
         probe_interval = \"200ms\"\nsync_interval = \"1s\"\ncommand_deadline = \"5s\"\n\
         [runner]\nbinary = {wharf:?}\ndirectory = {runner:?}\n\
         [loopback]\ninstances = 2\nroot = {root:?}\n\
         [store]\nbackend = \"etcd\"\nendpoints = [\"{endpoint}\"]\nprefix = \"/fence\"\n\
         lease_ttl = \"3s\"\nreplica = \"{name}\"\nadvertise = \"127.0.0.1:1\"\n",
        data = dir.join(name).display().to_string(),
        wharf = WHARF,
        runner = shared.join("runner").display().to_string(),
        root = shared.join("instances").display().to_string(),
        endpoint = etcd.endpoint(),
    );
    FleetConfig::parse(&text).unwrap()
}

async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "never {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The workers whose agents run allocation `id` (each agent asked directly).
fn agents_running(shared: &Path, id: &str) -> Vec<String> {
    let mut on = Vec::new();
    for instance in std::fs::read_dir(shared.join("instances")).unwrap().flatten() {
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
    on.sort();
    on
}

/// Wipes the shared loopback workers with everything they ran.
struct Wipe(PathBuf);

impl Drop for Wipe {
    fn drop(&mut self) {
        for instance in std::fs::read_dir(self.0.join("instances")).into_iter().flatten().flatten()
        {
            let data = instance.path().join("data");
            let _ = Command::new(WHARF).arg("--data-dir").arg(data).arg("wipe").output();
        }
    }
}

fn job(id: &str) -> String {
    format!(
        "{{\"job\": {{\"id\": \"{id}\", \"type\": \"service\"}}, \"group\": {{\"name\": \"g\", \
         \"task\": [{{\"name\": \"t\", \"driver\": \"raw_exec\", \
         \"config\": {{\"command\": \"/bin/sleep\", \"args\": [\"1000\"]}}}}]}}}}"
    )
}

async fn leading_term(fleet: &Fleet) -> Term {
    until("the replica leads", async || Some(fleet.leading()?.scheduler().term().clone())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_before_a_start_is_refused_by_the_worker_when_it_wakes() {
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
    let etcd = Etcd::start(LIMIT).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let _wipe = Wipe(shared.path().to_owned());

    let gate = Arc::new(StartGate::default());
    let (report, old_start) = oneshot::channel();
    *gate.result.lock() = Some(report);
    let layer = {
        let gate = gate.clone();
        ExecutorLayer(Arc::new(move |instance: &Instance, inner| {
            Arc::new(Gated { worker: instance.id.clone(), inner, gate: gate.clone() })
                as Arc<dyn Executor>
        }))
    };
    let first =
        Fleet::start_layered(config(dir.path(), shared.path(), &etcd, "first"), Some(layer))
            .await
            .unwrap();
    let old_term = leading_term(&first).await;
    let second = Fleet::start(config(dir.path(), shared.path(), &etcd, "second")).await.unwrap();
    until("two idle workers", async || {
        let workers = first.leading()?.pool().workers();
        (workers.iter().filter(|w| w.state == "idle").count() == 2).then_some(())
    })
    .await;

    // The first leader decides the start, writes it down, checks its term, and is held there.
    let scheduler = first.leading().unwrap().scheduler().clone();
    scheduler.submit(Submission::new("once", job("once"))).await.unwrap();
    tokio::time::timeout(LIMIT, gate.arrived.notified()).await.expect("the start was never held");
    let held_for = gate.held.lock().clone().unwrap();

    // Its lease ends (as it would while it slept); the second replica leads. The worker the
    // start was for takes no new work, so once the new leader has asked it and heard nothing
    // of the work, it places the work on the other worker.
    let lease = etcd.lease_of("/fence/replicas/first").unwrap().expect("the first replica's lease");
    etcd.revoke(&lease).unwrap();
    let new_term = leading_term(&second).await;
    assert!(new_term.number() > old_term.number());
    let leading = second.leading().unwrap();
    until("the first worker held", async || {
        second.set_idle_behavior(&leading, &held_for, IdleBehavior::Hold).await.ok()
    })
    .await;
    let elsewhere = until("the work placed on the other worker", async || {
        let placement = leading.scheduler().get("once")?;
        match placement.phase {
            wharf_state::fleet::WorkPhase::Running { worker } if worker != held_for.0 => {
                Some(worker)
            }
            _ => None,
        }
    })
    .await;
    until("the work running on the other worker", async || {
        (agents_running(shared.path(), "once") == [elsewhere.clone()]).then_some(())
    })
    .await;

    // The old leader wakes and sends the start it held, under its old term.
    gate.release.notify_one();
    let answer =
        tokio::time::timeout(LIMIT, old_start).await.expect("the held start hung").unwrap();
    let answer = answer.expect("the held start reached the worker");
    assert!(!answer.success(), "the worker accepted the old leader's start: {answer:?}");
    let text = String::from_utf8_lossy(&answer.stderr);
    assert!(
        text.contains(&format!(
            "fleet term {} is older than term {}",
            old_term.number(),
            new_term.number()
        )),
        "{text}"
    );
    // The work runs once, where the new leader placed it.
    assert_eq!(agents_running(shared.path(), "once"), [elsewhere]);

    second.shutdown().await;
    first.shutdown().await;
}
