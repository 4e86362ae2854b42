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
    /// The task's directories could not be made or changed: an error of the file system, or a
    /// link where one of them should be, which root does not follow (the task may have put
    /// it there to aim root's changes at another file).
    #[error("the task's directories: {source}")]
    Dirs {
        /// Why.
        #[source]
        source: wharf_isolate::IsolateError,
    },
    /// A template could not be rendered, written or read back.
    #[error("{message}")]
    Template {
        /// What went wrong, naming the template.
        message: String,
    },
    /// A hook failed.
    #[error("hook {hook}: {reason}")]
    Hook {
        /// The hook.
        hook: String,
        /// Why.
        reason: String,
    },
    /// A prestart hook failed, and says which event records it (such as "Failed Artifact
    /// Download") in place of the generic "Task Hook Failed".
    #[error("hook {hook}: {event}")]
    HookEvent {
        /// The hook.
        hook: String,
        /// The event to record.
        event: wharf_state::TaskEventKind,
    },
}
