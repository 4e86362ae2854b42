//! Size-rotated log files for one output stream of a task.
//!
//! The current file is always `<task>.<stream>.0`; when it reaches the size limit it becomes
//! `<task>.<stream>.1`, `.1` becomes `.2`, and so on, and the oldest beyond `max_files` is dropped (the
//! renames replace it). A file never grows past the limit: a write that does not fit is split
//! across the rotation. A new run of the same task appends to the current file. Files are
//! opened without following a link, relative to the log directory's descriptor.

use super::text::Line;
use core::fmt::Write;
use wharf_nolibc::sys::{self, Errno};

/// A file name: the task's name, the stream's and an index, with dots between.
type Name = Line<320>;

/// One stream's files.
#[derive(Debug)]
pub(crate) struct RotatingLog<'a> {
    /// The log directory (a descriptor this value does not own).
    dir: i32,
    /// The task's part of the names, borrowed rather than copied: the shim keeps a long-lived
    /// value small, as its stack pages are private memory.
    task: &'a [u8],
    stream: &'a str,
    /// 0: never rotate.
    max_bytes: u64,
    max_files: u32,
    file: i32,
    size: u64,
}

impl<'a> RotatingLog<'a> {
    /// Opens (creating or appending to) `<task>.<stream>.0` in the directory `dir`.
    pub(crate) fn open(
        dir: i32,
        task: &'a [u8],
        stream: &'a str,
        max_bytes: u64,
        max_files: u32,
    ) -> Result<RotatingLog<'a>, Errno> {
        let mut log = RotatingLog {
            dir,
            task,
            stream,
            max_bytes,
            max_files: max_files.max(1),
            file: -1,
            size: 0,
        };
        log.file = log.open_current(sys::O_APPEND)?;
        log.size = sys::seek_end(log.file)?;
        Ok(log)
    }

    fn name(&self, index: u32) -> Result<Name, Errno> {
        let mut name = Name::new();
        name.push(self.task);
        let _ = write!(name, ".{}.{index}", self.stream);
        Ok(name)
    }

    fn open_current(&self, mode: i32) -> Result<i32, Errno> {
        let mut name = self.name(0)?;
        let name = name.c_str().ok_or(Errno(sys::EINVAL))?;
        let flags = sys::O_WRONLY | sys::O_CREAT | sys::O_NOFOLLOW | sys::O_CLOEXEC | mode;
        sys::openat(self.dir, name, flags, 0o644)
    }

    /// Appends `data`, rotating as often as the limit requires.
    pub(crate) fn write(&mut self, mut data: &[u8]) -> Result<(), Errno> {
        while !data.is_empty() {
            if self.max_bytes > 0 && self.size >= self.max_bytes {
                self.rotate()?;
            }
            let room = if self.max_bytes == 0 {
                data.len()
            } else {
                data.len().min(usize::try_from(self.max_bytes - self.size).unwrap_or(usize::MAX))
            };
            sys::write_all(self.file, &data[..room])?;
            self.size += room as u64;
            data = &data[room..];
        }
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), Errno> {
        // Oldest first, so each rename lands on a name already moved on (or dropped).
        for index in (0..self.max_files - 1).rev() {
            let (mut from, mut to) = (self.name(index)?, self.name(index + 1)?);
            let (Some(from), Some(to)) = (from.c_str(), to.c_str()) else {
                return Err(Errno(sys::EINVAL));
            };
            match sys::renameat(self.dir, from, to) {
                Ok(()) | Err(Errno(sys::ENOENT)) => {}
                Err(e) => return Err(e),
            }
        }
        let file = self.open_current(sys::O_TRUNC)?;
        sys::close(core::mem::replace(&mut self.file, file));
        self.size = 0;
        Ok(())
    }
}

impl Drop for RotatingLog<'_> {
    fn drop(&mut self) {
        sys::close(self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::path::Path;

    /// The stdout files of task `t` in `dir`, `.0` first, as text.
    fn files(dir: &Path) -> Vec<String> {
        (0..10)
            .map_while(|i| std::fs::read_to_string(dir.join(format!("t.stdout.{i}"))).ok())
            .collect()
    }

    fn open(dir: &std::fs::File, max_bytes: u64, max_files: u32) -> RotatingLog<'static> {
        RotatingLog::open(dir.as_raw_fd(), b"t", "stdout", max_bytes, max_files).unwrap()
    }

    #[test]
    fn rotation_keeps_the_newest_bytes_in_bounded_files() {
        // (max bytes, max files, writes, files expected afterwards, .0 first)
        let cases: &[(u64, u32, &[&str], &[&str])] = &[
            (10, 3, &["0123456789abcdefghij", "ABCDE"], &["ABCDE", "abcdefghij", "0123456789"]),
            (
                10,
                3,
                &["0123456789abcdefghijklmnopqrstuvwxyz"],
                &["uvwxyz", "klmnopqrst", "abcdefghij"],
            ),
            (4, 2, &["ab", "cd", "ef"], &["ef", "abcd"]),
            (4, 1, &["abcdef"], &["ef"]),
            (0, 3, &["no limit ", "at all"], &["no limit at all"]),
            (10, 2, &[], &[""]),
        ];
        for (max_bytes, max_files, writes, expected) in cases {
            let dir = tempfile::tempdir().unwrap();
            let handle = std::fs::File::open(dir.path()).unwrap();
            let mut log = open(&handle, *max_bytes, *max_files);
            for write in *writes {
                log.write(write.as_bytes()).unwrap();
            }
            assert_eq!(files(dir.path()), *expected, "{max_bytes} {max_files} {writes:?}");
        }
    }

    #[test]
    fn a_new_run_appends_to_the_current_file() {
        let dir = tempfile::tempdir().unwrap();
        let handle = std::fs::File::open(dir.path()).unwrap();
        let mut first = open(&handle, 8, 2);
        first.write(b"12345").unwrap();
        drop(first);
        let mut second = open(&handle, 8, 2);
        second.write(b"6789").unwrap();
        assert_eq!(files(dir.path()), ["9", "12345678"]);
    }

    #[test]
    fn a_link_in_place_of_the_log_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("t.stdout.0");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), log).unwrap();
        let handle = std::fs::File::open(dir.path()).unwrap();
        assert!(RotatingLog::open(handle.as_raw_fd(), b"t", "stdout", 8, 2).is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }
}
