//! The file work both cgroup versions share: reading and writing the kernel's files (and
//! keeping the busy ones open, [`OpenFiles`]), making the parent and the directories below it,
//! the locks that keep one agent per parent, and removing directories.
//!
//! Nothing here knows which version it works on: a v1 cpuset's need to be given its parent's
//! CPUs and memory nodes when it is made is a flag its manager passes ([`make_dirs`]).

use crate::cpuset::CpuSet;
use crate::error::IsolateError;
use parking_lot::Mutex;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// How long a parent's lock is waited for: a process forked by the agent that held it keeps a
/// copy of its descriptor (and so the lock) until it executes its program. A live agent holds
/// its parent's lock for good, so waiting longer would only delay the refusal.
const PARENT_LOCK_LIMIT: Duration = Duration::from_millis(500);

/// How long the lock above the parents is waited for. Agents hold it only while they make a
/// parent or sweep, but any process one of them forks meanwhile keeps it until its exec, and
/// a child that joins cgroups before its exec can take that long on a loaded host (each join
/// waits for the kernel's cgroup lock).
const ABOVE_LOCK_LIMIT: Duration = Duration::from_secs(10);

/// The files of a task's cgroup its stats, OOM record and kills use, kept open once used:
/// opening a cgroup file again costs ten to thirty times reading it again (the lookups through
/// kernfs), and a metrics scrape reads every running task's, a stop of many tasks freezes each.
/// A read from offset 0 makes the kernel write such a file afresh. Not `cgroup.procs`, whose
/// v1 listing is kept per open file (`TaskCgroup::pids`). Closed when the cgroup is removed.
#[derive(Debug, Default)]
pub(crate) struct OpenFiles(Mutex<Vec<(std::path::PathBuf, Access, std::fs::File)>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

impl OpenFiles {
    /// Runs `with` on `path` opened for `access`, opening it the first time.
    fn with<T>(
        &self,
        path: &Path,
        access: Access,
        with: impl FnOnce(&std::fs::File) -> io::Result<T>,
    ) -> Result<T, IsolateError> {
        let mut files = self.0.lock();
        let index = match files.iter().position(|(p, a, _)| p == path && *a == access) {
            Some(index) => index,
            None => {
                let file = match access {
                    Access::Read => std::fs::File::open(path),
                    Access::Write => std::fs::OpenOptions::new().write(true).open(path),
                }
                .map_err(IsolateError::io(path))?;
                files.push((path.to_owned(), access, file));
                files.len() - 1
            }
        };
        with(&files[index].2).map_err(IsolateError::io(path))
    }

    /// The whole of `path` as the kernel writes it now.
    pub(crate) fn read(&self, path: &Path) -> Result<String, IsolateError> {
        use std::os::unix::fs::FileExt;
        let bytes = self.with(path, Access::Read, |file| {
            // Reading from offset 0 makes the kernel write the file afresh.
            let mut bytes = Vec::with_capacity(1024);
            let mut chunk = [0u8; 4096];
            loop {
                let n = file.read_at(&mut chunk, bytes.len() as u64)?;
                if n == 0 {
                    return Ok(bytes);
                }
                bytes.extend_from_slice(&chunk[..n]);
            }
        })?;
        String::from_utf8(bytes).map_err(|_| IsolateError::Unreadable {
            path: path.to_owned(),
            reason: "not text".into(),
        })
    }

    /// Writes `value` to `path` in one call.
    pub(crate) fn write(&self, path: &Path, value: &str) -> Result<(), IsolateError> {
        use std::os::unix::fs::FileExt;
        self.with(path, Access::Write, |file| file.write_at(value.as_bytes(), 0).map(drop))
    }

    /// The number `path` holds.
    pub(crate) fn number(&self, path: &Path) -> Result<u64, IsolateError> {
        let text = self.read(path)?;
        super::stats::number(&text).ok_or_else(|| IsolateError::Unreadable {
            path: path.to_owned(),
            reason: format!("{:?} is not a number", text.trim()),
        })
    }

    /// Closes every file it keeps.
    pub(crate) fn close(&self) {
        self.0.lock().clear();
    }
}

/// Makes `parent` and the directories between `base` and it, and locks it for the life of the
/// returned descriptor. The directory above it is locked meanwhile, as a sweep of siblings locks
/// it: an agent starting beside this one then either sees the parent locked or does not see it
/// yet, never made but unlocked (and so removed). `copy_cpusets` as for [`make_dirs`].
pub(crate) fn make_and_lock_parent(
    base: &Path,
    parent: &Path,
    copy_cpusets: bool,
) -> Result<OwnedFd, IsolateError> {
    let above = parent.parent().filter(|above| above.starts_with(base)).unwrap_or(base);
    make_dirs(base, above, copy_cpusets)?;
    let making = lock_above(above)?;
    make_dirs(base, parent, copy_cpusets)?;
    let lock = lock_parent(parent)?;
    drop(making);
    Ok(lock)
}

/// Makes `dir` and the directories between `base` and it. With `copy_cpusets` (v1's cpuset
/// hierarchy), a new directory gets its parent's CPUs and memory nodes: it starts with none,
/// and could hold no task.
pub(crate) fn make_dirs(base: &Path, dir: &Path, copy_cpusets: bool) -> Result<(), IsolateError> {
    let Ok(below) = dir.strip_prefix(base) else {
        return Err(IsolateError::Invalid {
            what: dir.display().to_string(),
            reason: format!("is not below {}", base.display()),
        });
    };
    let mut current = base.to_path_buf();
    for component in below.components() {
        let parent = current.clone();
        current.push(component);
        match std::fs::create_dir(&current) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(IsolateError::Io { path: current, source: e }),
        }
        if copy_cpusets {
            for file in ["cpuset.mems", "cpuset.cpus"] {
                if read_text(&current.join(file))?.trim().is_empty() {
                    write(&current.join(file), read_text(&parent.join(file))?.trim())?;
                }
            }
        }
    }
    Ok(())
}

/// The cores tasks may have, from the parent's `effective` cpuset file (v1
/// `cpuset.effective_cpus`, v2 `cpuset.cpus.effective`), less the ones the node keeps.
pub(crate) fn usable_cores(
    parent: &Path,
    own: &Path,
    effective: &str,
    kept: &CpuSet,
) -> Result<CpuSet, IsolateError> {
    // A parent made just now may not show it yet in a fake tree; its own cgroup's is the same
    // set.
    let path = [parent.join(effective), own.join(effective)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| parent.join(effective));
    let cpus = read_text(&path)?;
    Ok(CpuSet::parse(&cpus)
        .map_err(|reason| IsolateError::Unreadable { path, reason })?
        .difference(kept))
}

/// Locks a directory, waiting up to `limit` for a holder that is only a child of an agent on
/// its way to exec (it keeps a copy of the descriptor until then). `None`: still held after
/// that, by a live agent.
fn lock_dir(dir: &Path, limit: Duration) -> Result<Option<OwnedFd>, IsolateError> {
    let lock = crate::sys::open_dir(dir).map_err(IsolateError::io(dir))?;
    let mut wait = Duration::from_millis(1);
    let mut waited = Duration::ZERO;
    while !crate::sys::try_lock_exclusive(lock.as_fd()).map_err(IsolateError::io(dir))? {
        if waited >= limit {
            return Ok(None);
        }
        std::thread::sleep(wait);
        waited += wait;
        wait = (wait * 2).min(Duration::from_millis(100));
    }
    Ok(Some(lock))
}

/// Locks the parent for this manager.
fn lock_parent(parent: &Path) -> Result<OwnedFd, IsolateError> {
    lock_dir(parent, PARENT_LOCK_LIMIT)?
        .ok_or_else(|| IsolateError::ParentInUse { path: parent.to_owned() })
}

/// Locks the directory above the parent, while an agent makes its parent there or sweeps it.
pub(crate) fn lock_above(above: &Path) -> Result<OwnedFd, IsolateError> {
    lock_dir(above, ABOVE_LOCK_LIMIT)?.ok_or_else(|| IsolateError::Invalid {
        what: above.display().to_string(),
        reason: "stays locked: another wharf agent is making or sweeping its cgroup parent here"
            .into(),
    })
}

pub(crate) fn read_text(path: &Path) -> Result<String, IsolateError> {
    std::fs::read_to_string(path).map_err(IsolateError::io(path))
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), IsolateError> {
    std::fs::write(path, value).map_err(IsolateError::io(path))
}

/// Writes a file the kernel may not have (swap accounting is optional).
pub(crate) fn write_if_present(path: &Path, value: &str) -> Result<(), IsolateError> {
    if path.exists() { write(path, value) } else { Ok(()) }
}

/// Removes a directory; one that is gone already is no error.
pub(crate) fn remove_dir(path: &Path) -> Result<(), IsolateError> {
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(IsolateError::Io { path: path.to_owned(), source: e })
        }
        _ => Ok(()),
    }
}
