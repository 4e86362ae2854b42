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
}
