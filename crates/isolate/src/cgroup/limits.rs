//! What a task's `resources` become in its cgroup: pure arithmetic, tested as a table.
//!
//! | resources | v1 file | v2 file |
//! |---|---|---|
//! | `memory` (or `memory_max` when set) | `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`: no swap) | `memory.max` (and `memory.swap.max` 0) |
//! | `memory` below `memory_max` | `memory.soft_limit_in_bytes` | `memory.low` |
//! | `cpu` (MHz; with `cores`, their MHz) | `cpu.shares` | `cpu.weight` |
//! | `cpu_hard_limit` | `cpu.cfs_quota_us` over `cpu.cfs_period_us` | `cpu.max` |
//! | `cores` | `cpuset.cpus` | `cpuset.cpus` |
//! | node's `pids_limit` | `pids.max` | `pids.max` |
//!
//! A hard CPU limit is the task's share of the node's total MHz turned into time: a task with
//! `cpu = 1300` on cores of 2600 MHz may run half a core, so its quota is half of each period.

use wharf_state::spec::Resources;

/// The kernel's bounds on `cpu.shares`.
const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
/// The kernel's bounds on a CFS quota and period, in microseconds.
const MIN_QUOTA_US: u64 = 1_000;
/// The default CFS period, as the kernel's and Nomad's (`cpu_cfs_period`).
pub const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// The limits of one task's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The hard memory limit, in bytes.
    pub memory_max: u64,
    /// The reservation below it, when the task may burst above it (`memory_max`).
    pub memory_low: Option<u64>,
    /// The CPU weight as v1 shares (v2's weight is derived from it).
    pub cpu_shares: u64,
    /// A CFS quota, for `cpu_hard_limit`.
    pub cpu_quota: Option<CpuQuota>,
    /// Whole cores to reserve.
    pub cores: u32,
    /// The most processes and threads the task may have.
    pub pids_max: Option<u64>,
}

/// CPU time per period, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    /// Time the task may run in each period.
    pub quota_us: u64,
    /// The period.
    pub period_us: u64,
}

/// How fast the node's cores are, which turns MHz into shares of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCpu {
    /// The speed of one core, in MHz.
    pub mhz_per_core: u64,
}

impl Limits {
    /// The limits for `resources`. `hard_limit_period_us` is set for a task whose driver
    /// config asks for `cpu_hard_limit` (with its `cpu_cfs_period`).
    pub fn new(
        resources: &Resources,
        node: NodeCpu,
        hard_limit_period_us: Option<u64>,
        pids_max: Option<u64>,
    ) -> Limits {
        const MIB: u64 = 1 << 20;
        let mhz = if resources.cores > 0 {
            u64::from(resources.cores) * node.mhz_per_core
        } else {
            u64::from(resources.cpu)
        };
        let memory = u64::from(resources.memory) * MIB;
        let memory_max = u64::from(resources.memory_limit()) * MIB;
        let cpu_quota = hard_limit_period_us.map(|period_us| {
            let quota_us = if resources.cores > 0 {
                u64::from(resources.cores) * period_us
            } else {
                (u128::from(period_us) * u128::from(mhz) / u128::from(node.mhz_per_core.max(1)))
                    .try_into()
                    .unwrap_or(u64::MAX)
            };
            CpuQuota { quota_us: quota_us.max(MIN_QUOTA_US), period_us }
        });
        Limits {
            memory_max,
            memory_low: (memory_max > memory).then_some(memory),
            cpu_shares: mhz.clamp(MIN_SHARES, MAX_SHARES),
            cpu_quota,
            cores: resources.cores,
            pids_max,
        }
    }

    /// The v2 `cpu.weight` (1 to 10,000) of these shares, as runc and systemd convert them.
    pub fn cpu_weight(&self) -> u64 {
        1 + (self.cpu_shares.clamp(MIN_SHARES, MAX_SHARES) - MIN_SHARES) * 9_999
            / (MAX_SHARES - MIN_SHARES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const NODE: NodeCpu = NodeCpu { mhz_per_core: 2600 };

    fn resources(cpu: u32, memory: u32, memory_max: Option<u32>, cores: u32) -> Resources {
        Resources { cpu, memory, memory_max, cores }
    }

    #[test]
    fn resources_become_limits() {
        let cases = [
            // (resources, hard limit period, expected)
            (
                resources(500, 256, None, 0),
                None,
                Limits {
                    memory_max: 256 * MIB,
                    memory_low: None,
                    cpu_shares: 500,
                    cpu_quota: None,
                    cores: 0,
                    pids_max: Some(64),
                },
            ),
            (
                resources(500, 256, Some(1024), 0),
                None,
                Limits {
                    memory_max: 1024 * MIB,
                    memory_low: Some(256 * MIB),
                    cpu_shares: 500,
                    cpu_quota: None,
                    cores: 0,
                    pids_max: Some(64),
                },
            ),
            // Half a core's MHz is half of each period.
            (
                resources(1300, 64, None, 0),
                Some(100_000),
                Limits {
                    memory_max: 64 * MIB,
                    memory_low: None,
                    cpu_shares: 1300,
                    cpu_quota: Some(CpuQuota { quota_us: 50_000, period_us: 100_000 }),
                    cores: 0,
                    pids_max: Some(64),
                },
            ),
            // More than a core's MHz spans cores.
            (
                resources(3900, 64, None, 0),
                Some(20_000),
                Limits {
                    memory_max: 64 * MIB,
                    memory_low: None,
                    cpu_shares: 3900,
                    cpu_quota: Some(CpuQuota { quota_us: 30_000, period_us: 20_000 }),
                    cores: 0,
                    pids_max: Some(64),
                },
            ),
            // A tiny share still gets the kernel's smallest quota.
            (
                resources(1, 64, None, 0),
                Some(100_000),
                Limits {
                    memory_max: 64 * MIB,
                    memory_low: None,
                    cpu_shares: 2,
                    cpu_quota: Some(CpuQuota { quota_us: 1_000, period_us: 100_000 }),
                    cores: 0,
                    pids_max: Some(64),
                },
            ),
            // Reserved cores weigh their MHz and limit to themselves.
            (
                resources(100, 64, None, 2),
                Some(100_000),
                Limits {
                    memory_max: 64 * MIB,
                    memory_low: None,
                    cpu_shares: 5200,
                    cpu_quota: Some(CpuQuota { quota_us: 200_000, period_us: 100_000 }),
                    cores: 2,
                    pids_max: Some(64),
                },
            ),
        ];
        for (resources, period, expected) in cases {
            assert_eq!(Limits::new(&resources, NODE, period, Some(64)), expected, "{resources:?}");
        }
    }

    #[test]
    fn shares_become_v2_weights_on_runcs_scale() {
        let weight = |shares| {
            Limits { cpu_shares: shares, ..Limits::new(&Resources::default(), NODE, None, None) }
                .cpu_weight()
        };
        assert_eq!(weight(2), 1);
        assert_eq!(weight(1024), 39);
        assert_eq!(weight(262_144), 10_000);
        assert_eq!(weight(1_000_000), 10_000);
    }
}
