//! Workload users: one uid per task, from a configured range, with the gid of the same number,
//! that no other task holds while it may still matter.
//!
//! As Nomad's dynamic workload users, the ids name no account (there is no `/etc/passwd`
//! entry); unlike Nomad's pool, which lives in the client's memory and is rebuilt from each
//! task's hook state on restore, wharf's [`UserPool`] keeps its leases in a journal file
//! (by default `<data_dir>/workload-users`) that is written before the task starts. So there is
//! no moment, not even between a start and the persisting of its handle, when a running task's
//! uid is known to nobody, and an agent that comes back after `kill -9` never hands a live
//! uid to a new task. The journal belongs to this crate alone: the driver asks for a uid by
//! its task directory and needs neither the store nor the task runner's state.
//!
//! A lease is keyed by the task's directory (its owner) and outlives the task's runs: a task
//! that restarts gets the same uid back, so the files it made in its directory stay its own.
//! A lease ends when its directory is gone (the allocation was garbage-collected) and no
//! process runs as its uid; that is checked lazily, when the pool is opened and when the range
//! is exhausted ([`UserPool::sweep`]). Uids are handed out round-robin, so a freed one is
//! reused as late as possible.
//!
//! The journal is a text file, one line per change, appended with a single `write` under an
//! exclusive `flock`; every operation first reads what others appended, so agents on one host
//! may share a file (and a range). Each sweep compacts a journal that has grown well past its
//! live leases (a new file renamed over the old; others notice the new inode and reread it):
//!
//! ```text
//! wharf-workload-users-1
//! + 80012 /var/lib/wharf/allocs/5f0c.../web
//! - 80012
//! ```
//!
//! A last line without its newline can only be a write cut short by a crash; it was never
//! acknowledged and is cut off. Any other line that does not parse is an error that names
//! the file and the line: the journal is never guessed at.

use crate::dirs::OpenDir;
use crate::error::IsolateError;
use crate::sys;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// A workload user: the uid, and the gid of the same number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ugid(u32);

impl Ugid {
    /// The number, as uid and as gid.
    pub fn get(self) -> u32 {
        self.0
    }

    /// A workload user with this number; `None` for root (0) and for `u32::MAX`, which the
    /// kernel reads as "leave unchanged".
    pub fn new(id: u32) -> Option<Ugid> {
        (id != 0 && id != u32::MAX).then_some(Ugid(id))
    }
}

impl std::fmt::Display for Ugid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The ids workload users are taken from, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UgidRange {
    min: u32,
    max: u32,
}

impl UgidRange {
    /// Nomad's default range for dynamic workload users: 80,000 to 89,999.
    pub const DEFAULT: UgidRange = UgidRange { min: 80_000, max: 89_999 };

    /// The ids `min..=max`. Refused: an empty range, and ranges that include root (0) or
    /// reach past 2^31 - 1 (tools that read ids as signed numbers would misread them).
    pub fn new(min: u32, max: u32) -> Result<UgidRange, IsolateError> {
        let bad = |reason: &str| IsolateError::BadRange { min, max, reason: reason.to_owned() };
        if min == 0 {
            return Err(bad("it includes root (0); start at 1 or above"));
        }
        if max < min {
            return Err(bad("the maximum is below the minimum"));
        }
        if max > i32::MAX as u32 {
            return Err(bad("ids above 2147483647 are misread by tools that use signed ids"));
        }
        Ok(UgidRange { min, max })
    }

    /// The lowest id.
    pub fn min(self) -> u32 {
        self.min
    }

    /// The highest id.
    pub fn max(self) -> u32 {
        self.max
    }

    /// Whether `id` is in the range.
    pub fn contains(self, id: u32) -> bool {
        (self.min..=self.max).contains(&id)
    }
}

/// The first line of a journal.
const HEADER: &str = "wharf-workload-users-1";
/// Compact on open when the journal holds this many lines beyond twice its live leases.
const COMPACT_SLACK: usize = 64;

/// The workload users of a node: leases in a journal file, handed out from a range.
#[derive(Debug)]
pub struct UserPool {
    path: PathBuf,
    range: UgidRange,
    journal: Mutex<Journal>,
}

impl UserPool {
    /// Opens (creating if needed) the journal at `path`: reads it, ends the leases whose task
    /// directories are gone and whose uids no process runs as, and compacts it if it has grown.
    pub fn open(path: &Path, range: UgidRange) -> Result<UserPool, IsolateError> {
        let journal = Journal::open(path)?;
        let pool = UserPool { path: path.to_owned(), range, journal: Mutex::new(journal) };
        pool.locked(|journal, path| journal.sweep(path).map(drop))?;
        Ok(pool)
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The range uids are taken from.
    pub fn range(&self) -> UgidRange {
        self.range
    }

    /// The workload user of the task whose directory is `owner` (an absolute path): its lease
    /// if it has one, else a new one, written to the journal before this returns.
    pub fn acquire(&self, owner: &Path) -> Result<Ugid, IsolateError> {
        if !owner.is_absolute() || owner.as_os_str().as_bytes().contains(&b'\n') {
            return Err(IsolateError::Journal {
                path: self.path.clone(),
                line: 0,
                reason: format!(
                    "cannot lease a user to {}: an owner is an absolute path without newlines",
                    owner.display()
                ),
            });
        }
        let range = self.range;
        self.locked(|journal, path| {
            if let Some(&id) = journal.owners.get(owner) {
                return Ok(Ugid(id));
            }
            let id = match journal.free_id(range) {
                Some(id) => id,
                None => {
                    journal.sweep(path)?;
                    journal.free_id(range).ok_or(IsolateError::UsersExhausted {
                        min: range.min,
                        max: range.max,
                        leased: journal.leases.len(),
                    })?
                }
            };
            let mut line = format!("+ {id} ").into_bytes();
            line.extend_from_slice(owner.as_os_str().as_bytes());
            line.push(b'\n');
            journal.append(path, &line)?;
            Ok(Ugid(id))
        })
    }

    /// Ends every lease whose task directory is gone and whose uid no process runs as;
    /// returns how many ended. Done on open and when the range runs out; callers may also call
    /// it after removing many task directories.
    pub fn sweep(&self) -> Result<usize, IsolateError> {
        self.locked(|journal, path| journal.sweep(path))
    }

    /// The leases as the journal has them now, by uid.
    pub fn leases(&self) -> Result<Vec<(Ugid, PathBuf)>, IsolateError> {
        self.locked(|journal, _| {
            Ok(journal.leases.iter().map(|(id, owner)| (Ugid(*id), owner.clone())).collect())
        })
    }

    /// Runs `f` with the journal locked (in this process and with `flock` against others) and
    /// up to date.
    fn locked<R>(
        &self,
        f: impl FnOnce(&mut Journal, &Path) -> Result<R, IsolateError>,
    ) -> Result<R, IsolateError> {
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let io = |source| IsolateError::Io { path: self.path.clone(), source };
        // Another process may have compacted the journal (a new file under the same name) or
        // the file may have been removed: lock the file the name points to now.
        loop {
            sys::flock(journal.file.as_fd(), libc::LOCK_EX).map_err(io)?;
            match std::fs::metadata(&self.path) {
                Ok(meta) if (meta.dev(), meta.ino()) == journal.id => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(e)),
            }
            *journal = Journal::open(&self.path)?;
        }
        let result = journal.catch_up(&self.path).and_then(|()| f(&mut journal, &self.path));
        let unlocked = sys::flock(journal.file.as_fd(), libc::LOCK_UN).map_err(io);
        let result = result?;
        unlocked?;
        Ok(result)
    }
}

/// One process's view of the journal file.
#[derive(Debug)]
struct Journal {
    file: File,
    /// Device and inode of `file`, to notice a compaction by another process.
    id: (u64, u64),
    /// How far the file has been read.
    read_upto: u64,
    /// Lines read, the header included.
    lines: usize,
    leases: BTreeMap<u32, PathBuf>,
    owners: HashMap<PathBuf, u32>,
    /// The last id handed out, here or by another process: the search for a free one
    /// starts after it.
    last: Option<u32>,
}

impl Journal {
    fn open(path: &Path) -> Result<Journal, IsolateError> {
        let io = |source| IsolateError::Io { path: path.to_owned(), source };
        let file =
            OpenOptions::new().read(true).append(true).create(true).open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        Ok(Journal {
            file,
            id: (meta.dev(), meta.ino()),
            read_upto: 0,
            lines: 0,
            leases: BTreeMap::new(),
            owners: HashMap::new(),
            last: None,
        })
    }

    /// Reads and applies what was appended since the last read. Called with the lock held, so
    /// a line without its newline is a torn write, which is cut off.
    fn catch_up(&mut self, path: &Path) -> Result<(), IsolateError> {
        let io = |source| IsolateError::Io { path: path.to_owned(), source };
        let mut new = Vec::new();
        self.file.seek(io::SeekFrom::Start(self.read_upto)).map_err(io)?;
        (&self.file).read_to_end(&mut new).map_err(io)?;
        if self.read_upto == 0 && new.is_empty() {
            return self.append(path, format!("{HEADER}\n").as_bytes());
        }
        let complete = new.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if complete < new.len() {
            self.file.set_len(self.read_upto + complete as u64).map_err(io)?;
        }
        for line in new[..complete].split_inclusive(|b| *b == b'\n') {
            self.lines += 1;
            self.apply(path, &line[..line.len() - 1])?;
            self.read_upto += line.len() as u64;
        }
        Ok(())
    }

    /// Applies one line (without its newline); `self.lines` is its number.
    fn apply(&mut self, path: &Path, line: &[u8]) -> Result<(), IsolateError> {
        let bad = |reason: String| IsolateError::Journal {
            path: path.to_owned(),
            line: self.lines,
            reason,
        };
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        if self.lines == 1 {
            return match std::str::from_utf8(line) {
                Ok(HEADER) => Ok(()),
                Ok(other) if other.starts_with("wharf-workload-users-") => {
                    Err(bad(format!("written in format {other}; this wharf reads {HEADER}")))
                }
                _ => Err(bad(format!("not a workload-user journal: {:?}", text(line)))),
            };
        }
        let number = |word: &[u8]| {
            std::str::from_utf8(word)
                .ok()
                .and_then(|w| w.parse::<u32>().ok())
                .and_then(Ugid::new)
                .map(Ugid::get)
                .ok_or_else(|| bad(format!("bad id {:?}", text(word))))
        };
        match line {
            [b'+', b' ', rest @ ..] => {
                let mut parts = rest.splitn(2, |b| *b == b' ');
                let id = number(parts.next().unwrap_or_default())?;
                let owner = PathBuf::from(std::ffi::OsStr::from_bytes(
                    parts.next().filter(|o| o.starts_with(b"/")).ok_or_else(|| {
                        bad(format!("a lease without an absolute owner: {:?}", text(line)))
                    })?,
                ));
                if let Some(previous) = self.leases.insert(id, owner.clone()) {
                    self.owners.remove(&previous);
                }
                self.owners.insert(owner, id);
                self.last = Some(id);
                Ok(())
            }
            [b'-', b' ', rest @ ..] => {
                if let Some(owner) = self.leases.remove(&number(rest)?) {
                    self.owners.remove(&owner);
                }
                Ok(())
            }
            _ => Err(bad(format!("not a journal line: {:?}", text(line)))),
        }
    }

    /// Appends whole lines with one write and applies them. A failed write is cut back off,
    /// so no torn line is left for the next writer to append to.
    fn append(&mut self, path: &Path, lines: &[u8]) -> Result<(), IsolateError> {
        let io = |source| IsolateError::Io { path: path.to_owned(), source };
        if let Err(e) = self.file.write_all(lines) {
            let _ = self.file.set_len(self.read_upto);
            return Err(io(e));
        }
        self.catch_up(path)
    }

    /// A free id in `range`, searching round-robin from the last one handed out.
    fn free_id(&self, range: UgidRange) -> Option<u32> {
        let start = match self.last {
            Some(last) if range.contains(last) && last < range.max => last + 1,
            _ => range.min,
        };
        (start..=range.max).chain(range.min..start).find(|id| !self.leases.contains_key(id))
    }

    /// Ends the leases whose directories are gone and whose uids no process runs as, then
    /// compacts the journal if it has grown well past its live leases; returns how many ended.
    fn sweep(&mut self, path: &Path) -> Result<usize, IsolateError> {
        let ended = self.end_gone_leases(path)?;
        if self.lines > 2 * self.leases.len() + COMPACT_SLACK {
            self.compact(path)?;
        }
        Ok(ended)
    }

    fn end_gone_leases(&mut self, path: &Path) -> Result<usize, IsolateError> {
        let gone: Vec<u32> = self
            .leases
            .iter()
            .filter(|(_, owner)| {
                matches!(std::fs::symlink_metadata(owner), Err(e) if e.kind() == io::ErrorKind::NotFound)
            })
            .map(|(id, _)| *id)
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        // Reading every process's ids costs a file per process: only when there is a
        // candidate.
        let live = ids_in_use();
        let mut ended = Vec::new();
        for id in gone.into_iter().filter(|id| !live.contains(id)) {
            ended.extend_from_slice(format!("- {id}\n").as_bytes());
        }
        let count = ended.iter().filter(|b| **b == b'\n').count();
        if count > 0 {
            self.append(path, &ended)?;
        }
        Ok(count)
    }

    /// Rewrites the journal with only its live leases: a new file, synced, renamed over the
    /// old one, then this journal moves to it. Others notice the new inode when they lock.
    fn compact(&mut self, path: &Path) -> Result<(), IsolateError> {
        let mut text = format!("{HEADER}\n").into_bytes();
        for (id, owner) in &self.leases {
            text.extend_from_slice(format!("+ {id} ").as_bytes());
            text.extend_from_slice(owner.as_os_str().as_bytes());
            text.push(b'\n');
        }
        let mut temp = path.as_os_str().to_owned();
        temp.push(".compact");
        let temp = PathBuf::from(temp);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| IsolateError::Io { path, source }
        };
        let mut file = File::create(&temp).map_err(io(&temp))?;
        file.write_all(&text).and_then(|()| file.sync_all()).map_err(io(&temp))?;
        std::fs::rename(&temp, path).map_err(io(path))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        }
        let last = self.last;
        *self = Journal::open(path)?;
        self.catch_up(path)?;
        self.last = last;
        Ok(())
    }
}

/// Every uid and gid (real, effective, saved, file system) of every process now. A process
/// that exits or starts during the scan may be missed; the caller only needs the processes
/// of tasks whose directories are already gone, which start nothing new.
fn ids_in_use() -> HashSet<u32> {
    let mut ids = HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return ids };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        for line in status.lines() {
            if let Some(values) = line.strip_prefix("Uid:").or_else(|| line.strip_prefix("Gid:")) {
                ids.extend(values.split_ascii_whitespace().filter_map(|v| v.parse::<u32>().ok()));
            }
        }
    }
    ids
}

/// Gives the directories `dirs` (not what they hold) to `user`, as owner and group, through
/// their descriptors: what a task put in place of one of their paths since they were opened
/// (a link, another directory) is not touched.
pub fn hand_over(dirs: &[&OpenDir], user: Ugid) -> Result<(), IsolateError> {
    dirs.iter().try_for_each(|dir| dir.set_owner(user.0, user.0))
}

/// Whether this process runs as root, which switching to a workload user needs.
pub fn running_as_root() -> bool {
    sys::geteuid() == 0
}
