#![doc = include_str!("../README.md")]
//!
//! ## Inside
//!
//! - [`sys`]: the raw system calls (x86_64 and aarch64), each behind a small function that
//!   returns an [`sys::Errno`] on failure, with the constants they take;
//! - [`join_cgroup`]: how a process joins a cgroup with one write and no allocation, between
//!   the clone and the exec of a task;
//! - [`open_beneath`]: how root opens a path in a directory a task can write, following no
//!   link the task may have put there;
//! - [`contain`]: the mounts and Landlock rules a task's process makes between its clone and
//!   its exec.
//!
//! Everything uses `core` alone and allocates nothing, so it works in a program with no C
//! library and no allocator (wharf-exec's static shim) as well as in an ordinary std program
//! (wharf-exec's `wharf-shim` binary, wharf-isolate's `dirs`, this crate's tests).

#![no_std]

#[cfg(not(target_os = "linux"))]
compile_error!("wharf-nolibc makes Linux system calls");

// The tests use std (temporary directories, `std::process::id`).
#[cfg(test)]
extern crate std;

/// The path of this crate's root file, for a build script that compiles the crate itself into a
/// program cargo cannot build: one with `panic=abort`, no C library and flags of its own, such
/// as wharf-exec's static shim (its build script compiles this file with `rustc --crate-type
/// rlib` and links the result with `--extern wharf_nolibc=...`). This is the one supported way
/// to build the crate outside cargo: compile this file as the crate's root, never a file of it
/// as a module of another crate.
pub const LIB_RS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs");

pub mod contain;
pub mod sys;

use core::ffi::CStr;
use sys::Errno;

/// Moves the calling process into a cgroup by writing `0`, the writer itself, into `file`: v1's
/// `tasks` (the calling thread, which is the whole of a process with one thread) or v2's
/// `cgroup.procs` (wharf-isolate's `TaskCgroup::join_files` names them). Allocates nothing:
/// safe in the child of a vfork-style clone, which has one thread.
pub fn join_cgroup(file: &CStr) -> Result<(), Errno> {
    let fd = sys::open(file, sys::O_WRONLY | sys::O_CLOEXEC, 0)?;
    let written = sys::write(fd, b"0");
    sys::close(fd);
    written.map(drop)
}

/// Opens `path`, relative to the directory `dir`, as root must inside a directory a task can
/// write: no component of `path` may be a symbolic link (a task could have put one there to
/// aim root's call at any file on the host), and `path` must stay beneath `dir`. A link is
/// refused with `ELOOP` (or `ENOTDIR`, for one in place of a directory on the older kernels
/// below), an absolute path or a `..` component with `EXDEV`, an empty path with `ENOENT`.
///
/// `openat2` (Linux 5.6) checks every component in one call; where the kernel lacks it
/// (`ENOSYS`) the path is opened a component at a time, each with `O_NOFOLLOW` and relative
/// to the one before, which is as safe and a little slower. `flags` must not hold `O_PATH`
/// without `O_DIRECTORY` (`EINVAL`): with `O_NOFOLLOW` such a handle would name a link rather
/// than refuse it.
pub fn open_beneath(dir: i32, path: &CStr, flags: i32, mode: u32) -> Result<i32, Errno> {
    let bytes = path.to_bytes();
    if bytes.is_empty() {
        return Err(Errno(sys::ENOENT));
    }
    if bytes[0] == b'/' || bytes.split(|b| *b == b'/').any(|component| component == b"..") {
        return Err(Errno(sys::EXDEV));
    }
    if flags & sys::O_PATH != 0 && flags & sys::O_DIRECTORY == 0 {
        return Err(Errno(sys::EINVAL));
    }
    let resolve = sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_BENEATH;
    match sys::openat2(dir, path, flags, mode, resolve) {
        Err(Errno(sys::ENOSYS)) => open_each_component(dir, bytes, flags, mode),
        opened => opened,
    }
}

/// [`open_beneath`] without `openat2`: each directory on the way opened with `O_NOFOLLOW`
/// relative to the one before, then the last component with `flags` and `O_NOFOLLOW`. `path`
/// is relative, non-empty and free of `..`.
#[cold]
#[inline(never)]
fn open_each_component(dir: i32, path: &[u8], flags: i32, mode: u32) -> Result<i32, Errno> {
    let mut components =
        path.split(|b| *b == b'/').filter(|c| !c.is_empty() && *c != b".").peekable();
    // A path of `.` alone names `dir` itself.
    let mut component: &[u8] = components.next().unwrap_or(b".");
    let mut at = dir;
    loop {
        let last = components.peek().is_none();
        let mut name = [0u8; 256];
        // Longer than a file name can be (the last byte must stay the NUL).
        let opened = if component.len() >= name.len() {
            Err(Errno(sys::ENAMETOOLONG))
        } else {
            name[..component.len()].copy_from_slice(component);
            match CStr::from_bytes_until_nul(&name) {
                Ok(name) if last => sys::openat(at, name, flags | sys::O_NOFOLLOW, mode),
                Ok(name) => {
                    let through = sys::O_PATH | sys::O_DIRECTORY | sys::O_NOFOLLOW;
                    sys::openat(at, name, through | sys::O_CLOEXEC, 0)
                }
                Err(_) => Err(Errno(sys::EINVAL)),
            }
        };
        if at != dir {
            sys::close(at);
        }
        match (opened, components.next()) {
            (Ok(fd), Some(next)) => (at, component) = (fd, next),
            (opened, _) => return opened,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn system_calls_report_errors_as_errno() {
        assert_eq!(join_cgroup(c"/nonexistent/cgroup.procs"), Err(Errno(sys::ENOENT)));
        let (read, write) = sys::pipe().unwrap();
        assert_eq!(sys::write(write, b"abc"), Ok(3));
        let mut buf = [0u8; 8];
        assert_eq!(sys::read(read, &mut buf), Ok(3));
        assert_eq!(&buf[..3], b"abc");
        sys::close(write);
        assert_eq!(sys::read(read, &mut buf), Ok(0));
        sys::close(read);
        assert_eq!(sys::write(-1, b"x"), Err(Errno(sys::EBADF)));
        assert_eq!(sys::getpid(), std::process::id() as i32);
    }

    /// `open_beneath` through `openat2` and through the component walk older kernels get: the
    /// same answers, and no link followed anywhere in the path.
    #[test]
    fn open_beneath_follows_no_link_and_stays_beneath() {
        use std::ffi::CString;
        use std::os::fd::AsRawFd;
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/file"), "inside").unwrap();
        std::fs::write(outside.path().join("file"), "outside").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("file"), root.path().join("a/flink"))
            .unwrap();
        let dir = std::fs::File::open(root.path()).unwrap();
        let read = sys::O_RDONLY | sys::O_CLOEXEC;
        let create = sys::O_WRONLY | sys::O_CREAT | sys::O_EXCL | sys::O_CLOEXEC;
        let through = sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC;
        let walk = |path: &CStr, flags, mode| {
            let bytes = path.to_bytes();
            open_each_component(dir.as_raw_fd(), bytes, flags, mode)
        };
        type Open<'a> = &'a dyn Fn(&CStr, i32, u32) -> Result<i32, Errno>;
        let beneath = |path: &CStr, flags, mode| open_beneath(dir.as_raw_fd(), path, flags, mode);
        for (how, open) in [("openat2", &beneath as Open<'_>), ("walk", &walk)] {
            let opened = |path: &str, flags| {
                let path = CString::new(path).unwrap();
                open(&path, flags, 0o600).inspect(|fd| sys::close(*fd)).map(drop)
            };
            assert_eq!(opened("a/b/file", read), Ok(()), "{how}");
            assert_eq!(opened("./a//b/", through), Ok(()), "{how}");
            assert_eq!(opened(".", through), Ok(()), "{how}");
            assert_eq!(opened(&format!("a/new-{how}"), create), Ok(()), "{how}");
            assert_eq!(opened(&format!("a/new-{how}"), create), Err(Errno(sys::EEXIST)), "{how}");
            // A link as the last component, or on the way: refused, whatever the flags.
            assert_eq!(opened("a/flink", read), Err(Errno(sys::ELOOP)), "{how}");
            assert_eq!(opened("a/flink", create), Err(Errno(sys::EEXIST)), "{how}");
            let dir_link = if how == "walk" { sys::ENOTDIR } else { sys::ELOOP };
            assert_eq!(opened("a/link", through), Err(Errno(dir_link)), "{how}");
            assert_eq!(opened("a/link/file", read), Err(Errno(dir_link)), "{how}");
            assert_eq!(opened("a/link/new", create), Err(Errno(dir_link)), "{how}");
            assert_eq!(opened("a/missing/file", read), Err(Errno(sys::ENOENT)), "{how}");
        }
        let opened = |path: &str, flags| {
            let path = CString::new(path).unwrap();
            open_beneath(dir.as_raw_fd(), &path, flags, 0).inspect(|fd| sys::close(*fd)).map(drop)
        };
        assert_eq!(opened("a/../a/b", through), Err(Errno(sys::EXDEV)));
        assert_eq!(opened("/etc", through), Err(Errno(sys::EXDEV)));
        assert_eq!(opened("", read), Err(Errno(sys::ENOENT)));
        assert_eq!(opened("a/b", sys::O_PATH), Err(Errno(sys::EINVAL)));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1, "nothing made outside");
    }
}
