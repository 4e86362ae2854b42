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
}
