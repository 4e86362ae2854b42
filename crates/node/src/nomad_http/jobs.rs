//! Nomad's job calls as any server answers them, from the [`Registry`] and a [`Placer`] that
//! places and stops one allocation at a time (the agent on itself, the fleet on its workers):
//! register, stop (and purge), and the job, its list stub and its evaluations in Nomad's
//! shapes.
//!
//! Registering a job that is already registered and unchanged places nothing; a changed job
//! stops the allocations of the old version, then places the new ones. The record naming the
//! new allocations is durable before the first is placed, so a crash mid-registration leaves
//! no allocation that no job owns: the record says which were being placed, and registering
//! the job again stops those and places anew (as Nomad's scheduler takes up an evaluation
//! the server had written). A placer that cannot place them all has those it placed stopped,
//! the record is put back as it was, and the call fails with the reason.
//!
//! A record keeps the newest [`KEPT_EVALS`] evaluations and, besides the current
//! registration's allocations, the newest [`KEPT_OLD_ALLOCS`] of earlier ones: a job
//! registered over and over does not grow without bound.

use super::registry::{AllocRecord, EvalRecord, JobRecord, Registry};
use super::{NomadApiError, NomadResult, now};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use wharf_nomad::NomadJob;
use wharf_nomad::shapes::{self, JobRegisterResponse};
use wharf_state::{ClientStatus, Job, Timestamp};

/// The evaluations a job's record keeps.
pub(crate) const KEPT_EVALS: usize = 64;
/// The allocations of earlier registrations a job's record keeps.
pub(crate) const KEPT_OLD_ALLOCS: usize = 256;

/// Places and stops a server's allocations, one at a time.
pub(crate) trait Placer {
    /// Places allocation `id`, which runs `job` (one instance of a group).
    async fn place_one(&self, id: &str, job: Job) -> NomadResult<()>;

    /// Stops allocation `id`, for the reason `why`; one the server no longer has is stopped
    /// already.
    async fn stop_one(&self, id: &str, why: &str) -> NomadResult<()>;
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

/// A modify index after `previous`: now, or just past `previous` if the clock is behind it.
fn after(previous: Timestamp, at: Timestamp) -> Timestamp {
    at.max(Timestamp(previous.0 + 1))
}

/// Registers `nomad` (a register call's job, translated), placing what it asks for.
pub(crate) async fn register(
    placer: &impl Placer,
    registry: &Registry,
    nomad: &NomadJob,
) -> NomadResult<JobRegisterResponse> {
    let at = now();
    let eval = EvalRecord { id: new_id(), triggered_by: "job-register".into(), at };
    let old = registry.get(&nomad.id);
    let mut record = match &old {
        Some(old) if old.job == nomad.submitted && !old.stopped && old.placing.is_empty() => {
            let mut record = old.clone();
            record.modified = after(record.modified, at);
            record.evals.push(eval.clone());
            prune(&mut record);
            let modified = record.modified.0;
            registry.put(&nomad.id, record).await.map_err(NomadApiError::internal)?;
            return Ok(response(eval.id, modified));
        }
        Some(old) => {
            if let Err(error) = stop_all(placer, old, "its job was registered again").await {
                restore(registry, &nomad.id, old.clone(), old.modified).await;
                return Err(error);
            }
            let mut record = old.clone();
            // A registration a crash interrupted is taken up again under the same version.
            if record.job != nomad.submitted || record.stopped {
                record.version += 1;
            }
            record.job = nomad.submitted.clone();
            record.stopped = false;
            record
        }
        None => JobRecord {
            job: nomad.submitted.clone(),
            version: 0,
            created: at,
            modified: at,
            stopped: false,
            allocs: Vec::new(),
            evals: Vec::new(),
            placing: Vec::new(),
        },
    };
    let planned = plan(nomad, &eval.id, at);
    record.allocs.extend(planned.iter().map(|(alloc, _)| alloc.clone()));
    record.placing = planned.iter().map(|(alloc, _)| alloc.id.clone()).collect();
    record.modified = after(record.modified, at);
    record.evals.push(eval.clone());
    prune(&mut record);
    registry.put(&nomad.id, record.clone()).await.map_err(NomadApiError::internal)?;

    if let Err(error) = place_all(placer, planned).await {
        match old {
            Some(old) => restore(registry, &nomad.id, old, record.modified).await,
            None => {
                if let Err(purge_error) =
                    registry.purge(&nomad.id, after(record.modified, at)).await
                {
                    tracing::warn!(job = %nomad.id, error = %purge_error, "cannot forget the record of a failed registration; registering the job again mends it");
                }
            }
        }
        return Err(error);
    }
    record.placing.clear();
    let modified = record.modified.0;
    registry.put(&nomad.id, record).await.map_err(NomadApiError::internal)?;
    Ok(response(eval.id, modified))
}

/// Puts `old` back as job `id`'s record after a registration that stopped (or may have
/// stopped) its allocations and then failed, at an index after `modified`. Its current
/// allocations are marked as being placed, so that registering the job again, even as it
/// was, places them anew (a stopped job's were stopped already).
async fn restore(registry: &Registry, id: &str, mut old: JobRecord, modified: Timestamp) {
    if !old.stopped {
        let current = current_eval(&old).map(str::to_owned);
        old.placing = old
            .allocs
            .iter()
            .filter(|a| Some(a.eval_id.as_str()) == current.as_deref())
            .map(|a| a.id.clone())
            .collect();
    }
    old.modified = after(modified, now());
    if let Err(error) = registry.put(id, old).await {
        tracing::warn!(job = %id, %error, "cannot put back the record of a failed registration; registering the job again mends it");
    }
}

/// The evaluation that placed the job's current allocations: the latest that placed any.
fn current_eval(record: &JobRecord) -> Option<&str> {
    record.allocs.last().map(|a| a.eval_id.as_str())
}

/// Every allocation `nomad` asks for, with the job it runs: each group's `Count`, in order.
fn plan(nomad: &NomadJob, eval_id: &str, at: Timestamp) -> Vec<(AllocRecord, Job)> {
    let mut planned = Vec::new();
    for group in &nomad.groups {
        for index in 0..group.count {
            let alloc = AllocRecord {
                id: new_id(),
                group: group.name.clone(),
                index,
                eval_id: eval_id.to_owned(),
                created: at,
            };
            planned.push((alloc, group.instance(&nomad.name, index)));
        }
    }
    planned
}

/// Places every allocation of `planned`, or none: on the first refusal, those placed are
/// stopped again and the refusal is returned, naming its group.
async fn place_all(placer: &impl Placer, planned: Vec<(AllocRecord, Job)>) -> NomadResult<()> {
    let mut placed: Vec<String> = Vec::new();
    for (alloc, job) in planned {
        if let Err(error) = placer.place_one(&alloc.id, job).await {
            // The refused one too: a refusal may come after the placement took.
            placed.push(alloc.id.clone());
            for id in &placed {
                if let Err(stop_error) = placer.stop_one(id, "its job's registration failed").await
                {
                    tracing::warn!(alloc_id = %id, error = %stop_error.message, "cannot stop an allocation of a failed registration");
                }
            }
            return Err(NomadApiError::new(
                error.status,
                format!("group {:?}: {}", alloc.group, error.message),
            ));
        }
        placed.push(alloc.id);
    }
    Ok(())
}

/// Stops every allocation `record` names.
async fn stop_all(placer: &impl Placer, record: &JobRecord, why: &str) -> NomadResult<()> {
    for alloc in &record.allocs {
        placer.stop_one(&alloc.id, why).await?;
    }
    Ok(())
}

/// Drops the oldest evaluations, and the oldest allocations of earlier registrations, beyond
/// what a record keeps. The current allocations (those of the latest registration that
/// placed any) are never dropped, nor are any being placed.
fn prune(record: &mut JobRecord) {
    let excess = record.evals.len().saturating_sub(KEPT_EVALS);
    record.evals.drain(..excess);
    let Some(current) = current_eval(record).map(str::to_owned) else { return };
    let droppable = |a: &AllocRecord| a.eval_id != current && !record.placing.contains(&a.id);
    let old = record.allocs.iter().filter(|a| droppable(a)).count();
    let mut dropping = old.saturating_sub(KEPT_OLD_ALLOCS);
    let droppable: Vec<bool> = record.allocs.iter().map(droppable).collect();
    // Oldest first.
    let mut index = 0;
    record.allocs.retain(|_| {
        let drop = dropping > 0 && droppable[index];
        index += 1;
        dropping -= usize::from(drop);
        !drop
    });
}

/// Stops job `id`'s allocations; with `purge`, forgets the job as well.
pub(crate) async fn deregister(
    placer: &impl Placer,
    registry: &Registry,
    id: &str,
    purge: bool,
) -> NomadResult<JobRegisterResponse> {
    let mut record = record_of(registry, id)?;
    stop_all(placer, &record, "its job was stopped through Nomad's API").await?;
    let at = now();
    let eval = EvalRecord { id: new_id(), triggered_by: "job-deregister".into(), at };
    record.stopped = true;
    record.placing.clear();
    record.modified = after(record.modified, at);
    record.evals.push(eval.clone());
    prune(&mut record);
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

/// Evaluation `id`: complete, since placing was done when the call that left it returned,
/// unless a crash cut that call short (pending until the job is registered again).
pub(crate) fn evaluation(registry: &Registry, id: &str) -> NomadResult<shapes::Evaluation> {
    let (record, eval) =
        registry.eval(id).ok_or_else(|| NomadApiError::not_found("eval not found"))?;
    let index = eval.at.0;
    // A registration a crash interrupted left its allocations being placed.
    let unfinished =
        record.allocs.iter().any(|a| a.eval_id == eval.id && record.placing.contains(&a.id));
    let status = if unfinished { "pending" } else { "complete" };
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
        status: status.to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::path::Path;
    use tokio::sync::Notify;

    /// What a placer was asked.
    #[derive(Default)]
    struct Asked {
        placed: Vec<String>,
        stopped: Vec<String>,
    }

    /// A placer that checks, before each placement, that the record naming the allocation
    /// is already on disk; refuses the placement numbered `refuse_at`; and at `hang_at` says
    /// so on `reached` and never returns (the server dies there).
    struct CheckingPlacer<'a> {
        data_dir: &'a Path,
        job: &'a str,
        refuse_at: Option<usize>,
        hang_at: Option<usize>,
        reached: Notify,
        asked: Mutex<Asked>,
    }

    impl<'a> CheckingPlacer<'a> {
        fn new(data_dir: &'a Path, job: &'a str) -> CheckingPlacer<'a> {
            CheckingPlacer {
                data_dir,
                job,
                refuse_at: None,
                hang_at: None,
                reached: Notify::new(),
                asked: Mutex::default(),
            }
        }
    }

    impl Placer for CheckingPlacer<'_> {
        async fn place_one(&self, id: &str, _job: Job) -> NomadResult<()> {
            let on_disk = Registry::open(self.data_dir).unwrap().get(self.job);
            let named = on_disk.is_some_and(|r| r.placing.iter().any(|p| p == id));
            assert!(named, "allocation {id} is placed before a durable record names it");
            let count = self.asked.lock().placed.len();
            if self.hang_at == Some(count) {
                self.reached.notify_one();
                std::future::pending::<()>().await;
            }
            if self.refuse_at == Some(count) {
                return Err(NomadApiError::bad_request("no room"));
            }
            self.asked.lock().placed.push(id.to_owned());
            Ok(())
        }

        async fn stop_one(&self, id: &str, _why: &str) -> NomadResult<()> {
            self.asked.lock().stopped.push(id.to_owned());
            Ok(())
        }
    }

    fn job(count: u32, command: &str) -> NomadJob {
        wharf_nomad::translate(&json!({
            "ID": "web", "Type": "service",
            "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [
                {"Name": "t", "Driver": "raw_exec", "Config": {"command": command}}
            ]}]
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn register_places_each_allocation_once_its_record_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let placer = CheckingPlacer::new(dir.path(), "web");
        register(&placer, &registry, &job(3, "/bin/true")).await.unwrap();
        let record = Registry::open(dir.path()).unwrap().get("web").unwrap();
        let ids: Vec<String> = record.allocs.iter().map(|a| a.id.clone()).collect();
        assert_eq!(ids, placer.asked.lock().placed);
        assert!(record.placing.is_empty(), "every allocation placed: {record:?}");
        let eval = evaluation(&registry, &record.evals[0].id).unwrap();
        assert_eq!(eval.status, "complete");
    }

    #[tokio::test]
    async fn a_refused_placement_stops_those_placed_and_puts_the_record_back() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let mut refusing = CheckingPlacer::new(dir.path(), "web");
        refusing.refuse_at = Some(1);
        let error = register(&refusing, &registry, &job(3, "/bin/true")).await.unwrap_err();
        assert!(error.message.contains("group \"g\": no room"), "{}", error.message);
        {
            let asked = refusing.asked.lock();
            assert_eq!(asked.placed.len(), 1);
            assert_eq!(asked.stopped.len(), 2, "the one placed and the one refused are stopped");
            assert_eq!(asked.stopped[0], asked.placed[0]);
        }
        assert!(registry.get("web").is_none());
        assert!(Registry::open(dir.path()).unwrap().get("web").is_none(), "nor on disk");

        // A changed job that cannot be placed leaves the old version's record.
        register(&CheckingPlacer::new(dir.path(), "web"), &registry, &job(1, "/bin/true"))
            .await
            .unwrap();
        let before = registry.get("web").unwrap();
        let error = register(&refusing, &registry, &job(2, "/bin/false")).await.unwrap_err();
        assert!(error.message.contains("no room"), "{}", error.message);
        let after = Registry::open(dir.path()).unwrap().get("web").unwrap();
        assert_eq!((&after.job, after.version, &after.allocs), (&before.job, 0, &before.allocs));
        assert!(after.modified > before.modified, "the index still grows");
        // Its allocations were stopped for the new version: registering it again as it was
        // places them anew.
        let ids: Vec<String> = before.allocs.iter().map(|a| a.id.clone()).collect();
        assert_eq!(after.placing, ids, "marked to be placed again");
        let placer = CheckingPlacer::new(dir.path(), "web");
        register(&placer, &registry, &job(1, "/bin/true")).await.unwrap();
        assert_eq!(placer.asked.lock().placed.len(), 1, "placed anew");
        assert!(registry.get("web").unwrap().placing.is_empty());
    }

    #[tokio::test]
    async fn a_registration_cut_short_is_taken_up_by_registering_again() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let mut dying = CheckingPlacer::new(dir.path(), "web");
        dying.hang_at = Some(1);
        let web = job(3, "/bin/true");
        tokio::select! {
            _ = register(&dying, &registry, &web) => panic!("the registration returned"),
            () = dying.reached.notified() => {}
        }
        // The server died placing the second of three: its record, as a restart reads it,
        // names all three as being placed, and its evaluation is pending.
        let registry = Registry::open(dir.path()).unwrap();
        let cut_short = registry.get("web").unwrap();
        assert_eq!(cut_short.placing.len(), 3);
        let eval_id = cut_short.evals[0].id.clone();
        assert_eq!(evaluation(&registry, &eval_id).unwrap().status, "pending");

        let placer = CheckingPlacer::new(dir.path(), "web");
        register(&placer, &registry, &web).await.unwrap();
        let asked = placer.asked.lock();
        assert_eq!(asked.stopped, cut_short.placing, "what may have been placed is stopped");
        assert_eq!(asked.placed.len(), 3, "and placed anew");
        let record = registry.get("web").unwrap();
        assert!(record.placing.is_empty());
        assert_eq!(record.version, 0, "the same job, taken up again");
        assert_eq!(evaluation(&registry, &eval_id).unwrap().status, "complete");
    }

    #[tokio::test]
    async fn a_job_registered_over_and_over_keeps_a_bounded_record() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let placer = CheckingPlacer::new(dir.path(), "web");
        let rounds = KEPT_OLD_ALLOCS + 20;
        for round in 0..rounds {
            register(&placer, &registry, &job(1, &format!("/bin/true{round}"))).await.unwrap();
        }
        let record = registry.get("web").unwrap();
        assert_eq!(record.version, rounds as u64 - 1);
        assert_eq!(record.evals.len(), KEPT_EVALS);
        assert_eq!(record.allocs.len(), KEPT_OLD_ALLOCS + 1);
        let newest = placer.asked.lock().placed.last().cloned();
        assert_eq!(record.allocs.last().map(|a| a.id.clone()), newest, "the current one is kept");
    }
}
