//! The fleet's management API (JSON; errors as `{"error": "..."}` with a 4xx for bad requests).
//!
//! | call | what |
//! |------|------|
//! | `GET /v1/health` | liveness and the brake (no token needed) |
//! | `POST /v1/allocations[?id=ID]` | submit a job spec (TOML or JSON); `{"id": ...}` |
//! | `GET /v1/allocations[?job=JOB]` | every allocation the scheduler knows (of job `JOB`) |
//! | `GET /v1/allocations/{id}[?after=V&wait=10s]` | one; waits for a version after `V` |
//! | `POST /v1/allocations/{id}/stop` | cancel it if queued, stop it if running |
//! | `GET /v1/workers` | every worker: state, idle behaviour, probes, allocations |
//! | `POST /v1/workers/{id}/{hold,drain,run,kill,probe}` | operator actions (`probe`: now) |
//! | `GET /v1/metrics` | the pool's and the scheduler's metrics (Prometheus) |
//! | `GET /v1/status` | this replica, the leader, the replicas and the store |
//! | `GET\|PUT\|DELETE /v1/var/{path}`, `GET /v1/vars[?prefix=P]` | the variables it serves to its workers ([`super::variables`]) |
//! | `/arvados/v1/dispatch/instances[/{hold,drain,run,kill}]` | Arvados' management API ([`super::arvados`]) |
//!
//! Every call but `/v1/health` requires the fleet's token, as `Authorization: Bearer <token>`:
//! the configured one, or the one the fleet keeps in its data directory
//! ([`crate::api_token::FLEET`]). None is a 401, a wrong one a 403.
//!
//! Every replica answers. The leader serves everything; a follower serves its status, its
//! metrics and the allocations as the store holds them, and forwards the rest to the leader
//! (the answer says who in `x-wharf-leader`); with no leader (an election under way) it
//! answers 503, and a client tries again.

use super::wiring::{Fleet, Leading};
use crate::api::extract::{Path, Query};
use crate::api::{ApiError, check_token, job_spec};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::WorkPhaseName;
use wharf_fleet::{FleetError, Placement, Replica, StoreInfo, Submission, WorkPhase};
use wharf_prober::{IdleBehavior, InstanceId, ProberError, State as WorkerState, WorkerView};
use wharf_state::resources::Amount;

type ApiResult<T> = Result<T, ApiError>;

/// The fleet's router.
pub fn router(fleet: Arc<Fleet>) -> Router {
    let protected = Router::new()
        .route("/v1/allocations", post(submit).get(list))
        .route("/v1/allocations/{id}", get(status))
        .route("/v1/allocations/{id}/stop", post(stop))
        .route("/v1/workers", get(workers))
        .route("/v1/workers/{id}/{action}", post(worker_action))
        .route("/v1/metrics", get(metrics))
        .route("/v1/status", get(fleet_status))
        .merge(super::arvados::routes())
        .merge(crate::variables::routes(fleet.variables().clone()))
        .route_layer(axum::middleware::from_fn_with_state(fleet.clone(), follow_the_leader))
        .route_layer(axum::middleware::from_fn_with_state(fleet.clone(), require_token));
    Router::new()
        .route("/v1/health", get(health))
        .merge(protected)
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "no such endpoint; see the fleet API table")
        })
        .method_not_allowed_fallback(crate::api::method_not_allowed)
        .with_state(fleet)
}

async fn require_token(State(fleet): State<Arc<Fleet>>, request: Request, next: Next) -> Response {
    match check_token(fleet.config().token.as_deref(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// What a follower answers itself; everything else goes to the leader.
fn followers_answer(request: &Request) -> bool {
    let path = request.uri().path();
    request.method() == axum::http::Method::GET
        && (path.starts_with("/v1/allocations") || path == "/v1/status" || path == "/v1/metrics")
}

/// On a follower, forwards what only the leader can answer.
async fn follow_the_leader(
    State(fleet): State<Arc<Fleet>>,
    request: Request,
    next: Next,
) -> Response {
    if fleet.leading().is_some() || followers_answer(&request) {
        return next.run(request).await;
    }
    forward(&fleet, request).await.unwrap_or_else(IntoResponse::into_response)
}

/// Sends `request` to the leader and returns its answer, naming the leader.
async fn forward(fleet: &Fleet, request: Request) -> ApiResult<Response> {
    let unavailable = |why: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why);
    let leader = fleet
        .store()
        .leader()
        .await
        .map_err(|e| unavailable(format!("cannot learn who leads the fleet: {e}")))?
        .filter(|leader| leader.name != fleet.replica().name)
        .ok_or_else(|| unavailable("no replica leads the fleet now; try again shortly".into()))?;
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, fleet.config().max_body_bytes)
        .await
        .map_err(|e| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()))?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let content_type = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let client = crate::client::Client::new(&leader.address, fleet.config().token.clone());
    let answer = client.send(parts.method, path, Some((content_type, bytes.to_vec()))).await;
    let mut response = match answer {
        Ok(answer) => {
            let status = answer.status();
            let content_type = answer.headers().get(axum::http::header::CONTENT_TYPE).cloned();
            let body = http_body_util::BodyExt::collect(answer.into_body())
                .await
                .map_err(|e| {
                    unavailable(format!("the leader at {} broke off: {e}", leader.address))
                })?
                .to_bytes();
            let mut response = (status, body).into_response();
            if let Some(content_type) = content_type {
                response.headers_mut().insert(axum::http::header::CONTENT_TYPE, content_type);
            }
            response
        }
        Err(crate::client::ClientError::Api { status, message }) => {
            ApiError::new(status, message).into_response()
        }
        Err(e) => {
            return Err(unavailable(format!(
                "the leader at {} does not answer: {e}",
                leader.address
            )));
        }
    };
    if let Ok(value) = axum::http::HeaderValue::from_str(&leader.address) {
        response.headers_mut().insert("x-wharf-leader", value);
    }
    Ok(response)
}

/// What leads here, or a 503 (it stopped leading since the request was let in).
fn leading(fleet: &Fleet) -> ApiResult<Arc<Leading>> {
    fleet.leading().ok_or_else(|| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "this replica no longer leads; try again")
    })
}

fn prober_error(error: &ProberError) -> ApiError {
    let status = match error {
        ProberError::UnknownWorker(_) => StatusCode::NOT_FOUND,
        ProberError::NotAllowed { .. } => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, error.to_string())
}

fn fleet_error(error: FleetError) -> ApiError {
    let status = match &error {
        FleetError::Prober(error) => return prober_error(error),
        FleetError::UnknownWork(_) => StatusCode::NOT_FOUND,
        FleetError::QueueFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
        FleetError::Submit { .. } => StatusCode::CONFLICT,
        // Not durable, so not taken: the client may try again (or another replica).
        FleetError::Store { .. } | FleetError::Fenced { .. } | FleetError::NotLeading { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    ApiError::new(status, error.to_string())
}

/// One allocation as the fleet reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetAlloc {
    /// Its id (also its id on the worker).
    pub id: String,
    /// The id of the job it runs, as its spec says (none for work found running).
    #[serde(default)]
    pub job: Option<String>,
    /// The job's group it runs.
    #[serde(default)]
    pub group: Option<String>,
    /// `queued`, `starting`, `running`, `ended`, `lost`, `failed` or `cancelled`.
    pub phase: WorkPhaseName,
    /// The worker it is (or was last) on.
    pub worker: Option<String>,
    /// For `ended`: what the worker said (`complete ...`, `failed ...`); for `lost` and
    /// `failed`: why.
    pub detail: Option<String>,
    /// The current attempt, from 1 (each reschedule is a new attempt).
    pub attempt: u32,
    /// Start commands sent for the current attempt.
    pub starts: u32,
    /// The id the current attempt runs under on its worker.
    pub runner_id: String,
    /// When a worker acknowledged the current attempt's start (RFC 3339).
    pub started: Option<String>,
    /// When the current attempt ended (RFC 3339), once the work is done with.
    pub finished: Option<String>,
    /// How the current attempt ended, once the work is done with, as each attempt in
    /// `history` says it: `ended: complete ...`, `ended: failed ...`, `lost: <why>`,
    /// `failed: <why>` or `cancelled`.
    pub outcome: Option<String>,
    /// For a reschedule: the delay the current attempt waits (or waited), in seconds.
    pub delay_seconds: Option<f64>,
    /// Queued after a reschedule: not placed before this (RFC 3339).
    pub not_before: Option<String>,
    /// The attempts before the current one, oldest first.
    pub history: Vec<FleetAttempt>,
    /// Queued: why it is placed nowhere yet (no worker has room, or none has what it needs,
    /// with the most any has; or its reschedule delay).
    pub waiting: Option<String>,
    /// What it needs of a worker.
    pub needs: Amount,
    /// Found running rather than submitted here.
    pub adopted: bool,
    /// Seconds from submission to the acknowledged start.
    pub start_latency_seconds: Option<f64>,
    /// Seconds since it was submitted.
    pub age_seconds: f64,
    /// The hourly price of the current attempt's worker's instance type, where it has one.
    #[serde(default)]
    pub price_per_hour: Option<f64>,
    /// What the current attempt's worker time has cost so far (to its end, once it ended):
    /// the price times the time from its start.
    #[serde(default)]
    pub cost: Option<f64>,
    /// What every attempt's worker time has cost, this one's included, where they had a price.
    #[serde(default)]
    pub total_cost: f64,
    /// Changes with every change of any allocation; pass it as `after` to wait for the next.
    pub version: u64,
}

/// An attempt that is over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetAttempt {
    /// Its number, from 1.
    pub attempt: u32,
    /// Its id on the worker.
    pub runner_id: String,
    /// The worker it ran on.
    pub worker: Option<String>,
    /// When it started (RFC 3339), if it did.
    pub started: Option<String>,
    /// When it ended (RFC 3339).
    pub finished: String,
    /// How it ended.
    pub outcome: String,
    /// For a reschedule: the delay it waited, in seconds.
    pub delay_seconds: Option<f64>,
    /// What its worker's time cost: the hourly price of the worker's instance type times the
    /// time from its start to its end, where the type has a price.
    #[serde(default)]
    pub cost: Option<f64>,
}

impl FleetAlloc {
    /// Whether it is done with.
    pub fn is_final(&self) -> bool {
        self.phase.is_final()
    }
}

/// The job and group a payload (the job spec the worker runs) names; none for one that is no
/// spec (adopted work has no payload).
fn job_of(payload: &str) -> (Option<String>, Option<String>) {
    #[derive(Deserialize)]
    struct Named {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        name: Option<String>,
    }
    #[derive(Deserialize)]
    struct Head {
        job: Named,
        group: Named,
    }
    match serde_json::from_str::<Head>(payload) {
        Ok(head) => (head.job.id, head.group.name),
        Err(_) => (None, None),
    }
}

/// The allocation as the API shows it; `payload` is its job spec, `waiting` why it is queued,
/// where the scheduler knows.
fn describe(
    fleet: &Fleet,
    placement: Placement,
    payload: &str,
    version: u64,
    waiting: Option<String>,
) -> FleetAlloc {
    let now = fleet.now();
    let (job, group) = job_of(payload);
    let detail = match &placement.phase {
        WorkPhase::Ended { outcome, .. } => Some(outcome.clone()),
        WorkPhase::Lost { reason, .. } | WorkPhase::Failed { reason } => Some(reason.clone()),
        _ => None,
    };
    FleetAlloc {
        job,
        group,
        phase: placement.phase.name(),
        worker: placement.phase.worker().map(str::to_owned),
        detail,
        attempt: placement.attempt,
        starts: placement.starts,
        runner_id: placement.runner_id(),
        started: placement.started.map(|at| at.to_string()),
        finished: placement.finished.map(|at| at.to_string()),
        outcome: placement.phase.attempt_outcome(),
        delay_seconds: placement.rescheduled.as_ref().map(|r| r.delay.as_secs_f64()),
        not_before: placement.not_before.map(|at| at.to_string()),
        history: placement
            .history
            .iter()
            .map(|a| FleetAttempt {
                attempt: a.attempt,
                runner_id: a.runner_id.clone(),
                worker: a.worker.clone(),
                started: a.started.map(|at| at.to_string()),
                finished: a.finished.to_string(),
                outcome: a.outcome.clone(),
                delay_seconds: a.rescheduled.as_ref().map(|r| r.delay.as_secs_f64()),
                cost: a.cost(),
            })
            .collect(),
        waiting,
        needs: placement.needs,
        adopted: placement.adopted,
        start_latency_seconds: placement
            .started
            .map(|started| started.since(placement.submitted).as_secs_f64()),
        age_seconds: now.since(placement.submitted).as_secs_f64(),
        price_per_hour: placement.price_micros_per_hour.map(|micros| micros as f64 / 1e6),
        cost: placement.cost(now),
        total_cost: placement.total_cost(now),
        id: placement.id,
        version,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitQuery {
    id: Option<String>,
}

async fn submit(
    State(fleet): State<Arc<Fleet>>,
    Query(query): Query<SubmitQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let job = job_spec(&headers, body, fleet.config().max_body_bytes).await?;
    let id = match query.id {
        Some(id) => {
            wharf_state::check_alloc_id(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
            id
        }
        None => crate::agent::new_alloc_id(),
    };
    // Workers get the checked spec in JSON, whatever the user wrote.
    let payload = serde_json::to_string(&job.to_spec())
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let group = job.groups.first().ok_or_else(|| ApiError::bad_request("the job has no group"))?;
    // Cores are counted as cores: their MHz depend on the worker.
    let submission = Submission {
        id,
        payload: payload.clone(),
        needs: Amount::of_group(group, 0),
        reschedule: job.reschedule_policy(group),
    };
    let scheduler = leading(&fleet)?.scheduler().clone();
    let placement = scheduler.submit(submission).await.map_err(fleet_error)?;
    let version = *scheduler.subscribe().borrow();
    let alloc = describe(&fleet, placement, &payload, version, None);
    Ok((StatusCode::CREATED, axum::Json(alloc)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    job: Option<String>,
}

async fn list(
    State(fleet): State<Arc<Fleet>>,
    Query(query): Query<ListQuery>,
) -> ApiResult<axum::Json<Vec<FleetAlloc>>> {
    let of_job = |alloc: &FleetAlloc| query.job.is_none() || alloc.job == query.job;
    let Some(leading) = fleet.leading() else {
        // A follower reads the store.
        let loaded = fleet.store().load_all().await.map_err(fleet_error)?;
        let mut all = loaded.records;
        all.sort_by(|a, b| {
            let (a, b) = (&a.placement, &b.placement);
            (a.submitted, &a.id).cmp(&(b.submitted, &b.id))
        });
        let all = all.into_iter().map(|r| describe(&fleet, r.placement, &r.payload, 0, None));
        return Ok(axum::Json(all.filter(of_job).collect()));
    };
    let scheduler = leading.scheduler();
    let version = *scheduler.subscribe().borrow();
    let all = scheduler.list().into_iter();
    Ok(axum::Json(
        all.map(|p| {
            let waiting = scheduler.waiting_reason(&p.id);
            let payload = scheduler.payload(&p.id).unwrap_or_default();
            describe(&fleet, p, &payload, version, waiting)
        })
        .filter(of_job)
        .collect(),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    after: Option<u64>,
    wait: Option<String>,
}

async fn status(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
    Query(query): Query<StatusQuery>,
) -> ApiResult<axum::Json<FleetAlloc>> {
    let wait = match &query.wait {
        Some(text) => wharf_state::duration::parse(text)
            .map_err(|e| ApiError::bad_request(format!("wait: {e}")))?
            .min(Duration::from_secs(60)),
        None => Duration::ZERO,
    };
    let Some(leading) = fleet.leading() else {
        // A follower reads the store, which tells it of no changes: a client that waits for
        // one is kept a second (at most its wait), so a follow loop does not spin.
        if query.after.is_some() {
            tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
        }
        let record = fleet.store().load(&id).await.map_err(fleet_error)?;
        let record = record.ok_or_else(|| fleet_error(FleetError::UnknownWork(id)))?;
        return Ok(axum::Json(describe(&fleet, record.placement, &record.payload, 0, None)));
    };
    let scheduler = leading.scheduler();
    let mut changes = scheduler.subscribe();
    if let Some(after) = query.after
        && *changes.borrow_and_update() == after
    {
        let _ = tokio::time::timeout(wait, changes.changed()).await;
    }
    let version = *changes.borrow();
    let placement = scheduler.get(&id).ok_or_else(|| fleet_error(FleetError::UnknownWork(id)))?;
    let waiting = scheduler.waiting_reason(&placement.id);
    let payload = scheduler.payload(&placement.id).unwrap_or_default();
    Ok(axum::Json(describe(&fleet, placement, &payload, version, waiting)))
}

async fn stop(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<FleetAlloc>> {
    let scheduler = leading(&fleet)?.scheduler().clone();
    let placement =
        scheduler.stop(&id, "stopped through the fleet API").await.map_err(fleet_error)?;
    let version = *scheduler.subscribe().borrow();
    let payload = scheduler.payload(&placement.id).unwrap_or_default();
    Ok(axum::Json(describe(&fleet, placement, &payload, version, None)))
}

/// One worker as the fleet reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetWorker {
    /// Its id (instance id, or host name).
    pub id: String,
    /// Where it is reached.
    pub address: Option<String>,
    /// `unknown`, `booting`, `idle`, `running` or `shutdown`.
    #[serde(with = "by_name")]
    pub state: WorkerState,
    /// `run`, `hold` or `drain`.
    #[serde(with = "by_name")]
    pub idle_behavior: IdleBehavior,
    /// Allocations running there.
    pub allocations: Vec<String>,
    /// Seconds since its last successful probe.
    pub last_probe_seconds: f64,
    /// Whether its last probe failed, and why.
    pub last_error: Option<String>,
    /// What it has for work, once its runner said.
    pub resources: Option<Amount>,
    /// What the work the fleet placed there needs.
    pub used: Amount,
    /// What it has less what is used, once its runner said.
    pub free: Option<Amount>,
    /// Its instance type's name (empty for loopback and static workers).
    #[serde(default)]
    pub instance_type: String,
    /// Its instance type's hourly price, where configured.
    #[serde(default)]
    pub price_per_hour: Option<f64>,
}

impl FleetWorker {
    fn of(view: WorkerView, used: Amount, price: Option<f64>) -> FleetWorker {
        let resources = view.resources.map(Amount::from);
        FleetWorker {
            instance_type: view.instance_type,
            price_per_hour: price,
            id: view.id.0,
            address: view.address,
            state: view.state,
            idle_behavior: view.idle_behavior,
            allocations: view.running.into_iter().chain(view.starting).collect(),
            last_probe_seconds: view.probe_age.as_secs_f64(),
            last_error: if view.last_probe_failed { view.last_error } else { None },
            free: resources.map(|has| has.saturating_sub(used)),
            resources,
            used,
        }
    }
}

async fn workers(State(fleet): State<Arc<Fleet>>) -> ApiResult<axum::Json<Vec<FleetWorker>>> {
    let leading = leading(&fleet)?;
    let usage = leading.scheduler().usage();
    let used = |id: &InstanceId| usage.get(&id.0).copied().unwrap_or(Amount::ZERO);
    let views = leading.pool().workers().into_iter();
    Ok(axum::Json(
        views
            .map(|view| {
                let used = used(&view.id);
                let price = leading.pool().instance_type(&view.instance_type).price;
                FleetWorker::of(view, used, price.map(|p| p.hourly()))
            })
            .collect(),
    ))
}

async fn worker_action(
    State(fleet): State<Arc<Fleet>>,
    Path((id, action)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let id = InstanceId(id);
    let leading = leading(&fleet)?;
    let pool = leading.pool();
    let result = match action.as_str() {
        "kill" => pool.kill_instance(&id, "killed through the fleet API").await,
        "probe" => pool.probe_now(&id).await.map(drop),
        other => match other.parse::<IdleBehavior>() {
            Ok(behavior) => fleet.set_idle_behavior(&leading, &id, behavior).await,
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "unknown action {other:?}: use hold, drain, run, kill or probe"
                )));
            }
        },
    };
    result.map_err(|e| prober_error(&e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The leader's pool and scheduler metrics; every replica says whether it leads.
async fn metrics(State(fleet): State<Arc<Fleet>>) -> String {
    let leading = fleet.leading();
    let mut text = String::new();
    if let Some(leading) = &leading {
        text.push_str(&leading.pool().metrics());
        text.push_str(&leading.scheduler().metrics());
    }
    text.push_str("# HELP wharf_fleet_leading Whether this replica leads the fleet.\n");
    text.push_str("# TYPE wharf_fleet_leading gauge\n");
    text.push_str(&format!("wharf_fleet_leading {}\n", u8::from(leading.is_some())));
    text
}

async fn health(State(fleet): State<Arc<Fleet>>) -> axum::Json<serde_json::Value> {
    let leading = fleet.leading();
    let brake = leading.as_ref().map(|l| l.pool().brake());
    axum::Json(serde_json::json!({
        "status": "ok",
        "leading": leading.is_some(),
        "workers": leading.as_ref().map_or(0, |l| l.pool().workers().len()),
        "brake_engaged": brake.is_some_and(|b| b.engaged()),
        "brake_reason": brake.filter(|b| b.engaged()).map(|b| b.reason()),
    }))
}

/// The fleet as one replica sees it: itself, the leader, the replicas and the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// This replica.
    pub replica: Replica,
    /// `leader` or `follower`.
    #[serde(with = "by_name")]
    pub role: Role,
    /// The leader's term, when this replica leads.
    pub term: Option<u64>,
    /// Who leads, if anyone.
    pub leader: Option<Replica>,
    /// Every replica that is up.
    pub replicas: Vec<Replica>,
    /// Where the fleet's state is kept.
    pub store: StoreInfo,
}

async fn fleet_status(State(fleet): State<Arc<Fleet>>) -> ApiResult<axum::Json<FleetStatus>> {
    let store = fleet.store();
    let leading = fleet.leading();
    let (leader, replicas) = (store.leader().await, store.replicas().await);
    Ok(axum::Json(FleetStatus {
        replica: fleet.replica().clone(),
        role: if leading.is_some() { Role::Leader } else { Role::Follower },
        term: leading.map(|l| l.scheduler().term().number()),
        leader: leader.map_err(fleet_error)?,
        replicas: replicas.map_err(fleet_error)?,
        store: store.describe(),
    }))
}

/// A replica's role in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It leads: it places work and acts on workers.
    Leader,
    /// It follows: it serves reads and forwards the rest to the leader.
    Follower,
}

impl Role {
    /// The name: the one spelling of it, which `Display` prints and `FromStr` reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(name: &str) -> Result<Role, String> {
        [Role::Leader, Role::Follower]
            .into_iter()
            .find(|role| role.as_str() == name)
            .ok_or_else(|| format!("unknown role {name:?}: leader or follower"))
    }
}

impl PartialEq<&str> for Role {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// Serde for a name's type through its `Display` and `FromStr`: the JSON carries the name as
/// the type spells it, and nowhere else is it spelled.
mod by_name {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::borrow::Cow;
    use std::fmt::Display;
    use std::str::FromStr;

    pub(super) fn serialize<T: Display, S: Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(super) fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
    where
        T: FromStr<Err: Display>,
        D: Deserializer<'de>,
    {
        let name = Cow::<str>::deserialize(deserializer)?;
        name.parse().map_err(D::Error::custom)
    }
}
