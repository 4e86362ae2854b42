//! What every Nomad route shares: the server's state, errors as Nomad answers them (a status
//! and a line of text), the token check, the index that blocking queries wait on, and the
//! query parameters Nomad's clients send everywhere.
//!
//! The index is a time in milliseconds: the latest change of any allocation (its last task
//! event) or job record. It only grows while nothing is removed, survives an agent restart,
//! and needs no counter of its own.

use super::registry::Registry;
use crate::agent::{Agent, AgentError, POLL_INTERVAL};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wharf_state::Timestamp;
use wharf_task::{SystemClock, WallClock};

/// The Nomad API's state beside the agent.
#[derive(Debug)]
pub(crate) struct NomadServer {
    pub(crate) agent: Arc<Agent>,
    pub(crate) registry: Registry,
    /// The node's id, kept in the data directory so that it outlives restarts.
    pub(crate) node_id: String,
    /// One registration or stop at a time: each reads the record, places, then writes it.
    pub(crate) changing: tokio::sync::Mutex<()>,
}

pub(crate) type Shared = Arc<NomadServer>;

impl NomadServer {
    pub(crate) fn open(agent: Arc<Agent>) -> std::io::Result<NomadServer> {
        let data_dir = agent.config().data_dir.clone();
        let registry = Registry::open(&data_dir)?;
        let id_path = data_dir.join("nomad").join("node-id");
        let node_id = match std::fs::read_to_string(&id_path) {
            Ok(id) if !id.trim().is_empty() => id.trim().to_owned(),
            _ => {
                let id = crate::agent::new_alloc_id();
                std::fs::write(&id_path, &id)?;
                id
            }
        };
        Ok(NomadServer { agent, registry, node_id, changing: tokio::sync::Mutex::new(()) })
    }

    /// `host:port` the API is served on: the address the agent announced (its configured
    /// port may be 0), else the configured one.
    pub(crate) fn http_addr(&self) -> String {
        let data_dir = &self.agent.config().data_dir;
        match crate::agent_file::AgentFile::read(data_dir) {
            Ok(Some(file)) if file.pid == std::process::id() => {
                file.address.trim_start_matches("http://").to_owned()
            }
            _ => self.agent.config().bind.to_string(),
        }
    }

    /// The node's name: its host name, as Nomad's default.
    pub(crate) fn node_name(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .unwrap_or_else(|_| "wharf".to_owned())
    }

    /// The latest change the Nomad API can show, in milliseconds.
    pub(crate) fn index(&self) -> u64 {
        let mut latest = self.registry.last_change();
        for runner in self.agent.list() {
            let state = runner.subscribe();
            if let Some(changed) = wharf_nomad::shapes::last_change(&state.borrow()) {
                latest = latest.max(changed);
            }
        }
        latest.0.max(1)
    }
}

/// The time now, from the system's clock (as the agent's own).
pub(crate) fn now() -> Timestamp {
    SystemClock.now()
}

/// An error as Nomad answers one: a status and a line of text.
#[derive(Debug)]
pub(crate) struct NomadApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl NomadApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> NomadApiError {
        NomadApiError { status, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> NomadApiError {
        NomadApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> NomadApiError {
        NomadApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub(crate) fn internal(message: impl ToString) -> NomadApiError {
        NomadApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message.to_string())
    }
}

impl IntoResponse for NomadApiError {
    fn into_response(self) -> Response {
        (self.status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], self.message)
            .into_response()
    }
}

impl From<AgentError> for NomadApiError {
    fn from(error: AgentError) -> NomadApiError {
        let status = match &error {
            AgentError::UnknownAlloc(_) => StatusCode::NOT_FOUND,
            AgentError::InvalidId(_) | AgentError::Spec(_) => StatusCode::BAD_REQUEST,
            AgentError::IdTaken(_) | AgentError::DoesNotFit(_) | AgentError::Ports(_) => {
                StatusCode::CONFLICT
            }
            AgentError::Alloc(wharf_alloc::AllocError::UnknownTask { .. }) => StatusCode::NOT_FOUND,
            AgentError::Alloc(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        NomadApiError::new(status, error.to_string())
    }
}

impl From<wharf_alloc::AllocError> for NomadApiError {
    fn from(error: wharf_alloc::AllocError) -> NomadApiError {
        AgentError::from(error).into()
    }
}

pub(crate) type NomadResult<T> = Result<T, NomadApiError>;

/// The token a Nomad client presents: `X-Nomad-Token`, or wharf's `Authorization: Bearer`.
pub(crate) fn presented_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-nomad-token")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .filter(|t| !t.is_empty())
}

/// Constant-time comparison, so the time taken does not tell how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, byte) in a.iter().enumerate() {
        diff |= usize::from(byte ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

/// Nomad's answer to a missing or wrong token: 403 and "Permission denied", which its
/// clients recognise.
pub(crate) fn check_token(expected: Option<&str>, headers: &HeaderMap) -> NomadResult<()> {
    let Some(expected) = expected else { return Ok(()) };
    match presented_token(headers) {
        Some(token) if same(token.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(NomadApiError::new(StatusCode::FORBIDDEN, "Permission denied")),
    }
}

pub(crate) async fn require_token(
    State(server): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
    match check_token(server.agent.config().token.as_deref(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// Every answer carries the index and says the leader is known, as Nomad's client library
/// requires of a query's answer.
pub(crate) async fn query_headers(
    State(server): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    with_index_headers(&server, response)
}

/// `response` with Nomad's query headers.
pub(crate) fn with_index_headers(server: &NomadServer, mut response: Response) -> Response {
    let headers = response.headers_mut();
    if let Ok(index) = HeaderValue::from_str(&server.index().to_string()) {
        headers.insert("x-nomad-index", index);
    }
    headers.insert("x-nomad-knownleader", HeaderValue::from_static("true"));
    headers.insert("x-nomad-lastcontact", HeaderValue::from_static("0"));
    response
}

/// The query parameters; those Nomad's clients send that mean nothing here (`namespace`,
/// `region`, `stale`, ...) are accepted and left.
pub(crate) type Params = BTreeMap<String, String>;

/// A boolean parameter: `true`/`false` in any case (Python clients send `True`), or `1`/`0`.
pub(crate) fn flag(params: &Params, name: &str) -> NomadResult<bool> {
    match params.get(name).map(|v| v.to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) if v.is_empty() || v == "true" || v == "1" => Ok(true),
        Some(v) if v == "false" || v == "0" => Ok(false),
        Some(v) => Err(NomadApiError::bad_request(format!("{name}: {v:?} is not true or false"))),
    }
}

/// A number parameter.
pub(crate) fn number(params: &Params, name: &str) -> NomadResult<Option<u64>> {
    params
        .get(name)
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| NomadApiError::bad_request(format!("{name}: {v:?} is not a number")))
        })
        .transpose()
}

/// The longest a blocking query waits, as in Nomad.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// How long a blocking query waits without `wait`.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// A blocking query (`?index=N&wait=D`): returns once the index is past `N` or `D` has passed.
pub(crate) async fn block(server: &NomadServer, params: &Params) -> NomadResult<()> {
    let Some(after) = number(params, "index")? else { return Ok(()) };
    let wait = match params.get("wait").filter(|w| !w.is_empty()) {
        Some(text) => wharf_state::duration::parse(text)
            .map_err(|e| NomadApiError::bad_request(format!("wait: {e}")))?,
        None => DEFAULT_WAIT,
    };
    let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
    while server.index() <= after && tokio::time::Instant::now() < deadline {
        tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + POLL_INTERVAL)).await;
    }
    Ok(())
}

/// Reads a JSON body of at most the agent's limit; an empty one is `{}`.
pub(crate) async fn json_body(
    server: &NomadServer,
    body: axum::body::Body,
) -> NomadResult<serde_json::Value> {
    let limit = server.agent.config().max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        NomadApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        )
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| NomadApiError::bad_request(format!("invalid JSON: {e}")))
}
