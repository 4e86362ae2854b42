//! Jobs, task groups and tasks: what a user writes, parsed and validated.
//!
//! A job spec file holds one job header and one task group (see DESIGN.md). Field names follow
//! Nomad's job spec. [`parse_toml`] and [`parse_json`] read a file into a [`Job`] and validate
//! it; every error names the field it is about, such as `group.task[1].restart.interval`.
//! Which drivers exist is not known here: [`Job::check_drivers`] takes that from the caller.

use crate::artifact::{self, Artifact};
use crate::duration;
pub use crate::job_type::JobType;
use crate::lifetime;
use crate::problems::Problems;
pub use crate::problems::{FieldProblem, SpecError};
use crate::readiness;
use crate::reschedule::{RescheduleOverrides, ReschedulePolicy};
use crate::service::{self, Network, PortSpec, Service, UpdateStrategy};
use crate::signal::Signal;
use crate::template::{self, Template};
use crate::volume::{self, VolumeMount, VolumeRequest};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// A job: an id, a type and its task groups. An allocation runs one of the groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// The job's id, as the user named it.
    pub id: String,
    /// Service, batch, system or sysbatch.
    #[serde(rename = "type")]
    pub job_type: JobType,
    /// The groups; a spec file has exactly one.
    pub groups: Vec<TaskGroup>,
}

/// Tasks that are placed, started and stopped together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskGroup {
    /// The group's name, unique within the job.
    pub name: String,
    /// Restart settings for every task of the group; a task's own settings win.
    #[serde(default, skip_serializing_if = "RestartOverrides::is_empty")]
    pub restart: RestartOverrides,
    /// The ports an allocation of the group holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// How the allocation's health is judged; Nomad's defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<UpdateStrategy>,
    /// How a fleet places the group again after it is lost with its worker or fails there;
    /// unset fields take the job type's defaults.
    #[serde(default, skip_serializing_if = "RescheduleOverrides::is_empty")]
    pub reschedule: RescheduleOverrides,
    /// The longest an allocation of the group runs: then it is stopped, and its poststop
    /// tasks are skipped. None: no limit.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub max_run_duration: Option<Duration>,
    /// How long the group's services are out of the catalog before its tasks are killed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub shutdown_delay: Option<Duration>,
    /// The node's host volumes the group asks for, by the name its tasks mount them under.
    #[serde(default, rename = "volume", skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, VolumeRequest>,
    /// The tasks, in the order the user wrote them.
    #[serde(rename = "task")]
    pub tasks: Vec<Task>,
}

/// One process (or container, or VM) run by a driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique within the group; also a directory name, so `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    /// The driver that runs it, such as `raw_exec`.
    pub driver: String,
    /// Driver-specific settings, checked by the driver before start.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Environment variables; values may refer to others as `${NAME}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// When the leader dies, the other tasks of the group are killed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leader: bool,
    /// Prestart, poststart or poststop, and whether it is a sidecar. None: a main task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// How long to wait after `kill_signal` before killing for good.
    #[serde(default = "default_kill_timeout", with = "duration::serde_str")]
    pub kill_timeout: Duration,
    /// The signal that asks the task to stop.
    #[serde(default = "default_kill_signal")]
    pub kill_signal: Signal,
    /// Restart settings; unset fields come from the group, then from the job type's defaults.
    #[serde(default, skip_serializing_if = "RestartOverrides::is_empty")]
    pub restart: RestartOverrides,
    /// What the task may use.
    #[serde(default)]
    pub resources: Resources,
    /// The services it offers, with their checks.
    #[serde(default, rename = "service", skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<Service>,
    /// Files rendered before it starts and again when what they read changes.
    #[serde(default, rename = "template", skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<Template>,
    /// How long the task's services are out of the catalog before it is sent its kill
    /// signal, on a stop and on a restart.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub shutdown_delay: Option<Duration>,
    /// What is fetched into its directory before it starts.
    #[serde(default, rename = "artifact", skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Where it mounts its group's volumes.
    #[serde(default, rename = "volume_mount", skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Tasks of the group whose checks must all pass before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wait_healthy: Vec<String>,
    /// Tasks of the group that must each have said `READY=1` on their `NOTIFY_SOCKET` (they
    /// set `notify_socket`) before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wait_ready: Vec<String>,
    /// The task gets a unix datagram socket of its own in `NOTIFY_SOCKET`, on which it says
    /// `READY=1` once ready (systemd's notify protocol), for the tasks that `wait_ready` on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_socket: bool,
    /// How long this task waits for `wait_healthy` and `wait_ready` before the allocation
    /// fails; unset: [`crate::readiness::DEFAULT_WAIT_DEADLINE`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub wait_deadline: Option<Duration>,
}

/// A task may not be called this: `<alloc dir>/alloc` is the directory its group shares.
pub const RESERVED_TASK_NAME: &str = "alloc";

/// The default `kill_timeout`, as in Nomad.
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);

fn default_kill_timeout() -> Duration {
    DEFAULT_KILL_TIMEOUT
}

/// The default `kill_signal`: SIGINT, as in Nomad, so that ported jobs stop the same way.
pub const DEFAULT_KILL_SIGNAL: Signal = Signal::Int;

fn default_kill_signal() -> Signal {
    DEFAULT_KILL_SIGNAL
}

/// When a task runs relative to the group's main tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// The stage it is attached to.
    pub hook: LifecycleHook,
    /// Keeps running beside the main tasks instead of running to completion.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sidecar: bool,
}

/// The lifecycle stage a non-main task is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleHook {
    /// Before the main tasks.
    Prestart,
    /// Once the main tasks run.
    Poststart,
    /// After every other task is dead.
    Poststop,
}

/// Where a task stands in the group's start order; derived from [`Task::lifecycle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// A prestart task that runs to completion before the main tasks.
    PrestartEphemeral,
    /// A prestart task that keeps running beside the main tasks.
    PrestartSidecar,
    /// A task with no lifecycle block.
    Main,
    /// A poststart task that runs to completion.
    PoststartEphemeral,
    /// A poststart task that keeps running.
    PoststartSidecar,
    /// A task that runs once every other task is dead.
    Poststop,
}

impl Stage {
    /// Sidecars are killed last and do not keep an allocation alive on their own.
    pub fn is_sidecar(self) -> bool {
        matches!(self, Stage::PrestartSidecar | Stage::PoststartSidecar)
    }
}

/// What a task may use of the node, with Nomad's field names.
///
/// `memory` is the reservation the node admits the task on and, without `memory_max`, its hard
/// limit; `memory_max` (oversubscription) raises the hard limit above the reservation. `cpu` is
/// a share in MHz (a relative weight, and with the driver's `cpu_hard_limit` a quota); `cores`
/// reserves whole cores for the task alone, and then `cpu` does not count. The name
/// `memory_mb` of earlier wharf versions is still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU in MHz, used as a relative share.
    #[serde(default = "Resources::default_cpu")]
    pub cpu: u32,
    /// Memory in MiB: what the node reserves for the task, and its limit unless `memory_max`
    /// is set.
    #[serde(default = "Resources::default_memory", alias = "memory_mb")]
    pub memory: u32,
    /// A hard memory limit in MiB above `memory`, for tasks that may use more for a while.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u32>,
    /// Whole CPU cores reserved for this task alone; 0 for none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cores: u32,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

impl Resources {
    fn default_cpu() -> u32 {
        100
    }
    fn default_memory() -> u32 {
        300
    }

    /// The hard memory limit in MiB: `memory_max` if set, else `memory`.
    pub fn memory_limit(&self) -> u32 {
        self.memory_max.unwrap_or(self.memory).max(self.memory)
    }

    /// The problems with these values, as `(field, message)` with the field relative to the
    /// `resources` block.
    fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.cpu == 0 {
            problems.push(("cpu", "must be at least 1".to_owned()));
        }
        if self.memory == 0 {
            problems.push(("memory", "must be at least 1".to_owned()));
        }
        if let Some(max) = self.memory_max
            && max < self.memory
        {
            problems.push((
                "memory_max",
                format!(
                    "{max} MiB is below `memory` ({} MiB); it is a limit above the reservation",
                    self.memory
                ),
            ));
        }
        problems
    }
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpu: Self::default_cpu(),
            memory: Self::default_memory(),
            memory_max: None,
            cores: 0,
        }
    }
}

/// What to do once a task has used up its restart attempts within the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    /// The task fails.
    Fail,
    /// Wait for the rest of the interval, then start counting again.
    Delay,
}

/// A complete restart policy, as the task runner applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartPolicy {
    /// Restarts allowed within one interval.
    pub attempts: u32,
    /// The window attempts are counted in.
    #[serde(with = "duration::serde_str")]
    pub interval: Duration,
    /// Wait before each restart (plus up to 25% jitter).
    #[serde(with = "duration::serde_str")]
    pub delay: Duration,
    /// What happens when attempts run out.
    pub mode: RestartMode,
}

impl RestartPolicy {
    /// Nomad's defaults: services 2 attempts in 30m, batch 3 in 24h; 15s delay; mode fail.
    pub fn defaults_for(job_type: JobType) -> RestartPolicy {
        let (attempts, interval) = if job_type.runs_to_completion() {
            (3, Duration::from_secs(24 * 3600))
        } else {
            (2, Duration::from_secs(30 * 60))
        };
        RestartPolicy {
            attempts,
            interval,
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        }
    }

    /// Applies the fields `overrides` sets.
    pub fn with(mut self, overrides: &RestartOverrides) -> RestartPolicy {
        self.attempts = overrides.attempts.unwrap_or(self.attempts);
        self.interval = overrides.interval.unwrap_or(self.interval);
        self.delay = overrides.delay.unwrap_or(self.delay);
        self.mode = overrides.mode.unwrap_or(self.mode);
        self
    }

    /// Nomad's rules: an interval of at least 5s, `attempts * delay <= interval`, and
    /// zero attempts only with mode fail (otherwise it is ambiguous).
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.interval < MIN_RESTART_INTERVAL {
            problems.push(format!(
                "interval {} is shorter than the minimum of {}",
                duration::Formatted(self.interval),
                duration::Formatted(MIN_RESTART_INTERVAL)
            ));
        }
        if self.attempts == 0 && self.mode != RestartMode::Fail {
            problems.push("0 attempts with mode \"delay\" is ambiguous; use mode \"fail\"".into());
        }
        let needed = self.delay.checked_mul(self.attempts).unwrap_or(Duration::MAX);
        if needed > self.interval {
            problems.push(format!(
                "{} attempts with a delay of {} do not fit in the interval of {}",
                self.attempts,
                duration::Formatted(self.delay),
                duration::Formatted(self.interval)
            ));
        }
        problems
    }
}

/// The shortest restart interval a policy may have.
pub const MIN_RESTART_INTERVAL: Duration = Duration::from_secs(5);

/// Restart settings as written in a spec: each field may be left to the level above.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartOverrides {
    /// Restarts allowed within one interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The window attempts are counted in.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub interval: Option<Duration>,
    /// Wait before each restart.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub delay: Option<Duration>,
    /// What happens when attempts run out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RestartMode>,
}

impl RestartOverrides {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        *self == RestartOverrides::default()
    }
}

impl Task {
    /// A main task called `name`, run by `driver`, with an empty `config` block and Nomad's
    /// defaults for the rest (a 5s kill timeout, SIGINT, the job type's restart policy).
    ///
    /// ```
    /// use wharf_state::{LifecycleHook, Task};
    ///
    /// let init = Task::new("init", "raw_exec")
    ///     .with_config("command", "/bin/sh")
    ///     .with_config("args", ["-c", "echo ready"])
    ///     .with_lifecycle(LifecycleHook::Prestart, false);
    /// assert_eq!(init.config["args"][1], "echo ready");
    /// ```
    pub fn new(name: impl Into<String>, driver: impl Into<String>) -> Task {
        Task {
            name: name.into(),
            driver: driver.into(),
            config: serde_json::Map::new(),
            env: BTreeMap::new(),
            leader: false,
            lifecycle: None,
            kill_timeout: DEFAULT_KILL_TIMEOUT,
            kill_signal: DEFAULT_KILL_SIGNAL,
            restart: RestartOverrides::default(),
            resources: Resources::default(),
            services: Vec::new(),
            templates: Vec::new(),
            shutdown_delay: None,
            artifacts: Vec::new(),
            volume_mounts: Vec::new(),
            wait_healthy: Vec::new(),
            wait_ready: Vec::new(),
            notify_socket: false,
            wait_deadline: None,
        }
    }

    /// Sets `key` of the driver's `config` block.
    pub fn with_config(
        mut self,
        key: impl Into<String>,
        value: impl Into<serde_json::Value>,
    ) -> Task {
        self.config.insert(key.into(), value.into());
        self
    }

    /// Sets an environment variable.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Task {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Makes it the group's leader: when it dies, the other tasks are killed.
    pub fn as_leader(mut self) -> Task {
        self.leader = true;
        self
    }

    /// Attaches it to a lifecycle stage instead of running it as a main task.
    pub fn with_lifecycle(mut self, hook: LifecycleHook, sidecar: bool) -> Task {
        self.lifecycle = Some(Lifecycle { hook, sidecar });
        self
    }

    /// Sets the restart settings the task's own block would (unset fields come from the group
    /// and the job type).
    pub fn with_restart(mut self, restart: RestartOverrides) -> Task {
        self.restart = restart;
        self
    }

    /// Adds a service the task offers.
    pub fn with_service(mut self, service: Service) -> Task {
        self.services.push(service);
        self
    }

    /// Adds a template rendered before it starts.
    pub fn with_template(mut self, template: Template) -> Task {
        self.templates.push(template);
        self
    }

    /// The task's place in the group's start order.
    pub fn stage(&self) -> Stage {
        match self.lifecycle {
            None => Stage::Main,
            Some(Lifecycle { hook: LifecycleHook::Prestart, sidecar: false }) => {
                Stage::PrestartEphemeral
            }
            Some(Lifecycle { hook: LifecycleHook::Prestart, sidecar: true }) => {
                Stage::PrestartSidecar
            }
            Some(Lifecycle { hook: LifecycleHook::Poststart, sidecar: false }) => {
                Stage::PoststartEphemeral
            }
            Some(Lifecycle { hook: LifecycleHook::Poststart, sidecar: true }) => {
                Stage::PoststartSidecar
            }
            Some(Lifecycle { hook: LifecycleHook::Poststop, .. }) => Stage::Poststop,
        }
    }
}

impl TaskGroup {
    /// A group called `name` with `tasks`, in start order as a spec file lists them.
    pub fn new(name: impl Into<String>, tasks: impl IntoIterator<Item = Task>) -> TaskGroup {
        TaskGroup {
            name: name.into(),
            restart: RestartOverrides::default(),
            network: None,
            update: None,
            reschedule: RescheduleOverrides::default(),
            max_run_duration: None,
            shutdown_delay: None,
            volumes: BTreeMap::new(),
            tasks: tasks.into_iter().collect(),
        }
    }

    /// Adds port `label` to the group's network: `static_port`, or a dynamic one if None.
    pub fn with_port(mut self, label: impl Into<String>, static_port: Option<u16>) -> TaskGroup {
        let network = self.network.get_or_insert_with(Network::default);
        network.ports.insert(label.into(), PortSpec { static_port });
        self
    }

    /// Judges the health of its allocations by `update`.
    pub fn with_update(mut self, update: UpdateStrategy) -> TaskGroup {
        self.update = Some(update);
        self
    }
}

impl Job {
    /// A job with one group, as a spec file holds. It is not validated: call
    /// [`Job::validate`] before trusting a job built from outside input.
    ///
    /// ```
    /// use wharf_state::{Job, JobType, Task, TaskGroup};
    ///
    /// let job = Job::new("hello", JobType::Batch, TaskGroup::new("web", [Task::new("main", "mock")]));
    /// job.validate()?;
    /// # Ok::<(), wharf_state::SpecError>(())
    /// ```
    pub fn new(id: impl Into<String>, job_type: JobType, group: TaskGroup) -> Job {
        Job { id: id.into(), job_type, groups: vec![group] }
    }

    /// The group named `name`, if the job has it.
    pub fn group(&self, name: &str) -> Option<&TaskGroup> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// The restart policy a task of `group` runs under: the job type's defaults, then the
    /// group's settings, then the task's.
    pub fn restart_policy(&self, group: &TaskGroup, task: &Task) -> RestartPolicy {
        RestartPolicy::defaults_for(self.job_type).with(&group.restart).with(&task.restart)
    }

    /// How the health of an allocation of `group` is judged: its `update` block, or Nomad's
    /// defaults. None for jobs that run to completion, whose health nobody watches (as in
    /// Nomad, where only service and system jobs have deployments and migrations).
    pub fn health_strategy(&self, group: &TaskGroup) -> Option<UpdateStrategy> {
        if self.job_type.runs_to_completion() {
            return None;
        }
        Some(group.update.unwrap_or_default())
    }

    /// The reschedule policy of `group`: the job type's defaults, then the group's settings.
    pub fn reschedule_policy(&self, group: &TaskGroup) -> ReschedulePolicy {
        ReschedulePolicy::defaults_for(self.job_type).with(&group.reschedule)
    }

    /// Checks everything that can be checked without knowing the node: names, leaders,
    /// lifecycles, restart policies, environment. Returns every problem found, not just the first.
    pub fn validate(&self) -> Result<(), SpecError> {
        let mut problems = Problems::default();
        if let Err(problem) = check_job_id(&self.id) {
            problems.add("job.id", problem);
        }
        if self.groups.is_empty() {
            problems.add("group", "a job needs a task group".into());
        }
        let mut group_names = HashSet::new();
        for (gi, group) in self.groups.iter().enumerate() {
            let at =
                if self.groups.len() == 1 { "group".to_owned() } else { format!("group[{gi}]") };
            check_name(&mut problems, &format!("{at}.name"), &group.name);
            if !group_names.insert(group.name.as_str()) {
                problems
                    .add(&format!("{at}.name"), format!("duplicate group name {:?}", group.name));
            }
            self.validate_group(&mut problems, &at, group);
        }
        problems.into_result()
    }

    fn validate_group(&self, problems: &mut Problems, at: &str, group: &TaskGroup) {
        for problem in self.reschedule_policy(group).problems() {
            problems.add(&format!("{at}.reschedule"), problem);
        }
        if let Some(network) = &group.network {
            service::validate_network(problems, at, network);
        }
        if let Some(update) = &group.update {
            service::validate_update(problems, at, update);
        }
        lifetime::validate_group(
            problems,
            at,
            group.max_run_duration,
            group.shutdown_delay,
            group.tasks.iter().map(|t| t.shutdown_delay),
        );
        volume::validate(
            problems,
            at,
            &group.volumes,
            group
                .tasks
                .iter()
                .enumerate()
                .map(|(ti, t)| (format!("{at}.task[{ti}]"), t.volume_mounts.as_slice())),
        );
        let waits: Vec<readiness::TaskWaits<'_>> = group
            .tasks
            .iter()
            .map(|t| readiness::TaskWaits {
                name: &t.name,
                wait_healthy: &t.wait_healthy,
                wait_ready: &t.wait_ready,
                notify_socket: t.notify_socket,
                wait_deadline: t.wait_deadline,
                has_checks: t.services.iter().any(|s| !s.checks.is_empty()),
            })
            .collect();
        readiness::validate(problems, at, &waits);
        if group.tasks.is_empty() {
            problems.add(&format!("{at}.task"), "a group needs at least one task".into());
        }
        let mut task_names = HashSet::new();
        let mut leaders = Vec::new();
        for (ti, task) in group.tasks.iter().enumerate() {
            let at = format!("{at}.task[{ti}]");
            check_name(problems, &format!("{at}.name"), &task.name);
            if task.name == RESERVED_TASK_NAME {
                problems.add(
                    &format!("{at}.name"),
                    format!("{RESERVED_TASK_NAME:?} is reserved: it names the directory the group's tasks share"),
                );
            }
            if !task.name.is_empty() && !task_names.insert(task.name.as_str()) {
                problems.add(&format!("{at}.name"), format!("duplicate task name {:?}", task.name));
            }
            if task.driver.is_empty() {
                problems.add(
                    &format!("{at}.driver"),
                    "a task needs a driver, such as \"raw_exec\"".into(),
                );
            }
            if task.leader {
                leaders.push(task.name.as_str());
            }
            if let Some(Lifecycle { hook: LifecycleHook::Poststop, sidecar: true }) = task.lifecycle
            {
                problems.add(
                    &format!("{at}.lifecycle.sidecar"),
                    "a poststop task cannot be a sidecar: it runs after every other task is dead"
                        .into(),
                );
            }
            for problem in self.restart_policy(group, task).problems() {
                problems.add(&format!("{at}.restart"), problem);
            }
            for (key, value) in &task.env {
                if key.is_empty() || key.contains(['=', '\0']) {
                    problems
                        .add(&format!("{at}.env"), format!("{key:?} is not a valid variable name"));
                }
                if value.contains('\0') {
                    problems
                        .add(&format!("{at}.env.{key}"), "values cannot contain NUL bytes".into());
                }
            }
            for (field, message) in task.resources.problems() {
                problems.add(&format!("{at}.resources.{field}"), message);
            }
            service::validate_services(problems, &at, &task.services, group.network.as_ref());
            template::validate(problems, &at, &task.templates);
            artifact::validate(problems, &at, &task.artifacts);
        }
        if leaders.len() > 1 {
            problems.add(
                &format!("{at}.task"),
                format!(
                    "only one task may be the leader, found {}: {}",
                    leaders.len(),
                    leaders.join(", ")
                ),
            );
        }
    }

    /// Fails for the first task whose driver `is_known` rejects, naming the task and driver.
    pub fn check_drivers(&self, is_known: impl Fn(&str) -> bool) -> Result<(), SpecError> {
        let mut problems = Problems::default();
        for (gi, group) in self.groups.iter().enumerate() {
            for (ti, task) in group.tasks.iter().enumerate() {
                if !is_known(&task.driver) {
                    let at = if self.groups.len() == 1 {
                        "group".to_owned()
                    } else {
                        format!("group[{gi}]")
                    };
                    problems.add(
                        &format!("{at}.task[{ti}].driver"),
                        format!("unknown driver {:?}", task.driver),
                    );
                }
            }
        }
        problems.into_result()
    }

    /// The job as a spec file body (job header plus its one group), for writing back out.
    /// Jobs with several groups write the first.
    pub fn to_spec(&self) -> SpecFile {
        SpecFile {
            job: JobHeader { id: self.id.clone(), job_type: self.job_type },
            group: self
                .groups
                .first()
                .cloned()
                .unwrap_or_else(|| TaskGroup::new(String::new(), Vec::new())),
        }
    }
}

/// The shape of a spec file: `[job]` and `[group]` with `[[group.task]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    /// The `[job]` table.
    pub job: JobHeader,
    /// The `[group]` table.
    pub group: TaskGroup,
}

/// The `[job]` table of a spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobHeader {
    /// The job's id.
    pub id: String,
    /// Service, batch, system or sysbatch.
    #[serde(rename = "type")]
    pub job_type: JobType,
}

impl From<SpecFile> for Job {
    fn from(spec: SpecFile) -> Job {
        Job { id: spec.job.id, job_type: spec.job.job_type, groups: vec![spec.group] }
    }
}

/// A job id names what people and dispatchers see, and may end up in paths and labels: 1 to
/// 128 bytes, with no `/`, no `..`, no spaces and no control characters.
fn check_job_id(id: &str) -> Result<(), String> {
    let fits = (1..=128).contains(&id.len())
        && !id.contains(['/', '\\'])
        && !id.contains("..")
        && id != "."
        && !id.chars().any(|c| c.is_whitespace() || c.is_control());
    if fits {
        Ok(())
    } else {
        Err(format!(
            "{id:?} must be 1 to 128 bytes, with no `/`, `\\`, `..`, spaces or control characters"
        ))
    }
}

fn check_name(problems: &mut Problems, field: &str, name: &str) {
    let valid = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        problems.add(
            field,
            format!("{name:?} must match [A-Za-z0-9_-]{{1,64}} (it becomes a directory name)"),
        );
    }
}

/// Reads and validates a TOML job spec.
pub fn parse_toml(text: &str) -> Result<Job, SpecError> {
    let deserializer = toml::Deserializer::parse(text).map_err(|e| single("", e.to_string()))?;
    finish(serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let field = e.path().to_string();
        single(&field, e.into_inner().to_string())
    }))
}

/// Reads and validates a JSON job spec (the same shape as the TOML one).
pub fn parse_json(text: &str) -> Result<Job, SpecError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let spec = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let field = e.path().to_string();
        single(&field, e.into_inner().to_string())
    })?;
    deserializer.end().map_err(|e| single("", e.to_string()))?;
    finish(Ok(spec))
}

fn finish(spec: Result<SpecFile, SpecError>) -> Result<Job, SpecError> {
    let job = Job::from(spec?);
    job.validate()?;
    Ok(job)
}

fn single(field: &str, message: String) -> SpecError {
    // serde_path_to_error writes "." for the root.
    let field = if field == "." { "" } else { field };
    SpecError {
        problems: vec![FieldProblem {
            field: field.to_owned(),
            message: message.trim_end().to_owned(),
        }],
    }
}
