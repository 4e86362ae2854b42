//! Nomad's job endpoints on the agent: register (each group's `Count` allocations placed on
//! this node), list, read, stop (and purge), the job's allocations, validation, and the
//! evaluations registrations and stops leave behind. The registration's flow and the job's
//! shapes are [`crate::nomad_http::jobs`]; here is how the agent places and stops.

use super::common::{NomadServer, Shared, block};
use super::views;
use crate::nomad_http::jobs::{self as shared, Placer};
use crate::nomad_http::registry::JobRecord;
use crate::nomad_http::{NomadApiError, NomadResult, Params, flag, json_body};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use wharf_nomad::shapes::{self, JobRegisterResponse};
use wharf_nomad::translate;

/// `PUT|POST /v1/jobs`.
pub(crate) async fn register(
    State(server): State<Shared>,
    body: Body,
) -> NomadResult<Json<JobRegisterResponse>> {
    register_as(server, None, body).await
}

/// `PUT|POST /v1/job/:id`: the body's job must be the one the path names.
pub(crate) async fn register_at(
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
    let body = json_body(server.agent.config().max_body_bytes, body).await?;
    let nomad = shared::job_to_register(&body, path.as_deref())?;
    // A task of its own: a client that hangs up mid-registration does not cut it short.
    let registering = tokio::spawn(async move {
        let _changing = server.changing.lock().await;
        shared::register(server.as_ref(), &server.registry, &nomad).await
    });
    Ok(Json(registering.await.map_err(NomadApiError::internal)??))
}

/// The agent places on itself.
impl Placer for NomadServer {
    async fn place_one(&self, id: &str, job: wharf_state::Job) -> NomadResult<()> {
        self.agent.submit_as(job, Some(id.to_owned())).await?;
        Ok(())
    }

    async fn stop_one(&self, id: &str, _why: &str) -> NomadResult<()> {
        match self.agent.stop(id).await {
            // Collected already: nothing left to stop.
            Ok(()) | Err(crate::agent::AgentError::UnknownAlloc(_)) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// The client statuses of a job's allocations that the node still has, by group.
fn statuses(server: &NomadServer, record: &JobRecord) -> Vec<(String, wharf_state::ClientStatus)> {
    record
        .allocs
        .iter()
        .filter_map(|a| {
            server
                .agent
                .get(&a.id)
                .ok()
                .map(|runner| (a.group.clone(), runner.subscribe().borrow().client_status))
        })
        .collect()
}

fn stub(server: &NomadServer, record: &JobRecord) -> shapes::JobListStub {
    shared::stub(record, &statuses(server, record))
}

/// `GET /v1/jobs` (`?prefix=`).
pub(crate) async fn list(
    State(server): State<Shared>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::JobListStub>>> {
    block(&server, &params).await?;
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
pub(crate) async fn read(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Value>> {
    block(&server, &params).await?;
    let record = shared::record_of(&server.registry, &id)?;
    let status = stub(&server, &record).status;
    Ok(Json(shared::job(&record, &status)))
}

/// `DELETE /v1/job/:id` (`?purge=true` forgets the job as well).
pub(crate) async fn deregister(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<JobRegisterResponse>> {
    let purge = flag(&params, "purge")?;
    let _changing = server.changing.lock().await;
    Ok(Json(shared::deregister(server.as_ref(), &server.registry, &id, purge).await?))
}

/// `GET /v1/job/:id/allocations`.
pub(crate) async fn allocations(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::AllocationListStub>>> {
    block(&server, &params).await?;
    let record = shared::record_of(&server.registry, &id)?;
    let mut stubs: Vec<shapes::AllocationListStub> = record
        .allocs
        .iter()
        .filter_map(|a| server.agent.get(&a.id).ok())
        .map(|runner| shapes::AllocationListStub::from(&views::allocation(&server, &runner)))
        .collect();
    stubs.sort_by(|a, b| b.create_index.cmp(&a.create_index).then_with(|| a.name.cmp(&b.name)));
    Ok(Json(stubs))
}

/// `PUT|POST /v1/validate/job`: the translation and the node's drivers' own checks, as
/// Nomad's validation answer (200 with the errors listed).
pub(crate) async fn validate(
    State(server): State<Shared>,
    body: Body,
) -> NomadResult<Json<shapes::JobValidateResponse>> {
    let body = json_body(server.agent.config().max_body_bytes, body).await?;
    let mut errors = Vec::new();
    let translated = wharf_nomad::job_of_request(&body).and_then(translate);
    match translated {
        Err(error) => errors.push(error.to_string()),
        Ok(nomad) => {
            for group in &nomad.groups {
                for task in group.job.groups.iter().flat_map(|g| &g.tasks) {
                    match server.agent.drivers().get(&task.driver) {
                        None => errors.push(format!(
                            "task {:?}: this node has no {:?} driver",
                            task.name, task.driver
                        )),
                        Some(driver) => {
                            if let Err(error) = driver.validate_config(&task.config) {
                                errors.push(format!("task {:?}: {error}", task.name));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(Json(shapes::JobValidateResponse {
        driver_config_validated: errors.is_empty(),
        error: errors.join("\n"),
        validation_errors: errors,
        warnings: String::new(),
    }))
}

/// `GET /v1/evaluation/:id`: complete, since placing was done when the call returned.
pub(crate) async fn evaluation(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<shapes::Evaluation>> {
    block(&server, &params).await?;
    Ok(Json(shared::evaluation(&server.registry, &id)?))
}

/// `PUT|POST /v1/allocation/:id/stop`.
pub(crate) async fn stop_allocation(
    State(server): State<Shared>,
    Path(id): Path<String>,
) -> NomadResult<(StatusCode, Json<Value>)> {
    server.agent.stop(&id).await?;
    let eval_id = crate::agent::new_alloc_id();
    Ok((StatusCode::OK, Json(json!({"EvalID": eval_id, "Index": server.index()}))))
}
