//! Where "now" comes from.
//!
//! Every decision is taken at one instant, in whole milliseconds since the Unix epoch. The memory
//! backend asks a [`Clock`]; the Redis backend asks Redis (`TIME`) unless it was given a clock,
//! so that application servers with skewed clocks still share one window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch.
///
/// Time is expected not to go backwards. If it does (an NTP step, a replayed trace), decisions
/// stay correct — every admission is counted by its own timestamp — but `reset_after` may be
/// reported short by the size of the step.
pub trait Clock: Send + Sync + 'static {
    /// The current time in milliseconds.
    fn now_ms(&self) -> u64;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock set before 1970 is a broken machine; answer 0 rather than panic on the hot path.
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to: for tests and replays. Clones share one time.
///
/// ```
/// use slidegate::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_millis(500));
/// assert_eq!(clock.now_ms(), 1_500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `start_ms` until moved.
    pub fn new(start_ms: u64) -> Self {
        Self { now: Arc::new(AtomicU64::new(start_ms)) }
    }

    /// Sets the time.
    pub fn set_ms(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by whole milliseconds of `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
