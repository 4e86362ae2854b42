//! The prober against a real OpenSSH server on 127.0.0.1: boot probe, runner deployment, run
//! probe, host key pinning, deadlines, one connection per worker. Each test starts its own
//! sshd (see `wharf_tests::sshd`); without OpenSSH installed they fail and say how to install
//! it.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_prober::ssh::{parse_private_key, parse_public_key};
use wharf_prober::*;
use wharf_tests::proc_stat::ProcStat;
use wharf_tests::sshd::Sshd;

fn sshd() -> Sshd {
    Sshd::start().unwrap_or_else(|e| panic!("cannot start the test sshd: {e}"))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn executor(sshd: &Sshd, host_key: Option<&str>, client_key: &str) -> SshExecutor {
    let target = SshTarget {
        address: Some(sshd.address.clone()),
        user: sshd.user.clone(),
        host_key: host_key.map(|k| parse_public_key(k).unwrap()),
    };
    SshExecutor::new("w1", target, Arc::new(parse_private_key(client_key).unwrap()))
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn commands_run_over_one_persistent_connection() {
    let sshd = sshd();
    let runtime = rt();
    let exec = Arc::new(executor(&sshd, Some(&sshd.host_key), &sshd.client_key));
    runtime.block_on(async {
        let out =
            exec.execute("echo hello; echo oops >&2; exit 3", b"", 10 * SECOND).await.unwrap();
        assert_eq!(out.stdout, b"hello\n");
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.status, Some(3));
        let big = vec![b'x'; 3 << 20];
        let out = exec.execute("wc -c", &big, 20 * SECOND).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (3 << 20).to_string());
        for i in 0..20 {
            let out = exec.execute(&format!("echo {i}"), b"", 10 * SECOND).await.unwrap();
            assert_eq!(out.stdout, format!("{i}\n").as_bytes());
        }
    });
    assert_eq!(exec.dials(), 1, "every command went over the first connection");

    // Concurrent callers on a fresh executor share one dial.
    let fresh = Arc::new(executor(&sshd, Some(&sshd.host_key), &sshd.client_key));
    runtime.block_on(async {
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let fresh = fresh.clone();
                tokio::spawn(
                    async move { fresh.execute(&format!("echo {i}"), b"", 10 * SECOND).await },
                )
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().unwrap().success());
        }
    });
    assert_eq!(fresh.dials(), 1, "concurrent callers shared one connection attempt");
}

#[test]
fn a_changed_or_unknown_host_key_is_refused() {
    let sshd = sshd();
    let runtime = rt();
    let changed = executor(&sshd, Some(&sshd.other_host_key), &sshd.client_key);
    let err = runtime.block_on(changed.execute("true", b"", 10 * SECOND)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ProberError::HostKey { .. }), "{text}");
    assert!(text.contains("the host key changed"), "{text}");
    assert!(text.contains("refusing to connect"), "{text}");
    let presented = ssh::fingerprint(&parse_public_key(&sshd.host_key).unwrap());
    assert!(text.contains(&presented), "names the presented key: {text}");

    let unknown = executor(&sshd, None, &sshd.client_key);
    let err = runtime.block_on(unknown.execute("true", b"", 10 * SECOND)).unwrap_err();
    assert!(err.to_string().contains("no host key is pinned"), "{err}");

    let stranger = executor(&sshd, Some(&sshd.host_key), &sshd.stranger_key);
    let err = runtime.block_on(stranger.execute("true", b"", 10 * SECOND)).unwrap_err();
    assert!(matches!(err, ProberError::Auth { .. }), "{err}");
}

#[test]
fn a_hung_command_is_cut_at_its_deadline_and_the_connection_survives() {
    let sshd = sshd();
    let runtime = rt();
    let exec = executor(&sshd, Some(&sshd.host_key), &sshd.client_key);
    runtime.block_on(async {
        assert!(exec.execute("true", b"", 10 * SECOND).await.unwrap().success());
        #[allow(clippy::disallowed_methods)] // measuring the real deadline
        let started = Instant::now();
        let err = exec.execute("sleep 60", b"", Duration::from_millis(500)).await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, ProberError::Timeout { .. }), "{err}");
        assert!(took < 5 * SECOND, "cut after {took:?}");
        // A command that blocks reading stdin gets end of file at once and does not hang.
        let out = exec.execute("cat", b"", 10 * SECOND).await.unwrap();
        assert!(out.success());
        assert_eq!(exec.execute("echo ok", b"", 10 * SECOND).await.unwrap().stdout, b"ok\n");
    });
    assert_eq!(exec.dials(), 1);
}

/// Whether process `pid` has ended (a zombie has).
fn ended(pid: u32) -> bool {
    ProcStat::of(pid).is_none_or(|stat| stat.is_dead())
}

#[test]
fn a_command_cut_at_its_deadline_leaves_nothing_running_on_the_worker() {
    let sshd = sshd();
    let runtime = rt();
    let exec = executor(&sshd, Some(&sshd.host_key), &sshd.client_key);
    let shell = sshd.scratch().join("shell.pid");
    let child = sshd.scratch().join("child.pid");
    // A hung probe: the shell waits on a child that never ends.
    let command =
        format!("echo $$ > {}; sleep 600 & echo $! > {}; wait", shell.display(), child.display());
    let err =
        runtime.block_on(exec.execute(&command, b"", Duration::from_millis(500))).unwrap_err();
    assert!(matches!(err, ProberError::Timeout { .. }), "{err}");
    let pid = |file: &std::path::Path| -> u32 {
        std::fs::read_to_string(file).unwrap().trim().parse().unwrap()
    };
    let (shell, child) = (pid(&shell), pid(&child));
    #[allow(clippy::disallowed_methods)] // a bound on a real process ending
    let deadline = Instant::now() + 10 * SECOND;
    #[allow(clippy::disallowed_methods)]
    while !(ended(shell) && ended(child)) {
        assert!(Instant::now() < deadline, "the command (pid {shell}, child {child}) still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The connection is still good for the next command.
    assert_eq!(
        runtime.block_on(exec.execute("echo ok", b"", 10 * SECOND)).unwrap().stdout,
        b"ok\n"
    );
    assert_eq!(exec.dials(), 1);
}

/// Every descendant of `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            found.push(child);
            next.push(child);
        }
    }
    found
}

fn signal_all(pids: &[u32], signal: &str) {
    for pid in pids {
        #[allow(clippy::disallowed_methods)] // freezing the test's own sshd session
        let _ = std::process::Command::new("kill").args([signal, &pid.to_string()]).status();
    }
}

#[test]
fn a_connection_that_stops_answering_is_dropped_and_the_next_command_redials() {
    let sshd = sshd();
    let runtime = rt();
    let exec = executor(&sshd, Some(&sshd.host_key), &sshd.client_key);
    runtime.block_on(async {
        assert!(exec.execute("true", b"", 10 * SECOND).await.unwrap().success());
        // The session's processes stop answering, as a connection across a cut link does.
        let session = descendants(sshd.pid());
        assert!(!session.is_empty(), "no session process under sshd {}", sshd.pid());
        signal_all(&session, "-STOP");
        let err = exec.execute("true", b"", Duration::from_millis(500)).await.unwrap_err();
        assert!(matches!(err, ProberError::Timeout { .. }), "{err}");
        // The next command does not wait on the dead connection: it dials a new one.
        let out = exec.execute("echo back", b"", 10 * SECOND).await;
        signal_all(&session, "-CONT");
        assert_eq!(out.unwrap().stdout, b"back\n");
    });
    assert_eq!(exec.dials(), 2);
}

#[test]
fn a_worker_that_goes_away_fails_fast_and_is_redialled() {
    let sshd = sshd();
    let runtime = rt();
    let exec = executor(&sshd, Some(&sshd.host_key), &sshd.client_key);
    runtime.block_on(async {
        assert!(exec.execute("true", b"", 10 * SECOND).await.unwrap().success());
        exec.close().await;
        assert!(exec.execute("true", b"", 10 * SECOND).await.unwrap().success());
    });
    assert_eq!(exec.dials(), 2, "closing drops the connection; the next call dials");
    // The listener goes away (the session sshd of an open connection would outlive it, as it
    // does on a real host, so that connection is dropped too): the next call fails at once.
    drop(sshd);
    runtime.block_on(exec.close());
    let err = runtime.block_on(exec.execute("true", b"", 10 * SECOND)).unwrap_err();
    assert!(matches!(err, ProberError::Connect { .. }), "the server is gone: {err}");
    assert!(err.to_string().contains("Connection refused"), "{err}");
}

#[test]
fn a_hung_handshake_is_cut_at_its_deadline() {
    // A listener that accepts and never speaks SSH.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let sshd = sshd();
    let runtime = rt();
    let target = SshTarget {
        address: Some(address),
        user: sshd.user.clone(),
        host_key: Some(parse_public_key(&sshd.host_key).unwrap()),
    };
    let exec =
        SshExecutor::new("mute", target, Arc::new(parse_private_key(&sshd.client_key).unwrap()));
    let err = runtime.block_on(exec.execute("true", b"", Duration::from_millis(500))).unwrap_err();
    assert!(matches!(err, ProberError::Timeout { .. }), "{err}");
    drop(listener);
}

#[test]
fn a_hostile_id_cannot_inject_over_ssh() {
    let sshd = sshd();
    let runtime = rt();
    let exec = executor(&sshd, Some(&sshd.host_key), &sshd.client_key);
    let marker = sshd.scratch().join("pwned");
    let id = format!("x'; touch {}; echo '$(touch {})", marker.display(), marker.display());
    let command = format!("printf '%s' {}", quote("runner id", &id).unwrap());
    let out = runtime.block_on(exec.execute(&command, b"", 10 * SECOND)).unwrap();
    assert_eq!(out.stdout, id.as_bytes());
    assert!(!marker.exists());
}

/// A runner that answers the list command from a file beside it in the scratch directory.
fn runner_script(list_file: &std::path::Path) -> Vec<u8> {
    format!(
        "#!/bin/sh\ncase \"$1\" in\n--list) cat {} 2>/dev/null ;;\n*) exit 2 ;;\nesac\n",
        list_file.display()
    )
    .into_bytes()
}

#[test]
fn boot_probe_deployment_and_run_probe_against_sshd() {
    let sshd = sshd();
    let runtime = rt();
    let list_file = sshd.scratch().join("list");
    let binary = runner_script(&list_file);
    let directory = sshd.scratch().join("runner dir");
    let config = WorkerConfig {
        boot_probe_command: "test -d /".into(),
        runner: RunnerConfig {
            command: "unused".into(),
            binary: Some(binary.clone().into()),
            directory: directory.display().to_string(),
            list_args: "--list".into(),
            start_args: "--start".into(),
            kill_args: "--kill".into(),
            outcome_args: None,
            resources_args: None,
        },
        cluster_prefix: "zzzzz-".into(),
        command_deadline: 10 * SECOND,
        deploy_deadline: 20 * SECOND,
        ..WorkerConfig::default()
    }
    .prepare()
    .unwrap();
    let deployment = config.deployment().unwrap().clone();
    let clock = Arc::new(SystemClock::new());
    let exec = Arc::new(executor(&sshd, Some(&sshd.host_key), &sshd.client_key));
    let instance = Instance {
        id: "w1".into(),
        address: Some(sshd.address.clone()),
        remote_user: "root".into(),
        tags: Tags::new(),
        host_key: Some(sshd.host_key.clone()),
        runner_args: String::new(),
    };
    let worker = Worker::new(
        WorkerSpec {
            instance,
            instance_type: "small".into(),
            state: State::Booting,
            idle_behavior: IdleBehavior::Run,
        },
        exec.clone(),
        Arc::new(config),
        clock,
        Arc::new(Brake::default()),
    );
    std::fs::write(&list_file, "zzzzz-1\nyyyyy-2\nzzzzz-3 stale\n").unwrap();
    runtime.block_on(async {
        assert_eq!(worker.probe_and_update().await, ProbeOutcome::Passed);
    });
    let view = worker.view();
    assert_eq!(view.state, State::Running, "{view:?}");
    assert_eq!(view.running, ["zzzzz-1"]);
    let deployed = std::path::Path::new(&deployment.path);
    assert_eq!(std::fs::read(deployed).unwrap(), binary);
    assert_eq!(std::fs::metadata(deployed).unwrap().permissions().mode() & 0o777, 0o755);
    let leftovers: Vec<_> = std::fs::read_dir(&directory)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temp file left: {leftovers:?}");

    // The work ends: the next probe sees the worker idle, and does not copy again.
    std::fs::write(&list_file, "").unwrap();
    let modified = std::fs::metadata(deployed).unwrap().modified().unwrap();
    runtime.block_on(async {
        assert_eq!(worker.probe_and_update().await, ProbeOutcome::Passed);
    });
    assert_eq!(worker.state(), State::Idle);
    assert_eq!(std::fs::metadata(deployed).unwrap().modified().unwrap(), modified);
    assert_eq!(exec.dials(), 1);
}

#[test]
fn a_tampered_runner_binary_is_replaced() {
    let sshd = sshd();
    let runtime = rt();
    let list_file = sshd.scratch().join("list");
    let binary = runner_script(&list_file);
    let config = WorkerConfig {
        boot_probe_command: "true".into(),
        runner: RunnerConfig {
            binary: Some(binary.clone().into()),
            directory: sshd.scratch().join("r").display().to_string(),
            list_args: "--list".into(),
            ..RunnerConfig::default()
        },
        ..WorkerConfig::default()
    }
    .prepare()
    .unwrap();
    let path = config.deployment().unwrap().path.clone();
    std::fs::create_dir_all(sshd.scratch().join("r")).unwrap();
    std::fs::write(&path, b"#!/bin/sh\necho tampered\n").unwrap();
    std::fs::write(&list_file, "").unwrap();
    let exec = Arc::new(executor(&sshd, Some(&sshd.host_key), &sshd.client_key));
    let worker = Worker::new(
        WorkerSpec {
            instance: Instance {
                id: "w1".into(),
                address: Some(sshd.address.clone()),
                remote_user: "root".into(),
                tags: Tags::new(),
                host_key: None,
                runner_args: String::new(),
            },
            instance_type: "small".into(),
            state: State::Unknown,
            idle_behavior: IdleBehavior::Run,
        },
        exec,
        Arc::new(config),
        Arc::new(SystemClock::new()),
        Arc::new(Brake::default()),
    );
    runtime.block_on(worker.probe_and_update());
    assert_eq!(std::fs::read(&path).unwrap(), binary);
    assert_eq!(worker.state(), State::Idle);
}
