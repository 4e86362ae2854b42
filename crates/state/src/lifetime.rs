//! How long an allocation may run and how it is wound down: the checks of a group's
//! `max_run_duration` and of the group's and tasks' `shutdown_delay`.

use crate::duration::Formatted;
use crate::problems::Problems;
use std::time::Duration;

/// The longest `shutdown_delay` a spec may ask for: a stop must end in bounded time.
pub(crate) const MAX_SHUTDOWN_DELAY: Duration = Duration::from_secs(3600);

/// Adds the problems of a group's (at `at`) lifetime settings and of its tasks' delays, in
/// the tasks' order.
pub(crate) fn validate_group(
    problems: &mut Problems,
    at: &str,
    max_run_duration: Option<Duration>,
    shutdown_delay: Option<Duration>,
    task_delays: impl Iterator<Item = Option<Duration>>,
) {
    if max_run_duration == Some(Duration::ZERO) {
        problems.add(
            &format!("{at}.max_run_duration"),
            "must be longer than 0; leave it out for no limit".into(),
        );
    }
    let delays = std::iter::once((format!("{at}.shutdown_delay"), shutdown_delay)).chain(
        task_delays
            .enumerate()
            .map(|(ti, delay)| (format!("{at}.task[{ti}].shutdown_delay"), delay)),
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
