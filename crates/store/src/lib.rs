#![doc = include_str!("../README.md")]
//!
//! This crate is the only one that knows redb. redb is synchronous, so every call into it runs
//! on the writer thread or on tokio's blocking pool, never on an async worker thread.

mod error;
#[cfg(feature = "redb")]
pub mod fault;
#[cfg(feature = "redb")]
mod ledger;
mod memory;
pub mod record;
#[cfg(feature = "redb")]
mod redb_store;
pub mod variables;
#[cfg(feature = "redb")]
mod writer;

pub use error::{Cause, StoreError};
#[cfg(feature = "redb")]
pub use ledger::{LEDGER_SCHEMA_VERSION, Ledger, LedgerChange};
pub use memory::MemoryStore;
pub use record::DecodeError;
#[cfg(feature = "redb")]
pub use redb_store::{RedbStore, SCHEMA_VERSION, StoreOptions, StoreStats};
pub use variables::{Variable, VariableFile, VariableSync, check_variable};

/// The attribute that implementations of [`StateStore`] put on their `impl` block.
pub use async_trait::async_trait;
/// The state model this crate stores, in the version it was built with.
pub use wharf_state as state;

use std::collections::BTreeMap;
use wharf_state::{Allocation, DeploymentStatus, TaskState};

/// Where state is persisted. Every method returns once its effect is durable (or failed).
#[async_trait::async_trait]
pub trait StateStore: Send + Sync + std::fmt::Debug + 'static {
    /// Applies every change in `batch` atomically: all of it is durable, or none of it.
    async fn write(&self, batch: WriteBatch) -> Result<(), StoreError>;

    /// Everything stored about one allocation, if it is there.
    async fn load_alloc(&self, alloc_id: &str) -> Result<Option<StoredAlloc>, StoreError>;

    /// Everything stored, for restore.
    async fn load_all(&self) -> Result<Snapshot, StoreError>;

    /// Stores an allocation, replacing an older copy.
    async fn put_allocation(&self, alloc: &Allocation) -> Result<(), StoreError> {
        self.write(WriteBatch::new().put_allocation(alloc)?).await
    }

    /// Stores a task's state.
    async fn put_task_state(
        &self,
        alloc_id: &str,
        task: &str,
        state: &TaskState,
    ) -> Result<(), StoreError> {
        self.write(WriteBatch::new().put_task_state(alloc_id, task, state)?).await
    }

    /// Stores a task's local state (driver handle and hook state), opaque to the store.
    async fn put_task_local_state(
        &self,
        alloc_id: &str,
        task: &str,
        local: &[u8],
    ) -> Result<(), StoreError> {
        self.write(WriteBatch::new().put_task_local_state(alloc_id, task, local)?).await
    }

    /// Stores an allocation's deployment status.
    async fn put_deployment_status(
        &self,
        alloc_id: &str,
        status: &DeploymentStatus,
    ) -> Result<(), StoreError> {
        self.write(WriteBatch::new().put_deployment_status(alloc_id, status)?).await
    }

    /// Deletes an allocation and everything under it, in one transaction.
    async fn delete_allocation(&self, alloc_id: &str) -> Result<(), StoreError> {
        self.write(WriteBatch::new().delete_allocation(alloc_id)?).await
    }
}

/// Changes to apply together. Records are encoded as they are added, so the writer only
/// does I/O and a bad record is reported to the code that made it.
#[derive(Debug, Default, Clone)]
pub struct WriteBatch {
    ops: Vec<Op>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Put { table: Table, key: String, value: Vec<u8> },
    DeleteAlloc { alloc_id: String },
}

/// The tables of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Table {
    Allocs,
    Deployments,
    TaskStates,
    TaskLocal,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// How many changes it holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when it holds no change.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Adds an allocation.
    pub fn put_allocation(mut self, alloc: &Allocation) -> Result<WriteBatch, StoreError> {
        record::check_key(&alloc.id)?;
        let value = record::encode(|| format!("allocation {}", alloc.id), alloc)?;
        self.ops.push(Op::Put { table: Table::Allocs, key: alloc.id.clone(), value });
        Ok(self)
    }

    /// Adds a task's state.
    pub fn put_task_state(
        mut self,
        alloc_id: &str,
        task: &str,
        state: &TaskState,
    ) -> Result<WriteBatch, StoreError> {
        let key = task_key(alloc_id, task)?;
        let value = record::encode(|| format!("task state {key}"), state)?;
        self.ops.push(Op::Put { table: Table::TaskStates, key, value });
        Ok(self)
    }

    /// Adds a task's local state.
    pub fn put_task_local_state(
        mut self,
        alloc_id: &str,
        task: &str,
        local: &[u8],
    ) -> Result<WriteBatch, StoreError> {
        let key = task_key(alloc_id, task)?;
        self.ops.push(Op::Put { table: Table::TaskLocal, key, value: record::stamp(local) });
        Ok(self)
    }

    /// Adds an allocation's deployment status.
    pub fn put_deployment_status(
        mut self,
        alloc_id: &str,
        status: &DeploymentStatus,
    ) -> Result<WriteBatch, StoreError> {
        record::check_key(alloc_id)?;
        let value = record::encode(|| format!("deployment status of {alloc_id}"), status)?;
        self.ops.push(Op::Put { table: Table::Deployments, key: alloc_id.to_owned(), value });
        Ok(self)
    }

    /// Deletes an allocation with its deployment status and all its task records.
    pub fn delete_allocation(mut self, alloc_id: &str) -> Result<WriteBatch, StoreError> {
        record::check_key(alloc_id)?;
        self.ops.push(Op::DeleteAlloc { alloc_id: alloc_id.to_owned() });
        Ok(self)
    }
}

fn task_key(alloc_id: &str, task: &str) -> Result<String, StoreError> {
    record::check_key(alloc_id)?;
    record::check_key(task)?;
    Ok(record::task_key(alloc_id, task))
}

/// What is stored about one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAlloc {
    /// The allocation.
    pub alloc: Allocation,
    /// Its deployment status, if one was stored.
    pub deployment_status: Option<DeploymentStatus>,
    /// Its tasks' records, by task name.
    pub tasks: BTreeMap<String, StoredTask>,
}

/// What is stored about one task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredTask {
    /// Its state, if one was stored.
    pub state: Option<TaskState>,
    /// Its local state, if one was stored.
    pub local_state: Option<Vec<u8>>,
}

/// Everything stored, as [`StateStore::load_all`] returns it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every allocation that could be read, by id order.
    pub allocs: Vec<StoredAlloc>,
    /// Records that could not be read, and task records whose allocation is missing. The
    /// allocations they belong to are left out of `allocs`, so nothing is restored from half
    /// its records; the caller decides what to tell the operator.
    pub problems: Vec<RecordProblem>,
}

/// A record that [`StateStore::load_all`] could not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordProblem {
    /// The allocation it belongs to.
    pub alloc_id: String,
    /// Which record, such as `task state web`.
    pub record: String,
    /// What is wrong with it.
    pub error: String,
    /// The record is readable but its allocation's own record is missing, so nothing can
    /// restore it; deleting the allocation's records loses nothing.
    pub orphaned: bool,
}

/// Raw records, table by table, as an engine reads them; assembled by [`Snapshot::assemble`].
#[derive(Debug, Default)]
pub(crate) struct RawRecords {
    pub(crate) allocs: BTreeMap<String, Vec<u8>>,
    pub(crate) deployments: BTreeMap<String, Vec<u8>>,
    pub(crate) task_states: BTreeMap<String, Vec<u8>>,
    pub(crate) task_local: BTreeMap<String, Vec<u8>>,
}

impl Snapshot {
    /// Decodes raw records into allocations, collecting what cannot be read.
    pub(crate) fn assemble(raw: RawRecords) -> Snapshot {
        let mut problems = Vec::new();
        let mut allocs: BTreeMap<String, Result<StoredAlloc, ()>> = BTreeMap::new();
        for (id, bytes) in &raw.allocs {
            let entry = record::decode::<Allocation>(bytes)
                .map(|alloc| StoredAlloc { alloc, deployment_status: None, tasks: BTreeMap::new() })
                .map_err(|e| {
                    problems.push(RecordProblem {
                        alloc_id: id.clone(),
                        record: "allocation".into(),
                        error: e.to_string(),
                        orphaned: false,
                    })
                });
            allocs.insert(id.clone(), entry);
        }
        let mut attach =
            |alloc_id: &str,
             record: String,
             apply: &mut dyn FnMut(&mut StoredAlloc) -> Result<(), DecodeError>| {
                match allocs.get_mut(alloc_id) {
                    Some(Ok(stored)) => {
                        if let Err(e) = apply(stored) {
                            problems.push(RecordProblem {
                                alloc_id: alloc_id.to_owned(),
                                record,
                                error: e.to_string(),
                                orphaned: false,
                            });
                            allocs.insert(alloc_id.to_owned(), Err(()));
                        }
                    }
                    Some(Err(())) => {}
                    None => problems.push(RecordProblem {
                        alloc_id: alloc_id.to_owned(),
                        record,
                        error: "its allocation record is missing".into(),
                        orphaned: true,
                    }),
                }
            };
        for (id, bytes) in &raw.deployments {
            attach(id, "deployment status".into(), &mut |stored| {
                stored.deployment_status = Some(record::decode(bytes)?);
                Ok(())
            });
        }
        for (key, bytes) in &raw.task_states {
            let (alloc_id, task) = key.split_once('/').unwrap_or((key, ""));
            attach(alloc_id, format!("task state {task}"), &mut |stored| {
                stored.tasks.entry(task.to_owned()).or_default().state =
                    Some(record::decode(bytes)?);
                Ok(())
            });
        }
        for (key, bytes) in &raw.task_local {
            let (alloc_id, task) = key.split_once('/').unwrap_or((key, ""));
            attach(alloc_id, format!("task local state {task}"), &mut |stored| {
                let body = record::unstamp(bytes)?;
                stored.tasks.entry(task.to_owned()).or_default().local_state = Some(body.to_vec());
                Ok(())
            });
        }
        Snapshot { allocs: allocs.into_values().filter_map(Result::ok).collect(), problems }
    }
}
