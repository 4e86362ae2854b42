//! A real OpenSSH server on 127.0.0.1 for tests and benchmarks of the prober's SSH executor.
//!
//! [`Sshd::start`] generates a host key and a client key with `ssh-keygen` in a temporary
//! directory, writes a config that listens on 127.0.0.1 only and accepts only the client key,
//! starts `/usr/sbin/sshd -D` on a free port and waits (bounded) until it says it listens.
//! Dropping it kills that server. If OpenSSH is not installed this is an error that says how
//! to install it: tests fail rather than skip.

// This fixture's job is to start helper processes (sshd, ssh-keygen, id).
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) const SSHD: &str = "/usr/sbin/sshd";
const INSTALL: &str = "OpenSSH is needed for this test: apt-get install openssh-server";

/// A running sshd and the keys to use it.
#[derive(Debug)]
pub struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    /// `127.0.0.1:<port>`.
    pub address: String,
    /// The server's host key, as an OpenSSH public key line.
    pub host_key: String,
    /// Another host key of the same kind the server does not have.
    pub other_host_key: String,
    /// The client's private key (OpenSSH format).
    pub client_key: String,
    /// A client key the server does not accept.
    pub stranger_key: String,
    /// The user to log in as (the one running the test).
    pub user: String,
}

/// Makes an ed25519 key pair without a passphrase: `path` and `path.pub`.
pub(crate) fn keygen(path: &Path) -> Result<(), String> {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "wharf-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run ssh-keygen ({e}). {INSTALL}"))?;
    if status.success() { Ok(()) } else { Err(format!("ssh-keygen failed: {status}")) }
}

pub(crate) fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot bind 127.0.0.1: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

impl Sshd {
    /// Starts a server; `extra` lines are added to its config.
    pub fn start_with(extra: &[&str]) -> Result<Sshd, String> {
        if !Path::new(SSHD).exists() {
            return Err(format!("{SSHD} is missing. {INSTALL}"));
        }
        let dir = tempfile::Builder::new()
            .prefix("wharf-sshd")
            .tempdir()
            .map_err(|e| format!("cannot make a temp dir: {e}"))?;
        let path = |name: &str| -> PathBuf { dir.path().join(name) };
        for key in ["host", "other_host", "client", "stranger"] {
            keygen(&path(key))?;
        }
        let client_key = read(&path("client.pub"))?;
        let user = whoami()?;
        write_server_config(dir.path(), "127.0.0.1", &client_key, &user, extra)?;
        // The port is free when picked but another process may take it before sshd binds
        // it: a few attempts, each on a new port.
        let mut failures = Vec::new();
        let (child, port) = loop {
            let port = free_port()?;
            match listen(&path("sshd_config"), port) {
                Ok(child) => break (child, port),
                Err(e) if failures.len() < 2 => failures.push(e),
                Err(e) => {
                    failures.push(e);
                    return Err(failures.join("; "));
                }
            }
        };
        Ok(Sshd {
            address: format!("127.0.0.1:{port}"),
            host_key: read(&path("host.pub"))?,
            other_host_key: read(&path("other_host.pub"))?,
            client_key: read(&path("client"))?,
            stranger_key: read(&path("stranger"))?,
            user,
            child,
            dir,
        })
    }

    /// Starts a server with the default config.
    pub fn start() -> Result<Sshd, String> {
        Sshd::start_with(&[])
    }

    /// The process id of the listening sshd (its connections are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A scratch directory that lives as long as the server.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

/// Writes what a server in `dir` needs besides its host key (`dir/host`, made with [`keygen`]):
/// `dir/authorized_keys` holding `authorized_keys`, and `dir/sshd_config` for a server that
/// listens on `listen_address` (an IP address) and lets in `user` only, plus the `extra`
/// lines. Makes sure sshd's privilege separation directory exists.
pub(crate) fn write_server_config(
    dir: &Path,
    listen_address: &str,
    authorized_keys: &str,
    user: &str,
    extra: &[&str],
) -> Result<(), String> {
    let keys = dir.join("authorized_keys");
    std::fs::write(&keys, authorized_keys)
        .map_err(|e| format!("cannot write authorized_keys: {e}"))?;
    // sshd insists on its privilege separation directory.
    std::fs::create_dir_all("/run/sshd").map_err(|e| format!("cannot create /run/sshd: {e}"))?;
    let mut config = server_config(listen_address, &dir.join("host"), &keys, user);
    for line in extra {
        config.push_str(line);
        config.push('\n');
    }
    std::fs::write(dir.join("sshd_config"), config)
        .map_err(|e| format!("cannot write sshd_config: {e}"))
}

/// The config of a server that listens on `listen_address` (an IP address), has the host key
/// `host_key` (a private key file) and accepts only the keys in `authorized_keys`, from
/// `user` only.
fn server_config(
    listen_address: &str,
    host_key: &Path,
    authorized_keys: &Path,
    user: &str,
) -> String {
    // `SetEnv SHLVL=1` keeps bash from reading the login user's ~/.bashrc for every command
    // (bash does that when it thinks sshd started it at level 1): a developer's shell setup
    // would otherwise dominate every figure measured against this server, and could print
    // into the output of commands run over it.
    format!(
        "ListenAddress {listen_address}\n\
         HostKey {host}\n\
         AuthorizedKeysFile {keys}\n\
         PidFile none\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         UsePAM no\n\
         StrictModes no\n\
         PermitRootLogin prohibit-password\n\
         AllowUsers {user}\n\
         MaxSessions 1000\n\
         MaxStartups 1000\n\
         SetEnv SHLVL=1\n\
         LogLevel INFO\n",
        host = host_key.display(),
        keys = authorized_keys.display(),
    )
}

/// Starts sshd on `port` and waits (at most 10 s) until it says it listens.
fn listen(config: &Path, port: u16) -> Result<Child, String> {
    let mut command = Command::new(SSHD);
    command.arg("-D").arg("-e").arg("-f").arg(config).arg("-p").arg(port.to_string());
    spawn_listening(command, &format!("127.0.0.1:{port}"), None)
}

/// Starts `command`, an sshd run with `-D -e` (perhaps through a wrapper such as
/// `ip netns exec`), and waits (at most 10 s) until it says it listens on `what`. Every line it
/// logs is appended to `log` if given, before and after.
pub(crate) fn spawn_listening(
    mut command: Command,
    what: &str,
    log: Option<&Path>,
) -> Result<Child, String> {
    let mut log_file = match log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}. {INSTALL}"))?;
    let Some(stderr) = child.stderr.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("sshd started without stderr".into());
    };
    // Read its log on a thread: it tells when it listens, and must never block on a full
    // pipe afterwards.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut said = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(file) = log_file.as_mut() {
                let _ = writeln!(file, "{line}");
            }
            if !said {
                let listening = line.contains("Server listening on");
                let _ = tx.send((listening, line));
                said = listening;
            }
        }
    });
    let mut log = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok((true, _)) => return Ok(child),
            Ok((false, line)) => log.push(line),
            // Timed out, or sshd exited (its log closed) without listening.
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("sshd did not start listening on {what}: {}", log.join(" | ")));
            }
        }
    }
}

pub(crate) fn whoami() -> Result<String, String> {
    let out =
        Command::new("id").arg("-un").output().map_err(|e| format!("cannot run id -un: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
