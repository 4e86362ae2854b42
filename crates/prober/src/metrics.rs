//! The pool's Prometheus metrics, rendered as text exposition format.
//!
//! Names follow the reference dispatcher's under the `wharf_prober_` prefix, changed only where
//! Prometheus' own linter (`promtool check metrics`) objects: counters end in `_total`
//! (`boot_outcomes_total`, `instances_disappeared_total`) and gauges do not (the reference's
//! `instances_total` gauge is `instances`). `runners_running` stands for `containers_running`
//! and `instances_time_to_ready_seconds` for the time to ready. Summaries export `_sum` and
//! `_count`. CI runs promtool on this text (`tests/tests/prober_metrics.rs`).

use crate::worker::{BootOutcome, IdleBehavior, State, WorkerView};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// A running sum and count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Summary {
    pub(crate) sum: f64,
    pub(crate) count: u64,
}

impl Summary {
    pub(crate) fn observe(&mut self, value: Duration) {
        self.sum += value.as_secs_f64();
        self.count += 1;
    }
}

/// Counters the pool keeps between scrapes.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) boot_outcomes: BTreeMap<BootOutcome, u64>,
    pub(crate) disappeared: BTreeMap<State, u64>,
    pub(crate) time_to_ready: Summary,
    pub(crate) run_probe_ok: Summary,
    pub(crate) run_probe_fail: Summary,
    pub(crate) probes: [u64; 3],
    pub(crate) destroy_failures: u64,
}

/// Index into [`Counters::probes`].
pub(crate) const PASSED: usize = 0;
pub(crate) const FAILED: usize = 1;
pub(crate) const SKIPPED: usize = 2;

/// What a scrape shows about the workers right now.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    pub(crate) by_category: BTreeMap<Category, u64>,
    /// The hourly price of the instances of each category (of their types' prices).
    pub(crate) price_by_category: BTreeMap<Category, f64>,
    pub(crate) by_state: BTreeMap<State, u64>,
    pub(crate) runners_running: u64,
    pub(crate) probe_age_max: f64,
    pub(crate) probe_age_median: f64,
    pub(crate) brake_engaged: bool,
    pub(crate) at_quota: bool,
}

/// Where an instance counts in the `instances` gauge (Arvados' categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Category {
    /// Running or starting work.
    InUse,
    /// On hold, without work.
    Hold,
    /// Booting.
    Booting,
    /// Found by a list, not yet probed.
    Unknown,
    /// Booted, without work.
    Idle,
    /// Being destroyed.
    Shutdown,
}

impl Category {
    /// Every category, in the order the gauge lists them.
    pub(crate) const ALL: [Category; 6] = [
        Category::InUse,
        Category::Hold,
        Category::Booting,
        Category::Unknown,
        Category::Idle,
        Category::Shutdown,
    ];

    /// The label value: the one spelling of it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Category::InUse => "inuse",
            Category::Hold => "hold",
            Category::Booting => "booting",
            Category::Unknown => "unknown",
            Category::Idle => "idle",
            Category::Shutdown => "shutdown",
        }
    }

    /// The category of the worker seen in `view`.
    pub(crate) fn of(view: &WorkerView) -> Category {
        match view.state {
            State::Shutdown => Category::Shutdown,
            _ if !view.running.is_empty() || !view.starting.is_empty() => Category::InUse,
            _ if view.idle_behavior == IdleBehavior::Hold => Category::Hold,
            State::Booting => Category::Booting,
            State::Unknown => Category::Unknown,
            _ => Category::Idle,
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP wharf_prober_{name} {help}");
    let _ = writeln!(out, "# TYPE wharf_prober_{name} {kind}");
}

fn summary(out: &mut String, name: &str, labels: &str, value: &Summary) {
    let _ = writeln!(out, "wharf_prober_{name}_sum{labels} {}", value.sum);
    let _ = writeln!(out, "wharf_prober_{name}_count{labels} {}", value.count);
}

pub(crate) fn render(counters: &Counters, gauges: &Gauges) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "instances",
        "gauge",
        "Instances by category: inuse, hold, booting, unknown, idle, shutdown.",
    );
    for category in Category::ALL {
        let n = gauges.by_category.get(&category).copied().unwrap_or(0);
        let name = category.as_str();
        let _ = writeln!(out, "wharf_prober_instances{{category=\"{name}\"}} {n}");
    }
    header(
        &mut out,
        "instances_price",
        "gauge",
        "Hourly price of the instances by category, at their types' prices now.",
    );
    for category in Category::ALL {
        let price = gauges.price_by_category.get(&category).copied().unwrap_or(0.0);
        let name = category.as_str();
        let _ = writeln!(out, "wharf_prober_instances_price{{category=\"{name}\"}} {price}");
    }
    header(&mut out, "workers", "gauge", "Workers by state.");
    for state in State::ALL {
        let n = gauges.by_state.get(&state).copied().unwrap_or(0);
        let _ = writeln!(out, "wharf_prober_workers{{state=\"{state}\"}} {n}");
    }
    header(&mut out, "runners_running", "gauge", "Runners the workers run.");
    let _ = writeln!(out, "wharf_prober_runners_running {}", gauges.runners_running);
    header(
        &mut out,
        "probe_age_seconds_max",
        "gauge",
        "Longest time since a worker's last successful probe.",
    );
    let _ = writeln!(out, "wharf_prober_probe_age_seconds_max {}", gauges.probe_age_max);
    header(
        &mut out,
        "probe_age_seconds_median",
        "gauge",
        "Median time since a worker's last successful probe.",
    );
    let _ = writeln!(out, "wharf_prober_probe_age_seconds_median {}", gauges.probe_age_median);
    header(&mut out, "boot_outcomes_total", "counter", "Boot outcomes, one per worker.");
    for outcome in BootOutcome::ALL {
        let n = counters.boot_outcomes.get(&outcome).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "wharf_prober_boot_outcomes_total{{outcome=\"{}\"}} {n}",
            outcome.as_str()
        );
    }
    header(
        &mut out,
        "instances_disappeared_total",
        "counter",
        "Instances that vanished from the list, by their last state.",
    );
    for state in State::ALL {
        let n = counters.disappeared.get(&state).copied().unwrap_or(0);
        let _ = writeln!(out, "wharf_prober_instances_disappeared_total{{state=\"{state}\"}} {n}");
    }
    header(
        &mut out,
        "instances_time_to_ready_seconds",
        "summary",
        "Time from first contact to ready, for instances this prober created.",
    );
    summary(&mut out, "instances_time_to_ready_seconds", "", &counters.time_to_ready);
    header(
        &mut out,
        "instances_run_probe_duration_seconds",
        "summary",
        "Run probe durations by outcome.",
    );
    summary(
        &mut out,
        "instances_run_probe_duration_seconds",
        "{outcome=\"success\"}",
        &counters.run_probe_ok,
    );
    summary(
        &mut out,
        "instances_run_probe_duration_seconds",
        "{outcome=\"fail\"}",
        &counters.run_probe_fail,
    );
    header(
        &mut out,
        "probes_total",
        "counter",
        "Probes by result; skipped means one was still in flight.",
    );
    for (index, result) in ["passed", "failed", "skipped"].iter().enumerate() {
        let _ = writeln!(
            out,
            "wharf_prober_probes_total{{result=\"{result}\"}} {}",
            counters.probes[index]
        );
    }
    header(
        &mut out,
        "destroy_failures_total",
        "counter",
        "Destroy calls the cloud refused (retried by sync).",
    );
    let _ = writeln!(out, "wharf_prober_destroy_failures_total {}", counters.destroy_failures);
    header(
        &mut out,
        "fleet_brake_engaged",
        "gauge",
        "1 while too many workers fail at once and shutdowns for unresponsiveness are held.",
    );
    let _ = writeln!(out, "wharf_prober_fleet_brake_engaged {}", u8::from(gauges.brake_engaged));
    header(&mut out, "at_quota", "gauge", "1 while creates are held for quota.");
    let _ = writeln!(out, "wharf_prober_at_quota {}", u8::from(gauges.at_quota));
    out
}
