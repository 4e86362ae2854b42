//! A task's resource usage from `/proc`, for tasks without a cgroup.
//!
//! A task's processes are the shim's descendants: its main process and everything started
//! under it, including processes that left its session or were orphaned (the shim is their
//! subreaper). CPU time is user plus system time; memory is the sum of resident set sizes,
//! which counts pages shared between the processes once per process.

use crate::handle::Identity;
use crate::sys::{self, ProcStat};
use std::collections::HashMap;
use std::time::Duration;
use wharf_driver::ResourceUsage;

/// The usage of the task under the shim `shim`. A shim that is gone (or whose pid is another
/// process's now) has no task left, which uses nothing.
pub(crate) fn usage(shim: &Identity) -> ResourceUsage {
    let Some(shim_pid) = shim.pid.filter(|_| shim.is_running()).map(|p| p.get()) else {
        return ResourceUsage::default();
    };
    let procs: HashMap<i32, ProcStat> =
        sys::all_pids().filter_map(|pid| Some((pid, ProcStat::read(pid)?))).collect();
    let descends_from_shim = |mut pid: i32| {
        // Parent chains are short; the bound guards against a chain read mid-change.
        for _ in 0..256 {
            match procs.get(&pid) {
                Some(stat) if stat.ppid == shim_pid => return true,
                Some(stat) if stat.ppid > 1 => pid = stat.ppid,
                _ => return false,
            }
        }
        false
    };
    let (mut ticks, mut pages, mut processes) = (0u64, 0u64, 0u32);
    for (pid, stat) in &procs {
        if !stat.is_dead() && descends_from_shim(*pid) {
            ticks += stat.utime + stat.stime;
            pages += stat.rss_pages;
            processes += 1;
        }
    }
    let hz = sys::clock_ticks_per_second();
    ResourceUsage {
        cpu_time: Duration::from_secs(ticks / hz)
            + Duration::from_nanos((ticks % hz) * 1_000_000_000 / hz),
        memory_rss_bytes: pages * sys::page_size(),
        processes,
        ..ResourceUsage::default()
    }
}
