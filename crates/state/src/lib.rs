//! The wharf state model: what a user asks to run and what the node knows about it.
//!
//! This crate is plain data plus pure functions. It does no I/O, reads no clock (callers pass
//! [`Timestamp`]s in) and knows nothing of tokio, redb or processes: the store persists these
//! types, the task and alloc runners change them, the API shows them.
//!
//! - [`spec`]: jobs, task groups and tasks; parsing and validating job spec files.
//! - [`alloc`]: allocations, their client status and how it is derived from task states.
//! - [`task_state`]: a task's state and its typed event history.
//! - [`resources`]: what an allocation needs of a node, and whether it fits (admission).
//! - [`duration`], [`signal`], [`time`]: the small value types the others are written in.
//!
//! Every type that derives serde is a compatibility boundary: it is written to the store and
//! sent over the API. Such records are stamped with [`FORMAT_VERSION`] by whoever writes them,
//! and a change to their shape bumps it.

pub mod alloc;
pub mod duration;
pub mod resources;
pub mod signal;
pub mod spec;
pub mod task_state;
pub mod time;

pub use alloc::{
    AllocState, Allocation, ClientStatus, DeploymentStatus, DesiredStatus, InvalidAllocId,
    check_alloc_id, client_status,
};
pub use signal::Signal;
pub use spec::{
    Job, JobType, Lifecycle, LifecycleHook, RestartMode, RestartPolicy, SpecError, Stage, Task,
    TaskGroup,
};
pub use task_state::{TaskEvent, TaskEventKind, TaskState, TaskStatus};
pub use time::Timestamp;

/// The version of the serialised form of this crate's types.
///
/// 2: a task's `resources` write `memory` (read also as `memory_mb`), `memory_max` and `cores`.
pub const FORMAT_VERSION: u16 = 2;
