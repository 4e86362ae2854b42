//! `wharf fleet` with no subcommand: one replica of the fleet, configured from its file and
//! the global flags, served until SIGTERM or SIGINT ([`crate::fleet::serve`]).

use crate::cli::common::{GlobalFlags, UsageError, init_logs, listen_address};
use crate::fleet::config::FleetConfig;
use std::path::Path;
use std::process::ExitCode;

/// Runs the fleet with the configuration of `path` (or the defaults) under the global flags.
pub(super) async fn serve(
    path: Option<&Path>,
    log_json: bool,
    flags: GlobalFlags<'_>,
) -> anyhow::Result<ExitCode> {
    init_logs(log_json);
    let config = fleet_config(path, flags)?;
    crate::fleet::serve(config).await?;
    Ok(ExitCode::SUCCESS)
}

/// The fleet's configuration: `--config` (or the defaults), then the global flags over it.
fn fleet_config(path: Option<&Path>, flags: GlobalFlags<'_>) -> anyhow::Result<FleetConfig> {
    let mut config = match path {
        Some(path) => FleetConfig::load(path).map_err(UsageError)?,
        None => FleetConfig::default(),
    };
    if let Some(address) = flags.address {
        config.bind = listen_address(address)?;
    }
    if let Some(data_dir) = flags.data_dir {
        config.data_dir = data_dir.to_owned();
    }
    if let Some(token) = flags.token {
        config.token = Some(token.to_owned());
    }
    config.check().map_err(|problem| UsageError(format!("invalid configuration: {problem}")))?;
    Ok(config)
}
