//! The `wharf` command line: `agent`, `run`, `validate`, `alloc ...` and `service list`.
//!
//! Exit codes (the README's table; [`exit_code`] decides):
//! - 0: success (for `run`, the allocation completed);
//! - 1: it did not end as asked: `run`'s allocation failed or was lost, `alloc stop --wait`
//!   ran out of time, `alloc exec`'s command failed;
//! - 2: bad usage: a wrong flag, a job spec or configuration file that cannot be read or is
//!   not valid, an id that names no allocation, a request the agent rejects as wrong (4xx);
//! - 3: the agent could not be reached, refused the token, or failed (for `agent` itself: it
//!   could not start);
//! - 130: `run` interrupted twice.

// A command line's output is its interface.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::agent::StartOptions;
use crate::api::{AllocDetail, AllocSummary, ExecResponse};
use crate::client::{ApiPath, Client, ClientError};
use crate::config::NodeConfig;
use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hyper::Method;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use wharf_prober::RunnerOutcome;
use wharf_state::duration::Formatted;
use wharf_state::{AllocState, ClientStatus, TaskState, Timestamp};

/// Exit code: the allocation failed or was lost.
pub const EXIT_ALLOC_FAILED: u8 = 1;
/// Exit code: bad usage or an invalid job spec.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the agent could not be reached or refused.
pub const EXIT_AGENT: u8 = 3;
/// Exit code: interrupted twice.
pub const EXIT_INTERRUPTED: u8 = 130;

/// The user asked for something that cannot be done as asked (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// What was asked was done, but did not end as hoped (exit 1): the command failed, the
/// allocation has not stopped in time.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotDone(pub(crate) String);

/// A job spec file that cannot be read as text (exit 2).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpecFileError {
    /// Missing, unreadable, a directory.
    #[error("cannot read the job spec {file}: {source}")]
    Read {
        /// The file, or "standard input".
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// Bytes that are not UTF-8.
    #[error("the job spec {file} is not UTF-8 text: bad bytes at line {line}, column {column}")]
    NotUtf8 {
        /// The file, or "standard input".
        file: String,
        /// The line of the first bad byte, from 1.
        line: usize,
        /// Its column, in characters from 1.
        column: usize,
    },
}

/// The exit code for `error`: the first cause in its chain that says.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(client) = cause.downcast_ref::<ClientError>() {
            return match client {
                ClientError::Api { status, .. }
                    if status.is_client_error()
                        && *status != hyper::StatusCode::UNAUTHORIZED
                        && *status != hyper::StatusCode::FORBIDDEN =>
                {
                    EXIT_USAGE
                }
                _ => EXIT_AGENT,
            };
        }
        if cause.is::<NotDone>() {
            return EXIT_ALLOC_FAILED;
        }
        if cause.is::<UsageError>()
            || cause.is::<SpecFileError>()
            || cause.is::<crate::config::ConfigError>()
            || cause.is::<wharf_state::SpecError>()
            || cause.is::<wharf_state::InvalidAllocId>()
            || cause.is::<wharf_state::duration::DurationError>()
        {
            return EXIT_USAGE;
        }
    }
    EXIT_AGENT
}

/// `error` and its causes in one line, each said once: a cause whose text the message
/// already holds (most of ours name their source inline) is not repeated.
pub fn describe(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// wharf: run allocations on this node, and watch them.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
pub struct Cli {
    /// The agent's address: where `agent` listens (over `bind` in its configuration), and
    /// where the other commands reach it [default: http://127.0.0.1:4747, or the address the
    /// agent of --data-dir announced].
    #[arg(long, global = true, env = "WHARF_ADDR")]
    address: Option<String>,
    /// The agent's data directory: where `agent` keeps its state (over `data_dir` in its
    /// configuration); the other commands read the agent's address from `agent.json` there,
    /// and `alloc list --probe` reads its store when it does not answer.
    #[arg(long, global = true, env = "WHARF_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The agent's API token: `agent` requires it of every caller (over `token` in its
    /// configuration; with none, it makes one and keeps it in `agent-token` in its data
    /// directory, readable by its user alone); the other commands present it [default: the
    /// token kept in --data-dir, or with neither --address nor --data-dir, in ./wharf-data].
    #[arg(long, global = true, env = "WHARF_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of text (`agent`: log JSON lines).
    #[arg(long, global = true)]
    json: bool,
    /// The term of the fleet leader that runs this command on its worker: the agent refuses
    /// a start or a stop under a term older than one it has heard (see the fleet's docs).
    #[arg(long, global = true, env = "WHARF_FLEET_TERM", hide = true)]
    fleet_term: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent (HTTP API on 127.0.0.1:4747 by default).
    #[command(after_help = AGENT_SETTINGS)]
    Agent(AgentArgs),
    /// Submit a job spec and follow the allocation until it ends (Ctrl-C stops it).
    Run(RunArgs),
    /// Check a job spec without running it.
    Validate {
        /// The job spec (TOML, or JSON ending in .json).
        file: PathBuf,
    },
    /// Inspect and control allocations.
    #[command(subcommand)]
    Alloc(AllocCommand),
    /// Inspect the node.
    #[command(subcommand)]
    Node(NodeCommand),
    /// The services of the node's running tasks.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Run a fleet of agents (`wharf fleet`), or talk to one (`wharf fleet submit ...`).
    #[command(after_help = crate::fleet::cli::FLEET_SETTINGS)]
    Fleet(crate::fleet::cli::FleetArgs),
    /// Kill the agent of --data-dir and every task it ran, and delete the directory: what
    /// destroying the machine would do (the fleet's loopback instances end this way).
    Wipe {
        /// Its configuration (for the data directory, unless --data-dir is given).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// Show the node's CPU and memory, what it keeps for itself, what allocations hold, what
    /// is free, how tasks are contained, and each driver's health.
    Status {
        /// One line for a prober: what the node can give work in all
        /// (`cpu_mhz=... memory_mb=... cores=...`), then what is free now (`free_cpu_mhz=...`).
        #[arg(long)]
        probe: bool,
    },
}

/// How `wharf agent` combines its sources of settings.
const AGENT_SETTINGS: &str = "\
Settings: a flag overrides its environment variable (WHARF_ADDR, WHARF_DATA_DIR, WHARF_TOKEN), \
which overrides the --config file, which overrides the defaults (data in ./wharf-data, API on \
127.0.0.1:4747). --address, --data-dir and --token set the file's `bind`, `data_dir` and \
`token`. Every API call but /v1/health needs the token; with none set, the agent makes one at \
its first start and keeps it in agent-token in its data directory, readable by its user \
alone, where the other commands find it through --data-dir.";

#[derive(Debug, Args)]
struct AgentArgs {
    /// A TOML configuration file; without one, defaults apply.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Log JSON lines instead of human-readable text (the same as --json).
    #[arg(long)]
    log_json: bool,
    /// If the state store is damaged, move it aside and start empty.
    #[arg(long)]
    reset_state: bool,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The job spec; `-` reads it from standard input.
    file: PathBuf,
    /// Submit and print the allocation id without following it.
    #[arg(long)]
    detach: bool,
    /// Run it under this allocation id (`[A-Za-z0-9_-]{1,64}`) instead of a new one. The same
    /// job submitted again under the same id is accepted once, so a retry is safe.
    #[arg(long)]
    id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ServiceCommand {
    /// List the services with their address, port, tags and health.
    List,
}

#[derive(Debug, Subcommand)]
enum AllocCommand {
    /// List allocations.
    List {
        /// Print the runner-list protocol (DESIGN.md) for a prober.
        #[arg(long)]
        probe: bool,
        /// The agent's configuration, to find its data when no agent answers (--probe).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print how an allocation ended, in one line for a dispatcher: `unknown` if this node
    /// does not have it, else its status (`pending`, `running`, `complete`, `failed`, `lost`)
    /// and, once it ended, why.
    Outcome {
        /// The allocation id (exact).
        id: String,
    },
    /// Show an allocation's tasks and recent events.
    Status {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
    },
    /// Print a task's output.
    Logs {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The task.
        task: String,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
        /// Keep printing as the task writes, until it ends.
        #[arg(short, long)]
        follow: bool,
        /// Only the last this many bytes.
        #[arg(long)]
        tail: Option<u64>,
    },
    /// Stop an allocation (poststop tasks still run).
    Stop {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// Wait this long (such as `10s`) for it to end; fail if it has not.
        #[arg(long)]
        wait: Option<String>,
        /// Take the id exactly, never as a prefix: for programs, such as a fleet stopping an
        /// attempt that may be gone while a later one (`<id>__2`) runs.
        #[arg(long)]
        exact: bool,
    },
    /// Restart a task, the running tasks, or (with --all) every task.
    Restart {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The task; without it, every running task.
        task: Option<String>,
        /// Restart the whole allocation, prestart tasks first.
        #[arg(long, conflicts_with = "task")]
        all: bool,
    },
    /// Send a signal to a task, or to every task.
    Signal {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The signal, such as SIGHUP.
        signal: String,
        /// The task; without it, every task.
        #[arg(long)]
        task: Option<String>,
    },
    /// Run a command inside a task.
    Exec {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The task.
        task: String,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
        /// Give up after this long.
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let mut cli = Cli::parse();
    // `WHARF_ADDR=` unsets, as people expect of an empty variable.
    cli.address = cli.address.filter(|a| !a.is_empty());
    cli.data_dir = cli.data_dir.filter(|d| !d.as_os_str().is_empty());
    cli.token = cli.token.filter(|t| !t.is_empty());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(EXIT_AGENT, &format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(run(cli))
}

fn fail(code: u8, message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "wharf: {message}");
    ExitCode::from(code)
}

/// The agent's client: at the address given, else at the one announced in the data directory
/// given, else at the default address. It presents the token given, else the one kept in the
/// data directory given, or, with neither an address nor a data directory given, in the
/// default data directory (`wharf-data`). Its requests carry the fleet term, if one was given.
fn agent_client(cli: &Cli) -> Client {
    agent_address_client(cli).with_fleet_term(cli.fleet_term)
}

fn agent_address_client(cli: &Cli) -> Client {
    const DEFAULT: &str = "http://127.0.0.1:4747";
    let token = cli.token.clone();
    match (&cli.data_dir, &cli.address) {
        (Some(data_dir), None) => Client::of_data_dir(data_dir, token),
        (Some(data_dir), Some(address)) => Client::new(address, token).with_token_of(data_dir),
        (None, Some(address)) => Client::new(address, token),
        (None, None) => Client::new(DEFAULT, token).with_token_of(&NodeConfig::default().data_dir),
    }
}

/// The node configuration from `--config` (or defaults), with `--data-dir` applied.
fn node_config(config: Option<&Path>, data_dir: Option<&Path>) -> anyhow::Result<NodeConfig> {
    let mut config = match config {
        Some(path) => NodeConfig::load(path)?,
        None => NodeConfig::default(),
    };
    if let Some(data_dir) = data_dir {
        config.data_dir = data_dir.to_owned();
    }
    Ok(config)
}

async fn run(cli: Cli) -> ExitCode {
    let client = agent_client(&cli);
    let data_dir = cli.data_dir.as_deref();
    let result = match cli.command {
        Command::Agent(args) => {
            let overrides = AgentOverrides {
                address: cli.address.as_deref(),
                data_dir,
                token: cli.token.as_deref(),
                json: cli.json,
            };
            agent(args, overrides).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Wipe { config } => wipe(config.as_deref(), data_dir, cli.json).await,
        Command::Fleet(args) => {
            let overrides = crate::fleet::cli::Overrides {
                address: cli.address.as_deref(),
                data_dir,
                token: cli.token.as_deref(),
            };
            crate::fleet::cli::run(args, overrides, cli.json).await
        }
        Command::Validate { file } => validate(&file, cli.json),
        Command::Run(args) => run_file(&client, &args, data_dir, cli.json).await,
        Command::Alloc(command) => {
            alloc(&client, command, data_dir, cli.json).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Node(NodeCommand::Status { probe }) => node_status(&client, cli.json, probe).await,
        Command::Service(ServiceCommand::List) => {
            list_services(&client, cli.json).await.map(|()| ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|error| fail(exit_code(&error), &describe(&error)))
}

/// `wharf node status`.
async fn node_status(client: &Client, json: bool, probe: bool) -> anyhow::Result<ExitCode> {
    let status: crate::usage::NodeStatus =
        client.json(Method::GET, ApiPath::v1(["node"]), None).await?;
    if probe {
        println!("{}", crate::usage::probe_line(&status));
    } else if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", crate::usage::node_text(&status));
    }
    Ok(ExitCode::SUCCESS)
}

/// Logs to stderr, as text or JSON lines, at the levels `RUST_LOG` asks for (`info`, or
/// `wharf_fleet=debug,info`: a level per target, as a prefix of the module path), `info`
/// without it.
pub(crate) fn init_logs(json: bool) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let default = || Targets::new().with_default(LevelFilter::INFO);
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => text.parse::<Targets>().unwrap_or_else(|error| {
            eprintln!("RUST_LOG={text:?} is not a list of target=level: {error}; logging at info");
            default()
        }),
        _ => default(),
    };
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = tracing_subscriber::registry().with(filter);
    if json {
        logs.with(layer.json()).init();
    } else {
        logs.with(layer).init();
    }
}

/// The global flags (or their environment variables) as `wharf agent` applies them.
struct AgentOverrides<'a> {
    address: Option<&'a str>,
    data_dir: Option<&'a Path>,
    token: Option<&'a str>,
    json: bool,
}

async fn agent(args: AgentArgs, overrides: AgentOverrides<'_>) -> anyhow::Result<()> {
    init_logs(args.log_json || overrides.json);
    let mut config = node_config(args.config.as_deref(), overrides.data_dir)?;
    if let Some(address) = overrides.address {
        config.bind = listen_address(address)?;
    }
    if let Some(token) = overrides.token {
        config.token = Some(token.to_owned());
    }
    crate::serve::serve(config, StartOptions { reset_state: args.reset_state }).await
}

/// The address `--address` asks the agent (or the fleet) to listen on: `127.0.0.1:4747`, or
/// the same as a URL (`http://127.0.0.1:4747`), as the other commands take it.
pub(crate) fn listen_address(text: &str) -> Result<std::net::SocketAddr, UsageError> {
    let bare = text.strip_prefix("http://").unwrap_or(text).trim_end_matches('/');
    bare.parse().map_err(|_| {
        UsageError(format!(
            "--address: the agent cannot listen on {text:?}; give an IP address and port, such \
             as 127.0.0.1:4747 (port 0: one the system picks)"
        ))
    })
}

/// Reads and checks a job spec; `-` is standard input (JSON if it starts with `{`).
pub(crate) fn read_spec(file: &Path) -> anyhow::Result<wharf_state::Job> {
    let stdin = file == Path::new("-");
    let text = read_text(file)?;
    let json = if stdin {
        text.trim_start().starts_with('{')
    } else {
        file.extension().is_some_and(|e| e == "json")
    };
    let parsed = if json {
        wharf_state::spec::parse_json(&text)
    } else {
        wharf_state::spec::parse_toml(&text)
    };
    parsed.map_err(|e| {
        anyhow::Error::new(e).context(format!("{} is not a valid job spec", spec_name(file)))
    })
}

/// How messages name a job spec file.
fn spec_name(file: &Path) -> String {
    if file == Path::new("-") { "standard input".to_owned() } else { file.display().to_string() }
}

/// The text of a job spec file (`-`: standard input), or what keeps it from being read.
fn read_text(file: &Path) -> Result<String, SpecFileError> {
    let name = spec_name(file);
    let bytes = if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes).map(|_| bytes)
    } else {
        std::fs::read(file)
    };
    let bytes = bytes.map_err(|source| SpecFileError::Read { file: name.clone(), source })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        // Valid UTF-8 up to there, so the line and column count characters.
        let before = std::str::from_utf8(valid).unwrap_or_default();
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        SpecFileError::NotUtf8 {
            file: name,
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    })
}

fn validate(file: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let job = read_spec(file)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&job.to_spec())?);
    } else {
        let tasks: Vec<&str> =
            job.groups.iter().flat_map(|g| g.tasks.iter().map(|t| t.name.as_str())).collect();
        println!(
            "{}: job {:?} is valid ({} tasks: {})",
            file.display(),
            job.id,
            tasks.len(),
            tasks.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Submits the file; follows the allocation unless detached. With no agent reachable, runs an
/// embedded one in this process (only when following: a detached allocation needs an agent).
async fn run_file(
    client: &Client,
    args: &RunArgs,
    data_dir: Option<&Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let job = read_spec(&args.file)?;
    let spec = serde_json::to_vec(&job.to_spec())?;
    let mut embedded = None;
    let client = match client.reach().await {
        Ok(()) => client.clone(),
        Err(absent) if args.detach => {
            return Err(anyhow::Error::new(absent).context("a detached run needs a running agent"));
        }
        Err(_) => {
            let (local, handle) = crate::serve::embedded(node_config(None, data_dir)?).await?;
            embedded = Some(handle);
            local
        }
    };
    if let Some(id) = &args.id {
        wharf_state::check_alloc_id(id)?;
    }
    let path = ApiPath::v1(["allocations"]).query_opt("id", args.id.as_deref());
    let submitted: serde_json::Value = serde_json::from_slice(
        &client.call(Method::POST, &path, Some(("application/json", spec))).await?,
    )?;
    let id = submitted["id"].as_str().context("the agent returned no id")?.to_owned();
    if args.detach {
        if json {
            println!("{submitted}");
        } else {
            println!("{id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let outcome = follow(&client, &id, json).await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    outcome
}

/// Prints task events as they happen until the allocation is done. Ctrl-C stops it (its
/// poststop tasks still run); a second Ctrl-C leaves at once.
async fn follow(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    if !json {
        println!("==> allocation {id}");
    }
    let mut seen: BTreeSet<(String, u64, String)> = BTreeSet::new();
    let mut version = String::new();
    let mut interrupts = 0;
    loop {
        let path = ApiPath::v1(["allocations", id]).query("after", &version).query("wait", "10s");
        let detail: AllocDetail = tokio::select! {
            detail = client.json(Method::GET, &path, None) => detail?,
            _ = tokio::signal::ctrl_c() => {
                interrupts += 1;
                if interrupts > 1 {
                    return Ok(ExitCode::from(EXIT_INTERRUPTED));
                }
                if !json {
                    println!("==> stopping the allocation (Ctrl-C again to leave at once)");
                }
                client.call(Method::POST, ApiPath::v1(["allocations", id, "stop"]), None).await?;
                continue;
            }
        };
        version = detail.version.clone();
        print_new_events(&detail.state, &mut seen, json)?;
        if detail.done {
            if json {
                println!("{}", serde_json::to_string(&detail.state)?);
            } else {
                println!(
                    "==> allocation {}: {}",
                    detail.state.client_status, detail.state.client_description
                );
            }
            return Ok(match detail.state.client_status {
                ClientStatus::Complete => ExitCode::SUCCESS,
                _ => ExitCode::from(EXIT_ALLOC_FAILED),
            });
        }
    }
}

fn print_new_events(
    state: &AllocState,
    seen: &mut BTreeSet<(String, u64, String)>,
    json: bool,
) -> anyhow::Result<()> {
    let mut new: Vec<(Timestamp, &str, &wharf_state::TaskEvent)> = Vec::new();
    for (task, task_state) in &state.task_states {
        for event in &task_state.events {
            let key = (task.clone(), event.time.0, serde_json::to_string(&event.kind)?);
            if seen.insert(key) {
                new.push((event.time, task, event));
            }
        }
    }
    new.sort_by_key(|(time, _, _)| *time);
    let mut out = std::io::stdout().lock();
    for (time, task, event) in new {
        if json {
            writeln!(out, "{}", serde_json::json!({ "task": task, "event": event }))?;
        } else {
            writeln!(
                out,
                "    {}  {task:<12} {:<20} {}",
                clock_time(time),
                event.kind.title(),
                event.kind
            )?;
        }
    }
    Ok(())
}

/// `HH:MM:SS` of a timestamp, in UTC.
fn clock_time(time: Timestamp) -> String {
    time.to_string()[11..19].to_owned()
}

async fn wipe(
    config: Option<&Path>,
    data_dir: Option<&Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let config = node_config(config, data_dir)?;
    let wiped = crate::wipe::wipe(&config).await?;
    if json {
        let report = serde_json::json!({
            "agent_killed": wiped.agent_killed,
            "tasks_destroyed": wiped.tasks_destroyed,
        });
        println!("{report}");
    } else {
        println!(
            "wiped {}: {}, tasks destroyed: {}",
            config.data_dir.display(),
            if wiped.agent_killed { "agent killed" } else { "no agent running" },
            wiped.tasks_destroyed
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn alloc(
    client: &Client,
    command: AllocCommand,
    data_dir: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        AllocCommand::List { probe: true, config } => {
            let config = node_config(config.as_deref(), data_dir)?;
            crate::probe::print(client, &config).await
        }
        AllocCommand::Outcome { id } => {
            wharf_state::check_alloc_id(&id)?;
            // The runner-outcome protocol, printed in the grammar wharf-prober parses.
            let outcome = match client
                .json::<AllocDetail>(Method::GET, ApiPath::v1(["allocations", &id]), None)
                .await
            {
                Ok(detail) if detail.done => RunnerOutcome::status(
                    detail.state.client_status,
                    &detail.state.client_description,
                ),
                Ok(detail) => RunnerOutcome::status(detail.state.client_status, ""),
                Err(ClientError::Api { status, .. }) if status.as_u16() == 404 => {
                    RunnerOutcome::Unknown
                }
                Err(e) => return Err(e.into()),
            };
            println!("{outcome}");
            Ok(())
        }
        AllocCommand::List { probe: false, .. } => {
            let allocs: Vec<AllocSummary> =
                client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&allocs)?);
                return Ok(());
            }
            println!("{:<36}  {:<16}  {:<10}  {:<9}  TASKS", "ID", "JOB", "GROUP", "STATUS");
            for a in allocs {
                let tasks: Vec<String> = a.tasks.iter().map(|(n, s)| format!("{n}:{s}")).collect();
                println!(
                    "{:<36}  {:<16}  {:<10}  {:<9}  {}",
                    a.id,
                    a.job_id,
                    a.group,
                    a.client_status.to_string(),
                    tasks.join(" ")
                );
            }
            Ok(())
        }
        AllocCommand::Status { id } => {
            let id = resolve(client, &id).await?;
            let detail: AllocDetail =
                client.json(Method::GET, ApiPath::v1(["allocations", &id]), None).await?;
            // What its running tasks use; an allocation that is done has none.
            let stats: Option<crate::usage::AllocStats> = if detail.done {
                None
            } else {
                let path = ApiPath::v1(["allocations", &id, "stats"]);
                Some(client.json(Method::GET, path, None).await?)
            };
            if json {
                let mut value = serde_json::to_value(&detail)?;
                value["stats"] = serde_json::to_value(&stats)?;
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print_status(&detail);
                if let Some(stats) = stats.filter(|s| !s.tasks.is_empty()) {
                    println!();
                    println!("Resources:");
                    print!("{}", crate::usage::stats_text(&stats));
                }
            }
            Ok(())
        }
        AllocCommand::Logs { id, task, stderr, follow, tail } => {
            let id = resolve(client, &id).await?;
            let mut path = ApiPath::v1(["allocations", &id, "logs", &task])
                .query("stream", if stderr { "stderr" } else { "stdout" })
                .query_opt("tail", tail);
            if follow {
                // Followed from the start, unless only the tail is wanted.
                path = path.query("follow", true).query_opt("offset", tail.is_none().then_some(0));
            }
            let response = client.send(Method::GET, path, None).await?;
            let mut body = response.into_body();
            let mut out = std::io::stdout();
            while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
                if let Ok(data) = frame.context("the log stream broke")?.into_data() {
                    out.write_all(&data)?;
                    out.flush()?;
                }
            }
            Ok(())
        }
        AllocCommand::Stop { id, wait, exact } => {
            let wait = wait.as_deref().map(wharf_state::duration::parse).transpose()?;
            let id = if exact {
                wharf_state::check_alloc_id(&id)?;
                id
            } else {
                resolve(client, &id).await?
            };
            match client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await {
                Ok(_) => {}
                // Only an exact id can be unknown here: a resolved one was just listed.
                Err(ClientError::Api { status, .. }) if exact && status.as_u16() == 404 => {
                    return Err(UsageError(format!("no allocation {id:?} on this node")).into());
                }
                Err(e) => return Err(e.into()),
            }
            let Some(wait) = wait else {
                println!("stopping {id}");
                return Ok(());
            };
            let deadline = tokio::time::Instant::now() + wait;
            let mut version = String::new();
            let detail = loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let path = ApiPath::v1(["allocations", &id])
                    .query("after", &version)
                    .query("wait", Formatted(left.max(Duration::from_millis(1))));
                let detail: AllocDetail = client.json(Method::GET, &path, None).await?;
                if detail.done || left.is_zero() {
                    break detail;
                }
                version = detail.version.clone();
            };
            if !detail.done {
                return Err(
                    NotDone(format!("{id} is still stopping after {}", Formatted(wait))).into()
                );
            }
            println!("stopped {id}: {}", detail.state.client_status);
            Ok(())
        }
        AllocCommand::Restart { id, task, all } => {
            let id = resolve(client, &id).await?;
            let body = serde_json::json!({ "task": task, "all": all });
            client
                .call(
                    Method::POST,
                    ApiPath::v1(["allocations", &id, "restart"]),
                    Some(("application/json", body.to_string().into_bytes())),
                )
                .await?;
            println!(
                "restarting {}",
                task.as_deref().unwrap_or(if all { "every task" } else { "the running tasks" })
            );
            Ok(())
        }
        AllocCommand::Signal { id, signal, task } => {
            let id = resolve(client, &id).await?;
            let body = serde_json::json!({ "signal": signal, "task": task });
            client
                .call(
                    Method::POST,
                    ApiPath::v1(["allocations", &id, "signal"]),
                    Some(("application/json", body.to_string().into_bytes())),
                )
                .await?;
            Ok(())
        }
        AllocCommand::Exec { id, task, command, timeout } => {
            let id = resolve(client, &id).await?;
            let body = serde_json::json!({ "task": task, "command": command, "timeout": timeout });
            let result: ExecResponse = client
                .json(Method::POST, ApiPath::v1(["allocations", &id, "exec"]), Some(body))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print!("{}", result.stdout);
                eprint!("{}", result.stderr);
                if result.exit_code != 0 || result.signal.is_some() {
                    return Err(NotDone(format!(
                        "the command exited with code {}{}",
                        result.exit_code,
                        result.signal.map(|s| format!(" (signal {s})")).unwrap_or_default()
                    ))
                    .into());
                }
            }
            Ok(())
        }
    }
}

/// The allocation `given` names: the one with exactly that id, else the one id it is a
/// prefix of. The API itself takes exact ids only; prefixes are a convenience of the CLI.
async fn resolve(client: &Client, given: &str) -> anyhow::Result<String> {
    let allocs: Vec<AllocSummary> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    match_id(allocs.iter().map(|a| a.id.as_str()), given).map(str::to_owned)
}

/// An exact match always wins, so an id that begins another (`job-1`, `job-10`) is never
/// ambiguous; a prefix is taken only when it matches one id.
fn match_id<'a>(ids: impl Iterator<Item = &'a str>, given: &str) -> anyhow::Result<&'a str> {
    let mut matches = Vec::new();
    for id in ids {
        if id == given {
            return Ok(id);
        }
        if id.starts_with(given) {
            matches.push(id);
        }
    }
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(UsageError(format!("no allocation {given:?} on this node")).into()),
        many => Err(UsageError(format!(
            "{given:?} is not an allocation id, and {} ids start with it ({}); give more of the id",
            many.len(),
            many.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        ))
        .into()),
    }
}

async fn list_services(client: &Client, json: bool) -> anyhow::Result<()> {
    let services: Vec<wharf_state::ServiceEntry> =
        client.json(Method::GET, ApiPath::v1(["services"]), None).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&services)?);
        return Ok(());
    }
    println!(
        "{:<20} {:<22} {:<9} {:<20} {:<36} TASK",
        "NAME", "ADDRESS", "HEALTH", "TAGS", "ALLOCATION"
    );
    for service in services {
        let address = match (service.address, service.port) {
            (Some(ip), Some(port)) => std::net::SocketAddr::new(ip, port).to_string(),
            (Some(ip), None) => ip.to_string(),
            _ => "-".into(),
        };
        let tags = if service.tags.is_empty() { "-".into() } else { service.tags.join(",") };
        println!(
            "{:<20} {address:<22} {:<9} {tags:<20} {:<36} {}",
            service.name,
            service.health.to_string(),
            service.alloc_id,
            service.task
        );
    }
    Ok(())
}

/// How an allocation's health reads: judged (when, and why if unhealthy) or not yet.
fn health_line(state: &AllocState) -> String {
    let Some(status) = state.deployment_status.as_ref() else { return "not judged yet".into() };
    let when = status.timestamp.map(|t| format!(" at {t}")).unwrap_or_default();
    match (status.healthy, &status.description) {
        (Some(true), _) => format!("healthy{when}"),
        (Some(false), Some(reason)) => format!("unhealthy{when}: {reason}"),
        (Some(false), None) => format!("unhealthy{when}"),
        (None, _) => "not judged yet".into(),
    }
}

fn print_status(detail: &AllocDetail) {
    let (alloc, state) = (&detail.alloc, &detail.state);
    println!("ID       = {}", alloc.id);
    println!("Job      = {} (group {})", alloc.job.id, alloc.task_group);
    println!("Desired  = {:?}", alloc.desired_status);
    println!("Status   = {}: {}", state.client_status, state.client_description);
    println!("Health   = {}", health_line(state));
    if !alloc.ports.is_empty() {
        let ports: Vec<String> =
            alloc.ports.iter().map(|p| format!("{} {}", p.label, p.address())).collect();
        println!("Ports    = {}", ports.join(", "));
    }
    println!();
    println!(
        "{:<16} {:<8} {:<8} {:<24} {:<24}",
        "TASK", "STATE", "RESTARTS", "STARTED", "FINISHED"
    );
    for (name, task) in &state.task_states {
        let status =
            if task.failed { format!("{} (failed)", task.status) } else { task.status.to_string() };
        let time = |t: Option<Timestamp>| t.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{name:<16} {status:<8} {:<8} {:<24} {:<24}",
            task.restarts,
            time(task.started_at),
            time(task.finished_at)
        );
    }
    if !detail.checks.is_empty() {
        println!();
        println!(
            "{:<16} {:<16} {:<20} {:<7} {:<9} OUTPUT",
            "TASK", "SERVICE", "CHECK", "TYPE", "STATUS"
        );
        for check in &detail.checks {
            let output = check.last.as_ref().map_or("waiting to run", |r| r.output.as_str());
            let first_line = output.lines().next().unwrap_or_default();
            let kind = serde_json::to_value(check.kind).ok();
            println!(
                "{:<16} {:<16} {:<20} {:<7} {:<9} {first_line}",
                check.task,
                check.service,
                check.check,
                kind.as_ref().and_then(|k| k.as_str()).unwrap_or("-"),
                check.status.to_string()
            );
        }
    }
    println!();
    println!("Recent events:");
    let mut events: Vec<(&String, &TaskState, &wharf_state::TaskEvent)> = state
        .task_states
        .iter()
        .flat_map(|(n, t)| t.events.iter().map(move |e| (n, t, e)))
        .collect();
    events.sort_by_key(|(_, _, e)| e.time);
    for (name, _, event) in events.iter().rev().take(20).rev() {
        println!("  {}  {name:<16} {:<20} {}", event.time, event.kind.title(), event.kind);
    }
}
