//! [`MemoryStore`]: the fleet store's rules in memory, for tests of the scheduler and of the
//! replica loop.
//!
//! Its terms behave as the etcd store's do: a campaign waits for as long as another replica
//! leads, and once the leader resigns or its term ends, the campaign that has waited longest
//! wins (etcd's election goes by the revision each candidate's key was made at); a later term
//! has a higher number;
//! a commit under a term that ended is refused ([`FleetError::Fenced`]). Two hooks end the
//! current term as a lease would: [`MemoryStore::lapse`] (the holder hears at once, as a
//! keep-alive that learns its lease expired) and [`MemoryStore::expire`] (the holder does not:
//! it learns when a write is refused, as a leader frozen past its lease does).

use super::{Change, Entry, EntryKind, FleetStore, Loaded, Replica, Standing, StoreInfo, Term};
use crate::FleetError;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use wharf_state::fleet::WorkRecord;

/// A fleet store in memory: one replica leads at a time, the others' campaigns wait, and
/// writes can be made to fail. Clones share the records and the election.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    /// Bumped whenever the lead falls vacant: waiting campaigns look again.
    vacated: Arc<watch::Sender<u64>>,
}

#[derive(Debug, Default)]
struct Inner {
    records: BTreeMap<String, WorkRecord>,
    entries: BTreeMap<(EntryKind, String), String>,
    term: u64,
    leader: Option<(Replica, watch::Sender<Standing>)>,
    /// Replicas whose campaign waits, in the order they began.
    campaigning: BTreeMap<u64, Replica>,
    /// The place in line of the next campaign.
    next_ticket: u64,
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

    /// Ends the current term as a lapsed lease would, and its holder hears it at once: the
    /// term no longer [holds](Term::holds), its writes are refused, and a waiting campaign
    /// wins.
    pub fn lapse(&self) {
        let ended = self.inner.lock().leader.take();
        if let Some((_, standing)) = ended {
            standing.send_replace(Standing::Over);
            self.vacated.send_modify(|n| *n += 1);
        }
    }

    /// Ends `term`, if it is the current one, as etcd does when a lease expires on the server
    /// while its holder is frozen or cut off: its writes are refused and a waiting campaign
    /// wins, but its holder is not told; it still believes it [holds](Term::holds) until a
    /// write comes back [`FleetError::Fenced`].
    pub fn expire(&self, term: &Term) {
        let mut inner = self.inner.lock();
        if inner.term == term.number() && inner.leader.take().is_some() {
            drop(inner);
            self.vacated.send_modify(|n| *n += 1);
        }
    }

    /// Takes the lead for the campaign at `ticket` if no one holds it and no campaign has
    /// waited longer.
    fn try_lead(&self, ticket: u64, me: &Replica) -> Option<Term> {
        let mut inner = self.inner.lock();
        if inner.leader.is_some() || inner.campaigning.keys().next() != Some(&ticket) {
            return None;
        }
        inner.term += 1;
        let (term, standing) = Term::lasting(inner.term);
        inner.leader = Some((me.clone(), standing));
        Some(term)
    }
}

/// A campaign's place in line, given up when the campaign ends, won or dropped.
struct Waiting<'a> {
    store: &'a MemoryStore,
    ticket: u64,
}

impl<'a> Waiting<'a> {
    fn enter(store: &'a MemoryStore, me: &Replica) -> Waiting<'a> {
        let mut inner = store.inner.lock();
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        inner.campaigning.insert(ticket, me.clone());
        Waiting { store, ticket }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.store.inner.lock().campaigning.remove(&self.ticket);
        // The next in line may be first now.
        self.store.vacated.send_modify(|n| *n += 1);
    }
}

#[crate::async_trait]
impl FleetStore for MemoryStore {
    fn describe(&self) -> StoreInfo {
        StoreInfo { backend: "memory".into(), location: "this process".into() }
    }

    async fn campaign(&self, me: &Replica) -> Result<Term, FleetError> {
        let mut vacated = self.vacated.subscribe();
        let waiting = Waiting::enter(self, me);
        loop {
            // Subscribed before it looks: a vacancy after the look wakes it.
            vacated.borrow_and_update();
            if let Some(term) = self.try_lead(waiting.ticket, me) {
                return Ok(term);
            }
            // The sender lives as long as the store: a closed channel cannot happen here.
            let _ = vacated.changed().await;
        }
    }

    async fn resign(&self, term: &Term) -> Result<(), FleetError> {
        term.end();
        let mut inner = self.inner.lock();
        if inner.term == term.number()
            && let Some((_, standing)) = inner.leader.take()
        {
            drop(inner);
            standing.send_replace(Standing::Over);
            self.vacated.send_modify(|n| *n += 1);
        }
        Ok(())
    }

    async fn leader(&self) -> Result<Option<Replica>, FleetError> {
        Ok(self.inner.lock().leader.as_ref().map(|(replica, _)| replica.clone()))
    }

    async fn replicas(&self) -> Result<Vec<Replica>, FleetError> {
        let inner = self.inner.lock();
        let mut replicas: Vec<Replica> = Vec::new();
        let leader = inner.leader.as_ref().map(|(leader, _)| leader);
        for replica in leader.into_iter().chain(inner.campaigning.values()) {
            if !replicas.contains(replica) {
                replicas.push(replica.clone());
            }
        }
        Ok(replicas)
    }

    async fn load_all(&self) -> Result<Loaded, FleetError> {
        let records = self.inner.lock().records.values().cloned().collect();
        Ok(Loaded { records, problems: Vec::new() })
    }

    async fn load_entries(&self, kind: EntryKind) -> Result<Vec<Entry>, FleetError> {
        let inner = self.inner.lock();
        let entries = inner.entries.iter().filter(|((k, _), _)| *k == kind);
        Ok(entries
            .map(|((_, id), json)| Entry { kind, id: id.clone(), json: json.clone() })
            .collect())
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
                detail: "its term is over: a later term leads, or none".into(),
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
                Change::PutEntry(entry) => {
                    inner.entries.insert((entry.kind, entry.id), entry.json);
                }
                Change::DeleteEntry(kind, id) => {
                    inner.entries.remove(&(kind, id));
                }
            }
        }
        inner.commits += 1;
        Ok(())
    }
}
