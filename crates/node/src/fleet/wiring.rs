//! The running fleet ([`Fleet`]): its store, this replica's loop (wharf-fleet's
//! [`ReplicaLoop`]), and the build of a lead: the instance set of the configured workers, the
//! executors that reach them, and the runner commands, fenced by the leader's term. The
//! configuration (`config`), the API (`api`) and the CLI (`cli`) are its neighbours.

use super::config::StoreBackend;
use super::config::{Ec2Settings, Ec2TypeSettings, FleetConfig, Instances};
use super::spot_prices;
use super::variables::{FleetVariables, SyncingExecutor};
use crate::wipe;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::{FleetStore, LeadError, Replica, ReplicaLoop, Scheduler, SchedulerConfig, Term};
use wharf_prober::{
    BrakeConfig, Clock, Ec2Config, Ec2InstanceSet, Executor, IdleBehavior, Instance, InstanceId,
    InstanceSet, InstanceType, LocalExecutor, LoopbackConfig, LoopbackInstanceSet, NewExecutor,
    Pool, PoolConfig, Price, Resources, RunnerConfig, SshExecutor, StaticConfig, StaticHost,
    StaticInstanceSet, SystemClock, Tag, Timeouts, WorkerConfig, quote,
};

/// Idle workers are kept: a fleet of fixed size is not shrunk for idleness.
const NEVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The running fleet: this replica's loop (wharf-fleet's [`ReplicaLoop`]: campaign, lead,
/// follow), its store, and while it leads, the pool and the scheduler ([`Leading`]). Only the
/// leader probes, creates, destroys and places; a follower serves reads from the store and
/// forwards the rest to the leader (see the fleet's `api` module).
#[derive(Debug)]
pub struct Fleet {
    config: FleetConfig,
    plan: Plan,
    store: Arc<dyn FleetStore>,
    replica: Arc<ReplicaLoop<InstanceSets>>,
    clock: Arc<dyn Clock>,
    wall_origin: wharf_state::Timestamp,
    /// Wraps every executor the pool gets, if set.
    executor_layer: Option<ExecutorLayer>,
    /// The variables it serves to its workers.
    variables: Arc<FleetVariables>,
}

/// Wraps the executor of each worker (given with its instance): for tests that hold, delay or
/// fail commands, and for embedders that log or meter them.
#[derive(Clone)]
pub struct ExecutorLayer(pub Arc<WrapExecutor>);

/// What an [`ExecutorLayer`] does: the worker's instance and its executor in, the executor the
/// pool uses out.
pub type WrapExecutor = dyn Fn(&Instance, Arc<dyn Executor>) -> Arc<dyn Executor> + Send + Sync;

impl std::fmt::Debug for ExecutorLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecutorLayer")
    }
}

/// What the leader runs: the pool of workers and the scheduler under one term, with the
/// instance set the pool was made over.
pub type Leading = wharf_fleet::Leading<InstanceSets>;

/// The instance set a lead's pool was made over, kept for what the node does beside the pool:
/// putting a static host back in service, destroying loopback instances at shutdown.
#[derive(Debug, Default)]
pub struct InstanceSets {
    static_set: Option<Arc<StaticInstanceSet>>,
    loopback: Option<Arc<LoopbackInstanceSet>>,
    /// The EC2 set, asked for spot prices beside the pool.
    ec2: Option<Arc<Ec2InstanceSet>>,
    /// How each worker reached over SSH relays a call to its agent, by worker.
    relays: Arc<Relays>,
}

/// How a call reaches the agent of a worker the fleet reaches over SSH alone: `wharf
/// agent-relay` run there in a session of the worker's connection ([`crate::agent_relay`]).
#[derive(Debug, Clone)]
pub struct AgentRelay {
    /// The worker.
    worker: String,
    /// The worker's connection, as long as the pool keeps the worker's executor (a worker
    /// gone takes it with it).
    ssh: std::sync::Weak<SshExecutor>,
    /// The command, as the runner commands are run there (`[sudo ]RUNNER ARGS agent-relay`).
    command: String,
    /// Where the fleet that relays answers: the node's `HTTPAddr` for Nomad's clients, which
    /// send the client calls there (the agent listens on the worker's loopback).
    pub(crate) fleet_address: String,
    /// The relays open on this worker at once: bounded, so that reads and client calls
    /// share the worker's one connection with the pool's probes, well within sshd's
    /// sessions per connection (`MaxSessions`, 10 by default), and a flood of calls waits
    /// rather than make the connection drop.
    open_now: Arc<tokio::sync::Semaphore>,
}

/// The relays open at once on one worker, at most.
const RELAYS_PER_WORKER: usize = 4;

impl AgentRelay {
    /// Starts the command, within `deadline`.
    pub async fn open(
        &self,
        deadline: Duration,
    ) -> Result<wharf_prober::channel::Session, wharf_prober::ProberError> {
        use wharf_prober::SessionOpener;
        let Some(ssh) = self.ssh.upgrade() else {
            return Err(wharf_prober::ProberError::UnknownWorker(self.worker.clone()));
        };
        let waited = tokio::time::timeout(deadline, self.open_now.clone().acquire_owned()).await;
        let Ok(Ok(permit)) = waited else {
            return Err(wharf_prober::ProberError::Timeout {
                worker: self.worker.clone(),
                what: format!("a turn among the {RELAYS_PER_WORKER} relays open at once"),
                deadline,
            });
        };
        let session = ssh.open_session(&self.command, deadline).await?;
        // The turn is held as long as the session.
        Ok(wharf_prober::channel::Session { keep: Box::new((session.keep, permit)), ..session })
    }
}

/// How each worker reached over SSH relays a call to its agent, by worker.
type Relays = parking_lot::Mutex<std::collections::HashMap<String, AgentRelay>>;

/// Keeps how worker `instance`, reached through `ssh`, relays a call to its agent.
fn keep_relay(
    relays: &Relays,
    runner: &wharf_prober::Prepared,
    agent_args: &str,
    fleet_address: &str,
    instance: &Instance,
    ssh: &Arc<SshExecutor>,
) {
    match wharf_prober::RunnerInvocation::of(runner, instance) {
        Ok(invocation) => {
            let command = invocation.command(&format!("{agent_args}agent-relay"));
            let ssh = Arc::downgrade(ssh);
            let worker = instance.id.0.clone();
            let fleet_address = fleet_address.to_owned();
            let open_now = Arc::new(tokio::sync::Semaphore::new(RELAYS_PER_WORKER));
            let relay = AgentRelay { worker, ssh, command, fleet_address, open_now };
            let mut relays = relays.lock();
            relays.retain(|_, kept| kept.ssh.strong_count() > 0);
            relays.insert(instance.id.0.clone(), relay);
        }
        Err(error) => {
            tracing::warn!(worker = %instance.id, %error, "no relay to this worker's agent");
        }
    }
}

impl InstanceSets {
    /// How a call reaches worker `id`'s agent when the fleet reaches the worker over SSH
    /// alone: known for static and EC2 workers the pool has an executor for.
    pub fn agent_relay(&self, id: &InstanceId) -> Option<AgentRelay> {
        let relays = self.relays.lock();
        relays.get(&id.0).filter(|relay| relay.ssh.strong_count() > 0).cloned()
    }

    /// The data directory of worker `id`'s agent, where it announces its address and keeps its
    /// token: known for loopback workers, whose agents run on this host.
    pub fn agent_data_dir(&self, id: &InstanceId) -> Option<PathBuf> {
        // Only a listed instance's: the id may come from outside (a query's `node_id`).
        let set = self.loopback.as_ref().filter(|set| set.has(id))?;
        Some(set.dir(id).join("data"))
    }
}

/// The settings a lead is built from, worked out once from the configuration.
#[derive(Debug, Clone)]
struct Plan {
    data_dir: PathBuf,
    wharf: PathBuf,
    pool: PoolConfig,
    scheduling: SchedulerConfig,
    /// The SSH identity of static or EC2 workers, read at start so a bad one fails at once.
    ssh_key: Option<Arc<wharf_prober::ssh::PrivateKey>>,
    /// What the runner commands add to find a worker's agent (`--address ...`), if anything.
    agent_args: String,
}

impl Fleet {
    /// Opens the store and starts this replica: it campaigns in the background, and leads
    /// (builds the pool and the scheduler, and starts them on real time) once it wins. With the
    /// embedded store there is no one to wait for: it returns once it leads, or with the reason
    /// it cannot.
    pub async fn start(config: FleetConfig) -> anyhow::Result<Arc<Fleet>> {
        Fleet::start_layered(config, None).await
    }

    /// [`Fleet::start`], with every worker's executor wrapped by `layer`.
    pub async fn start_layered(
        mut config: FleetConfig,
        executor_layer: Option<ExecutorLayer>,
    ) -> anyhow::Result<Arc<Fleet>> {
        config.check().map_err(|problem| anyhow::anyhow!("invalid configuration: {problem}"))?;
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create {}", config.data_dir.display()))?;
        let data_dir = config.data_dir.canonicalize()?;
        // The API is never open: a configured token, else the one kept in the data directory.
        match &config.token {
            Some(_) => crate::api_token::FLEET.remove(&data_dir)?,
            None => config.token = Some(crate::api_token::FLEET.load_or_create(&data_dir)?),
        }
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let mut plan = plan(&config, &data_dir)?;
        let wall_origin = wall_origin(clock.as_ref());
        plan.scheduling.wall_origin = wall_origin;
        let store = open_store(&config, &data_dir).await?;
        let me = Replica {
            name: config.store.replica.clone().unwrap_or_else(|| config.bind.to_string()),
            address: config.store.advertise.clone().unwrap_or_else(|| config.bind.to_string()),
        };
        let replica = Arc::new(ReplicaLoop::new(store.clone(), me));
        let fleet = Arc::new(Fleet {
            wall_origin,
            config,
            plan,
            store,
            replica: replica.clone(),
            clock,
            executor_layer,
            variables: Arc::new(FleetVariables::new(replica.store().clone())),
        });
        let (first, first_lead) = tokio::sync::oneshot::channel();
        let for_build = fleet.clone();
        let build = move |term: Term| {
            let fleet = for_build.clone();
            async move { fleet.take_lead(term).await }
        };
        tokio::spawn(replica.run(build, Some(first)));
        if fleet.config.store.backend == StoreBackend::Redb {
            match first_lead.await {
                Ok(Ok(())) => {}
                Ok(Err(LeadError::Campaign(error))) => return Err(error.into()),
                Ok(Err(LeadError::Build(error))) => return Err(error),
                Err(_) => anyhow::bail!("the fleet stopped"),
            }
        }
        Ok(fleet)
    }

    /// Its configuration.
    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// What it runs while it leads; `None` while it follows.
    pub fn leading(&self) -> Option<Arc<Leading>> {
        self.replica.leading()
    }

    /// The wall-clock time now.
    pub fn now(&self) -> wharf_state::Timestamp {
        self.wall_origin.saturating_add(self.clock.now().since_origin())
    }

    /// The variables it serves to its workers.
    pub fn variables(&self) -> &Arc<FleetVariables> {
        &self.variables
    }

    /// The store that keeps the fleet's state.
    pub fn store(&self) -> &Arc<dyn FleetStore> {
        &self.store
    }

    /// This replica.
    pub fn replica(&self) -> &Replica {
        self.replica.replica()
    }

    /// Builds what a leader runs under `term`, and starts the pool: the replica loop's `build`.
    async fn take_lead(&self, term: Term) -> anyhow::Result<Leading> {
        let plan = &self.plan;
        let mut pool_config = plan.pool.clone();
        fence_runner_commands(&mut pool_config.worker.runner, term.number());
        let (instances, mut new_executor, extra) = self.instance_set(&mut pool_config).await?;
        if let Some(layer) = self.executor_layer.clone() {
            let inner = new_executor;
            new_executor =
                Arc::new(move |instance: &Instance| (layer.0)(instance, inner(instance)));
        }
        // Read before the pool runs: its first probes give the workers the set.
        self.variables.load(&term).await?;
        let syncing = self.variables.clone();
        let runner = &pool_config.worker.runner;
        let (list_args, start_args) = (runner.list_args.clone(), runner.start_args.clone());
        let agent_args = plan.agent_args.clone();
        let inner = new_executor;
        new_executor = Arc::new(move |instance: &Instance| {
            Arc::new(SyncingExecutor::new(
                instance,
                inner(instance),
                syncing.clone(),
                list_args.clone(),
                start_args.clone(),
                agent_args.clone(),
            )) as Arc<dyn Executor>
        });
        let pool = Pool::new(pool_config, self.clock.clone(), instances, new_executor)?;
        let scheduler =
            Scheduler::take_over(pool.clone(), plan.scheduling.clone(), self.store.clone(), term)
                .await?;
        let keeper = match (&extra.ec2, self.config.instances()) {
            (Some(set), Instances::Ec2(settings)) => spot_prices::keeper(
                pool.clone(),
                set.clone(),
                settings.spot_price_refresh,
                plan.pool.cloud_deadline,
            ),
            _ => None,
        };
        let keeping = keeper.map(tokio::spawn);
        let running = pool.clone();
        tokio::spawn(async move {
            running.run().await;
            // The pool stopped with the lead: its prices are no one's to keep.
            if let Some(keeping) = keeping {
                keeping.abort();
            }
        });
        Ok(Leading::new(pool, scheduler, extra))
    }

    /// The instance set of the configured workers, with the executors that reach them. Made
    /// when this replica takes the lead: a loopback set lists the instances it finds then (those
    /// an earlier leader made are workers again, with their work) and wipes the creates no one
    /// finished.
    async fn instance_set(
        &self,
        pool_config: &mut PoolConfig,
    ) -> anyhow::Result<(Arc<dyn InstanceSet>, NewExecutor, InstanceSets)> {
        match self.config.instances() {
            Instances::Loopback(settings) => {
                let root =
                    settings.root.clone().unwrap_or_else(|| self.plan.data_dir.join("instances"));
                std::fs::create_dir_all(&root)
                    .with_context(|| format!("cannot create {}", root.display()))?;
                let wharf = quote("wharf binary", &self.plan.wharf.display().to_string())?;
                let set = Arc::new(LoopbackInstanceSet::new(LoopbackConfig {
                    root,
                    max_instances: settings.instances,
                    address: None,
                    host_key: None,
                    // Commands run as this user, whoever it is: no sudo.
                    remote_user: "root".into(),
                    init_deadline: Duration::from_secs(30),
                    destroy_command: format!("{wharf} --data-dir \"$PWD/data\" wipe >/dev/null"),
                }));
                wipe_strays(&set.strays()).await?;
                let for_executor = set.clone();
                let channel = self.channel(pool_config)?;
                let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
                    let dir = for_executor.dir(&instance.id);
                    let data = dir.join("data").display().to_string();
                    // The agent is found by its data dir alone, with the token it keeps there,
                    // whatever WHARF_ADDR or WHARF_TOKEN the fleet was given (set empty, a
                    // variable counts as unset).
                    let local = Arc::new(
                        LocalExecutor::new(&instance.id.0)
                            .with_dir(dir)
                            .with_env("WHARF_DATA_DIR", &data)
                            .with_env("WHARF_ADDR", "")
                            .with_env("WHARF_TOKEN", ""),
                    );
                    over_channel(instance, local, channel.as_ref())
                });
                let extra = InstanceSets { loopback: Some(set.clone()), ..InstanceSets::default() };
                Ok((set as Arc<dyn InstanceSet>, new_executor, extra))
            }
            Instances::Static(settings) => {
                // Each host's runner reaches its agent through the agent's data directory, and
                // reads the agent's own token there: no token leaves its host.
                let hosts = settings
                    .host
                    .iter()
                    .map(|h| {
                        let runner_args = match h.agent_data_dir(&self.config.runner) {
                            Some(dir) => format!("--data-dir {}", quote("agent data dir", dir)?),
                            None => String::new(),
                        };
                        Ok(StaticHost {
                            name: h.name.clone(),
                            address: h.address.clone(),
                            remote_user: h.user.clone(),
                            host_key: h.host_key.clone(),
                            runner_args,
                        })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                pool_config.max_instances = hosts.len();
                let set = Arc::new(StaticInstanceSet::new(
                    StaticConfig { hosts, rejoin_after: settings.rejoin_after },
                    self.clock.clone(),
                )?);
                let key = self.plan.ssh_key.clone().context("no SSH identity for static hosts")?;
                let channel = self.channel(pool_config)?;
                let runner = pool_config.worker.clone().prepare()?;
                let relays = Arc::default();
                let (kept, agent_args) = (Arc::clone(&relays), self.plan.agent_args.clone());
                let fleet_address = self.replica().address.clone();
                let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
                    let ssh = Arc::new(SshExecutor::for_instance(instance, key.clone()));
                    keep_relay(&kept, &runner, &agent_args, &fleet_address, instance, &ssh);
                    over_channel(instance, ssh, channel.as_ref())
                });
                let extra = InstanceSets {
                    static_set: Some(set.clone()),
                    relays,
                    ..InstanceSets::default()
                };
                Ok((set as Arc<dyn InstanceSet>, new_executor, extra))
            }
            Instances::Ec2(settings) => {
                let key = self.plan.ssh_key.clone().context("no SSH identity for EC2 workers")?;
                let set = Arc::new(Ec2InstanceSet::new(self.ec2_config(settings, &key)?)?);
                let runner = pool_config.worker.clone().prepare()?;
                let relays = Arc::default();
                let (kept, agent_args) = (Arc::clone(&relays), self.plan.agent_args.clone());
                let fleet_address = self.replica().address.clone();
                let new_executor: NewExecutor = Arc::new(move |instance: &Instance| {
                    let ssh = Arc::new(SshExecutor::for_instance(instance, key.clone()));
                    keep_relay(&kept, &runner, &agent_args, &fleet_address, instance, &ssh);
                    ssh as Arc<dyn Executor>
                });
                let extra =
                    InstanceSets { ec2: Some(set.clone()), relays, ..InstanceSets::default() };
                Ok((set as Arc<dyn InstanceSet>, new_executor, extra))
            }
        }
    }

    /// The EC2 instance set's settings: the fleet's tag, its key pair, the pinned host key,
    /// and where the runner finds each instance's agent.
    fn ec2_config(
        &self,
        settings: &Ec2Settings,
        key: &wharf_prober::ssh::PrivateKey,
    ) -> anyhow::Result<Ec2Config> {
        let public_key =
            key.public_key().to_openssh().context("cannot write the SSH identity's public key")?;
        let mut config = Ec2Config::new(&settings.region, &settings.image);
        config.endpoint = settings.endpoint.clone();
        config.subnets = settings.subnets.clone();
        config.security_groups = settings.security_groups.clone();
        config.admin_user = settings.admin_user.clone();
        config.public_key = Some(public_key);
        config.host_key = Some(settings.host_key.clone());
        config.tags = [("wharf-fleet".to_owned(), settings.fleet_tag.clone())].into();
        if let Some(dir) = &self.config.runner.agent_data_dir {
            config.runner_args = format!("--data-dir {}", quote("agent data dir", dir)?);
        }
        Ok(config)
    }

    /// The worker configuration the probe channels are opened for, unless the configuration
    /// turns them off.
    fn channel(&self, pool_config: &PoolConfig) -> anyhow::Result<Option<wharf_prober::Prepared>> {
        if self.config.runner.channel == Some(false) {
            return Ok(None);
        }
        Ok(Some(pool_config.worker.clone().prepare()?))
    }

    /// Sets a worker's idle behaviour. `run` also puts a static host that was taken out of
    /// service back in. Only the leader acts on workers.
    pub async fn set_idle_behavior(
        &self,
        leading: &Leading,
        id: &InstanceId,
        idle_behavior: IdleBehavior,
    ) -> Result<(), wharf_prober::ProberError> {
        match leading.pool().set_idle_behavior(id, idle_behavior).await {
            Err(wharf_prober::ProberError::UnknownWorker(_))
                if idle_behavior == IdleBehavior::Run
                    && let Some(set) = &leading.extra().static_set =>
            {
                let key = Tag::IdleBehavior.key(&leading.pool().worker_config().tag_prefix);
                if set.restore(id, &key) {
                    leading.pool().sync().await.map(drop)
                } else {
                    Err(wharf_prober::ProberError::UnknownWorker(id.0.clone()))
                }
            }
            other => other,
        }
    }

    /// Stops leading (the pool and the scheduler stop, the term is given up so another replica
    /// may lead at once) and campaigning. Loopback instances are destroyed with the embedded
    /// store, whose fleet is this process alone; with a shared store they are the fleet's, and
    /// the next leader adopts them. Static hosts are left as they are.
    pub async fn shutdown(&self) {
        let Some(leading) = self.replica.shutdown().await else { return };
        if self.config.store.backend == StoreBackend::Redb
            && let Some(set) = &leading.extra().loopback
        {
            for (worker, error) in set.destroy_all().await {
                tracing::warn!(%worker, %error, "cannot destroy loopback instance");
            }
        }
    }
}

/// `executor`, with the runner's commands sent over the worker's probe channel when `channel`
/// (the worker configuration) is given; as it is otherwise, or if the channel's program cannot
/// be named.
fn over_channel<E>(
    instance: &Instance,
    executor: Arc<E>,
    channel: Option<&wharf_prober::Prepared>,
) -> Arc<dyn Executor>
where
    E: Executor + wharf_prober::SessionOpener,
{
    let Some(config) = channel else { return executor };
    match wharf_prober::ChannelConfig::for_runner(config, instance) {
        Ok(channel) => Arc::new(wharf_prober::ChannelExecutor::new(
            instance,
            executor.clone(),
            executor,
            channel,
        )),
        Err(error) => {
            tracing::warn!(worker = %instance.id, %error, "no probe channel for this worker");
            executor
        }
    }
}

/// Makes every runner command carry the leader's term (`--fleet-term N`): each worker's agent
/// keeps the highest term it has heard (from the probes of a new leader, first) and refuses
/// the starts and stops of older ones, so a leader that lost its term while paused starts
/// nothing its successor placed elsewhere (`wharf_node::fence`).
fn fence_runner_commands(runner: &mut RunnerConfig, term: u64) {
    let fenced = |args: &str| format!("--fleet-term {term} {args}");
    runner.list_args = fenced(&runner.list_args);
    runner.start_args = fenced(&runner.start_args);
    runner.kill_args = fenced(&runner.kill_args);
    runner.outcome_args = runner.outcome_args.as_deref().map(fenced);
}

/// Works out the pool's and the scheduler's settings from the configuration.
fn plan(config: &FleetConfig, data_dir: &Path) -> anyhow::Result<Plan> {
    let wharf = match &config.runner.binary {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("cannot find the running wharf binary")?,
    };
    // Read when a worker needs a copy, not held: it is tens of megabytes.
    let binary = wharf_prober::RunnerBinary::file(wharf.clone());
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
            outcome_hold: config.timeouts.outcome_hold,
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
    let mut pool = PoolConfig {
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
    let mut ssh_key = None;
    match config.instances() {
        Instances::Loopback(settings) => {
            let wharf = quote("wharf binary", &wharf.display().to_string())?;
            // Each agent on a loopback port the kernel picks, found by its data dir: flags, so
            // that a WHARF_ADDR or WHARF_DATA_DIR in the fleet's environment does not override
            // them. No WHARF_TOKEN is inherited: each agent makes its own token and keeps it in
            // its data dir (inside the fleet's), where the runner commands read it.
            pool.init_command = format!(
                "mkdir -p data && {{ env -u WHARF_TOKEN setsid {wharf} --data-dir \"$PWD/data\" agent --address 127.0.0.1:0 </dev/null >agent.log 2>&1 & }}"
            );
            pool.secret_path = "secret".into();
            pool.max_instances = settings.instances;
            pool.max_concurrent_creates = settings.max_concurrent_creates;
            worker.boot_probe_command = "test -s data/agent.json".into();
            // A loopback instance is this host, and its agent runs the fleet's own binary in
            // place: so do the runner commands. Nothing is copied (a copy per instance would be
            // the same file written and hashed once per worker on one disk and one CPU).
            worker.runner.binary = None;
            worker.runner.command = wharf;
            scheduling.min_workers = settings.instances;
        }
        Instances::Static(settings) => ssh_key = Some(read_identity(&settings.identity)?),
        Instances::Ec2(settings) => {
            ssh_key = Some(read_identity(&settings.identity)?);
            pool.max_instances = settings.max_instances;
            pool.instance_types = settings.instance_type.iter().map(ec2_type).collect();
            worker.timeouts.idle = settings.timeout_idle;
        }
    }
    if let Some(probe) = &config.runner.boot_probe {
        worker.boot_probe_command = probe.clone();
    }
    if let Some(directory) = &config.runner.directory {
        worker.runner.directory = directory.clone();
    }
    pool.worker = worker;
    Ok(Plan { data_dir: data_dir.to_owned(), wharf, pool, scheduling, ssh_key, agent_args: agent })
}

/// An SSH private key from `path`.
fn read_identity(path: &Path) -> anyhow::Result<Arc<wharf_prober::ssh::PrivateKey>> {
    let pem = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the SSH identity {}", path.display()))?;
    Ok(Arc::new(wharf_prober::ssh::parse_private_key(&pem)?))
}

/// An EC2 type as the pool and the scheduler see it: what it has (a vCPU as 1000 MHz and one
/// core), its price and its quota group.
fn ec2_type(settings: &Ec2TypeSettings) -> InstanceType {
    InstanceType {
        provider_type: settings.provider_type.clone(),
        preemptible: settings.preemptible,
        quota_group: settings.quota_group.clone(),
        resources: Some(Resources {
            cpu_mhz: u64::from(settings.vcpus) * 1000,
            memory_mb: settings.memory_mb,
            cores: settings.vcpus,
        }),
        price: Price::per_hour(settings.price),
        ..InstanceType::new(&settings.name)
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
