//! Rows of figures and the Markdown they become.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};
use wharf_state::Timestamp;

/// Whether a larger figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Better {
    Higher,
    Lower,
}

/// One measured figure.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) unit: &'static str,
    pub(crate) better: Better,
    /// wharf's figure, once per run.
    pub(crate) samples: Vec<f64>,
    /// The figure of the thing compared against, measured in the same run.
    pub(crate) baseline: Option<(String, Vec<f64>)>,
    /// What the figure should reach.
    pub(crate) target: Option<String>,
}

pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
}

pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn spread(samples: &[f64]) -> String {
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if samples.len() < 2 { "-".into() } else { format!("{}–{}", figure(min), figure(max)) }
}

fn figure(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

impl Report {
    pub(crate) fn new(rows: Vec<Row>) -> Report {
        Report { rows }
    }

    pub(crate) fn markdown(&self, quick: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# wharf benchmarks\n");
        if quick {
            let _ = writeln!(
                out,
                "**Quick run: sizes cut down, one run each. These numbers mean nothing.**\n"
            );
        }
        let _ = writeln!(out, "Written by `cargo xtask bench`. {}\n", machine());
        let _ = writeln!(
            out,
            "| figure | wharf (median) | spread | compared with | its figure | ratio | target |"
        );
        let _ = writeln!(out, "|---|---:|---:|---|---:|---:|---|");
        for row in &self.rows {
            let ours = median(&row.samples);
            let (peer, theirs, ratio) = match &row.baseline {
                Some((name, samples)) => {
                    let theirs = median(samples);
                    let ratio = match row.better {
                        Better::Higher => ours / theirs,
                        Better::Lower => theirs / ours,
                    };
                    (
                        name.as_str(),
                        format!("{} {}", figure(theirs), row.unit),
                        format!("{ratio:.1}x"),
                    )
                }
                None => ("-", "-".into(), "-".into()),
            };
            let _ = writeln!(
                out,
                "| {} | {} {} | {} | {peer} | {theirs} | {ratio} | {} |",
                row.name,
                figure(ours),
                row.unit,
                spread(&row.samples),
                row.target.as_deref().unwrap_or("-"),
            );
        }
        let _ = writeln!(
            out,
            "\nRatios are wharf's advantage: above 1.0x wharf is better, whichever way the unit points."
        );
        out
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown memory".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format!(
        "Machine: {cores} cores, {memory}, Linux {}. Date: {}.",
        kernel.trim(),
        &Timestamp::from_unix(now).to_string()[..10]
    )
}
