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
    /// Root met a symbolic link, or something else than a directory, where it works in a
    /// directory a task can write (see [`crate::dirs`]): it refuses rather than follow it.
    #[error(
        "{path}: a symbolic link or not a directory, in a directory a task can write; root does \
         not follow it"
    )]
    NotFollowed {
        /// The path, as root meant to reach it.
        path: PathBuf,
    },
    /// A file of the kernel's interface said something this crate cannot read.
    #[error("{path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content.
        reason: String,
    },
    /// cgroups cannot be used on this host: a controller is missing, or the hierarchy is not
    /// one this crate knows.
    #[error("cgroups are not usable here: {reason}")]
    Unavailable {
        /// What is missing, and what to do about it.
        reason: String,
    },
    /// Another agent uses the same cgroup parent: each agent needs its own, since it removes
    /// the task cgroups under it that it does not know.
    #[error(
        "the cgroup {path} is in use by another wharf agent; give each agent its own \
         `cgroups.parent`"
    )]
    ParentInUse {
        /// The parent's directory that is locked.
        path: PathBuf,
    },
    /// A task asked for more whole cores than are free.
    #[error(
        "needs {needed} reserved cores, {free} free (one core always stays shared with tasks \
         that reserve none)"
    )]
    NotEnoughCores {
        /// Cores asked for.
        needed: u32,
        /// Cores free.
        free: u32,
    },
    /// A setting or a value given to the crate cannot be used.
    #[error("{what}: {reason}")]
    Invalid {
        /// The setting or value.
        what: String,
        /// Why.
        reason: String,
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

impl IsolateError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> IsolateError {
        let path = path.into();
        move |source| IsolateError::Io { path, source }
    }

    /// Whether the kernel refused for lack of permission (not root, a read-only cgroupfs, a
    /// container without delegation): the sign that cgroups are not writable here.
    pub fn is_permission(&self) -> bool {
        matches!(self, IsolateError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::EROFS)))
    }
}
