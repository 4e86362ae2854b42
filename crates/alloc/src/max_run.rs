//! The group's `max_run_duration`: how long is left of it, and the wait until it is spent.
//!
//! The allocation's run is measured from its first task's start (kept in the task states, so
//! an agent restart does not start the count over) or, before any task has started, from the
//! moment the wait began. An update may change the limit, longer or shorter, or remove it: the
//! wait looks again at every change. What happens once it is spent (the tasks killed, the
//! poststop tasks skipped) is the alloc runner's.

use std::time::Duration;
use tokio::sync::Notify;
use wharf_state::Timestamp;
use wharf_task::WallClock;

/// How long is left of `limit` for a run that began at `origin`, at `now`; zero once spent.
pub(crate) fn remaining(limit: Duration, origin: Timestamp, now: Timestamp) -> Duration {
    limit.saturating_sub(now.since(origin))
}

/// Waits until the run that began at `origin` has lasted the limit `limit()` gives (read again
/// whenever `changed` is notified; None is no limit) and returns that limit. Never returns
/// while there is no limit; the caller races it against the end of the run.
pub(crate) async fn spent(
    clock: &dyn WallClock,
    origin: Timestamp,
    limit: impl Fn() -> Option<Duration>,
    changed: &Notify,
) -> Duration {
    loop {
        let Some(limit) = limit() else {
            changed.notified().await;
            continue;
        };
        let left = remaining(limit, origin, clock.now());
        if left.is_zero() {
            return limit;
        }
        tokio::select! {
            () = tokio::time::sleep(left) => {}
            () = changed.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use wharf_task::TokioClock;

    #[test]
    fn remaining_counts_from_the_origin_and_stops_at_zero() {
        let limit = Duration::from_secs(10);
        let origin = Timestamp(1_000);
        assert_eq!(remaining(limit, origin, Timestamp(1_000)), limit);
        assert_eq!(remaining(limit, origin, Timestamp(4_000)), Duration::from_secs(7));
        assert_eq!(remaining(limit, origin, Timestamp(11_000)), Duration::ZERO);
        assert_eq!(remaining(limit, origin, Timestamp(99_000)), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_limit_is_read_again() {
        let clock = TokioClock::starting_at(Timestamp(0));
        let limit = Arc::new(parking_lot::Mutex::new(Some(Duration::from_secs(5))));
        let changed = Notify::new();
        let started = tokio::time::Instant::now();
        let wait = spent(&clock, Timestamp(0), || *limit.lock(), &changed);
        let extend = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            *limit.lock() = Some(Duration::from_secs(8));
            changed.notify_one();
        };
        let (spent_limit, ()) = tokio::join!(wait, extend);
        assert_eq!(spent_limit, Duration::from_secs(8));
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(8),
            "the extension counts from the origin"
        );
    }
}
