//! The agent's metrics for `/v1/metrics`: its counters, the allocation gauges tallied at
//! scrape time ([`AllocTally`]), and a small typed writer of Prometheus' text exposition
//! format 0.0.4 ([`Family`], [`render`]) that every series of the agent goes through, the
//! node's and the tasks' ([`crate::usage`]) included.
//!
//! Why a writer of our own and not the `prometheus-client` crate: its encoder writes
//! OpenMetrics text only (`# EOF`, counters named without `_total` in `# TYPE`, a full stop
//! added to each help text), which is not the text the agent serves and `promtool check
//! metrics` checks (docs/ARCHITECTURE.md says more).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use wharf_driver::ExitResult;
use wharf_state::{AllocState, CheckState, CheckStatus, ClientStatus};
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

impl Metrics {
    /// The counters kept here, in the order they open the page.
    pub fn families(&self) -> Vec<Family<'static>> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        vec![
            Family::single(
                "wharf_allocs_submitted_total",
                "Allocations accepted through the API.",
                MetricKind::Counter,
                load(&self.allocs_submitted),
            ),
            Family::single(
                "wharf_task_starts_total",
                "Task runs started, restarts included.",
                MetricKind::Counter,
                load(&self.task_starts),
            ),
            Family::single(
                "wharf_task_failures_total",
                "Task runs that ended unsuccessfully.",
                MetricKind::Counter,
                load(&self.task_failures),
            ),
            Family::single(
                "wharf_restore_seconds",
                "How long restoring allocations took at the last start.",
                MetricKind::Gauge,
                load(&self.restore_micros) / 1e6,
            ),
            Family::single(
                "wharf_restored_allocs",
                "Allocations restored at the last start.",
                MetricKind::Gauge,
                load(&self.restored_allocs),
            ),
        ]
    }
}

/// What a metric family is, as its `# TYPE` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (a restart of the agent aside); its name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

impl std::fmt::Display for MetricKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
        })
    }
}

/// One metric family: its name, help text, kind, and samples, each with its labels
/// (`name="value",...`, escaped as [`labels`] does; empty for none) and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Family<'a> {
    /// The metric's name.
    pub name: &'a str,
    /// What it measures, for `# HELP`.
    pub help: &'a str,
    /// Counter or gauge.
    pub kind: MetricKind,
    /// `(labels, value)` for each sample; a family may have none.
    pub samples: Vec<(String, f64)>,
}

impl<'a> Family<'a> {
    /// A family of one sample without labels.
    pub fn single(name: &'a str, help: &'a str, kind: MetricKind, value: f64) -> Family<'a> {
        Family { name, help, kind, samples: vec![(String::new(), value)] }
    }

    /// A family of labelled samples.
    pub fn labelled(
        name: &'a str,
        help: &'a str,
        kind: MetricKind,
        samples: Vec<(String, f64)>,
    ) -> Family<'a> {
        Family { name, help, kind, samples }
    }
}

/// The text exposition of `families`, in their order: for each, its `# HELP` and `# TYPE`
/// lines, then a line per sample.
pub fn render(families: &[Family<'_>]) -> String {
    let mut out = String::new();
    for Family { name, help, kind, samples } in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = if labels.is_empty() {
                writeln!(out, "{name} {value}")
            } else {
                writeln!(out, "{name}{{{labels}}} {value}")
            };
        }
    }
    out
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

/// The allocation gauges, tallied one allocation at a time from its state and its checks'
/// latest results: allocations by client status and by health, checks by status, and
/// whether each check passes. Every status and health has its series from zero, so a
/// dashboard sees `lost 0` rather than no series at all.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocTally {
    by_status: BTreeMap<String, f64>,
    by_health: BTreeMap<&'static str, f64>,
    checks: BTreeMap<String, f64>,
    passing: Vec<(String, f64)>,
}

impl Default for AllocTally {
    fn default() -> AllocTally {
        use ClientStatus::{Complete, Failed, Lost, Pending, Running};
        let statuses = [Pending, Running, Complete, Failed, Lost];
        let checks = [
            CheckStatus::Passing,
            CheckStatus::Warning,
            CheckStatus::Critical,
            CheckStatus::Pending,
        ];
        AllocTally {
            by_status: statuses.iter().map(|s| (s.to_string(), 0.0)).collect(),
            by_health: [HEALTHY, UNHEALTHY, NOT_JUDGED].into_iter().map(|h| (h, 0.0)).collect(),
            checks: checks.iter().map(|s| (s.to_string(), 0.0)).collect(),
            passing: Vec::new(),
        }
    }
}

/// The `health` label of an allocation judged healthy.
const HEALTHY: &str = "healthy";
/// The `health` label of an allocation judged unhealthy.
const UNHEALTHY: &str = "unhealthy";
/// The `health` label of an allocation not judged (yet, or ever: it is in no deployment).
const NOT_JUDGED: &str = "unknown";

impl AllocTally {
    /// Counts allocation `alloc_id`, with `state`, and its `checks`.
    pub fn add(&mut self, alloc_id: &str, state: &AllocState, checks: &[CheckState]) {
        *self.by_status.entry(state.client_status.to_string()).or_default() += 1.0;
        let health = match state.deployment_status.as_ref().and_then(|d| d.healthy) {
            Some(true) => HEALTHY,
            Some(false) => UNHEALTHY,
            None => NOT_JUDGED,
        };
        *self.by_health.entry(health).or_default() += 1.0;
        for check in checks {
            *self.checks.entry(check.status.to_string()).or_default() += 1.0;
            let labels = labels(&[
                ("alloc_id", alloc_id),
                ("task", &check.task),
                ("service", &check.service),
                ("check", &check.check),
            ]);
            self.passing.push((labels, f64::from(u8::from(check.status == CheckStatus::Passing))));
        }
    }

    /// The tally as its four families.
    pub fn families(self) -> Vec<Family<'static>> {
        fn by(
            label: &str,
            counts: impl IntoIterator<Item = (impl AsRef<str>, f64)>,
        ) -> Vec<(String, f64)> {
            counts.into_iter().map(|(value, n)| (labels(&[(label, value.as_ref())]), n)).collect()
        }
        vec![
            Family::labelled(
                "wharf_allocs",
                "Allocations on this node by client status.",
                MetricKind::Gauge,
                by("status", self.by_status),
            ),
            Family::labelled(
                "wharf_alloc_health",
                "Allocations on this node by health: healthy, unhealthy, or not judged.",
                MetricKind::Gauge,
                by("health", self.by_health),
            ),
            Family::labelled(
                "wharf_checks",
                "Checks of the allocations' services by their latest status.",
                MetricKind::Gauge,
                by("status", self.checks),
            ),
            Family::labelled(
                "wharf_check_passing",
                "Whether each check's latest run passed (1) or not (0).",
                MetricKind::Gauge,
                self.passing,
            ),
        ]
    }
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
        let mut families = metrics.families();
        families.push(Family::single(
            "wharf_store_commits_total",
            "Commits.",
            MetricKind::Counter,
            7.0,
        ));
        families.push(Family::labelled(
            "wharf_allocs",
            "Allocations by status.",
            MetricKind::Gauge,
            vec![("status=\"running\"".into(), 2.0)],
        ));
        let text = render(&families);
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

    /// Every family on the page is a `# HELP` line, a `# TYPE` line, then its samples; one
    /// without samples keeps its two lines.
    #[test]
    fn render_table() {
        let table: [(Family<'_>, &str); 4] = [
            (
                Family::single("a_total", "A.", MetricKind::Counter, 3.0),
                "# HELP a_total A.\n# TYPE a_total counter\na_total 3\n",
            ),
            (
                Family::single("b", "B.", MetricKind::Gauge, 0.25),
                "# HELP b B.\n# TYPE b gauge\nb 0.25\n",
            ),
            (
                Family::labelled("c", "C.", MetricKind::Gauge, Vec::new()),
                "# HELP c C.\n# TYPE c gauge\n",
            ),
            (
                Family::labelled(
                    "d",
                    "D.",
                    MetricKind::Gauge,
                    vec![(labels(&[("k", "x")]), 1.0), (labels(&[("k", "y\"")]), 2.0)],
                ),
                "# HELP d D.\n# TYPE d gauge\nd{k=\"x\"} 1\nd{k=\"y\\\"\"} 2\n",
            ),
        ];
        for (family, text) in table {
            assert_eq!(render(std::slice::from_ref(&family)), text, "{family:?}");
        }
    }

    fn state(status: ClientStatus, healthy: Option<bool>) -> AllocState {
        AllocState {
            client_status: status,
            client_description: String::new(),
            task_states: Default::default(),
            deployment_status: Some(wharf_state::DeploymentStatus {
                healthy,
                timestamp: None,
                description: None,
                canary: false,
                modify_index: 1,
            }),
        }
    }

    fn check(name: &str, status: CheckStatus) -> CheckState {
        CheckState {
            task: "web".into(),
            service: "http".into(),
            check: name.into(),
            kind: wharf_state::CheckKind::Tcp,
            status,
            last: None,
        }
    }

    /// Where one allocation counts: its status, its health, each check's status, and whether
    /// each check passes; every other series stays at zero.
    #[test]
    fn alloc_tally_table() {
        use CheckStatus::{Critical, Passing, Pending as CheckPending, Warning};
        use ClientStatus::{Complete, Failed, Lost, Pending, Running};
        let table = [
            (Pending, None, vec![], "pending", "unknown"),
            (Running, Some(true), vec![check("up", Passing)], "running", "healthy"),
            (Running, Some(false), vec![check("up", Critical)], "running", "unhealthy"),
            (
                Running,
                None,
                vec![check("up", CheckPending), check("slow", Warning)],
                "running",
                "unknown",
            ),
            (Complete, Some(true), vec![], "complete", "healthy"),
            (Failed, Some(false), vec![], "failed", "unhealthy"),
            (Lost, None, vec![], "lost", "unknown"),
        ];
        for (status, healthy, checks, status_label, health_label) in table {
            let mut tally = AllocTally::default();
            tally.add("a1", &state(status, healthy), &checks);
            let case = format!("{status} {healthy:?} {checks:?}");
            let families = tally.families();
            let names: Vec<&str> = families.iter().map(|f| f.name).collect();
            assert_eq!(
                names,
                ["wharf_allocs", "wharf_alloc_health", "wharf_checks", "wharf_check_passing"]
            );
            let allocs = &families[0];
            assert_eq!(allocs.samples.len(), 5, "{case}");
            for (labels, n) in &allocs.samples {
                let here = *labels == format!("status=\"{status_label}\"");
                assert_eq!(*n, if here { 1.0 } else { 0.0 }, "{case}: {labels}");
            }
            let health = &families[1];
            assert_eq!(health.samples.len(), 3, "{case}");
            for (labels, n) in &health.samples {
                let here = *labels == format!("health=\"{health_label}\"");
                assert_eq!(*n, if here { 1.0 } else { 0.0 }, "{case}: {labels}");
            }
            let by_check = &families[2];
            assert_eq!(by_check.samples.len(), 4, "{case}");
            for (labels, n) in &by_check.samples {
                let with = checks.iter().filter(|c| *labels == format!("status=\"{}\"", c.status));
                assert_eq!(*n, with.count() as f64, "{case}: {labels}");
            }
            let passing: Vec<(String, f64)> = checks
                .iter()
                .map(|c| {
                    let labels = format!(
                        "alloc_id=\"a1\",task=\"web\",service=\"http\",check=\"{}\"",
                        c.check
                    );
                    (labels, if c.status == Passing { 1.0 } else { 0.0 })
                })
                .collect();
            assert_eq!(families[3].samples, passing, "{case}");
        }
    }

    #[test]
    fn an_empty_tally_has_every_series_at_zero() {
        let text = render(&AllocTally::default().families());
        for line in [
            "wharf_allocs{status=\"lost\"} 0\n",
            "wharf_alloc_health{health=\"unknown\"} 0\n",
            "wharf_checks{status=\"warning\"} 0\n",
            "# TYPE wharf_check_passing gauge\n",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
    }
}
