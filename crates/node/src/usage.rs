//! What the API, the CLI and the metrics show of the node's resources and of tasks' usage:
//! `GET /v1/node` ([`NodeStatus`]), `GET /v1/allocations/{id}/stats` ([`AllocStats`]), the
//! Prometheus series of both, and their text for `wharf node status` and `wharf alloc status`.
//!
//! The figures come from elsewhere: the node's from [`crate::resources`], a task's from its
//! driver (`Driver::task_stats`: its cgroup, or `/proc` without one).

use crate::metrics::{Family, MetricKind, escape as label};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use wharf_driver::{Fingerprint, ResourceUsage, UsageSource};
use wharf_state::resources::Amount;

/// `GET /v1/node`: what the node has, keeps, gives and has left, and its drivers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node's CPU.
    pub cpu: NodeCpuStatus,
    /// Its memory, in MiB.
    pub memory_mb: u64,
    /// What it keeps for itself (configured).
    pub reserved: Amount,
    /// The cores it keeps, in the kernel's list format.
    pub reserved_cores: String,
    /// What the allocations that may still run hold between them.
    pub allocated: Amount,
    /// How many such allocations there are.
    pub allocations: usize,
    /// What is left for new allocations (one core always stays shared, so `free.cores` is at
    /// most the usable cores less one).
    pub free: Amount,
    /// How tasks are contained.
    pub cgroups: CgroupsStatus,
    /// Each driver's fingerprint (its health and why).
    pub drivers: BTreeMap<String, Fingerprint>,
}

/// The resources line a prober reads (wharf-prober's `Resources`): what the node can give work
/// in all (what allocations hold plus what is free), then what is free now.
pub fn probe_line(status: &NodeStatus) -> String {
    let all = status.allocated + status.free;
    let free = status.free;
    format!(
        "cpu_mhz={} memory_mb={} cores={} free_cpu_mhz={} free_memory_mb={} free_cores={}",
        all.cpu_mhz, all.memory_mb, all.cores, free.cpu_mhz, free.memory_mb, free.cores
    )
}

/// The node's CPU, as `GET /v1/node` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCpuStatus {
    /// Cores.
    pub cores: u32,
    /// The speed of one, in MHz.
    pub mhz_per_core: u64,
    /// All of them, in MHz.
    pub total_mhz: u64,
}

/// Whether tasks get cgroups, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupsStatus {
    /// Tasks get cgroups.
    pub enabled: bool,
    /// `v1` or `v2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The parent of the task cgroups, one directory per hierarchy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    /// Why tasks get none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl CgroupsStatus {
    /// The status of a driver-side choice.
    pub fn of(cgroups: &wharf_exec::TaskCgroups) -> CgroupsStatus {
        match cgroups {
            wharf_exec::TaskCgroups::On(manager) => CgroupsStatus {
                enabled: true,
                version: Some(manager.version().to_string()),
                parents: manager.parents().iter().map(|p| p.display().to_string()).collect(),
                reason: None,
            },
            wharf_exec::TaskCgroups::Off { reason } => CgroupsStatus {
                enabled: false,
                version: None,
                parents: Vec::new(),
                reason: Some(reason.clone()),
            },
        }
    }
}

/// `GET /v1/allocations/{id}/stats`: each running task's usage and their sum.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocStats {
    /// Each running task's usage, by task name.
    pub tasks: BTreeMap<String, TaskUsage>,
    /// Their sum.
    pub total: TaskUsage,
}

/// One task's usage, in units people read (seconds, bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskUsage {
    /// Where the figures come from: `cgroup` (every figure) or `proc` (CPU total, RSS and
    /// processes only).
    pub source: UsageSource,
    /// CPU.
    pub cpu: CpuUsage,
    /// Memory.
    pub memory: MemoryUsage,
    /// Processes (with a cgroup: processes and threads).
    pub processes: u32,
}

/// A task's CPU usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUsage {
    /// User plus system time, in seconds.
    pub total_seconds: f64,
    /// User time, in seconds.
    pub user_seconds: f64,
    /// System time, in seconds.
    pub system_seconds: f64,
    /// CFS periods in which a quota held the task back.
    pub throttled_periods: u64,
    /// How long it was held back, in seconds.
    pub throttled_seconds: f64,
}

/// A task's memory usage, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryUsage {
    /// Resident memory.
    pub rss_bytes: u64,
    /// Page cache.
    pub cache_bytes: u64,
    /// Swap.
    pub swap_bytes: u64,
    /// The most it has had at once.
    pub max_usage_bytes: u64,
}

impl From<&ResourceUsage> for TaskUsage {
    fn from(usage: &ResourceUsage) -> TaskUsage {
        TaskUsage {
            source: usage.source,
            cpu: CpuUsage {
                total_seconds: usage.cpu_time.as_secs_f64(),
                user_seconds: usage.cpu_user.as_secs_f64(),
                system_seconds: usage.cpu_system.as_secs_f64(),
                throttled_periods: usage.cpu_throttled_periods,
                throttled_seconds: usage.cpu_throttled.as_secs_f64(),
            },
            memory: MemoryUsage {
                rss_bytes: usage.memory_rss_bytes,
                cache_bytes: usage.memory_cache_bytes,
                swap_bytes: usage.memory_swap_bytes,
                max_usage_bytes: usage.memory_max_usage_bytes,
            },
            processes: usage.processes,
        }
    }
}

impl From<&wharf_alloc::AllocUsage> for AllocStats {
    fn from(usage: &wharf_alloc::AllocUsage) -> AllocStats {
        AllocStats {
            tasks: usage.tasks.iter().map(|(name, u)| (name.clone(), TaskUsage::from(u))).collect(),
            total: TaskUsage::from(&usage.total),
        }
    }
}

/// The Prometheus series of the node's resources.
pub fn node_series(status: &NodeStatus) -> Vec<Family<'static>> {
    let states = [
        (
            "total",
            Amount {
                cpu_mhz: status.cpu.total_mhz,
                memory_mb: status.memory_mb,
                cores: status.cpu.cores,
            },
        ),
        ("reserved", status.reserved),
        ("allocated", status.allocated),
        ("free", status.free),
    ];
    let family = |pick: fn(&Amount) -> f64| -> Vec<(String, f64)> {
        states.iter().map(|(state, amount)| (format!("state=\"{state}\""), pick(amount))).collect()
    };
    vec![
        Family::labelled(
            "wharf_node_cpu_mhz",
            "The node's CPU in MHz: all of it, kept for itself, held by allocations, free.",
            MetricKind::Gauge,
            family(|a| a.cpu_mhz as f64),
        ),
        Family::labelled(
            "wharf_node_memory_bytes",
            "The node's memory: all of it, kept for itself, held by allocations, free.",
            MetricKind::Gauge,
            family(|a| (a.memory_mb << 20) as f64),
        ),
        Family::labelled(
            "wharf_node_cores",
            "The node's whole cores: all, kept for itself, reserved by tasks, free to reserve.",
            MetricKind::Gauge,
            family(|a| f64::from(a.cores)),
        ),
    ]
}

/// One figure of a task's usage.
type Figure = fn(&ResourceUsage) -> f64;

/// The Prometheus series of running tasks' usage, from `(alloc id, task, usage)`.
pub fn task_series(usages: &[(String, String, ResourceUsage)]) -> Vec<Family<'static>> {
    let labels =
        |alloc: &str, task: &str| format!("alloc_id=\"{}\",task=\"{}\"", label(alloc), label(task));
    let each = |value: Figure| -> Vec<(String, f64)> {
        usages.iter().map(|(alloc, task, usage)| (labels(alloc, task), value(usage))).collect()
    };
    let by = |kind: &str, values: &[(&str, Figure)]| -> Vec<(String, f64)> {
        usages
            .iter()
            .flat_map(|(alloc, task, usage)| {
                values.iter().map(move |(name, value)| {
                    (format!("{},{kind}=\"{name}\"", labels(alloc, task)), value(usage))
                })
            })
            .collect()
    };
    vec![
        Family::labelled(
            "wharf_task_cpu_seconds_total",
            "CPU time of a running task, by mode (user and system sampled at the scheduler's ticks).",
            MetricKind::Counter,
            by(
                "mode",
                &[
                    ("user", |u| u.cpu_user.as_secs_f64()),
                    ("system", |u| u.cpu_system.as_secs_f64()),
                ],
            ),
        ),
        Family::labelled(
            "wharf_task_cpu_throttled_periods_total",
            "CFS periods in which a running task's CPU quota held it back.",
            MetricKind::Counter,
            each(|u| u.cpu_throttled_periods as f64),
        ),
        Family::labelled(
            "wharf_task_cpu_throttled_seconds_total",
            "How long a running task's CPU quota held it back.",
            MetricKind::Counter,
            each(|u| u.cpu_throttled.as_secs_f64()),
        ),
        Family::labelled(
            "wharf_task_memory_bytes",
            "Memory of a running task, by kind (rss, cache, swap, max_usage).",
            MetricKind::Gauge,
            by(
                "kind",
                &[
                    ("rss", |u| u.memory_rss_bytes as f64),
                    ("cache", |u| u.memory_cache_bytes as f64),
                    ("swap", |u| u.memory_swap_bytes as f64),
                    ("max_usage", |u| u.memory_max_usage_bytes as f64),
                ],
            ),
        ),
        Family::labelled(
            "wharf_task_processes",
            "Processes (with a cgroup: processes and threads) of a running task.",
            MetricKind::Gauge,
            each(|u| f64::from(u.processes)),
        ),
    ]
}

/// `wharf node status` as text.
pub fn node_text(status: &NodeStatus) -> String {
    let amount = |a: &Amount| {
        let cores = if a.cores == 1 { "core" } else { "cores" };
        format!("{} MHz CPU, {} MB memory, {} {cores}", a.cpu_mhz, a.memory_mb, a.cores)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "CPU        = {} cores x {} MHz = {} MHz",
        status.cpu.cores, status.cpu.mhz_per_core, status.cpu.total_mhz
    );
    let _ = writeln!(out, "Memory     = {} MB", status.memory_mb);
    let kept = if status.reserved_cores.is_empty() {
        String::new()
    } else {
        format!(" (cores {})", status.reserved_cores)
    };
    let _ = writeln!(out, "Reserved   = {}{kept}", amount(&status.reserved));
    let _ = writeln!(
        out,
        "Allocated  = {} ({} allocation{})",
        amount(&status.allocated),
        status.allocations,
        if status.allocations == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "Free       = {}", amount(&status.free));
    let cgroups = match (&status.cgroups.version, &status.cgroups.reason) {
        (Some(version), _) => format!(
            "{version} under {}",
            status.cgroups.parents.first().map(String::as_str).unwrap_or("?")
        ),
        (None, Some(reason)) => format!("none: {reason}"),
        (None, None) => "none".to_owned(),
    };
    let _ = writeln!(out, "Cgroups    = {cgroups}");
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<12} {:<10} DETAIL", "DRIVER", "HEALTH");
    for (name, fingerprint) in &status.drivers {
        let health = serde_json::to_value(fingerprint.health)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = writeln!(out, "{name:<12} {health:<10} {}", fingerprint.description);
    }
    out
}

/// The usage table `wharf alloc status` shows for the running tasks.
pub fn stats_text(stats: &AllocStats) -> String {
    let mib = |bytes: u64| format!("{:.1}", bytes as f64 / f64::from(1 << 20));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}",
        "TASK",
        "CPU s",
        "USER s",
        "SYS s",
        "THROTTLED",
        "RSS MiB",
        "CACHE MiB",
        "SWAP MiB",
        "MAX MiB",
        "PROCS"
    );
    for (name, usage) in &stats.tasks {
        let measured = usage.source == UsageSource::Cgroup;
        let or_dash = |text: String| if measured { text } else { "-".to_owned() };
        let _ = writeln!(
            out,
            "{name:<16} {:>9.2} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}",
            usage.cpu.total_seconds,
            or_dash(format!("{:.2}", usage.cpu.user_seconds)),
            or_dash(format!("{:.2}", usage.cpu.system_seconds)),
            or_dash(usage.cpu.throttled_periods.to_string()),
            mib(usage.memory.rss_bytes),
            or_dash(mib(usage.memory.cache_bytes)),
            or_dash(mib(usage.memory.swap_bytes)),
            or_dash(mib(usage.memory.max_usage_bytes)),
            usage.processes,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn usage() -> ResourceUsage {
        ResourceUsage {
            cpu_time: Duration::from_millis(1500),
            memory_rss_bytes: 3 << 20,
            processes: 2,
            at: None,
            cpu_user: Duration::from_secs(1),
            cpu_system: Duration::from_millis(500),
            cpu_throttled_periods: 7,
            cpu_throttled: Duration::from_millis(250),
            memory_cache_bytes: 4096,
            memory_swap_bytes: 0,
            memory_max_usage_bytes: 5 << 20,
            source: UsageSource::Cgroup,
        }
    }

    #[test]
    fn usage_reads_in_seconds_and_bytes() {
        let task = TaskUsage::from(&usage());
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json["source"], "cgroup");
        assert_eq!(json["cpu"]["total_seconds"], 1.5);
        assert_eq!(json["cpu"]["throttled_periods"], 7);
        assert_eq!(json["memory"]["max_usage_bytes"], 5 << 20);
        let text = stats_text(&AllocStats {
            tasks: BTreeMap::from([("web".into(), task.clone())]),
            ..Default::default()
        });
        let header: Vec<&str> = text.lines().next().unwrap().split("  ").map(str::trim).collect();
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            ["web", "1.50", "1.00", "0.50", "7", "3.0", "0.0", "0.0", "5.0", "2"],
            "{text}"
        );
        for column in ["THROTTLED", "RSS MiB", "CACHE MiB", "SWAP MiB", "MAX MiB"] {
            assert!(header.contains(&column), "{column} missing: {text}");
        }
        // Figures a task without a cgroup does not have are not shown as zeros.
        let plain = TaskUsage { source: UsageSource::Proc, ..task };
        let text = stats_text(&AllocStats {
            tasks: BTreeMap::from([("web".into(), plain)]),
            ..Default::default()
        });
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row, ["web", "1.50", "-", "-", "-", "3.0", "-", "-", "-", "2"], "{text}");
    }

    #[test]
    fn task_series_carry_their_labels() {
        let series = task_series(&[("a1".into(), "web\"x".into(), usage())]);
        let Family { name, kind, samples, .. } = &series[0];
        assert_eq!((*name, *kind), ("wharf_task_cpu_seconds_total", MetricKind::Counter));
        assert_eq!(samples[0], ("alloc_id=\"a1\",task=\"web\\\"x\",mode=\"user\"".to_owned(), 1.0));
        let memory = series.iter().find(|s| s.name == "wharf_task_memory_bytes").unwrap();
        assert!(memory.samples.contains(&(
            "alloc_id=\"a1\",task=\"web\\\"x\",kind=\"max_usage\"".to_owned(),
            f64::from(5u32 << 20)
        )));
    }
}
