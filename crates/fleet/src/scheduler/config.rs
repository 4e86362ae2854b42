//! How the scheduler places work ([`SchedulerConfig`]), and the limits its books and its
//! journal keep.

use std::time::Duration;
use wharf_prober::Moment;
use wharf_state::Timestamp;

/// A count limit as configured: 0 means no limit.
pub(super) fn limit(configured: usize) -> usize {
    if configured == 0 { usize::MAX } else { configured }
}

/// Most changes one journal entry carries: what a commit may. An entry is what one decision
/// changed and is committed whole, never split; a step that would change more stops there,
/// and the next step (at once) goes on.
pub(crate) const MAX_CHANGES_PER_ENTRY: usize = crate::store::MAX_CHANGES_PER_COMMIT;

/// The most changes one record's decision makes: the record, and the oldest finished record
/// it pushes out.
pub(super) const CHANGES_PER_DECISION: usize = 2;

/// How the scheduler places work. A limit of 0 means no limit, as in the pool's configuration.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// At most this many runners on one worker (those it found there count too).
    pub per_worker_limit: usize,
    /// Work whose start was refused this many times fails.
    pub max_start_attempts: u32,
    /// A worker that refused a start gets no work for this long.
    pub start_failure_backoff: Duration,
    /// At most this much work waits in the queue; more is refused.
    pub max_queued: usize,
    /// Finished work is remembered (for status queries) up to this many, oldest forgotten first.
    pub max_finished: usize,
    /// Keep at least this many workers: ask the pool for more when fewer exist.
    pub min_workers: usize,
    /// The instance type of those creates.
    pub instance_type: String,
    /// The wall-clock time at the pool clock's origin: records carry wall-clock times, so that
    /// another process reads them right.
    pub wall_origin: Timestamp,
}

impl SchedulerConfig {
    /// Whether work refused `attempts` times may be tried again.
    pub(super) fn may_retry(&self, attempts: u32) -> bool {
        self.max_start_attempts == 0 || attempts < self.max_start_attempts
    }

    /// The wall-clock time of `moment`.
    pub fn wall(&self, moment: Moment) -> Timestamp {
        self.wall_origin.saturating_add(moment.since_origin())
    }
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            per_worker_limit: 4,
            max_start_attempts: 3,
            start_failure_backoff: Duration::from_secs(30),
            max_queued: 10_000,
            max_finished: 10_000,
            min_workers: 0,
            instance_type: String::new(),
            wall_origin: Timestamp(0),
        }
    }
}
