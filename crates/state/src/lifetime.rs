//! How long an allocation may run and how it is wound down: the checks of a group's
//! `max_run_duration` and of the group's and tasks' `shutdown_delay`.

use crate::duration::Formatted;
use crate::problems::Problems;
use crate::spec::TaskGroup;
use std::time::Duration;

/// The longest `shutdown_delay` a spec may ask for: a stop must end in bounded time.
pub(crate) const MAX_SHUTDOWN_DELAY: Duration = Duration::from_secs(3600);

/// Adds the problems of `group`'s (at `at`) and its tasks' lifetime settings.
pub(crate) fn validate_group(problems: &mut Problems, at: &str, group: &TaskGroup) {
    if group.max_run_duration == Some(Duration::ZERO) {
        problems.add(
            &format!("{at}.max_run_duration"),
            "must be longer than 0; leave it out for no limit".into(),
        );
    }
    let delays = std::iter::once((format!("{at}.shutdown_delay"), group.shutdown_delay)).chain(
        group
            .tasks
            .iter()
            .enumerate()
            .map(|(ti, task)| (format!("{at}.task[{ti}].shutdown_delay"), task.shutdown_delay)),
    );
    for (field, delay) in delays {
        if let Some(delay) = delay
            && delay > MAX_SHUTDOWN_DELAY
        {
            problems.add(
                &field,
                format!(
                    "{} is longer than the maximum of {}",
                    Formatted(delay),
                    Formatted(MAX_SHUTDOWN_DELAY)
                ),
            );
        }
    }
}
