//! In-memory stand-ins for the network and the task, whose answers a test scripts: with them,
//! every rule of the checks runs under tokio's paused clock.

use crate::check::{HttpReply, HttpRequest};
use crate::runner::TaskControl;
use crate::transport::Transport;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::Notify;
use wharf_driver::{ExecResult, ExitResult};

/// How a fake service at an address answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Accepts connections and answers http requests with this status (and reason `R`).
    Status(u16),
    /// As `Status`, with a body.
    Body(u16, String),
    /// Refuses connections.
    Refuse,
    /// Accepts nothing and never answers.
    Hang,
}

/// A network of fake services. Addresses nobody scripted refuse connections.
#[derive(Debug, Default)]
pub struct FakeTransport {
    answers: Mutex<HashMap<(SocketAddr, Option<String>), Answer>>,
    requests: Mutex<HashMap<SocketAddr, Vec<HttpRequest>>>,
    connects: Mutex<HashMap<SocketAddr, usize>>,
}

impl FakeTransport {
    /// A network where every address refuses.
    pub fn new() -> FakeTransport {
        FakeTransport::default()
    }

    /// From now on, `addr` answers `answer` (unless a path has its own answer).
    pub fn answer(&self, addr: SocketAddr, answer: Answer) {
        self.answers.lock().insert((addr, None), answer);
    }

    /// From now on, http requests for `target` (path and query) at `addr` get `answer`.
    pub fn answer_path(&self, addr: SocketAddr, target: &str, answer: Answer) {
        self.answers.lock().insert((addr, Some(target.to_owned())), answer);
    }

    /// The http requests `addr` was sent, oldest first.
    pub fn requests(&self, addr: SocketAddr) -> Vec<HttpRequest> {
        self.requests.lock().get(&addr).cloned().unwrap_or_default()
    }

    /// How many times something connected (tcp) or sent a request (http) to `addr`.
    pub fn hits(&self, addr: SocketAddr) -> usize {
        self.connects.lock().get(&addr).copied().unwrap_or(0)
    }

    async fn reach(&self, addr: SocketAddr, target: Option<&str>) -> io::Result<Answer> {
        *self.connects.lock().entry(addr).or_default() += 1;
        let answer = {
            let answers = self.answers.lock();
            target
                .and_then(|target| answers.get(&(addr, Some(target.to_owned()))))
                .or_else(|| answers.get(&(addr, None)))
                .cloned()
                .unwrap_or(Answer::Refuse)
        };
        match answer {
            Answer::Refuse => Err(io::Error::from(io::ErrorKind::ConnectionRefused)),
            Answer::Hang => std::future::pending().await,
            answer => Ok(answer),
        }
    }
}

#[async_trait::async_trait]
impl Transport for FakeTransport {
    async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        self.reach(addr, None).await.map(drop)
    }

    async fn http(&self, addr: SocketAddr, request: &HttpRequest) -> io::Result<HttpReply> {
        self.requests.lock().entry(addr).or_default().push(request.clone());
        let (status, body) = match self.reach(addr, Some(&request.target)).await? {
            Answer::Status(status) => (status, String::new()),
            Answer::Body(status, body) => (status, body),
            Answer::Refuse | Answer::Hang => unreachable!("reach answers these itself"),
        };
        Ok(HttpReply { status, reason: "R".into(), body })
    }
}

/// A task runner as checks see it: script runs answer as scripted, restarts are recorded.
#[derive(Debug, Default)]
pub struct FakeControl {
    exec: Mutex<Option<(i32, String)>>,
    exec_hangs: Mutex<bool>,
    exec_error: Mutex<Option<String>>,
    execs: Mutex<Vec<(String, Vec<String>)>>,
    restarts: Mutex<Vec<(String, String)>>,
    restarted: Notify,
}

impl FakeControl {
    /// A task whose scripts exit 0 with no output.
    pub fn new() -> FakeControl {
        FakeControl::default()
    }

    /// From now on, scripts exit `code` having written `output`.
    pub fn script_exits(&self, code: i32, output: &str) {
        *self.exec.lock() = Some((code, output.to_owned()));
        *self.exec_hangs.lock() = false;
        *self.exec_error.lock() = None;
    }

    /// From now on, scripts never end.
    pub fn script_hangs(&self) {
        *self.exec_hangs.lock() = true;
    }

    /// From now on, scripts cannot be run: exec fails with `error`.
    pub fn script_fails(&self, error: &str) {
        *self.exec_error.lock() = Some(error.to_owned());
        *self.exec_hangs.lock() = false;
    }

    /// The scripts run, by task, oldest first.
    pub fn execs(&self) -> Vec<(String, Vec<String>)> {
        self.execs.lock().clone()
    }

    /// The restarts asked for, as (task, reason), oldest first.
    pub fn restarts(&self) -> Vec<(String, String)> {
        self.restarts.lock().clone()
    }

    /// Waits until at least `count` restarts were asked for.
    pub async fn restarted(&self, count: usize) {
        loop {
            // Registered before looking, so a restart between the look and the wait wakes it.
            let notified = self.restarted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.restarts.lock().len() >= count {
                return;
            }
            notified.await;
        }
    }
}

#[async_trait::async_trait]
impl TaskControl for FakeControl {
    async fn exec(
        &self,
        task: &str,
        command: &[String],
        _timeout: Duration,
    ) -> Result<ExecResult, String> {
        self.execs.lock().push((task.to_owned(), command.to_vec()));
        if *self.exec_hangs.lock() {
            return std::future::pending().await;
        }
        if let Some(error) = self.exec_error.lock().clone() {
            return Err(error);
        }
        let (code, output) = self.exec.lock().clone().unwrap_or((0, String::new()));
        Ok(ExecResult {
            stdout: output.into_bytes(),
            stderr: Vec::new(),
            exit: ExitResult { exit_code: code, signal: None, oom_killed: false, error: None },
        })
    }

    async fn restart(&self, task: &str, reason: &str) -> Result<(), String> {
        self.restarts.lock().push((task.to_owned(), reason.to_owned()));
        self.restarted.notify_waiters();
        Ok(())
    }
}
