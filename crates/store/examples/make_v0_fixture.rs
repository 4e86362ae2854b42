//! Writes `tests/fixtures/state-v0.redb`: a store in schema 0, the layout before versioning
//! (no meta table; `allocs` and `task_states` with bare JSON values). The migration test opens
//! a copy of it. Run it again only if the fixture must change:
//! `cargo run -p wharf-store --example make_v0_fixture -- crates/store/tests/fixtures/state-v0.redb`
//! Without an argument it writes a scratch copy and opens it with the current store, which
//! upgrades it: what `cargo xtask ci` runs, so the generator cannot rot.

use redb::TableDefinition;
use wharf_state::{Allocation, DesiredStatus, TaskState, TaskStatus, Timestamp, spec};
use wharf_store::StateStore;

const ALLOCS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("allocs");
const TASK_STATES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("task_states");

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args_os().nth(1) {
        Some(path) => write_fixture(std::path::Path::new(&path)),
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("state-v0.redb");
            write_fixture(&path)?;
            let snapshot = wharf_store::RedbStore::open(&path)?.load_all().await?;
            assert_eq!(snapshot.allocs.len(), 1, "the upgraded fixture: {snapshot:?}");
            Ok(())
        }
    }
}

fn write_fixture(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let _ = std::fs::remove_file(path);
    let job = spec::parse_toml(
        "[job]\nid = \"legacy\"\ntype = \"batch\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"main\"\ndriver = \"raw_exec\"\nconfig = { command = \"/bin/true\" }\n",
    )?;
    let alloc = Allocation {
        id: "legacy-alloc".into(),
        job,
        task_group: "g".into(),
        desired_status: DesiredStatus::Run,
        modify_index: 7,
        deployment_id: None,
        ports: Vec::new(),
    };
    let mut state = TaskState::new();
    state.set_status(TaskStatus::Running, Timestamp(1_700_000_000_000))?;
    let mut db = redb::Database::create(path)?;
    let txn = db.begin_write()?;
    txn.open_table(ALLOCS)?.insert(alloc.id.as_str(), serde_json::to_vec(&alloc)?.as_slice())?;
    txn.open_table(TASK_STATES)?
        .insert("legacy-alloc/main", serde_json::to_vec(&state)?.as_slice())?;
    txn.commit()?;
    db.compact()?;
    Ok(())
}
