//! The container driver in the node: its settings (`[drivers.container]`), the image API
//! (`/v1/images`), and the images' garbage collection with the finished allocations.
//!
//! The driver itself (images, runc, the waiter) is wharf-container's; the `wharf` binary is
//! also the containers' waiter (`wharf_container::waiter::run_if_invoked` in its `main`).

use crate::agent::Agent;
use crate::api::ApiError;
use crate::config::NodeConfig;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use hyper::StatusCode;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use wharf_container::{ContainerDriver, ContainerOptions, ImageRef, Runtime, StoredImage};
use wharf_exec::TaskCgroups;

/// The container driver's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainerDriverConfig {
    /// Whether tasks may use it (it still needs root, runc and overlayfs to be healthy).
    pub enabled: bool,
    /// The OCI runtime: `runc` (default) or `crun` (which refuses hybrid cgroup layouts).
    pub runtime: Runtime,
    /// The runtime's program; by default found on the system's paths.
    pub runtime_path: Option<PathBuf>,
    /// Host directories under which tasks' `mounts` may take their sources; none by default.
    pub allowed_mount_dirs: Vec<PathBuf>,
}

impl Default for ContainerDriverConfig {
    fn default() -> Self {
        ContainerDriverConfig {
            enabled: true,
            runtime: Runtime::default(),
            runtime_path: None,
            allowed_mount_dirs: Vec::new(),
        }
    }
}

/// The node's container driver, if enabled and its store opens (why not is logged).
pub(crate) fn driver(config: &NodeConfig, cgroups: &TaskCgroups) -> Option<Arc<ContainerDriver>> {
    let settings = &config.drivers.container;
    if !settings.enabled {
        return None;
    }
    let mut options = ContainerOptions::new(config.data_dir.join("container"));
    options.runtime = settings.runtime;
    options.runtime_path = settings.runtime_path.clone();
    options.allowed_mount_dirs = settings.allowed_mount_dirs.clone();
    let exec = wharf_exec::RawExecOptions {
        shim_path: config.drivers.raw_exec.shim_path.clone(),
        ..wharf_exec::RawExecOptions::default()
    };
    match ContainerDriver::new(options, exec, cgroups.clone()) {
        Ok(driver) => Some(Arc::new(driver)),
        Err(error) => {
            tracing::error!(%error, "the container driver is not available");
            None
        }
    }
}

/// The images the allocations the agent keeps name (`config.image` of their container tasks).
pub(crate) fn images_named(
    allocs: impl IntoIterator<Item = wharf_state::Allocation>,
) -> BTreeSet<String> {
    let mut images = BTreeSet::new();
    for alloc in allocs {
        for group in alloc.job.groups.iter().filter(|g| g.name == alloc.task_group) {
            for task in group.tasks.iter().filter(|t| t.driver == wharf_container::DRIVER_NAME) {
                if let Some(image) = task.config.get("image").and_then(|v| v.as_str()) {
                    images.insert(image.to_owned());
                }
            }
        }
    }
    images
}

/// Removes the stored images that no allocation the agent still keeps names: run after the
/// finished allocations are collected.
pub(crate) async fn collect_images(driver: &Arc<ContainerDriver>, mut in_use: BTreeSet<String>) {
    in_use.extend(driver.images_in_use());
    let store = driver.store().clone();
    match tokio::task::spawn_blocking(move || store.collect_garbage(&in_use)).await {
        Ok(Ok(removed)) => {
            for image in removed {
                tracing::info!(%image, "garbage-collected image");
            }
        }
        Ok(Err(error)) => tracing::warn!(%error, "cannot collect unused images"),
        Err(error) => tracing::warn!(%error, "the image collection did not finish"),
    }
}

/// `/v1/images`: list (GET), pull (POST `{"reference": ...}`), remove (DELETE
/// `?reference=...`).
pub(crate) fn routes() -> Router<Arc<Agent>> {
    Router::new().route("/v1/images", get(list).post(pull).delete(remove))
}

#[derive(Debug, Deserialize)]
struct ImageQuery {
    reference: String,
}

fn driver_of(agent: &Agent) -> Result<Arc<ContainerDriver>, ApiError> {
    agent.containers().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "the container driver is not enabled on this node",
        )
    })
}

fn image_error(error: wharf_container::ContainerError) -> ApiError {
    use wharf_container::ContainerError as E;
    let status = match &error {
        E::BadReference { .. } => StatusCode::BAD_REQUEST,
        E::ImageNotFound { .. } => StatusCode::NOT_FOUND,
        E::BadImage { .. } | E::LayerRefused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        E::Pull { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, error.to_string())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, wharf_container::ContainerError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(image_error)
}

async fn list(State(agent): State<Arc<Agent>>) -> Result<Json<Vec<StoredImage>>, ApiError> {
    let store = driver_of(&agent)?.store().clone();
    Ok(Json(blocking(move || store.list()).await?))
}

async fn pull(
    State(agent): State<Arc<Agent>>,
    Json(query): Json<ImageQuery>,
) -> Result<Json<StoredImage>, ApiError> {
    let store = driver_of(&agent)?.store().clone();
    let reference = ImageRef::parse(&query.reference).map_err(image_error)?;
    Ok(Json(blocking(move || store.pull(&reference)).await?))
}

async fn remove(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ImageQuery>,
) -> Result<StatusCode, ApiError> {
    let driver = driver_of(&agent)?;
    if driver.images_in_use().contains(&query.reference) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("image {} is in use by a running container", query.reference),
        ));
    }
    let store = driver.store().clone();
    let reference = query.reference.clone();
    if blocking(move || store.remove(&reference)).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(StatusCode::NOT_FOUND, format!("no image {}", query.reference)))
    }
}
