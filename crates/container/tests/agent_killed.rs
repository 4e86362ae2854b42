//! The agent dies with SIGKILL; its container does not, and a new agent reattaches to it with
//! the same container pid, confirmed by the runtime's `state`.
//!
//! The "agent" is this test binary run again with `--helper`: it starts a container through a
//! `ContainerDriver`, prints its handle and the container's pid, and waits to be killed. The
//! test kills it with SIGKILL and recovers the container from a fresh driver on the same data
//! directory and cgroups. This binary has its own `main` (no libtest harness) because it is
//! also the helper.

#![allow(clippy::print_stdout, clippy::print_stderr)] // A test program: its output is its interface.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use wharf_driver::{Driver, RunState, Signal, TaskHandle};

const NAME: &str = "container_reattach_after_agent_sigkill_keeps_the_container_pid";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, root, parent] = args.as_slice()
        && flag == "--helper"
    {
        return helper(Path::new(root), parent);
    }
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--skip" => skips.extend(rest.next()),
            "--test-threads" | "--logfile" | "--color" | "--format" | "-Z" => drop(rest.next()),
            flag if flag.starts_with('-') => {}
            filter => filters.push(filter),
        }
    }
    let wanted = (filters.is_empty() || filters.iter().any(|f| NAME.contains(f)))
        && !skips.iter().any(|s| NAME.contains(s.as_str()));
    if !wanted {
        println!("0 passed, 0 failed");
        return ExitCode::SUCCESS;
    }
    println!("running 1 test");
    let ok = std::panic::catch_unwind(test).is_ok();
    println!("test {NAME} ... {}", if ok { "ok" } else { "FAILED" });
    println!("{} passed, {} failed", u8::from(ok), u8::from(!ok));
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn task(root: &Path) -> wharf_driver::TaskConfig {
    let layout = Layout::new(&root.join("layout")).image(
        "busybox",
        &[busybox_layer()],
        serde_json::json!({"Cmd": ["sh"]}),
    );
    config(
        root,
        "svc",
        serde_json::json!({"image": layout.reference("busybox"), "command": "sleep", "args": ["600"]}),
    )
}

/// The agent to be killed: starts the container, prints its handle and pid, then waits for
/// its stdin to close (it never does: the test kills it first).
fn helper(root: &Path, parent: &str) -> ExitCode {
    // The node's directory is the test's: kept when this helper dies.
    let node = Node::at(tempfile::TempDir::new_in(root).unwrap(), parent);
    let mut options = node.options();
    options.data_dir = root.join("data");
    runtime().block_on(async {
        let driver = node.driver_with(options);
        let handle = driver.start_task(task(root)).await.unwrap();
        let pid =
            driver.inspect_task(handle.id()).await.unwrap().attributes["container_pid"].clone();
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(&handle).unwrap()).unwrap();
        writeln!(out, "{pid}").unwrap();
        out.flush().unwrap();
    });
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::mem::forget(node); // Killed before this; never clean up the cgroups the test recovers.
    ExitCode::SUCCESS
}

fn test() {
    let root = tempfile::tempdir().unwrap();
    let parent = format!("/wharf-container-test-killed-{}", std::process::id());
    #[allow(clippy::disallowed_methods)] // The test's "agent": this binary again.
    let mut agent = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--helper", &root.path().display().to_string(), &parent])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = agent.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let handle = lines.next().and_then(Result::ok);
        let pid = lines.next().and_then(Result::ok);
        let _ = tx.send((handle, pid));
        // Keep reading so the helper never blocks on a full pipe.
        for _ in lines {}
    });
    let (handle, pid) =
        rx.recv_timeout(LIMIT).expect("the agent did not start the container in time");
    let handle: TaskHandle = serde_json::from_str(&handle.expect("no handle")).unwrap();
    let pid = pid.expect("no pid");
    agent.kill().unwrap();
    agent.wait().unwrap();

    let node = Node::at(tempfile::TempDir::new_in(root.path()).unwrap(), &parent);
    let mut options = node.options();
    options.data_dir = root.path().join("data");
    runtime().block_on(async {
        let driver = node.driver_with(options);
        driver.recover_task(&handle).await.unwrap();
        let info = driver.inspect_task(handle.id()).await.unwrap();
        assert_eq!(info.state, RunState::Running);
        assert_eq!(info.attributes["container_pid"], pid, "the same container");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.lines().any(|l| l.starts_with("Name:") && l.contains("sleep")), "{status}");
        // The runtime knows it as running: a command runs in it.
        let ps = driver
            .exec_task(handle.id(), &["cat".into(), "/proc/1/cmdline".into()], LIMIT)
            .await
            .unwrap();
        assert_eq!(ps.stdout, b"sleep\x00600\x00");
        driver.stop_task(handle.id(), Duration::from_millis(100), Signal::Term).await.unwrap();
        let exit =
            tokio::time::timeout(LIMIT, driver.wait_task(handle.id())).await.unwrap().unwrap();
        assert!(!exit.successful());
        driver.destroy_task(handle.id(), false).await.unwrap();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    });
}
