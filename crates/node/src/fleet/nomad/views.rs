//! The fleet's work and workers in Nomad's shapes. An allocation's status is the
//! scheduler's; its task states are its worker agent's, asked for the attempt that runs
//! there, where the fleet reaches that agent. Work a Nomad job placed shows that job; work
//! submitted through the fleet's own API shows a job made from its spec.

use super::server::FleetNomad;
use crate::client::Client;
use crate::fleet::wiring::Leading;
use crate::nomad_http::now;
use axum::http::Method;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use wharf_fleet::{Placement, WorkPhase};
use wharf_nomad::shapes;
use wharf_prober::{IdleBehavior, InstanceId, State as WorkerState, WorkerView};
use wharf_state::{ClientStatus, Timestamp};

/// The longest the fleet waits for a worker's agent to answer a read.
const AGENT_READ: Duration = Duration::from_secs(2);

/// The most a read of a worker's agent through its SSH relay takes in.
const AGENT_READ_LIMIT: u64 = 4 * 1024 * 1024;

/// A client of worker `worker`'s agent, with that agent's token, where the fleet knows its
/// data directory.
pub(super) fn agent_client(leading: &Leading, worker: &str) -> Option<Client> {
    let data_dir = leading.extra().agent_data_dir(&InstanceId(worker.to_owned()))?;
    Some(Client::of_data_dir(&data_dir, None))
}

/// `host:port` of worker `worker`'s agent, as it announced it.
pub(super) fn agent_address(leading: &Leading, worker: &str) -> Option<String> {
    let data_dir = leading.extra().agent_data_dir(&InstanceId(worker.to_owned()))?;
    let file = crate::agent_file::AgentFile::read(&data_dir).ok()??;
    Some(file.address.trim_start_matches("http://").to_owned())
}

/// A JSON read of worker `worker`'s agent, bounded; none if it cannot be had.
async fn agent_read<T: serde::de::DeserializeOwned>(
    leading: &Leading,
    worker: &str,
    path: &str,
) -> Option<T> {
    let Some(client) = agent_client(leading, worker) else {
        // A worker reached over SSH alone: read through its relay.
        let relay = leading.extra().agent_relay(&InstanceId(worker.to_owned()))?;
        let who = format!("node {worker}'s agent");
        let read = super::relay::read_over_ssh(&relay, &who, path, AGENT_READ_LIMIT);
        return match tokio::time::timeout(AGENT_READ, read).await {
            Ok(Ok(body)) => serde_json::from_slice(&body)
                .inspect_err(|error| tracing::debug!(%worker, %path, %error, "the worker's agent answered what is not the JSON asked"))
                .ok(),
            Ok(Err(error)) => {
                tracing::debug!(%worker, %path, error = %error.message, "the worker's agent gave no answer");
                None
            }
            Err(_) => {
                tracing::debug!(%worker, %path, "the worker's agent did not answer in time");
                None
            }
        };
    };
    match tokio::time::timeout(AGENT_READ, client.json::<T>(Method::GET, path, None)).await {
        Ok(Ok(value)) => Some(value),
        Ok(Err(error)) => {
            tracing::debug!(%worker, %path, %error, "the worker's agent gave no answer");
            None
        }
        Err(_) => {
            tracing::debug!(%worker, %path, "the worker's agent did not answer in time");
            None
        }
    }
}

/// The client status the scheduler's phase implies.
pub(super) fn client_status(phase: &WorkPhase) -> ClientStatus {
    match phase {
        WorkPhase::Queued | WorkPhase::Starting { .. } => ClientStatus::Pending,
        WorkPhase::Running { .. } => ClientStatus::Running,
        WorkPhase::Ended { outcome, .. } if outcome.starts_with("failed") => ClientStatus::Failed,
        WorkPhase::Ended { .. } | WorkPhase::Cancelled => ClientStatus::Complete,
        WorkPhase::Lost { .. } => ClientStatus::Lost,
        WorkPhase::Failed { .. } => ClientStatus::Failed,
    }
}

/// What a Nomad job says of one of its allocations: the job, its namespace, the
/// allocation's name, the evaluation that placed it, and when.
struct Owner {
    job: Value,
    namespace: String,
    name: String,
    group: String,
    eval_id: String,
    created: Timestamp,
}

/// The owner of work the fleet's own API took: a job made from its spec.
fn owner_of_spec(placement: &Placement, payload: &str) -> Owner {
    let spec = wharf_state::spec::parse_json(payload).ok();
    let (job_id, job_type, group) = match &spec {
        Some(job) => (
            job.id.clone(),
            wharf_nomad::type_name(job.job_type),
            job.groups.first().map(|g| g.name.clone()).unwrap_or_default(),
        ),
        None => (placement.id.clone(), "batch", String::new()),
    };
    Owner {
        job: json!({
            "ID": job_id, "Name": job_id, "Type": job_type, "Namespace": "default",
            "Region": "global", "Datacenters": ["*"], "Priority": 50,
        }),
        namespace: "default".to_owned(),
        name: wharf_nomad::alloc_name(&job_id, &group, 0),
        group,
        eval_id: String::new(),
        created: placement.submitted,
    }
}

fn owner(server: &FleetNomad, placement: &Placement, payload: &str) -> Owner {
    match server.registry.owner_of(&placement.id) {
        Some((record, placed)) => {
            let job_name = record.job.get("Name").and_then(Value::as_str).unwrap_or_default();
            Owner {
                namespace: record
                    .job
                    .get("Namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_owned(),
                name: wharf_nomad::alloc_name(job_name, &placed.group, placed.index),
                group: placed.group,
                eval_id: placed.eval_id.clone(),
                created: placed.created,
                job: record.job,
            }
        }
        None => owner_of_spec(placement, payload),
    }
}

/// Work `placement` (its spec `payload`) as Nomad's `Allocation`.
pub(super) async fn allocation(
    server: &FleetNomad,
    leading: &Leading,
    placement: &Placement,
    payload: &str,
) -> shapes::Allocation {
    let owner = owner(server, placement, payload);
    let worker = placement.phase.worker().map(str::to_owned);
    // What the worker's agent says of the attempt it runs, while it still has it.
    let on_worker: Option<shapes::Allocation> = match &worker {
        Some(worker) => {
            let path = format!("/v1/allocation/{}", placement.runner_id());
            agent_read(leading, worker, &path).await
        }
        None => None,
    };
    let fleet_status = client_status(&placement.phase);
    let client_status = match (&on_worker, &placement.phase) {
        // The scheduler's word is final once the work is done with; before, the agent's.
        (Some(seen), phase) if !phase.is_final() => seen.client_status.clone(),
        _ => fleet_status.to_string(),
    };
    let changed = [Some(placement.submitted), placement.started, placement.finished]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or_else(now);
    let task_group = match &on_worker {
        Some(seen) => seen.task_group.clone(),
        None => owner.group,
    };
    let job_id = owner.job.get("ID").and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut alloc = shapes::Allocation {
        id: placement.id.clone(),
        namespace: owner.namespace,
        eval_id: owner.eval_id,
        name: owner.name,
        node_id: worker.clone().unwrap_or_default(),
        node_name: worker.unwrap_or_default(),
        job_id,
        job: owner.job,
        task_group,
        desired_status: if placement.stop_requested { "stop" } else { "run" }.to_owned(),
        desired_description: String::new(),
        client_status,
        client_description: match &placement.phase {
            WorkPhase::Ended { outcome, .. } => outcome.clone(),
            WorkPhase::Lost { reason, .. } | WorkPhase::Failed { reason } => reason.clone(),
            _ => String::new(),
        },
        task_states: BTreeMap::new(),
        deployment_id: String::new(),
        deployment_status: None,
        followup_eval_id: String::new(),
        previous_allocation: String::new(),
        next_allocation: String::new(),
        preempted_allocations: Vec::new(),
        preempted_by_allocation: String::new(),
        create_index: owner.created.0,
        modify_index: changed.0.max(owner.created.0),
        alloc_modify_index: owner.created.0,
        create_time: shapes::nanos(owner.created),
        modify_time: shapes::nanos(changed),
    };
    if let Some(seen) = on_worker {
        alloc.task_states = seen.task_states;
        alloc.deployment_status = seen.deployment_status;
        alloc.modify_index = alloc.modify_index.max(seen.modify_index);
        alloc.modify_time = alloc.modify_time.max(seen.modify_time);
        if alloc.client_description.is_empty() {
            alloc.client_description = seen.client_description;
        }
    }
    alloc
}

/// Every placement of `placements` as Nomad's `Allocation`, its workers' agents asked at
/// once, so that a list takes one agent's answer time, not the sum of them.
pub(super) async fn allocations(
    server: &FleetNomad,
    leading: &Leading,
    placements: &[Placement],
) -> Vec<shapes::Allocation> {
    let scheduler = leading.scheduler();
    let payloads: Vec<_> =
        placements.iter().map(|p| scheduler.payload(&p.id).unwrap_or_default()).collect();
    let views = placements
        .iter()
        .zip(&payloads)
        .map(|(placement, payload)| allocation(server, leading, placement, payload));
    futures_util::future::join_all(views).await
}

/// Worker `view` as Nomad's `Node`: what the prober knows, with its agent's drivers,
/// attributes and resources where the fleet reaches the agent.
pub(super) async fn node(leading: &Leading, view: &WorkerView) -> shapes::Node {
    let id = view.id.0.clone();
    let from_agent = agent_node(leading, &id).await;
    let resources = view.resources;
    let (status, description) = match view.state {
        WorkerState::Idle | WorkerState::Running => ("ready", String::new()),
        WorkerState::Unknown | WorkerState::Booting => ("initializing", String::new()),
        WorkerState::Shutdown => ("down", "shut down by the fleet".to_owned()),
    };
    let mut node = shapes::Node {
        id: id.clone(),
        name: id.clone(),
        datacenter: "dc1".to_owned(),
        node_class: view.instance_type.clone(),
        node_pool: "default".to_owned(),
        // A worker reached over SSH alone: its client calls go to the fleet, which relays them.
        http_addr: agent_address(leading, &id)
            .or_else(|| {
                let relay = leading.extra().agent_relay(&view.id)?;
                Some(relay.fleet_address.trim_start_matches("http://").to_owned())
            })
            .unwrap_or_default(),
        tls_enabled: false,
        attributes: BTreeMap::new(),
        node_resources: shapes::NodeResources {
            cpu: shapes::NodeCpuResources {
                cpu_shares: resources.map_or(0, |r| r.cpu_mhz),
                total_cpu_cores: resources.map_or(0, |r| u64::from(r.cores)),
                reservable_cpu_cores: (0..resources.map_or(0, |r| u64::from(r.cores))).collect(),
            },
            memory: shapes::NodeMemoryResources { memory_mb: resources.map_or(0, |r| r.memory_mb) },
            disk: shapes::NodeDiskResources { disk_mb: 0 },
            networks: Vec::new(),
            min_dynamic_port: 0,
            max_dynamic_port: 0,
        },
        meta: BTreeMap::new(),
        drain: view.idle_behavior == IdleBehavior::Drain,
        scheduling_eligibility: if view.idle_behavior == IdleBehavior::Run {
            "eligible"
        } else {
            "ineligible"
        }
        .to_owned(),
        status: status.to_owned(),
        status_description: description,
        status_updated_at: 0,
        drivers: BTreeMap::new(),
        create_index: 1,
        modify_index: 1,
    };
    if let Some(agent) = from_agent {
        node.attributes = agent.attributes;
        node.node_resources = agent.node_resources;
        node.drivers = agent.drivers;
        node.modify_index = agent.modify_index;
    }
    node
}

/// The node worker `worker`'s agent says it is.
async fn agent_node(leading: &Leading, worker: &str) -> Option<shapes::Node> {
    let stubs: Vec<shapes::NodeListStub> = agent_read(leading, worker, "/v1/nodes").await?;
    let id = &stubs.first()?.id;
    agent_read(leading, worker, &format!("/v1/node/{id}")).await
}
