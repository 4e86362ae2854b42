//! The one error type of wharf-store.

use std::path::PathBuf;

/// Boxed cause from the storage engine; its type is not part of this crate's API.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong persisting or loading state.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened or created.
    #[error("cannot open the state store {path}: {source}")]
    Open {
        /// The store file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the file.
    #[error(
        "the state store {path} is in use by another process; is another wharf agent or fleet running with this data dir?"
    )]
    Locked {
        /// The store file.
        path: PathBuf,
    },
    /// The file is not a readable store.
    #[error(
        "the state store {path} is damaged ({detail}); move it aside to start with an empty \
         store (tasks still running will then not be reattached) and keep the copy for diagnosis"
    )]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// What the storage engine reported.
        detail: String,
    },
    /// The file was written by a newer wharf.
    #[error(
        "the state store {path} has schema version {found}, newer than version {supported} that \
         this wharf understands; run a newer wharf, or move the file aside to start empty"
    )]
    NewerSchema {
        /// The store file.
        path: PathBuf,
        /// The version in the file.
        found: u64,
        /// The newest this build reads.
        supported: u64,
    },
    /// Upgrading an older schema failed; the file is unchanged and a backup is beside it.
    #[error("upgrading the state store {path} from schema version {from} failed: {source}")]
    Migration {
        /// The store file.
        path: PathBuf,
        /// The version in the file.
        from: u64,
        /// Why.
        #[source]
        source: Cause,
    },
    /// A read or write failed.
    #[error("state store {operation} failed on {path}: {source}")]
    Storage {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// Why.
        #[source]
        source: Cause,
    },
    /// A record could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// The record.
        what: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// An allocation id or task name that cannot be a key.
    #[error("invalid store key {0:?}: ids and task names must match [A-Za-z0-9_-]{{1,64}}")]
    InvalidKey(String),
    /// A variable that cannot be stored, with why.
    #[error("variable {path:?}: {reason}")]
    InvalidVariable {
        /// Its path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The store was closed, or its writer thread is gone.
    #[error("the state store is closed")]
    Closed,
    /// A write under a term that a later term replaced (see [`Ledger`](crate::Ledger)); nothing
    /// was written.
    #[error("{store}: the write under term {term} is refused, term {current} holds now")]
    Fenced {
        /// The store.
        store: String,
        /// The term the write named.
        term: u64,
        /// The term that holds.
        current: u64,
    },
}
