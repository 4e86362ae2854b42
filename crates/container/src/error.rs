//! The one error type of wharf-container, and how it becomes a [`DriverError`].

use std::path::PathBuf;
use wharf_driver::DriverError;

/// What can go wrong storing images and running containers.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// An image reference that names no source this driver knows.
    #[error("invalid image reference {reference:?}: {reason}")]
    BadReference {
        /// The reference as written.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The image is not in its source (no such tag, no such file).
    #[error("image {reference} not found: {reason}")]
    ImageNotFound {
        /// The reference.
        reference: String,
        /// Where it was looked for.
        reason: String,
    },
    /// What an image's source holds is malformed (JSON, tar, a digest that does not match).
    #[error("bad image {reference}: {reason}")]
    BadImage {
        /// The reference.
        reference: String,
        /// What is wrong.
        reason: String,
    },
    /// A layer holds an entry that would land outside its directory, or one this driver
    /// does not unpack.
    #[error("layer {digest} refused: entry {entry:?}: {reason}")]
    LayerRefused {
        /// The layer's digest.
        digest: String,
        /// The entry's path as the tar holds it.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A file or directory could not be made or read.
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
    /// A task's `config` block is wrong.
    #[error("invalid driver config: {field}: {reason}")]
    InvalidConfig {
        /// The field, such as `config.image`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The runtime (runc) failed.
    #[error("{runtime} {action} failed: {reason}")]
    Runtime {
        /// The runtime program.
        runtime: String,
        /// Which command.
        action: &'static str,
        /// What it said.
        reason: String,
    },
    /// A registry could not be reached or answered with an error worth a retry.
    #[error("pulling {reference}: {reason}")]
    Pull {
        /// The reference.
        reference: String,
        /// What happened.
        reason: String,
    },
    /// A handle's driver state cannot be used.
    #[error("unusable container task handle: {reason}")]
    BadHandle {
        /// Why.
        reason: String,
    },
}

impl ContainerError {
    /// A closure that makes an [`ContainerError::Io`] for `action` on `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ContainerError {
        let path = path.into();
        move |source| ContainerError::Io { action, path, source }
    }

    /// Whether trying again may succeed (a registry that did not answer).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ContainerError::Pull { .. })
    }
}

impl From<ContainerError> for DriverError {
    fn from(error: ContainerError) -> DriverError {
        match error {
            ContainerError::InvalidConfig { field, reason } => {
                DriverError::InvalidConfig { field, reason }
            }
            e @ (ContainerError::BadReference { .. } | ContainerError::ImageNotFound { .. }) => {
                DriverError::invalid_config("config.image", e.to_string())
            }
            e if e.is_retryable() => DriverError::Retryable { reason: e.to_string() },
            e => DriverError::other(e),
        }
    }
}
