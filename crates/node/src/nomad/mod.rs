//! Nomad's HTTP API on the agent, beside wharf's own: the client node's subset, in Nomad's
//! shapes ([`wharf_nomad`]), so that Nomad's clients (python-nomad, the Go `api` package,
//! scripts) work against a wharf node unchanged.
//!
//! | method and path | what |
//! |---|---|
//! | `PUT\|POST /v1/jobs`, `/v1/job/:id` | register a Nomad job: each group's `Count` allocations run on this node |
//! | `GET /v1/jobs` (`?prefix=`) | the registered jobs, with their status and summary |
//! | `GET /v1/job/:id` | the job as registered, with `Status`, `Version`, `Stop` |
//! | `DELETE /v1/job/:id` (`?purge=true`) | stop the job's allocations (and forget the job) |
//! | `GET /v1/job/:id/allocations` | its allocations |
//! | `PUT\|POST /v1/validate/job` | the translation's and the drivers' verdict |
//! | `GET /v1/allocations` (`?prefix=`), `/v1/allocation/:id` | allocations, with task states and events |
//! | `PUT\|POST /v1/allocation/:id/stop` | stop one |
//! | `GET /v1/nodes`, `/v1/node/:id`, `/v1/node/:id/allocations` | this node (`HTTPAddr`, `NodeResources`, `Drivers`) |
//! | `GET /v1/evaluation/:id` | the evaluation a registration or stop left |
//! | `GET /v1/agent/self`, `/v1/status/leader`, `/v1/status/peers` | the agent |
//! | `GET /v1/client/fs/{ls,stat,cat,readat,stream}/:alloc?path=` | the allocation's files, in Nomad's layout, confined to its directory (`client`) |
//! | `GET /v1/client/fs/logs/:alloc?task=&type=` | a task's logs: frames `{Offset, Data, File, FileEvent}` with `{}` heartbeats, or `plain=true`; `follow`, `offset`, `origin` |
//! | `GET /v1/client/allocation/:id/stats`, `/v1/client/stats` | usage, in Nomad's `AllocResourceUsage` and `HostStats` |
//! | `PUT\|POST /v1/client/allocation/:id/restart`, `/signal` | restart tasks, send a signal |
//! | `GET /v1/event/stream` (`topic=Allocation`, `topic=Job:<id>`, `index=`) | events as NDJSON frames with `{}` heartbeats, exactly once from `index` across restarts (`events`) |
//!
//! Every answer carries `X-Nomad-Index`, `X-Nomad-KnownLeader` and `X-Nomad-LastContact`;
//! reads take `?index=&wait=` (blocking queries). The token is the agent's, sent as
//! `X-Nomad-Token` or as wharf's `Authorization: Bearer`; a missing or wrong one is a 403 with
//! Nomad's "Permission denied". `GET /v1/allocations` is wharf's list too: a request with
//! `X-Nomad-Token` or a Nomad query parameter gets Nomad's answer.
//!
//! Errors are Nomad's: a status and a line of text, such as a 400 naming the job field wharf
//! does not implement.

mod client;
mod common;
mod events;
mod jobs;
mod reads;
mod views;

use crate::agent::Agent;
use crate::nomad_http::{self as shared, NomadApiError, Params};
use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::{NomadServer, Shared};
use std::sync::Arc;

/// `router` with Nomad's routes added, for `agent`. If the Nomad state cannot be opened (its
/// directory in the data directory), the agent serves wharf's API alone and says why.
pub fn mount(router: Router<Arc<Agent>>, agent: &Arc<Agent>) -> Router<Arc<Agent>> {
    let server: Shared = match NomadServer::open(agent.clone()) {
        Ok(server) => Arc::new(server),
        Err(error) => {
            tracing::error!(%error, "cannot open the Nomad API's state; serving wharf's API alone");
            return router;
        }
    };
    let nomad: Router<Arc<Agent>> = Router::new()
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
        .route("/v1/client/fs/ls/{id}", get(client::ls))
        .route("/v1/client/fs/stat/{id}", get(client::stat))
        .route("/v1/client/fs/cat/{id}", get(client::cat))
        .route("/v1/client/fs/readat/{id}", get(client::readat))
        .route("/v1/client/fs/stream/{id}", get(client::stream))
        .route("/v1/client/fs/logs/{id}", get(client::logs))
        .route("/v1/client/allocation/{id}/stats", get(client::alloc_stats))
        .route("/v1/client/allocation/{id}/restart", post(client::restart).put(client::restart))
        .route("/v1/client/allocation/{id}/signal", post(client::signal).put(client::signal))
        .route("/v1/client/stats", get(client::host_stats))
        .route("/v1/event/stream", get(events::stream))
        .route_layer(axum::middleware::from_fn_with_state(server.clone(), shared::require_token))
        .route_layer(axum::middleware::from_fn_with_state(server.clone(), shared::query_headers))
        .with_state(server.clone());
    router.merge(nomad).layer(axum::middleware::from_fn_with_state(server, divert))
}

/// Sends a Nomad client's `GET /v1/allocations` to Nomad's list rather than wharf's.
async fn divert(State(server): State<Shared>, request: Request, next: Next) -> Response {
    if !(request.method() == Method::GET
        && request.uri().path() == "/v1/allocations"
        && shared::is_nomad(&request))
    {
        return next.run(request).await;
    }
    if let Err(refused) =
        shared::check_token(server.agent.config().token.as_deref(), request.headers())
    {
        return refused.into_response();
    }
    let params = match Query::<Params>::try_from_uri(request.uri()) {
        Ok(Query(params)) => params,
        Err(rejection) => {
            return NomadApiError::bad_request(rejection.body_text()).into_response();
        }
    };
    let response = reads::allocations(State(server.clone()), Query(params)).await.into_response();
    shared::with_index_headers(server.index(), response)
}
