//! The Nomad jobs an agent was given: each job as registered, its allocations (which group,
//! which index) and its evaluations, kept as one JSON file per job under
//! `<data_dir>/nomad/jobs/`, written whole (to a temporary file, then renamed) so that a
//! crash leaves the old record or the new one. The allocations themselves live in the
//! agent's store like any other; this says only which Nomad job each belongs to.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// Every job, read at start and written through.
#[derive(Debug)]
pub(crate) struct Registry {
    dir: PathBuf,
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
            dir,
            jobs: parking_lot::Mutex::new(jobs),
            purged: parking_lot::Mutex::new(Timestamp(0)),
        })
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
    pub(crate) fn put(&self, id: &str, record: JobRecord) -> std::io::Result<()> {
        let path = self.path(id);
        let temporary = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        std::fs::rename(&temporary, &path)?;
        self.jobs.lock().insert(id.to_owned(), record);
        Ok(())
    }

    /// Forgets job `id`.
    pub(crate) fn purge(&self, id: &str, now: Timestamp) -> std::io::Result<()> {
        match std::fs::remove_file(self.path(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
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

    /// A job id names a file: its bytes in hex, so that any id Nomad allows is a safe name.
    fn path(&self, id: &str) -> PathBuf {
        let name: String = id.bytes().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_and_purge_removes_them() {
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
        };
        registry.put("a/../b", record.clone()).unwrap();
        let reopened = Registry::open(dir.path()).unwrap();
        assert_eq!(reopened.get("a/../b"), Some(record));
        assert_eq!(reopened.owner_of("x").unwrap().1.group, "g");
        assert_eq!(reopened.eval("e").unwrap().1.triggered_by, "job-register");
        reopened.purge("a/../b", Timestamp(9)).unwrap();
        assert_eq!(reopened.last_change(), Timestamp(9));
        assert!(Registry::open(dir.path()).unwrap().all().is_empty());
    }
}
