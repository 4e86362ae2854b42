//! `wharf probe-channel`: the worker's end of the prober's probe channel (wharf-prober's
//! `channel` module, whose `wire` module is the protocol). One long-lived process per worker,
//! started over the prober's one session, answers the run probe (`alloc list --probe`) and
//! detached starts (`run --detach - --id ID`) in this process, with the agent's client kept
//! between requests: no session, shell or program start per probe. Anything else is answered
//! `unsupported`, and the prober runs it as a command of its own, as before.
//!
//! Each request is parsed as the `wharf` command line it stands for, with the same global
//! flags (`--data-dir`, `--fleet-term`, ...) and environment, and answers with what that
//! command would print and its exit code; it gets the deadline the request carries. Requests
//! are answered concurrently, each answer written whole. The process ends when its standard
//! input does (the prober closed the channel), after the requests in flight are answered.

use super::common::{describe, exit_code, node_config, spec_of_stdin};
use super::run::RunArgs;
use crate::agent_file::AgentFile;
use crate::client::{ApiPath, Client};
use anyhow::Context;
use hyper::Method;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Poll, ready};
use std::time::SystemTime;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use wharf_prober::Output;
use wharf_prober::channel::wire::{self, Answer, Request, WireError};

/// The status of a request cut at its deadline, as `timeout` exits.
const TIMED_OUT: u32 = 124;

/// A request the channel serves, parsed from its command line by the command line's parser
/// (`cli`), which knows the flags.
pub(crate) struct Asked {
    /// `--address`, `--data-dir` and `--token` as given: which agent, and its client's key.
    pub(crate) address: Option<String>,
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) token: Option<String>,
    /// `--fleet-term`.
    pub(crate) fleet_term: Option<u64>,
    /// `--json`.
    pub(crate) json: bool,
    /// What it asks.
    pub(crate) wanted: Wanted,
    /// Makes the agent's client for these flags, as the command line would.
    pub(crate) new_client: Box<dyn FnOnce() -> Client + Send>,
}

impl Asked {
    /// Which agent's client the request uses: its `--address`, `--data-dir` and `--token`.
    fn client_key(&self) -> ClientKey {
        (self.address.clone(), self.data_dir.clone(), self.token.clone())
    }
}

/// What a served request asks.
pub(crate) enum Wanted {
    /// `alloc list --probe [--config FILE]`.
    ProbeList { config: Option<PathBuf> },
    /// `run --detach - [--id ID]`.
    Start(RunArgs),
}

/// Parses a request's words as a `wharf` command line: `None` for one the channel does not
/// serve.
pub(crate) type Parse = fn(Vec<String>) -> Option<Asked>;

/// Serves requests on standard input until it ends.
pub(crate) async fn serve(parse: Parse) -> anyhow::Result<ExitCode> {
    let output: Arc<tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>> =
        Arc::new(tokio::sync::Mutex::new(Box::new(Stdio::take(1)?)));
    {
        let mut out = output.lock().await;
        out.write_all(format!("{}\n", wire::GREETING).as_bytes()).await?;
        out.flush().await?;
    }
    let clients = Arc::new(Clients::default());
    let mut input = BufReader::new(Stdio::take(0)?);
    let mut in_flight = tokio::task::JoinSet::new();
    let ended = loop {
        let request = match wire::read_request(&mut input).await {
            Ok(request) => request,
            Err(WireError::Closed) => break Ok(()),
            Err(e) => break Err(e),
        };
        let (output, clients) = (output.clone(), clients.clone());
        in_flight.spawn(async move {
            let seq = request.seq;
            let answer = answer(&clients, parse, request).await;
            let frame = wire::answer_frame(seq, &answer);
            let mut out = output.lock().await;
            // A prober that is gone reads no answer: its channel's end is the input's end.
            let _ = out.write_all(&frame).await;
            let _ = out.flush().await;
        });
        // Answered requests are reaped as they end, so a long channel holds only those in flight.
        while in_flight.try_join_next().is_some() {}
    };
    // Each request ends by its own deadline.
    while in_flight.join_next().await.is_some() {}
    ended.map(|()| ExitCode::SUCCESS).map_err(|e| anyhow::anyhow!("probe channel: {e}"))
}

/// The agent's clients, kept between requests (with their connections) and made again when
/// the agent announces itself anew in its data directory.
#[derive(Default)]
struct Clients {
    kept: Mutex<HashMap<ClientKey, (Option<SystemTime>, Client)>>,
    /// Probe command lines already parsed, by their words: a prober sends the same line at
    /// every probe, and a lookup of its words costs less than parsing them again (with the
    /// parser `cli` builds once) and making the request's client key.
    probes: Mutex<HashMap<Vec<String>, ProbeLine>>,
}

type ClientKey = (Option<String>, Option<PathBuf>, Option<String>);

/// What a parsed `alloc list --probe` line asks, without parsing it again.
#[derive(Clone)]
struct ProbeLine {
    key: ClientKey,
    fleet_term: Option<u64>,
    config: Option<PathBuf>,
}

/// Probe lines kept at most; a new fleet term is a new line, so the set is cleared when full.
const KEPT_PROBE_LINES: usize = 64;

impl Clients {
    fn client(&self, asked: &mut Asked) -> Client {
        let key = asked.client_key();
        let client = self.kept(&key).unwrap_or_else(|| {
            let new_client =
                std::mem::replace(&mut asked.new_client, Box::new(|| Client::new("", None)));
            let client = new_client();
            let stamp = announced(key.1.as_deref());
            self.kept.lock().insert(key, (stamp, client.clone()));
            client
        });
        client.with_fleet_term(asked.fleet_term)
    }

    /// The client kept for `key`, if the agent has not announced itself anew since.
    fn kept(&self, key: &ClientKey) -> Option<Client> {
        let stamp = announced(key.1.as_deref());
        match self.kept.lock().get(key) {
            Some((kept_stamp, client)) if *kept_stamp == stamp => Some(client.clone()),
            _ => None,
        }
    }

    /// A probe line seen before, with its agent's client still good.
    fn known_probe(&self, words: &[String]) -> Option<(ProbeLine, Client)> {
        let line = self.probes.lock().get(words).cloned()?;
        let client = self.kept(&line.key)?.with_fleet_term(line.fleet_term);
        Some((line, client))
    }

    fn remember_probe(&self, words: Vec<String>, asked: &Asked, config: Option<PathBuf>) {
        let key = asked.client_key();
        let mut probes = self.probes.lock();
        if probes.len() >= KEPT_PROBE_LINES {
            probes.clear();
        }
        probes.insert(words, ProbeLine { key, fleet_term: asked.fleet_term, config });
    }
}

/// When the agent of `data_dir` last announced itself (its agent file's time).
fn announced(data_dir: Option<&Path>) -> Option<SystemTime> {
    std::fs::metadata(AgentFile::path(data_dir?)).ok()?.modified().ok()
}

/// What the command line of `request` would print and exit with, or `unsupported`.
async fn answer(clients: &Clients, parse: Parse, request: Request) -> Answer {
    let Some(words) = wire::words(&request.args) else { return Answer::Unsupported };
    if let Some((line, client)) = clients.known_probe(&words) {
        let data_dir = line.key.1;
        let work = probe(client, line.config, data_dir);
        return exited(tokio::time::timeout(request.deadline, work).await, request.deadline);
    }
    // Not served, or not a valid command line: usage errors are the command's to print.
    let Some(mut asked) = parse(words.clone()) else { return Answer::Unsupported };
    let client = clients.client(&mut asked);
    if let Wanted::ProbeList { config } = &asked.wanted {
        clients.remember_probe(words, &asked, config.clone());
    }
    let Asked { data_dir, json, wanted, .. } = asked;
    let ran = match wanted {
        Wanted::ProbeList { config } => {
            tokio::time::timeout(request.deadline, probe(client, config, data_dir)).await
        }
        Wanted::Start(args) => {
            let work = start(client, args, request.stdin, json);
            tokio::time::timeout(request.deadline, work).await
        }
    };
    exited(ran, request.deadline)
}

/// `alloc list --probe`: what it prints.
async fn probe(
    client: Client,
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<String> {
    let config = node_config(config.as_deref(), data_dir.as_deref())?;
    let lines = crate::probe::lines(&client, &config).await?;
    Ok(lines.iter().map(|line| format!("{line}\n")).collect::<String>())
}

/// The answer for a command that ran (or was cut at `deadline`), as its exit says.
fn exited(
    ran: Result<anyhow::Result<String>, tokio::time::error::Elapsed>,
    deadline: std::time::Duration,
) -> Answer {
    Answer::Exit(match ran {
        Ok(Ok(stdout)) => Output::exited(0, stdout),
        Ok(Err(error)) => Output {
            stdout: Vec::new(),
            stderr: format!("wharf: {}\n", describe(&error)).into_bytes(),
            status: Some(u32::from(exit_code(&error))),
        },
        Err(_) => Output {
            stdout: Vec::new(),
            stderr: format!("wharf: the request did not finish within {deadline:?}\n").into_bytes(),
            status: Some(TIMED_OUT),
        },
    })
}

/// `wharf run --detach - [--id ID]` with `stdin` as the job spec: what it prints.
async fn start(
    client: Client,
    args: RunArgs,
    stdin: Vec<u8>,
    json: bool,
) -> anyhow::Result<String> {
    let job = spec_of_stdin(stdin)?;
    let spec = serde_json::to_vec(&job.to_spec())?;
    if let Some(id) = &args.id {
        wharf_state::check_alloc_id(id)?;
    }
    let path = ApiPath::v1(["allocations"]).query_opt("id", args.id.as_deref());
    let reply = match client.call(Method::POST, &path, Some(("application/json", spec))).await {
        Ok(reply) => reply,
        Err(absent @ crate::client::ClientError::Unreachable { .. }) => {
            return Err(anyhow::Error::new(absent).context("a detached run needs a running agent"));
        }
        Err(other) => return Err(other.into()),
    };
    let submitted: serde_json::Value = serde_json::from_slice(&reply)?;
    if json {
        return Ok(format!("{submitted}\n"));
    }
    let id = submitted["id"].as_str().context("the agent returned no id")?;
    Ok(format!("{id}\n"))
}

/// Standard input or output read and written without blocking, on the runtime's reactor: a
/// request costs no hand-off to a blocking thread. `wharf agent-relay` streams through it too.
pub(crate) struct Stdio(AsyncFd<File>);

impl Stdio {
    /// A non-blocking copy of descriptor `fd` (0 or 1), which must be a pipe or a socket (as
    /// sshd and the prober's local sessions give).
    pub(crate) fn take(fd: i32) -> anyhow::Result<Stdio> {
        let which = if fd == 0 { "standard input" } else { "standard output" };
        // SAFETY: dup of a descriptor this process holds; the copy is owned from here on.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
        if copy < 0 {
            return Err(std::io::Error::last_os_error()).context(format!("cannot take {which}"));
        }
        // SAFETY: `copy` was just made and nothing else owns it.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(copy) });
        // SAFETY: flags of a descriptor this process owns.
        let nonblocking = unsafe {
            let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            flags >= 0
                && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !nonblocking {
            return Err(std::io::Error::last_os_error())
                .context(format!("cannot make {which} non-blocking"));
        }
        // SAFETY: a `File` owns its descriptor and keeps it open and the same until dropped.
        let fd = unsafe { AsyncFd::register(file) }
            .map_err(|e| anyhow::anyhow!("{which} must be a pipe or a socket: {e}"))?;
        Ok(Stdio(fd))
    }
}

impl AsyncRead for Stdio {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|file| (&mut file.get_ref()).read(unfilled)) {
                Ok(Ok(read)) => {
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Stdio {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|file| (&mut file.get_ref()).write(data)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
