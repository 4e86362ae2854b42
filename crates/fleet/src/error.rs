//! The one error type of wharf-fleet.

use wharf_prober::ProberError;

/// Everything that can go wrong placing and following work.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// No work with this id.
    #[error("no work {0:?}")]
    UnknownWork(String),
    /// Work cannot be submitted as asked.
    #[error("cannot submit {id:?}: {reason}")]
    Submit {
        /// The work's id.
        id: String,
        /// Why not: a duplicate id, an id the runner-list grammar cannot carry.
        reason: String,
    },
    /// The queue holds as much as it may; the submission was not taken.
    #[error("cannot submit {id:?}: the queue is full ({limit} waiting)")]
    QueueFull {
        /// The work's id.
        id: String,
        /// The configured limit.
        limit: usize,
    },
    /// The pool refused or failed.
    #[error(transparent)]
    Prober(#[from] ProberError),
    /// The store failed (it cannot be reached, a record cannot be written or read).
    #[error("fleet store {operation} failed: {detail}")]
    Store {
        /// What was being done.
        operation: &'static str,
        /// Why.
        detail: String,
    },
    /// A write under a term that is over: another replica leads, or this one's lease lapsed.
    /// Nothing was written.
    #[error("the write under term {term} is refused: {detail}")]
    Fenced {
        /// The term the write named.
        term: u64,
        /// Why it is over.
        detail: String,
    },
    /// This scheduler does not lead (any more); ask the leader.
    #[error("this fleet replica does not lead: {detail}")]
    NotLeading {
        /// Why.
        detail: String,
    },
}
