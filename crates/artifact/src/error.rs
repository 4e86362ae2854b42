//! The one error type of wharf-artifact.

use std::path::PathBuf;

/// Why an artifact could not be fetched, checked or put in place. Each says which artifact.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// Fetching failed: the server's answer, the connection, a missing local file.
    #[error("fetching {artifact}: {reason}")]
    Fetch {
        /// The artifact's source.
        artifact: String,
        /// Why.
        reason: String,
    },
    /// The fetched bytes do not hash to `options.checksum`.
    #[error("checksum of {artifact} does not match: expected {expected}, got {actual}")]
    Checksum {
        /// The artifact's source.
        artifact: String,
        /// The checksum the spec states.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// The download or the unpacked archive is larger than the node allows.
    #[error("{artifact} is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The artifact's source.
        artifact: String,
        /// The limit.
        limit: u64,
    },
    /// The fetch did not finish in time.
    #[error("fetching {artifact} did not finish within {seconds}s")]
    TimedOut {
        /// The artifact's source.
        artifact: String,
        /// The limit.
        seconds: u64,
    },
    /// The archive cannot be read, or asks for something refused: an entry outside the
    /// destination, a link leading out of it, an entry of an unsupported kind.
    #[error("unpacking {artifact}: {reason}")]
    Archive {
        /// The artifact's source.
        artifact: String,
        /// Why.
        reason: String,
    },
    /// The spec's artifact block is not usable (a bad checksum, a destination that leaves the
    /// task's directory).
    #[error("artifact {artifact}: {reason}")]
    Spec {
        /// The artifact's source.
        artifact: String,
        /// Why.
        reason: String,
    },
    /// A file operation in the task's directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// TLS could not be set up for https sources.
    #[error("TLS for https artifacts: {reason}")]
    Tls {
        /// Why.
        reason: String,
    },
}
