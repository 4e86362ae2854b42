//! What the node has: its CPUs (which ones, at what speed) and its memory, read from `/proc`
//! and `/sys`. The node agent reports it (`GET /v1/node`) and admits allocations against it;
//! the cgroup layer takes the total MHz from it for CPU quotas.
//!
//! The speed of a core is its highest frequency where cpufreq says so
//! (`cpuinfo_max_freq`), else the `cpu MHz` `/proc/cpuinfo` reports (a virtual machine often
//! has no cpufreq), as Nomad's fingerprint does.

use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use std::path::{Path, PathBuf};

/// The node's CPUs and memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The CPUs online.
    pub cpus: CpuSet,
    /// The speed of one core, in MHz.
    pub mhz_per_core: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
}

impl Host {
    /// Reads this machine.
    pub fn detect() -> Result<Host, IsolateError> {
        Host::detect_at(Path::new("/"))
    }

    /// Reads a machine whose `/proc` and `/sys` are under `root` (tests use a fake tree).
    pub fn detect_at(root: &Path) -> Result<Host, IsolateError> {
        let read = |relative: &str| -> Result<(PathBuf, String), IsolateError> {
            let path = root.join(relative);
            let text = std::fs::read_to_string(&path).map_err(IsolateError::io(&path))?;
            Ok((path, text))
        };
        let (path, online) = read("sys/devices/system/cpu/online")?;
        let cpus =
            CpuSet::parse(&online).map_err(|reason| IsolateError::Unreadable { path, reason })?;
        let first = cpus.iter().next().unwrap_or(0);
        let max_freq =
            root.join(format!("sys/devices/system/cpu/cpu{first}/cpufreq/cpuinfo_max_freq"));
        let mhz_per_core = match std::fs::read_to_string(&max_freq) {
            Ok(khz) => khz.trim().parse::<u64>().ok().map(|khz| khz / 1000),
            Err(_) => None,
        };
        let mhz_per_core = match mhz_per_core.filter(|mhz| *mhz > 0) {
            Some(mhz) => mhz,
            None => {
                let (path, cpuinfo) = read("proc/cpuinfo")?;
                cpuinfo_mhz(&cpuinfo).ok_or_else(|| IsolateError::Unreadable {
                    path,
                    reason: "no `cpu MHz` line".into(),
                })?
            }
        };
        let (path, meminfo) = read("proc/meminfo")?;
        let memory_mb = meminfo_total_mb(&meminfo).ok_or_else(|| IsolateError::Unreadable {
            path,
            reason: "no `MemTotal` line".into(),
        })?;
        Ok(Host { cpus, mhz_per_core, memory_mb })
    }

    /// How many cores.
    pub fn cores(&self) -> u32 {
        u32::try_from(self.cpus.len()).unwrap_or(u32::MAX)
    }

    /// All the node's CPU, in MHz: cores times the speed of one.
    pub fn total_mhz(&self) -> u64 {
        u64::from(self.cores()) * self.mhz_per_core
    }
}

/// The highest `cpu MHz` of `/proc/cpuinfo`, rounded down.
fn cpuinfo_mhz(cpuinfo: &str) -> Option<u64> {
    cpuinfo
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "cpu MHz").then(|| value.trim().parse::<f64>().ok())?
        })
        .filter(|mhz| mhz.is_finite() && *mhz >= 1.0)
        .map(|mhz| mhz as u64)
        .max()
}

/// `MemTotal` of `/proc/meminfo`, in MiB.
fn meminfo_total_mb(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(value / 1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_speed_and_memory_parse() {
        let cpuinfo =
            "processor\t: 0\ncpu MHz\t\t: 2596.120\n\nprocessor\t: 1\ncpu MHz\t\t: 2800.5\n";
        assert_eq!(cpuinfo_mhz(cpuinfo), Some(2800));
        assert_eq!(cpuinfo_mhz("processor : 0\n"), None);
        assert_eq!(cpuinfo_mhz("cpu MHz : nan\n"), None);
        assert_eq!(meminfo_total_mb("MemTotal:       24683520 kB\nMemFree: 1 kB\n"), Some(24105));
        assert_eq!(meminfo_total_mb("MemFree: 1 kB\n"), None);
        assert_eq!(meminfo_total_mb("MemTotal: lots kB\n"), None);
    }

    fn fake_host(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        root
    }

    #[test]
    fn a_fake_machine_is_read_whole() {
        let root = fake_host(&[
            ("sys/devices/system/cpu/online", "0-3\n"),
            ("proc/cpuinfo", "cpu MHz : 1000.0\n"),
            ("proc/meminfo", "MemTotal: 2097152 kB\n"),
        ]);
        let host = Host::detect_at(root.path()).unwrap();
        assert_eq!(
            host,
            Host { cpus: CpuSet::parse("0-3").unwrap(), mhz_per_core: 1000, memory_mb: 2048 }
        );
        assert_eq!((host.cores(), host.total_mhz()), (4, 4000));

        // cpufreq's maximum wins over the current speed.
        std::fs::create_dir_all(root.path().join("sys/devices/system/cpu/cpu0/cpufreq")).unwrap();
        std::fs::write(
            root.path().join("sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"),
            "3200000\n",
        )
        .unwrap();
        assert_eq!(Host::detect_at(root.path()).unwrap().mhz_per_core, 3200);
    }

    #[test]
    fn a_missing_file_is_named() {
        let root = fake_host(&[("sys/devices/system/cpu/online", "0\n")]);
        let error = Host::detect_at(root.path()).unwrap_err().to_string();
        assert!(error.contains("proc/cpuinfo"), "{error}");
    }

    #[test]
    fn this_machine_has_cpus_and_memory() {
        let host = Host::detect().unwrap();
        assert!(host.cores() >= 1 && host.mhz_per_core > 0 && host.memory_mb > 0, "{host:?}");
    }
}
