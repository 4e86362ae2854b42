//! The `wharf` command line: `agent`, `run`, `validate` and `alloc ...`.
//!
//! Exit codes: 0 success (for `run`: the allocation completed), 1 the allocation failed or was
//! lost, 2 bad usage or an invalid job spec, 3 the agent could not be reached or refused,
//! 130 interrupted twice.

// A command line's output is its interface.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::agent::StartOptions;
use crate::agent_file::AgentFile;
use crate::api::{AllocDetail, AllocSummary, ExecResponse};
use crate::client::{Client, ClientError};
use crate::config::NodeConfig;
use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use hyper::Method;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use wharf_state::{AllocState, ClientStatus, TaskState, Timestamp};

/// Exit code: the allocation failed or was lost.
pub const EXIT_ALLOC_FAILED: u8 = 1;
/// Exit code: bad usage or an invalid job spec.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the agent could not be reached or refused.
pub const EXIT_AGENT: u8 = 3;
/// Exit code: interrupted twice.
pub const EXIT_INTERRUPTED: u8 = 130;

/// wharf: run allocations on this node, and watch them.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
pub struct Cli {
    /// The agent's address [default: http://127.0.0.1:4747, or the one the agent of
    /// --data-dir announced].
    #[arg(long, global = true, env = "WHARF_ADDR")]
    address: Option<String>,
    /// The agent's data directory: its address is read from `agent.json` there, and
    /// `alloc list --probe` reads its store when it does not answer.
    #[arg(long, global = true, env = "WHARF_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The agent's API token, if it has one.
    #[arg(long, global = true, env = "WHARF_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent (HTTP API on 127.0.0.1:4747 by default).
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
    /// Run a fleet of agents (`wharf fleet`), or talk to one (`wharf fleet submit ...`).
    Fleet(crate::fleet::cli::FleetArgs),
    /// Kill the agent of --data-dir and every task it ran, and delete the directory: what
    /// destroying the machine would do (the fleet's loopback instances end this way).
    Wipe {
        /// Its configuration (for the data directory, unless --data-dir is given).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
struct AgentArgs {
    /// A TOML configuration file; without one, defaults apply.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Log JSON lines instead of human-readable text.
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
        /// The allocation id (a unique prefix will do).
        id: String,
    },
    /// Print a task's output.
    Logs {
        /// The allocation id.
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
        /// The allocation id.
        id: String,
        /// Wait this long (such as `10s`) for it to end; fail if it has not.
        #[arg(long)]
        wait: Option<String>,
    },
    /// Restart a task, the running tasks, or (with --all) every task.
    Restart {
        /// The allocation id.
        id: String,
        /// The task; without it, every running task.
        task: Option<String>,
        /// Restart the whole allocation, prestart tasks first.
        #[arg(long, conflicts_with = "task")]
        all: bool,
    },
    /// Send a signal to a task, or to every task.
    Signal {
        /// The allocation id.
        id: String,
        /// The signal, such as SIGHUP.
        signal: String,
        /// The task; without it, every task.
        #[arg(long)]
        task: Option<String>,
    },
    /// Run a command inside a task.
    Exec {
        /// The allocation id.
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
    let cli = Cli::parse();
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

/// The agent's address: as given, else as announced in the data directory, else the default.
fn agent_client(cli: &Cli) -> Client {
    const DEFAULT: &str = "http://127.0.0.1:4747";
    let (Some(data_dir), None) = (&cli.data_dir, &cli.address) else {
        return Client::new(cli.address.as_deref().unwrap_or(DEFAULT), cli.token.clone());
    };
    match AgentFile::read(data_dir) {
        Ok(Some(file)) => Client::new(&file.address, cli.token.clone()),
        Ok(None) => Client::absent(
            &format!("the agent of {}", data_dir.display()),
            "it has not announced an address (no agent.json there)".into(),
        ),
        Err(reason) => Client::absent(&format!("the agent of {}", data_dir.display()), reason),
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
        Command::Agent(args) => agent(args, data_dir).await.map(|()| ExitCode::SUCCESS),
        Command::Wipe { config } => wipe(config.as_deref(), data_dir, cli.json).await,
        Command::Fleet(args) => crate::fleet::cli::run(args, cli.token.clone(), cli.json).await,
        Command::Validate { file } => validate(&file, cli.json),
        Command::Run(args) => run_file(&client, &args, cli.json).await,
        Command::Alloc(command) => {
            alloc(&client, command, data_dir, cli.json).await.map(|()| ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|error| {
        let code = match error.downcast_ref::<ClientError>() {
            Some(ClientError::Api { status, .. }) if matches!(status.as_u16(), 400 | 409 | 422) => {
                EXIT_USAGE
            }
            Some(_) => EXIT_AGENT,
            None if error.downcast_ref::<wharf_state::SpecError>().is_some() => EXIT_USAGE,
            None if error.downcast_ref::<wharf_state::InvalidAllocId>().is_some() => EXIT_USAGE,
            None => EXIT_AGENT,
        };
        fail(code, &format!("{error:#}"))
    })
}

pub(crate) fn init_logs(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn agent(args: AgentArgs, data_dir: Option<&Path>) -> anyhow::Result<()> {
    init_logs(args.log_json);
    let config = node_config(args.config.as_deref(), data_dir)?;
    crate::serve::serve(config, StartOptions { reset_state: args.reset_state }).await
}

/// Reads and checks a job spec; `-` is standard input (JSON if it starts with `{`).
pub(crate) fn read_spec(file: &Path) -> anyhow::Result<wharf_state::Job> {
    let stdin = file == Path::new("-");
    let text = if stdin {
        std::io::read_to_string(std::io::stdin().lock()).context("cannot read standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
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
        anyhow::Error::new(e).context(format!("{} is not a valid job spec", file.display()))
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
async fn run_file(client: &Client, args: &RunArgs, json: bool) -> anyhow::Result<ExitCode> {
    let job = read_spec(&args.file)?;
    let spec = serde_json::to_vec(&job.to_spec())?;
    let mut embedded = None;
    let client = if client.reachable().await {
        client.clone()
    } else if args.detach {
        bail!(
            "no wharf agent answers at {}; start one with `wharf agent` (a detached run needs one)",
            client.address()
        );
    } else {
        let (local, handle) = crate::serve::embedded(NodeConfig::default()).await?;
        embedded = Some(handle);
        local
    };
    let path = match &args.id {
        Some(id) => {
            wharf_state::check_alloc_id(id)?;
            format!("/v1/allocations?id={id}")
        }
        None => "/v1/allocations".to_owned(),
    };
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
        let path = format!("/v1/allocations/{id}?after={version}&wait=10s");
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
                client.call(Method::POST, &format!("/v1/allocations/{id}/stop"), None).await?;
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
            let line = match client
                .json::<AllocDetail>(Method::GET, &format!("/v1/allocations/{id}"), None)
                .await
            {
                Ok(detail) if detail.done => {
                    format!("{} {}", detail.state.client_status, detail.state.client_description)
                }
                Ok(detail) => detail.state.client_status.to_string(),
                Err(ClientError::Api { status, .. }) if status.as_u16() == 404 => {
                    "unknown".to_owned()
                }
                Err(e) => return Err(e.into()),
            };
            // One line, whatever the description holds.
            println!("{}", line.replace('\n', " ").trim_end());
            Ok(())
        }
        AllocCommand::List { probe: false, .. } => {
            let allocs: Vec<AllocSummary> =
                client.json(Method::GET, "/v1/allocations", None).await?;
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
                client.json(Method::GET, &format!("/v1/allocations/{id}"), None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&detail)?);
            } else {
                print_status(&detail);
            }
            Ok(())
        }
        AllocCommand::Logs { id, task, stderr, follow, tail } => {
            let id = resolve(client, &id).await?;
            let stream = if stderr { "stderr" } else { "stdout" };
            let mut query = format!("stream={stream}");
            if let Some(tail) = tail {
                query.push_str(&format!("&tail={tail}"));
            }
            if follow {
                query.push_str(if tail.is_some() {
                    "&follow=true"
                } else {
                    "&follow=true&offset=0"
                });
            }
            let response = client
                .send(Method::GET, &format!("/v1/allocations/{id}/logs/{task}?{query}"), None)
                .await?;
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
        AllocCommand::Stop { id, wait } => {
            let wait = wait.as_deref().map(wharf_state::duration::parse).transpose()?;
            let id = resolve(client, &id).await?;
            client.call(Method::POST, &format!("/v1/allocations/{id}/stop"), None).await?;
            let Some(wait) = wait else {
                println!("stopping {id}");
                return Ok(());
            };
            let deadline = tokio::time::Instant::now() + wait;
            let mut version = String::new();
            let detail = loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let path = format!(
                    "/v1/allocations/{id}?after={version}&wait={}ms",
                    left.as_millis().max(1)
                );
                let detail: AllocDetail = client.json(Method::GET, &path, None).await?;
                if detail.done || left.is_zero() {
                    break detail;
                }
                version = detail.version.clone();
            };
            if !detail.done {
                bail!("{id} is still stopping after {}", wharf_state::duration::format(wait));
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
                    &format!("/v1/allocations/{id}/restart"),
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
                    &format!("/v1/allocations/{id}/signal"),
                    Some(("application/json", body.to_string().into_bytes())),
                )
                .await?;
            Ok(())
        }
        AllocCommand::Exec { id, task, command, timeout } => {
            let id = resolve(client, &id).await?;
            let body = serde_json::json!({ "task": task, "command": command, "timeout": timeout });
            let result: ExecResponse = client
                .json(Method::POST, &format!("/v1/allocations/{id}/exec"), Some(body))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print!("{}", result.stdout);
                eprint!("{}", result.stderr);
                if result.exit_code != 0 || result.signal.is_some() {
                    bail!(
                        "the command exited with code {}{}",
                        result.exit_code,
                        result.signal.map(|s| format!(" (signal {s})")).unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
    }
}

/// Expands a unique prefix of an allocation id.
async fn resolve(client: &Client, prefix: &str) -> anyhow::Result<String> {
    let allocs: Vec<AllocSummary> = client.json(Method::GET, "/v1/allocations", None).await?;
    let matches: Vec<&AllocSummary> = allocs.iter().filter(|a| a.id.starts_with(prefix)).collect();
    match matches.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => bail!("no allocation id starts with {prefix:?}"),
        many => bail!("{} allocations start with {prefix:?}; give more of the id", many.len()),
    }
}

fn print_status(detail: &AllocDetail) {
    let (alloc, state) = (&detail.alloc, &detail.state);
    println!("ID       = {}", alloc.id);
    println!("Job      = {} (group {})", alloc.job.id, alloc.task_group);
    println!("Desired  = {:?}", alloc.desired_status);
    println!("Status   = {}: {}", state.client_status, state.client_description);
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
