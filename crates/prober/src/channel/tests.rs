//! The channel's rules against a server played by the test, over an in-memory stream: what
//! goes over the channel, what falls back to a fresh session, what is never sent twice, and
//! deadlines.

use super::wire::{self, Answer};
use super::*;
use crate::executor::{Reply, ScriptedExecutor};
use crate::{Instance, InstanceId, Tags};
use tokio::io::{AsyncWriteExt, DuplexStream};

/// How the played server treats a request it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Play {
    /// Answers `served: <args>` on stdout, with the stdin echoed on stderr.
    Answer,
    /// Answers `unsupported`.
    Unsupported,
    /// Closes the session without answering.
    Die,
    /// Never answers (and keeps the session open).
    Hang,
}

/// Opens sessions to a played server. Session `n` follows `sessions[n]` request by request
/// (the last play repeats; sessions past the list answer everything). Every request any
/// session read is recorded.
#[derive(Debug, Default)]
struct PlayedServer {
    sessions: Mutex<Vec<Vec<Play>>>,
    opened: AtomicU64,
    /// Whether the program greets with something else (a runner without a channel).
    refuse: AtomicBool,
    read: Arc<Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl SessionOpener for PlayedServer {
    async fn open_session(&self, command: &str, _: Duration) -> Result<Session, ProberError> {
        assert_eq!(command, "wharf --data-dir /d probe-channel");
        let index = usize::try_from(self.opened.fetch_add(1, Ordering::SeqCst)).unwrap();
        let (client, mut server) = tokio::io::duplex(1 << 20);
        if self.refuse.load(Ordering::SeqCst) {
            server.write_all(b"wharf: unrecognized subcommand 'probe-channel'\n").await.unwrap();
        } else {
            let plays =
                self.sessions.lock().get(index).cloned().unwrap_or_else(|| vec![Play::Answer]);
            tokio::spawn(serve(server, plays, self.read.clone()));
        }
        let (output, input) = tokio::io::split(client);
        Ok(Session { input: Box::pin(input), output: Box::pin(output), keep: Box::new(()) })
    }
}

async fn serve(server: DuplexStream, plays: Vec<Play>, read: Arc<Mutex<Vec<String>>>) {
    let (from_client, mut to_client) = tokio::io::split(server);
    let mut from_client = BufReader::new(from_client);
    to_client.write_all(format!("{}\n", wire::GREETING).as_bytes()).await.unwrap();
    let mut held = Vec::new();
    for n in 0.. {
        let Ok(request) = wire::read_request(&mut from_client).await else { return };
        read.lock().push(request.args.clone());
        let play = plays.get(n).or(plays.last()).copied().unwrap_or(Play::Answer);
        let answer = match play {
            Play::Answer => Answer::Exit(Output {
                stdout: format!("served: {}\n", request.args).into_bytes(),
                stderr: request.stdin.clone(),
                status: Some(0),
            }),
            Play::Unsupported => Answer::Unsupported,
            Play::Die => return,
            Play::Hang => {
                held.push(request);
                continue;
            }
        };
        to_client.write_all(&wire::answer_frame(request.seq, &answer)).await.unwrap();
    }
}

fn instance() -> Instance {
    Instance {
        id: InstanceId("w1".into()),
        address: Some("10.0.0.1:22".into()),
        remote_user: "root".into(),
        tags: Tags::new(),
        host_key: None,
        runner_args: "--data-dir /d".into(),
    }
}

/// A channel over a played server, with a scripted executor as the command mode.
fn channel(plays: Vec<Vec<Play>>) -> (ChannelExecutor, Arc<PlayedServer>, ScriptedExecutor) {
    let server = Arc::new(PlayedServer::default());
    *server.sessions.lock() = plays;
    let commands = ScriptedExecutor::new("w1");
    commands.containing("wharf ", Reply::ok("from a session of its own\n"));
    commands.exact("true", Reply::ok(""));
    let executor = ChannelExecutor::new(
        &instance(),
        Arc::new(commands.clone()),
        server.clone(),
        ChannelConfig::new("wharf"),
    );
    (executor, server, commands)
}

const LIST: &str = "wharf --data-dir /d alloc list --probe";
const START: &str = "wharf --data-dir /d run --detach - --id 'job-1'";
const DEADLINE: Duration = Duration::from_secs(20);

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn runner_commands_go_over_one_channel_and_others_run_as_before() {
    let (executor, server, commands) = channel(vec![]);
    for _ in 0..3 {
        let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
        assert_eq!(stdout(&out), "served: --data-dir /d alloc list --probe\n");
    }
    let out = executor.execute(START, b"[job]", DEADLINE).await.unwrap();
    assert_eq!(stdout(&out), "served: --data-dir /d run --detach - --id 'job-1'\n");
    assert_eq!(out.stderr, b"[job]", "the payload went with the request");
    // Not the runner's, or not simple words: the command mode.
    for other in ["true", "wharf alloc list --probe | head", "wharfx alloc list"] {
        let _ = executor.execute(other, b"", DEADLINE).await;
    }
    assert_eq!(server.opened.load(Ordering::SeqCst), 1, "one session for every request");
    assert_eq!(server.read.lock().len(), 4);
    let sent: Vec<String> = commands.calls().into_iter().map(|c| c.command).collect();
    assert_eq!(sent, ["true", "wharf alloc list --probe | head", "wharfx alloc list"]);
    assert_eq!(
        executor.stats(),
        ChannelStats { opened: 1, failed_opens: 0, answered: 4, fell_back: 0 }
    );
}

#[tokio::test]
async fn an_unsupported_request_runs_in_a_session_of_its_own() {
    let (executor, _server, commands) = channel(vec![vec![Play::Unsupported, Play::Answer]]);
    let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert_eq!(stdout(&out), "from a session of its own\n");
    assert_eq!(commands.call_count(), 1);
    // The channel stays open for the next.
    let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert!(stdout(&out).starts_with("served: "), "{out:?}");
    assert!(executor.is_open());
}

/// Arvados' worker probes again at its next tick when a probe fails; here a probe whose channel
/// broke is run again at once in a fresh session, and the next command opens a new channel.
#[tokio::test]
async fn a_broken_channel_falls_back_to_a_fresh_session_and_the_next_command_reopens_it() {
    let (executor, server, commands) = channel(vec![vec![Play::Answer, Play::Die]]);
    assert!(stdout(&executor.execute(LIST, b"", DEADLINE).await.unwrap()).starts_with("served"));
    // The server dies on reading the second request: a probe is safe to run again.
    let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert_eq!(stdout(&out), "from a session of its own\n");
    assert_eq!(commands.calls()[0].command, LIST);
    assert!(!executor.is_open());
    let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert!(stdout(&out).starts_with("served"), "a new channel answered: {out:?}");
    assert_eq!(server.opened.load(Ordering::SeqCst), 2);
    assert_eq!(executor.stats().fell_back, 1);
}

#[tokio::test]
async fn a_start_sent_over_a_channel_that_broke_is_never_sent_again() {
    let (executor, server, commands) = channel(vec![vec![Play::Die]]);
    let error = executor.execute(START, b"[job]", DEADLINE).await.unwrap_err().to_string();
    assert!(error.contains("is not sent again, as it may have run"), "{error}");
    assert_eq!(commands.call_count(), 0, "not sent in a fresh session");
    assert_eq!(server.read.lock().as_slice(), ["--data-dir /d run --detach - --id 'job-1'"]);
}

#[tokio::test(start_paused = true)]
async fn a_hung_channel_hits_the_deadline_and_is_replaced() {
    let (executor, server, commands) = channel(vec![vec![Play::Hang]]);
    let started = Instant::now();
    let error = executor.execute(LIST, b"", Duration::from_secs(3)).await.unwrap_err();
    assert!(matches!(error, ProberError::Timeout { .. }), "{error}");
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(3) && took < Duration::from_millis(3100), "{took:?}");
    assert_eq!(
        error.to_string(),
        format!("command {LIST:?} on worker w1 did not finish within 3s")
    );
    assert_eq!(commands.call_count(), 0);
    let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert!(stdout(&out).starts_with("served"), "{out:?}");
    assert_eq!(server.opened.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_runner_without_a_channel_is_probed_by_commands_and_asked_again_later() {
    let (executor, server, commands) = channel(vec![]);
    server.refuse.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
        assert_eq!(stdout(&out), "from a session of its own\n");
    }
    assert_eq!(server.opened.load(Ordering::SeqCst), 1, "not asked again at every probe");
    assert_eq!(commands.call_count(), 3);
    server.refuse.store(false, Ordering::SeqCst);
    tokio::time::advance(ChannelConfig::new("wharf").reopen_after).await;
    let out = executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert!(stdout(&out).starts_with("served"), "{out:?}");
    assert_eq!(executor.stats().failed_opens, 1);
}

#[tokio::test]
async fn requests_in_flight_together_get_their_own_answers() {
    let (executor, _server, _) = channel(vec![]);
    let executor = Arc::new(executor);
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let executor = executor.clone();
            tokio::spawn(async move {
                let command = format!("wharf --data-dir /d alloc outcome 'job-{i}'");
                let out = executor.execute(&command, b"", DEADLINE).await.unwrap();
                assert_eq!(
                    stdout(&out),
                    format!("served: --data-dir /d alloc outcome 'job-{i}'\n")
                );
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(executor.stats().opened, 1, "concurrent first calls shared one open");
}

#[tokio::test]
async fn a_changed_address_or_runner_arguments_reopen_the_channel_and_a_sync_keeps_it() {
    let (executor, server, _) = channel(vec![]);
    executor.execute(LIST, b"", DEADLINE).await.unwrap();
    executor.retarget(&instance());
    assert!(executor.is_open(), "an unchanged listing keeps the channel");
    executor.retarget(&Instance { address: Some("10.0.0.2:22".into()), ..instance() });
    assert!(!executor.is_open());
    executor.execute(LIST, b"", DEADLINE).await.unwrap();
    assert_eq!(server.opened.load(Ordering::SeqCst), 2);
}
