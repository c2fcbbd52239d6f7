//! The semantics of each algorithm, written once, plainly, as the specification that the memory
//! backend and the Redis scripts are tested against (decision for decision, see
//! `tests/conformance.rs`). Nothing here is tuned for speed.
//!
//! # Sliding window log
//!
//! Time `t` is in whole milliseconds. A key keeps a log of admissions, one entry per permit.
//!
//! - An admission made at `t` **is in the window at `now` iff `now < t + window`**: an entry
//!   exactly `window` old has left. (The Redis script removes scores `<= now - window`.)
//! - A check of `cost` permits at `now` is **admitted iff `live + cost <= limit`**, where `live`
//!   is the number of entries in the window. Only an admission writes: it appends `cost` entries
//!   stamped `now`. A denial records nothing, so a client that keeps retrying is not locked out.
//! - `remaining` = `limit - live` after the decision (so an admission's own cost is taken off).
//! - `reset_after` = time until the newest entry leaves the window (zero for an empty log).
//! - `retry_after` (denials only) = time until the `k`-th oldest live entry leaves, with
//!   `k = live + cost - limit`: exactly then, the same request fits.

use std::time::Duration;

use crate::{Decision, MultiDecision};

/// The reference sliding-window log of one key.
///
/// ```
/// use slidegate::reference::SlidingLog;
///
/// // The seed demo: 5 per 10 s, seven requests 0.5 s apart.
/// let mut log = SlidingLog::default();
/// let admitted: Vec<bool> = (0..7).map(|i| log.check(i * 500, 5, 10_000, 1).allowed).collect();
/// assert_eq!(admitted, [true, true, true, true, true, false, false]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct SlidingLog {
    admissions: Vec<u64>,
}

impl SlidingLog {
    /// Decides `cost` permits of `limit` per `window_ms` at `now`; records them when admitted.
    pub fn check(&mut self, now: u64, limit: u64, window_ms: u64, cost: u64) -> Decision {
        let decision = self.decide(now, limit, window_ms, cost);
        if decision.allowed {
            self.record(now, cost);
        }
        decision
    }

    /// What [`SlidingLog::check`] would answer, recording nothing.
    pub fn decide(&self, now: u64, limit: u64, window_ms: u64, cost: u64) -> Decision {
        let live = self.live(now, window_ms);
        let count = live.len() as u64;
        if count + cost <= limit {
            let newest = live.last().map_or(now, |&t| t.max(now));
            return Decision::allowed(limit, limit - count - cost, ms(newest + window_ms - now));
        }
        let k = count + cost - limit;
        // `k <= count` whenever `cost <= limit`; a larger cost can never be admitted.
        let Some(&blocking) = live.get(usize::try_from(k - 1).unwrap_or(usize::MAX)) else {
            return Decision::denied(limit, limit.saturating_sub(count), Duration::ZERO, Duration::MAX);
        };
        Decision::denied(
            limit,
            limit.saturating_sub(count),
            self.reset_after(now, window_ms),
            ms(blocking + window_ms - now),
        )
    }

    /// Appends `cost` admissions at `now`.
    pub fn record(&mut self, now: u64, cost: u64) {
        self.admissions.extend(std::iter::repeat_n(now, usize::try_from(cost).unwrap_or(usize::MAX)));
    }

    /// The admissions in the window at `now`, oldest first.
    pub fn live(&self, now: u64, window_ms: u64) -> Vec<u64> {
        let mut live: Vec<u64> = self.admissions.iter().copied().filter(|&t| now < t + window_ms).collect();
        live.sort_unstable();
        live
    }

    /// Time until the newest admission in the window leaves it; zero when none is in it.
    pub fn reset_after(&self, now: u64, window_ms: u64) -> Duration {
        self.live(now, window_ms).last().map_or(Duration::ZERO, |&t| ms(t + window_ms - now))
    }
}

/// The atomic multi-limit check: `checks[i] = (limit, window_ms, cost)` on `logs[i]`, all at
/// `now`. Either every check fits and all are recorded, or nothing is recorded; then each check
/// that fit is reported [`Decision::held`] with its uncharged `remaining`.
pub fn check_all(logs: &mut [SlidingLog], now: u64, checks: &[(u64, u64, u64)]) -> MultiDecision {
    let fits: Vec<Decision> =
        logs.iter().zip(checks).map(|(log, &(limit, window, cost))| log.decide(now, limit, window, cost)).collect();
    if fits.iter().all(|d| d.allowed) {
        for (log, &(_, _, cost)) in logs.iter_mut().zip(checks) {
            log.record(now, cost);
        }
        return MultiDecision::new(fits);
    }
    let decisions = fits
        .into_iter()
        .zip(logs.iter().zip(checks))
        .map(
            |(d, (log, &(limit, window, cost)))| {
                if d.allowed { Decision::held(limit, d.remaining + cost, log.reset_after(now, window)) } else { d }
            },
        )
        .collect();
    MultiDecision::new(decisions)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_edge_burst_is_denied() {
        // 100 per 60 s: 100 at 00:59, then 100 more at 01:01 — a fixed window would admit 200.
        let mut log = SlidingLog::default();
        for _ in 0..100 {
            assert!(log.check(59_000, 100, 60_000, 1).allowed);
        }
        let second_burst = (0..100).filter(|_| log.check(61_000, 100, 60_000, 1).allowed).count();
        assert_eq!(second_burst, 0);
        // The first burst leaves at 59 s + 60 s.
        let d = log.check(61_000, 100, 60_000, 1);
        assert_eq!(d.retry_after, Some(Duration::from_millis(58_000)));
        assert!(log.check(119_000, 100, 60_000, 1).allowed);
    }

    #[test]
    fn an_entry_exactly_one_window_old_has_left() {
        let mut log = SlidingLog::default();
        assert!(log.check(0, 1, 1_000, 1).allowed);
        assert!(!log.check(999, 1, 1_000, 1).allowed);
        assert!(log.check(1_000, 1, 1_000, 1).allowed);
    }

    #[test]
    fn retry_after_waits_for_enough_entries_to_leave() {
        let mut log = SlidingLog::default();
        for t in [0, 100, 200] {
            assert!(log.check(t, 3, 1_000, 1).allowed);
        }
        // Two permits need the two oldest gone: the one at 100 leaves at 1_100.
        let d = log.check(300, 3, 1_000, 2);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Some(Duration::from_millis(800)));
        assert_eq!(d.reset_after, Duration::from_millis(900));
        assert!(log.check(1_100, 3, 1_000, 2).allowed);
    }

    #[test]
    fn multi_limit_charges_all_or_nothing() {
        let mut logs = [SlidingLog::default(), SlidingLog::default()];
        let per_second_and_per_minute = [(2, 1_000, 1), (3, 60_000, 1)];
        for t in [0, 10] {
            assert!(check_all(&mut logs, t, &per_second_and_per_minute).allowed);
        }
        // The per-second limit denies: the per-minute one is not charged.
        let d = check_all(&mut logs, 20, &per_second_and_per_minute);
        assert_eq!((d.allowed, d.denied_by), (false, Some(0)));
        assert_eq!(d.decisions[1], Decision::held(3, 1, Duration::from_millis(60_000 - 10)));
        assert_eq!(d.retry_after(), Some(Duration::from_millis(980)));
        // A second later the third fits both; then the per-minute one denies.
        assert!(check_all(&mut logs, 1_000, &per_second_and_per_minute).allowed);
        let d = check_all(&mut logs, 2_000, &per_second_and_per_minute);
        assert_eq!(d.denied_by, Some(1));
        assert_eq!(logs[0].live(2_000, 1_000).len(), 0, "the per-second log was not charged");
    }

    #[test]
    fn denial_records_nothing_and_cost_counts_each_permit() {
        let mut log = SlidingLog::default();
        let d = log.check(0, 5, 1_000, 4);
        assert_eq!((d.allowed, d.remaining), (true, 1));
        let d = log.check(1, 5, 1_000, 2);
        assert_eq!((d.allowed, d.remaining), (false, 1));
        assert_eq!(log.live(1, 1_000).len(), 4);
        assert_eq!(log.check(2, 5, 1_000, 1).remaining, 0);
    }
}
