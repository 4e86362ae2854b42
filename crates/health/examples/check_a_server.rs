//! An http check against a real server on this machine, over `TcpTransport`: a thread answers
//! `200 OK` on 127.0.0.1, the check of a service on that port runs on its interval, and its
//! result is printed once it passes.
//!
//! `cargo run -p wharf-health --example check_a_server`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;
use wharf_health::driver::ExecResult;
use wharf_health::state::{AllocatedPort, Allocation, CheckStatus, Timestamp, parse_toml};
use wharf_health::{CheckBook, CheckIo, TaskChecks, TaskControl, TcpTransport, plans};

/// The task the checks belong to, as far as an http check needs one: it has no scripts to run
/// and is never restarted here.
#[derive(Debug)]
struct NoTask;

#[wharf_health::async_trait]
impl TaskControl for NoTask {
    async fn exec(&self, _: &str, _: &[String], _: Duration) -> Result<ExecResult, String> {
        Err("no script checks here".into())
    }
    async fn restart(&self, task: &str, reason: &str) -> Result<(), String> {
        println!("would restart {task}: {reason}");
        Ok(())
    }
}

/// Answers every request on a connection with `200 OK`, a thread per connection.
fn serve(listener: std::net::TcpListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { return };
        std::thread::spawn(move || {
            let (mut request, mut buf) = (Vec::new(), [0u8; 1024]);
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                request.extend_from_slice(&buf[..n]);
                while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    request.drain(..end + 4);
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    if stream.write_all(answer).is_err() {
                        return;
                    }
                }
            }
        });
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || serve(listener));

    let job = parse_toml(
        r#"
        [job]
        id = "web"
        type = "service"
        [group]
        name = "web"
        [group.network.port.http]
        [[group.task]]
        name = "server"
        driver = "raw_exec"
        [[group.task.service]]
        name = "web"
        port = "http"
        [[group.task.service.check]]
        name = "alive"
        type = "http"
        path = "/health"
        interval = "1s"
        timeout = "1s"
        "#,
    )?;
    // The port a node would have given the allocation: here, the server's.
    let mut alloc = Allocation::new("a1", job, "web");
    alloc.ports =
        vec![AllocatedPort { label: "http".into(), value: port, host_ip: [127, 0, 0, 1].into() }];
    let task = alloc.group()?.tasks[0].clone();

    let book = Arc::new(CheckBook::new(&alloc));
    let io = CheckIo {
        transport: Arc::new(TcpTransport::new()),
        control: Arc::new(NoTask),
        now: Arc::new(|| Timestamp(0)),
    };
    let checks = TaskChecks::start(&task.name, plans(&alloc, &task), book.clone(), io);
    let mut changes = book.subscribe();
    let passed = tokio::time::timeout(Duration::from_secs(10), async {
        while book.statuses().iter().any(|(_, status)| *status != CheckStatus::Passing) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    checks.stop();
    for state in book.states() {
        let output = state.last.map(|r| r.output).unwrap_or_default();
        println!("{}/{}/{}: {} ({output})", state.task, state.service, state.check, state.status);
    }
    passed.map_err(|_| "the check did not pass within 10s".into())
}
