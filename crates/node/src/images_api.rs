//! `/v1/images`: the container driver's image store over HTTP (list, pull, remove). Errors
//! are answered as the rest of the API answers them: `{"error": "..."}` with a status.

use crate::agent::Agent;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hyper::StatusCode;
use serde::Deserialize;
use std::sync::Arc;
use wharf_container::{ContainerDriver, ContainerError, ImageRef, StoredImage};

/// `/v1/images`: list (GET), pull (POST `{"reference": ...}`), remove (DELETE
/// `?reference=...`).
pub(crate) fn routes() -> Router<Arc<Agent>> {
    Router::new().route("/v1/images", get(list).post(pull).delete(remove))
}

#[derive(Debug, Deserialize)]
struct ImageQuery {
    reference: String,
}

fn driver_of(agent: &Agent) -> Result<Arc<ContainerDriver>, ImageApiError> {
    agent.containers().cloned().ok_or_else(|| {
        ImageApiError(
            StatusCode::NOT_IMPLEMENTED,
            "the container driver is not enabled on this node".into(),
        )
    })
}

fn image_error(error: ContainerError) -> ImageApiError {
    use ContainerError as E;
    let status = match &error {
        E::BadReference { .. } => StatusCode::BAD_REQUEST,
        E::ImageNotFound { .. } => StatusCode::NOT_FOUND,
        E::BadImage { .. } | E::LayerRefused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        E::Pull { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ImageApiError(status, error.to_string())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ContainerError> + Send + 'static,
) -> Result<T, ImageApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ImageApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(image_error)
}

async fn list(State(agent): State<Arc<Agent>>) -> Result<Json<Vec<StoredImage>>, ImageApiError> {
    let store = driver_of(&agent)?.store().clone();
    Ok(Json(blocking(move || store.list()).await?))
}

async fn pull(
    State(agent): State<Arc<Agent>>,
    Json(query): Json<ImageQuery>,
) -> Result<Json<StoredImage>, ImageApiError> {
    let driver = driver_of(&agent)?;
    let reference = ImageRef::parse(&query.reference).map_err(image_error)?;
    let image = wharf_container::fetch(driver.store(), &reference, driver.registries(), true)
        .await
        .map_err(image_error)?;
    Ok(Json(image))
}

async fn remove(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ImageQuery>,
) -> Result<StatusCode, ImageApiError> {
    let driver = driver_of(&agent)?;
    // As the collector: an image stays while an allocation the agent keeps names it.
    let mut in_use = crate::container::images_named(agent.list().iter().map(|r| r.alloc()));
    in_use.extend(driver.images_in_use());
    if in_use.contains(&query.reference) {
        return Err(ImageApiError(
            StatusCode::CONFLICT,
            format!("image {} is in use by an allocation on this node", query.reference),
        ));
    }
    let store = driver.store().clone();
    let reference = query.reference.clone();
    if blocking(move || store.remove(&reference)).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ImageApiError(StatusCode::NOT_FOUND, format!("no image {}", query.reference)))
    }
}

/// An error of the image API: a status and a message.
#[derive(Debug)]
pub(crate) struct ImageApiError(StatusCode, String);

impl IntoResponse for ImageApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}
