//! The Nomad jobs a server was given: each job as registered, its allocations (which group,
//! which index) and its evaluations. An agent keeps them as one JSON file per job under
//! `<data_dir>/nomad/jobs/`, written whole (to a temporary file, then renamed) so that a
//! crash leaves the old record or the new one; a fleet gives them to a [`Keeper`] (its shared
//! store, so that whichever replica leads has them). The allocations themselves live in the
//! agent's or the fleet's store like any other; this says only which Nomad job each belongs to.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wharf_state::Timestamp;

/// One registered job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    /// The job as shown back (`wharf_nomad::NomadJob::submitted`).
    pub(crate) job: Value,
    /// Grows with each registration that changed the job.
    pub(crate) version: u64,
    /// When it was first registered.
    pub(crate) created: Timestamp,
    /// When it last changed (registered, changed or stopped): its modify index.
    pub(crate) modified: Timestamp,
    /// Stopped by a deregistration.
    pub(crate) stopped: bool,
    /// Its allocations, oldest first, across versions.
    pub(crate) allocs: Vec<AllocRecord>,
    /// Its evaluations, oldest first.
    pub(crate) evals: Vec<EvalRecord>,
    /// The allocations of `allocs` a registration was placing when this record was written:
    /// written before any of them is placed, cleared once all are. A record that still names
    /// some was left by a crash mid-registration; registering the job again stops them and
    /// places anew.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) placing: Vec<String>,
}

/// One allocation of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AllocRecord {
    pub(crate) id: String,
    pub(crate) group: String,
    pub(crate) index: u32,
    pub(crate) eval_id: String,
    pub(crate) created: Timestamp,
}

/// One evaluation: a registration or a stop, complete when the call returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EvalRecord {
    pub(crate) id: String,
    /// `job-register` or `job-deregister` (or `alloc-stop`).
    pub(crate) triggered_by: String,
    pub(crate) at: Timestamp,
}

/// Where a registry's records are kept other than in files; a write returns once it is
/// durable.
#[async_trait::async_trait]
pub(crate) trait Keeper: Send + Sync + std::fmt::Debug {
    /// Keeps `record` as job `id`'s.
    async fn put(&self, id: &str, record: &JobRecord) -> Result<(), String>;
    /// Forgets job `id`.
    async fn delete(&self, id: &str) -> Result<(), String>;
}

#[derive(Debug)]
enum Keeping {
    /// One file per job in this directory.
    Files(PathBuf),
    Elsewhere(Arc<dyn Keeper>),
}

/// Every job, read at start and written through.
#[derive(Debug)]
pub(crate) struct Registry {
    keeping: Keeping,
    jobs: parking_lot::Mutex<BTreeMap<String, JobRecord>>,
    /// When a job was last purged: the index must still grow.
    purged: parking_lot::Mutex<Timestamp>,
}

impl Registry {
    /// Reads the records under `data_dir`; a record that cannot be read is logged and left.
    pub(crate) fn open(data_dir: &Path) -> std::io::Result<Registry> {
        let dir = data_dir.join("nomad").join("jobs");
        std::fs::create_dir_all(&dir)?;
        let mut jobs = BTreeMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let record = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|bytes| {
                serde_json::from_slice::<JobRecord>(&bytes).map_err(|e| e.to_string())
            });
            match record {
                Ok(record) => {
                    let id =
                        record.job.get("ID").and_then(Value::as_str).unwrap_or_default().to_owned();
                    jobs.insert(id, record);
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "cannot read a Nomad job record; leaving it")
                }
            }
        }
        Ok(Registry {
            keeping: Keeping::Files(dir),
            jobs: parking_lot::Mutex::new(jobs),
            purged: parking_lot::Mutex::new(Timestamp(0)),
        })
    }

    /// An empty registry that writes through `keeper`; its owner fills it with
    /// [`replace`](Registry::replace).
    pub(crate) fn kept_by(keeper: Arc<dyn Keeper>) -> Registry {
        Registry {
            keeping: Keeping::Elsewhere(keeper),
            jobs: parking_lot::Mutex::default(),
            purged: parking_lot::Mutex::new(Timestamp(0)),
        }
    }

    /// Takes `jobs` as every job there is (read again from where they are kept).
    pub(crate) fn replace(&self, jobs: BTreeMap<String, JobRecord>) {
        *self.jobs.lock() = jobs;
    }

    pub(crate) fn get(&self, id: &str) -> Option<JobRecord> {
        self.jobs.lock().get(id).cloned()
    }

    pub(crate) fn all(&self) -> Vec<JobRecord> {
        self.jobs.lock().values().cloned().collect()
    }

    /// The job and allocation record of allocation `alloc_id`, if a Nomad job placed it.
    pub(crate) fn owner_of(&self, alloc_id: &str) -> Option<(JobRecord, AllocRecord)> {
        let jobs = self.jobs.lock();
        jobs.values().find_map(|job| {
            job.allocs.iter().find(|a| a.id == alloc_id).map(|a| (job.clone(), a.clone()))
        })
    }

    /// The evaluation `eval_id`, with its job.
    pub(crate) fn eval(&self, eval_id: &str) -> Option<(JobRecord, EvalRecord)> {
        let jobs = self.jobs.lock();
        jobs.values().find_map(|job| {
            job.evals.iter().find(|e| e.id == eval_id).map(|e| (job.clone(), e.clone()))
        })
    }

    /// Writes `record` (durably) and keeps it.
    pub(crate) async fn put(&self, id: &str, record: JobRecord) -> std::io::Result<()> {
        match &self.keeping {
            Keeping::Files(dir) => {
                let path = path(dir, id);
                let temporary = path.with_extension("json.tmp");
                let bytes = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
                {
                    use std::io::Write;
                    let mut file = std::fs::File::create(&temporary)?;
                    file.write_all(&bytes)?;
                    file.sync_all()?;
                }
                std::fs::rename(&temporary, &path)?;
                // The rename is durable once the directory is.
                std::fs::File::open(dir)?.sync_all()?;
            }
            Keeping::Elsewhere(keeper) => {
                keeper.put(id, &record).await.map_err(std::io::Error::other)?;
            }
        }
        self.jobs.lock().insert(id.to_owned(), record);
        Ok(())
    }

    /// Forgets job `id`.
    pub(crate) async fn purge(&self, id: &str, now: Timestamp) -> std::io::Result<()> {
        match &self.keeping {
            Keeping::Files(dir) => match std::fs::remove_file(path(dir, id)) {
                Ok(()) => std::fs::File::open(dir)?.sync_all()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            },
            Keeping::Elsewhere(keeper) => {
                keeper.delete(id).await.map_err(std::io::Error::other)?;
            }
        }
        self.jobs.lock().remove(id);
        let mut purged = self.purged.lock();
        *purged = (*purged).max(now);
        Ok(())
    }

    /// The latest change of any record.
    pub(crate) fn last_change(&self) -> Timestamp {
        let latest = self.jobs.lock().values().map(|j| j.modified).max().unwrap_or(Timestamp(0));
        latest.max(*self.purged.lock())
    }
}

/// A job id names a file in `dir`: its bytes in hex, so that any id Nomad allows is a safe name.
fn path(dir: &Path, id: &str) -> PathBuf {
    let name: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{name}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_survive_a_reopen_and_purge_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let record = JobRecord {
            job: serde_json::json!({"ID": "a/../b"}),
            version: 1,
            created: Timestamp(5),
            modified: Timestamp(6),
            stopped: false,
            allocs: vec![AllocRecord {
                id: "x".into(),
                group: "g".into(),
                index: 0,
                eval_id: "e".into(),
                created: Timestamp(5),
            }],
            evals: vec![EvalRecord {
                id: "e".into(),
                triggered_by: "job-register".into(),
                at: Timestamp(5),
            }],
            placing: vec!["x".into()],
        };
        registry.put("a/../b", record.clone()).await.unwrap();
        let reopened = Registry::open(dir.path()).unwrap();
        assert_eq!(reopened.get("a/../b"), Some(record));
        assert_eq!(reopened.owner_of("x").unwrap().1.group, "g");
        assert_eq!(reopened.eval("e").unwrap().1.triggered_by, "job-register");
        reopened.purge("a/../b", Timestamp(9)).await.unwrap();
        assert_eq!(reopened.last_change(), Timestamp(9));
        assert!(Registry::open(dir.path()).unwrap().all().is_empty());
    }
}
