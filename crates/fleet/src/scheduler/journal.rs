//! The scheduler's journal writer: every change to the books goes to the store in order, under
//! the scheduler's term, and the shell hears how far it is durable ([`Durable`]).

use super::config::MAX_CHANGES_PER_ENTRY;
use crate::store::{Change, FleetStore, Term};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tracing::warn;

/// Where the journal stands: every change up to a sequence number is durable, or writing
/// failed and nothing more will be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Durable {
    Upto(u64),
    Failed(String),
}

/// Writes the journal's changes in order, each commit under `term`, and tells how far it got.
/// The first failure ends it: the scheduler may not act on what it cannot persist.
pub(super) async fn write_journal(
    store: Arc<dyn FleetStore>,
    term: Term,
    mut writes: mpsc::UnboundedReceiver<(u64, Vec<Change>)>,
    durable: watch::Sender<Durable>,
) {
    let mut pending: Vec<(u64, Vec<Change>)> = Vec::new();
    loop {
        if pending.is_empty() {
            match writes.recv().await {
                Some(first) => pending.push(first),
                None => return,
            }
        }
        while let Ok(more) = writes.try_recv() {
            pending.push(more);
        }
        // Whole entries, as many as fit in one commit; a record's later change replaces its
        // earlier one in place, so it never goes before it.
        let mut batch: Vec<Change> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut upto = 0;
        let mut taken = 0;
        for (sequence, changes) in &pending {
            if batch.len() + changes.len() > MAX_CHANGES_PER_ENTRY && !batch.is_empty() {
                break;
            }
            for change in changes {
                match at.get(change.id()) {
                    Some(&index) => batch[index] = change.clone(),
                    None => {
                        at.insert(change.id().to_owned(), batch.len());
                        batch.push(change.clone());
                    }
                }
            }
            upto = *sequence;
            taken += 1;
        }
        pending.drain(..taken);
        if let Err(e) = store.commit(&term, batch).await {
            warn!(term = term.number(), error = %e, "the fleet's journal cannot be written");
            durable.send_replace(Durable::Failed(e.to_string()));
            return;
        }
        durable.send_replace(Durable::Upto(upto));
    }
}
