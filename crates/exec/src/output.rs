//! Reading a task's output back (the `logs` capability): the size-rotated files the shim
//! writes (module `shim::logs`), `<task>.<stream>.0` the current file, `.1` the one before,
//! and so on.
//!
//! The task can write in its own log directory, so nothing found there is trusted. The
//! directory is opened without following a link; each file is opened relative to that open
//! directory, without following a link and without blocking (a FIFO planted there cannot hang
//! the agent), and is read only if it is a regular file with no other name (no hard link to a
//! file elsewhere). Anything else is refused ([`DriverError::Refused`] naming the file). Files
//! are read through the descriptors checked, never opened again by name. The reading itself
//! runs on tokio's blocking pool.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use wharf_driver::{DriverError, LogFrom, LogReader, LogStream, LogTarget};

/// The most rotated files looked for (the agent's `logs.max_files` is far below).
const MAX_FILES: u32 = 10_000;

/// Why a task's logs could not be read.
#[derive(Debug)]
enum LogError {
    /// Something in the log directory (or the directory itself) is not what the shim writes.
    Refused { what: String, reason: String },
    /// Reading failed.
    Io { path: PathBuf, source: io::Error },
}

impl From<LogError> for DriverError {
    fn from(error: LogError) -> DriverError {
        match error {
            LogError::Refused { what, reason } => DriverError::Refused {
                what,
                reason: format!(
                    "{reason}; a task's log files must be regular files in its log directory"
                ),
            },
            LogError::Io { path, source } => {
                DriverError::other(format!("cannot read {}: {source}", path.display()))
            }
        }
    }
}

/// One stream of one task's logs.
#[derive(Debug, Clone)]
struct TaskLogs {
    dir: PathBuf,
    task: String,
    stem: String,
}

/// A log file opened and checked, with what identifies it.
#[derive(Debug)]
struct LogFile {
    file: File,
    size: u64,
    identity: (u64, u64),
}

impl TaskLogs {
    /// The logs of `task` in `logs_dir`.
    fn new(logs_dir: &Path, task: &str, stream: LogStream) -> TaskLogs {
        TaskLogs {
            dir: logs_dir.to_owned(),
            task: task.to_owned(),
            stem: format!("{task}.{}", stream.name()),
        }
    }

    /// Refuses file `name` of the log directory, or the directory itself when `None`.
    fn refused(&self, name: Option<&str>, reason: impl Into<String>) -> LogError {
        let dir = format!("the log directory of task {:?}", self.task);
        let what = match name {
            Some(name) => format!("{name} in {dir}"),
            None => dir,
        };
        LogError::Refused { what, reason: reason.into() }
    }

    /// The log directory, opened without following a link; `None` if it does not exist yet.
    fn open_dir(&self) -> Result<Option<File>, LogError> {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.dir);
        match opened {
            Ok(dir) => Ok(Some(dir)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                Err(self.refused(None, "it is a symbolic link or not a directory"))
            }
            Err(source) => Err(LogError::Io { path: self.dir.clone(), source }),
        }
    }

    /// File `index` of the stream, opened in `dir` and checked; `None` if there is none.
    fn open(&self, dir: &File, index: u32) -> Result<Option<LogFile>, LogError> {
        let name = format!("{}.{index}", self.stem);
        let io_error = |source| LogError::Io { path: self.dir.join(&name), source };
        let file = match open_in(dir, &name) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(self.refused(Some(&name), "it is a symbolic link"));
            }
            // What a socket gives when opened.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                return Err(self.refused(Some(&name), "it is not a regular file"));
            }
            Err(source) => return Err(io_error(source)),
        };
        let meta = file.metadata().map_err(io_error)?;
        let kind = meta.file_type();
        if !kind.is_file() {
            let what = if kind.is_dir() {
                "a directory"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_block_device() || kind.is_char_device() {
                "a device"
            } else {
                "not a regular file"
            };
            return Err(self.refused(Some(&name), format!("it is {what}")));
        }
        if meta.nlink() > 1 {
            return Err(self.refused(
                Some(&name),
                format!(
                    "it has {} names (hard links), so it may be a file from elsewhere",
                    meta.nlink()
                ),
            ));
        }
        Ok(Some(LogFile { file, size: meta.len(), identity: (meta.dev(), meta.ino()) }))
    }

    /// Every file of the stream that exists, oldest first, opened and checked.
    fn open_all(&self, dir: &File) -> Result<Vec<LogFile>, LogError> {
        let mut files = Vec::new();
        for index in 0..MAX_FILES {
            match self.open(dir, index)? {
                Some(file) => files.push(file),
                None => break,
            }
        }
        files.reverse();
        Ok(files)
    }

    /// A reader positioned at `from`: the files before it are skipped, the one it falls in
    /// is read from there, the newer ones in full, then the current file as it grows.
    fn open_at(&self, from: LogFrom) -> Result<Follower, LogError> {
        let mut follower = Follower {
            logs: self.clone(),
            dir: self.open_dir()?,
            current: None,
            backlog: Vec::new(),
            offset: 0,
        };
        let Some(dir) = &follower.dir else { return Ok(follower) };
        let mut files = self.open_all(dir)?;
        let total: u64 = files.iter().map(|f| f.size).sum();
        let start = match from {
            LogFrom::Start => 0,
            LogFrom::Offset(offset) => offset.min(total),
            LogFrom::Tail(tail) => total.saturating_sub(tail),
            LogFrom::End => total,
        };
        // Skip the files wholly before `start`; the current file (the last) stays even when
        // skipped entirely, since it grows.
        let mut skip = start;
        while files.len() > 1 && skip >= files[0].size {
            skip -= files[0].size;
            files.remove(0);
        }
        if let Some(first) = files.first_mut() {
            let at = skip.min(first.size);
            first
                .file
                .seek(SeekFrom::Start(at))
                .map_err(|source| LogError::Io { path: self.dir.clone(), source })?;
        }
        follower.current = files.pop();
        follower.backlog = files;
        follower.offset = start;
        Ok(follower)
    }
}

/// Reads a stream as it grows, across rotations.
#[derive(Debug)]
struct Follower {
    logs: TaskLogs,
    /// The log directory, once it exists.
    dir: Option<File>,
    /// The file being read: `.0` when it was opened.
    current: Option<LogFile>,
    /// Older files to read first, oldest first.
    backlog: Vec<LogFile>,
    /// The offset of the next byte, counted from the oldest byte kept when it was opened.
    offset: u64,
}

impl Follower {
    /// The bytes written since the last call (at most `limit`); empty when there is nothing new.
    fn poll(&mut self, limit: usize) -> Result<Vec<u8>, LogError> {
        let out = self.poll_files(limit)?;
        self.offset += out.len() as u64;
        Ok(out)
    }

    fn poll_files(&mut self, limit: usize) -> Result<Vec<u8>, LogError> {
        let io_error = |source| LogError::Io { path: self.logs.dir.clone(), source };
        let mut out = Vec::new();
        while let Some(old) = self.backlog.first_mut() {
            let want = limit - out.len();
            if read_up_to(&mut old.file, want, &mut out).map_err(io_error)? < want {
                self.backlog.remove(0);
            } else {
                return Ok(out);
            }
        }
        if self.dir.is_none() {
            self.dir = self.logs.open_dir()?;
        }
        let Some(dir) = &self.dir else { return Ok(out) };
        if self.current.is_none() {
            // It did not exist when following began: all of it is new.
            self.current = self.logs.open(dir, 0)?;
        }
        let Some(current) = &mut self.current else { return Ok(out) };
        let want = limit - out.len();
        if read_up_to(&mut current.file, want, &mut out).map_err(io_error)? == want {
            return Ok(out);
        }
        // Drained. Rotated, if `.0` is now another file: what we hold became `.1`.
        if let Some(fresh) = self.logs.open(dir, 0)?
            && fresh.identity != current.identity
        {
            self.current = Some(fresh);
            let want = limit - out.len();
            if let Some(fresh) = &mut self.current {
                read_up_to(&mut fresh.file, want, &mut out).map_err(io_error)?;
            }
        }
        Ok(out)
    }
}

/// Opens one stream of a task's output at `from`, as [`wharf_driver::Driver::task_logs`]
/// promises; the opening and every read run on tokio's blocking pool.
pub(crate) async fn open(
    target: &LogTarget,
    stream: LogStream,
    from: LogFrom,
) -> Result<Box<dyn LogReader>, DriverError> {
    let logs = TaskLogs::new(&target.dir, &target.task_name, stream);
    let follower = tokio::task::spawn_blocking(move || logs.open_at(from))
        .await
        .map_err(|e| DriverError::other(format!("opening the logs failed: {e}")))??;
    Ok(Box::new(BlockingReader { offset: follower.offset, follower: Some(follower) }))
}

/// A [`Follower`] read off the async threads.
#[derive(Debug)]
struct BlockingReader {
    /// Taken while a read runs; gone if that read was dropped before it finished.
    follower: Option<Follower>,
    offset: u64,
}

#[async_trait::async_trait]
impl LogReader for BlockingReader {
    async fn read(&mut self, limit: usize) -> Result<Vec<u8>, DriverError> {
        let mut follower = self.follower.take().ok_or_else(|| {
            DriverError::other("an earlier read of these logs was abandoned; open them again")
        })?;
        let (follower, read) = tokio::task::spawn_blocking(move || {
            let read = follower.poll(limit);
            (follower, read)
        })
        .await
        .map_err(|e| DriverError::other(format!("reading the logs failed: {e}")))?;
        self.offset = follower.offset;
        self.follower = Some(follower);
        Ok(read?)
    }

    fn offset(&self) -> u64 {
        self.offset
    }
}

/// Appends at most `max` bytes of `file` to `out`; returns how many.
fn read_up_to(file: &mut File, max: usize, out: &mut Vec<u8>) -> io::Result<usize> {
    file.take(max as u64).read_to_end(out)
}

/// Opens `name` in `dir` for reading, refusing a symbolic link (`ELOOP`) and never blocking
/// on a FIFO or device.
fn open_in(dir: &File, name: &str) -> io::Result<File> {
    if name.contains('/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a file name cannot hold '/'"));
    }
    let name = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    // SAFETY: `dir` is an open descriptor for the whole call and `name` a NUL-terminated
    // string that outlives it; the result is checked before use.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat, is open, and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use LogStream as Stream;

    /// One read of at most `limit` bytes from `from`: the bytes and the offset after them.
    fn read(logs: &TaskLogs, from: LogFrom, limit: usize) -> Result<(Vec<u8>, u64), String> {
        let mut reader = logs.open_at(from).map_err(|e| DriverError::from(e).to_string())?;
        let bytes = reader.poll(limit).map_err(|e| DriverError::from(e).to_string())?;
        Ok((bytes, reader.offset))
    }

    fn follow(logs: &TaskLogs, from_start: bool) -> Result<Follower, String> {
        let from = if from_start { LogFrom::Start } else { LogFrom::End };
        logs.open_at(from).map_err(|e| DriverError::from(e).to_string())
    }

    #[test]
    fn reads_across_rotated_files_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        for (index, text) in [(2, "one\n"), (1, "two\n"), (0, "three\n")] {
            std::fs::write(dir.path().join(format!("web.stdout.{index}")), text).unwrap();
        }
        let logs = TaskLogs::new(dir.path(), "web", Stream::Stdout);
        let read = |from, limit| read(&logs, from, limit).unwrap();
        assert_eq!(read(LogFrom::Start, 1 << 20), (b"one\ntwo\nthree\n".to_vec(), 14));
        assert_eq!(read(LogFrom::Offset(6), 1 << 20), (b"o\nthree\n".to_vec(), 14));
        assert_eq!(read(LogFrom::Tail(6), 1 << 20), (b"three\n".to_vec(), 14));
        assert_eq!(read(LogFrom::Offset(2), 5), (b"e\ntwo".to_vec(), 7));
        assert_eq!(read(LogFrom::Offset(99), 10), (Vec::new(), 14));
        assert_eq!(read(LogFrom::Tail(99), 4), (b"one\n".to_vec(), 4));
        assert_eq!(read(LogFrom::End, 10), (Vec::new(), 14));
        // Exactly at a file's end: the next file follows.
        assert_eq!(read(LogFrom::Offset(4), 4), (b"two\n".to_vec(), 8));
        let empty = TaskLogs::new(dir.path(), "web", Stream::Stderr);
        assert_eq!(super::tests::read(&empty, LogFrom::Start, 10).unwrap(), (Vec::new(), 0));
        let no_dir = TaskLogs::new(&dir.path().join("none"), "web", Stream::Stdout);
        assert_eq!(super::tests::read(&no_dir, LogFrom::Tail(5), 10).unwrap(), (Vec::new(), 0));
    }

    fn append(path: &Path, text: &str) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    #[test]
    fn a_follower_sees_appends_and_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("t.stdout.0");
        std::fs::write(&current, "old\n").unwrap();
        let logs = TaskLogs::new(dir.path(), "t", Stream::Stdout);
        let mut follower = follow(&logs, false).unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"");
        append(&current, "new\n");
        assert_eq!(follower.poll(1024).unwrap(), b"new\n");
        // Rotate: .0 becomes .1 after one more line, and a new .0 starts.
        append(&current, "last\n");
        std::fs::rename(&current, dir.path().join("t.stdout.1")).unwrap();
        std::fs::write(&current, "fresh\n").unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"last\nfresh\n");
        assert_eq!(follower.poll(1024).unwrap(), b"");

        let mut from_start = follow(&logs, true).unwrap();
        assert_eq!(from_start.poll(1024).unwrap(), b"old\nnew\nlast\nfresh\n");
        // In chunks of the limit, older files included, none cut short.
        let mut small = follow(&logs, true).unwrap();
        let chunks: Vec<Vec<u8>> = (0..8).map(|_| small.poll(3).unwrap()).collect();
        assert_eq!(chunks.concat(), b"old\nnew\nlast\nfresh\n");
        assert!(chunks.iter().all(|c| c.len() <= 3));
    }

    #[test]
    fn a_follower_reads_a_stream_that_appears_later_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let logs_dir = dir.path().join("logs");
        let logs = TaskLogs::new(&logs_dir, "t", Stream::Stderr);
        let mut follower = follow(&logs, false).unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"");
        std::fs::create_dir(&logs_dir).unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"");
        append(&logs_dir.join("t.stderr.0"), "first\n");
        assert_eq!(follower.poll(1024).unwrap(), b"first\n");
    }

    fn read_tail(logs: &TaskLogs) -> String {
        read(logs, LogFrom::Tail(1 << 20), 1024).expect_err("refused")
    }

    /// Every way a task can plant something in its log directory, read and followed.
    #[test]
    fn what_is_not_a_plain_log_file_is_refused() {
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(secret.path(), "secret\n").unwrap();
        type Plant<'a> = &'a dyn Fn(&Path);
        let plant: &[(&str, Plant<'_>, &str)] = &[
            (
                "the current file is a link",
                &|dir| std::os::unix::fs::symlink(secret.path(), dir.join("t.stdout.0")).unwrap(),
                "t.stdout.0 in the log directory of task \"t\": it is a symbolic link",
            ),
            (
                "an older file is a link",
                &|dir| {
                    std::fs::write(dir.join("t.stdout.0"), "mine\n").unwrap();
                    std::os::unix::fs::symlink(secret.path(), dir.join("t.stdout.1")).unwrap();
                },
                "t.stdout.1 in the log directory of task \"t\": it is a symbolic link",
            ),
            (
                "a hard link",
                &|dir| std::fs::hard_link(secret.path(), dir.join("t.stdout.0")).unwrap(),
                "it has 2 names (hard links)",
            ),
            (
                "a FIFO",
                &|dir| {
                    let path = CString::new(dir.join("t.stdout.0").to_str().unwrap()).unwrap();
                    // SAFETY: a NUL-terminated path; the result is checked.
                    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
                },
                "it is a FIFO",
            ),
            (
                "a directory",
                &|dir| std::fs::create_dir(dir.join("t.stdout.0")).unwrap(),
                "it is a directory",
            ),
        ];
        for (case, plant, phrase) in plant {
            let dir = tempfile::tempdir().unwrap();
            plant(dir.path());
            let logs = TaskLogs::new(dir.path(), "t", Stream::Stdout);
            let read = read(&logs, LogFrom::Start, 1024).expect_err(case);
            assert!(read.contains(phrase), "{case}: {read}");
            let tail = read_tail(&logs);
            assert!(tail.contains(phrase), "{case}: {tail}");
        }

        // The log directory itself replaced by a link.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(secret.path().parent().unwrap(), dir.path().join("logs"))
            .unwrap();
        let logs = TaskLogs::new(&dir.path().join("logs"), "t", Stream::Stdout);
        let err = read(&logs, LogFrom::Start, 1024).unwrap_err();
        assert!(err.contains("the log directory of task \"t\": it is a symbolic link"), "{err}");

        // Planted while being followed: the next poll refuses it.
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("t.stdout.0");
        std::fs::write(&current, "one\n").unwrap();
        let logs = TaskLogs::new(dir.path(), "t", Stream::Stdout);
        let mut follower = follow(&logs, true).unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"one\n");
        std::fs::rename(&current, dir.path().join("t.stdout.1")).unwrap();
        std::os::unix::fs::symlink(secret.path(), &current).unwrap();
        let err = DriverError::from(follower.poll(1024).unwrap_err()).to_string();
        assert!(err.contains("it is a symbolic link"), "{err}");
    }
}
