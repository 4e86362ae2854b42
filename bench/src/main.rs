//! The benchmark runner behind `cargo xtask bench`: runs every scenario a few times, and
//! prints a Markdown table of medians, spreads, baselines measured in the same run, ratios,
//! targets and whether each was met, then the list of misses. With `--out PAGE` it also
//! appends the run to the history kept beside the page (`history`) and writes the page from
//! every kept run: the medians across runs, and their misses, which end the output.
//!
//! `--quick` runs each scenario once with small sizes and checks that it produced figures;
//! CI runs it so the benchmarks never rot. Its numbers mean nothing: it prints its verdicts
//! but never fails on a miss, and keeps no history. A full run does not fail on a miss either
//! (misses are reported, not hidden); a row that could not be measured, or whose target does
//! not apply to it, fails its scenario.

#![allow(clippy::print_stdout, clippy::print_stderr, clippy::disallowed_methods)]

mod alloc;
mod build;
mod cgroups;
mod channel;
mod container;
mod effort;
mod exec;
mod figure;
mod fleet;
mod health;
mod heap;
mod history;
mod isolated;
mod node;
mod peers;
mod prober;
mod report;
mod scratch;
mod store;
mod target;

pub(crate) use effort::Effort;
use report::{Report, Row};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

const USAGE: &str = "usage: wharf-bench [--quick | --out PAGE | --render PAGE] [--only build|store|alloc|exec|isolated|container|cgroups|node|peers|health|fleet|prober|channel]";

fn main() -> ExitCode {
    let mut quick = false;
    let mut out = None;
    let mut only: Option<String> = None;
    let mut render = None;
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
            "--render" => render = args.next().map(PathBuf::from),
            other => {
                eprintln!("unknown argument {other:?}; {USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(page) = render {
        // The page again from the kept runs, measuring nothing: after a run was taken out of
        // the history by hand, or the page's layout changed.
        return match write_page(&page, &history::beside(&page)) {
            Ok(misses) => {
                println!("{misses}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    if cfg!(debug_assertions) && out.is_some() {
        eprintln!(
            "a debug build's numbers are not kept: `cargo xtask bench` runs the bench in release mode"
        );
        return ExitCode::from(2);
    }
    if quick && out.is_some() {
        eprintln!(
            "a quick run's numbers mean nothing: it keeps no history and writes no page; {USAGE}"
        );
        return ExitCode::from(2);
    }
    let effort =
        if quick { Effort { runs: 1, scale: 0.02 } } else { Effort { runs: 5, scale: 1.0 } };

    type Scenario = fn(Effort) -> Result<Vec<Row>, String>;
    let scenarios: [(&str, Scenario); 13] = [
        ("build", build::run),
        ("store", store::run),
        ("alloc", alloc::run),
        ("exec", exec::run),
        ("isolated", isolated::run),
        ("container", container::run),
        ("cgroups", cgroups::run),
        ("node", node::run),
        ("peers", peers::run),
        ("health", health::run),
        ("fleet", fleet::run),
        ("prober", prober::run),
        ("channel", channel::run),
    ];
    if let Some(only) = &only
        && !scenarios.iter().any(|(name, _)| name == only)
    {
        eprintln!("unknown scenario {only:?}; {USAGE}");
        return ExitCode::from(2);
    }
    // The code is named before it is measured: a commit made during the run is not this run's.
    let code = out.as_deref().and_then(|page| history::code_of(&directory_of(page)));
    let mut rows: Vec<Row> = Vec::new();
    // A scenario that cannot run fails the bench (quick runs included), after the others ran.
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let checked = scenario(effort).and_then(|scenario_rows| {
            scenario_rows.iter().try_for_each(Row::check)?;
            Ok(scenario_rows)
        });
        match checked {
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
    if let Some(out) = out {
        match keep(&report, &out, code) {
            // The misses across the kept runs end the output, as they end the page.
            Ok(misses) => println!("# Across the kept runs\n\n{misses}"),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// Appends this run (of `code`) to the history beside `page`, then writes the page from every
/// kept run; returns the page's list of misses. The page is made before the history changes, so a run
/// that cannot be reported leaves the history as it was.
fn keep(report: &Report, page: &std::path::Path, code: Option<String>) -> Result<String, String> {
    let path = history::beside(page);
    let run = history::Run::new(&report.rows, report::now(), report::machine(), code);
    let mut runs = history::load(&path)?;
    runs.push(run.clone());
    let (text, misses) = history::page(&runs, &file_name(&path))?;
    history::append(&path, &run)?;
    std::fs::write(page, text).map_err(|e| format!("cannot write {}: {e}", page.display()))?;
    eprintln!(
        "kept the run in {} ({} runs) and wrote {}",
        path.display(),
        runs.len(),
        page.display()
    );
    Ok(misses)
}

/// Writes `page` from the runs kept in `history`; returns its list of misses.
fn write_page(page: &std::path::Path, history: &std::path::Path) -> Result<String, String> {
    let runs = history::load(history)?;
    if runs.is_empty() {
        return Err(format!("{} keeps no run to report", history.display()));
    }
    let (text, misses) = history::page(&runs, &file_name(history))?;
    std::fs::write(page, text).map_err(|e| format!("cannot write {}: {e}", page.display()))?;
    eprintln!("wrote {} from its history ({} runs kept)", page.display(), runs.len());
    Ok(misses)
}

/// The directory `path` is in, `.` for a bare file name.
fn directory_of(path: &std::path::Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    }
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
