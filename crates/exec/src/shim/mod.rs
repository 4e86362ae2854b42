//! The shim: the parent of one task, and the reason a task outlives the agent.
//!
//! The driver starts one shim per task (on the `posix_spawn` fast path: the agent forks
//! nothing and runs no code in the child). The shim then, in this order:
//! 1. closes every descriptor it inherited beyond stdin, stdout and stderr, leaves the agent's
//!    session (`setsid`), so nothing aimed at the agent's terminal or group reaches it, and
//!    becomes a child subreaper, so every process the task leaves behind is re-parented to it
//!    rather than to init;
//! 2. starts the task with `posix_spawn` (a vfork-style clone: the shim is small, but fork and
//!    exec still took it a few times longer) in a session and process group of its own (its
//!    pid is both ids), in its working directory, with the shim's environment, which the
//!    driver set to exactly the task's;
//! 3. writes one line on its stdout for the driver (the start report): the task's pid and start
//!    time, or why it could not start; then it yields the CPU once, so that the driver it has
//!    just woken runs first; only then does it create files (the log files and the run
//!    directory), the slowest step on a busy file system and not needed before the task has
//!    run: its first output waits in the pipes;
//! 4. copies the task's stdout and stderr into size-rotated files (module `logs`) and reaps every
//!    child it has, until the task's main process exits;
//! 5. then kills whatever the task left behind (its process group, and any descendant that
//!    escaped it, which the subreaper setting has made the shim's child), reaps it all, drains
//!    the pipes, and records the exit status durably (temp file, fsync, rename, fsync of the
//!    directory) in the run directory, then exits.
//!
//! So the shim's exit means the whole task is gone and its exit record is on disk, whether or
//! not the agent is alive to see it. The shim is single-threaded, has no async runtime and
//! allocates almost nothing: about 0.5 MiB of private memory, most of it the binary's own
//! pages, which shims running side by side share.
//!
//! It writes its own diagnostics (panics included) to `shim.log` in the run directory, made
//! only when there is something to say; it never signals anything but its own children and
//! the task's process group, pinned by a pidfd.

mod logs;

use crate::protocol::{self, EXIT_FILE, SHIM_LOG, ShimArgs, Stage, StartReport};
use crate::sys::{self, Pid, ProcStat, WaitStatus};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use logs::RotatingLog;

/// After the task's main process exits, how long the shim waits for the rest of its processes
/// to die and its pipes to close before it records the exit anyway.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// Runs the shim and exits, if this process was started as one; returns at once otherwise.
///
/// This is how a program embeds the shim rather than ship the `wharf-shim` binary beside
/// itself (cargo builds a dependency's library, never its binaries): call it first thing in
/// `main`, and make the program its own shim with
/// `RawExecDriver::with_shim(std::env::current_exe()?)` (or
/// [`RawExecOptions::shim_path`](crate::RawExecOptions::shim_path)). The driver starts a shim
/// with a first argument that names the shim protocol, `wharf-shim-1`; with any other
/// command line this returns at once and the program goes on as usual.
///
/// Started as the shim, the process must have one thread: the shim closes every descriptor it
/// inherited beyond stdin, stdout and stderr, and another thread (an async runtime's, for one)
/// may own some. So call it before any thread starts and before an async runtime is built
/// (`#[tokio::main]` builds one before `main`'s body runs: build it by hand after this call).
/// A process with more threads refuses to be the shim: the driver's start fails with a
/// message that says so, and the process exits with status 2.
///
/// ```no_run
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     wharf_exec::shim::run_if_invoked(); // never returns when started as the shim
///     let driver = wharf_exec::RawExecDriver::with_shim(std::env::current_exe()?);
///     // ... build a tokio runtime and use the driver
///     # drop(driver);
///     Ok(())
/// }
/// ```
pub fn run_if_invoked() {
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new(protocol::SHIM_PROTOCOL))
    {
        return;
    }
    let code = match std::fs::read_dir("/proc/self/task").map(Iterator::count) {
        // SAFETY: this thread is the process's only one, and it never returns to the code that
        // called it (the process exits below): nothing that owned a descriptor above 2 runs
        // again.
        Ok(1) => unsafe { run() },
        threads => {
            let threads =
                threads.map_or_else(|e| format!("an unknown number ({e}) of"), |n| n.to_string());
            let message = format!(
                "the program embedding the shim had {threads} threads when started as the shim; \
                 call wharf_exec::shim::run_if_invoked() first in main, before any thread or \
                 async runtime starts"
            );
            let _ = report(&StartReport::Failed { stage: Stage::Setup, errno: 0, message });
            2
        }
    };
    std::process::exit(i32::from(code))
}

/// The shim's entry point: the `wharf-shim` binary's `main` calls it and nothing else. A
/// program that embeds the shim calls [`run_if_invoked`] instead.
///
/// # Safety
///
/// Call it first thing in the program's `main`, with nothing else running: it closes every
/// descriptor above 2 (the shim must not pass on what it inherited), which would pull them
/// from under any other owner.
pub unsafe fn main() -> ExitCode {
    // SAFETY: the caller's promise is this function's.
    ExitCode::from(unsafe { run() })
}

/// The shim's whole life; returns its exit status.
///
/// # Safety
///
/// As for [`main`].
unsafe fn run() -> u8 {
    // SAFETY: the caller runs this first in `main`, so nothing owns a descriptor above 2.
    unsafe { sys::close_inherited_fds() };
    let args = match ShimArgs::parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            let _ = report(&StartReport::Failed { stage: Stage::Setup, errno: 0, message });
            return 2;
        }
    };
    let mut diag = Diag::new(&args.run_dir);
    let panic_log = diag.path.clone();
    std::panic::set_hook(Box::new(move |info| {
        Diag { path: panic_log.clone(), file: None }.note(&format!("panicked: {info}"));
    }));
    match supervise(&args, &mut diag) {
        Ok(()) => 0,
        Err(message) => {
            diag.note(&message);
            1
        }
    }
}

/// Writes the start report to the driver; false if the driver has closed its end (it gave up
/// on the start, or died). SIGPIPE is ignored by Rust's runtime, so that is an error here.
fn report(report: &StartReport) -> bool {
    let mut out = io::stdout().lock();
    out.write_all(report.line().as_bytes()).and_then(|()| out.flush()).is_ok()
}

/// Diagnostics for people, appended to `shim.log`, which is made only when there is something
/// to say (a start costs one file fewer); lost if it cannot be opened.
struct Diag {
    path: PathBuf,
    file: Option<File>,
}

impl Diag {
    fn new(run_dir: &Path) -> Diag {
        Diag { path: run_dir.join(SHIM_LOG), file: None }
    }

    fn note(&mut self, message: &str) {
        if self.file.is_none() {
            let open = || OpenOptions::new().create(true).append(true).open(&self.path);
            self.file = open()
                .or_else(|e| match self.path.parent() {
                    // Notes can come before the run directory is made.
                    Some(dir) if e.kind() == io::ErrorKind::NotFound => {
                        std::fs::create_dir_all(dir).and_then(|()| open())
                    }
                    _ => Err(e),
                })
                .ok();
        }
        if let Some(file) = &mut self.file {
            let _ = writeln!(file, "wharf-shim[{}]: {message}", sys::getpid());
        }
    }
}

fn failed(stage: Stage, error: &io::Error, what: &str) -> StartReport {
    StartReport::Failed {
        stage,
        errno: error.raw_os_error().unwrap_or(0),
        message: format!("{what}: {error}"),
    }
}

fn supervise(args: &ShimArgs, diag: &mut Diag) -> Result<(), String> {
    let setup = sys::setsid()
        .map_err(|e| failed(Stage::Setup, &e, "setsid"))
        .and_then(|()| sys::set_child_subreaper().map_err(|e| failed(Stage::Setup, &e, "prctl")))
        .and_then(|()| sys::sigchld_fd().map_err(|e| failed(Stage::Setup, &e, "signalfd")));
    let sigchld = match setup {
        Ok(fd) => fd,
        Err(failure) => {
            let _ = report(&failure);
            return Err(failure.line());
        }
    };
    let (pid, pipes) = match spawn_task(args) {
        Ok(spawned) => spawned,
        Err(failure) => {
            let _ = report(&failure);
            return Err(failure.line());
        }
    };
    // The task is our unreaped child, so this pidfd is certainly its. It pins the process
    // group's id for the final kill.
    let pidfd = Pid::new(pid.into()).and_then(|p| sys::pidfd_open(p).ok());
    let start_ticks = ProcStat::read(pid).map_or(0, |s| s.start_ticks);
    let mut supervisor = Supervisor { pid, pidfd, sigchld, pipes, logs: [None, None], diag };
    if !report(&StartReport::Started { pid, start_ticks }) {
        // No handle for this task will ever exist, so nobody could stop it: it goes now. The
        // loop below still reaps it and everything it started.
        supervisor.diag.note("the driver went away before hearing of the start; killing the task");
        supervisor.kill_leftovers();
    }
    // The driver, woken by the report, is waiting for a CPU. With the task starting on one
    // core and this shim creating files on the other, it would wait for both: about 1 ms on a
    // two-core machine, more than the whole start. Stepping aside once lets it run first.
    sys::yield_cpu();

    // Creating files is the slowest part of a start on a busy file system, and nothing below
    // is needed before the task has run a while: it is done after the report, off the start's
    // path. The task's first output waits in its pipes meanwhile. A log file that cannot be
    // opened is noted, and its output dropped, as when a disk fills up later.
    let name = args.log_name.to_string_lossy();
    let logs = ["stdout", "stderr"].map(|stream| {
        let stem = format!("{name}.{stream}");
        RotatingLog::open(&args.log_dir, stem, args.max_file_bytes, args.max_files)
            .map_err(|e| {
                let path = args.log_dir.join(format!("{name}.{stream}.0"));
                supervisor
                    .diag
                    .note(&format!("cannot open {}, dropping the output: {e}", path.display()));
            })
            .ok()
    });
    supervisor.logs = logs;
    // A record left by an earlier start of the same run must not pass for this one's.
    if let Err(e) = std::fs::create_dir_all(&args.run_dir) {
        supervisor.diag.note(&format!("cannot create {}: {e}", args.run_dir.display()));
    }
    match std::fs::remove_file(args.run_dir.join(EXIT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            supervisor.diag.note(&format!("cannot remove an old exit record: {e}"));
        }
        _ => {}
    }

    let status = supervisor.run()?;
    record_exit(&args.run_dir, status).map_err(|e| format!("cannot record the exit status: {e}"))
}

/// Starts the task: in the working directory (the shim moves there itself, so the task
/// inherits it), with the shim's environment, its output on two new pipes. Returns its pid and
/// the pipes' read ends.
fn spawn_task(args: &ShimArgs) -> Result<(i32, [Option<OwnedFd>; 2]), StartReport> {
    let setup = |e: io::Error, what: &str| failed(Stage::Setup, &e, what);
    let cstring = |s: &std::ffi::OsStr| {
        CString::new(s.as_bytes())
            .map_err(|_| failed(Stage::Setup, &io::ErrorKind::InvalidInput.into(), "a NUL byte"))
    };
    let program = cstring(args.program.as_os_str())?;
    let argv = std::iter::once(args.arg0.as_os_str())
        .chain(args.args.iter().map(|a| a.as_os_str()))
        .map(cstring)
        .collect::<Result<Vec<_>, _>>()?;
    let envp = std::env::vars_os()
        .map(|(name, value)| {
            let mut entry = name;
            entry.push("=");
            entry.push(value);
            cstring(&entry)
        })
        .collect::<Result<Vec<_>, _>>()?;
    std::env::set_current_dir(&args.work_dir).map_err(|e| {
        failed(Stage::WorkDir, &e, &format!("cannot enter {}", args.work_dir.display()))
    })?;
    let null = File::open("/dev/null").map_err(|e| setup(e, "/dev/null"))?;
    let (out_read, out_write) = sys::pipe().map_err(|e| setup(e, "pipe"))?;
    let (err_read, err_write) = sys::pipe().map_err(|e| setup(e, "pipe"))?;
    let stdio = [null.as_fd(), out_write.as_fd(), err_write.as_fd()];
    let cannot_run =
        |e: &io::Error| failed(Stage::Spawn, e, &format!("cannot run {}", args.program.display()));
    let pid = if args.containment.is_empty() {
        sys::spawn_in_new_session(&program, &argv, &envp, stdio).map_err(|e| cannot_run(&e))?
    } else {
        // Containment steps need a child of our own between its clone and its exec.
        let contain = |errno: i32, message: String| StartReport::Failed {
            stage: Stage::Confine,
            errno,
            message,
        };
        let prepared = args.containment.prepare().map_err(|e| contain(0, e.to_string()))?;
        sys::spawn_contained(&program, &argv, &envp, stdio, &prepared).map_err(|failure| {
            match failure {
                sys::ChildFailure::Setup(errno) => {
                    setup(io::Error::from_raw_os_error(errno), "setsid, dup2 or namespaces")
                }
                sys::ChildFailure::Contain(failure) => {
                    contain(failure.errno, failure.describe(&args.containment))
                }
                sys::ChildFailure::Exec(errno) => cannot_run(&io::Error::from_raw_os_error(errno)),
            }
        })?
    };
    Ok((pid, [Some(out_read), Some(err_read)]))
}

/// The loop that copies output and reaps children.
struct Supervisor<'d> {
    pid: i32,
    pidfd: Option<OwnedFd>,
    sigchld: OwnedFd,
    pipes: [Option<OwnedFd>; 2],
    /// `None` for a stream whose file could not be opened: its output is dropped.
    logs: [Option<RotatingLog>; 2],
    diag: &'d mut Diag,
}

impl Supervisor<'_> {
    /// Runs until the task and everything it started are gone; returns how the main process
    /// ended.
    fn run(mut self) -> Result<WaitStatus, String> {
        let mut buf = [0u8; 16 * 1024];
        let mut main_exit: Option<(WaitStatus, Instant)> = None;
        let mut children_left = true;
        let mut log_failed = [false; 2];
        loop {
            let pipes_open = self.pipes.iter().any(Option::is_some);
            let timeout_ms = match main_exit {
                None => -1,
                Some((status, _)) if !children_left && !pipes_open => return Ok(status),
                Some((status, exited)) => {
                    #[allow(clippy::disallowed_methods)] // The shim has no tokio; a bounded wait.
                    let left = CLEANUP_LIMIT.saturating_sub(Instant::now() - exited);
                    if left.is_zero() {
                        self.diag.note(&format!(
                            "gave up after {CLEANUP_LIMIT:?}: children left: {children_left}, \
                             output still open: {pipes_open}"
                        ));
                        return Ok(status);
                    }
                    i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
                }
            };
            let fd = |pipe: &Option<OwnedFd>| pipe.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            let mut fds = [
                libc::pollfd { fd: self.sigchld.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: fd(&self.pipes[0]), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: fd(&self.pipes[1]), events: libc::POLLIN, revents: 0 },
            ];
            sys::poll(&mut fds, timeout_ms).map_err(|e| format!("poll: {e}"))?;

            for stream in 0..2 {
                if fds[stream + 1].revents == 0 {
                    continue;
                }
                let Some(pipe) = &self.pipes[stream] else { continue };
                match sys::read(pipe, &mut buf) {
                    Ok(0) => self.pipes[stream] = None,
                    Ok(n) => {
                        // A full disk must not stop the copying: the task would block on its
                        // pipe. Say so once and drop the output.
                        let Some(log) = &mut self.logs[stream] else { continue };
                        if let Err(e) = log.write(&buf[..n])
                            && !std::mem::replace(&mut log_failed[stream], true)
                        {
                            self.diag.note(&format!("cannot write the log, dropping output: {e}"));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        self.diag.note(&format!("cannot read the task's output: {e}"));
                        self.pipes[stream] = None;
                    }
                }
            }

            if fds[0].revents != 0 {
                sys::drain_signalfd(&self.sigchld);
                loop {
                    match sys::try_reap_any() {
                        Ok(Some((pid, status))) if pid == self.pid => {
                            #[allow(clippy::disallowed_methods)] // No tokio here.
                            let now = Instant::now();
                            main_exit = Some((status, now));
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => {
                            if e.raw_os_error() != Some(libc::ECHILD) {
                                self.diag.note(&format!("waitpid: {e}"));
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

    /// SIGKILL to the task's process group and to every child of the shim (descendants that
    /// left the group were re-parented here). Children cannot be reused pids: they are ours and
    /// unreaped.
    fn kill_leftovers(&mut self) {
        if let Some(group) = Pid::new(self.pid.into()) {
            let killed = match &self.pidfd {
                Some(pidfd) => sys::pidfd_kill_group(pidfd, group, libc::SIGKILL),
                None => sys::kill_group(group, libc::SIGKILL),
            };
            if let Err(e) = killed
                && e.raw_os_error() != Some(libc::ESRCH)
            {
                self.diag.note(&format!("cannot kill process group {group}: {e}"));
            }
        }
        for child in sys::own_children() {
            if let Some(child) = Pid::new(child.into()) {
                let _ = sys::kill(child, libc::SIGKILL);
            }
        }
    }
}

/// Writes the exit record so that it is either absent or complete, even across a power cut.
fn record_exit(run_dir: &Path, status: WaitStatus) -> io::Result<()> {
    let temp = run_dir.join(format!("{EXIT_FILE}.tmp"));
    let mut file = File::create(&temp)?;
    file.write_all(protocol::exit_record(status).as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, run_dir.join(EXIT_FILE))?;
    File::open(run_dir)?.sync_all()
}
