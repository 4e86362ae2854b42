//! `wharf fleet status [ID]`: the fleet (this replica, the leader, the replicas, the store),
//! or one allocation with its attempts.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use super::allocs::print_allocs;
use crate::client::{ApiPath, Client};
use crate::fleet::api::{FleetAlloc, FleetStatus};
use hyper::Method;
use std::process::ExitCode;
use wharf_fleet::WorkPhaseName;

/// `wharf fleet status`: who serves, who leads, and where the fleet keeps its state.
pub(super) async fn fleet(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let status: FleetStatus = client.json(Method::GET, ApiPath::v1(["status"]), None).await?;
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

/// `wharf fleet status ID`: the allocation's line, then its attempts.
pub(super) async fn alloc(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let alloc: FleetAlloc =
        client.json(Method::GET, ApiPath::v1(["allocations", id]), None).await?;
    print_allocs(std::slice::from_ref(&alloc), json)?;
    if !json {
        print_attempts(&alloc);
    }
    Ok(ExitCode::SUCCESS)
}

/// The allocation's attempts, oldest first, each with when and how it ended once it has: the
/// ones that are over, then the current one (Nomad's reschedule tracker, as `nomad alloc
/// status` shows it), whose outcome is its phase while it is under way.
pub(super) fn print_attempts(alloc: &FleetAlloc) {
    let row = |attempt: &dyn std::fmt::Display,
               runner_id: &str,
               worker: Option<&str>,
               (started, ended): (Option<&str>, Option<&str>),
               cost: &str,
               outcome: &str| {
        println!(
            "{attempt:<7}  {runner_id:<40}  {:<12}  {:<24}  {:<24}  {cost:<10}  {outcome}",
            worker.unwrap_or("-"),
            started.unwrap_or("-"),
            ended.unwrap_or("-"),
        );
    };
    // Worker time at the worker type's hourly price; "-" where the type has none.
    let cost = |cost: Option<f64>| cost.map_or_else(|| "-".to_owned(), |c| format!("{c:.6}"));
    println!();
    let heading = (Some("STARTED"), Some("ENDED"));
    row(&"ATTEMPT", "RUNNER ID", Some("WORKER"), heading, "COST", "OUTCOME");
    for a in &alloc.history {
        let (worker, times) = (a.worker.as_deref(), (a.started.as_deref(), Some(&*a.finished)));
        row(&a.attempt, &a.runner_id, worker, times, &cost(a.cost), &a.outcome);
    }
    let now = match (&alloc.outcome, &alloc.not_before, alloc.phase) {
        (Some(outcome), _, _) => outcome.clone(),
        (None, Some(at), WorkPhaseName::Queued) => format!("{}, not before {at}", alloc.phase),
        (None, _, phase) => phase.to_string(),
    };
    let times = (alloc.started.as_deref(), alloc.finished.as_deref());
    let worker = alloc.worker.as_deref();
    row(&alloc.attempt, &alloc.runner_id, worker, times, &cost(alloc.cost), &now);
}
