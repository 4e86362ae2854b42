//! `wharf fleet ...`: running a fleet, and the commands that talk to one.
//!
//! This module parses the fleet's part of the command line and hands each subcommand to its
//! own module: `wharf fleet` alone runs a replica (`serve`); the others talk to the fleet's
//! API with a client of it made here (`submit`, `status`, `allocs`, `job`, `workers`). What
//! they share with the agent's commands comes from [`crate::cli::common`].

mod allocs;
mod job;
mod serve;
mod status;
mod submit;
mod workers;

use super::config::FleetConfig;
use crate::cli::common::GlobalFlags;
use crate::client::Client;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct FleetArgs {
    /// The fleet's configuration (TOML); without one, two loopback workers on this host.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log JSON lines instead of human-readable text.
    #[arg(long)]
    pub log_json: bool,
    /// The fleet's address, for the commands that talk to it.
    #[arg(long, global = true, env = "WHARF_FLEET_ADDR", default_value = "http://127.0.0.1:4748")]
    pub fleet_address: String,
    #[command(subcommand)]
    pub command: Option<FleetCommand>,
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Submit a job spec to the fleet and follow it until it ends (`--detach`: print the id).
    Submit {
        /// The job spec; `-` reads it from standard input.
        file: PathBuf,
        /// Return at once with the allocation id.
        #[arg(long)]
        detach: bool,
        /// The allocation id to use instead of a new one.
        #[arg(long)]
        id: Option<String>,
    },
    /// Show one allocation with its attempts, or a job with its allocations; without an id,
    /// the fleet: this replica, the leader, the replicas and the store.
    Status {
        /// The allocation id, or the job id.
        id: Option<String>,
    },
    /// List the allocations the fleet knows.
    Allocs,
    /// Stop an allocation (cancel it if it is still queued), or every allocation of a job.
    Stop {
        /// The allocation id, or the job id.
        id: String,
    },
    /// The fleet's work by job: list jobs, show one's allocations and attempts, stop one.
    #[command(subcommand)]
    Job(job::JobCommand),
    /// List the workers.
    Workers,
    /// Give a worker no new work, but keep it.
    Hold {
        /// The worker.
        worker: String,
    },
    /// Give a worker no new work, and shut it down once its work is done.
    Drain {
        /// The worker.
        worker: String,
    },
    /// Let a worker take work again (a static host taken out of service comes back).
    Run {
        /// The worker.
        worker: String,
    },
    /// Shut a worker down now, whatever runs there (its allocations are lost).
    Kill {
        /// The worker.
        worker: String,
    },
    /// Probe a worker now rather than at its turn (after fixing it by hand, say).
    Probe {
        /// The worker.
        worker: String,
    },
    /// The variables the fleet gives its workers, which their task templates read
    /// (`nomadVar`, `key`): put, get, list, delete.
    #[command(subcommand)]
    Var(crate::cli::var::VarCommand),
}

/// How `wharf fleet` combines its sources of settings.
pub(crate) const FLEET_SETTINGS: &str = "\
Settings of `wharf fleet` itself, as of `wharf agent`: a flag overrides its environment variable \
(WHARF_ADDR, WHARF_DATA_DIR, WHARF_TOKEN), which overrides the --config file, which overrides \
the defaults (data in ./wharf-fleet, API on 127.0.0.1:4748). --address, --data-dir and --token \
set the file's `bind`, `data_dir` and `token`; any address other than loopback requires a \
token, and so does a fleet on etcd (the same on every replica). Without one, the fleet makes a \
token at its first start and keeps it in `fleet-token` in its data directory, readable by its \
user alone. The commands that talk to a fleet find it with --fleet-address and present \
--token, or else the token kept in --data-dir (./wharf-fleet without it).";

/// The client of the fleet at `address`: it presents the token given, else the one the fleet
/// keeps in its data directory (the one given, else the default one), as the agent's clients
/// do.
fn client(address: &str, flags: GlobalFlags<'_>) -> Client {
    let default_dir;
    let data_dir = match flags.data_dir {
        Some(dir) => dir,
        None => {
            default_dir = FleetConfig::default().data_dir;
            &default_dir
        }
    };
    Client::new(address, flags.token.map(str::to_owned))
        .with_token_in(crate::api_token::FLEET, data_dir)
}

/// Runs `wharf fleet` with `args`.
pub async fn run(args: FleetArgs, flags: GlobalFlags<'_>) -> anyhow::Result<ExitCode> {
    let Some(command) = args.command else {
        return serve::serve(args.config.as_deref(), args.log_json, flags).await;
    };
    let client = client(&args.fleet_address, flags);
    let json = flags.json;
    match command {
        FleetCommand::Submit { file, detach, id } => {
            submit::submit(&client, &file, detach, id.as_deref(), json).await
        }
        FleetCommand::Status { id: None } => status::fleet(&client, json).await,
        FleetCommand::Status { id: Some(id) } => match status::alloc(&client, &id, json).await {
            Err(error) if job::no_such_alloc(&error) => {
                job::status(&job::of_job(&client, &id).await?, json)
            }
            done => done,
        },
        FleetCommand::Allocs => allocs::list(&client, json).await,
        FleetCommand::Stop { id } => match allocs::stop(&client, &id, json).await {
            Err(error) if job::no_such_alloc(&error) => {
                job::stop(&client, &job::of_job(&client, &id).await?, &id, json).await
            }
            done => done,
        },
        FleetCommand::Job(command) => job::job(&client, command, json).await,
        FleetCommand::Workers => workers::list(&client, json).await,
        FleetCommand::Hold { worker } => workers::act(&client, &worker, "hold").await,
        FleetCommand::Drain { worker } => workers::act(&client, &worker, "drain").await,
        FleetCommand::Run { worker } => workers::act(&client, &worker, "run").await,
        FleetCommand::Kill { worker } => workers::act(&client, &worker, "kill").await,
        FleetCommand::Probe { worker } => workers::act(&client, &worker, "probe").await,
        FleetCommand::Var(crate::cli::var::VarCommand::Sync) => anyhow::bail!(
            "`var sync` gives a worker's agent a fleet's variables; the fleet's own are set \
             with `wharf fleet var put`"
        ),
        FleetCommand::Var(command) => crate::cli::var::var(&client, command, json).await,
    }
}
