//! The probe channel end to end: a real OpenSSH server on 127.0.0.1 (see
//! `wharf_tests::sshd`), the `wharf` binary as the runner serving `probe-channel` over one
//! session, and a real agent. The channel answers the run probe and starts as the command mode
//! does; a channel whose server is killed falls back to a fresh session within the probe's
//! deadline and is opened again; a hung one hits the deadline; a start over it runs once.

// Real processes on the real clock, waited on within bounds.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{AgentProcess, LIMIT, WHARF};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_node::client::Client;
use wharf_prober::ssh::{parse_private_key, parse_public_key};
use wharf_prober::*;
use wharf_tests::proc_stat::ProcStat;
use wharf_tests::sshd::Sshd;

const DEADLINE: Duration = Duration::from_secs(10);

fn sshd() -> Sshd {
    Sshd::start().unwrap_or_else(|e| panic!("cannot start the test sshd: {e}"))
}

fn ssh(sshd: &Sshd) -> Arc<SshExecutor> {
    let target = SshTarget {
        address: Some(sshd.address.clone()),
        user: sshd.user.clone(),
        host_key: Some(parse_public_key(&sshd.host_key).unwrap()),
    };
    Arc::new(SshExecutor::new("w1", target, Arc::new(parse_private_key(&sshd.client_key).unwrap())))
}

/// The agent's data dir as the instance's runner arguments.
fn instance(sshd: &Sshd, agent: &AgentProcess) -> Instance {
    Instance {
        id: "w1".into(),
        address: Some(sshd.address.clone()),
        remote_user: "root".into(),
        tags: Tags::new(),
        host_key: Some(sshd.host_key.clone()),
        runner_args: format!(
            "--data-dir {}",
            quote("data dir", agent.data_dir.to_str().unwrap()).unwrap()
        ),
    }
}

fn config() -> Arc<Prepared> {
    Arc::new(
        WorkerConfig {
            boot_probe_command: "true".into(),
            runner: RunnerConfig {
                command: quote("wharf", WHARF).unwrap(),
                resources_args: None,
                ..RunnerConfig::default()
            },
            command_deadline: DEADLINE,
            ..WorkerConfig::default()
        }
        .prepare()
        .unwrap(),
    )
}

fn channel(sshd: &Sshd, agent: &AgentProcess) -> Arc<ChannelExecutor> {
    let ssh = ssh(sshd);
    let instance = instance(sshd, agent);
    let channel = ChannelConfig::for_runner(&config(), &instance).unwrap();
    Arc::new(ChannelExecutor::new(&instance, ssh.clone(), ssh, channel))
}

fn worker(sshd: &Sshd, agent: &AgentProcess, executor: Arc<dyn Executor>) -> Worker {
    Worker::new(
        WorkerSpec {
            instance: instance(sshd, agent),
            instance_type: "small".into(),
            state: State::Idle,
            idle_behavior: IdleBehavior::Run,
        },
        executor,
        config(),
        Arc::new(SystemClock::new()),
        Arc::new(Brake::default()),
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The commands the worker sends, as it builds them.
fn command(agent: &AgentProcess, args: &str) -> String {
    let data_dir = quote("data dir", agent.data_dir.to_str().unwrap()).unwrap();
    format!("{} --data-dir {data_dir} {args}", quote("wharf", WHARF).unwrap())
}

fn sleeper(id: &str) -> String {
    common::job(id, "service", &common::sh_task("t", "exec sleep 1000"))
}

/// The processes serving a probe channel under `sshd`.
fn channel_servers(sshd: &Sshd) -> Vec<u32> {
    let mut found = Vec::new();
    for pid in wharf_tests::proc_stat::pids().filter_map(|pid| u32::try_from(pid).ok()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("probe-channel") && descends_from(pid, sshd.pid()) {
            found.push(pid);
        }
    }
    found
}

fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        match ProcStat::of(pid).and_then(|stat| u32::try_from(stat.parent).ok()) {
            Some(parent) if parent > 1 => pid = parent,
            _ => return false,
        }
    }
    false
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: a signal to a process this test found under its own sshd.
    let _ = unsafe { libc::kill(pid as i32, signal) };
}

/// Ported from the prober's SSH tests (`boot_probe_deployment_and_run_probe_against_sshd`):
/// the same run probe over the channel and as a command of its own prints the same lines, and
/// the worker sees the same work; a start and a refused start answer the same.
#[test]
fn the_channel_answers_probes_and_starts_as_the_command_mode_does() {
    let sshd = sshd();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let runtime = rt();
    let plain: Arc<dyn Executor> = ssh(&sshd);
    let channel = channel(&sshd, &agent);
    let list = command(&agent, "alloc list --probe");
    runtime.block_on(async {
        // Nothing runs: both print nothing, and exit 0.
        let by_command = plain.execute(&list, b"", DEADLINE).await.unwrap();
        let by_channel = channel.execute(&list, b"", DEADLINE).await.unwrap();
        assert_eq!(by_channel, by_command);
        assert_eq!(by_channel, Output::exited(0, ""));

        // One started as a command, one over the channel: both listed, the same by both.
        let start = |id: &str| command(&agent, &format!("run --detach - --id {id}"));
        let (a, b) = (sleeper("a"), sleeper("b"));
        let (start_a, start_b) = (start("by-command"), start("by-channel"));
        let by_command = plain.execute(&start_a, a.as_bytes(), DEADLINE).await.unwrap();
        let by_channel = channel.execute(&start_b, b.as_bytes(), DEADLINE).await.unwrap();
        assert_eq!(by_command, Output::exited(0, "by-command\n"));
        assert_eq!(by_channel, Output::exited(0, "by-channel\n"));
        let client = Client::of_data_dir(&agent.data_dir, None);
        for id in ["by-command", "by-channel"] {
            common::until(&client, id, "it runs", |d| {
                d.state.client_status == wharf_state::ClientStatus::Running
            })
            .await;
        }
        let by_command = plain.execute(&list, b"", DEADLINE).await.unwrap();
        let by_channel = channel.execute(&list, b"", DEADLINE).await.unwrap();
        assert_eq!(by_channel, by_command);
        let mut lines: Vec<&str> =
            std::str::from_utf8(&by_channel.stdout).unwrap().lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["by-channel", "by-command"]);

        // A spec that is not valid: the same message and exit code by both.
        let bad = start("bad");
        let by_command = plain.execute(&bad, b"[job]\n", DEADLINE).await.unwrap();
        let by_channel = channel.execute(&bad, b"[job]\n", DEADLINE).await.unwrap();
        assert_eq!(by_channel, by_command);
        assert_eq!(by_channel.status, Some(2), "{by_channel:?}");
        // A command the channel does not serve runs as a command, with the same result.
        let status = command(&agent, "alloc outcome by-channel");
        let by_command = plain.execute(&status, b"", DEADLINE).await.unwrap();
        let by_channel = channel.execute(&status, b"", DEADLINE).await.unwrap();
        assert_eq!(by_channel, by_command);
    });
    let stats = channel.stats();
    assert_eq!((stats.opened, stats.failed_opens), (1, 0), "{stats:?}");
    // Two probes and two starts answered; the outcome question ran as a command.
    assert_eq!((stats.answered, stats.fell_back), (4, 1), "{stats:?}");

    // The worker sees the same over either.
    for executor in [plain, channel as Arc<dyn Executor>] {
        let worker = worker(&sshd, &agent, executor);
        assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
        let mut running = worker.view().running;
        running.sort_unstable();
        assert_eq!(running, ["by-channel", "by-command"]);
        assert_eq!(worker.state(), State::Running);
    }
}

#[test]
fn a_killed_channel_server_falls_back_within_the_deadline_and_a_later_probe_reopens_it() {
    let sshd = sshd();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let runtime = rt();
    let channel = channel(&sshd, &agent);
    let worker = worker(&sshd, &agent, channel.clone());
    assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
    let servers = channel_servers(&sshd);
    assert_eq!(servers.len(), 1, "one channel server: {servers:?}");
    signal(servers[0], libc::SIGKILL);
    common::eventually("the killed server is gone", || !common::alive(servers[0] as i32));
    let started = Instant::now();
    assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
    assert!(started.elapsed() < DEADLINE, "{:?}", started.elapsed());
    // Whether that probe found the channel broken before sending (and opened another) or
    // after (and ran in a fresh session), the next probes go over a new channel.
    for _ in 0..3 {
        assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
    }
    let stats = channel.stats();
    assert_eq!(stats.opened, 2, "{stats:?}");
    assert!(stats.answered >= 4, "{stats:?}");
    let now = channel_servers(&sshd);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], servers[0]);

    // A session closed under it (the prober's own connection dropped) is the same.
    runtime.block_on(channel.close());
    assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
    assert_eq!(channel.stats().opened, 3);
    common::eventually("the closed channel's server ends", || channel_servers(&sshd).len() == 1);
}

#[test]
fn a_hung_channel_hits_the_deadline_and_the_next_probe_opens_another() {
    let sshd = sshd();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let runtime = rt();
    let channel = channel(&sshd, &agent);
    let list = command(&agent, "alloc list --probe");
    runtime.block_on(channel.execute(&list, b"", DEADLINE)).unwrap();
    let servers = channel_servers(&sshd);
    assert_eq!(servers.len(), 1, "{servers:?}");
    signal(servers[0], libc::SIGSTOP);
    let deadline = Duration::from_secs(2);
    let started = Instant::now();
    let error = runtime.block_on(channel.execute(&list, b"", deadline)).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, ProberError::Timeout { .. }), "{error}");
    assert!(took >= deadline && took < deadline + Duration::from_secs(1), "{took:?}");
    let out = runtime.block_on(channel.execute(&list, b"", DEADLINE)).unwrap();
    assert!(out.success(), "{out:?}");
    assert_eq!(channel.stats().opened, 2);
    signal(servers[0], libc::SIGKILL);
}

/// The fleet's start path over the channel: the worker's start runs the work once, and the
/// probe then lists it.
#[test]
fn a_start_over_the_channel_runs_the_work_exactly_once() {
    let sshd = sshd();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let runtime = rt();
    let channel = channel(&sshd, &agent);
    let worker = worker(&sshd, &agent, channel.clone());
    let runs = dir.path().join("runs");
    let spec = common::job(
        "once",
        "batch",
        &common::sh_task("t", &format!("echo ran >> {}", runs.display())),
    );
    runtime.block_on(async {
        worker.start_runner("once-1", spec.as_bytes()).await.unwrap();
        let client = Client::of_data_dir(&agent.data_dir, None);
        let done = common::until(&client, "once-1", "it completes", |d| d.done).await;
        assert_eq!(done.state.client_status, wharf_state::ClientStatus::Complete);
    });
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\n", "ran exactly once");
    let stats = channel.stats();
    assert_eq!((stats.answered, stats.fell_back), (1, 0), "the start went over the channel");
    let deadline = Instant::now() + LIMIT;
    // Until the probe no longer lists it (it completed), the worker counts it as running.
    while worker.view().running.iter().any(|r| r == "once-1") {
        assert!(Instant::now() < deadline, "still listed: {:?}", worker.view());
        assert_eq!(runtime.block_on(worker.probe_and_update()), ProbeOutcome::Passed);
    }
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\n");
}

/// The channel answers a probe line it has seen before without parsing it again, yet follows
/// the agent when it restarts (on another port): a client kept for the old agent would find
/// no one and answer from the store the new agent holds, `broken`.
#[test]
fn a_probe_line_seen_before_follows_an_agent_that_restarted() {
    let sshd = sshd();
    let dir = tempfile::tempdir().unwrap();
    let first = AgentProcess::start_with_its_own_token(dir.path(), "");
    let runtime = rt();
    let plain: Arc<dyn Executor> = ssh(&sshd);
    let channel = channel(&sshd, &first);
    let list = command(&first, "alloc list --probe");
    let probe = |executor: &dyn Executor| runtime.block_on(executor.execute(&list, b"", DEADLINE));
    assert_eq!(probe(channel.as_ref()).unwrap(), Output::exited(0, ""));
    assert_eq!(probe(channel.as_ref()).unwrap(), Output::exited(0, ""), "the same line again");
    let (data_dir, config) = first.kill9();
    let agent = AgentProcess::launch(data_dir, config);
    let start = command(&agent, "run --detach - --id after-restart");
    let started =
        runtime.block_on(plain.execute(&start, sleeper("after-restart").as_bytes(), DEADLINE));
    assert_eq!(started.unwrap(), Output::exited(0, "after-restart\n"));
    assert_eq!(probe(channel.as_ref()).unwrap(), Output::exited(0, "after-restart\n"));
    let stats = channel.stats();
    assert_eq!((stats.answered, stats.fell_back), (3, 0), "{stats:?}");
}
