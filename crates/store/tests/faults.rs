//! Storage faults injected under the engine: every failed write is reported to its writer, and
//! the file reopens consistent, with every acknowledged write and no half-applied batch.

use wharf_state::{Allocation, DesiredStatus, TaskState, TaskStatus, Timestamp, spec};
use wharf_store::{RedbStore, StateStore, StoreOptions, WriteBatch, fault};

fn alloc(id: &str) -> Allocation {
    let job = spec::parse_toml("[job]\nid = \"j\"\ntype = \"batch\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"mock\"\n").unwrap();
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

/// A batch of an allocation and its task state, which must land together or not at all.
fn pair(id: &str) -> WriteBatch {
    let mut state = TaskState::new();
    state.set_status(TaskStatus::Running, Timestamp(1)).unwrap();
    WriteBatch::new().put_allocation(&alloc(id)).unwrap().put_task_state(id, "t", &state).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Writes good batches, turns a fault on, writes more (all must fail), then reopens the file
/// without faults and checks that every acknowledged batch is there, whole. When
/// `failed_may_land`, a batch whose write was reported failed may be there too (a failed
/// fsync cannot say whether the data reached the disk), but only whole.
fn check_fault(name: &str, failed_may_land: bool, inject: impl Fn(&fault::FaultPlan)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let rt = runtime();
    let mut acknowledged = Vec::new();
    {
        let (store, plan) = fault::open(&path, StoreOptions::default()).unwrap();
        for i in 0..5 {
            let id = format!("ok{i}");
            rt.block_on(store.write(pair(&id))).unwrap();
            acknowledged.push(id);
        }
        inject(&plan);
        for i in 0..3 {
            let result = rt.block_on(store.write(pair(&format!("bad{i}"))));
            let err = result.expect_err(&format!("{name}: a write under a fault must fail"));
            let message = err.to_string();
            assert!(message.contains("state.redb"), "{name}: error names the file: {message}");
        }
        assert!(plan.injected() > 0, "{name}: the fault was reached");
        assert!(store.failing().is_some(), "{name}: the store says it cannot persist");
        plan.heal();
    }
    let store = RedbStore::open(&path).unwrap_or_else(|e| panic!("{name}: reopen failed: {e}"));
    let snapshot = rt.block_on(store.load_all()).unwrap();
    assert!(snapshot.problems.is_empty(), "{name}: {:?}", snapshot.problems);
    let mut ids: Vec<_> = snapshot.allocs.iter().map(|a| a.alloc.id.clone()).collect();
    if failed_may_land {
        ids.retain(|id| !id.starts_with("bad"));
    }
    assert_eq!(ids, acknowledged, "{name}: the acknowledged writes and no others");
    assert!(
        snapshot.allocs.iter().all(|a| a.tasks["t"].state.is_some()),
        "{name}: batches are whole"
    );
    // The reopened store takes writes again.
    rt.block_on(store.write(pair("after"))).unwrap();
}

#[test]
fn failed_writes_are_reported_and_the_file_stays_consistent() {
    check_fault("failed writes", false, |plan| plan.fail_writes(true));
}

#[test]
fn torn_writes_are_reported_and_the_file_stays_consistent() {
    check_fault("torn writes", false, |plan| plan.tear_writes(true));
}

#[test]
fn failed_syncs_are_reported_and_the_file_stays_consistent() {
    check_fault("failed syncs", true, |plan| plan.fail_syncs(true));
}
