//! Allocations and their state: what the node was asked to run and how it is going.
//!
//! [`client_status`] derives an allocation's status from its task states; [`AllocState::settle`]
//! applies what follows once the allocation is terminal. Both are pure so the alloc runner, the
//! API and tests agree on them.

use crate::spec::{Job, TaskGroup};
use crate::task_state::{TaskState, TaskStatus};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// One task group of a job, placed on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Unique on the node; `[A-Za-z0-9_-]{1,64}` since it names directories and store keys.
    pub id: String,
    /// The job it belongs to.
    pub job: Job,
    /// Which of the job's groups it runs.
    pub task_group: String,
    /// What the allocation should be doing.
    pub desired_status: DesiredStatus,
    /// Grows with every change of the allocation; an older update never replaces a newer one.
    pub modify_index: u64,
    /// The deployment it is part of, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_id: Option<String>,
    /// The node's ports it holds, one per port of its group's network, set when the node
    /// accepted it and held until it ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<AllocatedPort>,
}

/// A port of the node held by an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocatedPort {
    /// The label in the group's `network.port.<label>`.
    pub label: String,
    /// The port number.
    pub value: u16,
    /// The address it is reached at.
    pub host_ip: IpAddr,
}

impl AllocatedPort {
    /// `ip:port`, with brackets around an IPv6 address.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(self.host_ip, self.value)
    }
}

/// What the allocation should be doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    /// Run it.
    Run,
    /// Stop it.
    Stop,
    /// Stop it to make room for something else.
    Evict,
}

/// An allocation whose task group is not in its job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allocation {alloc_id} names task group {group:?}, which job {job_id:?} does not have")]
pub struct MissingGroup {
    /// The allocation.
    pub alloc_id: String,
    /// Its job.
    pub job_id: String,
    /// The group it names.
    pub group: String,
}

/// An id that cannot name an allocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allocation id {0:?}: it must match [A-Za-z0-9_-]{{1,64}}")]
pub struct InvalidAllocId(pub String);

/// Checks that `id` can name an allocation: it becomes a directory name and a store key.
pub fn check_alloc_id(id: &str) -> Result<(), InvalidAllocId> {
    let valid = (1..=64).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid { Ok(()) } else { Err(InvalidAllocId(id.to_owned())) }
}

impl Allocation {
    /// Allocation `id` of `job`'s group `task_group`, to run, at modify index 0 and in no
    /// deployment. Later updates carry a larger `modify_index`.
    ///
    /// The id becomes a directory name and a store key: [`check_alloc_id`] says whether it can.
    pub fn new(id: impl Into<String>, job: Job, task_group: impl Into<String>) -> Allocation {
        Allocation {
            id: id.into(),
            job,
            task_group: task_group.into(),
            desired_status: DesiredStatus::Run,
            modify_index: 0,
            deployment_id: None,
            ports: Vec::new(),
        }
    }

    /// The task group this allocation runs.
    pub fn group(&self) -> Result<&TaskGroup, MissingGroup> {
        self.job.group(&self.task_group).ok_or_else(|| MissingGroup {
            alloc_id: self.id.clone(),
            job_id: self.job.id.clone(),
            group: self.task_group.clone(),
        })
    }

    /// The port it holds under `label`, if any.
    pub fn port(&self, label: &str) -> Option<&AllocatedPort> {
        self.ports.iter().find(|p| p.label == label)
    }

    /// The server side wants it stopped: no task should start.
    pub fn server_terminal(&self) -> bool {
        matches!(self.desired_status, DesiredStatus::Stop | DesiredStatus::Evict)
    }
}

/// An allocation's status as the node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    /// No task has started yet.
    Pending,
    /// At least one task runs and none failed.
    Running,
    /// Every task finished without failing.
    Complete,
    /// A task failed.
    Failed,
    /// The node lost track of it (its worker went away).
    Lost,
}

impl ClientStatus {
    /// Every status, in the order an allocation goes through them.
    pub const ALL: [ClientStatus; 5] = [
        ClientStatus::Pending,
        ClientStatus::Running,
        ClientStatus::Complete,
        ClientStatus::Failed,
        ClientStatus::Lost,
    ];

    /// Complete, failed and lost allocations never run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost)
    }
}

/// A word that is no client status's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown client status {0:?}: one of pending, running, complete, failed, lost")]
pub struct UnknownClientStatus(pub String);

impl std::str::FromStr for ClientStatus {
    type Err = UnknownClientStatus;

    /// The name its `Display` prints, exactly.
    fn from_str(name: &str) -> Result<ClientStatus, UnknownClientStatus> {
        ClientStatus::ALL
            .into_iter()
            .find(|status| status.to_string() == name)
            .ok_or_else(|| UnknownClientStatus(name.to_owned()))
    }
}

impl fmt::Display for ClientStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClientStatus::Pending => "pending",
            ClientStatus::Running => "running",
            ClientStatus::Complete => "complete",
            ClientStatus::Failed => "failed",
            ClientStatus::Lost => "lost",
        })
    }
}

/// The status of an allocation with these task states and why: failed beats running beats
/// pending beats complete. None when there are no tasks.
pub fn client_status<'a>(
    task_states: impl IntoIterator<Item = &'a TaskState>,
) -> Option<(ClientStatus, &'static str)> {
    let (mut pending, mut running, mut complete, mut failed) = (false, false, false, false);
    for state in task_states {
        match state.status {
            TaskStatus::Pending => pending = true,
            TaskStatus::Running => running = true,
            TaskStatus::Dead if state.failed => failed = true,
            TaskStatus::Dead => complete = true,
        }
    }
    if failed {
        Some((ClientStatus::Failed, "Failed tasks"))
    } else if running {
        Some((ClientStatus::Running, "Tasks are running"))
    } else if pending {
        Some((ClientStatus::Pending, "No tasks have started"))
    } else if complete {
        Some((ClientStatus::Complete, "All tasks have completed"))
    } else {
        None
    }
}

/// Health of an allocation within a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeploymentStatus {
    /// None until health is known.
    pub healthy: Option<bool>,
    /// When health was last set.
    pub timestamp: Option<Timestamp>,
    /// Why it is unhealthy, when it is and the node knows why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether the allocation is a canary.
    pub canary: bool,
    /// Grows with every change.
    pub modify_index: u64,
}

/// Everything the node reports about an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocState {
    /// Derived from the task states unless the node forced it (lost).
    pub client_status: ClientStatus,
    /// Why it has that status.
    pub client_description: String,
    /// Each task's state, by task name.
    pub task_states: BTreeMap<String, TaskState>,
    /// Health in its deployment, if it is part of one.
    pub deployment_status: Option<DeploymentStatus>,
}

impl AllocState {
    /// The state of an allocation none of whose tasks has started.
    pub fn pending(task_names: impl IntoIterator<Item = String>) -> AllocState {
        AllocState {
            client_status: ClientStatus::Pending,
            client_description: "No tasks have started".into(),
            task_states: task_names.into_iter().map(|name| (name, TaskState::new())).collect(),
            deployment_status: None,
        }
    }

    /// Recomputes the status from the task states and, once terminal, finishes the picture: every
    /// task gets a `finished_at` (at `now` if it has none) and a failed allocation in a
    /// deployment whose health is unknown is marked unhealthy. A forced `lost` status stays.
    pub fn settle(&mut self, in_deployment: bool, now: Timestamp) {
        if self.client_status != ClientStatus::Lost
            && let Some((status, description)) = client_status(self.task_states.values())
        {
            self.client_status = status;
            self.client_description = description.to_owned();
        }
        if !self.client_status.is_terminal() {
            return;
        }
        for state in self.task_states.values_mut() {
            state.finished_at.get_or_insert(now);
        }
        if in_deployment && self.client_status == ClientStatus::Failed {
            let deployment = self.deployment_status.get_or_insert_with(DeploymentStatus::default);
            if deployment.healthy.is_none() {
                deployment.healthy = Some(false);
                deployment.timestamp = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_state::TaskStatus::*;

    fn task(status: TaskStatus, failed: bool) -> TaskState {
        TaskState { status, failed, ..TaskState::new() }
    }

    /// A status's name reads back as that status, and is the one its JSON carries.
    #[test]
    fn client_status_names_read_back_and_match_the_json() {
        for status in ClientStatus::ALL {
            let name = status.to_string();
            assert_eq!(name.parse::<ClientStatus>(), Ok(status));
            assert_eq!(serde_json::to_string(&status).unwrap(), format!("\"{name}\""));
        }
        let unknown = "Running".parse::<ClientStatus>().unwrap_err();
        assert!(unknown.to_string().contains("\"Running\""), "{unknown}");
    }

    /// Every combination of the four kinds of task an allocation can hold, against the rule
    /// written out independently: failed > running > pending > complete.
    #[test]
    fn client_status_on_every_combination() {
        let kinds =
            [task(Pending, false), task(Running, false), task(Dead, false), task(Dead, true)];
        for mask in 0u8..16 {
            for copies in 1..=2 {
                let states: Vec<TaskState> = (0..4)
                    .filter(|bit| mask & (1 << bit) != 0)
                    .flat_map(|bit| std::iter::repeat_n(kinds[bit].clone(), copies))
                    .collect();
                let has = |bit: u8| mask & (1 << bit) != 0;
                let want = if has(3) {
                    Some((ClientStatus::Failed, "Failed tasks"))
                } else if has(1) {
                    Some((ClientStatus::Running, "Tasks are running"))
                } else if has(0) {
                    Some((ClientStatus::Pending, "No tasks have started"))
                } else if has(2) {
                    Some((ClientStatus::Complete, "All tasks have completed"))
                } else {
                    None
                };
                assert_eq!(client_status(&states), want, "mask {mask:04b}");
                // Order of tasks never matters.
                assert_eq!(client_status(states.iter().rev()), want, "mask {mask:04b} reversed");
            }
        }
    }

    #[test]
    fn terminal_statuses() {
        use ClientStatus::*;
        for (status, terminal) in
            [(Pending, false), (Running, false), (Complete, true), (Failed, true), (Lost, true)]
        {
            assert_eq!(status.is_terminal(), terminal, "{status}");
        }
    }

    #[test]
    fn settle_backfills_finish_times_and_marks_failed_deployments_unhealthy() {
        let mut state = AllocState::pending(["a".to_owned(), "b".to_owned()]);
        state.task_states.get_mut("a").unwrap().status = Dead;
        state.task_states.get_mut("a").unwrap().failed = true;
        state.task_states.get_mut("a").unwrap().finished_at = Some(Timestamp(5));
        state.task_states.get_mut("b").unwrap().status = Dead;
        state.settle(true, Timestamp(9));
        assert_eq!(state.client_status, ClientStatus::Failed);
        assert_eq!(state.task_states["a"].finished_at, Some(Timestamp(5)), "kept");
        assert_eq!(state.task_states["b"].finished_at, Some(Timestamp(9)), "back-filled");
        assert_eq!(state.deployment_status.as_ref().unwrap().healthy, Some(false));

        let mut running = AllocState::pending(["a".to_owned()]);
        running.task_states.get_mut("a").unwrap().status = Running;
        running.settle(true, Timestamp(9));
        assert_eq!(running.client_status, ClientStatus::Running);
        assert_eq!(running.task_states["a"].finished_at, None);
        assert_eq!(running.deployment_status, None);

        let mut lost = AllocState::pending(["a".to_owned()]);
        lost.client_status = ClientStatus::Lost;
        lost.settle(false, Timestamp(3));
        assert_eq!(lost.client_status, ClientStatus::Lost, "a forced lost status stays");
    }

    #[test]
    fn alloc_ids() {
        assert!(check_alloc_id("6f1c-web_0").is_ok());
        for bad in ["", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(check_alloc_id(bad).is_err(), "{bad:?}");
        }
    }
}
