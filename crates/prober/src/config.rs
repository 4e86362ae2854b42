//! What the worker state machine and the pool are told: timeouts, commands, the runner.
//!
//! Defaults follow the reference dispatcher (10 minute boot and probe timeouts, 1 minute idle
//! timeout, 5 s stale-lock timeout, TERM every 5 s for 2 minutes) with one addition: every
//! command has a deadline ([`WorkerConfig::command_deadline`], [`WorkerConfig::deploy_deadline`]).

use crate::ProberError;
use crate::quote::quote;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The timeouts of the worker state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    /// A booting or unknown worker is shut down once this long passed since it appeared (or
    /// last probed successfully) and a probe started after that still failed.
    pub booting: Duration,
    /// An idle or running worker is shut down once this long passed since its last successful
    /// probe and a probe started after that still failed.
    pub probe: Duration,
    /// An idle worker with idle behaviour `run` is shut down after this long without work.
    pub idle: Duration,
    /// A `stale` line seen for longer than this makes the worker broken.
    pub stale_run_lock: Duration,
    /// Interval between TERM signals while a runner is being killed.
    pub signal: Duration,
    /// Killing gives up after this long; the worker is then drained.
    pub term: Duration,
    /// A destroyed instance still listed after this long is destroyed again.
    pub shutdown: Duration,
    /// A runner that left a worker's list (it ended, or was killed) holds the worker's idle
    /// shutdown until the pool's user says its outcome is in
    /// ([`Pool::outcome_collected`](crate::Pool::outcome_collected)), or this long: the
    /// runner's outcome command needs the worker. Zero: no hold, as for a runner that cannot
    /// say how work ended.
    pub outcome_hold: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            booting: Duration::from_secs(600),
            probe: Duration::from_secs(600),
            idle: Duration::from_secs(60),
            stale_run_lock: Duration::from_secs(5),
            signal: Duration::from_secs(5),
            term: Duration::from_secs(120),
            shutdown: Duration::from_secs(10),
            outcome_hold: Duration::ZERO,
        }
    }
}

/// The runner on the worker: the program the run probe, start and kill commands call.
///
/// The defaults are wharf's own node CLI (`wharf alloc list --probe`, `wharf run --detach -
/// --id ID` with the job spec on stdin, `wharf alloc stop --exact --wait 1s ID`, `wharf alloc outcome
/// ID`); crunch-run is driven with `--list`, `--detach --stdin-config`, `--kill 15` and no
/// outcome command.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The command when no binary is deployed (it is assumed installed), e.g. `wharf`.
    pub command: String,
    /// A binary to deploy to every worker; `None` to use `command` as installed.
    pub binary: Option<RunnerBinary>,
    /// The directory deployed binaries go to, as `<directory>/runner~<sha256>`.
    pub directory: String,
    /// Arguments of the run probe, e.g. `alloc list --probe` or `--list`.
    pub list_args: String,
    /// Arguments that start work in the background, reading its payload on stdin; the quoted
    /// id is appended.
    pub start_args: String,
    /// Arguments that ask work to stop and exit 0 once it has (the quoted id is appended);
    /// repeated every [`Timeouts::signal`] until then.
    pub kill_args: String,
    /// Arguments that print, in one line, how work that is no longer listed ended (the
    /// quoted id is appended): `unknown` if the runner never had it, else its final status
    /// and why. `None` for runners that cannot say (work that leaves the list just ended).
    pub outcome_args: Option<String>,
    /// Arguments that print what the worker has for work, in one line (see
    /// [`Resources`](crate::Resources)); run once it has booted, until it answers. `None` for
    /// runners that cannot say: their workers are placed on by count alone.
    pub resources_args: Option<String>,
}

impl Default for RunnerConfig {
    fn default() -> RunnerConfig {
        RunnerConfig {
            command: "wharf".into(),
            binary: None,
            directory: "/var/lib/wharf-runner".into(),
            list_args: "alloc list --probe".into(),
            start_args: "run --detach - --id".into(),
            // Exact: the attempt asked to stop may be gone while a later one (`<id>__2`),
            // which its id is a prefix of, runs.
            kill_args: "alloc stop --exact --wait 1s".into(),
            outcome_args: Some("alloc outcome".into()),
            resources_args: Some("node status --probe".into()),
        }
    }
}

/// The runner binary to deploy.
#[derive(Debug, Clone)]
pub enum RunnerBinary {
    /// Its bytes, held in memory.
    Bytes(Arc<[u8]>),
    /// A file, read only while a worker needs a copy (a large binary is not held for the
    /// life of the pool); its checksum is taken once, when the configuration is prepared.
    File(RunnerFile),
}

/// A runner binary in a file ([`RunnerBinary::file`]), read when a worker needs a copy. The
/// copies under way share one read (a fleet booting a hundred workers holds the binary once,
/// not a hundred times), and it is let go when the last of them ends.
#[derive(Debug, Clone)]
pub struct RunnerFile {
    path: PathBuf,
    /// The bytes while some copy holds them.
    loaded: Arc<tokio::sync::Mutex<Option<std::sync::Weak<[u8]>>>>,
}

impl RunnerFile {
    async fn load(&self) -> Result<Arc<[u8]>, ProberError> {
        // Held across the read, so copies that start together wait for one read.
        let mut loaded = self.loaded.lock().await;
        if let Some(bytes) = loaded.as_ref().and_then(std::sync::Weak::upgrade) {
            return Ok(bytes);
        }
        let bytes: Arc<[u8]> =
            tokio::fs::read(&self.path).await.map_err(|e| unreadable(&self.path, e))?.into();
        *loaded = Some(Arc::downgrade(&bytes));
        Ok(bytes)
    }
}

fn unreadable(path: &Path, error: std::io::Error) -> ProberError {
    ProberError::Config {
        field: "runner.binary",
        problem: format!("cannot read {}: {error}", path.display()),
    }
}

impl From<Vec<u8>> for RunnerBinary {
    fn from(bytes: Vec<u8>) -> RunnerBinary {
        RunnerBinary::Bytes(bytes.into())
    }
}

impl From<Arc<[u8]>> for RunnerBinary {
    fn from(bytes: Arc<[u8]>) -> RunnerBinary {
        RunnerBinary::Bytes(bytes)
    }
}

impl RunnerBinary {
    /// The runner binary in the file at `path`.
    pub fn file(path: impl Into<PathBuf>) -> RunnerBinary {
        RunnerBinary::File(RunnerFile { path: path.into(), loaded: Arc::default() })
    }

    /// Its bytes (reading the file, off the async threads).
    pub async fn load(&self) -> Result<Arc<[u8]>, ProberError> {
        match self {
            RunnerBinary::Bytes(bytes) => Ok(bytes.clone()),
            RunnerBinary::File(file) => file.load().await,
        }
    }

    /// Lowercase hex sha256 of its content.
    fn sha256(&self) -> Result<String, ProberError> {
        match self {
            RunnerBinary::Bytes(bytes) => Ok(sha256_hex(bytes)),
            RunnerBinary::File(RunnerFile { path, .. }) => {
                use std::io::Read;
                let problem = |e| unreadable(path, e);
                let mut file = std::fs::File::open(path).map_err(problem)?;
                let mut hasher = Sha256::new();
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    match file.read(&mut buf).map_err(problem)? {
                        0 => return Ok(hex(&hasher.finalize())),
                        n => hasher.update(&buf[..n]),
                    }
                }
            }
        }
    }
}

/// Where the runner binary goes and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// Remote path: `<directory>/runner~<sha256>`.
    pub path: String,
    /// Lowercase hex sha256 of the binary.
    pub sha256: String,
}

/// Lowercase hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
    }
    hex
}

/// Everything a worker needs to know besides its instance and executor.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The state machine's timeouts.
    pub timeouts: Timeouts,
    /// The boot probe; empty means `true`.
    pub boot_probe_command: String,
    /// The runner.
    pub runner: RunnerConfig,
    /// Ids of this cluster's work start with this; other lines are ignored.
    pub cluster_prefix: String,
    /// Prefix of the tag keys the prober writes (`<prefix>InstanceType`, ...).
    pub tag_prefix: String,
    /// Deadline of one probe command (boot probe, run probe, start, kill).
    pub command_deadline: Duration,
    /// Deadline of the runner binary's copy, and of each check of its checksum (a read of
    /// the whole binary).
    pub deploy_deadline: Duration,
}

impl Default for WorkerConfig {
    fn default() -> WorkerConfig {
        WorkerConfig {
            timeouts: Timeouts::default(),
            boot_probe_command: "systemctl is-system-running".into(),
            runner: RunnerConfig::default(),
            cluster_prefix: String::new(),
            tag_prefix: "wharf-".into(),
            command_deadline: Duration::from_secs(20),
            deploy_deadline: Duration::from_secs(120),
        }
    }
}

impl WorkerConfig {
    /// Checks the values and computes the deployment path and checksum once.
    pub fn prepare(self) -> Result<Prepared, ProberError> {
        let positive = [
            ("timeouts.booting", self.timeouts.booting),
            ("timeouts.probe", self.timeouts.probe),
            ("timeouts.signal", self.timeouts.signal),
            ("command_deadline", self.command_deadline),
            ("deploy_deadline", self.deploy_deadline),
        ];
        for (field, value) in positive {
            if value.is_zero() {
                return Err(ProberError::Config {
                    field,
                    problem: "must be more than zero".into(),
                });
            }
        }
        if self.runner.command.trim().is_empty() && self.runner.binary.is_none() {
            return Err(ProberError::Config {
                field: "runner.command",
                problem: "empty, and no binary to deploy".into(),
            });
        }
        if self.runner.directory.contains('\0') || !self.runner.directory.starts_with('/') {
            return Err(ProberError::Config {
                field: "runner.directory",
                problem: format!("{:?} is not an absolute path", self.runner.directory),
            });
        }
        let deployment = match &self.runner.binary {
            Some(binary) => {
                let sha256 = binary.sha256()?;
                let directory = self.runner.directory.trim_end_matches('/');
                Some(Deployment { path: format!("{directory}/runner~{sha256}"), sha256 })
            }
            None => None,
        };
        Ok(Prepared { config: self, deployment })
    }
}

/// A checked [`WorkerConfig`] with what follows from it computed once.
#[derive(Debug, Clone)]
pub struct Prepared {
    config: WorkerConfig,
    deployment: Option<Deployment>,
}

impl std::ops::Deref for Prepared {
    type Target = WorkerConfig;
    fn deref(&self) -> &WorkerConfig {
        &self.config
    }
}

impl Prepared {
    /// Where the runner binary is deployed, if one is.
    pub fn deployment(&self) -> Option<&Deployment> {
        self.deployment.as_ref()
    }

    /// The runner program as a shell word: the deployed path, or the configured command.
    pub(crate) fn runner_program(&self) -> Result<String, ProberError> {
        match &self.deployment {
            Some(d) => quote("runner path", &d.path),
            // The command is configuration, and may carry arguments of its own.
            None => Ok(self.runner.command.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_binary(binary: RunnerBinary) -> Result<Prepared, ProberError> {
        let runner = RunnerConfig { binary: Some(binary), ..RunnerConfig::default() };
        WorkerConfig { runner, ..WorkerConfig::default() }.prepare()
    }

    #[tokio::test]
    async fn a_binary_file_is_hashed_once_and_read_once_for_the_copies_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner");
        let content = vec![7u8; 200_000];
        std::fs::write(&path, &content).unwrap();
        let from_file = with_binary(RunnerBinary::file(path.clone())).unwrap();
        let from_bytes = with_binary(content.clone().into()).unwrap();
        assert_eq!(from_file.deployment(), from_bytes.deployment());
        let binary = from_file.runner.binary.clone().unwrap();
        assert_eq!(&*binary.load().await.unwrap(), &content[..]);
        // Copies under way share one read of the file.
        let (first, second) = tokio::join!(binary.load(), binary.load());
        assert!(Arc::ptr_eq(&first.unwrap(), &second.unwrap()), "one read for both");
        // Once no copy holds it, it is let go: the next copy reads the file again.
        std::fs::remove_file(&path).unwrap();
        let gone = binary.load().await.unwrap_err().to_string();
        assert!(gone.contains("runner.binary") && gone.contains("cannot read"), "{gone}");
        let missing = with_binary(RunnerBinary::file(path)).unwrap_err().to_string();
        assert!(missing.contains("runner.binary"), "{missing}");
    }
}
