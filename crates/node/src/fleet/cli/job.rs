//! `wharf fleet job list|status|stop`: the fleet's work by job, as `wharf job` shows a node's.
//! A job is every allocation submitted with its spec, so the job id a user wrote is enough to
//! find, follow and stop what a submission started; `wharf fleet status` and `wharf fleet stop`
//! take a job id where no allocation has that id.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use super::allocs::print_allocs;
use super::status::print_attempts;
use crate::client::{ApiPath, Client, ClientError};
use crate::fleet::api::FleetAlloc;
use clap::Subcommand;
use hyper::{Method, StatusCode};
use std::collections::BTreeMap;
use std::process::ExitCode;
use wharf_fleet::WorkPhaseName;

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Every job the fleet knows: its status and how many allocations are in each phase.
    List,
    /// One job's allocations, each with its attempts and how they ended.
    Status {
        /// The job's id.
        job: String,
    },
    /// Stop every allocation of a job that is not done with (cancel those still queued).
    Stop {
        /// The job's id.
        job: String,
    },
}

/// Runs `wharf fleet job ...`.
pub(super) async fn job(
    client: &Client,
    command: JobCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        JobCommand::List => list(client, json).await,
        JobCommand::Status { job } => status(&of_job(client, &job).await?, json),
        JobCommand::Stop { job } => stop(client, &of_job(client, &job).await?, &job, json).await,
    }
}

/// The allocations of job `id`, oldest first; a 404 naming the jobs there are if none.
pub(super) async fn of_job(client: &Client, id: &str) -> anyhow::Result<Vec<FleetAlloc>> {
    let path = ApiPath::v1(["allocations"]).query("job", id);
    let found: Vec<FleetAlloc> = client.json(Method::GET, path, None).await?;
    if !found.is_empty() {
        return Ok(found);
    }
    let all: Vec<FleetAlloc> = client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    let jobs = lines(&all);
    let known: Vec<&str> = jobs.iter().map(|line| line.id.as_str()).collect();
    let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
    Err(ClientError::Api {
        status: StatusCode::NOT_FOUND,
        message: format!("no allocation or job {id:?} in the fleet (jobs: {known})"),
    }
    .into())
}

/// Whether `error` is the fleet's answer that no allocation has the id asked for.
pub(super) fn no_such_alloc(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<ClientError>(),
        Some(ClientError::Api { status: StatusCode::NOT_FOUND, .. })
    )
}

/// One line of `fleet job list`.
#[derive(Debug, serde::Serialize)]
struct JobLine {
    id: String,
    status: &'static str,
    allocations: BTreeMap<String, usize>,
}

/// Nomad's job status from its allocations' phases: `dead` once every one is done with,
/// `running` while any is starting or running, `pending` while all wait for a worker.
fn job_status<'a>(phases: impl Iterator<Item = &'a WorkPhaseName> + Clone) -> &'static str {
    if phases.clone().all(|phase| phase.is_final()) {
        "dead"
    } else if phases
        .clone()
        .any(|phase| matches!(phase, WorkPhaseName::Starting | WorkPhaseName::Running))
    {
        "running"
    } else {
        "pending"
    }
}

fn lines(allocs: &[FleetAlloc]) -> Vec<JobLine> {
    let mut by_job: BTreeMap<&str, Vec<&FleetAlloc>> = BTreeMap::new();
    for alloc in allocs {
        // Work found running carries no spec: it belongs to no job.
        if let Some(job) = &alloc.job {
            by_job.entry(job.as_str()).or_default().push(alloc);
        }
    }
    by_job
        .into_iter()
        .map(|(id, allocs)| {
            let mut counts = BTreeMap::new();
            for alloc in &allocs {
                *counts.entry(alloc.phase.to_string()).or_insert(0) += 1;
            }
            JobLine {
                id: id.to_owned(),
                status: job_status(allocs.iter().map(|a| &a.phase)),
                allocations: counts,
            }
        })
        .collect()
}

async fn list(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let allocs: Vec<FleetAlloc> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    let lines = lines(&allocs);
    if json {
        println!("{}", serde_json::to_string_pretty(&lines)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<32} {:<8} ALLOCATIONS", "ID", "STATUS");
    for line in lines {
        let counts: Vec<String> =
            line.allocations.iter().map(|(phase, n)| format!("{phase}={n}")).collect();
        println!("{:<32} {:<8} {}", line.id, line.status, counts.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}

/// `wharf fleet job status JOB` (and `wharf fleet status JOB`): the job's line, its
/// allocations, then each one's attempts.
pub(super) fn status(allocs: &[FleetAlloc], json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(allocs)?);
        return Ok(ExitCode::SUCCESS);
    }
    let line = &lines(allocs)[0];
    println!("ID     = {}", line.id);
    println!("Status = {}", line.status);
    println!();
    print_allocs(allocs, false)?;
    for alloc in allocs {
        println!();
        println!("Allocation {} ({})", alloc.id, alloc.group.as_deref().unwrap_or("-"));
        print_attempts(alloc);
    }
    Ok(ExitCode::SUCCESS)
}

/// `wharf fleet job stop JOB` (and `wharf fleet stop JOB`): every allocation not done with
/// is stopped.
pub(super) async fn stop(
    client: &Client,
    allocs: &[FleetAlloc],
    job: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut stopped = Vec::new();
    for alloc in allocs.iter().filter(|a| !a.is_final()) {
        let path = ApiPath::v1(["allocations", &alloc.id, "stop"]);
        client.call(Method::POST, path, None).await?;
        stopped.push(alloc.id.clone());
    }
    if json {
        println!("{}", serde_json::json!({ "job": job, "stopped": stopped }));
    } else {
        println!("job {job:?}: stopping {} allocation(s)", stopped.len());
    }
    Ok(ExitCode::SUCCESS)
}
