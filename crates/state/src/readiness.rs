//! Start ordering by readiness: the checks of a task's `wait_healthy` list, the `READY=1`
//! notifications of its `wait_ready` list, and its `wait_deadline`. A task so configured
//! starts only once every task it names has passed its checks or said it is ready; the alloc
//! runner holds it and fails the allocation at the deadline.

use crate::duration::Formatted;
use crate::problems::Problems;
use std::collections::HashMap;
use std::time::Duration;

/// How long a task waits for the tasks it names in `wait_healthy` when `wait_deadline` is not
/// set.
pub const DEFAULT_WAIT_DEADLINE: Duration = Duration::from_secs(300);

/// The longest `wait_deadline` a spec may ask for: every wait is bounded.
pub(crate) const MAX_WAIT_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// What validation reads of a task: its name, its waits, whether it has a check to pass and
/// whether it can say it is ready.
pub(crate) struct TaskWaits<'a> {
    pub(crate) name: &'a str,
    pub(crate) wait_healthy: &'a [String],
    pub(crate) wait_ready: &'a [String],
    pub(crate) notify_socket: bool,
    pub(crate) wait_deadline: Option<Duration>,
    pub(crate) has_checks: bool,
}

impl TaskWaits<'_> {
    /// Every task it waits for, by checks or by notification.
    fn waits(&self) -> impl Iterator<Item = &String> {
        self.wait_healthy.iter().chain(self.wait_ready)
    }
}

/// Adds the problems of the `wait_healthy` and `wait_ready` lists and deadlines of a group's
/// (at `at`) tasks: an unknown task, a task waiting on itself, a task without checks to pass
/// or without a notify socket to say it is ready on, a cycle.
pub(crate) fn validate(problems: &mut Problems, at: &str, tasks: &[TaskWaits<'_>]) {
    let index: HashMap<&str, usize> =
        tasks.iter().enumerate().map(|(ti, t)| (t.name, ti)).collect();
    for (ti, task) in tasks.iter().enumerate() {
        for (list, names) in [("wait_healthy", task.wait_healthy), ("wait_ready", task.wait_ready)]
        {
            let field = format!("{at}.task[{ti}].{list}");
            for name in names {
                if name == task.name {
                    problems.add(&field, format!("task {name:?} cannot wait for itself"));
                    continue;
                }
                let Some(&other) = index.get(name.as_str()) else {
                    problems.add(&field, format!("no task {name:?} in this group"));
                    continue;
                };
                if list == "wait_healthy" && !tasks[other].has_checks {
                    problems.add(
                        &field,
                        format!("task {name:?} has no service check, so it can never pass one"),
                    );
                }
                if list == "wait_ready" && !tasks[other].notify_socket {
                    problems.add(
                        &field,
                        format!(
                            "task {name:?} does not set notify_socket = true, so it can never \
                             say READY=1"
                        ),
                    );
                }
            }
        }
        if let Some(deadline) = task.wait_deadline {
            let field = format!("{at}.task[{ti}].wait_deadline");
            if task.waits().next().is_none() {
                problems.add(
                    &field,
                    "is set but names no task to wait for in wait_healthy or wait_ready".into(),
                );
            } else if deadline.is_zero() {
                problems.add(&field, "must be longer than 0".into());
            } else if deadline > MAX_WAIT_DEADLINE {
                problems.add(
                    &field,
                    format!(
                        "{} is longer than the maximum of {}",
                        Formatted(deadline),
                        Formatted(MAX_WAIT_DEADLINE)
                    ),
                );
            }
        }
    }
    if let Some(cycle) = find_cycle(tasks, &index) {
        let (ti, _) = cycle[0];
        let names: Vec<&str> = cycle.iter().map(|(_, name)| *name).collect();
        let list = if tasks[ti].wait_healthy.is_empty() { "wait_ready" } else { "wait_healthy" };
        problems.add(
            &format!("{at}.task[{ti}].{list}"),
            format!("tasks wait for each other in a cycle: {}", names.join(" -> ")),
        );
    }
}

/// The first cycle of waits found, as (task index, name) from a task back to itself.
fn find_cycle<'a>(
    tasks: &[TaskWaits<'a>],
    index: &HashMap<&str, usize>,
) -> Option<Vec<(usize, &'a str)>> {
    // 0: not seen, 1: on the current path, 2: done.
    let mut mark = vec![0u8; tasks.len()];
    let mut path = Vec::new();
    for start in 0..tasks.len() {
        if mark[start] == 0
            && let Some(cycle) = visit(tasks, index, start, &mut mark, &mut path)
        {
            return Some(cycle);
        }
    }
    None
}

fn visit<'a>(
    tasks: &[TaskWaits<'a>],
    index: &HashMap<&str, usize>,
    at: usize,
    mark: &mut [u8],
    path: &mut Vec<usize>,
) -> Option<Vec<(usize, &'a str)>> {
    mark[at] = 1;
    path.push(at);
    for name in tasks[at].waits() {
        // A task waiting on itself is reported on its own.
        let Some(&next) = index.get(name.as_str()).filter(|&&next| next != at) else { continue };
        if mark[next] == 1 {
            let from = path.iter().position(|&p| p == next).unwrap_or(0);
            let mut cycle: Vec<(usize, &str)> =
                path[from..].iter().map(|&p| (p, tasks[p].name)).collect();
            cycle.push((next, tasks[next].name));
            return Some(cycle);
        }
        if mark[next] == 0
            && let Some(cycle) = visit(tasks, index, next, mark, path)
        {
            return Some(cycle);
        }
    }
    path.pop();
    mark[at] = 2;
    None
}
