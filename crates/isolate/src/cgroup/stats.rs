//! A task's usage as its cgroup counts it ([`CgroupStats`]), and the parsers of the files it
//! comes from.

use std::time::Duration;

/// What a cgroup has used.
///
/// | figure | v1 | v2 |
/// |---|---|---|
/// | RSS | `memory.stat` `rss` | `memory.stat` `anon` |
/// | cache | `memory.stat` `cache` | `memory.stat` `file` |
/// | swap | `memory.stat` `swap` (with swap accounting) | `memory.swap.current` |
/// | max usage | `memory.max_usage_in_bytes` | `memory.peak` (Linux 5.19) |
/// | CPU total | `cpuacct.usage` (ns) | `cpu.stat` `usage_usec` |
/// | CPU user, system | `cpuacct.usage_all` (per CPU) | `cpu.stat` `user_usec`, `system_usec` |
/// | throttling | `cpu.stat` `nr_periods`, `nr_throttled`, `throttled_time` | `cpu.stat` `nr_periods`, `nr_throttled`, `throttled_usec` |
/// | processes | `pids.current` | `pids.current` |
///
/// A figure the kernel does not give is 0, and [`CgroupStats::measured`] leaves it out. The
/// kernel folds its per-CPU counters into `memory.stat` (RSS, cache, swap) every two seconds
/// or so, so those lag a task that has just started; max usage does not. The total CPU time
/// is the scheduler's exact count; the split into user and system time is
/// sampled at the scheduler's ticks (4 ms at 250 Hz), which is why they need not add up to it
/// and why a quota is checked against the total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Anonymous memory (resident, not file-backed), in bytes.
    pub memory_rss: u64,
    /// Page cache, in bytes.
    pub memory_cache: u64,
    /// Swap, in bytes.
    pub memory_swap: u64,
    /// The most it was ever charged, in bytes.
    pub memory_max_usage: u64,
    /// CPU time, user and system, as the scheduler counts it (to the nanosecond).
    pub cpu_total: Duration,
    /// CPU time in user mode (sampled at the scheduler's ticks, so coarser than the total).
    pub cpu_user: Duration,
    /// CPU time in the kernel (sampled at ticks, as `cpu_user`).
    pub cpu_system: Duration,
    /// CFS periods in which the task could run.
    pub cpu_periods: u64,
    /// Periods in which it used up its quota and was held back.
    pub cpu_throttled_periods: u64,
    /// Time it was held back.
    pub cpu_throttled: Duration,
    /// Processes and threads.
    pub processes: u64,
    /// Which figures the kernel gave.
    pub measured: Measured,
}

/// Figures a hierarchy may not have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    /// Swap (v1 without swap accounting has none).
    pub swap: bool,
    /// Max usage (v2 before Linux 5.19 has none).
    pub max_usage: bool,
}

/// `key value` lines, as `memory.stat`, `cpu.stat` and `memory.events` write them.
pub(crate) fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

/// A single number, as `pids.current` or `memory.usage_in_bytes` write it.
pub(crate) fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The user and system nanoseconds summed over CPUs, from v1's `cpuacct.usage_all`:
/// `cpu user system` then one line per CPU.
pub(crate) fn usage_all(text: &str) -> Option<(u64, u64)> {
    let mut lines = text.lines();
    let header = lines.next()?;
    if header.split_whitespace().collect::<Vec<_>>() != ["cpu", "user", "system"] {
        return None;
    }
    lines.filter(|l| !l.trim().is_empty()).try_fold((0u64, 0u64), |(user, system), line| {
        let mut words = line.split_whitespace().skip(1).map(str::parse::<u64>);
        let (u, s) = (words.next()?.ok()?, words.next()?.ok()?);
        Some((user.saturating_add(u), system.saturating_add(s)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_value_files_parse() {
        let stat = "cache 4096\nrss 81920\nrss_huge 0\nswap 12\ntotal_rss 81920\n";
        assert_eq!(field(stat, "rss"), Some(81920));
        assert_eq!(field(stat, "cache"), Some(4096));
        assert_eq!(field(stat, "swap"), Some(12));
        assert_eq!(field(stat, "mapped_file"), None);
        assert_eq!(field("rss x\n", "rss"), None);
        assert_eq!(field("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(number("42\n"), Some(42));
        assert_eq!(number("max\n"), None);
    }

    #[test]
    fn per_cpu_usage_sums() {
        assert_eq!(usage_all("cpu user system\n0 100 10\n1 200 20\n"), Some((300, 30)));
        assert_eq!(usage_all("cpu user system\n"), Some((0, 0)));
        assert_eq!(usage_all("cpu user\n0 1\n"), None);
        assert_eq!(usage_all("cpu user system\n0 1\n"), None);
        assert_eq!(usage_all(""), None);
    }
}
