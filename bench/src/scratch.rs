//! Scratch directories for the scenarios, all removed when the bench ends rather than when
//! each scenario does. Removing thousands of files leaves the file system slow to create new
//! ones for a while (a journal-less ext4 passes over recently freed inodes when it allocates
//! one: 150 to 500 µs a directory on the bench machine, against 40 µs on a quiet disk), and
//! one scenario must not measure another's clean-up.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static KEPT: Mutex<Vec<tempfile::TempDir>> = Mutex::new(Vec::new());

/// A new empty directory beside the build output (on the workspace's disk, not tmpfs), named
/// after `prefix`; it lasts until [`remove_all`].
pub(crate) fn dir(prefix: &str) -> PathBuf {
    let parent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-scratch");
    std::fs::create_dir_all(&parent).unwrap();
    kept(prefix, &parent).unwrap()
}

/// A new empty directory on tmpfs (`/dev/shm`), named after `prefix`, for a run that shows what
/// the disk costs; it lasts until [`remove_all`].
pub(crate) fn dir_in_memory(prefix: &str) -> Result<PathBuf, String> {
    let parent = Path::new("/dev/shm");
    kept(prefix, parent).map_err(|e| {
        format!(
            "cannot make a directory in {} (a tmpfs most Linux systems mount): {e}",
            parent.display()
        )
    })
}

/// Where a scenario keeps its data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    /// The workspace's disk, as a node would ([`dir`]).
    Disk,
    /// tmpfs, to show what the disk costs ([`dir_in_memory`]).
    Memory,
}

/// A new empty directory on `storage`, named after `prefix`; it lasts until [`remove_all`].
pub(crate) fn dir_on(storage: Storage, prefix: &str) -> Result<PathBuf, String> {
    match storage {
        Storage::Disk => Ok(dir(prefix)),
        Storage::Memory => dir_in_memory(prefix),
    }
}

/// A new directory in `parent`, kept until [`remove_all`].
fn kept(prefix: &str, parent: &Path) -> std::io::Result<PathBuf> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?;
    let path = dir.path().to_owned();
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(dir);
    Ok(path)
}

/// Removes every scratch directory made so far.
pub(crate) fn remove_all() {
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).clear();
}
