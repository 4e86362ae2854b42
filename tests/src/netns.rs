//! Hosts made of Linux network namespaces, for end-to-end tests that need real machines on a
//! real network: each [`Host`] is a namespace joined to this one by a veth pair, with its own
//! OpenSSH server listening on its address, port 22.
//!
//! - Addresses: host number `n` is `10.231.n.2/24` inside its namespace, and `10.231.n.1/24`
//!   on this side of its veth (so this namespace routes to it). `n` comes from a process-wide
//!   counter and skips subnets already on an interface here, so tests running in parallel
//!   threads (or another test process) do not collide.
//! - Names carry this process's id: namespace `wharf-<pid>-<n>`, veth `wh<pid>h<n>` here and
//!   `wh<pid>n<n>` inside (at most 15 characters, as Linux requires).
//! - [`Host::command`] runs a program inside the namespace (`ip netns exec`), where
//!   `127.0.0.1` is the namespace's own; [`Host::spawn`] starts a long-lived one with its
//!   output in a log file, [`Host::set_link`] cuts the host off and reconnects it.
//! - Dropping a host kills every process in its namespace (its sshd, what was spawned, what
//!   those started), then deletes the namespace and the veth pair, also when a test panics.
//!   Namespaces (and scratch directories) a killed test process left behind are removed by
//!   the next one.
//!
//! This needs root, `ip` (iproute2) and OpenSSH; without them [`Host::start`] is an error that
//! says what is missing: tests fail rather than skip.

// This fixture's job is to run helper programs (ip, sshd, ssh-keygen, kill) and wait on the
// real clock for what they set up.
#![allow(clippy::disallowed_methods)]

use crate::sshd;
use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const INSTALL: &str = "apt-get install -y iproute2 openssh-server";
/// Any single wait for the setup; reaching it means something is wrong.
const LIMIT: Duration = Duration::from_secs(10);
const PREFIX: &str = "wharf-";

/// The next host number to try.
static NEXT: AtomicU32 = AtomicU32::new(1);

/// Checks, once per process, that this runs as root with `ip`, `sshd` and `ssh-keygen`.
pub fn check_requirements() -> Result<(), String> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let uid = Command::new("id")
                .arg("-u")
                .output()
                .map_err(|e| format!("cannot run id -u: {e}"))?;
            if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
                return Err(format!(
                    "network namespace tests need root (they run `ip netns` and `ip link`); this is {} (uid {}): run them as root",
                    sshd::whoami()?,
                    String::from_utf8_lossy(&uid.stdout).trim()
                ));
            }
            match Command::new("ip").arg("-V").output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => return Err(format!("`ip -V` failed ({}); {INSTALL}", out.status)),
                Err(e) => return Err(format!("cannot run `ip` ({e}): {INSTALL}")),
            }
            if !Path::new(sshd::SSHD).exists() {
                return Err(format!("{} is missing: {INSTALL}", sshd::SSHD));
            }
            if let Err(e) = Command::new("ssh-keygen").arg("-?").output() {
                return Err(format!("cannot run ssh-keygen ({e}): {INSTALL}"));
            }
            remove_stale();
            Ok(())
        })
        .clone()
}

/// Runs `ip` with `args`; an error carries its stderr.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip ({e}): {INSTALL}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The processes in namespace `name`.
fn pids_in(name: &str) -> Vec<u32> {
    ip(&["netns", "pids", name])
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Kills every process in namespace `name` (waiting, bounded, until they are gone) and
/// deletes it; best effort.
fn destroy_namespace(name: &str) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let pids = pids_in(name);
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = ip(&["netns", "delete", name]);
}

/// Removes the namespaces of test processes that no longer exist (killed before their
/// hosts were dropped).
fn remove_stale() {
    let Ok(list) = ip(&["netns", "list"]) else { return };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            destroy_namespace(name);
        }
    }
    // And their scratch directories (see `scratch_dir`).
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.strip_prefix(PREFIX).unwrap_or_default().split('-');
        let (Some(pid), Some(_tag), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A temporary directory `<temp>/wharf-<pid>-<tag>-XXXXXX` (`tag` without `-`): removed when
/// dropped, or by the next test process that uses this module if this one is killed first.
pub fn scratch_dir(tag: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-{tag}-", std::process::id()))
        .tempdir()
        .map_err(|e| format!("cannot make a temp dir: {e}"))
}

/// Picks a host number whose subnet no interface here uses.
fn next_number() -> Result<u32, String> {
    let used = ip(&["-o", "-4", "addr", "show"])?;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        if n > 254 {
            return Err("no free subnet 10.231.<n>.0/24 left for another test host".into());
        }
        if !used.contains(&format!(" 10.231.{n}.")) {
            return Ok(n);
        }
    }
}

/// A client key pair for logging in to [`Host`]s.
#[derive(Debug)]
pub struct ClientKey {
    dir: tempfile::TempDir,
    /// The public key, as an OpenSSH public key line (what `authorized_keys` holds).
    pub public_key: String,
}

impl ClientKey {
    /// Generates an ed25519 key pair.
    pub fn generate() -> Result<ClientKey, String> {
        check_requirements()?;
        let dir = scratch_dir("key")?;
        let path = dir.path().join("client");
        sshd::keygen(&path)?;
        let public_key = sshd::read(&path.with_extension("pub"))?;
        Ok(ClientKey { dir, public_key })
    }

    /// The private key file (OpenSSH format).
    pub fn private_key_path(&self) -> PathBuf {
        self.dir.path().join("client")
    }
}

/// A network namespace with a veth link to this one and an sshd on its address.
#[derive(Debug)]
pub struct Host {
    /// The namespace's name.
    pub namespace: String,
    /// The host number `n` of its subnet `10.231.n.0/24`.
    pub number: u32,
    /// This side's end of the veth pair: setting it down cuts the host off.
    pub link: String,
    /// The host's address (`10.231.n.2`).
    pub address: Ipv4Addr,
    /// `<address>:22`, where its sshd listens.
    pub ssh_address: String,
    /// Its sshd's host key, as an OpenSSH public key line.
    pub host_key: String,
    /// The user to log in as.
    pub user: String,
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Host {
    /// Makes the namespace and its link, and starts an sshd there that accepts
    /// `authorized_key` (an OpenSSH public key line) for the user running the test.
    pub fn start(authorized_key: &str) -> Result<Host, String> {
        check_requirements()?;
        let number = next_number()?;
        let pid = std::process::id();
        let namespace = format!("{PREFIX}{pid}-{number}");
        let link = format!("wh{pid}h{number}");
        let peer = format!("wh{pid}n{number}");
        if peer.len() > 15 {
            return Err(format!("interface name {peer} is longer than 15 characters"));
        }
        let dir = scratch_dir(&number.to_string())?;
        ip(&["netns", "add", &namespace])?;
        // From here on, dropping the host undoes what was set up, whatever fails next.
        let mut host = Host {
            address: Ipv4Addr::new(10, 231, number as u8, 2),
            ssh_address: format!("10.231.{number}.2:22"),
            namespace,
            number,
            link,
            host_key: String::new(),
            user: sshd::whoami()?,
            children: Vec::new(),
            dir,
        };
        host.set_up_link(&peer)?;
        host.start_sshd(authorized_key)?;
        host.wait_reachable()?;
        Ok(host)
    }

    fn set_up_link(&self, peer: &str) -> Result<(), String> {
        let ns = self.namespace.as_str();
        let n = self.number;
        ip(&["link", "add", &self.link, "type", "veth", "peer", "name", peer, "netns", ns])?;
        ip(&["addr", "add", &format!("10.231.{n}.1/24"), "dev", &self.link])?;
        ip(&["link", "set", &self.link, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("10.231.{n}.2/24"), "dev", peer])?;
        ip(&["-n", ns, "link", "set", peer, "up"])?;
        Ok(())
    }

    fn start_sshd(&mut self, authorized_key: &str) -> Result<(), String> {
        let path = |name: &str| self.dir.path().join(name);
        sshd::keygen(&path("host"))?;
        self.host_key = sshd::read(&path("host.pub"))?;
        let listen = self.address.to_string();
        sshd::write_server_config(self.dir.path(), &listen, authorized_key, &self.user, &[])?;
        let mut command = self.command(sshd::SSHD);
        command.args(["-D", "-e", "-p", "22", "-f"]).arg(path("sshd_config"));
        let child = sshd::spawn_listening(command, &self.ssh_address, Some(&path("sshd.log")))?;
        self.children.push(child);
        Ok(())
    }

    /// Waits (bounded) until this namespace reaches the host's sshd over the link.
    fn wait_reachable(&self) -> Result<(), String> {
        let target = SocketAddr::from((self.address, 22));
        let deadline = Instant::now() + LIMIT;
        loop {
            match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("{target} is not reachable over {}: {e}", self.link));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace]).arg(program);
        command
    }

    /// Starts `command` (usually from [`Host::command`]) with its stdout and stderr in the log
    /// file `<name>.log` of the host's scratch directory; it is killed when the host is dropped.
    /// Returns its process id.
    pub fn spawn(&mut self, name: &str, mut command: Command) -> Result<u32, String> {
        let path = self.log_path(name);
        let log = std::fs::File::create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let err = log.try_clone().map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name} in {}: {e}", self.namespace))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// The log file of what [`Host::spawn`] started as `name` (`sshd` for the sshd).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// The content of [`Host::log_path`], or why it cannot be read.
    pub fn log(&self, name: &str) -> String {
        let path = self.log_path(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
    }

    /// Sets this side of the link up or down: down, nothing reaches the host or leaves it.
    pub fn set_link(&self, up: bool) -> Result<(), String> {
        ip(&["link", "set", &self.link, if up { "up" } else { "down" }]).map(drop)
    }

    /// The processes running in the namespace.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.namespace)
    }

    /// A scratch directory that lives as long as the host.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        destroy_namespace(&self.namespace);
        // Deleting the namespace took the veth pair with it; this is in case it did not.
        let _ = Command::new("ip")
            .args(["link", "delete", &self.link])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
