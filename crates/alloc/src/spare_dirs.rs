//! Allocation directories made ahead of time.
//!
//! Every new directory costs an inode, and on a busy file system inode allocation is the
//! slowest step between a submission and a running task. A one-task allocation needs eight
//! directories: 40 µs each on a quiet ext4, 150 to 900 µs where many were deleted, and a node
//! that garbage-collects allocations deletes a lot. Moving a finished directory into place is
//! one rename, about 13 µs, whatever the file system's history.
//!
//! So a node keeps a few empty trees ready, called shells, and the alloc dir hook renames them
//! into place. A background thread at the lowest CPU priority (nice 19) makes new ones, giving
//! way to anything else that wants the CPU between its system calls (a kernel that does not
//! preempt inside them still lets one `mkdir` hold a core until it returns). When no shell is
//! ready (a burst of submissions, or a spare root on another file system), the hook creates
//! the directories itself, as it would without spares.
//!
//! Under the spare root (`<data dir>/spare`):
//! - `alloc-<n>/` holds the directories the allocation's tasks share (`alloc/data`,
//!   `alloc/logs`, `alloc/tmp`, as the alloc dir hook makes them); it becomes
//!   `<data dir>/allocs/<alloc id>`;
//! - `task-<n>/` holds `local/`, `logs/` and `secrets/` (mode 0700) as
//!   [`wharf_task::hooks::TaskDirs`] lays them out; it becomes `<alloc root>/<task>`;
//! - `building-<n>/` is a shell being made. It is renamed to one of the above once complete,
//!   so a crash never leaves a half-made shell under a usable name; the next start removes it.

use crate::alloc_dir;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wharf_task::hooks::TaskDirs;

/// How long the filler waits after a failure (a full or read-only disk) before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A pool of ready allocation and task directories. Dropping it stops the thread that fills
/// it; the shells stay on disk for the next start.
#[derive(Debug)]
pub struct SpareDirs {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    root: PathBuf,
    keep: usize,
    ready: Mutex<Ready>,
    /// Signalled when a shell is taken and when the pool closes: the filler's cue.
    wanted: Condvar,
    /// Signalled when a shell is added.
    added: Condvar,
}

#[derive(Debug, Default)]
struct Ready {
    allocs: Vec<PathBuf>,
    tasks: Vec<PathBuf>,
    next: u64,
    closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Alloc,
    Task,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Alloc => "alloc-",
            Kind::Task => "task-",
        }
    }

    /// Makes the inside of a shell of this kind in `dir`, which exists, as the hooks would.
    fn furnish(self, dir: &Path) -> io::Result<()> {
        match self {
            Kind::Alloc => {
                for shared in alloc_dir::shared_dirs(dir) {
                    std::fs::create_dir_all(shared)?;
                }
                Ok(())
            }
            Kind::Task => {
                let parent = dir.parent().unwrap_or(dir);
                let name = dir.file_name().unwrap_or_default().to_string_lossy();
                TaskDirs::new(parent, &name).create_own().map_err(io::Error::other)
            }
        }
    }
}

impl Ready {
    fn list(&mut self, kind: Kind) -> &mut Vec<PathBuf> {
        match kind {
            Kind::Alloc => &mut self.allocs,
            Kind::Task => &mut self.tasks,
        }
    }

    /// The kind the pool is shorter of, if either is below `keep`.
    fn wanted(&self, keep: usize) -> Option<Kind> {
        let (allocs, tasks) = (self.allocs.len(), self.tasks.len());
        if allocs >= keep && tasks >= keep {
            None
        } else if allocs <= tasks {
            Some(Kind::Alloc)
        } else {
            Some(Kind::Task)
        }
    }
}

impl SpareDirs {
    /// Opens the spare root at `root` (creating it), takes back the complete shells an earlier
    /// run left there, removes half-made ones, and starts the thread that keeps `keep` shells
    /// of each kind ready.
    pub fn open(root: impl Into<PathBuf>, keep: usize) -> io::Result<SpareDirs> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        let mut ready = Ready::default();
        for entry in std::fs::read_dir(&root)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let (kind, number) = if let Some(n) = name.strip_prefix(Kind::Alloc.prefix()) {
                (Some(Kind::Alloc), n)
            } else if let Some(n) = name.strip_prefix(Kind::Task.prefix()) {
                (Some(Kind::Task), n)
            } else if let Some(n) = name.strip_prefix("building-") {
                (None, n)
            } else {
                continue; // Not ours: left alone.
            };
            let Ok(number) = number.parse::<u64>() else { continue };
            ready.next = ready.next.max(number + 1);
            match kind {
                Some(kind) if entry.file_type()?.is_dir() => ready.list(kind).push(entry.path()),
                Some(_) => {}
                None => std::fs::remove_dir_all(entry.path())?,
            }
        }
        let shared = Arc::new(Shared {
            root,
            keep,
            ready: Mutex::new(ready),
            wanted: Condvar::new(),
            added: Condvar::new(),
        });
        let filler = shared.clone();
        std::thread::Builder::new().name("wharf-spare-dirs".into()).spawn(move || filler.fill())?;
        Ok(SpareDirs { shared })
    }

    /// Moves a ready allocation shell to `dest`, the allocation's root, which must not exist.
    /// False if none was ready or it could not be moved: the caller makes the directories.
    pub fn take_alloc(&self, dest: &Path) -> bool {
        self.shared.take(Kind::Alloc, dest)
    }

    /// Moves a ready task shell to `dest`, a task's directory, which must not exist. False if
    /// none was ready or it could not be moved: the caller makes the directories.
    pub fn take_task(&self, dest: &Path) -> bool {
        self.shared.take(Kind::Task, dest)
    }

    /// How many shells are ready: `(allocation shells, task shells)`.
    pub fn ready(&self) -> (usize, usize) {
        let ready = self.shared.ready.lock();
        (ready.allocs.len(), ready.tasks.len())
    }

    /// Waits until the pool is full, at most `limit`; whether it is.
    pub fn wait_full(&self, limit: Duration) -> bool {
        let keep = self.shared.keep;
        let mut ready = self.shared.ready.lock();
        self.shared.added.wait_while_for(&mut ready, |r| r.wanted(keep).is_some(), limit);
        ready.wanted(keep).is_none()
    }
}

impl Drop for SpareDirs {
    fn drop(&mut self) {
        self.shared.ready.lock().closed = true;
        self.shared.wanted.notify_all();
    }
}

impl Shared {
    fn take(&self, kind: Kind, dest: &Path) -> bool {
        // rename() would replace an empty directory there. Whatever exists belongs to someone
        // (an allocation whose prerun runs again after a restart): leave it, keep the shell.
        if dest.symlink_metadata().is_ok() {
            return false;
        }
        let Some(shell) = self.ready.lock().list(kind).pop() else { return false };
        self.wanted.notify_one();
        match std::fs::rename(&shell, dest) {
            Ok(()) => true,
            Err(error) => {
                // Another file system, most likely. A shell still in place goes back.
                tracing::debug!(shell = %shell.display(), dest = %dest.display(), %error,
                    "cannot use a spare directory");
                if shell.is_dir() {
                    self.ready.lock().list(kind).push(shell);
                }
                false
            }
        }
    }

    /// The filler thread: makes shells while the pool is short of any, until it closes.
    fn fill(&self) {
        lower_own_priority();
        let mut ready = self.ready.lock();
        loop {
            if ready.closed {
                return;
            }
            let Some(kind) = ready.wanted(self.keep) else {
                self.wanted.wait(&mut ready);
                continue;
            };
            let number = ready.next;
            ready.next += 1;
            let made = MutexGuard::unlocked(&mut ready, || self.make(kind, number));
            match made {
                Ok(shell) => {
                    ready.list(kind).push(shell);
                    self.added.notify_all();
                }
                Err(error) => {
                    tracing::warn!(root = %self.root.display(), %error,
                        "cannot make spare allocation directories; retrying in {RETRY_AFTER:?}");
                    let _ = self.wanted.wait_while_for(&mut ready, |r| !r.closed, RETRY_AFTER);
                }
            }
        }
    }

    /// Makes one shell: built under a temporary name, then renamed, so it is complete or absent.
    fn make(&self, kind: Kind, number: u64) -> io::Result<PathBuf> {
        let building = self.root.join(format!("building-{number}"));
        let shell = self.root.join(format!("{}{number}", kind.prefix()));
        let result = std::fs::create_dir(&building)
            .and_then(|()| kind.furnish(&building))
            .and_then(|()| std::fs::rename(&building, &shell));
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&building);
        }
        result.map(|()| shell)
    }
}

/// Puts the calling thread at nice 19, so it gets the CPU only when nothing else wants it.
fn lower_own_priority() {
    // SAFETY: setpriority takes plain integers and touches no memory; on Linux, PRIO_PROCESS
    // with who = 0 applies to the calling thread only.
    let failed = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) } != 0;
    if failed {
        tracing::debug!(error = %io::Error::last_os_error(), "cannot lower the filler's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const FILL_LIMIT: Duration = Duration::from_secs(10);

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn assert_alloc_layout(root: &Path) {
        for dir in alloc_dir::shared_dirs(root) {
            assert!(dir.is_dir(), "{} is missing", dir.display());
        }
    }

    fn assert_task_layout(dir: &Path) {
        for sub in ["local", "logs", "secrets"] {
            assert!(dir.join(sub).is_dir(), "{}/{sub} is missing", dir.display());
        }
        assert_eq!(mode(&dir.join("secrets")), 0o700);
    }

    #[test]
    fn fills_to_the_count_with_complete_shells() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareDirs::open(tmp.path().join("spare"), 3).unwrap();
        assert!(spares.wait_full(FILL_LIMIT), "not full: {:?}", spares.ready());
        assert_eq!(spares.ready(), (3, 3));
        let ready = spares.shared.ready.lock();
        ready.allocs.iter().for_each(|shell| assert_alloc_layout(shell));
        ready.tasks.iter().for_each(|shell| assert_task_layout(shell));
    }

    #[test]
    fn a_taken_shell_is_in_place_and_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareDirs::open(tmp.path().join("spare"), 2).unwrap();
        assert!(spares.wait_full(FILL_LIMIT));
        let alloc_root = tmp.path().join("allocs-a1");
        assert!(spares.take_alloc(&alloc_root));
        assert_alloc_layout(&alloc_root);
        let task_dir = alloc_root.join("web");
        assert!(spares.take_task(&task_dir));
        assert_task_layout(&task_dir);
        assert!(spares.wait_full(FILL_LIMIT), "not refilled: {:?}", spares.ready());
        // The shells in the pool are new ones, not the ones handed out.
        let ready = spares.shared.ready.lock();
        assert!(ready.allocs.iter().chain(&ready.tasks).all(|shell| shell.is_dir()));
    }

    #[test]
    fn an_existing_directory_is_never_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareDirs::open(tmp.path().join("spare"), 1).unwrap();
        assert!(spares.wait_full(FILL_LIMIT));
        let taken = tmp.path().join("taken");
        std::fs::create_dir(&taken).unwrap();
        std::fs::write(taken.join("keep"), "data").unwrap();
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(!spares.take_alloc(&taken));
        assert!(!spares.take_task(&empty));
        assert_eq!(std::fs::read_to_string(taken.join("keep")).unwrap(), "data");
        assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
        assert_eq!(spares.ready(), (1, 1), "the shells stay in the pool");
    }

    #[test]
    fn an_empty_pool_says_so_and_the_caller_falls_back() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareDirs::open(tmp.path().join("spare"), 0).unwrap();
        assert!(!spares.take_alloc(&tmp.path().join("a")));
        assert!(!tmp.path().join("a").exists());
    }

    #[test]
    fn a_restart_keeps_complete_shells_and_removes_half_made_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("spare");
        let spares = SpareDirs::open(&root, 2).unwrap();
        assert!(spares.wait_full(FILL_LIMIT));
        let before: Vec<PathBuf> = {
            let ready = spares.shared.ready.lock();
            ready.allocs.iter().chain(&ready.tasks).cloned().collect()
        };
        drop(spares);
        // What a crash in the middle of making a shell leaves, and a file that is not ours.
        std::fs::create_dir_all(root.join("building-99/alloc")).unwrap();
        std::fs::write(root.join("notes"), "mine").unwrap();

        let spares = SpareDirs::open(&root, 2).unwrap();
        assert!(!root.join("building-99").exists());
        assert!(root.join("notes").exists());
        let ready = spares.shared.ready.lock();
        for shell in &before {
            assert!(ready.allocs.contains(shell) || ready.tasks.contains(shell), "{shell:?}");
        }
        assert!(ready.next >= 100, "new shells must not reuse a number: {}", ready.next);
    }
}
