//! The benchmark runner behind `cargo xtask bench`: runs every scenario a few times, and
//! prints (and with `--out`, writes) a Markdown table of medians, spreads, baselines measured
//! in the same run, ratios and targets.
//!
//! `--quick` runs each scenario once with small sizes and checks that it produced figures;
//! CI runs it so the benchmarks never rot. Its numbers mean nothing.

#![allow(clippy::print_stdout, clippy::print_stderr, clippy::disallowed_methods)]

mod alloc;
mod build;
mod cgroups;
mod exec;
mod fleet;
mod health;
mod heap;
mod isolated;
mod node;
mod peers;
mod prober;
mod report;
mod scratch;
mod store;

use report::{Report, Row};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

/// How hard a run pushes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Effort {
    /// Repetitions of each measurement; the table shows their median and spread.
    pub(crate) runs: usize,
    /// A multiplier on each scenario's size: 1.0 for a full run.
    pub(crate) scale: f64,
}

impl Effort {
    pub(crate) fn scaled(&self, full: usize) -> usize {
        ((full as f64 * self.scale) as usize).max(1)
    }
}

const USAGE: &str = "usage: wharf-bench [--quick] [--out FILE] [--only build|store|alloc|exec|isolated|cgroups|node|peers|health|fleet|prober]";

fn main() -> ExitCode {
    let mut quick = false;
    let mut out = None;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    if let [flag, port] = &std::env::args().skip(1).collect::<Vec<_>>()[..]
        && flag == "--serve-http"
    {
        health::serve_http(port);
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = args.next().map(PathBuf::from),
            "--only" => only = args.next(),
            other => {
                eprintln!("unknown argument {other:?}; {USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let effort =
        if quick { Effort { runs: 1, scale: 0.02 } } else { Effort { runs: 5, scale: 1.0 } };

    type Scenario = fn(Effort) -> Result<Vec<Row>, String>;
    let scenarios: [(&str, Scenario); 11] = [
        ("build", build::run),
        ("store", |effort| Ok(store::run(effort))),
        ("alloc", alloc::run),
        ("exec", exec::run),
        ("isolated", isolated::run),
        ("cgroups", cgroups::run),
        ("node", node::run),
        ("peers", peers::run),
        ("health", health::run),
        ("fleet", fleet::run),
        ("prober", prober::run),
    ];
    if let Some(only) = &only
        && !scenarios.iter().any(|(name, _)| name == only)
    {
        eprintln!("unknown scenario {only:?}; {USAGE}");
        return ExitCode::from(2);
    }
    let mut rows: Vec<Row> = Vec::new();
    // A scenario that cannot run fails the bench (quick runs included), after the others ran.
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        match scenario(effort) {
            Ok(scenario_rows) => rows.extend(scenario_rows),
            Err(error) => {
                eprintln!("the {name} scenario failed: {error}");
                failed.push(name);
            }
        }
    }
    scratch::remove_all();
    let report = Report::new(rows);
    let text = report.markdown(quick);
    println!("{text}");
    if !failed.is_empty() {
        eprintln!("scenarios that failed: {}", failed.join(", "));
        return ExitCode::FAILURE;
    }
    if let Some(missing) = report.rows.iter().find(|r| r.samples.is_empty()) {
        eprintln!("scenario {:?} produced no figures", missing.name);
        return ExitCode::FAILURE;
    }
    if let Some(out) = out {
        if let Err(e) = std::fs::write(&out, &text) {
            eprintln!("cannot write {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", out.display());
    }
    ExitCode::SUCCESS
}
