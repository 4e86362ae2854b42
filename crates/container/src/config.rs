//! A container task's `config` block, and the node's settings for the driver.

use crate::error::ContainerError;
use crate::seccomp::SeccompChoice;
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// A task's `config` block under the container driver. Field names follow Nomad's docker
/// driver where it has them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerConfig {
    /// The image: `oci:/path:tag` or `docker-archive:/path.tar`.
    pub image: String,
    /// Replaces the image's `Entrypoint` (and, as in Docker, drops its `Cmd`).
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Replaces the image's `Cmd` with this command and `args`.
    #[serde(default)]
    pub command: Option<String>,
    /// Arguments: after `command`, or, without it, in place of the image's `Cmd`.
    #[serde(default)]
    pub args: Vec<String>,
    /// The working directory inside the container (default: the image's, or `/`).
    #[serde(default)]
    pub work_dir: Option<String>,
    /// `uid[:gid]` or a user name of the image's `/etc/passwd` (default: the image's user).
    #[serde(default)]
    pub user: Option<String>,
    /// Capabilities added to Docker's default set (`NET_ADMIN` or `CAP_NET_ADMIN`, or `ALL`).
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// Capabilities dropped from it (or `ALL`).
    #[serde(default)]
    pub cap_drop: Vec<String>,
    /// Mounts the root filesystem read-only.
    #[serde(default)]
    pub readonly_rootfs: bool,
    /// `host` (default) or `none`.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// Host paths bound into the container; each source must lie under a directory the node
    /// allows.
    #[serde(default)]
    pub mounts: Vec<MountConfig>,
    /// Docker's `security_opt`: `no-new-privileges` (the default) or `no-new-privileges:false`;
    /// `seccomp=unconfined` (no seccomp filter) or `seccomp=/path.json` (a profile file in
    /// Docker's format on the node) in place of Docker's default profile.
    #[serde(default)]
    pub security_opt: Vec<String>,
}

/// How the container is networked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The node's network (ports as for raw_exec).
    #[default]
    Host,
    /// A network namespace of its own with only loopback.
    None,
}

/// One host path bound into the container.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    /// The host path.
    pub source: PathBuf,
    /// Where it appears inside the container.
    pub target: PathBuf,
    /// Read-only (default false).
    #[serde(default)]
    pub readonly: bool,
}

impl ContainerConfig {
    /// Parses a task's `config` block; the error names the field.
    pub fn parse(
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ContainerConfig, ContainerError> {
        let parsed: ContainerConfig =
            serde_json::from_value(serde_json::Value::Object(config.clone())).map_err(|e| {
                ContainerError::InvalidConfig { field: "config".into(), reason: e.to_string() }
            })?;
        let invalid = |field: &str, reason: String| ContainerError::InvalidConfig {
            field: format!("config.{field}"),
            reason,
        };
        if parsed.image.is_empty() {
            return Err(invalid("image", "is empty".into()));
        }
        for (i, mount) in parsed.mounts.iter().enumerate() {
            if !mount.source.is_absolute() || has_parent(&mount.source) {
                return Err(invalid(
                    &format!("mounts[{i}].source"),
                    format!("{} must be an absolute path without ..", mount.source.display()),
                ));
            }
            if !mount.target.is_absolute() || has_parent(&mount.target) {
                return Err(invalid(
                    &format!("mounts[{i}].target"),
                    format!("{} must be an absolute path without ..", mount.target.display()),
                ));
            }
        }
        if let Some(dir) = &parsed.work_dir
            && !dir.starts_with('/')
        {
            return Err(invalid("work_dir", format!("{dir:?} must be an absolute path")));
        }
        for opt in &parsed.security_opt {
            if let Some(choice) = SeccompChoice::from_security_opt(opt) {
                choice.map_err(|reason| invalid("security_opt", reason))?;
                continue;
            }
            if !matches!(
                opt.as_str(),
                "no-new-privileges" | "no-new-privileges:true" | "no-new-privileges:false"
            ) {
                return Err(invalid(
                    "security_opt",
                    format!(
                        "{opt:?} is not supported (no-new-privileges[:true|false] and \
                         seccomp=unconfined|/path.json are)"
                    ),
                ));
            }
        }
        Ok(parsed)
    }

    /// The seccomp filter `security_opt` chooses (the last `seccomp=` entry; by default
    /// Docker's profile).
    pub fn seccomp(&self) -> SeccompChoice {
        self.security_opt
            .iter()
            .filter_map(|opt| SeccompChoice::from_security_opt(opt)?.ok())
            .next_back()
            .unwrap_or_default()
    }

    /// Whether `no_new_privs` is set: by default, unless `security_opt` turns it off.
    pub fn no_new_privileges(&self) -> bool {
        !self.security_opt.iter().any(|o| o == "no-new-privileges:false")
    }
}

fn has_parent(path: &Path) -> bool {
    path.components().any(|c| c == Component::ParentDir)
}

/// Which OCI runtime runs the containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// runc (the default: it works on v1, v2 and hybrid hierarchies).
    #[default]
    Runc,
    /// crun (refuses hybrid cgroup layouts).
    Crun,
}

impl Runtime {
    /// The program's name.
    pub fn program(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Crun => "crun",
        }
    }
}

/// The node's settings for the container driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerOptions {
    /// Where images, runtime state and the driver's scratch go (a directory of the node's data
    /// directory).
    pub data_dir: PathBuf,
    /// The runtime.
    pub runtime: Runtime,
    /// The runtime's program; default: `runtime`'s name looked up in `/usr/local/sbin`,
    /// `/usr/local/bin`, `/usr/sbin`, `/usr/bin`, `/sbin`, `/bin`.
    pub runtime_path: Option<PathBuf>,
    /// The waiter program and the arguments that make it one: by default the current
    /// executable with `--wharf-container-waiter` (see [`crate::waiter`]).
    pub waiter: Option<PathBuf>,
    /// Host directories under which `mounts` sources may lie. Empty: no host mounts.
    pub allowed_mount_dirs: Vec<PathBuf>,
    /// How long one runtime command (`state`, `delete`) may take.
    pub runtime_timeout: Duration,
    /// How registries are reached (those allowed over plain HTTP).
    pub registries: crate::registry::RegistryOptions,
}

impl ContainerOptions {
    /// Defaults, with everything under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> ContainerOptions {
        ContainerOptions {
            data_dir: data_dir.into(),
            runtime: Runtime::default(),
            runtime_path: None,
            waiter: None,
            allowed_mount_dirs: Vec::new(),
            runtime_timeout: Duration::from_secs(10),
            registries: Default::default(),
        }
    }

    /// The runtime's program, found on the usual system paths.
    pub fn runtime_program(&self) -> PathBuf {
        if let Some(path) = &self.runtime_path {
            return path.clone();
        }
        let name = self.runtime.program();
        ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|path| path.is_file())
            .unwrap_or_else(|| PathBuf::from("/usr/bin").join(name))
    }

    /// Whether `source` lies under an allowed directory (compared after resolving links).
    pub fn mount_allowed(&self, source: &Path) -> bool {
        let Ok(real) = std::fs::canonicalize(source) else { return false };
        self.allowed_mount_dirs
            .iter()
            .any(|dir| std::fs::canonicalize(dir).is_ok_and(|dir| real.starts_with(dir)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<ContainerConfig, ContainerError> {
        ContainerConfig::parse(value.as_object().unwrap())
    }

    #[test]
    fn bad_config_blocks_are_refused_naming_the_field() {
        for (value, field) in [
            (json!({}), "config"),
            (json!({"image": "oci:/x", "surprise": 1}), "config"),
            (json!({"image": ""}), "config.image"),
            (json!({"image": "oci:/x", "network_mode": "bridge"}), "config"),
            (
                json!({"image": "oci:/x", "mounts": [{"source": "rel", "target": "/t"}]}),
                "config.mounts[0].source",
            ),
            (
                json!({"image": "oci:/x", "mounts": [{"source": "/a", "target": "/t/../.."}]}),
                "config.mounts[0].target",
            ),
            (json!({"image": "oci:/x", "work_dir": "tmp"}), "config.work_dir"),
            (
                json!({"image": "oci:/x", "security_opt": ["apparmor=unconfined"]}),
                "config.security_opt",
            ),
            (
                json!({"image": "oci:/x", "security_opt": ["seccomp=relative.json"]}),
                "config.security_opt",
            ),
        ] {
            match parse(value.clone()) {
                Err(ContainerError::InvalidConfig { field: f, .. }) => {
                    assert_eq!(f, field, "{value}")
                }
                other => panic!("{value}: {other:?}"),
            }
        }
        let good =
            parse(json!({"image": "oci:/x", "security_opt": ["no-new-privileges:false"]})).unwrap();
        assert!(!good.no_new_privileges());
        assert_eq!(good.seccomp(), SeccompChoice::Default);
        let unconfined =
            parse(json!({"image": "oci:/x", "security_opt": ["seccomp=unconfined"]})).unwrap();
        assert_eq!(unconfined.seccomp(), SeccompChoice::Unconfined);
        assert_eq!(good.network_mode, NetworkMode::Host);
    }
}
