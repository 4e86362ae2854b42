//! Starting a `wharf` process (an agent, a fleet) and learning its address from the line it
//! logs when it is ready, such as `agent ready address=127.0.0.1:41234`.

// This fixture's job is to start a program and wait (bounded) for what it says.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Starts `command` with its standard error piped (and logs as plain text, at `info` unless the
/// command sets `RUST_LOG` itself), waits at most
/// `limit` for a line containing `ready`, and returns the child and the `address=` value of
/// that line. Standard error keeps being read so the child never blocks on it; every line of
/// it is appended to the file `log`, if given, and dropped otherwise.
pub fn spawn_announcing(
    command: &mut Command,
    ready: &str,
    limit: Duration,
    log: Option<&Path>,
) -> Result<(Child, String), String> {
    let mut log = log
        .map(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))
        })
        .transpose()?;
    if command.get_envs().all(|(name, _)| name != "RUST_LOG") {
        command.env("RUST_LOG", "info");
    }
    let mut child = command
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    let Some(stderr) = child.stderr.take() else {
        let _ = child.kill();
        return Err("started without a standard error".into());
    };
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(log) = &mut log {
                let _ = writeln!(log, "{line}");
            }
            let _ = lines_tx.send(line);
        }
    });
    let mut seen = Vec::new();
    loop {
        let Ok(line) = lines.recv_timeout(limit) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{command:?} never said {ready:?}; it said: {}", seen.join(" | ")));
        };
        if line.contains(ready) {
            let address = line.split("address=").nth(1).and_then(|s| s.split_whitespace().next());
            return match address {
                Some(address) => Ok((child, address.to_owned())),
                None => Err(format!("no address= in the ready line: {line}")),
            };
        }
        seen.push(line);
    }
}

/// Sends SIGTERM to `child` and waits at most `limit` for it to exit.
pub fn terminate(child: &mut Child, limit: Duration) -> Result<ExitStatus, String> {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    if !sent.as_ref().is_ok_and(ExitStatus::success) {
        return Err(format!("cannot send SIGTERM to {pid}: {sent:?}"));
    }
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => return Err(format!("process {pid} did not exit within {limit:?}")),
            Err(e) => return Err(format!("cannot wait for process {pid}: {e}")),
        }
    }
}

/// How often [`terminate`] looks for the exit.
const POLL: Duration = Duration::from_millis(20);
