//! The OCI runtime's commands that the driver itself runs (`state`, `delete`, `--version`),
//! outside any task: each bounded in time, its output kept for the error.
//!
//! The commands that run inside a task (`create`, `start` in the waiter, `exec` through
//! wharf-exec's `exec_task`) are not here.

use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One runtime program with its state directory.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeCommand {
    pub(crate) program: PathBuf,
    pub(crate) root: PathBuf,
    pub(crate) timeout: Duration,
}

/// What `state` says of a container.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct ContainerState {
    /// `created`, `running`, `paused` or `stopped`.
    pub(crate) status: String,
    /// The container's init process, as the runtime saw it.
    #[serde(default)]
    pub(crate) pid: i64,
}

impl RuntimeCommand {
    /// `<program> --version`: its first line.
    pub(crate) async fn version(&self) -> Result<String, String> {
        let out = self.run(&["--version"], false).await?;
        Ok(out.lines().next().unwrap_or_default().to_owned())
    }

    /// The container's state; `Ok(None)` if the runtime does not know it.
    pub(crate) async fn state(&self, id: &str) -> Result<Option<ContainerState>, String> {
        match self.run(&["state", id], true).await {
            Ok(out) => {
                serde_json::from_str(&out).map(Some).map_err(|e| format!("state of {id}: {e}"))
            }
            Err(e) if e.contains("does not exist") || e.contains("not exist") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the container, killing what still runs in it. A container it does not know is
    /// already deleted.
    pub(crate) async fn delete(&self, id: &str) -> Result<(), String> {
        match self.run(&["delete", "--force", id], true).await {
            Ok(_) => Ok(()),
            Err(e) if e.contains("does not exist") || e.contains("not exist") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The ids of the containers the runtime keeps state for under its root.
    pub(crate) fn known(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Vec::new() };
        entries
            .flatten()
            .filter(|entry| entry.path().join("state.json").is_file())
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect()
    }

    async fn run(&self, args: &[&str], with_root: bool) -> Result<String, String> {
        let mut full: Vec<String> = Vec::new();
        if with_root {
            full.extend(["--root".to_owned(), self.root.display().to_string()]);
        }
        full.extend(args.iter().map(|a| (*a).to_owned()));
        let (program, timeout) = (self.program.clone(), self.timeout);
        tokio::task::spawn_blocking(move || run_bounded(&program, &full, timeout))
            .await
            .map_err(|e| format!("the runtime's command did not finish: {e}"))?
    }
}

/// Runs a command to its end, at most `timeout` (then kills it); its stdout, or an error with
/// what it wrote to stderr.
fn run_bounded(program: &Path, args: &[String], timeout: Duration) -> Result<String, String> {
    let shown = format!("{} {}", program.display(), args.join(" "));
    // The runtime's own control commands: short, run by the driver, never a task's process.
    #[allow(clippy::disallowed_methods)]
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    // Polled, in steps that add up to the limit: the runtime's commands take milliseconds.
    const STEP: Duration = Duration::from_millis(5);
    let mut waited = Duration::ZERO;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if waited < timeout => {
                std::thread::sleep(STEP);
                waited += STEP;
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} took longer than {timeout:?}; killed"));
            }
            Err(e) => return Err(format!("waiting for {shown}: {e}")),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if status.success() { Ok(stdout) } else { Err(format!("{shown}: {status}: {}", stderr.trim())) }
}
