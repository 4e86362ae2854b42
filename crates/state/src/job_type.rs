//! The type of a job, which decides how its tasks' exits are read and its defaults.

use serde::{Deserialize, Serialize};

/// Whether a job runs until it is stopped or until its work is done.
///
/// On one node `system` behaves as `service` and `sysbatch` as `batch`; they are accepted so
/// that Nomad job specs carry over unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    /// Long-running: tasks that exit are restarted by policy.
    Service,
    /// Run to completion: a task that exits 0 is done.
    Batch,
    /// Nomad's job on every node; here, a service.
    System,
    /// Nomad's batch job on every node; here, a batch job.
    #[serde(rename = "sysbatch")]
    SysBatch,
}

impl JobType {
    /// Whether the job runs to completion (batch and sysbatch), so that a task that exits 0
    /// has done its work.
    pub fn runs_to_completion(self) -> bool {
        matches!(self, JobType::Batch | JobType::SysBatch)
    }
}
