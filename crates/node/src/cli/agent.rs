//! `wharf agent`: the node agent, configured from its file, its environment and the global
//! flags, served until SIGTERM or SIGINT ([`crate::serve`]).

use super::common::{GlobalFlags, init_logs, listen_address, node_config};
use crate::agent::StartOptions;
use clap::Args;
use std::path::PathBuf;

/// How `wharf agent` combines its sources of settings.
pub(crate) const AGENT_SETTINGS: &str = "\
Settings: a flag overrides its environment variable (WHARF_ADDR, WHARF_DATA_DIR, WHARF_TOKEN), \
which overrides the --config file, which overrides the defaults (data in ./wharf-data, API on \
127.0.0.1:4747). --address, --data-dir and --token set the file's `bind`, `data_dir` and \
`token`. Every API call but /v1/health needs the token; with none set, the agent makes one at \
its first start and keeps it in agent-token in its data directory, readable by its user \
alone, where the other commands find it through --data-dir.";

#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
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

/// Runs the agent until it is told to stop.
pub(crate) async fn agent(args: AgentArgs, flags: GlobalFlags<'_>) -> anyhow::Result<()> {
    init_logs(args.log_json || flags.json);
    let mut config = node_config(args.config.as_deref(), flags.data_dir)?;
    if let Some(address) = flags.address {
        config.bind = listen_address(address)?;
    }
    if let Some(token) = flags.token {
        config.token = Some(token.to_owned());
    }
    crate::serve::serve(config, StartOptions { reset_state: args.reset_state }).await
}
