//! Where queued work goes: best fit on CPU and memory among the workers that take work, with
//! a reason the user can read when it fits nowhere.
//!
//! A [`Placer`] is made once per scheduling step from the pool's snapshot and the scheduler's
//! books (each worker's count of runners, what it has, and what the work placed on it needs),
//! then answers one [`Placer::place`] per queued piece of work, updating the counts it changes:
//! one pass over the books per step, and per decision one pass over the workers, never a new
//! snapshot. Pure: no pool, no clock.
//!
//! The rules:
//! - a worker takes work below its count limit (every runner on it counts, whoever placed it);
//! - a worker whose runner said what it has ([`Resources`](wharf_prober::Resources)) takes work
//!   that fits in what it has less what the work placed on it needs; one that did not say is
//!   placed on by count alone;
//! - among those, best fit: the worker the work leaves least free, as a share of what it has,
//!   CPU and memory added (so big machines are kept for big work); workers that did not say
//!   come after, least loaded first; ties go to the fewer runners, then the worker's id;
//! - work that fits nowhere waits, and says why: no worker takes work, all are at their limit,
//!   or the dimension no worker has enough of, with the most any has free.
//!
//! What the node keeps for itself and what others run there are the node's to count: its
//! admission refuses what does not fit after all, and the refused start goes elsewhere.

use wharf_prober::InstanceId;
use wharf_state::resources::Amount;

/// One worker that takes work, as placement sees it.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The worker.
    pub worker: InstanceId,
    /// Runners on it (listed, starting, and placed this step).
    pub count: usize,
    /// What it has for work, if its runner said.
    pub has: Option<Amount>,
    /// What the work placed on it needs.
    pub used: Amount,
}

impl Slot {
    fn free(&self) -> Option<Amount> {
        self.has.map(|has| has.saturating_sub(self.used))
    }

    /// How much of it `needs` would leave free, as a share of what it has (lower is a tighter
    /// fit); `None` if it does not fit, `Some(f64::INFINITY)` if it has not said.
    fn leftover(&self, needs: &Amount) -> Option<f64> {
        let (Some(has), Some(free)) = (self.has, self.free()) else { return Some(f64::INFINITY) };
        if free.shortfall(needs).is_some() {
            return None;
        }
        let share = |free: u64, need: u64, has: u64| {
            if has == 0 { 0.0 } else { (free - need) as f64 / has as f64 }
        };
        Some(
            share(free.cpu_mhz, needs.cpu_mhz, has.cpu_mhz)
                + share(free.memory_mb, needs.memory_mb, has.memory_mb),
        )
    }
}

/// The workers that take work, for one step's placements.
#[derive(Debug)]
pub struct Placer {
    slots: Vec<Slot>,
    limit: usize,
}

impl Placer {
    /// Workers `slots`, each taking at most `limit` runners.
    pub fn new(slots: Vec<Slot>, limit: usize) -> Placer {
        Placer { slots, limit }
    }

    /// Whether any worker has room for one more runner, whatever it needs.
    pub fn any_room(&self) -> bool {
        self.slots.iter().any(|s| s.count < self.limit)
    }

    /// The worker for work needing `needs`, counted as placed there; or why there is none.
    pub fn place(&mut self, needs: &Amount) -> Result<InstanceId, String> {
        let mut best: Option<(f64, usize, usize)> = None;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.count >= self.limit {
                continue;
            }
            let Some(leftover) = slot.leftover(needs) else { continue };
            let key = (leftover, slot.count, i);
            let better = match &best {
                None => true,
                Some((l, c, j)) => {
                    (leftover, slot.count).partial_cmp(&(*l, *c)).is_some_and(|o| o.is_lt())
                        || (leftover == *l
                            && slot.count == *c
                            && slot.worker.0 < self.slots[*j].worker.0)
                }
            };
            if better {
                best = Some(key);
            }
        }
        let Some((_, _, i)) = best else { return Err(self.why_not(needs)) };
        let slot = &mut self.slots[i];
        slot.count += 1;
        slot.used = slot.used + *needs;
        Ok(slot.worker.clone())
    }

    /// Why work needing `needs` fits on no worker.
    fn why_not(&self, needs: &Amount) -> String {
        if self.slots.is_empty() {
            return "no worker takes work".into();
        }
        let open: Vec<&Slot> = self.slots.iter().filter(|s| s.count < self.limit).collect();
        if open.is_empty() {
            return format!("every worker that takes work runs its limit of {}", self.limit);
        }
        let most = open.iter().filter_map(|s| s.free()).fold(Amount::ZERO, Amount::max);
        if needs.memory_mb > most.memory_mb {
            format!("no worker has {} MB free; largest free {} MB", needs.memory_mb, most.memory_mb)
        } else if needs.cpu_mhz > most.cpu_mhz {
            format!(
                "no worker has {} MHz of CPU free; largest free {} MHz",
                needs.cpu_mhz, most.cpu_mhz
            )
        } else if needs.cores > most.cores {
            format!("no worker has {} cores free; most free {}", needs.cores, most.cores)
        } else {
            format!(
                "no worker has {} MHz of CPU and {} MB free at once",
                needs.cpu_mhz, needs.memory_mb
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(cpu_mhz: u64, memory_mb: u64, cores: u32) -> Amount {
        Amount { cpu_mhz, memory_mb, cores }
    }

    fn slot(worker: &str, count: usize, has: Option<Amount>, used: Amount) -> Slot {
        Slot { worker: worker.into(), count, has, used }
    }

    /// Placement as a table: the workers (runners, what they have, what is placed there), the
    /// limit, the work's needs in order, and where each goes or why it waits.
    #[test]
    fn placement_table() {
        let big = Some(amount(16_000, 32_768, 8));
        let small = Some(amount(4_000, 4_096, 2));
        let none = Amount::ZERO;
        let m = |mb: u64| amount(0, mb, 0);
        type Row =
            (&'static str, Vec<Slot>, usize, Vec<Amount>, Vec<Result<&'static str, &'static str>>);
        let cases: Vec<Row> = vec![
            (
                "best fit: small work to the small worker, big work to the big one",
                vec![slot("big", 0, big, none), slot("small", 0, small, none)],
                4,
                vec![m(1_024), m(20_000)],
                vec![Ok("small"), Ok("big")],
            ),
            (
                "the tightest fit counts what is already placed there",
                vec![slot("a", 1, big, m(30_000)), slot("b", 0, big, none)],
                4,
                vec![m(2_000)],
                vec![Ok("a")],
            ),
            (
                "each placement uses up what it needs",
                vec![slot("a", 0, small, none)],
                4,
                vec![m(3_000), m(3_000)],
                vec![Ok("a"), Err("no worker has 3000 MB free; largest free 1096 MB")],
            ),
            (
                "memory says first, with the most any has",
                vec![slot("a", 0, small, m(2_048)), slot("b", 0, small, none)],
                4,
                vec![m(8_192)],
                vec![Err("no worker has 8192 MB free; largest free 4096 MB")],
            ),
            (
                "then CPU, then cores",
                vec![slot("a", 0, small, none)],
                4,
                vec![amount(6_000, 10, 0), amount(0, 10, 3)],
                vec![
                    Err("no worker has 6000 MHz of CPU free; largest free 4000 MHz"),
                    Err("no worker has 3 cores free; most free 2"),
                ],
            ),
            (
                "CPU and memory each fit somewhere, but not together",
                vec![
                    slot("a", 0, small, amount(0, 4_000, 0)),
                    slot("b", 0, small, amount(3_900, 0, 0)),
                ],
                4,
                vec![amount(1_000, 1_000, 0)],
                vec![Err("no worker has 1000 MHz of CPU and 1000 MB free at once")],
            ),
            (
                "a worker that did not say is placed on by count, after those that did",
                vec![slot("quiet", 0, None, none), slot("said", 3, small, none)],
                4,
                vec![m(100), m(100), m(100_000)],
                vec![Ok("said"), Ok("quiet"), Ok("quiet")],
            ),
            (
                "between equals: fewer runners, then the id",
                vec![slot("b", 1, None, none), slot("c", 0, None, none), slot("a", 0, None, none)],
                4,
                vec![none, none],
                vec![Ok("a"), Ok("c")],
            ),
            (
                "the count limit holds whatever fits",
                vec![slot("a", 2, big, none)],
                2,
                vec![m(1)],
                vec![Err("every worker that takes work runs its limit of 2")],
            ),
            ("no workers", vec![], 2, vec![none], vec![Err("no worker takes work")]),
        ];
        for (name, slots, limit, needs, expected) in cases {
            let mut placer = Placer::new(slots, limit);
            let got: Vec<Result<String, String>> =
                needs.iter().map(|n| placer.place(n).map(|w| w.0)).collect();
            let want: Vec<Result<String, String>> =
                expected.iter().map(|r| r.map(str::to_owned).map_err(str::to_owned)).collect();
            assert_eq!(got, want, "{name}");
        }
    }
}
