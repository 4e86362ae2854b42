//! The [`InstanceSet`] seam: the cloud as the pool sees it.
//!
//! A cloud driver creates instances (with tags and an init command), lists them, destroys them
//! and replaces their tags. The pool reconciles its workers with [`InstanceSet::list`] rather
//! than trusting create calls, so an instance that appears without a create (after a restart of
//! the prober) becomes an `unknown` worker, and one whose create is still pending is matched by
//! its secret tag.
//!
//! Quota, capacity and rate-limit refusals are the variants [`ProberError::Quota`],
//! [`ProberError::Capacity`] and [`ProberError::RateLimited`]: the pool's create throttling
//! depends on telling them apart. [`LoopbackInstanceSet`](crate::LoopbackInstanceSet) is the
//! implementation on this host.

use crate::ProberError;
use crate::capacity::InstanceType;
use std::collections::BTreeMap;
use std::fmt;

/// Tags on an instance, key to value.
pub type Tags = BTreeMap<String, String>;

/// A cloud instance's stable id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId(pub String);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for InstanceId {
    fn from(id: &str) -> InstanceId {
        InstanceId(id.to_owned())
    }
}

/// One instance as the cloud lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Stable id.
    pub id: InstanceId,
    /// `host:port` to reach it, once known.
    pub address: Option<String>,
    /// The user commands run as; anyone but root gets `sudo` for privileged commands.
    pub remote_user: String,
    /// Its tags.
    pub tags: Tags,
    /// The host key it is known to have (OpenSSH public key line), when the cloud can tell.
    /// The SSH executor pins it: any other key is refused.
    pub host_key: Option<String>,
    /// Arguments the runner gets on this instance before each command's own (shell words,
    /// such as `--data-dir /srv/wharf`): what differs between hosts, like where the runner
    /// finds what it drives there. Empty for none.
    pub runner_args: String,
}

impl Instance {
    /// Instance `id` reached at `address` (`host:port`) as root, with no tags and no pinned host
    /// key.
    pub fn new(id: impl Into<InstanceId>, address: impl Into<String>) -> Instance {
        Instance {
            id: id.into(),
            address: Some(address.into()),
            remote_user: "root".into(),
            tags: Tags::new(),
            host_key: None,
            runner_args: String::new(),
        }
    }

    /// The same instance with `tags`.
    pub fn with_tags(mut self, tags: Tags) -> Instance {
        self.tags = tags;
        self
    }
}

/// The cloud: where instances come from and go.
#[async_trait::async_trait]
pub trait InstanceSet: Send + Sync + fmt::Debug + 'static {
    /// Creates an instance of `instance_type` (its provider type, preemptible or not) with
    /// `tags`, running `init_command` at boot. Refusals are [`ProberError::Quota`],
    /// [`ProberError::Capacity`] (scoped to the type, its quota group or every type) or
    /// [`ProberError::RateLimited`] where the cloud says so.
    async fn create(
        &self,
        instance_type: &InstanceType,
        tags: &Tags,
        init_command: &str,
    ) -> Result<Instance, ProberError>;

    /// Every instance of this set, with current tags.
    async fn list(&self) -> Result<Vec<Instance>, ProberError>;

    /// Destroys an instance. Destroying one already gone is not an error.
    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError>;

    /// Replaces an instance's tags with `tags`.
    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError>;
}

/// The tags the prober writes; each key is the configured prefix plus the tag's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The instance type name, to map an instance back to its type after a restart.
    InstanceType,
    /// `run`, `hold` or `drain`, so the behaviour survives a restart of the prober.
    IdleBehavior,
    /// A random secret written to the instance at create; tells our pending create from an
    /// instance that appears by itself.
    InstanceSecret,
}

impl Tag {
    /// The tag's key under `prefix`.
    pub fn key(self, prefix: &str) -> String {
        let name = match self {
            Tag::InstanceType => "InstanceType",
            Tag::IdleBehavior => "IdleBehavior",
            Tag::InstanceSecret => "InstanceSecret",
        };
        format!("{prefix}{name}")
    }
}
