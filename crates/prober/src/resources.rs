//! What a worker has for work, as its runner reports it in one line of `key=value` words:
//!
//! ```text
//! cpu_mhz=11200 memory_mb=15360 cores=3
//! ```
//!
//! CPU in MHz, memory in MiB and whole cores that can be given to work (the machine's, less
//! what its node keeps for itself). The worker runs the runner's resources command once it has
//! booted, until it has an answer ([`RunnerConfig::resources_args`](crate::RunnerConfig)), and
//! shows the answer in its view; the pool does nothing else with it. A scheduler places work
//! by it. Words it does not know are ignored, so a runner may say more.

use std::fmt;
use wharf_state::resources::Amount;

/// What a worker (or an instance type) has for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Resources {
    /// CPU, in MHz.
    pub cpu_mhz: u64,
    /// Memory, in MiB.
    pub memory_mb: u64,
    /// Whole cores that can be reserved for one piece of work.
    pub cores: u32,
}

impl Resources {
    /// Reads the first line of a runner's answer. Every one of `cpu_mhz`, `memory_mb` and
    /// `cores` must be there, as a number.
    pub fn parse(text: &str) -> Result<Resources, String> {
        let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
        let mut found = (None, None, None);
        for word in line.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else { continue };
            let number =
                || value.parse::<u64>().map_err(|_| format!("{key}={value:?} is not a number"));
            match key {
                "cpu_mhz" => found.0 = Some(number()?),
                "memory_mb" => found.1 = Some(number()?),
                "cores" => {
                    let cores = u32::try_from(number()?)
                        .map_err(|_| format!("cores={value} is too many"))?;
                    found.2 = Some(cores);
                }
                _ => {}
            }
        }
        match found {
            (Some(cpu_mhz), Some(memory_mb), Some(cores)) => {
                Ok(Resources { cpu_mhz, memory_mb, cores })
            }
            _ => Err(format!("{line:?} does not say cpu_mhz, memory_mb and cores")),
        }
    }
}

/// What a worker has, as an amount a placement counts with (wharf-state's [`Amount`]): the
/// one conversion between the runner's report and the fleet's records.
impl From<Resources> for Amount {
    fn from(has: Resources) -> Amount {
        Amount { cpu_mhz: has.cpu_mhz, memory_mb: has.memory_mb, cores: has.cores }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu_mhz={} memory_mb={} cores={}", self.cpu_mhz, self.memory_mb, self.cores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resources_line_reads_back_and_bad_ones_say_why() {
        let r = Resources { cpu_mhz: 11_200, memory_mb: 15_360, cores: 3 };
        assert_eq!(Resources::parse(&format!("{r}\n")), Ok(r));
        assert_eq!(
            Resources::parse("\n  cores=3 gpus=1 memory_mb=15360 cpu_mhz=11200 extra\n"),
            Ok(r)
        );
        let cases = [
            ("", "does not say"),
            ("cpu_mhz=1 memory_mb=2", "does not say"),
            ("cpu_mhz=lots memory_mb=2 cores=1", "cpu_mhz=\"lots\" is not a number"),
            ("cpu_mhz=1 memory_mb=-2 cores=1", "is not a number"),
            ("cpu_mhz=1 memory_mb=2 cores=99999999999", "too many"),
        ];
        for (text, why) in cases {
            let err = Resources::parse(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
