//! The JSON shapes Nomad's HTTP API answers with, field for field as its `api` package
//! decodes them (allocations, task states and events, nodes, evaluations, job stubs and
//! register responses), and the pure functions that fill them from wharf's allocation state.
//!
//! Times follow Nomad's types: event times, `CreateTime` and `ModifyTime` are nanoseconds
//! since the epoch; `StartedAt`, `FinishedAt` and `LastRestart` are RFC 3339 strings, with
//! Go's zero time for "never".

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use wharf_state::{
    AllocState, Allocation as WharfAllocation, ClientStatus, DesiredStatus,
    TaskEvent as WharfEvent, TaskEventKind, TaskState as WharfTaskState, TaskStatus, Timestamp,
};

/// Go's zero `time.Time`, as Nomad writes a time that never happened.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// `api.TaskEvent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskEvent {
    /// Nomad's event type name, such as `"Terminated"`.
    #[serde(rename = "Type")]
    pub event_type: String,
    /// Nanoseconds since the epoch.
    pub time: i64,
    pub display_message: String,
    pub details: BTreeMap<String, String>,
    pub message: String,
    pub fails_task: bool,
    pub restart_reason: String,
    pub setup_error: String,
    pub driver_error: String,
    pub driver_message: String,
    pub exit_code: i64,
    pub signal: i64,
    pub kill_reason: String,
    /// Nanoseconds.
    pub kill_timeout: i64,
    pub kill_error: String,
    /// Nanoseconds.
    pub start_delay: i64,
    pub download_error: String,
    pub validation_error: String,
    pub disk_limit: i64,
    pub disk_size: i64,
    pub failed_sibling: String,
    pub vault_error: String,
    pub task_signal_reason: String,
    pub task_signal: String,
    pub generic_source: String,
}

/// `api.TaskState`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskState {
    /// pending, running or dead.
    pub state: String,
    /// Whether it failed.
    pub failed: bool,
    /// How many times it restarted.
    pub restarts: u64,
    /// RFC 3339, or Go's zero time.
    pub last_restart: String,
    /// RFC 3339, or Go's zero time.
    pub started_at: String,
    /// RFC 3339, or Go's zero time.
    pub finished_at: String,
    /// Oldest first.
    pub events: Vec<TaskEvent>,
}

/// `api.AllocDeploymentStatus`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocDeploymentStatus {
    /// Unset until judged.
    pub healthy: Option<bool>,
    /// When it was judged (RFC 3339, or Go's zero time).
    pub timestamp: String,
    /// Canaries are not run.
    pub canary: bool,
    /// The index of the judgement.
    pub modify_index: u64,
}

/// `api.Allocation`, the parts a node knows; the scheduler's metrics and previous-allocation
/// links are empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Allocation {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub name: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_name: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The Nomad job as registered.
    pub job: Value,
    pub task_group: String,
    pub desired_status: String,
    pub desired_description: String,
    pub client_status: String,
    pub client_description: String,
    pub task_states: BTreeMap<String, TaskState>,
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    pub deployment_status: Option<AllocDeploymentStatus>,
    #[serde(rename = "FollowupEvalID")]
    pub followup_eval_id: String,
    pub previous_allocation: String,
    pub next_allocation: String,
    pub preempted_allocations: Vec<String>,
    pub preempted_by_allocation: String,
    pub create_index: u64,
    pub modify_index: u64,
    pub alloc_modify_index: u64,
    /// Nanoseconds since the epoch.
    pub create_time: i64,
    /// Nanoseconds since the epoch.
    pub modify_time: i64,
}

/// `api.AllocationListStub`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AllocationListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub name: String,
    pub namespace: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_name: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_type: String,
    pub job_version: u64,
    pub task_group: String,
    pub desired_status: String,
    pub desired_description: String,
    pub client_status: String,
    pub client_description: String,
    pub task_states: BTreeMap<String, TaskState>,
    pub deployment_status: Option<AllocDeploymentStatus>,
    #[serde(rename = "FollowupEvalID")]
    pub followup_eval_id: String,
    pub preempted_allocations: Vec<String>,
    pub preempted_by_allocation: String,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time: i64,
    pub modify_time: i64,
}

impl From<&Allocation> for AllocationListStub {
    fn from(a: &Allocation) -> AllocationListStub {
        AllocationListStub {
            id: a.id.clone(),
            eval_id: a.eval_id.clone(),
            name: a.name.clone(),
            namespace: a.namespace.clone(),
            node_id: a.node_id.clone(),
            node_name: a.node_name.clone(),
            job_id: a.job_id.clone(),
            job_type: a.job.get("Type").and_then(Value::as_str).unwrap_or("service").to_owned(),
            job_version: a.job.get("Version").and_then(Value::as_u64).unwrap_or(0),
            task_group: a.task_group.clone(),
            desired_status: a.desired_status.clone(),
            desired_description: a.desired_description.clone(),
            client_status: a.client_status.clone(),
            client_description: a.client_description.clone(),
            task_states: a.task_states.clone(),
            deployment_status: a.deployment_status.clone(),
            followup_eval_id: String::new(),
            preempted_allocations: Vec::new(),
            preempted_by_allocation: String::new(),
            create_index: a.create_index,
            modify_index: a.modify_index,
            create_time: a.create_time,
            modify_time: a.modify_time,
        }
    }
}

/// Where an allocation runs and how Nomad names it, for [`allocation`].
#[derive(Debug, Clone)]
pub struct AllocContext<'a> {
    /// The node's id.
    pub node_id: &'a str,
    /// The node's name.
    pub node_name: &'a str,
    /// The job's namespace.
    pub namespace: &'a str,
    /// `<job>.<group>[<index>]`.
    pub name: &'a str,
    /// The evaluation that placed it.
    pub eval_id: &'a str,
    /// The Nomad job as registered (shown back under `Job`).
    pub job: &'a Value,
    /// When it was placed.
    pub created: Timestamp,
    /// The index it was placed at.
    pub create_index: u64,
}

/// Nanoseconds since the epoch.
pub fn nanos(time: Timestamp) -> i64 {
    i64::try_from(time.0).unwrap_or(i64::MAX / 1_000_000).saturating_mul(1_000_000)
}

fn rfc3339(time: Option<Timestamp>) -> String {
    time.map_or_else(|| ZERO_TIME.to_owned(), |t| t.to_string())
}

/// The latest time anything of `state` changed.
pub fn last_change(state: &AllocState) -> Option<Timestamp> {
    state.task_states.values().filter_map(|t| t.events.back().map(|e| e.time)).max()
}

/// A wharf allocation with its state, as Nomad's `Allocation`. `ModifyIndex` is the time of
/// its last change in milliseconds, so that it only grows, across agent restarts too.
pub fn allocation(
    alloc: &WharfAllocation,
    state: &AllocState,
    context: &AllocContext<'_>,
) -> Allocation {
    let changed = last_change(state).unwrap_or(context.created).max(context.created);
    Allocation {
        id: alloc.id.clone(),
        namespace: context.namespace.to_owned(),
        eval_id: context.eval_id.to_owned(),
        name: context.name.to_owned(),
        node_id: context.node_id.to_owned(),
        node_name: context.node_name.to_owned(),
        job_id: alloc.job.id.clone(),
        job: context.job.clone(),
        task_group: alloc.task_group.clone(),
        desired_status: desired_status(alloc.desired_status).to_owned(),
        desired_description: String::new(),
        client_status: state.client_status.to_string(),
        client_description: state.client_description.clone(),
        task_states: state
            .task_states
            .iter()
            .map(|(name, task)| (name.clone(), task_state(task)))
            .collect(),
        deployment_id: alloc.deployment_id.clone().unwrap_or_default(),
        deployment_status: state.deployment_status.as_ref().map(|d| AllocDeploymentStatus {
            healthy: d.healthy,
            timestamp: rfc3339(d.timestamp),
            canary: d.canary,
            modify_index: d.modify_index,
        }),
        followup_eval_id: String::new(),
        previous_allocation: String::new(),
        next_allocation: String::new(),
        preempted_allocations: Vec::new(),
        preempted_by_allocation: String::new(),
        create_index: context.create_index,
        modify_index: changed.0.max(context.create_index),
        alloc_modify_index: context.create_index.max(alloc.modify_index),
        create_time: nanos(context.created),
        modify_time: nanos(changed),
    }
}

/// Nomad's word for a desired status.
pub fn desired_status(status: DesiredStatus) -> &'static str {
    match status {
        DesiredStatus::Run => "run",
        DesiredStatus::Stop => "stop",
        DesiredStatus::Evict => "evict",
    }
}

/// Whether a client status is one Nomad counts as running for a job's status.
pub fn is_live(status: ClientStatus) -> bool {
    matches!(status, ClientStatus::Pending | ClientStatus::Running)
}

/// A task's state as Nomad's `TaskState`.
pub fn task_state(state: &WharfTaskState) -> TaskState {
    TaskState {
        state: match state.status {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Dead => "dead",
        }
        .to_owned(),
        failed: state.failed,
        restarts: state.restarts,
        last_restart: rfc3339(state.last_restart),
        started_at: rfc3339(state.started_at),
        finished_at: rfc3339(state.finished_at),
        events: state.events.iter().map(task_event).collect(),
    }
}

/// Nomad's type name of an event kind. wharf's titles are Nomad's, but for an OOM kill
/// (Nomad: a `Terminated` event whose details say so) and the hook events' capitalisation.
pub fn event_type(kind: &TaskEventKind) -> &'static str {
    match kind {
        TaskEventKind::Terminated { .. } => "Terminated",
        TaskEventKind::HookFailed { .. } => "Task hook failed",
        TaskEventKind::HookMessage { .. } => "Task hook message",
        other => other.title(),
    }
}

fn duration_nanos(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

/// A task event as Nomad's `TaskEvent`, with the kind's details in Nomad's fields and in
/// `Details` (as Nomad fills both).
pub fn task_event(event: &WharfEvent) -> TaskEvent {
    let mut out = TaskEvent {
        event_type: event_type(&event.kind).to_owned(),
        time: nanos(event.time),
        display_message: event.kind.to_string(),
        details: BTreeMap::new(),
        message: String::new(),
        fails_task: event.fails_task,
        restart_reason: String::new(),
        setup_error: String::new(),
        driver_error: String::new(),
        driver_message: String::new(),
        exit_code: 0,
        signal: 0,
        kill_reason: String::new(),
        kill_timeout: 0,
        kill_error: String::new(),
        start_delay: 0,
        download_error: String::new(),
        validation_error: String::new(),
        disk_limit: 0,
        disk_size: 0,
        failed_sibling: String::new(),
        vault_error: String::new(),
        task_signal_reason: String::new(),
        task_signal: String::new(),
        generic_source: String::new(),
    };
    let mut detail = |key: &str, value: String| {
        out.details.insert(key.to_owned(), value);
    };
    use TaskEventKind::*;
    match &event.kind {
        Terminated { exit_code, signal, oom_killed, message } => {
            detail("exit_code", exit_code.to_string());
            detail("signal", signal.unwrap_or(0).to_string());
            detail("oom_killed", oom_killed.to_string());
            if let Some(message) = message {
                detail("exit_message", message.clone());
            }
            out.exit_code = i64::from(*exit_code);
            out.signal = i64::from(signal.unwrap_or(0));
            out.message = message.clone().unwrap_or_default();
        }
        Restarting { delay, reason } => {
            detail("restart_reason", reason.clone());
            detail("start_delay", duration_nanos(*delay).to_string());
            out.restart_reason = reason.clone();
            out.start_delay = duration_nanos(*delay);
        }
        NotRestarting { reason } | RestartSignaled { reason } => {
            detail("restart_reason", reason.clone());
            out.restart_reason = reason.clone();
        }
        Signaling { signal, reason } => {
            detail("signal", signal.to_string());
            detail("reason", reason.clone());
            out.task_signal = signal.to_string();
            out.task_signal_reason = reason.clone();
        }
        Killing { signal, kill_timeout } => {
            detail("kill_timeout", duration_nanos(*kill_timeout).to_string());
            out.kill_timeout = duration_nanos(*kill_timeout);
            out.task_signal = signal.to_string();
        }
        Killed { error } => {
            if let Some(error) = error {
                detail("kill_error", error.clone());
                out.kill_error = error.clone();
            }
        }
        SetupFailure { error } => {
            detail("setup_error", error.clone());
            out.setup_error = error.clone();
        }
        FailedValidation { error } => {
            detail("validation_error", error.clone());
            out.validation_error = error.clone();
        }
        DriverFailure { error } => {
            detail("driver_error", error.clone());
            out.driver_error = error.clone();
        }
        DriverMessage { message, annotations } => {
            detail("driver_message", message.clone());
            for (key, value) in annotations {
                detail(key, value.clone());
            }
            out.driver_message = message.clone();
        }
        SiblingFailed { task } => {
            detail("failed_sibling", task.clone());
            out.failed_sibling = task.clone();
        }
        Setup { message }
        | HookMessage { message, .. }
        | AllocUnhealthy { message }
        | Template { message } => {
            detail("message", message.clone());
            out.message = message.clone();
        }
        HookFailed { error, .. } | FailedRestoring { error } => {
            detail("message", error.clone());
            out.message = error.clone();
        }
        ArtifactDownloadFailed { error } => {
            detail("download_error", error.clone());
            out.download_error = error.clone();
        }
        MaxRunDurationExceeded { .. } | WaitingShutdownDelay { .. } => {
            let message = event.kind.to_string();
            detail("message", message.clone());
            out.message = message;
        }
        Received | Started | Reattached | LeaderDead | MainTasksDead => {}
    }
    if event.fails_task {
        out.details.insert("fails_task".to_owned(), "true".to_owned());
    }
    out
}

/// `api.DriverInfo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DriverInfo {
    /// What the driver found.
    pub attributes: BTreeMap<String, String>,
    /// Whether it is there.
    pub detected: bool,
    /// Whether it works.
    pub healthy: bool,
    /// Why not.
    pub health_description: String,
    /// When it was last checked (RFC 3339).
    pub update_time: String,
}

/// `api.NodeCpuResources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeCpuResources {
    pub cpu_shares: u64,
    pub total_cpu_cores: u64,
    pub reservable_cpu_cores: Vec<u64>,
}

/// `api.NodeMemoryResources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeMemoryResources {
    /// MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: u64,
}

/// `api.NodeDiskResources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeDiskResources {
    /// MiB.
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
}

/// `api.NodeResources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeResources {
    pub cpu: NodeCpuResources,
    pub memory: NodeMemoryResources,
    pub disk: NodeDiskResources,
    pub networks: Vec<Value>,
    pub min_dynamic_port: u16,
    pub max_dynamic_port: u16,
}

/// `api.Node`, as far as a wharf node fills it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Node {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub datacenter: String,
    pub node_class: String,
    pub node_pool: String,
    /// `host:port` of the node's HTTP API: where clients send the client calls.
    #[serde(rename = "HTTPAddr")]
    pub http_addr: String,
    #[serde(rename = "TLSEnabled")]
    pub tls_enabled: bool,
    pub attributes: BTreeMap<String, String>,
    pub node_resources: NodeResources,
    pub meta: BTreeMap<String, String>,
    pub drain: bool,
    pub scheduling_eligibility: String,
    pub status: String,
    pub status_description: String,
    pub status_updated_at: i64,
    pub drivers: BTreeMap<String, DriverInfo>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `api.NodeListStub`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeListStub {
    pub address: String,
    #[serde(rename = "ID")]
    pub id: String,
    pub datacenter: String,
    pub name: String,
    pub node_class: String,
    pub node_pool: String,
    pub version: String,
    pub drain: bool,
    pub scheduling_eligibility: String,
    pub status: String,
    pub status_description: String,
    pub drivers: BTreeMap<String, DriverInfo>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl NodeListStub {
    /// The stub of `node`, whose address (without the port) is `address`, running `version`.
    pub fn of(node: &Node, version: &str) -> NodeListStub {
        let address =
            node.http_addr.rsplit_once(':').map_or(node.http_addr.as_str(), |(host, _)| host);
        NodeListStub {
            address: address.trim_start_matches('[').trim_end_matches(']').to_owned(),
            id: node.id.clone(),
            datacenter: node.datacenter.clone(),
            name: node.name.clone(),
            node_class: node.node_class.clone(),
            node_pool: node.node_pool.clone(),
            version: version.to_owned(),
            drain: node.drain,
            scheduling_eligibility: node.scheduling_eligibility.clone(),
            status: node.status.clone(),
            status_description: node.status_description.clone(),
            drivers: node.drivers.clone(),
            create_index: node.create_index,
            modify_index: node.modify_index,
        }
    }
}

/// `api.Evaluation`: each registration or stop is one evaluation, complete at once, since
/// placing is done when the call returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Evaluation {
    #[serde(rename = "ID")]
    pub id: String,
    pub priority: u64,
    #[serde(rename = "Type")]
    pub eval_type: String,
    pub triggered_by: String,
    pub namespace: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_modify_index: u64,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    pub status: String,
    pub status_description: String,
    pub next_eval: String,
    pub previous_eval: String,
    pub blocked_eval: String,
    pub failed_t_g_allocs: Option<BTreeMap<String, Value>>,
    pub queued_allocations: BTreeMap<String, u64>,
    pub snapshot_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time: i64,
    pub modify_time: i64,
}

/// `api.JobListStub`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub name: String,
    pub namespace: String,
    pub datacenters: Vec<String>,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: u64,
    pub periodic: bool,
    pub parameterized_job: bool,
    pub stop: bool,
    pub status: String,
    pub status_description: String,
    pub job_summary: JobSummary,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
    /// Nanoseconds since the epoch.
    pub submit_time: i64,
    pub meta: BTreeMap<String, String>,
}

/// `api.JobSummary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobSummary {
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub namespace: String,
    pub summary: BTreeMap<String, TaskGroupSummary>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `api.TaskGroupSummary`: how many allocations of a group are in each status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskGroupSummary {
    pub queued: u64,
    pub complete: u64,
    pub failed: u64,
    pub running: u64,
    pub starting: u64,
    pub lost: u64,
    pub unknown: u64,
}

impl TaskGroupSummary {
    /// Counts one allocation of `status`.
    pub fn add(&mut self, status: ClientStatus) {
        match status {
            ClientStatus::Pending => self.starting += 1,
            ClientStatus::Running => self.running += 1,
            ClientStatus::Complete => self.complete += 1,
            ClientStatus::Failed => self.failed += 1,
            ClientStatus::Lost => self.lost += 1,
        }
    }
}

/// Nomad's job status from its allocations' statuses: `running` while any is pending or
/// running, `dead` once all are terminal (or the job was stopped), `pending` with none.
pub fn job_status(stopped: bool, statuses: impl IntoIterator<Item = ClientStatus>) -> &'static str {
    let mut any = false;
    for status in statuses {
        any = true;
        if is_live(status) && !stopped {
            return "running";
        }
    }
    if stopped || any { "dead" } else { "pending" }
}

/// `api.JobRegisterResponse` (also the answer to a stop, as `JobDeregisterResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobRegisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    pub warnings: String,
    pub last_index: u64,
    pub request_time: i64,
}

/// `api.JobValidateResponse`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobValidateResponse {
    pub driver_config_validated: bool,
    pub validation_errors: Vec<String>,
    pub error: String,
    pub warnings: String,
}

/// `api.StreamFrame`: a chunk of a file or log, or `{}` as a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StreamFrame {
    /// Where `Data` starts in the file.
    pub offset: u64,
    /// The bytes, base64 in JSON.
    pub data: String,
    /// The file's name.
    pub file: String,
    /// `file deleted` or `file truncated` when that happened; else empty.
    pub file_event: String,
}

/// `api.AllocFileInfo`, one entry of `fs/ls` and the answer of `fs/stat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocFileInfo {
    /// The entry's name.
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Its size in bytes.
    pub size: u64,
    /// Go's `os.FileMode` string, such as `-rw-r--r--`.
    pub file_mode: String,
    /// RFC 3339.
    pub mod_time: String,
    /// The content type of a file, guessed from its name.
    pub content_type: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use wharf_state::{Signal, TaskEvent as E};

    #[test]
    fn event_types_use_nomads_names() {
        let table = [
            (TaskEventKind::Received, "Received"),
            (TaskEventKind::Setup { message: "m".into() }, "Task Setup"),
            (TaskEventKind::Started, "Started"),
            (
                TaskEventKind::Terminated {
                    exit_code: 1,
                    signal: None,
                    oom_killed: true,
                    message: None,
                },
                "Terminated",
            ),
            (
                TaskEventKind::Killing {
                    signal: Signal::Int,
                    kill_timeout: Duration::from_secs(5),
                },
                "Killing",
            ),
            (TaskEventKind::Killed { error: None }, "Killed"),
            (
                TaskEventKind::Restarting { delay: Duration::from_secs(1), reason: "r".into() },
                "Restarting",
            ),
            (TaskEventKind::NotRestarting { reason: "r".into() }, "Not Restarting"),
            (TaskEventKind::SiblingFailed { task: "t".into() }, "Sibling Task Failed"),
            (TaskEventKind::RestartSignaled { reason: "r".into() }, "Restart Signaled"),
            (TaskEventKind::Signaling { signal: Signal::Hup, reason: "r".into() }, "Signaling"),
            (TaskEventKind::HookFailed { hook: "h".into(), error: "e".into() }, "Task hook failed"),
            (TaskEventKind::DriverFailure { error: "e".into() }, "Driver Failure"),
            (TaskEventKind::LeaderDead, "Leader Task Dead"),
        ];
        for (kind, name) in table {
            assert_eq!(event_type(&kind), name, "{kind:?}");
        }
    }

    #[test]
    fn terminated_event_carries_exit_code_and_signal_in_nomads_fields() {
        let event = E::new(
            Timestamp(1_700_000_000_123),
            TaskEventKind::Terminated {
                exit_code: 3,
                signal: Some(9),
                oom_killed: false,
                message: None,
            },
        );
        let nomad = task_event(&event);
        assert_eq!(nomad.time, 1_700_000_000_123_000_000);
        assert_eq!((nomad.exit_code, nomad.signal), (3, 9));
        assert_eq!(nomad.details["exit_code"], "3");
        assert_eq!(nomad.display_message, "Exit Code: 3, Signal: 9");
        let killing = task_event(&E::new(
            Timestamp(1),
            TaskEventKind::Killing { signal: Signal::Term, kill_timeout: Duration::from_secs(5) },
        ));
        assert_eq!(killing.kill_timeout, 5_000_000_000);
    }

    #[test]
    fn task_state_times_are_rfc3339_or_go_zero() {
        let mut state = WharfTaskState::new();
        state.started_at = Some(Timestamp(1_000));
        let nomad = task_state(&state);
        assert_eq!(nomad.state, "pending");
        assert_eq!(nomad.started_at, "1970-01-01T00:00:01.000Z");
        assert_eq!(nomad.finished_at, ZERO_TIME);
    }

    #[test]
    fn job_status_follows_its_allocations() {
        assert_eq!(job_status(false, []), "pending");
        assert_eq!(job_status(false, [ClientStatus::Complete, ClientStatus::Running]), "running");
        assert_eq!(job_status(false, [ClientStatus::Complete, ClientStatus::Failed]), "dead");
        assert_eq!(job_status(true, [ClientStatus::Running]), "dead");
    }
}
