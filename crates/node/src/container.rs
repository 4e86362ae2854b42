//! The container driver in the node: its settings (`[drivers.container]`), and the images'
//! garbage collection with the finished allocations (the image API is `images_api`'s).
//!
//! The driver itself (images, runc, the waiter) is wharf-container's; the `wharf` binary is
//! also the containers' waiter (`wharf_container::waiter::run_if_invoked` in its `main`).

use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wharf_container::{ContainerDriver, ContainerOptions, Runtime};
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
    /// Registries (`host[:port]`) pulled from over plain HTTP; every other one over HTTPS.
    pub insecure_registries: Vec<String>,
}

impl Default for ContainerDriverConfig {
    fn default() -> Self {
        ContainerDriverConfig {
            enabled: true,
            runtime: Runtime::default(),
            runtime_path: None,
            allowed_mount_dirs: Vec::new(),
            insecure_registries: Vec::new(),
        }
    }
}

/// The node's container driver, if enabled and its store opens (why not is logged): its data
/// under `<data_dir>/container`, its tasks under raw_exec's shim (`shim_path`, or the default).
pub(crate) fn driver(
    settings: &ContainerDriverConfig,
    data_dir: &Path,
    shim_path: Option<PathBuf>,
    cgroups: &TaskCgroups,
) -> Option<Arc<ContainerDriver>> {
    if !settings.enabled {
        return None;
    }
    let mut options = ContainerOptions::new(data_dir.join("container"));
    options.runtime = settings.runtime;
    options.runtime_path = settings.runtime_path.clone();
    options.allowed_mount_dirs = settings.allowed_mount_dirs.clone();
    options.registries.insecure = settings.insecure_registries.clone();
    let exec = wharf_exec::RawExecOptions { shim_path, ..wharf_exec::RawExecOptions::default() };
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
