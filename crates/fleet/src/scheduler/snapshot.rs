//! What the scheduler sees of the pool at one moment ([`Snapshot`]): the input of a step's
//! pure decision.

use std::collections::{HashMap, HashSet};
use wharf_prober::{InstanceId, InstanceView, Pool, WorkerView};
use wharf_state::Timestamp;
use wharf_state::resources::Amount;

/// What the scheduler sees of the pool at one moment: every worker, the creates in flight,
/// the time, and whether the pool has listed its instances yet.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) workers: HashMap<InstanceId, WorkerView>,
    /// Creates in flight, by instance type.
    pub(crate) creating: HashMap<String, usize>,
    pub(crate) now: Timestamp,
    pub(crate) loaded: bool,
    /// The instance types that say what an instance has, smallest first.
    pub(crate) types: Vec<(String, Amount)>,
    /// The types whose creates the cloud's capacity holds now (the type's own, its quota
    /// group's, or every type's).
    pub(crate) held: HashSet<String>,
    /// The hourly price of each instance type that has one, in millionths.
    pub(crate) prices: HashMap<String, u64>,
}

impl Snapshot {
    pub(super) fn of(pool: &Pool, now: Timestamp) -> Snapshot {
        let mut types: Vec<(String, Amount)> = pool
            .instance_types()
            .iter()
            .filter_map(|it| {
                let has = Amount::from(it.resources?);
                Some((it.name.clone(), has))
            })
            .collect();
        types.sort_by_key(|(name, has)| (has.memory_mb, has.cpu_mhz, has.cores, name.clone()));
        let held =
            types.iter().map(|(name, _)| name).filter(|name| pool.at_capacity(name)).cloned();
        let held = held.collect();
        let prices = pool
            .instance_types()
            .iter()
            .filter_map(|it| Some((it.name.clone(), it.price?.micros_per_hour())))
            .collect();
        let mut snapshot = Snapshot {
            workers: HashMap::new(),
            creating: HashMap::new(),
            now,
            loaded: pool.loaded(),
            types,
            held,
            prices,
        };
        for instance in pool.instances() {
            match instance {
                InstanceView::Worker(view) => {
                    snapshot.workers.insert(view.id.clone(), *view);
                }
                InstanceView::Creating { instance_type, .. } => {
                    *snapshot.creating.entry(instance_type).or_default() += 1;
                }
            }
        }
        snapshot
    }
}
