//! Serving: the agent behind its HTTP API until SIGTERM or SIGINT, then a graceful shutdown
//! that leaves tasks running. Also the embedded agent `wharf run` starts when none answers.

use crate::agent::{Agent, StartOptions};
use crate::agent_file::AgentFile;
use crate::cli::common::UsageError;
use crate::client::Client;
use crate::config::NodeConfig;
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long open connections (such as followed logs) may linger after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

/// Runs the agent until SIGTERM or SIGINT.
pub async fn serve(config: NodeConfig, options: StartOptions) -> anyhow::Result<()> {
    config.check().map_err(|problem| UsageError(format!("invalid configuration: {problem}")))?;
    let listener = TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("cannot listen on {}", config.bind))?;
    let agent = Agent::start(config, options).await?;
    // Handled from before "ready" is said: a SIGTERM right after it is a clean shutdown.
    let terminated = terminate_signal();
    let address = listener.local_addr()?;
    let data_dir = agent.config().data_dir.clone();
    AgentFile { pid: std::process::id(), address: format!("http://{address}") }
        .write(&data_dir)
        .with_context(|| format!("cannot write {}", AgentFile::path(&data_dir).display()))?;
    tracing::info!(%address, data_dir = %data_dir.display(), "agent ready");
    let (stop, stopped) = watch::channel(false);
    let gc = {
        let (agent, stopped) = (agent.clone(), stopped.clone());
        tokio::spawn(async move { agent.gc_loop(stopped).await })
    };
    tokio::spawn(async move {
        terminated.await;
        tracing::info!("shutting down; tasks keep running");
        stop.send_replace(true);
    });
    run_server(listener, crate::api::router(agent.clone()), stopped).await;
    let _ = gc.await;
    AgentFile::remove_own(&data_dir);
    agent.shutdown().await;
    Ok(())
}

/// Serves `router` until `stopped` is raised, then lets open connections drain for a bounded
/// time.
pub(crate) async fn run_server(
    listener: TcpListener,
    router: axum::Router,
    mut stopped: watch::Receiver<bool>,
) {
    let mut graceful = stopped.clone();
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        let _ = graceful.wait_for(|s| *s).await;
    });
    let drained = async move {
        let _ = stopped.wait_for(|s| *s).await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::select! {
        result = server => if let Err(error) = result { tracing::error!(%error, "the API server failed") },
        () = drained => tracing::warn!("connections still open after the drain period were dropped"),
    }
}

/// Handles SIGTERM and SIGINT from now on (their default, to die at once, no longer applies),
/// and waits for either.
pub(crate) fn terminate_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// An agent started inside a CLI process.
#[derive(Debug)]
pub struct EmbeddedAgent {
    agent: Arc<Agent>,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl EmbeddedAgent {
    /// Stops serving and shuts the agent down (tasks still running are left running).
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.server.await;
        self.agent.shutdown().await;
    }
}

/// Starts an agent in this process, serving on an ephemeral loopback port (so the CLI talks
/// to it as to any agent), and a client of it.
pub async fn embedded(mut config: NodeConfig) -> anyhow::Result<(Client, EmbeddedAgent)> {
    config.bind = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let listener =
        TcpListener::bind(config.bind).await.context("cannot listen on a loopback port")?;
    let address = listener.local_addr()?;
    let agent = Agent::start(config, StartOptions::default())
        .await
        .context("no agent answers and an embedded one could not start")?;
    // The configured token, or the one the agent keeps in its data directory.
    let token = agent.config().token.clone();
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(run_server(listener, crate::api::router(agent.clone()), stopped));
    Ok((Client::new(&address.to_string(), token), EmbeddedAgent { agent, stop, server }))
}
