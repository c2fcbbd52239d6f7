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

/// The wall clock as of its creation, moved forward by the CPU's time-stamp counter (through
/// `quanta`, where the TSC is reliable; the OS clock elsewhere): monotonic, and reading the
/// counter takes a few instructions where asking the OS goes through `clock_gettime` (a vDSO
/// call at best, a system call on some virtual machines' clock sources), which matters when a
/// whole in-memory decision costs a few hundred nanoseconds. The memory backend's default.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    start: quanta::Instant,
    start_ms: u64,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock {
    /// A clock that reads the system time now and counts from there.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.now();
        Self { clock, start, start_ms: SystemClock.now_ms() }
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let elapsed = self.clock.now().duration_since(self.start).as_millis();
        self.start_ms.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_follows_the_system_clock() {
        let (system, monotonic) = (SystemClock, MonotonicClock::new());
        let a = monotonic.now_ms();
        std::thread::sleep(Duration::from_millis(20));
        let b = monotonic.now_ms();
        assert!(b >= a + 20, "{a} then {b}");
        assert!(system.now_ms().abs_diff(b) < 50, "anchored to the wall clock");
    }
}
