//! The agent's side of a shim: starting it, hearing whether the task started, and learning how
//! the task ended.
//!
//! The shim is started with `std::process::Command` and nothing that would make it fork: no
//! `pre_exec`, no uid, gid, groups or chroot, an absolute program path. So std uses
//! `posix_spawn` (a vfork-style clone), which costs the same however large the agent is. The
//! shim does the setsid and the rest itself.
//!
//! Reaping has one owner per process: the agent reaps only the shims it spawned, each by its
//! own pid (`waitpid(pid)` once its pidfd says it exited), never with `waitpid(-1)`. A shim
//! recovered after a restart is not the agent's child; it is watched through a pidfd alone,
//! and whoever is its parent now (init, or a subreaper) reaps it.

use crate::error::ExecError;
use crate::handle::Identity;
use crate::protocol::{self, EXIT_FILE, ShimArgs, StartReport};
use crate::sys::{self, Pid, WaitStatus};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::sync::watch;
use wharf_driver::ExitResult;
use wharf_isolate::cgroup::OomRecord;
use wharf_isolate::{IsolateError, TaskCgroup};

/// A shim that has been started and has not yet said whether the task runs. Dropped before
/// [`Launched::started`] (a failed start, a timeout, or a caller that gave up on the start),
/// it closes the report pipe, which tells a shim that has not reported yet to kill its task
/// and exit, and reaps the shim in the background.
#[derive(Debug)]
pub(crate) struct Launched {
    pid: Pid,
    /// Readable once the shim exits.
    pidfd: OwnedFd,
    report: Option<OwnedFd>,
    /// Whether dropping this cleans up: until the task is known to run.
    armed: bool,
}

/// Starts a shim with exactly `env` as its environment (which the task inherits).
pub(crate) fn spawn_shim(
    shim: &Path,
    args: &ShimArgs,
    env: &BTreeMap<String, String>,
) -> Result<Launched, ExecError> {
    #[allow(clippy::disallowed_methods)] // wharf-exec is the crate that starts task processes.
    let mut command = std::process::Command::new(shim);
    command
        .args(args.to_args())
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // The shim writes its diagnostics (panics included) to shim.log in the run directory.
        .stderr(Stdio::null());
    let mut child = command.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            ExecError::ShimMissing { path: shim.to_owned() }
        }
        _ => ExecError::SpawnShim { path: shim.to_owned(), source },
    })?;
    let report = child.stdout.take().map(OwnedFd::from);
    if let Some(pipe) = &report {
        // Read through tokio, and without blocking when a start is abandoned.
        let _ = sys::set_nonblocking(pipe);
    }
    // Dropping a std `Child` neither kills nor reaps it; `Launched` or the watcher reaps it.
    let raw = child.id();
    drop(child);
    let Some(pid) = Pid::new(raw.into()) else {
        return Err(ExecError::ShimFailed {
            detail: format!("the shim got pid {raw}"),
            log: args.run_dir.join(protocol::SHIM_LOG),
        });
    };
    let pidfd = match sys::pidfd_open(pid) {
        Ok(pidfd) => pidfd,
        Err(source) => {
            drop(report); // The shim sees the closed pipe and gives up.
            let _ = sys::kill(pid, libc::SIGKILL);
            let _ = sys::reap_blocking(pid);
            return Err(ExecError::Sys { call: "pidfd_open", source });
        }
    };
    Ok(Launched { pid, pidfd, report, armed: true })
}

impl Launched {
    /// The shim's pid.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits (at most `limit`) for the shim's start report. A failure report is returned as
    /// such; anything else that goes wrong is an error.
    pub(crate) async fn report(
        &self,
        limit: Duration,
        log: &Path,
    ) -> Result<StartReport, ExecError> {
        let Some(pipe) = &self.report else {
            return Err(ExecError::ShimFailed { detail: "no stdout pipe".into(), log: log.into() });
        };
        let line = match tokio::time::timeout(limit, read_line(pipe)).await {
            Ok(Ok(line)) => line,
            Ok(Err(detail)) => return Err(ExecError::ShimFailed { detail, log: log.to_owned() }),
            Err(_) => return Err(ExecError::StartTimeout { limit, log: log.to_owned() }),
        };
        StartReport::parse(&line).ok_or_else(|| ExecError::ShimFailed {
            detail: format!("unreadable start report {line:?}"),
            log: log.to_owned(),
        })
    }

    /// After a failure report: waits (bounded) for the shim to exit and reaps it.
    pub(crate) async fn reap_failed(mut self) {
        if let Ok(fd) = sys::async_fd_borrowed(self.pidfd.as_fd()) {
            let _ = tokio::time::timeout(ABANDON_GRACE, fd.readable()).await;
        }
        if !matches!(sys::try_reap(self.pid), Ok(Some(_))) {
            abandon(self.pid);
        }
        self.armed = false;
    }

    /// The task runs: from now on the watcher owns the shim. Returns the shim's pidfd for it.
    pub(crate) fn started(mut self) -> Result<OwnedFd, ExecError> {
        let pidfd =
            self.pidfd.try_clone().map_err(|source| ExecError::Sys { call: "dup", source })?;
        self.armed = false;
        Ok(pidfd)
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // A report already written but not read names a task nobody will own: kill it. Then
        // closing the pipe makes a shim that has not reported yet kill its task and exit.
        if let Some(pipe) = self.report.take() {
            let mut buf = [0u8; 512];
            let line = sys::read(&pipe, &mut buf).map(|n| buf[..n].to_vec()).unwrap_or_default();
            let line = String::from_utf8_lossy(&line);
            if let Some(StartReport::Started { pid, start_ticks }) =
                StartReport::parse(line.lines().next().unwrap_or_default())
            {
                kill_orphan(&Identity { pid: Pid::new(pid.into()), start_ticks });
            }
        }
        let pid = self.pid;
        let Ok(pidfd) = self.pidfd.try_clone() else { return abandon(pid) };
        let reap = async move {
            if let Ok(fd) = sys::async_fd(pidfd) {
                let _ = tokio::time::timeout(ABANDON_GRACE, fd.readable()).await;
            }
            if !matches!(sys::try_reap(pid), Ok(Some(_))) {
                abandon(pid);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(reap)),
            Err(_) => abandon(pid),
        }
    }
}

/// Kills and reaps a shim this process spawned, right now.
pub(crate) fn abandon(pid: Pid) {
    let _ = sys::kill(pid, libc::SIGKILL);
    let _ = sys::reap_blocking(pid);
}

/// How long an abandoned shim gets to clean up and exit before it is killed.
const ABANDON_GRACE: Duration = Duration::from_secs(5);

/// Reads one line (without its newline) from a pipe, to EOF at most.
async fn read_line(fd: &OwnedFd) -> Result<String, String> {
    let fd = sys::async_fd_borrowed(fd.as_fd())
        .map_err(|e| format!("cannot watch the shim's report: {e}"))?;
    let mut line = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let mut guard = fd.readable().await.map_err(|e| format!("waiting for the report: {e}"))?;
        match guard.try_io(|fd| sys::read(fd.get_ref(), &mut buf)) {
            Ok(Ok(0)) => {
                return Err(if line.is_empty() {
                    "the shim exited without a report".into()
                } else {
                    format!("a cut-off report {:?}", String::from_utf8_lossy(&line))
                });
            }
            Ok(Ok(n)) => {
                line.extend_from_slice(&buf[..n]);
                if let Some(end) = line.iter().position(|b| *b == b'\n') {
                    line.truncate(end);
                    return String::from_utf8(line).map_err(|_| "a report that is not text".into());
                }
                if line.len() > 4096 {
                    return Err("a report without an end".into());
                }
            }
            Ok(Err(e)) => return Err(format!("reading the report: {e}")),
            Err(_would_block) => continue,
        }
    }
}

/// How a task ended, from its exit record.
pub(crate) fn read_exit_record(run_dir: &Path) -> Result<ExitResult, String> {
    let path = run_dir.join(EXIT_FILE);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let status =
        protocol::parse_exit_record(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(exit_result(status))
}

pub(crate) fn exit_result(status: WaitStatus) -> ExitResult {
    match status {
        WaitStatus::Exited(code) => ExitResult::code(code),
        WaitStatus::Signaled(signal) => ExitResult::signalled(signal),
    }
}

/// An outcome that could not be learned: exit code -1 and the reason.
pub(crate) fn unknown_exit(reason: String) -> ExitResult {
    ExitResult { exit_code: -1, signal: None, oom_killed: false, error: Some(reason) }
}

/// What to watch to learn that a task has ended.
#[derive(Debug)]
pub(crate) struct Watch {
    /// Readable once the shim exits.
    pub(crate) shim_pidfd: OwnedFd,
    /// Set if this process spawned the shim and so must reap it.
    pub(crate) own_child: Option<Pid>,
    pub(crate) run_dir: PathBuf,
    /// The task's main process, killed (group and all) if the shim vanished without a record.
    pub(crate) task: Identity,
    /// The task's cgroup, asked whether the kernel's OOM killer ended the task.
    pub(crate) cgroup: Option<TaskCgroup>,
}

/// Starts watching: when the shim exits, reaps it if it is ours, reads the exit record and
/// publishes the result. Needs a tokio runtime with I/O enabled; the registration is done here
/// so that a missing one fails the caller, not the watch.
pub(crate) fn watch(
    watch: Watch,
    exit: watch::Sender<Option<ExitResult>>,
    span: impl FnOnce() -> tracing::Span + Send + 'static,
) -> Result<(), ExecError> {
    let Watch { shim_pidfd, own_child, run_dir, task, cgroup } = watch;
    let pidfd =
        sys::async_fd(shim_pidfd).map_err(|source| ExecError::Sys { call: "epoll_ctl", source })?;
    tokio::spawn(async move {
        let readable = pidfd.readable().await;
        // Made now, not held while the task runs; nothing below awaits.
        let span = span();
        let _entered = span.enter();
        if let Err(e) = readable {
            tracing::warn!(error = %e, "cannot wait for the shim; reading its exit record now");
        }
        let shim_status = own_child.and_then(|pid| sys::try_reap(pid).ok().flatten());
        let result = match read_exit_record(&run_dir) {
            Ok(mut result) => {
                note_oom(&mut result, cgroup.as_ref());
                result
            }
            Err(reason) => {
                let killed = kill_orphan(&task);
                tracing::warn!(%reason, ?shim_status, killed, "the shim left no exit record");
                unknown_exit(format!(
                    "the shim exited ({}) without recording the task's exit ({reason}){}",
                    shim_status.map_or_else(|| "status unknown".into(), |s| format!("{s:?}")),
                    if killed { "; the task's processes were killed" } else { "" },
                ))
            }
        };
        tracing::debug!(?result, "task exited");
        exit.send_replace(Some(result));
    });
    Ok(())
}

/// Marks an unsuccessful exit as an OOM kill if the kernel's OOM killer killed a process of
/// the task's cgroup. A task that outlived the kill of one of its processes and exited 0 did
/// not fail, so it is left as it was.
pub(crate) fn note_oom(result: &mut ExitResult, cgroup: Option<&TaskCgroup>) {
    if result.successful() {
        return;
    }
    if let Some(record) = cgroup.map(TaskCgroup::oom_killed) {
        apply_oom_record(result, record);
    }
}

/// [`note_oom`] once the cgroup's record is read. Where the kernel counts no OOM kills, an
/// exit is never called one; an end by SIGKILL, which is how the OOM killer ends a process,
/// says that whether it did is unknown.
fn apply_oom_record(result: &mut ExitResult, record: Result<OomRecord, IsolateError>) {
    match record {
        Ok(OomRecord::Killed) => result.oom_killed = true,
        Ok(OomRecord::NotKilled) => {}
        Ok(OomRecord::NotCounted) => {
            if result.signal == Some(libc::SIGKILL) && result.error.is_none() {
                result.error = Some(OOM_UNKNOWN.into());
            }
        }
        Err(error) => tracing::warn!(%error, "cannot learn whether the task was OOM-killed"),
    }
}

/// What an end by SIGKILL says on a kernel without an OOM count.
const OOM_UNKNOWN: &str = "killed by SIGKILL; whether by the kernel's OOM killer is unknown: \
                           this kernel counts no OOM kills (Linux 4.13 and later do)";

/// Kills the process group of a task whose shim is gone, if its main process is still the one
/// recorded. Returns whether it sent the signal.
pub(crate) fn kill_orphan(task: &Identity) -> bool {
    let (Ok(Some(pidfd)), Some(pid)) = (task.open(), task.pid) else { return false };
    sys::pidfd_kill_group(&pidfd, pid, libc::SIGKILL).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exit is an OOM kill only where the kernel counted one; without a count, an end by
    /// SIGKILL says it cannot be known, and no other end says anything.
    #[test]
    fn an_exit_is_called_an_oom_kill_only_where_the_kernel_counted_one() {
        let killed = ExitResult::signalled(libc::SIGKILL);
        let unreadable =
            || Err(IsolateError::Unavailable { reason: "no memory controller".into() });
        type Case = (ExitResult, Result<OomRecord, IsolateError>, bool, Option<&'static str>);
        let cases: [Case; 6] = [
            (killed.clone(), Ok(OomRecord::Killed), true, None),
            (killed.clone(), Ok(OomRecord::NotKilled), false, None),
            (killed.clone(), Ok(OomRecord::NotCounted), false, Some(OOM_UNKNOWN)),
            (killed.clone(), unreadable(), false, None),
            (ExitResult::code(3), Ok(OomRecord::NotCounted), false, None),
            (ExitResult::signalled(libc::SIGTERM), Ok(OomRecord::NotCounted), false, None),
        ];
        for (exit, record, oom_killed, error) in cases {
            let case = format!("{exit:?} {record:?}");
            let mut result = exit;
            apply_oom_record(&mut result, record);
            assert_eq!(result.oom_killed, oom_killed, "{case}");
            assert_eq!(result.error.as_deref(), error, "{case}");
        }
    }
}
