//! OS containment for wharf's drivers: cgroups (v1 and v2), Landlock, workload users.
//!
//! A driver asks this crate for a contained place to run a task; it never writes cgroup files
//! or makes Landlock calls itself. Nothing here needs tokio, so the per-task shim can use it.
//! Which drivers contain what, and how, is described in `docs/ARCHITECTURE.md`.

mod error;

pub use error::IsolateError;
