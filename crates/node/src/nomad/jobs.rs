//! Nomad's job endpoints on the agent: register (each group's `Count` allocations placed on
//! this node), list, read, stop (and purge), the job's allocations, validation, and the
//! evaluations registrations and stops leave behind.
//!
//! Registering a job that is already registered and unchanged places nothing; a changed job
//! stops the allocations of the old version, then places the new ones. If one of the new
//! allocations cannot be placed, the ones placed by the same call are stopped again and the
//! call fails with the reason.

use super::common::{
    NomadApiError, NomadResult, NomadServer, Params, Shared, block, flag, json_body, now,
};
use super::registry::{AllocRecord, EvalRecord, JobRecord};
use super::views;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use wharf_nomad::shapes::{self, JobRegisterResponse};
use wharf_nomad::{NomadJob, translate};
use wharf_state::Timestamp;

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
    let body = json_body(&server, body).await?;
    let job = wharf_nomad::job_of_request(&body)
        .map_err(|e| NomadApiError::bad_request(e.to_string()))?;
    let nomad = translate(job).map_err(|e| NomadApiError::bad_request(e.to_string()))?;
    if let Some(id) = path
        && id != nomad.id
    {
        return Err(NomadApiError::bad_request(format!(
            "the path names job {id:?}, the body {:?}",
            nomad.id
        )));
    }
    let _changing = server.changing.lock().await;
    let at = now();
    let eval =
        EvalRecord { id: crate::agent::new_alloc_id(), triggered_by: "job-register".into(), at };
    let mut record = match server.registry.get(&nomad.id) {
        Some(old) if old.job == nomad.submitted && !old.stopped => old,
        Some(mut old) => {
            stop_allocs(&server, &old).await?;
            old.job = nomad.submitted.clone();
            old.version += 1;
            old.stopped = false;
            let placed = place(&server, &nomad, &eval.id, at).await?;
            old.allocs.extend(placed);
            old
        }
        None => {
            let allocs = place(&server, &nomad, &eval.id, at).await?;
            JobRecord {
                job: nomad.submitted.clone(),
                version: 0,
                created: at,
                modified: at,
                stopped: false,
                allocs,
                evals: Vec::new(),
            }
        }
    };
    record.modified = at.max(Timestamp(record.modified.0 + 1));
    record.evals.push(eval.clone());
    let modified = record.modified.0;
    server.registry.put(&nomad.id, record).map_err(NomadApiError::internal)?;
    Ok(Json(JobRegisterResponse {
        eval_id: eval.id,
        eval_create_index: modified,
        job_modify_index: modified,
        warnings: String::new(),
        last_index: modified,
        request_time: 0,
    }))
}

/// Places every allocation of `nomad`, or none: a failure stops those already placed.
async fn place(
    server: &NomadServer,
    nomad: &NomadJob,
    eval_id: &str,
    at: Timestamp,
) -> NomadResult<Vec<AllocRecord>> {
    let mut placed: Vec<AllocRecord> = Vec::new();
    for group in &nomad.groups {
        for index in 0..group.count {
            let id = crate::agent::new_alloc_id();
            match server.agent.submit_as(group.instance(&nomad.name, index), Some(id.clone())).await
            {
                Ok(_) => placed.push(AllocRecord {
                    id,
                    group: group.name.clone(),
                    index,
                    eval_id: eval_id.to_owned(),
                    created: at,
                }),
                Err(error) => {
                    for done in &placed {
                        if let Err(stop_error) = server.agent.stop(&done.id).await {
                            tracing::warn!(alloc_id = %done.id, error = %stop_error, "cannot stop an allocation of a failed registration");
                        }
                    }
                    let error = NomadApiError::from(error);
                    return Err(NomadApiError::new(
                        error.status,
                        format!("group {:?}: {}", group.name, error.message),
                    ));
                }
            }
        }
    }
    Ok(placed)
}

async fn stop_allocs(server: &NomadServer, record: &JobRecord) -> NomadResult<()> {
    for alloc in &record.allocs {
        match server.agent.stop(&alloc.id).await {
            // Collected already: nothing left to stop.
            Ok(()) | Err(crate::agent::AgentError::UnknownAlloc(_)) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
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

fn job_id(record: &JobRecord) -> String {
    record.job.get("ID").and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn text<'a>(record: &'a JobRecord, key: &str, default: &'a str) -> &'a str {
    record.job.get(key).and_then(Value::as_str).unwrap_or(default)
}

fn stub(server: &NomadServer, record: &JobRecord) -> shapes::JobListStub {
    let statuses = statuses(server, record);
    let mut summary: BTreeMap<String, shapes::TaskGroupSummary> = BTreeMap::new();
    for group in record.job.get("TaskGroups").and_then(Value::as_array).into_iter().flatten() {
        if let Some(name) = group.get("Name").and_then(Value::as_str) {
            summary.entry(name.to_owned()).or_default();
        }
    }
    for (group, status) in &statuses {
        summary.entry(group.clone()).or_default().add(*status);
    }
    let id = job_id(record);
    let namespace = text(record, "Namespace", "default").to_owned();
    let meta = record
        .job
        .get("Meta")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    shapes::JobListStub {
        id: id.clone(),
        parent_id: String::new(),
        name: text(record, "Name", &id).to_owned(),
        namespace: namespace.clone(),
        datacenters: record
            .job
            .get("Datacenters")
            .and_then(|d| serde_json::from_value(d.clone()).ok())
            .unwrap_or_default(),
        job_type: text(record, "Type", "service").to_owned(),
        priority: record.job.get("Priority").and_then(Value::as_u64).unwrap_or(50),
        periodic: false,
        parameterized_job: false,
        stop: record.stopped,
        status: shapes::job_status(record.stopped, statuses.iter().map(|(_, s)| *s)).to_owned(),
        status_description: String::new(),
        job_summary: shapes::JobSummary {
            job_id: id,
            namespace,
            summary,
            create_index: record.created.0,
            modify_index: record.modified.0,
        },
        create_index: record.created.0,
        modify_index: record.modified.0,
        job_modify_index: record.modified.0,
        submit_time: shapes::nanos(record.modified),
        meta,
    }
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
        .filter(|r| job_id(r).starts_with(prefix))
        .map(|r| stub(&server, r))
        .collect();
    Ok(Json(jobs))
}

fn record_of(server: &NomadServer, id: &str) -> NomadResult<JobRecord> {
    server.registry.get(id).ok_or_else(|| NomadApiError::not_found("job not found"))
}

/// `GET /v1/job/:id`: the job as registered, with the server's fields filled in.
pub(crate) async fn read(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Value>> {
    block(&server, &params).await?;
    let record = record_of(&server, &id)?;
    let status = stub(&server, &record).status;
    let mut job = record.job.clone();
    if let Value::Object(fields) = &mut job {
        let server_fields = [
            ("Status", json!(status)),
            ("Stop", json!(record.stopped)),
            ("Version", json!(record.version)),
            ("Stable", json!(false)),
            ("SubmitTime", json!(shapes::nanos(record.modified))),
            ("CreateIndex", json!(record.created.0)),
            ("ModifyIndex", json!(record.modified.0)),
            ("JobModifyIndex", json!(record.modified.0)),
        ];
        for (key, value) in server_fields {
            fields.insert(key.to_owned(), value);
        }
    }
    Ok(Json(job))
}

/// `DELETE /v1/job/:id` (`?purge=true` forgets the job as well).
pub(crate) async fn deregister(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<JobRegisterResponse>> {
    let purge = flag(&params, "purge")?;
    let _changing = server.changing.lock().await;
    let mut record = record_of(&server, &id)?;
    stop_allocs(&server, &record).await?;
    let at = now();
    let eval =
        EvalRecord { id: crate::agent::new_alloc_id(), triggered_by: "job-deregister".into(), at };
    record.stopped = true;
    record.modified = at.max(Timestamp(record.modified.0 + 1));
    record.evals.push(eval.clone());
    let modified = record.modified.0;
    if purge {
        server.registry.purge(&id, record.modified).map_err(NomadApiError::internal)?;
    } else {
        server.registry.put(&id, record).map_err(NomadApiError::internal)?;
    }
    Ok(Json(JobRegisterResponse {
        eval_id: eval.id,
        eval_create_index: modified,
        job_modify_index: modified,
        warnings: String::new(),
        last_index: modified,
        request_time: 0,
    }))
}

/// `GET /v1/job/:id/allocations`.
pub(crate) async fn allocations(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::AllocationListStub>>> {
    block(&server, &params).await?;
    let record = record_of(&server, &id)?;
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
    let body = json_body(&server, body).await?;
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
    let (record, eval) =
        server.registry.eval(&id).ok_or_else(|| NomadApiError::not_found("eval not found"))?;
    let index = eval.at.0;
    Ok(Json(shapes::Evaluation {
        id: eval.id,
        priority: record.job.get("Priority").and_then(Value::as_u64).unwrap_or(50),
        eval_type: text(&record, "Type", "service").to_owned(),
        triggered_by: eval.triggered_by,
        namespace: text(&record, "Namespace", "default").to_owned(),
        job_id: job_id(&record),
        job_modify_index: index,
        node_id: String::new(),
        deployment_id: String::new(),
        status: "complete".to_owned(),
        status_description: String::new(),
        next_eval: String::new(),
        previous_eval: String::new(),
        blocked_eval: String::new(),
        failed_t_g_allocs: None,
        queued_allocations: BTreeMap::new(),
        snapshot_index: index,
        create_index: index,
        modify_index: index,
        create_time: shapes::nanos(eval.at),
        modify_time: shapes::nanos(eval.at),
    }))
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
