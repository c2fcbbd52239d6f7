//! What one key keeps under one algorithm, and how it decides, in production: the code the
//! memory backend and the Redis module (`slidegate-module`) share, so both answer exactly as
//! [`crate::spec`] specifies.
//!
//! The sliding log, the hot path, keeps its admission times oldest first as the gaps between
//! them, one LEB128 number each (a byte for a gap under 128 ms, two under 16 s), and drops the
//! expired prefix as it is met. Every other algorithm keeps a few numbers per key, for which the
//! specification's plain structure is already the right one: a [`Counter`] runs
//! [`crate::spec::Key`] itself for them. What a snapshot keeps of a counter
//! ([`Counter::encode`]) is in `snapshot.rs`.
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

use crate::{Algorithm, Charged, Decision, KeyState, MAX_CHARGE_FACTOR, Quota, Refunded, spec};

/// One key's state under one algorithm.
///
/// A check is two steps so that a group of checks can be decided all or nothing:
/// [`Counter::evaluate`] answers (dropping expired admissions on the way), and
/// [`Counter::record`] charges the permits when the answer — and the group's — is yes.
#[derive(Debug, Clone)]
pub struct Counter(pub(crate) Inner);

#[derive(Debug, Clone)]
pub(crate) enum Inner {
    /// The sliding log, compact.
    Log(Log),
    /// The other algorithms: the specification's own structure.
    Spec(spec::Key),
}

/// One permit per admission, as in [`spec::SlidingLog`], but stored as gaps: an admission
/// costs 1–2 bytes where a time would take 8, so a key's ring spans a quarter to an eighth of
/// the cache lines, and on many keys a decision's cost is mostly the memory it touches
/// (BENCHMARKS.md, "The memory backend beside governor").
#[derive(Debug, Clone)]
pub(crate) struct Log {
    /// For each admission after the oldest, its gap in ms to the one before, as LEB128: the
    /// times are `oldest`, `oldest + gap₁`, `oldest + gap₁ + gap₂`, ….
    gaps: VecDeque<u8>,
    /// The number of admissions (permits) held.
    pub(crate) len: u64,
    /// The oldest admission (`u64::MAX` when empty): a decision that expires nothing reads no
    /// gap.
    oldest: u64,
    /// The newest admission (meaningless when empty): an admission appends its gap to it.
    newest: u64,
    /// When the current warm-up began (quotas with a warm-up only).
    pub(crate) warm_since: u64,
    /// Once the log has held [`MARK_EVERY`] admissions: where to start reading it far from its
    /// oldest admission.
    marks: Option<Box<Marks>>,
}

/// A long log marks every this-many-th admission: a denial then reads at most this many gaps to
/// find the admission that blocks it, wherever that is in the log, instead of a gap per
/// admission before it (half a million of them for a cost of 500,000 in a log of a million).
const MARK_EVERY: u64 = 256;

/// Every [`MARK_EVERY`]-th admission of a long log: its time, and where the gaps after it
/// begin. Admissions and bytes are numbered from when the marks began, so dropping the oldest
/// ones moves no mark.
#[derive(Debug, Clone, Default)]
struct Marks {
    /// The number of the oldest admission held: admissions dropped so far.
    dropped: u64,
    /// Bytes of gaps dropped so far: the number of the first byte held.
    bytes_dropped: u64,
    /// `(admission number, number of the first byte after its gap, time)`, oldest first.
    marks: VecDeque<(u64, u64, u64)>,
}

/// A log shrinks when it uses less than a quarter of its ring (a burst passed), and never below
/// this many bytes.
const MIN_SHRINK_CAPACITY: usize = 64;

/// The latest time, in ms since the epoch, a decision may be asked about (the Redis module's
/// `NOW`) and a snapshot may hold: 2⁵³ ms, some 285,000 years. Up to it, every sum and product
/// a decision forms (a time plus a window of up to [`crate::MAX_WINDOW`], a GCRA's time in µs
/// plus its bucket) fits in 64 bits.
pub const MAX_TIME_MS: u64 = 1 << 53;

/// The latest time, in ms since 1970, that a Redis backend takes from a caller's clock
/// (`RedisBackend::with_clock`), and that a stored sliding window counter may start at: 2⁵² ms,
/// some 140,000 years. Up to it the Lua scripts' bucket indexes, and the steps between them,
/// are exact in Lua's doubles; past it a loop over buckets could step by nothing and never end,
/// holding Redis.
pub const MAX_CLOCK_MS: u64 = 1 << 52;

impl Counter {
    /// A key that holds nothing yet, counted by `algorithm`.
    pub fn new(algorithm: Algorithm) -> Self {
        Self::with_capacity(algorithm, 0)
    }

    /// A key that holds nothing yet, with room for `log_capacity` bytes of admissions (the gaps
    /// between them, 1–2 bytes each: see [the module](crate::state)) if it is a log.
    #[inline]
    pub fn with_capacity(algorithm: Algorithm, log_capacity: usize) -> Self {
        Self(match algorithm {
            Algorithm::SlidingLog => Inner::Log(Log::with_capacity(log_capacity)),
            other => Inner::Spec(spec::Key::new(other)),
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
            Inner::Spec(key) => key.algorithm_kind(),
        }
    }

    /// Whether `cost` more permits of `quota` fit at `now`: the admission to answer if they are
    /// recorded, or the denial. Drops expired log entries on the way.
    // The memory backend's hot path calls these from another module (and codegen unit).
    #[inline]
    pub fn evaluate(&mut self, now: u64, quota: &Quota, cost: u64) -> Decision {
        match &mut self.0 {
            Inner::Log(log) => log.evaluate(now, quota, cost),
            Inner::Spec(key) => key.decide(now, quota, cost),
        }
    }

    /// Records `cost` permits at `now`, after [`Counter::evaluate`] found that they fit.
    #[inline]
    pub fn record(&mut self, now: u64, quota: &Quota, cost: u64) {
        match &mut self.0 {
            Inner::Log(log) => log.record(now, cost, quota.warm_up().is_some()),
            Inner::Spec(key) => key.record(now, quota, cost),
        }
    }

    /// Records `cost` permits at `now` whatever the key holds, clamped at
    /// [`crate::MAX_CHARGE_FACTOR`] times the limit: [`crate::spec`], "Charges and refunds".
    pub fn charge(&mut self, now: u64, quota: &Quota, cost: u64) -> Charged {
        match &mut self.0 {
            Inner::Log(log) => {
                log.evaluate(now, quota, 0);
                let recorded = cost.min((MAX_CHARGE_FACTOR * quota.limit()).saturating_sub(log.len));
                if recorded > 0 {
                    log.record(now, recorded, quota.warm_up().is_some());
                }
                Charged::new(log.standing(now, quota), cost, recorded)
            }
            Inner::Spec(key) => key.charge(now, quota, cost),
        }
    }

    /// Gives back up to `cost` of the key's most recent admissions: [`crate::spec`], "Charges
    /// and refunds".
    pub fn refund(&mut self, now: u64, quota: &Quota, cost: u64) -> Refunded {
        match &mut self.0 {
            Inner::Log(log) => {
                log.evaluate(now, quota, 0);
                let refunded = cost.min(log.len);
                log.pop(refunded);
                Refunded::new(log.standing(now, quota), refunded)
            }
            Inner::Spec(key) => key.refund(now, quota, cost),
        }
    }

    /// The key's standing at `now`, as a charge or a refund answers it ([`crate::spec::Key::standing`]).
    pub fn standing(&mut self, now: u64, quota: &Quota) -> Decision {
        match &mut self.0 {
            Inner::Log(log) => {
                log.evaluate(now, quota, 0);
                log.standing(now, quota)
            }
            Inner::Spec(key) => key.standing(now, quota),
        }
    }

    /// When, at the earliest, the key holds nothing; forgetting it then changes no decision.
    #[inline]
    pub fn expires_at(&self, quota: &Quota) -> u64 {
        match &self.0 {
            Inner::Log(log) => log.newest().map_or(0, |t| t + quota.window_ms()),
            Inner::Spec(key) => key.expires_at(quota),
        }
    }

    /// Time until the key holds nothing.
    pub fn reset_after(&self, now: u64, quota: &Quota) -> Duration {
        match &self.0 {
            Inner::Log(log) => log.reset_after(now, quota.window_ms()),
            Inner::Spec(key) => key.reset_after(now, quota),
        }
    }

    /// The decision of a check that fit but was not charged because another check of its group
    /// did not: its `remaining` without the cost, and the key's own reset time.
    pub fn held(&self, now: u64, quota: &Quota, cost: u64, fit: &Decision) -> Decision {
        let next = match &self.0 {
            Inner::Log(log) => log.next_permit_after(now, quota.window_ms()),
            Inner::Spec(key) => key.next_permit_after(now, quota),
        };
        Decision::held(fit.limit, fit.remaining + cost, self.reset_after(now, quota)).with_next_permit_after(next)
    }

    /// What the key holds at `now`, for operators; changes nothing.
    pub fn inspect(&self, now: u64, quota: &Quota) -> KeyState {
        match &self.0 {
            Inner::Log(log) => {
                let window = quota.window_ms();
                let first = now.checked_sub(window).map_or(0, |edge| log.first_after(edge));
                KeyState {
                    count: log.len - first,
                    oldest_ms: log.nth(first),
                    reset_after: log.reset_after(now, window),
                }
            }
            Inner::Spec(model) => {
                // A zero-cost look: what is used of the (effective) limit now.
                let d = model.decide(now, quota, 0);
                KeyState { count: d.limit - d.remaining, oldest_ms: None, reset_after: model.reset_after(now, quota) }
            }
        }
    }

    /// A sliding log's newest `max` admissions still in the window at `now`, oldest first; empty
    /// for the other algorithms. Changes nothing.
    pub fn admissions(&self, now: u64, quota: &Quota, max: usize) -> Vec<u64> {
        let Inner::Log(log) = &self.0 else { return Vec::new() };
        let first = now.checked_sub(quota.window_ms()).map_or(0, |edge| log.first_after(edge));
        let skip = first + (log.len - first).saturating_sub(max as u64);
        log.times().skip(usize::try_from(skip).unwrap_or(usize::MAX)).collect()
    }

    /// The admissions a sliding log holds (expired ones not yet dropped included); 0 for the
    /// other algorithms.
    pub fn len(&self) -> usize {
        match &self.0 {
            Inner::Log(log) => usize::try_from(log.len).unwrap_or(usize::MAX),
            Inner::Spec(_) => 0,
        }
    }

    /// Whether a sliding log holds no admission; always true for the other algorithms.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes this counter holds beyond its own size (the log's ring, the buckets' map).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Inner::Log(log) => {
                let marks = log
                    .marks
                    .as_ref()
                    .map_or(0, |m| size_of::<Marks>() + m.marks.capacity() * size_of::<(u64, u64, u64)>());
                log.gaps.capacity() + marks
            }
            Inner::Spec(key) => key.heap_bytes(),
        }
    }

    /// A sliding log holding the admissions `times` (sorted, oldest first) whose warm-up began at
    /// `warm_since`.
    pub fn from_log(times: impl IntoIterator<Item = u64>, warm_since: u64) -> Self {
        Self(Inner::Log(Log::from_times(times, warm_since)))
    }
}

impl Log {
    fn with_capacity(bytes: usize) -> Self {
        Self { gaps: VecDeque::with_capacity(bytes), len: 0, oldest: u64::MAX, newest: 0, warm_since: 0, marks: None }
    }

    /// A log of the admissions `times` (sorted, oldest first).
    fn from_times(times: impl IntoIterator<Item = u64>, warm_since: u64) -> Self {
        let mut log = Self::with_capacity(0);
        for t in times {
            log.push(t, 1);
        }
        log.warm_since = warm_since;
        log
    }

    // Always inlined: the memory backend runs it once per decision, where a call of its own
    // would cost a few percent of the decision (BENCHMARKS.md, "What the bounds cost").
    #[inline(always)]
    fn evaluate(&mut self, now: u64, quota: &Quota, cost: u64) -> Decision {
        let window = quota.window_ms();
        if self.oldest.saturating_add(window) <= now {
            self.expire(now - window);
        }
        let limit = match quota.warm_up() {
            None => quota.limit(),
            Some(_) if self.len == 0 => quota.limit_at(0),
            Some(_) => quota.limit_at(now.saturating_sub(self.warm_since)),
        };
        self.decide(now, limit, window, cost)
    }

    /// [`crate::spec::Key::standing`] of a log whose expired prefix is already gone.
    fn standing(&mut self, now: u64, quota: &Quota) -> Decision {
        let within = self.evaluate(now, quota, 0);
        if !within.allowed {
            return self.evaluate(now, quota, 1);
        }
        let window = quota.window_ms();
        Decision::allowed(within.limit, within.remaining, self.reset_after(now, window))
            .with_next_permit_after(self.next_permit_after(now, window))
    }

    /// Drops the `permits` newest admissions (at most all of them), reading their gaps from the
    /// back: a refund's work is bounded by what it gives back.
    fn pop(&mut self, permits: u64) {
        if permits >= self.len {
            self.gaps.clear();
            (self.len, self.oldest, self.marks) = (0, u64::MAX, None);
            return;
        }
        for _ in 0..permits {
            // A gap's last byte is below 0x80 and the bytes before it are not: read it backwards.
            let mut gap = 0;
            if let Some(last) = self.gaps.pop_back() {
                gap = u64::from(last);
                while self.gaps.back().is_some_and(|&b| b >= 0x80) {
                    let b = self.gaps.pop_back().unwrap_or_default();
                    gap = (gap << 7) | u64::from(b & 0x7f);
                }
            }
            self.newest -= gap;
            self.len -= 1;
        }
        if let Some(m) = &mut self.marks {
            while m.marks.back().is_some_and(|&(n, ..)| n >= m.dropped + self.len) {
                m.marks.pop_back();
            }
        }
    }

    /// Drops the admissions at or before `edge`; the oldest is one of them.
    fn expire(&mut self, edge: u64) {
        if self.newest <= edge {
            self.gaps.clear();
            (self.len, self.oldest, self.marks) = (0, u64::MAX, None);
        } else {
            // The newest stays, so a gap follows every admission dropped here.
            let (len, bytes) = (self.len, self.gaps.len());
            while self.oldest <= edge {
                self.oldest += read_gap(&mut std::iter::from_fn(|| self.gaps.pop_front()));
                self.len -= 1;
            }
            if let Some(m) = &mut self.marks {
                m.dropped += len - self.len;
                m.bytes_dropped += (bytes - self.gaps.len()) as u64;
                while m.marks.front().is_some_and(|&(n, ..)| n < m.dropped) {
                    m.marks.pop_front();
                }
            }
        }
        if self.gaps.capacity() > MIN_SHRINK_CAPACITY && self.gaps.len() < self.gaps.capacity() / 4 {
            self.gaps.shrink_to((self.gaps.len() * 2).max(MIN_SHRINK_CAPACITY));
        }
    }

    /// The sliding log whose expired prefix is already gone: every question is answered by
    /// position. Semantics: [`crate::spec::SlidingLog`].
    #[inline]
    fn decide(&self, now: u64, limit: u64, window: u64, cost: u64) -> Decision {
        let live = self.len;
        if live + cost <= limit {
            // What the admission will answer once recorded: the newest entry is then `now` (or
            // a later one, when the clock stepped back).
            let newest = self.newest().map_or(now, |t| t.max(now));
            // The oldest is `u64::MAX` when the log is empty: the new entries are the oldest
            // then, as when the clock stepped back.
            let oldest = self.oldest.min(now);
            return Decision::allowed(limit, limit - live - cost, ms(newest + window - now))
                .with_next_permit_after(ms(oldest + window - now));
        }
        // The k-th oldest must leave first (k = live + cost - limit); for one permit, the oldest.
        let (k, next) = (live + cost - limit, self.next_permit_after(now, window));
        let retry = if k == 1 { next } else { self.nth(k - 1).map_or(Duration::MAX, |t| ms(t + window - now)) };
        Decision::denied(limit, limit.saturating_sub(live), self.reset_after(now, window), retry)
            .with_next_permit_after(next)
    }

    #[inline]
    fn newest(&self) -> Option<u64> {
        (self.len > 0).then_some(self.newest)
    }

    fn reset_after(&self, now: u64, window: u64) -> Duration {
        self.newest().map_or(Duration::ZERO, |t| ms((t + window).saturating_sub(now)))
    }

    /// Time until the oldest admission leaves; zero when the log is empty. The expired prefix
    /// is already gone (after [`Log::evaluate`]).
    #[inline]
    fn next_permit_after(&self, now: u64, window: u64) -> Duration {
        if self.len == 0 { Duration::ZERO } else { ms((self.oldest + window).saturating_sub(now)) }
    }

    /// The admission times, oldest first.
    pub(crate) fn times(&self) -> impl Iterator<Item = u64> + '_ {
        let mut bytes = self.gaps.iter().copied();
        let mut t = self.oldest;
        (0..self.len).map(move |i| {
            if i > 0 {
                t += read_gap(&mut bytes);
            }
            t
        })
    }

    /// The admission at position `i` (0 = the oldest). A denial's usual case, the oldest, reads
    /// no gap and stays inline on the hot path; the others are read from the nearest mark.
    #[inline]
    fn nth(&self, i: u64) -> Option<u64> {
        match i {
            _ if i >= self.len => None,
            0 => Some(self.oldest),
            _ => Some(self.walk_to(i)),
        }
    }

    /// The position of the oldest admission after `edge` (`len` when there is none): a binary
    /// search over positions, each read from the nearest mark, so that inspecting the longest
    /// log reads a few thousand gaps, not all of them.
    fn first_after(&self, edge: u64) -> u64 {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.nth(mid).is_some_and(|t| t <= edge) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The admission at position `i` (below `len`), read from the nearest mark before it.
    fn walk_to(&self, i: u64) -> u64 {
        let mark = self.marks.as_ref().and_then(|m| {
            let n = m.dropped + i;
            let at = m.marks.partition_point(|&(mark, ..)| mark <= n).checked_sub(1)?;
            let (mark, byte, time) = m.marks[at];
            Some((time, n - mark, usize::try_from(byte - m.bytes_dropped).ok()?))
        });
        let (mut t, skip, from_byte) = mark.unwrap_or((self.oldest, i, 0));
        let mut bytes = self.gaps.range(from_byte..).copied();
        for _ in 0..skip {
            t += read_gap(&mut bytes);
        }
        t
    }

    /// Appends `permits` admissions at `now`, which is not older than the newest.
    fn push(&mut self, now: u64, permits: u64) {
        if permits == 0 {
            return;
        }
        if self.marks.is_none() && self.len + permits >= MARK_EVERY {
            self.marks = Some(Box::default());
        }
        if self.len == 0 {
            self.oldest = now;
        } else {
            let mut gap = now - self.newest;
            while gap >= 0x80 {
                self.gaps.push_back(gap as u8 | 0x80);
                gap >>= 7;
            }
            self.gaps.push_back(gap as u8);
        }
        // The permits after the first are gaps of zero, a byte each: admission `first + j` ends
        // at byte `after_first + j`.
        if let Some(m) = &mut self.marks {
            let (first, after_first) = (m.dropped + self.len, m.bytes_dropped + self.gaps.len() as u64);
            let mut n = first.next_multiple_of(MARK_EVERY);
            while n < first + permits {
                m.marks.push_back((n, after_first + (n - first), now));
                n += MARK_EVERY;
            }
        }
        let zeros = usize::try_from(permits - 1).unwrap_or(usize::MAX);
        if zeros > 0 {
            self.gaps.extend(std::iter::repeat_n(0, zeros));
        }
        self.len += permits;
        self.newest = now;
    }

    /// Records `cost` admissions at `now`, keeping the log sorted; into an empty log under a
    /// warm-up (`warm`), the ramp starts.
    fn record(&mut self, now: u64, cost: u64, warm: bool) {
        if warm && self.len == 0 {
            self.warm_since = now;
        }
        if self.newest().is_none_or(|t| t <= now) {
            self.push(now, cost);
        } else {
            // The clock stepped back: rebuild in order, once.
            let times: Vec<u64> = self.times().collect();
            let (before, after) = times.split_at(times.partition_point(|&t| t <= now));
            let inserted = std::iter::repeat_n(now, usize::try_from(cost).unwrap_or(usize::MAX));
            *self =
                Self::from_times(before.iter().copied().chain(inserted).chain(after.iter().copied()), self.warm_since);
        }
    }
}

/// Reads one LEB128 number (the encoding [`Log::push`] writes) from `bytes`.
fn read_gap(bytes: &mut impl Iterator<Item = u8>) -> u64 {
    let (mut gap, mut shift) = (0, 0);
    for byte in bytes {
        gap |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            break;
        }
        shift += 7;
    }
    gap
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_LIMIT;

    proptest::proptest! {
        /// The gaps are written in 1 to 10 bytes each: every width, over windows up to the
        /// longest, with the clock now and then stepping back, must answer as the specification's
        /// plain list of times does, and give that list back when encoded. Limits and costs in
        /// the thousands make logs long enough to be marked, and denials that must find an
        /// admission hundreds deep. (A step back never
        /// goes so far that an admission dropped as expired would be live again: the log, like
        /// the sorted set in Redis, has forgotten it, where the specification keeps every one.)
        #[test]
        fn a_log_of_gaps_of_every_width_answers_as_the_spec(
            limit in proptest::prop_oneof![1u64..=40, 200u64..=3_000],
            window_bits in 0u32..=34,
            steps in proptest::collection::vec(
                (0u32..=44, 0u64..u64::MAX, proptest::bool::weighted(0.1), proptest::prop_oneof![1u64..=40, 100u64..=3_000]),
                1..120,
            ),
        ) {
            let window = (1u64 << window_bits).min(crate::quota::MAX_WINDOW.as_millis() as u64);
            let q = Quota::new(limit, Duration::from_millis(window)).expect("valid");
            let (mut counter, mut spec) = (Counter::new(q.algorithm()), spec::SlidingLog::default());
            let (mut now, mut latest, mut admitted) = (1u64 << 40, 0, Vec::new());
            for (bits, draw, back, cost) in steps {
                let gap = draw >> (64 - bits.max(1)) >> u32::from(bits == 0);
                now = if back {
                    let forgotten = admitted.iter().filter(|&&t| t + window <= latest).max();
                    now.saturating_sub(gap).max(forgotten.map_or(0, |t| t + window))
                } else {
                    now + gap
                };
                latest = latest.max(now);
                let cost = cost.min(limit);
                let decision = counter.evaluate(now, &q, cost);
                if decision.allowed {
                    counter.record(now, &q, cost);
                    admitted.push(now);
                }
                proptest::prop_assert_eq!(decision, spec.check(now, limit, window, cost), "at {}", now);
            }
            let restored = Counter::decode(&counter.encode()).expect("decodes");
            proptest::prop_assert_eq!(restored.encode(), counter.encode());
            proptest::prop_assert_eq!(restored.inspect(now, &q), counter.inspect(now, &q));
        }
    }

    /// A bucket counted under one quota and weighed under another of a far longer bucket:
    /// 10^9 permits times a 366-day bucket in ms passes 2^64 (an overflow, which aborted Redis
    /// in the module); the weighing stays exact.
    #[test]
    fn a_count_from_another_quota_weighs_without_overflow() {
        let window = |limit, ms| {
            Quota::new(limit, Duration::from_millis(ms))
                .and_then(|q| q.with_algorithm(Algorithm::SlidingWindow { buckets: 1 }))
                .expect("valid")
        };
        let (short, long) = (window(MAX_LIMIT, 1_000), window(1_000, crate::quota::MAX_WINDOW_MS));
        let mut counter = Counter::new(short.algorithm());
        assert!(counter.evaluate(0, &short, MAX_LIMIT).allowed);
        counter.record(0, &short, MAX_LIMIT);
        // Bucket 0 of the long quota has just ended: the count weighs in full.
        let d = counter.evaluate(crate::quota::MAX_WINDOW_MS, &long, 1);
        assert!(!d.allowed);
        assert_eq!(counter.inspect(crate::quota::MAX_WINDOW_MS, &long).count, 1_000, "the whole limit is used");
        assert_eq!(counter.expires_at(&long), 2 * crate::quota::MAX_WINDOW_MS);
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
