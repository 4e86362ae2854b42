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
//! - [`placement`]: best fit on CPU and memory over the workers that take work, with the
//!   reason work fits nowhere; pure.
//! - [`reschedule`]: when lost or failed work is placed again, as pure functions of its
//!   policy (wharf-state's [`ReschedulePolicy`](wharf_state::ReschedulePolicy)) and history.
//! - [`store`]: [`FleetStore`], where the records live and who may write them, with its
//!   backends.
//! - [`replica`]: the [`ReplicaLoop`]: a replica campaigns in the store, leads (runs a
//!   [`Leading`]: the pool and the scheduler under its term) until the term is lost, then
//!   follows and campaigns again.
//!
//! Its neighbours: wharf-prober's [`Pool`](wharf_prober::Pool) owns the workers (their state
//! machines, probes, creates and destroys) and knows nothing of scheduling; wharf-node wires a
//! fleet to the `wharf` binary and serves its API. Time comes from the pool's injected
//! [`Clock`](wharf_prober::Clock), commands go through the pool, and the crate prints nothing
//! (it logs with `tracing`, with a `work` field). The records themselves ([`Placement`],
//! [`WorkRecord`]) are wharf-state's, so other tools read them without this crate.

mod error;
pub mod placement;
pub mod replica;
pub mod reschedule;
pub mod scheduler;
pub mod store;

pub use error::FleetError;
pub use replica::{FirstLead, LeadError, Leading, ReplicaLoop};
pub use scheduler::{Scheduler, SchedulerConfig, Submission};
#[cfg(feature = "redb")]
pub use store::LedgerStore;
#[cfg(feature = "etcd")]
pub use store::etcd::{EtcdConfig, EtcdStore};
pub use store::{
    Change, Entry, EntryKind, FleetStore, Loaded, MAX_CHANGES_PER_COMMIT, MemoryStore, Replica,
    StoreInfo, Term,
};
pub use wharf_state::fleet::{
    Attempt, Placement, RescheduleEvent, WorkPhase, WorkPhaseName, WorkRecord,
};

/// The attribute that implementations of [`FleetStore`] put on their `impl` block.
pub use async_trait::async_trait;
/// The prober this crate places work through, in the version it was built with.
pub use wharf_prober as prober;
/// The state model of its records, in the version it was built with.
pub use wharf_state as state;

#[cfg(test)]
mod scheduler_tests;
