//! [`ContainerDriver`]: the [`Driver`] trait for OCI images under runc.
//!
//! A container task is a raw_exec task whose program is the waiter ([`crate::waiter`]), so
//! the shim, its log files, its durable exit record, its cgroup, kills, stats and reattach
//! are wharf-exec's, unchanged. What this driver adds around it: the image (from the store,
//! fetched on first use), the root filesystem (an overlayfs mounted before the start and
//! unmounted at destroy), the bundle's `config.json`, the runtime's `state` on recover,
//! `exec` through `runc exec`, and `runc delete` at destroy.
//!
//! ```text
//! <task_dir>/.container/<run>/config.json   the bundle (plus pid, started|failed, runtime.log)
//!                             rootfs/        the overlayfs mount point
//!                             upper/ work/   the task's own layer, and overlayfs's scratch
//! <data_dir>/images/                         the image store
//! <data_dir>/runtime/                        the runtime's state (`--root`)
//! ```

use crate::cgroup_path::{cgroups_path, remove_runtime_parents};
use crate::config::{ContainerConfig, ContainerOptions};
use crate::error::ContainerError;
use crate::mount;
use crate::reference::ImageRef;
use crate::runtime::RuntimeCommand;
use crate::spec::{self, SpecInputs};
use crate::store::ImageStore;
use crate::waiter::{self, FAILED_FILE, PID_FILE, STARTED_FILE};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use wharf_driver::{
    Capabilities, Driver, DriverError, DriverEvent, DriverState, ExecResult, ExitResult,
    Fingerprint, FsIsolation, Health, LogFrom, LogReader, LogStream, LogTarget, ResourceUsage,
    RunState, TaskConfig, TaskHandle, TaskId, TaskInfo,
};
use wharf_exec::{RawExecDriver, RawExecOptions, TaskCgroups};
use wharf_state::Signal;

/// The name job specs use for this driver.
pub const DRIVER_NAME: &str = "container";
/// The directory, inside a task directory, that holds one container directory per run.
pub const CONTAINERS_DIR: &str = ".container";
const STATE_VERSION: u32 = 1;

/// The container driver. Linux only, as root.
#[derive(Debug)]
pub struct ContainerDriver {
    inner: RawExecDriver,
    store: Arc<ImageStore>,
    options: ContainerOptions,
    runtime: RuntimeCommand,
    waiter: PathBuf,
    cgroups: TaskCgroups,
    containers: Mutex<HashMap<TaskId, Arc<Container>>>,
    /// Held through a container's destroy: a second destroy (the task's release, and the GC
    /// of its allocation) waits for the first and then finds the container gone, rather than
    /// racing it over the mount and the directory.
    destroying: Mutex<HashMap<TaskId, Arc<tokio::sync::Mutex<()>>>>,
    /// Shared by the starts, from before the runtime makes the container's cgroups until it
    /// has; taken alone to remove the runtime's parents, which would otherwise go between the
    /// runtime's making of the parent and of the container's cgroup in it.
    runtime_cgroups: tokio::sync::RwLock<()>,
}

/// What the driver knows of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Container {
    /// The runtime's id for it.
    id: String,
    /// Its directory: bundle, root filesystem, upper layer.
    dir: PathBuf,
    /// The image reference it runs.
    image: String,
}

impl Container {
    fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
}

/// The handle's `driver_state`: the container and the shim's own state.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedState {
    version: u32,
    container: Container,
    shim: DriverState,
}

impl ContainerDriver {
    /// Removes the parents the runtime made outside the node's hierarchies, unless a container of
    /// the node is still in them (the kernel refuses then); no container is made meanwhile.
    /// After every deletion of a container: the last one's takes them.
    async fn clear_runtime_parents(&self) {
        let _no_starts = self.runtime_cgroups.write().await;
        remove_runtime_parents(&self.cgroups);
    }

    /// Deletes a container the runtime has made ([`ContainerDriver::clean_up`]), then the
    /// runtime's parents if it was the node's last container in them.
    async fn delete(&self, container: &Container) -> Result<(), DriverError> {
        let deleted = self.clean_up(container).await;
        self.clear_runtime_parents().await;
        deleted
    }

    /// Starts `container`'s waiter under the shim and waits until the runtime has started the
    /// container; the shim's task of a start that fails is destroyed again (the container is
    /// the caller's to delete).
    async fn launch(
        &self,
        config: &TaskConfig,
        container: &Container,
    ) -> Result<TaskHandle, DriverError> {
        let inner = self.inner.start_task(self.waiter_task(config, container)).await?;
        if let Err(error) = self.started(&config.id, container).await {
            let _ = self.inner.destroy_task(&config.id, true).await;
            return Err(error);
        }
        Ok(inner)
    }

    /// A destroy, with no other of the same task under way.
    async fn destroy_one(&self, task_id: &TaskId, force: bool) -> Result<(), DriverError> {
        let container = self.container(task_id)?;
        let info = self.inner.inspect_task(task_id).await?;
        if info.state != RunState::Exited {
            if !force {
                return Err(DriverError::other(format!(
                    "task {task_id} is still running; stop it first, or destroy with force"
                )));
            }
            self.inner.stop_task(task_id, Duration::ZERO, Signal::Kill).await?;
        }
        // The runtime's delete first: it leaves the task's cgroup empty for the shim's driver.
        self.delete(&container).await?;
        self.inner.destroy_task(task_id, true).await?;
        self.containers.lock().remove(task_id);
        Ok(())
    }

    /// A driver with the node's `options`, raw_exec's `exec` options (shim, timeouts) and the
    /// node's task cgroups. Opens the image store; checks nothing else yet (what the node
    /// lacks shows in [`Driver::fingerprint`] and fails each start with a clear error).
    pub fn new(
        options: ContainerOptions,
        exec: RawExecOptions,
        cgroups: TaskCgroups,
    ) -> Result<ContainerDriver, ContainerError> {
        let store = Arc::new(ImageStore::open(options.data_dir.join("images"))?);
        let runtime_root = options.data_dir.join("runtime");
        std::fs::create_dir_all(&runtime_root)
            .map_err(ContainerError::io("make", &runtime_root))?;
        let runtime = RuntimeCommand {
            program: options.runtime_program(),
            root: runtime_root,
            timeout: options.runtime_timeout,
        };
        let waiter = options
            .waiter
            .clone()
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_else(|| PathBuf::from("wharf"));
        if let TaskCgroups::Off { reason } = &cgroups {
            tracing::warn!(%reason, "containers run without the node's cgroups: no limits, no OOM reports");
        }
        let inner = RawExecDriver::new(exec).with_cgroups_unannounced(cgroups.clone());
        Ok(ContainerDriver {
            inner,
            store,
            options,
            runtime,
            waiter,
            cgroups,
            containers: Mutex::default(),
            destroying: Mutex::default(),
            runtime_cgroups: tokio::sync::RwLock::new(()),
        })
    }

    /// The image store the driver runs from.
    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    /// How the driver reaches registries.
    pub fn registries(&self) -> &crate::registry::RegistryOptions {
        &self.options.registries
    }

    /// The references of the images the driver's containers run now.
    pub fn images_in_use(&self) -> std::collections::BTreeSet<String> {
        self.containers.lock().values().map(|c| c.image.clone()).collect()
    }

    /// Deletes (with force: what still runs in them is killed) every container the runtime
    /// keeps state for under this driver's root, whether a task still records it or not: for
    /// a node being wiped, where an agent killed mid-destroy may have left one. Their ids.
    /// One that cannot be deleted (its state half written by the killed agent, say) does not
    /// stop the others: the wipe kills what is left through the node's cgroups after. The
    /// first such failure is returned once every container was tried. As a destroy does, it
    /// then removes the parents the runtime made outside the node's hierarchies, whether or not
    /// a container was left: an agent killed between a destroy's delete and that removal
    /// leaves the parents with no container.
    pub async fn delete_all_containers(&self) -> Result<Vec<String>, ContainerError> {
        let ids = self.runtime.known();
        let mut failed = None;
        for id in &ids {
            if let Err(reason) = self.runtime.delete(id).await {
                tracing::warn!(container = %id, %reason, "cannot delete a container");
                failed.get_or_insert(ContainerError::Runtime {
                    runtime: self.runtime.program.display().to_string(),
                    action: "delete",
                    reason,
                });
            }
        }
        self.clear_runtime_parents().await;
        match failed {
            Some(error) => Err(error),
            None => Ok(ids),
        }
    }

    /// Destroys (with force) every container of allocation `alloc_id` the driver still holds,
    /// after any destroy of one already under way: for an allocation about to be collected,
    /// whose directory must not be removed while a container's root is mounted in it.
    pub async fn destroy_alloc_containers(&self, alloc_id: &str) -> Result<(), DriverError> {
        let prefix = format!("{alloc_id}/");
        let ids: Vec<TaskId> =
            self.containers.lock().keys().filter(|id| id.0.starts_with(&prefix)).cloned().collect();
        for id in ids {
            match self.destroy_task(&id, true).await {
                Ok(()) | Err(DriverError::TaskNotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn container(&self, id: &TaskId) -> Result<Arc<Container>, DriverError> {
        self.containers.lock().get(id).cloned().ok_or_else(|| DriverError::not_found(id))
    }

    /// The raw_exec task that runs the waiter for `config`: the same run, its program the
    /// waiter, and only a `PATH` of its own (the container's environment is in its spec).
    fn waiter_task(&self, config: &TaskConfig, container: &Container) -> TaskConfig {
        let mut task = config.clone();
        task.driver_config = serde_json::Map::new();
        task.driver_config.insert("command".into(), self.waiter.display().to_string().into());
        let args = waiter::waiter_args(
            &self.runtime.program,
            &self.runtime.root,
            &container.dir,
            &container.id,
        );
        task.driver_config.insert("args".into(), args.into());
        task.env =
            BTreeMap::from([("PATH".to_owned(), wharf_exec::config::DEFAULT_PATH.to_owned())]);
        task
    }

    /// Everything a start does before the waiter runs: the image, the mount, the bundle.
    async fn prepare(&self, config: &TaskConfig, container: &Container) -> Result<(), DriverError> {
        let parsed = ContainerConfig::parse(&config.driver_config)?;
        let mut host_mounts = Vec::new();
        for (i, m) in parsed.mounts.iter().enumerate() {
            if !self.options.mount_allowed(&m.source) {
                return Err(DriverError::invalid_config(
                    format!("config.mounts[{i}].source"),
                    format!(
                        "{} is not under a directory the node allows for mounts (allowed_mount_dirs)",
                        m.source.display()
                    ),
                ));
            }
            host_mounts.push((m.source.clone(), m.target.clone(), m.readonly));
        }
        // A profile file is a host path the job names, as a mount's source is.
        if let crate::seccomp::SeccompChoice::File(path) = parsed.seccomp()
            && !self.options.mount_allowed(&path)
        {
            return Err(DriverError::invalid_config(
                "config.security_opt",
                format!(
                    "the seccomp profile {} is not under a directory the node allows for host \
                     paths (allowed_mount_dirs)",
                    path.display()
                ),
            ));
        }
        // The group's host volumes, which the node's config declares (so no allow-list here).
        for volume in &config.mounts {
            let target = PathBuf::from(&volume.destination);
            host_mounts.push((volume.source.clone(), target, volume.read_only));
        }
        let reference = ImageRef::parse(&parsed.image)?;
        let image =
            crate::fetch::fetch(&self.store, &reference, &self.options.registries, false).await?;
        let store = self.store.clone();
        let (image_config, layers) = tokio::task::spawn_blocking(move || {
            Ok::<_, ContainerError>((store.config(&image)?, store.layer_dirs(&image)?))
        })
        .await
        .map_err(|e| {
            DriverError::other(format!("the image's preparation did not finish: {e}"))
        })??;
        for dir in [
            config.alloc_dir.clone(),
            config.task_dir.join("local"),
            config.task_dir.join("secrets"),
        ] {
            std::fs::create_dir_all(&dir).map_err(ContainerError::io("make", &dir))?;
        }
        for sub in ["rootfs", "upper", "work"] {
            let dir = container.dir.join(sub);
            std::fs::create_dir_all(&dir).map_err(ContainerError::io("make", &dir))?;
        }
        let rootfs = container.rootfs();
        mount::mount_overlay(
            &layers,
            &container.dir.join("upper"),
            &container.dir.join("work"),
            &rootfs,
        )
        .map_err(ContainerError::io("mount the root filesystem at", &rootfs))?;
        let inputs = SpecInputs {
            task: config,
            config: &parsed,
            image: &image_config,
            rootfs: &rootfs,
            cgroups_path: cgroups_path(&self.cgroups, &config.id.0),
            host_mounts: &host_mounts,
        };
        let spec = spec::build(&inputs)?;
        let path = container.dir.join("config.json");
        spec.save(&path).map_err(|e| ContainerError::Io {
            action: "write",
            path: path.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(())
    }

    /// Waits (bounded) for the waiter to say the container runs, or why it does not.
    async fn started(&self, task_id: &TaskId, container: &Container) -> Result<(), DriverError> {
        let limit = self.options.runtime_timeout;
        let check = async {
            loop {
                if container.dir.join(STARTED_FILE).exists() {
                    return Ok(());
                }
                if let Ok(reason) = std::fs::read_to_string(container.dir.join(FAILED_FILE)) {
                    return Err(start_error(reason));
                }
                if matches!(
                    self.inner.inspect_task(task_id).await,
                    Ok(TaskInfo { state: RunState::Exited, .. })
                ) {
                    // The last look: the files are written before the waiter exits.
                    if container.dir.join(STARTED_FILE).exists() {
                        return Ok(());
                    }
                    let reason = std::fs::read_to_string(container.dir.join(FAILED_FILE))
                        .unwrap_or_else(|_| {
                            "the container's waiter exited before it started".into()
                        });
                    return Err(start_error(reason));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        match tokio::time::timeout(limit, check).await {
            Ok(result) => result,
            Err(_) => Err(DriverError::other(format!(
                "the container did not start within {limit:?}; see {}",
                container.dir.join(waiter::RUNTIME_LOG).display()
            ))),
        }
    }

    /// Undoes a start's preparation: the runtime's container, the mount, the directory.
    async fn clean_up(&self, container: &Container) -> Result<(), DriverError> {
        let deleted = self.runtime.delete(&container.id).await;
        let rootfs = container.rootfs();
        mount::unmount(&rootfs).map_err(ContainerError::io("unmount", &rootfs))?;
        deleted.map_err(|reason| ContainerError::Runtime {
            runtime: self.runtime.program.display().to_string(),
            action: "delete",
            reason,
        })?;
        match std::fs::remove_dir_all(&container.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ContainerError::io("remove", &container.dir)(e).into()),
        }
    }

    async fn fingerprint_checks(&self) -> Result<String, String> {
        let version = self
            .runtime
            .version()
            .await
            .map_err(|e| format!("the runtime does not run (install runc): {e}"))?;
        let scratch = self.options.data_dir.join("runtime").join(".overlay-check");
        let _ = mount::unmount(&scratch.join("merged"));
        let _ = std::fs::remove_dir_all(&scratch);
        let dirs = ["lower", "upper", "work", "merged"].map(|d| scratch.join(d));
        for dir in &dirs {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        }
        let mounted = mount::mount_overlay(&dirs[..1], &dirs[1], &dirs[2], &dirs[3]);
        let _ = mount::unmount(&dirs[3]);
        let _ = std::fs::remove_dir_all(&scratch);
        mounted
            .map_err(|e| format!("an overlay mount fails here (overlayfs and root needed): {e}"))?;
        Ok(version)
    }
}

fn start_error(reason: String) -> DriverError {
    let reason = reason.trim().to_owned();
    let lower = reason.to_ascii_lowercase();
    if lower.contains("executable file not found")
        || lower.contains("no such file or directory")
        || lower.contains("permission denied")
    {
        DriverError::invalid_config("config.command", reason)
    } else {
        DriverError::other(reason)
    }
}

/// A run's container: its runtime id (the task's cgroup name, prefixed) and directory.
fn container_for(config: &TaskConfig) -> Container {
    let name = wharf_isolate::cgroup::cgroup_name(&config.id.0);
    Container {
        id: format!("wharf-{name}"),
        dir: config.task_dir.join(CONTAINERS_DIR).join(name),
        image: config
            .driver_config
            .get("image")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned(),
    }
}

#[async_trait::async_trait]
impl Driver for ContainerDriver {
    fn name(&self) -> &str {
        DRIVER_NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            send_signals: true,
            exec: true,
            logs: true,
            fs_isolation: FsIsolation::Image,
        }
    }

    async fn fingerprint(&self) -> Fingerprint {
        let mut attributes = BTreeMap::new();
        attributes.insert(
            "driver.container.runtime".to_owned(),
            self.runtime.program.display().to_string(),
        );
        attributes.insert("driver.container.cgroups".to_owned(), self.cgroups.describe());
        let shim = self.inner.fingerprint().await;
        let (health, description) = if shim.health != Health::Healthy {
            (shim.health, shim.description)
        } else {
            match self.fingerprint_checks().await {
                Ok(version) => {
                    attributes
                        .insert("driver.container.runtime_version".to_owned(), version.clone());
                    (Health::Healthy, format!("container: ready ({version})"))
                }
                Err(reason) => (Health::Unhealthy, reason),
            }
        };
        Fingerprint { health, description, attributes }
    }

    fn validate_config(
        &self,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DriverError> {
        let parsed = ContainerConfig::parse(config)?;
        ImageRef::parse(&parsed.image)?;
        Ok(())
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        if self.containers.lock().contains_key(&config.id) {
            return Err(DriverError::other(format!("task {} is already running", config.id)));
        }
        let container = container_for(&config);
        // What an earlier, crashed start of the same run left.
        if container.dir.exists() {
            self.clean_up(&container).await?;
        }
        if let Err(error) = self.prepare(&config, &container).await {
            let _ = self.clean_up(&container).await;
            return Err(error);
        }
        let creating = self.runtime_cgroups.read().await;
        let launched = self.launch(&config, &container).await;
        drop(creating);
        let inner = match launched {
            Ok(handle) => handle,
            Err(error) => {
                let _ = self.delete(&container).await;
                return Err(error);
            }
        };
        let state = SavedState {
            version: STATE_VERSION,
            container: container.clone(),
            shim: inner.driver_state,
        };
        let driver_state = DriverState::from_serialize(&state).map_err(DriverError::other)?;
        tracing::info!(alloc_id = %config.alloc_id, task = %config.task_name, container = %container.id, image = %container.image, "container started");
        self.containers.lock().insert(config.id.clone(), Arc::new(container));
        Ok(TaskHandle { driver_state, ..TaskHandle::new(DRIVER_NAME, config) })
    }

    async fn recover_task(&self, handle: &TaskHandle) -> Result<(), DriverError> {
        if handle.driver != DRIVER_NAME {
            return Err(ContainerError::BadHandle {
                reason: format!("it was made by driver {:?}", handle.driver),
            }
            .into());
        }
        let state: SavedState = handle
            .driver_state
            .to_deserialize()
            .map_err(|e| ContainerError::BadHandle { reason: e.to_string() })?;
        if state.version != STATE_VERSION {
            return Err(ContainerError::BadHandle {
                reason: format!("state version {}", state.version),
            }
            .into());
        }
        if self.containers.lock().contains_key(handle.id()) {
            return Ok(());
        }
        let container = state.container;
        let mut inner =
            TaskHandle::new(wharf_exec::DRIVER_NAME, self.waiter_task(&handle.config, &container));
        inner.driver_state = state.shim;
        self.inner.recover_task(&inner).await?;
        let running = matches!(
            self.inner.inspect_task(handle.id()).await,
            Ok(TaskInfo { state: RunState::Running, .. })
        );
        if running {
            // The runtime must know the container as running too.
            match self.runtime.state(&container.id).await {
                Ok(Some(found)) if found.status == "running" => {
                    tracing::info!(container = %container.id, pid = found.pid, "reattached to a running container");
                }
                other => {
                    tracing::warn!(container = %container.id, ?other, "the shim runs but the runtime does not know the container as running");
                }
            }
        }
        self.containers.lock().insert(handle.id().clone(), Arc::new(container));
        Ok(())
    }

    async fn wait_task(&self, task_id: &TaskId) -> Result<ExitResult, DriverError> {
        self.container(task_id)?;
        self.inner.wait_task(task_id).await
    }

    async fn stop_task(
        &self,
        task_id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        self.container(task_id)?;
        self.inner.stop_task(task_id, timeout, signal).await
    }

    async fn destroy_task(&self, task_id: &TaskId, force: bool) -> Result<(), DriverError> {
        let lock = self.destroying.lock().entry(task_id.clone()).or_default().clone();
        let result = {
            let _destroying = lock.lock().await;
            self.destroy_one(task_id, force).await
        };
        let mut destroying = self.destroying.lock();
        // However it ended, the entry goes once no other destroy holds it (the map's and ours
        // are the only references then): unknown ids and failures leave nothing behind.
        if Arc::strong_count(&lock) <= 2 {
            destroying.remove(task_id);
        }
        result
    }

    async fn inspect_task(&self, task_id: &TaskId) -> Result<TaskInfo, DriverError> {
        let container = self.container(task_id)?;
        let mut info = self.inner.inspect_task(task_id).await?;
        info.attributes.insert("container_id".into(), container.id.clone());
        info.attributes.insert("image".into(), container.image.clone());
        if let Ok(pid) = std::fs::read_to_string(container.dir.join(PID_FILE)) {
            info.attributes.insert("container_pid".into(), pid.trim().to_owned());
        }
        Ok(info)
    }

    async fn signal_task(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        self.container(task_id)?;
        self.inner.signal_task(task_id, signal).await
    }

    async fn exec_task(
        &self,
        task_id: &TaskId,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, DriverError> {
        let container = self.container(task_id)?;
        if command.is_empty() {
            return Err(DriverError::invalid_config("command", "is empty"));
        }
        let mut full = vec![
            self.runtime.program.display().to_string(),
            "--root".to_owned(),
            self.runtime.root.display().to_string(),
            "exec".to_owned(),
            container.id.clone(),
        ];
        full.extend(command.iter().cloned());
        self.inner.exec_task(task_id, &full, timeout).await
    }

    async fn task_stats(&self, task_id: &TaskId) -> Result<ResourceUsage, DriverError> {
        self.container(task_id)?;
        self.inner.task_stats(task_id).await
    }

    async fn task_logs(
        &self,
        target: &LogTarget,
        stream: LogStream,
        from: LogFrom,
    ) -> Result<Box<dyn LogReader>, DriverError> {
        self.inner.task_logs(target, stream, from).await
    }

    fn events(&self) -> broadcast::Receiver<DriverEvent> {
        self.inner.events()
    }
}

/// Whether `path` is a mount point now: for tests and checks that nothing is left.
pub fn is_mounted(path: &Path) -> bool {
    mount::is_mounted(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Destroys that fail (here: of a task the driver never had) leave no lock behind.
    #[tokio::test]
    async fn a_failed_destroy_leaves_no_lock_behind() {
        let dir = tempfile::tempdir().unwrap();
        let driver = ContainerDriver::new(
            ContainerOptions::new(dir.path()),
            RawExecOptions::default(),
            TaskCgroups::Off { reason: "a unit test".into() },
        )
        .unwrap();
        for n in 0..3 {
            let id = TaskId::new("a1", "t", n);
            assert!(driver.destroy_task(&id, true).await.is_err());
        }
        assert!(driver.destroying.lock().is_empty());
    }
}
