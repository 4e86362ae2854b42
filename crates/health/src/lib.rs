//! Service health on a wharf node: ports, checks, check_restart and allocation health, as
//! Nomad's client does them for its native services (`provider = "nomad"`).
//!
//! - [`ports`]: [`PortTable`], which allocation holds which port of the node; static ports
//!   checked for conflicts, dynamic ones from the node's range.
//! - [`check`]: a task's checks resolved against its allocation's ports ([`CheckPlan`]), the
//!   HTTP request an http check sends, and how answers and script exits are judged.
//! - [`transport`]: the checks' network I/O behind [`Transport`]; [`TcpTransport`] is a tiny
//!   HTTP/1.1 client on tokio's `TcpStream`, enough for a status line.
//! - [`runner`]: [`TaskChecks`], the loops that run one task's checks on their intervals with
//!   bounded timeouts, reaching the task (script checks, restarts) through [`TaskControl`].
//! - [`restart`]: [`RestartWatch`], check_restart as a pure decision: `limit` failing results
//!   in a row, after `grace`, restart the task once.
//! - [`tracker`]: [`HealthTracker`], allocation health as a pure decision: tasks running and
//!   checks passing for `min_healthy_time`, or unhealthy by `healthy_deadline`, with reasons.
//! - [`catalog`]: [`CheckBook`], an allocation's latest check results, and [`ServiceCatalog`],
//!   the node's services while their tasks run.
//!
//! Neighbours: wharf-alloc runs the checks and the tracker beside its alloc runner (its
//! health hook and service hook), and restarts tasks through their task runners; the node
//! agent owns the port table and the catalog and shows them in its API. This crate knows
//! nothing of the store or of processes, and no HTTP library: its network I/O sits behind
//! [`Transport`] and its time comes from tokio, so every rule is tested under a paused clock
//! with `fake::FakeTransport` and `fake::FakeControl` (feature `fake`).

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
pub use tracker::{HealthTracker, Progress, Snapshot, TaskView, Verdict};
pub use transport::{TcpTransport, Transport};
