//! `wharf fleet`: a pool of workers, each running the wharf node agent, and a scheduler that
//! places allocations on them, as Arvados' dispatcher keeps instances running crunch-run.
//!
//! This module only wires wharf-prober's pool and wharf-fleet's scheduler to the `wharf`
//! binary:
//! - the runner is `wharf` itself, deployed to every worker by sha256; the run probe is
//!   `wharf alloc list --probe`, a start is `wharf run --detach - --id ID` with the job spec on
//!   stdin, a stop is `wharf alloc stop --wait`, and `wharf alloc outcome ID` says how an
//!   allocation that left the list ended;
//! - loopback workers are agents on this host, one per instance directory, started by the
//!   instance's init command and ended by `wharf wipe`; static workers are the user's machines,
//!   reached over SSH with pinned host keys, each running its agent at the default address;
//! - [`api`] serves the management API.

pub mod api;
pub mod cli;
pub mod config;

use crate::wipe;
use anyhow::Context;
use config::StoreBackend;
use config::{FleetConfig, Instances};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::{FleetStore, Replica, Scheduler, SchedulerConfig};
use wharf_prober::{
    BrakeConfig, Clock, Executor, IdleBehavior, Instance, InstanceId, InstanceSet, LocalExecutor,
    LoopbackConfig, LoopbackInstanceSet, NewExecutor, Pool, PoolConfig, RunnerConfig, SshExecutor,
    StaticConfig, StaticHost, StaticInstanceSet, SystemClock, Tag, Timeouts, WorkerConfig, quote,
};

/// Idle workers are kept: a fleet of fixed size is not shrunk for idleness.
const NEVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The running fleet.
#[derive(Debug)]
pub struct Fleet {
    config: FleetConfig,
    pool: Pool,
    scheduler: Scheduler,
    store: Arc<dyn FleetStore>,
    replica: Replica,
    static_set: Option<Arc<StaticInstanceSet>>,
    loopback: Option<Arc<LoopbackInstanceSet>>,
}

impl Fleet {
    /// Builds the pool and the scheduler and starts them on real time.
    pub async fn start(config: FleetConfig) -> anyhow::Result<Arc<Fleet>> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create {}", config.data_dir.display()))?;
        let data_dir = config.data_dir.canonicalize()?;
        let wharf = match &config.runner.binary {
            Some(path) => path.clone(),
            None => std::env::current_exe().context("cannot find the running wharf binary")?,
        };
        // Read when a worker needs a copy, not held: it is tens of megabytes.
        let binary = wharf_prober::RunnerBinary::file(wharf.clone());
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        // Where the runner finds the worker's agent, when not at its default address.
        let agent = match &config.runner.agent_address {
            Some(address) => format!("--address {} ", quote("agent address", address)?),
            None => String::new(),
        };
        // The prober's defaults are wharf's own commands; only the agent's address is added.
        let defaults = RunnerConfig::default();
        let mut worker = WorkerConfig {
            timeouts: Timeouts {
                booting: config.timeouts.booting,
                probe: config.timeouts.probe,
                idle: NEVER,
                stale_run_lock: config.timeouts.stale_run_lock,
                signal: config.timeouts.signal,
                term: config.timeouts.term,
                ..Timeouts::default()
            },
            boot_probe_command: "true".into(),
            runner: RunnerConfig {
                binary: Some(binary),
                list_args: format!("{agent}{}", defaults.list_args),
                start_args: format!("{agent}{}", defaults.start_args),
                kill_args: format!("{agent}{}", defaults.kill_args),
                outcome_args: defaults.outcome_args.map(|args| format!("{agent}{args}")),
                resources_args: defaults.resources_args.map(|args| format!("{agent}{args}")),
                ..defaults
            },
            command_deadline: config.command_deadline,
            ..WorkerConfig::default()
        };
        let mut pool_config = PoolConfig {
            probe_interval: config.probe_interval,
            sync_interval: config.sync_interval,
            max_concurrent_creates: 4,
            brake: BrakeConfig {
                max_failing_share: config.brake.max_failing_share,
                min_failing: config.brake.min_failing,
            },
            cloud_deadline: Duration::from_secs(60),
            ..PoolConfig::default()
        };
        let mut scheduling = SchedulerConfig {
            per_worker_limit: config.per_worker_limit,
            max_queued: config.max_queued,
            ..SchedulerConfig::default()
        };
        let (instances, new_executor, static_set, loopback): (
            Arc<dyn InstanceSet>,
            NewExecutor,
            _,
            _,
        ) = match config.instances() {
            Instances::Loopback(settings) => {
                let root = data_dir.join("instances");
                std::fs::create_dir_all(&root)?;
                let wharf = quote("wharf binary", &wharf.display().to_string())?;
                // Each agent on a loopback port the kernel picks, found by its data dir, with no
                // token: flags, so that a WHARF_ADDR or WHARF_DATA_DIR in the fleet's
                // environment does not override them, and no WHARF_TOKEN inherited.
                pool_config.init_command = format!(
                    "mkdir -p data && {{ env -u WHARF_TOKEN setsid {wharf} --data-dir \"$PWD/data\" agent --address 127.0.0.1:0 </dev/null >agent.log 2>&1 & }}"
                );
                pool_config.secret_path = "secret".into();
                pool_config.max_instances = settings.instances;
                worker.boot_probe_command = "test -s data/agent.json".into();
                worker.runner.directory = data_dir.join("runner").display().to_string();
                scheduling.min_workers = settings.instances;
                let set = Arc::new(LoopbackInstanceSet::new(LoopbackConfig {
                    root: root.clone(),
                    max_instances: settings.instances,
                    address: None,
                    host_key: None,
                    // Commands run as this user, whoever it is: no sudo.
                    remote_user: "root".into(),
                    init_deadline: Duration::from_secs(30),
                    destroy_command: format!("{wharf} --data-dir \"$PWD/data\" wipe >/dev/null"),
                }));
                // Instances a killed fleet left are workers again, with their work; a create it
                // was in the middle of is wiped.
                wipe_strays(&set.strays()).await?;
                let for_executor = set.clone();
                let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
                    let dir = for_executor.dir(&instance.id);
                    let data = dir.join("data").display().to_string();
                    // The agent is found by its data dir alone, whatever WHARF_ADDR the fleet
                    // was given (set empty, it counts as unset).
                    Arc::new(
                        LocalExecutor::new(&instance.id.0)
                            .with_dir(dir)
                            .with_env("WHARF_DATA_DIR", &data)
                            .with_env("WHARF_ADDR", ""),
                    ) as Arc<dyn Executor>
                });
                (set.clone() as Arc<dyn InstanceSet>, new_executor, None, Some(set))
            }
            Instances::Static(settings) => {
                let pem = std::fs::read_to_string(&settings.identity).with_context(|| {
                    format!("cannot read the SSH identity {}", settings.identity.display())
                })?;
                let key = Arc::new(wharf_prober::ssh::parse_private_key(&pem)?);
                let hosts = settings
                    .host
                    .iter()
                    .map(|h| StaticHost {
                        name: h.name.clone(),
                        address: h.address.clone(),
                        remote_user: h.user.clone(),
                        host_key: h.host_key.clone(),
                    })
                    .collect::<Vec<_>>();
                pool_config.max_instances = hosts.len();
                let set = Arc::new(StaticInstanceSet::new(
                    StaticConfig { hosts, rejoin_after: settings.rejoin_after },
                    clock.clone(),
                )?);
                let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
                    Arc::new(SshExecutor::for_instance(instance, key.clone())) as Arc<dyn Executor>
                });
                (set.clone() as Arc<dyn InstanceSet>, new_executor, Some(set), None)
            }
        };
        if let Some(probe) = &config.runner.boot_probe {
            worker.boot_probe_command = probe.clone();
        }
        if let Some(directory) = &config.runner.directory {
            worker.runner.directory = directory.clone();
        }
        pool_config.worker = worker;
        scheduling.wall_origin = wall_origin(clock.as_ref());
        let store = open_store(&config, &data_dir).await?;
        let replica = Replica {
            name: config.store.replica.clone().unwrap_or_else(|| config.bind.to_string()),
            address: config.store.advertise.clone().unwrap_or_else(|| config.bind.to_string()),
        };
        let term = store.campaign(&replica).await?;
        tracing::info!(term = term.number(), store = ?store.describe(), "leading the fleet");
        let pool = Pool::new(pool_config, clock, instances, new_executor)?;
        let scheduler = Scheduler::take_over(pool.clone(), scheduling, store.clone(), term).await?;
        let fleet =
            Arc::new(Fleet { config, pool, scheduler, store, replica, static_set, loopback });
        let pool = fleet.pool.clone();
        tokio::spawn(async move { pool.run().await });
        let scheduler = fleet.scheduler.clone();
        tokio::spawn(async move { scheduler.run().await });
        Ok(fleet)
    }

    /// Its configuration.
    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// The pool of workers.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The wall-clock time now, on the pool's clock.
    pub fn now(&self) -> wharf_state::Timestamp {
        self.scheduler.config().wall(self.pool.clock().now())
    }

    /// The store that keeps the fleet's state.
    pub fn store(&self) -> &Arc<dyn FleetStore> {
        &self.store
    }

    /// This replica.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// Sets a worker's idle behaviour. `run` also puts a static host that was taken out of
    /// service back in.
    pub async fn set_idle_behavior(
        &self,
        id: &InstanceId,
        idle_behavior: IdleBehavior,
    ) -> Result<(), wharf_prober::ProberError> {
        match self.pool.set_idle_behavior(id, idle_behavior).await {
            Err(wharf_prober::ProberError::UnknownWorker(_))
                if idle_behavior == IdleBehavior::Run
                    && let Some(set) = &self.static_set =>
            {
                let key = Tag::IdleBehavior.key(&self.pool.worker_config().tag_prefix);
                if set.restore(id, &key) {
                    self.pool.sync().await.map(drop)
                } else {
                    Err(wharf_prober::ProberError::UnknownWorker(id.0.clone()))
                }
            }
            other => other,
        }
    }

    /// Stops the pool and the scheduler; loopback instances are destroyed (their agents and
    /// tasks end), static hosts are left as they are.
    pub async fn shutdown(&self) {
        self.scheduler.stop_running();
        self.pool.stop();
        // Another replica may lead at once, rather than after the lease lapses.
        if let Err(error) = self.store.resign(self.scheduler.term()).await {
            tracing::warn!(%error, "cannot resign the fleet's term");
        }
        if let Some(set) = &self.loopback {
            for (worker, error) in set.destroy_all().await {
                tracing::warn!(%worker, %error, "cannot destroy loopback instance");
            }
        }
    }
}

/// The wall-clock time at `clock`'s origin: the scheduler's records carry wall-clock times.
fn wall_origin(clock: &dyn Clock) -> wharf_state::Timestamp {
    // The one wall-clock read of the fleet: the scheduler counts from it on the pool's clock.
    #[allow(clippy::disallowed_methods)]
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    wharf_state::Timestamp::from_unix(now.saturating_sub(clock.now().since_origin()))
}

/// Opens the configured store.
async fn open_store(config: &FleetConfig, data_dir: &Path) -> anyhow::Result<Arc<dyn FleetStore>> {
    Ok(match config.store.backend {
        StoreBackend::Redb => {
            let path = config.store.path.clone().unwrap_or_else(|| data_dir.join("fleet.redb"));
            Arc::new(wharf_fleet::LedgerStore::open(&path)?)
        }
        StoreBackend::Etcd => Arc::new(
            wharf_fleet::EtcdStore::connect(wharf_fleet::EtcdConfig {
                endpoints: config.store.endpoints.clone(),
                prefix: config.store.prefix.clone(),
                lease_ttl: config.store.lease_ttl,
                ..wharf_fleet::EtcdConfig::default()
            })
            .await?,
        ),
    })
}

/// Wipes what creates a killed fleet never finished left under the loopback root, so none of
/// their agents and tasks outlive it unseen.
async fn wipe_strays(strays: &[PathBuf]) -> anyhow::Result<()> {
    for dir in strays {
        let dir = dir.clone();
        let node = crate::config::NodeConfig { data_dir: dir.join("data"), ..Default::default() };
        let wiped = wipe::wipe(&node)
            .await
            .with_context(|| format!("cannot wipe the unfinished instance {}", dir.display()))?;
        tracing::info!(instance = %dir.display(), agent_killed = wiped.agent_killed, tasks = wiped.tasks_destroyed, "wiped an unfinished loopback instance");
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    Ok(())
}

/// Runs the fleet and its API until SIGTERM or SIGINT.
pub async fn serve(mut config: FleetConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("cannot listen on {}", config.bind))?;
    // The address as bound (a port 0 becomes the one the kernel chose) names this replica.
    let bound = listener.local_addr()?.to_string();
    config.store.replica.get_or_insert_with(|| bound.clone());
    config.store.advertise.get_or_insert(bound);
    let fleet = Fleet::start(config).await?;
    // Handled from before "ready" is said: a SIGTERM right after it is a clean shutdown.
    let terminated = crate::serve::terminate_signal();
    tracing::info!(address = %listener.local_addr()?, "fleet ready");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        terminated.await;
        tracing::info!("shutting down the fleet");
        stop.send_replace(true);
    });
    crate::serve::run_server(listener, api::router(fleet.clone()), stopped).await;
    fleet.shutdown().await;
    Ok(())
}
