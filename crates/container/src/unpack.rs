//! Unpacking one layer tarball into a directory in overlayfs's own format: a whiteout
//! (`.wh.<name>`) becomes a 0/0 character device, an opaque directory (`.wh..wh..opq`) the
//! `trusted.overlay.opaque` attribute, so the layer directories can be overlayfs's lower
//! directories as they are.
//!
//! Nothing is written outside the layer's directory: entries with an absolute path or a
//! `..` are refused, a path whose parent is a symlink (made by an earlier entry) is refused
//! rather than followed, hard links must point inside the layer, and every file is made with
//! `O_NOFOLLOW | O_EXCL` after what was there is removed. Symlinks themselves are kept as
//! written: they are read inside the container's root, never followed here.

use crate::digest::Digest;
use crate::error::ContainerError;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Unpacks the layer blob at `blob` (a tar, gzip-compressed or not) into `dest`, which must
/// exist and be empty.
pub(crate) fn unpack_layer(
    blob: &Path,
    digest: &Digest,
    dest: &Path,
) -> Result<(), ContainerError> {
    let mut file = BufReader::new(File::open(blob).map_err(ContainerError::io("open", blob))?);
    let mut magic = [0u8; 2];
    let gzip = match file.get_mut().read_exact(&mut magic) {
        Ok(()) => magic == [0x1f, 0x8b],
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(ContainerError::io("read", blob)(e)),
    };
    let file = {
        let mut inner = file.into_inner();
        io::Seek::rewind(&mut inner).map_err(ContainerError::io("read", blob))?;
        BufReader::new(inner)
    };
    let reader: Box<dyn Read> =
        if gzip { Box::new(flate2::read::GzDecoder::new(file)) } else { Box::new(file) };
    let layer = Layer { digest, dest };
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| layer.bad("(the tar)", e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| layer.bad("(the tar)", e.to_string()))?;
        layer.unpack(&mut entry)?;
    }
    Ok(())
}

struct Layer<'a> {
    digest: &'a Digest,
    dest: &'a Path,
}

impl Layer<'_> {
    fn bad(&self, entry: &str, reason: impl Into<String>) -> ContainerError {
        ContainerError::LayerRefused {
            digest: self.digest.to_string(),
            entry: entry.to_owned(),
            reason: reason.into(),
        }
    }

    fn unpack<R: Read>(&self, entry: &mut tar::Entry<'_, R>) -> Result<(), ContainerError> {
        let raw = entry.path().map_err(|e| self.bad("(a path)", e.to_string()))?.into_owned();
        let shown = raw.display().to_string();
        let relative = self.relative(&raw, &shown)?;
        let Some(name) = relative.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return Ok(()); // The layer's root itself.
        };
        let parent = self.make_parents(relative.parent().unwrap_or(Path::new("")), &shown)?;
        let io = |action| ContainerError::io(action, parent.join(&name));
        if name == OPAQUE {
            return set_xattr(&parent, "trusted.overlay.opaque", b"y")
                .map_err(ContainerError::io("mark opaque", &parent));
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(self.bad(&shown, "a whiteout of nothing"));
            }
            let target = parent.join(hidden);
            remove_any(&target).map_err(ContainerError::io("remove", &target))?;
            return make_node(&target, libc::S_IFCHR, 0)
                .map_err(ContainerError::io("make the whiteout", &target));
        }
        let target = parent.join(&name);
        let header = entry.header();
        let mode = header.mode().map_err(|e| self.bad(&shown, e.to_string()))? & 0o7777;
        let owner = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
        let kind = header.entry_type();
        let existing = fs::symlink_metadata(&target).ok();
        let keep_dir = kind.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir());
        if existing.is_some() && !keep_dir {
            remove_any(&target).map_err(io("replace"))?;
        }
        match kind {
            tar::EntryType::Directory => {
                if !keep_dir {
                    fs::create_dir(&target).map_err(io("make directory"))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&target)
                    .map_err(io("create"))?;
                io::copy(entry, &mut out).map_err(io("write"))?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(|e| self.bad(&shown, e.to_string()))?
                    .ok_or_else(|| self.bad(&shown, "a symlink without a target"))?;
                std::os::unix::fs::symlink(&link, &target).map_err(io("make symlink"))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name()
                    .map_err(|e| self.bad(&shown, e.to_string()))?
                    .ok_or_else(|| self.bad(&shown, "a hard link without a target"))?;
                let link_shown = link.display().to_string();
                let source = self.relative(&link, &link_shown)?;
                let source = self.existing_parents(&source, &link_shown)?;
                match fs::symlink_metadata(&source) {
                    Ok(meta) if !meta.is_dir() => {}
                    _ => {
                        return Err(self.bad(
                            &shown,
                            format!("links to {link_shown:?}, which is not a file of the layer"),
                        ));
                    }
                }
                fs::hard_link(&source, &target).map_err(io("link"))?;
                return Ok(()); // The link shares its source's owner and mode.
            }
            tar::EntryType::Fifo => {
                make_node(&target, libc::S_IFIFO | 0o600, 0).map_err(io("make fifo"))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                // Containers get their devices from the runtime's minimal /dev.
                tracing::debug!(entry = %shown, "skipping a device node in a layer");
                return Ok(());
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => return Ok(()),
            other => return Err(self.bad(&shown, format!("entry type {other:?} is not unpacked"))),
        }
        lchown(&target, owner.0, owner.1).map_err(io("chown"))?;
        if !kind.is_symlink() {
            fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(io("chmod"))?;
        }
        Ok(())
    }

    /// The entry's path relative to the layer: `./` dropped, absolute paths and `..` refused.
    fn relative(&self, raw: &Path, shown: &str) -> Result<PathBuf, ContainerError> {
        let mut relative = PathBuf::new();
        for component in raw.components() {
            match component {
                Component::Normal(part) => relative.push(part),
                Component::CurDir => {}
                Component::ParentDir => return Err(self.bad(shown, "a path with `..`")),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(self.bad(shown, "an absolute path"));
                }
            }
        }
        Ok(relative)
    }

    /// Makes the directories of `relative` under the layer as needed, refusing to pass
    /// through anything that is not a directory (a symlink above all).
    fn make_parents(&self, relative: &Path, shown: &str) -> Result<PathBuf, ContainerError> {
        let mut path = self.dest.to_path_buf();
        for part in relative.components() {
            path.push(part);
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(self.bad(
                        shown,
                        format!(
                            "its parent {} is not a directory",
                            part.as_os_str().to_string_lossy()
                        ),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&path).map_err(ContainerError::io("make directory", &path))?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                        .map_err(ContainerError::io("chmod", &path))?;
                }
                Err(e) => return Err(ContainerError::io("inspect", &path)(e)),
            }
        }
        Ok(path)
    }

    /// `relative` under the layer, if each of its parents is a directory (not a symlink).
    fn existing_parents(&self, relative: &Path, shown: &str) -> Result<PathBuf, ContainerError> {
        let mut path = self.dest.to_path_buf();
        if let Some(parent) = relative.parent() {
            for part in parent.components() {
                path.push(part);
                if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                    return Err(self.bad(
                        shown,
                        "a link through something that is not a directory of the layer",
                    ));
                }
            }
        }
        Ok(path.join(relative.file_name().unwrap_or_default()))
    }
}

/// Removes whatever is at `path` (a tree, a file, a link) without following links.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn make_node(path: &Path, mode: libc::mode_t, device: libc::dev_t) -> io::Result<()> {
    let path = c_path(path)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::mknod(path.as_ptr(), mode, device) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn lchown(path: &Path, uid: u64, gid: u64) -> io::Result<()> {
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

pub(crate) fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let path = c_path(path)?;
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: NUL-terminated strings and a buffer of the given length, all outliving the call.
    let done = unsafe {
        libc::lsetxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}
