//! Arvados' dispatcher management API on the fleet, beside wharf's own paths, so that Arvados'
//! tools can read and steer wharf's workers:
//!
//! | call | what |
//! |------|------|
//! | `GET /arvados/v1/dispatch/instances` | `{"items": [...]}`, each worker with Arvados' field names |
//! | `POST /arvados/v1/dispatch/instances/{hold,drain,run}?instance_id=ID` | its idle behaviour |
//! | `POST /arvados/v1/dispatch/instances/kill?instance_id=ID[&reason=R]` | shut it down now |
//!
//! They take the fleet's token as every other call does. A missing `instance_id` is a 400, an
//! unknown one a 404, as in Arvados.

use super::wiring::{Fleet, Leading};
use crate::api::ApiError;
use crate::api::extract::{Path, Query};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use wharf_prober::{IdleBehavior, InstanceId, ProberError, WorkerView};

/// The routes, for the fleet's router to merge among those that need its token.
pub(super) fn routes() -> Router<Arc<Fleet>> {
    Router::new()
        .route("/arvados/v1/dispatch/instances", get(instances))
        .route("/arvados/v1/dispatch/instances/{action}", post(instance_action))
}

/// The answer of `GET /arvados/v1/dispatch/instances`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArvadosInstances {
    /// Every worker.
    pub items: Vec<ArvadosInstance>,
}

/// One worker, as Arvados' dispatcher lists an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArvadosInstance {
    /// Its id.
    pub instance: String,
    /// Its host (address without the port); empty until known.
    pub address: String,
    /// Its hourly price; 0 when its type has none.
    pub price: f64,
    /// Its instance type's name in the fleet's configuration.
    pub arvados_instance_type: String,
    /// The cloud's name of its type.
    pub provider_instance_type: String,
    /// The last allocation it ran or runs; empty if none.
    pub last_container_uuid: String,
    /// When it was last busy (RFC 3339, UTC).
    pub last_busy: String,
    /// The allocations it runs now.
    pub running_container_uuids: Vec<String>,
    /// `unknown`, `booting`, `idle`, `running` or `shutdown`.
    pub worker_state: String,
    /// `run`, `hold` or `drain`.
    pub idle_behavior: String,
}

impl ArvadosInstance {
    fn of(view: WorkerView, leading: &Leading, now: wharf_state::Timestamp) -> ArvadosInstance {
        let instance_type = leading.pool().instance_type(&view.instance_type);
        let address = view.address.as_deref().map(host_of).unwrap_or_default().to_owned();
        let idle_millis = u64::try_from(view.idle_for.as_millis()).unwrap_or(u64::MAX);
        ArvadosInstance {
            instance: view.id.0,
            address,
            price: instance_type.price.map_or(0.0, |p| p.hourly()),
            provider_instance_type: instance_type.provider_type,
            arvados_instance_type: view.instance_type,
            last_container_uuid: view.last_runner.unwrap_or_default(),
            last_busy: wharf_state::Timestamp(now.0.saturating_sub(idle_millis)).to_string(),
            running_container_uuids: view.running,
            worker_state: view.state.to_string(),
            idle_behavior: view.idle_behavior.to_string(),
        }
    }
}

/// The host of `host:port` (`[v6]:port` too); an address without a port as it is.
fn host_of(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => address,
    }
}

async fn instances(
    State(fleet): State<Arc<Fleet>>,
) -> Result<axum::Json<ArvadosInstances>, ApiError> {
    let leading = leading(&fleet)?;
    let now = fleet.now();
    let views = leading.pool().workers();
    let items = views.into_iter().map(|view| ArvadosInstance::of(view, &leading, now)).collect();
    Ok(axum::Json(ArvadosInstances { items }))
}

/// What leads; a replica that does not answers 503 (the fleet's router forwards these calls to
/// the leader before they get here).
fn leading(fleet: &Fleet) -> Result<Arc<Leading>, ApiError> {
    fleet.leading().ok_or_else(|| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "this replica no longer leads; try again")
    })
}

/// An unknown instance is a 404, as in Arvados; an action its state forbids a 409.
fn prober_error(error: &ProberError) -> ApiError {
    let status = match error {
        ProberError::UnknownWorker(_) => StatusCode::NOT_FOUND,
        ProberError::NotAllowed { .. } => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, error.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceQuery {
    instance_id: Option<String>,
    reason: Option<String>,
}

async fn instance_action(
    State(fleet): State<Arc<Fleet>>,
    Path(action): Path<String>,
    Query(query): Query<InstanceQuery>,
) -> Result<StatusCode, ApiError> {
    let id = match query.instance_id.filter(|id| !id.is_empty()) {
        Some(id) => InstanceId(id),
        None => return Err(ApiError::bad_request("instance_id parameter not provided")),
    };
    let leading = leading(&fleet)?;
    let result = match action.as_str() {
        "kill" => {
            let reason = format!(
                "via the Arvados management API: {}",
                query.reason.as_deref().unwrap_or("no reason given")
            );
            leading.pool().kill_instance(&id, &reason).await
        }
        "hold" | "drain" | "run" => {
            let behavior: IdleBehavior =
                action.parse().map_err(|e| ApiError::bad_request(format!("{e}")))?;
            fleet.set_idle_behavior(&leading, &id, behavior).await
        }
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no instance action {other:?}: use hold, drain, run or kill"),
            ));
        }
    };
    result.map_err(|e| prober_error(&e))?;
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_lose_their_port_as_arvados_shows_them() {
        assert_eq!(host_of("10.231.200.4:22"), "10.231.200.4");
        assert_eq!(host_of("[fd00::4]:22"), "fd00::4");
        assert_eq!(host_of("fd00::4"), "fd00::4");
        assert_eq!(host_of("node-1"), "node-1");
    }
}
