//! `wharf fleet workers` and the operator's actions on one worker (`hold`, `drain`, `run`,
//! `kill`, `probe`).

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::client::{ApiPath, Client};
use crate::fleet::api::FleetWorker;
use anyhow::Context;
use hyper::Method;
use std::process::ExitCode;
use std::time::Duration;
use wharf_state::duration::Formatted;

/// `wharf fleet workers`: one line per worker, with what it has, what is used, its hourly
/// price where its type has one, and its allocations.
pub(super) async fn list(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let workers: Vec<FleetWorker> =
        client.json(Method::GET, ApiPath::v1(["workers"]), None).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&workers)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<20}  {:<8}  {:<5}  {:>10}  {:>15}  {:>17}  {:>5}  {:>8}  {:<24}  ERROR",
        "WORKER",
        "STATE",
        "IDLE",
        "PROBED",
        "CPU USED/ALL",
        "MEMORY USED/ALL",
        "CORES",
        "PRICE/H",
        "ALLOCATIONS"
    );
    for w in workers {
        // To a tenth of a second, as people read it: "4.2s", "1m5.3s".
        let tenths = (w.last_probe_seconds.max(0.0) * 10.0).round() as u64;
        let probed = Formatted(Duration::from_millis(tenths * 100)).to_string();
        // Used of all it has, or just used where its runner has not said.
        let of = |used: u64, all: Option<u64>, unit: &str| {
            let all = all.map_or_else(|| "?".to_owned(), |all| all.to_string());
            format!("{used}/{all} {unit}").trim_end().to_owned()
        };
        let has = w.resources;
        let price = w.price_per_hour.map_or_else(|| "-".to_owned(), |p| p.to_string());
        println!(
            "{:<20}  {:<8}  {:<5}  {:>10}  {:>15}  {:>17}  {:>5}  {:>8}  {:<24}  {}",
            w.id,
            w.state,
            w.idle_behavior,
            probed,
            of(w.used.cpu_mhz, has.map(|h| h.cpu_mhz), "MHz"),
            of(w.used.memory_mb, has.map(|h| h.memory_mb), "MB"),
            of(u64::from(w.used.cores), has.map(|h| u64::from(h.cores)), ""),
            price,
            w.allocations.join(","),
            w.last_error.unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// An operator's `action` on `worker` (the API's `POST /v1/workers/{id}/{action}`).
pub(super) async fn act(client: &Client, worker: &str, action: &str) -> anyhow::Result<ExitCode> {
    client
        .call(Method::POST, ApiPath::v1(["workers", worker, action]), None)
        .await
        .with_context(|| format!("cannot {action} worker {worker}"))?;
    println!("worker {worker}: {action}");
    Ok(ExitCode::SUCCESS)
}
