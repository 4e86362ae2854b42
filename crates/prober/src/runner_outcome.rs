//! The runner-outcome protocol: how work that left the runner list ended, parsed once.
//!
//! The runner's outcome command (`wharf alloc outcome ID`, [`RunnerConfig::outcome_args`](
//! crate::RunnerConfig)) prints one line about one unit of work:
//!
//! | line | [`RunnerOutcome`] | meaning |
//! |------|-------------------|---------|
//! | `unknown` | [`Unknown`](RunnerOutcome::Unknown) | the runner never had it, or no longer knows it |
//! | `pending`, `running` (then anything) | [`Status`](RunnerOutcome::Status), not ended | it has not ended: the probe that missed it raced its start |
//! | `complete`, `failed`, `lost` (then why) | [`Status`](RunnerOutcome::Status), ended | it ended, and why |
//! | anything else | [`Other`](RunnerOutcome::Other) | an end the runner describes in its own words, not a failure |
//!
//! The status words are wharf-state's [`ClientStatus`] names (its `Display` and `FromStr`), so
//! the node that prints the line and the fleet that reads it share one spelling: the node
//! prints a [`RunnerOutcome`] through its `Display`, and [`RunnerOutcome::parse`] reads it back.

use std::fmt;
use wharf_state::ClientStatus;

/// One outcome line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerOutcome {
    /// `unknown`: the runner does not have the work.
    Unknown,
    /// `<status>` or `<status> <detail>`: the work's status as its runner sees it, and once it
    /// ended, why.
    Status {
        /// Its status.
        status: ClientStatus,
        /// What the runner says beside it (why it ended); may be empty.
        detail: String,
    },
    /// A line of no other form, kept as the runner said it.
    Other(String),
}

impl RunnerOutcome {
    /// The line for work in `status`, with `detail` made one line (its line breaks become
    /// spaces, its trailing spaces go).
    pub fn status(status: ClientStatus, detail: &str) -> RunnerOutcome {
        RunnerOutcome::Status { status, detail: detail.replace('\n', " ").trim_end().to_owned() }
    }

    /// Parses one line (the runner's first, trimmed).
    pub fn parse(line: &str) -> RunnerOutcome {
        if line == "unknown" {
            return RunnerOutcome::Unknown;
        }
        let (word, detail) = line.split_once(' ').unwrap_or((line, ""));
        match word.parse::<ClientStatus>() {
            Ok(status) => RunnerOutcome::Status { status, detail: detail.to_owned() },
            Err(_) => RunnerOutcome::Other(line.to_owned()),
        }
    }

    /// Whether the work has ended, by the runner's word: not `pending` or `running`. (Work the
    /// runner does not know has not ended there either: it never started, or was forgotten.)
    pub fn has_ended(&self) -> bool {
        match self {
            RunnerOutcome::Unknown => false,
            RunnerOutcome::Status { status, .. } => {
                !matches!(status, ClientStatus::Pending | ClientStatus::Running)
            }
            RunnerOutcome::Other(_) => true,
        }
    }

    /// Whether it ended `failed`.
    pub fn failed(&self) -> bool {
        matches!(self, RunnerOutcome::Status { status: ClientStatus::Failed, .. })
    }

    /// Whether it ended `complete`.
    pub fn completed(&self) -> bool {
        matches!(self, RunnerOutcome::Status { status: ClientStatus::Complete, .. })
    }
}

impl fmt::Display for RunnerOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunnerOutcome::Unknown => f.write_str("unknown"),
            RunnerOutcome::Status { status, detail } if detail.is_empty() => write!(f, "{status}"),
            RunnerOutcome::Status { status, detail } => write!(f, "{status} {detail}"),
            RunnerOutcome::Other(line) => f.write_str(line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form of the grammar: the line, what it parses to, whether the work ended and
    /// whether it failed. Each line prints back as it was.
    #[test]
    fn outcome_table() {
        let status = |status, detail: &str| RunnerOutcome::Status { status, detail: detail.into() };
        let other = |line: &str| RunnerOutcome::Other(line.into());
        let cases = [
            ("unknown", RunnerOutcome::Unknown, false, false),
            ("pending", status(ClientStatus::Pending, ""), false, false),
            ("running", status(ClientStatus::Running, ""), false, false),
            ("running since 10:00", status(ClientStatus::Running, "since 10:00"), false, false),
            ("complete", status(ClientStatus::Complete, ""), true, false),
            (
                "complete all tasks finished",
                status(ClientStatus::Complete, "all tasks finished"),
                true,
                false,
            ),
            ("failed", status(ClientStatus::Failed, ""), true, true),
            ("failed exit 3", status(ClientStatus::Failed, "exit 3"), true, true),
            ("lost its node went", status(ClientStatus::Lost, "its node went"), true, false),
            // Not the grammar's: an end in the runner's words, never a failure.
            ("unknown to me", other("unknown to me"), true, false),
            ("failed: exit 3", other("failed: exit 3"), true, false),
            ("Complete", other("Complete"), true, false),
            ("done", other("done"), true, false),
            ("", other(""), true, false),
        ];
        for (line, want, ended, failed) in cases {
            let got = RunnerOutcome::parse(line);
            assert_eq!(got, want, "{line:?}");
            assert_eq!(got.has_ended(), ended, "{line:?} ended");
            assert_eq!(got.failed(), failed, "{line:?} failed");
            assert_eq!(got.to_string(), line, "{line:?} prints back");
        }
    }

    /// The node's line: one line whatever the detail holds, no trailing space when it has none.
    #[test]
    fn a_status_line_is_one_line() {
        let cases = [
            (ClientStatus::Failed, "", "failed"),
            (ClientStatus::Failed, "  ", "failed"),
            (ClientStatus::Complete, "all tasks finished\n", "complete all tasks finished"),
            (
                ClientStatus::Failed,
                "task a failed\ntask b failed",
                "failed task a failed task b failed",
            ),
            (ClientStatus::Running, "", "running"),
        ];
        for (status, detail, line) in cases {
            let outcome = RunnerOutcome::status(status, detail);
            assert_eq!(outcome.to_string(), line, "{status} {detail:?}");
            assert_eq!(RunnerOutcome::parse(line), outcome, "{line:?} reads back");
        }
    }
}
