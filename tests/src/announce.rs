//! Starting a `wharf` process (an agent, a fleet) and learning its address from the line it
//! logs when it is ready, such as `agent ready address=127.0.0.1:41234`.

// This fixture's job is to start a program and wait (bounded) for what it says.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Starts `command` with its standard error piped (and logs as plain text), waits at most
/// `limit` for a line containing `ready`, and returns the child and the `address=` value of
/// that line. Standard error keeps being read (and dropped) so the child never blocks on it.
pub fn spawn_announcing(
    command: &mut Command,
    ready: &str,
    limit: Duration,
) -> Result<(Child, String), String> {
    let mut child = command
        .env("RUST_LOG", "info")
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
