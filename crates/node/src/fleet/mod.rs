//! `wharf fleet`: a pool of workers, each running the wharf node agent, and a scheduler that
//! places allocations on them, as Arvados' dispatcher keeps instances running crunch-run.
//!
//! This module only wires wharf-prober's pool and wharf-fleet's scheduler and replica loop
//! ([`ReplicaLoop`](wharf_fleet::ReplicaLoop): campaign, lead, follow) to the `wharf` binary:
//! its configuration, the lead's build (the instance set, the executors and the runner
//! commands of one term), the HTTP API and the CLI. What it wires:
//! - the runner is `wharf` itself, deployed to every static worker by sha256 (loopback workers
//!   run the fleet's own binary in place, as their agents do); the run probe is
//!   `wharf alloc list --probe`, a start is `wharf run --detach - --id ID` with the job spec on
//!   stdin, a stop is `wharf alloc stop --wait`, and `wharf alloc outcome ID` says how an
//!   allocation that left the list ended; each carries the leader's term (`--fleet-term N`),
//!   and the agent refuses starts and stops of a term older than one it has heard
//!   ([`crate::fence`]);
//! - loopback workers are agents on this host, one per instance directory, started by the
//!   instance's init command and ended by `wharf wipe`; static workers are the user's machines,
//!   reached over SSH with pinned host keys, each running its agent;
//! - every agent keeps a token of its own, in its data directory: the runner commands reach
//!   each agent through that directory (a loopback agent's is in the fleet's; a static host's
//!   is `agent_data_dir`), and read the token there as root, so no token leaves its host;
//! - [`api`] serves the management API, which always requires a token: the configured one, or
//!   the one the fleet makes at its first start and keeps in `<data_dir>/fleet-token`
//!   ([`crate::api_token::FLEET`]), where `wharf fleet` commands read it.

pub mod api;
pub mod arvados;
pub mod cli;
pub mod config;
pub mod nomad;
mod spot_prices;
pub mod variables;
mod wiring;

pub use wiring::{ExecutorLayer, Fleet, InstanceSets, Leading, WrapExecutor};

use anyhow::Context;
use config::FleetConfig;

/// Runs the fleet and its API until SIGTERM or SIGINT.
pub async fn serve(mut config: FleetConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("cannot listen on {}", config.bind))?;
    // The address as bound (a port 0 becomes the one the kernel chose) names this replica.
    let bound = listener.local_addr()?.to_string();
    config.store.replica.get_or_insert_with(|| bound.clone());
    config.store.advertise.get_or_insert(bound);
    let fleet = Fleet::start(config).await?;
    // Handled from before "ready" is said: a SIGTERM right after it is a clean shutdown.
    let terminated = crate::serve::terminate_signal();
    tracing::info!(address = %listener.local_addr()?, "fleet ready");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        terminated.await;
        tracing::info!("shutting down the fleet");
        stop.send_replace(true);
    });
    let router = nomad::mount(api::router(fleet.clone()), &fleet);
    crate::serve::run_server(listener, router, stopped).await;
    fleet.shutdown().await;
    Ok(())
}
