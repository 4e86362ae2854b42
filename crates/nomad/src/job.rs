//! A Nomad job (the `api.Job` JSON that `nomad job run -output` prints and the HTTP API takes)
//! translated into wharf's spec: one wharf [`Job`] per task group, each run as `Count`
//! allocations. The fields that only choose among regions, datacenters, namespaces and
//! priorities are kept in [`NomadJob`] to be shown back; every field that would change how
//! tasks run and that wharf lacks is refused with its path (see the `fields` module).
//!
//! Tasks get Nomad's task environment through wharf's `${WHARF_*}` interpolation, so the
//! values are the ones wharf's own variables have: `NOMAD_TASK_DIR` is the task's `local/`
//! directory, as in Nomad.

use crate::NomadError;
use crate::fields::{Key, Obj, invalid};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use wharf_state::{ChangeMode, ChangeScript, Template, TemplateWait};
use wharf_state::{
    Check, CheckKind, CheckRestart, DelayFunction, HealthCheck, Job, JobType, Lifecycle,
    LifecycleHook, OnUpdate, RescheduleOverrides, Resources, RestartMode, RestartOverrides,
    Service, Signal, Task, TaskGroup, UpdateStrategy,
};

/// A registered Nomad job: what is shown back, and the wharf jobs its groups run as.
#[derive(Debug, Clone, PartialEq)]
pub struct NomadJob {
    /// `ID`.
    pub id: String,
    /// `Name`; the id when not given.
    pub name: String,
    /// `Type`: service, batch, system or sysbatch.
    pub job_type: JobType,
    /// `Namespace`; `default` when not given.
    pub namespace: String,
    /// `Region`; `global` when not given.
    pub region: String,
    /// `Datacenters`.
    pub datacenters: Vec<String>,
    /// `Priority`; 50 when not given.
    pub priority: u64,
    /// `Meta`.
    pub meta: BTreeMap<String, String>,
    /// Each task group, in the order written.
    pub groups: Vec<GroupPlan>,
    /// The job as submitted, with the defaults above filled in: what `GET /v1/job/:id` shows.
    pub submitted: Value,
}

/// One task group: how many allocations of it to run, and the wharf job each runs.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPlan {
    /// The group's name.
    pub name: String,
    /// `Count`: how many allocations.
    pub count: u32,
    /// A wharf job with this group alone, under the Nomad job's id.
    pub job: Job,
}

impl GroupPlan {
    /// The wharf job that allocation `index` of the group runs: the group's, with
    /// `NOMAD_ALLOC_INDEX` and `NOMAD_ALLOC_NAME` set for its tasks.
    pub fn instance(&self, job_name: &str, index: u32) -> Job {
        let mut job = self.job.clone();
        let name = alloc_name(job_name, &self.name, index);
        for group in &mut job.groups {
            for task in &mut group.tasks {
                task.env.insert("NOMAD_ALLOC_INDEX".into(), index.to_string());
                task.env.insert("NOMAD_ALLOC_NAME".into(), name.clone());
            }
        }
        job
    }
}

/// Nomad's allocation name: `<job>.<group>[<index>]`.
pub fn alloc_name(job_name: &str, group: &str, index: u32) -> String {
    format!("{job_name}.{group}[{index}]")
}

/// The job of a register request's body, `{"Job": {...}}`, or a bare job.
pub fn job_of_request(body: &Value) -> Result<&Value, NomadError> {
    match body.get("Job") {
        Some(job) if job.is_object() => Ok(job),
        Some(_) => Err(invalid("Job", "expected an object".into())),
        None if body.get("ID").is_some() => Ok(body),
        None => Err(invalid("Job", "the request has no job: send {\"Job\": {...}}".into())),
    }
}

/// The drivers a Nomad job may name, and the wharf driver each maps to.
pub const DRIVERS: &[(&str, &str)] =
    &[("raw_exec", "raw_exec"), ("exec", "exec"), ("docker", "container"), ("podman", "container")];

const JOB_KEYS: &[(&str, Key)] = &[
    ("ID", Key::Used),
    ("Name", Key::Used),
    ("Type", Key::Used),
    ("TaskGroups", Key::Used),
    ("Region", Key::Used),
    ("Namespace", Key::Used),
    ("Datacenters", Key::Used),
    ("Priority", Key::Used),
    ("Meta", Key::Used),
    ("NodePool", Key::Used),
    ("Update", Key::Used),
    ("Reschedule", Key::Used),
    ("Affinities", Key::Informs),
    ("Spreads", Key::Informs),
    ("AllAtOnce", Key::Informs),
    ("Migrate", Key::Informs),
    ("Status", Key::Informs),
    ("StatusDescription", Key::Informs),
    ("Stable", Key::Informs),
    ("Stop", Key::Informs),
    ("Version", Key::Informs),
    ("VersionTag", Key::Informs),
    ("SubmitTime", Key::Informs),
    ("CreateIndex", Key::Informs),
    ("ModifyIndex", Key::Informs),
    ("JobModifyIndex", Key::Informs),
    ("ParentID", Key::Informs),
    ("Dispatched", Key::Informs),
    ("UI", Key::Informs),
    ("NomadTokenID", Key::Informs),
    ("DispatchIdempotencyToken", Key::Informs),
    ("Constraints", Key::Refused("wharf does not place work by constraints")),
    ("Periodic", Key::Refused("wharf does not run periodic jobs")),
    ("ParameterizedJob", Key::Refused("wharf does not run parameterized jobs")),
    ("Payload", Key::Refused("wharf does not run dispatched jobs")),
    ("Multiregion", Key::Refused("wharf has one region")),
    ("VaultToken", Key::Refused("wharf has no Vault integration")),
    ("VaultNamespace", Key::Refused("wharf has no Vault integration")),
    ("ConsulToken", Key::Refused("wharf has no Consul integration")),
    ("ConsulNamespace", Key::Refused("wharf has no Consul integration")),
];

const GROUP_KEYS: &[(&str, Key)] = &[
    ("Name", Key::Used),
    ("Count", Key::Used),
    ("Tasks", Key::Used),
    ("RestartPolicy", Key::Used),
    ("ReschedulePolicy", Key::Used),
    ("Networks", Key::Used),
    ("Update", Key::Used),
    ("Meta", Key::Used),
    ("EphemeralDisk", Key::Informs),
    ("Migrate", Key::Informs),
    ("Scaling", Key::Informs),
    ("Affinities", Key::Informs),
    ("Spreads", Key::Informs),
    ("StopAfterClientDisconnect", Key::Informs),
    ("MaxClientDisconnect", Key::Informs),
    ("PreventRescheduleOnLost", Key::Informs),
    ("Disconnect", Key::Informs),
    ("Constraints", Key::Refused("wharf does not place work by constraints")),
    ("Volumes", Key::Refused("wharf reads host volumes from its own spec only (`volume`) for now")),
    (
        "Services",
        Key::Refused(
            "wharf's services belong to a task: move the service into the task that serves it",
        ),
    ),
    ("ShutdownDelay", Key::Used),
    // Which Consul cluster the group's services and templates would use (Nomad fills it in);
    // those are refused on their own, so the choice alone changes nothing.
    ("Consul", Key::Informs),
];

const TASK_KEYS: &[(&str, Key)] = &[
    ("Name", Key::Used),
    ("Driver", Key::Used),
    ("Config", Key::Used),
    ("Env", Key::Used),
    ("Resources", Key::Used),
    ("Services", Key::Used),
    ("Lifecycle", Key::Used),
    ("KillTimeout", Key::Used),
    ("KillSignal", Key::Used),
    ("RestartPolicy", Key::Used),
    ("Leader", Key::Used),
    ("Meta", Key::Used),
    ("LogConfig", Key::Informs),
    ("Affinities", Key::Informs),
    ("ScalingPolicies", Key::Informs),
    ("User", Key::Refused("wharf runs tasks as the driver's configured user")),
    ("Constraints", Key::Refused("wharf does not place work by constraints")),
    (
        "Artifacts",
        Key::Refused("wharf reads artifacts from its own spec only (`artifact` blocks) for now"),
    ),
    ("Vault", Key::Refused("wharf has no Vault integration")),
    ("Templates", Key::Used),
    ("DispatchPayload", Key::Refused("wharf does not run dispatched jobs")),
    (
        "VolumeMounts",
        Key::Refused("wharf reads volume mounts from its own spec only (`volume_mount`) for now"),
    ),
    ("CSIPluginConfig", Key::Refused("wharf has no CSI plugins")),
    ("Kind", Key::Refused("wharf has no Consul Connect")),
    ("ShutdownDelay", Key::Used),
    ("Identity", Key::Refused("wharf issues no workload identities")),
    ("Identities", Key::Refused("wharf issues no workload identities")),
    ("Consul", Key::Informs),
];

/// Translates a Nomad job (the object inside `{"Job": ...}`) into wharf's spec.
pub fn translate(job: &Value) -> Result<NomadJob, NomadError> {
    let obj = Obj::of(job, "Job")?.ok_or_else(|| invalid("Job", "the job is null".into()))?;
    obj.check(JOB_KEYS)?;
    let id = obj
        .str("ID")?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("Job.ID", "a job needs an ID".into()))?;
    let name = obj.str("Name")?.filter(|s| !s.is_empty()).unwrap_or(id).to_owned();
    let job_type = match obj.str("Type")?.unwrap_or("") {
        "" | "service" => JobType::Service,
        "batch" => JobType::Batch,
        "system" => JobType::System,
        "sysbatch" => JobType::SysBatch,
        other => {
            return Err(invalid(
                "Job.Type",
                format!("{other:?} is not service, batch, system or sysbatch"),
            ));
        }
    };
    let datacenters = obj
        .array("Datacenters")?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| invalid("Job.Datacenters", "expected a list of strings".into()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta: BTreeMap<String, String> =
        obj.strings("Meta")?.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    let defaults = JobDefaults {
        job_type,
        update: obj.get("Update"),
        reschedule: obj.get("Reschedule"),
        id,
        name: &name,
        meta: &meta,
    };
    let groups = obj.array("TaskGroups")?;
    if groups.is_empty() {
        return Err(invalid("Job.TaskGroups", "a job needs at least one task group".into()));
    }
    let groups = groups
        .iter()
        .enumerate()
        .map(|(index, group)| {
            translate_group(&defaults, group, &format!("Job.TaskGroups[{index}]"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut translated = NomadJob {
        id: id.to_owned(),
        name,
        job_type,
        namespace: obj.str("Namespace")?.filter(|s| !s.is_empty()).unwrap_or("default").to_owned(),
        region: obj.str("Region")?.filter(|s| !s.is_empty()).unwrap_or("global").to_owned(),
        datacenters: if datacenters.is_empty() { vec!["*".to_owned()] } else { datacenters },
        priority: obj.u64("Priority")?.filter(|p| *p != 0).unwrap_or(50),
        meta,
        groups,
        submitted: job.clone(),
    };
    translated.submitted = shown_back(&translated, job);
    Ok(translated)
}

/// The submitted job with the defaults filled in, as Nomad shows a registered job.
fn shown_back(job: &NomadJob, submitted: &Value) -> Value {
    let mut shown = submitted.as_object().cloned().unwrap_or_default();
    let fields = [
        ("Name", json!(job.name)),
        ("Type", json!(type_name(job.job_type))),
        ("Namespace", json!(job.namespace)),
        ("Region", json!(job.region)),
        ("Datacenters", json!(job.datacenters)),
        ("Priority", json!(job.priority)),
    ];
    for (key, value) in fields {
        shown.insert(key.to_owned(), value);
    }
    if let Some(Value::Array(groups)) = shown.get_mut("TaskGroups") {
        for (group, plan) in groups.iter_mut().zip(&job.groups) {
            if let Value::Object(group) = group {
                group.insert("Count".to_owned(), json!(plan.count));
            }
        }
    }
    Value::Object(shown)
}

/// Nomad's name of a job type.
pub fn type_name(job_type: JobType) -> &'static str {
    match job_type {
        JobType::Service => "service",
        JobType::Batch => "batch",
        JobType::System => "system",
        JobType::SysBatch => "sysbatch",
    }
}

/// What every group takes from the job.
struct JobDefaults<'a> {
    job_type: JobType,
    update: Option<&'a Value>,
    reschedule: Option<&'a Value>,
    id: &'a str,
    name: &'a str,
    meta: &'a BTreeMap<String, String>,
}

fn translate_group(
    defaults: &JobDefaults<'_>,
    value: &Value,
    at: &str,
) -> Result<GroupPlan, NomadError> {
    let obj = Obj::of(value, at)?.ok_or_else(|| invalid(at, "a task group is null".into()))?;
    obj.check(GROUP_KEYS)?;
    let name = obj.str("Name")?.unwrap_or("").to_owned();
    let count = obj.u32("Count")?.unwrap_or(1);
    let mut group = TaskGroup::new(name.clone(), Vec::new());
    group.shutdown_delay = obj.duration("ShutdownDelay")?.filter(|d| !d.is_zero());
    if let Some(restart) = obj.get("RestartPolicy") {
        group.restart = restart_policy(restart, &obj.path("RestartPolicy"))?;
    }
    // The group's settings over the job's, field by field, as Nomad merges them.
    let mut reschedule = RescheduleOverrides::default();
    for (value, at) in [
        (defaults.reschedule, "Job.Reschedule".to_owned()),
        (obj.get("ReschedulePolicy"), obj.path("ReschedulePolicy")),
    ] {
        if let Some(value) = value {
            reschedule_policy(&mut reschedule, value, &at)?;
        }
    }
    group.reschedule = reschedule;
    let mut update = None;
    for (value, at) in
        [(defaults.update, "Job.Update".to_owned()), (obj.get("Update"), obj.path("Update"))]
    {
        if let Some(value) = value {
            update_strategy(&mut update, value, &at)?;
        }
    }
    group.update = update;
    let networks = obj.array("Networks")?;
    if networks.len() > 1 {
        return Err(NomadError::Unsupported {
            field: format!("{}[1]", obj.path("Networks")),
            reason: "wharf gives a group one network".into(),
        });
    }
    if let Some(network) = networks.first() {
        group = network_ports(group, network, &format!("{}[0]", obj.path("Networks")))?;
    }
    let ports: Vec<String> = group.network.iter().flat_map(|n| n.ports.keys().cloned()).collect();
    let mut meta = defaults.meta.clone();
    meta.extend(obj.strings("Meta")?.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
    let env = GroupEnv {
        job_id: defaults.id,
        job_name: defaults.name,
        group: &name,
        ports: &ports,
        meta: &meta,
    };
    for (index, task) in obj.array("Tasks")?.iter().enumerate() {
        group.tasks.push(translate_task(task, &format!("{}[{index}]", obj.path("Tasks")), &env)?);
    }
    let job = Job::new(defaults.id, defaults.job_type, group);
    job.validate()?;
    Ok(GroupPlan { name, count, job })
}

fn restart_policy(value: &Value, at: &str) -> Result<RestartOverrides, NomadError> {
    let Some(obj) = Obj::of(value, at)? else { return Ok(RestartOverrides::default()) };
    obj.check(&[
        ("Attempts", Key::Used),
        ("Interval", Key::Used),
        ("Delay", Key::Used),
        ("Mode", Key::Used),
        ("RenderTemplates", Key::Informs),
    ])?;
    let mode = match obj.str("Mode")? {
        None | Some("") => None,
        Some("fail") => Some(RestartMode::Fail),
        Some("delay") => Some(RestartMode::Delay),
        Some(other) => {
            return Err(invalid(
                &obj.path("Mode"),
                format!("{other:?} is neither \"fail\" nor \"delay\""),
            ));
        }
    };
    Ok(RestartOverrides {
        attempts: obj.u32("Attempts")?,
        interval: obj.duration("Interval")?,
        delay: obj.duration("Delay")?,
        mode,
    })
}

fn reschedule_policy(
    into: &mut RescheduleOverrides,
    value: &Value,
    at: &str,
) -> Result<(), NomadError> {
    let Some(obj) = Obj::of(value, at)? else { return Ok(()) };
    obj.check(&[
        ("Attempts", Key::Used),
        ("Interval", Key::Used),
        ("Delay", Key::Used),
        ("DelayFunction", Key::Used),
        ("MaxDelay", Key::Used),
        ("Unlimited", Key::Used),
    ])?;
    into.attempts = obj.u32("Attempts")?.or(into.attempts);
    into.interval = obj.duration("Interval")?.or(into.interval);
    into.delay = obj.duration("Delay")?.or(into.delay);
    into.max_delay = obj.duration("MaxDelay")?.or(into.max_delay);
    if obj.get("Unlimited").is_some() {
        into.unlimited = Some(obj.bool("Unlimited")?);
    }
    into.delay_function = match obj.str("DelayFunction")? {
        None | Some("") => into.delay_function,
        Some("constant") => Some(DelayFunction::Constant),
        Some("exponential") => Some(DelayFunction::Exponential),
        Some("fibonacci") => Some(DelayFunction::Fibonacci),
        Some(other) => {
            return Err(invalid(
                &obj.path("DelayFunction"),
                format!("{other:?} is not constant, exponential or fibonacci"),
            ));
        }
    };
    Ok(())
}

fn update_strategy(
    into: &mut Option<UpdateStrategy>,
    value: &Value,
    at: &str,
) -> Result<(), NomadError> {
    let Some(obj) = Obj::of(value, at)? else { return Ok(()) };
    // A deployment's pacing means nothing to allocations placed one by one: shown back only.
    let informs =
        ["MaxParallel", "Stagger", "ProgressDeadline", "Canary", "AutoRevert", "AutoPromote"];
    let mut table: Vec<(&str, Key)> = informs.iter().map(|k| (*k, Key::Informs)).collect();
    table.extend([
        ("HealthCheck", Key::Used),
        ("MinHealthyTime", Key::Used),
        ("HealthyDeadline", Key::Used),
    ]);
    obj.check(&table)?;
    let strategy = into.get_or_insert_with(UpdateStrategy::default);
    match obj.str("HealthCheck")? {
        None | Some("") => {}
        Some("checks") => strategy.health_check = HealthCheck::Checks,
        Some("task_states") => strategy.health_check = HealthCheck::TaskStates,
        Some("manual") => strategy.health_check = HealthCheck::Manual,
        Some(other) => {
            return Err(invalid(
                &obj.path("HealthCheck"),
                format!("{other:?} is not checks, task_states or manual"),
            ));
        }
    }
    if let Some(time) = obj.duration("MinHealthyTime")? {
        strategy.min_healthy_time = time;
    }
    if let Some(deadline) = obj.duration("HealthyDeadline")? {
        strategy.healthy_deadline = deadline;
    }
    Ok(())
}

fn network_ports(mut group: TaskGroup, value: &Value, at: &str) -> Result<TaskGroup, NomadError> {
    let Some(obj) = Obj::of(value, at)? else { return Ok(group) };
    obj.check(&[
        ("Mode", Key::Used),
        ("ReservedPorts", Key::Used),
        ("DynamicPorts", Key::Used),
        ("MBits", Key::Informs),
        ("Device", Key::Informs),
        ("CIDR", Key::Informs),
        ("IP", Key::Informs),
        ("DNS", Key::Refused("wharf's tasks use the node's DNS")),
        ("Hostname", Key::Refused("wharf's tasks use the node's host name")),
    ])?;
    match obj.str("Mode")? {
        None | Some("" | "host") => {}
        Some(other) => {
            return Err(NomadError::Unsupported {
                field: obj.path("Mode"),
                reason: format!("network mode {other:?}: wharf has host networking only"),
            });
        }
    }
    for (key, fixed) in [("ReservedPorts", true), ("DynamicPorts", false)] {
        for (index, port) in obj.array(key)?.iter().enumerate() {
            let at = format!("{}[{index}]", obj.path(key));
            let port = Obj::of(port, &at)?.ok_or_else(|| invalid(&at, "a port is null".into()))?;
            port.check(&[
                ("Label", Key::Used),
                ("Value", Key::Used),
                ("To", Key::Used),
                ("HostNetwork", Key::Used),
            ])?;
            let label = port.str("Label")?.unwrap_or("").to_owned();
            let value = port.u64("Value")?.unwrap_or(0);
            let value = u16::try_from(value).map_err(|_| {
                invalid(&port.path("Value"), format!("{value} is not a port number"))
            })?;
            let to = port.get("To").and_then(Value::as_i64).unwrap_or(0);
            if to != 0 && !(fixed && to == i64::from(value)) {
                return Err(NomadError::Unsupported {
                    field: port.path("To"),
                    reason: "wharf maps no ports: a task listens on the port it is given".into(),
                });
            }
            if !matches!(port.str("HostNetwork")?, None | Some("" | "default")) {
                return Err(NomadError::Unsupported {
                    field: port.path("HostNetwork"),
                    reason: "wharf has the default host network only".into(),
                });
            }
            group = group.with_port(label, (fixed && value != 0).then_some(value));
        }
    }
    Ok(group)
}

/// What a task's environment needs to know of its group and job.
struct GroupEnv<'a> {
    job_id: &'a str,
    job_name: &'a str,
    group: &'a str,
    ports: &'a [String],
    meta: &'a BTreeMap<String, String>,
}

fn translate_task(value: &Value, at: &str, group: &GroupEnv<'_>) -> Result<Task, NomadError> {
    let obj = Obj::of(value, at)?.ok_or_else(|| invalid(at, "a task is null".into()))?;
    obj.check(TASK_KEYS)?;
    let name = obj.str("Name")?.unwrap_or("");
    let nomad_driver = obj.str("Driver")?.unwrap_or("");
    let driver = DRIVERS
        .iter()
        .find(|(nomad, _)| *nomad == nomad_driver)
        .map(|(_, wharf)| *wharf)
        .ok_or_else(|| NomadError::Unsupported {
            field: obj.path("Driver"),
            reason: format!("{nomad_driver:?} is not a driver wharf has; it runs raw_exec, exec, docker and podman (as its container driver)"),
        })?;
    let mut task = Task::new(name, driver);
    task.config = driver_config(nomad_driver, obj.get("Config"), &obj.path("Config"))?;
    task.leader = obj.bool("Leader")?;
    if let Some(timeout) = obj.duration("KillTimeout")? {
        task.kill_timeout = timeout;
    }
    task.shutdown_delay = obj.duration("ShutdownDelay")?.filter(|d| !d.is_zero());
    if let Some(signal) = obj.str("KillSignal")?.filter(|s| !s.is_empty()) {
        task.kill_signal = signal
            .parse::<Signal>()
            .map_err(|e| invalid(&obj.path("KillSignal"), e.to_string()))?;
    }
    if let Some(restart) = obj.get("RestartPolicy") {
        task.restart = restart_policy(restart, &obj.path("RestartPolicy"))?;
    }
    if let Some(lifecycle) = obj.get("Lifecycle") {
        task.lifecycle = lifecycle_of(lifecycle, &obj.path("Lifecycle"))?;
    }
    if let Some(resources) = obj.get("Resources") {
        task.resources = resources_of(resources, &obj.path("Resources"))?;
    }
    for (index, service) in obj.array("Services")?.iter().enumerate() {
        task.services.push(service_of(service, &format!("{}[{index}]", obj.path("Services")))?);
    }
    for (index, template) in obj.array("Templates")?.iter().enumerate() {
        let at = format!("{}[{index}]", obj.path("Templates"));
        task.templates.push(template_of(template, &at, group.ports)?);
    }
    let mut meta = group.meta.clone();
    meta.extend(obj.strings("Meta")?.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
    task.env = nomad_env(group, &task, &meta);
    for (key, value) in obj.strings("Env")? {
        task.env.insert(key.to_owned(), nomad_references(value, group.ports));
    }
    Ok(task)
}

fn lifecycle_of(value: &Value, at: &str) -> Result<Option<Lifecycle>, NomadError> {
    let Some(obj) = Obj::of(value, at)? else { return Ok(None) };
    obj.check(&[("Hook", Key::Used), ("Sidecar", Key::Used)])?;
    let hook = match obj.str("Hook")? {
        None | Some("") => return Ok(None),
        Some("prestart") => LifecycleHook::Prestart,
        Some("poststart") => LifecycleHook::Poststart,
        Some("poststop") => LifecycleHook::Poststop,
        Some(other) => {
            return Err(invalid(
                &obj.path("Hook"),
                format!("{other:?} is not prestart, poststart or poststop"),
            ));
        }
    };
    Ok(Some(Lifecycle { hook, sidecar: obj.bool("Sidecar")? }))
}

fn resources_of(value: &Value, at: &str) -> Result<Resources, NomadError> {
    let mut resources = Resources::default();
    let Some(obj) = Obj::of(value, at)? else { return Ok(resources) };
    obj.check(&[
        ("CPU", Key::Used),
        ("Cores", Key::Used),
        ("MemoryMB", Key::Used),
        ("MemoryMaxMB", Key::Used),
        ("DiskMB", Key::Informs),
        ("IOPS", Key::Informs),
        ("SecretsMB", Key::Informs),
        (
            "Networks",
            Key::Refused("a task's own networks are gone from Nomad too: give the group a network"),
        ),
        ("Devices", Key::Refused("wharf schedules no devices")),
        ("NUMA", Key::Refused("wharf has no NUMA-aware placement")),
    ])?;
    if let Some(cpu) = obj.u32("CPU")?.filter(|c| *c != 0) {
        resources.cpu = cpu;
    }
    if let Some(memory) = obj.u32("MemoryMB")?.filter(|m| *m != 0) {
        resources.memory = memory;
    }
    resources.memory_max = obj.u32("MemoryMaxMB")?.filter(|m| *m != 0);
    resources.cores = obj.u32("Cores")?.unwrap_or(0);
    Ok(resources)
}

fn on_update_of(obj: &Obj<'_>) -> Result<Option<OnUpdate>, NomadError> {
    match obj.str("OnUpdate")? {
        None | Some("") => Ok(None),
        Some("require_healthy") => Ok(Some(OnUpdate::RequireHealthy)),
        Some("ignore_warnings") => Ok(Some(OnUpdate::IgnoreWarnings)),
        Some("ignore") => Ok(Some(OnUpdate::Ignore)),
        Some(other) => Err(invalid(
            &obj.path("OnUpdate"),
            format!("{other:?} is not require_healthy, ignore_warnings or ignore"),
        )),
    }
}

fn check_restart_of(obj: &Obj<'_>) -> Result<Option<CheckRestart>, NomadError> {
    let Some(value) = obj.get("CheckRestart") else { return Ok(None) };
    let at = obj.path("CheckRestart");
    let Some(inner) = Obj::of(value, &at)? else { return Ok(None) };
    inner.check(&[("Limit", Key::Used), ("Grace", Key::Used), ("IgnoreWarnings", Key::Used)])?;
    Ok(Some(CheckRestart {
        limit: inner.u32("Limit")?,
        grace: inner.duration("Grace")?,
        ignore_warnings: inner
            .get("IgnoreWarnings")
            .map(|_| inner.bool("IgnoreWarnings"))
            .transpose()?,
    }))
}

/// `api.Template`, with its paths' `${NOMAD_*}` references in wharf's terms.
fn template_of(value: &Value, at: &str, ports: &[String]) -> Result<Template, NomadError> {
    let obj = Obj::of(value, at)?.ok_or_else(|| invalid(at, "a template is null".into()))?;
    obj.check(&[
        ("EmbeddedTmpl", Key::Used),
        ("SourcePath", Key::Used),
        ("DestPath", Key::Used),
        ("ChangeMode", Key::Used),
        ("ChangeSignal", Key::Used),
        ("ChangeScript", Key::Used),
        ("Splay", Key::Used),
        ("Perms", Key::Used),
        ("LeftDelim", Key::Used),
        ("RightDelim", Key::Used),
        ("Envvars", Key::Used),
        ("Wait", Key::Used),
        ("ErrMissingKey", Key::Informs),
        ("VaultGrace", Key::Informs),
        ("Uid", Key::Refused("wharf writes rendered files as the agent's user")),
        ("Gid", Key::Refused("wharf writes rendered files as the agent's user")),
        ("Once", Key::Refused("wharf renders templates again when their data changes")),
    ])?;
    let text = |key: &str| -> Result<Option<String>, NomadError> {
        Ok(obj.str(key)?.filter(|s| !s.is_empty()).map(str::to_owned))
    };
    let path = |key: &str| -> Result<Option<String>, NomadError> {
        Ok(text(key)?.map(|p| nomad_references(&p, ports)))
    };
    let mut template = Template::inline(String::new(), path("DestPath")?.unwrap_or_default());
    template.data = text("EmbeddedTmpl")?;
    template.source = path("SourcePath")?;
    if template.data.is_none() && template.source.is_none() {
        template.data = Some(String::new());
    }
    if let Some(mode) = text("ChangeMode")? {
        template.change_mode = match mode.as_str() {
            "restart" => ChangeMode::Restart,
            "signal" => ChangeMode::Signal,
            "noop" => ChangeMode::Noop,
            "script" => ChangeMode::Script,
            other => {
                return Err(invalid(
                    &obj.path("ChangeMode"),
                    format!("unknown change mode {other:?}"),
                ));
            }
        };
    }
    if let Some(signal) = text("ChangeSignal")? {
        let signal = signal
            .parse::<Signal>()
            .map_err(|e| invalid(&obj.path("ChangeSignal"), e.to_string()))?;
        // Nomad fills a signal in for every mode; wharf reads it with mode signal only.
        template.change_signal = (template.change_mode == ChangeMode::Signal).then_some(signal);
    }
    if let Some(script) =
        obj.get("ChangeScript").filter(|_| template.change_mode == ChangeMode::Script)
    {
        let at = obj.path("ChangeScript");
        let inner =
            Obj::of(script, &at)?.ok_or_else(|| invalid(&at, "a change script is null".into()))?;
        inner.check(&[
            ("Command", Key::Used),
            ("Args", Key::Used),
            ("Timeout", Key::Used),
            ("FailOnError", Key::Used),
        ])?;
        template.change_script = Some(ChangeScript {
            command: inner.str("Command")?.unwrap_or("").to_owned(),
            args: strings_of(inner.array("Args")?, &inner.path("Args"))?,
            timeout: inner.duration("Timeout")?.unwrap_or(Duration::from_secs(5)),
            fail_on_error: inner.bool("FailOnError")?,
        });
    }
    if let Some(splay) = obj.duration("Splay")? {
        template.splay = splay;
    }
    if let Some(perms) = text("Perms")? {
        template.perms = perms;
    }
    template.left_delimiter = text("LeftDelim")?;
    template.right_delimiter = text("RightDelim")?;
    template.env = obj.bool("Envvars")?;
    if let Some(wait) = obj.get("Wait") {
        let at = obj.path("Wait");
        if let Some(inner) = Obj::of(wait, &at)? {
            inner.check(&[("Min", Key::Used), ("Max", Key::Used)])?;
            let (min, max) = (inner.duration("Min")?, inner.duration("Max")?);
            if min.is_some() || max.is_some() {
                let min = min.unwrap_or_default();
                template.wait = Some(TemplateWait { min, max: max.unwrap_or(min) });
            }
        }
    }
    Ok(template)
}

fn service_of(value: &Value, at: &str) -> Result<Service, NomadError> {
    let obj = Obj::of(value, at)?.ok_or_else(|| invalid(at, "a service is null".into()))?;
    obj.check(&[
        ("Name", Key::Used),
        ("Tags", Key::Used),
        ("PortLabel", Key::Used),
        ("Provider", Key::Used),
        ("Checks", Key::Used),
        ("CheckRestart", Key::Used),
        ("OnUpdate", Key::Used),
        ("AddressMode", Key::Used),
        ("CanaryTags", Key::Informs),
        ("Meta", Key::Informs),
        ("CanaryMeta", Key::Informs),
        ("EnableTagOverride", Key::Informs),
        ("TaskName", Key::Informs),
        ("Connect", Key::Refused("wharf has no Consul Connect")),
        ("Address", Key::Refused("wharf advertises the node's address")),
        ("Identity", Key::Refused("wharf issues no workload identities")),
    ])?;
    if let Some(provider) = obj.str("Provider")?.filter(|p| !p.is_empty() && *p != "nomad") {
        return Err(NomadError::Unsupported {
            field: obj.path("Provider"),
            reason: format!(
                "{provider:?}: wharf registers services in its own catalog; set Provider to \"nomad\""
            ),
        });
    }
    if !matches!(obj.str("AddressMode")?, None | Some("" | "auto" | "host")) {
        return Err(NomadError::Unsupported {
            field: obj.path("AddressMode"),
            reason: "wharf has host addresses only".into(),
        });
    }
    let mut service = Service::new(obj.str("Name")?.unwrap_or(""));
    service.port = obj.str("PortLabel")?.filter(|p| !p.is_empty()).map(str::to_owned);
    service.tags = strings_of(obj.array("Tags")?, &obj.path("Tags"))?;
    service.check_restart = check_restart_of(&obj)?;
    service.on_update = on_update_of(&obj)?.unwrap_or_default();
    for (index, check) in obj.array("Checks")?.iter().enumerate() {
        service.checks.push(check_of(check, &format!("{}[{index}]", obj.path("Checks")))?);
    }
    Ok(service)
}

fn check_of(value: &Value, at: &str) -> Result<Check, NomadError> {
    let obj = Obj::of(value, at)?.ok_or_else(|| invalid(at, "a check is null".into()))?;
    let used = [
        "Name",
        "Type",
        "Path",
        "Method",
        "Header",
        "Body",
        "Protocol",
        "PortLabel",
        "Command",
        "Args",
        "Interval",
        "Timeout",
        "CheckRestart",
        "OnUpdate",
    ];
    let mut table: Vec<(&str, Key)> = used.iter().map(|k| (*k, Key::Used)).collect();
    table.extend([
        ("TaskName", Key::Informs),
        ("AddressMode", Key::Informs),
        ("Notes", Key::Informs),
    ]);
    obj.check(&table)?;
    let kind = match obj.str("Type")? {
        Some("http") => CheckKind::Http,
        Some("tcp") => CheckKind::Tcp,
        Some("script") => CheckKind::Script,
        other => {
            return Err(NomadError::Unsupported {
                field: obj.path("Type"),
                reason: format!(
                    "{:?}: wharf runs http, tcp and script checks",
                    other.unwrap_or("")
                ),
            });
        }
    };
    let interval = obj
        .duration("Interval")?
        .ok_or_else(|| invalid(&obj.path("Interval"), "a check needs an interval".into()))?;
    let timeout = obj
        .duration("Timeout")?
        .ok_or_else(|| invalid(&obj.path("Timeout"), "a check needs a timeout".into()))?;
    let mut check = Check::new(obj.str("Name")?.unwrap_or(""), kind, interval, timeout);
    check.port = obj.str("PortLabel")?.filter(|p| !p.is_empty()).map(str::to_owned);
    check.path = obj.str("Path")?.filter(|p| !p.is_empty()).map(str::to_owned);
    check.method = obj.str("Method")?.filter(|p| !p.is_empty()).map(str::to_owned);
    check.body = obj.str("Body")?.filter(|p| !p.is_empty()).map(str::to_owned);
    check.protocol = obj.str("Protocol")?.filter(|p| !p.is_empty()).map(str::to_owned);
    check.command = obj.str("Command")?.filter(|p| !p.is_empty()).map(str::to_owned);
    check.args = strings_of(obj.array("Args")?, &obj.path("Args"))?;
    if let Some(Value::Object(headers)) = obj.get("Header") {
        for (name, values) in headers {
            let at = format!("{}.{name}", obj.path("Header"));
            let values = values
                .as_array()
                .ok_or_else(|| invalid(&at, "expected a list of strings".into()))?;
            check.header.insert(name.clone(), strings_of(values, &at)?);
        }
    }
    check.check_restart = check_restart_of(&obj)?;
    check.on_update = on_update_of(&obj)?;
    Ok(check)
}

fn strings_of(values: &[Value], at: &str) -> Result<Vec<String>, NomadError> {
    values
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| invalid(at, "expected a list of strings".into()))
        })
        .collect()
}

/// The common keys of Docker's and Podman's `config` that the container driver takes.
const CONTAINER_KEYS: &[&str] = &["image", "command", "args", "entrypoint", "ports"];

fn driver_config(
    driver: &str,
    value: Option<&Value>,
    at: &str,
) -> Result<Map<String, Value>, NomadError> {
    let config = match value {
        None => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(invalid(at, "expected an object".into())),
    };
    if matches!(driver, "docker" | "podman") {
        // Refused here rather than by the container driver, which would not know the key
        // came from a Docker job.
        if let Some(key) = config.keys().find(|k| !CONTAINER_KEYS.contains(&k.as_str())) {
            return Err(NomadError::Unsupported {
                field: format!("{at}.{key}"),
                reason: format!(
                    "wharf's container driver takes {} of a {driver} task's config",
                    CONTAINER_KEYS.join(", ")
                ),
            });
        }
    }
    Ok(config)
}

/// Nomad's task variables, each as the wharf variable (or value) it means.
fn nomad_env(
    group: &GroupEnv<'_>,
    task: &Task,
    meta: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("NOMAD_ALLOC_ID".to_owned(), "${WHARF_ALLOC_ID}".to_owned()),
        ("NOMAD_ALLOC_DIR".to_owned(), "${WHARF_ALLOC_DIR}".to_owned()),
        ("NOMAD_TASK_DIR".to_owned(), "${WHARF_TASK_DIR}/local".to_owned()),
        ("NOMAD_SECRETS_DIR".to_owned(), "${WHARF_SECRETS_DIR}".to_owned()),
        ("NOMAD_TASK_NAME".to_owned(), task.name.clone()),
        ("NOMAD_GROUP_NAME".to_owned(), group.group.to_owned()),
        ("NOMAD_JOB_ID".to_owned(), group.job_id.to_owned()),
        ("NOMAD_JOB_NAME".to_owned(), group.job_name.to_owned()),
        ("NOMAD_CPU_LIMIT".to_owned(), task.resources.cpu.to_string()),
        ("NOMAD_MEMORY_LIMIT".to_owned(), task.resources.memory.to_string()),
    ]);
    if let Some(max) = task.resources.memory_max {
        env.insert("NOMAD_MEMORY_MAX_LIMIT".to_owned(), max.to_string());
    }
    for label in group.ports {
        env.insert(format!("NOMAD_PORT_{label}"), format!("${{WHARF_PORT_{label}}}"));
        env.insert(format!("NOMAD_IP_{label}"), format!("${{WHARF_IP_{label}}}"));
        env.insert(format!("NOMAD_ADDR_{label}"), format!("${{WHARF_ADDR_{label}}}"));
        env.insert(format!("NOMAD_HOST_PORT_{label}"), format!("${{WHARF_PORT_{label}}}"));
    }
    for (key, value) in meta {
        env.insert(format!("NOMAD_META_{key}"), value.clone());
    }
    env
}

/// A user's variable may refer to Nomad's (`${NOMAD_TASK_DIR}/run.sh`): the reference is
/// written as the wharf variable it means, since wharf resolves a task's variables in one pass
/// over its own.
fn nomad_references(value: &str, ports: &[String]) -> String {
    let mut out = value
        .replace("${NOMAD_ALLOC_ID}", "${WHARF_ALLOC_ID}")
        .replace("${NOMAD_ALLOC_DIR}", "${WHARF_ALLOC_DIR}")
        .replace("${NOMAD_TASK_DIR}", "${WHARF_TASK_DIR}/local")
        .replace("${NOMAD_SECRETS_DIR}", "${WHARF_SECRETS_DIR}");
    for label in ports {
        for kind in ["PORT", "IP", "ADDR"] {
            out = out.replace(
                &format!("${{NOMAD_{kind}_{label}}}"),
                &format!("${{WHARF_{kind}_{label}}}"),
            );
        }
    }
    out
}
