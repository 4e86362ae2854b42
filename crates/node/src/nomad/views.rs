//! The node's allocations and the node itself in Nomad's shapes. An allocation a Nomad job
//! placed shows that job; one submitted through wharf's own API shows a job made from its
//! wharf spec (id, name, type), so Nomad's clients see everything the node runs.

use super::common::NomadServer;
use crate::nomad_http::now;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use wharf_alloc::AllocRunner;
use wharf_driver::Health;
use wharf_nomad::shapes::{self, AllocContext};

/// Allocation `runner` as Nomad's `Allocation`.
pub(crate) fn allocation(server: &NomadServer, runner: &AllocRunner) -> shapes::Allocation {
    let alloc = runner.alloc();
    let state = runner.subscribe().borrow().clone();
    let node_name = server.node_name();
    let owner = server.registry.owner_of(runner.id());
    let (job, namespace, name, eval_id, created) = match &owner {
        Some((record, placed)) => {
            let job_name = record.job.get("Name").and_then(Value::as_str).unwrap_or(&alloc.job.id);
            (
                record.job.clone(),
                record.job.get("Namespace").and_then(Value::as_str).unwrap_or("default").to_owned(),
                wharf_nomad::alloc_name(job_name, &placed.group, placed.index),
                placed.eval_id.clone(),
                placed.created,
            )
        }
        None => {
            let created = state
                .task_states
                .values()
                .filter_map(|t| t.events.front().map(|e| e.time))
                .min()
                .unwrap_or_else(now);
            let job = json!({
                "ID": alloc.job.id, "Name": alloc.job.id, "Type": wharf_nomad::type_name(alloc.job.job_type),
                "Namespace": "default", "Region": "global", "Datacenters": ["*"], "Priority": 50,
            });
            let name = wharf_nomad::alloc_name(&alloc.job.id, &alloc.task_group, 0);
            (job, "default".to_owned(), name, String::new(), created)
        }
    };
    let context = AllocContext {
        node_id: &server.node_id,
        node_name: &node_name,
        namespace: &namespace,
        name: &name,
        eval_id: &eval_id,
        job: &job,
        created,
        create_index: created.0,
    };
    shapes::allocation(&alloc, &state, &context)
}

/// Every allocation on the node, newest first (as Nomad sorts them), whose id starts with
/// `prefix`.
pub(crate) fn allocations(server: &NomadServer, prefix: &str) -> Vec<shapes::Allocation> {
    let mut allocs: Vec<shapes::Allocation> = server
        .agent
        .list()
        .iter()
        .filter(|runner| runner.id().starts_with(prefix))
        .map(|runner| allocation(server, runner))
        .collect();
    allocs.sort_by(|a, b| b.create_index.cmp(&a.create_index).then_with(|| a.id.cmp(&b.id)));
    allocs
}

/// The node as Nomad's `Node`.
pub(crate) async fn node(server: &NomadServer) -> shapes::Node {
    let agent = &server.agent;
    let status = agent.node_status().await;
    let config = agent.config();
    let drivers = status
        .drivers
        .iter()
        .map(|(name, fingerprint)| {
            let info = shapes::DriverInfo {
                attributes: fingerprint.attributes.clone(),
                detected: fingerprint.health != Health::Undetected,
                healthy: fingerprint.health == Health::Healthy,
                health_description: fingerprint.description.clone(),
                update_time: now().to_string(),
            };
            (name.clone(), info)
        })
        .collect();
    let mut attributes = BTreeMap::from([
        ("kernel.name".to_owned(), "linux".to_owned()),
        ("cpu.numcores".to_owned(), status.cpu.cores.to_string()),
        ("cpu.frequency".to_owned(), status.cpu.mhz_per_core.to_string()),
        ("cpu.totalcompute".to_owned(), status.cpu.total_mhz.to_string()),
        ("memory.totalbytes".to_owned(), (status.memory_mb * 1024 * 1024).to_string()),
        ("unique.hostname".to_owned(), server.node_name()),
        ("nomad.version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
    ]);
    for name in status.drivers.keys() {
        attributes.insert(format!("driver.{name}"), "1".to_owned());
    }
    let created = server.index();
    shapes::Node {
        id: server.node_id.clone(),
        name: server.node_name(),
        datacenter: "dc1".to_owned(),
        node_class: String::new(),
        node_pool: "default".to_owned(),
        http_addr: server.http_addr(),
        tls_enabled: false,
        attributes,
        node_resources: shapes::NodeResources {
            cpu: shapes::NodeCpuResources {
                cpu_shares: status.cpu.total_mhz,
                total_cpu_cores: u64::from(status.cpu.cores),
                reservable_cpu_cores: (0..u64::from(status.cpu.cores)).collect(),
            },
            memory: shapes::NodeMemoryResources { memory_mb: status.memory_mb },
            disk: shapes::NodeDiskResources { disk_mb: 0 },
            networks: Vec::new(),
            min_dynamic_port: config.network.min_dynamic_port,
            max_dynamic_port: config.network.max_dynamic_port,
        },
        meta: BTreeMap::new(),
        drain: false,
        scheduling_eligibility: "eligible".to_owned(),
        status: if agent.broken().await.is_some() { "down" } else { "ready" }.to_owned(),
        status_description: String::new(),
        status_updated_at: 0,
        drivers,
        create_index: 1,
        modify_index: created,
    }
}
