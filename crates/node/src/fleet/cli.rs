//! `wharf fleet ...`: running a fleet, and the commands that talk to one.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use super::api::{FleetAlloc, FleetStatus, FleetWorker};
use super::config::FleetConfig;
use crate::cli::{EXIT_ALLOC_FAILED, UsageError, init_logs, read_spec};
use crate::client::{ApiPath, Client};
use anyhow::Context;
use clap::{Args, Subcommand};
use hyper::Method;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use wharf_fleet::WorkPhaseName;
use wharf_prober::RunnerOutcome;
use wharf_state::duration::Formatted;

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
    /// Show one allocation with its attempts; without an id, the fleet: this replica, the
    /// leader, the replicas and the store.
    Status {
        /// The allocation id.
        id: Option<String>,
    },
    /// List the allocations the fleet knows.
    Allocs,
    /// Stop an allocation (cancel it if it is still queued).
    Stop {
        /// The allocation id.
        id: String,
    },
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

/// The global flags (or their environment variables) as `wharf fleet` applies them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides<'a> {
    /// `--address`: where the fleet's API listens, over `bind`.
    pub address: Option<&'a str>,
    /// `--data-dir`: the fleet's files, over `data_dir`.
    pub data_dir: Option<&'a std::path::Path>,
    /// `--token`: what the fleet's API requires, over `token`; what the commands present.
    pub token: Option<&'a str>,
}

/// The fleet's configuration: `--config` (or the defaults), then the global flags over it.
fn fleet_config(
    path: Option<&std::path::Path>,
    overrides: Overrides<'_>,
) -> anyhow::Result<FleetConfig> {
    let mut config = match path {
        Some(path) => FleetConfig::load(path).map_err(UsageError)?,
        None => FleetConfig::default(),
    };
    if let Some(address) = overrides.address {
        config.bind = crate::cli::listen_address(address)?;
    }
    if let Some(data_dir) = overrides.data_dir {
        config.data_dir = data_dir.to_owned();
    }
    if let Some(token) = overrides.token {
        config.token = Some(token.to_owned());
    }
    config.check().map_err(|problem| UsageError(format!("invalid configuration: {problem}")))?;
    Ok(config)
}

/// The client of the fleet at `address`: it presents the token given, else the one the fleet
/// keeps in its data directory (the one given, else the default one), as the agent's clients
/// do.
fn client(address: &str, overrides: Overrides<'_>) -> Client {
    let default_dir;
    let data_dir = match overrides.data_dir {
        Some(dir) => dir,
        None => {
            default_dir = FleetConfig::default().data_dir;
            &default_dir
        }
    };
    Client::new(address, overrides.token.map(str::to_owned))
        .with_token_in(crate::api_token::FLEET, data_dir)
}

/// Runs `wharf fleet` with `args`.
pub async fn run(
    args: FleetArgs,
    overrides: Overrides<'_>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Some(command) = args.command else {
        init_logs(args.log_json);
        let config = fleet_config(args.config.as_deref(), overrides)?;
        super::serve(config).await?;
        return Ok(ExitCode::SUCCESS);
    };
    let client = client(&args.fleet_address, overrides);
    let worker_action = |worker: String, action: &'static str| {
        let client = client.clone();
        async move {
            client
                .call(Method::POST, ApiPath::v1(["workers", &worker, action]), None)
                .await
                .with_context(|| format!("cannot {action} worker {worker}"))?;
            println!("worker {worker}: {action}");
            anyhow::Ok(ExitCode::SUCCESS)
        }
    };
    match command {
        FleetCommand::Submit { file, detach, id } => {
            let job = read_spec(&file)?;
            let spec = serde_json::to_vec(&job.to_spec())?;
            if let Some(id) = &id {
                wharf_state::check_alloc_id(id)?;
            }
            let path = ApiPath::v1(["allocations"]).query_opt("id", id.as_deref());
            let body = client.call(Method::POST, &path, Some(("application/json", spec))).await?;
            let alloc: FleetAlloc = serde_json::from_slice(&body)?;
            if detach {
                if json {
                    println!("{}", serde_json::to_string(&alloc)?);
                } else {
                    println!("{}", alloc.id);
                }
                return Ok(ExitCode::SUCCESS);
            }
            follow(&client, alloc, json).await
        }
        FleetCommand::Status { id: None } => {
            let status: FleetStatus =
                client.json(Method::GET, ApiPath::v1(["status"]), None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
                return Ok(ExitCode::SUCCESS);
            }
            let name = |r: &wharf_fleet::Replica| format!("{} at {}", r.name, r.address);
            println!("Replica  = {} ({})", name(&status.replica), status.role);
            match &status.leader {
                Some(leader) => println!("Leader   = {}", name(leader)),
                None => println!("Leader   = none (an election is under way)"),
            }
            for replica in &status.replicas {
                println!("Replicas = {}", name(replica));
            }
            println!("Store    = {} ({})", status.store.backend, status.store.location);
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Status { id: Some(id) } => {
            let alloc: FleetAlloc =
                client.json(Method::GET, ApiPath::v1(["allocations", &id]), None).await?;
            print_allocs(std::slice::from_ref(&alloc), json)?;
            if !json {
                print_attempts(&alloc);
            }
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Allocs => {
            let allocs: Vec<FleetAlloc> =
                client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
            print_allocs(&allocs, json)?;
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Stop { id } => {
            let alloc: FleetAlloc =
                client.json(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await?;
            print_allocs(&[alloc], json)?;
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Workers => {
            let workers: Vec<FleetWorker> =
                client.json(Method::GET, ApiPath::v1(["workers"]), None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&workers)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<20}  {:<8}  {:<5}  {:>10}  {:>15}  {:>17}  {:>5}  {:<24}  ERROR",
                "WORKER",
                "STATE",
                "IDLE",
                "PROBED",
                "CPU USED/ALL",
                "MEMORY USED/ALL",
                "CORES",
                "ALLOCATIONS"
            );
            for w in workers {
                // To a tenth of a second, as people read it: "4.2s", "1m5.3s".
                let tenths = (w.last_probe_seconds.max(0.0) * 10.0).round() as u64;
                let probed = Formatted(Duration::from_millis(tenths * 100)).to_string();
                // Used of all it has, or just used where its runner has not said.
                let of = |used: u64, all: Option<u64>, unit: &str| {
                    let all = all.map_or_else(|| "?".to_owned(), |all| all.to_string());
                    format!("{used}/{all} {unit}").trim_end().to_owned()
                };
                let has = w.resources;
                println!(
                    "{:<20}  {:<8}  {:<5}  {:>10}  {:>15}  {:>17}  {:>5}  {:<24}  {}",
                    w.id,
                    w.state,
                    w.idle_behavior,
                    probed,
                    of(w.used.cpu_mhz, has.map(|h| h.cpu_mhz), "MHz"),
                    of(w.used.memory_mb, has.map(|h| h.memory_mb), "MB"),
                    of(u64::from(w.used.cores), has.map(|h| u64::from(h.cores)), ""),
                    w.allocations.join(","),
                    w.last_error.unwrap_or_default()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Hold { worker } => worker_action(worker, "hold").await,
        FleetCommand::Drain { worker } => worker_action(worker, "drain").await,
        FleetCommand::Run { worker } => worker_action(worker, "run").await,
        FleetCommand::Kill { worker } => worker_action(worker, "kill").await,
        FleetCommand::Probe { worker } => worker_action(worker, "probe").await,
    }
}

fn print_allocs(allocs: &[FleetAlloc], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(allocs)?);
        return Ok(());
    }
    println!("{:<36}  {:<9}  {:<20}  DETAIL", "ID", "PHASE", "WORKER");
    for a in allocs {
        println!(
            "{:<36}  {:<9}  {:<20}  {}",
            a.id,
            a.phase,
            a.worker.as_deref().unwrap_or("-"),
            a.detail.as_deref().or(a.waiting.as_deref()).unwrap_or("")
        );
    }
    Ok(())
}

/// The allocation's attempts, oldest first, each with when and how it ended once it has: the
/// ones that are over, then the current one (Nomad's reschedule tracker, as `nomad alloc
/// status` shows it), whose outcome is its phase while it is under way.
fn print_attempts(alloc: &FleetAlloc) {
    let row = |attempt: &dyn std::fmt::Display,
               runner_id: &str,
               worker: Option<&str>,
               started: Option<&str>,
               ended: Option<&str>,
               outcome: &str| {
        println!(
            "{attempt:<7}  {runner_id:<40}  {:<12}  {:<24}  {:<24}  {outcome}",
            worker.unwrap_or("-"),
            started.unwrap_or("-"),
            ended.unwrap_or("-"),
        );
    };
    println!();
    row(&"ATTEMPT", "RUNNER ID", Some("WORKER"), Some("STARTED"), Some("ENDED"), "OUTCOME");
    for a in &alloc.history {
        let (worker, started) = (a.worker.as_deref(), a.started.as_deref());
        row(&a.attempt, &a.runner_id, worker, started, Some(&a.finished), &a.outcome);
    }
    let now = match (&alloc.outcome, &alloc.not_before, alloc.phase) {
        (Some(outcome), _, _) => outcome.clone(),
        (None, Some(at), WorkPhaseName::Queued) => format!("{}, not before {at}", alloc.phase),
        (None, _, phase) => phase.to_string(),
    };
    let (worker, started) = (alloc.worker.as_deref(), alloc.started.as_deref());
    let ended = alloc.finished.as_deref();
    row(&alloc.attempt, &alloc.runner_id, worker, started, ended, &now);
}

/// Prints each change of phase until the allocation is done with; succeeds if it completed.
async fn follow(client: &Client, mut alloc: FleetAlloc, json: bool) -> anyhow::Result<ExitCode> {
    let mut shown: Option<(WorkPhaseName, Option<String>)> = None;
    loop {
        let now = (alloc.phase, alloc.worker.clone());
        if shown.as_ref() != Some(&now) {
            if json {
                println!("{}", serde_json::to_string(&alloc)?);
            } else {
                let on = alloc.worker.as_deref().map(|w| format!(" on {w}")).unwrap_or_default();
                let detail = alloc.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
                println!("==> {} {}{on}{detail}", alloc.id, alloc.phase);
            }
            shown = Some(now);
        }
        if alloc.is_final() {
            let complete = alloc.phase == WorkPhaseName::Ended
                && alloc.detail.as_deref().is_some_and(|d| RunnerOutcome::parse(d).completed());
            return Ok(if complete {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_ALLOC_FAILED)
            });
        }
        let path = ApiPath::v1(["allocations", &alloc.id])
            .query("after", alloc.version)
            .query("wait", "10s");
        alloc = client.json(Method::GET, path, None).await?;
    }
}
