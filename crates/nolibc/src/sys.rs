//! Raw Linux system calls for x86_64 and aarch64, with no C library.
//!
//! A call returns `-errno` in its result register on failure; [`check`] turns that into an
//! [`Errno`]. Descriptors are plain `i32`s: the caller owns every one it opens and closes them
//! itself. Each `unsafe` block is a system call whose pointers are valid for the call.
//!
//! Every function is `#[inline]`: most are a few instructions around one `syscall`, and a
//! program that links this crate as an rlib (the static shim does) inlines them as it would
//! its own code.

use core::arch::asm;
use core::ffi::CStr;

/// An error number from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

/// The result of a system call.
pub type Result<T> = core::result::Result<T, Errno>;

// Error numbers (the same on both architectures).
/// No such file or directory.
pub const ENOENT: i32 = 2;
/// No such process.
pub const ESRCH: i32 = 3;
/// Interrupted system call.
pub const EINTR: i32 = 4;
/// Bad file descriptor.
pub const EBADF: i32 = 9;
/// No child processes.
pub const ECHILD: i32 = 10;
/// Try again.
pub const EAGAIN: i32 = 11;
/// File exists.
pub const EEXIST: i32 = 17;
/// Cross-device link (also: a path that leaves the directory it must stay beneath).
pub const EXDEV: i32 = 18;
/// Not a directory.
pub const ENOTDIR: i32 = 20;
/// Invalid argument.
pub const EINVAL: i32 = 22;
/// Broken pipe.
pub const EPIPE: i32 = 32;
/// File name too long.
pub const ENAMETOOLONG: i32 = 36;
/// Function not implemented (a system call this kernel lacks).
pub const ENOSYS: i32 = 38;
/// Too many levels of symbolic links (also: a link met where none may be followed).
pub const ELOOP: i32 = 40;
/// Operation not permitted.
pub const EPERM: i32 = 1;
/// Permission denied.
pub const EACCES: i32 = 13;
/// Too many open files.
pub const EMFILE: i32 = 24;

// `open` flags.
/// Read only.
pub const O_RDONLY: i32 = 0;
/// Write only.
pub const O_WRONLY: i32 = 1;
/// Create if missing.
pub const O_CREAT: i32 = 0o100;
/// Truncate.
pub const O_TRUNC: i32 = 0o1000;
/// Append.
pub const O_APPEND: i32 = 0o2000;
/// Non-blocking.
pub const O_NONBLOCK: i32 = 0o4000;
/// Must be a directory.
#[cfg(target_arch = "x86_64")]
pub const O_DIRECTORY: i32 = 0o200000;
/// Must be a directory.
#[cfg(target_arch = "aarch64")]
pub const O_DIRECTORY: i32 = 0o40000;
/// Do not follow a final symbolic link.
#[cfg(target_arch = "x86_64")]
pub const O_NOFOLLOW: i32 = 0o400000;
/// Do not follow a final symbolic link.
#[cfg(target_arch = "aarch64")]
pub const O_NOFOLLOW: i32 = 0o100000;
/// A handle to a path, for `*at` calls only.
pub const O_PATH: i32 = 0o10000000;
/// Close on exec.
pub const O_CLOEXEC: i32 = 0o2000000;
/// Fail if the file exists (with `O_CREAT`).
pub const O_EXCL: i32 = 0o200;
/// Relative to the working directory.
pub const AT_FDCWD: i32 = -100;

// `openat2` resolve flags.
/// Follow no symbolic link, in any component.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// Stay beneath the starting directory: no absolute path, no `..` above it.
pub const RESOLVE_BENEATH: u64 = 0x08;

/// Signals used here.
pub const SIGKILL: i32 = 9;
/// Broken pipe.
pub const SIGPIPE: i32 = 13;
/// Child stopped or exited.
pub const SIGCHLD: i32 = 17;

/// `poll` events.
pub const POLLIN: i16 = 1;

#[cfg(target_arch = "x86_64")]
mod nr {
    pub(super) const READ: usize = 0;
    pub(super) const WRITE: usize = 1;
    pub(super) const CLOSE: usize = 3;
    pub(super) const LSEEK: usize = 8;
    pub(super) const MMAP: usize = 9;
    pub(super) const MPROTECT: usize = 10;
    pub(super) const MUNMAP: usize = 11;
    pub(super) const RT_SIGACTION: usize = 13;
    pub(super) const RT_SIGPROCMASK: usize = 14;
    pub(super) const SCHED_YIELD: usize = 24;
    pub(super) const GETPID: usize = 39;
    pub(super) const CLONE: usize = 56;
    pub(super) const EXECVE: usize = 59;
    pub(super) const WAIT4: usize = 61;
    pub(super) const KILL: usize = 62;
    pub(super) const FCNTL: usize = 72;
    pub(super) const FSYNC: usize = 74;
    pub(super) const CHDIR: usize = 80;
    pub(super) const SETSID: usize = 112;
    pub(super) const PRCTL: usize = 157;
    pub(super) const GETDENTS64: usize = 217;
    pub(super) const CLOCK_GETTIME: usize = 228;
    pub(super) const EXIT_GROUP: usize = 231;
    pub(super) const OPENAT: usize = 257;
    pub(super) const MKDIRAT: usize = 258;
    pub(super) const UNLINKAT: usize = 263;
    pub(super) const PPOLL: usize = 271;
    pub(super) const SIGNALFD4: usize = 289;
    pub(super) const DUP3: usize = 292;
    pub(super) const PIPE2: usize = 293;
    pub(super) const RENAMEAT2: usize = 316;
    pub(super) const SETGROUPS: usize = 116;
    pub(super) const SETRESUID: usize = 117;
    pub(super) const SETRESGID: usize = 119;
    pub(super) const FSTATFS: usize = 138;
    pub(super) const MOUNT: usize = 165;
    pub(super) const UNSHARE: usize = 272;
}

#[cfg(target_arch = "aarch64")]
mod nr {
    pub(super) const READ: usize = 63;
    pub(super) const WRITE: usize = 64;
    pub(super) const CLOSE: usize = 57;
    pub(super) const LSEEK: usize = 62;
    pub(super) const RT_SIGACTION: usize = 134;
    pub(super) const RT_SIGPROCMASK: usize = 135;
    pub(super) const SCHED_YIELD: usize = 124;
    pub(super) const GETPID: usize = 172;
    pub(super) const CLONE: usize = 220;
    pub(super) const EXECVE: usize = 221;
    pub(super) const WAIT4: usize = 260;
    pub(super) const KILL: usize = 129;
    pub(super) const FCNTL: usize = 25;
    pub(super) const FSYNC: usize = 82;
    pub(super) const CHDIR: usize = 49;
    pub(super) const SETSID: usize = 157;
    pub(super) const PRCTL: usize = 167;
    pub(super) const GETDENTS64: usize = 61;
    pub(super) const CLOCK_GETTIME: usize = 113;
    pub(super) const EXIT_GROUP: usize = 94;
    pub(super) const OPENAT: usize = 56;
    pub(super) const MKDIRAT: usize = 34;
    pub(super) const UNLINKAT: usize = 35;
    pub(super) const PPOLL: usize = 73;
    pub(super) const SIGNALFD4: usize = 74;
    pub(super) const DUP3: usize = 24;
    pub(super) const PIPE2: usize = 59;
    pub(super) const RENAMEAT2: usize = 276;
    pub(super) const MUNMAP: usize = 215;
    pub(super) const MMAP: usize = 222;
    pub(super) const MPROTECT: usize = 226;
    pub(super) const SETGROUPS: usize = 159;
    pub(super) const SETRESUID: usize = 147;
    pub(super) const SETRESGID: usize = 149;
    pub(super) const FSTATFS: usize = 44;
    pub(super) const MOUNT: usize = 40;
    pub(super) const UNSHARE: usize = 97;
}

// The same number on every architecture.
const CLOSE_RANGE: usize = 436;
const PIDFD_OPEN: usize = 434;
const PIDFD_SEND_SIGNAL: usize = 424;
const OPENAT2: usize = 437;
const LANDLOCK_CREATE_RULESET: usize = 444;
const LANDLOCK_ADD_RULE: usize = 445;
const LANDLOCK_RESTRICT_SELF: usize = 446;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("wharf-nolibc's system calls are written for x86_64 and aarch64");

/// A system call with up to six arguments; returns the raw result (`-errno` on failure).
///
/// # Safety
///
/// The arguments must be what the kernel expects for `number`: pointers valid for the reads
/// and writes the call makes.
#[inline]
pub unsafe fn syscall(number: usize, args: [usize; 6]) -> isize {
    let ret: isize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's promise; `syscall` clobbers rcx and r11 only.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") number as isize => ret,
            in("rdi") args[0], in("rsi") args[1], in("rdx") args[2],
            in("r10") args[3], in("r8") args[4], in("r9") args[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: the caller's promise; `svc 0` clobbers x0 only.
    unsafe {
        asm!(
            "svc 0",
            in("x8") number,
            inlateout("x0") args[0] as isize => ret,
            in("x1") args[1], in("x2") args[2], in("x3") args[3], in("x4") args[4], in("x5") args[5],
            options(nostack),
        );
    }
    ret
}

/// Turns a raw result into a `Result`.
#[inline]
pub fn check(ret: isize) -> Result<usize> {
    if (-4095..0).contains(&ret) { Err(Errno(-ret as i32)) } else { Ok(ret as usize) }
}

/// [`syscall`] and [`check`], retried while interrupted.
///
/// # Safety
///
/// As for [`syscall`].
#[inline]
unsafe fn call(number: usize, args: [usize; 6]) -> Result<usize> {
    loop {
        // SAFETY: the caller's promise.
        match check(unsafe { syscall(number, args) }) {
            Err(Errno(EINTR)) => continue,
            other => return other,
        }
    }
}

/// A signed argument (a descriptor, a pid, flags) as a register.
#[inline]
fn a(x: i32) -> usize {
    x as isize as usize
}

/// Reads into `buf`.
#[inline]
pub fn read(fd: i32, buf: &mut [u8]) -> Result<usize> {
    // SAFETY: `buf` is writable for its length.
    unsafe { call(nr::READ, [a(fd), buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0]) }
}

/// Writes from `buf`; may write less than all of it.
#[inline]
pub fn write(fd: i32, buf: &[u8]) -> Result<usize> {
    // SAFETY: `buf` is readable for its length.
    unsafe { call(nr::WRITE, [a(fd), buf.as_ptr() as usize, buf.len(), 0, 0, 0]) }
}

/// Writes all of `buf`.
#[inline]
pub fn write_all(fd: i32, mut buf: &[u8]) -> Result<()> {
    while !buf.is_empty() {
        match write(fd, buf)? {
            0 => return Err(Errno(EPIPE)),
            n => buf = &buf[n..],
        }
    }
    Ok(())
}

/// Closes a descriptor (errors are of no use to the caller).
#[inline]
pub fn close(fd: i32) {
    // SAFETY: plain integers.
    let _ = unsafe { syscall(nr::CLOSE, [a(fd), 0, 0, 0, 0, 0]) };
}

/// Closes every descriptor from `first` up.
#[inline]
pub fn close_from(first: u32) -> Result<()> {
    // SAFETY: plain integers.
    unsafe { call(CLOSE_RANGE, [first as usize, u32::MAX as usize, 0, 0, 0, 0]) }.map(drop)
}

/// Opens `path` (relative to `dir`, or absolute).
#[inline]
pub fn openat(dir: i32, path: &CStr, flags: i32, mode: u32) -> Result<i32> {
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe {
        call(nr::OPENAT, [a(dir), path.as_ptr() as usize, a(flags), mode as usize, 0, 0])
    }?;
    Ok(fd as i32)
}

/// The kernel's `struct open_how`, for `openat2`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `path` relative to `dir` as [`openat`] does, resolved as `resolve` says (Linux 5.6;
/// `ENOSYS` before). `mode` counts only with `O_CREAT`.
#[inline]
pub fn openat2(dir: i32, path: &CStr, flags: i32, mode: u32, resolve: u64) -> Result<i32> {
    // The kernel refuses a mode without O_CREAT, and flags it does not know (so no sign bits).
    let mode = if flags & O_CREAT != 0 { u64::from(mode) } else { 0 };
    let how = OpenHow { flags: u64::from(flags as u32), mode, resolve };
    let size = core::mem::size_of::<OpenHow>();
    // SAFETY: `path` is NUL-terminated; `how` is a live `struct open_how` of `size` bytes.
    let fd = unsafe {
        call(OPENAT2, [a(dir), path.as_ptr() as usize, &raw const how as usize, size, 0, 0])
    }?;
    Ok(fd as i32)
}

/// Opens `path`.
#[inline]
pub fn open(path: &CStr, flags: i32, mode: u32) -> Result<i32> {
    openat(AT_FDCWD, path, flags, mode)
}

/// Makes a directory.
#[inline]
pub fn mkdirat(dir: i32, path: &CStr, mode: u32) -> Result<()> {
    // SAFETY: `path` is NUL-terminated.
    unsafe { call(nr::MKDIRAT, [a(dir), path.as_ptr() as usize, mode as usize, 0, 0, 0]) }.map(drop)
}

/// Removes a file.
#[inline]
pub fn unlinkat(dir: i32, path: &CStr) -> Result<()> {
    // SAFETY: `path` is NUL-terminated.
    unsafe { call(nr::UNLINKAT, [a(dir), path.as_ptr() as usize, 0, 0, 0, 0]) }.map(drop)
}

/// A stack for a child process: `len` bytes of private memory, above a guard region that
/// faults, so that an overflow kills the child instead of writing over other memory. Nothing
/// of it costs memory until it is written, and [`unmap_stack`] gives it back. Returns the
/// stack's lowest usable address; the stack's top is `len` bytes above it.
#[inline]
pub fn map_stack(len: usize) -> Result<*mut u8> {
    const PROT_READ_WRITE: usize = 0x1 | 0x2;
    const MAP_PRIVATE_ANONYMOUS_STACK: usize = 0x02 | 0x20 | 0x20000;
    let total = STACK_GUARD + len;
    // SAFETY: a new mapping the kernel places; no memory of ours is named.
    let base = unsafe {
        call(nr::MMAP, [0, total, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS_STACK, usize::MAX, 0])
    }?;
    // SAFETY: the guard is the start of the mapping just made.
    if let Err(e) = unsafe { call(nr::MPROTECT, [base, STACK_GUARD, 0, 0, 0, 0]) } {
        // SAFETY: the mapping just made, used by nothing.
        let _ = unsafe { call(nr::MUNMAP, [base, total, 0, 0, 0, 0]) };
        return Err(e);
    }
    Ok((base + STACK_GUARD) as *mut u8)
}

/// Gives back a stack from [`map_stack`].
///
/// # Safety
///
/// `stack` and `len` are a [`map_stack`] result and its length, and nothing uses it any more.
#[inline]
pub unsafe fn unmap_stack(stack: *mut u8, len: usize) {
    let base = stack as usize - STACK_GUARD;
    // SAFETY: the caller's promise.
    let _ = unsafe { call(nr::MUNMAP, [base, STACK_GUARD + len, 0, 0, 0, 0]) };
}

/// The guard below a [`map_stack`] stack: a whole number of pages for any page size Linux
/// uses (4, 16 or 64 KiB).
const STACK_GUARD: usize = 64 * 1024;

/// Renames `from` to `to`, replacing `to`.
#[inline]
pub fn renameat(dir: i32, from: &CStr, to: &CStr) -> Result<()> {
    let (from, to) = (from.as_ptr() as usize, to.as_ptr() as usize);
    // SAFETY: both paths are NUL-terminated.
    unsafe { call(nr::RENAMEAT2, [a(dir), from, a(dir), to, 0, 0]) }.map(drop)
}

/// Flushes a file's data and metadata to disk.
#[inline]
pub fn fsync(fd: i32) -> Result<()> {
    // SAFETY: plain integers.
    unsafe { call(nr::FSYNC, [a(fd), 0, 0, 0, 0, 0]) }.map(drop)
}

/// The size of an open file (its end, found by seeking there).
#[inline]
pub fn seek_end(fd: i32) -> Result<u64> {
    const SEEK_END: usize = 2;
    // SAFETY: plain integers.
    unsafe { call(nr::LSEEK, [a(fd), 0, SEEK_END, 0, 0, 0]) }.map(|n| n as u64)
}

/// Enters a directory.
#[inline]
pub fn chdir(path: &CStr) -> Result<()> {
    // SAFETY: `path` is NUL-terminated.
    unsafe { call(nr::CHDIR, [path.as_ptr() as usize, 0, 0, 0, 0, 0]) }.map(drop)
}

/// A pipe, both ends close-on-exec: `(read end, write end)`.
#[inline]
pub fn pipe() -> Result<(i32, i32)> {
    let mut fds = [-1i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    unsafe { call(nr::PIPE2, [fds.as_mut_ptr() as usize, a(O_CLOEXEC), 0, 0, 0, 0]) }?;
    Ok((fds[0], fds[1]))
}

/// Makes `to` a copy of `from` (not close-on-exec). With `from == to`, clears the
/// close-on-exec flag instead, which `dup3` refuses to do.
#[inline]
pub fn dup_to(from: i32, to: i32) -> Result<()> {
    const F_SETFD: usize = 2;
    if from == to {
        // SAFETY: plain integers.
        return unsafe { call(nr::FCNTL, [a(from), F_SETFD, 0, 0, 0, 0]) }.map(drop);
    }
    // SAFETY: plain integers.
    unsafe { call(nr::DUP3, [a(from), a(to), 0, 0, 0, 0]) }.map(drop)
}

/// Puts `fd` in non-blocking mode.
#[inline]
pub fn set_nonblocking(fd: i32) -> Result<()> {
    const F_GETFL: usize = 3;
    const F_SETFL: usize = 4;
    // SAFETY: plain integers.
    let flags = unsafe { call(nr::FCNTL, [a(fd), F_GETFL, 0, 0, 0, 0]) }?;
    // SAFETY: plain integers.
    unsafe { call(nr::FCNTL, [a(fd), F_SETFL, flags | O_NONBLOCK as usize, 0, 0, 0]) }.map(drop)
}

/// One entry for [`poll`], laid out as the kernel's `struct pollfd`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PollFd {
    /// The descriptor; a negative one is skipped.
    pub fd: i32,
    /// Events asked for.
    pub events: i16,
    /// Events that happened.
    pub revents: i16,
}

/// Waits for events on `fds`, at most `timeout_ms` (negative: no limit).
#[inline]
pub fn poll(fds: &mut [PollFd], timeout_ms: i64) -> Result<usize> {
    let time = [timeout_ms.max(0) / 1000, (timeout_ms.max(0) % 1000) * 1_000_000];
    let time = if timeout_ms < 0 { 0 } else { time.as_ptr() as usize };
    // SAFETY: `fds` is writable for its length; `time` lives across the call.
    unsafe { call(nr::PPOLL, [fds.as_mut_ptr() as usize, fds.len(), time, 0, 8, 0]) }
}

/// Milliseconds on the monotonic clock.
#[inline]
pub fn monotonic_ms() -> u64 {
    const CLOCK_MONOTONIC: usize = 1;
    let mut time = [0i64; 2];
    // SAFETY: `time` has room for a `struct timespec`.
    let _ = unsafe {
        call(nr::CLOCK_GETTIME, [CLOCK_MONOTONIC, time.as_mut_ptr() as usize, 0, 0, 0, 0])
    };
    (time[0] as u64).saturating_mul(1000) + (time[1] as u64) / 1_000_000
}

/// This process's id.
#[inline]
pub fn getpid() -> i32 {
    // SAFETY: no arguments.
    unsafe { syscall(nr::GETPID, [0; 6]) as i32 }
}

/// Makes this process the leader of a new session.
#[inline]
pub fn setsid() -> Result<()> {
    // SAFETY: no arguments.
    unsafe { call(nr::SETSID, [0; 6]) }.map(drop)
}

/// Makes this process adopt its orphaned descendants.
#[inline]
pub fn set_child_subreaper() -> Result<()> {
    const PR_SET_CHILD_SUBREAPER: usize = 36;
    // SAFETY: plain integers.
    unsafe { call(nr::PRCTL, [PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0, 0]) }.map(drop)
}

/// Names this process (`/proc/<pid>/comm`, what `ps` shows), cut to 15 bytes.
#[inline]
pub fn set_name(name: &CStr) {
    const PR_SET_NAME: usize = 15;
    // SAFETY: `name` is NUL-terminated.
    let _ = unsafe { syscall(nr::PRCTL, [PR_SET_NAME, name.as_ptr() as usize, 0, 0, 0, 0]) };
}

/// Gives up the CPU to whatever else is ready to run.
#[inline]
pub fn yield_cpu() {
    // SAFETY: no arguments.
    let _ = unsafe { syscall(nr::SCHED_YIELD, [0; 6]) };
}

/// Ends the process.
#[inline]
pub fn exit(code: i32) -> ! {
    loop {
        // SAFETY: plain integers; it does not return.
        unsafe { syscall(nr::EXIT_GROUP, [a(code), 0, 0, 0, 0, 0]) };
    }
}

/// A signal set, as the kernel's 64-bit `sigset_t`.
pub type SigSet = u64;

/// The bit of `signal` in a [`SigSet`].
#[inline]
pub const fn sig_bit(signal: i32) -> SigSet {
    1 << (signal - 1)
}

/// How `sigprocmask` changes the mask.
#[derive(Debug, Clone, Copy)]
pub enum MaskHow {
    /// Adds to it.
    Block = 0,
    /// Replaces it.
    Set = 2,
}

/// Changes the blocked signals; returns the old mask.
#[inline]
pub fn sigprocmask(how: MaskHow, set: SigSet) -> Result<SigSet> {
    let mut old: SigSet = 0;
    let (set_ptr, old_ptr) = (&raw const set as usize, &raw mut old as usize);
    // SAFETY: both point to live 8-byte sets, the size given.
    unsafe { call(nr::RT_SIGPROCMASK, [how as usize, set_ptr, old_ptr, 8, 0, 0]) }?;
    Ok(old)
}

/// Sets `signal` to be ignored (`true`) or to its default action (`false`).
#[inline]
pub fn set_ignored(signal: i32, ignored: bool) -> Result<()> {
    // The kernel's `struct sigaction`: handler, flags, restorer, mask. SIG_DFL is 0, SIG_IGN 1.
    let action: [usize; 4] = [usize::from(ignored), 0, 0, 0];
    // SAFETY: `action` is a complete `struct sigaction`; the old one is not asked for.
    unsafe { call(nr::RT_SIGACTION, [a(signal), action.as_ptr() as usize, 0, 8, 0, 0]) }.map(drop)
}

/// Blocks SIGCHLD and returns a non-blocking, close-on-exec signalfd for it.
#[inline]
pub fn sigchld_fd() -> Result<i32> {
    const SFD_NONBLOCK: usize = 0o4000;
    const SFD_CLOEXEC: usize = 0o2000000;
    let set = sig_bit(SIGCHLD);
    sigprocmask(MaskHow::Block, set)?;
    let flags = SFD_NONBLOCK | SFD_CLOEXEC;
    // SAFETY: `set` is a live 8-byte set; -1 asks for a new descriptor.
    let fd = unsafe { call(nr::SIGNALFD4, [usize::MAX, &raw const set as usize, 8, flags, 0, 0]) }?;
    Ok(fd as i32)
}

/// How a process ended, as `wait4` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// It called `exit` with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
}

impl WaitStatus {
    /// Decodes a raw `wait4` status.
    #[inline]
    pub fn from_raw(status: i32) -> WaitStatus {
        let signal = status & 0x7f;
        if signal != 0 && signal != 0x7f {
            WaitStatus::Signaled(signal)
        } else {
            WaitStatus::Exited((status >> 8) & 0xff)
        }
    }
}

/// Reaps a child that has exited (`pid` -1: any child): `Ok(None)` if none has yet, `ECHILD`
/// if there are none.
#[inline]
pub fn try_reap(pid: i32) -> Result<Option<(i32, WaitStatus)>> {
    const WNOHANG: usize = 1;
    let mut status = 0i32;
    // SAFETY: `status` is a live int; no rusage is asked for.
    let pid = unsafe { call(nr::WAIT4, [a(pid), &raw mut status as usize, WNOHANG, 0, 0, 0]) }?;
    Ok((pid != 0).then(|| (pid as i32, WaitStatus::from_raw(status))))
}

/// Waits for the child `pid` and reaps it.
#[inline]
pub fn reap(pid: i32) -> Result<WaitStatus> {
    let mut status = 0i32;
    // SAFETY: `status` is a live int; no rusage is asked for.
    unsafe { call(nr::WAIT4, [a(pid), &raw mut status as usize, 0, 0, 0, 0]) }?;
    Ok(WaitStatus::from_raw(status))
}

/// Sends `signal` to a process (`pid` > 0) or a process group (`pid` < -1). Refuses 0, -1 and
/// 1, which would reach the caller's own group, every process, or init.
#[inline]
pub fn kill(pid: i32, signal: i32) -> Result<()> {
    if matches!(pid, -1..=1) {
        return Err(Errno(EINVAL));
    }
    // SAFETY: plain integers.
    unsafe { call(nr::KILL, [a(pid), a(signal), 0, 0, 0, 0]) }.map(drop)
}

/// A pidfd for `pid`, close-on-exec.
#[inline]
pub fn pidfd_open(pid: i32) -> Result<i32> {
    // SAFETY: plain integers.
    unsafe { call(PIDFD_OPEN, [a(pid), 0, 0, 0, 0, 0]) }.map(|fd| fd as i32)
}

/// Sends `signal` to the process group of the pidfd's process (Linux 6.9); `EINVAL` on older
/// kernels.
#[inline]
pub fn pidfd_kill_group(pidfd: i32, signal: i32) -> Result<()> {
    const PIDFD_SIGNAL_PROCESS_GROUP: usize = 1 << 2;
    // SAFETY: plain integers; a null siginfo is allowed.
    unsafe { call(PIDFD_SEND_SIGNAL, [a(pidfd), a(signal), 0, PIDFD_SIGNAL_PROCESS_GROUP, 0, 0]) }
        .map(drop)
}

/// Reads directory entries into `buf` (`struct linux_dirent64` records); 0 at the end.
#[inline]
pub fn getdents(fd: i32, buf: &mut [u8]) -> Result<usize> {
    // SAFETY: `buf` is writable for its length.
    unsafe { call(nr::GETDENTS64, [a(fd), buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0]) }
}

/// Executes `program`; returns only on failure.
///
/// # Safety
///
/// `argv` and `envp` are null-terminated arrays of NUL-terminated strings.
#[inline]
pub unsafe fn execve(program: &CStr, argv: *const *const u8, envp: *const *const u8) -> Errno {
    let args = [program.as_ptr() as usize, argv as usize, envp as usize, 0, 0, 0];
    // SAFETY: the caller's promise.
    match check(unsafe { syscall(nr::EXECVE, args) }) {
        Err(errno) => errno,
        Ok(_) => Errno(0),
    }
}

/// Starts `child(arg)` in a new process that shares this one's memory, on `stack_top`, while
/// this process waits until the child has executed a program or exited (`CLONE_VM |
/// CLONE_VFORK`, as `posix_spawn` does it). Returns the child's pid.
///
/// # Safety
///
/// `stack_top` is the 16-byte aligned end of memory that nothing else uses until the call
/// returns; `child` makes system calls only (it shares this process's memory and must not
/// return: it executes a program or calls [`exit`]); `arg` is valid for `child`. Signals
/// should be blocked around the call, so that no handler runs in the child.
#[inline]
pub unsafe fn clone_vfork(
    stack_top: *mut u8,
    child: extern "C" fn(*mut u8) -> !,
    arg: *mut u8,
) -> Result<i32> {
    const CLONE_VM: usize = 0x100;
    const CLONE_VFORK: usize = 0x4000;
    let flags = CLONE_VM | CLONE_VFORK | SIGCHLD as usize;
    let ret: isize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's promise. In the child the kernel sets rsp to `stack_top` and keeps
    // every other register, so it calls `child(arg)` from r12 and r13 without touching the
    // parent's stack; `child` never returns.
    unsafe {
        asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") nr::CLONE as isize => ret,
            in("rdi") flags, in("rsi") stack_top, in("rdx") 0usize, in("r10") 0usize,
            in("r8") 0usize, in("r12") arg, in("r13") child,
            lateout("rcx") _, lateout("r11") _,
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above, with the stack pointer set by the kernel and `child(arg)` called from
    // x9 and x10, which the kernel keeps.
    unsafe {
        asm!(
            "svc 0",
            "cbnz x0, 2f",
            "mov x0, x9",
            "blr x10",
            "brk 1",
            "2:",
            in("x8") nr::CLONE,
            inlateout("x0") flags as isize => ret,
            in("x1") stack_top, in("x2") 0usize, in("x3") 0usize, in("x4") 0usize,
            in("x9") arg, in("x10") child,
        );
    }
    check(ret).map(|pid| pid as i32)
}

// Namespaces, mounts, users and Landlock: what a task's process does to itself between its
// clone and its exec (module `contain` puts them together).

/// `unshare` flag: a mount namespace.
pub const CLONE_NEWNS: i32 = 0x0002_0000;
/// `unshare` flag: an IPC namespace.
pub const CLONE_NEWIPC: i32 = 0x0800_0000;
/// `unshare` flag: a PID namespace (for the caller's next children).
pub const CLONE_NEWPID: i32 = 0x2000_0000;

/// Moves this process into new namespaces (for a PID namespace: its next children).
#[inline]
pub fn unshare(flags: i32) -> Result<()> {
    // SAFETY: plain integers.
    unsafe { call(nr::UNSHARE, [a(flags), 0, 0, 0, 0, 0]) }.map(drop)
}

/// `mount` flag: read-only.
pub const MS_RDONLY: u64 = 1;
/// `mount` flag: setuid and setgid bits ignored.
pub const MS_NOSUID: u64 = 2;
/// `mount` flag: device files refused.
pub const MS_NODEV: u64 = 4;
/// `mount` flag: programs refused.
pub const MS_NOEXEC: u64 = 8;
/// `mount` flag: change an existing mount's flags.
pub const MS_REMOUNT: u64 = 32;
/// `mount` flag: a bind mount.
pub const MS_BIND: u64 = 4096;
/// `mount` flag: recursively.
pub const MS_REC: u64 = 16384;
/// `mount` flag: receive the peer's mount events, send none.
pub const MS_SLAVE: u64 = 1 << 19;

/// `mount(2)`; a `None` is a null pointer.
#[inline]
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fs_type: Option<&CStr>,
    flags: u64,
) -> Result<()> {
    let pointer = |s: Option<&CStr>| s.map_or(0, |s| s.as_ptr() as usize);
    let args = [pointer(source), target.as_ptr() as usize, pointer(fs_type), flags as usize, 0, 0];
    // SAFETY: NUL-terminated strings or null; no data.
    unsafe { call(nr::MOUNT, args) }.map(drop)
}

/// The flags of the file system `fd` lies on (`statfs`'s `f_flags`: `ST_RDONLY` is 1,
/// `ST_NOSUID` 2, `ST_NODEV` 4, `ST_NOEXEC` 8, as the `MS_` flags of the same names).
#[inline]
pub fn fs_flags(fd: i32) -> Result<u64> {
    // `struct statfs` on 64-bit Linux: eleven 8-byte words (`f_flags` the last), four spare.
    let mut stat = [0u64; 15];
    // SAFETY: `stat` has room for a `struct statfs`.
    unsafe { call(nr::FSTATFS, [a(fd), stat.as_mut_ptr() as usize, 0, 0, 0, 0]) }?;
    Ok(stat[10])
}

/// Drops every supplementary group.
#[inline]
pub fn clear_groups() -> Result<()> {
    // SAFETY: a count of 0 with a null list reads no memory.
    unsafe { call(nr::SETGROUPS, [0; 6]) }.map(drop)
}

/// Sets the real, effective and saved group ids.
#[inline]
pub fn set_gid(gid: u32) -> Result<()> {
    let gid = gid as usize;
    // SAFETY: plain integers.
    unsafe { call(nr::SETRESGID, [gid, gid, gid, 0, 0, 0]) }.map(drop)
}

/// Sets the real, effective and saved user ids; from root to another user this also empties
/// the capability sets.
#[inline]
pub fn set_uid(uid: u32) -> Result<()> {
    let uid = uid as usize;
    // SAFETY: plain integers.
    unsafe { call(nr::SETRESUID, [uid, uid, uid, 0, 0, 0]) }.map(drop)
}

/// Sets `no_new_privs`: no `execve` from now on grants privileges.
#[inline]
pub fn set_no_new_privs() -> Result<()> {
    const PR_SET_NO_NEW_PRIVS: usize = 38;
    // SAFETY: plain integers.
    unsafe { call(nr::PRCTL, [PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0]) }.map(drop)
}

/// The Landlock ABI version the kernel offers (`ENOSYS`: not built in; `EOPNOTSUPP`: not
/// enabled at boot).
#[inline]
pub fn landlock_abi() -> Result<u32> {
    const CREATE_RULESET_VERSION: usize = 1;
    // SAFETY: a null attribute of size 0 with the VERSION flag reads no memory.
    unsafe { call(LANDLOCK_CREATE_RULESET, [0, 0, CREATE_RULESET_VERSION, 0, 0, 0]) }
        .map(|v| v as u32)
}

/// A new Landlock ruleset (close-on-exec) that handles the file rights `handled_fs` and the
/// scopes `scoped` (ABI 6).
#[inline]
pub fn landlock_create_ruleset(handled_fs: u64, scoped: u64) -> Result<i32> {
    // `struct landlock_ruleset_attr`: handled_access_fs, handled_access_net, scoped.
    let attr = [handled_fs, 0, scoped];
    let size = core::mem::size_of_val(&attr);
    // SAFETY: `attr` is the kernel's struct, `size` bytes, live across the call.
    unsafe { call(LANDLOCK_CREATE_RULESET, [attr.as_ptr() as usize, size, 0, 0, 0, 0]) }
        .map(|fd| fd as i32)
}

/// Allows `allowed` beneath the file or directory `parent` (an `O_PATH` descriptor).
#[inline]
pub fn landlock_add_path_rule(ruleset: i32, parent: i32, allowed: u64) -> Result<()> {
    const RULE_PATH_BENEATH: usize = 1;
    // `struct landlock_path_beneath_attr`, packed: allowed_access, then parent_fd.
    let mut attr = [0u8; 12];
    attr[..8].copy_from_slice(&allowed.to_ne_bytes());
    attr[8..].copy_from_slice(&parent.to_ne_bytes());
    let args = [a(ruleset), RULE_PATH_BENEATH, attr.as_ptr() as usize, 0, 0, 0];
    // SAFETY: `attr` is the kernel's packed struct, live across the call.
    unsafe { call(LANDLOCK_ADD_RULE, args) }.map(drop)
}

/// Enforces `ruleset` on this thread and everything it starts from now on (needs
/// `no_new_privs` or `CAP_SYS_ADMIN`).
#[inline]
pub fn landlock_restrict_self(ruleset: i32) -> Result<()> {
    // SAFETY: plain integers.
    unsafe { call(LANDLOCK_RESTRICT_SELF, [a(ruleset), 0, 0, 0, 0, 0]) }.map(drop)
}
