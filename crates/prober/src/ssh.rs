//! [`SshExecutor`]: commands over one persistent SSH connection per worker.
//!
//! Built on russh. Each worker keeps one connection (TCP with `TCP_NODELAY`, so small probe
//! round trips are not held back by Nagle's algorithm) and opens a channel per command.
//! Reconnects are serialised: when the connection is down, the first caller dials and the
//! others wait for it and share the result, so a worker never has a storm of handshakes.
//!
//! Host keys are pinned. The instance set tells us the key each instance has
//! ([`Instance::host_key`](crate::Instance)); a server presenting another key, or any key when
//! none is pinned, is refused with [`ProberError::HostKey`] naming both fingerprints. Nothing
//! is ever accepted on first use.
//!
//! Every call has a deadline covering the dial, the handshake, authentication and the command;
//! at the deadline the command is stopped on the worker (TERM, then KILL, to its process
//! group), the channel is closed and [`ProberError::Timeout`] returned.

use crate::ProberError;
use crate::deadline::under_deadline;
use crate::executor::{Executor, MAX_OUTPUT, Output};
use parking_lot::Mutex;
use russh::client::{self, Handle};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
/// The key types of this module's API (russh's), so that callers need no russh dependency.
pub use russh::keys::{PrivateKey, PublicKey};
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Sig};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where and as whom to connect.
#[derive(Debug, Clone)]
pub struct SshTarget {
    /// `host:port`; `None` while the instance has no address.
    pub address: Option<String>,
    /// The remote user.
    pub user: String,
    /// The only host key accepted; `None` refuses every key.
    pub host_key: Option<PublicKey>,
}

/// Parses an OpenSSH public key line (`ssh-ed25519 AAAA... comment`).
pub fn parse_public_key(line: &str) -> Result<PublicKey, ProberError> {
    PublicKey::from_openssh(line.trim())
        .map_err(|e| ProberError::Key { what: "public key".into(), detail: e.to_string() })
}

/// Parses an OpenSSH private key (unencrypted).
pub fn parse_private_key(pem: &str) -> Result<PrivateKey, ProberError> {
    russh::keys::decode_secret_key(pem, None)
        .map_err(|e| ProberError::Key { what: "private key".into(), detail: e.to_string() })
}

/// The SHA256 fingerprint of a key, as `ssh-keygen -l` prints it.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Why the handler refused a server.
#[derive(Debug)]
enum Refusal {
    Ssh(russh::Error),
    HostKey { presented: String, expected: String },
}

impl From<russh::Error> for Refusal {
    fn from(e: russh::Error) -> Refusal {
        Refusal::Ssh(e)
    }
}

/// Checks the server's key against the pinned one.
struct Pinned {
    expected: Option<PublicKey>,
}

impl client::Handler for Pinned {
    type Error = Refusal;

    async fn check_server_key(
        &mut self,
        presented: &PublicKeyOrCertificate,
    ) -> Result<bool, Refusal> {
        let key = match presented {
            PublicKeyOrCertificate::PublicKey { key, .. } => key,
            PublicKeyOrCertificate::Certificate(cert) => {
                return Err(Refusal::HostKey {
                    presented: format!("a certificate for {}", cert.key_id()),
                    expected: "but only plain pinned keys are accepted".into(),
                });
            }
        };
        match &self.expected {
            Some(expected) if expected.key_data() == key.key_data() => Ok(true),
            Some(expected) => Err(Refusal::HostKey {
                presented: fingerprint(key),
                expected: format!("but {} is pinned (the host key changed)", fingerprint(expected)),
            }),
            None => Err(Refusal::HostKey {
                presented: fingerprint(key),
                expected: "but no host key is pinned for it (unknown host)".into(),
            }),
        }
    }
}

/// Runs commands on one worker over SSH.
pub struct SshExecutor {
    worker: String,
    target: Mutex<SshTarget>,
    key: Arc<PrivateKey>,
    config: Arc<client::Config>,
    connection: Mutex<Option<Arc<Handle<Pinned>>>>,
    dialing: tokio::sync::Mutex<()>,
    dials: AtomicU64,
}

impl fmt::Debug for SshExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshExecutor")
            .field("worker", &self.worker)
            .field("target", &*self.target.lock())
            .finish_non_exhaustive()
    }
}

impl SshExecutor {
    /// An executor for `instance`: its address, remote user and pinned host key.
    pub fn for_instance(instance: &crate::Instance, key: Arc<PrivateKey>) -> SshExecutor {
        let executor = SshExecutor::new(
            &instance.id.0,
            SshTarget { address: None, user: instance.remote_user.clone(), host_key: None },
            key,
        );
        executor.retarget(instance);
        executor
    }

    /// An executor for `worker` at `target`, authenticating with `key`.
    pub fn new(worker: &str, target: SshTarget, key: Arc<PrivateKey>) -> SshExecutor {
        let config = client::Config {
            nodelay: true,
            // A dead peer is noticed between probes rather than at the next deadline.
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_max: 3,
            ..client::Config::default()
        };
        SshExecutor {
            worker: worker.to_owned(),
            target: Mutex::new(target),
            key,
            config: Arc::new(config),
            connection: Mutex::new(None),
            dialing: tokio::sync::Mutex::new(()),
            dials: AtomicU64::new(0),
        }
    }

    /// Changes where to connect (a new address or host key from a sync). The current
    /// connection is kept if the address and key are unchanged, else dropped.
    pub fn set_target(&self, target: SshTarget) {
        let mut current = self.target.lock();
        let same = current.address == target.address
            && current.user == target.user
            && current.host_key.as_ref().map(PublicKey::key_data)
                == target.host_key.as_ref().map(PublicKey::key_data);
        *current = target;
        drop(current);
        if !same {
            self.connection.lock().take();
        }
    }

    /// How many connections were dialled (handshakes attempted) so far.
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// Whether the connection still answers: a channel opens on it within a second. Commands
    /// still running on it are left alone either way.
    async fn answers(&self, handle: &Handle<Pinned>) -> bool {
        match tokio::time::timeout(Duration::from_secs(1), handle.channel_open_session()).await {
            Ok(Ok(channel)) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), channel.close()).await;
                true
            }
            _ => false,
        }
    }

    /// Drops `handle` from the cache if it is still the cached connection; the next command
    /// dials a new one.
    fn forget(&self, handle: &Arc<Handle<Pinned>>) {
        let mut connection = self.connection.lock();
        if connection.as_ref().is_some_and(|c| Arc::ptr_eq(c, handle)) {
            connection.take();
        }
    }

    fn live(&self) -> Option<Arc<Handle<Pinned>>> {
        self.connection.lock().as_ref().filter(|h| !h.is_closed()).cloned()
    }

    /// The live connection, dialling one if there is none. Concurrent callers share a dial.
    async fn connected(&self) -> Result<Arc<Handle<Pinned>>, ProberError> {
        if let Some(handle) = self.live() {
            return Ok(handle);
        }
        let _dialing = self.dialing.lock().await;
        if let Some(handle) = self.live() {
            return Ok(handle);
        }
        let handle = Arc::new(self.dial().await?);
        *self.connection.lock() = Some(handle.clone());
        Ok(handle)
    }

    async fn dial(&self) -> Result<Handle<Pinned>, ProberError> {
        self.dials.fetch_add(1, Ordering::Relaxed);
        let target = self.target.lock().clone();
        let Some(address) = target.address else {
            return Err(ProberError::NoAddress { worker: self.worker.clone() });
        };
        let connect_error = |detail: String| ProberError::Connect {
            worker: self.worker.clone(),
            address: address.clone(),
            detail,
        };
        let stream = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| connect_error(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| connect_error(format!("TCP_NODELAY: {e}")))?;
        let handler = Pinned { expected: target.host_key };
        let mut handle = match client::connect_stream(self.config.clone(), stream, handler).await {
            Ok(handle) => handle,
            Err(Refusal::HostKey { presented, expected }) => {
                return Err(ProberError::HostKey {
                    worker: self.worker.clone(),
                    address,
                    presented,
                    expected,
                });
            }
            Err(Refusal::Ssh(e)) => return Err(connect_error(format!("SSH handshake: {e}"))),
        };
        let key = PrivateKeyWithHashAlg::new(self.key.clone(), None);
        let auth = handle
            .authenticate_publickey(&target.user, key)
            .await
            .map_err(|e| connect_error(format!("authentication: {e}")))?;
        if !auth.success() {
            return Err(ProberError::Auth { worker: self.worker.clone(), user: target.user });
        }
        Ok(handle)
    }

    async fn run(
        &self,
        handle: &Handle<Pinned>,
        command: &str,
        stdin: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<Output, Attempt> {
        let channel = handle.channel_open_session().await.map_err(Attempt::Reconnect)?;
        let (mut read, write) = channel.split();
        let exec_error = |e: russh::Error| ProberError::Exec {
            worker: self.worker.clone(),
            detail: format!("running {command:?}: {e}"),
        };
        let guarded = under_deadline(
            command,
            deadline.saturating_duration_since(tokio::time::Instant::now()),
        );
        let io = async {
            write.exec(true, guarded).await.map_err(exec_error)?;
            let send = async {
                if !stdin.is_empty() {
                    write.data(stdin).await?;
                }
                write.eof().await
            };
            let receive = async {
                let mut out = Output::default();
                let (mut eof, mut exited) = (false, false);
                // Done at close, or once both the end of output and the exit are in (a server
                // that never closes the channel does not hold the caller to the deadline).
                while let Some(message) = read.wait().await {
                    match message {
                        ChannelMsg::Data { data } => append(&mut out.stdout, &data),
                        ChannelMsg::ExtendedData { data, ext: 1 } => append(&mut out.stderr, &data),
                        ChannelMsg::ExitStatus { exit_status } => {
                            out.status = Some(exit_status);
                            exited = true;
                        }
                        ChannelMsg::ExitSignal { .. } => exited = true,
                        ChannelMsg::Eof => eof = true,
                        ChannelMsg::Close => break,
                        _ => {}
                    }
                    if eof && exited {
                        break;
                    }
                }
                out
            };
            let (sent, out) = tokio::join!(send, receive);
            // A command that exits without reading its stdin refuses the rest: not an error.
            if let Err(e) = sent
                && out.status.is_none()
            {
                return Err(exec_error(e));
            }
            Ok(out)
        };
        match tokio::time::timeout_at(deadline, io).await {
            Ok(result) => result.map_err(Attempt::Failed),
            Err(_) => {
                self.stop_remote(&write, &mut read, command).await;
                Err(Attempt::Failed(ProberError::Timeout {
                    worker: self.worker.clone(),
                    what: format!("command {command:?}"),
                    deadline: Duration::ZERO,
                }))
            }
        }
    }
}

impl SshExecutor {
    /// Stops a command that overran its deadline, so that a hung probe does not stay on the
    /// worker (closing the channel alone leaves it running: sshd only closes its pipes). The
    /// remote `timeout` (see [`under_deadline`]) ends it at about this moment; this adds
    /// what the connection can carry: TERM to the command's process group (an SSH `signal`
    /// request, which OpenSSH's sshd delivers with `killpg`, though not for root logins, which
    /// it serves without privilege separation), then KILL if it has not exited within a
    /// second; TERM first, because `sudo` passes TERM on to its command but cannot pass KILL.
    /// Then the channel is closed. Every step is bounded, so a connection that no longer
    /// answers costs a few seconds at most.
    async fn stop_remote(
        &self,
        write: &ChannelWriteHalf<client::Msg>,
        read: &mut ChannelReadHalf,
        command: &str,
    ) {
        const STEP: Duration = Duration::from_secs(1);
        for signal in [Sig::TERM, Sig::KILL] {
            let name = format!("{signal:?}");
            if !matches!(tokio::time::timeout(STEP, write.signal(signal)).await, Ok(Ok(()))) {
                tracing::debug!(worker = %self.worker, command, "cannot signal the overrunning command");
                break;
            }
            if tokio::time::timeout(STEP, exited(read)).await.is_ok() {
                tracing::debug!(worker = %self.worker, command, signal = name, "stopped the overrunning command");
                break;
            }
        }
        let _ = tokio::time::timeout(STEP, write.close()).await;
    }
}

/// Returns once the channel says its command exited, or closes.
async fn exited(read: &mut ChannelReadHalf) {
    while let Some(message) = read.wait().await {
        if matches!(
            message,
            ChannelMsg::ExitStatus { .. } | ChannelMsg::ExitSignal { .. } | ChannelMsg::Close
        ) {
            return;
        }
    }
}

/// Why one attempt at a command failed.
enum Attempt {
    /// The connection is unusable: drop it and try once more on a fresh one.
    Reconnect(russh::Error),
    /// The command failed; report it.
    Failed(ProberError),
}

fn append(buffer: &mut Vec<u8>, data: &[u8]) {
    let room = MAX_OUTPUT.saturating_sub(buffer.len());
    buffer.extend_from_slice(&data[..data.len().min(room)]);
}

/// The probe channel's session: a channel on the worker's one connection, its command run
/// as it is (no `timeout`: it lives as long as the channel), its standard streams as a stream.
#[async_trait::async_trait]
impl crate::channel::SessionOpener for SshExecutor {
    async fn open_session(
        &self,
        command: &str,
        deadline: Duration,
    ) -> Result<crate::channel::Session, ProberError> {
        let open = async {
            let handle = self.connected().await?;
            let exec_error = |e: russh::Error| ProberError::Exec {
                worker: self.worker.clone(),
                detail: format!("opening the probe channel {command:?}: {e}"),
            };
            let channel = handle.channel_open_session().await.map_err(exec_error)?;
            channel.exec(true, command).await.map_err(exec_error)?;
            let (output, input) = tokio::io::split(channel.into_stream());
            Ok(crate::channel::Session {
                input: Box::pin(input),
                output: Box::pin(output),
                keep: Box::new(()),
            })
        };
        tokio::time::timeout(deadline, open).await.unwrap_or_else(|_| {
            Err(ProberError::Timeout {
                worker: self.worker.clone(),
                what: format!("opening the probe channel {command:?}"),
                deadline,
            })
        })
    }
}

#[async_trait::async_trait]
impl Executor for SshExecutor {
    async fn execute(
        &self,
        command: &str,
        stdin: &[u8],
        deadline: Duration,
    ) -> Result<Output, ProberError> {
        let until = tokio::time::Instant::now() + deadline;
        let timeout =
            |what: String| ProberError::Timeout { worker: self.worker.clone(), what, deadline };
        // The connection a command used, so that after a timeout it can be checked: after a
        // network cut a connection can hang for minutes while the kernel backs off its
        // retries, and every command on it would time out long after the peer is back.
        let mut used: Option<Arc<Handle<Pinned>>> = None;
        let attempts = async {
            let mut last = None;
            for _ in 0..2 {
                let handle = self.connected().await?;
                used = Some(handle.clone());
                match self.run(&handle, command, stdin, until).await {
                    Ok(out) => return Ok(out),
                    Err(Attempt::Failed(ProberError::Timeout { .. })) => {
                        return Err(timeout(format!("command {command:?}")));
                    }
                    Err(Attempt::Failed(e)) => return Err(e),
                    Err(Attempt::Reconnect(e)) => {
                        self.forget(&handle);
                        last = Some(e);
                    }
                }
            }
            Err(ProberError::Exec {
                worker: self.worker.clone(),
                detail: format!(
                    "cannot open a channel: {}",
                    last.map(|e| e.to_string()).unwrap_or_default()
                ),
            })
        };
        let result = tokio::time::timeout_at(until, attempts).await;
        let timed_out = matches!(result, Err(_) | Ok(Err(ProberError::Timeout { .. })));
        let handle = used.take();
        if let (true, Some(handle)) = (timed_out, &handle)
            && !self.answers(handle).await
        {
            tracing::debug!(worker = %self.worker, "the connection does not answer; the next command dials");
            self.forget(handle);
        }
        match result {
            Ok(result) => result,
            Err(_) if handle.is_some() => Err(timeout(format!("command {command:?}"))),
            Err(_) => Err(timeout(format!("connecting for command {command:?}"))),
        }
    }

    fn retarget(&self, instance: &crate::Instance) {
        let host_key = match instance.host_key.as_deref().map(parse_public_key) {
            Some(Ok(key)) => Some(key),
            Some(Err(e)) => {
                tracing::warn!(worker = %self.worker, error = %e, "the instance's host key is unreadable; no key is pinned");
                None
            }
            None => None,
        };
        self.set_target(SshTarget {
            address: instance.address.clone(),
            user: instance.remote_user.clone(),
            host_key,
        });
    }

    async fn close(&self) {
        let handle = self.connection.lock().take();
        if let Some(handle) = handle {
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                handle.disconnect(russh::Disconnect::ByApplication, "closing", "en"),
            )
            .await;
        }
    }
}
