//! [`LocalExecutor`]: runs commands on this host, under `timeout`.
//!
//! The loopback instance set's workers are this host, so their commands run here. This is the
//! one place in the crate that starts processes. Each command runs in its own process group;
//! at its deadline the whole group is killed, so a hung command (and anything it started that
//! holds its output open) cannot outlive the deadline. It also runs under `timeout` (see
//! [`under_deadline`]), so it ends at its deadline even if this process is killed first: a
//! start that a killed fleet left in flight is over by the time its successor judges it. A
//! simple command is started by `timeout` directly, without the `sh -c` around it: a shell
//! would cost every start and probe about 0.6 ms here.

use crate::ProberError;
use crate::deadline::{timeout_args, under_deadline};
use crate::executor::{Executor, MAX_OUTPUT, Output};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Runs commands on this host: a simple command under `timeout`, anything else with `sh -c`.
#[derive(Debug, Clone, Default)]
pub struct LocalExecutor {
    name: String,
    dir: Option<PathBuf>,
    env: BTreeMap<String, String>,
}

impl LocalExecutor {
    /// An executor whose errors name the worker `name`.
    pub fn new(name: &str) -> LocalExecutor {
        LocalExecutor { name: name.to_owned(), ..LocalExecutor::default() }
    }

    /// Runs commands in `dir`.
    pub fn with_dir(mut self, dir: impl Into<PathBuf>) -> LocalExecutor {
        self.dir = Some(dir.into());
        self
    }

    /// Sets an environment variable for every command.
    pub fn with_env(mut self, key: &str, value: &str) -> LocalExecutor {
        self.env.insert(key.to_owned(), value.to_owned());
        self
    }
}

impl LocalExecutor {
    /// `program` with `args`, in this executor's directory and environment, in a process
    /// group of its own, with piped standard streams.
    fn command(&self, program: &str, args: &[String]) -> tokio::process::Command {
        // This executor is the prober's one way to run a command on this host (DESIGN.md).
        #[allow(clippy::disallowed_methods)]
        let mut builder = tokio::process::Command::new(program);
        builder
            .args(args)
            .envs(&self.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.dir {
            builder.current_dir(dir);
        }
        builder
    }
}

/// Reads all of `reader`, keeping the first [`MAX_OUTPUT`] bytes.
async fn read_capped(mut reader: impl AsyncRead + Unpin) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(kept);
        }
        let room = MAX_OUTPUT.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

#[async_trait::async_trait]
impl Executor for LocalExecutor {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        let exec_error = |detail: String| ProberError::Exec { worker: self.name.clone(), detail };
        let direct = timeout_args(command, deadline).map(|args| self.command("timeout", &args));
        let spawned = match direct.map(|mut timeout| timeout.spawn()) {
            // Without `timeout` here, the shell's form runs the command as it is.
            Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
            other => other,
        };
        let spawned = match spawned {
            Some(spawned) => spawned,
            None => {
                let args = ["-c".to_owned(), under_deadline(command, deadline)];
                self.command("sh", &args).spawn()
            }
        };
        let mut child =
            spawned.map_err(|e| exec_error(format!("cannot start {command:?}: {e}")))?;
        // The group leader is `timeout` (or sh); its group holds whatever it started. Killed
        // at the deadline, and if the call is dropped before the command ends.
        let group = child.id().and_then(|p| i32::try_from(p).ok()).map(ProcessGroup);
        let (Some(mut input), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(exec_error(format!("{command:?} started without its pipes")));
        };
        let stdin = stdin.to_vec();
        let run = async move {
            let write = async move {
                // A command that does not read its stdin closes the pipe: not an error.
                let _ = input.write_all(&stdin).await;
                drop(input);
            };
            let (_, out, err, status) =
                tokio::join!(write, read_capped(stdout), read_capped(stderr), child.wait());
            let status = status?;
            Ok::<_, std::io::Error>(Output {
                stdout: out?,
                stderr: err?,
                status: status.code().and_then(|c| u32::try_from(c).ok()),
            })
        };
        match tokio::time::timeout(deadline, run).await {
            Ok(result) => {
                // It ended: what it left running in its group (a daemon it started) is its own.
                std::mem::forget(group);
                result.map_err(|e| exec_error(format!("running {command:?}: {e}")))
            }
            Err(_) => Err(ProberError::Timeout {
                worker: self.name.clone(),
                what: format!("command {command:?}"),
                deadline,
            }),
        }
    }
}

/// The probe channel's session: the command in its own process group, in this executor's
/// directory and environment, killed with its group when the session is dropped.
#[async_trait::async_trait]
impl crate::channel::SessionOpener for LocalExecutor {
    async fn open_session(
        &self,
        command: &str,
        _deadline: Duration,
    ) -> Result<crate::channel::Session, ProberError> {
        let exec_error = |detail: String| ProberError::Exec { worker: self.name.clone(), detail };
        let mut child = match crate::channel::wire::words(command) {
            Some(words) if !words.is_empty() => self.command(&words[0], &words[1..]),
            _ => self.command("sh", &["-c".to_owned(), format!("exec {command}")]),
        }
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| exec_error(format!("cannot start {command:?}: {e}")))?;
        let group = child.id().and_then(|p| i32::try_from(p).ok()).map(ProcessGroup);
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(exec_error(format!("{command:?} started without its pipes")));
        };
        Ok(crate::channel::Session {
            input: Box::pin(input),
            output: Box::pin(output),
            keep: Box::new((child, group)),
        })
    }
}

/// A command's process group, killed when dropped.
struct ProcessGroup(i32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quote;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn runs_commands_with_stdin_and_reports_status() {
        let exec = LocalExecutor::new("local").with_env("WHARF_X", "42");
        /// (command, stdin, stdout, stderr, status)
        type Case<'a> = (&'a str, &'a [u8], &'a [u8], &'a [u8], Option<u32>);
        let cases: &[Case<'_>] = &[
            ("echo hi", b"", b"hi\n", b"", Some(0)),
            ("cat", b"from stdin", b"from stdin", b"", Some(0)),
            ("echo oops >&2; exit 3", b"", b"", b"oops\n", Some(3)),
            ("echo $WHARF_X", b"", b"42\n", b"", Some(0)),
            // Started by `timeout` itself, with the environment, and quotes taken off.
            ("printenv WHARF_X", b"", b"42\n", b"", Some(0)),
            ("/bin/echo 'x~y'", b"", b"x~y\n", b"", Some(0)),
            ("false", b"", b"", b"", Some(1)),
            ("kill -9 $$", b"", b"", b"", None),
            ("true", &[0u8; 300_000], b"", b"", Some(0)),
        ];
        let runtime = rt();
        for (command, stdin, stdout, stderr, status) in cases {
            let out =
                runtime.block_on(exec.execute(command, stdin, Duration::from_secs(20))).unwrap();
            assert_eq!(out.stdout, *stdout, "{command}");
            assert_eq!(out.stderr, *stderr, "{command}");
            assert_eq!(out.status, *status, "{command}");
        }
    }

    #[test]
    fn a_hung_command_is_cut_at_its_deadline_with_its_children() {
        let runtime = rt();
        let exec = LocalExecutor::new("local");
        // The child sleep holds stdout open; killing only sh would leave the read hanging.
        let err = runtime
            .block_on(exec.execute("sleep 600 & wait", b"", Duration::from_millis(300)))
            .unwrap_err();
        assert!(matches!(err, ProberError::Timeout { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "command \"sleep 600 & wait\" on worker local did not finish within 300ms"
        );
    }

    /// A call dropped before its command ends (its caller gave up) kills the command's group,
    /// and a command that ends leaves what it started in the background alone.
    #[test]
    #[allow(clippy::disallowed_methods)] // Real processes on the real clock, polled within a bound.
    fn a_dropped_call_kills_its_command_and_an_ended_one_leaves_its_daemons() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let exec = LocalExecutor::new("local").with_dir(dir.path());
        let alive =
            |pid: i32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        let pid_in = |name: &str| -> Option<i32> {
            std::fs::read_to_string(dir.path().join(name)).ok()?.trim().parse().ok()
        };
        let until = |what: &str, check: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !check() {
                assert!(std::time::Instant::now() < deadline, "never {what}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };

        let call = runtime.spawn({
            let exec = exec.clone();
            async move {
                exec.execute("echo $$ > hung.pid; sleep 600", b"", Duration::from_secs(600)).await
            }
        });
        until("started", &|| pid_in("hung.pid").is_some());
        let hung = pid_in("hung.pid").unwrap();
        call.abort();
        until("killed with its dropped call", &|| !alive(hung));

        let out = runtime
            .block_on(exec.execute(
                "sleep 600 >/dev/null 2>&1 & echo $! > daemon.pid",
                b"",
                Duration::from_secs(20),
            ))
            .unwrap();
        assert_eq!(out.status, Some(0));
        let daemon = pid_in("daemon.pid").unwrap();
        assert!(alive(daemon), "a daemon the command started was killed");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(daemon),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    #[test]
    fn a_hostile_id_cannot_inject_a_command() {
        let runtime = rt();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pwned");
        let exec = LocalExecutor::new("local").with_dir(dir.path());
        let hostile = [
            "x; touch pwned",
            "x' ; touch pwned; echo '",
            "$(touch pwned)",
            "`touch pwned`",
            "x\ntouch pwned",
            "x && touch pwned",
            "x | touch pwned",
            "'\"$(touch pwned)\"'",
        ];
        for id in hostile {
            let command = format!("printf '%s' {}", quote("runner id", id).unwrap());
            let out =
                runtime.block_on(exec.execute(&command, b"", Duration::from_secs(20))).unwrap();
            assert_eq!(out.stdout, id.as_bytes(), "the id comes back as one literal word");
            assert!(!marker.exists(), "{id:?} ran a command");
        }
    }
}
