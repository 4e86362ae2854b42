//! The fleet's fence on this node: the highest fleet term the agent has heard, kept in
//! `<data_dir>/fleet-term`, and the refusal of starts and stops from older terms.
//!
//! A fleet leader sends its term with every command it runs here (`wharf --fleet-term N ...`,
//! which the CLI passes as the `X-Wharf-Fleet-Term` header): its run probes, starts and stops.
//! A term higher than any heard is written down (durably, before the request goes on); a start
//! or a stop under a lower term is refused. So once a new leader has probed this node, a leader
//! that lost its term while it was paused cannot start work here that its successor already
//! placed elsewhere: its store writes are fenced by the store, and its commands to workers by
//! this. A successor writes work off a worker only after probing it (or after the worker is
//! gone), so every worker that matters has heard the new term first.
//!
//! Requests without a term (a person's `wharf run`, the API used directly) are not fenced.
//!
//! Starts and stops under the current term hold a shared guard while they run; raising the
//! term waits for them, so no start of an older term slips in beside the first request of a
//! newer one.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use tokio::sync::{RwLock, RwLockReadGuard};

/// The file, in the data directory.
const FILE: &str = "fleet-term";

/// The HTTP header a fleet term travels in.
pub const HEADER: &str = "x-wharf-fleet-term";

/// Why a request under a fleet term is refused, or the term cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A newer leader has spoken to this node.
    #[error(
        "fleet term {asked} is older than term {highest}, which this node has heard: a newer \
         fleet leader has taken over, and this command is refused"
    )]
    Outdated {
        /// The term the request carried.
        asked: u64,
        /// The highest term heard.
        highest: u64,
    },
    /// The term file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The term file holds something else than a term.
    #[error("{}: {content:?} is not a fleet term (remove the file if no fleet uses this node)", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What it holds.
        content: String,
    },
}

/// The highest fleet term heard, and the lock that orders requests around a change of it.
#[derive(Debug)]
pub struct FleetFence {
    path: PathBuf,
    highest: RwLock<u64>,
}

/// Held while a request admitted under the current term runs.
#[derive(Debug)]
pub struct Admitted<'a> {
    _term: Option<RwLockReadGuard<'a, u64>>,
}

impl FleetFence {
    /// The fence kept in `data_dir` (term 0 if no fleet has spoken yet).
    pub fn open(data_dir: &Path) -> Result<FleetFence, FenceError> {
        let path = data_dir.join(FILE);
        let highest = match std::fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse()
                .map_err(|_| FenceError::Damaged { path: path.clone(), content: text.clone() })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(FenceError::Io { path, source }),
        };
        Ok(FleetFence { path, highest: RwLock::new(highest) })
    }

    /// The highest term heard.
    pub async fn highest(&self) -> u64 {
        *self.highest.read().await
    }

    /// Admits a request under `term` (none: not a fleet's; always admitted): refused if the
    /// term is older than the highest heard; written down first if it is newer. The guard
    /// keeps a newer term from being admitted until the request is done.
    pub async fn admit(&self, term: Option<u64>) -> Result<Admitted<'_>, FenceError> {
        let Some(term) = term else { return Ok(Admitted { _term: None }) };
        {
            let highest = self.highest.read().await;
            if term == *highest {
                return Ok(Admitted { _term: Some(highest) });
            }
            if term < *highest {
                return Err(FenceError::Outdated { asked: term, highest: *highest });
            }
        }
        let mut highest = self.highest.write().await;
        if term < *highest {
            return Err(FenceError::Outdated { asked: term, highest: *highest });
        }
        if term > *highest {
            let path = self.path.clone();
            tokio::task::spawn_blocking(move || write_durably(&path, term))
                .await
                .map_err(|e| FenceError::Io { path: self.path.clone(), source: e.into() })??;
            *highest = term;
        }
        Ok(Admitted { _term: Some(highest.downgrade()) })
    }
}

/// Replaces the file with `term`, durably: a new file beside it, synced, renamed over it, and
/// the directory synced.
fn write_durably(path: &Path, term: u64) -> Result<(), FenceError> {
    let io = |source| FenceError::Io { path: path.to_owned(), source };
    let fresh = path.with_extension("new");
    let _ = std::fs::remove_file(&fresh);
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).open(&fresh).map_err(io)?;
    writeln!(file, "{term}").map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&fresh, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_newer_term_is_kept_and_older_ones_are_refused_from_then_on() {
        let dir = tempfile::tempdir().unwrap();
        let fence = FleetFence::open(dir.path()).unwrap();
        assert_eq!(fence.highest().await, 0);
        drop(fence.admit(None).await.unwrap());
        drop(fence.admit(Some(5)).await.unwrap());
        drop(fence.admit(Some(5)).await.unwrap());
        drop(fence.admit(Some(7)).await.unwrap());
        let refused = fence.admit(Some(5)).await.unwrap_err();
        assert!(matches!(refused, FenceError::Outdated { asked: 5, highest: 7 }), "{refused}");
        assert!(refused.to_string().contains("newer fleet leader"), "{refused}");
        // Requests that are not a fleet's pass whatever the term.
        drop(fence.admit(None).await.unwrap());

        // Kept across a restart.
        drop(fence);
        let fence = FleetFence::open(dir.path()).unwrap();
        assert_eq!(fence.highest().await, 7);
        assert!(fence.admit(Some(6)).await.is_err());
    }

    #[tokio::test]
    async fn a_newer_term_waits_for_the_requests_of_the_current_one() {
        let dir = tempfile::tempdir().unwrap();
        let fence = std::sync::Arc::new(FleetFence::open(dir.path()).unwrap());
        let running = fence.admit(Some(3)).await.unwrap();
        // Another request of the same term runs beside it, within a few turns of the runtime.
        let same = tokio::spawn({
            let fence = fence.clone();
            async move { fence.admit(Some(3)).await.map(drop) }
        });
        let newer = tokio::spawn({
            let fence = fence.clone();
            async move { fence.admit(Some(4)).await.map(drop) }
        });
        // The newer term cannot be admitted while a request of term 3 runs: the spawned
        // admission runs until it waits on the lock, and stays there.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(same.is_finished(), "a request of the current term waited");
        assert!(!newer.is_finished(), "term 4 was admitted while a request of term 3 ran");
        assert_eq!(std::fs::read_to_string(dir.path().join(FILE)).unwrap().trim(), "3");
        drop(running);
        newer.await.unwrap().unwrap();
        assert_eq!(fence.highest().await, 4);
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "seven").unwrap();
        let error = FleetFence::open(dir.path()).unwrap_err();
        assert!(error.to_string().contains("fleet-term") && error.to_string().contains("seven"));
    }
}
