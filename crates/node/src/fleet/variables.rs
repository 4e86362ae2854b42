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

use crate::variables::VariableError;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wharf_fleet::{Change, Entry, EntryKind, FleetError, FleetStore, Term};
use wharf_prober::{Executor, Output, ProberError};
use wharf_store::{Variable, VariableSync};

/// The id of the one entry that holds the set.
const SET_ID: &str = "set";

/// The most the whole set may hold, encoded: well under what one etcd value may be.
pub const MAX_SET_BYTES: usize = 1024 * 1024;

/// The version of the set's layout in the store.
const SET_VERSION: u64 = 1;

/// The set as kept: its layout's version, its generation and index, and its variables.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Set {
    #[serde(default)]
    version: u64,
    /// Made with the set's first variable: a set begun anew (its store replaced) is another
    /// generation, which workers take whatever index they hold.
    #[serde(default)]
    generation: String,
    index: u64,
    variables: BTreeMap<String, Variable>,
}

/// What the fleet holds: the term the set was read in, and the set, or why it could not be
/// read (then the variables are not served and no worker is given any, rather than the set
/// be overwritten).
#[derive(Debug, Default)]
struct Held {
    term: Option<Term>,
    set: Set,
    unreadable: Option<String>,
}

/// The fleet's variables, as of the term they were last read in.
#[derive(Debug)]
pub struct FleetVariables {
    store: Arc<dyn FleetStore>,
    held: parking_lot::RwLock<Held>,
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
    /// hands its workers) the variables its predecessors set. A store that cannot be read
    /// fails the lead; a set that cannot be understood is reported, not served, and kept.
    pub async fn load(&self, term: &Term) -> Result<(), FleetError> {
        let _changing = self.changing.lock().await;
        let entries = self.store.load_entries(EntryKind::Variables).await?;
        let read = match entries.iter().find(|e| e.id == SET_ID) {
            Some(entry) => match serde_json::from_str::<Set>(&entry.json) {
                Ok(set) if set.version > SET_VERSION => Err(format!(
                    "the fleet's variables are of layout {}, newer than this wharf's ({SET_VERSION})",
                    set.version
                )),
                Ok(set) => Ok(set),
                Err(e) => Err(format!("the fleet's variables in its store cannot be read: {e}")),
            },
            None => Ok(Set::default()),
        };
        let held = match read {
            Ok(set) => {
                tracing::info!(
                    variables = set.variables.len(),
                    index = set.index,
                    term = term.number(),
                    "variables loaded"
                );
                Held { term: Some(term.clone()), set, unreadable: None }
            }
            Err(why) => {
                tracing::error!(%why, "the fleet's variables are not served");
                Held { term: Some(term.clone()), set: Set::default(), unreadable: Some(why) }
            }
        };
        *self.held.write() = held;
        Ok(())
    }

    /// The variable at `path`.
    pub fn get(&self, path: &str) -> Option<Variable> {
        self.held.read().set.variables.get(path).cloned()
    }

    /// The variables under `prefix`, by path.
    pub fn list(&self, prefix: &str) -> Vec<Variable> {
        wharf_store::variables::under_prefix(&self.held.read().set.variables, prefix)
    }

    /// Why the variables cannot be served now, if they cannot.
    pub fn unavailable(&self) -> Option<VariableError> {
        let held = self.held.read();
        let why = held.unreadable.as_ref()?;
        Some(VariableError::new(StatusCode::SERVICE_UNAVAILABLE, why.clone()))
    }

    /// The whole set as workers take it; `None` while the fleet has never had a variable.
    pub fn copy(&self) -> Option<VariableSync> {
        let held = self.held.read();
        (held.set.index > 0 && held.unreadable.is_none()).then(|| VariableSync {
            source_index: held.set.index,
            generation: held.set.generation.clone(),
            variables: held
                .set
                .variables
                .iter()
                .map(|(p, v)| (p.clone(), v.items.clone()))
                .collect(),
        })
    }

    /// Sets the variable at `path`, durably under the term the set was read in.
    pub async fn put(
        &self,
        path: &str,
        items: BTreeMap<String, String>,
    ) -> Result<Variable, VariableError> {
        wharf_store::check_variable(path, &items)
            .map_err(|e| VariableError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
        if let Some(same) = self.get(path).filter(|v| v.items == items) {
            // Nothing to write, nor to give the workers again.
            return Ok(same);
        }
        let path = path.to_owned();
        self.change(move |set| {
            let variable = Variable { path: path.clone(), items, modify_index: set.index };
            set.variables.insert(path, variable.clone());
            variable
        })
        .await
    }

    /// Removes the variable at `path`, durably; whether there was one.
    pub async fn delete(&self, path: &str) -> Result<bool, VariableError> {
        if self.get(path).is_none() {
            return Ok(false);
        }
        self.change(|set| set.variables.remove(path).is_some()).await
    }

    /// Applies `change` to the next set (its index one more), writes it, keeps it once written.
    async fn change<T>(&self, change: impl FnOnce(&mut Set) -> T) -> Result<T, VariableError> {
        let _changing = self.changing.lock().await;
        if let Some(refused) = self.unavailable() {
            return Err(refused);
        }
        let (term, mut next) = {
            let held = self.held.read();
            (held.term.clone(), held.set.clone())
        };
        let term = term.ok_or_else(|| {
            VariableError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the fleet's variables are not loaded yet; try again",
            )
        })?;
        if next.generation.is_empty() {
            next.generation = crate::agent::new_alloc_id();
        }
        next.version = SET_VERSION;
        next.index += 1;
        let result = change(&mut next);
        let json = serde_json::to_string(&next)
            .map_err(|e| VariableError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        if json.len() > MAX_SET_BYTES {
            return Err(VariableError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "the fleet's variables would hold {} bytes, more than the {MAX_SET_BYTES} allowed",
                    json.len()
                ),
            ));
        }
        let entry = Entry { kind: EntryKind::Variables, id: SET_ID.to_owned(), json };
        self.store.commit(&term, vec![Change::PutEntry(entry)]).await.map_err(|e| {
            let status = match e {
                FleetError::Fenced { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            VariableError::new(status, format!("cannot keep the fleet's variables: {e}"))
        })?;
        self.held.write().set = next;
        Ok(result)
    }
}

/// A worker's executor that gives the worker the fleet's variables before the pool's run
/// probes and starts there, whenever the worker's copy is older than the fleet's.
#[derive(Debug)]
pub struct SyncingExecutor {
    /// The worker, for errors.
    worker: String,
    inner: Arc<dyn Executor>,
    variables: Arc<FleetVariables>,
    /// The run probe's arguments and the start's, as the pool sends them (fenced): how a
    /// command that needs the worker's agent is known, and where its runner's path ends.
    list_args: String,
    start_args: String,
    /// What the runner needs to find the worker's agent (`--address ...`), if anything.
    agent_args: String,
    /// The generation and index of the set this worker was last given (index 0: never).
    given: parking_lot::Mutex<(String, u64)>,
    /// The address the worker was last reached at: given the set again when it changes.
    address: parking_lot::Mutex<Option<String>>,
}

impl SyncingExecutor {
    /// Wraps `inner`, the executor of worker `instance`.
    pub fn new(
        instance: &wharf_prober::Instance,
        inner: Arc<dyn Executor>,
        variables: Arc<FleetVariables>,
        list_args: String,
        start_args: String,
        agent_args: String,
    ) -> SyncingExecutor {
        SyncingExecutor {
            worker: instance.id.0.clone(),
            address: parking_lot::Mutex::new(instance.address.clone()),
            inner,
            variables,
            list_args,
            start_args,
            agent_args,
            given: parking_lot::Mutex::default(),
        }
    }

    /// The runner's path in `command`, if it is a run probe or a start, and whether it is
    /// a start.
    fn runner_of<'a>(&self, command: &'a str) -> Option<(&'a str, bool)> {
        let probe = command.strip_suffix(self.list_args.as_str()).map(|r| (r.trim_end(), false));
        let start = || {
            let at = command.find(&format!(" {}", self.start_args))?;
            Some((&command[..at], true))
        };
        probe.or_else(start).filter(|(runner, _)| !runner.is_empty())
    }

    /// Gives the worker the fleet's set, if it has not been given this one; why it could not
    /// otherwise (it is tried again before the next command).
    async fn give(&self, runner: &str, deadline: Duration) -> Result<(), String> {
        let Some(copy) = self.variables.copy() else { return Ok(()) };
        {
            let given = self.given.lock();
            if given.0 == copy.generation && given.1 >= copy.source_index {
                return Ok(());
            }
        }
        let stdin = serde_json::to_vec(&copy).map_err(|e| e.to_string())?;
        let command = format!("{runner} {}var sync", self.agent_args);
        match self.inner.execute(&command, &stdin, deadline).await {
            Ok(output) if output.status == Some(0) => {
                let mut given = self.given.lock();
                if given.0 != copy.generation || given.1 < copy.source_index {
                    *given = (copy.generation, copy.source_index);
                }
                Ok(())
            }
            Ok(output) => Err(format!(
                "`var sync` exited with {:?}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(error) => Err(error.to_string()),
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
        if let Some((runner, starts)) = self.runner_of(command)
            && let Err(why) = self.give(runner, deadline).await
        {
            tracing::warn!(worker = %self.worker, %why, "cannot give a worker the fleet's variables");
            // Work does not start where its templates would not see the fleet's set.
            if starts {
                return Err(ProberError::Exec {
                    worker: self.worker.clone(),
                    detail: format!("cannot give the worker the fleet's variables: {why}"),
                });
            }
        }
        self.inner.execute(command, stdin, deadline).await
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    fn retarget(&self, instance: &wharf_prober::Instance) {
        // Another machine may answer at a new address: give it the set again.
        let mut address = self.address.lock();
        if *address != instance.address {
            address.clone_from(&instance.address);
            *self.given.lock() = (String::new(), 0);
        }
        drop(address);
        self.inner.retarget(instance);
    }
}

impl crate::variables::VariableService for FleetVariables {
    fn unavailable(&self) -> Option<VariableError> {
        FleetVariables::unavailable(self)
    }

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
    ) -> Result<Variable, VariableError> {
        FleetVariables::put(&self, &path, items).await
    }

    async fn delete(self: Arc<Self>, path: String) -> Result<bool, VariableError> {
        FleetVariables::delete(&self, &path).await
    }

    async fn sync(
        self: Arc<Self>,
        _: VariableSync,
    ) -> Result<crate::variables::Synced, VariableError> {
        Err(VariableError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "a fleet's variables are set one at a time (PUT /v1/var/PATH); a whole set is what \
             a fleet gives its workers' agents",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
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
        let instance = wharf_prober::Instance::new("w1", "10.0.0.1:22");
        let executor = SyncingExecutor::new(
            &instance,
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

        // A worker that refuses it does not start work, and is given it again before the
        // next command.
        variables.put("app/db", items("bob")).await.unwrap();
        recording.sync_status.store(1, Ordering::Relaxed);
        let refused = executor.execute(start, b"spec", deadline).await.unwrap_err();
        assert!(refused.to_string().contains("variables"), "{refused}");
        assert_eq!(ran(), [sync], "the start was not sent");
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [sync, probe], "a probe goes on");
        recording.sync_status.store(0, Ordering::Relaxed);
        executor.execute(start, b"spec", deadline).await.unwrap();
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [sync, start, probe]);

        // The same address again (the pool's periodic retarget): nothing to give; another
        // address: given again.
        executor.retarget(&instance);
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [probe]);
        executor.retarget(&wharf_prober::Instance::new("w1", "10.0.0.2:22"));
        executor.execute(probe, b"", deadline).await.unwrap();
        assert_eq!(ran(), [sync, probe]);

        // What a later leader reads is the set as written.
        let reread = FleetVariables::new(store.clone());
        reread.load(&term).await.unwrap();
        assert_eq!(reread.copy(), variables.copy());
        assert!(reread.delete("app/db").await.unwrap());
        assert_eq!(reread.copy().map(|c| (c.source_index, c.variables.len())), Some((3, 0)));
    }
}
