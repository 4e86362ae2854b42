//! The system calls wharf-exec makes, as small safe functions over `libc`.
//!
//! Every `unsafe` block of the crate is here, each with the reason it is sound. Callers above see `io::Result`s and the [`Pid`] type, which cannot hold
//! 0, 1 or a negative number: `kill(0)`, `kill(-1)` and `kill(1)` would reach the caller's own
//! group, every process, or init, and no value read from a handle on disk may ever get there.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A process id that may be signalled: greater than 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Pid(i32);

impl Pid {
    /// `raw` if it names an ordinary process (not 0, not init, not negative).
    pub(crate) fn new(raw: i64) -> Option<Pid> {
        i32::try_from(raw).ok().filter(|p| *p > 1).map(Pid)
    }

    /// The number.
    pub(crate) fn get(self) -> i32 {
        self.0
    }
}

impl std::fmt::Display for Pid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Turns a `-1` return into the thread's `errno`.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// How a process ended, as `waitpid` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitStatus {
    /// It called `exit` with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
}

impl WaitStatus {
    fn from_raw(status: libc::c_int) -> WaitStatus {
        if libc::WIFSIGNALED(status) {
            WaitStatus::Signaled(libc::WTERMSIG(status))
        } else {
            WaitStatus::Exited(libc::WEXITSTATUS(status))
        }
    }
}

/// Reaps `pid`, a child of this process, if it has exited; `None` if it still runs.
pub(crate) fn try_reap(pid: Pid) -> io::Result<Option<WaitStatus>> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid, writable int for the duration of the call.
        let ret = unsafe { libc::waitpid(pid.get(), &mut status, libc::WNOHANG) };
        match check(ret.into()) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(WaitStatus::from_raw(status))),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Waits for `pid`, a child of this process, to exit and reaps it.
pub(crate) fn reap_blocking(pid: Pid) -> io::Result<WaitStatus> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid, writable int for the duration of the call.
        let ret = unsafe { libc::waitpid(pid.get(), &mut status, 0) };
        match check(ret.into()) {
            Ok(_) => return Ok(WaitStatus::from_raw(status)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Sends `signal` to one process.
pub(crate) fn kill(pid: Pid, signal: i32) -> io::Result<()> {
    // SAFETY: kill takes plain integers; `Pid` rules out the broadcast forms.
    check(unsafe { libc::kill(pid.get(), signal) }.into()).map(drop)
}

/// Sends `signal` to every process of the group `pgid`.
pub(crate) fn kill_group(pgid: Pid, signal: i32) -> io::Result<()> {
    // SAFETY: kill takes plain integers; a negative `Pid` (> 1) names exactly one group.
    check(unsafe { libc::kill(-pgid.get(), signal) }.into()).map(drop)
}

/// Opens a pidfd: a file descriptor that stays bound to the process `pid` names now, even
/// after that number is reused, and becomes readable when the process exits.
pub(crate) fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid.get(), 0) })?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `PIDFD_SIGNAL_PROCESS_GROUP` of `<linux/pidfd.h>` (Linux 6.9): signal the process group
/// whose id is the pidfd's process.
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// Sends `signal` to the process group led (now or formerly) by the pidfd's process. The
/// pidfd pins the process id, so this can never reach a group that took over a reused number.
/// Kernels before 6.9 lack the flag: then the group is signalled by number, which is as safe
/// as long as the caller has just checked the leader's identity through this pidfd.
pub(crate) fn pidfd_kill_group(pidfd: &OwnedFd, pgid: Pid, signal: i32) -> io::Result<()> {
    match pidfd_send_signal(pidfd, signal, PIDFD_SIGNAL_PROCESS_GROUP) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => kill_group(pgid, signal),
        result => result,
    }
}

/// Sends `signal` to the pidfd's process (never to a process that reused its number).
pub(crate) fn pidfd_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    pidfd_send_signal(pidfd, signal, 0)
}

fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: the descriptor is open for the call; a null siginfo is allowed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    };
    check(ret).map(drop)
}

/// Waits at most `timeout` for the pidfd's process to exit.
pub(crate) fn pidfd_wait(pidfd: &OwnedFd, timeout: std::time::Duration) -> io::Result<()> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    poll_one(pidfd.as_raw_fd(), libc::POLLIN, ms).map(drop)
}

/// Whether the process behind `pidfd` has exited (the pidfd is readable), without waiting.
pub(crate) fn pidfd_exited(pidfd: &OwnedFd) -> io::Result<bool> {
    Ok(poll_one(pidfd.as_raw_fd(), libc::POLLIN, 0)? != 0)
}

/// Polls one descriptor; returns its `revents` (0 on timeout).
fn poll_one(fd: RawFd, events: libc::c_short, timeout_ms: i32) -> io::Result<libc::c_short> {
    let mut fds = [libc::pollfd { fd, events, revents: 0 }];
    poll(&mut fds, timeout_ms)?;
    Ok(fds[0].revents)
}

/// `poll(2)` over `fds`, retried on EINTR; returns how many have events.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        // SAFETY: `fds` is a valid slice of pollfd structs of the given length.
        let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        match check(ret.into()) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Puts `fd` in non-blocking mode.
pub(crate) fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL only read and set the flags of an open descriptor.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) }.into())?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags as libc::c_int | libc::O_NONBLOCK) }.into())
        .map(drop)
}

/// Reads from a raw descriptor into `buf`.
pub(crate) fn read(fd: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let ret = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match check(ret as libc::c_long) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether this process may execute `path` (`access(X_OK)`).
pub(crate) fn executable(path: &Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

/// Clock ticks per second, the unit of the times in `/proc/<pid>/stat`.
pub(crate) fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// The size of a memory page, the unit of RSS in `/proc/<pid>/stat`.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

/// This boot's id: after a reboot every pid and start time recorded before it is meaningless.
pub(crate) fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_owned())
}

/// Lowers the calling thread's priority to nice 19 (Linux's `setpriority` on a thread id
/// applies to that thread alone).
pub(crate) fn lower_own_priority() -> io::Result<()> {
    // SAFETY: gettid cannot fail and touches no memory.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority takes plain integers.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// This process's id.
pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid cannot fail and touches no memory.
    unsafe { libc::getpid() }
}

/// Closes every descriptor from 3 up: what the agent's process held without close-on-exec
/// (a build tool's jobserver pipe, a service manager's sockets) is not the task's business.
/// Needs Linux 5.9; on older kernels the descriptors stay open.
///
/// # Safety
///
/// Nothing in the process may own a descriptor above 2: call it first thing in `main`.
pub(crate) unsafe fn close_inherited_fds() {
    // SAFETY: close_range takes plain integers; the caller guarantees that no descriptor it
    // closes is owned by anything.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
}

/// A sealed in-memory file holding `bytes`, executable, close-on-exec: it can be executed
/// through `/proc/self/fd/<fd>` (here and in a child before its exec) and never changed.
pub(crate) fn sealed_memory_file(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    // `MFD_EXEC` (Linux 6.3): executable even where the default is not; older kernels refuse
    // the flag, and their memory files are executable anyway.
    const MFD_EXEC: libc::c_uint = 0x10;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is NUL-terminated; the flags are plain integers.
    let fd = match unsafe { libc::memfd_create(name.as_ptr(), flags | MFD_EXEC) } {
        // SAFETY: as above.
        -1 if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) => unsafe {
            libc::memfd_create(name.as_ptr(), flags)
        },
        fd => fd,
    };
    check(fd.into())?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    let file = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::Write::write_all(&mut &file, bytes)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS takes an integer and touches no memory.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) }.into())?;
    Ok(file.into())
}

/// Raises this process's soft limit on open descriptors to its hard limit; returns the new
/// soft limit.
pub(crate) fn raise_fd_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit for the call.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }.into())?;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit for the call.
        check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }.into())?;
    }
    Ok(limit.rlim_cur)
}

/// Registers a descriptor this crate owns with tokio's reactor, for read readiness. Fails
/// (rather than panicking) outside a tokio runtime; the runtime must have I/O enabled.
pub(crate) fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    // SAFETY: an `OwnedFd` is open until it is dropped, which happens only when the `AsyncFd`
    // that owns it is dropped, and its `as_raw_fd` always returns that same descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

/// Like [`async_fd`], for a descriptor borrowed for the `AsyncFd`'s lifetime.
pub(crate) fn async_fd_borrowed(
    fd: BorrowedFd<'_>,
) -> io::Result<tokio::io::unix::AsyncFd<BorrowedFd<'_>>> {
    tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    // SAFETY: the borrow keeps the descriptor open for as long as the `AsyncFd` (which holds
    // the borrow) lives, and a `BorrowedFd`'s `as_raw_fd` always returns the same descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

/// The fields of `/proc/<pid>/stat` that wharf-exec uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// R, S, D, Z, T, ...
    pub(crate) state: u8,
    /// The parent.
    pub(crate) ppid: i32,
    /// The process group.
    pub(crate) pgrp: i32,
    /// The session.
    pub(crate) session: i32,
    /// User CPU time, in clock ticks.
    pub(crate) utime: u64,
    /// System CPU time, in clock ticks.
    pub(crate) stime: u64,
    /// When it started, in clock ticks since boot: with the pid, its identity.
    pub(crate) start_ticks: u64,
    /// Resident set size, in pages.
    pub(crate) rss_pages: u64,
}

impl ProcStat {
    /// Parses the text of `/proc/<pid>/stat`. The command name may hold spaces and
    /// parentheses, so fields are counted from its last `)`.
    pub(crate) fn parse(text: &str) -> Option<ProcStat> {
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        // fields[0] is field 3 of proc(5), "state".
        let get = |field: usize| fields.get(field - 3).copied();
        let num = |field: usize| get(field)?.parse::<u64>().ok();
        let int = |field: usize| get(field)?.parse::<i32>().ok();
        Some(ProcStat {
            state: *get(3)?.as_bytes().first()?,
            ppid: int(4)?,
            pgrp: int(5)?,
            session: int(6)?,
            utime: num(14)?,
            stime: num(15)?,
            start_ticks: num(22)?,
            rss_pages: get(24)?.parse::<i64>().ok()?.max(0) as u64,
        })
    }

    /// Reads `/proc/<pid>/stat`; `None` if there is no such process (or it is unreadable).
    pub(crate) fn read(pid: i32) -> Option<ProcStat> {
        let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        ProcStat::parse(&text)
    }

    /// Whether the process has exited and waits to be reaped (or is being reaped).
    pub(crate) fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }
}

/// Whether a signal's default action ends the process (terminate, or dump core): every
/// signal but those that are ignored or stop by default.
pub(crate) fn ends_by_default(signal: i32) -> bool {
    signal > 0
        && !matches!(
            signal,
            libc::SIGCHLD
                | libc::SIGCONT
                | libc::SIGURG
                | libc::SIGWINCH
                | libc::SIGSTOP
                | libc::SIGTSTP
                | libc::SIGTTIN
                | libc::SIGTTOU
        )
}

/// Which signals a process catches and ignores (`SigCgt`, `SigIgn` of `/proc/<pid>/status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignalDisposition {
    caught: u64,
    ignored: u64,
}

impl SignalDisposition {
    /// Reads the text of `/proc/<pid>/status`.
    pub(crate) fn parse(status: &str) -> Option<SignalDisposition> {
        let mask = |name: &str| {
            let line = status.lines().find_map(|l| l.strip_prefix(name))?;
            u64::from_str_radix(line.trim(), 16).ok()
        };
        Some(SignalDisposition { caught: mask("SigCgt:")?, ignored: mask("SigIgn:")? })
    }

    /// Reads `/proc/<pid>/status`; `None` if the process is gone.
    pub(crate) fn read(pid: i32) -> Option<SignalDisposition> {
        SignalDisposition::parse(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
    }

    /// Whether the process has a handler for `signal` or ignores it.
    pub(crate) fn handles(&self, signal: i32) -> bool {
        let Some(bit) = u32::try_from(signal - 1).ok().and_then(|b| 1u64.checked_shl(b)) else {
            return false;
        };
        (self.caught | self.ignored) & bit != 0
    }
}

/// Every process id in `/proc`.
pub(crate) fn all_pids() -> impl Iterator<Item = i32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_that_would_broadcast_are_refused() {
        for (raw, expected) in [
            (-1, None),
            (0, None),
            (1, None),
            (2, Some(2)),
            (4_194_304, Some(4_194_304)),
            (i64::from(i32::MAX) + 1, None),
            (i64::MIN, None),
        ] {
            assert_eq!(Pid::new(raw).map(Pid::get), expected, "{raw}");
        }
    }

    #[test]
    fn stat_lines_parse_with_awkward_command_names() {
        let tail = "S 10 20 20 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 123456 1000000 250 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        for comm in ["sleep", "a b", "x) S 1 2 3 (y", "(("] {
            let stat = ProcStat::parse(&format!("42 ({comm}) {tail}")).expect(comm);
            assert_eq!(
                stat,
                ProcStat {
                    state: b'S',
                    ppid: 10,
                    pgrp: 20,
                    session: 20,
                    utime: 7,
                    stime: 3,
                    start_ticks: 123_456,
                    rss_pages: 250,
                },
                "{comm}"
            );
        }
        for garbage in ["", "42 (x)", "42 (x) S 1 2", "no parens at all 1 2 3"] {
            assert_eq!(ProcStat::parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn the_descriptor_limit_rises_to_the_hard_limit() {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `limit` is a valid, writable rlimit for the call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        assert_eq!(raise_fd_limit().unwrap(), limit.rlim_max);
    }

    #[test]
    fn signal_dispositions_read_from_proc_status() {
        let status = "Name:\tsh\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000004\n\
                      SigCgt:\t0000000000010002\n";
        let disposition = SignalDisposition::parse(status).unwrap();
        // SIGINT (2) caught, SIGQUIT (3) ignored, SIGCHLD (17) caught; SIGTERM (15) neither.
        for (signal, handled) in [(2, true), (3, true), (17, true), (15, false), (9, false)] {
            assert_eq!(disposition.handles(signal), handled, "{signal}");
        }
        assert!(!disposition.handles(0) && !disposition.handles(99));
        assert_eq!(SignalDisposition::parse("Name:\tsh\n"), None);
        assert!(ends_by_default(libc::SIGTERM) && ends_by_default(libc::SIGHUP));
        assert!(!ends_by_default(libc::SIGCHLD) && !ends_by_default(libc::SIGTSTP));
        assert!(!ends_by_default(0));
        // This test process: Rust ignores SIGPIPE.
        let me = SignalDisposition::read(getpid()).unwrap();
        assert!(me.handles(libc::SIGPIPE));
    }

    #[test]
    fn this_process_reads_as_alive() {
        let me = ProcStat::read(getpid()).unwrap();
        assert!(!me.is_dead());
        assert!(me.start_ticks > 0);
    }
}
