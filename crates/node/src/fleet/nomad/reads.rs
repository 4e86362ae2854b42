//! Nomad's reads on the fleet: its work as allocations, its workers as nodes, and the fleet
//! itself as a server agent with its leader and peers.

use super::server::Shared;
use super::views;
use crate::nomad_http::{NomadApiError, NomadResult, Params};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use wharf_nomad::shapes;

/// Every allocation whose id starts with `prefix` (and that `keep` keeps), newest first.
async fn allocations_where(
    server: &Shared,
    prefix: &str,
    keep: impl Fn(&wharf_fleet::Placement) -> bool,
) -> NomadResult<Vec<shapes::Allocation>> {
    let leading = server.leading()?;
    let placements: Vec<wharf_fleet::Placement> = leading
        .scheduler()
        .list()
        .into_iter()
        .filter(|p| p.id.starts_with(prefix) && keep(p))
        .collect();
    let mut allocs = views::allocations(server, &leading, &placements).await;
    allocs.sort_by(|a, b| b.create_index.cmp(&a.create_index).then_with(|| a.id.cmp(&b.id)));
    Ok(allocs)
}

/// `GET /v1/allocations` (`?prefix=`).
pub(super) async fn allocations(
    State(server): State<Shared>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::AllocationListStub>>> {
    server.block(&params).await?;
    let prefix = params.get("prefix").map_or("", String::as_str);
    let allocs = allocations_where(&server, prefix, |_| true).await?;
    Ok(Json(allocs.iter().map(shapes::AllocationListStub::from).collect()))
}

/// `GET /v1/allocation/:id`.
pub(super) async fn allocation(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<shapes::Allocation>> {
    server.block(&params).await?;
    let leading = server.leading()?;
    let scheduler = leading.scheduler();
    let placement =
        scheduler.get(&id).ok_or_else(|| NomadApiError::not_found("alloc not found"))?;
    let payload = scheduler.payload(&id).unwrap_or_default();
    Ok(Json(views::allocation(&server, &leading, &placement, &payload).await))
}

/// The workers as nodes.
async fn all_nodes(server: &Shared) -> NomadResult<Vec<shapes::Node>> {
    let leading = server.leading()?;
    let workers = leading.pool().workers();
    Ok(futures_util::future::join_all(workers.iter().map(|view| views::node(&leading, view))).await)
}

/// `GET /v1/nodes` (`?prefix=`): the workers.
pub(super) async fn nodes(
    State(server): State<Shared>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::NodeListStub>>> {
    server.block(&params).await?;
    let prefix = params.get("prefix").map_or("", String::as_str);
    let stubs = all_nodes(&server)
        .await?
        .iter()
        .filter(|n| n.id.starts_with(prefix))
        .map(|n| shapes::NodeListStub::of(n, env!("CARGO_PKG_VERSION")))
        .collect();
    Ok(Json(stubs))
}

/// `GET /v1/node/:id`: a worker, by its id.
pub(super) async fn node(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<shapes::Node>> {
    server.block(&params).await?;
    let leading = server.leading()?;
    let view = leading
        .pool()
        .workers()
        .into_iter()
        .find(|view| view.id.0 == id)
        .ok_or_else(|| NomadApiError::not_found("node not found"))?;
    Ok(Json(views::node(&leading, &view).await))
}

/// `GET /v1/node/:id/allocations`: the work placed on a worker.
pub(super) async fn node_allocations(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<shapes::Allocation>>> {
    server.block(&params).await?;
    let leading = server.leading()?;
    if !leading.pool().workers().iter().any(|view| view.id.0 == id) {
        return Err(NomadApiError::not_found("node not found"));
    }
    Ok(Json(allocations_where(&server, "", |p| p.phase.worker() == Some(id.as_str())).await?))
}

/// `GET /v1/agent/self`: a server agent, with no client role; it leads when this replica
/// does.
pub(super) async fn agent_self(State(server): State<Shared>) -> Json<Value> {
    let fleet = &server.fleet;
    let config = fleet.config();
    let name = fleet.replica().name.clone();
    let version = env!("CARGO_PKG_VERSION");
    let leading = fleet.leading();
    let workers = leading.as_ref().map_or(0, |l| l.pool().workers().len());
    // The address as bound: the configured port may be 0.
    let port: u16 = fleet
        .replica()
        .address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(config.bind.port());
    Json(json!({
        "config": {
            "Region": "global",
            "Datacenter": "dc1",
            "NodeName": name,
            "DataDir": config.data_dir,
            "Version": {"Version": version, "VersionPrerelease": "", "VersionMetadata": "wharf", "Revision": ""},
            "Client": {"Enabled": false},
            "Server": {"Enabled": true},
            "ACL": {"Enabled": true},
            "Addresses": {"HTTP": config.bind.ip().to_string()},
            "Ports": {"HTTP": port},
        },
        "member": {
            "Name": name,
            "Addr": config.bind.ip().to_string(),
            "Port": port,
            "Tags": {"role": "nomad", "dc": "dc1", "region": "global", "build": version},
            "Status": "alive",
        },
        "stats": {
            "nomad": {
                "version": version,
                "leader": leading.is_some().to_string(),
                "server": "true",
                "known_regions": "1",
            },
            "fleet": {"workers": workers.to_string()},
        },
    }))
}

/// `GET /v1/status/leader`: the leading replica's address.
pub(super) async fn leader(State(server): State<Shared>) -> NomadResult<Json<String>> {
    let unavailable = |why: String| NomadApiError::new(StatusCode::SERVICE_UNAVAILABLE, why);
    let leader = server
        .fleet
        .store()
        .leader()
        .await
        .map_err(|e| unavailable(format!("cannot learn who leads the fleet: {e}")))?;
    Ok(Json(leader.map(|l| l.address).unwrap_or_default()))
}

/// `GET /v1/status/peers`: every replica that is up.
pub(super) async fn peers(State(server): State<Shared>) -> NomadResult<Json<Vec<String>>> {
    let replicas = server.fleet.store().replicas().await.map_err(|e| {
        NomadApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot list the replicas: {e}"),
        )
    })?;
    Ok(Json(replicas.into_iter().map(|r| r.address).collect()))
}
