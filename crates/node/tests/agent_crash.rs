//! What the agent acknowledges survives SIGKILL: rounds of a stream of submissions and stops
//! over the API, each round ended by `kill -9` of the agent at a random point. After every
//! restart, each acknowledged submission is there, and each acknowledged stop is carried out:
//! the allocation is stopped and its task killed, even if the agent died before it acted.

// Real processes on the real clock: the test starts and kills agents.
#![allow(clippy::disallowed_methods)]

use hyper::Method;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;
use wharf_node::api::{AllocDetail, AllocSummary};
use wharf_node::client::Client;
use wharf_state::{DesiredStatus, TaskStatus};
use wharf_tests::announce::spawn_announcing;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
const ROUNDS: u64 = 30;
/// Any single wait; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(30);
/// The job every submission runs: one task that sleeps until it is killed.
const JOB: &str = "[job]\nid = \"sleeper\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
    [[group.task]]\nname = \"sleep\"\ndriver = \"raw_exec\"\n\
    config = { command = \"/bin/sleep\", args = [\"600\"] }\n";

/// xorshift64*: a fixed seed makes a failing round reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

fn start_agent(config: &Path) -> (Child, Client) {
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
    let (child, address) = spawn_announcing(
        Command::new(WHARF).args(["agent", "--config", config.to_str().unwrap()]),
        "agent ready",
        LIMIT,
        None,
    )
    .unwrap();
    (child, Client::new(&address, None))
}

/// What the client was told: the allocations it submitted, and those whose stop was
/// acknowledged.
#[derive(Debug, Default)]
struct Acknowledged {
    submitted: BTreeSet<String>,
    stopped: BTreeSet<String>,
}

enum Acked {
    Submitted(String),
    Stopped(String),
}

/// Submits and stops until the agent stops answering; every acknowledgement is sent on
/// `acks` as it arrives. `running` is what may be stopped.
async fn stream(
    client: Client,
    mut running: Vec<String>,
    seed: u64,
    acks: tokio::sync::mpsc::UnboundedSender<Acked>,
) {
    let mut rng = Rng(seed | 1);
    for _ in 0..1000 {
        if !running.is_empty() && rng.below(3) == 0 {
            let id = running.swap_remove(rng.below(running.len() as u64) as usize);
            match client.call(Method::POST, &format!("/v1/allocations/{id}/stop"), None).await {
                Ok(_) => {
                    let _ = acks.send(Acked::Stopped(id));
                }
                Err(_) => return,
            }
        } else {
            let body = Some(("application/toml", JOB.as_bytes().to_vec()));
            match client.call(Method::POST, "/v1/allocations", body).await {
                Ok(bytes) => {
                    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    let id = value["id"].as_str().unwrap().to_owned();
                    running.push(id.clone());
                    let _ = acks.send(Acked::Submitted(id));
                }
                Err(_) => return,
            }
        }
    }
}

/// Checks that the agent holds everything acknowledged so far: every submission, and every
/// stop carried out (its task dead, whether or not the agent acted before it was killed).
async fn check(client: &Client, acknowledged: &Acknowledged, round: u64) {
    let list: Vec<AllocSummary> = client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    let present: BTreeSet<&str> = list.iter().map(|a| a.id.as_str()).collect();
    for id in &acknowledged.submitted {
        assert!(present.contains(id.as_str()), "round {round}: acknowledged submission {id} lost");
    }
    for id in &acknowledged.stopped {
        let wait = async {
            let mut version = String::new();
            loop {
                let path = format!("/v1/allocations/{id}?after={version}&wait=5s");
                let detail: AllocDetail = client.json(Method::GET, &path, None).await.unwrap();
                assert_eq!(
                    detail.alloc.desired_status,
                    DesiredStatus::Stop,
                    "round {round}: acknowledged stop of {id} lost"
                );
                if detail.done {
                    return detail;
                }
                version = detail.version;
            }
        };
        let detail = tokio::time::timeout(LIMIT, wait)
            .await
            .unwrap_or_else(|_| panic!("round {round}: stopped allocation {id} never ended"));
        let task = &detail.state.task_states["sleep"];
        assert_eq!(task.status, TaskStatus::Dead, "round {round}: {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_submissions_and_stops_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nbind = \"127.0.0.1:0\"\n[gc]\nmax_allocs = 10000\n",
            dir.path().join("data").display().to_string()
        ),
    )
    .unwrap();
    let mut rng = Rng(0x5eed_0fa9_e7c0_de01);
    let mut acknowledged = Acknowledged::default();
    for round in 0..ROUNDS {
        let (mut agent, client) = start_agent(&config);
        check(&client, &acknowledged, round).await;

        let running: Vec<String> =
            acknowledged.submitted.difference(&acknowledged.stopped).cloned().collect();
        let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
        let streaming = tokio::spawn(stream(client.clone(), running, rng.below(u64::MAX), acks_tx));
        // Kill after this many acknowledgements; 0 kills while the first request is in flight.
        let kill_after = rng.below(8);
        for _ in 0..kill_after {
            let ack = tokio::time::timeout(LIMIT, acks.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the agent stopped answering"))
                .expect("the stream runs until the agent is killed");
            record(&mut acknowledged, ack);
        }
        agent.kill().unwrap();
        agent.wait().unwrap();
        tokio::time::timeout(LIMIT, streaming)
            .await
            .expect("the stream ends with the agent")
            .unwrap();
        // Acknowledgements that arrived before the kill are still in the channel.
        while let Ok(ack) = acks.try_recv() {
            record(&mut acknowledged, ack);
        }
    }
    assert!(acknowledged.stopped.len() >= 5, "the stream stopped some: {acknowledged:?}");

    // A last agent checks the last round, then ends everything it runs.
    let (agent, client) = start_agent(&config);
    check(&client, &acknowledged, ROUNDS).await;
    drop(client);
    let mut agent = agent;
    agent.kill().unwrap();
    agent.wait().unwrap();
    let wipe = Command::new(WHARF)
        .args(["wipe", "--data-dir", dir.path().join("data").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(wipe.status.success(), "{wipe:?}");
}

fn record(acknowledged: &mut Acknowledged, ack: Acked) {
    match ack {
        Acked::Submitted(id) => acknowledged.submitted.insert(id),
        Acked::Stopped(id) => acknowledged.stopped.insert(id),
    };
}
