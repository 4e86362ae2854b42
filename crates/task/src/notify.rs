//! The notify socket of a task that sets `notify_socket`: a unix datagram socket the agent
//! binds in the task's directory and hands to the task in `NOTIFY_SOCKET`, on which the task
//! says `READY=1` once it is ready, as systemd's `sd_notify` protocol has it (each datagram a
//! list of `KEY=VALUE` lines; every line but `READY=1` is ignored).
//!
//! The socket lives in the task directory so that its path outlives the agent: an agent that
//! restarts and reattaches to the task binds it again at the same path, and the task's next
//! datagram reaches the new agent (one sent while no agent listened is lost). Readiness once
//! heard is kept in the task's state (`ready_at`), not in the socket, so a restarted agent does
//! not need to hear it again. Under `exec` the task directory is the workload user's, and the
//! socket is open to any user that reaches it: only that user does.

use crate::error::TaskError;
use std::path::{Path, PathBuf};
use tokio::net::UnixDatagram;
use wharf_isolate::dirs::OpenDir;

/// The variable that tells the task where its notify socket is.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// The socket's name in the task directory.
pub const NOTIFY_SOCKET_NAME: &str = "notify.sock";

/// The longest path a unix socket address holds (`sun_path`, less its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The largest datagram read whole; systemd's own limit for a notification is the same order.
const MAX_DATAGRAM: usize = 4096;

/// Where a task's notify socket is: in its directory.
pub fn socket_path(task_dir: &Path) -> PathBuf {
    task_dir.join(NOTIFY_SOCKET_NAME)
}

/// Binds the notify socket at `path`, replacing whatever is there (a socket a previous agent
/// bound, or a file the task put there), open to the user the task runs as.
pub(crate) fn bind(path: &Path) -> Result<UnixDatagram, TaskError> {
    let io = |source| TaskError::Io { path: path.to_owned(), source };
    let length = path.as_os_str().len();
    if length > MAX_SOCKET_PATH {
        return Err(io(std::io::Error::other(format!(
            "the notify socket's path is {length} bytes long, more than the {MAX_SOCKET_PATH} a \
             unix socket address holds: give the agent a shorter data directory"
        ))));
    }
    // Unlinking never follows a link: one the task put there is removed, not its target.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let socket = UnixDatagram::bind(path).map_err(io)?;
    // The directory may be the task's own (under exec): the mode is set through the bound
    // entry itself, so a link the task swaps in meanwhile is refused, not followed.
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io(std::io::Error::other("the notify socket's path has no directory")));
    };
    OpenDir::open(dir)
        .and_then(|dir| dir.set_socket_mode(name, 0o666))
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    Ok(socket)
}

/// Waits for a datagram on `socket` that says `READY=1`; other datagrams are skipped.
pub(crate) async fn next_ready(socket: &UnixDatagram) -> std::io::Result<()> {
    let mut buffer = vec![0; MAX_DATAGRAM];
    loop {
        let length = socket.recv(&mut buffer).await?;
        if says_ready(&buffer[..length]) {
            return Ok(());
        }
    }
}

/// Whether a notification holds the line `READY=1`.
fn says_ready(datagram: &[u8]) -> bool {
    datagram.split(|b| *b == b'\n').any(|line| line == b"READY=1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_ready_line_says_ready() {
        assert!(says_ready(b"READY=1"));
        assert!(says_ready(b"STATUS=warming up\nREADY=1\n"));
        assert!(!says_ready(b"STATUS=READY=1"));
        assert!(!says_ready(b"READY=0\nWATCHDOG=1"));
        assert!(!says_ready(b"READY=1x"));
        assert!(!says_ready(b""));
    }
}
