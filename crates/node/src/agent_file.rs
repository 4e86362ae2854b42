//! `<data_dir>/agent.json`: where a running agent listens, and its process id.
//!
//! `wharf agent` writes it once it listens and removes it on a clean shutdown. Commands given
//! `--data-dir` (or `WHARF_DATA_DIR`) read the address from it, so several agents on one host,
//! each on a port the kernel chose, are reached by their data directory alone: that is how the
//! fleet's loopback instances are addressed. `wharf wipe` reads the process id from it.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    /// The agent's process id.
    pub pid: u32,
    /// Its API's base URL, such as `http://127.0.0.1:4747`.
    pub address: String,
}

impl AgentFile {
    /// The file's path in `data_dir`.
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("agent.json")
    }

    /// Writes it whole (temporary file, then rename), so a reader never sees half of it.
    pub fn write(&self, data_dir: &Path) -> std::io::Result<()> {
        let path = AgentFile::path(data_dir);
        let temp = path.with_extension("json.tmp");
        let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, &path)
    }

    /// Reads it; `Ok(None)` if there is none (no agent has announced itself there).
    pub fn read(data_dir: &Path) -> Result<Option<AgentFile>, String> {
        let path = AgentFile::path(data_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{} is not an agent file: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// Removes it, if it still names this process.
    pub fn remove_own(data_dir: &Path) {
        if AgentFile::read(data_dir).ok().flatten().is_some_and(|f| f.pid == std::process::id()) {
            let _ = std::fs::remove_file(AgentFile::path(data_dir));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reports_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(AgentFile::read(dir.path()).unwrap(), None);
        let file = AgentFile { pid: std::process::id(), address: "http://127.0.0.1:1".into() };
        file.write(dir.path()).unwrap();
        assert_eq!(AgentFile::read(dir.path()).unwrap(), Some(file));
        AgentFile::remove_own(dir.path());
        assert_eq!(AgentFile::read(dir.path()).unwrap(), None);
        std::fs::write(AgentFile::path(dir.path()), "{").unwrap();
        let err = AgentFile::read(dir.path()).unwrap_err();
        assert!(err.contains("agent.json is not an agent file"), "{err}");
    }
}
