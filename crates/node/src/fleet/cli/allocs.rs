//! `wharf fleet allocs` and `wharf fleet stop`: the allocations the fleet knows, one line
//! each, and an allocation stopped (or cancelled while queued).

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::client::{ApiPath, Client};
use crate::fleet::api::FleetAlloc;
use hyper::Method;
use std::process::ExitCode;

/// `wharf fleet allocs`.
pub(super) async fn list(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let allocs: Vec<FleetAlloc> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    print_allocs(&allocs, json)?;
    Ok(ExitCode::SUCCESS)
}

/// `wharf fleet stop`: the allocation as it stands once the fleet took the stop.
pub(super) async fn stop(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let alloc: FleetAlloc =
        client.json(Method::POST, ApiPath::v1(["allocations", id, "stop"]), None).await?;
    print_allocs(&[alloc], json)?;
    Ok(ExitCode::SUCCESS)
}

/// One line per allocation: its id, its job, phase, worker and what it is doing or waiting
/// for.
pub(super) fn print_allocs(allocs: &[FleetAlloc], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(allocs)?);
        return Ok(());
    }
    println!("{:<36}  {:<20}  {:<9}  {:<20}  DETAIL", "ID", "JOB", "PHASE", "WORKER");
    for a in allocs {
        println!(
            "{:<36}  {:<20}  {:<9}  {:<20}  {}",
            a.id,
            a.job.as_deref().unwrap_or("-"),
            a.phase,
            a.worker.as_deref().unwrap_or("-"),
            a.detail.as_deref().or(a.waiting.as_deref()).unwrap_or("")
        );
    }
    Ok(())
}
