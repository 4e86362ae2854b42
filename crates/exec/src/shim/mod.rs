//! The shim: the parent of one task, and the reason a task outlives the agent.
//!
//! The driver starts one shim per task (on the `posix_spawn` fast path: the agent forks
//! nothing and runs no code in the child). The shim then, in this order:
//! 1. leaves the agent's session (`setsid`), so nothing aimed at the agent's terminal or group
//!    reaches it, and becomes a child subreaper, so every process the task leaves behind is
//!    re-parented to it rather than to init;
//! 2. opens the task's log files and starts the task in a session and process group of its own
//!    (its pid is both ids), with the shim's environment, which the driver set to exactly the
//!    task's;
//! 3. writes one line on its stdout for the driver (the start report): the task's pid and start
//!    time, or why it could not start;
//! 4. copies the task's stdout and stderr into size-rotated files (module `logs`) and reaps every
//!    child it has, until the task's main process exits;
//! 5. then kills whatever the task left behind (its process group, and any descendant that
//!    escaped it, which the subreaper setting has made the shim's child), reaps it all, drains
//!    the pipes, and records the exit status durably (temp file, fsync, rename, fsync of the
//!    directory) in the run directory, then exits.
//!
//! So the shim's exit means the whole task is gone and its exit record is on disk, whether or
//! not the agent is alive to see it. The shim is single-threaded, has no async runtime and
//! allocates almost nothing: its private memory stays in the low hundreds of KiB.
//!
//! It writes its own diagnostics to `shim.log` in the run directory; it never signals anything
//! but its own children and the task's process group, pinned by a pidfd.

mod logs;

use crate::protocol::{self, EXIT_FILE, SHIM_LOG, ShimArgs, Stage, StartReport};
use crate::sys::{self, Pid, ProcStat, WaitStatus};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use logs::RotatingLog;

/// After the task's main process exits, how long the shim waits for the rest of its processes
/// to die and its pipes to close before it records the exit anyway.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// The shim's entry point: `wharf-shim` is `fn main() -> ExitCode { wharf_exec::shim::main() }`.
/// A program that embeds the shim under another name calls this, and points the driver at
/// itself with [`crate::RawExecOptions::shim_path`].
pub fn main() -> ExitCode {
    let args = match ShimArgs::parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            report(&StartReport::Failed { stage: Stage::Setup, errno: 0, message });
            return ExitCode::from(2);
        }
    };
    let mut diag = Diag::open(&args.run_dir);
    match supervise(&args, &mut diag) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            diag.note(&message);
            ExitCode::FAILURE
        }
    }
}

/// Writes the start report to the driver. If the driver is gone there is no one to tell, and
/// the shim carries on (SIGPIPE is ignored by Rust's runtime).
fn report(report: &StartReport) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(report.line().as_bytes()).and_then(|()| out.flush());
}

/// Diagnostics for people, appended to `shim.log`; lost if that file cannot be opened.
struct Diag(Option<File>);

impl Diag {
    fn open(run_dir: &Path) -> Diag {
        Diag(OpenOptions::new().create(true).append(true).open(run_dir.join(SHIM_LOG)).ok())
    }

    fn note(&mut self, message: &str) {
        if let Some(file) = &mut self.0 {
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
            report(&failure);
            return Err(failure.line());
        }
    };
    let name = args.log_name.to_string_lossy();
    let open = |stream: &str| {
        RotatingLog::open(
            &args.log_dir,
            format!("{name}.{stream}"),
            args.max_file_bytes,
            args.max_files,
        )
        .map_err(|e| {
            let path = args.log_dir.join(format!("{name}.{stream}.0"));
            failed(Stage::Logs, &e, &format!("cannot open {}", path.display()))
        })
    };
    let logs = match open("stdout").and_then(|out| Ok([out, open("stderr")?])) {
        Ok(logs) => logs,
        Err(failure) => {
            report(&failure);
            return Err(failure.line());
        }
    };

    #[allow(clippy::disallowed_methods)] // The shim is where task processes are started.
    let mut command = std::process::Command::new(&args.program);
    command
        .arg0(&args.arg0)
        .args(&args.args)
        .current_dir(&args.work_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the hook runs in the forked child between fork and exec, where only
    // async-signal-safe calls are allowed; `task_child_setup` makes only such calls (setsid,
    // sigprocmask, signal) and allocates nothing.
    unsafe { command.pre_exec(sys::task_child_setup) };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let failure =
                failed(Stage::Spawn, &e, &format!("cannot run {}", args.program.display()));
            report(&failure);
            return Err(failure.line());
        }
    };
    let pid = child.id() as i32;
    let pipes = [child.stdout.take().map(OwnedFd::from), child.stderr.take().map(OwnedFd::from)];
    // The task is our unreaped child, so this pidfd is certainly its. It pins the process
    // group's id for the final kill.
    let pidfd = Pid::new(pid.into()).and_then(|p| sys::pidfd_open(p).ok());
    let start_ticks = ProcStat::read(pid).map_or(0, |s| s.start_ticks);
    report(&StartReport::Started { pid, start_ticks });

    let status = Supervisor { pid, pidfd, sigchld, pipes, logs, diag }.run()?;
    record_exit(&args.run_dir, status).map_err(|e| format!("cannot record the exit status: {e}"))
}

/// The loop that copies output and reaps children.
struct Supervisor<'d> {
    pid: i32,
    pidfd: Option<OwnedFd>,
    sigchld: OwnedFd,
    pipes: [Option<OwnedFd>; 2],
    logs: [RotatingLog; 2],
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
                        if let Err(e) = self.logs[stream].write(&buf[..n])
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
