#![doc = include_str!("../README.md")]
//!
//! Modules: [`spec`] (jobs, groups, tasks, parsing), [`alloc`] (allocations, the ports they
//! hold, client status), [`service`] (the group's ports, the tasks' services and checks, how
//! health is judged), [`health`] (check results and the node's catalog, as the API shows
//! them), [`task_state`] (a task's state and events), [`resources`] (what an
//! allocation needs of a node, and whether it fits), [`reschedule`] (a group's reschedule
//! policy), [`template`] (a task's template blocks), [`fleet`] (what a fleet keeps about each piece of work), and the value types
//! [`duration`], [`signal`] and [`time`]. What a user needs is re-exported here.

pub mod alloc;
pub mod artifact;
pub mod duration;
pub mod fleet;
pub mod health;
mod job_type;
mod lifetime;
mod problems;
pub mod readiness;
pub mod reschedule;
pub mod resources;
pub mod service;
pub mod signal;
pub mod spec;
pub mod task_state;
pub mod template;
pub mod time;
pub mod volume;

pub use alloc::{
    AllocState, AllocatedPort, Allocation, ClientStatus, DeploymentStatus, DesiredStatus,
    InvalidAllocId, check_alloc_id, client_status,
};
pub use artifact::{Artifact, ArtifactMode, ArtifactOptions, Checksum};
pub use health::{CheckResult, CheckState, CheckStatus, ServiceEntry};
pub use reschedule::{DelayFunction, RescheduleOverrides, ReschedulePolicy};
pub use service::{
    Check, CheckKind, CheckRestart, CheckRestartPolicy, HealthCheck, Network, OnUpdate, PortSpec,
    Service, UpdateStrategy,
};
pub use signal::Signal;
pub use spec::{
    Job, JobType, Lifecycle, LifecycleHook, Resources, RestartMode, RestartOverrides,
    RestartPolicy, SpecError, Stage, Task, TaskGroup, parse_json, parse_toml,
};
pub use task_state::{TaskEvent, TaskEventKind, TaskState, TaskStatus};
pub use template::{ChangeMode, ChangeScript, Template, TemplateWait};
pub use time::Timestamp;

/// The JSON crate of this crate's API (a task's driver `config` block is a JSON object), so
/// that callers build values with the same version: `wharf_state::serde_json::json!`.
pub use serde_json;

/// The version of the serialised form of this crate's types.
///
/// 2: a task's `resources` write `memory` (read also as `memory_mb`), `memory_max` and `cores`.
/// 3: specs have ports, services, checks and the update block; allocations the ports they
/// hold; a deployment status its reason; task events `alloc_unhealthy`.
/// 4: tasks have `template` blocks; task events `template`.
/// 5: groups have `max_run_duration` and `shutdown_delay`, tasks `shutdown_delay`; task events
/// `max_run_duration_exceeded`, `waiting_shutdown_delay` and `artifact_download_failed`; tasks
/// `artifact` blocks; groups `volume`, tasks `volume_mount`.
/// 6: tasks have `wait_healthy` and `wait_deadline`.
/// 7: tasks have `wait_ready` and `notify_socket`; task states `ready_at`.
pub const FORMAT_VERSION: u16 = 7;
