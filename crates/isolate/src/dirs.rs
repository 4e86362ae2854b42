//! Directories that tasks can write, as root works in them.
//!
//! A task can put a symbolic link wherever it may write: in its own directory, in the
//! allocation's shared one (mode 1777), in place of a directory it owns or between the
//! moment root looks at a path and the moment root uses it. Root must therefore never resolve
//! a path through such a directory by name. It opens a directory whose path is its own (the
//! task's directory, the allocation's: no task can write in the directories above them) with
//! [`OpenDir::open`], and everything below it with [`OpenDir`]'s methods, which resolve each
//! component without following a link ([`wharf_nolibc::open_beneath`]: `openat2` with
//! `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`, or one `O_NOFOLLOW` component at a time on
//! kernels before 5.6) and change modes and owners through the open directory (`fchmod`,
//! `fchown`), never through its path. A link where a directory should be is refused
//! ([`IsolateError::NotFollowed`]), never followed.
//!
//! The shim, which has no std, does the same for its log directory with
//! [`wharf_nolibc::open_beneath`] directly.

use crate::error::IsolateError;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use wharf_nolibc::sys::Errno;

/// A directory held open, and the path it was reached by (for messages).
#[derive(Debug)]
pub struct OpenDir {
    file: File,
    path: PathBuf,
}

impl OpenDir {
    /// Opens the directory `path`, which is the agent's: links in it are followed, so only a
    /// path in which no task can write (above the directory itself) belongs here.
    pub fn open(path: impl Into<PathBuf>) -> Result<OpenDir, IsolateError> {
        let path = path.into();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&path)
            .map_err(IsolateError::io(&path))?;
        Ok(OpenDir { file, path })
    }

    /// The path this directory was reached by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the directory `relative` below this one, following no link on the way.
    pub fn open_dir(&self, relative: impl AsRef<Path>) -> Result<OpenDir, IsolateError> {
        let relative = relative.as_ref();
        let path = self.path.join(relative);
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let fd =
            open_beneath(&self.file, relative.as_os_str(), flags).map_err(|e| refusal(&path, e))?;
        Ok(OpenDir { file: File::from(fd), path })
    }

    /// Makes the directory `relative` below this one (its parent must exist) with `mode`,
    /// less the process's umask, unless it exists; opens it, following no link on the way. A
    /// directory that exists keeps its mode: [`OpenDir::set_mode`] sets it.
    pub fn make_dir(&self, relative: impl AsRef<Path>, mode: u32) -> Result<OpenDir, IsolateError> {
        let relative = relative.as_ref();
        let path = self.path.join(relative);
        let (parent, name) = match (relative.parent(), relative.file_name()) {
            (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
                (Some(self.open_dir(parent)?), name)
            }
            (_, Some(name)) => (None, name),
            (_, None) => {
                return Err(IsolateError::Invalid {
                    what: path.display().to_string(),
                    reason: "not a directory name to make".into(),
                });
            }
        };
        let at = parent.as_ref().map_or(&self.file, |parent| &parent.file);
        let name_c = c_string(name).map_err(|e| refusal(&path, e))?;
        // mkdirat never follows a link in the last component: one there is EEXIST, and the
        // open below refuses it.
        match wharf_nolibc::sys::mkdirat(at.as_raw_fd(), &name_c, mode) {
            Ok(()) | Err(Errno(libc::EEXIST)) => {}
            Err(e) => return Err(refusal(&path, e)),
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let fd = open_beneath(at, name, flags).map_err(|e| refusal(&path, e))?;
        Ok(OpenDir { file: File::from(fd), path })
    }

    /// Reads the regular file `relative` below this one, following no link on the way.
    pub fn read_file(&self, relative: impl AsRef<Path>) -> Result<Vec<u8>, IsolateError> {
        use std::io::Read;
        let relative = relative.as_ref();
        let path = self.path.join(relative);
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd =
            open_beneath(&self.file, relative.as_os_str(), flags).map_err(|e| refusal(&path, e))?;
        let mut file = File::from(fd);
        if !file.metadata().map_err(IsolateError::io(&path))?.is_file() {
            return Err(IsolateError::NotFollowed { path });
        }
        let mut contents = Vec::new();
        file.read_to_end(&mut contents).map_err(IsolateError::io(&path))?;
        Ok(contents)
    }

    /// Replaces the file `name` in this directory with `contents` and `mode`, at once: written
    /// to a new file beside it (never one that exists, so never through a link), synced, and
    /// renamed over it.
    pub fn write_file(&self, name: &OsStr, contents: &[u8], mode: u32) -> Result<(), IsolateError> {
        self.write_file_owned(name, contents, mode, None)
    }

    /// [`OpenDir::write_file`], the new file given to `owner` (uid and gid) before it takes
    /// the name.
    pub fn write_file_owned(
        &self,
        name: &OsStr,
        contents: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<(), IsolateError> {
        use std::io::Write;
        let path = self.path.join(name);
        if name.is_empty() || name.as_bytes().contains(&b'/') || name == "." || name == ".." {
            return Err(IsolateError::Invalid {
                what: path.display().to_string(),
                reason: "not a file name".into(),
            });
        }
        let mut temp_name = OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = c_string(&temp_name).map_err(|e| refusal(&path, e))?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
        let dir = self.file.as_raw_fd();
        // A temp file left by a crash is ours to replace.
        // SAFETY: `temp` is a NUL-terminated name and `dir` an open directory.
        unsafe { libc::unlinkat(dir, temp.as_ptr(), 0) };
        let fd = wharf_nolibc::open_beneath(dir, &temp, flags, mode & 0o7777)
            .map_err(|e| refusal(&path, e))?;
        // SAFETY: the descriptor was just opened, and nothing else owns it.
        let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let written = file
            .write_all(contents)
            .and_then(|()| match owner {
                Some((uid, gid)) => std::os::unix::fs::fchown(&file, Some(uid), Some(gid)),
                None => Ok(()),
            })
            // After the owner: a change of owner clears the set-id bits.
            .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777)))
            .and_then(|()| file.sync_all());
        let name_c = c_string(name).map_err(|e| refusal(&path, e))?;
        let renamed = written.and_then(|()| {
            // SAFETY: both names are NUL-terminated and `dir` is an open directory.
            let code = unsafe { libc::renameat(dir, temp.as_ptr(), dir, name_c.as_ptr()) };
            if code == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        });
        if let Err(error) = renamed {
            // SAFETY: as above.
            unsafe { libc::unlinkat(dir, temp.as_ptr(), 0) };
            return Err(IsolateError::Io { path, source: error });
        }
        Ok(())
    }

    /// The directories directly in this one, each opened without following a link. Links,
    /// files and entries that vanish while they are read are left out.
    pub fn subdirs(&self) -> Result<Vec<OpenDir>, IsolateError> {
        let mut subdirs = Vec::new();
        for name in self.names()? {
            match self.open_dir(&name) {
                Ok(dir) => subdirs.push(dir),
                Err(IsolateError::NotFollowed { .. }) => {}
                Err(IsolateError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(subdirs)
    }

    /// The names in this directory (without `.` and `..`), read through its descriptor.
    fn names(&self) -> Result<Vec<OsString>, IsolateError> {
        let io = |e: Errno| IsolateError::Io {
            path: self.path.clone(),
            source: std::io::Error::from_raw_os_error(e.0),
        };
        // A descriptor of its own: reading moves its offset.
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let listing = open_beneath(&self.file, OsStr::new("."), flags).map_err(io)?;
        let mut names = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let filled = wharf_nolibc::sys::getdents(listing.as_raw_fd(), &mut buf).map_err(io)?;
            if filled == 0 {
                return Ok(names);
            }
            // `struct linux_dirent64`: inode (8), offset (8), record length (2), type (1),
            // then the NUL-terminated name.
            let mut at = 0;
            while at + 19 < filled {
                let len = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
                let Some(record) = buf.get(at + 19..at + len) else { break };
                let name = record.split(|b| *b == 0).next().unwrap_or_default();
                if name != b"." && name != b".." {
                    names.push(OsString::from_vec(name.to_vec()));
                }
                at += len.max(1);
            }
        }
    }

    /// Opens the regular file `relative` below this one for reading, following no link on
    /// the way nor at the end, and refusing anything but a regular file (a FIFO, a device, a
    /// socket: opened without blocking, then refused) as [`IsolateError::NotFollowed`].
    pub fn open_file(&self, relative: impl AsRef<Path>) -> Result<File, IsolateError> {
        let relative = relative.as_ref();
        let path = self.path.join(relative);
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        let fd =
            open_beneath(&self.file, relative.as_os_str(), flags).map_err(|e| refusal(&path, e))?;
        let file = File::from(fd);
        if !file.metadata().map_err(IsolateError::io(&path))?.is_file() {
            return Err(IsolateError::NotFollowed { path });
        }
        Ok(file)
    }

    /// The entries of this directory with their own metadata (a link's is the link's, never
    /// its target's), read without following a link. Entries that vanish while they are read
    /// are left out.
    pub fn entries(&self) -> Result<Vec<(OsString, std::fs::Metadata)>, IsolateError> {
        let mut entries = Vec::new();
        for name in self.names()? {
            // One component of a listing holds no `/`, so `openat` cannot leave this
            // directory; O_PATH with O_NOFOLLOW opens a link itself, and reads nothing.
            let Ok(name_c) = c_string(&name) else { continue };
            let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            let Ok(fd) = wharf_nolibc::sys::openat(self.file.as_raw_fd(), &name_c, flags, 0) else {
                continue;
            };
            // SAFETY: the descriptor was just opened, and nothing else owns it.
            let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            if let Ok(meta) = file.metadata() {
                entries.push((name, meta));
            }
        }
        Ok(entries)
    }

    /// Gives what root owns below this directory (the agent made it there for the task) to
    /// `uid` and `gid`: each directory, and each regular file that has no other link (another
    /// link may be the name of a file the task must not have); at most `limit` entries are
    /// looked at, `skip` ones are left alone with what is below them, and nothing is
    /// followed. Ownership is changed through a descriptor of the very entry looked at.
    /// Returns how many entries changed hands.
    pub fn hand_over_below(
        &self,
        uid: u32,
        gid: u32,
        limit: usize,
        skip: &dyn Fn(&Path) -> bool,
    ) -> Result<usize, IsolateError> {
        let mut changed = 0;
        let mut budget = limit;
        let mut pending = Vec::new();
        let mut dir = Some(self.open_dir(".")?);
        while let Some(current) = dir.take().or_else(|| pending.pop()) {
            for name in current.names()? {
                if budget == 0 {
                    return Ok(changed);
                }
                budget -= 1;
                let path = current.path.join(&name);
                if skip(&path) {
                    continue;
                }
                let Ok(name_c) = c_string(&name) else { continue };
                let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                let Ok(fd) = wharf_nolibc::sys::openat(current.file.as_raw_fd(), &name_c, flags, 0)
                else {
                    continue;
                };
                // SAFETY: the descriptor was just opened, and nothing else owns it.
                let entry = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                let Ok(meta) = entry.metadata() else { continue };
                let root_made =
                    meta.uid() == 0 && (meta.is_dir() || (meta.is_file() && meta.nlink() == 1));
                if root_made {
                    // SAFETY: an empty NUL-terminated name and an open descriptor; with
                    // AT_EMPTY_PATH the call changes the descriptor's own inode.
                    let code = unsafe {
                        libc::fchownat(
                            entry.as_raw_fd(),
                            c"".as_ptr(),
                            uid,
                            gid,
                            libc::AT_EMPTY_PATH,
                        )
                    };
                    if code != 0 {
                        return Err(IsolateError::io(&path)(std::io::Error::last_os_error()));
                    }
                    changed += 1;
                }
                if meta.is_dir() {
                    match current.open_dir(&name) {
                        Ok(below) => pending.push(below),
                        Err(IsolateError::NotFollowed { .. }) => {}
                        Err(IsolateError::Io { source, .. })
                            if source.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(changed)
    }

    /// The directory's metadata, read through its descriptor.
    pub fn metadata(&self) -> Result<std::fs::Metadata, IsolateError> {
        self.file.metadata().map_err(IsolateError::io(&self.path))
    }

    /// Sets the directory's mode (permission bits, sticky, set-id) to `mode`, through its
    /// descriptor, unless it is that already.
    pub fn set_mode(&self, mode: u32) -> Result<(), IsolateError> {
        if self.metadata()?.mode() & 0o7777 != mode {
            self.file
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(IsolateError::io(&self.path))?;
        }
        Ok(())
    }

    /// Sets the mode of the socket `name` in this directory through a descriptor of the entry
    /// itself (`O_PATH`, no link followed), so that whoever can write the directory cannot
    /// turn the change onto another file: anything but a socket there is refused.
    pub fn set_socket_mode(&self, name: &OsStr, mode: u32) -> Result<(), IsolateError> {
        let path = self.path.join(name);
        let name_c = c_string(name).map_err(|errno| refusal(&path, errno))?;
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = wharf_nolibc::sys::openat(self.file.as_raw_fd(), &name_c, flags, 0)
            .map_err(|errno| refusal(&path, errno))?;
        // SAFETY: the descriptor was just opened, and nothing else owns it.
        let entry = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let meta = entry.metadata().map_err(IsolateError::io(&path))?;
        if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
            return Err(IsolateError::io(&path)(std::io::Error::other("not a socket")));
        }
        // A descriptor opened with O_PATH takes no fchmod; its /proc link names the same
        // inode, the entry opened above and not whatever has the name now.
        let by_descriptor = format!("/proc/self/fd/{}", entry.as_raw_fd());
        std::fs::set_permissions(by_descriptor, std::fs::Permissions::from_mode(mode))
            .map_err(IsolateError::io(&path))
    }

    /// Gives the directory to `uid` and `gid`, through its descriptor, unless they own it
    /// already.
    pub fn set_owner(&self, uid: u32, gid: u32) -> Result<(), IsolateError> {
        let meta = self.metadata()?;
        if (meta.uid(), meta.gid()) != (uid, gid) {
            std::os::unix::fs::fchown(&self.file, Some(uid), Some(gid))
                .map_err(IsolateError::io(&self.path))?;
        }
        Ok(())
    }
}

/// [`wharf_nolibc::open_beneath`] on a std directory, as an owned descriptor.
fn open_beneath(dir: &File, relative: &OsStr, flags: i32) -> Result<OwnedFd, Errno> {
    let relative = c_string(relative)?;
    let fd = wharf_nolibc::open_beneath(dir.as_raw_fd(), &relative, flags, 0)?;
    // SAFETY: the descriptor was just opened, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn c_string(text: &OsStr) -> Result<CString, Errno> {
    CString::new(text.as_bytes()).map_err(|_| Errno(libc::EINVAL))
}

/// The error for `path`: a refusal where a link (or something else than a directory) was
/// met, the kernel's error otherwise.
fn refusal(path: &Path, errno: Errno) -> IsolateError {
    match errno.0 {
        libc::ELOOP | libc::ENOTDIR | libc::EXDEV => {
            IsolateError::NotFollowed { path: path.to_owned() }
        }
        code => IsolateError::Io {
            path: path.to_owned(),
            source: std::io::Error::from_raw_os_error(code),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sockets_mode_is_set_through_the_entry_and_a_link_in_its_place_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = OpenDir::open(dir.path()).unwrap();
        let socket = std::os::unix::net::UnixDatagram::bind(dir.path().join("s")).unwrap();
        open.set_socket_mode(OsStr::new("s"), 0o666).unwrap();
        assert_eq!(mode(&dir.path().join("s")), 0o666);
        drop(socket);
        let target = dir.path().join("target");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::remove_file(dir.path().join("s")).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("s")).unwrap();
        assert!(open.set_socket_mode(OsStr::new("s"), 0o666).is_err(), "a link is refused");
        assert!(open.set_socket_mode(OsStr::new("target"), 0o666).is_err(), "a file is refused");
        assert_eq!(mode(&target), 0o600, "nothing changed through the link");
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn what_root_made_below_is_handed_over_but_no_link_nor_a_file_linked_twice() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let task = root.path().join("task");
        std::fs::create_dir_all(task.join("local/conf")).unwrap();
        std::fs::create_dir_all(task.join("logs")).unwrap();
        std::fs::write(task.join("local/conf/app.conf"), "").unwrap();
        std::fs::write(task.join("top"), "").unwrap();
        std::fs::write(task.join("logs/out"), "").unwrap();
        std::fs::write(outside.path().join("precious"), "").unwrap();
        std::fs::hard_link(outside.path().join("precious"), task.join("local/linked")).unwrap();
        std::os::unix::fs::symlink(outside.path(), task.join("local/away")).unwrap();
        let dir = OpenDir::open(&task).unwrap();
        let logs = task.join("logs");
        let changed = dir.hand_over_below(4242, 4343, 100, &|p| p == logs).unwrap();
        let owner = |p: &Path| {
            let meta = std::fs::symlink_metadata(p).unwrap();
            (meta.uid(), meta.gid())
        };
        for handed in ["local", "local/conf", "local/conf/app.conf", "top"] {
            assert_eq!(owner(&task.join(handed)), (4242, 4343), "{handed}");
        }
        assert_eq!(changed, 4);
        for kept in ["logs", "logs/out", "local/linked", "local/away"] {
            assert_eq!(owner(&task.join(kept)), (0, 0), "{kept}");
        }
        assert_eq!(owner(outside.path()), (0, 0));
        assert_eq!(owner(&outside.path().join("precious")), (0, 0));
        assert_eq!(dir.hand_over_below(5, 5, 0, &|_| false).unwrap(), 0, "nothing past the limit");
        assert_eq!(owner(&logs), (0, 0));
    }

    #[test]
    fn files_are_written_whole_with_their_mode_and_never_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("target");
        std::fs::write(&target, "theirs").unwrap();
        std::os::unix::fs::symlink(&target, root.path().join("out")).unwrap();
        let dir = OpenDir::open(root.path()).unwrap();
        assert!(matches!(dir.read_file("out"), Err(IsolateError::NotFollowed { .. })));
        dir.write_file(OsStr::new("out"), b"ours", 0o777).unwrap();
        // The link was replaced, not followed.
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
        assert_eq!(dir.read_file("out").unwrap(), b"ours");
        assert_eq!(mode(&root.path().join("out")), 0o777);
        dir.write_file(OsStr::new("out"), b"again", 0o600).unwrap();
        assert_eq!(dir.read_file("out").unwrap(), b"again");
        assert_eq!(mode(&root.path().join("out")), 0o600);
        assert!(dir.write_file(OsStr::new("a/b"), b"", 0o600).is_err());
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1, "no temp file is left");
    }

    #[test]
    fn links_in_a_task_writable_directory_are_refused_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        let task = root.path().join("task");
        std::fs::create_dir_all(task.join("local")).unwrap();
        std::fs::write(task.join("file"), "").unwrap();
        std::os::unix::fs::symlink(outside.path(), task.join("secrets")).unwrap();
        let dir = OpenDir::open(&task).unwrap();

        for (what, result) in [
            ("open", dir.open_dir("secrets").map(drop)),
            ("open below", dir.open_dir("secrets/x").map(drop)),
            ("make", dir.make_dir("secrets", 0o700).map(drop)),
            ("make below", dir.make_dir("secrets/x", 0o700).map(drop)),
            ("a file", dir.open_dir("file").map(drop)),
            ("above", dir.open_dir("../task").map(drop)),
        ] {
            match result {
                Err(IsolateError::NotFollowed { path }) => {
                    assert!(path.starts_with(&task), "{what}: {}", path.display());
                    assert!(
                        IsolateError::NotFollowed { path }.to_string().contains("symbolic link"),
                        "{what}"
                    );
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        assert_eq!(mode(outside.path()), 0o750);
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

        let names = |dirs: Vec<OpenDir>| {
            let mut names: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_owned()).collect();
            names.sort();
            names
        };
        let made = dir.make_dir("logs", 0o700).unwrap();
        made.set_mode(0o1777).unwrap();
        assert_eq!(mode(&task.join("logs")), 0o1777);
        assert_eq!(dir.make_dir("logs", 0o700).unwrap().path(), task.join("logs"), "made twice");
        assert_eq!(mode(&task.join("logs")), 0o1777, "a directory made already keeps its mode");
        dir.make_dir("logs/inner", 0o755).unwrap();
        assert_eq!(names(dir.subdirs().unwrap()), [task.join("local"), task.join("logs")]);
        assert_eq!(dir.open_dir("logs/inner").unwrap().path(), task.join("logs/inner"));
        dir.open_dir("local").unwrap().set_owner(4242, 4243).unwrap();
        let meta = std::fs::metadata(task.join("local")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4242, 4243));

        match OpenDir::open(root.path().join("missing")) {
            Err(IsolateError::Io { path, source }) => {
                assert!(path.ends_with("missing"));
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn open_file_reads_regular_files_only_and_entries_show_links_as_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/file"), "mine").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("dirlink")).unwrap();
        let fifo = CString::new(dir.path().join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let open = OpenDir::open(dir.path()).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut open.open_file("sub/file").unwrap(), &mut text).unwrap();
        assert_eq!(text, "mine");
        // A FIFO would block a read forever: it is refused at once.
        for refused in ["link", "dirlink/secret", "fifo", "sub"] {
            assert!(
                matches!(open.open_file(refused), Err(IsolateError::NotFollowed { .. })),
                "{refused} was opened"
            );
        }
        let entries: std::collections::BTreeMap<String, bool> = open
            .entries()
            .unwrap()
            .into_iter()
            .map(|(name, meta)| {
                (name.to_string_lossy().into_owned(), meta.file_type().is_symlink())
            })
            .collect();
        let expected = [("dirlink", true), ("fifo", false), ("link", true), ("sub", false)];
        assert_eq!(entries, expected.into_iter().map(|(n, l)| (n.to_owned(), l)).collect());
    }
}
