//! [`Ledger`]: keyed records in one redb file, owned by one writer at a time through terms.
//!
//! For state that one process decides and must not lose, such as a fleet's queue and
//! placements. A writer first takes a term ([`Ledger::take_term`]), which outdates every term
//! before it; each write names the term it was made under, and a write under an outdated term
//! is refused ([`StoreError::Fenced`]) and changes nothing. The file's own lock already keeps a
//! second process out; terms also fence a writer within the process that was replaced (a
//! scheduler that lost its place), the same rule a distributed store enforces with its leases.
//!
//! Layout (schema [`LEDGER_SCHEMA_VERSION`]):
//!
//! ```text
//! meta     "schema_version" -> u64, "term" -> u64
//! records  <key>            -> opaque bytes
//! ```
//!
//! Writes go to the file's [`GroupWriter`] thread, which takes every request waiting, applies
//! those whose term holds in one transaction, commits once with immediate durability and
//! answers each: a burst of writes shares one fsync, and a write returns only once it is
//! durable. Reads run on tokio's blocking pool.

use crate::error::StoreError;
use crate::redb_store::{StoreOptions, open_file};
use crate::writer::GroupWriter;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::oneshot;

/// The schema this build reads and writes.
pub const LEDGER_SCHEMA_VERSION: u64 = 1;

const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const RECORDS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("records");
const SCHEMA_KEY: &str = "schema_version";
const TERM_KEY: &str = "term";

/// A change to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerChange {
    /// Store `value` under `key`, replacing what was there.
    Put {
        /// The key.
        key: String,
        /// The value, opaque to the ledger.
        value: Vec<u8>,
    },
    /// Remove the record under `key` (nothing if there is none).
    Delete {
        /// The key.
        key: String,
    },
}

enum Request {
    TakeTerm(oneshot::Sender<Result<u64, String>>),
    Write { term: u64, changes: Vec<LedgerChange>, reply: oneshot::Sender<Result<(), Refusal>> },
}

/// Why the writer did not apply a write.
enum Refusal {
    Fenced { current: u64 },
    Failed(String),
}

/// Keyed records in one redb file, written under terms. Clones share the file and the writer
/// thread, which stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    db: Arc<Database>,
    writer: GroupWriter<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Request::TakeTerm(_) => "TakeTerm",
            Request::Write { .. } => "Write",
        })
    }
}

impl Ledger {
    /// Opens the ledger at `path`, creating it (mode 0600) if it does not exist. A file held
    /// by another process, a damaged file or one of a newer schema is refused.
    pub fn open(path: impl Into<PathBuf>) -> Result<Ledger, StoreError> {
        let path = path.into();
        let db = open_file(&path, &StoreOptions::default())?;
        check_schema(&path, &db)?;
        let db = Arc::new(db);
        let writer = {
            let (db, writer_path) = (db.clone(), path.clone());
            GroupWriter::spawn("wharf-ledger-writer", usize::MAX, move |group| {
                commit_group(&db, &writer_path, group)
            })
            .map_err(|source| StoreError::Open { path: path.clone(), source })?
        };
        Ok(Ledger { inner: Arc::new(Inner { path, db, writer }) })
    }

    /// The file it writes.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Takes a new term, durably: every write under an earlier term is refused from now on.
    pub async fn take_term(&self) -> Result<u64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::TakeTerm(reply))?;
        answer.await.map_err(|_| StoreError::Closed)?.map_err(|e| self.storage("commit", e))
    }

    /// The term writes must name now.
    pub async fn term(&self) -> Result<u64, StoreError> {
        self.read(|db, path| {
            let txn = db.begin_read().map_err(|e| storage_error(path, "read", e.into()))?;
            let meta = txn.open_table(META).map_err(|e| storage_error(path, "read", e.into()))?;
            let term = meta.get(TERM_KEY).map_err(|e| storage_error(path, "read", e.into()))?;
            Ok(term.map_or(0, |v| v.value()))
        })
        .await
    }

    /// Applies `changes` atomically if `term` is still the ledger's term; returns once they are
    /// durable. Under an outdated term nothing changes and the answer is
    /// [`StoreError::Fenced`].
    pub async fn write(&self, term: u64, changes: Vec<LedgerChange>) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Write { term, changes, reply })?;
        match answer.await.map_err(|_| StoreError::Closed)? {
            Ok(()) => Ok(()),
            Err(Refusal::Fenced { current }) => Err(StoreError::Fenced {
                store: self.inner.path.display().to_string(),
                term,
                current,
            }),
            Err(Refusal::Failed(e)) => Err(self.storage("commit", e)),
        }
    }

    /// The record under `key`.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_owned();
        self.read(move |db, path| {
            let txn = db.begin_read().map_err(|e| storage_error(path, "read", e.into()))?;
            let table =
                txn.open_table(RECORDS).map_err(|e| storage_error(path, "read", e.into()))?;
            let value =
                table.get(key.as_str()).map_err(|e| storage_error(path, "read", e.into()))?;
            Ok(value.map(|v| v.value().to_vec()))
        })
        .await
    }

    /// Every record, by key.
    pub async fn scan(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|db, path| {
            let read = |e: redb::Error| storage_error(path, "read", e);
            let txn = db.begin_read().map_err(|e| read(e.into()))?;
            let table = txn.open_table(RECORDS).map_err(|e| read(e.into()))?;
            let mut rows = Vec::new();
            for entry in table.iter().map_err(|e| read(e.into()))? {
                let (key, value) = entry.map_err(|e| read(e.into()))?;
                rows.push((key.value().to_owned(), value.value().to_vec()));
            }
            Ok(rows)
        })
        .await
    }

    fn send(&self, request: Request) -> Result<(), StoreError> {
        self.inner.writer.send(request).map_err(|_| StoreError::Closed)
    }

    fn storage(&self, operation: &'static str, message: String) -> StoreError {
        StoreError::Storage { path: self.inner.path.clone(), operation, source: message.into() }
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

fn storage_error(path: &Path, operation: &'static str, source: redb::Error) -> StoreError {
    StoreError::Storage { path: path.to_owned(), operation, source: source.into() }
}

fn check_schema(path: &Path, db: &Database) -> Result<(), StoreError> {
    let storage = |e: redb::Error| storage_error(path, "schema check", e);
    let txn = db.begin_write().map_err(|e| storage(e.into()))?;
    let tables: Vec<String> =
        txn.list_tables().map_err(|e| storage(e.into()))?.map(|t| t.name().to_owned()).collect();
    if tables.is_empty() {
        txn.open_table(RECORDS).map_err(|e| storage(e.into()))?;
        let mut meta = txn.open_table(META).map_err(|e| storage(e.into()))?;
        meta.insert(SCHEMA_KEY, LEDGER_SCHEMA_VERSION).map_err(|e| storage(e.into()))?;
        meta.insert(TERM_KEY, 0).map_err(|e| storage(e.into()))?;
        drop(meta);
        return txn.commit().map_err(|e| storage(e.into()));
    }
    let corrupt =
        |detail: &str| StoreError::Corrupt { path: path.to_owned(), detail: detail.into() };
    if !tables.iter().any(|t| t == META.name()) || !tables.iter().any(|t| t == RECORDS.name()) {
        return Err(corrupt("it is not a ledger: its meta or records table is missing"));
    }
    let meta = txn.open_table(META).map_err(|e| storage(e.into()))?;
    let found = meta.get(SCHEMA_KEY).map_err(|e| storage(e.into()))?.map(|v| v.value());
    match found {
        Some(LEDGER_SCHEMA_VERSION) => Ok(()),
        Some(found) if found > LEDGER_SCHEMA_VERSION => Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            supported: LEDGER_SCHEMA_VERSION,
        }),
        Some(found) => Err(corrupt(&format!("unknown ledger schema version {found}"))),
        None => Err(corrupt("the meta table has no schema version")),
    }
}

/// Commits one group and answers each request: a term taken, a write applied or fenced, or
/// the commit's failure.
fn commit_group(db: &Database, path: &Path, group: Vec<Request>) {
    match commit(db, &group) {
        Ok(answers) => {
            for (request, answer) in group.into_iter().zip(answers) {
                // A caller that stopped waiting does not care about the answer.
                match (request, answer) {
                    (Request::TakeTerm(reply), Answer::Term(term)) => {
                        let _ = reply.send(Ok(term));
                    }
                    (Request::Write { reply, .. }, Answer::Fenced { current }) => {
                        let _ = reply.send(Err(Refusal::Fenced { current }));
                    }
                    (Request::Write { reply, .. }, _) => {
                        let _ = reply.send(Ok(()));
                    }
                    (Request::TakeTerm(reply), _) => {
                        let _ = reply.send(Err("no term was taken".into()));
                    }
                }
            }
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, writes = group.len(), "ledger commit failed");
            for request in group {
                match request {
                    Request::TakeTerm(reply) => {
                        let _ = reply.send(Err(e.to_string()));
                    }
                    Request::Write { reply, .. } => {
                        let _ = reply.send(Err(Refusal::Failed(e.to_string())));
                    }
                }
            }
        }
    }
}

/// What the writer answers one request of a committed group.
enum Answer {
    Term(u64),
    Written,
    Fenced { current: u64 },
}

/// Applies a group in order in one transaction: a term taken in the group outdates the writes
/// after it.
fn commit(db: &Database, group: &[Request]) -> Result<Vec<Answer>, redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let mut answers = Vec::with_capacity(group.len());
    {
        let mut meta = txn.open_table(META)?;
        let mut records = txn.open_table(RECORDS)?;
        let before = meta.get(TERM_KEY)?.map_or(0, |v| v.value());
        let mut term = before;
        for request in group {
            match request {
                Request::TakeTerm(_) => {
                    term += 1;
                    answers.push(Answer::Term(term));
                }
                Request::Write { term: given, .. } if *given != term => {
                    answers.push(Answer::Fenced { current: term });
                }
                Request::Write { changes, .. } => {
                    for change in changes {
                        match change {
                            LedgerChange::Put { key, value } => {
                                records.insert(key.as_str(), value.as_slice())?;
                            }
                            LedgerChange::Delete { key } => {
                                records.remove(key.as_str())?;
                            }
                        }
                    }
                    answers.push(Answer::Written);
                }
            }
        }
        if term != before {
            meta.insert(TERM_KEY, term)?;
        }
    }
    txn.commit()?;
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> LedgerChange {
        LedgerChange::Put { key: key.into(), value: value.as_bytes().to_vec() }
    }

    /// A term outdates the ones before it: their writes are refused and change nothing, the
    /// current term's apply; terms and records outlive the process's handle.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_later_term_fences_the_earlier_ones_and_both_outlive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.redb");
        let ledger = Ledger::open(&path).unwrap();
        assert_eq!(ledger.term().await.unwrap(), 0);
        let first = ledger.take_term().await.unwrap();
        ledger.write(first, vec![put("a", "1"), put("b", "1")]).await.unwrap();
        let second = ledger.take_term().await.unwrap();
        assert!(second > first);
        let refused = ledger.write(first, vec![put("a", "late"), put("c", "late")]).await;
        assert!(
            matches!(refused, Err(StoreError::Fenced { term, current, .. }) if term == first && current == second),
            "{refused:?}"
        );
        let changes = vec![put("a", "2"), LedgerChange::Delete { key: "b".into() }];
        ledger.write(second, changes).await.unwrap();
        drop(ledger);

        let ledger = Ledger::open(&path).unwrap();
        assert_eq!(ledger.term().await.unwrap(), second);
        let rows = ledger.scan().await.unwrap();
        assert_eq!(rows, [("a".to_owned(), b"2".to_vec())]);
        assert_eq!(ledger.get("b").await.unwrap(), None);
        // A second handle in another process would be refused: the file is locked.
        assert!(matches!(Ledger::open(&path), Err(StoreError::Locked { .. })));
    }

    /// Writes waiting together share one commit, in order: a term taken among them outdates
    /// the writes after it in the same commit, not those before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_term_taken_inside_a_group_fences_only_the_writes_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path().join("fleet.redb")).unwrap();
        let term = ledger.take_term().await.unwrap();
        let (before, before_answer) = oneshot::channel();
        let (take, taken) = oneshot::channel();
        let (after, after_answer) = oneshot::channel();
        let group = [
            Request::Write { term, changes: vec![put("before", "1")], reply: before },
            Request::TakeTerm(take),
            Request::Write { term, changes: vec![put("after", "1")], reply: after },
        ];
        let answers = commit(&ledger.inner.db, &group).unwrap();
        assert!(
            matches!(answers[..], [Answer::Written, Answer::Term(n), Answer::Fenced { current }] if n == term + 1 && current == term + 1)
        );
        drop((group, before_answer, taken, after_answer));
        let keys: Vec<String> = ledger.scan().await.unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["before"]);
        assert_eq!(ledger.term().await.unwrap(), term + 1);
    }
}
