//! [`EtcdStore`]: the fleet's records and its leadership in etcd (the v3 API, through its JSON
//! gateway: `gateway.rs`), for several `wharf fleet` replicas that share one etcd.
//!
//! Keys, under the configured prefix (`/wharf/fleet` by default):
//!
//! ```text
//! <prefix>/work/<id>          one record per piece of work (format version + JSON)
//! <prefix>/nomad-jobs/<id>    one record per Nomad job, as its keeper wrote it
//! <prefix>/replicas/<name>    each replica's name and API address, on its own lease
//! <prefix>/leader/...         etcd's election: the leader's key, on its lease
//! ```
//!
//! Each replica holds one lease of `lease_ttl`, kept alive every third of it. It registers
//! itself under `replicas/` and campaigns in etcd's election with it; the winner's term is the
//! revision its leader key was created at (so later terms have higher numbers), and every
//! commit is a transaction that applies only if that key still exists with that revision. A
//! leader that was frozen or cut off past its lease has lost the key, so its writes change
//! nothing. The keep-alive also bounds [`Term::holds`](super::Term::holds): the term surely
//! holds until the lease's expiry as last renewed (measured from when the renewal was asked),
//! less a margin; past that the replica stops acting on workers even before etcd answers.

mod gateway;

use super::{
    Change, Entry, EntryKind, FleetStore, Loaded, Replica, Standing, StoreInfo, Term, Token,
    decode, encode,
};
use crate::FleetError;
use gateway::{Gateway, GatewayError, Operation};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use wharf_state::fleet::WorkRecord;

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` or `http://host:port` of each member.
    pub endpoints: Vec<String>,
    /// Every key of this fleet starts with it.
    pub prefix: String,
    /// The lease's time to live: a replica that stops renewing it (killed, frozen, cut off)
    /// loses its place, and another takes over, within this long.
    pub lease_ttl: Duration,
    /// The deadline of one call to etcd.
    pub call_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> EtcdConfig {
        EtcdConfig {
            endpoints: vec!["127.0.0.1:2379".into()],
            prefix: "/wharf/fleet".into(),
            lease_ttl: Duration::from_secs(5),
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// A fleet store in etcd.
pub struct EtcdStore {
    config: EtcdConfig,
    etcd: Arc<Gateway>,
    /// This replica's lease and its keeper, once it has one.
    lease: Mutex<Option<Arc<Lease>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("config", &self.config).finish_non_exhaustive()
    }
}

/// A lease kept alive in the background until dropped.
#[derive(Debug)]
struct Lease {
    id: i64,
    standing: watch::Receiver<Standing>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

fn etcd_error(operation: &'static str, error: impl std::fmt::Display) -> FleetError {
    FleetError::Store { operation, detail: format!("etcd: {error}") }
}

impl EtcdStore {
    /// Connects to etcd, and checks with a first read that a member answers.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, FleetError> {
        if config.lease_ttl < Duration::from_secs(2) {
            return Err(FleetError::Store {
                operation: "connect",
                detail: "etcd: the lease TTL must be at least 2s".into(),
            });
        }
        let etcd = Gateway::new(&config.endpoints, config.call_timeout)
            .map_err(|e| etcd_error("connect", e))?;
        let store = EtcdStore { config, etcd: Arc::new(etcd), lease: Mutex::new(None) };
        // Fails here, with the endpoints named, rather than at the first campaign.
        let probe = store.key("work/");
        store.call("connect", store.etcd.range(probe.as_bytes(), None, 1)).await?;
        Ok(store)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.config.prefix.trim_end_matches('/'))
    }

    async fn call<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, GatewayError>>,
    ) -> Result<T, FleetError> {
        match tokio::time::timeout(self.config.call_timeout, call).await {
            Ok(result) => result.map_err(|e| etcd_error(operation, e)),
            Err(_) => Err(etcd_error(
                operation,
                format!(
                    "no answer within {:?} from {:?}",
                    self.config.call_timeout, self.config.endpoints
                ),
            )),
        }
    }

    /// This replica's lease: granted and kept alive on first use, and again after it lapsed.
    async fn lease(&self) -> Result<Arc<Lease>, FleetError> {
        let mut held = self.lease.lock().await;
        if let Some(lease) = held.as_ref()
            && *lease.standing.borrow() != Standing::Over
        {
            return Ok(lease.clone());
        }
        let ttl = self.config.lease_ttl;
        let asked = Instant::now();
        let id = self.call("lease", self.etcd.lease_grant(ttl)).await?;
        let (sender, standing) = watch::channel(Standing::Until(Some(valid_until(asked, ttl))));
        let keeper = tokio::spawn(keep_alive(self.etcd.clone(), id, sender, ttl));
        let lease = Arc::new(Lease { id, standing, keeper });
        *held = Some(lease.clone());
        Ok(lease)
    }

    /// Every key under `<prefix>/<under>` with its value, read a page at a time.
    async fn scan(&self, under: &str) -> Result<Vec<(String, Vec<u8>)>, FleetError> {
        const PAGE: i64 = 500;
        let prefix = self.key(under);
        let end = prefix_end(&prefix);
        let mut from = prefix.into_bytes();
        let mut rows = Vec::new();
        loop {
            let answer = self.call("load", self.etcd.range(&from, Some(&end), PAGE)).await?;
            for kv in &answer.kvs {
                rows.push((String::from_utf8_lossy(&kv.key.0).into_owned(), kv.value.0.clone()));
            }
            match answer.kvs.last() {
                Some(last) if answer.more => {
                    from = last.key.0.clone();
                    from.push(0);
                }
                _ => return Ok(rows),
            }
        }
    }

    fn decode_replica(bytes: &[u8]) -> Result<Replica, FleetError> {
        serde_json::from_slice(bytes)
            .map_err(|e| etcd_error("read", format!("a replica record: {e}")))
    }
}

/// The moment a lease renewed at `asked` surely still holds until: its TTL less a third, for
/// clocks that drift and answers that come late.
fn valid_until(asked: Instant, ttl: Duration) -> Instant {
    asked + ttl - ttl / 3
}

/// Renews the lease every third of its TTL, and tells the standing each renewal gives. The
/// lease is over once etcd says it expired (a TTL of 0); a round with no answer, or an error,
/// leaves the standing to run out on its own.
async fn keep_alive(etcd: Arc<Gateway>, id: i64, standing: watch::Sender<Standing>, ttl: Duration) {
    let every = ttl / 3;
    loop {
        let asked = Instant::now();
        match tokio::time::timeout(every, etcd.lease_keep_alive(id)).await {
            Ok(Ok(left)) if !left.is_zero() => {
                standing.send_replace(Standing::Until(Some(valid_until(asked, ttl))));
            }
            Ok(Ok(_)) => {
                tracing::warn!(lease = id, "the etcd lease expired");
                break;
            }
            Ok(Err(error)) => tracing::debug!(lease = id, %error, "no keep-alive this round"),
            Err(_) => tracing::debug!(lease = id, "no keep-alive answer this round"),
        }
        if let Standing::Until(Some(until)) = *standing.borrow()
            && Instant::now() >= until
        {
            tracing::warn!(lease = id, "the etcd lease was not renewed in time");
            break;
        }
        tokio::time::sleep_until(asked + every).await;
    }
    standing.send_replace(Standing::Over);
}

/// The end of the key range that holds every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[crate::async_trait]
impl FleetStore for EtcdStore {
    fn describe(&self) -> StoreInfo {
        StoreInfo {
            backend: "etcd".into(),
            location: format!("{} under {}", self.config.endpoints.join(","), self.config.prefix),
        }
    }

    async fn campaign(&self, me: &Replica) -> Result<Term, FleetError> {
        let lease = self.lease().await?;
        let value = serde_json::to_vec(me).map_err(|e| etcd_error("campaign", e))?;
        let presence = self.key(&format!("replicas/{}", me.name));
        self.call("campaign", self.etcd.put(presence.as_bytes(), &value, lease.id)).await?;
        // Waits as long as another leads, but not past this replica's own lease.
        let mut standing = lease.standing.clone();
        let lapsed = async move {
            while *standing.borrow_and_update() != Standing::Over {
                if standing.changed().await.is_err() {
                    break;
                }
            }
        };
        let election = self.key("leader");
        let leader = tokio::select! {
            won = self.etcd.campaign(election.as_bytes(), &value, lease.id) => {
                won.map_err(|e| etcd_error("campaign", e))?
            }
            () = lapsed => {
                return Err(etcd_error("campaign", "this replica's lease lapsed while it waited"));
            }
        };
        let token = Token::Key { key: leader.key.0, revision: leader.rev.0, lease: leader.lease.0 };
        Ok(Term::new(leader.rev.0 as u64, token, lease.standing.clone()))
    }

    async fn resign(&self, term: &Term) -> Result<(), FleetError> {
        term.end();
        let Token::Key { key, revision, .. } = &term.token else { return Ok(()) };
        let delete = vec![Operation::Delete { key: key.clone() }];
        self.call("resign", self.etcd.txn_if_created_at(key, *revision, delete)).await?;
        Ok(())
    }

    async fn leader(&self) -> Result<Option<Replica>, FleetError> {
        let election = self.key("leader");
        let leader = self.call("leader", self.etcd.leader(election.as_bytes())).await?;
        leader.map(|kv| EtcdStore::decode_replica(&kv.value.0)).transpose()
    }

    async fn replicas(&self) -> Result<Vec<Replica>, FleetError> {
        let prefix = self.key("replicas/");
        let end = prefix_end(&prefix);
        let answer =
            self.call("replicas", self.etcd.range(prefix.as_bytes(), Some(&end), 0)).await?;
        answer.kvs.iter().map(|kv| EtcdStore::decode_replica(&kv.value.0)).collect()
    }

    async fn load_all(&self) -> Result<Loaded, FleetError> {
        let mut loaded = Loaded::default();
        for (key, value) in self.scan("work/").await? {
            match decode(&value) {
                Ok(record) => loaded.records.push(record),
                Err(why) => loaded.problems.push((key, why)),
            }
        }
        Ok(loaded)
    }

    async fn load_entries(&self, kind: EntryKind) -> Result<Vec<Entry>, FleetError> {
        let dir = format!("{}/", kind.etcd_dir());
        let prefix = self.key(&dir);
        let mut entries = Vec::new();
        for (key, value) in self.scan(&dir).await? {
            let id = key.strip_prefix(&prefix).unwrap_or(&key).to_owned();
            let json = String::from_utf8(value)
                .map_err(|e| etcd_error("load", format!("{} {id:?}: {e}", kind.describe())))?;
            entries.push(Entry { kind, id, json });
        }
        Ok(entries)
    }

    async fn load(&self, id: &str) -> Result<Option<WorkRecord>, FleetError> {
        let key = self.key(&format!("work/{id}"));
        let answer = self.call("load", self.etcd.range(key.as_bytes(), None, 0)).await?;
        answer
            .kvs
            .first()
            .map(|kv| {
                decode(&kv.value.0)
                    .map_err(|detail| FleetError::Store { operation: "load", detail })
            })
            .transpose()
    }

    async fn commit(&self, term: &Term, changes: Vec<Change>) -> Result<(), FleetError> {
        let Token::Key { key, revision, .. } = &term.token else {
            return Err(etcd_error("commit", "the term is not an etcd term"));
        };
        if !term.holds() {
            return Err(FleetError::Fenced {
                term: term.number(),
                detail: "its lease was not renewed in time".into(),
            });
        }
        if let Some(refused) = super::too_many_changes(&changes) {
            return Err(refused);
        }
        let mut operations = Vec::with_capacity(changes.len());
        for change in &changes {
            let dir = match change {
                Change::Put(_) | Change::Delete(_) => "work",
                Change::PutEntry(Entry { kind, .. }) | Change::DeleteEntry(kind, _) => {
                    kind.etcd_dir()
                }
            };
            let key = self.key(&format!("{dir}/{}", change.id())).into_bytes();
            operations.push(match change {
                Change::Put(record) => Operation::Put { key, value: encode(record)? },
                Change::PutEntry(entry) => {
                    Operation::Put { key, value: entry.json.clone().into_bytes() }
                }
                Change::Delete(_) | Change::DeleteEntry(..) => Operation::Delete { key },
            });
        }
        let applied =
            self.call("commit", self.etcd.txn_if_created_at(key, *revision, operations)).await?;
        if applied {
            Ok(())
        } else {
            Err(FleetError::Fenced {
                term: term.number(),
                detail: "its leader key is gone from etcd: another replica leads".into(),
            })
        }
    }
}
