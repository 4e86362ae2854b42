//! The fleet store's contract, the same tests on every backend: the embedded ledger (a redb
//! file through wharf-store), etcd (a real server on 127.0.0.1, from Debian's `etcd-server`;
//! without it these tests fail and say what to install), and the memory store the scheduler's
//! own tests use.
//!
//! The contract: records round-trip and outlive the process that wrote them; a commit applies
//! all its changes; every write names a term, and a term that ended (resigned, outdated, lapsed)
//! writes nothing; later terms have higher numbers; the leader and the replicas are known; a
//! record that cannot be read is reported, not dropped or misread; the Nomad API's job records
//! are kept apart from the work, under the same terms.

use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::state::Timestamp;
use wharf_fleet::state::fleet::{Placement, WorkPhase, WorkRecord};
use wharf_fleet::state::reschedule::ReschedulePolicy;
use wharf_fleet::state::resources::Amount;
use wharf_fleet::{
    Change, Entry, EntryKind, EtcdConfig, EtcdStore, FleetError, FleetStore, LedgerStore,
    MAX_CHANGES_PER_COMMIT, MemoryStore, Replica,
};
use wharf_tests::etcd::Etcd;

/// Any single wait; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(20);

/// A backend the contract runs on: it opens handles on one store, as processes would.
enum Backend {
    Memory(MemoryStore),
    Ledger(tempfile::TempDir),
    Etcd(Etcd, String, Duration),
}

impl Backend {
    fn memory() -> Backend {
        Backend::Memory(MemoryStore::new())
    }

    fn ledger() -> Backend {
        Backend::Ledger(tempfile::tempdir().unwrap())
    }

    fn etcd() -> Backend {
        Backend::etcd_with_ttl(Duration::from_secs(2))
    }

    /// etcd, its replicas on leases of `ttl`.
    fn etcd_with_ttl(ttl: Duration) -> Backend {
        let etcd = Etcd::start(LIMIT).unwrap_or_else(|e| panic!("{e}"));
        Backend::Etcd(etcd, "/contract".into(), ttl)
    }

    fn etcd_config(&self) -> EtcdConfig {
        let Backend::Etcd(etcd, prefix, ttl) = self else { panic!("not etcd") };
        EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            prefix: prefix.clone(),
            lease_ttl: *ttl,
            ..EtcdConfig::default()
        }
    }

    /// A handle on the store (for the ledger, only one may be open at once, as the file is
    /// locked: drop the last before opening another).
    async fn open(&self) -> Arc<dyn FleetStore> {
        match self {
            Backend::Memory(store) => Arc::new(store.clone()),
            Backend::Ledger(dir) => {
                Arc::new(LedgerStore::open(&dir.path().join("fleet.redb")).unwrap())
            }
            Backend::Etcd(..) => Arc::new(EtcdStore::connect(self.etcd_config()).await.unwrap()),
        }
    }

    /// Writes bytes no reader of this build accepts (a record from a newer format) under `id`.
    async fn put_unreadable(&self, id: &str) {
        let newer = [u8::MAX, u8::MAX, b'{', b'}'];
        match self {
            Backend::Memory(_) => unreachable!("the memory store keeps records, not bytes"),
            Backend::Ledger(dir) => {
                let ledger = wharf_store::Ledger::open(dir.path().join("fleet.redb")).unwrap();
                let term = ledger.term().await.unwrap();
                let change =
                    wharf_store::LedgerChange::Put { key: id.into(), value: newer.to_vec() };
                ledger.write(term, vec![change]).await.unwrap();
            }
            Backend::Etcd(etcd, prefix, _) => {
                etcd.put(&format!("{prefix}/work/{id}"), &newer).unwrap()
            }
        }
    }
}

fn replica(name: &str) -> Replica {
    Replica { name: name.into(), address: format!("127.0.0.1:{}", 4000 + name.len()) }
}

fn record(id: &str, phase: WorkPhase) -> WorkRecord {
    let mut placement =
        Placement::queued(id, Timestamp(1_000), Amount::ZERO, ReschedulePolicy::DISABLED);
    placement.phase = phase;
    WorkRecord { placement, payload: format!("{{\"spec\": \"{id}\"}}") }
}

fn running(worker: &str) -> WorkPhase {
    WorkPhase::Running { worker: worker.into() }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, future).await.unwrap_or_else(|_| panic!("{what} hung"))
}

/// Records written under a term read back, one by one and all together, and outlive the
/// handle that wrote them; a commit's puts and deletes apply together.
async fn records_round_trip_and_outlive_their_writer(backend: Backend) {
    let store = backend.open().await;
    let term = within("campaign", store.campaign(&replica("a"))).await.unwrap();
    assert!(store.load_all().await.unwrap().records.is_empty());
    let (a, b, c) = (
        record("a", WorkPhase::Queued),
        record("b", running("h1")),
        record("c", WorkPhase::Queued),
    );
    let changes = vec![Change::Put(a.clone()), Change::Put(b.clone()), Change::Put(c)];
    store.commit(&term, changes).await.unwrap();
    let mut b2 = b.clone();
    b2.placement.phase = WorkPhase::Ended { worker: "h1".into(), outcome: "complete".into() };
    b2.placement.revision += 1;
    store.commit(&term, vec![Change::Put(b2.clone()), Change::Delete("c".into())]).await.unwrap();
    assert_eq!(store.load("a").await.unwrap(), Some(a.clone()));
    assert_eq!(store.load("b").await.unwrap(), Some(b2.clone()));
    assert_eq!(store.load("c").await.unwrap(), None);
    assert_eq!(store.load("nope").await.unwrap(), None);
    store.resign(&term).await.unwrap();
    drop((store, term));

    let store = backend.open().await;
    let mut loaded = store.load_all().await.unwrap();
    assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
    loaded.records.sort_by(|x, y| x.placement.id.cmp(&y.placement.id));
    assert_eq!(loaded.records, [a, b2]);
}

/// A term that ended writes nothing: resigned, or outdated by a later term. Later terms have
/// higher numbers, and the leader is whoever holds the newest.
async fn an_ended_term_writes_nothing_and_later_terms_lead(backend: Backend) {
    let store = backend.open().await;
    let first = within("campaign", store.campaign(&replica("a"))).await.unwrap();
    assert!(first.holds());
    assert_eq!(store.leader().await.unwrap(), Some(replica("a")));
    assert!(store.replicas().await.unwrap().contains(&replica("a")));
    store.commit(&first, vec![Change::Put(record("kept", WorkPhase::Queued))]).await.unwrap();
    store.resign(&first).await.unwrap();
    assert!(!first.holds());
    within("the end of a resigned term", first.lost()).await;
    let refused = store.commit(&first, vec![Change::Put(record("late", WorkPhase::Queued))]).await;
    assert!(matches!(refused, Err(FleetError::Fenced { .. })), "{refused:?}");

    let second = within("campaign", store.campaign(&replica("b"))).await.unwrap();
    assert!(second.number() > first.number(), "{second:?} after {first:?}");
    assert_eq!(store.leader().await.unwrap(), Some(replica("b")));
    let refused = store.commit(&first, vec![Change::Delete("kept".into())]).await;
    assert!(matches!(refused, Err(FleetError::Fenced { .. })), "{refused:?}");
    store.commit(&second, vec![Change::Put(record("new", WorkPhase::Queued))]).await.unwrap();
    let mut ids: Vec<String> =
        store.load_all().await.unwrap().records.into_iter().map(|r| r.placement.id).collect();
    ids.sort();
    assert_eq!(ids, ["kept", "new"], "nothing of the ended term's late writes");
    store.resign(&second).await.unwrap();
}

/// A record this build cannot read (written by a newer one) is reported with its key, and the
/// others still load.
async fn an_unreadable_record_is_reported_not_dropped(backend: Backend) {
    {
        let store = backend.open().await;
        let term = within("campaign", store.campaign(&replica("a"))).await.unwrap();
        store.commit(&term, vec![Change::Put(record("good", WorkPhase::Queued))]).await.unwrap();
        store.resign(&term).await.unwrap();
    }
    backend.put_unreadable("from-the-future").await;
    let store = backend.open().await;
    let loaded = store.load_all().await.unwrap();
    assert_eq!(loaded.records.len(), 1);
    assert_eq!(loaded.problems.len(), 1, "{:?}", loaded.problems);
    let (key, why) = &loaded.problems[0];
    assert!(key.ends_with("from-the-future") && why.contains("newer"), "{key}: {why}");
    assert!(store.load("from-the-future").await.is_err());
}

/// A commit carries at most `MAX_CHANGES_PER_COMMIT` changes on every backend (etcd cannot take
/// more in one transaction): one more is refused whole, and writes nothing.
async fn a_commit_of_too_many_changes_is_refused_whole(backend: Backend) {
    let store = backend.open().await;
    let term = within("campaign", store.campaign(&replica("a"))).await.unwrap();
    let changes = |n: usize| -> Vec<Change> {
        (0..n).map(|i| Change::Put(record(&format!("r{i}"), WorkPhase::Queued))).collect()
    };
    store.commit(&term, changes(MAX_CHANGES_PER_COMMIT)).await.unwrap();
    let refused = store.commit(&term, changes(MAX_CHANGES_PER_COMMIT + 1)).await;
    match refused {
        Err(FleetError::Store { detail, .. }) => assert!(detail.contains("at most"), "{detail}"),
        other => panic!("{other:?}"),
    }
    let loaded = store.load_all().await.unwrap().records;
    assert_eq!(loaded.len(), MAX_CHANGES_PER_COMMIT, "nothing of the refused commit");
    store.resign(&term).await.unwrap();
}

fn job(id: &str, json: &str) -> Entry {
    Entry { kind: EntryKind::NomadJob, id: id.into(), json: json.into() }
}

/// Kept entries (Nomad job records, the fleet's variables) round-trip apart from the work and
/// from each other: a job, a variables entry and a work of the same id are three records,
/// loading one kind shows none of the others, a commit may change all of them, and an ended
/// term writes no entry.
async fn kept_entries_round_trip_apart_from_the_work_and_each_other(backend: Backend) {
    let store = backend.open().await;
    let term = within("campaign", store.campaign(&replica("a"))).await.unwrap();
    for kind in EntryKind::ALL {
        assert!(store.load_entries(kind).await.unwrap().is_empty());
    }
    let shared = record("shared", WorkPhase::Queued);
    let (spaced, gone) = (job("a job/with spaces", r#"{"v":1}"#), job("gone", "{}"));
    let variables =
        Entry { kind: EntryKind::Variables, id: "shared".into(), json: r#"{"index":3}"#.into() };
    let changes = vec![
        Change::Put(shared.clone()),
        Change::PutEntry(job("shared", r#"{"v":0}"#)),
        Change::PutEntry(spaced.clone()),
        Change::PutEntry(gone),
        Change::PutEntry(variables.clone()),
    ];
    store.commit(&term, changes).await.unwrap();
    let changes = vec![
        Change::PutEntry(job("shared", r#"{"v":2}"#)),
        Change::DeleteEntry(EntryKind::NomadJob, "gone".into()),
        Change::DeleteEntry(EntryKind::Variables, "gone".into()),
    ];
    store.commit(&term, changes).await.unwrap();
    store.resign(&term).await.unwrap();
    let refused = store.commit(&term, vec![Change::PutEntry(job("late", "{}"))]).await;
    assert!(matches!(refused, Err(FleetError::Fenced { .. })), "{refused:?}");
    drop((store, term));

    let store = backend.open().await;
    let mut jobs = store.load_entries(EntryKind::NomadJob).await.unwrap();
    jobs.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(jobs, [spaced, job("shared", r#"{"v":2}"#)]);
    assert_eq!(store.load_entries(EntryKind::Variables).await.unwrap(), [variables]);
    let loaded = store.load_all().await.unwrap();
    assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
    assert_eq!(loaded.records, std::slice::from_ref(&shared));
    assert_eq!(store.load("shared").await.unwrap(), Some(shared));
    let term = within("campaign", store.campaign(&replica("b"))).await.unwrap();
    store.commit(&term, vec![Change::Delete("shared".into())]).await.unwrap();
    let jobs = store.load_entries(EntryKind::NomadJob).await.unwrap();
    assert_eq!(jobs.len(), 2, "the work's delete leaves its job");
    assert_eq!(store.load_entries(EntryKind::Variables).await.unwrap().len(), 1, "and variables");
    store.resign(&term).await.unwrap();
}

macro_rules! contract {
    ($backend:ident: $($test:ident),*) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Backend::$backend()).await;
                }
            )*
        }
    };
}

contract!(memory: records_round_trip_and_outlive_their_writer, an_ended_term_writes_nothing_and_later_terms_lead, a_commit_of_too_many_changes_is_refused_whole, kept_entries_round_trip_apart_from_the_work_and_each_other);
contract!(ledger: records_round_trip_and_outlive_their_writer, an_ended_term_writes_nothing_and_later_terms_lead, an_unreadable_record_is_reported_not_dropped, a_commit_of_too_many_changes_is_refused_whole, kept_entries_round_trip_apart_from_the_work_and_each_other);
contract!(etcd: records_round_trip_and_outlive_their_writer, an_ended_term_writes_nothing_and_later_terms_lead, an_unreadable_record_is_reported_not_dropped, a_commit_of_too_many_changes_is_refused_whole, kept_entries_round_trip_apart_from_the_work_and_each_other);

/// etcd with replicas in earnest: while one leads, another's campaign waits; when the leader
/// resigns it wins, with a higher term. When a leader's lease lapses (its keep-alive stopped,
/// as in a process that was killed), its key goes with it within the lease's TTL: another
/// takes over, and the old term's writes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_campaigns_wait_for_the_leader_and_a_lapsed_lease_hands_over() {
    let backend = Backend::etcd();
    let a = backend.open().await;
    let b = backend.open().await;
    let first = within("campaign of a", a.campaign(&replica("a"))).await.unwrap();
    let mut waiting = tokio::spawn({
        let b = b.clone();
        async move { b.campaign(&replica("b")).await }
    });
    // b registers before it campaigns; once it is listed, it must not win while a leads (an
    // absence, seen only by watching a while).
    let deadline = tokio::time::Instant::now() + LIMIT;
    let replicas = loop {
        let mut names: Vec<String> =
            a.replicas().await.unwrap().into_iter().map(|r| r.name).collect();
        names.sort();
        if names.len() == 2 || tokio::time::Instant::now() > deadline {
            break names;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(replicas, ["a", "b"]);
    let early = tokio::time::timeout(Duration::from_millis(500), &mut waiting).await;
    assert!(early.is_err(), "b won while a leads: {early:?}");
    a.resign(&first).await.unwrap();
    let second = within("campaign of b", waiting).await.unwrap().unwrap();
    assert!(second.number() > first.number());
    assert_eq!(a.leader().await.unwrap(), Some(replica("b")));

    // b's process goes away without resigning: its lease lapses, and a's campaign wins.
    let lapsed = second.clone();
    drop((b, second));
    let ttl = backend.etcd_config().lease_ttl;
    let started = tokio::time::Instant::now();
    let third = within("campaign after the lapse", a.campaign(&replica("a"))).await.unwrap();
    assert!(started.elapsed() < ttl + Duration::from_secs(2), "took {:?}", started.elapsed());
    let refused = a.commit(&lapsed, vec![Change::Put(record("late", WorkPhase::Queued))]).await;
    assert!(matches!(refused, Err(FleetError::Fenced { .. })), "{refused:?}");
    a.commit(&third, vec![Change::Put(record("new", WorkPhase::Queued))]).await.unwrap();
}

/// etcd's own compare fences a commit, not only the replica's clock: with a term that still
/// holds here, a commit after its leader key was deleted behind its back (an operator, or
/// another replica that outlived it) is refused by etcd, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_commit_whose_leader_key_is_gone_though_the_term_holds_here() {
    let backend = Backend::etcd_with_ttl(Duration::from_secs(30));
    let Backend::Etcd(etcd, prefix, _) = &backend else { unreachable!() };
    let store = backend.open().await;
    let term = within("campaign", store.campaign(&replica("a"))).await.unwrap();
    let leader_keys = etcd.list(&format!("{prefix}/leader/")).unwrap();
    assert_eq!(leader_keys.len(), 1, "one candidate, the leader");
    etcd.delete(&leader_keys[0].0).unwrap();

    assert!(term.holds(), "the term must still hold here for the test to mean anything");
    let refused = store.commit(&term, vec![Change::Put(record("late", WorkPhase::Queued))]).await;
    match refused {
        Err(FleetError::Fenced { detail, .. }) => {
            assert!(detail.contains("leader key is gone"), "refused by etcd, not locally: {detail}")
        }
        other => panic!("a commit without its leader key: {other:?}"),
    }
    assert!(etcd.list(&format!("{prefix}/work/")).unwrap().is_empty(), "nothing written");
    assert_eq!(store.load("late").await.unwrap(), None);
}

/// The same when the replica's lease is revoked (its key goes with it) between two renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_commit_whose_lease_was_revoked_though_the_term_holds_here() {
    let backend = Backend::etcd_with_ttl(Duration::from_secs(30));
    let Backend::Etcd(etcd, prefix, _) = &backend else { unreachable!() };
    let store = backend.open().await;
    let term = within("campaign", store.campaign(&replica("a"))).await.unwrap();
    store.commit(&term, vec![Change::Put(record("before", WorkPhase::Queued))]).await.unwrap();
    let lease = etcd.lease_of(&format!("{prefix}/replicas/a")).unwrap().expect("a lease");
    etcd.revoke(&lease).unwrap();
    assert!(etcd.list(&format!("{prefix}/leader/")).unwrap().is_empty(), "the key went with it");

    assert!(term.holds(), "the term must still hold here for the test to mean anything");
    let refused = store
        .commit(
            &term,
            vec![Change::Put(record("late", WorkPhase::Queued)), Change::Delete("before".into())],
        )
        .await;
    assert!(
        matches!(&refused, Err(FleetError::Fenced { detail, .. }) if detail.contains("leader key is gone")),
        "{refused:?}"
    );
    let kept: Vec<String> =
        store.load_all().await.unwrap().records.into_iter().map(|r| r.placement.id).collect();
    assert_eq!(kept, ["before"], "the refused commit changed nothing");
}
