//! What the agent acknowledges survives SIGKILL: rounds of a stream of submissions and stops
//! over the API, each round ended by `kill -9` of the agent at a random point. After every
//! restart, each acknowledged submission is there, and each acknowledged stop is carried out:
//! the allocation is stopped and its task killed, even if the agent died before it acted.

// Real processes on the real clock: the test starts and kills agents.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{AgentProcess, LIMIT, WHARF, submit, until};
use hyper::Method;
use std::collections::BTreeSet;
use std::process::Command;
use wharf_node::api::AllocSummary;
use wharf_node::client::{ApiPath, Client};
use wharf_state::{DesiredStatus, TaskStatus};
use wharf_tests::rng::Rng;

const ROUNDS: u64 = 30;
/// The job every submission runs: one task that sleeps until it is killed.
const JOB: &str = "[job]\nid = \"sleeper\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
    [[group.task]]\nname = \"sleep\"\ndriver = \"raw_exec\"\n\
    config = { command = \"/bin/sleep\", args = [\"600\"] }\n";

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
    /// The request the stream ended on failed: once the agent is killed, as it must; before,
    /// the agent lost an answer, and the test says which and why.
    Failed(String),
}

/// Submits and stops until the agent stops answering; every acknowledgement is sent on
/// `acks` as it arrives, and so is the failure that ends the stream. `running` is what may be
/// stopped.
async fn stream(
    client: Client,
    mut running: Vec<String>,
    seed: u64,
    acks: tokio::sync::mpsc::UnboundedSender<Acked>,
) {
    let mut rng = Rng(seed | 1);
    for _ in 0..1000 {
        let ack = if !running.is_empty() && rng.below(3) == 0 {
            let id = running.swap_remove(rng.below(running.len() as u64) as usize);
            let stop = ApiPath::v1(["allocations", &id, "stop"]);
            match client.call(Method::POST, stop, None).await {
                Ok(_) => Acked::Stopped(id),
                Err(error) => {
                    let _ = acks.send(Acked::Failed(format!("stopping {id}: {error}")));
                    return;
                }
            }
        } else {
            match submit(&client, JOB).await {
                Ok(id) => {
                    running.push(id.clone());
                    Acked::Submitted(id)
                }
                Err(error) => {
                    let _ = acks.send(Acked::Failed(format!("submitting: {error}")));
                    return;
                }
            }
        };
        let _ = acks.send(ack);
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
        let what = format!("round {round}: the stopped allocation {id} ends");
        let detail = until(client, id, &what, |d| {
            assert_eq!(
                d.alloc.desired_status,
                DesiredStatus::Stop,
                "round {round}: acknowledged stop of {id} lost"
            );
            d.done
        })
        .await;
        let task = &detail.state.task_states["sleep"];
        assert_eq!(task.status, TaskStatus::Dead, "round {round}: {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_submissions_and_stops_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // Room for every allocation the rounds leave running (a submission in flight at the kill
    // is kept but never acknowledged, so never stopped), whatever this machine's CPU and memory.
    let config = "[gc]\nmax_allocs = 10000\n\
        [resources]\ncpu_total_compute = 1000000\nmemory_total_mb = 1000000\n";
    let mut agent = AgentProcess::start(dir.path(), config);
    let mut rng = Rng(0x5eed_0fa9_e7c0_de01);
    let mut acknowledged = Acknowledged::default();
    for round in 0..ROUNDS {
        let client = agent.client();
        check(&client, &acknowledged, round).await;

        let running: Vec<String> =
            acknowledged.submitted.difference(&acknowledged.stopped).cloned().collect();
        let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
        let streaming = tokio::spawn(stream(client, running, rng.below(u64::MAX), acks_tx));
        // Kill after this many acknowledgements; 0 kills while the first request is in flight.
        let kill_after = rng.below(8);
        for _ in 0..kill_after {
            let ack = tokio::time::timeout(LIMIT, acks.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the agent stopped answering"))
                .expect("the stream runs until the agent is killed");
            if let Acked::Failed(error) = ack {
                panic!("round {round}: before the kill, {error}");
            }
            record(&mut acknowledged, ack);
        }
        let (data_dir, config) = agent.kill9();
        tokio::time::timeout(LIMIT, streaming)
            .await
            .expect("the stream ends with the agent")
            .unwrap();
        // Acknowledgements that arrived before the kill are still in the channel.
        while let Ok(ack) = acks.try_recv() {
            record(&mut acknowledged, ack);
        }
        agent = AgentProcess::launch(data_dir, config);
    }
    assert!(acknowledged.stopped.len() >= 5, "the stream stopped some: {acknowledged:?}");

    // The last agent checks the last round; then everything it runs is ended.
    check(&agent.client(), &acknowledged, ROUNDS).await;
    let (data_dir, _) = agent.kill9();
    let wipe = Command::new(WHARF)
        .args(["wipe", "--data-dir", data_dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(wipe.status.success(), "{wipe:?}");
}

fn record(acknowledged: &mut Acknowledged, ack: Acked) {
    match ack {
        Acked::Submitted(id) => acknowledged.submitted.insert(id),
        Acked::Stopped(id) => acknowledged.stopped.insert(id),
        // After the kill, the request in flight fails.
        Acked::Failed(_) => false,
    };
}
