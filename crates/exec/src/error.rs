//! The one error type of wharf-exec, and how it becomes a [`DriverError`].

use std::path::PathBuf;
use std::time::Duration;
use wharf_driver::DriverError;

/// What can go wrong running tasks under shims. Callers of the [`wharf_driver::Driver`] trait
/// see these as [`DriverError`]s: [`ExecError::is_retryable`] decides which kind.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The shim program is not where the driver was told to find it.
    #[error(
        "the raw_exec shim {path} is missing or not executable; install wharf-shim beside the \
         agent or set RawExecOptions::shim_path"
    )]
    ShimMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A file or directory the driver needs could not be made or read.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The shim could not be started.
    #[error("cannot start the shim {path}: {source}")]
    SpawnShim {
        /// The shim program.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The shim did not say whether the task started within the limit.
    #[error(
        "the shim did not report the task's start within {}; see {log}",
        wharf_state::duration::Formatted(*limit)
    )]
    StartTimeout {
        /// The limit.
        limit: Duration,
        /// The shim's diagnostics.
        log: PathBuf,
    },
    /// The shim exited, or said something unreadable, before reporting the task's start.
    #[error("the shim failed before the task started ({detail}); see {log}")]
    ShimFailed {
        /// What was seen.
        detail: String,
        /// The shim's diagnostics.
        log: PathBuf,
    },
    /// A handle's driver state cannot be used.
    #[error("unusable raw_exec task handle: {reason}")]
    BadHandle {
        /// What is wrong with it.
        reason: String,
    },
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The call.
        call: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ExecError {
    /// Whether trying again could help: the system was short of processes, memory or
    /// descriptors, or the shim was slow.
    pub fn is_retryable(&self) -> bool {
        let transient = |e: &std::io::Error| {
            matches!(
                e.raw_os_error(),
                Some(libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EINTR)
            )
        };
        match self {
            ExecError::SpawnShim { source, .. } | ExecError::Sys { source, .. } => {
                transient(source)
            }
            ExecError::Io { source, .. } => transient(source),
            ExecError::StartTimeout { .. } => true,
            ExecError::ShimMissing { .. }
            | ExecError::ShimFailed { .. }
            | ExecError::BadHandle { .. } => false,
        }
    }
}

impl From<ExecError> for DriverError {
    fn from(error: ExecError) -> DriverError {
        if error.is_retryable() {
            DriverError::Retryable { reason: error.to_string() }
        } else {
            DriverError::other(error)
        }
    }
}
