//! The containment system calls, as small safe functions over `libc`.
//!
//! Every `unsafe` block of the crate is here, each with the reason it is sound. The functions a forked child calls before `execve` (everything but
//! [`landlock_abi`]) allocate nothing and return errors as bare error numbers
//! (`io::Error::from_raw_os_error` does not allocate), so they are safe to call in the child of
//! a multi-threaded parent, where another thread may have held the allocator's lock at the
//! fork.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Turns a `-1` return into the thread's `errno`.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

// The containment calls are wharf-nolibc's (the static shim makes the same ones), here with
// `io::Error`s and owned descriptors.

/// The Landlock ABI version the kernel offers. `ENOSYS`: not built in; `EOPNOTSUPP`: built in
/// but not enabled at boot.
pub(crate) fn landlock_abi() -> io::Result<u32> {
    wharf_nolibc::sys::landlock_abi().map_err(errno)
}

/// A new Landlock ruleset that handles (denies unless a rule allows) `handled_fs`, and
/// confines signals and abstract unix sockets as `scoped` says.
pub(crate) fn landlock_create_ruleset(handled_fs: u64, scoped: u64) -> io::Result<OwnedFd> {
    let fd = wharf_nolibc::sys::landlock_create_ruleset(handled_fs, scoped).map_err(errno)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Allows `allowed` beneath the file or directory `parent` (an `O_PATH` descriptor).
pub(crate) fn landlock_add_path_rule(
    ruleset: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    allowed: u64,
) -> io::Result<()> {
    wharf_nolibc::sys::landlock_add_path_rule(ruleset.as_raw_fd(), parent.as_raw_fd(), allowed)
        .map_err(errno)
}

/// Enforces `ruleset` on this thread (the whole process, when it is single-threaded, as a
/// child between fork and exec is) and on everything it starts from now on. Needs
/// `no_new_privs` or `CAP_SYS_ADMIN`.
pub(crate) fn landlock_restrict_self(ruleset: BorrowedFd<'_>) -> io::Result<()> {
    wharf_nolibc::sys::landlock_restrict_self(ruleset.as_raw_fd()).map_err(errno)
}

/// An `O_PATH` descriptor for `path` (close-on-exec): names a file without opening it, for
/// Landlock rules.
pub(crate) fn open_path(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) }.into())?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether `fd` is a directory.
pub(crate) fn is_dir(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is writable memory of the right size; fstat fills it on success.
    check(unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) }.into())?;
    // SAFETY: fstat succeeded, so it initialised the struct.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// Sets `no_new_privs`: from now on no `execve` can grant privileges (setuid and setgid bits,
/// file capabilities are ignored). Inherited by every child and kept across `execve`.
pub(crate) fn set_no_new_privs() -> io::Result<()> {
    wharf_nolibc::sys::set_no_new_privs().map_err(errno)
}

/// Whether `no_new_privs` is set on this thread.
pub(crate) fn no_new_privs() -> io::Result<bool> {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes integers and touches no memory.
    check(unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) }.into()).map(|v| v == 1)
}

/// Drops every supplementary group. The raw system call acts on the calling thread only
/// (glibc's wrapper would signal every thread), which is right in a child between fork and
/// exec: it has one thread.
pub(crate) fn clear_groups() -> io::Result<()> {
    wharf_nolibc::sys::clear_groups().map_err(errno)
}

/// Sets the real, effective and saved group ids (this thread only, as [`clear_groups`]).
pub(crate) fn set_gid(gid: u32) -> io::Result<()> {
    wharf_nolibc::sys::set_gid(gid).map_err(errno)
}

/// Sets the real, effective and saved user ids (this thread only, as [`clear_groups`]). From
/// root to another user this also empties the capability sets.
pub(crate) fn set_uid(uid: u32) -> io::Result<()> {
    wharf_nolibc::sys::set_uid(uid).map_err(errno)
}

/// `unshare(flags)`: moves this process into new namespaces (for a PID namespace: its next
/// children).
pub(crate) fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes an integer and touches no memory.
    check(unsafe { libc::unshare(flags) }.into()).map(drop)
}

/// Makes every mount in this mount namespace a slave of its peer in the parent namespace
/// ([`wharf_nolibc::contain::make_mounts_slave`]).
pub(crate) fn make_mounts_slave() -> io::Result<()> {
    wharf_nolibc::contain::make_mounts_slave().map_err(errno)
}

/// Binds the directory `source` at `destination` (relative to `/`), through a descriptor
/// opened with no symbolic link on the way, read-only if asked
/// ([`wharf_nolibc::contain::bind_mount`]). Allocates nothing.
pub(crate) fn bind_mount(source: &CStr, destination: &CStr, read_only: bool) -> io::Result<()> {
    wharf_nolibc::contain::bind_mount(source, destination, read_only).map_err(errno)
}

/// Mounts a new procfs on `/proc` ([`wharf_nolibc::contain::mount_proc`]).
pub(crate) fn mount_proc() -> io::Result<()> {
    wharf_nolibc::contain::mount_proc().map_err(errno)
}

fn errno(e: wharf_nolibc::sys::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.0)
}

/// `flock(fd, op)`, retried on `EINTR`.
pub(crate) fn flock(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock takes a descriptor and an integer and touches no memory.
        match check(unsafe { libc::flock(fd.as_raw_fd(), op) }.into()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// This process's effective user id.
pub(crate) fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Opens a directory (a cgroup's) for holding a lock on it.
pub(crate) fn open_dir(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    let fd = check(
        unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) }
            .into(),
    )?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Takes an exclusive lock on `fd`'s file without waiting: `Ok(false)` if another open file
/// description holds it. The lock lasts until the descriptor is closed.
pub(crate) fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match flock(fd, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `fd` in one `write` call (retried on `EINTR`): allocation-free, for the
/// child between fork and exec.
pub(crate) fn write_once(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: `bytes` is valid for reads of its length; `fd` is open (borrowed).
        let ret = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        match check(ret as libc::c_long) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}
