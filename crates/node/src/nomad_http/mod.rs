//! What Nomad's API shares wherever wharf serves it (the agent's client-node subset in
//! [`crate::nomad`], the fleet's server subset in [`crate::fleet::nomad`]): errors as Nomad
//! answers them (a status and a line of text), the token check (`X-Nomad-Token` or
//! `Authorization: Bearer`, else 403 "Permission denied"), the query headers every answer
//! carries (`X-Nomad-Index`, `X-Nomad-KnownLeader`, `X-Nomad-LastContact`), blocking queries
//! (`?index=&wait=`), the query parameters Nomad's clients send, the registry of the Nomad
//! jobs a server was given ([`registry`]) and the job shapes made from it ([`jobs`]).
//!
//! A server is anything that says its token and its index ([`NomadService`]); the index is a
//! time in milliseconds, the latest change the server can show, so it only grows and needs
//! no counter of its own.

pub(crate) mod events;
pub(crate) mod jobs;
pub(crate) mod registry;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wharf_state::Timestamp;
use wharf_task::{SystemClock, WallClock};

/// A server of Nomad's API: what the shared middleware needs of it.
pub(crate) trait NomadService: Send + Sync + 'static {
    /// The token a request must present, if any.
    fn token(&self) -> Option<&str>;
    /// The latest change the server can show, in milliseconds (at least 1).
    fn index(&self) -> u64;
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

/// Middleware: the server's token, or Nomad's 403.
pub(crate) async fn require_token<S: NomadService>(
    State(server): State<Arc<S>>,
    request: Request,
    next: Next,
) -> Response {
    match check_token(server.token(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// Middleware: every answer carries the index and says the leader is known, as Nomad's
/// client library requires of a query's answer.
pub(crate) async fn query_headers<S: NomadService>(
    State(server): State<Arc<S>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    with_index_headers(server.index(), response)
}

/// `response` with Nomad's query headers, at `index`, unless it has them already (an answer
/// another server gave, relayed with its own).
pub(crate) fn with_index_headers(index: u64, mut response: Response) -> Response {
    let headers = response.headers_mut();
    if headers.contains_key("x-nomad-index") {
        return response;
    }
    if let Ok(index) = HeaderValue::from_str(&index.to_string()) {
        headers.insert("x-nomad-index", index);
    }
    headers.insert("x-nomad-knownleader", HeaderValue::from_static("true"));
    headers.insert("x-nomad-lastcontact", HeaderValue::from_static("0"));
    response
}

/// Whether a request to a path both APIs have (`GET /v1/allocations`) is a Nomad client's.
pub(crate) fn is_nomad(request: &Request) -> bool {
    const NOMAD_PARAMS: [&str; 5] = ["index=", "prefix=", "namespace=", "region=", "wait="];
    request.headers().contains_key("x-nomad-token")
        || request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| NOMAD_PARAMS.iter().any(|n| p.starts_with(n))))
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
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(600);
/// How long a blocking query waits without `wait`.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// A blocking query (`?index=N&wait=D`): returns once `index()` is past `N` or `D` has passed.
/// `index()` is read again at least every `poll`, and at once whenever `changes` (the
/// server's change signal, where it has one) says something changed.
pub(crate) async fn block_until(
    params: &Params,
    poll: Duration,
    mut changes: Option<tokio::sync::watch::Receiver<u64>>,
    index: impl Fn() -> u64,
) -> NomadResult<()> {
    let Some(after) = number(params, "index")? else { return Ok(()) };
    let wait = match params.get("wait").filter(|w| !w.is_empty()) {
        Some(text) => wharf_state::duration::parse(text)
            .map_err(|e| NomadApiError::bad_request(format!("wait: {e}")))?,
        None => DEFAULT_WAIT,
    };
    let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
    while index() <= after && tokio::time::Instant::now() < deadline {
        let next = deadline.min(tokio::time::Instant::now() + poll);
        match &mut changes {
            Some(signal) => {
                if let Ok(Err(_)) = tokio::time::timeout_at(next, signal.changed()).await {
                    // The signal's sender is gone: polling alone from here.
                    changes = None;
                }
            }
            None => tokio::time::sleep_until(next).await,
        }
    }
    Ok(())
}

/// Reads a JSON body of at most `limit` bytes; an empty one is `{}`.
pub(crate) async fn json_body(
    limit: usize,
    body: axum::body::Body,
) -> NomadResult<serde_json::Value> {
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
