//! Wall-clock time for event timestamps, injected so tests control it.
//!
//! Durations and timeouts use tokio's clock; only the timestamps written into task states and
//! events need the wall clock.

use std::time::Duration;
use wharf_state::Timestamp;

/// Where a runner gets the time of day from.
pub trait WallClock: Send + Sync + std::fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> Timestamp {
        #[allow(clippy::disallowed_methods)] // This is the one wall-clock read of the runners.
        let now = std::time::SystemTime::now();
        Timestamp::from_unix(now.duration_since(std::time::UNIX_EPOCH).unwrap_or(Duration::ZERO))
    }
}

/// A clock that starts at a fixed time and moves with tokio's clock, so timestamps are
/// deterministic under `tokio::time::pause()`.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: Timestamp,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `start` now.
    pub fn starting_at(start: Timestamp) -> TokioClock {
        TokioClock { start, origin: tokio::time::Instant::now() }
    }
}

impl WallClock for TokioClock {
    fn now(&self) -> Timestamp {
        self.start.saturating_add(self.origin.elapsed())
    }
}
