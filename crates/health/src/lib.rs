#![doc = include_str!("../README.md")]
//!
//! Modules: [`ports`] ([`PortTable`]), [`check`] (a task's checks as [`CheckPlan`]s, HTTP
//! requests, judging answers), [`transport`] ([`Transport`], [`TcpTransport`]), [`runner`]
//! ([`TaskChecks`], [`TaskControl`]), [`restart`] ([`RestartWatch`]), [`tracker`]
//! ([`HealthTracker`]) and [`catalog`] ([`CheckBook`], [`ServiceCatalog`]).
//!
//! Neighbours: wharf-alloc runs the checks and the tracker beside its alloc runner (its
//! health hook and service hook), and restarts tasks through their task runners; the node
//! agent owns the port table and the catalog and shows them in its API. This crate knows
//! nothing of the store or of processes: its network I/O sits behind [`Transport`], the task
//! behind [`TaskControl`], and its time comes from tokio, so every rule is tested under a
//! paused clock with `fake::FakeTransport` and `fake::FakeControl` (feature `fake`).

pub mod catalog;
pub mod check;
#[cfg(feature = "fake")]
pub mod fake;
pub mod ports;
pub mod restart;
pub mod runner;
pub mod tracker;
pub mod transport;

pub use catalog::{CheckBook, Registration, ServiceCatalog};
pub use check::{CheckId, CheckPlan, plans};
pub use ports::{PortError, PortTable};
pub use restart::RestartWatch;
pub use runner::{CheckIo, Now, TaskChecks, TaskControl};
pub use tracker::{CheckView, HealthTracker, Progress, Snapshot, TaskView, Verdict};
pub use transport::{TcpTransport, Transport};

/// The attribute that implementations of [`Transport`] and [`TaskControl`] put on their `impl`
/// block.
pub use wharf_driver::async_trait;

// The crates this one's API is written in, so that a user needs no other wharf dependency and
// gets the very versions this crate was built with.
pub use wharf_driver as driver;
pub use wharf_state as state;
