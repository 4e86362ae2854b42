//! Sets of CPU ids in the kernel's list format (`0-3,8,10-11`), as `cpuset.cpus` and
//! `/sys/devices/system/cpu/online` write them.

use std::collections::BTreeSet;
use std::fmt;

/// A set of CPU (core) ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

/// The largest CPU id accepted: far above any machine, low enough that a damaged file cannot
/// make a parser build a huge set.
const MAX_CPU: u32 = 1 << 16;

impl CpuSet {
    /// The empty set.
    pub fn new() -> CpuSet {
        CpuSet::default()
    }

    /// Reads the list format; whitespace around it is ignored, an empty text is the empty set.
    pub fn parse(text: &str) -> Result<CpuSet, String> {
        let mut set = BTreeSet::new();
        for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let number = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= MAX_CPU)
                    .ok_or_else(|| format!("{s:?} is not a CPU number"))
            };
            match part.split_once('-') {
                Some((low, high)) => {
                    let (low, high) = (number(low)?, number(high)?);
                    if low > high {
                        return Err(format!("{part:?} is an empty range"));
                    }
                    set.extend(low..=high);
                }
                None => {
                    set.insert(number(part)?);
                }
            }
        }
        Ok(CpuSet(set))
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `cpu` is in it.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// The ids, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// The ids in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    /// The ids in either.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    /// The ids in both.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    /// The lowest `count` ids, or `None` if there are fewer.
    pub fn take_lowest(&self, count: usize) -> Option<CpuSet> {
        (self.0.len() >= count).then(|| CpuSet(self.0.iter().copied().take(count).collect()))
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> CpuSet {
        CpuSet(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    /// The list format with runs folded: `0-3,8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = ids.next() {
            let mut end = start;
            while ids.peek() == Some(&(end + 1)) {
                end += 1;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end { write!(f, "{start}")? } else { write!(f, "{start}-{end}")? }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_format_reads_and_writes() {
        for (text, ids, written) in [
            ("", vec![], ""),
            ("\n", vec![], ""),
            ("0", vec![0], "0"),
            ("0-3\n", vec![0, 1, 2, 3], "0-3"),
            ("0-1,3,5-6", vec![0, 1, 3, 5, 6], "0-1,3,5-6"),
            ("3,1,2", vec![1, 2, 3], "1-3"),
            (" 4 , 2-2 ", vec![2, 4], "2,4"),
        ] {
            let set = CpuSet::parse(text).unwrap();
            assert_eq!(set.iter().collect::<Vec<_>>(), ids, "{text:?}");
            assert_eq!(set.to_string(), written, "{text:?}");
        }
        for bad in ["x", "1-", "-1", "3-1", "1,,a", "99999999"] {
            assert!(CpuSet::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn set_operations() {
        let all = CpuSet::parse("0-7").unwrap();
        let some = CpuSet::parse("2-3,6").unwrap();
        assert_eq!(all.difference(&some).to_string(), "0-1,4-5,7");
        assert_eq!(some.union(&CpuSet::parse("4").unwrap()).to_string(), "2-4,6");
        assert_eq!(all.intersection(&some), some);
        assert_eq!(all.difference(&some).take_lowest(3).unwrap().to_string(), "0-1,4");
        assert_eq!(some.take_lowest(4), None);
    }
}
