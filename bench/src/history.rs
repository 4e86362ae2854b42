//! The kept runs. Every full run of `cargo xtask bench` is appended, dated, as one JSON line
//! to the history beside the page it writes (`docs/BENCHMARKS-history.jsonl` beside
//! `docs/BENCHMARKS.md`). A run is never replaced by a later one: one that looks wrong is
//! outvoted by the median, or taken out of the file by hand in a commit that says why.
//!
//! A run records the code it measured ([`code_of`]): the newest commit that changed
//! anything outside `docs/`. The page judges the newest code: each row's figure is the
//! median of the medians of the runs made on the same code as the newest run, and every kept
//! run's range stands beside it, older code's included. A figure across code that changed
//! would judge code that is gone: a cut made since is outvoted by the runs before it. A run
//! without a recorded code, or made with uncommitted changes, has no other run on its code.
//!
//! A row is the same row across runs when its name, unit and baseline's name are the same;
//! its target and direction are the newest run's. A row the newest code's runs do not
//! measure stays on the page, from the runs that did, until its lines leave the history.

use crate::report::{self, Better, Line, Row, median, spread};
use crate::target::Target;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The version of a history line; a line of another version is refused, not misread.
const VERSION: u32 = 1;

/// One kept run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Run {
    pub(crate) version: u32,
    /// When it ran: RFC 3339 in UTC, or a bare day for runs recorded before the history.
    pub(crate) date: String,
    /// Cores, memory, kernel.
    pub(crate) machine: String,
    /// The code measured, as [`code_of`] names it; absent in runs kept before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) code: Option<String>,
    pub(crate) rows: Vec<RunRow>,
}

/// One row of a kept run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRow {
    pub(crate) name: String,
    pub(crate) unit: String,
    pub(crate) better: Better,
    /// The run's median.
    pub(crate) median: f64,
    /// The run's lowest and highest sample, when it took at least two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spread: Option<[f64; 2]>,
    /// The run's samples; empty for a run recorded with its medians only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) samples: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) baseline: Option<RunBaseline>,
    /// The target's text, as the table prints it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
}

/// The baseline of a kept row, measured in the same run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunBaseline {
    pub(crate) name: String,
    pub(crate) median: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) samples: Vec<f64>,
}

impl Run {
    /// A run of `rows`, at `date`, on `machine`, of `code`.
    pub(crate) fn new(rows: &[Row], date: String, machine: String, code: Option<String>) -> Run {
        let rows = rows
            .iter()
            .map(|row| RunRow {
                name: row.name.clone(),
                unit: row.unit.to_owned(),
                better: row.better,
                median: median(&row.samples),
                spread: spread(&row.samples).map(|(min, max)| [min, max]),
                samples: row.samples.clone(),
                baseline: row.baseline.as_ref().map(|(name, samples)| RunBaseline {
                    name: name.clone(),
                    median: median(samples),
                    samples: samples.clone(),
                }),
                target: row.target.as_ref().map(|t| t.text().to_owned()),
            })
            .collect();
        Run { version: VERSION, date, machine, code, rows }
    }

    /// The day it ran.
    fn day(&self) -> &str {
        self.date.get(..10).unwrap_or(&self.date)
    }

    /// Whether this run measured the same code as `other`, as far as the history can tell.
    fn same_code_as(&self, other: &Run) -> bool {
        match (&self.code, &other.code) {
            (Some(mine), Some(theirs)) => mine == theirs && !mine.ends_with(UNCOMMITTED),
            _ => false,
        }
    }
}

/// How many hex digits of a commit's id name the code.
const CODE_DIGITS: usize = 12;

/// How [`code_of`] marks a tree with changes of its own: such a run has no other on its code.
const UNCOMMITTED: &str = "+uncommitted";

/// The code in the git work tree holding `dir`: the id of the newest commit that changed
/// anything outside `docs/` (its first [`CODE_DIGITS`] hex digits), with [`UNCOMMITTED`] when
/// files outside `docs/` differ from it; `None` outside a work tree or without git. Commits of
/// the page alone keep the id.
pub(crate) fn code_of(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        let output = std::process::Command::new("git").arg("-C").arg(dir).args(args).output();
        output.ok().filter(|o| o.status.success()).map(|o| o.stdout)
    };
    let outside_docs = ["--", ":/", ":(top,exclude)docs"];
    let commit = git(&[&["log", "-1", "--format=%H"][..], &outside_docs].concat())?;
    // A fixed length: git's own short ids grow with the repository, which would part one
    // commit's runs.
    let commit = String::from_utf8(commit).ok()?.trim().get(..CODE_DIGITS)?.to_owned();
    let changes = git(&[&["status", "--porcelain"][..], &outside_docs].concat())?;
    Some(if changes.is_empty() { commit } else { commit + UNCOMMITTED })
}

/// The history kept beside `page`: `BENCHMARKS.md` keeps `BENCHMARKS-history.jsonl`.
pub(crate) fn beside(page: &Path) -> PathBuf {
    let stem = page.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default();
    page.with_file_name(format!("{stem}-history.jsonl"))
}

/// Reads the runs kept in `text`, oldest first; an error names the line.
pub(crate) fn parse(text: &str) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let run: Run =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", index + 1))?;
        if run.version != VERSION {
            return Err(format!(
                "line {}: version {} (this bench reads version {VERSION})",
                index + 1,
                run.version
            ));
        }
        runs.push(run);
    }
    Ok(runs)
}

/// Reads the runs kept at `path`; none when the file does not exist yet.
pub(crate) fn load(path: &Path) -> Result<Vec<Run>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// `run` as its line of the history, newline included.
pub(crate) fn line_of(run: &Run) -> Result<String, String> {
    // serde_json writes a NaN as null, which would not read back: refuse it here.
    let unmeasured = run.rows.iter().find(|r| {
        !r.median.is_finite() || r.baseline.as_ref().is_some_and(|b| !b.median.is_finite())
    });
    if let Some(row) = unmeasured {
        return Err(format!("row {:?} has no figure to keep", row.name));
    }
    let json = serde_json::to_string(run).map_err(|e| format!("cannot write the run: {e}"))?;
    Ok(json + "\n")
}

/// Adds `run` at the end of the history at `path`, leaving the lines before it as they are.
pub(crate) fn append(path: &Path, run: &Run) -> Result<(), String> {
    let mut line = line_of(run)?;
    let ends_open = std::fs::read(path).is_ok_and(|b| b.last().is_some_and(|&c| c != b'\n'));
    if ends_open {
        line.insert(0, '\n');
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot append to {}: {e}", path.display()))
}

/// What identifies a row across runs.
type Key = (String, String, Option<String>);

fn key(row: &RunRow) -> Key {
    (row.name.clone(), row.unit.clone(), row.baseline.as_ref().map(|b| b.name.clone()))
}

/// The rows of `runs` that are the row `key`.
fn measuring<'a>(runs: impl Iterator<Item = &'a Run>, key: &Key) -> Vec<&'a RunRow> {
    runs.flat_map(|run| &run.rows).filter(|r| self::key(r) == *key).collect()
}

/// The runs of `runs` (oldest first) on the newest run's code, the newest included.
fn on_newest_code(runs: &[Run]) -> Vec<&Run> {
    let Some((newest, older)) = runs.split_last() else { return Vec::new() };
    older.iter().filter(|run| run.same_code_as(newest)).chain([newest]).collect()
}

/// Each row's line across `runs` (oldest first), from the runs on the newest run's code (or,
/// for a row they do not measure, from the runs that do): the median of their medians, their
/// range (a lone run's: that of its samples) and count, the median of its baseline's
/// medians, the newest run's target, and the count and range of every run that measured it.
/// Rows come in the newest run's order, then those only older runs have.
/// `on_newest_code` are those runs, as [`on_newest_code`] picks them.
fn merge(runs: &[Run], on_newest_code: &[&Run]) -> Result<Vec<Line>, String> {
    let mut order: Vec<Key> = Vec::new();
    let mut newest: std::collections::HashMap<Key, &RunRow> = Default::default();
    for row in runs.iter().rev().flat_map(|run| &run.rows) {
        let key = key(row);
        if !newest.contains_key(&key) {
            newest.insert(key.clone(), row);
            order.push(key);
        }
    }
    order
        .into_iter()
        .map(|key| {
            let every = measuring(runs.iter(), &key);
            let mut rows = measuring(on_newest_code.iter().copied(), &key);
            if rows.is_empty() {
                rows = every.clone();
            }
            let medians: Vec<f64> = rows.iter().map(|r| r.median).collect();
            let every: Vec<f64> = every.iter().map(|r| r.median).collect();
            let (low, high) = spread(&every).unwrap_or((median(&every), median(&every)));
            let newest = newest[&key];
            let baseline = newest.baseline.as_ref().map(|b| {
                let theirs: Vec<f64> =
                    rows.iter().filter_map(|r| Some(r.baseline.as_ref()?.median)).collect();
                (b.name.clone(), median(&theirs))
            });
            let target = newest
                .target
                .as_deref()
                .map(Target::parse)
                .transpose()
                .map_err(|e| format!("row {:?}: {e}", newest.name))?;
            Ok(Line {
                name: newest.name.clone(),
                unit: newest.unit.clone(),
                better: newest.better,
                median: median(&medians),
                // One run's range is that of its own samples.
                spread: match rows[..] {
                    [only] => only.spread.map(|[low, high]| (low, high)),
                    _ => spread(&medians),
                },
                runs: Some(medians.len()),
                all_runs: Some((every.len(), low, high)),
                baseline,
                target,
            })
        })
        .collect()
}

/// The page of the kept runs (oldest first), read from `history`: the table of medians
/// across runs, the misses, and the list of runs.
pub(crate) fn page(runs: &[Run], history: &str) -> Result<(String, String), String> {
    use std::fmt::Write as _;
    let judged = on_newest_code(runs);
    let lines = merge(runs, &judged)?;
    for line in &lines {
        if let Some(Err(e)) = line.verdict() {
            return Err(format!("row {:?}: {e}", line.name));
        }
    }
    let misses = report::misses(&lines);
    let mut out = String::from("# wharf benchmarks\n\n");
    let kept = match runs {
        [] => "no run".to_owned(),
        [only] => format!("1 run, {}", only.day()),
        [first, .., last] => format!("{} runs, {} to {}", runs.len(), first.day(), last.day()),
    };
    let judged = judged.len();
    let code = match runs.last().and_then(|run| run.code.as_deref()) {
        Some(code) => format!("code at {code}"),
        None => "code not recorded".to_owned(),
    };
    let _ = writeln!(
        out,
        "Written by `cargo xtask bench` from every run it kept ({kept}; each a line of \
         [{history}]({history})). The targets judge the newest code ({code}, measured by \
         {judged} of the runs): each figure is the median of those runs' medians, with how \
         many they are and the range of their medians (of its samples, for a lone run). \
         Every kept run's range, older code's included, stands beside it. A full run adds \
         its line; none replaces another.\n"
    );
    out.push_str(&report::table(&lines));
    out.push('\n');
    out.push_str(&misses);
    out.push_str("\n## Kept runs\n\n| date | machine | code | rows |\n|---|---|---|---:|\n");
    for run in runs {
        let code = run.code.as_deref().unwrap_or("not recorded");
        let _ = writeln!(out, "| {} | {} | {code} | {} |", run.date, run.machine, run.rows.len());
    }
    Ok((out, misses))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(runs: &[Run]) -> Result<Vec<Line>, String> {
        merge(runs, &on_newest_code(runs))
    }

    fn row(name: &str, median: f64, baseline: Option<(&str, f64)>, target: Option<&str>) -> RunRow {
        RunRow {
            name: name.into(),
            unit: "ms".into(),
            better: Better::Lower,
            median,
            spread: None,
            samples: Vec::new(),
            baseline: baseline.map(|(name, median)| RunBaseline {
                name: name.into(),
                median,
                samples: Vec::new(),
            }),
            target: target.map(str::to_owned),
        }
    }

    /// A run of code `c1`.
    fn run(date: &str, rows: Vec<RunRow>) -> Run {
        run_of(Some("c1"), date, rows)
    }

    fn run_of(code: Option<&str>, date: &str, rows: Vec<RunRow>) -> Run {
        let (date, machine, code) = (date.into(), "2 cores".into(), code.map(str::to_owned));
        Run { version: VERSION, date, machine, code, rows }
    }

    #[test]
    fn each_row_is_the_median_of_the_runs_medians_with_their_count_and_range() {
        let runs = [
            run("2026-12-01", vec![row("start", 10.0, None, None)]),
            run("2026-12-02", vec![row("start", 30.0, None, None)]),
            run("2026-12-03", vec![row("start", 12.0, None, None)]),
        ];
        let lines = merged(&runs).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].median, 12.0, "one slow run is outvoted, not averaged in");
        assert_eq!(lines[0].runs, Some(3));
        assert_eq!(lines[0].spread, Some((10.0, 30.0)));
        assert_eq!(lines[0].all_runs, Some((3, 10.0, 30.0)));
        let two = merged(&runs[..2]).unwrap();
        assert_eq!((two[0].median, two[0].runs), (20.0, Some(2)));
        let one = merged(&runs[..1]).unwrap();
        assert_eq!((one[0].median, one[0].runs, one[0].spread), (10.0, Some(1), None));
        let mut sampled = row("start", 10.0, None, None);
        sampled.spread = Some([8.0, 14.0]);
        let lone = merged(&[run("2026-12-01", vec![sampled])]).unwrap();
        assert_eq!(lone[0].spread, Some((8.0, 14.0)), "a lone run's range is its samples'");
        assert_eq!(one[0].all_runs, Some((1, 10.0, 10.0)));
    }

    #[test]
    fn the_figures_are_the_newest_codes_and_every_run_stands_beside_them() {
        let runs = [
            run_of(Some("c1"), "2026-12-01", vec![row("stop", 30.0, None, Some("≤ 20 ms"))]),
            run_of(Some("c2"), "2026-12-02", vec![row("stop", 16.0, None, Some("≤ 20 ms"))]),
            run_of(Some("c1"), "2026-12-03", vec![row("stop", 32.0, None, Some("≤ 20 ms"))]),
            run_of(Some("c2"), "2026-12-04", vec![row("stop", 18.0, None, Some("≤ 20 ms"))]),
        ];
        let lines = merged(&runs).unwrap();
        assert_eq!((lines[0].median, lines[0].runs), (17.0, Some(2)), "c2's runs only");
        assert_eq!(lines[0].spread, Some((16.0, 18.0)));
        assert_eq!(lines[0].all_runs, Some((4, 16.0, 32.0)));
        let (page, misses) = page(&runs, "h").unwrap();
        assert!(misses.contains("None: all 1 rows with a target met it."), "{misses}");
        assert!(page.contains("(code at c2, measured by 2 of the runs)"), "{page}");
        assert!(
            page.contains(
                "| stop | 17.0 ms | 2 | 16.0–18.0 | 4: 16.0–32.0 | - | - | - | ≤ 20 ms | met |"
            ),
            "{page}"
        );
        assert!(page.ends_with("| 2026-12-04 | 2 cores | c2 | 1 |\n"), "{page}");
        // Older code's figure is what the page says when the newest code was measured on it.
        let older = merged(&runs[..3]).unwrap();
        assert_eq!((older[0].median, older[0].runs), (31.0, Some(2)));
    }

    #[test]
    fn a_run_without_its_code_or_with_uncommitted_changes_has_no_other_on_its_code() {
        let stop = |median| vec![row("stop", median, None, None)];
        let dirty = Some("c1+uncommitted");
        let cases: [(Option<&str>, Option<&str>); 3] =
            [(None, None), (dirty, dirty), (Some("c1"), None)];
        for (older, newer) in cases {
            let runs =
                [run_of(older, "2026-12-01", stop(30.0)), run_of(newer, "2026-12-02", stop(10.0))];
            let lines = merged(&runs).unwrap();
            assert_eq!((lines[0].median, lines[0].runs), (10.0, Some(1)), "{older:?} {newer:?}");
            assert_eq!(lines[0].all_runs, Some((2, 10.0, 30.0)));
        }
        let (page, _) = page(&[run_of(None, "2026-12-01", stop(1.0))], "h").unwrap();
        assert!(page.contains("(code not recorded, measured by 1 of the runs)"), "{page}");
        assert!(page.ends_with("| 2026-12-01 | 2 cores | not recorded | 1 |\n"), "{page}");
    }

    #[test]
    fn a_row_the_newest_code_does_not_measure_keeps_the_figures_of_the_runs_that_did() {
        let runs = [
            run_of(Some("c1"), "2026-12-01", vec![row("retired", 5.0, None, None)]),
            run_of(Some("c2"), "2026-12-02", vec![row("kept", 1.0, None, None)]),
        ];
        let lines = merged(&runs).unwrap();
        assert_eq!(lines[1].name, "retired");
        assert_eq!(
            (lines[1].median, lines[1].runs, lines[1].all_runs),
            (5.0, Some(1), Some((1, 5.0, 5.0)))
        );
    }

    #[test]
    fn the_code_is_the_newest_commit_outside_the_docs_and_says_when_the_tree_differs() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let status = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
                .arg(dir.path())
                .args(args)
                .output()
                .expect("git is needed by this test: apt-get install -y git");
            assert!(status.status.success(), "git {args:?}: {status:?}");
            String::from_utf8(status.stdout).unwrap().trim().to_owned()
        };
        assert_eq!(code_of(dir.path()), None, "not a work tree");
        git(&["init", "-q"]);
        std::fs::create_dir(dir.path().join("docs")).unwrap();
        std::fs::write(dir.path().join("code.rs"), "1").unwrap();
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "code"]);
        let code = git(&["log", "-1", "--format=%H"])[..12].to_owned();
        assert_eq!(code_of(&dir.path().join("docs")), Some(code.clone()));
        std::fs::write(dir.path().join("docs/BENCHMARKS.md"), "page").unwrap();
        assert_eq!(code_of(dir.path()).as_deref(), Some(code.as_str()), "the page is not code");
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "page"]);
        assert_eq!(code_of(dir.path()).as_deref(), Some(code.as_str()), "nor is its commit");
        std::fs::write(dir.path().join("code.rs"), "2").unwrap();
        assert_eq!(code_of(dir.path()), Some(format!("{code}+uncommitted")));
        git(&["commit", "-q", "-am", "more code"]);
        let newer = git(&["log", "-1", "--format=%H"])[..12].to_owned();
        assert_ne!(newer, code);
        assert_eq!(code_of(dir.path()), Some(newer));
    }

    #[test]
    fn rows_are_told_apart_by_name_unit_and_baseline() {
        let mut in_seconds = row("stop", 0.5, None, None);
        in_seconds.unit = "s".into();
        let runs = [
            run(
                "2026-12-01",
                vec![
                    row("stop", 700.0, Some(("supervisord", 400.0)), None),
                    row("stop", 700.0, Some(("s6", 450.0)), None),
                ],
            ),
            run(
                "2026-12-02",
                vec![
                    row("stop", 800.0, Some(("supervisord", 380.0)), None),
                    row("stop", 800.0, Some(("s6", 470.0)), None),
                    in_seconds,
                ],
            ),
        ];
        let lines = merged(&runs).unwrap();
        let found: Vec<(&str, Option<&str>, f64, usize)> = lines
            .iter()
            .map(|l| {
                let baseline = l.baseline.as_ref().map(|(n, _)| n.as_str());
                (l.unit.as_str(), baseline, l.median, l.runs.unwrap())
            })
            .collect();
        assert_eq!(
            found,
            [
                ("ms", Some("supervisord"), 750.0, 2),
                ("ms", Some("s6"), 750.0, 2),
                ("s", None, 0.5, 1)
            ]
        );
        assert_eq!(lines[0].baseline, Some(("supervisord".into(), 390.0)));
        assert_eq!(lines[1].baseline, Some(("s6".into(), 460.0)));
    }

    #[test]
    fn rows_follow_the_newest_run_then_those_only_older_runs_have() {
        let runs = [
            run("2026-12-01", vec![row("retired", 1.0, None, None), row("b", 1.0, None, None)]),
            run("2026-12-02", vec![row("a", 1.0, None, None), row("b", 2.0, None, None)]),
        ];
        let names: Vec<String> = merged(&runs).unwrap().into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["a", "b", "retired"]);
    }

    #[test]
    fn the_newest_runs_target_judges_the_median_of_all() {
        let runs = [
            run("2026-12-01", vec![row("start", 4.0, None, Some("≤ 10 ms"))]),
            run("2026-12-02", vec![row("start", 6.0, None, Some("≤ 10 ms"))]),
            run("2026-12-03", vec![row("start", 9.0, None, Some("≤ 5 ms"))]),
        ];
        let lines = merged(&runs).unwrap();
        assert_eq!(lines[0].target.as_ref().map(Target::text), Some("≤ 5 ms"));
        assert_eq!(lines[0].median, 6.0);
        let (page, misses) = page(&runs, "BENCHMARKS-history.jsonl").unwrap();
        let (one, _) = super::page(&runs[..1], "h").unwrap();
        assert!(one.contains("(1 run, 2026-12-01;"), "{one}");
        assert!(
            misses.contains("- start: 6.00 ms against ≤ 5 ms: 6.00 ms is above 5 ms."),
            "{misses}"
        );
        assert!(
            page.contains(
                "| start | 6.00 ms | 3 | 4.00–9.00 | 3: 4.00–9.00 | - | - | - | ≤ 5 ms | **missed** |"
            ),
            "{page}"
        );
        assert!(page.contains("3 runs, 2026-12-01 to 2026-12-03"), "{page}");
        assert!(page.ends_with("| 2026-12-03 | 2 cores | c1 | 1 |\n"), "{page}");
    }

    #[test]
    fn a_target_that_no_longer_reads_fails_the_page() {
        let runs = [run("2026-12-01", vec![row("start", 4.0, None, Some("≤ soon"))])];
        assert!(merged(&runs).unwrap_err().contains("start"));
        let runs = [run("2026-12-01", vec![row("start", 4.0, None, Some("≥ 2x"))])];
        assert!(page(&runs, "h").unwrap_err().contains("baseline"));
    }

    #[test]
    fn a_run_reads_back_as_written_and_appends_without_touching_earlier_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = beside(&dir.path().join("BENCHMARKS.md"));
        assert_eq!(path, dir.path().join("BENCHMARKS-history.jsonl"));
        assert_eq!(load(&path).unwrap(), Vec::new(), "no history yet is no runs");
        let first = run("2026-12-01", vec![row("start", 4.0, Some(("s6", 5.0)), Some("≤ 5 ms"))]);
        // A first line written by hand, without its newline.
        std::fs::write(&path, line_of(&first).unwrap().trim_end()).unwrap();
        let mut measured = row("start", 5.0, None, None);
        measured.samples = vec![4.0, 5.0, 6.0];
        measured.spread = Some([4.0, 6.0]);
        let second = run("2026-12-02T10:00:00.000Z", vec![measured]);
        append(&path, &second).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(line_of(&first).unwrap().as_str()), "{text}");
        assert_eq!(load(&path).unwrap(), vec![first, second]);
    }

    #[test]
    fn a_line_it_cannot_read_is_refused_with_its_number() {
        let good = line_of(&run("2026-12-01", Vec::new())).unwrap();
        let other_version = good.replace("\"version\":1", "\"version\":2");
        assert!(
            parse(&format!("{good}{other_version}")).unwrap_err().starts_with("line 2: version 2")
        );
        assert!(parse(&format!("{good}\n{{\"date\": 3}}\n")).unwrap_err().starts_with("line 3:"));
        let unmeasured = run("2026-12-01", vec![row("start", f64::NAN, None, None)]);
        assert!(line_of(&unmeasured).unwrap_err().contains("start"));
    }
}
