//! Failover, deterministic: replica loops on the in-memory store (whose terms behave as
//! etcd's do) under tokio's paused clock, each leading an empty pool. A lapsed lease hands the
//! lead over; a write under a term the store expired is fenced and ends that lead; a replica
//! that lost its term resigns and follows; two replicas that race never both act. The
//! process-level tests (wharf-node's `fleet_ha` and `fleet_fence`) do the same with real
//! processes and etcd.

use super::*;
use crate::store::MemoryStore;
use crate::{SchedulerConfig, Submission};
use std::time::Duration;
use tokio::task::JoinHandle;
use wharf_prober::{FakeClock, Moment, Pool, PoolConfig, StaticConfig, StaticInstanceSet};

/// Any wait for something that must happen; reaching it (in virtual time) fails the test.
const LIMIT: Duration = Duration::from_secs(60);

/// What the tests keep beside each lead: the task that runs its pool.
type PoolRun = JoinHandle<()>;

/// How a replica's first attempt to lead went.
type FirstLeadAnswer = oneshot::Receiver<Result<(), LeadError<FleetError>>>;

/// A pool of no workers, on a fake clock.
fn empty_pool() -> Pool {
    let clock = Arc::new(FakeClock::new(Moment::from_origin(Duration::from_secs(1))));
    let set = StaticInstanceSet::new(
        StaticConfig { hosts: Vec::new(), rejoin_after: Duration::from_secs(300) },
        clock.clone(),
    )
    .unwrap();
    let no_executor: wharf_prober::NewExecutor =
        Arc::new(|_: &wharf_prober::Instance| unreachable!("a pool of no workers runs nothing"));
    Pool::new(PoolConfig::default(), clock, Arc::new(set), no_executor).unwrap()
}

/// Replica `name` of the fleet in `store`, running its loop: each lead is an empty pool (run
/// in a task of its own) and a scheduler over it.
fn start(store: &MemoryStore, name: &str) -> (Arc<ReplicaLoop<PoolRun>>, FirstLeadAnswer) {
    let me = Replica { name: name.into(), address: format!("127.0.0.1:{}", 4000 + name.len()) };
    let replica = Arc::new(ReplicaLoop::new(Arc::new(store.clone()), me));
    let for_build = replica.store().clone();
    let build = move |term: Term| {
        let store = for_build.clone();
        async move {
            let pool = empty_pool();
            let scheduler =
                Scheduler::take_over(pool.clone(), SchedulerConfig::default(), store, term).await?;
            let run = {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run().await })
            };
            Ok::<_, FleetError>(Leading::new(pool, scheduler, run))
        }
    };
    let (first, first_lead) = oneshot::channel();
    tokio::spawn(replica.clone().run(build, Some(first)));
    (replica, first_lead)
}

/// Waits until `replica` leads, and returns its lead.
async fn leads(replica: &ReplicaLoop<PoolRun>) -> Arc<Leading<PoolRun>> {
    let mut leading = replica.subscribe();
    let wait = leading.wait_for(|l| l.as_ref().is_some_and(|l| l.scheduler().acting()));
    match tokio::time::timeout(LIMIT, wait).await {
        Ok(Ok(lead)) => lead.clone().expect("a lead"),
        _ => panic!("{} never led", replica.replica().name),
    }
}

/// Waits until `replica` follows.
async fn follows(replica: &ReplicaLoop<PoolRun>) {
    let mut leading = replica.subscribe();
    let wait = leading.wait_for(Option::is_none);
    assert!(
        matches!(tokio::time::timeout(LIMIT, wait).await, Ok(Ok(_))),
        "{} never stopped leading",
        replica.replica().name
    );
}

/// Waits until the task that ran a lead's pool has returned: the pool stopped.
async fn pool_stopped(lead: &Leading<PoolRun>) {
    for _ in 0..600 {
        if lead.extra().is_finished() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the pool of term {} still runs", lead.term().number());
}

/// The replicas that lead and act now (their term holds and their writes succeed).
fn acting(replicas: &[&ReplicaLoop<PoolRun>]) -> Vec<String> {
    replicas
        .iter()
        .filter(|r| r.leading().is_some_and(|l| l.scheduler().acting()))
        .map(|r| r.replica().name.clone())
        .collect()
}

/// Holds for `span` of virtual time, checking every 100 ms that at most one replica acts, and
/// that it is the one the store names.
async fn at_most_one_acts(store: &MemoryStore, replicas: &[&ReplicaLoop<PoolRun>], span: Duration) {
    let rounds = span.as_millis() / 100;
    for _ in 0..rounds {
        let now = acting(replicas);
        assert!(now.len() <= 1, "{now:?} act at once");
        if let [one] = now.as_slice() {
            let leader = store.leader().await.unwrap().map(|r| r.name);
            assert_eq!(leader.as_deref(), Some(one.as_str()), "the store names another leader");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A lapsed lease: the leader hears its term is over, stops its pool, gives the term back and
/// follows; the replica that waited wins a later term and leads.
#[tokio::test(start_paused = true)]
async fn a_lapsed_lease_hands_the_lead_to_the_replica_that_waited() {
    let store = MemoryStore::new();
    let (a, first) = start(&store, "a");
    assert!(matches!(first.await, Ok(Ok(()))), "a's first campaign led");
    let a_lead = leads(&a).await;
    let (b, _) = start(&store, "b");
    at_most_one_acts(&store, &[&a, &b], Duration::from_secs(10)).await;
    assert!(b.leading().is_none(), "b follows while a leads");
    let names: Vec<String> = store.replicas().await.unwrap().into_iter().map(|r| r.name).collect();
    assert!(names.contains(&"a".into()) && names.contains(&"b".into()), "{names:?}");

    store.lapse();
    assert!(!a_lead.term().holds(), "a lapsed term holds no longer");
    let b_lead = leads(&b).await;
    assert!(b_lead.term().number() > a_lead.term().number());
    follows(&a).await;
    pool_stopped(&a_lead).await;
    at_most_one_acts(&store, &[&a, &b], Duration::from_secs(10)).await;
    assert_eq!(store.leader().await.unwrap().map(|r| r.name).as_deref(), Some("b"));
    assert!(a.leading().is_none(), "a follows b");
}

/// A fenced write: the store expired the leader's term without it hearing (a leader frozen
/// past its lease), and another replica won. The old leader still believes it holds, but its
/// next write is refused: it stops acting, resigns (which leaves the new term alone) and
/// follows. Nothing it wrote under the old term after the expiry is in the store.
#[tokio::test(start_paused = true)]
async fn a_fenced_write_ends_the_lead_and_the_new_term_keeps_its_place() {
    let store = MemoryStore::new();
    let (a, _) = start(&store, "a");
    let a_lead = leads(&a).await;
    a_lead.scheduler().submit(Submission::new("before", "spec")).await.unwrap();
    let (b, _) = start(&store, "b");

    store.expire(a_lead.term());
    let b_lead = leads(&b).await;
    assert!(a_lead.term().holds(), "a has not heard that its term expired");
    let refused = a_lead.scheduler().submit(Submission::new("late", "spec")).await;
    match refused {
        Err(FleetError::NotLeading { detail }) => assert!(detail.contains("refused"), "{detail}"),
        other => panic!("a write under an expired term was not fenced: {other:?}"),
    }
    assert!(!a_lead.scheduler().acting());
    follows(&a).await;
    pool_stopped(&a_lead).await;

    assert_eq!(store.leader().await.unwrap().map(|r| r.name).as_deref(), Some("b"));
    assert!(b_lead.scheduler().acting(), "a's resignation left b's term alone");
    assert!(store.load("before").await.unwrap().is_some());
    assert!(store.load("late").await.unwrap().is_none(), "a fenced write changed nothing");
    b_lead.scheduler().submit(Submission::new("after", "spec")).await.unwrap();
    assert!(b_lead.scheduler().get("before").is_some(), "b took over a's records");
    at_most_one_acts(&store, &[&a, &b], Duration::from_secs(10)).await;
}

/// Resign then follow: a replica that shuts down gives its term back at once, and the one
/// that waited leads without waiting for a lease to lapse. A replica that lost its term
/// follows and campaigns again: it leads once the new leader resigns in turn.
#[tokio::test(start_paused = true)]
async fn a_resigned_term_passes_at_once_and_the_old_leader_follows_then_leads_again() {
    let store = MemoryStore::new();
    let (a, _) = start(&store, "a");
    let a_lead = leads(&a).await;
    let (b, _) = start(&store, "b");
    let (c, _) = start(&store, "c");
    at_most_one_acts(&store, &[&a, &b, &c], Duration::from_secs(5)).await;

    // a loses its term; it resigns, and follows whoever wins.
    store.lapse();
    follows(&a).await;
    pool_stopped(&a_lead).await;
    let second = tokio::select! {
        lead = leads(&b) => (b.clone(), lead),
        lead = leads(&c) => (c.clone(), lead),
    };
    let (second, second_lead) = second;
    at_most_one_acts(&store, &[&a, &b, &c], Duration::from_secs(5)).await;

    // The second leader shuts down: it resigns, and one of the others leads at once.
    let started = tokio::time::Instant::now();
    let given_up = second.shutdown().await.expect("it led");
    assert_eq!(given_up.term().number(), second_lead.term().number());
    assert!(!second_lead.term().holds(), "a resigned term holds no longer");
    let others: Vec<&ReplicaLoop<PoolRun>> = [&a, &b, &c]
        .into_iter()
        .map(|r| &**r)
        .filter(|r| r.replica() != second.replica())
        .collect();
    let third = tokio::select! {
        lead = leads(others[0]) => lead,
        lead = leads(others[1]) => lead,
    };
    assert!(third.term().number() > second_lead.term().number());
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    at_most_one_acts(&store, &[&a, &b, &c], Duration::from_secs(5)).await;
    assert!(second.leading().is_none(), "a replica that shut down does not lead again");
    let names: Vec<String> = store.replicas().await.unwrap().into_iter().map(|r| r.name).collect();
    assert!(!names.contains(&second.replica().name), "it no longer campaigns: {names:?}");
}

/// Two replicas start at once: one wins, the other follows, and at no moment do both act,
/// through three handovers.
#[tokio::test(start_paused = true)]
async fn two_replicas_racing_never_both_act() {
    let store = MemoryStore::new();
    let (a, _) = start(&store, "a");
    let (b, _) = start(&store, "b");
    let mut terms = Vec::new();
    for _ in 0..3 {
        let lead = tokio::select! {
            lead = leads(&a) => lead,
            lead = leads(&b) => lead,
        };
        terms.push(lead.term().number());
        at_most_one_acts(&store, &[&a, &b], Duration::from_secs(5)).await;
        store.lapse();
        at_most_one_acts(&store, &[&a, &b], Duration::from_secs(2)).await;
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms rise: {terms:?}");
}

/// A lead that cannot be built gives its term back, says why to whoever waits for the first
/// lead, and the replica campaigns again after its retry wait.
#[tokio::test(start_paused = true)]
async fn a_lead_that_cannot_be_built_gives_the_term_back_and_tries_again() {
    let store = MemoryStore::new();
    let me = Replica { name: "a".into(), address: "127.0.0.1:4001".into() };
    let replica: Arc<ReplicaLoop<PoolRun>> = Arc::new(
        ReplicaLoop::new(Arc::new(store.clone()), me).with_retry_after(Duration::from_secs(3)),
    );
    let tries = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let for_build = (replica.store().clone(), tries.clone());
    let build = move |term: Term| {
        let (store, tries) = for_build.clone();
        async move {
            if tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return Err("no instances to lead".to_owned());
            }
            let pool = empty_pool();
            let scheduler =
                Scheduler::take_over(pool.clone(), SchedulerConfig::default(), store, term)
                    .await
                    .map_err(|e| e.to_string())?;
            Ok(Leading::new(pool, scheduler, tokio::spawn(async {})))
        }
    };
    let (first, first_lead) = oneshot::channel();
    let started = tokio::time::Instant::now();
    tokio::spawn(replica.clone().run(build, Some(first)));
    match first_lead.await {
        Ok(Err(LeadError::Build(why))) => assert_eq!(why, "no instances to lead"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.leader().await.unwrap(), None, "the term was given back");
    let lead = leads(&replica).await;
    assert!(started.elapsed() >= Duration::from_secs(3), "it waited its retry time");
    assert_eq!(lead.term().number(), 2);
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 2);
}
