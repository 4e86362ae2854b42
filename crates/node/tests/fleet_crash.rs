//! Crash rounds of `wharf fleet` on its embedded store: the fleet (the real binary, with two
//! loopback workers whose agents outlive it) is killed with SIGKILL at a random moment of a
//! stream of submissions and stops, thirty times, and started again over the same directory.
//!
//! After every restart, and at the end: every submission the fleet acknowledged is there, and
//! every stop it acknowledged holds (the work is final, or is being stopped, and is never
//! placed again); work that had reached a final phase is still in it, with the same outcome;
//! and each allocation ran at most once, as its tasks log (every task appends its allocation id
//! to one file). At the end, once everything is final, work that was not stopped has
//! completed, and work cancelled in the queue never ran.

// Real processes on the real clock: the test starts and kills fleets, and polls within bounds.
#![allow(clippy::disallowed_methods)]

use hyper::Method;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use wharf_fleet::WorkPhaseName;
use wharf_node::client::{ApiPath, Client};
use wharf_node::fleet::api::FleetAlloc;
use wharf_tests::fleet::Fleet;
use wharf_tests::rng::Rng;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
const ROUNDS: u64 = 30;
/// Submitters at once: the kill lands while several requests are in flight.
const SUBMITTERS: usize = 3;
/// Any single wait; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);
/// `command_deadline` bounds how long a start a killed fleet left in flight may still arrive,
/// and so how long its successor waits before judging it.
const SETTINGS: &str = "per_worker_limit = 8\nprobe_interval = \"100ms\"\nsync_interval = \"1s\"\n\
                        command_deadline = \"3s\"\n[loopback]\ninstances = 2\n";

/// What a submitter asked, and what the fleet acknowledged.
#[derive(Debug)]
enum Ack {
    /// A stop was asked; unless acknowledged it may or may not have taken effect.
    Stopping(String),
    Submitted(String),
    Stopped(String),
}

/// What the test knows the fleet promised, and what it saw final.
#[derive(Debug, Default)]
struct Promised {
    submitted: BTreeSet<String>,
    /// Stops acknowledged.
    stopped: BTreeSet<String>,
    /// Stops asked, acknowledged or not.
    stops_asked: BTreeSet<String>,
    /// Work seen in a final phase: (phase, detail).
    finals: BTreeMap<String, (WorkPhaseName, Option<String>)>,
}

fn job(id: &str, ran: &Path) -> String {
    let script = format!("echo \"$WHARF_ALLOC_ID\" >> {}; sleep 0.3", ran.display());
    format!(
        "[job]\nid = \"{id}\"\ntype = \"batch\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
         config = {{ command = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

/// One submitter: submits new work, or stops work already acknowledged, until a request fails
/// (the fleet was killed) or the round ends.
async fn submit_until_killed(
    client: Client,
    name: String,
    ran: std::path::PathBuf,
    known: Arc<Mutex<Vec<String>>>,
    seed: u64,
    acks: mpsc::UnboundedSender<Ack>,
) {
    let mut rng = Rng(seed);
    for n in 0.. {
        let stop = rng.below(4) == 0;
        let victim = {
            let known = known.lock();
            (stop && !known.is_empty())
                .then(|| known[rng.below(known.len() as u64) as usize].clone())
        };
        let (request, ack) = match victim {
            Some(id) => {
                if acks.send(Ack::Stopping(id.clone())).is_err() {
                    return;
                }
                let path = ApiPath::v1(["allocations", &id, "stop"]);
                (client.call(Method::POST, path, None), Ack::Stopped(id))
            }
            None => {
                let id = format!("{name}-{n}");
                let body = Some(("application/toml", job(&id, &ran).into_bytes()));
                let path = ApiPath::v1(["allocations"]).query("id", &id);
                (client.call(Method::POST, path, body), Ack::Submitted(id))
            }
        };
        match tokio::time::timeout(LIMIT, request).await {
            Ok(Ok(_)) => {
                if let Ack::Submitted(id) = &ack {
                    known.lock().push(id.clone());
                }
                if acks.send(ack).is_err() {
                    return;
                }
            }
            Ok(Err(_)) => return,
            Err(_) => panic!("a request to the fleet hung"),
        }
    }
}

async fn allocations(client: &Client) -> BTreeMap<String, FleetAlloc> {
    let list: Vec<FleetAlloc> =
        client.json(Method::GET, "/v1/allocations", None).await.expect("GET /v1/allocations");
    list.into_iter().map(|a| (a.id.clone(), a)).collect()
}

/// The allocation ids the tasks logged, each time one ran.
fn ran(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// For a failure message: what the fleets logged that was not routine (all rounds, since the
/// log is appended to), and what each worker's agent logged that was not.
fn context(fleet: &Fleet) -> String {
    let notable = |line: &&str| {
        !line.contains(" INFO ")
            || ["drain", "broken", "shut", "disappeared"].iter().any(|w| line.contains(w))
    };
    let mut text =
        fleet.log_tail(usize::MAX).lines().filter(notable).collect::<Vec<_>>().join("\n");
    let instances = std::fs::read_dir(fleet.data_dir().join("instances"));
    for instance in instances.into_iter().flatten().flatten() {
        let log = std::fs::read_to_string(instance.path().join("agent.log")).unwrap_or_default();
        text.push_str(&format!("\nthe agent of {}:\n", instance.path().display()));
        text.push_str(&log.lines().filter(notable).collect::<Vec<_>>().join("\n"));
    }
    text
}

/// Checks what a fleet that just started shows against what was promised, and records what
/// is final now.
fn check(
    round: u64,
    fleet: &Fleet,
    seen: &BTreeMap<String, FleetAlloc>,
    promised: &mut Promised,
    ran_ids: &[String],
) {
    let log = || context(fleet);
    for id in &promised.submitted {
        let alloc = seen
            .get(id)
            .unwrap_or_else(|| panic!("round {round}: acknowledged {id} is gone\n{}", log()));
        assert_eq!(alloc.attempt, 1, "round {round}: {id} was placed again: {alloc:?}\n{}", log());
        if promised.stopped.contains(id) {
            let stopping =
                alloc.is_final() || matches!(alloc.phase.as_str(), "starting" | "running");
            assert!(
                stopping,
                "round {round}: stopped {id} is back in the queue: {alloc:?}\n{}",
                log()
            );
        }
    }
    for (id, (phase, detail)) in &promised.finals {
        let alloc = &seen[id];
        assert_eq!(
            (&alloc.phase, &alloc.detail),
            (phase, detail),
            "round {round}: the outcome of {id} changed\n{}",
            log()
        );
    }
    for alloc in seen.values().filter(|a| a.is_final()) {
        promised.finals.insert(alloc.id.clone(), (alloc.phase, alloc.detail.clone()));
    }
    let mut once = BTreeSet::new();
    for id in ran_ids {
        assert!(once.insert(id), "round {round}: {id} ran twice: {ran_ids:?}\n{}", log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_work_survives_sigkills_of_the_fleet_and_runs_once() {
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build the whole workspace", shim.display());
    let dir = tempfile::tempdir().unwrap();
    let ran_log = dir.path().join("ran");
    let start = || Fleet::start(Path::new(WHARF), dir.path(), SETTINGS, "info", LIMIT).unwrap();
    let mut rng = Rng(0x0f1e_e7c4_a5b0_0001);
    let mut promised = Promised::default();
    let known = Arc::new(Mutex::new(Vec::new()));

    // The workers come up before the first kill, so no kill lands in their creation.
    let mut fleet = start();
    let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
    let deadline = Instant::now() + LIMIT;
    loop {
        let health: serde_json::Value =
            client.json(Method::GET, "/v1/workers", None).await.expect("GET /v1/workers");
        let idle =
            health.as_array().map_or(0, |w| w.iter().filter(|w| w["state"] == "idle").count());
        if idle == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the loopback workers never came up: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for round in 0..ROUNDS {
        let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
        check(round, &fleet, &allocations(&client).await, &mut promised, &ran(&ran_log));

        // Kill after this many acknowledgements (0: at once, while the fleet takes over).
        let kill_after = rng.below(10) as usize;
        let (acks, mut acked) = mpsc::unbounded_channel();
        let mut submitters = Vec::new();
        for s in 0..SUBMITTERS {
            let name = format!("r{round}s{s}");
            let args =
                (client.clone(), name, ran_log.clone(), known.clone(), rng.below(u64::MAX) | 1);
            submitters.push(tokio::spawn(submit_until_killed(
                args.0,
                args.1,
                args.2,
                args.3,
                args.4,
                acks.clone(),
            )));
        }
        drop(acks);
        let mut count = 0;
        while count < kill_after {
            match tokio::time::timeout(LIMIT, acked.recv()).await {
                Ok(Some(ack)) => {
                    count += usize::from(!matches!(ack, Ack::Stopping(_)));
                    promise(&mut promised, ack);
                }
                Ok(None) => {
                    panic!("round {round}: every submitter stopped\n{}", context(&fleet))
                }
                Err(_) => panic!("round {round}: no acknowledgement\n{}", context(&fleet)),
            }
        }
        fleet.kill();
        // What was acknowledged before the kill was answered; the rest failed.
        for submitter in submitters {
            tokio::time::timeout(LIMIT, submitter).await.expect("a submitter hung").unwrap();
        }
        while let Ok(ack) = acked.try_recv() {
            promise(&mut promised, ack);
        }
        fleet = start();
    }

    // The last fleet runs everything to its end.
    let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
    check(ROUNDS, &fleet, &allocations(&client).await, &mut promised, &ran(&ran_log));
    let deadline = Instant::now() + LIMIT;
    let seen = loop {
        let seen = allocations(&client).await;
        if promised.submitted.iter().all(|id| seen[id].is_final()) {
            break seen;
        }
        assert!(Instant::now() < deadline, "not everything ended: {seen:#?}\n{}", context(&fleet));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ran_ids = ran(&ran_log);
    check(ROUNDS + 1, &fleet, &seen, &mut promised, &ran_ids);
    let ran_ids: BTreeSet<&String> = ran_ids.iter().collect();
    for id in &promised.submitted {
        let alloc = &seen[id];
        if !promised.stops_asked.contains(id) {
            let complete = alloc.detail.as_deref().is_some_and(|d| d.starts_with("complete"));
            assert!(alloc.phase == "ended" && complete, "{id} did not complete: {alloc:?}");
            assert!(ran_ids.contains(id), "{id} completed without running");
        } else if alloc.phase == "cancelled" {
            assert!(!ran_ids.contains(id), "{id} was cancelled in the queue, yet ran");
        }
    }
    assert!(promised.submitted.len() >= ROUNDS as usize, "too few submissions to mean much");
}

fn promise(promised: &mut Promised, ack: Ack) {
    match ack {
        Ack::Stopping(id) => {
            promised.stops_asked.insert(id);
        }
        Ack::Submitted(id) => {
            promised.submitted.insert(id);
        }
        Ack::Stopped(id) => {
            promised.stopped.insert(id);
        }
    }
}
