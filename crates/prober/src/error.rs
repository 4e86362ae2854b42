//! The one error type of wharf-prober.
//!
//! Executors, the runner deployment, the instance sets and the pool all report through
//! [`ProberError`]. Cloud errors that change what the pool does next (quota, capacity, rate
//! limits) are variants of their own, so callers match on them instead of parsing messages.

use crate::capacity::{CapacityScope, HoldReason, Refusal};
use std::time::Duration;
use wharf_state::duration::Formatted;

/// Everything that can go wrong probing workers and managing instances.
#[derive(Debug, thiserror::Error)]
pub enum ProberError {
    /// A name that is none of its kind's (a worker state, an idle behaviour).
    #[error("unknown {what} {name:?}")]
    UnknownName {
        /// What kind of name.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// A command did not finish before its deadline; it was cut off.
    #[error("{what} on worker {worker} did not finish within {}", Formatted(*.deadline))]
    Timeout {
        /// The worker (instance id or address).
        worker: String,
        /// What was running: a command, a connection attempt.
        what: String,
        /// The deadline it had.
        deadline: Duration,
    },
    /// The worker has no address yet (normal while it boots).
    #[error("worker {worker} has no address yet")]
    NoAddress {
        /// The worker.
        worker: String,
    },
    /// The TCP connection or SSH handshake failed (normal while a worker boots).
    #[error("cannot connect to worker {worker} at {address}: {detail}")]
    Connect {
        /// The worker.
        worker: String,
        /// Where we connected.
        address: String,
        /// What failed.
        detail: String,
    },
    /// The worker presented a host key that is not the pinned one, or none is pinned.
    #[error(
        "worker {worker} at {address} presented host key {presented}, {expected}; \
         refusing to connect"
    )]
    HostKey {
        /// The worker.
        worker: String,
        /// Where we connected.
        address: String,
        /// Fingerprint of the key the server presented.
        presented: String,
        /// What was expected: "but no host key is pinned for it" or "but SHA256:... is pinned".
        expected: String,
    },
    /// The worker refused our key.
    #[error("worker {worker} refused public key authentication as user {user:?}")]
    Auth {
        /// The worker.
        worker: String,
        /// The remote user.
        user: String,
    },
    /// The command could not be run at all (channel refused, process spawn failed).
    #[error("cannot run a command on worker {worker}: {detail}")]
    Exec {
        /// The worker.
        worker: String,
        /// What failed.
        detail: String,
    },
    /// The command ran and exited with a non-zero status (or was killed by a signal).
    #[error("command {command:?} on worker {worker} exited with {status}: {stderr}")]
    CommandFailed {
        /// The worker.
        worker: String,
        /// The command line.
        command: String,
        /// The exit status, or "signal" if none was reported.
        status: String,
        /// Its standard error, cut to a few hundred bytes.
        stderr: String,
    },
    /// The runner binary on the worker does not match after it was copied there.
    #[error(
        "runner binary at {path} on worker {worker} has checksum {found:?} after the copy, \
         expected {expected}"
    )]
    DeployMismatch {
        /// The worker.
        worker: String,
        /// The remote path.
        path: String,
        /// The sha256 we sent.
        expected: String,
        /// What the worker reported.
        found: String,
    },
    /// A value cannot be put in a shell command (it contains a NUL byte).
    #[error("{what} {value:?} cannot be passed to a shell: it contains a NUL byte")]
    Unquotable {
        /// What the value is (runner id, path).
        what: &'static str,
        /// The value.
        value: String,
    },
    /// A key or host key could not be read.
    #[error("cannot read {what}: {detail}")]
    Key {
        /// Which key.
        what: String,
        /// Why.
        detail: String,
    },
    /// A configuration value is out of range.
    #[error("invalid prober configuration: {field}: {problem}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The cloud refuses more instances: the account quota is used up.
    #[error("instance quota reached{}", detail_suffix(.detail))]
    Quota {
        /// The provider's message.
        detail: String,
    },
    /// The cloud has no capacity right now, for the instance type asked for, its quota group,
    /// or every type, as `scope` says.
    #[error("no capacity for {scope}{}", detail_suffix(.detail))]
    Capacity {
        /// Which creates the refusal holds.
        scope: CapacityScope,
        /// The provider's message.
        detail: String,
    },
    /// The cloud asks us to slow down.
    #[error("cloud rate limit: retry after {}", Formatted(*.retry_after))]
    RateLimited {
        /// How long to wait before the next call.
        retry_after: Duration,
    },
    /// The pool holds creates back: quota or capacity learned earlier, the cloud's rate
    /// limit, the instance limit, or too many creates in flight.
    #[error("not creating an instance of type {instance_type:?}: {reason}")]
    CreateHeld {
        /// The type asked for.
        instance_type: String,
        /// What holds it.
        reason: HoldReason,
    },
    /// Any other failure of a cloud call.
    #[error("cloud {operation} failed: {detail}")]
    Cloud {
        /// create, list, destroy, set_tags.
        operation: &'static str,
        /// The provider's message.
        detail: String,
    },
    /// No worker with this id.
    #[error("no worker {0:?}")]
    UnknownWorker(String),
    /// The worker cannot do this in its current state.
    #[error("worker {worker} cannot {action}: {reason}")]
    NotAllowed {
        /// The worker.
        worker: String,
        /// What was asked.
        action: &'static str,
        /// Why not.
        reason: String,
    },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() { String::new() } else { format!(": {detail}") }
}

impl ProberError {
    /// Whether this failure is expected while a worker boots (no address, no connection, a
    /// non-zero exit of the boot probe): such failures are logged quietly.
    pub fn expected_while_booting(&self) -> bool {
        matches!(
            self,
            ProberError::NoAddress { .. }
                | ProberError::Connect { .. }
                | ProberError::CommandFailed { .. }
                | ProberError::Timeout { .. }
        )
    }

    /// Whether the failure shows the worker was reached (a command ran), as opposed to a
    /// connection that never came up.
    pub fn reached_worker(&self) -> bool {
        matches!(self, ProberError::CommandFailed { .. } | ProberError::DeployMismatch { .. })
    }
}

impl ProberError {
    /// The refusal of the cloud's this error stands for, if it is one.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        match self {
            ProberError::Quota { .. } => Some(Refusal::Quota),
            ProberError::Capacity { scope, .. } => Some(Refusal::Capacity(*scope)),
            ProberError::RateLimited { retry_after } => Some(Refusal::RateLimited(*retry_after)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations in messages read as in the rest of wharf (and as a job spec writes them):
    /// `1m30s`, not Rust's `90s`.
    #[test]
    fn durations_in_messages_are_written_as_wharf_writes_them() {
        let timeout = ProberError::Timeout {
            worker: "w1".into(),
            what: "command \"true\"".into(),
            deadline: Duration::from_secs(90),
        };
        assert_eq!(
            timeout.to_string(),
            "command \"true\" on worker w1 did not finish within 1m30s"
        );
        let limited = ProberError::RateLimited { retry_after: Duration::from_millis(1500) };
        assert_eq!(limited.to_string(), "cloud rate limit: retry after 1.5s");
        let held = HoldReason::RateLimit { retry_in: Duration::from_secs(3600 + 90) };
        assert_eq!(held.to_string(), "rate limited for 1h1m30s");
    }
}
