//! The shim's life, step by step (the module above says why each step is there), with no
//! allocator and no C library: this code is both the static `wharf-shim` and what
//! [`super::run_if_invoked`] runs inside a std program.

use super::args::Args;
use super::contain::{Failure, Plan};
use super::logs::RotatingLog;
use super::text::{Argv, Line, Lossy, parse_u64};
use core::cell::Cell;
use core::ffi::CStr;
use core::fmt::{self, Write};
use wharf_nolibc::sys::{self, Errno, MaskHow, PollFd, WaitStatus};

/// After the task's main process exits, how long the shim waits for the rest of its processes
/// to die and its pipes to close before it records the exit anyway.
const CLEANUP_LIMIT_MS: u64 = 5_000;
/// The exit record's file name in the run directory.
pub(crate) const EXIT_FILE: &CStr = c"exit";
const EXIT_TEMP: &CStr = c"exit.tmp";
/// The shim's own diagnostics, in the run directory.
pub(crate) const SHIM_LOG: &CStr = c"shim.log";
/// The first word of an exit record.
pub(crate) const EXIT_RECORD_VERSION: &str = "wharf-exit-1";

/// Where a start failed (the words of the start report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartStep {
    /// The shim itself could not get going (arguments, session, signals).
    Setup,
    /// The working directory could not be entered.
    WorkDir,
    /// A containment step failed (joining the task's cgroup, ...).
    Confine,
    /// The task could not be executed.
    Spawn,
}

impl StartStep {
    pub(crate) fn word(self) -> &'static str {
        match self {
            StartStep::Setup => "setup",
            StartStep::WorkDir => "work_dir",
            StartStep::Confine => "confine",
            StartStep::Spawn => "spawn",
        }
    }
}

/// Writes the start report's failure line (`failed <step> <errno> <message>`) to the
/// driver; a closed pipe is not an error worth more than the exit that follows.
// Out of line, as every path that holds a large buffer: the buffer would otherwise sit in the
// caller's frame, and a frame's pages are written (stack probes) whether or not the path runs,
// each one a private page of every shim.
#[cold]
#[inline(never)]
pub(crate) fn report_failure(step: StartStep, errno: i32, message: fmt::Arguments<'_>) {
    let mut line = Line::<1024>::new();
    let _ = write!(line, "failed {} {errno} {message}", step.word());
    line.replace(b'\n', b' ');
    line.truncate(1023).push(b"\n");
    let _ = sys::write_all(1, line.bytes());
}

/// The containment of `range` in `argv` ([`Plan::parse`]), or `None` after reporting the bad
/// argument to the driver as a failed start.
pub(crate) fn read_containment<'a>(
    argv: &'a Argv<'a>,
    range: core::ops::Range<usize>,
) -> Option<Plan<'a>> {
    let bad = |arg: &CStr| {
        let arg = Lossy(arg.to_bytes());
        report_failure(StartStep::Setup, 0, format_args!("bad containment argument {arg}"));
    };
    Plan::parse(argv, range).map_err(bad).ok()
}

/// The buffer the output is copied through. It costs private memory only once output flows:
/// a task that writes nothing leaves it untouched.
#[repr(C, align(16))]
struct OutputBuffer([u8; BUFFER_LEN]);
const BUFFER_LEN: usize = 8 * 1024;
static mut OUTPUT: OutputBuffer = OutputBuffer([0; BUFFER_LEN]);

/// The stack of the task's process between its clone and its exec: mapped for the clone and
/// given back once the program runs, so none of it stays in the shim. Generous, as only what
/// is written costs anything (a few hundred bytes for the static shim's child).
const CHILD_STACK_LEN: usize = 64 * 1024;

/// The shim's whole life after its arguments were read; returns its exit status.
///
/// # Safety
///
/// The process has one thread, which runs nothing else from now on (the shim owns the output
/// buffer and every descriptor); `argv` holds `args` and `envp` is the environment.
pub(crate) unsafe fn run(
    args: &Args<'_>,
    argv: &Argv<'_>,
    envp: *const *const u8,
    confine: &Plan<'_>,
) -> u8 {
    let mut diag = Diag { run_dir: args.run_dir, fd: -1 };
    // SAFETY: the caller's promise; a supervise call owns the output buffer.
    match unsafe { supervise(args, argv, envp, confine, &mut diag) } {
        Ok(()) => 0,
        Err(message) => {
            diag.note(format_args!("{}", Lossy(message.bytes())));
            1
        }
    }
}

/// Diagnostics for people, appended to `shim.log` in the run directory, which is made only
/// when there is something to say; lost if it cannot be opened.
pub(crate) struct Diag<'a> {
    pub(crate) run_dir: &'a CStr,
    pub(crate) fd: i32,
}

impl Diag<'_> {
    #[cold]
    #[inline(never)]
    pub(crate) fn note(&mut self, message: fmt::Arguments<'_>) {
        if self.fd < 0 {
            let flags = sys::O_WRONLY | sys::O_CREAT | sys::O_APPEND | sys::O_CLOEXEC;
            let open = |dir: i32| sys::openat(dir, SHIM_LOG, flags, 0o644);
            self.fd = match open_dir(self.run_dir) {
                // Notes can come before the run directory is made.
                Err(Errno(sys::ENOENT)) => make_dirs(self.run_dir).and_then(|dir| {
                    let fd = open(dir);
                    sys::close(dir);
                    fd
                }),
                Err(e) => Err(e),
                Ok(dir) => {
                    let fd = open(dir);
                    sys::close(dir);
                    fd
                }
            }
            .unwrap_or(-1);
        }
        let mut line = Line::<2048>::new();
        let _ = writeln!(line, "wharf-shim[{}]: {message}", sys::getpid());
        let _ = sys::write_all(self.fd, line.bytes());
    }
}

fn open_dir(path: &CStr) -> Result<i32, Errno> {
    sys::open(path, sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC, 0)
}

/// Makes the directory `path` and any missing parents; returns it opened.
fn make_dirs(path: &CStr) -> Result<i32, Errno> {
    match sys::mkdirat(sys::AT_FDCWD, path, 0o755) {
        Ok(()) | Err(Errno(sys::EEXIST)) => open_dir(path),
        Err(Errno(sys::ENOENT)) => open_each_dir(path.to_bytes(), true),
        Err(e) => Err(e),
    }
}

/// Opens the log directory. The task may write in the directory that holds it (its own
/// directory), and so may have put a link in its place, aimed anywhere: the log directory
/// itself is opened without following a link ([`wharf_nolibc::open_beneath`]), relative to its
/// parent, which is the agent's and is opened as any path. Root creates the log files in
/// what is opened: never in a directory the task chose.
fn open_log_dir(path: &CStr) -> Result<i32, Errno> {
    let bytes = path.to_bytes_with_nul();
    // The last slash that starts a name: `/a/logs` and `/a/logs/` both name `logs` in `/a`.
    let split = (0..bytes.len().saturating_sub(2))
        .rev()
        .find(|&at| bytes[at] == b'/' && !matches!(bytes[at + 1], b'/' | 0));
    let flags = sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC;
    let Some(split) = split else {
        // `/` itself, or a name in the working directory.
        return if bytes.first() == Some(&b'/') {
            open_dir(path)
        } else {
            wharf_nolibc::open_beneath(sys::AT_FDCWD, path, flags, 0)
        };
    };
    let name = CStr::from_bytes_with_nul(&bytes[split + 1..]).map_err(|_| Errno(sys::EINVAL))?;
    let parent = if split == 0 { open_dir(c"/")? } else { open_each_dir(&bytes[..split], false)? };
    let opened = wharf_nolibc::open_beneath(parent, name, flags, 0);
    sys::close(parent);
    opened
}

/// Opens (and with `make`, makes where missing) the directory `path` a component at a time,
/// each relative to the one before, so that no copy of the whole path is needed; returns the
/// last one opened. A component that exists is only looked up: making a directory locks its
/// parent, which every shim shares.
#[inline(never)]
fn open_each_dir(path: &[u8], make: bool) -> Result<i32, Errno> {
    let mut dir = if path.starts_with(b"/") { open_dir(c"/")? } else { sys::AT_FDCWD };
    for component in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        let mut name = Line::<256>::new();
        let next = match name.push(component).c_str() {
            // Longer than a file name can be.
            None => Err(Errno(sys::ENAMETOOLONG)),
            Some(name) => {
                let open =
                    || sys::openat(dir, name, sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC, 0);
                match open() {
                    Err(Errno(sys::ENOENT)) if make => match sys::mkdirat(dir, name, 0o755) {
                        Ok(()) | Err(Errno(sys::EEXIST)) => open(),
                        Err(e) => Err(e),
                    },
                    opened => opened,
                }
            }
        };
        if dir != sys::AT_FDCWD {
            sys::close(dir);
        }
        dir = next?;
    }
    if dir == sys::AT_FDCWD { open_dir(c".") } else { Ok(dir) }
}

/// The steps of the module docs; the error is a note for `shim.log`.
///
/// # Safety
///
/// As for [`run`].
unsafe fn supervise<'a>(
    args: &Args<'a>,
    argv: &Argv<'_>,
    envp: *const *const u8,
    confine: &Plan<'_>,
    diag: &mut Diag<'a>,
) -> Result<(), Line<256>> {
    let fail = |step: StartStep, errno: Errno, what: &str| {
        report_failure(step, errno.0, format_args!("{what}"));
        let mut line = Line::new();
        let _ = write!(line, "start failed: {what} (errno {})", errno.0);
        line
    };
    // A write to a pipe the driver closed must fail with EPIPE, not kill the shim.
    sys::set_ignored(sys::SIGPIPE, true).map_err(|e| fail(StartStep::Setup, e, "sigaction"))?;
    sys::setsid().map_err(|e| fail(StartStep::Setup, e, "setsid"))?;
    sys::set_child_subreaper().map_err(|e| fail(StartStep::Setup, e, "prctl"))?;
    let sigchld = sys::sigchld_fd().map_err(|e| fail(StartStep::Setup, e, "signalfd"))?;
    sys::chdir(args.work_dir).map_err(|e| fail(StartStep::WorkDir, e, "cannot enter"))?;
    let null = sys::open(c"/dev/null", sys::O_RDONLY | sys::O_CLOEXEC, 0)
        .map_err(|e| fail(StartStep::Setup, e, "/dev/null"))?;
    let (out_read, out_write) = sys::pipe().map_err(|e| fail(StartStep::Setup, e, "pipe"))?;
    let (err_read, err_write) = sys::pipe().map_err(|e| fail(StartStep::Setup, e, "pipe"))?;

    // SAFETY: the caller's promise: `envp` is the environment.
    let spawned = unsafe { spawn(args, argv, envp, [null, out_write, err_write], confine) };
    for fd in [null, out_write, err_write] {
        sys::close(fd);
    }
    let pid = match spawned {
        Ok(pid) => pid,
        Err(ChildFailure::Setup(e)) => {
            return Err(fail(StartStep::Setup, e, "setsid, dup2 or clone"));
        }
        Err(ChildFailure::Exec(e)) => return Err(fail(StartStep::Spawn, e, "cannot run")),
        Err(ChildFailure::Confine(failure)) => return Err(confine_failed(confine, failure)),
    };
    // The task is our unreaped child, so this pidfd is certainly its. It pins the process
    // group's id for the final kill.
    let pidfd = sys::pidfd_open(pid).unwrap_or(-1);
    let start_ticks = start_ticks(pid).unwrap_or(0);
    let mut supervisor = Supervisor {
        pid,
        pidfd,
        sigchld,
        pipes: [out_read, err_read],
        logs: [None, None],
        log_dir: -1,
        diag,
    };
    let mut report = Line::<64>::new();
    let _ = writeln!(report, "started {pid} {start_ticks}");
    if sys::write_all(1, report.bytes()).is_err() {
        // No handle for this task will ever exist, so nobody could stop it: it goes now. The
        // loop below still reaps it and everything it started.
        supervisor.diag.note(format_args!(
            "the driver went away before hearing of the start; killing the task"
        ));
        supervisor.kill_leftovers();
    }
    sys::close(1);
    // The driver, woken by the report, is waiting for a CPU. With the task starting on one
    // core and this shim creating files on the other, it would wait for both: stepping aside
    // once lets it run first.
    sys::yield_cpu();

    // Creating files is the slowest part of a start on a busy file system, and nothing below
    // is needed before the task has run a while: the task's first output waits in its pipes.
    // A log file that cannot be opened is noted, and its output dropped.
    match open_log_dir(args.log_dir) {
        Ok(dir) => {
            for (index, stream) in ["stdout", "stderr"].into_iter().enumerate() {
                let (task, limit, files) = (args.log_name, args.max_file_bytes, args.max_files);
                supervisor.logs[index] = match RotatingLog::open(dir, task, stream, limit, files) {
                    Ok(log) => Some(log),
                    Err(e) => {
                        supervisor.diag.note(format_args!(
                            "cannot open {}/{}.{stream}.0, dropping the output (errno {})",
                            Lossy(args.log_dir.to_bytes()),
                            Lossy(task),
                            e.0
                        ));
                        None
                    }
                };
            }
            supervisor.log_dir = dir;
        }
        Err(e) => supervisor.diag.note(format_args!(
            "cannot open {}, dropping the output (errno {})",
            Lossy(args.log_dir.to_bytes()),
            e.0
        )),
    }
    // A record left by an earlier start of the same run must not pass for this one's.
    let run_dir = make_dirs(args.run_dir);
    if let Ok(dir) = run_dir {
        match sys::unlinkat(dir, EXIT_FILE) {
            Ok(()) | Err(Errno(sys::ENOENT)) => {}
            Err(e) => supervisor
                .diag
                .note(format_args!("cannot remove an old exit record (errno {})", e.0)),
        }
    }

    let status = supervisor.run().map_err(|e| {
        let mut line = Line::new();
        let _ = write!(line, "poll failed (errno {})", e.0);
        line
    })?;
    let recorded = run_dir.and_then(|dir| record_exit(dir, status));
    recorded.map_err(|e| {
        let mut line = Line::new();
        let _ = write!(line, "cannot record the exit status (errno {})", e.0);
        line
    })
}

/// Reports that the task could not be contained; the note for `shim.log`.
#[cold]
#[inline(never)]
fn confine_failed(confine: &Plan<'_>, failure: Failure) -> Line<256> {
    let mut message = Line::<1024>::new();
    let _ = confine.describe(failure, &mut message);
    report_failure(StartStep::Confine, failure.errno, format_args!("{}", Lossy(message.bytes())));
    let mut line = Line::new();
    let _ = write!(line, "start failed: {}", Lossy(message.bytes()));
    line
}

/// How the task's process failed before its program ran.
#[derive(Debug, Clone, Copy)]
enum ChildFailure {
    Setup(Errno),
    Confine(Failure),
    Exec(Errno),
}

/// What the task's process reads, on the shim's memory.
struct ChildArgs<'a> {
    program: &'a CStr,
    argv: *const *const u8,
    envp: *const *const u8,
    stdio: [i32; 3],
    confine: &'a Plan<'a>,
    /// Written by the child if it fails.
    failure: Cell<Option<ChildFailure>>,
}

/// Starts the task in a session of its own (its pid is its process group), its stdio on
/// `stdio`, contained by `confine`, with signals unblocked and SIGPIPE at its default. A
/// vfork-style clone: it costs the same however large the shim is, and the shim waits until
/// the program runs or the child failed.
///
/// # Safety
///
/// `envp` is a null-terminated array of environment strings.
unsafe fn spawn(
    args: &Args<'_>,
    argv: &Argv<'_>,
    envp: *const *const u8,
    stdio: [i32; 3],
    confine: &Plan<'_>,
) -> Result<i32, ChildFailure> {
    confine.before_clone().map_err(ChildFailure::Setup)?;
    let child = ChildArgs {
        program: args.program,
        argv: argv.tail(args.task_argv),
        envp,
        stdio,
        confine,
        failure: Cell::new(None),
    };
    let stack = sys::map_stack(CHILD_STACK_LEN).map_err(ChildFailure::Setup)?;
    let pid = match sys::sigprocmask(MaskHow::Set, !0) {
        Err(e) => Err(e),
        Ok(old) => {
            // SAFETY: the stack's top is page-aligned, and nothing else uses the stack until
            // the child has executed or exited (CLONE_VFORK suspends this thread until then);
            // `child_main` makes system calls only and never returns; `child` outlives its
            // use. Signals are blocked.
            let pid = unsafe {
                let top = stack.add(CHILD_STACK_LEN);
                sys::clone_vfork(top, child_main, (&raw const child).cast_mut().cast())
            };
            let _ = sys::sigprocmask(MaskHow::Set, old);
            pid
        }
    };
    // SAFETY: the child has executed or exited, so its stack is no longer used.
    unsafe { sys::unmap_stack(stack, CHILD_STACK_LEN) };
    let pid = pid.map_err(ChildFailure::Setup)?;
    // SAFETY: the child has executed or exited, so nothing writes the cell any more; a volatile
    // read, since the write happened behind the compiler's back.
    match unsafe { core::ptr::read_volatile(child.failure.as_ptr()) } {
        None => Ok(pid),
        Some(failure) => {
            let _ = sys::reap(pid);
            Err(failure)
        }
    }
}

/// The task's process between its clone and its exec.
extern "C" fn child_main(arg: *mut u8) -> ! {
    // SAFETY: `arg` is the `ChildArgs` the shim passed; it waits while this runs.
    let child = unsafe { &*(arg as *const ChildArgs<'_>) };
    let fail = |failure: ChildFailure| -> ! {
        // SAFETY: the shim reads the cell only after this process has exited.
        unsafe { core::ptr::write_volatile(child.failure.as_ptr(), Some(failure)) };
        sys::exit(127)
    };
    if let Err(e) = sys::setsid() {
        fail(ChildFailure::Setup(e));
    }
    for (target, fd) in (0..).zip(child.stdio) {
        if let Err(e) = sys::dup_to(fd, target) {
            fail(ChildFailure::Setup(e));
        }
    }
    if let Err(failure) = child.confine.apply() {
        fail(ChildFailure::Confine(failure));
    }
    let _ = sys::set_ignored(sys::SIGPIPE, false);
    let _ = sys::sigprocmask(MaskHow::Set, 0);
    // SAFETY: `argv` and `envp` are the shim's own null-terminated arrays.
    let errno = unsafe { sys::execve(child.program, child.argv, child.envp) };
    fail(ChildFailure::Exec(errno))
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`, counted from the last `)` since the command name may hold anything).
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let mut path = Line::<32>::new();
    let _ = write!(path, "/proc/{pid}/stat");
    let fd = sys::open(path.c_str()?, sys::O_RDONLY | sys::O_CLOEXEC, 0).ok()?;
    // The fields up to the 22nd fit in 512 bytes: the name is at most 15 bytes, a number 20.
    let mut buf = [0u8; 512];
    let read = sys::read(fd, &mut buf);
    sys::close(fd);
    let text = &buf[..read.ok()?];
    let rest = &text[text.iter().rposition(|b| *b == b')')? + 1..];
    let field = rest.split(|b| *b == b' ').filter(|f| !f.is_empty()).nth(22 - 3)?;
    parse_u64(field)
}

/// The loop that copies output and reaps children.
struct Supervisor<'d, 'a> {
    pid: i32,
    /// -1 if it could not be opened.
    pidfd: i32,
    sigchld: i32,
    /// -1 once closed.
    pipes: [i32; 2],
    /// `None` for a stream whose file could not be opened: its output is dropped.
    logs: [Option<RotatingLog<'a>>; 2],
    log_dir: i32,
    diag: &'d mut Diag<'a>,
}

impl Supervisor<'_, '_> {
    /// Runs until the task and everything it started are gone; returns how the main process
    /// ended.
    fn run(&mut self) -> Result<WaitStatus, Errno> {
        // SAFETY: only this loop uses the output buffer (the caller's promise to `run`).
        let buf = unsafe { &mut *(&raw mut OUTPUT).cast::<[u8; BUFFER_LEN]>() };
        let mut main_exit: Option<(WaitStatus, u64)> = None;
        let mut children_left = true;
        let mut log_failed = [false; 2];
        loop {
            let pipes_open = self.pipes.iter().any(|fd| *fd >= 0);
            let timeout_ms = match main_exit {
                None => -1,
                Some((status, _)) if !children_left && !pipes_open => return Ok(status),
                Some((status, exited)) => {
                    let left = CLEANUP_LIMIT_MS.saturating_sub(sys::monotonic_ms() - exited);
                    if left == 0 {
                        self.diag.note(format_args!(
                            "gave up after {CLEANUP_LIMIT_MS} ms: children left: \
                             {children_left}, output still open: {pipes_open}"
                        ));
                        return Ok(status);
                    }
                    left as i64 + 1
                }
            };
            let mut fds = [
                PollFd { fd: self.sigchld, events: sys::POLLIN, revents: 0 },
                PollFd { fd: self.pipes[0], events: sys::POLLIN, revents: 0 },
                PollFd { fd: self.pipes[1], events: sys::POLLIN, revents: 0 },
            ];
            sys::poll(&mut fds, timeout_ms)?;

            for stream in 0..2 {
                if fds[stream + 1].revents == 0 || self.pipes[stream] < 0 {
                    continue;
                }
                match sys::read(self.pipes[stream], buf) {
                    Ok(0) => self.close_pipe(stream),
                    Ok(n) => {
                        // A full disk must not stop the copying: the task would block on its
                        // pipe. Say so once and drop the output.
                        let Some(log) = &mut self.logs[stream] else { continue };
                        if let Err(e) = log.write(&buf[..n])
                            && !core::mem::replace(&mut log_failed[stream], true)
                        {
                            self.diag.note(format_args!(
                                "cannot write the log, dropping output (errno {})",
                                e.0
                            ));
                        }
                    }
                    Err(Errno(sys::EAGAIN)) => {}
                    Err(e) => {
                        self.diag
                            .note(format_args!("cannot read the task's output (errno {})", e.0));
                        self.close_pipe(stream);
                    }
                }
            }

            if fds[0].revents != 0 {
                while matches!(sys::read(self.sigchld, buf), Ok(n) if n > 0) {}
                loop {
                    match sys::try_reap(-1) {
                        Ok(Some((pid, status))) if pid == self.pid => {
                            main_exit = Some((status, sys::monotonic_ms()));
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => {
                            if e.0 != sys::ECHILD {
                                self.diag.note(format_args!("waitpid failed (errno {})", e.0));
                            }
                            children_left = false;
                            break;
                        }
                    }
                }
                if main_exit.is_some() && children_left {
                    self.kill_leftovers();
                }
            }
        }
    }

    fn close_pipe(&mut self, stream: usize) {
        sys::close(self.pipes[stream]);
        self.pipes[stream] = -1;
    }

    /// SIGKILL to the task's process group and to every child of the shim (descendants that
    /// left the group were re-parented here). Children cannot be reused pids: they are ours
    /// and unreaped.
    fn kill_leftovers(&mut self) {
        let killed = match self.pidfd {
            -1 => sys::kill(-self.pid, sys::SIGKILL),
            pidfd => match sys::pidfd_kill_group(pidfd, sys::SIGKILL) {
                // Before Linux 6.9: by number; the unreaped leader pins the group's id.
                Err(Errno(sys::EINVAL)) => sys::kill(-self.pid, sys::SIGKILL),
                result => result,
            },
        };
        if let Err(e) = killed
            && e.0 != sys::ESRCH
        {
            self.diag.note(format_args!("cannot kill process group {} (errno {})", self.pid, e.0));
        }
        for_each_child(|child| {
            let _ = sys::kill(child, sys::SIGKILL);
        });
    }
}

/// Calls `f` with each direct child of this (single-threaded) process.
fn for_each_child(mut f: impl FnMut(i32)) {
    let me = sys::getpid();
    let mut path = Line::<64>::new();
    let _ = write!(path, "/proc/{me}/task/{me}/children");
    let Some(path) = path.c_str() else { return };
    match sys::open(path, sys::O_RDONLY | sys::O_CLOEXEC, 0) {
        Ok(fd) => {
            for_each_number(fd, &mut f);
            sys::close(fd);
        }
        // Kernels built without CONFIG_PROC_CHILDREN: ask every process for its parent.
        Err(_) => for_each_process(|pid| {
            if parent_of(pid) == Some(me) {
                f(pid);
            }
        }),
    }
}

/// Calls `f` with each space-separated number read from `fd`.
fn for_each_number(fd: i32, f: &mut impl FnMut(i32)) {
    let mut buf = [0u8; 512];
    let mut number: Option<i32> = None;
    while let Ok(n @ 1..) = sys::read(fd, &mut buf) {
        for byte in &buf[..n] {
            if byte.is_ascii_digit() {
                let digit = i32::from(byte - b'0');
                number = Some(number.unwrap_or(0).saturating_mul(10).saturating_add(digit));
            } else if let Some(done) = number.take() {
                f(done);
            }
        }
    }
    if let Some(done) = number {
        f(done);
    }
}

/// Calls `f` with each process id in `/proc`.
fn for_each_process(mut f: impl FnMut(i32)) {
    let Ok(proc) = sys::open(c"/proc", sys::O_RDONLY | sys::O_DIRECTORY | sys::O_CLOEXEC, 0) else {
        return;
    };
    let mut buf = [0u8; 2048];
    while let Ok(n @ 1..) = sys::getdents(proc, &mut buf) {
        // Each record: inode (8), offset (8), length (2), type (1), NUL-terminated name.
        let mut at = 0;
        while at + 19 < n {
            let len = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
            let name = &buf[at + 19..(at + len).min(n)];
            let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
            if let Some(pid) = parse_u64(name).and_then(|p| i32::try_from(p).ok()) {
                f(pid);
            }
            at += len.max(1);
        }
    }
    sys::close(proc);
}

/// The parent of `pid` (field 4 of `/proc/<pid>/stat`).
fn parent_of(pid: i32) -> Option<i32> {
    let mut path = Line::<32>::new();
    let _ = write!(path, "/proc/{pid}/stat");
    let fd = sys::open(path.c_str()?, sys::O_RDONLY | sys::O_CLOEXEC, 0).ok()?;
    let mut buf = [0u8; 512];
    let read = sys::read(fd, &mut buf);
    sys::close(fd);
    let text = &buf[..read.ok()?];
    let rest = &text[text.iter().rposition(|b| *b == b')')? + 1..];
    let field = rest.split(|b| *b == b' ').filter(|f| !f.is_empty()).nth(4 - 3)?;
    parse_u64(field).and_then(|p| i32::try_from(p).ok())
}

/// The exit record for `status`, newline included.
pub(crate) fn exit_record(status: WaitStatus, out: &mut dyn Write) -> fmt::Result {
    match status {
        WaitStatus::Exited(code) => writeln!(out, "{EXIT_RECORD_VERSION} exited {code}"),
        WaitStatus::Signaled(signal) => writeln!(out, "{EXIT_RECORD_VERSION} signaled {signal}"),
    }
}

/// Writes the exit record in the run directory `dir` so that it is either absent or complete,
/// even across a power cut: a temporary file, fsync, rename, fsync of the directory.
fn record_exit(dir: i32, status: WaitStatus) -> Result<(), Errno> {
    let mut record = Line::<64>::new();
    let _ = exit_record(status, &mut record);
    let flags = sys::O_WRONLY | sys::O_CREAT | sys::O_TRUNC | sys::O_NOFOLLOW | sys::O_CLOEXEC;
    let file = sys::openat(dir, EXIT_TEMP, flags, 0o644)?;
    let written = sys::write_all(file, record.bytes()).and_then(|()| sys::fsync(file));
    sys::close(file);
    written?;
    sys::renameat(dir, EXIT_TEMP, EXIT_FILE)?;
    // An O_PATH descriptor cannot be synced: open the directory for reading.
    let synced = sys::openat(dir, c".", sys::O_RDONLY | sys::O_DIRECTORY | sys::O_CLOEXEC, 0)?;
    let result = sys::fsync(synced);
    sys::close(synced);
    result
}
