//! Nomad's HTTP API on `wharf fleet`: the server's subset, in Nomad's shapes
//! ([`wharf_nomad`]), beside the fleet's own API, so that Nomad's clients (python-nomad, the
//! Go `api` package, scripts) submit to and read from a fleet as from a Nomad server.
//!
//! | method and path | what |
//! |---|---|
//! | `PUT\|POST /v1/jobs`, `/v1/job/:id` | register a Nomad job: each group instance is fleet work, placed by the scheduler |
//! | `GET /v1/jobs` (`?prefix=`), `/v1/job/:id` | the registered jobs, with their status and summary |
//! | `DELETE /v1/job/:id` (`?purge=true`) | stop the job's work (and forget the job) |
//! | `GET /v1/job/:id/allocations` | its allocations |
//! | `PUT\|POST /v1/validate/job` | the translation's verdict |
//! | `GET /v1/allocations` (`?prefix=`), `/v1/allocation/:id` | the fleet's work as allocations: status from the scheduler, task states from the worker's agent |
//! | `PUT\|POST /v1/allocation/:id/stop` | stop one |
//! | `GET /v1/nodes`, `/v1/node/:id`, `/v1/node/:id/allocations` | the workers as nodes, `HTTPAddr` their agents' |
//! | `GET /v1/evaluation/:id` | the evaluation a registration or stop left |
//! | `GET /v1/agent/self`, `/v1/status/leader`, `/v1/status/peers` | the fleet as a server, its leader and replicas |
//! | `GET /v1/event/stream` (`topic=Allocation`, `topic=Job:<id>`, `index=`) | the work's submissions, starts and ends and the jobs' evaluations, as NDJSON frames with `{}` heartbeats, exactly once from `index` (`events`) |
//! | `/v1/client/...` | forwarded to the agent of the worker that runs the allocation, with that agent's token (`client`) |
//!
//! Every answer carries `X-Nomad-Index`, `X-Nomad-KnownLeader` and `X-Nomad-LastContact`;
//! reads take `?index=&wait=`, woken by the scheduler's changes. The token is the fleet's,
//! as `X-Nomad-Token` or `Authorization: Bearer`; a missing or wrong one is Nomad's 403. A
//! follower forwards every Nomad call to the leader, which places the work and keeps the job
//! records in the fleet's store (`kept`), so that a replica that takes over serves them. `GET /v1/allocations` is the fleet's own list
//! too: a request with `X-Nomad-Token` or a Nomad query parameter gets Nomad's answer.
//!
//! A worker's agent is reached where the fleet knows its data directory (loopback workers,
//! on this host): there it announces its address and keeps its token. Other workers' agents
//! (static hosts, EC2) are read and called through `wharf agent-relay` on the worker, in a
//! session of its SSH connection; their nodes' `HTTPAddr` is the fleet's, which relays.

mod client;
mod events;
mod jobs;
mod kept;
mod leader;
mod reads;
mod relay;
mod server;
mod views;

use super::wiring::Fleet;
use crate::nomad_http::{self as shared, NomadApiError, NomadService, Params};
use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use server::{FleetNomad, Shared};
use std::sync::Arc;

/// `router` (the fleet's own API) with Nomad's routes added.
pub fn mount(router: Router, fleet: &Arc<Fleet>) -> Router {
    let server: Shared = Arc::new(FleetNomad::new(fleet.clone()));
    let nomad: Router = Router::new()
        .route("/v1/jobs", get(jobs::list).put(jobs::register).post(jobs::register))
        .route(
            "/v1/job/{id}",
            get(jobs::read).put(jobs::register_at).post(jobs::register_at).delete(jobs::deregister),
        )
        .route("/v1/job/{id}/allocations", get(jobs::allocations))
        .route("/v1/validate/job", post(jobs::validate).put(jobs::validate))
        .route("/v1/evaluation/{id}", get(jobs::evaluation))
        .route("/v1/allocation/{id}", get(reads::allocation))
        .route("/v1/allocation/{id}/stop", post(jobs::stop_allocation).put(jobs::stop_allocation))
        .route("/v1/nodes", get(reads::nodes))
        .route("/v1/node/{id}", get(reads::node))
        .route("/v1/node/{id}/allocations", get(reads::node_allocations))
        .route("/v1/agent/self", get(reads::agent_self))
        .route("/v1/status/leader", get(reads::leader))
        .route("/v1/status/peers", get(reads::peers))
        .route("/v1/client/fs/{op}/{id}", get(client::fs))
        .route("/v1/client/allocation/{id}/stats", get(client::allocation))
        .route(
            "/v1/client/allocation/{id}/restart",
            post(client::allocation).put(client::allocation),
        )
        .route(
            "/v1/client/allocation/{id}/signal",
            post(client::allocation).put(client::allocation),
        )
        .route("/v1/client/stats", get(client::host_stats))
        .route("/v1/event/stream", get(events::stream))
        .route_layer(axum::middleware::from_fn_with_state(
            server.clone(),
            leader::follow_the_leader,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            server.clone(),
            shared::require_token::<FleetNomad>,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            server.clone(),
            shared::query_headers::<FleetNomad>,
        ))
        .with_state(server.clone());
    router.merge(nomad).layer(axum::middleware::from_fn_with_state(server, divert))
}

/// Sends a Nomad client's `GET /v1/allocations` to Nomad's list rather than the fleet's.
async fn divert(State(server): State<Shared>, request: Request, next: Next) -> Response {
    if !(request.method() == Method::GET
        && request.uri().path() == "/v1/allocations"
        && shared::is_nomad(&request))
    {
        return next.run(request).await;
    }
    if let Err(refused) = shared::check_token(server.token(), request.headers()) {
        return refused.into_response();
    }
    if server.fleet.leading().is_none() {
        return leader::to_the_leader(&server, request)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    if let Err(unready) = server.synced().await {
        return unready.into_response();
    }
    let params = match Query::<Params>::try_from_uri(request.uri()) {
        Ok(Query(params)) => params,
        Err(rejection) => return NomadApiError::bad_request(rejection.body_text()).into_response(),
    };
    let response = reads::allocations(State(server.clone()), Query(params)).await.into_response();
    shared::with_index_headers(server.index(), response)
}
