//! `wharf service list`: the services of the node's running tasks, from its catalog.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::client::{ApiPath, Client};
use clap::Subcommand;
use hyper::Method;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub(crate) enum ServiceCommand {
    /// List the services with their address, port, tags and health.
    List,
}

/// Runs `wharf service ...`.
pub(crate) async fn service(
    client: &Client,
    command: ServiceCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let ServiceCommand::List = command;
    list(client, json).await.map(|()| ExitCode::SUCCESS)
}

async fn list(client: &Client, json: bool) -> anyhow::Result<()> {
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
