//! The node's resources and its tasks' containment, as the agent wires them: what the host has
//! (wharf-isolate's `Host`, or the configured totals), what the node keeps for itself, what is
//! left for allocations, and the cgroup manager its drivers share.
//!
//! Admission itself is a pure rule of wharf-state (`Amount::of_group`, `Amount::shortfall`);
//! the agent adds up what its allocations hold and asks it.

use crate::config::NodeConfig;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use wharf_exec::TaskCgroups;
use wharf_isolate::cgroup::NodeCpu;
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, CpuSet, Host};
use wharf_state::resources::Amount;

/// What the node has and keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeResources {
    /// CPU cores.
    pub cores: u32,
    /// The speed of one core, in MHz.
    pub mhz_per_core: u64,
    /// Everything: all cores' MHz, all memory, all cores.
    pub total: Amount,
    /// What the node keeps for itself: no allocation gets it.
    pub reserved: Amount,
    /// The cores it keeps, in the kernel's list format.
    pub reserved_cores: String,
}

impl NodeResources {
    /// The host's resources, with the configured totals and reservation applied.
    pub fn new(config: &NodeConfig, host: &Host) -> NodeResources {
        let settings = &config.resources;
        let cores = host.cores().max(1);
        let total_mhz = match settings.cpu_total_compute {
            0 => host.total_mhz(),
            mhz => mhz,
        };
        let mhz_per_core = total_mhz / u64::from(cores);
        let reserved_cores = CpuSet::parse(&settings.reserved.cores).unwrap_or_default();
        let reserved_core_count = u32::try_from(reserved_cores.len()).unwrap_or(u32::MAX);
        NodeResources {
            cores,
            mhz_per_core,
            total: Amount {
                cpu_mhz: total_mhz,
                memory_mb: match settings.memory_total_mb {
                    0 => host.memory_mb,
                    mb => mb,
                },
                cores,
            },
            reserved: Amount {
                cpu_mhz: settings.reserved.cpu + u64::from(reserved_core_count) * mhz_per_core,
                memory_mb: settings.reserved.memory,
                cores: reserved_core_count,
            },
            reserved_cores: reserved_cores.to_string(),
        }
    }

    /// What allocations may hold between them: the total less the reservation, and of the
    /// cores, one less again (one core always stays shared by tasks that reserve none).
    pub fn allocatable(&self) -> Amount {
        let mut allocatable = self.total.saturating_sub(self.reserved);
        allocatable.cores = allocatable.cores.saturating_sub(1);
        allocatable
    }

    /// What one allocation of `group` needs here.
    pub fn needed(&self, group: &wharf_state::TaskGroup) -> Amount {
        Amount::of_group(group, self.mhz_per_core)
    }
}

/// The cgroup manager the node's drivers share, or why tasks run without cgroups.
pub fn task_cgroups(config: &NodeConfig, resources: &NodeResources) -> TaskCgroups {
    if !config.cgroups.enabled {
        return TaskCgroups::Off { reason: "cgroups.enabled is false".into() };
    }
    let (parent, sweep_siblings) = match &config.cgroups.parent {
        Some(parent) => (CgroupParent::Absolute(parent.clone()), false),
        None => {
            (CgroupParent::UnderOwn(format!("wharf/{}", node_cgroup_name(&config.data_dir))), true)
        }
    };
    let options = CgroupOptions {
        parent,
        pids_max: (config.cgroups.pids_limit > 0).then_some(config.cgroups.pids_limit),
        reserved_cores: CpuSet::parse(&resources.reserved_cores).unwrap_or_default(),
        cpu: NodeCpu { mhz_per_core: resources.mhz_per_core },
        sweep_siblings,
    };
    match Cgroups::open(options) {
        Ok(cgroups) => TaskCgroups::On(Arc::new(cgroups)),
        Err(error) => TaskCgroups::Off { reason: error.to_string() },
    }
}

/// The name of a node's cgroup under `wharf`: its data directory's path with `/` as `-` (and
/// anything but letters, digits, `-`, `_` and `.` as `_`), so two agents on one host never share
/// a parent. A path too long for a cgroup name keeps its end and gains a hash of the whole.
pub fn node_cgroup_name(data_dir: &Path) -> String {
    let path = data_dir.to_string_lossy();
    let name: String = path
        .trim_start_matches('/')
        .chars()
        .map(|c| match c {
            '/' => '-',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => c,
            _ => '_',
        })
        .collect();
    let name = name.trim_start_matches(['.', '-']);
    if name.is_empty() {
        return "root".into();
    }
    if name.len() <= 100 {
        return name.to_owned();
    }
    // FNV-1a: stable across builds, unlike std's hasher.
    let hash = path
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{}-{hash:016x}", &name[name.len() - 80..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_cgroup_names_follow_the_data_directory() {
        assert_eq!(node_cgroup_name(Path::new("/var/lib/wharf")), "var-lib-wharf");
        assert_eq!(node_cgroup_name(Path::new("/tmp/.tmpAb3/data")), "tmp-.tmpAb3-data");
        assert_eq!(node_cgroup_name(Path::new("/srv/my node")), "srv-my_node");
        assert_eq!(node_cgroup_name(Path::new("/")), "root");
        let long = format!("/{}", "d/".repeat(80));
        let name = node_cgroup_name(Path::new(&long));
        assert!(name.len() <= 100, "{name}");
        assert_ne!(name, node_cgroup_name(Path::new(&format!("/x{long}"))));
    }

    #[test]
    fn the_node_keeps_its_reservation_and_one_shared_core() {
        let host =
            Host { cpus: CpuSet::parse("0-3").unwrap(), mhz_per_core: 2000, memory_mb: 8192 };
        let mut config = NodeConfig::default();
        config.resources.reserved.cpu = 500;
        config.resources.reserved.memory = 1024;
        config.resources.reserved.cores = "3".into();
        let resources = NodeResources::new(&config, &host);
        assert_eq!(resources.total, Amount { cpu_mhz: 8000, memory_mb: 8192, cores: 4 });
        assert_eq!(resources.reserved, Amount { cpu_mhz: 2500, memory_mb: 1024, cores: 1 });
        assert_eq!(resources.allocatable(), Amount { cpu_mhz: 5500, memory_mb: 7168, cores: 2 });

        config.resources.cpu_total_compute = 4000;
        config.resources.memory_total_mb = 2048;
        let resources = NodeResources::new(&config, &host);
        assert_eq!((resources.mhz_per_core, resources.total.memory_mb), (1000, 2048));
    }
}
