//! The client node's calls (`/v1/client/...`) on the fleet: forwarded to the agent of the
//! worker that runs the allocation, under the id its attempt runs as there, with that
//! agent's token, and the answer streamed back as it comes (a followed log is a stream).
//! A Nomad client that reads the node's `HTTPAddr` and goes to the agent itself needs the
//! agent's token; through the fleet, the fleet's token serves.

use super::server::Shared;
use super::views;
use crate::client::ClientError;
use crate::nomad_http::{NomadApiError, NomadResult, Params};
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::response::Response;
use wharf_fleet::WorkPhase;

/// The headers of the agent's answer passed on: its body's type (the fleet adds Nomad's
/// query headers with its own index).
const PASSED_ON: [HeaderName; 1] = [header::CONTENT_TYPE];

/// `GET /v1/client/fs/{ls,stat,cat,readat,stream,logs}/:alloc`.
pub(super) async fn fs(
    State(server): State<Shared>,
    Path((op, id)): Path<(String, String)>,
    request: Request,
) -> NomadResult<Response> {
    forward_for(&server, &id, request, |runner| format!("/v1/client/fs/{op}/{runner}")).await
}

/// `/v1/client/allocation/:id/{stats,restart,signal}`.
pub(super) async fn allocation(
    State(server): State<Shared>,
    Path(id): Path<String>,
    request: Request,
) -> NomadResult<Response> {
    let op = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
    forward_for(&server, &id, request, |runner| format!("/v1/client/allocation/{runner}/{op}"))
        .await
}

/// `GET /v1/client/stats?node_id=`: the host's usage, from that worker's agent.
pub(super) async fn host_stats(
    State(server): State<Shared>,
    Query(params): Query<Params>,
    request: Request,
) -> NomadResult<Response> {
    let worker = params.get("node_id").filter(|id| !id.is_empty()).ok_or_else(|| {
        NomadApiError::bad_request("node_id: the fleet has many nodes; name the one to ask")
    })?;
    forward(&server, worker, "/v1/client/stats".to_owned(), request).await
}

/// Forwards `request` about allocation `id` to its worker's agent, at the path `path` makes
/// of the id its current attempt runs as there.
async fn forward_for(
    server: &Shared,
    id: &str,
    request: Request,
    path: impl FnOnce(&str) -> String,
) -> NomadResult<Response> {
    let leading = server.leading()?;
    let placement =
        leading.scheduler().get(id).ok_or_else(|| NomadApiError::not_found("alloc not found"))?;
    let worker = match &placement.phase {
        WorkPhase::Queued | WorkPhase::Cancelled | WorkPhase::Failed { .. } => {
            return Err(NomadApiError::bad_request(format!(
                "allocation {id} runs on no node ({})",
                placement.phase.name()
            )));
        }
        phase => phase.worker().unwrap_or_default().to_owned(),
    };
    forward(server, &worker, path(&placement.runner_id()), request).await
}

/// Sends `request` (its method, query and body) to worker `worker`'s agent at `path`, and
/// streams the answer back.
async fn forward(
    server: &Shared,
    worker: &str,
    path: String,
    request: Request,
) -> NomadResult<Response> {
    let leading = server.leading()?;
    let client = views::agent_client(&leading, worker).ok_or_else(|| {
        NomadApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "the fleet does not reach node {worker}'s agent over HTTP; send the call to the agent itself"
            ),
        )
    })?;
    let (parts, body) = request.into_parts();
    let target = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let limit = server.fleet.config().max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        NomadApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        )
    })?;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let answer = client
        .send(parts.method, target.as_str(), Some((content_type.as_str(), bytes.to_vec())))
        .await;
    match answer {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let mut response = Response::new(Body::new(body));
            *response.status_mut() = parts.status;
            for name in PASSED_ON {
                if let Some(value) = parts.headers.get(&name) {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            Ok(response)
        }
        // The agent's refusal, as it said it.
        Err(ClientError::Api { status, message }) => {
            let prefix = format!("{status}: ");
            Err(NomadApiError::new(status, message.strip_prefix(&prefix).unwrap_or(&message)))
        }
        Err(error) => Err(NomadApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("node {worker}'s agent does not answer: {error}"),
        )),
    }
}
