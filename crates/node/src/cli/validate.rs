//! `wharf validate`: a job spec checked without running it.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use super::common::read_spec;
use std::path::Path;
use std::process::ExitCode;

/// Reads and checks `file`, and says what it holds (`--json`: the spec as the agent takes it).
pub(crate) fn validate(file: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let job = read_spec(file)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&job.to_spec())?);
    } else {
        let tasks: Vec<&str> =
            job.groups.iter().flat_map(|g| g.tasks.iter().map(|t| t.name.as_str())).collect();
        println!(
            "{}: job {:?} is valid ({} tasks: {})",
            file.display(),
            job.id,
            tasks.len(),
            tasks.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
