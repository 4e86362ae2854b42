//! Running a command in a task's context (`exec_task`), as health-check scripts do.
//!
//! The command gets the task's environment and working directory, and a process group of its
//! own so that a timeout kills everything it started. It is spawned by the agent directly (the
//! `posix_spawn` path again: `process_group` and `current_dir` do not force a fork), watched
//! through a pidfd and reaped by its own pid. Output is kept up to [`OUTPUT_LIMIT`] bytes per
//! stream; the rest is read and dropped so the command never blocks on a full pipe.

use crate::config::resolve_command;
use crate::launch::{exit_result, unknown_exit};
use crate::sys::{self, Pid};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use wharf_driver::{DriverError, ExecResult};
use wharf_state::duration::Formatted;

/// Output kept per stream.
pub const OUTPUT_LIMIT: usize = 1 << 20;
/// After a timeout's SIGKILL, how long the command's output and exit may take to arrive.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// Runs `command` with `env` in `work_dir`, cut off after `limit`.
pub(crate) async fn run(
    env: &BTreeMap<String, String>,
    work_dir: &Path,
    command: &[String],
    limit: Duration,
) -> Result<ExecResult, DriverError> {
    let Some(name) = command.first() else {
        return Err(DriverError::invalid_config("command", "is empty"));
    };
    if command.iter().any(|c| c.contains('\0')) {
        return Err(DriverError::invalid_config("command", "contains a NUL byte"));
    }
    let program = resolve_command("command", name, env, work_dir)?;
    #[allow(clippy::disallowed_methods)] // wharf-exec is the crate that runs commands in tasks.
    let mut std_command = std::process::Command::new(&program);
    std_command
        .arg0(name)
        .args(&command[1..])
        .env_clear()
        .envs(env)
        .current_dir(work_dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = std_command
        .spawn()
        .map_err(|e| DriverError::other(format!("cannot run {}: {e}", program.display())))?;
    let raw = child.id();
    let pipes = (child.stdout.take().map(OwnedFd::from), child.stderr.take().map(OwnedFd::from));
    drop(child);
    let pid =
        Pid::new(raw.into()).ok_or_else(|| DriverError::other(format!("exec got pid {raw}")))?;
    let watched = (|| {
        let pidfd = sys::pidfd_open(pid)?;
        let (Some(out), Some(err)) = pipes else {
            return Err(std::io::Error::other("no output pipes"));
        };
        sys::set_nonblocking(&out)?;
        sys::set_nonblocking(&err)?;
        Ok((sys::async_fd(pidfd)?, sys::async_fd(out)?, sys::async_fd(err)?))
    })();
    let (pidfd, out, err) = match watched {
        Ok(fds) => fds,
        Err(e) => {
            let _ = sys::kill_group(pid, libc::SIGKILL);
            let _ = sys::reap_blocking(pid);
            return Err(DriverError::other(format!("cannot watch the exec'd command: {e}")));
        }
    };

    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let everything = async {
        let (a, b, _) =
            tokio::join!(drain(&out, &mut stdout), drain(&err, &mut stderr), pidfd.readable());
        a.and(b)
    };
    let timed_out = match tokio::time::timeout(limit, everything).await {
        Ok(_) => false,
        Err(_) => {
            // Our unreaped child leads the group, so its number cannot have been reused.
            let _ = sys::kill_group(pid, libc::SIGKILL);
            let after = async {
                tokio::join!(drain(&out, &mut stdout), drain(&err, &mut stderr), pidfd.readable())
            };
            let _ = tokio::time::timeout(AFTER_KILL, after).await;
            true
        }
    };
    let status = match sys::try_reap(pid) {
        Ok(Some(status)) => Some(status),
        _ => {
            let _ = sys::kill(pid, libc::SIGKILL);
            sys::reap_blocking(pid).ok()
        }
    };
    let exit = match (timed_out, status) {
        (false, Some(status)) => exit_result(status),
        (true, status) => {
            let mut exit = status.map_or_else(|| unknown_exit(String::new()), exit_result);
            exit.error = Some(format!("timed out after {}", Formatted(limit)));
            exit
        }
        (false, None) => unknown_exit("cannot learn the command's exit status".into()),
    };
    Ok(ExecResult { stdout, stderr, exit })
}

/// Reads `fd` to EOF into `into`, keeping at most [`OUTPUT_LIMIT`] bytes.
async fn drain(fd: &AsyncFd<OwnedFd>, into: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 8192];
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|fd| sys::read(fd.get_ref(), &mut buf)) {
            Ok(Ok(0)) => return Ok(()),
            Ok(Ok(n)) => {
                let keep = n.min(OUTPUT_LIMIT.saturating_sub(into.len()));
                into.extend_from_slice(&buf[..keep]);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}
