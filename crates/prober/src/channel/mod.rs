//! The probe channel: one long-lived session per worker, running the runner's channel server,
//! that answers the runner's commands line by line, so that a probe or a start costs the worker
//! no session, no shell and no program start.
//!
//! [`ChannelExecutor`] wraps a worker's executor. A command `<program> <args>` (the runner's,
//! with plain or single-quoted words) goes over the channel as a request (see [`wire`]); any
//! other command, and any request the server answers `unsupported`, runs through the wrapped
//! executor as before (the command-per-probe mode). The channel is opened by the first command
//! that can use it, with `<program> <serve_args>` through a [`SessionOpener`].
//!
//! Every request keeps its deadline: the client gives up at the deadline (and closes the
//! channel, which the next request opens again), and the server is told the deadline too. When
//! the channel breaks (the server exits, the session closes), a request that carries no
//! standard input runs again in a fresh session within what is left of its deadline, and the
//! next command opens a new channel. A request with standard input (a start, which reads its
//! payload there) is never sent twice: once written to a channel that then broke, it fails, and
//! the worker counts it as possibly started, as it does a start whose answer was lost. A server
//! that cannot be started (an older runner, a runner without a channel) is tried again only
//! after [`ChannelConfig::reopen_after`]; meanwhile the commands run as before.

#[cfg(test)]
mod tests;
pub mod wire;

use crate::ProberError;
use crate::executor::{Executor, Output};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::oneshot;
use tokio::time::Instant;
use wire::{Answer, Request, WireError};

/// A long-lived session on a worker: the standard input and output of one process, which ends
/// when they are dropped (its input closes).
pub struct Session {
    /// The process's standard input.
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
    /// The process's standard output.
    pub output: Pin<Box<dyn AsyncRead + Send>>,
    /// Whatever else keeps the session (a child process handle, killed when dropped).
    pub keep: Box<dyn Send + Sync>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

/// Opens long-lived sessions on one worker: implemented by the SSH and local executors.
#[async_trait::async_trait]
pub trait SessionOpener: Send + Sync + fmt::Debug + 'static {
    /// Starts `command` on the worker with piped standard input and output, within `deadline`.
    async fn open_session(&self, command: &str, deadline: Duration)
    -> Result<Session, ProberError>;
}

/// How a [`ChannelExecutor`] reaches its server.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// The runner program as the commands start with it (`[sudo ]<program>`): commands that
    /// start with it and a space go over the channel.
    pub program: String,
    /// The arguments that start the channel server (`probe-channel`), after any arguments
    /// the instance gives the runner.
    pub serve_args: String,
    /// After a server could not be started, how long commands run without a channel before
    /// another start is tried.
    pub reopen_after: Duration,
    /// The longest an open may take, and at most half of the first request's deadline, so
    /// that the request still has time in a fresh session.
    pub open_deadline: Duration,
}

impl ChannelConfig {
    /// The channel of `program`, served by `<program> probe-channel` (wharf's).
    pub fn new(program: &str) -> ChannelConfig {
        ChannelConfig {
            program: program.to_owned(),
            serve_args: "probe-channel".into(),
            reopen_after: Duration::from_secs(60),
            open_deadline: Duration::from_secs(5),
        }
    }
}

impl ChannelConfig {
    /// The channel of the runner `config` names, as a worker of `instance` runs it: the
    /// deployed binary (or the configured command), under `sudo` for a user other than root.
    pub fn for_runner(
        config: &crate::Prepared,
        instance: &crate::Instance,
    ) -> Result<ChannelConfig, ProberError> {
        Ok(ChannelConfig::new(crate::RunnerInvocation::of(config, instance)?.program()))
    }
}

/// What a channel did so far, for tests and the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Servers started.
    pub opened: u64,
    /// Starts that failed.
    pub failed_opens: u64,
    /// Requests the channel answered.
    pub answered: u64,
    /// Commands run in a fresh session because the channel could not answer them.
    pub fell_back: u64,
}

/// An open channel: the writer, the answers awaited, and the reader task.
struct Link {
    writer: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    broken: AtomicBool,
    next_seq: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    _keep: Box<dyn Send + Sync>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
        // An SSH channel's stream closes itself by spawning a task, which panics where no
        // runtime is entered (an executor dropped after its runtime's `block_on` returned):
        // there the writer is leaked rather than dropped. The reader's half goes with its task,
        // which the runtime drops.
        let writer = std::mem::replace(self.writer.get_mut(), Box::pin(tokio::io::sink()));
        match tokio::runtime::Handle::try_current() {
            Ok(_) => drop(writer),
            Err(_) => std::mem::forget(writer),
        }
    }
}

/// Why a request got no answer over the channel.
enum Unanswered {
    /// It never reached the server: run it elsewhere.
    NotSent,
    /// It was sent, then the channel broke.
    Lost(String),
}

impl Link {
    fn start(session: Session) -> Arc<Link> {
        let Session { input, output, keep } = session;
        Arc::new_cyclic(|weak: &std::sync::Weak<Link>| {
            let weak = weak.clone();
            let reader = tokio::spawn(async move {
                let mut output = BufReader::new(output);
                let why = loop {
                    match wire::read_answer(&mut output).await {
                        Ok((seq, answer)) => {
                            let Some(link) = weak.upgrade() else { return };
                            if let Some(waiter) = link.waiting.lock().remove(&seq) {
                                let _ = waiter.send(answer);
                            }
                        }
                        Err(e) => break e,
                    }
                };
                if let Some(link) = weak.upgrade() {
                    tracing::debug!(error = %why, "the probe channel broke");
                    link.broken.store(true, Ordering::Release);
                    // Dropping the senders wakes every request still waiting.
                    link.waiting.lock().clear();
                }
            });
            Link {
                writer: tokio::sync::Mutex::new(input),
                waiting: Mutex::default(),
                broken: AtomicBool::new(false),
                next_seq: AtomicU64::new(1),
                reader,
                _keep: keep,
            }
        })
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire) || self.reader.is_finished()
    }

    async fn call(&self, args: &str, stdin: &[u8], left: Duration) -> Result<Answer, Unanswered> {
        if self.is_broken() {
            return Err(Unanswered::NotSent);
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(seq, tx);
        let request = Request { seq, deadline: left, args: args.to_owned(), stdin: stdin.to_vec() };
        let written = wire::write_request(&mut *self.writer.lock().await, &request).await;
        if let Err(e) = written {
            self.waiting.lock().remove(&seq);
            self.broken.store(true, Ordering::Release);
            return Err(match e {
                // Nothing of it can have run: the frame is refused before a byte is written.
                WireError::Garbled(_) => Unanswered::NotSent,
                // A frame cut short is never run by the server, which needs all of it; a
                // frame written whole may have been read before the channel broke.
                other => Unanswered::Lost(other.to_string()),
            });
        }
        rx.await.map_err(|_| Unanswered::Lost("the channel closed before answering".into()))
    }
}

/// What, when it changes, makes an open channel the wrong one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    runner_args: String,
    address: Option<String>,
    host_key: Option<String>,
    remote_user: String,
}

impl Target {
    fn of(instance: &crate::Instance) -> Target {
        Target {
            runner_args: instance.runner_args.trim().to_owned(),
            address: instance.address.clone(),
            host_key: instance.host_key.clone(),
            remote_user: instance.remote_user.clone(),
        }
    }
}

/// The channel's state: open, or closed since a moment (a failed open) until another try.
enum Slot {
    Closed,
    Open(Arc<Link>),
    Refused { until: Instant },
}

/// An [`Executor`] that sends the runner's commands over one long-lived session per worker and
/// everything else through the executor it wraps. See the module docs.
pub struct ChannelExecutor {
    worker: String,
    inner: Arc<dyn Executor>,
    opener: Arc<dyn SessionOpener>,
    config: ChannelConfig,
    /// Where the instance is and its own runner arguments (which the server's command line
    /// carries too), as last told.
    target: Mutex<Target>,
    slot: Mutex<Slot>,
    opening: tokio::sync::Mutex<()>,
    stats: Mutex<ChannelStats>,
}

impl fmt::Debug for ChannelExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelExecutor")
            .field("worker", &self.worker)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ChannelExecutor {
    /// A channel to `instance` through `opener`, with `inner` for every other command and as
    /// the fallback.
    pub fn new(
        instance: &crate::Instance,
        inner: Arc<dyn Executor>,
        opener: Arc<dyn SessionOpener>,
        config: ChannelConfig,
    ) -> ChannelExecutor {
        ChannelExecutor {
            worker: instance.id.0.clone(),
            inner,
            opener,
            config,
            target: Mutex::new(Target::of(instance)),
            slot: Mutex::new(Slot::Closed),
            opening: tokio::sync::Mutex::new(()),
            stats: Mutex::default(),
        }
    }

    /// What the channel did so far.
    pub fn stats(&self) -> ChannelStats {
        *self.stats.lock()
    }

    /// Whether a channel is open now.
    pub fn is_open(&self) -> bool {
        matches!(&*self.slot.lock(), Slot::Open(link) if !link.is_broken())
    }

    /// The arguments `command` passes to the runner, if the channel can carry it.
    fn channel_args<'c>(&self, command: &'c str) -> Option<&'c str> {
        let args = command.strip_prefix(self.config.program.as_str())?.strip_prefix(' ')?;
        (!args.is_empty() && wire::words(args).is_some()).then_some(args)
    }

    fn serve_command(&self) -> String {
        let instance_args = self.target.lock().runner_args.clone();
        crate::RunnerInvocation::new(self.config.program.as_str(), &instance_args)
            .command(&self.config.serve_args)
    }

    fn open_link(&self) -> Option<Arc<Link>> {
        match &*self.slot.lock() {
            Slot::Open(link) if !link.is_broken() => Some(link.clone()),
            _ => None,
        }
    }

    /// The open channel, opening one if none is and none failed lately; `None` if the command
    /// must run without one.
    async fn link(&self, until: Instant) -> Option<Arc<Link>> {
        if let Some(link) = self.open_link() {
            return Some(link);
        }
        let _opening = self.opening.lock().await;
        {
            let mut slot = self.slot.lock();
            match &*slot {
                Slot::Open(link) if !link.is_broken() => return Some(link.clone()),
                Slot::Refused { until } if Instant::now() < *until => return None,
                _ => *slot = Slot::Closed,
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        let budget = (left / 2).min(self.config.open_deadline);
        let command = self.serve_command();
        let opened = async {
            let mut session = self.opener.open_session(&command, budget).await?;
            let mut output = BufReader::new(session.output);
            wire::read_greeting(&mut output).await.map_err(|e| ProberError::Exec {
                worker: self.worker.clone(),
                detail: format!("the probe channel {command:?} did not greet: {e}"),
            })?;
            // What the greeting's read buffered (nothing, as a server waits for a request)
            // would be lost with the buffer: keep reading through it.
            session.output = Box::pin(output);
            Ok::<_, ProberError>(session)
        };
        match tokio::time::timeout(budget, opened).await {
            Ok(Ok(session)) => {
                let link = Link::start(session);
                *self.slot.lock() = Slot::Open(link.clone());
                self.stats.lock().opened += 1;
                tracing::debug!(worker = %self.worker, "opened the probe channel");
                Some(link)
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no greeting within {budget:?}"),
                };
                tracing::info!(worker = %self.worker, %error, retry_in = ?self.config.reopen_after, "cannot open the probe channel; commands run one session each meanwhile");
                *self.slot.lock() =
                    Slot::Refused { until: Instant::now() + self.config.reopen_after };
                self.stats.lock().failed_opens += 1;
                None
            }
        }
    }

    /// Closes `link` if it is still the open channel: the next command opens another.
    fn drop_link(&self, link: &Arc<Link>) {
        let mut slot = self.slot.lock();
        if matches!(&*slot, Slot::Open(open) if Arc::ptr_eq(open, link)) {
            *slot = Slot::Closed;
        }
    }

    async fn fall_back(
        &self,
        command: &str,
        stdin: &[u8],
        until: Instant,
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        self.stats.lock().fell_back += 1;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timeout(command, deadline));
        }
        self.inner.execute(command, stdin, left).await.map_err(|e| match e {
            // Named with the whole deadline the caller gave, as in the command mode.
            ProberError::Timeout { .. } => self.timeout(command, deadline),
            other => other,
        })
    }

    fn timeout(&self, command: &str, deadline: Duration) -> ProberError {
        ProberError::Timeout {
            worker: self.worker.clone(),
            what: format!("command {command:?}"),
            deadline,
        }
    }
}

#[async_trait::async_trait]
impl Executor for ChannelExecutor {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        let Some(args) = self.channel_args(command) else {
            return self.inner.execute(command, stdin, deadline).await;
        };
        let until = Instant::now() + deadline;
        let Some(link) = self.link(until).await else {
            return self.fall_back(command, stdin, until, deadline).await;
        };
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout_at(until, link.call(args, stdin, left)).await {
            Ok(Ok(Answer::Exit(output))) => {
                self.stats.lock().answered += 1;
                Ok(output)
            }
            Ok(Ok(Answer::Unsupported)) => self.fall_back(command, stdin, until, deadline).await,
            Ok(Err(Unanswered::NotSent)) => {
                self.drop_link(&link);
                self.fall_back(command, stdin, until, deadline).await
            }
            Ok(Err(Unanswered::Lost(why))) => {
                self.drop_link(&link);
                if stdin.is_empty() {
                    tracing::debug!(worker = %self.worker, command, why, "the probe channel broke; running the command in a session of its own");
                    return self.fall_back(command, stdin, until, deadline).await;
                }
                Err(ProberError::Exec {
                    worker: self.worker.clone(),
                    detail: format!(
                        "the probe channel broke after {command:?} was sent ({why}); it is not \
                         sent again, as it may have run"
                    ),
                })
            }
            Err(_) => {
                // A channel that lets a request overrun its deadline is not trusted again (and
                // a frame cut off halfway would garble what follows it).
                link.broken.store(true, Ordering::Release);
                self.drop_link(&link);
                Err(self.timeout(command, deadline))
            }
        }
    }

    async fn close(&self) {
        *self.slot.lock() = Slot::Closed;
        self.inner.close().await;
    }

    fn retarget(&self, instance: &crate::Instance) {
        let target = Target::of(instance);
        let changed = {
            let mut current = self.target.lock();
            let changed = *current != target;
            *current = target;
            changed
        };
        // A session on the old address, or a server started with the old arguments, is not
        // the instance's any more; a sync that changes nothing keeps the channel.
        if changed {
            *self.slot.lock() = Slot::Closed;
        }
        self.inner.retarget(instance);
    }
}
