//! `wharf wipe`: the command over [`crate::wipe`], which kills the agent of a data directory
//! and every task it ran, and deletes the directory.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use super::common::{GlobalFlags, node_config};
use std::path::Path;
use std::process::ExitCode;

/// Wipes the data directory of `config` (or `--data-dir`), and says what it found there.
pub(crate) async fn wipe(
    config: Option<&Path>,
    flags: GlobalFlags<'_>,
) -> anyhow::Result<ExitCode> {
    let config = node_config(config, flags.data_dir)?;
    let wiped = crate::wipe::wipe(&config).await?;
    if flags.json {
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
