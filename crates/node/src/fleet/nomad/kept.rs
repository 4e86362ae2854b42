//! The fleet's Nomad job records in its shared store ([`wharf_fleet::Entry`]), so that
//! whichever replica leads serves the jobs its predecessors registered: read into the registry
//! when a term begins here, and written under that term, so that a replica that lost its lead
//! cannot change them.

use crate::nomad_http::registry::{JobRecord, Keeper, Registry};
use std::collections::BTreeMap;
use std::sync::Arc;
use wharf_fleet::{Change, Entry, EntryKind, FleetError, FleetStore, Term};

/// Writes the registry's records to the fleet's store, under the term they were read in.
#[derive(Debug)]
pub(super) struct StoreKeeper {
    store: Arc<dyn FleetStore>,
    /// The term the registry holds the store's records of; none before the first load.
    term: parking_lot::Mutex<Option<Term>>,
}

impl StoreKeeper {
    pub(super) fn new(store: Arc<dyn FleetStore>) -> StoreKeeper {
        StoreKeeper { store, term: parking_lot::Mutex::new(None) }
    }

    /// Whether the registry holds the records as of `term`.
    pub(super) fn loaded_in(&self, term: &Term) -> bool {
        self.term.lock().as_ref().is_some_and(|loaded| loaded.number() == term.number())
    }

    /// Reads every job record from the store into `registry`, as `term`'s. A record that cannot
    /// be read is logged and left out.
    pub(super) async fn load(&self, registry: &Registry, term: &Term) -> Result<(), FleetError> {
        let mut jobs = BTreeMap::new();
        for entry in self.store.load_entries(EntryKind::NomadJob).await? {
            match serde_json::from_str::<JobRecord>(&entry.json) {
                Ok(record) => {
                    jobs.insert(entry.id, record);
                }
                Err(error) => {
                    tracing::warn!(job = %entry.id, %error, "cannot read a Nomad job record in the fleet's store; leaving it");
                }
            }
        }
        tracing::info!(jobs = jobs.len(), term = term.number(), "Nomad job records loaded");
        registry.replace(jobs);
        *self.term.lock() = Some(term.clone());
        Ok(())
    }

    async fn commit(&self, change: Change) -> Result<(), String> {
        let term = self.term.lock().clone();
        let term = term.ok_or("the Nomad job records were not loaded under a term")?;
        self.store.commit(&term, vec![change]).await.map_err(|e| e.to_string())
    }
}

#[async_trait::async_trait]
impl Keeper for StoreKeeper {
    async fn put(&self, id: &str, record: &JobRecord) -> Result<(), String> {
        let json = serde_json::to_string(record).map_err(|e| e.to_string())?;
        self.commit(Change::PutEntry(Entry { kind: EntryKind::NomadJob, id: id.to_owned(), json }))
            .await
    }

    async fn delete(&self, id: &str) -> Result<(), String> {
        self.commit(Change::DeleteEntry(EntryKind::NomadJob, id.to_owned())).await
    }
}
