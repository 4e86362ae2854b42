//! The crate's one error type.

use std::path::PathBuf;

/// Why containment could not be set up, inspected or torn down.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IsolateError {
    /// A file of the kernel's interface (a cgroup file, a `/proc` entry) could not be used.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The call.
        call: &'static str,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The kernel lacks a feature containment needs.
    #[error("{feature} is not available: {reason}")]
    Unsupported {
        /// The feature: `landlock`, `namespaces`.
        feature: &'static str,
        /// Why, and what would provide it.
        reason: String,
    },
    /// An `unveil` entry cannot be used.
    #[error("unveil entry {entry:?}: {reason}")]
    Unveil {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A workload-user range cannot be used.
    #[error("workload users {min}-{max}: {reason}")]
    BadRange {
        /// The lowest id.
        min: u32,
        /// The highest id.
        max: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// The workload-user journal holds something it should not, or a lease was refused.
    #[error("{path}:{line}: {reason}")]
    Journal {
        /// The journal file.
        path: PathBuf,
        /// The line (1 is the first; 0 when no line is concerned).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Every workload user of the range is leased.
    #[error(
        "every workload user from {min} to {max} is taken ({leased} leases, each held by a \
         task directory that still exists or a process that still runs); widen the range or \
         collect finished allocations"
    )]
    UsersExhausted {
        /// The lowest id.
        min: u32,
        /// The highest id.
        max: u32,
        /// Leases in the journal.
        leased: usize,
    },
}
