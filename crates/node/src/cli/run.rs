//! `wharf run`: a job spec submitted to the agent (or, with none reachable, to one started in
//! this process) and followed until its allocation ends; Ctrl-C stops it.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use super::common::{EXIT_ALLOC_FAILED, EXIT_INTERRUPTED, node_config, read_spec};
use crate::api::AllocDetail;
use crate::client::{ApiPath, Client};
use anyhow::Context;
use clap::Args;
use hyper::Method;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use wharf_state::{AllocState, ClientStatus, Timestamp};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The job spec; `-` reads it from standard input.
    pub(crate) file: PathBuf,
    /// Submit and print the allocation id without following it.
    #[arg(long)]
    pub(crate) detach: bool,
    /// Run it under this allocation id (`[A-Za-z0-9_-]{1,64}`) instead of a new one. The same
    /// job submitted again under the same id is accepted once, so a retry is safe.
    #[arg(long)]
    pub(crate) id: Option<String>,
}

/// Submits the file; follows the allocation unless detached. With no agent reachable, runs an
/// embedded one in this process (only when following: a detached allocation needs an agent).
pub(crate) async fn run(
    client: &Client,
    args: &RunArgs,
    data_dir: Option<&Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let job = read_spec(&args.file)?;
    let spec = serde_json::to_vec(&job.to_spec())?;
    let mut embedded = None;
    let client = match client.reach().await {
        Ok(()) => client.clone(),
        Err(absent) if args.detach => {
            return Err(anyhow::Error::new(absent).context("a detached run needs a running agent"));
        }
        Err(_) => {
            let (local, handle) = crate::serve::embedded(node_config(None, data_dir)?).await?;
            embedded = Some(handle);
            local
        }
    };
    if let Some(id) = &args.id {
        wharf_state::check_alloc_id(id)?;
    }
    let path = ApiPath::v1(["allocations"]).query_opt("id", args.id.as_deref());
    let submitted: serde_json::Value = serde_json::from_slice(
        &client.call(Method::POST, &path, Some(("application/json", spec))).await?,
    )?;
    let id = submitted["id"].as_str().context("the agent returned no id")?.to_owned();
    if args.detach {
        if json {
            println!("{submitted}");
        } else {
            println!("{id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let outcome = follow(&client, &id, json).await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    outcome
}

/// Prints task events as they happen until the allocation is done. Ctrl-C stops it (its
/// poststop tasks still run); a second Ctrl-C leaves at once.
async fn follow(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    if !json {
        println!("==> allocation {id}");
    }
    let mut seen: BTreeSet<(String, u64, String)> = BTreeSet::new();
    let mut version = String::new();
    let mut interrupts = 0;
    loop {
        let path = ApiPath::v1(["allocations", id]).query("after", &version).query("wait", "10s");
        let detail: AllocDetail = tokio::select! {
            detail = client.json(Method::GET, &path, None) => detail?,
            _ = tokio::signal::ctrl_c() => {
                interrupts += 1;
                if interrupts > 1 {
                    return Ok(ExitCode::from(EXIT_INTERRUPTED));
                }
                if !json {
                    println!("==> stopping the allocation (Ctrl-C again to leave at once)");
                }
                client.call(Method::POST, ApiPath::v1(["allocations", id, "stop"]), None).await?;
                continue;
            }
        };
        version = detail.version.clone();
        print_new_events(&detail.state, &mut seen, json)?;
        if detail.done {
            if json {
                println!("{}", serde_json::to_string(&detail.state)?);
            } else {
                println!(
                    "==> allocation {}: {}",
                    detail.state.client_status, detail.state.client_description
                );
            }
            return Ok(match detail.state.client_status {
                ClientStatus::Complete => ExitCode::SUCCESS,
                _ => ExitCode::from(EXIT_ALLOC_FAILED),
            });
        }
    }
}

fn print_new_events(
    state: &AllocState,
    seen: &mut BTreeSet<(String, u64, String)>,
    json: bool,
) -> anyhow::Result<()> {
    let mut new: Vec<(Timestamp, &str, &wharf_state::TaskEvent)> = Vec::new();
    for (task, task_state) in &state.task_states {
        for event in &task_state.events {
            let key = (task.clone(), event.time.0, serde_json::to_string(&event.kind)?);
            if seen.insert(key) {
                new.push((event.time, task, event));
            }
        }
    }
    new.sort_by_key(|(time, _, _)| *time);
    let mut out = std::io::stdout().lock();
    for (time, task, event) in new {
        if json {
            writeln!(out, "{}", serde_json::json!({ "task": task, "event": event }))?;
        } else {
            writeln!(
                out,
                "    {}  {task:<12} {:<20} {}",
                clock_time(time),
                event.kind.title(),
                event.kind
            )?;
        }
    }
    Ok(())
}

/// `HH:MM:SS` of a timestamp, in UTC.
fn clock_time(time: Timestamp) -> String {
    time.to_string()[11..19].to_owned()
}
