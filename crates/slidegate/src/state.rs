//! What one key keeps under one algorithm, and how it decides: the code the memory backend and
//! the Redis module (`slidegate-module`) share, so both answer exactly as [`crate::reference`]
//! specifies.
//!
//! The sliding log, the hot path, is a sorted ring of admission times (8 bytes per permit) whose
//! expired prefix is dropped as it is met; every other algorithm keeps a few numbers per key, for
//! which the reference model is already the right structure.
//!
//! ```
//! use slidegate::{Quota, state::Counter};
//!
//! let quota = Quota::per_second(2)?;
//! let mut counter = Counter::new(quota.algorithm());
//! for (now, admitted) in [(0, true), (10, true), (20, false), (1_000, true)] {
//!     let decision = counter.evaluate(now, &quota, 1);
//!     if decision.allowed {
//!         counter.record(now, &quota, 1);
//!     }
//!     assert_eq!(decision.allowed, admitted);
//! }
//! // What a snapshot (an RDB file) keeps: the same counter, decision for decision.
//! let restored = Counter::decode(&counter.encode()).expect("well formed");
//! assert_eq!(restored.inspect(1_005, &quota), counter.inspect(1_005, &quota));
//! # Ok::<(), slidegate::Error>(())
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use crate::{Algorithm, Decision, KeyState, Quota, reference};

/// One key's state under one algorithm.
///
/// A check is two steps so that a group of checks can be decided all or nothing:
/// [`Counter::evaluate`] answers (dropping expired admissions on the way), and
/// [`Counter::record`] charges the permits when the answer — and the group's — is yes.
#[derive(Debug, Clone)]
pub struct Counter(Inner);

#[derive(Debug, Clone)]
enum Inner {
    Log(Log),
    Model(reference::Key),
}

#[derive(Debug, Clone)]
struct Log {
    /// Admission times in ms, oldest first, one per permit.
    log: VecDeque<u64>,
    /// The log's first entry (`u64::MAX` when empty), kept beside the ring so that a decision
    /// that expires nothing need not load the head of the log.
    oldest: u64,
    /// The log's last entry (meaningless when empty), kept beside the ring for the same reason:
    /// an admission then reads nothing from the ring, and only writes its tail.
    newest: u64,
    /// When the current warm-up began (quotas with a warm-up only).
    warm_since: u64,
}

/// A log shrinks when it uses less than a quarter of its ring (a burst passed), and never below
/// this many slots.
const MIN_SHRINK_CAPACITY: usize = 16;

/// The tag that opens an encoded sliding log (the reference model's tags are 1 to 4).
const LOG_TAG: u64 = 0;

impl Counter {
    /// A key that holds nothing yet, counted by `algorithm`.
    pub fn new(algorithm: Algorithm) -> Self {
        Self::with_capacity(algorithm, 0)
    }

    /// A key that holds nothing yet, with room for `log_capacity` admissions if it is a log.
    #[inline]
    pub fn with_capacity(algorithm: Algorithm, log_capacity: usize) -> Self {
        Self(match algorithm {
            Algorithm::SlidingLog => Inner::Log(Log {
                log: VecDeque::with_capacity(log_capacity),
                oldest: u64::MAX,
                newest: 0,
                warm_since: 0,
            }),
            other => Inner::Model(reference::Key::new(other)),
        })
    }

    /// Whether this counter counts by `algorithm`'s kind (its parameters come with each quota).
    #[inline]
    pub fn counts_by(&self, algorithm: Algorithm) -> bool {
        std::mem::discriminant(&self.algorithm_kind()) == std::mem::discriminant(&algorithm)
    }

    /// The algorithm this counter counts by, with placeholder parameters.
    #[inline]
    pub fn algorithm_kind(&self) -> Algorithm {
        match &self.0 {
            Inner::Log(_) => Algorithm::SlidingLog,
            Inner::Model(key) => key.algorithm_kind(),
        }
    }

    /// Whether `cost` more permits of `quota` fit at `now`: the admission to answer if they are
    /// recorded, or the denial. Drops expired log entries on the way.
    // The memory backend's hot path calls these from another module (and codegen unit).
    #[inline]
    pub fn evaluate(&mut self, now: u64, quota: &Quota, cost: u64) -> Decision {
        match &mut self.0 {
            Inner::Log(log) => log.evaluate(now, quota, cost),
            Inner::Model(key) => key.decide(now, quota, cost),
        }
    }

    /// Records `cost` permits at `now`, after [`Counter::evaluate`] found that they fit.
    #[inline]
    pub fn record(&mut self, now: u64, quota: &Quota, cost: u64) {
        match &mut self.0 {
            Inner::Log(log) => log.record(now, cost),
            Inner::Model(key) => key.record(now, quota, cost),
        }
    }

    /// When, at the earliest, the key holds nothing; forgetting it then changes no decision.
    #[inline]
    pub fn expires_at(&self, quota: &Quota) -> u64 {
        match &self.0 {
            Inner::Log(log) => log.newest().map_or(0, |t| t + quota.window_ms()),
            Inner::Model(key) => key.expires_at(quota),
        }
    }

    /// Time until the key holds nothing.
    pub fn reset_after(&self, now: u64, quota: &Quota) -> Duration {
        match &self.0 {
            Inner::Log(log) => log.reset_after(now, quota.window_ms()),
            Inner::Model(key) => key.reset_after(now, quota),
        }
    }

    /// The decision of a check that fit but was not charged because another check of its group
    /// did not: its `remaining` without the cost, and the key's own reset time.
    pub fn held(&self, now: u64, quota: &Quota, cost: u64, fit: &Decision) -> Decision {
        Decision::held(fit.limit, fit.remaining + cost, self.reset_after(now, quota))
    }

    /// What the key holds at `now`, for operators; changes nothing.
    pub fn inspect(&self, now: u64, quota: &Quota) -> KeyState {
        match &self.0 {
            Inner::Log(Log { log, .. }) => {
                let window = quota.window_ms();
                let first_live = log.partition_point(|&t| t + window <= now);
                let count = (log.len() - first_live) as u64;
                KeyState {
                    count,
                    oldest_ms: log.get(first_live).copied(),
                    reset_after: log.back().filter(|_| count > 0).map_or(Duration::ZERO, |&t| ms(t + window - now)),
                }
            }
            Inner::Model(model) => {
                // A zero-cost look: what is used of the (effective) limit now.
                let d = model.decide(now, quota, 0);
                KeyState { count: d.limit - d.remaining, oldest_ms: None, reset_after: model.reset_after(now, quota) }
            }
        }
    }

    /// The admissions a sliding log holds (expired ones not yet dropped included); 0 for the
    /// other algorithms.
    pub fn len(&self) -> usize {
        match &self.0 {
            Inner::Log(log) => log.log.len(),
            Inner::Model(_) => 0,
        }
    }

    /// Whether a sliding log holds no admission; always true for the other algorithms.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes this counter holds beyond its own size (the log's ring, the buckets' map).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Inner::Log(log) => log.log.capacity() * size_of::<u64>(),
            Inner::Model(key) => key.heap_bytes(),
        }
    }

    /// The counter as a flat list of numbers: what a snapshot stores, so the format is stable.
    /// [`Counter::decode`] reads it back. Each list opens with a tag and the warm-up start:
    ///
    /// - sliding log: `0, warm_since, n, t₁ … tₙ` (admission times in ms, oldest first);
    /// - sliding window: `2, warm_since, n, i₁, c₁ … iₙ, cₙ` (bucket index and count, indexes
    ///   increasing);
    /// - fixed window: `3, warm_since, 0` (nothing counted) or `3, warm_since, 1, i, c` (window
    ///   index and count);
    /// - GCRA: `4, warm_since, tat` (theoretical arrival time in µs).
    pub fn encode(&self) -> Vec<u64> {
        match &self.0 {
            Inner::Log(log) => {
                let mut words = Vec::with_capacity(3 + log.log.len());
                words.extend([LOG_TAG, log.warm_since, log.log.len() as u64]);
                words.extend(log.log.iter().copied());
                words
            }
            Inner::Model(key) => key.encode(),
        }
    }

    /// A counter from [`Counter::encode`]'s numbers; `None` when they are not such a list.
    pub fn decode(words: &[u64]) -> Option<Self> {
        match *words {
            [LOG_TAG, warm_since, n, ref rest @ ..] if rest.len() as u64 == n && rest.is_sorted() => {
                Some(Self::from_log(rest.iter().copied().collect(), warm_since))
            }
            _ => reference::Key::decode(words).map(|key| Self(Inner::Model(key))),
        }
    }

    /// A sliding log holding the admissions `log` (oldest first) whose warm-up began at
    /// `warm_since`.
    pub fn from_log(log: VecDeque<u64>, warm_since: u64) -> Self {
        let (oldest, newest) = (log.front().copied().unwrap_or(u64::MAX), log.back().copied().unwrap_or(0));
        Self(Inner::Log(Log { log, oldest, newest, warm_since }))
    }
}

impl Log {
    #[inline]
    fn evaluate(&mut self, now: u64, quota: &Quota, cost: u64) -> Decision {
        let window = quota.window_ms();
        if self.oldest.saturating_add(window) <= now {
            while self.log.front().is_some_and(|&t| t + window <= now) {
                self.log.pop_front();
            }
            self.oldest = self.log.front().copied().unwrap_or(u64::MAX);
            if self.log.capacity() > MIN_SHRINK_CAPACITY && self.log.len() < self.log.capacity() / 4 {
                self.log.shrink_to((self.log.len() * 2).max(MIN_SHRINK_CAPACITY));
            }
        }
        let limit = match quota.warm_up() {
            None => quota.limit(),
            Some(_) if self.log.is_empty() => quota.limit_at(0),
            Some(_) => quota.limit_at(now.saturating_sub(self.warm_since)),
        };
        self.decide(now, limit, window, cost)
    }

    /// The sliding log on a sorted ring whose expired prefix is already gone: every question is
    /// answered by position. Semantics: [`crate::reference::SlidingLog`].
    #[inline]
    fn decide(&self, now: u64, limit: u64, window: u64, cost: u64) -> Decision {
        let live = self.log.len() as u64;
        if live + cost <= limit {
            // What the admission will answer once recorded: the newest entry is then `now` (or
            // a later one, when the clock stepped back).
            let newest = self.newest().map_or(now, |t| t.max(now));
            return Decision::allowed(limit, limit - live - cost, ms(newest + window - now));
        }
        let k = usize::try_from(live + cost - limit).unwrap_or(usize::MAX);
        let retry = self.log.get(k - 1).map_or(Duration::MAX, |&t| ms(t + window - now));
        Decision::denied(limit, limit.saturating_sub(live), self.reset_after(now, window), retry)
    }

    #[inline]
    fn newest(&self) -> Option<u64> {
        (!self.log.is_empty()).then_some(self.newest)
    }

    fn reset_after(&self, now: u64, window: u64) -> Duration {
        self.newest().map_or(Duration::ZERO, |t| ms((t + window).saturating_sub(now)))
    }

    /// Records `cost` admissions at `now`, keeping the log sorted.
    fn record(&mut self, now: u64, cost: u64) {
        if self.log.is_empty() {
            self.warm_since = now;
        }
        let permits = usize::try_from(cost).unwrap_or(usize::MAX);
        if self.newest().is_none_or(|t| t <= now) {
            if permits == 1 {
                self.log.push_back(now);
            } else {
                self.log.extend(std::iter::repeat_n(now, permits));
            }
            self.newest = now;
        } else {
            // The clock stepped back: insert in order, moving the later entries once.
            let later = self.log.split_off(self.log.partition_point(|&t| t <= now));
            self.log.extend(std::iter::repeat_n(now, permits));
            self.log.extend(later);
        }
        self.oldest = self.oldest.min(now);
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(algorithm: Algorithm) -> Quota {
        Quota::new(10, Duration::from_millis(1_000)).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
    }

    #[test]
    fn every_algorithm_round_trips_through_its_encoding() {
        for algorithm in [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow { buckets: 4 },
            Algorithm::FixedWindow,
            Algorithm::Gcra { burst: Some(3) },
        ] {
            let q = quota(algorithm);
            let mut counter = Counter::new(algorithm);
            for t in [0, 0, 100, 260, 700] {
                if counter.evaluate(t, &q, 1).allowed {
                    counter.record(t, &q, 1);
                }
            }
            let mut restored = Counter::decode(&counter.encode()).expect("decodes");
            assert!(restored.counts_by(algorithm));
            for t in [750, 1_000, 1_150, 1_300, 2_500] {
                assert_eq!(restored.evaluate(t, &q, 2), counter.evaluate(t, &q, 2), "{algorithm} at {t}");
            }
        }
    }

    #[test]
    fn malformed_encodings_are_refused() {
        for words in [&[][..], &[0, 0, 2, 5], &[0, 0, 2, 9, 5], &[9, 0], &[2, 0, 3, 1, 1], &[4]] {
            assert!(Counter::decode(words).is_none(), "{words:?}");
        }
    }

    #[test]
    fn a_log_gives_back_its_ring_after_a_burst() {
        let q = Quota::new(1_000, Duration::from_millis(100)).expect("valid");
        let mut counter = Counter::new(Algorithm::SlidingLog);
        counter.record(0, &q, 1_000);
        let burst = counter.heap_bytes();
        assert!(counter.evaluate(100, &q, 1).allowed);
        counter.record(100, &q, 1);
        assert!(counter.heap_bytes() * 8 <= burst, "{} of {burst} bytes kept", counter.heap_bytes());
    }
}
