//! `wharf node status`: what the node has, keeps, gives and has left, and its drivers.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::client::{ApiPath, Client};
use crate::usage::NodeStatus;
use clap::Subcommand;
use hyper::Method;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub(crate) enum NodeCommand {
    /// Show the node's CPU and memory, what it keeps for itself, what allocations hold, what
    /// is free, how tasks are contained, and each driver's health.
    Status {
        /// One line for a prober: what the node can give work in all
        /// (`cpu_mhz=... memory_mb=... cores=...`), then what is free now (`free_cpu_mhz=...`).
        #[arg(long)]
        probe: bool,
    },
}

/// Runs `wharf node ...`.
pub(crate) async fn node(
    client: &Client,
    command: NodeCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let NodeCommand::Status { probe } = command;
    let status: NodeStatus = client.json(Method::GET, ApiPath::v1(["node"]), None).await?;
    if probe {
        println!("{}", crate::usage::probe_line(&status));
    } else if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", crate::usage::node_text(&status));
    }
    Ok(ExitCode::SUCCESS)
}
