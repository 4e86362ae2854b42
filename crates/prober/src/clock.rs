//! Time as the prober sees it: an injected [`Clock`] giving [`Moment`]s.
//!
//! Every rule of the worker state machine compares moments (since the last successful probe,
//! since the worker was last busy, since a kill began), so the clock is a trait: the pool runs
//! on [`SystemClock`], tests on [`FakeClock`], which moves only when told. Nothing else in
//! this crate reads a clock. Deadlines on I/O (a hung SSH handshake or command) are enforced
//! with tokio timers by the executors; they bound waits, they decide no rule.

use parking_lot::Mutex;
use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on a monotonic clock, as the time since that clock's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Moment(Duration);

impl Moment {
    /// The moment `since_origin` after the clock's origin.
    pub const fn from_origin(since_origin: Duration) -> Moment {
        Moment(since_origin)
    }

    /// The time since the clock's origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// How long after `earlier` this is; zero if it is not later.
    pub fn since(self, earlier: Moment) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Moment {
    type Output = Moment;
    fn add(self, rhs: Duration) -> Moment {
        Moment(self.0.saturating_add(rhs))
    }
}

impl Sub<Duration> for Moment {
    type Output = Moment;
    fn sub(self, rhs: Duration) -> Moment {
        Moment(self.0.saturating_sub(rhs))
    }
}

impl fmt::Display for Moment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.0.as_secs_f64())
    }
}

/// Where the prober gets the time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Moment;
}

/// The real monotonic clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: std::time::Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        // The one real clock of the crate: everything else takes time from a `Clock`.
        #[allow(clippy::disallowed_methods)]
        let origin = std::time::Instant::now();
        SystemClock { origin }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Moment {
        // See `new`: this type is the crate's clock.
        #[allow(clippy::disallowed_methods)]
        let now = std::time::Instant::now();
        Moment(now.saturating_duration_since(self.origin))
    }
}

/// A clock that moves only when told: for deterministic tests and simulations.
#[derive(Debug, Default)]
pub struct FakeClock {
    now: Mutex<Moment>,
}

impl FakeClock {
    /// A fake clock showing `start`.
    pub fn new(start: Moment) -> FakeClock {
        FakeClock { now: Mutex::new(start) }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now = *now + by;
    }

    /// Sets the clock to `to` (never backwards).
    pub fn set(&self, to: Moment) {
        let mut now = self.now.lock();
        if to > *now {
            *now = to;
        }
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Moment {
        *self.now.lock()
    }
}
