//! The `wharf` command line: `agent`, `run`, `validate`, `alloc ...`, `job ...`, `node status`,
//! `service list`, `var ...`, `wipe`, and `fleet ...` ([`crate::fleet::cli`]).
//!
//! This module parses the command line and hands each subcommand to its own module, with the
//! agent's client and the global flags; what they all share ([`common`]: exit codes, errors,
//! logging, job specs) is imported by each, never taken from here.
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

mod agent;
mod alloc;
pub mod common;
mod image;
mod job;
mod node;
mod probe_channel;
mod run;
mod service;
mod validate;
pub(crate) mod var;
mod wipe;

pub use common::{
    EXIT_AGENT, EXIT_ALLOC_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, describe, exit_code,
};

use crate::client::Client;
use crate::config::NodeConfig;
use clap::{Parser, Subcommand};
use common::GlobalFlags;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
    #[command(after_help = agent::AGENT_SETTINGS)]
    Agent(agent::AgentArgs),
    /// Submit a job spec and follow the allocation until it ends (Ctrl-C stops it).
    Run(run::RunArgs),
    /// Check a job spec without running it.
    Validate {
        /// The job spec (TOML, or JSON ending in .json).
        file: PathBuf,
    },
    /// Inspect and control allocations.
    #[command(subcommand)]
    Alloc(alloc::AllocCommand),
    /// The node's work by job: list jobs, show one's allocations, stop one.
    #[command(subcommand)]
    Job(job::JobCommand),
    /// Inspect the node.
    #[command(subcommand)]
    Node(node::NodeCommand),
    /// The services of the node's running tasks.
    #[command(subcommand)]
    Service(service::ServiceCommand),
    /// The node's variables, which task templates read (`nomadVar`, `key`).
    #[command(subcommand)]
    Var(var::VarCommand),
    /// The container driver's images on the node.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Run a fleet of agents (`wharf fleet`), or talk to one (`wharf fleet submit ...`).
    #[command(after_help = crate::fleet::cli::FLEET_SETTINGS)]
    Fleet(crate::fleet::cli::FleetArgs),
    /// Answer a prober's run probes and starts over standard input and output, one request a
    /// line, until standard input ends (the prober's probe channel).
    #[command(hide = true)]
    ProbeChannel,
    /// Make one HTTP call to the agent, read from standard input, and write its answer to
    /// standard output (`wharf_node::agent_relay`): how a fleet that reaches this worker over
    /// SSH alone forwards Nomad's client calls to its agent.
    #[command(hide = true)]
    AgentRelay,
    /// Kill the agent of --data-dir and every task it ran, and delete the directory: what
    /// destroying the machine would do (the fleet's loopback instances end this way).
    Wipe {
        /// Its configuration (for the data directory, unless --data-dir is given).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse().normalized();
    // The servers (the agent, the fleet) spread their work over the cores; every other
    // command, the probe channel among them, is one client's sequence of calls, which a
    // single thread runs without handing each wake-up to another thread.
    let mut builder = match cli.command {
        Command::Agent(_) | Command::Fleet(_) => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(EXIT_AGENT, &format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(run(cli))
}

impl Cli {
    /// `WHARF_ADDR=` unsets, as people expect of an empty variable; so do the others.
    fn normalized(mut self) -> Cli {
        self.address = self.address.filter(|a| !a.is_empty());
        self.data_dir = self.data_dir.filter(|d| !d.as_os_str().is_empty());
        self.token = self.token.filter(|t| !t.is_empty());
        self
    }
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
    client_for(cli.address.as_deref(), cli.data_dir.as_deref(), cli.token.clone())
}

fn client_for(address: Option<&str>, data_dir: Option<&Path>, token: Option<String>) -> Client {
    const DEFAULT: &str = "http://127.0.0.1:4747";
    match (data_dir, address) {
        (Some(data_dir), None) => Client::of_data_dir(data_dir, token),
        (Some(data_dir), Some(address)) => Client::new(address, token).with_token_of(data_dir),
        (None, Some(address)) => Client::new(address, token),
        (None, None) => Client::new(DEFAULT, token).with_token_of(&NodeConfig::default().data_dir),
    }
}

/// A probe channel's request, parsed as the command line it stands for, if the channel serves
/// it (`probe_channel`).
fn channel_request(words: Vec<String>) -> Option<probe_channel::Asked> {
    use clap::{CommandFactory, FromArgMatches};
    use probe_channel::Wanted;
    // Built once: building the parser costs more than parsing a request with it.
    static PARSER: std::sync::LazyLock<parking_lot::Mutex<clap::Command>> =
        std::sync::LazyLock::new(|| parking_lot::Mutex::new(Cli::command()));
    let words = std::iter::once("wharf".to_owned()).chain(words);
    let matches = PARSER.lock().try_get_matches_from_mut(words).ok()?;
    let cli = Cli::from_arg_matches(&matches).ok()?.normalized();
    let wanted = match cli.command {
        Command::Alloc(alloc::AllocCommand::List { probe: true, config }) => {
            Wanted::ProbeList { config }
        }
        Command::Run(args) if args.detach && args.file == Path::new("-") => Wanted::Start(args),
        _ => return None,
    };
    let (address, data_dir, token) = (cli.address, cli.data_dir, cli.token);
    let for_client = (address.clone(), data_dir.clone(), token.clone());
    Some(probe_channel::Asked {
        address,
        data_dir,
        token,
        fleet_term: cli.fleet_term,
        json: cli.json,
        wanted,
        new_client: Box::new(move || {
            let (address, data_dir, token) = for_client;
            client_for(address.as_deref(), data_dir.as_deref(), token)
        }),
    })
}

/// Hands the subcommand to its module, and turns a failure into its message and exit code.
async fn run(cli: Cli) -> ExitCode {
    let client = agent_client(&cli);
    let flags = GlobalFlags {
        address: cli.address.as_deref(),
        data_dir: cli.data_dir.as_deref(),
        token: cli.token.as_deref(),
        json: cli.json,
    };
    let (data_dir, json) = (flags.data_dir, flags.json);
    let result = match cli.command {
        Command::Agent(args) => agent::agent(args, flags).await.map(|()| ExitCode::SUCCESS),
        Command::Wipe { config } => wipe::wipe(config.as_deref(), flags).await,
        Command::Fleet(args) => crate::fleet::cli::run(args, flags).await,
        Command::ProbeChannel => probe_channel::serve(channel_request).await,
        Command::AgentRelay => {
            let limit = crate::config::NodeConfig::default().max_body_bytes;
            let stdio =
                probe_channel::Stdio::take(0).and_then(|i| Ok((i, probe_channel::Stdio::take(1)?)));
            match stdio {
                Ok((input, output)) => crate::agent_relay::serve(&client, input, output, limit)
                    .await
                    .map(|()| ExitCode::SUCCESS),
                Err(error) => Err(error),
            }
        }
        Command::Validate { file } => validate::validate(&file, json),
        Command::Run(args) => run::run(&client, &args, data_dir, json).await,
        Command::Alloc(command) => {
            alloc::alloc(&client, command, data_dir, json).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Job(command) => job::job(&client, command, json).await,
        Command::Node(command) => node::node(&client, command, json).await,
        Command::Service(command) => service::service(&client, command, json).await,
        Command::Var(command) => var::var(&client, command, json).await,
        Command::Image(command) => image::image(&client, command, json).await,
    };
    result.unwrap_or_else(|error| fail(exit_code(&error), &describe(&error)))
}

#[cfg(test)]
mod tests {
    use super::channel_request;
    use super::probe_channel::Wanted;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    /// The channel parses every request with one parser built once: a request it refuses
    /// leaves nothing behind for the next, and each request's flags are its own.
    #[test]
    fn channel_requests_are_parsed_one_by_one_with_one_parser() {
        let first = channel_request(words("--data-dir /d1 --fleet-term 3 run --detach - --id a1"))
            .expect("a detached start is served");
        assert_eq!((first.data_dir.as_deref(), first.fleet_term), (Some("/d1".as_ref()), Some(3)));
        assert!(matches!(&first.wanted, Wanted::Start(args) if args.id.as_deref() == Some("a1")));

        assert!(channel_request(words("run --detach - --bogus")).is_none(), "a usage error");
        assert!(channel_request(words("alloc list")).is_none(), "not a probe: not served");

        let second = channel_request(words("--json run --detach - --id b2")).unwrap();
        assert_eq!((second.data_dir, second.fleet_term, second.json), (None, None, true));
        assert!(matches!(&second.wanted, Wanted::Start(args) if args.id.as_deref() == Some("b2")));

        let probe = channel_request(words("--data-dir /d2 alloc list --probe")).unwrap();
        assert!(matches!(probe.wanted, Wanted::ProbeList { config: None }));
        assert_eq!(probe.data_dir.as_deref(), Some("/d2".as_ref()));
    }
}
