//! The node agent: opens the store, restores every allocation, runs new ones, applies stops,
//! collects garbage, and shuts down leaving tasks running. The HTTP API and the CLI's
//! embedded mode both drive it.
//!
//! Admission refuses, before anything is written, an allocation that does not fit the node's
//! resources or whose ports it cannot have. The agent owns the node's ports (a
//! `wharf_health::PortTable`): an accepted allocation's ports are written in its record, held
//! again from that record after a restart, and released when it ends. It owns the service
//! catalog too; the alloc runners register their tasks' services in it.

use crate::config::{GcConfig, NodeConfig};
use crate::metrics::{AllocTally, Family, MetricKind, Metrics, MetricsHook};
use crate::resources::NodeResources;
use crate::usage::{CgroupsStatus, NodeStatus};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinSet;
use wharf_alloc::{AllocError, AllocRunner, AllocRunnerConfig, HealthConfig, SpareDirs};
use wharf_artifact::{ArtifactHook, Fetcher, Limits as ArtifactLimits};
use wharf_driver::{DriverRegistry, Health};
use wharf_exec::TaskCgroups;
use wharf_health::{PortError, PortTable, ServiceCatalog, TcpTransport};
use wharf_state::resources::Amount;
use wharf_state::{Allocation, ClientStatus, DesiredStatus, Job, SpecError, Timestamp};
use wharf_store::{RedbStore, StateStore, StoreError, StoredAlloc};
use wharf_task::{LogLimits, SystemClock, TaskHook, WallClock};

/// Why the agent could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The store could not be opened or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store file is damaged; `wharf agent --reset-state` moves it aside.
    #[error(
        "the state store {} is damaged ({detail}); start the agent again with --reset-state to \
         move it aside and start empty (tasks still running will not be reattached, and the \
         damaged file stays beside it for diagnosis)",
        path.display()
    )]
    DamagedStore {
        /// The store file.
        path: PathBuf,
        /// What the storage engine reported.
        detail: String,
    },
    /// The job spec is not valid on this node.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// No allocation with that id.
    #[error("no allocation {0:?} on this node")]
    UnknownAlloc(String),
    /// The id asked for is not a valid allocation id.
    #[error(transparent)]
    InvalidId(#[from] wharf_state::InvalidAllocId),
    /// The id asked for already names an allocation of another job.
    #[error("allocation {0:?} already exists with a different job; choose another id")]
    IdTaken(String),
    /// The allocation refused.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The artifact fetcher could not be set up.
    #[error(transparent)]
    Artifacts(#[from] wharf_artifact::ArtifactError),
    /// The allocation does not fit in what the node has free; nothing was kept of it.
    /// The group asks for a host volume the node does not offer, or would write one the
    /// node offers read-only.
    #[error("the allocation's volumes are not available on this node: {0}")]
    Volume(String),
    #[error("the allocation does not fit on this node: {0}")]
    DoesNotFit(wharf_state::resources::Shortfall),
    /// The allocation's ports are not available here; nothing was kept of it.
    #[error("the allocation's ports are not available on this node: {0}")]
    Ports(#[from] PortError),
    /// The configured address of allocations' ports is not one of this host's.
    #[error("network.address {address} cannot be used on this host: {source}")]
    PortAddress {
        /// The address.
        address: std::net::IpAddr,
        /// Why binding to it failed.
        source: std::io::Error,
    },
    /// The fleet's fence refused the request, or cannot be kept.
    #[error(transparent)]
    Fence(#[from] crate::fence::FenceError),
    /// What the node has could not be read.
    #[error("cannot read the node's CPUs and memory: {0}")]
    Host(#[from] wharf_isolate::IsolateError),
    /// The API token file cannot be used.
    #[error(transparent)]
    Token(#[from] crate::agent_token::TokenFileError),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartOptions {
    /// If the store is damaged, move it aside and start empty instead of refusing to start.
    pub reset_state: bool,
}

/// One allocation the agent manages.
#[derive(Debug, Clone)]
struct Managed {
    runner: AllocRunner,
    /// Submission order, for listing.
    order: u64,
    /// What its group holds of the node while it may run, worked out once: the agent changes
    /// an allocation's desired status, never its job, so this does not change.
    needed: Amount,
    /// Its tasks' restarts when the agent took it on: those since count in the metrics.
    restarts_before: u64,
}

impl Managed {
    /// Its tasks' restarts since the agent took it on, read from the task states (which
    /// count them exactly) without copying them.
    fn restarts_since_adopted(&self) -> u64 {
        restarts(&self.runner).saturating_sub(self.restarts_before)
    }
}

/// The restarts of every task of `runner`'s allocation.
fn restarts(runner: &AllocRunner) -> u64 {
    runner.subscribe().borrow().task_states.values().map(|task| task.restarts).sum()
}

enum Claim<'a> {
    /// The same job runs under this id already.
    Taken,
    Ours(IdClaim<'a>),
}

/// An id being submitted; released when dropped.
struct IdClaim<'a> {
    agent: &'a Agent,
    id: String,
}

impl Drop for IdClaim<'_> {
    fn drop(&mut self) {
        self.agent.claimed.lock().remove(&self.id);
    }
}

/// An admitted allocation's share, held until it is managed (or its submission failed).
struct Admitted<'a> {
    agent: &'a Agent,
    amount: Amount,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut admitting = self.agent.admitting.lock();
        *admitting = admitting.saturating_sub(self.amount);
    }
}

/// The ports a submission took, given back unless it is taken under management.
struct PortClaim<'a> {
    agent: &'a Agent,
    alloc_id: String,
    kept: bool,
}

impl PortClaim<'_> {
    /// The allocation is managed: its ports stay held until it ends.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for PortClaim<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.agent.ports.lock().release(&self.alloc_id);
        }
    }
}

/// The running agent.
#[derive(Debug)]
pub struct Agent {
    config: NodeConfig,
    store: RedbStore,
    drivers: DriverRegistry,
    allocs: RwLock<BTreeMap<String, Managed>>,
    /// Ids being submitted right now.
    claimed: parking_lot::Mutex<std::collections::HashSet<String>>,
    next_order: std::sync::atomic::AtomicU64,
    metrics: Arc<Metrics>,
    clock: Arc<dyn WallClock>,
    task_hooks: Vec<Arc<dyn TaskHook>>,
    /// Ready-made allocation directories; none if the spare root cannot be used.
    spare_dirs: Option<Arc<SpareDirs>>,
    /// What the node has, keeps, and gives allocations.
    resources: NodeResources,
    /// The tasks' cgroups, shared by the drivers, or why there are none.
    cgroups: TaskCgroups,
    /// What submissions that passed admission but are not managed yet hold.
    admitting: parking_lot::Mutex<Amount>,
    /// Which allocation holds which port.
    ports: Arc<parking_lot::Mutex<PortTable>>,
    /// The node's host volumes, shared with every alloc runner.
    host_volumes: Arc<std::collections::BTreeMap<String, wharf_state::volume::HostVolume>>,
    /// The services of running tasks, and how their checks reach them.
    health: HealthConfig,
    /// The highest fleet term heard: commands of older fleet leaders are refused.
    fence: crate::fence::FleetFence,
    /// The node's variables, and what the tasks' templates read.
    variables: Arc<crate::variables::NodeVariables>,
    /// The container driver (also in `drivers`), for its image store.
    containers: Option<Arc<wharf_container::ContainerDriver>>,
    /// When a driver was last seen healthy, for [`Agent::broken`].
    healthy_driver_seen: HealthySeen,
}

/// How many ready-made allocation and task directories the agent keeps.
const SPARE_DIRS: usize = 4;

/// How long a driver seen healthy counts as healthy for the run probe's `broken` line.
const DRIVER_HEALTH_FRESH: Duration = Duration::from_secs(5);

/// When a driver was last seen healthy.
#[derive(Debug, Default)]
struct HealthySeen(parking_lot::Mutex<Option<tokio::time::Instant>>);

impl HealthySeen {
    /// Whether a driver was seen healthy less than [`DRIVER_HEALTH_FRESH`] before `now`.
    fn fresh(&self, now: tokio::time::Instant) -> bool {
        self.0.lock().is_some_and(|seen| now.saturating_duration_since(seen) < DRIVER_HEALTH_FRESH)
    }

    fn saw(&self, now: tokio::time::Instant) {
        *self.0.lock() = Some(now);
    }
}

/// How long a shutting-down agent waits for ended tasks to be freed.
const HOUSEKEEPING_LIMIT: Duration = Duration::from_secs(10);

impl Agent {
    /// Opens the store, builds the drivers and restores every allocation (in parallel), then
    /// starts them running. Ready to serve when it returns.
    pub async fn start(
        mut config: NodeConfig,
        options: StartOptions,
    ) -> Result<Arc<Agent>, AgentError> {
        let allocs_dir = config.data_dir.join("allocs");
        std::fs::create_dir_all(&allocs_dir)
            .map_err(|source| AgentError::Io { path: allocs_dir.clone(), source })?;
        // Tasks get absolute paths, whatever directory the agent was started in.
        config.data_dir = config
            .data_dir
            .canonicalize()
            .map_err(|source| AgentError::Io { path: config.data_dir.clone(), source })?;
        // The API is never open: a configured token, else the one kept in the data directory.
        match &config.token {
            Some(_) => crate::agent_token::remove(&config.data_dir)?,
            None => config.token = Some(crate::agent_token::load_or_create(&config.data_dir)?),
        }
        let store = open_store(&config, options)?;
        // An optimisation only: without it, the allocation directories are made on demand.
        let spare_dirs = match SpareDirs::open(config.spare_root(), SPARE_DIRS) {
            Ok(spares) => Some(Arc::new(spares)),
            Err(error) => {
                tracing::warn!(root = %config.spare_root().display(), %error,
                    "cannot keep spare allocation directories; making them on demand");
                None
            }
        };
        let metrics = Arc::new(Metrics::default());
        let network = &config.network;
        std::net::TcpListener::bind((network.address, 0))
            .map_err(|source| AgentError::PortAddress { address: network.address, source })?;
        let ports =
            PortTable::new(network.address, network.min_dynamic_port, network.max_dynamic_port)?;
        let resources = NodeResources::new(&config, &wharf_isolate::Host::detect()?);
        let cgroups = crate::resources::task_cgroups(&config, &resources);
        let fence = crate::fence::FleetFence::open(&config.data_dir)?;
        let catalog = Arc::new(ServiceCatalog::new());
        let variables = crate::variables::NodeVariables::open(&config.data_dir, catalog.clone())?;
        let host_volumes = Arc::new(config.host_volume.clone());
        let containers = crate::container::driver(
            &config.drivers.container,
            &config.data_dir,
            config.drivers.raw_exec.shim_path.clone(),
            &cgroups,
        );
        let agent = Arc::new(Agent {
            fence,
            variables,
            drivers: build_drivers(&config, &cgroups, containers.clone()),
            containers,
            healthy_driver_seen: Default::default(),
            store,
            allocs: RwLock::new(BTreeMap::new()),
            claimed: Default::default(),
            next_order: 0.into(),
            clock: Arc::new(SystemClock),
            task_hooks: vec![
                Arc::new(MetricsHook(metrics.clone())),
                Arc::new(ArtifactHook::new(Arc::new(Fetcher::new(ArtifactLimits::default())?))),
            ],
            spare_dirs,
            metrics,
            config,
            resources,
            cgroups,
            admitting: parking_lot::Mutex::new(Amount::ZERO),
            ports: Arc::new(parking_lot::Mutex::new(ports)),
            health: HealthConfig { catalog, transport: Arc::new(TcpTransport::new()) },
            host_volumes,
        });
        agent.restore().await?;
        // Every task that still runs has taken its cgroup back: the others' are left by runs
        // an earlier agent lost.
        if let Some(cgroups) = agent.cgroups.manager() {
            let removed = wharf_exec::remove_orphan_cgroups(cgroups);
            if !removed.is_empty() {
                tracing::info!(cgroups = ?removed, "removed the cgroups of tasks that are gone");
            }
        }
        Ok(agent)
    }

    /// The fleet's fence: the highest fleet term heard.
    pub fn fence(&self) -> &crate::fence::FleetFence {
        &self.fence
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The container driver, if it is enabled (its image store is the API's).
    pub fn containers(&self) -> Option<&Arc<wharf_container::ContainerDriver>> {
        self.containers.as_ref()
    }

    /// The drivers.
    pub fn drivers(&self) -> &DriverRegistry {
        &self.drivers
    }

    /// What the node has, keeps, and gives allocations.
    pub fn resources(&self) -> &NodeResources {
        &self.resources
    }

    /// The tasks' cgroups, or why there are none.
    pub fn task_cgroups(&self) -> &TaskCgroups {
        &self.cgroups
    }

    /// The services of the node's running tasks.
    pub fn catalog(&self) -> &ServiceCatalog {
        &self.health.catalog
    }

    /// The node's variables, which the tasks' templates read with the catalog.
    pub fn variables(&self) -> &Arc<crate::variables::NodeVariables> {
        &self.variables
    }

    /// How many ports allocations hold.
    pub fn ports_held(&self) -> usize {
        self.ports.lock().held()
    }

    /// Takes the ports `alloc`'s group asks for into `alloc.ports`: static ports unless held
    /// or in use on the host, dynamic ones from the node's range. Part of admission: they are
    /// given back if the submission does not go through.
    fn claim_ports(&self, alloc: &mut Allocation) -> Result<PortClaim<'_>, AgentError> {
        let claim = PortClaim { agent: self, alloc_id: alloc.id.clone(), kept: false };
        let group = alloc.group().map_err(AllocError::from)?;
        if let Some(network) = group.network.as_ref() {
            let ip = self.config.network.address;
            let is_free = |port| std::net::TcpListener::bind((ip, port)).is_ok();
            alloc.ports = self.ports.lock().assign(&alloc.id, network, is_free)?;
        }
        Ok(claim)
    }

    /// What the allocations that may still run hold between them, and how many there are.
    /// Every admission asks, so this reads what each holds rather than its allocation.
    pub fn allocated(&self) -> (Amount, usize) {
        let allocs = self.allocs.read();
        let holding = allocs.values().filter(|m| !m.runner.is_done());
        holding.fold((Amount::ZERO, 0), |(held, count), m| (held + m.needed, count + 1))
    }

    /// Admits an allocation of `group` if it fits in what is free, holding its share until the
    /// returned guard drops (by then the allocation is managed and counted as such).
    fn admit(&self, group: &wharf_state::TaskGroup) -> Result<Admitted<'_>, AgentError> {
        let writers = |volume: &str| {
            group
                .tasks
                .iter()
                .flat_map(|t| &t.volume_mounts)
                .any(|m| m.volume == volume && !m.read_only)
        };
        wharf_state::volume::check_offered(
            "group",
            &group.volumes,
            writers,
            &self.config.host_volume,
        )
        .map_err(AgentError::Volume)?;
        let needed = self.resources.needed(group);
        let mut admitting = self.admitting.lock();
        let (held, _) = self.allocated();
        let free = self.resources.allocatable().saturating_sub(held + *admitting);
        if let Some(shortfall) = free.shortfall(&needed) {
            return Err(AgentError::DoesNotFit(shortfall));
        }
        *admitting = *admitting + needed;
        Ok(Admitted { agent: self, amount: needed })
    }

    async fn restore(self: &Arc<Self>) -> Result<(), AgentError> {
        #[allow(clippy::disallowed_methods)] // Restore duration is a measurement.
        let started = std::time::Instant::now();
        let snapshot = self.store.load_all().await?;
        let mut orphans = Vec::new();
        for problem in &snapshot.problems {
            tracing::warn!(alloc_id = %problem.alloc_id, record = %problem.record, error = %problem.error, "unreadable state record");
            if problem.orphaned {
                orphans.push(problem.alloc_id.clone());
            }
        }
        for orphan in orphans {
            // Task records of an allocation whose own record is gone cannot be restored.
            self.store.delete_allocation(&orphan).await?;
        }
        let mut restoring = JoinSet::new();
        for stored in snapshot.allocs {
            let agent = self.clone();
            restoring.spawn(async move { agent.restore_one(stored).await });
        }
        let mut restored = 0;
        while let Some(result) = restoring.join_next().await {
            if matches!(result, Ok(true)) {
                restored += 1;
            }
        }
        let elapsed = started.elapsed();
        self.metrics.restore_micros.store(elapsed.as_micros() as u64, Ordering::Relaxed);
        self.metrics.restored_allocs.store(restored, Ordering::Relaxed);
        tracing::info!(
            allocs = restored,
            elapsed_ms = elapsed.as_millis() as u64,
            "restored allocations"
        );
        Ok(())
    }

    /// Restores one allocation and starts it; false if it could not be.
    async fn restore_one(self: Arc<Self>, stored: StoredAlloc) -> bool {
        let id = stored.alloc.id.clone();
        let runner = match self.new_runner(stored.alloc.clone()) {
            Ok(runner) => runner,
            Err(error) => {
                tracing::error!(alloc_id = %id, %error, "cannot restore allocation; its records are kept");
                return false;
            }
        };
        if let Err(error) = self.ports.lock().hold(&id, &stored.alloc.ports) {
            tracing::error!(alloc_id = %id, %error, "a restored allocation's port is held by another");
        }
        if let Err(error) = runner.restore(&stored).await {
            tracing::error!(alloc_id = %id, %error, "restoring allocation failed; marking it failed");
            runner.set_client_status(
                ClientStatus::Failed,
                &format!("could not be restored: {error}"),
            );
        }
        self.adopt(runner);
        true
    }

    fn new_runner(&self, alloc: Allocation) -> Result<AllocRunner, AllocError> {
        let alloc_root = self.config.alloc_root(&alloc.id);
        let mut config = AllocRunnerConfig::new(alloc, Arc::new(self.store.clone()), alloc_root)
            .with_drivers(self.drivers.clone())
            .with_clock(self.clock.clone())
            .with_max_kill_timeout(self.config.max_kill_timeout)
            .with_logs(LogLimits {
                max_files: self.config.logs.max_files,
                max_file_bytes: self.config.logs.max_file_mb << 20,
            });
        config.task_hooks = self.task_hooks.clone();
        config.spare_dirs = self.spare_dirs.clone();
        config.health = self.health.clone();
        config.template_sources = Some(self.variables.clone());
        config.host_volumes = self.host_volumes.clone();
        AllocRunner::new(config)
    }

    /// Takes an allocation under management and runs it.
    fn adopt(&self, runner: AllocRunner) {
        let order = self.next_order.fetch_add(1, Ordering::Relaxed);
        let alloc = runner.alloc();
        let needed = alloc
            .job
            .group(&alloc.task_group)
            .map_or(Amount::ZERO, |group| self.resources.needed(group));
        let restarts_before = restarts(&runner);
        self.allocs.write().insert(
            runner.id().to_owned(),
            Managed { runner: runner.clone(), order, needed, restarts_before },
        );
        let ports = self.ports.clone();
        tokio::spawn(async move {
            runner.run().await;
            // Its ports go back once it has ended; an agent leaving keeps them held, and the
            // next agent holds them again from the record.
            if !runner.lifecycle().shutting_down() {
                ports.lock().release(runner.id());
            }
        });
    }

    /// Accepts a job: checks it against this node's drivers, persists it as a new allocation
    /// of its first group and starts it. Returns the allocation's id.
    pub async fn submit(&self, job: Job) -> Result<String, AgentError> {
        self.submit_as(job, None).await.map(|(id, _)| id)
    }

    /// [`Agent::submit`] under an id the caller chose (a dispatcher names its work), or a new
    /// one. Submitting the same job under the same id again is accepted and changes nothing,
    /// so a caller that lost the answer can retry; the flag says whether it was new.
    pub async fn submit_as(
        &self,
        job: Job,
        id: Option<String>,
    ) -> Result<(String, bool), AgentError> {
        if let Some(id) = &id {
            wharf_state::check_alloc_id(id)?;
        }
        job.validate()?;
        job.check_drivers(|name| self.drivers.get(name).is_some())?;
        let mut problems = Vec::new();
        for group in &job.groups {
            for (index, task) in group.tasks.iter().enumerate() {
                if let Some(driver) = self.drivers.get(&task.driver)
                    && let Err(error) = driver.validate_config(&task.config)
                {
                    problems.push(wharf_state::spec::FieldProblem {
                        field: format!("group.task[{index}].{}", field_of(&error)),
                        message: error.to_string(),
                    });
                }
            }
        }
        if !problems.is_empty() {
            return Err(SpecError { problems }.into());
        }
        let mut alloc = Allocation {
            id: id.unwrap_or_else(new_alloc_id),
            task_group: job.groups[0].name.clone(),
            job,
            desired_status: DesiredStatus::Run,
            modify_index: 1,
            deployment_id: None,
            ports: Vec::new(),
        };
        // Held from the check until the allocation is managed, so two submissions of one id
        // cannot both pass it.
        let _claim = match self.claim_id(&alloc)? {
            Claim::Taken => return Ok((alloc.id, false)),
            Claim::Ours(claim) => claim,
        };
        // Refused before anything of it is written: resources, then ports.
        let _admitted = self.admit(&alloc.job.groups[0])?;
        let ports = self.claim_ports(&mut alloc)?;
        let runner = self.new_runner(alloc.clone())?;
        // Durable before the caller hears of it (and written once: the runner knows), with
        // the ports it holds.
        runner.persist().await?;
        self.metrics.allocs_submitted.fetch_add(1, Ordering::Relaxed);
        tracing::info!(alloc_id = %alloc.id, job_id = %alloc.job.id, ports = ?alloc.ports, "allocation accepted");
        self.adopt(runner);
        ports.keep();
        Ok((alloc.id, true))
    }

    /// Reserves `alloc`'s id, or says it names the same job already.
    fn claim_id(&self, alloc: &Allocation) -> Result<Claim<'_>, AgentError> {
        let mut claimed = self.claimed.lock();
        if let Some(existing) = self.allocs.read().get(&alloc.id) {
            return if existing.runner.alloc().job == alloc.job {
                Ok(Claim::Taken)
            } else {
                Err(AgentError::IdTaken(alloc.id.clone()))
            };
        }
        if !claimed.insert(alloc.id.clone()) {
            return Err(AgentError::IdTaken(alloc.id.clone()));
        }
        Ok(Claim::Ours(IdClaim { agent: self, id: alloc.id.clone() }))
    }

    /// Every allocation, oldest first.
    pub fn list(&self) -> Vec<AllocRunner> {
        oldest_first(&self.allocs.read())
    }

    /// One allocation.
    pub fn get(&self, id: &str) -> Result<AllocRunner, AgentError> {
        self.allocs
            .read()
            .get(id)
            .map(|m| m.runner.clone())
            .ok_or_else(|| AgentError::UnknownAlloc(id.to_owned()))
    }

    /// Asks an allocation to stop: its tasks are killed in order and poststop tasks run.
    /// Returns once the stop is durable, so an acknowledged stop survives a crash of the
    /// agent (the next agent kills what still runs). Stopping a stopped allocation changes
    /// nothing.
    pub async fn stop(&self, id: &str) -> Result<(), AgentError> {
        let runner = self.get(id)?;
        let mut alloc = runner.alloc();
        if alloc.server_terminal() {
            return Ok(());
        }
        alloc.desired_status = DesiredStatus::Stop;
        alloc.modify_index += 1;
        runner.update_durably(alloc).await?;
        Ok(())
    }

    /// Stops every allocation of `ids` at once: their stops are made durable concurrently,
    /// so the store's group commit takes them in one or a few commits rather than one each.
    /// Returns once every stop is durable (or has failed), each id with its own outcome, in
    /// the order asked; an id repeated is stopped once and answered once.
    pub async fn stop_many(&self, ids: &[String]) -> Vec<(String, Result<(), AgentError>)> {
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<&String> = ids.iter().filter(|id| seen.insert(id.as_str())).collect();
        let outcomes =
            futures_util::future::join_all(distinct.iter().map(|id| self.stop(id))).await;
        distinct.into_iter().cloned().zip(outcomes).collect()
    }

    /// Removes finished allocations (records and directories), oldest first: all beyond
    /// `gc.max_allocs`, and any finished longer ago than `gc.max_age`. Returns their ids.
    pub async fn gc(&self) -> Vec<String> {
        let now = self.clock.now();
        let finished: Vec<(Timestamp, AllocRunner)> = self
            .list()
            .into_iter()
            .filter(|r| r.is_done() && r.state().client_status.is_terminal())
            .map(|r| {
                let state = r.state();
                let at =
                    state.task_states.values().filter_map(|t| t.finished_at).max().unwrap_or(now);
                (at, r)
            })
            .collect();
        let mut removed = Vec::new();
        for runner in collectable(finished, now, &self.config.gc) {
            self.destroy_containers(runner.id()).await;
            runner.destroy().await;
            {
                // Counted under the lock a scrape reads the allocations under, so the
                // total never goes down.
                let mut allocs = self.allocs.write();
                if let Some(managed) = allocs.remove(runner.id()) {
                    let restarts = managed.restarts_since_adopted();
                    self.metrics.collected_task_restarts.fetch_add(restarts, Ordering::Relaxed);
                }
                let runs = runner.check_runs();
                self.metrics.collected_check_runs.fetch_add(runs, Ordering::Relaxed);
            }
            tracing::info!(alloc_id = %runner.id(), "garbage-collected allocation");
            removed.push(runner.id().to_owned());
        }
        if let Some(containers) = &self.containers {
            let kept = crate::container::images_named(self.list().iter().map(|r| r.alloc()));
            crate::container::collect_images(containers, kept).await;
        }
        removed
    }

    /// Destroys the containers of a finished allocation before its directory goes: the
    /// destroy its task's end started may still be unmounting a root in it.
    async fn destroy_containers(&self, alloc_id: &str) {
        let Some(containers) = &self.containers else { return };
        let limit = CONTAINER_DESTROY_TIMEOUT;
        match tokio::time::timeout(limit, containers.destroy_alloc_containers(alloc_id)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%alloc_id, %error, "cannot destroy its containers"),
            Err(_) => tracing::warn!(%alloc_id, ?limit, "its containers' destroy did not finish"),
        }
    }

    /// Runs [`Agent::gc`] every `gc.interval` until `stop` is raised.
    pub async fn gc_loop(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(self.config.gc.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            self.gc().await;
        }
    }

    /// Leaves every task running and stops managing them; the next agent reattaches.
    pub async fn shutdown(&self) {
        let mut stopping = JoinSet::new();
        for runner in self.list() {
            stopping.spawn(async move { runner.shutdown().await });
        }
        while stopping.join_next().await.is_some() {}
        // Ended tasks' cgroups and run directories, still queued, are freed before the agent
        // exits; past the limit they are its successor's sweep's.
        if !wharf_exec::housekeeping::finish(HOUSEKEEPING_LIMIT).await {
            tracing::warn!(limit = ?HOUSEKEEPING_LIMIT, "ended tasks not all freed; the next start sweeps them");
        }
        tracing::info!("agent shut down; tasks left running");
    }

    /// The runner-list protocol (DESIGN.md): one line per allocation that is not terminal,
    /// and `broken` when this node cannot run work.
    pub async fn probe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .list()
            .into_iter()
            .filter(|r| !r.state().client_status.is_terminal() && !r.is_done())
            .map(|r| r.id().to_owned())
            .collect();
        if let Some(reason) = self.broken().await {
            tracing::warn!(%reason, "node cannot run work");
            lines.push("broken".into());
        }
        lines
    }

    /// Why the node cannot run work, if it cannot: the store's last commit failed, the data dir
    /// is not writable (or full), or no driver is healthy.
    pub async fn broken(&self) -> Option<String> {
        if let Some(error) = self.store.failing() {
            return Some(format!("the state store cannot persist: {error}"));
        }
        // A file of its own per check: probes that overlap (a prober that restarted, and its
        // successor) must not remove each other's file and take that for a failure.
        static CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = self.config.data_dir.join(format!(".probe.{n}"));
        if let Err(e) = std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe)) {
            return Some(format!(
                "data dir {} is not writable: {e}",
                self.config.data_dir.display()
            ));
        }
        (!self.has_healthy_driver().await).then(|| "no healthy driver".to_owned())
    }

    /// Whether a driver is healthy, as a probe asks many times a second. A fingerprint can
    /// cost milliseconds (the container driver's runs its runtime and makes an overlay mount),
    /// so a healthy driver seen within [`DRIVER_HEALTH_FRESH`] answers; a node without one
    /// looks again at every probe, and is back as soon as a driver is.
    async fn has_healthy_driver(&self) -> bool {
        if self.healthy_driver_seen.fresh(tokio::time::Instant::now()) {
            return true;
        }
        for name in self.drivers.names() {
            if let Some(driver) = self.drivers.get(name)
                && driver.fingerprint().await.health == Health::Healthy
            {
                self.healthy_driver_seen.saw(tokio::time::Instant::now());
                return true;
            }
        }
        false
    }

    /// What the node has, keeps, gives and has left, and its drivers' health (`GET /v1/node`).
    pub async fn node_status(&self) -> NodeStatus {
        let (allocated, allocations) = self.allocated();
        let resources = &self.resources;
        let mut drivers = BTreeMap::new();
        for name in self.drivers.names() {
            if let Some(driver) = self.drivers.get(name) {
                drivers.insert(name.to_owned(), driver.fingerprint().await);
            }
        }
        NodeStatus {
            cpu: crate::usage::NodeCpuStatus {
                cores: resources.cores,
                mhz_per_core: resources.mhz_per_core,
                total_mhz: resources.total.cpu_mhz,
            },
            memory_mb: resources.total.memory_mb,
            reserved: resources.reserved,
            reserved_cores: resources.reserved_cores.clone(),
            allocated,
            allocations,
            free: resources.allocatable().saturating_sub(allocated),
            cgroups: CgroupsStatus::of(&self.cgroups),
            drivers,
        }
    }

    /// The Prometheus text for `/v1/metrics`: the agent's counters, the allocations by status
    /// and health with their checks, the node's resources, and every running task's usage.
    pub async fn metrics_text(&self) -> String {
        let mut usages = Vec::new();
        for runner in self.list().into_iter().filter(|r| !r.is_done()) {
            for (task, usage) in runner.usage().await.tasks {
                usages.push((runner.id().to_owned(), task, usage));
            }
        }
        let node = self.node_status().await;
        let (runners, mut check_runs, restarts) = {
            let allocs = self.allocs.read();
            let restarts = self.metrics.collected_task_restarts.load(Ordering::Relaxed)
                + allocs.values().map(Managed::restarts_since_adopted).sum::<u64>();
            (
                oldest_first(&allocs),
                self.metrics.collected_check_runs.load(Ordering::Relaxed),
                restarts,
            )
        };
        let mut tally = AllocTally::default();
        for runner in runners {
            check_runs += runner.check_runs();
            tally.add(runner.id(), &runner.state(), &runner.checks());
        }
        let mut families = self.metrics.families();
        families.extend(self.store_and_service_families(restarts, check_runs));
        families.extend(tally.families());
        families.extend(crate::usage::node_series(&node));
        families.extend(crate::usage::task_series(&usages));
        crate::metrics::render(&families)
    }

    /// The series read from the agent's parts at scrape time: task restarts and check runs
    /// (counted by the caller), the store's commits, the catalog's services, the ports held.
    fn store_and_service_families(&self, restarts: u64, check_runs: u64) -> Vec<Family<'static>> {
        let stats = self.store.stats();
        vec![
            Family::single(
                "wharf_task_restarts_total",
                "Task restarts.",
                MetricKind::Counter,
                restarts as f64,
            ),
            Family::single(
                "wharf_store_commits_total",
                "Durable commits of the state store.",
                MetricKind::Counter,
                stats.commits as f64,
            ),
            Family::single(
                "wharf_store_writes_total",
                "Writes committed (several share a commit).",
                MetricKind::Counter,
                stats.writes as f64,
            ),
            Family::single(
                "wharf_store_commit_seconds_total",
                "Time spent committing.",
                MetricKind::Counter,
                stats.commit_micros as f64 / 1e6,
            ),
            Family::single(
                "wharf_services",
                "Services of running tasks in the node's catalog.",
                MetricKind::Gauge,
                self.catalog().len() as f64,
            ),
            Family::single(
                "wharf_ports_held",
                "Ports held by allocations.",
                MetricKind::Gauge,
                self.ports_held() as f64,
            ),
            Family::single(
                "wharf_check_runs_total",
                "Runs of the checks of the allocations on this node since the agent started.",
                MetricKind::Counter,
                check_runs as f64,
            ),
        ]
    }
}

/// Opens the store; a damaged one is refused, or with `reset_state` moved aside.
fn open_store(config: &NodeConfig, options: StartOptions) -> Result<RedbStore, AgentError> {
    let path = config.store_path();
    match RedbStore::open(&path) {
        Err(StoreError::Corrupt { detail, .. }) if options.reset_state => {
            let mut aside = path.clone().into_os_string();
            aside.push(format!(".damaged-{}", SystemClock.now().0));
            let aside = PathBuf::from(aside);
            std::fs::rename(&path, &aside)
                .map_err(|source| AgentError::Io { path: path.clone(), source })?;
            tracing::warn!(path = %path.display(), moved_to = %aside.display(), %detail, "state store was damaged; starting empty");
            Ok(RedbStore::open(&path)?)
        }
        Err(StoreError::Corrupt { path, detail }) => Err(AgentError::DamagedStore { path, detail }),
        other => Ok(other?),
    }
}

fn build_drivers(
    config: &NodeConfig,
    cgroups: &TaskCgroups,
    containers: Option<Arc<wharf_container::ContainerDriver>>,
) -> DriverRegistry {
    let mut drivers = DriverRegistry::new();
    if let Some(driver) = containers {
        drivers.register(driver);
    }
    // Both drivers run tasks under the same shim.
    let options = wharf_exec::RawExecOptions {
        shim_path: config.drivers.raw_exec.shim_path.clone(),
        ..wharf_exec::RawExecOptions::default()
    };
    if config.drivers.raw_exec.enabled {
        let driver = wharf_exec::RawExecDriver::new(options.clone()).with_cgroups(cgroups.clone());
        drivers.register(Arc::new(driver));
    }
    if config.drivers.exec.enabled {
        match config.drivers.exec.options(&config.data_dir) {
            Ok(exec) => {
                let driver =
                    wharf_exec::ExecDriver::new(options, exec).with_cgroups(cgroups.clone());
                drivers.register(Arc::new(driver));
            }
            Err(error) => tracing::error!(%error, "the exec driver is not available"),
        }
    }
    drivers
}

/// `config.command` from a driver's InvalidConfig, or `config` otherwise.
fn field_of(error: &wharf_driver::DriverError) -> String {
    match error {
        wharf_driver::DriverError::InvalidConfig { field, .. } if field.starts_with("config") => {
            field.clone()
        }
        _ => "config".into(),
    }
}

/// A random (version 4) UUID.
pub fn new_alloc_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).unwrap_or_else(|_| {
        // No entropy source: fall back to the clock, still unique per process and moment.
        let now = SystemClock.now().0.to_le_bytes();
        bytes[..8].copy_from_slice(&now);
        bytes[8..].copy_from_slice(&std::process::id().to_le_bytes().repeat(2));
    });
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Which finished allocations the garbage collector removes, from when each ended: the
/// oldest beyond `gc.max_allocs`, and any that ended more than `gc.max_age` before `now`;
/// oldest first (allocations that ended at the same time, in the order given).
fn collectable<T>(mut finished: Vec<(Timestamp, T)>, now: Timestamp, gc: &GcConfig) -> Vec<T> {
    finished.sort_by_key(|(at, _)| *at);
    let excess = finished.len().saturating_sub(gc.max_allocs);
    finished
        .into_iter()
        .enumerate()
        .filter(|(index, (at, _))| *index < excess || now.since(*at) > gc.max_age)
        .map(|(_, (_, alloc))| alloc)
        .collect()
}

/// The managed allocations' runners, oldest first.
fn oldest_first(allocs: &BTreeMap<String, Managed>) -> Vec<AllocRunner> {
    let mut managed: Vec<&Managed> = allocs.values().collect();
    managed.sort_by_key(|m| m.order);
    managed.into_iter().map(|m| m.runner.clone()).collect()
}

/// How long the GC waits for a collected allocation's containers to be destroyed (each runtime
/// command is bounded on its own; this bounds them together).
const CONTAINER_DESTROY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait between checks for things that have no notification (log files).
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocation's name and how many minutes ago it ended.
    type Ended = (&'static str, u64);

    /// A healthy driver answers the run probe's health question for a while, then is asked
    /// again; nothing seen is never fresh.
    #[test]
    fn a_healthy_driver_is_fresh_for_a_while_then_asked_again() {
        let seen = HealthySeen::default();
        let now = tokio::time::Instant::now();
        assert!(!seen.fresh(now));
        seen.saw(now);
        assert!(seen.fresh(now));
        assert!(seen.fresh(now + DRIVER_HEALTH_FRESH - Duration::from_millis(1)));
        assert!(!seen.fresh(now + DRIVER_HEALTH_FRESH));
    }

    /// Which finished allocations one collection removes, with at most two kept and none
    /// kept more than an hour; each row lists `(name, minutes ago it ended)`.
    #[test]
    fn collectable_table() {
        let gc =
            GcConfig { max_allocs: 2, max_age: Duration::from_secs(3600), ..GcConfig::default() };
        let now = Timestamp(10 * 3_600_000);
        let table: [(&[Ended], &[&str]); 7] = [
            (&[], &[]),
            (&[("a", 5), ("b", 1)], &[]),
            (&[("a", 5), ("b", 1), ("c", 3)], &["a"]),
            (&[("a", 1), ("b", 2), ("c", 3), ("d", 4)], &["d", "c"]),
            (&[("old", 61), ("new", 1)], &["old"]),
            (&[("at the hour", 60), ("new", 1)], &[]),
            (&[("x", 90), ("y", 70), ("z", 2), ("w", 200)], &["w", "x", "y"]),
        ];
        for (finished, removed) in table {
            let ended: Vec<(Timestamp, &str)> = finished
                .iter()
                .map(|(name, minutes)| (Timestamp(now.0 - minutes * 60_000), *name))
                .collect();
            assert_eq!(collectable(ended, now, &gc), removed, "{finished:?}");
        }
    }
}
