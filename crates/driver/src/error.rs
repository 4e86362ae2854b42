//! The one error type of the driver interface.

use crate::TaskId;

/// Why a driver call failed, in a form the caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The driver does not know this task (never started, destroyed, or lost).
    #[error("task {task_id} not found")]
    TaskNotFound {
        /// The task asked about.
        task_id: TaskId,
    },
    /// The driver does not do this at all.
    #[error("driver {driver} does not support {operation}")]
    Unsupported {
        /// The driver.
        driver: String,
        /// What was asked of it.
        operation: &'static str,
    },
    /// The task's driver config is wrong. Fatal: starting again would fail again.
    #[error("invalid driver config: {field}: {reason}")]
    InvalidConfig {
        /// The field, such as `config.command`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Starting failed for a reason that may pass (resources, a busy system): worth a retry.
    #[error("{reason}")]
    Retryable {
        /// What happened.
        reason: String,
    },
    /// Something the driver was asked to read is not what it wrote (a task can write in its
    /// own directories), so it refuses to read it.
    #[error("refusing to read {what}: {reason}")]
    Refused {
        /// What, such as `web.stdout.0 in the log directory of task "web"`.
        what: String,
        /// What it is instead.
        reason: String,
    },
    /// Anything else. Fatal when starting a task.
    #[error("{reason}")]
    Other {
        /// What happened.
        reason: String,
    },
}

impl DriverError {
    /// Whether trying the same start again could succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, DriverError::Retryable { .. })
    }

    /// Shorthand for [`DriverError::Other`].
    pub fn other(reason: impl std::fmt::Display) -> DriverError {
        DriverError::Other { reason: reason.to_string() }
    }

    /// Shorthand for [`DriverError::TaskNotFound`].
    pub fn not_found(task_id: &TaskId) -> DriverError {
        DriverError::TaskNotFound { task_id: task_id.clone() }
    }

    /// Shorthand for [`DriverError::Unsupported`].
    pub fn unsupported(driver: impl Into<String>, operation: &'static str) -> DriverError {
        DriverError::Unsupported { driver: driver.into(), operation }
    }

    /// Shorthand for [`DriverError::InvalidConfig`].
    pub fn invalid_config(field: impl Into<String>, reason: impl Into<String>) -> DriverError {
        DriverError::InvalidConfig { field: field.into(), reason: reason.into() }
    }
}
