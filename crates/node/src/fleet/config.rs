//! `fleet.toml`: what `wharf fleet` runs, with defaults that work with no file at all (two
//! loopback workers on this host), unknown keys refused with the key named.
//!
//! ```toml
//! bind = "127.0.0.1:4748"
//! data_dir = "wharf-fleet"          # loopback instances and the fleet's own files
//! per_worker_limit = 4              # allocations on one worker at most
//! probe_interval = "5s"
//!
//! [loopback]                        # N agents on this host, created and destroyed by the pool
//! instances = 2
//! max_concurrent_creates = 4        # agents started at once (0: no limit)
//!
//! [store]                           # what the fleet must not lose
//! backend = "redb"                  # <data_dir>/fleet.redb, one fleet process (the default)
//! # backend = "etcd"                # replicas sharing one etcd; one leads at a time, and
//!                                   # they all need the same top-level `token`
//! # endpoints = ["127.0.0.1:2379"]
//! # lease_ttl = "5s"
//!
//! # or, instead of [loopback]: machines you have, reached over SSH with pinned host keys,
//! # each running `wharf agent` with its data in agent_data_dir, where the runner finds the
//! # agent's address and token (a host may set its own agent_data_dir)
//! [runner]
//! agent_data_dir = "/var/lib/wharf"
//! [static]
//! identity = "/root/.ssh/id_ed25519"
//! [[static.host]]
//! name = "node-1"
//! address = "10.0.0.11:22"
//! host_key = "ssh-ed25519 AAAA..."
//!
//! # or: EC2 instances, created for work that fits no worker (see the README)
//! # [ec2]
//! # region = "us-east-1"
//! # image = "ami-..."
//! # subnets = ["subnet-..."]
//! # host_key = "ssh-ed25519 AAAA..."
//! # [[ec2.instance_type]]
//! # name = "small"
//! # provider_type = "t3.small"
//! # vcpus = 2
//! # memory_mb = 2048
//! # price = 0.0208
//! ```

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_state::duration::serde_str;

/// Everything `wharf fleet` can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// The management API's address. Any address other than loopback requires `token`.
    pub bind: SocketAddr,
    /// A secret every API call but `/v1/health` must present. Without one, the fleet makes
    /// one at its first start and keeps it in `<data_dir>/fleet-token`, readable by its user
    /// alone, where `wharf fleet` commands read it (`crate::api_token`). Replicas on etcd
    /// forward to their leader, so they must be given the same one.
    pub token: Option<String>,
    /// The fleet's files: loopback instances live under `instances/`.
    pub data_dir: PathBuf,
    /// At most this many allocations run on one worker.
    pub per_worker_limit: usize,
    /// At most this many allocations wait for room.
    pub max_queued: usize,
    /// Each worker is probed this often.
    #[serde(with = "serde_str")]
    pub probe_interval: Duration,
    /// The instance list is read this often.
    #[serde(with = "serde_str")]
    pub sync_interval: Duration,
    /// Deadline of one command on a worker.
    #[serde(with = "serde_str")]
    pub command_deadline: Duration,
    /// The largest job spec accepted, in bytes.
    pub max_body_bytes: usize,
    /// The worker state machine's timeouts.
    pub timeouts: TimeoutsConfig,
    /// When unresponsive workers stop being shut down.
    pub brake: BrakeSettings,
    /// The runner on every worker.
    pub runner: RunnerSettings,
    /// Where the fleet keeps its queue, placements, attempts and outcomes.
    pub store: StoreSettings,
    /// Workers that are agents on this host.
    pub loopback: Option<LoopbackSettings>,
    /// Workers that are machines reached over SSH.
    #[serde(rename = "static")]
    pub static_hosts: Option<StaticSettings>,
    /// Workers that are EC2 instances (or instances of any cloud speaking EC2's API), created
    /// for work that fits no worker and destroyed when idle.
    pub ec2: Option<Ec2Settings>,
}

/// EC2 workers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ec2Settings {
    /// The region.
    pub region: String,
    /// The API's base URL (a local EC2 API such as moto); by default EC2's own for the region.
    pub endpoint: Option<String>,
    /// The image (AMI) every instance boots; it must run sshd and let `admin_user` in with
    /// the key pair, and have the agent (or let the init command start one).
    pub image: String,
    /// Subnets, tried in turn when one fails (full, say).
    pub subnets: Vec<String>,
    /// Security groups of the instances.
    pub security_groups: Vec<String>,
    /// The user the image lets in with the key pair.
    pub admin_user: String,
    /// The private key to log in with (OpenSSH format); its public half is imported as the
    /// key pair.
    pub identity: PathBuf,
    /// The host key every instance presents (an OpenSSH public key line; the image's own),
    /// pinned: any other key is refused.
    pub host_key: String,
    /// The tag by which this fleet's instances are found (`wharf-fleet = <this>`); give every
    /// fleet sharing an account its own.
    pub fleet_tag: String,
    /// At most this many instances.
    pub max_instances: usize,
    /// An idle worker is shut down after this long.
    #[serde(with = "serde_str")]
    pub timeout_idle: Duration,
    /// How often the spot price of each preemptible type is asked of EC2; until EC2 answers
    /// one, the type's configured price stands.
    #[serde(with = "serde_str")]
    pub spot_price_refresh: Duration,
    /// The kinds of instance to create, the smallest that fits each piece of work.
    pub instance_type: Vec<Ec2TypeSettings>,
}

/// One EC2 instance type.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ec2TypeSettings {
    /// Its name in the fleet.
    pub name: String,
    /// EC2's name for it (`t3.small`).
    pub provider_type: String,
    /// Its vCPUs (each counted as 1000 MHz and one core for placement).
    pub vcpus: u32,
    /// Its memory, in MiB.
    pub memory_mb: u64,
    /// Its hourly price.
    #[serde(default)]
    pub price: f64,
    /// Spot: created on the spot market, its capacity apart from on-demand's.
    #[serde(default)]
    pub preemptible: bool,
    /// Types sharing a quota (an instance family's vCPU limit).
    #[serde(default)]
    pub quota_group: Option<String>,
}

impl Default for Ec2Settings {
    fn default() -> Ec2Settings {
        Ec2Settings {
            region: "us-east-1".into(),
            endpoint: None,
            image: String::new(),
            subnets: Vec::new(),
            security_groups: Vec::new(),
            admin_user: "admin".into(),
            identity: PathBuf::from("/root/.ssh/id_ed25519"),
            host_key: String::new(),
            fleet_tag: "wharf".into(),
            max_instances: 8,
            timeout_idle: Duration::from_secs(300),
            spot_price_refresh: Duration::from_secs(600),
            instance_type: Vec::new(),
        }
    }
}

/// Timeouts of the worker state machine (see wharf-prober's `Timeouts`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// A new worker that has not passed its probes by then is shut down.
    #[serde(with = "serde_str")]
    pub booting: Duration,
    /// A worker failing its probes this long is shut down (unless the brake holds).
    #[serde(with = "serde_str")]
    pub probe: Duration,
    /// A stale allocation reported this long makes the worker broken.
    #[serde(with = "serde_str")]
    pub stale_run_lock: Duration,
    /// Stop commands are repeated this often ...
    #[serde(with = "serde_str")]
    pub signal: Duration,
    /// ... until this long has passed; then the worker is drained.
    #[serde(with = "serde_str")]
    pub term: Duration,
    /// A worker whose allocation ended is not shut down for idleness (drained) until the
    /// fleet has asked its agent how the allocation ended, or this long has passed.
    #[serde(with = "serde_str")]
    pub outcome_hold: Duration,
}

/// The fleet brake.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrakeSettings {
    /// Engage when more than this share of booted workers fail their probes ...
    pub max_failing_share: f64,
    /// ... and at least this many.
    pub min_failing: usize,
}

/// The runner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunnerSettings {
    /// The `wharf` binary to deploy; by default the one running the fleet. Loopback instances
    /// run it in place (it starts their agents too): they are this host, nothing is copied.
    pub binary: Option<PathBuf>,
    /// Where it goes on each static host, as `runner~<sha256>`.
    pub directory: Option<String>,
    /// The boot probe; by default `true` for static hosts, and "the agent announced itself"
    /// for loopback instances.
    pub boot_probe: Option<String>,
    /// Where the runner reaches each static host's agent, if not at its default address
    /// (`http://127.0.0.1:4747`).
    pub agent_address: Option<String>,
    /// The data directory of each static host's agent (absolute), unless a host sets its own:
    /// the runner, as root on the host, reads the agent's address and its token there. Each
    /// agent keeps a token of its own; none leaves its host.
    pub agent_data_dir: Option<String>,
    /// Whether probes and starts go over each worker's probe channel (`wharf probe-channel`,
    /// one long-lived session per worker) [default: true]; `false` runs each as a command in
    /// a session of its own, for hosts where the channel cannot run.
    pub channel: Option<bool>,
}

/// Which store keeps the fleet's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// One redb file in the data directory: one fleet process, nothing to set up.
    #[default]
    Redb,
    /// etcd's v3 API: several replicas share it, one leads at a time.
    Etcd,
}

/// The fleet's store, and this replica as the others see it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// `redb` or `etcd`.
    pub backend: StoreBackend,
    /// redb: the file; by default `fleet.redb` in the data directory.
    pub path: Option<PathBuf>,
    /// etcd: its members' client addresses.
    pub endpoints: Vec<String>,
    /// etcd: every key of this fleet starts with it.
    pub prefix: String,
    /// etcd: a replica that stops renewing its lease (killed, frozen, cut off) loses its
    /// place, and another takes over, within this long.
    #[serde(with = "serde_str")]
    pub lease_ttl: Duration,
    /// This replica's name among the replicas; by default its API address.
    pub replica: Option<String>,
    /// Where the other replicas reach this one's API; by default `bind`.
    pub advertise: Option<String>,
}

impl Default for StoreSettings {
    fn default() -> StoreSettings {
        StoreSettings {
            backend: StoreBackend::Redb,
            path: None,
            endpoints: vec!["127.0.0.1:2379".into()],
            prefix: "/wharf/fleet".into(),
            lease_ttl: Duration::from_secs(5),
            replica: None,
            advertise: None,
        }
    }
}

/// Loopback workers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopbackSettings {
    /// How many agents to keep.
    pub instances: usize,
    /// Where their directories are; by default `instances` in the data directory. Replicas
    /// of one fleet on one host (sharing an etcd) share it, so a new leader adopts the
    /// workers and their work.
    pub root: Option<PathBuf>,
    /// At most this many creates at once (each starts an agent); 0: no limit.
    pub max_concurrent_creates: usize,
}

/// Static workers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticSettings {
    /// The private key to log in with (OpenSSH format).
    pub identity: PathBuf,
    /// A host taken out of service (unresponsive, drained) is tried again after this long.
    #[serde(with = "serde_str")]
    pub rejoin_after: Duration,
    /// The hosts.
    pub host: Vec<HostSettings>,
}

/// One static host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSettings {
    /// Its name, the worker's id.
    pub name: String,
    /// `host:port` of its SSH server.
    pub address: String,
    /// The user to log in as; anyone but root runs the runner with sudo.
    #[serde(default = "root")]
    pub user: String,
    /// Its host key (an OpenSSH public key line), pinned.
    pub host_key: String,
    /// Its agent's data directory, over `runner.agent_data_dir`.
    pub agent_data_dir: Option<String>,
}

impl HostSettings {
    /// Where the runner finds this host's agent and its token: its own setting, else the
    /// runner's for every host.
    pub fn agent_data_dir<'a>(&'a self, runner: &'a RunnerSettings) -> Option<&'a str> {
        self.agent_data_dir.as_deref().or(runner.agent_data_dir.as_deref())
    }
}

fn root() -> String {
    "root".into()
}

impl Default for FleetConfig {
    fn default() -> FleetConfig {
        FleetConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 4748)),
            token: None,
            data_dir: PathBuf::from("wharf-fleet"),
            per_worker_limit: 4,
            max_queued: 10_000,
            probe_interval: Duration::from_secs(5),
            sync_interval: Duration::from_secs(30),
            command_deadline: Duration::from_secs(20),
            max_body_bytes: 1 << 20,
            timeouts: TimeoutsConfig::default(),
            brake: BrakeSettings::default(),
            runner: RunnerSettings::default(),
            store: StoreSettings::default(),
            loopback: None,
            static_hosts: None,
            ec2: None,
        }
    }
}

impl Default for TimeoutsConfig {
    fn default() -> TimeoutsConfig {
        TimeoutsConfig {
            booting: Duration::from_secs(600),
            probe: Duration::from_secs(600),
            stale_run_lock: Duration::from_secs(30),
            signal: Duration::from_secs(5),
            term: Duration::from_secs(120),
            outcome_hold: Duration::from_secs(60),
        }
    }
}

impl Default for BrakeSettings {
    fn default() -> BrakeSettings {
        BrakeSettings { max_failing_share: 0.5, min_failing: 3 }
    }
}

impl LoopbackSettings {
    const DEFAULT: LoopbackSettings =
        LoopbackSettings { instances: 2, root: None, max_concurrent_creates: 4 };
}

impl Default for LoopbackSettings {
    fn default() -> LoopbackSettings {
        LoopbackSettings::DEFAULT
    }
}

impl Default for StaticSettings {
    fn default() -> StaticSettings {
        StaticSettings {
            identity: PathBuf::from("/root/.ssh/id_ed25519"),
            rejoin_after: Duration::from_secs(300),
            host: Vec::new(),
        }
    }
}

/// Where the workers come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Instances<'a> {
    /// Agents on this host.
    Loopback(&'a LoopbackSettings),
    /// Machines over SSH.
    Static(&'a StaticSettings),
    /// EC2 instances.
    Ec2(&'a Ec2Settings),
}

impl FleetConfig {
    /// Reads a TOML file; every key not set keeps its default.
    pub fn load(path: &Path) -> Result<FleetConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        FleetConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Reads TOML text and checks the result.
    pub fn parse(text: &str) -> Result<FleetConfig, String> {
        let deserializer = toml::Deserializer::parse(text).map_err(|e| e.to_string())?;
        let config: FleetConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner().message())
        })?;
        config.check()?;
        Ok(config)
    }

    /// Where the workers come from: loopback unless `[static]` or `[ec2]` is given.
    pub fn instances(&self) -> Instances<'_> {
        const DEFAULT: LoopbackSettings = LoopbackSettings::DEFAULT;
        if let Some(ec2) = &self.ec2 {
            return Instances::Ec2(ec2);
        }
        match (&self.loopback, &self.static_hosts) {
            (_, Some(hosts)) => Instances::Static(hosts),
            (Some(loopback), None) => Instances::Loopback(loopback),
            (None, None) => Instances::Loopback(&DEFAULT),
        }
    }

    /// Settings that are each valid but wrong together.
    pub fn check(&self) -> Result<(), String> {
        check_exposure(self.bind, self.token.as_deref())?;
        let kinds = [self.loopback.is_some(), self.static_hosts.is_some(), self.ec2.is_some()];
        if kinds.iter().filter(|k| **k).count() > 1 {
            return Err("loopback, static, ec2: choose one kind of worker".into());
        }
        if self.per_worker_limit == 0 {
            return Err("per_worker_limit: must be at least 1".into());
        }
        if self.probe_interval.is_zero() || self.sync_interval.is_zero() {
            return Err("probe_interval, sync_interval: must be more than zero".into());
        }
        if self.store.backend == StoreBackend::Etcd {
            if self.store.endpoints.is_empty() {
                return Err("store.endpoints: list at least one etcd member".into());
            }
            if self.store.lease_ttl < Duration::from_secs(2) {
                return Err("store.lease_ttl: must be at least 2s".into());
            }
            // Each replica would make a token of its own, and the leader would refuse what
            // the others forward with theirs.
            if self.token.as_deref().is_none_or(str::is_empty) {
                return Err("token: replicas sharing etcd forward requests to their leader, \
                     so they need one token they all know: set the same `token` on every \
                     replica (or give it with --token or WHARF_TOKEN)"
                    .into());
            }
        }
        if self.max_body_bytes < 1024 {
            return Err("max_body_bytes: must be at least 1024".into());
        }
        match self.instances() {
            Instances::Loopback(loopback) if loopback.instances == 0 => {
                Err("loopback.instances: must be at least 1".into())
            }
            Instances::Loopback(_)
                if self.runner.agent_address.is_some() || self.runner.agent_data_dir.is_some() =>
            {
                Err("runner.agent_address, runner.agent_data_dir: loopback agents are found by \
                 their data directory in the fleet's; these are for static hosts"
                    .into())
            }
            Instances::Static(hosts) if hosts.host.is_empty() => {
                Err("static.host: list at least one host".into())
            }
            // Taken out, it must be seen gone by a sync before it may come back, or the pool
            // would take its listing for an instance that survived its destroy.
            Instances::Static(hosts) if hosts.rejoin_after <= self.sync_interval => Err(format!(
                "static.rejoin_after: must be longer than sync_interval ({})",
                wharf_state::duration::Formatted(self.sync_interval)
            )),
            Instances::Static(hosts) => check_agent_data_dirs(hosts, &self.runner),
            Instances::Loopback(_) => Ok(()),
            Instances::Ec2(ec2) => check_ec2(ec2),
        }
    }
}

/// An EC2 fleet can create something, and knows what each type has and costs.
fn check_ec2(ec2: &Ec2Settings) -> Result<(), String> {
    if ec2.image.is_empty() {
        return Err("ec2.image: name the image (AMI) instances boot".into());
    }
    if ec2.instance_type.is_empty() {
        return Err("ec2.instance_type: list at least one type".into());
    }
    if ec2.host_key.split_whitespace().count() < 2 {
        return Err("ec2.host_key: give the host key the image's instances present (an \
                    OpenSSH public key line); it is pinned"
            .into());
    }
    if ec2.spot_price_refresh.is_zero() {
        return Err("ec2.spot_price_refresh: must be more than zero".into());
    }
    if ec2.max_instances == 0 || ec2.fleet_tag.is_empty() {
        return Err("ec2.max_instances, ec2.fleet_tag: must not be 0 or empty".into());
    }
    for (index, it) in ec2.instance_type.iter().enumerate() {
        let problem = if it.name.is_empty() || it.provider_type.is_empty() {
            Some("name and provider_type must not be empty")
        } else if it.vcpus == 0 || it.memory_mb == 0 {
            Some("vcpus and memory_mb must be more than 0")
        } else if wharf_prober::Price::per_hour(it.price).is_none() {
            Some("price must be a number of at least 0")
        } else if ec2.instance_type[..index].iter().any(|other| other.name == it.name) {
            Some("its name is used twice")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(format!("ec2.instance_type[{index}] ({}): {problem}", it.name));
        }
    }
    Ok(())
}

/// Every static host's agent has an absolute data directory to be found at: the runner reads
/// the agent's token there.
fn check_agent_data_dirs(hosts: &StaticSettings, runner: &RunnerSettings) -> Result<(), String> {
    for (index, host) in hosts.host.iter().enumerate() {
        match host.agent_data_dir(runner) {
            None => {
                return Err(format!(
                    "static.host[{index}] ({}): set runner.agent_data_dir, or this host's \
                     agent_data_dir, to where its agent keeps its data: the runner reads the \
                     agent's token there",
                    host.name
                ));
            }
            Some(dir) if !dir.starts_with('/') => {
                let key = if host.agent_data_dir.is_some() {
                    format!("static.host[{index}].agent_data_dir")
                } else {
                    "runner.agent_data_dir".to_owned()
                };
                return Err(format!("{key}: {dir:?} is not an absolute path"));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The fleet's API bound beyond loopback needs a token its remote clients can be given (the
/// one it makes is read on its own host, from its data directory), and a token must not be
/// guessable.
fn check_exposure(bind: SocketAddr, token: Option<&str>) -> Result<(), String> {
    if !bind.ip().is_loopback() && token.is_none_or(str::is_empty) {
        return Err(format!(
            "bind: {bind} is reachable from other machines; set `token`, and give it to their \
             clients"
        ));
    }
    if let Some(token) = token {
        crate::api_token::check(token).map_err(|problem| format!("token: {problem}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2_workers_are_read_with_their_types_and_checked() {
        let text = "[ec2]\nregion = \"eu-west-1\"\nendpoint = \"http://127.0.0.1:5000\"\n\
                    image = \"ami-1\"\nhost_key = \"ssh-ed25519 AAAA\"\nsubnets = [\"subnet-a\", \"subnet-b\"]\ntimeout_idle = \"2m\"\n\
                    [[ec2.instance_type]]\nname = \"small\"\nprovider_type = \"t3.small\"\n\
                    vcpus = 2\nmemory_mb = 2048\nprice = 0.0208\nquota_group = \"standard\"\n";
        let config = FleetConfig::parse(text).unwrap();
        let Instances::Ec2(ec2) = config.instances() else { panic!("not ec2: {config:?}") };
        assert_eq!((ec2.region.as_str(), ec2.subnets.len()), ("eu-west-1", 2));
        assert_eq!(ec2.timeout_idle, Duration::from_secs(120));
        assert_eq!(ec2.spot_price_refresh, Duration::from_secs(600));
        assert_eq!(ec2.instance_type[0].quota_group.as_deref(), Some("standard"));
        for (bad, why) in [
            ("[ec2]\nimage = \"a\"\n", "ec2.instance_type"),
            (
                "[ec2]\n[[ec2.instance_type]]\nname = \"s\"\nprovider_type = \"t\"\nvcpus = 1\nmemory_mb = 1\n",
                "ec2.image",
            ),
            (
                "[ec2]\nimage = \"a\"\nhost_key = \"k k\"\n[[ec2.instance_type]]\nname = \"s\"\nprovider_type = \"t\"\nvcpus = 1\nmemory_mb = 1\nprice = -1.0\n",
                "price",
            ),
            (
                "[ec2]\nimage = \"a\"\n[[ec2.instance_type]]\nname = \"s\"\nprovider_type = \"t\"\nvcpus = 1\nmemory_mb = 1\n",
                "ec2.host_key",
            ),
            (
                "[ec2]\nimage = \"a\"\nhost_key = \"k k\"\nspot_price_refresh = \"0s\"\n[[ec2.instance_type]]\nname = \"s\"\nprovider_type = \"t\"\nvcpus = 1\nmemory_mb = 1\n",
                "ec2.spot_price_refresh",
            ),
            ("[loopback]\n[ec2]\nimage = \"a\"\n", "choose one"),
        ] {
            let error = FleetConfig::parse(bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
    }

    #[test]
    fn no_file_means_two_loopback_workers() {
        let config = FleetConfig::parse("").unwrap();
        assert_eq!(config, FleetConfig::default());
        assert_eq!(config.instances(), Instances::Loopback(&LoopbackSettings::DEFAULT));
        assert_eq!(config.bind.to_string(), "127.0.0.1:4748");
    }

    #[test]
    fn static_hosts_are_read_with_their_keys() {
        let config = FleetConfig::parse(
            "probe_interval = \"1s\"\n[static]\nidentity = \"/k\"\nrejoin_after = \"1m\"\n\
             [runner]\nagent_data_dir = \"/var/lib/wharf\"\n\
             [[static.host]]\nname = \"a\"\naddress = \"10.0.0.1:22\"\nhost_key = \"ssh-ed25519 AAAA\"\n\
             [[static.host]]\nname = \"b\"\naddress = \"10.0.0.2:22\"\nhost_key = \"ssh-ed25519 AAAA\"\n\
             agent_data_dir = \"/srv/wharf\"\n",
        )
        .unwrap();
        let Instances::Static(hosts) = config.instances() else { panic!("{config:?}") };
        assert_eq!(hosts.host[0].user, "root");
        assert_eq!(hosts.rejoin_after, Duration::from_secs(60));
        let dirs: Vec<_> = hosts.host.iter().map(|h| h.agent_data_dir(&config.runner)).collect();
        assert_eq!(dirs, [Some("/var/lib/wharf"), Some("/srv/wharf")], "a host's own wins");
    }

    #[test]
    fn bad_settings_are_named() {
        let cases = [
            ("colour = 1", "unknown field `colour`"),
            ("[loopback]\ninstances = 0", "loopback.instances"),
            ("[loopback]\n[static]\n", "choose one"),
            ("[static]\n", "static.host"),
            ("[static]\n[[static.host]]\nname = \"a\"\n", "static.host"),
            ("[timeouts]\nprobe = \"soon\"", "timeouts.probe"),
            ("bind = \"0.0.0.0:1\"", "set `token`"),
            ("per_worker_limit = 0", "per_worker_limit"),
            ("[store]\nbackend = \"zookeeper\"", "store.backend"),
            ("[store]\nbackend = \"etcd\"\nendpoints = []", "store.endpoints"),
            ("[store]\nbackend = \"etcd\"\nlease_ttl = \"1s\"", "store.lease_ttl"),
            ("[store]\nbackend = \"etcd\"", "set the same `token` on every replica"),
            ("token = \"0123456789 abcdef\"", "token: use printable ASCII"),
            ("token = \"short\"", "token: use at least 16 characters"),
            ("[runner]\nagent_address = \"127.0.0.1:1\"", "runner.agent_address"),
            ("[runner]\nagent_data_dir = \"/var/lib/wharf\"", "runner.agent_data_dir"),
            (
                "sync_interval = \"1m\"\n[static]\nrejoin_after = \"30s\"\n[[static.host]]\nname = \"a\"\naddress = \"b\"\nhost_key = \"c d\"\n",
                "rejoin_after",
            ),
            (
                "[static]\n[[static.host]]\nname = \"a\"\naddress = \"b\"\nhost_key = \"c d\"\n",
                "static.host[0] (a): set runner.agent_data_dir",
            ),
            (
                "[runner]\nagent_data_dir = \"data\"\n[static]\n[[static.host]]\nname = \"a\"\naddress = \"b\"\nhost_key = \"c d\"\n",
                "runner.agent_data_dir: \"data\" is not an absolute path",
            ),
            (
                "[runner]\nagent_data_dir = \"/d\"\n[static]\n[[static.host]]\nname = \"a\"\naddress = \"b\"\nhost_key = \"c d\"\nagent_data_dir = \"d\"\n",
                "static.host[0].agent_data_dir: \"d\" is not an absolute path",
            ),
        ];
        for (text, phrase) in cases {
            let err = FleetConfig::parse(text).unwrap_err();
            assert!(err.contains(phrase), "{text:?}: {err}");
        }
    }
}
