//! wharf's job specs from outside wharf: read one, check one that is wrong (every problem
//! named by its field), and show an allocation's status as its tasks move.
//!
//! `cargo run -p wharf-state --example spec`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use wharf_state::{AllocState, Allocation, TaskStatus, Timestamp};

const SPEC: &str = r#"
[job]
id = "hello"
type = "service"

[group]
name = "web"

[[group.task]]
name = "server"
driver = "raw_exec"
leader = true
kill_signal = "SIGTERM"
config = { command = "python3", args = ["-m", "http.server", "8080"] }
restart = { attempts = 2, interval = "30m", delay = "15s", mode = "fail" }
"#;

const BROKEN: &str = r#"
[job]
id = "hello"
type = "service"

[group]
name = "web"

[[group.task]]
name = "a/b"
driver = "raw_exec"
restart = { attempts = 10, delay = "1m", interval = "5m" }

[[group.task]]
name = "cleanup"
driver = "raw_exec"
lifecycle = { hook = "poststop", sidecar = true }
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let job = wharf_state::parse_toml(SPEC)?;
    let group = &job.groups[0];
    let policy = job.restart_policy(group, &group.tasks[0]);
    let interval = wharf_state::duration::Formatted(policy.interval);
    println!(
        "{}: {} task(s); server restarts {} times in {interval}",
        job.id,
        group.tasks.len(),
        policy.attempts
    );

    let problems = wharf_state::parse_toml(BROKEN).expect_err("the broken spec is refused");
    println!("refused, {} problems:\n{problems}", problems.problems.len());
    assert_eq!(problems.problems.len(), 3);

    let alloc = Allocation::new("a1", job, "web");
    let mut state = AllocState::pending(["server".to_owned()]);
    for (status, at) in [(TaskStatus::Running, 1_000), (TaskStatus::Dead, 9_000)] {
        state.task_states.get_mut("server").expect("the task").set_status(status, Timestamp(at))?;
        state.settle(alloc.deployment_id.is_some(), Timestamp(at));
        println!(
            "server {status}: allocation {} ({})",
            state.client_status, state.client_description
        );
    }
    println!("as JSON: {}", wharf_state::serde_json::to_string(&state.task_states["server"])?);
    Ok(())
}
