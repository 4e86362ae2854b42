//! Nomad's reads of allocations, nodes and the agent itself, on the agent.

use super::common::{Shared, block};
use super::views;
use crate::nomad_http::{NomadApiError, NomadResult, Params};
use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};
use wharf_nomad::shapes;

/// `GET /v1/allocations` (`?prefix=`).
pub(crate) async fn allocations(
    State(server): State<Shared>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::AllocationListStub>>> {
    block(&server, &params).await?;
    let prefix = params.get("prefix").map_or("", String::as_str);
    Ok(Json(
        views::allocations(&server, prefix).iter().map(shapes::AllocationListStub::from).collect(),
    ))
}

/// `GET /v1/allocation/:id`.
pub(crate) async fn allocation(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<shapes::Allocation>> {
    block(&server, &params).await?;
    let runner = server.agent.get(&id).map_err(|_| NomadApiError::not_found("alloc not found"))?;
    Ok(Json(views::allocation(&server, &runner)))
}

/// `GET /v1/nodes`: this node.
pub(crate) async fn nodes(
    State(server): State<Shared>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::NodeListStub>>> {
    block(&server, &params).await?;
    let node = views::node(&server).await;
    let prefix = params.get("prefix").map_or("", String::as_str);
    let stubs = [node]
        .iter()
        .filter(|n| n.id.starts_with(prefix))
        .map(|n| shapes::NodeListStub::of(n, env!("CARGO_PKG_VERSION")))
        .collect();
    Ok(Json(stubs))
}

/// `GET /v1/node/:id`: this node, by its id.
pub(crate) async fn node(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<shapes::Node>> {
    block(&server, &params).await?;
    if id != server.node_id {
        return Err(NomadApiError::not_found("node not found"));
    }
    Ok(Json(views::node(&server).await))
}

/// `GET /v1/node/:id/allocations`.
pub(crate) async fn node_allocations(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::Allocation>>> {
    block(&server, &params).await?;
    if id != server.node_id {
        return Err(NomadApiError::not_found("node not found"));
    }
    Ok(Json(views::allocations(&server, "")))
}

/// `GET /v1/agent/self`: a client agent, with no server role.
pub(crate) async fn agent_self(State(server): State<Shared>) -> Json<Value> {
    let config = server.agent.config();
    let name = server.node_name();
    let version = env!("CARGO_PKG_VERSION");
    let port: u16 = server
        .http_addr()
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(config.bind.port());
    Json(json!({
        "config": {
            "Region": "global",
            "Datacenter": "dc1",
            "NodeName": name,
            "DataDir": config.data_dir,
            "Version": {"Version": version, "VersionPrerelease": "", "VersionMetadata": "wharf", "Revision": ""},
            "Client": {"Enabled": true, "NodeID": server.node_id},
            "Server": {"Enabled": false},
            "ACL": {"Enabled": config.token.is_some()},
            "Addresses": {"HTTP": config.bind.ip().to_string()},
            "Ports": {"HTTP": port},
        },
        "member": {
            "Name": name,
            "Addr": config.bind.ip().to_string(),
            "Port": port,
            "Tags": {"role": "client", "dc": "dc1", "region": "global", "build": version, "id": server.node_id},
            "Status": "alive",
        },
        "stats": {
            "client": {"node_id": server.node_id, "known_servers": "", "num_allocations": server.agent.list().len().to_string(), "last_heartbeat": "0"},
            "nomad": {"version": version},
        },
    }))
}

/// `GET /v1/status/leader`: the agent answers for itself.
pub(crate) async fn leader(State(server): State<Shared>) -> Json<String> {
    Json(server.http_addr())
}

/// `GET /v1/status/peers`.
pub(crate) async fn peers(State(server): State<Shared>) -> Json<Vec<String>> {
    Json(vec![server.http_addr()])
}
