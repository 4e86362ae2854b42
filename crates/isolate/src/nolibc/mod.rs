//! System calls without a C library, for wharf-exec's static shim.
//!
//! The shim that supervises each task links no C library: it starts with no dynamic loader,
//! no relocations and almost no memory of its own. It cannot link this crate (which uses std
//! and libc), so it compiles this module's source into itself (the build script says where it
//! is); everything here uses `core` alone, allocates nothing, refers to nothing else in the
//! crate and also works inside an ordinary std program, where the crate's tests run it.
//!
//! - [`sys`]: raw system calls (x86_64 and aarch64), each behind a small function that
//!   returns an [`sys::Errno`] on failure;
//! - [`join_cgroup`]: the one containment step the static shim takes, joining the task's
//!   cgroup between the clone and the exec. The isolated `exec` driver's further steps
//!   (user, Landlock, namespaces) are [`crate::Prepared::apply`]'s, in the shim built with std.

pub mod sys;

use core::ffi::CStr;
use sys::Errno;

/// Moves the calling process into a cgroup by writing `0`, the writer itself, into `file`, one
/// of [`crate::TaskCgroup::join_files`] (v1 `tasks`, v2 `cgroup.procs`). Allocates nothing:
/// safe in the child of a vfork-style clone, which has one thread.
pub fn join_cgroup(file: &CStr) -> Result<(), Errno> {
    let fd = sys::open(file, sys::O_WRONLY | sys::O_CLOEXEC, 0)?;
    let written = sys::write(fd, b"0");
    sys::close(fd);
    written.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
