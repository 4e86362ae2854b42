//! The redb-backed [`StateStore`]: one file, one writer thread, group commit.
//!
//! Layout (schema version [`SCHEMA_VERSION`]):
//!
//! ```text
//! meta          "schema_version" -> u64
//! allocs        <alloc_id>        -> Allocation
//! deployments   <alloc_id>        -> DeploymentStatus
//! task_states   <alloc_id>/<task> -> TaskState
//! task_local    <alloc_id>/<task> -> opaque bytes (driver handle, hook state)
//! ```
//!
//! Every value carries its format version (see `record`). Schema 0, the layout before
//! versioning (no `meta`, bare JSON values, no deployment or local-state tables), is upgraded
//! on open after a backup copy of the file is written beside it.
//!
//! Writes go to the file's [`GroupWriter`] thread, which takes every request waiting, applies
//! them in one transaction and commits once with `Durability::Immediate`, then answers each
//! caller. Under load many writes share one fsync; a lone write is committed at once.

use crate::error::StoreError;
use crate::writer::GroupWriter;
use crate::{Op, RawRecords, Snapshot, StateStore, StoredAlloc, Table, WriteBatch, record};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::oneshot;

/// The newest schema this build reads and the one it writes.
pub const SCHEMA_VERSION: u64 = 1;

const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const SCHEMA_KEY: &str = "schema_version";
const ALLOCS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("allocs");
const DEPLOYMENTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("deployments");
const TASK_STATES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("task_states");
const TASK_LOCAL: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("task_local");

fn definition(table: Table) -> TableDefinition<'static, &'static str, &'static [u8]> {
    match table {
        Table::Allocs => ALLOCS,
        Table::Deployments => DEPLOYMENTS,
        Table::TaskStates => TASK_STATES,
        Table::TaskLocal => TASK_LOCAL,
    }
}

/// Tuning for [`RedbStore`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The most write requests one commit takes. 1 gives one commit (one fsync) per write,
    /// the naive baseline the benchmark compares against.
    pub max_writes_per_commit: usize,
    /// The engine's page cache, in bytes. Default: 1 MiB. The store is read in full only when
    /// the agent starts, and a write's pages missing from the cache are a read from the
    /// kernel's page cache away, so a larger cache mostly holds a private copy of the file
    /// (about 4 KiB per allocation) in the agent's heap: with 1,000 allocations, 2 MiB cost
    /// the agent 1 KiB more per allocation, and read 10,000 records at start about 7% faster
    /// (570 ms against 615).
    pub cache_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { max_writes_per_commit: 4096, cache_bytes: 1 << 20 }
    }
}

/// Counters of what the writer did, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Commits made.
    pub commits: u64,
    /// Write requests committed.
    pub writes: u64,
    /// Total time spent committing, in microseconds.
    pub commit_micros: u64,
}

/// A [`StateStore`] in one redb file. Clones share the file and the writer thread, which
/// stops (after finishing what it was given) when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    db: Arc<Database>,
    writer: GroupWriter<Request>,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
    commit_micros: AtomicU64,
    /// Why the last commit failed, until one succeeds again.
    failing: parking_lot::Mutex<Option<String>>,
}

#[derive(Debug)]
struct Request {
    ops: Vec<Op>,
    reply: oneshot::Sender<Result<(), String>>,
}

impl RedbStore {
    /// Opens the store at `path`, creating it (mode 0600) if it does not exist, and upgrading
    /// an older schema.
    pub fn open(path: impl Into<PathBuf>) -> Result<RedbStore, StoreError> {
        RedbStore::open_with(path, StoreOptions::default())
    }

    /// [`RedbStore::open`] with tuning.
    pub fn open_with(
        path: impl Into<PathBuf>,
        options: StoreOptions,
    ) -> Result<RedbStore, StoreError> {
        let path = path.into();
        let mut db = open_file(&path, &options)?;
        if let Schema::Older(from) = check_schema(&path, &db)? {
            // Copy a cleanly closed file, so the backup opens on its own.
            drop(db);
            let copy = backup_path(&path, from);
            std::fs::copy(&path, &copy)
                .and_then(|_| std::fs::File::open(&copy)?.sync_all())
                .map_err(|e| StoreError::Migration {
                    path: path.clone(),
                    from,
                    source: format!("cannot write the backup {}: {e}", copy.display()).into(),
                })?;
            tracing::info!(path = %path.display(), backup = %copy.display(), from, to = SCHEMA_VERSION, "upgrading the state store");
            db = open_file(&path, &options)?;
            upgrade(&path, &db, from)?;
        }
        RedbStore::start(path, db, &options)
    }

    /// Opens a store over any redb backend, upgrading an older schema in place (no backup).
    pub(crate) fn open_backend(
        path: PathBuf,
        backend: impl redb::StorageBackend,
        options: &StoreOptions,
    ) -> Result<RedbStore, StoreError> {
        let db = redb::Builder::new()
            .set_cache_size(options.cache_bytes)
            .create_with_backend(backend)
            .map_err(|e| open_error(&path, e))?;
        if let Schema::Older(from) = check_schema(&path, &db)? {
            upgrade(&path, &db, from)?;
        }
        RedbStore::start(path, db, options)
    }

    fn start(path: PathBuf, db: Database, options: &StoreOptions) -> Result<RedbStore, StoreError> {
        let db = Arc::new(db);
        let counters = Arc::new(Counters::default());
        let writer = {
            let (db, writer_path, counters) = (db.clone(), path.clone(), counters.clone());
            GroupWriter::spawn("wharf-store-writer", options.max_writes_per_commit, move |group| {
                commit_group(&db, &writer_path, group, &counters)
            })
            .map_err(|source| StoreError::Open { path: path.clone(), source })?
        };
        let inner = Inner { path, db, writer, counters };
        Ok(RedbStore { inner: Arc::new(inner) })
    }

    /// The file this store writes.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> StoreStats {
        let c = &self.inner.counters;
        StoreStats {
            commits: c.commits.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            commit_micros: c.commit_micros.load(Ordering::Relaxed),
        }
    }

    /// Why the last commit failed, if it did and none has succeeded since: the store cannot
    /// persist, and a node should not take work.
    pub fn failing(&self) -> Option<String> {
        self.inner.counters.failing.lock().clone()
    }

    /// [`StateStore::write`] for callers outside an async runtime. Blocks until durable.
    pub fn write_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let reply = self.submit(batch)?;
        reply.blocking_recv().map_err(|_| StoreError::Closed)?.map_err(|e| self.write_error(e))
    }

    /// Everything stored, for callers outside an async runtime.
    pub fn load_all_blocking(&self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot::assemble(read_raw(&self.inner.db, &self.inner.path, None)?))
    }

    fn submit(
        &self,
        batch: WriteBatch,
    ) -> Result<oneshot::Receiver<Result<(), String>>, StoreError> {
        let (reply, receiver) = oneshot::channel();
        self.inner
            .writer
            .send(Request { ops: batch.ops, reply })
            .map_err(|_| StoreError::Closed)?;
        Ok(receiver)
    }

    fn write_error(&self, message: String) -> StoreError {
        StoreError::Storage {
            path: self.inner.path.clone(),
            operation: "commit",
            source: message.into(),
        }
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database, &Path) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner.db, &inner.path))
            .await
            .map_err(|_| StoreError::Closed)?
    }
}

#[async_trait::async_trait]
impl StateStore for RedbStore {
    async fn write(&self, batch: WriteBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let reply = self.submit(batch)?;
        reply.await.map_err(|_| StoreError::Closed)?.map_err(|e| self.write_error(e))
    }

    async fn load_alloc(&self, alloc_id: &str) -> Result<Option<StoredAlloc>, StoreError> {
        let alloc_id = alloc_id.to_owned();
        let raw = self.read(move |db, path| read_raw(db, path, Some(&alloc_id))).await?;
        Ok(Snapshot::assemble(raw).allocs.into_iter().next())
    }

    async fn load_all(&self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot::assemble(self.read(|db, path| read_raw(db, path, None)).await?))
    }
}

/// Commits one group of writes and answers each: all of them durable, or all failed.
fn commit_group(db: &Database, path: &Path, group: Vec<Request>, counters: &Counters) {
    #[allow(clippy::disallowed_methods)] // Commit latency is a measurement, not logic.
    let started = std::time::Instant::now();
    let result = commit(db, group.iter().flat_map(|r| &r.ops)).map_err(|e| {
        tracing::error!(path = %path.display(), error = %e, writes = group.len(), "state store commit failed");
        e.to_string()
    });
    counters.commit_micros.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    *counters.failing.lock() = result.as_ref().err().cloned();
    counters.commits.fetch_add(1, Ordering::Relaxed);
    counters.writes.fetch_add(group.len() as u64, Ordering::Relaxed);
    for request in group {
        // A caller that stopped waiting does not care about the answer.
        let _ = request.reply.send(result.clone());
    }
}

fn commit<'a>(db: &Database, ops: impl Iterator<Item = &'a Op>) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut allocs = txn.open_table(ALLOCS)?;
        let mut deployments = txn.open_table(DEPLOYMENTS)?;
        let mut task_states = txn.open_table(TASK_STATES)?;
        let mut task_local = txn.open_table(TASK_LOCAL)?;
        for op in ops {
            match op {
                Op::Put { table, key, value } => {
                    let table = match table {
                        Table::Allocs => &mut allocs,
                        Table::Deployments => &mut deployments,
                        Table::TaskStates => &mut task_states,
                        Table::TaskLocal => &mut task_local,
                    };
                    table.insert(key.as_str(), value.as_slice())?;
                }
                Op::DeleteAlloc { alloc_id } => {
                    allocs.remove(alloc_id.as_str())?;
                    deployments.remove(alloc_id.as_str())?;
                    let (lo, hi) = record::task_range(alloc_id);
                    task_states.retain_in(lo.as_str()..hi.as_str(), |_, _| false)?;
                    task_local.retain_in(lo.as_str()..hi.as_str(), |_, _| false)?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

/// Reads every record, or only those of `only_alloc`.
fn read_raw(
    db: &Database,
    path: &Path,
    only_alloc: Option<&str>,
) -> Result<RawRecords, StoreError> {
    let storage = |source: redb::Error| StoreError::Storage {
        path: path.to_owned(),
        operation: "read",
        source: source.into(),
    };
    let txn = db.begin_read().map_err(|e| storage(e.into()))?;
    let mut raw = RawRecords::default();
    for (table, rows) in [
        (Table::Allocs, &mut raw.allocs),
        (Table::Deployments, &mut raw.deployments),
        (Table::TaskStates, &mut raw.task_states),
        (Table::TaskLocal, &mut raw.task_local),
    ] {
        let handle = txn.open_table(definition(table)).map_err(|e| storage(e.into()))?;
        let range = match (only_alloc, table) {
            (None, _) => handle.range::<&str>(..),
            (Some(id), Table::Allocs | Table::Deployments) => handle.range(id..=id),
            (Some(id), Table::TaskStates | Table::TaskLocal) => {
                let (lo, hi) = record::task_range(id);
                handle.range(lo.as_str()..hi.as_str())
            }
        }
        .map_err(|e| storage(e.into()))?;
        for entry in range {
            let (key, value) = entry.map_err(|e| storage(e.into()))?;
            rows.insert(key.value().to_owned(), value.value().to_vec());
        }
    }
    Ok(raw)
}

/// Opens (creating with mode 0600) the redb file at `path`; one another process holds is refused
/// as [`StoreError::Locked`].
pub(crate) fn open_file(path: &Path, options: &StoreOptions) -> Result<Database, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| StoreError::Open { path: path.to_owned(), source })?;
    let backend = redb::backends::FileBackend::new(file).map_err(|e| open_error(path, e))?;
    redb::Builder::new()
        .set_cache_size(options.cache_bytes)
        .create_with_backend(backend)
        .map_err(|e| open_error(path, e))
}

enum Schema {
    Current,
    Older(u64),
}

/// Creates the tables of a new file and reads the schema version of an existing one. Writes
/// nothing to a file it refuses.
fn check_schema(path: &Path, db: &Database) -> Result<Schema, StoreError> {
    let storage = |source: redb::Error| StoreError::Storage {
        path: path.to_owned(),
        operation: "schema check",
        source: source.into(),
    };
    let txn = db.begin_write().map_err(|e| storage(e.into()))?;
    let tables: Vec<String> =
        txn.list_tables().map_err(|e| storage(e.into()))?.map(|t| t.name().to_owned()).collect();
    let version = if tables.iter().any(|t| t == META.name()) {
        let meta = txn.open_table(META).map_err(|e| storage(e.into()))?;
        let version = meta.get(SCHEMA_KEY).map_err(|e| storage(e.into()))?.map(|v| v.value());
        Some(version.ok_or_else(|| StoreError::Corrupt {
            path: path.to_owned(),
            detail: "the meta table has no schema version".into(),
        })?)
    } else if tables.is_empty() {
        None
    } else {
        Some(0)
    };
    match version {
        Some(SCHEMA_VERSION) => Ok(Schema::Current),
        Some(found) if found > SCHEMA_VERSION => {
            Err(StoreError::NewerSchema { path: path.to_owned(), found, supported: SCHEMA_VERSION })
        }
        Some(from) => Ok(Schema::Older(from)),
        None => {
            create_tables(&txn).map_err(storage)?;
            txn.commit().map_err(|e| storage(e.into()))?;
            Ok(Schema::Current)
        }
    }
}

/// Upgrades the schema from `from` to [`SCHEMA_VERSION`] in one transaction.
fn upgrade(path: &Path, db: &Database, from: u64) -> Result<(), StoreError> {
    let migration = |source: redb::Error| StoreError::Migration {
        path: path.to_owned(),
        from,
        source: source.into(),
    };
    let txn = db.begin_write().map_err(|e| migration(e.into()))?;
    migrate_from_v0(&txn).map_err(migration)?;
    txn.commit().map_err(|e| migration(e.into()))
}

/// Where the copy made before upgrading from `from` goes.
pub(crate) fn backup_path(path: &Path, from: u64) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".v{from}.backup"));
    path.with_file_name(name)
}

fn create_tables(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    for table in [ALLOCS, DEPLOYMENTS, TASK_STATES, TASK_LOCAL] {
        txn.open_table(table)?;
    }
    txn.open_table(META)?.insert(SCHEMA_KEY, SCHEMA_VERSION)?;
    Ok(())
}

/// Schema 0 kept `allocs` and `task_states` with bare JSON values. Stamp each value with the
/// format version (the bodies did not change) and add what schema 1 has beside them.
fn migrate_from_v0(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    for definition in [ALLOCS, TASK_STATES] {
        let mut table = txn.open_table(definition)?;
        let rows: Vec<(String, Vec<u8>)> = table
            .iter()?
            .map(|entry| entry.map(|(k, v)| (k.value().to_owned(), v.value().to_vec())))
            .collect::<Result<_, _>>()?;
        for (key, body) in rows {
            table.insert(key.as_str(), record::stamp(&body).as_slice())?;
        }
    }
    create_tables(txn)
}

fn open_error(path: &Path, error: impl Into<redb::Error>) -> StoreError {
    let path = path.to_owned();
    match error.into() {
        redb::Error::DatabaseAlreadyOpen => StoreError::Locked { path },
        redb::Error::Io(source)
            if matches!(
                source.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            StoreError::Corrupt { path, detail: source.to_string() }
        }
        redb::Error::Io(source) => StoreError::Open { path, source },
        redb::Error::Corrupted(detail) => StoreError::Corrupt { path, detail },
        redb::Error::UpgradeRequired(version) => StoreError::Corrupt {
            path,
            detail: format!("it is in storage format {version}, which this build cannot read"),
        },
        redb::Error::RepairAborted => {
            StoreError::Corrupt { path, detail: "repair was aborted".into() }
        }
        other => StoreError::Storage { path, operation: "open", source: other.into() },
    }
}
