//! One rule's decisions per 10-second slot over the last 15 minutes, and their latency over the
//! last minute: rings of atomic counters, fixed memory, written by every decision without a lock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The length of one slot.
pub const SLOT: Duration = Duration::from_secs(10);

/// The slots kept: 90 × 10 s = the last 15 minutes.
pub const SLOTS: usize = 90;

/// The slots whose latencies the percentiles are taken over: the last minute.
pub const LATENCY_SLOTS: u64 = 6;

/// Latency buckets: log-linear in µs with 4 sub-buckets per power of two (each bucket's top is
/// at most 25% over its bottom), exact below 4 µs; everything from 2²⁴ µs (16.8 s, past any
/// backend deadline) falls in the last.
const SUB_BITS: u32 = 2;
const SUB: usize = 1 << SUB_BITS;
const MAX_US: u32 = (1 << 24) - 1;
const BUCKETS: usize = (24 - SUB_BITS as usize + 1) * SUB;

/// How one decision came out, for the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted by the backend.
    Allowed,
    /// Denied by the backend (or the near-cache).
    Denied,
    /// Answered by a failure policy because the backend could not.
    Degraded,
}

/// One slot's counts. `at` is the slot's number plus one (0: never used), so a reader can tell
/// a slot of this lap from one left over from an earlier lap.
struct Slot {
    at: AtomicU64,
    counts: [AtomicU64; 3],
}

/// One slot's latencies, tagged as [`Slot`] is: kept for the last [`LATENCY_SLOTS`] slots
/// only, the ones the percentiles are taken over (a bucket array is ten times a slot's counts).
struct Latency {
    at: AtomicU64,
    buckets: [AtomicU32; BUCKETS],
}

/// Clears `at`'s ring entry for slot number `slot` if an earlier lap left it; true once cleared.
fn claim(at: &AtomicU64, slot: u64) -> bool {
    let (tag, seen) = (slot + 1, at.load(Relaxed));
    seen < tag && at.compare_exchange(seen, tag, Relaxed, Relaxed).is_ok()
}

/// The rings: `SLOTS` slots of 3 counters, and `LATENCY_SLOTS` of `BUCKETS` latency buckets
/// (about 5 KB whatever the traffic: a rules document's rules each hold one).
pub struct Series {
    slots: Box<[Slot]>,
    latency: Box<[Latency]>,
}

impl std::fmt::Debug for Series {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Series")
    }
}

impl Default for Series {
    fn default() -> Self {
        let zero = || AtomicU64::new(0);
        let slot = |_| Slot { at: zero(), counts: std::array::from_fn(|_| zero()) };
        let latency = |_| Latency { at: zero(), buckets: std::array::from_fn(|_| AtomicU32::new(0)) };
        Self { slots: (0..SLOTS).map(slot).collect(), latency: (0..LATENCY_SLOTS).map(latency).collect() }
    }
}

/// What a series held at one moment, oldest slot first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Admitted decisions per slot.
    pub allowed: Vec<u64>,
    /// Denied decisions per slot.
    pub denied: Vec<u64>,
    /// Decisions of a failure policy per slot.
    pub degraded: Vec<u64>,
    /// The last minute's latencies, counted per bucket.
    latency: Vec<u64>,
}

impl Snapshot {
    /// The last minute's latency percentiles in µs, `(p50, p99)`, each the top of its bucket
    /// (never under the true value, at most 25% over); `None` without decisions.
    pub fn latency_us(&self) -> Option<(u64, u64)> {
        percentile(&self.latency, 50).zip(percentile(&self.latency, 99))
    }

    /// Adds `other`'s counts to these, slot by slot (for totals).
    pub fn add(&mut self, other: &Self) {
        for (mine, theirs) in [
            (&mut self.allowed, &other.allowed),
            (&mut self.denied, &other.denied),
            (&mut self.degraded, &other.degraded),
            (&mut self.latency, &other.latency),
        ] {
            mine.resize(mine.len().max(theirs.len()), 0);
            mine.iter_mut().zip(theirs).for_each(|(m, t)| *m += t);
        }
    }
}

impl Series {
    /// Counts one decision of slot number `slot` (time since the service's start divided by
    /// [`SLOT`]) that took `took`.
    ///
    /// The first decision of a new slot clears what the ring's previous lap left there. A
    /// decision that races that clear (nanoseconds, once per 10 s) may be lost or counted in
    /// the new slot; counts are for watching, not billing.
    pub fn record(&self, slot: u64, outcome: Outcome, took: Duration) {
        let s = &self.slots[(slot % SLOTS as u64) as usize];
        if claim(&s.at, slot) {
            s.counts.iter().for_each(|c| c.store(0, Relaxed));
        }
        s.counts[outcome as usize].fetch_add(1, Relaxed);
        let l = &self.latency[(slot % LATENCY_SLOTS) as usize];
        if claim(&l.at, slot) {
            l.buckets.iter().for_each(|c| c.store(0, Relaxed));
        }
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        l.buckets[bucket(us)].fetch_add(1, Relaxed);
    }

    /// The last [`SLOTS`] slots up to slot number `now`, oldest first.
    pub fn snapshot(&self, now: u64) -> Snapshot {
        let mut snap = Snapshot { latency: vec![0; BUCKETS], ..Snapshot::default() };
        for n in (now + 1).saturating_sub(SLOTS as u64)..=now {
            let s = &self.slots[(n % SLOTS as u64) as usize];
            let current = s.at.load(Relaxed) == n + 1;
            let count = |i: usize| if current { s.counts[i].load(Relaxed) } else { 0 };
            snap.allowed.push(count(Outcome::Allowed as usize));
            snap.denied.push(count(Outcome::Denied as usize));
            snap.degraded.push(count(Outcome::Degraded as usize));
        }
        for n in (now + 1).saturating_sub(LATENCY_SLOTS)..=now {
            let l = &self.latency[(n % LATENCY_SLOTS) as usize];
            if l.at.load(Relaxed) == n + 1 {
                for (sum, b) in snap.latency.iter_mut().zip(&l.buckets) {
                    *sum += u64::from(b.load(Relaxed));
                }
            }
        }
        // Pad to SLOTS when the service is younger than the ring.
        for v in [&mut snap.allowed, &mut snap.denied, &mut snap.degraded] {
            v.splice(0..0, std::iter::repeat_n(0, SLOTS - v.len()));
        }
        snap
    }
}

/// The bucket of a latency of `us` µs.
fn bucket(us: u32) -> usize {
    crate::log_buckets::bucket(us.min(MAX_US), SUB_BITS)
}

/// The largest latency that falls in bucket `b`.
fn highest(b: usize) -> u64 {
    crate::log_buckets::highest(b, SUB_BITS)
}

/// The `p`-th percentile of the counts: the top of the bucket that holds it (never under the
/// true value, at most 25% over it), `None` without samples.
fn percentile(counts: &[u64], p: u64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (total * p).div_ceil(100).max(1);
    let mut seen = 0;
    counts
        .iter()
        .position(|&c| {
            seen += c;
            seen >= rank
        })
        .map(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_their_tops_bound_their_values() {
        let mut last = 0;
        for us in 0..200_000 {
            let b = bucket(us);
            assert!(b == last || b == last + 1, "{us}: bucket {b} after {last}");
            last = b;
        }
        for us in (0..200_000).chain([MAX_US - 1, MAX_US, u32::MAX]) {
            let (b, us) = (bucket(us), u64::from(us.min(MAX_US)));
            assert!(b < BUCKETS && us <= highest(b), "{us}: over its bucket's top {}", highest(b));
            assert!(highest(b) <= us * 5 / 4 + 1, "{us}: top {} more than 25% over", highest(b));
        }
        assert_eq!(bucket(u32::MAX), BUCKETS - 1);
    }

    #[test]
    fn the_rings_hold_5_kb_whatever_the_traffic() {
        assert_eq!(SLOTS * size_of::<Slot>() + LATENCY_SLOTS as usize * size_of::<Latency>(), 5_136);
    }

    #[test]
    fn slots_count_their_own_decisions_and_a_new_lap_clears_the_old_one() {
        let s = Series::default();
        for _ in 0..3 {
            s.record(5, Outcome::Denied, Duration::from_micros(100));
        }
        s.record(6, Outcome::Allowed, Duration::from_micros(40));
        s.record(6, Outcome::Degraded, Duration::from_micros(40));
        let snap = s.snapshot(6);
        assert_eq!(snap.denied.len(), SLOTS);
        assert_eq!((snap.denied[SLOTS - 2], snap.allowed[SLOTS - 1], snap.degraded[SLOTS - 1]), (3, 1, 1));
        let (p50, p99) = snap.latency_us().expect("samples");
        assert!((100..=125).contains(&p50) && (100..=125).contains(&p99), "{p50} {p99}");
        // One lap later, slot 5's place holds slot 95: the old counts are gone.
        s.record(95, Outcome::Allowed, Duration::from_micros(1));
        let snap = s.snapshot(95);
        assert_eq!(snap.denied.iter().sum::<u64>(), 0, "slot 5 left the window");
        assert_eq!(snap.allowed[SLOTS - 1], 1);
        // A minute later, no latency is left to report.
        assert_eq!(s.snapshot(95 + LATENCY_SLOTS).latency_us(), None);
    }
}
