//! One measure of starting, stopping and holding N processes, applied the same way to wharf and
//! to the tools a user would otherwise pick: supervisord (Debian package `supervisor`) and s6
//! (Debian package `s6`).
//!
//! For every system the daemon is already running and idle when the timer starts. The start
//! timer runs from the first request for the N processes until the system's own status
//! interface reports every one running; the stop timer from the first request to stop until it
//! reports every one down. Each status interface is asked in full every [`POLL`], from this
//! process, with no process start in between: wharf's `GET /v1/allocations`, supervisord's
//! XML-RPC `getAllProcessInfo` over its socket (what `supervisorctl status` calls), s6's status
//! files (what `s6-svstat` reads). A process in any state but starting or running (supervisord's
//! `BACKOFF`, `EXITED`, `FATAL`; an s6 service that died while wanted up; a failed wharf
//! allocation) fails the measure, as does a wait longer than [`LIMIT`].
//!
//! Memory has one definition for all: the private memory (`Private_Clean + Private_Dirty`)
//! the supervisor's own processes gain between idle and all N running. For wharf that is the
//! agent process and its shims, for supervisord its one process, for s6 `s6-svscan` and its
//! `s6-supervise` processes. The supervised `sleep` processes are counted for none.
//!
//! What each is asked: wharf gets N job submissions through its HTTP API, [`IN_FLIGHT`] at a
//! time, as a dispatcher would send them, and as many stop requests (and, in a row of its
//! own, the same stops asked [`STOP_BATCH`] ids a request); supervisord, whose N
//! programs are in its configuration (`autostart=false`), one `startAllProcesses` and one
//! `stopAllProcesses`; s6 finds N service directories, linked into its scan directory before
//! the timer, on one rescan (`s6-svscanctl -a`, which starts an `s6-supervise` per service as
//! wharf starts a shim per task), and is stopped by a `d` written to each service's control
//! FIFO (what `s6-svc -d` writes).
//!
//! Differences worth knowing when reading the figures: wharf writes each submission durably
//! before it answers, and each exit record; neither peer persists anything to survive its
//! own `kill -9` with reattachment. supervisord and wharf capture each process's output into
//! files; s6 here does not (a logger per service would double its process count). wharf puts
//! each task in a cgroup of its own (made, limited, and removed when the task ends), which
//! neither peer does: a second wharf, with `cgroups.enabled = false`, shows what that costs, and
//! a third, with its data directory on tmpfs, what the disk costs (the directories each
//! allocation has, made and removed, and the fsyncs).

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use hyper::Method;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wharf_node::api::{AllocSummary, StopManyResult};
use wharf_node::client::Client;
use wharf_node::config::NodeConfig;
use wharf_state::ClientStatus;

const FULL_PROCESSES: usize = 1000;

/// `N` processes under wharf, supervisord and s6, each measured by [`measure`], in turns so
/// that all see the same machine.
pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let shim = crate::exec::shim()?;
    let wharf = crate::exec::built("wharf-node", "wharf")?;
    let count = effort.scaled(FULL_PROCESSES);
    let mut systems: [(&str, Vec<PeerRun>); 3] =
        [("wharf", Vec::new()), ("supervisord", Vec::new()), ("s6", Vec::new())];
    let (mut uncontained, mut in_memory, mut batched) = (Vec::new(), Vec::new(), Vec::new());
    // Each run starts 5,000 real processes: three runs are enough.
    for _ in 0..effort.runs.min(3) {
        // What the scenarios before wrote is flushed first, not measured as part of an fsync.
        crate::exec::settle();
        for (cgroups, on_disk, stop_batch, runs) in [
            (true, true, None, &mut systems[0].1),
            (true, true, Some(STOP_BATCH), &mut batched),
            (false, true, None, &mut uncontained),
            (true, false, None, &mut in_memory),
        ] {
            let dir = if on_disk {
                crate::scratch::dir("wharf-bench-peers")
            } else {
                crate::scratch::dir_in_memory("wharf-bench-peers")?
            };
            let mut config = crate::node::config(&dir, &shim);
            config.cgroups.enabled = cgroups;
            let mut agent = AgentProcess::start(&wharf, &config, count)?;
            agent.stop_batch = stop_batch;
            runs.push(measure(&mut agent, count).map_err(|e| format!("wharf: {e}"))?);
            agent.terminate()?;
        }
        let dir = crate::scratch::dir("wharf-bench-peers");
        let mut supervisord = Supervisord::start(&dir, count)?;
        systems[1]
            .1
            .push(measure(&mut supervisord, count).map_err(|e| format!("supervisord: {e}"))?);
        supervisord.stop()?;
        let dir = crate::scratch::dir("wharf-bench-peers");
        let mut s6 = S6::start(&dir, count)?;
        systems[2].1.push(measure(&mut s6, count).map_err(|e| format!("s6: {e}"))?);
        s6.stop();
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let per_process = |r: &PeerRun| r.memory_kib / count as f64;
    let [(_, ours), peers @ ..] = &systems;
    let full = count == FULL_PROCESSES;
    let mut rows = Vec::new();
    for (peer, theirs) in peers {
        let is_s6 = *peer == "s6";
        // Issue 33's targets: start at 3x s6, stop ahead of both peers, and at most 20 KiB a
        // process (wharf's own figure, judged once, on s6's row).
        let row = |name: String,
                   figure: &dyn Fn(&PeerRun) -> f64,
                   unit,
                   target: Option<String>|
         -> Result<Row, String> {
            Ok(Row {
                name,
                unit,
                better: Better::Lower,
                samples: ours.iter().map(figure).collect(),
                baseline: Some(((*peer).into(), theirs.iter().map(figure).collect())),
                target: target.filter(|_| full).as_deref().map(Target::parse).transpose()?,
            })
        };
        rows.push(row(
            format!("{count} processes: start, from all requested (daemon running) until all reported running"),
            &|r| ms(&r.start),
            "ms",
            is_s6.then(|| "≥ 3x s6".to_owned()),
        )?);
        rows.push(row(
            format!("{count} processes: stop, from all requested until all reported down"),
            &|r| ms(&r.stop),
            "ms",
            Some(format!("≥ 1x {peer}, ahead of both peers")),
        )?);
        rows.push(row(
            format!("{count} processes: private memory the supervisor's processes gain, per process (wharf: agent and shims)"),
            &per_process,
            "KiB",
            is_s6.then(|| "≤ 20 KiB".to_owned()),
        )?);
    }
    // The same measure without cgroups, and with the data directory in memory, beside s6: what
    // the cgroups and the disk cost (directories made and removed, fsyncs).
    let (_, s6) = &systems[2];
    let start = |r: &PeerRun| ms(&r.start);
    let stop = |r: &PeerRun| ms(&r.stop);
    let batched_name = format!("wharf stopping by batches of {STOP_BATCH} ids a request");
    let variants: [(&str, &[PeerRun], &[Figure<'_>]); 3] = [
        // Beside the per-allocation stop of the rows above: the same stop asked in batches.
        (&batched_name, &batched, &[("stop", &stop, "ms")]),
        (
            "wharf without cgroups",
            &uncontained,
            &[
                ("start", &start, "ms"),
                ("stop", &stop, "ms"),
                ("private memory per process", &per_process, "KiB"),
            ],
        ),
        (
            "wharf with its data directory on tmpfs",
            &in_memory,
            &[("start", &start, "ms"), ("stop", &stop, "ms")],
        ),
    ];
    for (variant, runs, figures) in variants {
        for (name, figure, unit) in figures {
            rows.push(Row {
                name: format!("{count} processes: {name}, {variant}"),
                unit,
                better: Better::Lower,
                samples: runs.iter().map(figure).collect(),
                baseline: Some(("s6".into(), s6.iter().map(figure).collect())),
                target: None,
            });
        }
    }
    Ok(rows)
}

/// What one run of a system measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRun {
    /// From the first start request until every process is reported running.
    pub(crate) start: Duration,
    /// From the first stop request until every process is reported down.
    pub(crate) stop: Duration,
    /// Private memory the supervisor's processes gained for the running processes, in KiB.
    pub(crate) memory_kib: f64,
}

/// The longest any wait of a measure may take.
pub(crate) const LIMIT: Duration = Duration::from_secs(120);
/// The pause between two status queries, the same for every system.
pub(crate) const POLL: Duration = Duration::from_millis(20);
/// Ids in one batched stop request (`POST /v1/allocations/stop`).
pub(crate) const STOP_BATCH: usize = 100;
/// Requests wharf has in flight at once.
pub(crate) const IN_FLIGHT: usize = 32;

/// What a status interface reports about the N processes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    /// Running.
    pub(crate) up: usize,
    /// Stopped (or not started yet).
    pub(crate) down: usize,
    /// A process in a state that is neither: what it is.
    pub(crate) failed: Option<String>,
}

/// A supervisor as this measure drives it; the daemon runs and is idle when it is handed over.
pub(crate) trait Supervisor {
    /// Private memory of the supervisor's own processes, in KiB.
    fn private_kib(&mut self) -> Result<f64, String>;
    /// Asks for every process to start.
    fn request_start(&mut self) -> Result<(), String>;
    /// Asks for every process to stop.
    fn request_stop(&mut self) -> Result<(), String>;
    /// Asks its status interface about every process.
    fn status(&mut self) -> Result<Tally, String>;
}

/// A figure of a run: its name, how it is read, its unit.
type Figure<'a> = (&'static str, &'a dyn Fn(&PeerRun) -> f64, &'static str);

/// Starts `count` processes under `system`, then stops them, measuring both and the memory.
pub(crate) fn measure(system: &mut dyn Supervisor, count: usize) -> Result<PeerRun, String> {
    let idle = system.private_kib()?;
    let started = Instant::now();
    system.request_start()?;
    wait(system, "every process running", |tally| tally.up == count)?;
    let start = started.elapsed();
    let memory_kib = system.private_kib()? - idle;
    let stopping = Instant::now();
    system.request_stop()?;
    wait(system, "every process down", |tally| tally.down == count)?;
    Ok(PeerRun { start, stop: stopping.elapsed(), memory_kib })
}

/// Asks `system` for its status every [`POLL`] until `done`; fails on a failed process or
/// after [`LIMIT`].
fn wait(
    system: &mut dyn Supervisor,
    what: &str,
    done: impl Fn(&Tally) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let tally = system.status()?;
        if let Some(failed) = tally.failed {
            return Err(format!("waiting for {what}: {failed}"));
        }
        if done(&tally) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{what} not reported within {LIMIT:?}: {tally:?}"));
        }
        std::thread::sleep(POLL);
    }
}

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
pub(crate) fn private_kib(pid: u32) -> Result<f64, String> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let rollup = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(rollup
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum())
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

/// Polls `ready` every [`POLL`] for at most [`LIMIT`].
fn until(what: &str, mut ready: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + LIMIT;
    while !ready() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// A child process killed and reaped when dropped.
pub(crate) struct Reaped(pub(crate) Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `wharf agent` as a process of its own, idle until asked, measured as the peers are.
struct AgentProcess {
    child: Option<Reaped>,
    wharf: PathBuf,
    config: NodeConfig,
    client: Client,
    runtime: tokio::runtime::Runtime,
    count: usize,
    ids: Vec<String>,
    /// Stops asked in batches of this many ids; None: one request per allocation.
    stop_batch: Option<usize>,
}

impl AgentProcess {
    /// Starts `wharf agent` with `config`'s data directory, resources and cgroups switch (an
    /// API on a free loopback port), logging at its default level into the scratch directory,
    /// and waits until it is ready.
    fn start(wharf: &Path, config: &NodeConfig, count: usize) -> Result<AgentProcess, String> {
        let root = config.data_dir.parent().unwrap_or(&config.data_dir).to_owned();
        let file = root.join("agent.toml");
        // Its shim is the one it carries, as for any user.
        let text = format!(
            "data_dir = {:?}\nbind = \"127.0.0.1:0\"\n[gc]\nmax_allocs = {}\n\
             [resources]\ncpu_total_compute = {}\nmemory_total_mb = {}\n\
             [cgroups]\nenabled = {}\n",
            config.data_dir.display().to_string(),
            u32::MAX,
            config.resources.cpu_total_compute,
            config.resources.memory_total_mb,
            config.cgroups.enabled,
        );
        std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        let (child, address) = wharf_tests::announce::spawn_announcing(
            std::process::Command::new(wharf).arg("agent").arg("--config").arg(&file),
            "agent ready",
            LIMIT,
            Some(&root.join("agent.log")),
        )?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        // It made its own token, and keeps it in its data directory.
        let token = wharf_node::agent_token::read(&config.data_dir).map_err(|e| e.to_string())?;
        Ok(AgentProcess {
            child: Some(Reaped(child)),
            wharf: wharf.to_owned(),
            config: config.clone(),
            client: Client::new(&address, token),
            runtime,
            count,
            ids: Vec::new(),
            stop_batch: None,
        })
    }

    fn pid(&self) -> Result<u32, String> {
        self.child.as_ref().map(|c| c.0.id()).ok_or_else(|| "the agent has ended".into())
    }

    /// Stops the agent (SIGTERM), which leaves tasks running: by now there are none.
    fn terminate(mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        wharf_tests::announce::terminate(&mut child.0, LIMIT)
            .map(drop)
            .map_err(|e| format!("the agent did not stop cleanly: {e}"))
    }
}

impl AgentProcess {
    /// Asks for every stop in requests of `batch` ids each, [`IN_FLIGHT`] at a time.
    fn request_stop_batched(&mut self, batch: usize) -> Result<(), String> {
        let batches: Vec<Vec<String>> = self.ids.chunks(batch.max(1)).map(<[_]>::to_vec).collect();
        let (client, batches) = (self.client.clone(), std::sync::Arc::new(batches));
        self.runtime.block_on(in_flight(batches.len(), move |index| {
            let (client, batches) = (client.clone(), batches.clone());
            async move {
                let body = serde_json::json!({ "ids": batches[index] });
                let result: StopManyResult = client
                    .json(Method::POST, "/v1/allocations/stop", Some(body))
                    .await
                    .map_err(|e| e.to_string())?;
                if result.stopped.len() == batches[index].len() {
                    Ok(())
                } else {
                    Err(format!("a batched stop did not stop every id: {result:?}"))
                }
            }
        }))?;
        Ok(())
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.child.take().is_some() {
            // Killed by the drop of `Reaped`; its tasks go with a wipe of its data directory.
            let _ = std::process::Command::new(&self.wharf)
                .arg("--data-dir")
                .arg(&self.config.data_dir)
                .arg("wipe")
                .output();
        }
    }
}

/// Runs `request` for `0..count`, [`IN_FLIGHT`] at a time; the answers in order.
async fn in_flight<T, F, Fut>(count: usize, request: F) -> Result<Vec<T>, String>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, String>> + Send,
{
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT.min(count) {
        let (next, request) = (next.clone(), request.clone());
        lanes.spawn(async move {
            let mut answers = Vec::new();
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if index >= count {
                    return Ok::<_, String>(answers);
                }
                answers.push((index, request(index).await?));
            }
        });
    }
    let mut answers = Vec::with_capacity(count);
    while let Some(lane) = lanes.join_next().await {
        answers.extend(lane.map_err(|e| e.to_string())??);
    }
    answers.sort_by_key(|(index, _)| *index);
    Ok(answers.into_iter().map(|(_, answer)| answer).collect())
}

impl Supervisor for AgentProcess {
    fn private_kib(&mut self) -> Result<f64, String> {
        let mut kib = private_kib(self.pid()?)?;
        let shims = crate::node::shim_pids(&self.config);
        // Idle, there are none; once submitted, one a task.
        let expected = if self.ids.is_empty() { 0 } else { self.count };
        if shims.len() != expected {
            return Err(format!("found {} shims for {expected} tasks", shims.len()));
        }
        for shim in shims {
            kib += private_kib(shim)?;
        }
        Ok(kib)
    }

    fn request_start(&mut self) -> Result<(), String> {
        let client = self.client.clone();
        self.ids = self.runtime.block_on(in_flight(self.count, move |_| {
            let client = client.clone();
            async move { crate::node::submit(&client).await }
        }))?;
        Ok(())
    }

    fn request_stop(&mut self) -> Result<(), String> {
        if let Some(batch) = self.stop_batch {
            return self.request_stop_batched(batch);
        }
        let (client, ids) = (self.client.clone(), std::sync::Arc::new(self.ids.clone()));
        self.runtime.block_on(in_flight(ids.len(), move |index| {
            let (client, ids) = (client.clone(), ids.clone());
            async move {
                let path = format!("/v1/allocations/{}/stop", ids[index]);
                client.call(Method::POST, &path, None).await.map(drop).map_err(|e| e.to_string())
            }
        }))?;
        Ok(())
    }

    fn status(&mut self) -> Result<Tally, String> {
        let list: Vec<AllocSummary> = self
            .runtime
            .block_on(self.client.json(Method::GET, "/v1/allocations", None))
            .map_err(|e| format!("cannot list allocations: {e}"))?;
        let mut tally = Tally::default();
        for alloc in list {
            match alloc.client_status {
                ClientStatus::Running => tally.up += 1,
                ClientStatus::Complete => tally.down += 1,
                ClientStatus::Pending => {}
                status => {
                    tally.failed = Some(format!(
                        "allocation {} is {status:?}: {}",
                        alloc.id, alloc.description
                    ))
                }
            }
        }
        Ok(tally)
    }
}

/// supervisord with `count` programs `sleep 1000`, configured and not started.
pub(crate) struct Supervisord {
    daemon: Reaped,
    socket: PathBuf,
}

impl Supervisord {
    pub(crate) fn start(dir: &Path, count: usize) -> Result<Supervisord, String> {
        require(&["supervisord"], "supervisor")?;
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let config = dir.join("supervisord.conf");
        let socket = dir.join("supervisor.sock");
        let mut text = format!(
            "[unix_http_server]\nfile={socket}\n[supervisord]\nlogfile={d}/supervisord.log\npidfile={d}/supervisord.pid\n\
             nodaemon=true\nchildlogdir={d}/logs\nminfds={fds}\n[rpcinterface:supervisor]\n\
             supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
            socket = socket.display(),
            d = dir.display(),
            fds = count * 3 + 256,
        );
        for i in 0..count {
            text.push_str(&format!(
                "[program:p{i}]\ncommand=/bin/sleep 1000\nautostart=false\nstartsecs=0\nautorestart=false\n\
                 stdout_logfile={d}/p{i}.out\nstderr_logfile={d}/p{i}.err\n",
                d = logs.display()
            ));
        }
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let daemon = Reaped(
            Command::new("supervisord")
                .arg("-c")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start supervisord: {e}"))?,
        );
        let supervisord = Supervisord { daemon, socket };
        until("supervisord to answer", || supervisord.call("supervisor.getState", "").is_ok())?;
        Ok(supervisord)
    }

    /// One XML-RPC call over supervisord's socket; the response's body.
    fn call(&self, method: &str, params: &str) -> Result<String, String> {
        let body = format!(
            "<?xml version=\"1.0\"?><methodCall><methodName>{method}</methodName><params>{params}</params></methodCall>"
        );
        let mut stream = UnixStream::connect(&self.socket)
            .map_err(|e| format!("cannot reach supervisord at {}: {e}", self.socket.display()))?;
        stream.set_read_timeout(Some(LIMIT)).map_err(|e| e.to_string())?;
        write!(
            stream,
            "POST /RPC2 HTTP/1.0\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| format!("cannot call supervisord: {e}"))?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(|e| format!("supervisord's answer: {e}"))?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(format!("supervisord answered {method} with {head:?}"));
        }
        if body.contains("<fault>") {
            return Err(format!("supervisord refused {method}: {body}"));
        }
        Ok(body.to_owned())
    }

    pub(crate) fn stop(self) -> Result<(), String> {
        self.call("supervisor.shutdown", "").map(drop)
    }
}

/// XML-RPC's `false`, as the one parameter (`wait`) of the all-processes calls.
const NO_WAIT: &str = "<param><value><boolean>0</boolean></value></param>";

impl Supervisor for Supervisord {
    fn private_kib(&mut self) -> Result<f64, String> {
        private_kib(self.daemon.0.id())
    }

    fn request_start(&mut self) -> Result<(), String> {
        self.call("supervisor.startAllProcesses", NO_WAIT).map(drop)
    }

    fn request_stop(&mut self) -> Result<(), String> {
        self.call("supervisor.stopAllProcesses", NO_WAIT).map(drop)
    }

    fn status(&mut self) -> Result<Tally, String> {
        let body = self.call("supervisor.getAllProcessInfo", "")?;
        let mut tally = Tally::default();
        for member in body.split("<name>statename</name>").skip(1) {
            let state = member
                .split_once("<string>")
                .and_then(|(_, rest)| rest.split_once("</string>"))
                .map(|(state, _)| state)
                .ok_or_else(|| format!("a process without a state in {body}"))?;
            match state {
                "RUNNING" => tally.up += 1,
                "STOPPED" => tally.down += 1,
                "STARTING" | "STOPPING" => {}
                other => tally.failed = Some(format!("a supervisord program is {other}")),
            }
        }
        Ok(tally)
    }
}

/// s6-svscan, running on an empty scan directory, and `count` services `sleep 1000` for it.
pub(crate) struct S6 {
    svscan: Reaped,
    scan: PathBuf,
    services: Vec<PathBuf>,
}

impl S6 {
    pub(crate) fn start(dir: &Path, count: usize) -> Result<S6, String> {
        require(&["s6-svscan", "s6-svscanctl"], "s6")?;
        let scan = dir.join("scan");
        std::fs::create_dir_all(&scan).map_err(|e| e.to_string())?;
        let svscan = Reaped(
            Command::new("s6-svscan")
                // The default cap is 500 services; raise it to what this run supervises. No
                // scan but the ones asked for (-t0).
                .arg(format!("-c{}", count + 16))
                .arg("-t0")
                .arg(&scan)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start s6-svscan: {e}"))?,
        );
        until("s6-svscan to listen", || scan.join(".s6-svscan/control").exists())?;
        let mut services = Vec::with_capacity(count);
        for i in 0..count {
            let service = dir.join(format!("services/s{i}"));
            std::fs::create_dir_all(&service).map_err(|e| e.to_string())?;
            let run_file = service.join("run");
            std::fs::write(&run_file, "#!/bin/sh\nexec /bin/sleep 1000\n")
                .map_err(|e| e.to_string())?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&run_file, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(&service, scan.join(format!("s{i}")))
                .map_err(|e| e.to_string())?;
            services.push(service);
        }
        Ok(S6 { svscan, scan, services })
    }

    pub(crate) fn stop(self) {
        // The services are down; end their supervisors, then s6-svscan.
        let supervisors: Vec<String> =
            children(self.svscan.0.id()).iter().map(u32::to_string).collect();
        if !supervisors.is_empty() {
            let _ = Command::new("kill").arg("-TERM").args(&supervisors).status();
        }
        let _ = Command::new("s6-svscanctl").arg("-t").arg(&self.scan).status();
    }
}

impl Supervisor for S6 {
    fn private_kib(&mut self) -> Result<f64, String> {
        let mut kib = private_kib(self.svscan.0.id())?;
        for supervise in children(self.svscan.0.id()) {
            kib += private_kib(supervise)?;
        }
        Ok(kib)
    }

    fn request_start(&mut self) -> Result<(), String> {
        let status = Command::new("s6-svscanctl")
            .arg("-a")
            .arg(&self.scan)
            .status()
            .map_err(|e| format!("cannot run s6-svscanctl: {e}"))?;
        if status.success() { Ok(()) } else { Err(format!("s6-svscanctl -a failed ({status})")) }
    }

    fn request_stop(&mut self) -> Result<(), String> {
        for service in &self.services {
            let control = service.join("supervise/control");
            let mut fifo = std::fs::OpenOptions::new()
                .write(true)
                .open(&control)
                .map_err(|e| format!("cannot open {}: {e}", control.display()))?;
            fifo.write_all(b"d").map_err(|e| format!("cannot write {}: {e}", control.display()))?;
        }
        Ok(())
    }

    fn status(&mut self) -> Result<Tally, String> {
        let mut tally = Tally::default();
        for service in &self.services {
            let path = service.join("supervise/status");
            let status = match std::fs::read(&path) {
                Ok(status) => S6Status::parse(&status)
                    .ok_or_else(|| format!("{} is not an s6 status file", path.display()))?,
                // Not supervised yet.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
            };
            if status.pid != 0 {
                tally.up += 1;
            } else if status.want_up && status.wstat != 0 {
                tally.failed = Some(format!(
                    "s6 service {} died (wait status {})",
                    service.display(),
                    status.wstat
                ));
            } else {
                tally.down += 1;
            }
        }
        Ok(tally)
    }
}

/// What this measure reads of s6's `supervise/status` file: since s6 2.10, 35 bytes (two
/// TAI64N stamps, the pid as a big-endian u64, the wait status as a big-endian u16, flags), or
/// 43 with the process group after the pid (2.12).
#[derive(Debug)]
struct S6Status {
    pid: u64,
    wstat: u16,
    want_up: bool,
}

impl S6Status {
    fn parse(bytes: &[u8]) -> Option<S6Status> {
        let wstat_at = match bytes.len() {
            35 => 32,
            43 => 40,
            _ => return None,
        };
        Some(S6Status {
            pid: u64::from_be_bytes(bytes[24..32].try_into().ok()?),
            wstat: u16::from_be_bytes(bytes[wstat_at..wstat_at + 2].try_into().ok()?),
            want_up: bytes[wstat_at + 2] & 4 != 0,
        })
    }
}
