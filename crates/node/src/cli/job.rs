//! `wharf job list|status|stop`: the node's work by job, as Nomad's users think of it. A job
//! is every allocation that runs it, whether it came through wharf's API or Nomad's, so a job
//! id is enough to find, follow and stop what a submission started.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::api::AllocSummary;
use crate::client::{ApiPath, Client, ClientError};
use clap::Subcommand;
use hyper::{Method, StatusCode};
use std::collections::BTreeMap;
use std::process::ExitCode;
use wharf_state::ClientStatus;

#[derive(Debug, Subcommand)]
pub(crate) enum JobCommand {
    /// Every job on the node: its status and how many allocations are in each state.
    List,
    /// One job's allocations: group, desired and client status, each task's status.
    Status {
        /// The job's id.
        job: String,
    },
    /// Stop every allocation of a job (and a Nomad job of that id: it is marked stopped).
    Stop {
        /// The job's id.
        job: String,
    },
}

/// Runs `wharf job ...`.
pub(crate) async fn job(
    client: &Client,
    command: JobCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let allocs: Vec<AllocSummary> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    match command {
        JobCommand::List => list(&allocs, json),
        JobCommand::Status { job } => status(&of_job(&allocs, &job)?, json),
        JobCommand::Stop { job } => stop(client, &of_job(&allocs, &job)?, &job, json).await,
    }
    .map(|()| ExitCode::SUCCESS)
}

/// The allocations of job `id`, oldest first; an error naming the jobs there are if none.
fn of_job(allocs: &[AllocSummary], id: &str) -> anyhow::Result<Vec<AllocSummary>> {
    let found: Vec<AllocSummary> = allocs.iter().filter(|a| a.job_id == id).cloned().collect();
    if found.is_empty() {
        let mut known: Vec<&str> = allocs.iter().map(|a| a.job_id.as_str()).collect();
        known.sort_unstable();
        known.dedup();
        let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
        return Err(ClientError::Api {
            status: StatusCode::NOT_FOUND,
            message: format!("no job {id:?} on this node (jobs: {known})"),
        }
        .into());
    }
    Ok(found)
}

/// One line of `job list`.
#[derive(Debug, serde::Serialize)]
struct JobLine {
    id: String,
    status: &'static str,
    allocations: BTreeMap<String, usize>,
}

fn lines(allocs: &[AllocSummary]) -> Vec<JobLine> {
    let mut by_job: BTreeMap<&str, Vec<&AllocSummary>> = BTreeMap::new();
    for alloc in allocs {
        by_job.entry(alloc.job_id.as_str()).or_default().push(alloc);
    }
    by_job
        .into_iter()
        .map(|(id, allocs)| {
            let stopped =
                allocs.iter().all(|a| a.desired_status != wharf_state::DesiredStatus::Run);
            let mut counts = BTreeMap::new();
            for alloc in &allocs {
                *counts.entry(alloc.client_status.to_string()).or_insert(0) += 1;
            }
            JobLine {
                id: id.to_owned(),
                status: wharf_nomad::shapes::job_status(
                    stopped,
                    allocs.iter().map(|a| a.client_status),
                ),
                allocations: counts,
            }
        })
        .collect()
}

fn list(allocs: &[AllocSummary], json: bool) -> anyhow::Result<()> {
    let lines = lines(allocs);
    if json {
        println!("{}", serde_json::to_string_pretty(&lines)?);
        return Ok(());
    }
    println!("{:<32} {:<8} ALLOCATIONS", "ID", "STATUS");
    for line in lines {
        let counts: Vec<String> =
            line.allocations.iter().map(|(status, n)| format!("{status}={n}")).collect();
        println!("{:<32} {:<8} {}", line.id, line.status, counts.join(" "));
    }
    Ok(())
}

fn status(allocs: &[AllocSummary], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(allocs)?);
        return Ok(());
    }
    let line = &lines(allocs)[0];
    println!("ID     = {}", line.id);
    println!("Status = {}", line.status);
    println!();
    println!("{:<36} {:<12} {:<8} {:<9} TASKS", "ALLOCATION", "GROUP", "DESIRED", "STATUS");
    for alloc in allocs {
        let tasks: Vec<String> =
            alloc.tasks.iter().map(|(name, status)| format!("{name}={status}")).collect();
        let desired = wharf_nomad::shapes::desired_status(alloc.desired_status);
        println!(
            "{:<36} {:<12} {desired:<8} {:<9} {}",
            alloc.id,
            alloc.group,
            alloc.client_status.to_string(),
            tasks.join(" ")
        );
        if alloc.client_status == ClientStatus::Failed && !alloc.description.is_empty() {
            println!("  {}", alloc.description);
        }
    }
    Ok(())
}

async fn stop(
    client: &Client,
    allocs: &[AllocSummary],
    job: &str,
    json: bool,
) -> anyhow::Result<()> {
    // A Nomad job of this id is marked stopped too, so that Nomad's clients see it so.
    match client.call(Method::DELETE, ApiPath::v1(["job", job]), None).await {
        Ok(_) | Err(ClientError::Api { status: StatusCode::NOT_FOUND, .. }) => {}
        Err(error) => return Err(error.into()),
    }
    let mut stopped = Vec::new();
    for alloc in allocs.iter().filter(|a| a.desired_status == wharf_state::DesiredStatus::Run) {
        client.call(Method::POST, ApiPath::v1(["allocations", &alloc.id, "stop"]), None).await?;
        stopped.push(alloc.id.clone());
    }
    if json {
        println!("{}", serde_json::json!({ "job": job, "stopped": stopped }));
    } else {
        println!("job {job:?}: stopping {} allocation(s)", stopped.len());
    }
    Ok(())
}
