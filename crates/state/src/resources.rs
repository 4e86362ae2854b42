//! What allocations ask of a node and what the node has left: the pure half of admission.
//!
//! A task's [`Resources`] become an [`Amount`] (CPU in MHz, memory in MiB, whole cores); a
//! group's amount follows its lifecycle, since not every task runs at once:
//!
//! ```text
//! prestart:  prestart tasks (ephemeral and sidecars)
//! main:      prestart sidecars + main tasks + poststart tasks
//! poststop:  poststop tasks (everything else is dead by then)
//! ```
//!
//! and the group needs the largest of the three, dimension by dimension, as Nomad's scheduler
//! counts it. The node (wharf-node) adds up what its allocations hold, takes it and its own
//! reservation from what it has, and asks [`Amount::shortfall`] whether a new allocation fits.
//! Reserved cores count in CPU too: a core held by one task is `mhz_per_core` nobody else gets.

use crate::spec::{Resources, Stage, TaskGroup};
use serde::{Deserialize, Serialize};
use std::fmt;

/// An amount of node resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    /// CPU in MHz, reserved cores included.
    pub cpu_mhz: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Whole cores.
    pub cores: u32,
}

impl Amount {
    /// What one task needs: its `cpu`, or its cores at `mhz_per_core` each, and its `memory`
    /// (the reservation, not `memory_max`).
    pub fn of_task(resources: &Resources, mhz_per_core: u64) -> Amount {
        let cpu_mhz = if resources.cores > 0 {
            u64::from(resources.cores) * mhz_per_core
        } else {
            u64::from(resources.cpu)
        };
        Amount { cpu_mhz, memory_mb: u64::from(resources.memory), cores: resources.cores }
    }

    /// What a task group needs at its busiest lifecycle phase (see the module docs).
    pub fn of_group(group: &TaskGroup, mhz_per_core: u64) -> Amount {
        let (mut prestart, mut main, mut poststop) = (Amount::ZERO, Amount::ZERO, Amount::ZERO);
        for task in &group.tasks {
            let amount = Amount::of_task(&task.resources, mhz_per_core);
            match task.stage() {
                Stage::PrestartEphemeral => prestart = prestart + amount,
                Stage::PrestartSidecar => {
                    prestart = prestart + amount;
                    main = main + amount;
                }
                Stage::Main | Stage::PoststartEphemeral | Stage::PoststartSidecar => {
                    main = main + amount
                }
                Stage::Poststop => poststop = poststop + amount,
            }
        }
        prestart.max(main).max(poststop)
    }

    /// Nothing.
    pub const ZERO: Amount = Amount { cpu_mhz: 0, memory_mb: 0, cores: 0 };

    /// The larger of each dimension.
    pub fn max(self, other: Amount) -> Amount {
        Amount {
            cpu_mhz: self.cpu_mhz.max(other.cpu_mhz),
            memory_mb: self.memory_mb.max(other.memory_mb),
            cores: self.cores.max(other.cores),
        }
    }

    /// `self` minus `other`, each dimension stopping at zero.
    pub fn saturating_sub(self, other: Amount) -> Amount {
        Amount {
            cpu_mhz: self.cpu_mhz.saturating_sub(other.cpu_mhz),
            memory_mb: self.memory_mb.saturating_sub(other.memory_mb),
            cores: self.cores.saturating_sub(other.cores),
        }
    }

    /// What `needed` lacks if `self` is what is free; `None` if it fits.
    pub fn shortfall(&self, needed: &Amount) -> Option<Shortfall> {
        let mut lacking = Vec::new();
        if needed.memory_mb > self.memory_mb {
            lacking.push(Lack::Memory { needed: needed.memory_mb, free: self.memory_mb });
        }
        if needed.cpu_mhz > self.cpu_mhz {
            lacking.push(Lack::Cpu { needed: needed.cpu_mhz, free: self.cpu_mhz });
        }
        if needed.cores > self.cores {
            lacking.push(Lack::Cores { needed: needed.cores, free: self.cores });
        }
        (!lacking.is_empty()).then_some(Shortfall(lacking))
    }
}

impl std::ops::Add for Amount {
    type Output = Amount;

    fn add(self, other: Amount) -> Amount {
        Amount {
            cpu_mhz: self.cpu_mhz.saturating_add(other.cpu_mhz),
            memory_mb: self.memory_mb.saturating_add(other.memory_mb),
            cores: self.cores.saturating_add(other.cores),
        }
    }
}

impl std::iter::Sum for Amount {
    fn sum<I: Iterator<Item = Amount>>(iter: I) -> Amount {
        iter.fold(Amount::ZERO, |total, amount| total + amount)
    }
}

/// What an allocation lacks to fit on a node, dimension by dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall(pub Vec<Lack>);

/// One dimension that does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lack {
    /// Memory, in MiB.
    Memory {
        /// What the allocation needs.
        needed: u64,
        /// What the node has free.
        free: u64,
    },
    /// CPU, in MHz.
    Cpu {
        /// What the allocation needs.
        needed: u64,
        /// What the node has free.
        free: u64,
    },
    /// Whole cores.
    Cores {
        /// What the allocation needs.
        needed: u32,
        /// What the node has free.
        free: u32,
    },
}

impl fmt::Display for Shortfall {
    /// Such as `needs 4096 MB memory, 1024 MB free; needs 2 cores, 1 free`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, lack) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match lack {
                Lack::Memory { needed, free } => {
                    write!(f, "needs {needed} MB memory, {free} MB free")?
                }
                Lack::Cpu { needed, free } => write!(f, "needs {needed} MHz CPU, {free} MHz free")?,
                Lack::Cores { needed, free } => {
                    write!(f, "needs {needed} reserved cores, {free} free")?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Lifecycle, LifecycleHook, Task};

    fn task(name: &str, hook: Option<(LifecycleHook, bool)>, cpu: u32, memory: u32) -> Task {
        Task {
            name: name.into(),
            driver: "raw_exec".into(),
            config: Default::default(),
            env: Default::default(),
            leader: false,
            lifecycle: hook.map(|(hook, sidecar)| Lifecycle { hook, sidecar }),
            kill_timeout: crate::spec::DEFAULT_KILL_TIMEOUT,
            kill_signal: crate::Signal::Term,
            restart: Default::default(),
            resources: Resources { cpu, memory, ..Resources::default() },
            ..Task::new(name, "raw_exec")
        }
    }

    fn group(tasks: Vec<Task>) -> TaskGroup {
        TaskGroup::new("g", tasks)
    }

    fn amount(cpu_mhz: u64, memory_mb: u64, cores: u32) -> Amount {
        Amount { cpu_mhz, memory_mb, cores }
    }

    #[test]
    fn a_group_needs_its_busiest_phase() {
        use LifecycleHook::*;
        let cases = [
            (vec![task("a", None, 100, 200), task("b", None, 50, 100)], amount(150, 300, 0)),
            // A prestart task that has finished frees its share for the main tasks.
            (
                vec![task("init", Some((Prestart, false)), 500, 1000), task("m", None, 100, 200)],
                amount(500, 1000, 0),
            ),
            // A prestart sidecar runs in both phases.
            (
                vec![
                    task("init", Some((Prestart, false)), 100, 100),
                    task("side", Some((Prestart, true)), 100, 100),
                    task("m", None, 300, 300),
                    task("post", Some((Poststart, false)), 10, 10),
                ],
                amount(410, 410, 0),
            ),
            // Poststop tasks run alone.
            (
                vec![task("m", None, 100, 100), task("bye", Some((Poststop, false)), 900, 50)],
                amount(900, 100, 0),
            ),
        ];
        for (tasks, expected) in cases {
            let names: Vec<String> = tasks.iter().map(|t| t.name.clone()).collect();
            assert_eq!(Amount::of_group(&group(tasks), 2000), expected, "{names:?}");
        }
    }

    #[test]
    fn reserved_cores_count_in_cpu_instead_of_the_share() {
        let resources = Resources { cpu: 100, memory: 64, memory_max: Some(128), cores: 2 };
        assert_eq!(Amount::of_task(&resources, 2500), amount(5000, 64, 2));
    }

    #[test]
    fn shortfalls_name_what_is_missing() {
        let free = amount(1000, 1024, 1);
        assert_eq!(free.shortfall(&amount(1000, 1024, 1)), None);
        let cases = [
            (amount(10, 4096, 0), "needs 4096 MB memory, 1024 MB free"),
            (amount(2000, 10, 0), "needs 2000 MHz CPU, 1000 MHz free"),
            (
                amount(10, 2048, 2),
                "needs 2048 MB memory, 1024 MB free; needs 2 reserved cores, 1 free",
            ),
        ];
        for (needed, message) in cases {
            assert_eq!(free.shortfall(&needed).unwrap().to_string(), message);
        }
        assert_eq!(amount(5, 5, 5).saturating_sub(amount(7, 1, 5)), amount(0, 4, 0));
    }
}
