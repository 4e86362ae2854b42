//! The state Nomad's routes on the fleet share: the fleet, the job records, the index
//! blocking queries wait on, and the fleet's errors as Nomad's.

use super::kept::StoreKeeper;
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
    /// The job records, as of the term [`kept`](FleetNomad::kept) last read them in.
    pub(super) registry: Registry,
    kept: Arc<StoreKeeper>,
    /// One registration or stop at a time: each reads the record, places, then writes it.
    pub(super) changing: tokio::sync::Mutex<()>,
}

pub(super) type Shared = Arc<FleetNomad>;

impl FleetNomad {
    /// The Nomad API of `fleet`, its job records in the fleet's store.
    pub(super) fn new(fleet: Arc<Fleet>) -> FleetNomad {
        let kept = Arc::new(StoreKeeper::new(fleet.store().clone()));
        let registry = Registry::kept_by(kept.clone());
        FleetNomad { fleet, registry, kept, changing: tokio::sync::Mutex::new(()) }
    }

    /// Makes the job records the store's as of this replica's term, reading them when its
    /// term began since they were last read (a replica that takes over serves the jobs its
    /// predecessor registered).
    pub(super) async fn synced(&self) -> NomadResult<()> {
        let leading = self.leading()?;
        let term = leading.scheduler().term();
        if self.kept.loaded_in(term) {
            return Ok(());
        }
        // Not while a registration or a stop writes under the term before.
        let _changing = self.changing.lock().await;
        if self.kept.loaded_in(term) {
            return Ok(());
        }
        self.kept.load(&self.registry, term).await.map_err(fleet_error)?;
        self.import_file_records().await;
        Ok(())
    }

    /// Takes into the store the job records an earlier fleet kept in its data directory
    /// (`nomad/jobs`, before they moved to the store), each unless the store has that job
    /// already; then the directory is renamed `nomad/jobs.imported`, so they are taken once
    /// (an import a crash cut short goes on at the next term).
    async fn import_file_records(&self) {
        let data_dir = &self.fleet.config().data_dir;
        let dir = data_dir.join("nomad").join("jobs");
        if !dir.is_dir() {
            return;
        }
        let old = match Registry::open(data_dir) {
            Ok(old) => old.all(),
            Err(error) => {
                return tracing::warn!(dir = %dir.display(), %error, "cannot read the Nomad job records of an earlier fleet");
            }
        };
        for record in old {
            let id = crate::nomad_http::jobs::job_id(&record);
            if id.is_empty() {
                tracing::warn!(dir = %dir.display(), "an earlier fleet's Nomad job record names no job; leaving it");
                continue;
            }
            if self.registry.get(&id).is_some() {
                continue;
            }
            if let Err(error) = self.registry.put(&id, record).await {
                return tracing::warn!(job = %id, %error, "cannot take an earlier fleet's Nomad job record into the store; trying again at the next term");
            }
        }
        let imported = dir.with_file_name("jobs.imported");
        match std::fs::rename(&dir, &imported) {
            Ok(()) => {
                tracing::info!(from = %dir.display(), to = %imported.display(), "took the Nomad job records of an earlier fleet into the store")
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "took the Nomad job records of an earlier fleet into the store, but cannot rename their directory")
            }
        }
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
