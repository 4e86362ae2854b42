//! What the node reports about the health of services: each check's latest result, and the
//! catalog of services it offers. These are API types (`GET /v1/allocations/{id}` and
//! `GET /v1/services`); the checks themselves are run by wharf-health.

use crate::service::{CheckKind, OnUpdate};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// How a check stands. Ordered from best to worst, so the worst of several is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// The last run passed.
    Passing,
    /// The check has not run yet.
    Pending,
    /// The last run warned (an HTTP 429, a script exiting 1).
    Warning,
    /// The last run failed or did not finish in time.
    Critical,
}

impl fmt::Display for CheckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckStatus::Passing => "passing",
            CheckStatus::Pending => "pending",
            CheckStatus::Warning => "warning",
            CheckStatus::Critical => "critical",
        })
    }
}

/// The outcome of one run of a check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Passing, warning or critical.
    pub status: CheckStatus,
    /// What the run said: the HTTP status line and body, the script's output, the error.
    pub output: String,
    /// The HTTP status code, for http checks that got an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// When the run ended.
    pub time: Timestamp,
}

/// One check of an allocation and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckState {
    /// The task whose service it checks.
    pub task: String,
    /// The service.
    pub service: String,
    /// The check's name.
    pub check: String,
    /// http, tcp or script.
    pub kind: CheckKind,
    /// Its latest status: pending until it has run.
    pub status: CheckStatus,
    /// Its latest run, if it has run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<CheckResult>,
}

/// A service in the node's catalog, while its task runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    /// The service's name.
    pub name: String,
    /// Where it is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// Its port, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Its tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The worst status of its checks; passing when it has none.
    pub health: CheckStatus,
    /// The allocation offering it.
    pub alloc_id: String,
    /// Its job.
    pub job_id: String,
    /// Its group.
    pub group: String,
    /// Its task.
    pub task: String,
}

impl OnUpdate {
    /// Whether a check with this setting and `status` lets the allocation be healthy; None if
    /// the check does not count at all.
    pub fn passes(self, status: CheckStatus) -> Option<bool> {
        use CheckStatus::{Passing, Warning};
        match self {
            OnUpdate::RequireHealthy => Some(status == Passing),
            OnUpdate::IgnoreWarnings => Some(matches!(status, Passing | Warning)),
            OnUpdate::Ignore => None,
        }
    }
}
