//! Nomad's job endpoints on the fleet: a registered job's group instances become fleet work,
//! placed by the scheduler; list, read, stop (and purge), the job's allocations, validation,
//! and the evaluations. The registration's flow and the job's shapes are
//! [`crate::nomad_http::jobs`]'s; here is how the fleet places and stops.

use super::server::{FleetNomad, Shared, fleet_error};
use super::views;
use crate::nomad_http::jobs::{self as shared, Placer};
use crate::nomad_http::registry::JobRecord;
use crate::nomad_http::{NomadApiError, NomadResult, Params, flag, json_body};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};
use wharf_fleet::{FleetError, Submission};
use wharf_nomad::shapes::{self, JobRegisterResponse};
use wharf_nomad::translate;
use wharf_state::resources::Amount;

/// The fleet work that runs `job` (one group's instance), as its own API's submissions are.
fn submission(id: String, job: &wharf_state::Job) -> NomadResult<Submission> {
    let payload = serde_json::to_string(&job.to_spec()).map_err(NomadApiError::internal)?;
    let group =
        job.groups.first().ok_or_else(|| NomadApiError::bad_request("a group has no tasks"))?;
    // Cores are counted as cores: their MHz depend on the worker.
    Ok(Submission {
        id,
        payload,
        needs: Amount::of_group(group, 0),
        reschedule: job.reschedule_policy(group),
    })
}

/// The fleet places on its workers: each allocation is submitted to the scheduler.
impl Placer for FleetNomad {
    async fn place_one(&self, id: &str, job: wharf_state::Job) -> NomadResult<()> {
        let scheduler = self.leading()?.scheduler().clone();
        scheduler.submit(submission(id.to_owned(), &job)?).await.map_err(fleet_error)?;
        Ok(())
    }

    async fn stop_one(&self, id: &str, why: &str) -> NomadResult<()> {
        let scheduler = self.leading()?.scheduler().clone();
        match scheduler.stop(id, why).await {
            // Forgotten already: nothing left to stop.
            Ok(_) | Err(FleetError::UnknownWork(_)) => Ok(()),
            Err(error) => Err(fleet_error(error)),
        }
    }
}

/// `PUT|POST /v1/jobs`.
pub(super) async fn register(
    State(server): State<Shared>,
    body: Body,
) -> NomadResult<Json<JobRegisterResponse>> {
    register_as(server, None, body).await
}

/// `PUT|POST /v1/job/:id`: the body's job must be the one the path names.
pub(super) async fn register_at(
    State(server): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> NomadResult<Json<JobRegisterResponse>> {
    register_as(server, Some(id), body).await
}

async fn register_as(
    server: Shared,
    path: Option<String>,
    body: Body,
) -> NomadResult<Json<JobRegisterResponse>> {
    let body = json_body(server.fleet.config().max_body_bytes, body).await?;
    let nomad = shared::job_to_register(&body, path.as_deref())?;
    // A task of its own: a client that hangs up mid-registration does not cut it short.
    let registering = tokio::spawn(async move {
        let _changing = server.changing.lock().await;
        shared::register(server.as_ref(), &server.registry, &nomad).await
    });
    Ok(Json(registering.await.map_err(NomadApiError::internal)??))
}

/// The client statuses of a job's allocations the scheduler still has, by group, as its
/// phases imply (no worker is asked).
fn statuses(server: &FleetNomad, record: &JobRecord) -> Vec<(String, wharf_state::ClientStatus)> {
    let Some(leading) = server.fleet.leading() else { return Vec::new() };
    let scheduler = leading.scheduler();
    record
        .allocs
        .iter()
        .filter_map(|a| {
            scheduler.get(&a.id).map(|p| (a.group.clone(), views::client_status(&p.phase)))
        })
        .collect()
}

fn stub(server: &FleetNomad, record: &JobRecord) -> shapes::JobListStub {
    shared::stub(record, &statuses(server, record))
}

/// `GET /v1/jobs` (`?prefix=`).
pub(super) async fn list(
    State(server): State<Shared>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::JobListStub>>> {
    server.block(&params).await?;
    let prefix = params.get("prefix").map_or("", String::as_str);
    let jobs = server
        .registry
        .all()
        .iter()
        .filter(|r| shared::job_id(r).starts_with(prefix))
        .map(|r| stub(&server, r))
        .collect();
    Ok(Json(jobs))
}

/// `GET /v1/job/:id`: the job as registered, with the server's fields filled in.
pub(super) async fn read(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Value>> {
    server.block(&params).await?;
    let record = shared::record_of(&server.registry, &id)?;
    let status = stub(&server, &record).status;
    Ok(Json(shared::job(&record, &status)))
}

/// `DELETE /v1/job/:id` (`?purge=true` forgets the job as well).
pub(super) async fn deregister(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<JobRegisterResponse>> {
    let purge = flag(&params, "purge")?;
    let _changing = server.changing.lock().await;
    Ok(Json(shared::deregister(server.as_ref(), &server.registry, &id, purge).await?))
}

/// `GET /v1/job/:id/allocations`.
pub(super) async fn allocations(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::AllocationListStub>>> {
    server.block(&params).await?;
    let record = shared::record_of(&server.registry, &id)?;
    let leading = server.leading()?;
    let placements: Vec<wharf_fleet::Placement> =
        record.allocs.iter().filter_map(|a| leading.scheduler().get(&a.id)).collect();
    let views = views::allocations(&server, &leading, &placements).await;
    let mut stubs: Vec<shapes::AllocationListStub> =
        views.iter().map(shapes::AllocationListStub::from).collect();
    stubs.sort_by(|a, b| b.create_index.cmp(&a.create_index).then_with(|| a.name.cmp(&b.name)));
    Ok(Json(stubs))
}

/// `PUT|POST /v1/validate/job`: the translation's verdict, as Nomad's validation answer (200
/// with the errors listed). The drivers are the workers' to judge, when a task starts.
pub(super) async fn validate(
    State(server): State<Shared>,
    body: Body,
) -> NomadResult<Json<shapes::JobValidateResponse>> {
    let body = json_body(server.fleet.config().max_body_bytes, body).await?;
    let errors: Vec<String> = match wharf_nomad::job_of_request(&body).and_then(translate) {
        Err(error) => vec![error.to_string()],
        Ok(_) => Vec::new(),
    };
    Ok(Json(shapes::JobValidateResponse {
        driver_config_validated: false,
        error: errors.join("\n"),
        validation_errors: errors,
        warnings: String::new(),
    }))
}

/// `GET /v1/evaluation/:id`: complete, since the work was queued when the call returned.
pub(super) async fn evaluation(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<shapes::Evaluation>> {
    server.block(&params).await?;
    Ok(Json(shared::evaluation(&server.registry, &id)?))
}

/// `PUT|POST /v1/allocation/:id/stop`.
pub(super) async fn stop_allocation(
    State(server): State<Shared>,
    Path(id): Path<String>,
) -> NomadResult<Json<Value>> {
    let scheduler = server.leading()?.scheduler().clone();
    scheduler.stop(&id, "stopped through Nomad's API").await.map_err(fleet_error)?;
    Ok(Json(json!({"EvalID": crate::agent::new_alloc_id(), "Index": server.index()})))
}
