//! Rows of figures, the verdict on each row's target, and the Markdown they become: one run's
//! table, which every run prints, and the lines of the page of kept runs (`history` merges the
//! runs into lines; this module draws them).

pub(crate) use crate::figure::{Better, figure};
use crate::target::{Figures, Target, Verdict, advantage};
use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};
use wharf_state::Timestamp;

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
    pub(crate) target: Option<Target>,
}

impl Row {
    /// The row as a line of its run's table: medians of its samples, and their spread.
    pub(crate) fn line(&self) -> Line {
        Line {
            name: self.name.clone(),
            unit: self.unit.to_owned(),
            better: self.better,
            median: median(&self.samples),
            spread: spread(&self.samples),
            runs: None,
            all_runs: None,
            baseline: self.baseline.as_ref().map(|(name, samples)| (name.clone(), median(samples))),
            target: self.target.clone(),
        }
    }

    /// Whether the row can be reported: it has a figure (and its baseline one), and its target
    /// applies to it. An error fails the scenario, as a figure that could not be measured does.
    pub(crate) fn check(&self) -> Result<(), String> {
        let line = self.line();
        if !line.median.is_finite() {
            return Err(format!("row {:?} produced no figure", self.name));
        }
        if let Some((name, theirs)) = &line.baseline
            && !theirs.is_finite()
        {
            return Err(format!("row {:?}: its baseline {name:?} produced no figure", self.name));
        }
        match line.verdict() {
            Some(Err(e)) => Err(format!("row {:?}: {e}", self.name)),
            _ => Ok(()),
        }
    }
}

/// One line of a table: a row's medians, from one run or across the kept runs.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) unit: String,
    pub(crate) better: Better,
    pub(crate) median: f64,
    /// The lowest and highest of what the median is over (samples of one run, or the medians
    /// of the kept runs), when there are at least two.
    pub(crate) spread: Option<(f64, f64)>,
    /// How many kept runs the median is over; `None` in one run's table.
    pub(crate) runs: Option<usize>,
    /// Every kept run that measured the line, older code's included: how many, and the
    /// lowest and highest of their medians; `None` in one run's table.
    pub(crate) all_runs: Option<(usize, f64, f64)>,
    /// The baseline's name and median.
    pub(crate) baseline: Option<(String, f64)>,
    pub(crate) target: Option<Target>,
}

impl Line {
    /// The verdict on the target, if the line has one.
    pub(crate) fn verdict(&self) -> Option<Result<Verdict, String>> {
        let target = self.target.as_ref()?;
        Some(target.judge(&Figures {
            median: self.median,
            unit: &self.unit,
            better: self.better,
            baseline: self.baseline.as_ref().map(|(name, theirs)| (name.as_str(), *theirs)),
        }))
    }

    /// The row's name, with its baseline's when it has one: rows with one name may compare
    /// with several systems.
    fn title(&self) -> String {
        match &self.baseline {
            Some((name, _)) => format!("{} (compared with {name})", self.name),
            None => self.name.clone(),
        }
    }
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

/// The lowest and highest of `samples`, when there are at least two.
pub(crate) fn spread(samples: &[f64]) -> Option<(f64, f64)> {
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (samples.len() >= 2).then_some((min, max))
}

impl Report {
    pub(crate) fn new(rows: Vec<Row>) -> Report {
        Report { rows }
    }

    /// This run's table, its verdicts, and the list of its misses.
    pub(crate) fn markdown(&self, quick: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# wharf benchmarks: this run\n");
        if quick {
            let _ = writeln!(
                out,
                "**Quick run: sizes cut down, one run each. These numbers mean nothing, and nor \
                 do their verdicts.**\n"
            );
        }
        let _ = writeln!(out, "Machine: {}. Date: {}.\n", machine(), &now()[..10]);
        let lines: Vec<Line> = self.rows.iter().map(Row::line).collect();
        out.push_str(&table(&lines));
        out.push('\n');
        out.push_str(&misses(&lines));
        out
    }
}

/// The Markdown table of `lines`, with a column of run counts when they are across kept runs.
pub(crate) fn table(lines: &[Line]) -> String {
    let kept = lines.iter().any(|l| l.runs.is_some());
    let mut out = String::new();
    if kept {
        let _ = writeln!(
            out,
            "| figure | wharf (median of the runs on the newest code) | runs | range | every kept run | compared with | its figure | ratio | target | met? |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---|---:|---:|---|---|");
    } else {
        let _ = writeln!(
            out,
            "| figure | wharf (median) | spread | compared with | its figure | ratio | target | met? |"
        );
        let _ = writeln!(out, "|---|---:|---:|---|---:|---:|---|---|");
    }
    for line in lines {
        let (peer, theirs, ratio) = match &line.baseline {
            Some((name, theirs)) => (
                name.as_str(),
                with_unit(*theirs, &line.unit),
                format!("{:.1}x", advantage(line.median, *theirs, line.better)),
            ),
            None => ("-", "-".into(), "-".into()),
        };
        let spread = match line.spread {
            Some((min, max)) => format!("{}–{}", figure(min), figure(max)),
            None => "-".into(),
        };
        let verdict = match line.verdict() {
            None => "-".into(),
            Some(Ok(Verdict::Met)) => "met".into(),
            Some(Ok(Verdict::Missed(_))) => "**missed**".into(),
            Some(Err(e)) => format!("cannot judge: {e}"),
        };
        let runs = line.runs.map(|n| format!(" {n} |")).unwrap_or_default();
        let all_runs = match line.all_runs {
            Some((1, only, _)) => format!(" 1: {} |", figure(only)),
            Some((n, min, max)) => format!(" {n}: {}–{} |", figure(min), figure(max)),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {} |{runs} {spread} |{all_runs} {peer} | {theirs} | {ratio} | {} | {verdict} |",
            line.name,
            with_unit(line.median, &line.unit),
            line.target.as_ref().map_or("-", Target::text),
        );
    }
    let _ = writeln!(
        out,
        "\nRatios are wharf's advantage: above 1.0x wharf is better, whichever way the unit points. \
         A target is judged from the median."
    );
    out
}

fn with_unit(value: f64, unit: &str) -> String {
    format!("{} {unit}", figure(value)).trim_end().to_owned()
}

/// The section that lists every line that missed its target, with what missed.
pub(crate) fn misses(lines: &[Line]) -> String {
    let mut missed = Vec::new();
    for line in lines {
        match line.verdict() {
            Some(Ok(Verdict::Missed(reasons))) => missed.push(format!(
                "- {}: {} against {}: {}.",
                line.title(),
                with_unit(line.median, &line.unit),
                line.target.as_ref().map_or("-", Target::text),
                reasons.join("; ")
            )),
            Some(Err(e)) => missed.push(format!("- {}: cannot judge: {e}.", line.title())),
            _ => {}
        }
    }
    let targets = lines.iter().filter(|l| l.target.is_some()).count();
    let mut out = String::from("## Misses\n\n");
    if missed.is_empty() {
        let _ = writeln!(out, "None: all {targets} rows with a target met it.");
    } else {
        let _ = writeln!(out, "{} of the {targets} rows with a target missed it:\n", missed.len());
        for miss in missed {
            let _ = writeln!(out, "{miss}");
        }
    }
    out
}

/// The machine the run measures: cores, memory, kernel.
pub(crate) fn machine() -> String {
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
    format!("{cores} cores, {memory}, Linux {}", kernel.trim())
}

/// The time now, RFC 3339 in UTC.
pub(crate) fn now() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp::from_unix(now).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, samples: &[f64], target: Option<&str>) -> Row {
        Row {
            name: name.into(),
            unit: "ms",
            better: Better::Lower,
            samples: samples.to_vec(),
            baseline: None,
            target: target.map(|t| Target::parse(t).unwrap()),
        }
    }

    #[test]
    fn every_row_with_a_target_says_met_or_missed_and_the_misses_are_listed() {
        let report = Report::new(vec![
            row("fast", &[1.0, 2.0, 9.0], Some("≤ 5 ms")),
            row("slow", &[6.0, 7.0, 1.0], Some("≤ 5 ms")),
            row("untargeted", &[100.0], None),
        ]);
        let text = report.markdown(false);
        let line =
            |name: &str| text.lines().find(|l| l.starts_with(&format!("| {name} "))).unwrap();
        assert!(line("fast").ends_with("| ≤ 5 ms | met |"), "{}", line("fast"));
        assert!(line("slow").ends_with("| ≤ 5 ms | **missed** |"), "{}", line("slow"));
        assert!(line("untargeted").ends_with("| - | - |"), "{}", line("untargeted"));
        let misses = text.split("## Misses").nth(1).unwrap();
        assert!(misses.contains("1 of the 2 rows with a target missed it"), "{misses}");
        assert!(
            misses.contains("- slow: 6.00 ms against ≤ 5 ms: 6.00 ms is above 5 ms."),
            "{misses}"
        );
        assert!(!misses.contains("fast"), "{misses}");
    }

    #[test]
    fn a_run_with_no_misses_says_so() {
        let lines = [row("fast", &[1.0], Some("≤ 5 ms")).line()];
        assert!(misses(&lines).contains("None: all 1 rows with a target met it."));
    }

    #[test]
    fn a_row_whose_target_cannot_apply_fails_its_check() {
        let mut wrong_unit = row("r", &[1.0], Some("≤ 5 MB"));
        assert!(wrong_unit.check().unwrap_err().contains("does not measure"));
        wrong_unit.target = None;
        assert_eq!(wrong_unit.check(), Ok(()));
        let ratio_alone = row("r", &[1.0], Some("≥ 3x"));
        assert!(ratio_alone.check().unwrap_err().contains("baseline"));
        let empty = row("r", &[], None);
        assert!(empty.check().unwrap_err().contains("no figure"));
        let mut lost_baseline = row("r", &[1.0], None);
        lost_baseline.baseline = Some(("s6".into(), Vec::new()));
        assert!(lost_baseline.check().unwrap_err().contains("s6"));
    }
}
