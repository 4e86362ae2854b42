//! [`MemoryStore`]: the fleet store's rules in memory, for tests of the scheduler.

use super::{Change, FleetStore, Loaded, Replica, Standing, StoreInfo, Term};
use crate::FleetError;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use tokio::sync::watch;
use wharf_state::fleet::WorkRecord;

/// A fleet store in memory: one replica leads at a time, a new term outdates the old, and
/// writes can be made to fail. Clones share the records.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: std::sync::Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    records: BTreeMap<String, WorkRecord>,
    term: u64,
    leader: Option<(Replica, watch::Sender<Standing>)>,
    fail_writes: Option<String>,
    commits: u64,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Makes every commit fail with `reason` (or succeed again with `None`).
    pub fn fail_writes(&self, reason: Option<&str>) {
        self.inner.lock().fail_writes = reason.map(str::to_owned);
    }

    /// How many commits succeeded.
    pub fn commits(&self) -> u64 {
        self.inner.lock().commits
    }

    /// Ends the current term as a lapsed lease would.
    pub fn lapse(&self) {
        if let Some((_, standing)) = self.inner.lock().leader.take() {
            standing.send_replace(Standing::Over);
        }
    }
}

#[crate::async_trait]
impl FleetStore for MemoryStore {
    fn describe(&self) -> StoreInfo {
        StoreInfo { backend: "memory".into(), location: "this process".into() }
    }

    async fn campaign(&self, me: &Replica) -> Result<Term, FleetError> {
        let mut inner = self.inner.lock();
        inner.term += 1;
        let (term, standing) = Term::lasting(inner.term);
        if let Some((_, old)) = inner.leader.replace((me.clone(), standing)) {
            old.send_replace(Standing::Over);
        }
        Ok(term)
    }

    async fn resign(&self, term: &Term) -> Result<(), FleetError> {
        term.end();
        let mut inner = self.inner.lock();
        if inner.term == term.number()
            && let Some((_, standing)) = inner.leader.take()
        {
            standing.send_replace(Standing::Over);
        }
        Ok(())
    }

    async fn leader(&self) -> Result<Option<Replica>, FleetError> {
        Ok(self.inner.lock().leader.as_ref().map(|(replica, _)| replica.clone()))
    }

    async fn replicas(&self) -> Result<Vec<Replica>, FleetError> {
        Ok(self.leader().await?.into_iter().collect())
    }

    async fn load_all(&self) -> Result<Loaded, FleetError> {
        let records = self.inner.lock().records.values().cloned().collect();
        Ok(Loaded { records, problems: Vec::new() })
    }

    async fn load(&self, id: &str) -> Result<Option<WorkRecord>, FleetError> {
        Ok(self.inner.lock().records.get(id).cloned())
    }

    async fn commit(&self, term: &Term, changes: Vec<Change>) -> Result<(), FleetError> {
        let mut inner = self.inner.lock();
        if let Some(reason) = &inner.fail_writes {
            return Err(FleetError::Store { operation: "commit", detail: reason.clone() });
        }
        if let Some(refused) = super::too_many_changes(&changes) {
            return Err(refused);
        }
        if inner.term != term.number() || inner.leader.is_none() {
            return Err(FleetError::Fenced {
                term: term.number(),
                detail: "a later term leads".into(),
            });
        }
        for change in changes {
            match change {
                Change::Put(record) => {
                    inner.records.insert(record.placement.id.clone(), record);
                }
                Change::Delete(id) => {
                    inner.records.remove(&id);
                }
            }
        }
        inner.commits += 1;
        Ok(())
    }
}
