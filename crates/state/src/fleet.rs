//! What a fleet keeps about each piece of work: the records its store persists and its API
//! shows. Pure data; wharf-fleet changes them, and a fleet that restarts (or another replica
//! that takes over) reads them back.
//!
//! A [`Placement`] is one submission: where it is ([`WorkPhase`], named by [`WorkPhaseName`]),
//! what it needs of a worker, its reschedule policy, the attempt under way and the
//! [`Attempt`]s before it. Each attempt runs under its own id on the worker ([`runner_id`]), so
//! a worker that comes back still running an attempt that was written off is told to stop that
//! one and no other.

use crate::duration;
use crate::reschedule::ReschedulePolicy;
use crate::resources::Amount;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Where a piece of work is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase", deny_unknown_fields)]
pub enum WorkPhase {
    /// Waiting for a worker with room (or for its reschedule delay).
    Queued,
    /// Its start command is running on a worker.
    Starting {
        /// The worker.
        worker: String,
    },
    /// Running on a worker (or, until a probe says, possibly running).
    Running {
        /// The worker.
        worker: String,
    },
    /// It ran and ended; `outcome` is what the runner said about it.
    Ended {
        /// The worker it ran on.
        worker: String,
        /// The runner's outcome line (`complete ...`, `failed ...`), or `ended`.
        outcome: String,
    },
    /// Its worker was shut down or disappeared while it ran, or stopped knowing it, and it is
    /// not rescheduled.
    Lost {
        /// The worker it ran on.
        worker: String,
        /// What happened.
        reason: String,
    },
    /// It could not be started.
    Failed {
        /// The last refusal.
        reason: String,
    },
    /// Stopped while it was still queued.
    Cancelled,
}

impl WorkPhase {
    /// The phase's name, without what it carries.
    pub fn name(&self) -> WorkPhaseName {
        match self {
            WorkPhase::Queued => WorkPhaseName::Queued,
            WorkPhase::Starting { .. } => WorkPhaseName::Starting,
            WorkPhase::Running { .. } => WorkPhaseName::Running,
            WorkPhase::Ended { .. } => WorkPhaseName::Ended,
            WorkPhase::Lost { .. } => WorkPhaseName::Lost,
            WorkPhase::Failed { .. } => WorkPhaseName::Failed,
            WorkPhase::Cancelled => WorkPhaseName::Cancelled,
        }
    }

    /// Whether the work is done with, one way or another.
    pub fn is_final(&self) -> bool {
        self.name().is_final()
    }

    /// How a final phase ended the current attempt, as an [`Attempt`]'s `outcome` says it:
    /// `ended: <outcome>`, `lost: <reason>`, `failed: <reason>` or `cancelled`. `None` while
    /// the attempt is under way (queued, starting, running).
    pub fn attempt_outcome(&self) -> Option<String> {
        match self {
            WorkPhase::Queued | WorkPhase::Starting { .. } | WorkPhase::Running { .. } => None,
            WorkPhase::Ended { outcome, .. } => Some(format!("ended: {outcome}")),
            WorkPhase::Lost { reason, .. } => Some(format!("lost: {reason}")),
            WorkPhase::Failed { reason } => Some(format!("failed: {reason}")),
            WorkPhase::Cancelled => Some("cancelled".into()),
        }
    }

    /// The worker it is on (or was last on).
    pub fn worker(&self) -> Option<&str> {
        match self {
            WorkPhase::Starting { worker }
            | WorkPhase::Running { worker }
            | WorkPhase::Ended { worker, .. }
            | WorkPhase::Lost { worker, .. } => Some(worker),
            WorkPhase::Queued | WorkPhase::Failed { .. } | WorkPhase::Cancelled => None,
        }
    }
}

/// A [`WorkPhase`]'s name alone: what an API shows and a metric counts. `Display` prints it
/// and `FromStr` reads it (`queued`, `starting`, `running`, `ended`, `lost`, `failed`,
/// `cancelled`), and it serialises as that string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkPhaseName {
    /// [`WorkPhase::Queued`].
    Queued,
    /// [`WorkPhase::Starting`].
    Starting,
    /// [`WorkPhase::Running`].
    Running,
    /// [`WorkPhase::Ended`].
    Ended,
    /// [`WorkPhase::Lost`].
    Lost,
    /// [`WorkPhase::Failed`].
    Failed,
    /// [`WorkPhase::Cancelled`].
    Cancelled,
}

impl WorkPhaseName {
    /// Every phase, in the order work goes through them.
    pub const ALL: [WorkPhaseName; 7] = [
        WorkPhaseName::Queued,
        WorkPhaseName::Starting,
        WorkPhaseName::Running,
        WorkPhaseName::Ended,
        WorkPhaseName::Lost,
        WorkPhaseName::Failed,
        WorkPhaseName::Cancelled,
    ];

    /// The name: the one spelling of it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkPhaseName::Queued => "queued",
            WorkPhaseName::Starting => "starting",
            WorkPhaseName::Running => "running",
            WorkPhaseName::Ended => "ended",
            WorkPhaseName::Lost => "lost",
            WorkPhaseName::Failed => "failed",
            WorkPhaseName::Cancelled => "cancelled",
        }
    }

    /// Whether work in this phase is done with, one way or another.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            WorkPhaseName::Ended
                | WorkPhaseName::Lost
                | WorkPhaseName::Failed
                | WorkPhaseName::Cancelled
        )
    }
}

impl fmt::Display for WorkPhaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A word that is no work phase's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown work phase {0:?}: one of queued, starting, running, ended, lost, failed, cancelled"
)]
pub struct UnknownWorkPhase(pub String);

impl FromStr for WorkPhaseName {
    type Err = UnknownWorkPhase;

    fn from_str(name: &str) -> Result<WorkPhaseName, UnknownWorkPhase> {
        WorkPhaseName::ALL
            .into_iter()
            .find(|phase| phase.as_str() == name)
            .ok_or_else(|| UnknownWorkPhase(name.to_owned()))
    }
}

impl PartialEq<&str> for WorkPhaseName {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl Serialize for WorkPhaseName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for WorkPhaseName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// Why and when an attempt was placed again (Nomad's `RescheduleEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescheduleEvent {
    /// When the previous attempt ended and this one was decided.
    pub at: Timestamp,
    /// The wait before it could be placed.
    #[serde(with = "duration::serde_str")]
    pub delay: Duration,
    /// How the previous attempt ended.
    pub reason: String,
}

/// An attempt that is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    /// Its number, from 1.
    pub attempt: u32,
    /// Its id on the worker.
    pub runner_id: String,
    /// The worker it ran on (or was last placed on).
    pub worker: Option<String>,
    /// When a worker acknowledged its start (or a probe first listed it).
    pub started: Option<Timestamp>,
    /// When it ended.
    pub finished: Timestamp,
    /// How it ended: `ended: <outcome>`, `lost: <reason>` ([`WorkPhase::attempt_outcome`]).
    pub outcome: String,
    /// How it came to be, if it was a reschedule.
    pub rescheduled: Option<RescheduleEvent>,
    /// The hourly price of its worker's instance type, in millionths, where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_micros_per_hour: Option<u64>,
}

impl Attempt {
    /// What its worker's time cost, in the price's currency: the price times the time from
    /// its start to its end. `None` without a price or a start.
    pub fn cost(&self) -> Option<f64> {
        Some(cost(self.price_micros_per_hour?, self.started?, self.finished))
    }
}

/// What `price_micros_per_hour` comes to from `started` to `until`.
fn cost(price_micros_per_hour: u64, started: Timestamp, until: Timestamp) -> f64 {
    let hours = until.since(started).as_secs_f64() / 3600.0;
    price_micros_per_hour as f64 / 1e6 * hours
}

/// One piece of work, as the fleet keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Its id, as the user knows it.
    pub id: String,
    /// Where it is.
    pub phase: WorkPhase,
    /// When it was submitted (or adopted).
    pub submitted: Timestamp,
    /// When a worker acknowledged the current attempt's start (or a probe first listed it).
    pub started: Option<Timestamp>,
    /// When it reached a final phase.
    pub finished: Option<Timestamp>,
    /// Start commands sent for the current attempt.
    pub starts: u32,
    /// Found running by a probe rather than started here.
    pub adopted: bool,
    /// The current attempt's start was acknowledged, or a probe listed it: it reached the worker.
    pub confirmed: bool,
    /// What it needs of a worker (cores count in `cores`; their MHz depend on the worker).
    pub needs: Amount,
    /// How it is placed again after it is lost or fails.
    pub reschedule: ReschedulePolicy,
    /// Queued, but not to be placed before this (a reschedule's delay).
    pub not_before: Option<Timestamp>,
    /// The current attempt's number, from 1.
    pub attempt: u32,
    /// How the current attempt came to be, if it is a reschedule.
    pub rescheduled: Option<RescheduleEvent>,
    /// The attempts before the current one, oldest first.
    pub history: Vec<Attempt>,
    /// A stop was asked: it is never placed or rescheduled again.
    pub stop_requested: bool,
    /// Bumped by every change; the API's version of it.
    pub revision: u64,
    /// The hourly price of the current attempt's worker's instance type, in millionths,
    /// where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_micros_per_hour: Option<u64>,
}

impl Placement {
    /// Work `id`, submitted at `now` and queued, needing `needs`, rescheduled by `reschedule`.
    pub fn queued(
        id: &str,
        now: Timestamp,
        needs: Amount,
        reschedule: ReschedulePolicy,
    ) -> Placement {
        Placement {
            id: id.to_owned(),
            phase: WorkPhase::Queued,
            submitted: now,
            started: None,
            finished: None,
            starts: 0,
            adopted: false,
            confirmed: false,
            needs,
            reschedule,
            not_before: None,
            attempt: 1,
            rescheduled: None,
            history: Vec::new(),
            stop_requested: false,
            revision: 0,
            price_micros_per_hour: None,
        }
    }

    /// What the current attempt's worker time has cost up to `now` (to its end, if it ended).
    /// `None` without a price or a start.
    pub fn cost(&self, now: Timestamp) -> Option<f64> {
        let until = self.finished.unwrap_or(now);
        Some(cost(self.price_micros_per_hour?, self.started?, until))
    }

    /// What every attempt's worker time has cost up to `now`, where it has a price.
    pub fn total_cost(&self, now: Timestamp) -> f64 {
        self.history.iter().filter_map(Attempt::cost).sum::<f64>() + self.cost(now).unwrap_or(0.0)
    }

    /// The current attempt's id on the worker.
    pub fn runner_id(&self) -> String {
        runner_id(&self.id, self.attempt)
    }

    /// Every reschedule so far, oldest first (Nomad's `RescheduleTracker.Events`).
    pub fn reschedules(&self) -> impl Iterator<Item = &RescheduleEvent> {
        self.history.iter().filter_map(|a| a.rescheduled.as_ref()).chain(&self.rescheduled)
    }
}

/// The separator of a work id and its attempt in a runner id: not allowed in a fleet's ids.
pub const ATTEMPT_SEPARATOR: &str = "__";

/// The id attempt `attempt` of work `id` runs under on a worker: the id itself for the first,
/// `<id>__<attempt>` for later ones.
pub fn runner_id(id: &str, attempt: u32) -> String {
    if attempt <= 1 { id.to_owned() } else { format!("{id}{ATTEMPT_SEPARATOR}{attempt}") }
}

/// The work id and attempt of a runner id (the reverse of [`runner_id`]).
pub fn parse_runner_id(runner_id: &str) -> (&str, u32) {
    match runner_id.rsplit_once(ATTEMPT_SEPARATOR) {
        Some((id, n)) if !id.is_empty() => match n.parse::<u32>() {
            Ok(attempt) if attempt >= 2 && n == attempt.to_string() => (id, attempt),
            _ => (runner_id, 1),
        },
        _ => (runner_id, 1),
    }
}

/// A placement with the payload its starts send: what a fleet's store keeps per work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkRecord {
    /// Where it is.
    pub placement: Placement,
    /// What the runner reads on its standard input when an attempt starts.
    pub payload: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_ids_carry_the_attempt_and_read_back() {
        assert_eq!(runner_id("web", 1), "web");
        assert_eq!(runner_id("web", 3), "web__3");
        assert_eq!(parse_runner_id("web__3"), ("web", 3));
        assert_eq!(parse_runner_id("web"), ("web", 1));
        // Not an attempt suffix: taken as a plain id.
        for plain in ["web__1", "web__03", "web__x", "__2", "a__b__"] {
            assert_eq!(parse_runner_id(plain), (plain, 1), "{plain}");
        }
    }

    #[test]
    fn a_final_phase_says_how_the_attempt_ended_and_one_under_way_does_not() {
        let worker = || "h1".to_owned();
        let cases = [
            (WorkPhase::Queued, None),
            (WorkPhase::Starting { worker: worker() }, None),
            (WorkPhase::Running { worker: worker() }, None),
            (
                WorkPhase::Ended { worker: worker(), outcome: "failed exit 3".into() },
                Some("ended: failed exit 3"),
            ),
            (WorkPhase::Lost { worker: worker(), reason: "gone".into() }, Some("lost: gone")),
            (WorkPhase::Failed { reason: "refused".into() }, Some("failed: refused")),
            (WorkPhase::Cancelled, Some("cancelled")),
        ];
        for (phase, want) in cases {
            assert_eq!(phase.attempt_outcome().as_deref(), want, "{phase:?}");
            assert_eq!(want.is_some(), phase.is_final(), "{phase:?}");
        }
    }

    /// Each phase's name reads back, is the one its record's JSON carries in `phase`, and
    /// serialises as itself.
    #[test]
    fn phase_names_are_spelled_once() {
        let worker = || "h1".to_owned();
        let phases = [
            WorkPhase::Queued,
            WorkPhase::Starting { worker: worker() },
            WorkPhase::Running { worker: worker() },
            WorkPhase::Ended { worker: worker(), outcome: "complete".into() },
            WorkPhase::Lost { worker: worker(), reason: "gone".into() },
            WorkPhase::Failed { reason: "refused".into() },
            WorkPhase::Cancelled,
        ];
        let names: Vec<WorkPhaseName> = phases.iter().map(WorkPhase::name).collect();
        assert_eq!(names, WorkPhaseName::ALL);
        for phase in phases {
            let name = phase.name();
            assert_eq!(name.as_str().parse::<WorkPhaseName>(), Ok(name));
            let json = serde_json::to_value(&phase).unwrap();
            assert_eq!(json["phase"], name.as_str(), "{phase:?}");
            assert_eq!(serde_json::to_value(name).unwrap(), name.as_str());
            let back: WorkPhaseName = serde_json::from_value(json["phase"].clone()).unwrap();
            assert_eq!(back, name);
            assert_eq!(name.is_final(), phase.is_final());
        }
        assert!("Queued".parse::<WorkPhaseName>().is_err());
        assert!(serde_json::from_str::<WorkPhaseName>("\"done\"").is_err());
    }

    #[test]
    fn an_attempts_cost_is_its_workers_price_for_the_time_it_ran() {
        let hour = 3_600_000;
        let mut placement =
            Placement::queued("w", Timestamp(0), Amount::ZERO, ReschedulePolicy::DISABLED);
        assert_eq!(placement.cost(Timestamp(hour)), None, "not started");
        placement.history.push(Attempt {
            attempt: 1,
            runner_id: "w".into(),
            worker: Some("h1".into()),
            started: Some(Timestamp(0)),
            finished: Timestamp(hour / 2),
            outcome: "lost: gone".into(),
            rescheduled: None,
            price_micros_per_hour: Some(192_000),
        });
        assert_eq!(placement.history[0].cost(), Some(0.096));
        placement.started = Some(Timestamp(hour));
        assert_eq!(placement.cost(Timestamp(2 * hour)), None, "a worker without a price");
        placement.price_micros_per_hour = Some(41_600);
        assert_eq!(placement.cost(Timestamp(3 * hour)), Some(0.0832), "running: up to now");
        placement.finished = Some(Timestamp(2 * hour));
        assert_eq!(placement.cost(Timestamp(3 * hour)), Some(0.0416), "ended: up to its end");
        assert!((placement.total_cost(Timestamp(3 * hour)) - 0.1376).abs() < 1e-9);
    }

    #[test]
    fn records_round_trip_through_json() {
        let mut placement = Placement::queued(
            "w",
            Timestamp(1_000),
            Amount { cpu_mhz: 500, memory_mb: 256, cores: 0 },
            ReschedulePolicy::DISABLED,
        );
        placement.phase = WorkPhase::Lost { worker: "h1".into(), reason: "gone".into() };
        placement.history.push(Attempt {
            attempt: 1,
            runner_id: "w".into(),
            worker: Some("h1".into()),
            started: Some(Timestamp(2_000)),
            finished: Timestamp(3_000),
            outcome: "lost: gone".into(),
            rescheduled: None,
            price_micros_per_hour: Some(192_000),
        });
        let record = WorkRecord { placement, payload: "{}".into() };
        let text = serde_json::to_string(&record).unwrap();
        assert!(text.contains(r#""phase":"lost""#), "{text}");
        assert_eq!(serde_json::from_str::<WorkRecord>(&text).unwrap(), record);
    }
}
