//! [`LedgerStore`]: the embedded fleet store, one redb file through wharf-store's `Ledger`.

use super::{
    Change, Entry, EntryKind, FleetStore, Loaded, Replica, Standing, StoreInfo, Term, decode,
    encode,
};
use crate::FleetError;
use parking_lot::Mutex;
use std::path::Path;
use tokio::sync::watch;
use wharf_state::fleet::WorkRecord;
use wharf_store::{Ledger, LedgerChange, StoreError};

/// The fleet's records in one redb file (`<data_dir>/fleet.redb`), for a fleet of one process:
/// the file's lock keeps a second process out, and its terms never lapse. Taking a term
/// outdates the one before, so a scheduler that was replaced in this process cannot write.
#[derive(Debug)]
pub struct LedgerStore {
    ledger: Ledger,
    leader: Mutex<Option<(Replica, u64, watch::Sender<Standing>)>>,
}

impl LedgerStore {
    /// Opens (or creates) the file at `path`.
    pub fn open(path: &Path) -> Result<LedgerStore, FleetError> {
        let ledger = Ledger::open(path).map_err(|e| store_error("open", &e))?;
        Ok(LedgerStore { ledger, leader: Mutex::new(None) })
    }
}

fn store_error(operation: &'static str, error: &StoreError) -> FleetError {
    FleetError::Store { operation, detail: error.to_string() }
}

#[crate::async_trait]
impl FleetStore for LedgerStore {
    fn describe(&self) -> StoreInfo {
        StoreInfo { backend: "redb".into(), location: self.ledger.path().display().to_string() }
    }

    async fn campaign(&self, me: &Replica) -> Result<Term, FleetError> {
        let number = self.ledger.take_term().await.map_err(|e| store_error("campaign", &e))?;
        let (term, standing) = Term::lasting(number);
        if let Some((_, _, old)) = self.leader.lock().replace((me.clone(), number, standing)) {
            old.send_replace(Standing::Over);
        }
        Ok(term)
    }

    async fn resign(&self, term: &Term) -> Result<(), FleetError> {
        term.end();
        let mut leader = self.leader.lock();
        if leader.as_ref().is_some_and(|(_, number, _)| *number == term.number())
            && let Some((_, _, standing)) = leader.take()
        {
            standing.send_replace(Standing::Over);
        }
        drop(leader);
        // A later take of a term outdates this one in the file as well.
        Ok(())
    }

    async fn leader(&self) -> Result<Option<Replica>, FleetError> {
        Ok(self.leader.lock().as_ref().map(|(replica, _, _)| replica.clone()))
    }

    async fn replicas(&self) -> Result<Vec<Replica>, FleetError> {
        Ok(self.leader().await?.into_iter().collect())
    }

    async fn load_all(&self) -> Result<Loaded, FleetError> {
        let rows = self.ledger.scan().await.map_err(|e| store_error("load", &e))?;
        let mut loaded = Loaded::default();
        for (key, bytes) in rows {
            if EntryKind::ALL.iter().any(|kind| key.starts_with(kind.ledger_prefix())) {
                continue;
            }
            match decode(&bytes) {
                Ok(record) => loaded.records.push(record),
                Err(why) => loaded.problems.push((key, why)),
            }
        }
        Ok(loaded)
    }

    async fn load_entries(&self, kind: EntryKind) -> Result<Vec<Entry>, FleetError> {
        let rows = self.ledger.scan().await.map_err(|e| store_error("load", &e))?;
        let mut entries = Vec::new();
        for (key, bytes) in rows {
            let Some(id) = key.strip_prefix(kind.ledger_prefix()) else { continue };
            let json = String::from_utf8(bytes).map_err(|e| FleetError::Store {
                operation: "load",
                detail: format!("{} {id:?}: {e}", kind.describe()),
            })?;
            entries.push(Entry { kind, id: id.to_owned(), json });
        }
        Ok(entries)
    }

    async fn load(&self, id: &str) -> Result<Option<WorkRecord>, FleetError> {
        let bytes = self.ledger.get(id).await.map_err(|e| store_error("load", &e))?;
        bytes
            .map(|bytes| {
                decode(&bytes).map_err(|detail| FleetError::Store { operation: "load", detail })
            })
            .transpose()
    }

    async fn commit(&self, term: &Term, changes: Vec<Change>) -> Result<(), FleetError> {
        if !term.holds() {
            return Err(FleetError::Fenced {
                term: term.number(),
                detail: "it was resigned".into(),
            });
        }
        if let Some(refused) = super::too_many_changes(&changes) {
            return Err(refused);
        }
        let mut writes = Vec::with_capacity(changes.len());
        for change in changes {
            writes.push(match change {
                Change::Put(record) => {
                    LedgerChange::Put { key: record.placement.id.clone(), value: encode(&record)? }
                }
                Change::Delete(id) => LedgerChange::Delete { key: id },
                Change::PutEntry(entry) => LedgerChange::Put {
                    key: format!("{}{}", entry.kind.ledger_prefix(), entry.id),
                    value: entry.json.into_bytes(),
                },
                Change::DeleteEntry(kind, id) => {
                    LedgerChange::Delete { key: format!("{}{id}", kind.ledger_prefix()) }
                }
            });
        }
        match self.ledger.write(term.number(), writes).await {
            Ok(()) => Ok(()),
            Err(StoreError::Fenced { current, .. }) => Err(FleetError::Fenced {
                term: term.number(),
                detail: format!("term {current} leads now"),
            }),
            Err(e) => Err(store_error("commit", &e)),
        }
    }
}
