//! The same work for the tools a user would otherwise pick: supervisord (Debian package
//! `supervisor`) and s6 (Debian package `s6`) start N `sleep` processes, report them running,
//! and stop them. Each figure is measured the way a user of that tool would: supervisord
//! through `supervisorctl`, s6 through `s6-svwait` and `s6-svc`.
//!
//! Differences worth knowing when reading the figures: supervisord captures each process's
//! output into files, as wharf does; s6 here does not (a logger per service would double its
//! process count). Neither persists state to survive its own `kill -9` with reattachment.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What one run of a peer measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRun {
    /// From launching the supervisor until it reports every process running.
    pub(crate) start: Duration,
    /// From asking for a stop until every process is reported down.
    pub(crate) stop: Duration,
    /// Private memory of the supervisor's own processes while everything runs.
    pub(crate) memory_kib: f64,
}

const LIMIT: Duration = Duration::from_secs(300);

/// The tools a peer needs, or how to get them.
fn require(tools: &[&str], package: &str) -> Result<(), String> {
    for tool in tools {
        let found = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(format!(
                "{tool} is missing: install it with `apt-get install -y {package}`"
            ));
        }
    }
    Ok(())
}

/// Private (not shared) memory of a process, in KiB.
pub(crate) fn private_kib(pid: u32) -> f64 {
    let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return 0.0;
    };
    rollup
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

/// The pids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    let path = format!("/proc/{parent}/task/{parent}/children");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn run(command: &mut Command) -> Result<String, String> {
    let output = command.output().map_err(|e| format!("cannot run {command:?}: {e}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn poll(what: &str, mut done: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = Instant::now() + LIMIT;
    while !done()? {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// supervisord with `count` programs `sleep 1000`.
pub(crate) fn supervisord(dir: &Path, count: usize) -> Result<PeerRun, String> {
    require(&["supervisord", "supervisorctl"], "supervisor")?;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    let config = dir.join("supervisord.conf");
    let mut text = format!(
        "[unix_http_server]\nfile={d}/supervisor.sock\n[supervisord]\nlogfile={d}/supervisord.log\npidfile={d}/supervisord.pid\n\
         nodaemon=true\nchildlogdir={d}/logs\nminfds={fds}\n[rpcinterface:supervisor]\n\
         supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n[supervisorctl]\nserverurl=unix://{d}/supervisor.sock\n",
        d = dir.display(),
        fds = count * 3 + 256,
    );
    for i in 0..count {
        text.push_str(&format!(
            "[program:p{i}]\ncommand=/bin/sleep 1000\nstartsecs=0\nautorestart=false\nstdout_logfile={d}/p{i}.out\nstderr_logfile={d}/p{i}.err\n",
            d = logs.display()
        ));
    }
    std::fs::write(&config, text).map_err(|e| e.to_string())?;
    let ctl = |args: &[&str]| run(Command::new("supervisorctl").arg("-c").arg(&config).args(args));
    let running = |status: &str| status.lines().filter(|l| l.contains("RUNNING")).count();

    let started = Instant::now();
    let daemon = Reaped(
        Command::new("supervisord")
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start supervisord: {e}"))?,
    );
    poll("supervisord to run every program", || Ok(running(&ctl(&["status"])?) == count))?;
    let start = started.elapsed();
    let memory_kib = private_kib(daemon.0.id());

    let stopping = Instant::now();
    ctl(&["stop", "all"])?;
    poll("supervisord to stop every program", || Ok(running(&ctl(&["status"])?) == 0))?;
    let stop = stopping.elapsed();
    ctl(&["shutdown"])?;
    Ok(PeerRun { start, stop, memory_kib })
}

/// s6-svscan over `count` services `sleep 1000`.
pub(crate) fn s6(dir: &Path, count: usize) -> Result<PeerRun, String> {
    require(&["s6-svscan", "s6-svwait", "s6-svc"], "s6")?;
    let scan = dir.join("scan");
    let services: Vec<PathBuf> = (0..count).map(|i| scan.join(format!("s{i}"))).collect();
    for service in &services {
        std::fs::create_dir_all(service).map_err(|e| e.to_string())?;
        let run_file = service.join("run");
        std::fs::write(&run_file, "#!/bin/sh\nexec /bin/sleep 1000\n")
            .map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run_file, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    let started = Instant::now();
    let svscan = Reaped(
        Command::new("s6-svscan")
            // The default cap is 500 services; raise it to what this run supervises.
            .arg(format!("-c{}", count + 16))
            .arg(&scan)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start s6-svscan: {e}"))?,
    );
    // s6-svwait needs each service's supervise directory, which s6-svscan creates.
    poll("s6-svscan to supervise every service", || {
        Ok(services.iter().all(|s| s.join("supervise/status").exists()))
    })?;
    let waited = Command::new("s6-svwait")
        .args(["-u", "-a", "-t", "300000"])
        .args(&services)
        .status()
        .map_err(|e| e.to_string())?;
    if !waited.success() {
        return Err(format!("s6-svwait -u failed ({waited})"));
    }
    let start = started.elapsed();
    let mut memory_kib = private_kib(svscan.0.id());
    for supervise in children(svscan.0.id()) {
        memory_kib += private_kib(supervise);
    }

    // s6-svc takes one service at a time; run them 64 at once, as a script with `xargs -P` would.
    let stopping = Instant::now();
    for chunk in services.chunks(64) {
        let downs: Vec<Child> = chunk
            .iter()
            .map(|service| Command::new("s6-svc").arg("-d").arg(service).spawn())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("cannot run s6-svc: {e}"))?;
        for mut down in downs {
            let status = down.wait().map_err(|e| e.to_string())?;
            if !status.success() {
                return Err(format!("s6-svc -d failed ({status})"));
            }
        }
    }
    let waited = Command::new("s6-svwait")
        .args(["-d", "-a", "-t", "300000"])
        .args(&services)
        .status()
        .map_err(|e| e.to_string())?;
    if !waited.success() {
        return Err(format!("s6-svwait -d failed ({waited})"));
    }
    let stop = stopping.elapsed();
    // The services are down; end their supervisors, then s6-svscan.
    let supervisors: Vec<String> = children(svscan.0.id()).iter().map(u32::to_string).collect();
    if !supervisors.is_empty() {
        let _ = Command::new("kill").arg("-TERM").args(&supervisors).status();
    }
    let _ = Command::new("s6-svscanctl").arg("-t").arg(&scan).status();
    Ok(PeerRun { start, stop, memory_kib })
}
