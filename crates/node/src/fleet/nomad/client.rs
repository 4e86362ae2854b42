//! The client node's calls (`/v1/client/...`) on the fleet: forwarded to the agent of the
//! worker that runs the allocation, under the id its attempt runs as there, with that
//! agent's token, and the answer streamed back as it comes (a followed log is a stream).
//! A Nomad client that reads the node's `HTTPAddr` and goes to the agent itself needs the
//! agent's token; through the fleet, the fleet's token serves. A worker reached over SSH
//! alone (static hosts, EC2) has the call made by `wharf agent-relay` on it
//! ([`crate::agent_relay`]), in a session of its connection.

use super::relay::{relay, relay_over_ssh};
use super::server::Shared;
use super::views;
use crate::nomad_http::{NomadApiError, NomadResult, Params};
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use wharf_fleet::WorkPhase;
use wharf_prober::InstanceId;

/// `GET /v1/client/fs/{ls,stat,cat,readat,stream,logs}/:alloc`.
pub(super) async fn fs(
    State(server): State<Shared>,
    Path((op, id)): Path<(String, String)>,
    request: Request,
) -> NomadResult<Response> {
    // The operation becomes part of the agent's path: only the ones it serves pass.
    if !FS_OPERATIONS.contains(&op.as_str()) {
        return Err(NomadApiError::not_found(format!("no client fs operation {op:?}")));
    }
    forward_for(&server, &id, request, |runner| format!("/v1/client/fs/{op}/{runner}")).await
}

/// What `/v1/client/fs/` serves.
const FS_OPERATIONS: [&str; 6] = ["ls", "stat", "cat", "readat", "stream", "logs"];

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

/// Sends `request` to worker `worker`'s agent at `path`, and streams the answer back.
async fn forward(
    server: &Shared,
    worker: &str,
    path: String,
    request: Request,
) -> NomadResult<Response> {
    let leading = server.leading()?;
    let who = format!("node {worker}'s agent");
    let limit = server.fleet.config().max_body_bytes;
    if let Some(client) = views::agent_client(&leading, worker) {
        return relay(&client, &who, request, Some(path), limit).await;
    }
    // A worker reached over SSH alone: the call is made there, by its own runner.
    let id = InstanceId(worker.to_owned());
    match leading.extra().agent_relay(&id) {
        Some(agent_relay) => relay_over_ssh(&agent_relay, &who, request, path, limit).await,
        None if leading.pool().workers().iter().all(|w| w.id != id) => {
            Err(NomadApiError::not_found(format!("node {worker} not found")))
        }
        None => Err(NomadApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("the fleet has no way to node {worker}'s agent now"),
        )),
    }
}
