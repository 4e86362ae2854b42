//! Nomad's job calls as any server answers them, from the [`Registry`] and a [`Placer`] that
//! places and stops the allocations (the agent on itself, the fleet on its workers):
//! register, stop (and purge), and the job, its list stub and its evaluations in Nomad's
//! shapes.
//!
//! Registering a job that is already registered and unchanged places nothing; a changed job
//! stops the allocations of the old version, then places the new ones. A placer that cannot
//! place them all stops those it placed and fails with the reason.

use super::registry::{AllocRecord, EvalRecord, JobRecord, Registry};
use super::{NomadApiError, NomadResult, now};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use wharf_nomad::NomadJob;
use wharf_nomad::shapes::{self, JobRegisterResponse};
use wharf_state::{ClientStatus, Timestamp};

/// Places and stops a server's allocations.
pub(crate) trait Placer {
    /// Places every allocation of `nomad`, or none (those placed are stopped again).
    async fn place(
        &self,
        nomad: &NomadJob,
        eval_id: &str,
        at: Timestamp,
    ) -> NomadResult<Vec<AllocRecord>>;

    /// Stops the allocations of `record` that still run.
    async fn stop_allocs(&self, record: &JobRecord) -> NomadResult<()>;
}

/// A new evaluation's id.
fn new_id() -> String {
    crate::agent::new_alloc_id()
}

fn response(eval_id: String, modified: u64) -> JobRegisterResponse {
    JobRegisterResponse {
        eval_id,
        eval_create_index: modified,
        job_modify_index: modified,
        warnings: String::new(),
        last_index: modified,
        request_time: 0,
    }
}

/// Registers `nomad` (a register call's job, translated), placing what it asks for.
/// The job a registration's `body` carries, translated, for `PUT|POST /v1/jobs` (`path`
/// none) or `PUT|POST /v1/job/:id` (`path` the id, which must be the body's job's).
pub(crate) fn job_to_register(body: &Value, path: Option<&str>) -> NomadResult<NomadJob> {
    let job =
        wharf_nomad::job_of_request(body).map_err(|e| NomadApiError::bad_request(e.to_string()))?;
    let nomad =
        wharf_nomad::translate(job).map_err(|e| NomadApiError::bad_request(e.to_string()))?;
    if let Some(id) = path
        && id != nomad.id
    {
        return Err(NomadApiError::bad_request(format!(
            "the path names job {id:?}, the body {:?}",
            nomad.id
        )));
    }
    Ok(nomad)
}

pub(crate) async fn register(
    placer: &impl Placer,
    registry: &Registry,
    nomad: &NomadJob,
) -> NomadResult<JobRegisterResponse> {
    let at = now();
    let eval = EvalRecord { id: new_id(), triggered_by: "job-register".into(), at };
    let mut record = match registry.get(&nomad.id) {
        Some(old) if old.job == nomad.submitted && !old.stopped => old,
        Some(mut old) => {
            placer.stop_allocs(&old).await?;
            old.job = nomad.submitted.clone();
            old.version += 1;
            old.stopped = false;
            let placed = placer.place(nomad, &eval.id, at).await?;
            old.allocs.extend(placed);
            old
        }
        None => {
            let allocs = placer.place(nomad, &eval.id, at).await?;
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
    registry.put(&nomad.id, record).await.map_err(NomadApiError::internal)?;
    Ok(response(eval.id, modified))
}

/// Stops job `id`'s allocations; with `purge`, forgets the job as well.
pub(crate) async fn deregister(
    placer: &impl Placer,
    registry: &Registry,
    id: &str,
    purge: bool,
) -> NomadResult<JobRegisterResponse> {
    let mut record = record_of(registry, id)?;
    placer.stop_allocs(&record).await?;
    let at = now();
    let eval = EvalRecord { id: new_id(), triggered_by: "job-deregister".into(), at };
    record.stopped = true;
    record.modified = at.max(Timestamp(record.modified.0 + 1));
    record.evals.push(eval.clone());
    let modified = record.modified.0;
    if purge {
        registry.purge(id, record.modified).await.map_err(NomadApiError::internal)?;
    } else {
        registry.put(id, record).await.map_err(NomadApiError::internal)?;
    }
    Ok(response(eval.id, modified))
}

/// Job `id`'s record, or Nomad's 404.
pub(crate) fn record_of(registry: &Registry, id: &str) -> NomadResult<JobRecord> {
    registry.get(id).ok_or_else(|| NomadApiError::not_found("job not found"))
}

pub(crate) fn job_id(record: &JobRecord) -> String {
    record.job.get("ID").and_then(Value::as_str).unwrap_or_default().to_owned()
}

pub(crate) fn text<'a>(record: &'a JobRecord, key: &str, default: &'a str) -> &'a str {
    record.job.get(key).and_then(Value::as_str).unwrap_or(default)
}

/// The job's list stub, given the client statuses of its allocations that the server still
/// knows, by group.
pub(crate) fn stub(record: &JobRecord, statuses: &[(String, ClientStatus)]) -> shapes::JobListStub {
    let mut summary: BTreeMap<String, shapes::TaskGroupSummary> = BTreeMap::new();
    for group in record.job.get("TaskGroups").and_then(Value::as_array).into_iter().flatten() {
        if let Some(name) = group.get("Name").and_then(Value::as_str) {
            summary.entry(name.to_owned()).or_default();
        }
    }
    for (group, status) in statuses {
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

/// The job as registered, with the server's fields filled in (`status`: its stub's).
pub(crate) fn job(record: &JobRecord, status: &str) -> Value {
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
    job
}

/// Evaluation `id`: complete, since placing was done when the call that left it returned.
pub(crate) fn evaluation(registry: &Registry, id: &str) -> NomadResult<shapes::Evaluation> {
    let (record, eval) =
        registry.eval(id).ok_or_else(|| NomadApiError::not_found("eval not found"))?;
    let index = eval.at.0;
    Ok(shapes::Evaluation {
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
    })
}
