//! A `wharf fleet` process for tests and benchmarks: started on a config written into the
//! caller's directory, reached at the address it announces, its log kept in that directory,
//! and, when dropped, killed with the agents it left behind wiped (a test must leave nothing).
//! [`Fleet::kill`] is the crash instead: SIGKILL, leaving its agents for the next fleet over
//! the same directory to find. Its API requires a token: the one given in its settings, or the
//! one it makes and keeps in its data directory ([`Fleet::token`]).

// This fixture's job is to start and stop a program.
#![allow(clippy::disallowed_methods)]

use crate::announce::spawn_announcing;
use crate::proc_stat::ProcStat;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// A running `wharf fleet`.
#[derive(Debug)]
pub struct Fleet {
    child: Child,
    address: String,
    data_dir: PathBuf,
    log: PathBuf,
    wharf: PathBuf,
    /// Dropped after a crash: its agents are left for the next fleet.
    leave_instances: bool,
}

impl Fleet {
    /// Writes `<dir>/fleet.toml` (API on 127.0.0.1 at a free port, data in `<dir>/fleet`,
    /// then `settings`), starts `wharf fleet` on it, logging at `log_filter` (a `RUST_LOG`
    /// value, which the agents of its loopback instances inherit) to `<dir>/fleet.log` (appended
    /// to, so a fleet started again over the same directory adds to it), and
    /// waits at most `limit` until it is ready.
    pub fn start(
        wharf: &Path,
        dir: &Path,
        settings: &str,
        log_filter: &str,
        limit: Duration,
    ) -> Result<Fleet, String> {
        Fleet::start_with_env(wharf, dir, settings, log_filter, limit, &[])
    }

    /// [`Fleet::start`] with `env` set in its environment (which its loopback agents and the
    /// commands it runs on them inherit).
    pub fn start_with_env(
        wharf: &Path,
        dir: &Path,
        settings: &str,
        log_filter: &str,
        limit: Duration,
        env: &[(&str, &str)],
    ) -> Result<Fleet, String> {
        let data_dir = dir.join("fleet");
        let config = dir.join("fleet.toml");
        let text = format!(
            "bind = \"127.0.0.1:0\"\ndata_dir = {:?}\n{settings}",
            data_dir.display().to_string()
        );
        std::fs::write(&config, text)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let log = dir.join("fleet.log");
        let (child, address) = spawn_announcing(
            Command::new(wharf)
                .arg("fleet")
                .arg("--config")
                .arg(&config)
                .envs(env.iter().copied())
                .env("RUST_LOG", log_filter),
            "fleet ready",
            limit,
            Some(&log),
        )?;
        let wharf = wharf.to_owned();
        Ok(Fleet { child, address, data_dir, log, wharf, leave_instances: false })
    }

    /// Where its API listens, `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its data directory (`<dir>/fleet`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The token its API requires when none was configured: the one it made at its first
    /// start and keeps in `<data_dir>/fleet-token` (wharf-node's `api_token::FLEET`). An error
    /// if there is none (a fleet given a token removes the file).
    pub fn token(&self) -> Result<String, String> {
        let path = self.data_dir.join("fleet-token");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read the fleet's token {}: {e}", path.display()))?;
        Ok(text.trim_end().to_owned())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Kills it with SIGKILL, as a crash would, and leaves its loopback agents running with
    /// their work: a fleet started again over the same directory finds them.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.leave_instances = true;
    }

    /// Sends SIGTERM and waits at most `limit` for the exit.
    pub fn terminate(mut self, limit: Duration) -> Result<ExitStatus, String> {
        crate::announce::terminate(&mut self.child, limit)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A command the fleet runs on this host runs on under `timeout` when the fleet dies
        // (see `LocalExecutor`): an instance's init in flight would start its agent after the
        // wipe below. They go first, in their process groups. Not after `terminate`: the fleet
        // is reaped then, its pid free for another process, and a clean stop leaves no command
        // of its own running (it waits for its creates, and its runtime kills the rest).
        if !self.leave_instances && matches!(self.child.try_wait(), Ok(None)) {
            kill_commands(&self.child);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.leave_instances {
            return;
        }
        let Ok(instances) = std::fs::read_dir(self.data_dir.join("instances")) else { return };
        for instance in instances.flatten() {
            let data = instance.path().join("data");
            let _ = Command::new(&self.wharf).arg("--data-dir").arg(data).arg("wipe").output();
        }
    }
}

/// Stops `fleet` (SIGSTOP, so that it starts nothing more) and kills the process group each of
/// its children leads: the commands it runs on this host, each in a group of its own. An agent
/// one of them already started has a session of its own, and the wipe finds it.
fn kill_commands(fleet: &Child) {
    let Ok(pid) = i32::try_from(fleet.id()) else { return };
    // SAFETY: signals a process this fixture started and has not waited for.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Stopped once every thread is: a spawn under way in one of them has finished by then.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !all_threads_stopped(pid) && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    for child in crate::proc_stat::pids() {
        // Only a group leader's group: never the fleet's own, nor this process's.
        if ProcStat::of(child).is_some_and(|stat| stat.parent == pid && stat.group == child) {
            // SAFETY: signals the process group a child of the fleet leads.
            unsafe { libc::kill(-child, libc::SIGKILL) };
        }
    }
}

/// Whether every thread of `pid` is stopped (or gone).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    threads.flatten().all(|thread| {
        ProcStat::read(&thread.path().join("stat"))
            .is_none_or(|stat| stat.is_stopped() || stat.is_dead())
    })
}
