//! Reading a task's output from its size-rotated files: `<task>.<stream>.0` is the current
//! file, `.1` the one before, and so on (the layout wharf-exec's shim writes).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One stream of one task's logs.
#[derive(Debug, Clone)]
pub struct TaskLogs {
    dir: PathBuf,
    stem: String,
}

impl TaskLogs {
    /// The logs of `task` in `logs_dir`.
    pub fn new(logs_dir: &Path, task: &str, stream: Stream) -> TaskLogs {
        TaskLogs { dir: logs_dir.to_owned(), stem: format!("{task}.{}", stream.name()) }
    }

    fn path(&self, index: u32) -> PathBuf {
        self.dir.join(format!("{}.{index}", self.stem))
    }

    /// The files that exist, oldest first.
    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> =
            (0..10_000).map(|i| self.path(i)).take_while(|p| p.exists()).collect();
        files.reverse();
        files
    }

    /// Everything kept, oldest first, from byte `offset` on (or the last `tail` bytes), at
    /// most `limit` bytes. Returns the bytes and the offset just after them.
    pub fn read(
        &self,
        offset: Option<u64>,
        tail: Option<u64>,
        limit: usize,
    ) -> io::Result<(Vec<u8>, u64)> {
        let files = self.files();
        let sizes: Vec<u64> =
            files.iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).collect();
        let total: u64 = sizes.iter().sum();
        let start = match (offset, tail) {
            (_, Some(tail)) => total.saturating_sub(tail),
            (Some(offset), None) => offset.min(total),
            (None, None) => 0,
        };
        let mut out = Vec::new();
        let mut skip = start;
        for (file, size) in files.iter().zip(sizes) {
            if out.len() >= limit {
                break;
            }
            if skip >= size {
                skip -= size;
                continue;
            }
            let mut handle = File::open(file)?;
            handle.seek(SeekFrom::Start(skip))?;
            skip = 0;
            handle.take((limit - out.len()) as u64).read_to_end(&mut out)?;
        }
        let next = start + out.len() as u64;
        Ok((out, next))
    }

    /// A follower that starts at the end of what exists now (or at its start when `from_start`).
    pub fn follow(&self, from_start: bool) -> Follower {
        Follower {
            logs: self.clone(),
            current: None,
            backlog: if from_start { self.files() } else { Vec::new() },
        }
    }
}

/// Reads a stream as it grows, across rotations.
#[derive(Debug)]
pub struct Follower {
    logs: TaskLogs,
    current: Option<(File, u64)>,
    backlog: Vec<PathBuf>,
}

impl Follower {
    /// The bytes written since the last call (at most `limit`); empty when there is nothing new.
    pub fn poll(&mut self, limit: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        // Older files first, when following from the start.
        while let Some(file) = self.backlog.first().cloned() {
            if file == self.logs.path(0) {
                self.backlog.clear();
                let handle = File::open(&file)?;
                let inode = handle.metadata()?.ino();
                self.current = Some((handle, inode));
                break;
            }
            self.backlog.remove(0);
            File::open(&file)?.take(limit as u64).read_to_end(&mut out)?;
        }
        if self.current.is_none() {
            let Ok(mut handle) = File::open(self.logs.path(0)) else { return Ok(out) };
            let inode = handle.metadata()?.ino();
            if out.is_empty() && self.backlog.is_empty() {
                handle.seek(SeekFrom::End(0))?;
            }
            self.current = Some((handle, inode));
        }
        if let Some((handle, inode)) = &mut self.current {
            handle.take((limit - out.len().min(limit)) as u64).read_to_end(&mut out)?;
            // Rotated: what we hold is now `.1`, drained above; switch to the new `.0`.
            let rotated =
                std::fs::metadata(self.logs.path(0)).map(|m| m.ino() != *inode).unwrap_or(false);
            if rotated && out.len() < limit {
                handle.read_to_end(&mut out)?;
                let fresh = File::open(self.logs.path(0))?;
                let fresh_inode = fresh.metadata()?.ino();
                self.current = Some((fresh, fresh_inode));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_rotated_files_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        for (index, text) in [(2, "one\n"), (1, "two\n"), (0, "three\n")] {
            std::fs::write(dir.path().join(format!("web.stdout.{index}")), text).unwrap();
        }
        let logs = TaskLogs::new(dir.path(), "web", Stream::Stdout);
        assert_eq!(logs.read(None, None, 1 << 20).unwrap(), (b"one\ntwo\nthree\n".to_vec(), 14));
        assert_eq!(logs.read(Some(6), None, 1 << 20).unwrap(), (b"o\nthree\n".to_vec(), 14));
        assert_eq!(logs.read(None, Some(6), 1 << 20).unwrap().0, b"three\n");
        assert_eq!(logs.read(Some(2), None, 5).unwrap(), (b"e\ntwo".to_vec(), 7));
        assert_eq!(logs.read(Some(99), None, 10).unwrap(), (Vec::new(), 14));
        let empty = TaskLogs::new(dir.path(), "web", Stream::Stderr);
        assert_eq!(empty.read(None, None, 10).unwrap(), (Vec::new(), 0));
    }

    #[test]
    fn a_follower_sees_appends_and_rotations() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("t.stdout.0");
        std::fs::write(&current, "old\n").unwrap();
        let logs = TaskLogs::new(dir.path(), "t", Stream::Stdout);
        let mut follower = logs.follow(false);
        assert_eq!(follower.poll(1024).unwrap(), b"");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&current)
            .unwrap()
            .write_all(b"new\n")
            .unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"new\n");
        // Rotate: .0 becomes .1 after one more line, and a new .0 starts.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&current)
            .unwrap()
            .write_all(b"last\n")
            .unwrap();
        std::fs::rename(&current, dir.path().join("t.stdout.1")).unwrap();
        std::fs::write(&current, "fresh\n").unwrap();
        assert_eq!(follower.poll(1024).unwrap(), b"last\n");
        assert_eq!(follower.poll(1024).unwrap(), b"fresh\n");

        let mut from_start = logs.follow(true);
        assert_eq!(from_start.poll(1024).unwrap(), b"old\nnew\nlast\nfresh\n");
    }
}
