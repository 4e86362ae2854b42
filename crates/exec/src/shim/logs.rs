//! Size-rotated log files for one output stream of a task.
//!
//! The current file is always `<stem>.0`; when it reaches the size limit it becomes
//! `<stem>.1`, `.1` becomes `.2`, and so on, and the oldest beyond `max_files` is dropped (the
//! renames replace it). A file never grows past the limit: a write that does not fit is split
//! across the rotation. A new run of the same task appends to the current file.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One stream's files.
#[derive(Debug)]
pub(crate) struct RotatingLog {
    dir: PathBuf,
    stem: String,
    /// 0: never rotate.
    max_bytes: u64,
    max_files: u32,
    file: File,
    size: u64,
}

impl RotatingLog {
    /// Opens (creating or appending to) `<dir>/<stem>.0`.
    pub(crate) fn open(
        dir: &Path,
        stem: String,
        max_bytes: u64,
        max_files: u32,
    ) -> io::Result<RotatingLog> {
        let path = dir.join(format!("{stem}.0"));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingLog {
            dir: dir.to_owned(),
            stem,
            max_bytes,
            max_files: max_files.max(1),
            file,
            size,
        })
    }

    fn path(&self, index: u32) -> PathBuf {
        self.dir.join(format!("{}.{index}", self.stem))
    }

    /// Appends `data`, rotating as often as the limit requires.
    pub(crate) fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.max_bytes > 0 && self.size >= self.max_bytes {
                self.rotate()?;
            }
            let room = if self.max_bytes == 0 {
                data.len()
            } else {
                data.len().min(usize::try_from(self.max_bytes - self.size).unwrap_or(usize::MAX))
            };
            self.file.write_all(&data[..room])?;
            self.size += room as u64;
            data = &data[room..];
        }
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        // Oldest first, so each rename lands on a name already moved on (or dropped).
        for index in (0..self.max_files - 1).rev() {
            match std::fs::rename(self.path(index), self.path(index + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        self.file =
            OpenOptions::new().create(true).write(true).truncate(true).open(self.path(0))?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files of stem `t` in `dir`, `.0` first, as text.
    fn files(dir: &Path) -> Vec<String> {
        (0..10).map_while(|i| std::fs::read_to_string(dir.join(format!("t.{i}"))).ok()).collect()
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
            let mut log =
                RotatingLog::open(dir.path(), "t".into(), *max_bytes, *max_files).unwrap();
            for write in *writes {
                log.write(write.as_bytes()).unwrap();
            }
            assert_eq!(files(dir.path()), *expected, "{max_bytes} {max_files} {writes:?}");
        }
    }

    #[test]
    fn a_new_run_appends_to_the_current_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = RotatingLog::open(dir.path(), "t".into(), 8, 2).unwrap();
        first.write(b"12345").unwrap();
        drop(first);
        let mut second = RotatingLog::open(dir.path(), "t".into(), 8, 2).unwrap();
        second.write(b"6789").unwrap();
        assert_eq!(files(dir.path()), ["9", "12345678"]);
    }
}
