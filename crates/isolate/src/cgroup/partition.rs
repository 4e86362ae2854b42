//! Which cores are reserved by which task, and which are left shared: the books behind the
//! `share` and `reserve` cpusets.
//!
//! A task that asks for `cores` gets that many whole cores to itself: they leave the shared
//! set that every other task runs on, and come back when the task's cgroup is removed. One core
//! always stays shared, so tasks that reserve none still have somewhere to run. Pure: the
//! manager writes the sets to the cgroup files after each change.

use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use std::collections::BTreeMap;

/// The usable cores and who holds which.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Partition {
    usable: CpuSet,
    held: BTreeMap<String, CpuSet>,
}

impl Partition {
    pub(crate) fn new(usable: CpuSet) -> Partition {
        Partition { usable, held: BTreeMap::new() }
    }

    /// Every reserved core.
    pub(crate) fn reserved(&self) -> CpuSet {
        self.held.values().fold(CpuSet::new(), |all, set| all.union(set))
    }

    /// The cores tasks without a reservation run on.
    pub(crate) fn shared(&self) -> CpuSet {
        self.usable.difference(&self.reserved())
    }

    /// Cores that can still be reserved.
    pub(crate) fn free(&self) -> u32 {
        u32::try_from(self.shared().len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Reserves `count` cores for `name` (the lowest free ones); the same set again if it holds
    /// some already.
    pub(crate) fn reserve(&mut self, name: &str, count: u32) -> Result<CpuSet, IsolateError> {
        if let Some(held) = self.held.get(name) {
            return Ok(held.clone());
        }
        let shared = self.shared();
        let free = self.free();
        let cores = (count <= free)
            .then(|| shared.take_lowest(count as usize))
            .flatten()
            .ok_or(IsolateError::NotEnoughCores { needed: count, free })?;
        self.held.insert(name.to_owned(), cores.clone());
        Ok(cores)
    }

    /// Records cores `name` held before a restart (the cgroup says which). Cores that are
    /// not usable any more, or that another task holds, are not given to it twice.
    pub(crate) fn restore(&mut self, name: &str, cores: &CpuSet) -> CpuSet {
        let others = self
            .held
            .iter()
            .filter(|(holder, _)| holder.as_str() != name)
            .fold(CpuSet::new(), |all, (_, set)| all.union(set));
        let kept = cores.intersection(&self.usable).difference(&others);
        if !kept.is_empty() {
            self.held.insert(name.to_owned(), kept.clone());
        }
        kept
    }

    /// Gives `name`'s cores back; false if it held none.
    pub(crate) fn release(&mut self, name: &str) -> bool {
        self.held.remove(name).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    #[test]
    fn reservations_take_the_lowest_free_cores_and_give_them_back() {
        let mut cores = Partition::new(set("0-3"));
        assert_eq!((cores.shared(), cores.free()), (set("0-3"), 3));
        assert_eq!(cores.reserve("a", 2).unwrap(), set("0-1"));
        assert_eq!(cores.reserve("a", 2).unwrap(), set("0-1"), "asking again changes nothing");
        assert_eq!((cores.shared(), cores.reserved(), cores.free()), (set("2-3"), set("0-1"), 1));
        match cores.reserve("b", 2) {
            Err(IsolateError::NotEnoughCores { needed: 2, free: 1 }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(cores.reserve("b", 1).unwrap(), set("2"));
        assert_eq!(cores.shared(), set("3"), "one core stays shared");
        assert!(cores.release("a"));
        assert!(!cores.release("a"));
        assert_eq!(cores.shared(), set("0-1,3"));
        assert_eq!(cores.reserve("c", 2).unwrap(), set("0-1"));
    }

    #[test]
    fn restored_reservations_never_overlap_or_leave_the_usable_set() {
        let mut cores = Partition::new(set("0-3"));
        assert_eq!(cores.restore("a", &set("1-2")), set("1-2"));
        assert_eq!(cores.restore("b", &set("2-3")), set("3"), "core 2 is a's");
        assert_eq!(cores.restore("c", &set("7")), set(""), "core 7 is not usable");
        assert_eq!(cores.shared(), set("0"));
        assert_eq!(cores.free(), 0);
    }
}
