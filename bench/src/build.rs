//! What a new user waits for and what the fleet deploys: the size of the `wharf` binary, and
//! (in a full run) the README's first build from a clean target directory.
//!
//! The build is timed from a clone of the workspace's HEAD with a target directory of its own
//! and the machine's cargo cache (so downloads are not counted: they depend on the network,
//! not on wharf), `PROTOC` refused as in CI. A quick run only weighs the binary.

use crate::report::{Better, Row};
use crate::target::Target;
use crate::{Effort, exec};
use std::process::Command;
use std::time::Instant;

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let wharf = exec::built("wharf-node", "wharf")?;
    let bytes = std::fs::metadata(&wharf).map_err(|e| format!("{}: {e}", wharf.display()))?.len();
    let mut rows = vec![Row {
        name: format!(
            "build: size of the {} `wharf` binary (what the fleet copies to each worker)",
            if cfg!(debug_assertions) { "debug" } else { "release" }
        ),
        unit: "MB",
        better: Better::Lower,
        samples: vec![bytes as f64 / 1e6],
        baseline: None,
        target: Some(Target::parse("≤ 25 MB")?),
    }];
    if effort.runs > 1 {
        rows.push(Row {
            name: "build: `cargo build --release` of a clean clone, to the binary (cargo cache warm, downloads not counted)".into(),
            unit: "s",
            better: Better::Lower,
            samples: vec![clean_release_build()?],
            baseline: None,
            target: Some(Target::parse("≤ 4 min, downloads included")?),
        });
    }
    Ok(rows)
}

/// Seconds for `cargo build --release` in a fresh clone of HEAD.
fn clean_release_build() -> Result<f64, String> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let clone = crate::scratch::dir("clean-build");
    let status = Command::new("git")
        .args(["clone", "--quiet", "--no-hardlinks"])
        .arg(&workspace)
        .arg(&clone)
        .status()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !status.success() {
        return Err(format!("git clone of the workspace failed ({status})"));
    }
    let started = Instant::now();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--quiet"])
        .current_dir(&clone)
        .env_remove("CARGO_TARGET_DIR")
        .env("PROTOC", "/bin/false")
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        return Err(format!("cargo build --release of a clean clone failed ({status})"));
    }
    Ok(seconds)
}
