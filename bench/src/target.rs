//! What a row's figure should reach, and whether its median did.
//!
//! A target is written as the table prints it ("≤ 600 ms and ≥ 3x s6", "≤ 25 MB", "1000/s",
//! "≤ 4 min, downloads included") and read once into clauses: an upper bound, a lower bound,
//! or a ratio to the row's baseline, joined by "and"; text after ", " is a note. A bound may
//! name a unit of the same kind as the row's ("≤ 4 min" on a row in seconds); one with no
//! comparison sign is a bound in the direction the row's figure improves ("1000/s" on a rate
//! is at least 1000/s). A ratio is the table's ratio, wharf's advantage over the baseline.
//!
//! Judging takes the median (of a run, or of the kept runs) and never the spread: a target
//! met by the median is met.

use crate::figure::{Better, figure};

/// A target: the text the table prints and the clauses read from it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target {
    text: String,
    clauses: Vec<Clause>,
}

/// Which way a bound points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Comparison {
    /// `≤`: the figure may not exceed the bound.
    AtMost,
    /// `≥`: the figure may not fall below the bound.
    AtLeast,
    /// No sign: at least as good as the bound, whichever way the row's figure improves.
    AsGoodAs,
}

/// One condition of a target.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Clause {
    /// The figure against `value`, in `unit` (the row's own unit when none is written).
    Bound { comparison: Comparison, value: f64, unit: Option<String> },
    /// wharf's advantage over the row's baseline (the table's ratio) against `value`; when
    /// `baseline` is written, the row's baseline must be the one it names.
    Ratio { comparison: Comparison, value: f64, baseline: Option<String> },
}

/// What a target is judged against: a row's medians.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Figures<'a> {
    pub(crate) median: f64,
    pub(crate) unit: &'a str,
    pub(crate) better: Better,
    /// The baseline's name and median.
    pub(crate) baseline: Option<(&'a str, f64)>,
}

/// Whether a median reached its target.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Met,
    /// Each clause that failed, said with the figures ("1090 ms is above 600 ms").
    Missed(Vec<String>),
}

impl Target {
    /// Reads `text`; an error names the part it could not read.
    pub(crate) fn parse(text: &str) -> Result<Target, String> {
        let body = text.split_once(", ").map_or(text, |(body, _note)| body);
        let clauses = body
            .split(" and ")
            .map(|clause| {
                parse_clause(clause.trim())
                    .map_err(|e| format!("target {text:?}: {e} in {:?}", clause.trim()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Target { text: text.to_owned(), clauses })
    }

    /// The text the table prints.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    #[cfg(test)]
    pub(crate) fn clauses(&self) -> &[Clause] {
        &self.clauses
    }

    /// Judges `figures` against every clause. An error says why the target cannot apply to
    /// this row at all (a unit of another kind, a ratio on a row without a baseline, no
    /// figure): that is a fault in the bench, not a miss.
    pub(crate) fn judge(&self, figures: &Figures<'_>) -> Result<Verdict, String> {
        if !figures.median.is_finite() {
            return Err(format!("target {:?}: the row has no figure to judge", self.text));
        }
        let mut missed = Vec::new();
        for clause in &self.clauses {
            if let Some(miss) =
                judge_clause(clause, figures).map_err(|e| format!("target {:?}: {e}", self.text))?
            {
                missed.push(miss);
            }
        }
        Ok(if missed.is_empty() { Verdict::Met } else { Verdict::Missed(missed) })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn parse_clause(clause: &str) -> Result<Clause, String> {
    let (comparison, rest) = if let Some(rest) =
        clause.strip_prefix('≤').or_else(|| clause.strip_prefix("<="))
    {
        (Comparison::AtMost, rest)
    } else if let Some(rest) = clause.strip_prefix('≥').or_else(|| clause.strip_prefix(">=")) {
        (Comparison::AtLeast, rest)
    } else {
        (Comparison::AsGoodAs, clause)
    };
    let rest = rest.trim_start();
    let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == ',' || c == '.'));
    let (number, after) = rest.split_at(digits.unwrap_or(rest.len()));
    let value = parse_number(number)?;
    if let Some(baseline) = after.strip_prefix('x')
        && (baseline.is_empty() || baseline.starts_with(' '))
    {
        let baseline = baseline.trim();
        let baseline = (!baseline.is_empty()).then(|| baseline.to_owned());
        return Ok(Clause::Ratio { comparison, value, baseline });
    }
    let unit = after.trim();
    if unit.is_empty() {
        return Ok(Clause::Bound { comparison, value, unit: None });
    }
    if Unit::of(unit).is_none() {
        return Err(format!("unknown unit {unit:?}"));
    }
    Ok(Clause::Bound { comparison, value, unit: Some(unit.to_owned()) })
}

/// A number as the targets write it: digits, commas between groups of three, a decimal point.
fn parse_number(number: &str) -> Result<f64, String> {
    if number.is_empty() {
        return Err("no number".into());
    }
    let whole = number.split('.').next().unwrap_or_default();
    let mut groups = whole.split(',');
    let first = groups.next().unwrap_or_default();
    let grouped = groups.all(|group| group.len() == 3);
    if first.is_empty() || first.len() > 3 && whole.contains(',') || !grouped {
        return Err(format!("{number:?} is not a number (commas go between groups of three)"));
    }
    number.replace(',', "").parse::<f64>().map_err(|e| format!("{number:?} is not a number: {e}"))
}

/// What a unit measures, and its size in the base unit of that kind.
#[derive(Debug, Clone, PartialEq)]
struct Unit {
    kind: Kind,
    scale: f64,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Seconds,
    Bytes,
    /// A percentage, and of what ("of a core"; empty when the unit does not say).
    Percent(String),
    /// Things per second, and which ("decisions"; empty for a bare `/s`).
    Rate(String),
    /// A count or any unit this module does not convert: only the same text matches.
    Other(String),
}

impl Unit {
    fn of(unit: &str) -> Option<Unit> {
        let (kind, scale) = match unit {
            "µs" | "us" => (Kind::Seconds, 1e-6),
            "ms" => (Kind::Seconds, 1e-3),
            "s" => (Kind::Seconds, 1.0),
            "min" => (Kind::Seconds, 60.0),
            "h" => (Kind::Seconds, 3600.0),
            "B" => (Kind::Bytes, 1.0),
            "kB" | "KB" => (Kind::Bytes, 1e3),
            "MB" => (Kind::Bytes, 1e6),
            "GB" => (Kind::Bytes, 1e9),
            "KiB" => (Kind::Bytes, 1024.0),
            "MiB" => (Kind::Bytes, 1024.0 * 1024.0),
            "GiB" => (Kind::Bytes, 1024.0 * 1024.0 * 1024.0),
            _ => {
                if let Some(of) = unit.strip_prefix('%') {
                    (Kind::Percent(of.trim().to_owned()), 1.0)
                } else if let Some(counted) = unit.strip_suffix("/s") {
                    (Kind::Rate(counted.trim().to_owned()), 1.0)
                } else if unit.chars().any(char::is_whitespace) || unit.is_empty() {
                    return None;
                } else {
                    (Kind::Other(unit.to_owned()), 1.0)
                }
            }
        };
        Some(Unit { kind, scale })
    }

    /// Whether a figure in `self` can be written in `other`: the same kind, and where the
    /// kind says of what, the same thing or one side that does not say.
    fn converts_to(&self, other: &Unit) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Percent(a), Kind::Percent(b)) | (Kind::Rate(a), Kind::Rate(b)) => {
                a == b || a.is_empty() || b.is_empty()
            }
            (a, b) => a == b,
        }
    }
}

/// `value` written in `unit`, converted to the row's unit.
fn in_row_unit(value: f64, unit: &str, row_unit: &str) -> Result<f64, String> {
    if unit == row_unit {
        return Ok(value);
    }
    match (Unit::of(unit), Unit::of(row_unit)) {
        (Some(from), Some(to)) if from.converts_to(&to) => Ok(value * from.scale / to.scale),
        _ => Err(format!("its unit {unit:?} does not measure what the row's {row_unit:?} does")),
    }
}

/// The ratio the table prints: above 1 wharf is better, whichever way the unit points.
pub(crate) fn advantage(ours: f64, theirs: f64, better: Better) -> f64 {
    match better {
        Better::Higher => ours / theirs,
        Better::Lower => theirs / ours,
    }
}

/// A bound as a target writes it: no trailing zeros ("0.6", "240", "3").
fn plain(value: f64) -> String {
    let text = format!("{value:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `None` when the clause holds, or what missed.
fn judge_clause(clause: &Clause, figures: &Figures<'_>) -> Result<Option<String>, String> {
    let resolve = |comparison| match (comparison, figures.better) {
        (Comparison::AsGoodAs, Better::Lower) => Comparison::AtMost,
        (Comparison::AsGoodAs, Better::Higher) => Comparison::AtLeast,
        (comparison, _) => comparison,
    };
    let holds = |measured: f64, comparison, bound: f64| match resolve(comparison) {
        Comparison::AtMost => measured <= bound,
        _ => measured >= bound,
    };
    let side =
        |comparison| if resolve(comparison) == Comparison::AtMost { "above" } else { "below" };
    match clause {
        Clause::Bound { comparison, value, unit } => {
            let bound = match unit {
                Some(unit) => in_row_unit(*value, unit, figures.unit)?,
                None => *value,
            };
            if holds(figures.median, *comparison, bound) {
                return Ok(None);
            }
            let with_unit = |v: String| format!("{v} {}", figures.unit).trim().to_owned();
            Ok(Some(format!(
                "{} is {} {}",
                with_unit(figure(figures.median)),
                side(*comparison),
                with_unit(plain(bound))
            )))
        }
        Clause::Ratio { comparison, value, baseline } => {
            let Some((name, theirs)) = figures.baseline else {
                return Err("a ratio needs a baseline, and the row has none".into());
            };
            if let Some(wanted) = baseline
                && wanted != name
            {
                return Err(format!("it compares with {wanted:?}, the row with {name:?}"));
            }
            let ratio = advantage(figures.median, theirs, figures.better);
            if holds(ratio, *comparison, *value) {
                return Ok(None);
            }
            let against = baseline.as_deref().map(|b| format!(" {b}")).unwrap_or_default();
            Ok(Some(format!(
                "{ratio:.1}x{against} is {} {}x{against}",
                side(*comparison),
                plain(*value)
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(comparison: Comparison, value: f64, unit: Option<&str>) -> Clause {
        Clause::Bound { comparison, value, unit: unit.map(str::to_owned) }
    }

    #[test]
    fn every_target_the_bench_writes_reads_into_clauses() {
        use Comparison::*;
        let cases: &[(&str, Vec<Clause>)] = &[
            ("≤ 25 MB", vec![bound(AtMost, 25.0, Some("MB"))]),
            ("≤ 4 min, downloads included", vec![bound(AtMost, 4.0, Some("min"))]),
            ("≤ 1,024 KiB", vec![bound(AtMost, 1024.0, Some("KiB"))]),
            ("≤ 0.6 ms", vec![bound(AtMost, 0.6, Some("ms"))]),
            ("≤ 25%", vec![bound(AtMost, 25.0, Some("%"))]),
            ("≤ 5 %", vec![bound(AtMost, 5.0, Some("%"))]),
            ("1000/s", vec![bound(AsGoodAs, 1000.0, Some("/s"))]),
            ("≥ 2,000/s", vec![bound(AtLeast, 2000.0, Some("/s"))]),
            (
                "≥ 20,000/s and ≥ 10x",
                vec![
                    bound(AtLeast, 20_000.0, Some("/s")),
                    Clause::Ratio { comparison: AtLeast, value: 10.0, baseline: None },
                ],
            ),
            (
                "≤ 600 ms and ≥ 3x s6",
                vec![
                    bound(AtMost, 600.0, Some("ms")),
                    Clause::Ratio { comparison: AtLeast, value: 3.0, baseline: Some("s6".into()) },
                ],
            ),
            (">= 12", vec![bound(AtLeast, 12.0, None)]),
        ];
        for (text, clauses) in cases {
            let target = Target::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(target.clauses(), clauses.as_slice(), "{text}");
            assert_eq!(target.text(), *text, "the table prints the text as written");
        }
    }

    #[test]
    fn unreadable_targets_are_refused_with_the_part_named() {
        let cases = [
            ("≤ fast", "no number"),
            ("≤ 1,0245 KiB", "groups of three"),
            ("≤ 10,24 KiB", "groups of three"),
            ("≤ 5 parsecs per fortnight", "unknown unit"),
            ("≤ 5 ms and", "unknown unit \"ms and\""),
            ("≤ 5 ms and ≥ x", "no number"),
            ("", "no number"),
        ];
        for (text, expected) in cases {
            let error = Target::parse(text).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    fn figures(median: f64, unit: &str, better: Better) -> Figures<'_> {
        Figures { median, unit, better, baseline: None }
    }

    fn judge(text: &str, figures: &Figures<'_>) -> Verdict {
        Target::parse(text).unwrap().judge(figures).unwrap()
    }

    #[test]
    fn an_upper_bound_is_met_up_to_and_including_it() {
        let cases = [
            (0.59, Verdict::Met),
            (0.6, Verdict::Met),
            (0.61, Verdict::Missed(vec!["0.61 ms is above 0.6 ms".into()])),
        ];
        for (median, verdict) in cases {
            assert_eq!(judge("≤ 0.6 ms", &figures(median, "ms", Better::Lower)), verdict);
        }
    }

    #[test]
    fn a_lower_bound_is_met_from_it_upwards() {
        assert_eq!(judge("≥ 2,000/s", &figures(2000.0, "/s", Better::Higher)), Verdict::Met);
        assert_eq!(
            judge("≥ 2,000/s", &figures(591.0, "/s", Better::Higher)),
            Verdict::Missed(vec!["591 /s is below 2000 /s".into()])
        );
    }

    #[test]
    fn a_bound_without_a_sign_points_the_way_the_figure_improves() {
        // A rate: at least; a time: at most.
        assert_eq!(judge("1000/s", &figures(1002.0, "/s", Better::Higher)), Verdict::Met);
        assert!(matches!(
            judge("1000/s", &figures(998.0, "/s", Better::Higher)),
            Verdict::Missed(_)
        ));
        assert_eq!(judge("2 s", &figures(1.5, "s", Better::Lower)), Verdict::Met);
        assert!(matches!(judge("2 s", &figures(2.5, "s", Better::Lower)), Verdict::Missed(_)));
    }

    #[test]
    fn a_bound_in_another_unit_of_the_same_kind_is_converted() {
        use Better::*;
        let cases = [
            ("≤ 4 min, downloads included", 239.0, "s", Lower, true),
            ("≤ 4 min, downloads included", 241.0, "s", Lower, false),
            ("≤ 1,024 KiB", 1.0, "MiB", Lower, true),
            ("≤ 1,024 KiB", 1.01, "MiB", Lower, false),
            ("≤ 25 MB", 24_000.0, "KiB", Lower, true),
            ("≤ 25%", 24.0, "% of a core", Lower, true),
            ("≤ 5 %", 5.1, "% of a core", Lower, false),
            ("≥ 5,000/s", 75_811.0, "decisions/s", Higher, true),
            ("≥ 5,000/s", 4_999.0, "decisions/s", Higher, false),
            ("≤ 100 ms", 0.099, "s", Lower, true),
            ("≤ 100 µs", 0.2, "ms", Lower, false),
        ];
        for (text, median, unit, better, met) in cases {
            let verdict = judge(text, &figures(median, unit, better));
            assert_eq!(verdict == Verdict::Met, met, "{text} against {median} {unit}: {verdict:?}");
        }
    }

    #[test]
    fn a_bound_in_a_unit_of_another_kind_is_an_error_not_a_miss() {
        let cases = [
            ("≤ 25 MB", "ms"),
            ("≤ 5 ms", "KiB"),
            ("≥ 5,000/s", "workers"),
            ("≥ 5,000 runs/s", "decisions/s"),
            ("≤ 5 %", "µs"),
        ];
        for (text, unit) in cases {
            let error = Target::parse(text)
                .unwrap()
                .judge(&figures(1.0, unit, Better::Lower))
                .expect_err(text);
            assert!(error.contains("does not measure"), "{text} on {unit}: {error}");
        }
    }

    #[test]
    fn a_ratio_is_wharfs_advantage_over_the_baseline() {
        let with = |median, theirs, better| Figures {
            median,
            unit: "ms",
            better,
            baseline: Some(("s6", theirs)),
        };
        // Lower is better: the advantage is theirs over ours.
        assert_eq!(judge("≥ 3x s6", &with(500.0, 1572.0, Better::Lower)), Verdict::Met);
        assert_eq!(
            judge("≥ 3x s6", &with(1090.0, 1572.0, Better::Lower)),
            Verdict::Missed(vec!["1.4x s6 is below 3x s6".into()])
        );
        // Higher is better: ours over theirs.
        assert_eq!(judge("≥ 10x", &with(83_264.0, 5596.0, Better::Higher)), Verdict::Met);
        assert!(matches!(
            judge("≥ 10x", &with(50_000.0, 5596.0, Better::Higher)),
            Verdict::Missed(_)
        ));
    }

    #[test]
    fn a_combination_is_met_only_when_every_clause_is_and_names_each_miss() {
        let row = |median| Figures {
            median,
            unit: "ms",
            better: Better::Lower,
            baseline: Some(("s6", 1572.0)),
        };
        let target = "≤ 600 ms and ≥ 3x s6";
        assert_eq!(judge(target, &row(500.0)), Verdict::Met);
        assert_eq!(
            judge(target, &row(1090.0)),
            Verdict::Missed(vec![
                "1090 ms is above 600 ms".into(),
                "1.4x s6 is below 3x s6".into()
            ])
        );
        // Under 600 ms but not three times s6.
        let mut close = row(590.0);
        close.baseline = Some(("s6", 1000.0));
        assert_eq!(judge(target, &close), Verdict::Missed(vec!["1.7x s6 is below 3x s6".into()]));
    }

    #[test]
    fn a_ratio_on_a_row_without_its_baseline_is_an_error() {
        let target = Target::parse("≥ 3x s6").unwrap();
        let none = figures(1.0, "ms", Better::Lower);
        assert!(target.judge(&none).unwrap_err().contains("no"));
        let other = Figures { baseline: Some(("supervisord", 2.0)), ..none };
        assert!(target.judge(&other).unwrap_err().contains("supervisord"));
    }

    #[test]
    fn a_row_without_a_figure_cannot_be_judged() {
        let target = Target::parse("≤ 5 ms").unwrap();
        assert!(target.judge(&figures(f64::NAN, "ms", Better::Lower)).is_err());
    }
}
