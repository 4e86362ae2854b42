//! Prometheus' own linter on wharf's metrics: `promtool check metrics` reads a text exposition
//! on its standard input and names every problem (a counter without `_total`, a gauge with
//! it, a missing `HELP`). Without promtool this is an error that says how to install it, so
//! the tests that use it fail rather than skip.

// This fixture's job is to run promtool.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::process::{Command, Stdio};

const INSTALL: &str =
    "promtool is needed for this test: apt-get install prometheus (it ships /usr/bin/promtool)";

/// Runs `promtool check metrics` on `text`; `Err` carries everything promtool objected to.
pub fn check_metrics(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run promtool ({e}). {INSTALL}"))?;
    let mut stdin = child.stdin.take().ok_or("promtool started without a standard input")?;
    let text = text.to_owned();
    // promtool reads everything before it answers; write from a thread so a large exposition
    // cannot fill the pipe while this thread waits on the output.
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let output = child.wait_with_output().map_err(|e| format!("promtool did not finish: {e}"))?;
    writer
        .join()
        .map_err(|_| "the thread feeding promtool panicked".to_owned())?
        .map_err(|e| format!("cannot feed promtool: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics: {}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promtool_names_what_is_wrong() {
        let good = "# HELP wharf_x_total Things.\n# TYPE wharf_x_total counter\nwharf_x_total 1\n";
        assert_eq!(check_metrics(good), Ok(()));
        let bad = "# HELP wharf_x Things.\n# TYPE wharf_x counter\nwharf_x 1\n";
        let err = check_metrics(bad).unwrap_err();
        assert!(err.contains("wharf_x") && err.contains("_total"), "{err}");
    }
}
