//! The agent dies with SIGKILL; its tasks do not, and a new agent reattaches to them.
//!
//! The "agent" is this test binary run again with `--helper`: it starts two tasks through a
//! `RawExecDriver`, prints their handles and waits to be killed. The test kills it with
//! SIGKILL, lets one task finish while no agent runs, and recovers both from a fresh driver:
//! the running one is reattached (and stopped), the finished one's exit status is read from
//! the record its shim left.
//!
//! This binary has its own `main` (no libtest harness) because it is also the helper.

#![allow(clippy::print_stdout, clippy::print_stderr)] // A test program: its output is its interface.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use wharf_driver::{Driver, ExitResult, RunState, TaskHandle};
use wharf_state::Signal;

const NAME: &str = "a_task_outlives_an_agent_killed_with_sigkill";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, root] = args.as_slice()
        && flag == "--helper"
    {
        return helper(Path::new(root));
    }
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    // Honour libtest's filters: names to run, and `--skip` names not to.
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
    let outcome = std::panic::catch_unwind(test);
    let ok = outcome.is_ok();
    println!("test {NAME} ... {}", if ok { "ok" } else { "FAILED" });
    println!("{} passed, {} failed", u8::from(ok), u8::from(!ok));
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The agent to be killed: starts the tasks, prints one handle per line, then waits for its
/// stdin to close (it never does: the test kills it first).
fn helper(root: &Path) -> ExitCode {
    runtime().block_on(async {
        let driver = driver();
        let svc = driver.start_task(shell(root, "svc", "exec sleep 600")).await.unwrap();
        let batch_config = shell(root, "batch", "read line < go; exit 7");
        mkfifo(&batch_config.task_dir.join("go"));
        let batch = driver.start_task(batch_config).await.unwrap();
        let mut out = std::io::stdout().lock();
        for handle in [svc, batch] {
            writeln!(out, "{}", serde_json::to_string(&handle).unwrap()).unwrap();
        }
        out.flush().unwrap();
    });
    let _ = std::io::stdin().lines().count();
    ExitCode::SUCCESS
}

fn pid_of(handle: &TaskHandle, field: &str) -> i32 {
    handle.driver_state.value()[field].as_i64().unwrap() as i32
}

fn test() {
    let root = tempfile::tempdir().unwrap();
    #[allow(clippy::disallowed_methods)] // The test's job is to run and kill an agent.
    let mut agent = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--helper")
        .arg(root.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = agent.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut handles: Vec<TaskHandle> = (0..2)
        .map(|_| {
            let line = rx.recv_timeout(LIMIT).expect("the agent never printed its handles");
            serde_json::from_str(&line).unwrap()
        })
        .collect();
    let batch = handles.pop().unwrap();
    let svc = handles.pop().unwrap();

    agent.kill().unwrap(); // SIGKILL
    agent.wait().unwrap();
    for handle in [&svc, &batch] {
        assert!(alive(pid_of(handle, "shim_pid")), "a shim died with its agent");
        assert!(alive(pid_of(handle, "task_pid")), "a task died with its agent");
    }

    // The batch task ends while no agent is running.
    write_fifo(&batch.config.task_dir.join("go"), "go\n");
    wait_gone(pid_of(&batch, "shim_pid"));

    runtime().block_on(async {
        let driver = driver();
        driver.recover_task(&svc).await.unwrap();
        driver.recover_task(&batch).await.unwrap();

        let info = driver.inspect_task(batch.id()).await.unwrap();
        assert_eq!((info.state, info.exit), (RunState::Exited, Some(ExitResult::code(7))));
        assert_eq!(driver.wait_task(batch.id()).await.unwrap(), ExitResult::code(7));

        assert_eq!(driver.inspect_task(svc.id()).await.unwrap().state, RunState::Running);
        assert_eq!(driver.task_stats(svc.id()).await.unwrap().processes, 1);
        let stop = driver.stop_task(svc.id(), Duration::from_secs(5), Signal::Term);
        tokio::time::timeout(LIMIT, stop).await.unwrap().unwrap();
        let wait = tokio::time::timeout(LIMIT, driver.wait_task(svc.id()));
        assert_eq!(wait.await.unwrap().unwrap(), ExitResult::signalled(15));
        assert!(!alive(pid_of(&svc, "task_pid")));
        assert!(!alive(pid_of(&svc, "shim_pid")));

        // Yet another agent, after both ended, learns both outcomes from the records.
        let later = common::driver();
        for (handle, expected) in [(&svc, ExitResult::signalled(15)), (&batch, ExitResult::code(7))]
        {
            later.recover_task(handle).await.unwrap();
            assert_eq!(later.wait_task(handle.id()).await.unwrap(), expected);
        }
    });
}
