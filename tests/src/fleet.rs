//! A `wharf fleet` process for tests and benchmarks: started on a config written into the
//! caller's directory, reached at the address it announces, and, when dropped, killed with the
//! agents it left behind wiped (its next start would wipe them; a test must leave nothing).

// This fixture's job is to start and stop a program.
#![allow(clippy::disallowed_methods)]

use crate::announce::spawn_announcing;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A running `wharf fleet`.
#[derive(Debug)]
pub struct Fleet {
    child: Child,
    address: String,
    data_dir: PathBuf,
    wharf: PathBuf,
}

impl Fleet {
    /// Writes `<dir>/fleet.toml` (API on 127.0.0.1 at a free port, data in `<dir>/fleet`,
    /// then `settings`), starts `wharf fleet` on it and waits at most `limit` until it is
    /// ready.
    pub fn start(
        wharf: &Path,
        dir: &Path,
        settings: &str,
        limit: Duration,
    ) -> Result<Fleet, String> {
        let data_dir = dir.join("fleet");
        let config = dir.join("fleet.toml");
        let text = format!(
            "bind = \"127.0.0.1:0\"\ndata_dir = {:?}\n{settings}",
            data_dir.display().to_string()
        );
        std::fs::write(&config, text)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let (child, address) = spawn_announcing(
            Command::new(wharf).arg("fleet").arg("--config").arg(&config),
            "fleet ready",
            limit,
        )?;
        Ok(Fleet { child, address, data_dir, wharf: wharf.to_owned() })
    }

    /// Where its API listens, `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its data directory (`<dir>/fleet`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Sends SIGTERM and waits at most `limit` for the exit.
    pub fn terminate(mut self, limit: Duration) -> Result<ExitStatus, String> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        if !sent.as_ref().is_ok_and(ExitStatus::success) {
            return Err(format!("cannot send SIGTERM to {pid}: {sent:?}"));
        }
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => return Err(format!("the fleet did not exit within {limit:?}")),
                Err(e) => return Err(format!("cannot wait for the fleet: {e}")),
            }
        }
    }
}

/// How often [`Fleet::terminate`] looks for the exit.
const POLL: Duration = Duration::from_millis(20);

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let Ok(instances) = std::fs::read_dir(self.data_dir.join("instances")) else { return };
        for instance in instances.flatten() {
            let data = instance.path().join("data");
            let _ = Command::new(&self.wharf).arg("--data-dir").arg(data).arg("wipe").output();
        }
    }
}
