//! The runner-list protocol: what the run probe prints, parsed.
//!
//! The runner's list command (`wharf alloc list --probe`, or `crunch-run --list`) prints one
//! line per unit of work on the worker (DESIGN.md, "The runner-list protocol"):
//!
//! - `<id>`: work with this id is running;
//! - `<id> stale`: its record says running but its process is gone while the lock is still
//!   held; not counted as running, but a stale lock held too long makes the worker broken
//!   (the worker state machine keeps that timer);
//! - `broken`: the worker cannot run work.
//!
//! Lines whose id lacks this cluster's prefix belong to another cluster sharing the host and
//! are ignored. So are empty lines. Anything else is malformed: it is counted and skipped, never
//! a panic and never a reason to believe a worker idle that prints garbage beside real ids.

/// One parsed run-probe output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerList {
    /// Ids of work that is running, in the order printed, without duplicates.
    pub running: Vec<String>,
    /// Ids whose lock is stale.
    pub stale: Vec<String>,
    /// The worker said `broken`.
    pub broken: bool,
    /// Lines of other clusters.
    pub foreign: usize,
    /// Lines that fit no form of the grammar.
    pub malformed: Vec<String>,
}

/// Parses `output` for the cluster whose ids start with `cluster_prefix` (empty: every id).
pub fn parse(output: &[u8], cluster_prefix: &str) -> RunnerList {
    let text = String::from_utf8_lossy(output);
    let mut list = RunnerList::default();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if line == "broken" {
            list.broken = true;
            continue;
        }
        let mut words = line.split(' ');
        let id = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
            list.malformed.push(line.chars().take(200).collect());
            continue;
        }
        if !id.starts_with(cluster_prefix) {
            list.foreign += 1;
            continue;
        }
        match rest.as_slice() {
            [] => {
                if !list.running.iter().any(|r| r == id) {
                    list.running.push(id.to_owned());
                }
            }
            ["stale"] => list.stale.push(id.to_owned()),
            _ => list.malformed.push(line.chars().take(200).collect()),
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        output: &'static [u8],
        running: &'static [&'static str],
        stale: &'static [&'static str],
        broken: bool,
        foreign: usize,
        malformed: usize,
    }

    #[test]
    fn grammar_table() {
        let cases = [
            Case {
                name: "nothing runs",
                output: b"",
                running: &[],
                stale: &[],
                broken: false,
                foreign: 0,
                malformed: 0,
            },
            Case {
                name: "two running, trailing newline",
                output: b"zzzzz-a\nzzzzz-b\n",
                running: &["zzzzz-a", "zzzzz-b"],
                stale: &[],
                broken: false,
                foreign: 0,
                malformed: 0,
            },
            Case {
                name: "stale is not running",
                output: b"zzzzz-a stale\nzzzzz-b\n",
                running: &["zzzzz-b"],
                stale: &["zzzzz-a"],
                broken: false,
                foreign: 0,
                malformed: 0,
            },
            Case {
                name: "broken with work",
                output: b"zzzzz-a\nbroken\n",
                running: &["zzzzz-a"],
                stale: &[],
                broken: true,
                foreign: 0,
                malformed: 0,
            },
            Case {
                name: "another cluster's lines are ignored",
                output: b"yyyyy-a\nyyyyy-b stale\nzzzzz-c\n",
                running: &["zzzzz-c"],
                stale: &[],
                broken: false,
                foreign: 2,
                malformed: 0,
            },
            Case {
                name: "malformed lines are counted, not trusted",
                output: b"zzzzz-a running now\n\tzzzzz-b\nzzzzz-c\n \n",
                running: &["zzzzz-c"],
                stale: &[],
                broken: false,
                foreign: 0,
                malformed: 3,
            },
            Case {
                name: "crlf and duplicates",
                output: b"zzzzz-a\r\nzzzzz-a\r\n",
                running: &["zzzzz-a"],
                stale: &[],
                broken: false,
                foreign: 0,
                malformed: 0,
            },
            Case {
                name: "binary garbage does not panic",
                output: b"\xff\xfe\x00zzzzz\n\x00\n",
                running: &[],
                stale: &[],
                broken: false,
                foreign: 0,
                malformed: 2,
            },
        ];
        for case in cases {
            let got = parse(case.output, "zzzzz-");
            assert_eq!(got.running, case.running, "{}", case.name);
            assert_eq!(got.stale, case.stale, "{}", case.name);
            assert_eq!(got.broken, case.broken, "{}", case.name);
            assert_eq!(got.foreign, case.foreign, "{}", case.name);
            assert_eq!(got.malformed.len(), case.malformed, "{}: {:?}", case.name, got.malformed);
        }
    }

    #[test]
    fn empty_prefix_takes_every_id() {
        assert_eq!(parse(b"a\nb stale\n", "").running, ["a"]);
    }
}
