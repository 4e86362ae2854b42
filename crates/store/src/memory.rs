//! An in-memory [`StateStore`] for tests of the crates above the store.
//!
//! It encodes and decodes records exactly as [`crate::RedbStore`] does, so a type that does not
//! round-trip fails here too. [`MemoryStore::fail_writes`] makes every write fail, to test how
//! callers handle a store that cannot persist.

use crate::{
    Op, RawRecords, Snapshot, StateStore, StoreError, StoredAlloc, Table, WriteBatch, record,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A [`StateStore`] that keeps everything in memory. Clones share the same data.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    tables: BTreeMap<Table, BTreeMap<String, Vec<u8>>>,
    failing: Option<String>,
    writes: u64,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// From now on every write fails with `reason` (`None` heals the store). Nothing is applied
    /// while it fails.
    pub fn fail_writes(&self, reason: Option<&str>) {
        self.inner.lock().failing = reason.map(str::to_owned);
    }

    /// How many batches were written successfully.
    pub fn write_count(&self) -> u64 {
        self.inner.lock().writes
    }

    fn raw(&self) -> RawRecords {
        let inner = self.inner.lock();
        let table = |t| inner.tables.get(&t).cloned().unwrap_or_default();
        RawRecords {
            allocs: table(Table::Allocs),
            deployments: table(Table::Deployments),
            task_states: table(Table::TaskStates),
            task_local: table(Table::TaskLocal),
        }
    }
}

#[async_trait::async_trait]
impl StateStore for MemoryStore {
    async fn write(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        if let Some(reason) = &inner.failing {
            return Err(StoreError::Storage {
                path: "<memory>".into(),
                operation: "write",
                source: reason.clone().into(),
            });
        }
        for op in batch.ops {
            match op {
                Op::Put { table, key, value } => {
                    inner.tables.entry(table).or_default().insert(key, value);
                }
                Op::DeleteAlloc { alloc_id } => {
                    let (lo, hi) = record::task_range(&alloc_id);
                    for (table, rows) in inner.tables.iter_mut() {
                        match table {
                            Table::Allocs | Table::Deployments => {
                                rows.remove(&alloc_id);
                            }
                            Table::TaskStates | Table::TaskLocal => rows.retain(|key, _| {
                                !(lo.as_str() <= key.as_str() && key.as_str() < hi.as_str())
                            }),
                        }
                    }
                }
            }
        }
        inner.writes += 1;
        Ok(())
    }

    async fn load_alloc(&self, alloc_id: &str) -> Result<Option<StoredAlloc>, StoreError> {
        Ok(self.load_all().await?.allocs.into_iter().find(|a| a.alloc.id == alloc_id))
    }

    async fn load_all(&self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot::assemble(self.raw()))
    }
}
