//! The HTTP API (JSON over HTTP/1.1), served by axum. Thin: every handler calls the agent.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /v1/health` | liveness, store and drivers (no token needed) |
//! | `POST /v1/allocations` | submit a job spec (JSON, or TOML) → `{"id": ...}` |
//! | `GET /v1/allocations` | every allocation, summarised |
//! | `GET /v1/allocations/{id}?after=<version>&wait=30s` | one allocation (its ports, health and checks); blocks until its state differs from `after` |
//! | `POST /v1/allocations/{id}/stop` | stop it (poststop tasks still run) |
//! | `POST /v1/allocations/stop` | `{"ids": [...]}`: stop them all, durably, in one or a few commits → `{"stopped": [...], "unknown": [...], "failed": {id: error}}` |
//! | `POST /v1/allocations/{id}/restart` | `{"task": "web"}`, `{"all": true}` or `{}` for the running tasks |
//! | `POST /v1/allocations/{id}/signal` | `{"signal": "SIGHUP", "task": "web"}` (no task: all) |
//! | `POST /v1/allocations/{id}/exec` | `{"task": "web", "command": [...], "timeout": "30s"}` |
//! | `GET /v1/allocations/{id}/logs/{task}?stream=stderr&offset=N&tail=N&follow=true` | output, read by the task's driver: from byte `offset` of what is kept, or the last `tail` bytes, or the start (with `follow`: the end), and with `follow` on as it is written until the task is dead (403 if a log file is not a regular file of the log directory; 501 if the driver cannot read logs) |
//! | `GET /v1/allocations/{id}/stats` | each running task's CPU, memory and processes, and their sum (`usage::AllocStats`) |
//! | `GET /v1/node` | the node's CPU and memory, what it keeps, what allocations hold, what is free, cgroups, drivers (`usage::NodeStatus`) |
//! | `GET /v1/services` | the services of the node's running tasks: address, port, tags, health |
//! | `GET /v1/probe` | the runner-list protocol, as text |
//!
//! A fleet leader's requests carry its term in `X-Wharf-Fleet-Term` (see [`crate::fence`]):
//! a submission or a stop under a term older than one the node has heard is refused with 409.
//! | `GET /v1/metrics` | Prometheus text |
//!
//! `{id}` is an exact allocation id: prefixes are a convenience of the CLI only. Every error
//! is `{"error": "..."}`, with a 4xx status for a bad request (an unknown or bad query
//! parameter, a path or method the API does not have, included). Every call but `/v1/health`
//! must carry the agent's token (`Authorization: Bearer <token>`): the configured one, or the
//! one it keeps in its data directory ([`crate::agent_token`]). None is a 401, a wrong one a
//! 403; it is compared in constant time.

use crate::agent::{Agent, AgentError, POLL_INTERVAL};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use extract::{Path, Query};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wharf_driver::{DriverError, LogFrom, LogStream};
use wharf_state::{AllocState, Allocation, CheckState, ServiceEntry, Signal};

/// Builds the router for `agent`.
pub fn router(agent: Arc<Agent>) -> Router {
    let protected = Router::new()
        .route("/v1/allocations", post(submit).get(list))
        .route("/v1/allocations/stop", post(stop_many))
        .route("/v1/allocations/{id}", get(status))
        .route("/v1/allocations/{id}/stop", post(stop))
        .route("/v1/allocations/{id}/restart", post(restart))
        .route("/v1/allocations/{id}/signal", post(signal))
        .route("/v1/allocations/{id}/exec", post(exec))
        .route("/v1/allocations/{id}/logs/{task}", get(logs))
        .route("/v1/allocations/{id}/stats", get(stats))
        .route("/v1/node", get(node))
        .route("/v1/services", get(services))
        .route("/v1/probe", get(probe))
        .route("/v1/metrics", get(metrics))
        .merge(crate::variables::routes(agent.variables().clone()))
        .merge(crate::images_api::routes())
        .route_layer(axum::middleware::from_fn_with_state(agent.clone(), require_token));
    let router = Router::new().route("/v1/health", get(health)).merge(protected);
    crate::nomad::mount(router, &agent)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(agent)
}

/// axum's `Path` and `Query` extractors, with what they reject answered as the API's JSON
/// errors, like every other error.
pub(crate) mod extract {
    use super::ApiError;
    use axum::extract::FromRequestParts;
    use axum::http::request::Parts;
    use serde::de::DeserializeOwned;

    /// The path's parameters, decoded.
    #[derive(Debug)]
    pub(crate) struct Path<T>(pub(crate) T);

    /// The query's parameters, decoded; unknown ones are refused where `T` denies them.
    #[derive(Debug)]
    pub(crate) struct Query<T>(pub(crate) T);

    impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
        type Rejection = ApiError;

        async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
            match axum::extract::Path::<T>::from_request_parts(parts, state).await {
                Ok(axum::extract::Path(value)) => Ok(Path(value)),
                Err(rejection) => Err(ApiError::new(rejection.status(), rejection.body_text())),
            }
        }
    }

    impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
        type Rejection = ApiError;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
            match axum::extract::Query::<T>::try_from_uri(&parts.uri) {
                Ok(axum::extract::Query(value)) => Ok(Query(value)),
                Err(rejection) => Err(ApiError::new(
                    rejection.status(),
                    rejection.body_text().replace("Failed to deserialize query string", "query"),
                )),
            }
        }
    }
}

/// An error as the API reports it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<AgentError> for ApiError {
    fn from(error: AgentError) -> ApiError {
        let status = match &error {
            AgentError::UnknownAlloc(_) => StatusCode::NOT_FOUND,
            AgentError::InvalidId(_) => StatusCode::BAD_REQUEST,
            AgentError::IdTaken(_)
            | AgentError::DoesNotFit(_)
            | AgentError::Ports(_)
            | AgentError::Volume(_)
            | AgentError::Fence(crate::fence::FenceError::Outdated { .. }) => StatusCode::CONFLICT,
            AgentError::Spec(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AgentError::Alloc(wharf_alloc::AllocError::UnknownTask { .. }) => StatusCode::NOT_FOUND,
            AgentError::Alloc(wharf_alloc::AllocError::Task(
                wharf_task::TaskError::NotRunning { .. },
            )) => StatusCode::CONFLICT,
            AgentError::Alloc(wharf_alloc::AllocError::NotRestartable { .. }) => {
                StatusCode::CONFLICT
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, error.to_string())
    }
}

impl From<wharf_alloc::AllocError> for ApiError {
    fn from(error: wharf_alloc::AllocError) -> ApiError {
        AgentError::from(error).into()
    }
}

/// A task's logs could not be opened or read: the driver's own words.
fn log_error(error: wharf_task::TaskError) -> ApiError {
    let wharf_task::TaskError::Driver { source, .. } = &error else {
        return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
    };
    let status = match source {
        DriverError::Refused { .. } => StatusCode::FORBIDDEN,
        DriverError::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, source.to_string())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(serde_json::json!({ "error": self.message }))).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such endpoint; see the API table in the wharf-node docs",
    )
}

/// The answer to a path the API has, with a method it does not take there.
pub(crate) async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not a method this path takes; see the API table in the wharf-node docs"
        ),
    )
}

/// Constant-time comparison, so the time taken does not tell how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, byte) in a.iter().enumerate() {
        diff |= usize::from(byte ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

/// Checks the bearer token of a request against `expected`, if one is set.
pub(crate) fn check_token(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = expected else { return Ok(()) };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if presented.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server requires a token: send `Authorization: Bearer <token>`",
        ));
    }
    if !same(presented.as_bytes(), token.as_bytes()) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "the token is not valid"));
    }
    Ok(())
}

async fn require_token(State(agent): State<Arc<Agent>>, request: Request, next: Next) -> Response {
    match check_token(agent.config().token.as_deref(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// Reads a request body, refusing one larger than the configured limit.
async fn body(agent: &Agent, body: Body) -> ApiResult<Bytes> {
    limited_body(body, agent.config().max_body_bytes).await
}

/// Reads a request body of at most `limit` bytes.
pub(crate) async fn limited_body(body: Body, limit: usize) -> ApiResult<Bytes> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    })
}

/// A job spec from a request body of at most `limit` bytes: JSON if the content type says so
/// (or, with none given, if it starts with `{`), else TOML. Invalid specs are a 422 naming
/// every problem.
pub(crate) async fn job_spec(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> ApiResult<wharf_state::Job> {
    let bytes = limited_body(body, limit).await?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::bad_request("the job spec is not UTF-8 text"))?;
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let is_json = content_type.contains("json")
        || (!content_type.contains("toml") && text.trim_start().starts_with('{'));
    let parsed = if is_json {
        wharf_state::spec::parse_json(text)
    } else {
        wharf_state::spec::parse_toml(text)
    };
    parsed.map_err(|e| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("invalid job spec:\n{e}"))
    })
}

fn json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> ApiResult<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return serde_json::from_slice(b"{}")
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON request: {e}")))
}

async fn health(State(agent): State<Arc<Agent>>) -> Response {
    let mut drivers = BTreeMap::new();
    for name in agent.drivers().names() {
        if let Some(driver) = agent.drivers().get(name) {
            drivers.insert(name.to_owned(), driver.fingerprint().await);
        }
    }
    let broken = agent.broken().await;
    let status = if broken.is_some() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let body = serde_json::json!({ "status": if broken.is_some() { "broken" } else { "ok" }, "reason": broken, "drivers": drivers });
    (status, axum::Json(body)).into_response()
}

#[derive(Serialize)]
struct Submitted {
    id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitQuery {
    /// The id to run it under; by default a new one.
    id: Option<String>,
}

async fn submit(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<SubmitQuery>,
    headers: HeaderMap,
    request: Body,
) -> ApiResult<Response> {
    let _admitted = agent.fence().admit(fleet_term(&headers)?).await.map_err(AgentError::from)?;
    let job = job_spec(&headers, request, agent.config().max_body_bytes).await?;
    let (id, new) = agent.submit_as(job, query.id).await?;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(Submitted { id })).into_response())
}

/// One allocation, as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocSummary {
    /// Its id.
    pub id: String,
    /// Its job's id.
    pub job_id: String,
    /// Its group.
    pub group: String,
    /// What it should be doing.
    pub desired_status: wharf_state::DesiredStatus,
    /// What it is doing.
    pub client_status: wharf_state::ClientStatus,
    /// Why.
    pub description: String,
    /// Each task's status.
    pub tasks: BTreeMap<String, wharf_state::TaskStatus>,
    /// Whether it is healthy; absent until judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
}

/// An allocation's summary, read in place (a node lists thousands, and callers poll the list):
/// the allocation's fields first, then its state, one lock at a time.
fn summary(runner: &wharf_alloc::AllocRunner) -> AllocSummary {
    let (job_id, group, desired_status) =
        runner.with_alloc(|a| (a.job.id.clone(), a.task_group.clone(), a.desired_status));
    let state = runner.subscribe();
    let state = state.borrow();
    AllocSummary {
        id: runner.id().to_owned(),
        job_id,
        group,
        desired_status,
        client_status: state.client_status,
        description: state.client_description.clone(),
        tasks: state.task_states.iter().map(|(name, task)| (name.clone(), task.status)).collect(),
        healthy: state.deployment_status.as_ref().and_then(|d| d.healthy),
    }
}

async fn list(State(agent): State<Arc<Agent>>) -> axum::Json<Vec<AllocSummary>> {
    axum::Json(agent.list().iter().map(summary).collect())
}

/// One allocation in full, as `GET /v1/allocations/{id}` returns it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocDetail {
    /// The allocation.
    pub alloc: Allocation,
    /// Its state with every task's state and events.
    pub state: AllocState,
    /// Whether its runner has finished (nothing more will change).
    pub done: bool,
    /// A value that changes whenever the state does, for `?after=`.
    pub version: String,
    /// Its services' checks with their latest results (not part of `version`: a check's new
    /// result does not end a blocking query).
    #[serde(default)]
    pub checks: Vec<CheckState>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    after: Option<String>,
    wait: Option<String>,
}

fn version_of(detail_state: &AllocState, done: bool) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(detail_state).unwrap_or_default().hash(&mut hasher);
    done.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

async fn status(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(query): Query<StatusQuery>,
) -> ApiResult<axum::Json<AllocDetail>> {
    let runner = agent.get(&id)?;
    let wait = match &query.wait {
        Some(text) => wharf_state::duration::parse(text)
            .map_err(|e| ApiError::bad_request(format!("wait: {e}")))?
            .min(Duration::from_secs(300)),
        None => Duration::from_secs(30),
    };
    let mut watch = runner.subscribe();
    let detail = |state: AllocState| {
        let done = runner.is_done();
        AllocDetail {
            alloc: runner.alloc(),
            version: version_of(&state, done),
            state,
            done,
            checks: runner.checks(),
        }
    };
    let mut current = detail(watch.borrow_and_update().clone());
    if let Some(after) = query.after {
        let deadline = tokio::time::Instant::now() + wait;
        while current.version == after && !current.done {
            // Changes of state, and the end of the run, both wake this.
            let changed = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    result = watch.changed() => result.is_ok(),
                    () = runner.wait() => true,
                }
            })
            .await;
            current = detail(watch.borrow_and_update().clone());
            if !matches!(changed, Ok(true)) {
                break;
            }
        }
    }
    Ok(axum::Json(current))
}

async fn stop(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let _admitted = agent.fence().admit(fleet_term(&headers)?).await.map_err(AgentError::from)?;
    agent.stop(&id).await?;
    Ok(StatusCode::ACCEPTED)
}

/// The most ids one `POST /v1/allocations/stop` takes: a bound on the work one request asks.
const STOP_MANY_LIMIT: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StopManyRequest {
    ids: Vec<String>,
}

/// What became of each id of a batched stop: stopping (durably marked), unknown on this
/// node, or failed with the reason. An unknown or failed id does not fail the others.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct StopManyResult {
    /// Marked to stop, durably (or already terminal on the server's side).
    pub stopped: Vec<String>,
    /// No allocation of that id on this node.
    pub unknown: Vec<String>,
    /// Could not be stopped, with the reason.
    pub failed: BTreeMap<String, String>,
}

async fn stop_many(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<axum::Json<StopManyResult>> {
    let request: StopManyRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("stop request: {e}")))?;
    if request.ids.len() > STOP_MANY_LIMIT {
        return Err(ApiError::bad_request(format!(
            "stop request: {} ids, more than the {STOP_MANY_LIMIT} one request takes",
            request.ids.len()
        )));
    }
    let _admitted = agent.fence().admit(fleet_term(&headers)?).await.map_err(AgentError::from)?;
    let mut result = StopManyResult::default();
    for (id, outcome) in agent.stop_many(&request.ids).await {
        match outcome {
            Ok(()) => result.stopped.push(id),
            Err(AgentError::UnknownAlloc(_)) => result.unknown.push(id),
            Err(e) => {
                result.failed.insert(id, e.to_string());
            }
        }
    }
    Ok(axum::Json(result))
}

/// The fleet term a request carries (see [`crate::fence`]), if any.
fn fleet_term(headers: &HeaderMap) -> ApiResult<Option<u64>> {
    let Some(value) = headers.get(crate::fence::HEADER) else { return Ok(None) };
    value.to_str().ok().and_then(|v| v.trim().parse().ok()).map(Some).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{}: {value:?} is not a fleet term (a number)", crate::fence::HEADER),
        )
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RestartRequest {
    task: Option<String>,
    #[serde(default)]
    all: bool,
}

async fn restart(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    request: Body,
) -> ApiResult<StatusCode> {
    let runner = agent.get(&id)?;
    let request: RestartRequest = json(&body(&agent, request).await?)?;
    let reason = "restart requested through the API";
    match (request.task, request.all) {
        (Some(_), true) => {
            return Err(ApiError::bad_request("give either `task` or `all`, not both"));
        }
        (Some(task), false) => runner.restart_task(&task, reason).await?,
        (None, true) => runner.restart_all(reason).await?,
        (None, false) => runner.restart_running(reason).await?,
    }
    Ok(StatusCode::ACCEPTED)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalRequest {
    signal: String,
    task: Option<String>,
}

async fn signal(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    request: Body,
) -> ApiResult<StatusCode> {
    let runner = agent.get(&id)?;
    let request: SignalRequest = json(&body(&agent, request).await?)?;
    let signal: Signal =
        request.signal.parse().map_err(|e| ApiError::bad_request(format!("signal: {e}")))?;
    runner.signal(request.task.as_deref(), signal).await?;
    Ok(StatusCode::ACCEPTED)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecRequest {
    task: String,
    command: Vec<String>,
    timeout: Option<String>,
}

/// What `POST .../exec` returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecResponse {
    /// Standard output, as text (invalid UTF-8 replaced).
    pub stdout: String,
    /// Standard error, as text.
    pub stderr: String,
    /// The exit code.
    pub exit_code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
}

async fn exec(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    request: Body,
) -> ApiResult<axum::Json<ExecResponse>> {
    let runner = agent.get(&id)?;
    let request: ExecRequest = json(&body(&agent, request).await?)?;
    if request.command.is_empty() {
        return Err(ApiError::bad_request("command: give at least the program to run"));
    }
    let timeout = match &request.timeout {
        Some(text) => wharf_state::duration::parse(text)
            .map_err(|e| ApiError::bad_request(format!("timeout: {e}")))?,
        None => Duration::from_secs(30),
    };
    let result = runner.exec(&request.task, &request.command, timeout).await?;
    Ok(axum::Json(ExecResponse {
        stdout: String::from_utf8_lossy(&result.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
        exit_code: result.exit.exit_code,
        signal: result.exit.signal,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    stream: Option<String>,
    offset: Option<u64>,
    tail: Option<u64>,
    #[serde(default)]
    follow: bool,
}

fn driver_error(task: &str, source: DriverError) -> wharf_task::TaskError {
    wharf_task::TaskError::Driver { task: task.to_owned(), source }
}

/// The most log bytes one response (or one chunk of a followed stream) carries.
const LOG_CHUNK: usize = 1 << 20;

async fn logs(
    State(agent): State<Arc<Agent>>,
    Path((id, task)): Path<(String, String)>,
    Query(query): Query<LogsQuery>,
) -> ApiResult<Response> {
    let runner = agent.get(&id)?;
    let task_runner = runner.tasks().iter().find(|t| t.name() == task).ok_or_else(|| {
        ApiError::new(StatusCode::NOT_FOUND, format!("allocation {id} has no task {task:?}"))
    })?;
    let stream = match query.stream.as_deref() {
        None | Some("stdout") => LogStream::Stdout,
        Some("stderr") => LogStream::Stderr,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "stream: {other:?} is neither \"stdout\" nor \"stderr\""
            )));
        }
    };
    let from = match (query.offset, query.tail) {
        (_, Some(tail)) => LogFrom::Tail(tail),
        (Some(offset), None) => LogFrom::Offset(offset),
        (None, None) if query.follow => LogFrom::End,
        (None, None) => LogFrom::Start,
    };
    // Refused now, as an error status, if what is there is not a log file.
    let mut reader = task_runner.logs(stream, from).await.map_err(log_error)?;
    if !query.follow {
        let bytes = reader.read(LOG_CHUNK).await.map_err(|e| log_error(driver_error(&task, e)))?;
        return Ok(([("x-wharf-next-offset", reader.offset().to_string())], bytes).into_response());
    }
    let task_runner = task_runner.clone();
    // Ends once the task is dead (after a last read) or the client goes away.
    let chunks = futures_util::stream::unfold((reader, false), move |(mut reader, finished)| {
        let task_runner = task_runner.clone();
        async move {
            if finished {
                return None;
            }
            loop {
                let dead = task_runner.state().status == wharf_state::TaskStatus::Dead;
                match reader.read(LOG_CHUNK).await {
                    Ok(bytes) if !bytes.is_empty() => {
                        return Some((
                            Ok::<_, std::io::Error>(Bytes::from(bytes)),
                            (reader, false),
                        ));
                    }
                    Ok(_) if dead => return None,
                    Ok(_) => tokio::time::sleep(POLL_INTERVAL).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "following logs stopped");
                        return Some((Err(std::io::Error::other(e)), (reader, true)));
                    }
                }
            }
        }
    });
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

async fn stats(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<crate::usage::AllocStats>> {
    let runner = agent.get(&id)?;
    Ok(axum::Json(crate::usage::AllocStats::from(&runner.usage().await)))
}

async fn node(State(agent): State<Arc<Agent>>) -> axum::Json<crate::usage::NodeStatus> {
    axum::Json(agent.node_status().await)
}

async fn services(State(agent): State<Arc<Agent>>) -> axum::Json<Vec<ServiceEntry>> {
    axum::Json(agent.catalog().list())
}

/// A fleet's probe carries its term: a newer one is heard here, so that older leaders' starts
/// and stops are refused from now on. The answer does not depend on it.
async fn probe(State(agent): State<Arc<Agent>>, headers: HeaderMap) -> ApiResult<String> {
    if let Some(term) = fleet_term(&headers)? {
        match agent.fence().admit(Some(term)).await {
            Ok(_) | Err(crate::fence::FenceError::Outdated { .. }) => {}
            Err(error) => return Err(AgentError::from(error).into()),
        }
    }
    let mut text = agent.probe().await.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

async fn metrics(State(agent): State<Arc<Agent>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], agent.metrics_text().await)
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn token_comparison() {
        assert!(same(b"secret-token-123", b"secret-token-123"));
        assert!(!same(b"secret-token-124", b"secret-token-123"));
        assert!(!same(b"secret", b"secret-token-123"));
        assert!(!same(b"", b"x"));
        assert!(same(b"", b""));
    }
}
