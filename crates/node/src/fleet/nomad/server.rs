//! The state Nomad's routes on the fleet share: the fleet, the job records, the index
//! blocking queries wait on, and the fleet's errors as Nomad's.

use crate::fleet::wiring::{Fleet, Leading};
use crate::nomad_http::registry::Registry;
use crate::nomad_http::{self as shared, NomadApiError, NomadResult, NomadService, Params};
use axum::http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::FleetError;

/// How often a blocking query looks again when nothing woke it: changes on the workers (a
/// task's events) do not wake the scheduler.
const POLL: Duration = Duration::from_secs(1);

/// The Nomad API's state beside the fleet.
#[derive(Debug)]
pub(crate) struct FleetNomad {
    pub(super) fleet: Arc<Fleet>,
    pub(super) registry: Registry,
    /// One registration or stop at a time: each reads the record, places, then writes it.
    pub(super) changing: tokio::sync::Mutex<()>,
}

pub(super) type Shared = Arc<FleetNomad>;

impl FleetNomad {
    pub(super) fn new(fleet: Arc<Fleet>, registry: Registry) -> FleetNomad {
        FleetNomad { fleet, registry, changing: tokio::sync::Mutex::new(()) }
    }

    /// What leads here, or a 503 (a follower forwards Nomad's calls, so this is a replica
    /// that stopped leading since the call was let in).
    pub(super) fn leading(&self) -> NomadResult<Arc<Leading>> {
        self.fleet.leading().ok_or_else(|| {
            NomadApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "this replica no longer leads the fleet; try again",
            )
        })
    }

    /// The latest change the fleet can show, in milliseconds: a job record's, or a
    /// submission, start or end of any work.
    pub(super) fn index(&self) -> u64 {
        let mut latest = self.registry.last_change();
        if let Some(leading) = self.fleet.leading() {
            for placement in leading.scheduler().list() {
                let times = [Some(placement.submitted), placement.started, placement.finished];
                let ended = placement.history.iter().map(|a| a.finished);
                for time in times.into_iter().flatten().chain(ended) {
                    latest = latest.max(time);
                }
            }
        }
        latest.0.max(1)
    }

    /// A blocking query: woken by the scheduler's changes, and polled.
    pub(super) async fn block(&self, params: &Params) -> NomadResult<()> {
        let changes = self.fleet.leading().map(|leading| leading.scheduler().subscribe());
        shared::block_until(params, POLL, changes, || self.index()).await
    }
}

impl NomadService for FleetNomad {
    fn token(&self) -> Option<&str> {
        self.fleet.config().token.as_deref()
    }

    fn index(&self) -> u64 {
        FleetNomad::index(self)
    }
}

/// A fleet error as Nomad answers one.
pub(super) fn fleet_error(error: FleetError) -> NomadApiError {
    let status = match &error {
        FleetError::UnknownWork(_) => StatusCode::NOT_FOUND,
        FleetError::Submit { .. } => StatusCode::CONFLICT,
        FleetError::Prober(_) => StatusCode::INTERNAL_SERVER_ERROR,
        FleetError::QueueFull { .. }
        | FleetError::Store { .. }
        | FleetError::Fenced { .. }
        | FleetError::NotLeading { .. } => StatusCode::SERVICE_UNAVAILABLE,
    };
    NomadApiError::new(status, error.to_string())
}
