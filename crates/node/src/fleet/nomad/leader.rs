//! On a follower replica, every Nomad call goes to the leader, which holds the job records
//! (read from the fleet's store when its term began) and places the work: sent on with the fleet's token (the replicas share it) and its
//! answer streamed back in Nomad's words, with the leader's index.

use super::relay::relay;
use super::server::Shared;
use crate::client::Client;
use crate::nomad_http::{NomadApiError, NomadResult};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Middleware: the call is answered here while this replica leads, else by the leader.
pub(super) async fn follow_the_leader(
    State(server): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
    if server.fleet.leading().is_some() {
        if let Err(unready) = server.synced().await {
            return unready.into_response();
        }
        return next.run(request).await;
    }
    to_the_leader(&server, request).await.unwrap_or_else(IntoResponse::into_response)
}

/// `request` sent to the leader, and its answer; a 503 while no other replica leads.
pub(super) async fn to_the_leader(server: &Shared, request: Request) -> NomadResult<Response> {
    let unavailable = |why: String| NomadApiError::new(StatusCode::SERVICE_UNAVAILABLE, why);
    let fleet = &server.fleet;
    let leader = fleet
        .store()
        .leader()
        .await
        .map_err(|e| unavailable(format!("cannot learn who leads the fleet: {e}")))?
        .filter(|leader| leader.name != fleet.replica().name)
        .ok_or_else(|| unavailable("no replica leads the fleet now; try again shortly".into()))?;
    let client = Client::new(&leader.address, fleet.config().token.clone());
    let who = format!("the leader at {}", leader.address);
    let mut response = relay(&client, &who, request, None, fleet.config().max_body_bytes).await?;
    if let Ok(value) = axum::http::HeaderValue::from_str(&leader.address) {
        response.headers_mut().insert("x-wharf-leader", value);
    }
    Ok(response)
}
