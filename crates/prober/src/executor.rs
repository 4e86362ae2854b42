//! The [`Executor`] seam: run one command on a worker, with stdin, under a deadline.
//!
//! The worker state machine talks to its machine only through this trait. Implementations:
//! - [`SshExecutor`](crate::SshExecutor): one persistent SSH connection per worker, a channel
//!   per command; the production path.
//! - [`LocalExecutor`](crate::LocalExecutor): `sh -c` on this host, for the loopback
//!   instance set.
//! - [`ScriptedExecutor`]: answers from a script and records what it was asked; the tests and
//!   the benchmark drive the state machine with it.
//!
//! Every call carries a deadline and an implementation must return by then (with
//! [`ProberError::Timeout`]), so a hung handshake or command never stops a worker's probing.

use crate::ProberError;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Output of a command longer than this is cut (the rest is read and dropped), so a runaway
/// command cannot make the prober buffer without bound.
pub const MAX_OUTPUT: usize = 1 << 20;

/// What a command left behind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// Its standard output (at most [`MAX_OUTPUT`] bytes).
    pub stdout: Vec<u8>,
    /// Its standard error (at most [`MAX_OUTPUT`] bytes).
    pub stderr: Vec<u8>,
    /// Its exit status; `None` if it ended without one (killed by a signal).
    pub status: Option<u32>,
}

impl Output {
    /// A command that exited with `status` after printing `stdout`.
    pub fn exited(status: u32, stdout: impl Into<Vec<u8>>) -> Output {
        Output { stdout: stdout.into(), stderr: Vec::new(), status: Some(status) }
    }

    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// The output as `Ok` if the command succeeded, else [`ProberError::CommandFailed`].
    pub fn checked(self, worker: &str, command: &str) -> Result<Output, ProberError> {
        if self.success() {
            return Ok(self);
        }
        let mut stderr = String::from_utf8_lossy(&self.stderr).into_owned();
        if stderr.len() > 400 {
            let mut cut = 400;
            while !stderr.is_char_boundary(cut) {
                cut -= 1;
            }
            stderr.truncate(cut);
            stderr.push('…');
        }
        Err(ProberError::CommandFailed {
            worker: worker.to_owned(),
            command: command.to_owned(),
            status: self.status.map_or_else(|| "signal".to_owned(), |s| format!("status {s}")),
            stderr: stderr.trim_end().to_owned(),
        })
    }
}

/// Runs commands on one worker.
#[async_trait::async_trait]
pub trait Executor: Send + Sync + fmt::Debug + 'static {
    /// Runs `command` with `stdin` (then end of file) and returns what it printed and its
    /// exit status. A non-zero status is an `Ok` [`Output`]; an `Err` means the command could
    /// not be run or did not finish within `deadline`.
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError>;

    /// Drops any connection; the next call opens a new one.
    async fn close(&self) {}

    /// Takes a fresh listing of the instance (its address or host key may have changed).
    /// Must not wait for commands in flight.
    fn retarget(&self, _instance: &crate::Instance) {}
}

/// How a [`ScriptedExecutor`] answers one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The command ran and exited.
    Exit {
        /// Exit status.
        status: u32,
        /// Standard output.
        stdout: Vec<u8>,
        /// Standard error.
        stderr: Vec<u8>,
    },
    /// The command hung and was cut at its deadline.
    Timeout,
    /// The worker could not be reached.
    Unreachable,
    /// The worker has no address.
    NoAddress,
    /// The worker's host key is not the pinned one.
    HostKeyChanged,
    /// The command never answers, deadline or not, until the call is dropped: a frozen host
    /// behind an executor that does not enforce its deadlines.
    Hang,
}

impl Reply {
    /// Exit 0 with `stdout`.
    pub fn ok(stdout: &str) -> Reply {
        Reply::Exit { status: 0, stdout: stdout.as_bytes().to_vec(), stderr: Vec::new() }
    }

    /// Exit `status` with `stderr`.
    pub fn fail(status: u32, stderr: &str) -> Reply {
        Reply::Exit { status, stdout: Vec::new(), stderr: stderr.as_bytes().to_vec() }
    }
}

/// How a script line picks the commands it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// The command is exactly this.
    Exact(String),
    /// The command contains this.
    Contains(String),
}

#[derive(Debug)]
struct Rule {
    matcher: Match,
    /// Answers in turn; the last one repeats.
    replies: VecDeque<Reply>,
}

/// One call a [`ScriptedExecutor`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The command line.
    pub command: String,
    /// What was sent on stdin.
    pub stdin: Vec<u8>,
    /// The deadline it was given.
    pub deadline: Duration,
}

#[derive(Debug, Default)]
struct Script {
    exact: HashMap<String, usize>,
    rules: Vec<Rule>,
    calls: VecDeque<Call>,
}

/// An executor that answers from a script, for tests and simulations.
///
/// Exact matches win over `Contains` matches; among `Contains` rules the first added wins. A
/// command no rule matches fails with [`ProberError::Exec`] naming it. The last 10,000 calls
/// are kept for [`calls`](ScriptedExecutor::calls).
#[derive(Debug, Clone)]
pub struct ScriptedExecutor {
    worker: Arc<str>,
    script: Arc<Mutex<Script>>,
    count: Arc<AtomicU64>,
}

const KEPT_CALLS: usize = 10_000;

impl ScriptedExecutor {
    /// An executor for `worker` with an empty script.
    pub fn new(worker: &str) -> ScriptedExecutor {
        ScriptedExecutor { worker: worker.into(), script: Arc::default(), count: Arc::default() }
    }

    /// Answers `matcher`'s commands with `replies` in turn (the last repeats), replacing an
    /// earlier rule with the same matcher.
    pub fn on(&self, matcher: Match, replies: impl IntoIterator<Item = Reply>) -> &Self {
        let mut replies: VecDeque<Reply> = replies.into_iter().collect();
        if replies.is_empty() {
            replies.push_back(Reply::Unreachable);
        }
        let mut script = self.script.lock();
        if let Some(index) = script.rules.iter().position(|r| r.matcher == matcher) {
            script.rules[index].replies = replies;
            return self;
        }
        let index = script.rules.len();
        if let Match::Exact(command) = &matcher {
            script.exact.insert(command.clone(), index);
        }
        script.rules.push(Rule { matcher, replies });
        self
    }

    /// Shorthand for an exact command answered with one reply, always.
    pub fn exact(&self, command: &str, reply: Reply) -> &Self {
        self.on(Match::Exact(command.to_owned()), [reply])
    }

    /// Shorthand for commands containing `part`, answered with one reply, always.
    pub fn containing(&self, part: &str, reply: Reply) -> &Self {
        self.on(Match::Contains(part.to_owned()), [reply])
    }

    /// The calls received so far (the last 10,000), oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.script.lock().calls.iter().cloned().collect()
    }

    /// How many calls were received in all.
    pub fn call_count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn answer(&self, command: &str, stdin: &[u8], deadline: Duration) -> Option<Reply> {
        let mut script = self.script.lock();
        if script.calls.len() == KEPT_CALLS {
            script.calls.pop_front();
        }
        let call = Call { command: command.to_owned(), stdin: stdin.to_vec(), deadline };
        script.calls.push_back(call);
        let index = match script.exact.get(command) {
            Some(index) => *index,
            None => script.rules.iter().position(|r| match &r.matcher {
                Match::Contains(part) => command.contains(part.as_str()),
                Match::Exact(_) => false,
            })?,
        };
        let replies = &mut script.rules[index].replies;
        if replies.len() > 1 { replies.pop_front() } else { replies.front().cloned() }
    }
}

#[async_trait::async_trait]
impl Executor for ScriptedExecutor {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        let worker = self.worker.to_string();
        match self.answer(command, stdin, deadline) {
            None => Err(ProberError::Exec {
                worker,
                detail: format!("the script has no answer for {command:?}"),
            }),
            Some(Reply::Exit { status, stdout, stderr }) => {
                Ok(Output { stdout, stderr, status: Some(status) })
            }
            Some(Reply::Timeout) => {
                Err(ProberError::Timeout { worker, what: format!("command {command:?}"), deadline })
            }
            Some(Reply::Unreachable) => Err(ProberError::Connect {
                worker,
                address: "scripted".into(),
                detail: "connection refused".into(),
            }),
            Some(Reply::NoAddress) => Err(ProberError::NoAddress { worker }),
            Some(Reply::Hang) => std::future::pending().await,
            Some(Reply::HostKeyChanged) => Err(ProberError::HostKey {
                worker,
                address: "scripted".into(),
                presented: "SHA256:presented".into(),
                expected: "but SHA256:pinned is pinned".into(),
            }),
        }
    }
}
