//! `wharf fleet submit`: a job spec given to the fleet, and followed from phase to phase
//! until its allocation is done with (`--detach`: only its id).

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::cli::common::{EXIT_ALLOC_FAILED, read_spec};
use crate::client::{ApiPath, Client};
use crate::fleet::api::FleetAlloc;
use hyper::Method;
use std::path::Path;
use std::process::ExitCode;
use wharf_fleet::WorkPhaseName;
use wharf_prober::RunnerOutcome;

/// Submits `file` under `id` (or a new one); follows it unless `detach`.
pub(super) async fn submit(
    client: &Client,
    file: &Path,
    detach: bool,
    id: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let job = read_spec(file)?;
    let spec = serde_json::to_vec(&job.to_spec())?;
    if let Some(id) = id {
        wharf_state::check_alloc_id(id)?;
    }
    let path = ApiPath::v1(["allocations"]).query_opt("id", id);
    let body = client.call(Method::POST, &path, Some(("application/json", spec))).await?;
    let alloc: FleetAlloc = serde_json::from_slice(&body)?;
    if detach {
        if json {
            println!("{}", serde_json::to_string(&alloc)?);
        } else {
            println!("{}", alloc.id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    follow(client, alloc, json).await
}

/// Prints each change of phase until the allocation is done with; succeeds if it completed.
async fn follow(client: &Client, mut alloc: FleetAlloc, json: bool) -> anyhow::Result<ExitCode> {
    let mut shown: Option<(WorkPhaseName, Option<String>)> = None;
    loop {
        let now = (alloc.phase, alloc.worker.clone());
        if shown.as_ref() != Some(&now) {
            if json {
                println!("{}", serde_json::to_string(&alloc)?);
            } else {
                let on = alloc.worker.as_deref().map(|w| format!(" on {w}")).unwrap_or_default();
                let detail = alloc.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
                println!("==> {} {}{on}{detail}", alloc.id, alloc.phase);
            }
            shown = Some(now);
        }
        if alloc.is_final() {
            let complete = alloc.phase == WorkPhaseName::Ended
                && alloc.detail.as_deref().is_some_and(|d| RunnerOutcome::parse(d).completed());
            return Ok(if complete {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_ALLOC_FAILED)
            });
        }
        let path = ApiPath::v1(["allocations", &alloc.id])
            .query("after", alloc.version)
            .query("wait", "10s");
        alloc = client.json(Method::GET, path, None).await?;
    }
}
