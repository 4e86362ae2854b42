//! The fleet's variables, which it serves to its workers: the same store, paths and checks as
//! an agent's (`nomadVar` and `key` in task templates), kept whole in the fleet's store
//! ([`EntryKind::Variables`]) so that whichever replica leads has them, and set through the
//! fleet's API (`/v1/var/{path}`, `/v1/vars`, the same shapes as an agent's) or `wharf fleet var`.
//!
//! Every worker gets the whole set: before the pool's next run probe or start on a worker
//! whose copy is older than the fleet's, [`SyncingExecutor`] runs `wharf var sync` there with
//! the set on stdin. So a change reaches every worker within a probe interval (its templates
//! render again), and work never starts on a worker that has not been given the set as it
//! was when the start was sent. A worker's own variables are replaced by the fleet's once the
//! fleet has any; a fleet that never had one leaves its workers' alone. The set's index grows
//! with every change and is kept with it, so a worker refuses a copy older than its own (a
//! push a former leader sent late).

use crate::api::ApiError;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use wharf_fleet::{Change, Entry, EntryKind, FleetError, FleetStore, Term};
use wharf_prober::{Executor, Output, ProberError};
use wharf_store::{Variable, VariableSync};

/// The id of the one entry that holds the set.
const SET_ID: &str = "set";

/// The most the whole set may hold, encoded: well under what one etcd value may be.
pub const MAX_SET_BYTES: usize = 1024 * 1024;

/// The set as kept: its index and its variables.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Set {
    index: u64,
    variables: BTreeMap<String, Variable>,
}

/// The fleet's variables, as of the term they were last read in.
#[derive(Debug)]
pub struct FleetVariables {
    store: Arc<dyn FleetStore>,
    /// The term the set was read in (none before the first read), and the set.
    held: parking_lot::RwLock<(Option<Term>, Set)>,
    /// One change at a time: each reads the set, writes the next.
    changing: tokio::sync::Mutex<()>,
}

impl FleetVariables {
    /// The variables kept in `store`; read with [`FleetVariables::load`] when a term begins.
    pub fn new(store: Arc<dyn FleetStore>) -> FleetVariables {
        FleetVariables {
            store,
            held: parking_lot::RwLock::default(),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads the set from the store, as `term`'s: a replica that takes the lead serves (and
    /// hands its workers) the variables its predecessors set.
    pub async fn load(&self, term: &Term) -> Result<(), FleetError> {
        let _changing = self.changing.lock().await;
        let entries = self.store.load_entries(EntryKind::Variables).await?;
        let set = match entries.iter().find(|e| e.id == SET_ID) {
            Some(entry) => serde_json::from_str(&entry.json).map_err(|e| FleetError::Store {
                operation: "load",
                detail: format!("the fleet's variables: {e}"),
            })?,
            None => Set::default(),
        };
        tracing::info!(
            variables = set.variables.len(),
            index = set.index,
            term = term.number(),
            "variables loaded"
        );
        *self.held.write() = (Some(term.clone()), set);
        Ok(())
    }

    /// The variable at `path`.
    pub fn get(&self, path: &str) -> Option<Variable> {
        self.held.read().1.variables.get(path).cloned()
    }

    /// The variables under `prefix`, by path.
    pub fn list(&self, prefix: &str) -> Vec<Variable> {
        let held = self.held.read();
        held.1
            .variables
            .range(prefix.to_owned()..)
            .take_while(|(p, _)| p.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The whole set as workers take it; `None` while the fleet has never had a variable.
    pub fn copy(&self) -> Option<VariableSync> {
        let held = self.held.read();
        (held.1.index > 0).then(|| VariableSync {
            source_index: held.1.index,
            variables: held.1.variables.iter().map(|(p, v)| (p.clone(), v.items.clone())).collect(),
        })
    }

    /// Sets the variable at `path`, durably under the term the set was read in.
    pub async fn put(
        &self,
        path: &str,
        items: BTreeMap<String, String>,
    ) -> Result<Variable, ApiError> {
        wharf_store::check_variable(path, &items)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let path = path.to_owned();
        self.change(move |set| {
            let variable = Variable { path: path.clone(), items, modify_index: set.index };
            set.variables.insert(path, variable.clone());
            variable
        })
        .await
    }

    /// Removes the variable at `path`, durably; whether there was one.
    pub async fn delete(&self, path: &str) -> Result<bool, ApiError> {
        if self.get(path).is_none() {
            return Ok(false);
        }
        self.change(|set| set.variables.remove(path).is_some()).await
    }

    /// Applies `change` to the next set (its index one more), writes it, keeps it once written.
    async fn change<T>(&self, change: impl FnOnce(&mut Set) -> T) -> Result<T, ApiError> {
        let _changing = self.changing.lock().await;
        let (term, mut next) = self.held.read().clone();
        let term = term.ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the fleet's variables are not loaded yet; try again",
            )
        })?;
        next.index += 1;
        let result = change(&mut next);
        let json = serde_json::to_string(&next)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        if json.len() > MAX_SET_BYTES {
            return Err(ApiError::bad_request(format!(
                "the fleet's variables would hold {} bytes, more than the {MAX_SET_BYTES} allowed",
                json.len()
            )));
        }
        let entry = Entry { kind: EntryKind::Variables, id: SET_ID.to_owned(), json };
        self.store.commit(&term, vec![Change::PutEntry(entry)]).await.map_err(|e| {
            let status = match e {
                FleetError::Fenced { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            ApiError::new(status, format!("cannot keep the fleet's variables: {e}"))
        })?;
        self.held.write().1 = next;
        Ok(result)
    }
}

/// A worker's executor that gives the worker the fleet's variables before the pool's run
/// probes and starts there, whenever the worker's copy is older than the fleet's.
#[derive(Debug)]
pub struct SyncingExecutor {
    inner: Arc<dyn Executor>,
    variables: Arc<FleetVariables>,
    /// The run probe's arguments and the start's, as the pool sends them (fenced): how a
    /// command that needs the worker's agent is known, and where its runner's path ends.
    list_args: String,
    start_args: String,
    /// What the runner needs to find the worker's agent (`--address ...`), if anything.
    agent_args: String,
    /// The fleet's index of the set this worker was last given (0: never).
    given: AtomicU64,
}

impl SyncingExecutor {
    /// Wraps `inner`, the executor of one worker.
    pub fn new(
        inner: Arc<dyn Executor>,
        variables: Arc<FleetVariables>,
        list_args: String,
        start_args: String,
        agent_args: String,
    ) -> SyncingExecutor {
        SyncingExecutor {
            inner,
            variables,
            list_args,
            start_args,
            agent_args,
            given: AtomicU64::new(0),
        }
    }

    /// The runner's path in `command`, if it is a run probe or a start.
    fn runner_of<'a>(&self, command: &'a str) -> Option<&'a str> {
        let probe = command.strip_suffix(self.list_args.as_str()).map(str::trim_end);
        let start = || command.find(&format!(" {}", self.start_args)).map(|at| &command[..at]);
        probe.or_else(start).filter(|runner| !runner.is_empty())
    }

    /// Gives the worker the fleet's set, if it has not been given this one; a failure is
    /// logged and tried again before the next command.
    async fn give(&self, runner: &str, deadline: Duration) {
        let Some(copy) = self.variables.copy() else { return };
        if self.given.load(Ordering::Acquire) >= copy.source_index {
            return;
        }
        let stdin = match serde_json::to_vec(&copy) {
            Ok(stdin) => stdin,
            Err(error) => return tracing::warn!(%error, "cannot encode the fleet's variables"),
        };
        let command = format!("{runner} {}var sync", self.agent_args);
        match self.inner.execute(&command, &stdin, deadline).await {
            Ok(output) if output.status == Some(0) => {
                self.given.fetch_max(copy.source_index, Ordering::AcqRel);
            }
            Ok(output) => tracing::warn!(
                status = output.status,
                stderr = %String::from_utf8_lossy(&output.stderr).trim(),
                "a worker refused the fleet's variables"
            ),
            Err(error) => tracing::warn!(%error, "cannot give a worker the fleet's variables"),
        }
    }
}

#[async_trait::async_trait]
impl Executor for SyncingExecutor {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        if let Some(runner) = self.runner_of(command) {
            self.give(runner, deadline).await;
        }
        self.inner.execute(command, stdin, deadline).await
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    fn retarget(&self, instance: &wharf_prober::Instance) {
        // Another machine may answer now: give it the set again.
        self.given.store(0, Ordering::Release);
        self.inner.retarget(instance);
    }
}

impl crate::variables::VariableService for FleetVariables {
    fn get(&self, path: &str) -> Option<Variable> {
        FleetVariables::get(self, path)
    }

    fn list(&self, prefix: &str) -> Vec<Variable> {
        FleetVariables::list(self, prefix)
    }

    async fn put(
        self: Arc<Self>,
        path: String,
        items: BTreeMap<String, String>,
    ) -> Result<Variable, ApiError> {
        FleetVariables::put(&self, &path, items).await
    }

    async fn delete(self: Arc<Self>, path: String) -> Result<bool, ApiError> {
        FleetVariables::delete(&self, &path).await
    }

    async fn sync(self: Arc<Self>, _: VariableSync) -> Result<crate::variables::Synced, ApiError> {
        Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "a fleet's variables are set one at a time (PUT /v1/var/PATH); a whole set is what \
             a fleet gives its workers' agents",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_fleet::{MemoryStore, Replica};

    /// Records every command with its stdin; a `var sync` exits with `sync_status`.
    #[derive(Debug, Default)]
    struct Recording {
        ran: parking_lot::Mutex<Vec<(String, String)>>,
        sync_status: AtomicU64,
    }

    #[async_trait::async_trait]
    impl Executor for Recording {
        async fn execute(
            &self,
            command: &str,
            stdin: &[u8],
            _: Duration,
        ) -> Result<Output, ProberError> {
            let stdin = String::from_utf8_lossy(stdin).into_owned();
            self.ran.lock().push((command.to_owned(), stdin));
            let status = if command.ends_with("var sync") {
                self.sync_status.load(Ordering::Relaxed)
            } else {
                0
            };
            Ok(Output::exited(status as u32, ""))
        }
    }

    fn items(value: &str) -> BTreeMap<String, String> {
        [("user".to_owned(), value.to_owned())].into()
    }

    #[tokio::test]
    async fn a_worker_is_given_the_set_before_a_probe_or_start_whenever_its_copy_is_older() {
        let store: Arc<dyn FleetStore> = Arc::new(MemoryStore::new());
        let replica = Replica { name: "a".into(), address: "127.0.0.1:1".into() };
        let term = store.campaign(&replica).await.unwrap();
        let variables = Arc::new(FleetVariables::new(store.clone()));
        variables.load(&term).await.unwrap();
        let recording = Arc::new(Recording::default());
        let executor = SyncingExecutor::new(
            recording.clone(),
            variables.clone(),
            "--fleet-term 3 alloc list --probe".into(),
            "--fleet-term 3 run --detach - --id".into(),
            "--address 127.0.0.1:9 ".into(),
        );
        let probe = "sudo /r --fleet-term 3 alloc list --probe";
        let start = "sudo /r --fleet-term 3 run --detach - --id 'w1'";
        let ran = || -> Vec<String> { recording.ran.lock().drain(..).map(|(c, _)| c).collect() };
        let deadline = Duration::from_secs(1);

        // No variable ever: the workers keep their own.
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [probe]);

        variables.put("app/db", items("ann")).await.unwrap();
        executor.execute("true", b"", deadline).await.unwrap();
        executor.execute(probe, b"", deadline).await.unwrap();
        let sync = "sudo /r --address 127.0.0.1:9 var sync";
        let commands = recording.ran.lock().clone();
        assert_eq!(commands[1].0, sync, "{commands:?}");
        let copy: VariableSync = serde_json::from_str(&commands[1].1).unwrap();
        assert_eq!((copy.source_index, &copy.variables["app/db"]), (1, &items("ann")));
        assert_eq!(ran(), ["true", sync, probe], "nothing before a command that is no probe");
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [probe], "given once");

        // A worker that refuses it is given it again before the next command.
        variables.put("app/db", items("bob")).await.unwrap();
        recording.sync_status.store(1, Ordering::Relaxed);
        executor.execute(start, b"spec", deadline).await.unwrap();
        assert_eq!(ran(), [sync, start]);
        recording.sync_status.store(0, Ordering::Relaxed);
        executor.execute(start, b"spec", deadline).await.unwrap();
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [sync, start, probe]);

        // What a later leader reads is the set as written.
        let reread = FleetVariables::new(store.clone());
        reread.load(&term).await.unwrap();
        assert_eq!(reread.copy(), variables.copy());
        assert!(reread.delete("app/db").await.unwrap());
        assert_eq!(reread.copy().map(|c| (c.source_index, c.variables.len())), Some((3, 0)));
    }
}
