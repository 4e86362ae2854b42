//! Durable fleet state: [`FleetStore`], the one seam between the scheduler and wherever its
//! records live, and who may write them.
//!
//! A store keeps one [`WorkRecord`] per piece of work, and beside the work the [`Entry`]s of the
//! fleet's servers (each Nomad job the fleet's Nomad API registered, the fleet's variables: JSON
//! the store keeps as given, so that a new leader serves what its predecessor was given), and
//! decides who leads: a replica
//! [`campaign`](FleetStore::campaign)s and gets a [`Term`]; every [`commit`](FleetStore::commit)
//! names the term it is made under, and the store refuses it ([`FleetError::Fenced`]) once that
//! term has ended, so a replica that lost its place (its lease expired while it was frozen or
//! cut off) cannot change what its successor reads. A term also knows, from the local clock,
//! until when it surely still holds ([`Term::holds`]): the scheduler asks before it sends a
//! command to a worker, since a command does not go through the store.
//!
//! Backends, all passing the same contract tests (`tests/tests/fleet_store.rs`):
//! - [`LedgerStore`]: the embedded default, one redb file through wharf-store's `Ledger`. One
//!   fleet process; its terms never lapse, a new one outdates the old.
//! - [`EtcdStore`](etcd::EtcdStore) (feature `etcd`): etcd's v3 API through its JSON gateway,
//!   leadership by etcd's election on a lease, writes fenced by a transaction that compares
//!   the leader key's revision.
//! - [`MemoryStore`]: the same rules in memory, for tests.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "redb")]
mod ledger;
mod memory;

#[cfg(feature = "redb")]
pub use ledger::LedgerStore;
pub use memory::MemoryStore;

use crate::FleetError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use wharf_state::fleet::WorkRecord;

/// The most changes one [`FleetStore::commit`] may carry, on every backend: etcd refuses a
/// transaction of more than 128 operations (its default `--max-txn-ops`), and the other
/// backends keep the same rule so that a caller that would break it fails in its tests as it
/// would on etcd. A caller shapes its writes to fit, rather than split one across commits.
pub const MAX_CHANGES_PER_COMMIT: usize = 100;

/// A commit of more changes than [`MAX_CHANGES_PER_COMMIT`], refused whole.
pub(crate) fn too_many_changes(changes: &[Change]) -> Option<FleetError> {
    (changes.len() > MAX_CHANGES_PER_COMMIT).then(|| FleetError::Store {
        operation: "commit",
        detail: format!(
            "{} changes in one commit; at most {MAX_CHANGES_PER_COMMIT}",
            changes.len()
        ),
    })
}

/// One fleet process, as the others see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    /// Its name, unique among the replicas of a fleet.
    pub name: String,
    /// Where its API answers (`host:port`).
    pub address: String,
}

/// What a store is, for the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreInfo {
    /// `redb`, `etcd` or `memory`.
    pub backend: String,
    /// Its file, or its endpoints and key prefix.
    pub location: String,
}

/// A kind of entry the fleet's servers keep beside the work, each under keys of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// A Nomad job's record, for the fleet's Nomad API (its id is the job's).
    NomadJob,
    /// The fleet's variables, which it serves to its workers: the whole set in one entry.
    Variables,
}

impl EntryKind {
    /// Every kind.
    pub const ALL: [EntryKind; 2] = [EntryKind::NomadJob, EntryKind::Variables];

    /// What its keys start with in etcd (`<prefix>/<this>/<id>`).
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd_dir(self) -> &'static str {
        match self {
            EntryKind::NomadJob => "nomad-jobs",
            EntryKind::Variables => "variables",
        }
    }

    /// What its keys start with in the ledger (work ids hold no space).
    #[cfg(feature = "redb")]
    pub(crate) fn ledger_prefix(self) -> &'static str {
        match self {
            EntryKind::NomadJob => "nomad job ",
            EntryKind::Variables => "variables ",
        }
    }

    /// Its name in messages.
    #[cfg(any(feature = "etcd", feature = "redb"))]
    pub(crate) fn describe(self) -> &'static str {
        match self {
            EntryKind::NomadJob => "Nomad job",
            EntryKind::Variables => "variables",
        }
    }
}

/// An entry kept beside the work under a key of its own: the store keeps its JSON as given
/// and never reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: EntryKind,
    /// Its id among the entries of its kind.
    pub id: String,
    /// The entry, as its keeper wrote it.
    pub json: String,
}

/// A change to the records.
// Changes are made once and moved into a commit; boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Store a record, replacing the one with its id.
    Put(WorkRecord),
    /// Forget the record with this id.
    Delete(String),
    /// Store an entry, replacing the one of its kind with its id.
    PutEntry(Entry),
    /// Forget the entry of this kind with this id.
    DeleteEntry(EntryKind, String),
}

impl Change {
    /// The id of the record or entry it changes (each kind's ids are kept apart).
    pub fn id(&self) -> &str {
        match self {
            Change::Put(record) => &record.placement.id,
            Change::Delete(id) | Change::DeleteEntry(_, id) => id,
            Change::PutEntry(entry) => &entry.id,
        }
    }
}

/// Everything a store holds, for a replica that takes over.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The records it could read.
    pub records: Vec<WorkRecord>,
    /// Records it could not read, by key, with why: reported, never dropped in silence.
    pub problems: Vec<(String, String)>,
}

/// Whether a term still holds, as its keeper last heard from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It holds until this moment at least (the lease's expiry as last renewed, less a margin),
    /// or for good.
    Until(Option<Instant>),
    /// It is over: resigned, or the store said it lapsed.
    Over,
}

/// A term of leadership. Clones share it.
#[derive(Clone)]
pub struct Term {
    number: u64,
    pub(crate) token: Token,
    standing: watch::Receiver<Standing>,
    /// Set when it is given up here (resigned), whatever the store's standing says.
    ended: Arc<watch::Sender<bool>>,
}

/// What a backend needs to fence a write under a term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// The term number alone (the ledger, the memory store).
    Number,
    /// etcd's leader key and the revision it was created at, and its lease.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Key { key: Vec<u8>, revision: i64, lease: i64 },
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("number", &self.number)
            .field("token", &self.token)
            .field("standing", &*self.standing.borrow())
            .finish()
    }
}

impl Term {
    /// Term `number`, fenced by `token`, holding as `standing` says. The sender of `standing`
    /// belongs to the store (a lease's keep-alive): when it goes, the term lapses.
    pub(crate) fn new(number: u64, token: Token, standing: watch::Receiver<Standing>) -> Term {
        Term { number, token, standing, ended: Arc::new(watch::Sender::new(false)) }
    }

    /// A term that holds until it is resigned, with the sender that ends it.
    pub(crate) fn lasting(number: u64) -> (Term, watch::Sender<Standing>) {
        let (sender, standing) = watch::channel(Standing::Until(None));
        (Term::new(number, Token::Number, standing), sender)
    }

    /// Its number: higher for later terms of the same store.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Whether it surely holds now: not over, and its lease (if any) renewed recently enough.
    /// A replica acts on workers only while this is true.
    pub fn holds(&self) -> bool {
        if *self.ended.borrow() {
            return false;
        }
        match *self.standing.borrow() {
            Standing::Over => false,
            Standing::Until(None) => true,
            Standing::Until(Some(until)) => Instant::now() < until,
        }
    }

    /// Marks it given up here: it holds no longer.
    pub(crate) fn end(&self) {
        self.ended.send_replace(true);
    }

    /// Returns once the term is over, or once it has gone unrenewed past its margin.
    pub async fn lost(&self) {
        let mut ended = self.ended.subscribe();
        tokio::select! {
            () = self.lapsed() => {}
            _ = ended.wait_for(|ended| *ended) => {}
        }
    }

    async fn lapsed(&self) {
        let mut standing = self.standing.clone();
        loop {
            let until = match *standing.borrow_and_update() {
                Standing::Over => return,
                Standing::Until(until) => until,
            };
            match until {
                Some(until) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => return,
                        changed = standing.changed() => if changed.is_err() { return },
                    }
                }
                None => {
                    if standing.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Where a fleet keeps what it must not lose, and who leads it. Every write returns once it is
/// durable.
#[crate::async_trait]
pub trait FleetStore: Send + Sync + fmt::Debug + 'static {
    /// What it is and where.
    fn describe(&self) -> StoreInfo;

    /// Waits until `me` leads, and returns its term. Until then `me` is listed among the
    /// replicas.
    async fn campaign(&self, me: &Replica) -> Result<Term, FleetError>;

    /// Gives the term up: writes under it are refused from now on, and another may lead.
    async fn resign(&self, term: &Term) -> Result<(), FleetError>;

    /// Who leads now, if anyone.
    async fn leader(&self) -> Result<Option<Replica>, FleetError>;

    /// Every replica that is up (campaigning or leading).
    async fn replicas(&self) -> Result<Vec<Replica>, FleetError>;

    /// Every record, for a replica that takes over.
    async fn load_all(&self) -> Result<Loaded, FleetError>;

    /// Every entry of `kind`, for a replica that takes over.
    async fn load_entries(&self, kind: EntryKind) -> Result<Vec<Entry>, FleetError>;

    /// One record.
    async fn load(&self, id: &str) -> Result<Option<WorkRecord>, FleetError>;

    /// Applies `changes` atomically under `term`: all of them, durably, or none. Refused with
    /// [`FleetError::Fenced`] once the term is over, and whole if there are more than
    /// [`MAX_CHANGES_PER_COMMIT`].
    async fn commit(&self, term: &Term, changes: Vec<Change>) -> Result<(), FleetError>;
}

/// A record as stored: the format version in front of its JSON (wharf-store's encoding).
#[cfg(any(feature = "redb", feature = "etcd"))]
pub(crate) fn encode(record: &WorkRecord) -> Result<Vec<u8>, FleetError> {
    wharf_store::record::encode(|| format!("work {}", record.placement.id), record)
        .map_err(|e| FleetError::Store { operation: "encode", detail: e.to_string() })
}

/// A record read back, or why it cannot be.
#[cfg(any(feature = "redb", feature = "etcd"))]
pub(crate) fn decode(bytes: &[u8]) -> Result<WorkRecord, String> {
    wharf_store::record::decode(bytes).map_err(|e| e.to_string())
}
