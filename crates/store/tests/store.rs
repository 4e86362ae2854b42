//! StateStore behaviour, run against both implementations, plus what only the file store has:
//! durability across reopen, group commit, schema versions and damaged files.

use redb::ReadableDatabase;
use std::collections::BTreeMap;
use std::path::Path;
use wharf_state::{
    Allocation, DeploymentStatus, DesiredStatus, TaskEvent, TaskEventKind, TaskState, TaskStatus,
    Timestamp, spec,
};
use wharf_store::{
    MemoryStore, RedbStore, SCHEMA_VERSION, StateStore, StoreError, StoreOptions, WriteBatch,
};

fn alloc(id: &str) -> Allocation {
    let job = spec::parse_toml(
        "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"web\"\ndriver = \"mock\"\n[[group.task]]\nname = \"side\"\ndriver = \"mock\"\n",
    )
    .unwrap();
    Allocation {
        id: id.into(),
        job,
        task_group: "g".into(),
        desired_status: DesiredStatus::Run,
        modify_index: 1,
        deployment_id: None,
        ports: Vec::new(),
    }
}

fn running_state(at: u64) -> TaskState {
    let mut state = TaskState::new();
    state.set_status(TaskStatus::Running, Timestamp(at)).unwrap();
    state.append_event(TaskEvent::new(Timestamp(at), TaskEventKind::Started));
    state
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The contract every StateStore keeps.
async fn contract(store: &dyn StateStore) {
    assert!(store.load_all().await.unwrap().allocs.is_empty());
    for id in ["a1", "a10", "a1-b"] {
        store.put_allocation(&alloc(id)).await.unwrap();
        store.put_task_state(id, "web", &running_state(5)).await.unwrap();
        store.put_task_local_state(id, "web", b"handle").await.unwrap();
    }
    let health = DeploymentStatus {
        healthy: Some(true),
        timestamp: Some(Timestamp(9)),
        description: None,
        canary: false,
        modify_index: 2,
    };
    store.put_deployment_status("a1", &health).await.unwrap();

    let a1 = store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(a1.alloc, alloc("a1"));
    assert_eq!(a1.deployment_status, Some(health));
    assert_eq!(a1.tasks["web"].state, Some(running_state(5)));
    assert_eq!(a1.tasks["web"].local_state.as_deref(), Some(&b"handle"[..]));
    assert_eq!(a1.tasks.len(), 1, "only its own tasks, not those of a10 or a1-b");

    // A later write replaces the earlier one; a batch is applied whole.
    let mut alloc2 = alloc("a1");
    alloc2.modify_index = 2;
    let batch = WriteBatch::new()
        .put_allocation(&alloc2)
        .unwrap()
        .put_task_state("a1", "side", &TaskState::new())
        .unwrap();
    assert_eq!(batch.len(), 2);
    store.write(batch).await.unwrap();
    let a1 = store.load_alloc("a1").await.unwrap().unwrap();
    assert_eq!(a1.alloc.modify_index, 2);
    assert_eq!(a1.tasks.keys().collect::<Vec<_>>(), ["side", "web"]);

    // Deleting takes everything of that allocation and nothing of its neighbours.
    store.delete_allocation("a1").await.unwrap();
    assert_eq!(store.load_alloc("a1").await.unwrap(), None);
    let snapshot = store.load_all().await.unwrap();
    let ids: Vec<_> = snapshot.allocs.iter().map(|a| a.alloc.id.as_str()).collect();
    assert_eq!(ids, ["a1-b", "a10"]);
    assert!(snapshot.allocs.iter().all(|a| a.tasks.len() == 1));
    assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);

    // Keys that could escape their range are refused before anything is written.
    for bad in ["", "a/b", "a b"] {
        assert!(matches!(
            store.put_task_state("a10", bad, &TaskState::new()).await,
            Err(StoreError::InvalidKey(_))
        ));
        assert!(matches!(store.delete_allocation(bad).await, Err(StoreError::InvalidKey(_))));
    }

    // A task record without its allocation is reported, not silently restored or dropped.
    store.put_task_state("ghost", "web", &TaskState::new()).await.unwrap();
    let snapshot = store.load_all().await.unwrap();
    assert_eq!(snapshot.problems.len(), 1);
    assert_eq!(snapshot.problems[0].alloc_id, "ghost");
    assert!(snapshot.problems[0].error.contains("allocation record is missing"));
    assert!(snapshot.problems[0].orphaned);
}

#[test]
fn memory_store_keeps_the_contract() {
    runtime().block_on(contract(&MemoryStore::new()));
}

#[test]
fn redb_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("state.redb")).unwrap();
    runtime().block_on(contract(&store));
}

#[test]
fn memory_store_can_be_told_to_fail() {
    runtime().block_on(async {
        let store = MemoryStore::new();
        store.fail_writes(Some("disk full"));
        let err = store.put_allocation(&alloc("a")).await.unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        store.fail_writes(None);
        assert!(
            store.load_all().await.unwrap().allocs.is_empty(),
            "nothing was applied while failing"
        );
        store.put_allocation(&alloc("a")).await.unwrap();
        assert_eq!(store.write_count(), 1);
    });
}

#[test]
fn writes_survive_reopen_and_the_file_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let rt = runtime();
    {
        let store = RedbStore::open(&path).unwrap();
        rt.block_on(store.put_allocation(&alloc("a"))).unwrap();
        rt.block_on(store.put_task_state("a", "web", &running_state(3))).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let store = RedbStore::open(&path).unwrap();
    let stored = rt.block_on(store.load_alloc("a")).unwrap().unwrap();
    assert_eq!(stored.tasks["web"].state, Some(running_state(3)));
}

#[test]
fn a_second_opener_is_told_the_store_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let _first = RedbStore::open(&path).unwrap();
    let err = RedbStore::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("another wharf agent"), "{err}");
}

#[test]
fn concurrent_writers_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("state.redb")).unwrap();
    let rt = runtime();
    rt.block_on(store.put_allocation(&alloc("a"))).unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..32)
            .map(|writer| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..20u64 {
                        store
                            .put_task_state("a", &format!("t{writer}"), &running_state(i))
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    let stats = store.stats();
    assert_eq!(stats.writes, 1 + 32 * 20);
    assert!(stats.commits < stats.writes, "no write shared a commit: {stats:?}");
    let stored = rt.block_on(store.load_alloc("a")).unwrap().unwrap();
    assert_eq!(stored.tasks.len(), 32);
    assert!(stored.tasks.values().all(|t| t.state == Some(running_state(19))));

    // With one write per commit, as the benchmark's baseline does, nothing is shared.
    let naive = RedbStore::open_with(
        dir.path().join("naive.redb"),
        StoreOptions { max_writes_per_commit: 1, ..StoreOptions::default() },
    )
    .unwrap();
    rt.block_on(naive.put_allocation(&alloc("a"))).unwrap();
    rt.block_on(naive.put_allocation(&alloc("b"))).unwrap();
    assert_eq!(naive.stats().commits, 2);
}

fn set_schema_version(path: &Path, version: u64) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
        .unwrap()
        .insert("schema_version", version)
        .unwrap();
    txn.commit().unwrap();
}

#[test]
fn a_newer_schema_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    drop(RedbStore::open(&path).unwrap());
    set_schema_version(&path, SCHEMA_VERSION + 1);
    let err = RedbStore::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerSchema { found, supported, .. } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("newer wharf"),
        "{message}"
    );
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap();
    assert_eq!(
        meta.get("schema_version").unwrap().unwrap().value(),
        SCHEMA_VERSION + 1,
        "a refused file is left as it was"
    );
}

#[test]
fn the_v0_fixture_is_upgraded_with_a_backup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-v0.redb");
    std::fs::copy(&fixture, &path).unwrap();

    let store = RedbStore::open(&path).unwrap();
    // The backup is the schema-0 file as it was: no meta table, the bare JSON record.
    let backup = redb::Database::open(dir.path().join("state.redb.v0.backup")).unwrap();
    let txn = backup.begin_read().unwrap();
    let names: Vec<String> =
        txn.list_tables().unwrap().map(|t| redb::TableHandle::name(&t).to_owned()).collect();
    assert_eq!(names, ["allocs", "task_states"]);
    let allocs = txn.open_table(redb::TableDefinition::<&str, &[u8]>::new("allocs")).unwrap();
    assert_eq!(allocs.get("legacy-alloc").unwrap().unwrap().value()[0], b'{');

    let rt = runtime();
    let snapshot = rt.block_on(store.load_all()).unwrap();
    assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);
    assert_eq!(snapshot.allocs.len(), 1);
    let legacy = &snapshot.allocs[0];
    assert_eq!((legacy.alloc.id.as_str(), legacy.alloc.modify_index), ("legacy-alloc", 7));
    let main = legacy.tasks["main"].state.as_ref().unwrap();
    assert_eq!(
        (main.status, main.started_at),
        (TaskStatus::Running, Some(Timestamp(1_700_000_000_000)))
    );

    // The upgraded file takes new kinds of record and opens as the current schema.
    rt.block_on(store.put_task_local_state("legacy-alloc", "main", b"h")).unwrap();
    drop(store);
    let store = RedbStore::open(&path).unwrap();
    let legacy = rt.block_on(store.load_alloc("legacy-alloc")).unwrap().unwrap();
    assert_eq!(legacy.tasks["main"].local_state.as_deref(), Some(&b"h"[..]));
}

#[test]
fn damaged_files_give_an_error_that_names_the_file_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.redb");
    {
        let store = RedbStore::open(&good).unwrap();
        let rt = runtime();
        for i in 0..50 {
            rt.block_on(store.put_allocation(&alloc(&format!("a{i}")))).unwrap();
        }
    }
    let bytes = std::fs::read(&good).unwrap();
    let mut garbage = vec![0u8; 8192];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for byte in &mut garbage {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *byte = seed as u8;
    }
    let mut header_smashed = bytes.clone();
    header_smashed[..512].fill(0xAB);
    // (content, whether it must be refused): a file cut in half may keep a readable older
    // commit, so it may open; the others hold no database at all.
    let cases: BTreeMap<&str, (Vec<u8>, bool)> = BTreeMap::from([
        ("garbage", (garbage, true)),
        ("text", (b"this is not a database\n".to_vec(), true)),
        ("truncated-header", (bytes[..100].to_vec(), true)),
        ("truncated-half", (bytes[..bytes.len() / 2].to_vec(), false)),
        ("header-smashed", (header_smashed, true)),
    ]);
    for (name, (content, must_fail)) in cases {
        let path = dir.path().join(format!("{name}.redb"));
        std::fs::write(&path, &content).unwrap();
        let outcome = std::panic::catch_unwind(|| RedbStore::open(&path));
        let result = outcome.unwrap_or_else(|_| panic!("{name}: opening panicked"));
        let err = match result {
            Err(err) => err,
            // A damaged tail may still open; then reading it must not panic either.
            Ok(store) => match store.load_all_blocking() {
                Err(err) => err,
                Ok(_) => {
                    assert!(!must_fail, "{name}: a file with no database in it opened and loaded");
                    continue;
                }
            },
        };
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{name}: {message}");
        if let StoreError::Corrupt { .. } = err {
            assert!(message.contains("move it aside"), "{name}: {message}");
        }
    }
}
