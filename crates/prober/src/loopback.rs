//! [`LoopbackInstanceSet`]: an instance set whose instances live on this host.
//!
//! Each instance is a directory under the set's root; its init command runs there as a local
//! process at create, and its commands run there through [`LocalExecutor`] (with
//! `WHARF_INSTANCE_DIR` set), or through a real sshd on 127.0.0.1 when the set is given an
//! address and host key. It exists to run the whole prober (pool, worker, runner deployment,
//! run probe) end to end on one machine, in tests and in development. Quotas are modelled by
//! `max_instances`: a create beyond it is refused with [`ProberError::Quota`]. What an instance
//! started (the init command may start daemons) is ended by its destroy command.
//!
//! The set remembers its instances as a cloud does: each instance's tags are written to
//! [`TAGS_FILE`] in its directory once its init command succeeded (and again when they
//! change), and a new set over the same root lists the instances it finds there, so a prober
//! that restarts finds its workers again. A directory without the file is a create that never
//! finished ([`LoopbackInstanceSet::strays`]).

use crate::ProberError;
use crate::capacity::InstanceType;
use crate::capacity::limit;
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
    /// At most this many instances; more is a quota refusal. 0: no limit.
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
    /// Creates under way: their directories exist and their init commands may be running.
    creating: usize,
    /// Set by [`LoopbackInstanceSet::destroy_all`]: no more creates.
    closed: bool,
}

/// Instances on this host.
#[derive(Debug)]
pub struct LoopbackInstanceSet {
    config: LoopbackConfig,
    instances: Mutex<Instances>,
    /// Signalled each time a create ends, however it ends.
    create_ended: tokio::sync::Notify,
}

/// Counts a create as under way until it is dropped, whether it finished or was abandoned.
struct Creating<'a>(&'a LoopbackInstanceSet);

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.0.instances.lock().creating -= 1;
        self.0.create_ended.notify_waiters();
    }
}

/// The file in an instance's directory that holds its tags, one `key=value` a line.
pub const TAGS_FILE: &str = "instance.tags";

impl LoopbackInstanceSet {
    /// A set with its instance directories under `config.root`, listing the instances a set
    /// over the same root made before (those whose tags file is there).
    pub fn new(config: LoopbackConfig) -> LoopbackInstanceSet {
        let mut instances = Instances::default();
        for entry in std::fs::read_dir(&config.root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(number) = name.strip_prefix("loopback-").and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(entry.path().join(TAGS_FILE)) else { continue };
            let tags: Tags = text
                .lines()
                .filter_map(|line| line.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect();
            let id = InstanceId(name);
            instances.next = instances.next.max(number);
            instances.live.insert(
                id.clone(),
                Instance {
                    id,
                    address: config.address.clone(),
                    remote_user: config.remote_user.clone(),
                    tags,
                    host_key: config.host_key.clone(),
                    runner_args: String::new(),
                },
            );
        }
        LoopbackInstanceSet {
            config,
            instances: Mutex::new(instances),
            create_ended: tokio::sync::Notify::new(),
        }
    }

    /// Directories under the root that are no instance of the set: creates that never
    /// finished (a prober killed during one), whose init command may have started something.
    pub fn strays(&self) -> Vec<PathBuf> {
        let instances = self.instances.lock();
        std::fs::read_dir(&self.config.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                !instances.live.contains_key(&InstanceId(name))
                    && !entry.path().join(TAGS_FILE).exists()
            })
            .map(|entry| entry.path())
            .collect()
    }

    /// Writes `tags` to instance `id`'s tags file (a temp file renamed over it).
    fn save_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        let text: String = tags.iter().map(|(key, value)| format!("{key}={value}\n")).collect();
        let path = self.dir(id).join(TAGS_FILE);
        let temp = path.with_extension("tags.new");
        std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, &path)).map_err(|e| {
            ProberError::Cloud { operation: "set_tags", detail: format!("{}: {e}", path.display()) }
        })
    }

    /// Ends the set: refuses further creates, waits for the ones under way (each bounded by
    /// `init_deadline`), then destroys every instance. Returns the destroys that failed.
    pub async fn destroy_all(&self) -> Vec<(InstanceId, ProberError)> {
        self.instances.lock().closed = true;
        loop {
            let ended = self.create_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.instances.lock().creating == 0 {
                break;
            }
            ended.await;
        }
        let ids: Vec<InstanceId> = self.instances.lock().live.keys().cloned().collect();
        let mut failed = Vec::new();
        for id in ids {
            if let Err(error) = self.destroy(&id).await {
                failed.push((id, error));
            }
        }
        failed
    }

    /// Runs the destroy command in `instance`'s directory, if there is one.
    async fn run_destroy_command(&self, instance: &Instance) -> Result<(), ProberError> {
        if self.config.destroy_command.trim().is_empty() {
            return Ok(());
        }
        self.local_executor(instance)
            .execute(&self.config.destroy_command, &[], self.config.init_deadline)
            .await
            .and_then(|out| out.checked(&instance.id.0, "destroy command"))
            .map(drop)
            .map_err(|e| ProberError::Cloud { operation: "destroy", detail: e.to_string() })
    }

    /// Whether `id` is an instance of the set now.
    pub fn has(&self, id: &InstanceId) -> bool {
        self.instances.lock().live.contains_key(id)
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

/// Removes an instance's directory, gone already counting as removed. A process of the
/// instance that is still exiting may add a file while the tree is removed (the removal then
/// fails with "directory not empty"), so a failure is retried a few times, 50 ms apart.
async fn remove_instance_dir(dir: &std::path::Path) -> std::io::Result<()> {
    const ATTEMPTS: u32 = 10;
    let mut attempt = 1;
    loop {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempt == ATTEMPTS => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, attempt, "removing {} again", dir.display());
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                attempt += 1;
            }
        }
    }
}

#[async_trait::async_trait]
impl InstanceSet for LoopbackInstanceSet {
    async fn create(
        &self,
        instance_type: &InstanceType,
        tags: &Tags,
        init_command: &str,
    ) -> Result<Instance, ProberError> {
        let id = {
            let mut instances = self.instances.lock();
            if instances.closed {
                return Err(ProberError::Cloud {
                    operation: "create",
                    detail: "the loopback set is shutting down".into(),
                });
            }
            if instances.live.len() + instances.creating >= limit(self.config.max_instances) {
                return Err(ProberError::Quota {
                    detail: format!(
                        "the loopback set holds at most {} instances",
                        self.config.max_instances
                    ),
                });
            }
            instances.next += 1;
            instances.creating += 1;
            InstanceId(format!("loopback-{}", instances.next))
        };
        let _creating = Creating(self);
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
            runner_args: String::new(),
        };
        if !init_command.trim().is_empty() {
            let init = self
                .local_executor(&instance)
                .execute(init_command, &[], self.config.init_deadline)
                .await
                .and_then(|out| out.checked(&id.0, "init command"));
            if let Err(e) = init {
                // A half-made machine is no machine: end what its init started, and remove it.
                if let Err(error) = self.run_destroy_command(&instance).await {
                    tracing::warn!(worker = %id, %error, "cannot clean up a failed create");
                }
                let _ = std::fs::remove_dir_all(&dir);
                return Err(ProberError::Cloud { operation: "create", detail: e.to_string() });
            }
        }
        if let Err(e) = self.save_tags(&id, tags) {
            let _ = self.run_destroy_command(&instance).await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        tracing::info!(worker = %id, instance_type = instance_type.name, "loopback instance created");
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
        self.run_destroy_command(&instance).await?;
        // The directory goes first: an instance leaves the list only once nothing of it is
        // left, so whoever sees it gone from the list may rely on that.
        let dir = self.dir(id);
        if let Err(e) = remove_instance_dir(&dir).await {
            tracing::warn!(worker = %id, error = %e, "cannot remove {}", dir.display());
        }
        if self.instances.lock().live.remove(id).is_some() {
            tracing::info!(worker = %id, "loopback instance destroyed");
        }
        Ok(())
    }

    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        match self.instances.lock().live.get_mut(id) {
            Some(instance) => {
                self.save_tags(id, tags)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(root: &std::path::Path, destroy_command: &str) -> Arc<LoopbackInstanceSet> {
        Arc::new(LoopbackInstanceSet::new(LoopbackConfig {
            root: root.join("instances"),
            max_instances: 4,
            address: None,
            host_key: None,
            remote_user: "root".into(),
            init_deadline: Duration::from_secs(20),
            destroy_command: destroy_command.into(),
        }))
    }

    fn instance_dirs(root: &std::path::Path) -> usize {
        std::fs::read_dir(root.join("instances")).map_or(0, |dirs| dirs.count())
    }

    #[test]
    fn destroy_all_waits_for_a_create_under_way_and_ends_it_too() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // The destroy command leaves a mark beside the instances, which outlives them.
        let set = set(root, "touch \"$WHARF_INSTANCE_DIR/../../destroyed-${PWD##*/}\"");
        let go = root.join("go");
        let init = format!("while [ ! -e {go:?} ]; do sleep 0.01; done");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let create = tokio::spawn({
                let set = set.clone();
                async move { set.create(&InstanceType::new("local"), &Tags::new(), &init).await }
            });
            // Bounded waits for each side to reach its point, so a broken set fails the test
            // instead of hanging it.
            let limit = Duration::from_secs(30);
            let began = async {
                while set.instances.lock().creating == 0 {
                    tokio::task::yield_now().await;
                }
            };
            tokio::time::timeout(limit, began).await.expect("the create never began");
            let destroy_all = tokio::spawn({
                let set = set.clone();
                async move { set.destroy_all().await }
            });
            let closed = async {
                while !set.instances.lock().closed {
                    tokio::task::yield_now().await;
                }
            };
            tokio::time::timeout(limit, closed).await.expect("destroy_all never closed the set");
            assert!(!destroy_all.is_finished(), "it waits for the create under way");
            std::fs::write(&go, "").unwrap();
            let created = create.await.unwrap().unwrap();
            assert!(destroy_all.await.unwrap().is_empty());
            assert!(root.join(format!("destroyed-{}", created.id.0)).exists());
            assert_eq!(instance_dirs(root), 0, "nothing of the instance is left");
            let refused =
                set.create(&InstanceType::new("local"), &Tags::new(), "").await.unwrap_err();
            assert!(refused.to_string().contains("shutting down"), "{refused}");
        });
    }

    #[test]
    fn a_failed_init_ends_what_it_started_and_leaves_no_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let set = set(root, "touch \"$WHARF_INSTANCE_DIR/../../cleaned\"");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let failed = runtime.block_on(set.create(
            &InstanceType::new("local"),
            &Tags::new(),
            "touch started; exit 3",
        ));
        let error = failed.unwrap_err().to_string();
        assert!(error.contains("init command"), "{error}");
        assert!(root.join("cleaned").exists(), "the destroy command ran");
        assert_eq!(instance_dirs(root), 0);
        assert_eq!(set.instances.lock().creating, 0);
    }

    /// As a cloud does, a set over the same root lists the instances made before, with their
    /// tags as last set, and numbers new ones after them; a create that never finished is a
    /// stray, not an instance.
    #[test]
    fn a_new_set_over_the_same_root_lists_the_instances_made_before() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let first = set(root, "");
        let tags: Tags = [("kind".to_owned(), "test".to_owned())].into();
        let made = runtime.block_on(async {
            let made = first.create(&InstanceType::new("local"), &Tags::new(), "").await.unwrap();
            first.set_tags(&made.id, &tags).await.unwrap();
            made
        });
        std::fs::create_dir_all(root.join("instances/loopback-9")).unwrap();
        drop(first);

        let second = set(root, "");
        let listed = runtime.block_on(second.list()).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].id.clone(), listed[0].tags.clone()), (made.id, tags));
        assert_eq!(second.strays(), [root.join("instances/loopback-9")]);
        let next = runtime.block_on(second.create(&InstanceType::new("local"), &Tags::new(), ""));
        assert_eq!(next.unwrap().id.0, "loopback-2");
    }
}
