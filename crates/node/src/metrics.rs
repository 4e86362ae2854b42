//! Counters for `/v1/metrics`, written in Prometheus' text format by hand (a handful of
//! series do not need a metrics library).

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use wharf_driver::ExitResult;
use wharf_task::{HookContext, TaskHook};

/// The agent's counters. Gauges (allocations by status) are read at scrape time.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Allocations accepted through the API.
    pub allocs_submitted: AtomicU64,
    /// Task starts (every run, restarts included).
    pub task_starts: AtomicU64,
    /// Task restarts of allocations garbage-collected since the agent started; the restarts
    /// of the allocations it manages are read from their task states at scrape time.
    pub collected_task_restarts: AtomicU64,
    /// Task runs that ended unsuccessfully.
    pub task_failures: AtomicU64,
    /// How long the last restore took, in microseconds.
    pub restore_micros: AtomicU64,
    /// Allocations restored at the last start.
    pub restored_allocs: AtomicU64,
    /// Check runs of allocations garbage-collected since the agent started, so that the
    /// total of check runs never goes down.
    pub collected_check_runs: AtomicU64,
}

/// One sample line's worth: name, help, type, value.
type Series<'a> = (&'a str, &'a str, &'a str, f64);

/// A labelled series: name, help, type, and `(labels, value)` samples.
pub type Labelled<'a> = (&'a str, &'a str, &'a str, Vec<(String, f64)>);

impl Metrics {
    /// The text exposition: the counters, then `extra` (gauges and labelled series the caller
    /// reads at scrape time).
    pub fn render(&self, extra: &[Series<'_>], labelled: &[Labelled<'_>]) -> String {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        let mut series: Vec<Series<'_>> = vec![
            (
                "wharf_allocs_submitted_total",
                "Allocations accepted through the API.",
                "counter",
                load(&self.allocs_submitted),
            ),
            (
                "wharf_task_starts_total",
                "Task runs started, restarts included.",
                "counter",
                load(&self.task_starts),
            ),
            (
                "wharf_task_failures_total",
                "Task runs that ended unsuccessfully.",
                "counter",
                load(&self.task_failures),
            ),
            (
                "wharf_restore_seconds",
                "How long restoring allocations took at the last start.",
                "gauge",
                load(&self.restore_micros) / 1e6,
            ),
            (
                "wharf_restored_allocs",
                "Allocations restored at the last start.",
                "gauge",
                load(&self.restored_allocs),
            ),
        ];
        series.extend_from_slice(extra);
        let mut out = String::new();
        for (name, help, kind, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        for (name, help, kind, samples) in labelled {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
        out
    }
}

/// A label value escaped as the text format requires: backslash, double quote, newline.
pub fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Prometheus labels `name="value",...`, with values escaped as the text format requires.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A task hook that counts starts and failed runs.
#[derive(Debug)]
pub struct MetricsHook(pub Arc<Metrics>);

#[async_trait::async_trait]
impl TaskHook for MetricsHook {
    fn name(&self) -> &str {
        "metrics"
    }

    async fn poststart(&self, _ctx: HookContext<'_>) -> Result<(), wharf_task::TaskError> {
        self.0.task_starts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn exited(&self, _ctx: HookContext<'_>, exit: &ExitResult) {
        if !exit.successful() {
            self.0.task_failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let metrics = Metrics::default();
        metrics.task_starts.fetch_add(3, Ordering::Relaxed);
        let text = metrics.render(
            &[("wharf_store_commits_total", "Commits.", "counter", 7.0)],
            &[(
                "wharf_allocs",
                "Allocations by status.",
                "gauge",
                vec![("status=\"running\"".into(), 2.0)],
            )],
        );
        assert!(
            text.contains("# TYPE wharf_task_starts_total counter\nwharf_task_starts_total 3\n"),
            "{text}"
        );
        assert!(text.contains("wharf_store_commits_total 7\n"));
        assert!(text.contains("wharf_allocs{status=\"running\"} 2\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            labels(&[("check", "service: \"web\" check"), ("path", "a\\b\nc")]),
            r#"check="service: \"web\" check",path="a\\b\nc""#
        );
    }
}
