//! The agent's configuration: defaults that work with no file at all, every setting
//! overridable in TOML, unknown keys refused with the key named.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_state::duration::serde_str;

/// Everything `wharf agent` can be told.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where the store and the allocations' directories live.
    pub data_dir: PathBuf,
    /// The HTTP API's address.
    pub bind: SocketAddr,
    /// The secret every API call but `/v1/health` must present (`Authorization: Bearer ...`).
    /// Without one, the agent makes one at its first start and keeps it in its data directory
    /// (`crate::agent_token`), readable by its own user alone.
    pub token: Option<String>,
    /// The largest request body the API accepts, in bytes.
    pub max_body_bytes: usize,
    /// The node-wide cap on tasks' `kill_timeout`.
    #[serde(with = "serde_str")]
    pub max_kill_timeout: Duration,
    /// Drivers and their settings.
    pub drivers: DriversConfig,
    /// Garbage collection of finished allocations.
    pub gc: GcConfig,
    /// Task log rotation.
    pub logs: LogsConfig,
    /// What the node offers allocations, and what it keeps for itself.
    pub resources: ResourcesConfig,
    /// The tasks' cgroups.
    pub cgroups: CgroupsConfig,
    /// The ports allocations get.
    pub network: NetworkConfig,
    /// Directories of the node that groups may ask for as `host` volumes, by name:
    /// `[host_volume.NAME] path = "...", read_only = true|false`.
    pub host_volume: std::collections::BTreeMap<String, wharf_state::volume::HostVolume>,
}

/// Where allocations' ports are: the address tasks listen on and services are reached at,
/// and the range dynamic ports come from (Nomad's `min_dynamic_port` and `max_dynamic_port`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// The address of every allocated port (`WHARF_IP_<label>`).
    pub address: std::net::IpAddr,
    /// The first port of the dynamic range.
    pub min_dynamic_port: u16,
    /// The last port of the dynamic range.
    pub max_dynamic_port: u16,
}

impl Default for NetworkConfig {
    /// Loopback, and Nomad's range, 20000 to 32000.
    fn default() -> Self {
        NetworkConfig {
            address: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            min_dynamic_port: 20_000,
            max_dynamic_port: 32_000,
        }
    }
}

/// The node's resources, as allocations are admitted against them (Nomad's client
/// `cpu_total_compute`, `memory_total_mb` and `reserved` block).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourcesConfig {
    /// All the node's CPU in MHz; 0: its cores times their speed, as detected.
    pub cpu_total_compute: u64,
    /// The node's memory in MiB; 0: as detected.
    pub memory_total_mb: u64,
    /// What the node keeps for itself (the agent, the system): no allocation gets it.
    pub reserved: ReservedConfig,
}

/// What the node keeps for itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReservedConfig {
    /// CPU in MHz.
    pub cpu: u64,
    /// Memory in MiB.
    pub memory: u64,
    /// Cores no task runs on, in the kernel's list format (`"0"`, `"0-1,4"`).
    pub cores: String,
}

/// Task cgroups.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupsConfig {
    /// Whether tasks get cgroups where the host allows it.
    pub enabled: bool,
    /// The cgroup the task cgroups go under, from each hierarchy's root (`/wharf`). Default:
    /// `wharf/<data dir>` below the agent's own cgroup, so agents with different data
    /// directories never share one. Each agent needs its own: it removes what it does not know.
    pub parent: Option<String>,
    /// The most processes and threads one task may have; 0 for no limit.
    pub pids_limit: u64,
}

impl Default for CgroupsConfig {
    fn default() -> Self {
        CgroupsConfig { enabled: true, parent: None, pids_limit: 8192 }
    }
}

/// Driver settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DriversConfig {
    /// The raw_exec driver (plain processes).
    pub raw_exec: RawExecDriverConfig,
    /// The isolated exec driver (each task contained, as Nomad's exec2).
    pub exec: ExecDriverConfig,
    /// The container driver (OCI images under runc).
    pub container: crate::container::ContainerDriverConfig,
}

/// The isolated exec driver's settings (as exec2's plugin config, with Nomad's client names
/// for the workload users' range). It uses raw_exec's shim.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecDriverConfig {
    /// Whether tasks may use it (it still needs root, Landlock and cgroups to be healthy).
    pub enabled: bool,
    /// The lowest id of workload users.
    pub dynamic_user_min: u32,
    /// The highest id of workload users.
    pub dynamic_user_max: u32,
    /// The journal of workload-user leases; default `<data_dir>/workload-users`. Agents on one
    /// host that share a range must share this file.
    pub users_file: Option<PathBuf>,
    /// Open the system's programs, libraries and a few common files to every task.
    pub unveil_defaults: bool,
    /// More paths for every task, as `"<mode>:<path>"` (`"r:/etc/passwd"`).
    pub unveil_paths: Vec<String>,
    /// Whether tasks may open paths of their own (`config.unveil`).
    pub unveil_by_task: bool,
    /// A task's PID namespace unless its config says: `private` or `host`.
    pub default_pid_mode: wharf_exec::NamespaceMode,
    /// A task's IPC namespace unless its config says: `private` or `host`.
    pub default_ipc_mode: wharf_exec::NamespaceMode,
}

impl Default for ExecDriverConfig {
    fn default() -> Self {
        let defaults = wharf_exec::ExecOptions::new("");
        ExecDriverConfig {
            enabled: true,
            dynamic_user_min: defaults.users.min(),
            dynamic_user_max: defaults.users.max(),
            users_file: None,
            unveil_defaults: defaults.unveil_defaults,
            unveil_paths: Vec::new(),
            unveil_by_task: defaults.unveil_by_task,
            default_pid_mode: defaults.default_pid_mode,
            default_ipc_mode: defaults.default_ipc_mode,
        }
    }
}

impl ExecDriverConfig {
    /// The driver's options for a node whose data directory is `data_dir`; the error names the
    /// setting.
    pub fn options(&self, data_dir: &Path) -> Result<wharf_exec::ExecOptions, String> {
        let users =
            wharf_isolate::users::UgidRange::new(self.dynamic_user_min, self.dynamic_user_max)
                .map_err(|e| format!("drivers.exec.dynamic_user_min/max: {e}"))?;
        let unveil_paths = self
            .unveil_paths
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                wharf_isolate::landlock::Unveil::parse(entry)
                    .map_err(|e| format!("drivers.exec.unveil_paths[{index}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let users_file = self.users_file.clone().unwrap_or_else(|| data_dir.join("workload-users"));
        let options = wharf_exec::ExecOptions {
            users_file,
            users,
            unveil_defaults: self.unveil_defaults,
            unveil_paths,
            unveil_by_task: self.unveil_by_task,
            default_pid_mode: self.default_pid_mode,
            default_ipc_mode: self.default_ipc_mode,
            data_dir: Some(data_dir.to_owned()),
        };
        options.check_unveil_paths()?;
        Ok(options)
    }
}

/// The agent's settings of the raw_exec driver (`[drivers.raw_exec]`); a task's own `config`
/// block is wharf-exec's `RawExecConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawExecDriverConfig {
    /// Whether tasks may use it.
    pub enabled: bool,
    /// The shim program; by default `wharf-shim` beside the `wharf` binary.
    pub shim_path: Option<PathBuf>,
}

/// When finished allocations are removed (records and directories), oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcConfig {
    /// Keep at most this many finished allocations.
    pub max_allocs: usize,
    /// Remove finished allocations older than this.
    #[serde(with = "serde_str")]
    pub max_age: Duration,
    /// How often to look.
    #[serde(with = "serde_str")]
    pub interval: Duration,
}

/// Task log rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogsConfig {
    /// Files kept per stream.
    pub max_files: u32,
    /// Size at which a file is rotated, in MiB.
    pub max_file_mb: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            data_dir: PathBuf::from("wharf-data"),
            bind: SocketAddr::from(([127, 0, 0, 1], 4747)),
            token: None,
            max_body_bytes: 1 << 20,
            max_kill_timeout: Duration::from_secs(30),
            drivers: DriversConfig::default(),
            gc: GcConfig::default(),
            logs: LogsConfig::default(),
            resources: ResourcesConfig::default(),
            cgroups: CgroupsConfig::default(),
            network: NetworkConfig::default(),
            host_volume: Default::default(),
        }
    }
}

impl Default for RawExecDriverConfig {
    fn default() -> Self {
        RawExecDriverConfig { enabled: true, shim_path: None }
    }
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            max_allocs: 50,
            max_age: Duration::from_secs(4 * 3600),
            interval: Duration::from_secs(60),
        }
    }
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig { max_files: 10, max_file_mb: 10 }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
}

impl NodeConfig {
    /// Reads a TOML file; every key not set keeps its default.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        NodeConfig::parse(&text)
            .map_err(|message| ConfigError::Invalid { path: path.to_owned(), message })
    }

    /// Reads TOML text and checks the result.
    pub fn parse(text: &str) -> Result<NodeConfig, String> {
        let deserializer = toml::Deserializer::parse(text).map_err(|e| e.to_string())?;
        let config: NodeConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner().message())
        })?;
        config.check()?;
        Ok(config)
    }

    /// Settings that are each valid but wrong together.
    pub fn check(&self) -> Result<(), String> {
        // Any address will do: the API always requires a token, the configured one or the one
        // the agent keeps.
        if self.token.as_deref().is_some_and(|t| t.len() < crate::agent_token::MIN_LEN) {
            return Err(format!("token: use at least {} characters", crate::agent_token::MIN_LEN));
        }
        if self.max_body_bytes < 1024 {
            return Err("max_body_bytes: must be at least 1024".into());
        }
        if self.logs.max_files == 0 || self.logs.max_file_mb == 0 {
            return Err("logs: max_files and max_file_mb must be at least 1".into());
        }
        self.drivers.exec.options(&self.data_dir)?;
        let network = &self.network;
        if network.min_dynamic_port == 0 || network.min_dynamic_port > network.max_dynamic_port {
            return Err(format!(
                "network: min_dynamic_port ({}) must be at least 1 and at most max_dynamic_port ({})",
                network.min_dynamic_port, network.max_dynamic_port
            ));
        }
        wharf_isolate::CpuSet::parse(&self.resources.reserved.cores)
            .map_err(|e| format!("resources.reserved.cores: {e}"))?;
        if let Some(parent) = &self.cgroups.parent
            && (parent.trim_matches('/').is_empty()
                || parent.split('/').any(|p| p == ".." || p == "."))
        {
            return Err(format!(
                "cgroups.parent: {parent:?} must name a cgroup below the root, without `.` or `..`"
            ));
        }
        Ok(())
    }

    /// The store file.
    pub fn store_path(&self) -> PathBuf {
        self.data_dir.join("state.redb")
    }

    /// An allocation's directory.
    pub fn alloc_root(&self, alloc_id: &str) -> PathBuf {
        self.data_dir.join("allocs").join(alloc_id)
    }

    /// Where the agent keeps ready-made allocation directories (`wharf_alloc::SpareDirs`):
    /// beside `allocs/`, on the same file system, so a rename moves them into place.
    pub fn spare_root(&self) -> PathBuf {
        self.data_dir.join("spare")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_means_defaults() {
        assert_eq!(NodeConfig::parse("").unwrap(), NodeConfig::default());
        let defaults = NodeConfig::default();
        assert_eq!(defaults.bind.to_string(), "127.0.0.1:4747");
        assert!(defaults.drivers.raw_exec.enabled);
        let exec = defaults.drivers.exec.options(Path::new("/data")).unwrap();
        let data_dir = Some(PathBuf::from("/data"));
        assert_eq!(
            exec,
            wharf_exec::ExecOptions {
                data_dir,
                ..wharf_exec::ExecOptions::new("/data/workload-users")
            }
        );
    }

    #[test]
    fn the_exec_driver_can_be_configured() {
        let config = NodeConfig::parse(
            "[drivers.exec]\nenabled = false\ndynamic_user_min = 200000\ndynamic_user_max = 200999\n\
             users_file = \"/run/wharf-users\"\nunveil_defaults = false\n\
             unveil_paths = [\"r:/etc/passwd\", \"rwc:/srv\"]\nunveil_by_task = false\n\
             default_pid_mode = \"host\"\ndefault_ipc_mode = \"host\"\n",
        )
        .unwrap();
        assert!(!config.drivers.exec.enabled);
        let options = config.drivers.exec.options(&config.data_dir).unwrap();
        assert_eq!((options.users.min(), options.users.max()), (200_000, 200_999));
        assert_eq!(options.users_file, PathBuf::from("/run/wharf-users"));
        assert_eq!(options.unveil_paths.len(), 2);
        assert!(!options.unveil_defaults && !options.unveil_by_task);
        assert_eq!(options.default_pid_mode, wharf_exec::NamespaceMode::Host);
        assert_eq!(options.default_ipc_mode, wharf_exec::NamespaceMode::Host);
    }

    #[test]
    fn every_setting_can_be_overridden() {
        let config = NodeConfig::parse(
            "data_dir = \"/srv/wharf\"\nbind = \"0.0.0.0:9000\"\ntoken = \"0123456789abcdef\"\nmax_kill_timeout = \"1m\"\n\
             [drivers.raw_exec]\nenabled = false\nshim_path = \"/opt/shim\"\n[gc]\nmax_allocs = 3\nmax_age = \"1h\"\ninterval = \"5s\"\n\
             [logs]\nmax_files = 2\nmax_file_mb = 1\n\
             [resources]\ncpu_total_compute = 8000\nmemory_total_mb = 4096\n\
             [resources.reserved]\ncpu = 500\nmemory = 256\ncores = \"0\"\n\
             [cgroups]\nenabled = false\nparent = \"/wharf\"\npids_limit = 100\n\
             [network]\naddress = \"10.0.0.5\"\nmin_dynamic_port = 25000\nmax_dynamic_port = 25100\n",
        )
        .unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/srv/wharf"));
        assert_eq!(config.bind, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.token.as_deref(), Some("0123456789abcdef"));
        assert_eq!(config.max_kill_timeout, Duration::from_secs(60));
        assert!(!config.drivers.raw_exec.enabled);
        assert_eq!(config.drivers.raw_exec.shim_path, Some(PathBuf::from("/opt/shim")));
        assert_eq!(
            (config.gc.max_allocs, config.gc.max_age, config.gc.interval),
            (3, Duration::from_secs(3600), Duration::from_secs(5))
        );
        assert_eq!((config.logs.max_files, config.logs.max_file_mb), (2, 1));
        assert_eq!(
            (config.resources.cpu_total_compute, config.resources.reserved.cores.as_str()),
            (8000, "0")
        );
        assert_eq!(
            config.cgroups,
            CgroupsConfig { enabled: false, parent: Some("/wharf".into()), pids_limit: 100 }
        );
        assert_eq!(
            config.network,
            NetworkConfig {
                address: [10, 0, 0, 5].into(),
                min_dynamic_port: 25_000,
                max_dynamic_port: 25_100
            }
        );
    }

    /// The API requires a token on every address, the agent's own if none is set: binding
    /// beyond loopback needs no token in the file.
    #[test]
    fn any_address_may_be_bound_without_a_configured_token() {
        let config = NodeConfig::parse("bind = \"0.0.0.0:4747\"").unwrap();
        assert_eq!((config.bind.to_string(), config.token), ("0.0.0.0:4747".into(), None));
    }

    #[test]
    fn bad_settings_are_named() {
        let cases = [
            ("colour = \"blue\"", "unknown field `colour`"),
            ("[gc]\nmax_agee = \"1h\"", "gc.max_agee"),
            ("max_kill_timeout = \"soon\"", "max_kill_timeout"),
            ("bind = \"nowhere\"", "bind"),
            ("token = \"short\"", "at least 16"),
            ("[logs]\nmax_files = 0", "logs"),
            (
                "[network]\nmin_dynamic_port = 30000\nmax_dynamic_port = 20000",
                "network: min_dynamic_port (30000)",
            ),
            ("[network]\nmin_dynamic_port = 0", "network: min_dynamic_port (0)"),
            ("[network]\naddress = \"localhost\"", "network.address"),
            ("[resources.reserved]\ncores = \"0-x\"", "resources.reserved.cores"),
            ("[resources]\ncpu = 5", "unknown field `cpu`"),
            ("[cgroups]\nparent = \"/\"", "cgroups.parent"),
            ("[cgroups]\nparent = \"a/../b\"", "cgroups.parent"),
            ("[drivers.exec]\ndynamic_user_min = 0", "drivers.exec.dynamic_user_min/max"),
            ("[drivers.exec]\ndynamic_user_max = 10", "drivers.exec.dynamic_user_min/max"),
            ("[drivers.exec]\nunveil_paths = [\"/etc\"]", "drivers.exec.unveil_paths[0]"),
            // Paths no task may reach, named with the reason.
            (
                "data_dir = \"/srv/wharf\"\n[drivers.exec]\nunveil_paths = [\"r:/etc\", \"r:/srv\"]",
                "drivers.exec.unveil_paths[1]: /srv overlaps the node's data directory (/srv/wharf)",
            ),
            (
                "data_dir = \"/srv/wharf\"\n[drivers.exec]\nunveil_paths = [\"rwc:/srv/wharf/../wharf/allocs\"]",
                "drivers.exec.unveil_paths[0]: /srv/wharf/../wharf/allocs overlaps the node's data directory",
            ),
            (
                "[drivers.exec]\ndefault_pid_mode = \"host\"\nunveil_paths = [\"r:/proc/self/status\"]",
                "drivers.exec.unveil_paths[0]: /proc/self/status overlaps the host's init (/proc/1)",
            ),
            ("[drivers.exec]\ndefault_pid_mode = \"shared\"", "drivers.exec.default_pid_mode"),
        ];
        for (text, phrase) in cases {
            let err = NodeConfig::parse(text).unwrap_err();
            assert!(err.contains(phrase), "{text:?}: {err}");
        }
    }
}
