//! `wharf alloc ...`: the allocations of one node, listed, shown, followed, stopped,
//! restarted, signalled and exec'd into through the agent's API. An allocation is named by
//! its id, or by a prefix of one id ([`match_id`]); the API itself takes exact ids only.

// A command line's output is its interface.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use super::common::{NotDone, UsageError, node_config};
use crate::api::{AllocDetail, AllocSummary, ExecResponse, StopManyResult};
use crate::client::{ApiPath, Client, ClientError};
use anyhow::Context;
use clap::Subcommand;
use hyper::Method;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_prober::RunnerOutcome;
use wharf_state::duration::Formatted;
use wharf_state::{AllocState, TaskState, Timestamp};

#[derive(Debug, Subcommand)]
pub(crate) enum AllocCommand {
    /// List allocations.
    List {
        /// Print the runner-list protocol (DESIGN.md) for a prober.
        #[arg(long)]
        probe: bool,
        /// The agent's configuration, to find its data when no agent answers (--probe).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print how an allocation ended, in one line for a dispatcher: `unknown` if this node
    /// does not have it, else its status (`pending`, `running`, `complete`, `failed`, `lost`)
    /// and, once it ended, why.
    Outcome {
        /// The allocation id (exact).
        id: String,
    },
    /// Show an allocation's tasks and recent events.
    Status {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
    },
    /// Print a task's output.
    Logs {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The task.
        task: String,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
        /// Keep printing as the task writes, until it ends.
        #[arg(short, long)]
        follow: bool,
        /// Only the last this many bytes.
        #[arg(long)]
        tail: Option<u64>,
    },
    /// Stop allocations (poststop tasks still run), all in one request.
    Stop {
        /// The allocation ids (each exactly; else a prefix that matches only one).
        #[arg(required = true)]
        ids: Vec<String>,
        /// Wait this long (such as `10s`) for it to end; fail if it has not.
        #[arg(long)]
        wait: Option<String>,
        /// Take the id exactly, never as a prefix: for programs, such as a fleet stopping an
        /// attempt that may be gone while a later one (`<id>__2`) runs.
        #[arg(long)]
        exact: bool,
    },
    /// Restart a task, the running tasks, or (with --all) every task.
    Restart {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The task; without it, every running task.
        task: Option<String>,
        /// Restart the whole allocation, prestart tasks first.
        #[arg(long, conflicts_with = "task")]
        all: bool,
    },
    /// Send a signal to a task, or to every task.
    Signal {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The signal, such as SIGHUP.
        signal: String,
        /// The task; without it, every task.
        #[arg(long)]
        task: Option<String>,
    },
    /// Run a command inside a task.
    Exec {
        /// The allocation id (exactly; else a prefix that matches only one).
        id: String,
        /// The task.
        task: String,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
        /// Give up after this long.
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
}

/// Runs `wharf alloc ...`. `data_dir` is the agent's (`--data-dir`), where `list --probe`
/// finds its store when the agent does not answer.
pub(crate) async fn alloc(
    client: &Client,
    command: AllocCommand,
    data_dir: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        AllocCommand::List { probe: true, config } => {
            let config = node_config(config.as_deref(), data_dir)?;
            crate::probe::print(client, &config).await
        }
        AllocCommand::List { probe: false, .. } => list(client, json).await,
        AllocCommand::Outcome { id } => outcome(client, &id).await,
        AllocCommand::Status { id } => status(client, &id, json).await,
        AllocCommand::Logs { id, task, stderr, follow, tail } => {
            logs(client, &id, &task, LogsWanted { stderr, follow, tail }).await
        }
        AllocCommand::Stop { ids, wait, exact } => stop(client, ids, wait.as_deref(), exact).await,
        AllocCommand::Restart { id, task, all } => restart(client, &id, task.as_deref(), all).await,
        AllocCommand::Signal { id, signal: name, task } => signal(client, &id, &name, task).await,
        AllocCommand::Exec { id, task, command, timeout } => {
            exec(client, &id, &task, &command, &timeout, json).await
        }
    }
}

/// `alloc list`: one line per allocation, with its tasks' states.
async fn list(client: &Client, json: bool) -> anyhow::Result<()> {
    let allocs: Vec<AllocSummary> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&allocs)?);
        return Ok(());
    }
    println!("{:<36}  {:<16}  {:<10}  {:<9}  TASKS", "ID", "JOB", "GROUP", "STATUS");
    for a in allocs {
        let tasks: Vec<String> = a.tasks.iter().map(|(n, s)| format!("{n}:{s}")).collect();
        println!(
            "{:<36}  {:<16}  {:<10}  {:<9}  {}",
            a.id,
            a.job_id,
            a.group,
            a.client_status.to_string(),
            tasks.join(" ")
        );
    }
    Ok(())
}

/// `alloc outcome`: the one line a dispatcher reads ([`outcome_line`]).
async fn outcome(client: &Client, id: &str) -> anyhow::Result<()> {
    wharf_state::check_alloc_id(id)?;
    let detail =
        match client.json::<AllocDetail>(Method::GET, ApiPath::v1(["allocations", id]), None).await
        {
            Ok(detail) => Some(detail),
            Err(ClientError::Api { status, .. }) if status.as_u16() == 404 => None,
            Err(e) => return Err(e.into()),
        };
    println!("{}", outcome_line(detail.as_ref().map(|d| (&d.state, d.done))));
    Ok(())
}

/// How an allocation stands for a dispatcher, from its state and whether its runner is done
/// (`None`: this node does not have it): `unknown`; its status while it may still change;
/// its status and why once it is done.
fn outcome_line(known: Option<(&AllocState, bool)>) -> String {
    let outcome = match known {
        None => RunnerOutcome::Unknown,
        Some((state, true)) => {
            RunnerOutcome::status(state.client_status, &state.client_description)
        }
        Some((state, false)) => RunnerOutcome::status(state.client_status, ""),
    };
    outcome.to_string()
}

/// `alloc status`: the allocation, its tasks, checks and recent events, and what its running
/// tasks use.
async fn status(client: &Client, id: &str, json: bool) -> anyhow::Result<()> {
    let id = resolve(client, id).await?;
    let detail: AllocDetail =
        client.json(Method::GET, ApiPath::v1(["allocations", &id]), None).await?;
    // What its running tasks use; an allocation that is done has none.
    let stats: Option<crate::usage::AllocStats> = if detail.done {
        None
    } else {
        let path = ApiPath::v1(["allocations", &id, "stats"]);
        Some(client.json(Method::GET, path, None).await?)
    };
    if json {
        let mut value = serde_json::to_value(&detail)?;
        value["stats"] = serde_json::to_value(&stats)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_status(&detail);
        if let Some(stats) = stats.filter(|s| !s.tasks.is_empty()) {
            println!();
            println!("Resources:");
            print!("{}", crate::usage::stats_text(&stats));
        }
    }
    Ok(())
}

/// Which of a task's output `alloc logs` prints, and how.
struct LogsWanted {
    /// Standard error rather than standard output.
    stderr: bool,
    /// Keep printing until the task ends.
    follow: bool,
    /// Only the last this many bytes.
    tail: Option<u64>,
}

/// `alloc logs`: a task's output, copied as it streams from the agent.
async fn logs(client: &Client, id: &str, task: &str, wanted: LogsWanted) -> anyhow::Result<()> {
    let id = resolve(client, id).await?;
    let mut path = ApiPath::v1(["allocations", &id, "logs", task])
        .query("stream", if wanted.stderr { "stderr" } else { "stdout" })
        .query_opt("tail", wanted.tail);
    if wanted.follow {
        // Followed from the start, unless only the tail is wanted.
        path = path.query("follow", true).query_opt("offset", wanted.tail.is_none().then_some(0));
    }
    let response = client.send(Method::GET, path, None).await?;
    let mut body = response.into_body();
    let mut out = std::io::stdout();
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        if let Ok(data) = frame.context("the log stream broke")?.into_data() {
            out.write_all(&data)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// `alloc stop`: asks the agent to stop the allocations, in one request that answers once
/// every stop is durable; with `wait`, waits that long for each to end and fails if one has
/// not. An id the agent does not know fails the command, after the others are stopped.
async fn stop(
    client: &Client,
    given: Vec<String>,
    wait: Option<&str>,
    exact: bool,
) -> anyhow::Result<()> {
    let wait = wait.map(wharf_state::duration::parse).transpose()?;
    let ids = if exact {
        for id in &given {
            wharf_state::check_alloc_id(id)?;
        }
        given
    } else {
        resolve_all(client, &given).await?
    };
    let body = serde_json::json!({ "ids": ids });
    let result: StopManyResult =
        client.json(Method::POST, ApiPath::v1(["allocations", "stop"]), Some(body)).await?;
    for id in &result.stopped {
        if wait.is_none() {
            println!("stopping {id}");
        }
    }
    // Only an exact id can be unknown here: a resolved one was just listed.
    if !result.unknown.is_empty() || !result.failed.is_empty() {
        let mut problems: Vec<String> =
            result.unknown.iter().map(|id| format!("no allocation {id:?} on this node")).collect();
        problems.extend(result.failed.iter().map(|(id, error)| format!("{id}: {error}")));
        let message = problems.join("; ");
        return Err(if result.failed.is_empty() {
            UsageError(message).into()
        } else {
            anyhow::anyhow!(message)
        });
    }
    let Some(wait) = wait else { return Ok(()) };
    let deadline = tokio::time::Instant::now() + wait;
    for id in &result.stopped {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let detail = wait_until_done(client, id, left).await?;
        if !detail.done {
            return Err(NotDone(format!("{id} is still stopping after {}", Formatted(wait))).into());
        }
        println!("stopped {id}: {}", detail.state.client_status);
    }
    Ok(())
}

/// The allocation once its runner is done, or as it stands when `wait` has passed: blocking
/// queries, each bounded by the time left.
async fn wait_until_done(client: &Client, id: &str, wait: Duration) -> anyhow::Result<AllocDetail> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut version = String::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let path = ApiPath::v1(["allocations", id])
            .query("after", &version)
            .query("wait", Formatted(left.max(Duration::from_millis(1))));
        let detail: AllocDetail = client.json(Method::GET, &path, None).await?;
        if detail.done || left.is_zero() {
            return Ok(detail);
        }
        version = detail.version.clone();
    }
}

/// `alloc restart`: one task, the running tasks, or (`all`) the whole allocation.
async fn restart(client: &Client, id: &str, task: Option<&str>, all: bool) -> anyhow::Result<()> {
    let id = resolve(client, id).await?;
    let body = serde_json::json!({ "task": task, "all": all });
    client
        .call(
            Method::POST,
            ApiPath::v1(["allocations", &id, "restart"]),
            Some(("application/json", body.to_string().into_bytes())),
        )
        .await?;
    println!("restarting {}", task.unwrap_or(if all { "every task" } else { "the running tasks" }));
    Ok(())
}

/// `alloc signal`: a signal to one task, or to every task.
async fn signal(
    client: &Client,
    id: &str,
    signal: &str,
    task: Option<String>,
) -> anyhow::Result<()> {
    let id = resolve(client, id).await?;
    let body = serde_json::json!({ "signal": signal, "task": task });
    client
        .call(
            Method::POST,
            ApiPath::v1(["allocations", &id, "signal"]),
            Some(("application/json", body.to_string().into_bytes())),
        )
        .await?;
    Ok(())
}

/// `alloc exec`: a command run inside a task; its output is printed as it was written, and a
/// command that failed fails this one (exit 1).
async fn exec(
    client: &Client,
    id: &str,
    task: &str,
    command: &[String],
    timeout: &str,
    json: bool,
) -> anyhow::Result<()> {
    let id = resolve(client, id).await?;
    let body = serde_json::json!({ "task": task, "command": command, "timeout": timeout });
    let result: ExecResponse =
        client.json(Method::POST, ApiPath::v1(["allocations", &id, "exec"]), Some(body)).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", result.stdout);
        eprint!("{}", result.stderr);
        if result.exit_code != 0 || result.signal.is_some() {
            return Err(NotDone(format!(
                "the command exited with code {}{}",
                result.exit_code,
                result.signal.map(|s| format!(" (signal {s})")).unwrap_or_default()
            ))
            .into());
        }
    }
    Ok(())
}

/// The allocation `given` names: the one with exactly that id, else the one id it is a
/// prefix of, else the one allocation of the job of that id. The API itself takes exact ids
/// only; prefixes and job ids are a convenience of the CLI.
async fn resolve(client: &Client, given: &str) -> anyhow::Result<String> {
    let allocs: Vec<AllocSummary> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    match match_id(allocs.iter().map(|a| a.id.as_str()), given) {
        Ok(id) => Ok(id.to_owned()),
        Err(not_an_id) => by_job(&allocs, given).unwrap_or(Err(not_an_id)),
    }
}

/// Each of `given` resolved as [`resolve`] does, from one listing.
async fn resolve_all(client: &Client, given: &[String]) -> anyhow::Result<Vec<String>> {
    let allocs: Vec<AllocSummary> =
        client.json(Method::GET, ApiPath::v1(["allocations"]), None).await?;
    given
        .iter()
        .map(|one| match match_id(allocs.iter().map(|a| a.id.as_str()), one) {
            Ok(id) => Ok(id.to_owned()),
            Err(not_an_id) => by_job(&allocs, one).unwrap_or(Err(not_an_id)),
        })
        .collect()
}

/// The allocation of job `given`, if the job has one alone; None if it has none.
fn by_job(allocs: &[AllocSummary], given: &str) -> Option<anyhow::Result<String>> {
    let of_job: Vec<&str> =
        allocs.iter().filter(|a| a.job_id == given).map(|a| a.id.as_str()).collect();
    match of_job.as_slice() {
        [] => None,
        [one] => Some(Ok((*one).to_owned())),
        many => Some(Err(UsageError(format!(
            "job {given:?} has {} allocations ({}); name one, or see `wharf job status {given}`",
            many.len(),
            many.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        ))
        .into())),
    }
}

/// An exact match always wins, so an id that begins another (`job-1`, `job-10`) is never
/// ambiguous; a prefix is taken only when it matches one id.
fn match_id<'a>(ids: impl Iterator<Item = &'a str>, given: &str) -> anyhow::Result<&'a str> {
    let mut matches = Vec::new();
    for id in ids {
        if id == given {
            return Ok(id);
        }
        if id.starts_with(given) {
            matches.push(id);
        }
    }
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(UsageError(format!("no allocation {given:?} on this node")).into()),
        many => Err(UsageError(format!(
            "{given:?} is not an allocation id, and {} ids start with it ({}); give more of the id",
            many.len(),
            many.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        ))
        .into()),
    }
}

/// How an allocation's health reads: judged (when, and why if unhealthy) or not yet.
fn health_line(state: &AllocState) -> String {
    let Some(status) = state.deployment_status.as_ref() else { return "not judged yet".into() };
    let when = status.timestamp.map(|t| format!(" at {t}")).unwrap_or_default();
    match (status.healthy, &status.description) {
        (Some(true), _) => format!("healthy{when}"),
        (Some(false), Some(reason)) => format!("unhealthy{when}: {reason}"),
        (Some(false), None) => format!("unhealthy{when}"),
        (None, _) => "not judged yet".into(),
    }
}

fn print_status(detail: &AllocDetail) {
    let (alloc, state) = (&detail.alloc, &detail.state);
    println!("ID       = {}", alloc.id);
    println!("Job      = {} (group {})", alloc.job.id, alloc.task_group);
    println!("Desired  = {:?}", alloc.desired_status);
    println!("Status   = {}: {}", state.client_status, state.client_description);
    println!("Health   = {}", health_line(state));
    if !alloc.ports.is_empty() {
        let ports: Vec<String> =
            alloc.ports.iter().map(|p| format!("{} {}", p.label, p.address())).collect();
        println!("Ports    = {}", ports.join(", "));
    }
    println!();
    println!(
        "{:<16} {:<8} {:<8} {:<24} {:<24}",
        "TASK", "STATE", "RESTARTS", "STARTED", "FINISHED"
    );
    for (name, task) in &state.task_states {
        let status =
            if task.failed { format!("{} (failed)", task.status) } else { task.status.to_string() };
        let time = |t: Option<Timestamp>| t.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{name:<16} {status:<8} {:<8} {:<24} {:<24}",
            task.restarts,
            time(task.started_at),
            time(task.finished_at)
        );
    }
    print_checks(detail);
    println!();
    println!("Recent events:");
    let mut events: Vec<(&String, &TaskState, &wharf_state::TaskEvent)> = state
        .task_states
        .iter()
        .flat_map(|(n, t)| t.events.iter().map(move |e| (n, t, e)))
        .collect();
    events.sort_by_key(|(_, _, e)| e.time);
    for (name, _, event) in events.iter().rev().take(20).rev() {
        println!("  {}  {name:<16} {:<20} {}", event.time, event.kind.title(), event.kind);
    }
}

/// The allocation's checks with the first line of each one's latest output, if it has any.
fn print_checks(detail: &AllocDetail) {
    if detail.checks.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<16} {:<16} {:<20} {:<7} {:<9} OUTPUT",
        "TASK", "SERVICE", "CHECK", "TYPE", "STATUS"
    );
    for check in &detail.checks {
        let output = check.last.as_ref().map_or("waiting to run", |r| r.output.as_str());
        let first_line = output.lines().next().unwrap_or_default();
        let kind = serde_json::to_value(check.kind).ok();
        println!(
            "{:<16} {:<16} {:<20} {:<7} {:<9} {first_line}",
            check.task,
            check.service,
            check.check,
            kind.as_ref().and_then(|k| k.as_str()).unwrap_or("-"),
            check.status.to_string()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_state::{ClientStatus, DeploymentStatus};

    /// Which allocation a given id names among `job-1`, `job-10`, `other-7`.
    #[test]
    fn match_id_table() {
        let ids = ["job-1", "job-10", "other-7"];
        let table: [(&str, Result<&str, &str>); 6] = [
            ("job-1", Ok("job-1")),
            ("job-10", Ok("job-10")),
            ("oth", Ok("other-7")),
            (
                "job-",
                Err("\"job-\" is not an allocation id, and 2 ids start with it (job-1, job-10)"),
            ),
            ("nothing", Err("no allocation \"nothing\" on this node")),
            ("job-100", Err("no allocation \"job-100\" on this node")),
        ];
        for (given, expected) in table {
            let got = match_id(ids.into_iter(), given).map_err(|e| e.to_string());
            match expected {
                Ok(id) => assert_eq!(got.as_deref(), Ok(id), "{given:?}"),
                Err(message) => assert!(
                    got.as_ref().is_err_and(|e| e.starts_with(message)),
                    "{given:?}: {got:?}"
                ),
            }
        }
    }

    fn state(status: ClientStatus, description: &str) -> AllocState {
        AllocState {
            client_status: status,
            client_description: description.into(),
            task_states: Default::default(),
            deployment_status: None,
        }
    }

    /// The line `alloc outcome` prints: one line, whatever the description holds.
    #[test]
    fn outcome_line_table() {
        let failed = state(ClientStatus::Failed, "task t failed:\nexit code 3\n");
        let table = [
            (None, "unknown"),
            (Some((state(ClientStatus::Running, "Tasks are running"), false)), "running"),
            (Some((state(ClientStatus::Pending, "No tasks have started"), false)), "pending"),
            (
                Some((state(ClientStatus::Complete, "All tasks have completed"), true)),
                "complete All tasks have completed",
            ),
            (Some((state(ClientStatus::Complete, ""), true)), "complete"),
            (Some((failed, true)), "failed task t failed: exit code 3"),
            (Some((state(ClientStatus::Lost, "the node lost it"), true)), "lost the node lost it"),
        ];
        for (known, line) in table {
            let got = outcome_line(known.as_ref().map(|(state, done)| (state, *done)));
            assert_eq!(got, line, "{known:?}");
        }
    }

    /// How an allocation's health reads in `alloc status`.
    #[test]
    fn health_line_table() {
        let at = Timestamp(1_000);
        let judged = |healthy, timestamp, description: Option<&str>| DeploymentStatus {
            healthy,
            timestamp,
            description: description.map(str::to_owned),
            canary: false,
            modify_index: 1,
        };
        let table = [
            (None, "not judged yet".to_owned()),
            (Some(judged(None, Some(at), None)), "not judged yet".to_owned()),
            (Some(judged(Some(true), Some(at), None)), format!("healthy at {at}")),
            (Some(judged(Some(true), None, Some("ignored"))), "healthy".to_owned()),
            (
                Some(judged(Some(false), Some(at), Some("check web failed"))),
                format!("unhealthy at {at}: check web failed"),
            ),
            (Some(judged(Some(false), None, None)), "unhealthy".to_owned()),
        ];
        for (deployment, line) in table {
            let alloc = AllocState {
                deployment_status: deployment.clone(),
                ..state(ClientStatus::Running, "")
            };
            assert_eq!(health_line(&alloc), line, "{deployment:?}");
        }
    }
}
