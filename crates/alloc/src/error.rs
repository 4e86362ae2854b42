//! The one error type of wharf-alloc.

use wharf_task::TaskError;

/// What can go wrong building or driving an allocation.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The allocation names a group its job does not have.
    #[error(transparent)]
    MissingGroup(#[from] wharf_state::alloc::MissingGroup),
    /// A task names a driver this node does not have.
    #[error(
        "task {task} uses driver {driver:?}, which this node does not have (it has: {available})"
    )]
    UnknownDriver {
        /// The task.
        task: String,
        /// The driver it names.
        driver: String,
        /// The drivers there are.
        available: String,
    },
    /// No task of that name in the allocation.
    #[error("allocation {alloc_id} has no task {task:?}")]
    UnknownTask {
        /// The allocation.
        alloc_id: String,
        /// The name asked for.
        task: String,
    },
    /// One task's operation failed.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The same operation failed for several tasks; every failure is listed.
    #[error("{}", .0.iter().map(|(task, e)| format!("{task}: {e}")).collect::<Vec<_>>().join("; "))]
    Tasks(Vec<(String, TaskError)>),
    /// An alloc hook failed.
    #[error("alloc hook {hook}: {reason}")]
    Hook {
        /// The hook.
        hook: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] wharf_store::StoreError),
    /// An allocation-wide restart was asked for when the allocation cannot restart.
    #[error("allocation {alloc_id} cannot be restarted: {reason}")]
    NotRestartable {
        /// The allocation.
        alloc_id: String,
        /// Why not, such as "it is complete".
        reason: String,
    },
    /// A restored allocation's directory is gone, so it cannot run on this node again.
    #[error("the allocation directory {path} is missing")]
    AllocDirMissing {
        /// The directory.
        path: std::path::PathBuf,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
