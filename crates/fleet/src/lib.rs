#![doc = include_str!("../README.md")]
//!
//! ## Inside
//!
//! wharf-fleet decides what a dispatcher must decide and must not lose: which worker runs which
//! work, what waits in the queue, and how work that ended or was lost is followed up.
//!
//! - [`scheduler`]: the [`Scheduler`]: places work on the pool's workers, queues it while none
//!   has room, and follows it through the run probes until it ends. Its placement decision is
//!   a pure function of its books and a snapshot of the pool.
//!
//! Its neighbours: wharf-prober's [`Pool`](wharf_prober::Pool) owns the workers (their state
//! machines, probes, creates and destroys) and knows nothing of scheduling; wharf-node wires a
//! fleet to the `wharf` binary and serves its API. Time comes from the pool's injected
//! [`Clock`](wharf_prober::Clock), commands go through the pool, and the crate prints nothing
//! (it logs with `tracing`, with a `work` field).

mod error;
pub mod scheduler;

pub use error::FleetError;
pub use scheduler::{Phase, Placement, Scheduler, SchedulerConfig};

#[cfg(test)]
mod scheduler_tests;
