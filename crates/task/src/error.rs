//! The one error type of wharf-task.

use std::path::PathBuf;

/// What can go wrong running a task or talking to its runner.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The operation needs a running task.
    #[error("task {task} is not running")]
    NotRunning {
        /// The task.
        task: String,
    },
    /// The driver refused or failed.
    #[error("task {task}: {source}")]
    Driver {
        /// The task.
        task: String,
        /// What the driver said.
        #[source]
        source: wharf_driver::DriverError,
    },
    /// The store failed.
    #[error("task {task}: {source}")]
    Store {
        /// The task.
        task: String,
        /// What the store said.
        #[source]
        source: wharf_store::StoreError,
    },
    /// The persisted local state could not be read.
    #[error("task {task}: its saved local state is unreadable: {reason}")]
    BadLocalState {
        /// The task.
        task: String,
        /// Why.
        reason: String,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A hook failed.
    #[error("hook {hook}: {reason}")]
    Hook {
        /// The hook.
        hook: String,
        /// Why.
        reason: String,
    },
}
