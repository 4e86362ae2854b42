//! [`LoopbackInstanceSet`]: an instance set whose instances live on this host.
//!
//! Each instance is a directory under the set's root; its init command runs there as a local
//! process at create, and its commands run there through [`LocalExecutor`] (with
//! `WHARF_INSTANCE_DIR` set), or through a real sshd on 127.0.0.1 when the set is given an
//! address and host key. It exists to run the whole prober (pool, worker, runner deployment,
//! run probe) end to end on one machine, in tests and in development. Quotas are modelled by
//! `max_instances`: a create beyond it is refused with [`ProberError::Quota`]. What an instance
//! started (the init command may start daemons) is ended by its destroy command.

use crate::ProberError;
use crate::executor::Executor;
use crate::instance::{Instance, InstanceId, InstanceSet, Tags};
use crate::local::LocalExecutor;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How the loopback set makes its instances.
#[derive(Debug, Clone)]
pub struct LoopbackConfig {
    /// Instance directories go here.
    pub root: PathBuf,
    /// At most this many instances; more is a quota refusal.
    pub max_instances: usize,
    /// The address instances report (an sshd on 127.0.0.1), if any.
    pub address: Option<String>,
    /// That sshd's host key (OpenSSH public key line).
    pub host_key: Option<String>,
    /// The user commands run as.
    pub remote_user: String,
    /// Deadline of an init command (and of a destroy command).
    pub init_deadline: Duration,
    /// Run in the instance's directory when it is destroyed, before the directory is removed:
    /// what ending the machine would end (its processes). Empty: nothing to run. If it fails,
    /// the destroy fails and the instance stays listed, so the pool tries again.
    pub destroy_command: String,
}

#[derive(Debug, Default)]
struct Instances {
    next: u64,
    live: BTreeMap<InstanceId, Instance>,
}

/// Instances on this host.
#[derive(Debug)]
pub struct LoopbackInstanceSet {
    config: LoopbackConfig,
    instances: Mutex<Instances>,
}

impl LoopbackInstanceSet {
    /// A set with its instance directories under `config.root`.
    pub fn new(config: LoopbackConfig) -> LoopbackInstanceSet {
        LoopbackInstanceSet { config, instances: Mutex::default() }
    }

    /// The directory of instance `id`.
    pub fn dir(&self, id: &InstanceId) -> PathBuf {
        self.config.root.join(&id.0)
    }

    /// A local executor running in the instance's directory.
    pub fn local_executor(&self, instance: &Instance) -> Arc<dyn Executor> {
        let dir = self.dir(&instance.id);
        Arc::new(
            LocalExecutor::new(&instance.id.0)
                .with_dir(&dir)
                .with_env("WHARF_INSTANCE_DIR", &dir.display().to_string()),
        )
    }
}

#[async_trait::async_trait]
impl InstanceSet for LoopbackInstanceSet {
    async fn create(
        &self,
        instance_type: &str,
        tags: &Tags,
        init_command: &str,
    ) -> Result<Instance, ProberError> {
        let id = {
            let mut instances = self.instances.lock();
            if instances.live.len() >= self.config.max_instances {
                return Err(ProberError::Quota {
                    detail: format!(
                        "the loopback set holds at most {} instances",
                        self.config.max_instances
                    ),
                });
            }
            instances.next += 1;
            InstanceId(format!("loopback-{}", instances.next))
        };
        let dir = self.dir(&id);
        std::fs::create_dir_all(&dir).map_err(|e| ProberError::Cloud {
            operation: "create",
            detail: format!("cannot create {}: {e}", dir.display()),
        })?;
        let instance = Instance {
            id: id.clone(),
            address: self.config.address.clone(),
            remote_user: self.config.remote_user.clone(),
            tags: tags.clone(),
            host_key: self.config.host_key.clone(),
        };
        if !init_command.trim().is_empty() {
            let out = self
                .local_executor(&instance)
                .execute(init_command, &[], self.config.init_deadline)
                .await
                .and_then(|out| out.checked(&id.0, "init command"))
                .map_err(|e| ProberError::Cloud { operation: "create", detail: e.to_string() })?;
            drop(out);
        }
        tracing::info!(worker = %id, instance_type, "loopback instance created");
        self.instances.lock().live.insert(id, instance.clone());
        Ok(instance)
    }

    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        Ok(self.instances.lock().live.values().cloned().collect())
    }

    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError> {
        let Some(instance) = self.instances.lock().live.get(id).cloned() else {
            return Ok(());
        };
        if !self.config.destroy_command.trim().is_empty() {
            self.local_executor(&instance)
                .execute(&self.config.destroy_command, &[], self.config.init_deadline)
                .await
                .and_then(|out| out.checked(&id.0, "destroy command"))
                .map_err(|e| ProberError::Cloud { operation: "destroy", detail: e.to_string() })?;
        }
        if self.instances.lock().live.remove(id).is_some() {
            tracing::info!(worker = %id, "loopback instance destroyed");
            let dir = self.dir(id);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(worker = %id, error = %e, "cannot remove {}", dir.display());
            }
        }
        Ok(())
    }

    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        match self.instances.lock().live.get_mut(id) {
            Some(instance) => {
                instance.tags = tags.clone();
                Ok(())
            }
            None => Err(ProberError::Cloud {
                operation: "set_tags",
                detail: format!("no instance {id}"),
            }),
        }
    }
}
