//! Putting fetched bytes in place: archives unpacked (tar, tar.gz, zip, gz) so that nothing
//! lands outside the destination, within a budget of bytes and entries.
//!
//! Synchronous (run on a blocking thread). The rules, each refused with the entry's name:
//! - an entry's name is relative and has no `..` (a leading `/` or `./` is not stripped into
//!   something else: an absolute name is refused);
//! - nothing is written through a link: every directory above an entry must be a real
//!   directory, and a file or link already at the entry's place is replaced, not followed;
//! - a symbolic link's target is relative and, resolved from the link's own directory, stays
//!   inside; once every entry is out, every link that resolves to something is checked again
//!   on the real file system, which also catches a chain of links leading out;
//! - a hard link names an entry already unpacked;
//! - devices, fifos and other special entries are refused.

use crate::zip;
use flate2::read::{GzDecoder, MultiGzDecoder};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The archive formats, told apart by the source's file name as go-getter does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Tar,
    TarGz,
    Zip,
    Gz,
}

impl Kind {
    /// The format `name` ends in, if any.
    pub(crate) fn of(name: &str) -> Option<Kind> {
        let name = name.to_ascii_lowercase();
        if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            Some(Kind::TarGz)
        } else if name.ends_with(".tar") {
            Some(Kind::Tar)
        } else if name.ends_with(".zip") {
            Some(Kind::Zip)
        } else if name.ends_with(".gz") {
            Some(Kind::Gz)
        } else {
            None
        }
    }
}

/// What unpacking may produce at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub(crate) bytes: u64,
    pub(crate) entries: u64,
}

/// One destination directory being filled.
pub(crate) struct Unpacker {
    root: PathBuf,
    budget: Budget,
    links: Vec<PathBuf>,
}

impl Unpacker {
    /// Unpacks into `root`, an existing directory.
    pub(crate) fn new(root: &Path, budget: Budget) -> Unpacker {
        Unpacker { root: root.to_owned(), budget, links: Vec::new() }
    }

    /// Unpacks `archive` of `kind`; `name` is the source's file name (for `.gz`, the file
    /// written is that name without `.gz`).
    pub(crate) fn unpack(mut self, kind: Kind, archive: &Path, name: &str) -> Result<(), String> {
        let file = File::open(archive).map_err(|e| format!("cannot open the download: {e}"))?;
        match kind {
            Kind::Tar => self.tar(file)?,
            Kind::TarGz => self.tar(GzDecoder::new(file))?,
            Kind::Zip => zip::unpack(file, &mut self)?,
            Kind::Gz => {
                let stem = &name[..name.len() - 3];
                let stem = if stem.is_empty() { "artifact" } else { stem };
                self.file(stem, &mut MultiGzDecoder::new(file), 0o644)?;
            }
        }
        self.check_links()
    }

    fn tar(&mut self, reader: impl Read) -> Result<(), String> {
        let mut archive = tar::Archive::new(reader);
        let entries = archive.entries().map_err(|e| format!("not a tar archive: {e}"))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| format!("a damaged tar entry: {e}"))?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let mode = entry.header().mode().unwrap_or(0o644);
            let link = entry.link_name_bytes().map(|l| String::from_utf8_lossy(&l).into_owned());
            use tar::EntryType;
            match entry.header().entry_type() {
                EntryType::Regular | EntryType::Continuous => self.file(&name, &mut entry, mode)?,
                EntryType::Directory => self.dir(&name)?,
                EntryType::Symlink => self.symlink(&name, link.as_deref().unwrap_or(""))?,
                EntryType::Link => self.hard_link(&name, link.as_deref().unwrap_or(""))?,
                EntryType::XGlobalHeader => {}
                other => return Err(format!("entry {name:?} is of a refused kind ({other:?})")),
            }
        }
        Ok(())
    }

    fn count_entry(&mut self, name: &str) -> Result<(), String> {
        if self.budget.entries == 0 {
            return Err(format!("too many entries (at {name:?})"));
        }
        self.budget.entries -= 1;
        Ok(())
    }

    /// The path of entry `name` under the root, its parents made as real directories.
    fn place(&mut self, name: &str) -> Result<PathBuf, String> {
        self.count_entry(name)?;
        let parts = relative_parts(name)?;
        let Some((last, parents)) = parts.split_last() else {
            return Err(format!("entry {name:?} has no name"));
        };
        let mut path = self.root.clone();
        for part in parents {
            path.push(part);
            self.real_dir(&path, name)?;
        }
        path.push(last);
        // What an earlier entry left here is replaced, never followed.
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => fs::remove_file(&path).map_err(|e| format!("{name:?}: {e}"))?,
            Err(_) => {}
        }
        Ok(path)
    }

    /// Makes `path` a directory, refusing a link in its place.
    fn real_dir(&self, path: &Path, name: &str) -> Result<(), String> {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(()),
            Ok(_) => Err(format!("entry {name:?} would be written through a link or file")),
            Err(_) => fs::create_dir(path).map_err(|e| format!("{name:?}: {e}")),
        }
    }

    pub(crate) fn dir(&mut self, name: &str) -> Result<(), String> {
        let path = self.place(name)?;
        self.real_dir(&path, name)
    }

    /// Writes a regular file from `content`, counted against the byte budget.
    pub(crate) fn file(
        &mut self,
        name: &str,
        content: &mut dyn Read,
        mode: u32,
    ) -> Result<(), String> {
        let path = self.place(name)?;
        if path.is_dir() {
            return Err(format!("entry {name:?} is a file where a directory is"));
        }
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{name:?}: {e}"))?;
        let limit = self.budget.bytes;
        let copied = io::copy(&mut content.take(limit.saturating_add(1)), &mut out)
            .map_err(|e| format!("{name:?}: {e}"))?;
        if copied > limit {
            return Err("the unpacked archive is larger than the limit".into());
        }
        self.budget.bytes -= copied;
        out.flush().map_err(|e| format!("{name:?}: {e}"))?;
        // No set-id bits: the task gets files, not privileges.
        fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| format!("{name:?}: {e}"))
    }

    fn symlink(&mut self, name: &str, target: &str) -> Result<(), String> {
        let parents = relative_parts(name)?;
        if !target_stays_inside(&parents[..parents.len().saturating_sub(1)], target) {
            return Err(format!("link {name:?} -> {target:?} leads outside the destination"));
        }
        let path = self.place(name)?;
        std::os::unix::fs::symlink(target, &path).map_err(|e| format!("{name:?}: {e}"))?;
        self.links.push(path);
        Ok(())
    }

    fn hard_link(&mut self, name: &str, target: &str) -> Result<(), String> {
        let mut source = self.root.clone();
        let parts = relative_parts(target)
            .map_err(|_| format!("hard link {name:?} -> {target:?} leads outside"))?;
        for (i, part) in parts.iter().enumerate() {
            source.push(part);
            let meta = fs::symlink_metadata(&source)
                .map_err(|_| format!("hard link {name:?} names {target:?}, not unpacked"))?;
            let last = i + 1 == parts.len();
            if (!last && !meta.is_dir()) || (last && !meta.is_file()) {
                return Err(format!("hard link {name:?} -> {target:?} is refused"));
            }
        }
        let path = self.place(name)?;
        fs::hard_link(&source, &path).map_err(|e| format!("{name:?}: {e}"))
    }

    /// Every link that resolves, resolved on the real file system, must stay inside.
    fn check_links(&self) -> Result<(), String> {
        let root = fs::canonicalize(&self.root).map_err(|e| format!("{e}"))?;
        for link in &self.links {
            if let Ok(resolved) = fs::canonicalize(link)
                && !resolved.starts_with(&root)
            {
                let name = link.strip_prefix(&self.root).unwrap_or(link);
                return Err(format!("link {} leads outside the destination", name.display()));
            }
        }
        Ok(())
    }
}

impl zip::Entries for Unpacker {
    fn dir(&mut self, name: &str) -> Result<(), String> {
        Unpacker::dir(self, name)
    }
    fn file(&mut self, name: &str, content: &mut dyn Read, mode: u32) -> Result<(), String> {
        Unpacker::file(self, name, content, mode)
    }
    fn symlink(&mut self, name: &str, target: &str) -> Result<(), String> {
        Unpacker::symlink(self, name, target)
    }
}

/// The parts of an entry name: relative, no `..`; `.` and empty parts dropped.
fn relative_parts(name: &str) -> Result<Vec<&str>, String> {
    if name.starts_with('/') || name.contains('\0') {
        return Err(format!("entry {name:?} is an absolute path"));
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("entry {name:?} leads outside the destination")),
            part => parts.push(part),
        }
    }
    Ok(parts)
}

/// Whether `target`, resolved from the directory `dir` (parts below the root), stays inside.
fn target_stays_inside(dir: &[&str], target: &str) -> bool {
    if target.starts_with('/') || target.is_empty() {
        return false;
    }
    let mut depth = dir.len();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." if depth == 0 => return false,
            ".." => depth -= 1,
            _ => depth += 1,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_file_name() {
        let table = [
            ("app.tar.gz", Some(Kind::TarGz)),
            ("APP.TGZ", Some(Kind::TarGz)),
            ("app.tar", Some(Kind::Tar)),
            ("app.zip", Some(Kind::Zip)),
            ("notes.txt.gz", Some(Kind::Gz)),
            ("app.conf", None),
            ("tarball", None),
        ];
        for (name, kind) in table {
            assert_eq!(Kind::of(name), kind, "{name}");
        }
    }

    #[test]
    fn names_and_link_targets_stay_inside() {
        assert_eq!(relative_parts("./a//b/./c").unwrap(), ["a", "b", "c"]);
        assert!(relative_parts("/etc/passwd").is_err());
        assert!(relative_parts("a/../../b").is_err());
        assert!(relative_parts("a/../b").is_err(), "no `..` at all, even one that stays");
        let table = [
            (&[][..], "x", true),
            (&[][..], "../x", false),
            (&["a"][..], "../x", true),
            (&["a"][..], "../../x", false),
            (&["a", "b"][..], "./../c/../../d", true),
            (&[][..], "/etc", false),
            (&[][..], "", false),
        ];
        for (dir, target, inside) in table {
            assert_eq!(target_stays_inside(dir, target), inside, "{dir:?} {target}");
        }
    }
}
