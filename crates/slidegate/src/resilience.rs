//! What a limiter does when its backend cannot answer: a [`FailurePolicy`] per quota (or a
//! default per limiter), a [`CircuitBreaker`] that stops calling a backend that keeps failing,
//! and a [`NearCache`] that answers keys already known to be over their limit without a round
//! trip.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use crate::{Decision, Error, Quota};

/// How a decision is made when the backend errs, times out, or its circuit is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit: availability over enforcement.
    FailOpen,
    /// Deny: enforcement over availability.
    FailClosed,
    /// Decide with an in-process memory limiter at a share of the limit (e.g. the limit divided
    /// by the number of instances), so the limit still roughly holds across the fleet.
    Local {
        /// The share of the limit, in thousandths (`1..=1000`).
        share_permille: u16,
    },
    /// [`FailurePolicy::Local`] at the limit divided by the live instances of the fleet, as last
    /// counted into the limiter's [`Fleet`] (a server's heartbeat counts them in Redis while it
    /// can); at `fallback_permille` while the fleet has never been counted.
    LocalAuto {
        /// The share while the fleet has never been counted, in thousandths (`1..=1000`).
        fallback_permille: u16,
    },
}

impl FailurePolicy {
    /// [`FailurePolicy::Local`] at `share` (in `0.001..=1`, to the thousandth) of the limit.
    pub fn local(share: f64) -> Result<Self, Error> {
        if !(0.001..=1.0).contains(&share) {
            return Err(Error::InvalidQuota(format!("local_share must be between 0.001 and 1, got {share}")));
        }
        // In range by the check above.
        Ok(Self::Local { share_permille: (share * 1000.0).round() as u16 })
    }

    /// [`FailurePolicy::LocalAuto`], at `fallback` (in `0.001..=1`) until the fleet is counted.
    pub fn local_auto(fallback: f64) -> Result<Self, Error> {
        match Self::local(fallback)? {
            Self::Local { share_permille } => Ok(Self::LocalAuto { fallback_permille: share_permille }),
            other => Ok(other),
        }
    }

    /// The name used in configuration files and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::Local { .. } | Self::LocalAuto { .. } => "local",
        }
    }

    /// Of two policies, the one that admits least: `fail_closed`, then `local`, then `fail_open`.
    fn strictest(self, other: Self) -> Self {
        let rank = |p: Self| match p {
            Self::FailClosed => 2,
            Self::Local { .. } | Self::LocalAuto { .. } => 1,
            Self::FailOpen => 0,
        };
        if rank(other) > rank(self) { other } else { self }
    }
}

impl std::fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many instances of a fleet are live, as last counted (by a heartbeat in the shared store):
/// what [`FailurePolicy::LocalAuto`] divides each limit by while the store is away. It keeps the
/// last count through an outage, which is when it is used.
#[derive(Debug, Default)]
pub struct Fleet {
    /// The last count; 0 while the fleet has never been counted.
    live: AtomicU32,
}

impl Fleet {
    /// Records a count of the live instances (this one included; 0 is taken as 1).
    pub fn set_live(&self, instances: u32) {
        self.live.store(instances.max(1), Ordering::Relaxed);
    }

    /// The last count, or `None` while the fleet has never been counted.
    pub fn live(&self) -> Option<u32> {
        Some(self.live.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }
}

/// The strictest policy among `policies` (`None` when empty).
pub(crate) fn strictest(policies: impl IntoIterator<Item = FailurePolicy>) -> Option<FailurePolicy> {
    policies.into_iter().reduce(FailurePolicy::strictest)
}

/// Stops calling a backend that keeps failing: after `failures` consecutive failures the circuit
/// opens and every call is answered by the failure policy at once, without waiting for a
/// deadline; after `open_for` one call is let through as a probe (half-open); its success closes
/// the circuit, its failure opens it again. A probe that has not reported after another
/// `open_for` (its caller gave up mid-call) no longer holds the next one back.
#[derive(Debug)]
pub struct CircuitBreaker {
    failures: u32,
    open_for: Duration,
    epoch: Instant,
    consecutive: AtomicU32,
    /// When the circuit may be probed, in ns since `epoch`; 0 while closed.
    open_until: AtomicU64,
    /// When the probe in flight began, in ns since `epoch`; 0 when none is.
    probe_since: AtomicU64,
}

/// Consecutive failures that open a circuit unless set otherwise.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;

/// How long an open circuit waits before probing unless set otherwise: short, so a backend that
/// is back is used again within a fraction of a second.
pub const DEFAULT_BREAKER_OPEN_FOR: Duration = Duration::from_millis(250);

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new(DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_OPEN_FOR)
    }
}

impl CircuitBreaker {
    /// Opens after `failures` (at least 1) consecutive failures, probes after `open_for`.
    pub fn new(failures: u32, open_for: Duration) -> Self {
        Self {
            failures: failures.max(1),
            open_for,
            epoch: Instant::now(),
            consecutive: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probe_since: AtomicU64::new(0),
        }
    }

    /// Whether the circuit is open (calls are not being made).
    pub fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Consecutive failures that open the circuit.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long an open circuit waits before a probe.
    pub fn open_for(&self) -> Duration {
        self.open_for
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
    }

    /// Whether a call may go to the backend now: always while closed; once open, only the one
    /// probe after `open_for`.
    pub(crate) fn allow(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = self.now();
        let since = self.probe_since.load(Ordering::Acquire);
        // A probe whose caller gave up (its future dropped mid-call) never reports; without
        // this, it would hold the circuit open for good. One older than `open_for` is over.
        let over = since == 0 || now.saturating_sub(since) >= self.open_for_ns();
        now >= until
            && over
            && self.probe_since.compare_exchange(since, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    pub(crate) fn succeeded(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        if self.open_until.load(Ordering::Relaxed) != 0 {
            self.open_until.store(0, Ordering::Release);
            self.probe_since.store(0, Ordering::Release);
        }
    }

    /// A call the backend answered while the circuit is open, which must stay open for now
    /// (local admissions wait to be written back): the next probe comes after `open_for`, as
    /// after a failure, but the failure count starts over. Nothing while closed.
    pub(crate) fn hold_open(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        if self.open_until.load(Ordering::Relaxed) != 0 {
            self.open_until.store(self.now().saturating_add(self.open_for_ns()), Ordering::Release);
            self.probe_since.store(0, Ordering::Release);
        }
    }

    /// A call that ended in an error that is not the backend failing (see
    /// [`crate::Error::is_backend_failure`]): it neither counts as a failure nor closes the
    /// circuit, but a probe that ends so is over — the next call probes again. Without this, a
    /// probe answered with such an error (which a caller can provoke) would leave the circuit
    /// open for good.
    pub(crate) fn settled(&self) {
        self.probe_since.store(0, Ordering::Release);
    }

    pub(crate) fn failed(&self) {
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let probe_failed = self.probe_since.swap(0, Ordering::AcqRel) != 0;
        if probe_failed || n >= self.failures {
            self.open_until.store(self.now().saturating_add(self.open_for_ns()), Ordering::Release);
        }
    }

    fn open_for_ns(&self) -> u64 {
        u64::try_from(self.open_for.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Remembers keys the backend denied until their `retry_after` has passed, and answers them
/// without a round trip until then. Exact for the sliding log, the sliding window, the fixed
/// window and the GCRA: once a request is denied, nothing but an explicit reset lets the same
/// request (or a costlier one) through before `retry_after`. Quotas with a warm-up are not cached
/// (their `retry_after` is an upper bound). Bounded: a full cache drops expired entries, and
/// when none has expired caches nothing more until some do.
#[derive(Debug)]
pub struct NearCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
}

#[derive(Debug)]
struct Denied {
    hash: u64,
    key: Box<str>,
    quota: Quota,
    /// The cheapest denied cost: any request costing at least this is denied too.
    cost: u64,
    decision: Decision,
    until: Instant,
    at: Instant,
}

const NEAR_CACHE_SHARDS: usize = 16;

/// One shard: its denials, and how often it was asked and could answer (counted under the lock
/// the lookup holds anyway, so counting costs no atomic operation).
#[derive(Debug, Default)]
struct Shard {
    table: HashTable<Denied>,
    lookups: u64,
    hits: u64,
}

impl NearCache {
    /// A cache of at most `capacity` denied keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..NEAR_CACHE_SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(NEAR_CACHE_SHARDS).max(1),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        // All quotas of one key share its hash, so a reset finds them all in one shard.
        self.shards[(hash >> 32) as usize % NEAR_CACHE_SHARDS].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The denial to answer for `cost` permits of `quota` on `key`, if one is known still to hold.
    pub(crate) fn get(&self, key: &str, quota: &Quota, cost: u64) -> Option<Decision> {
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash);
        let shard = &mut *guard;
        shard.lookups += 1;
        let entry = shard.table.find_entry(hash, |d| d.quota == *quota && &*d.key == key).ok()?;
        let now = Instant::now();
        if now >= entry.get().until {
            entry.remove();
            return None;
        }
        let d = entry.get();
        if cost < d.cost {
            return None;
        }
        let elapsed = now - d.at;
        let mut decision = d.decision;
        decision.retry_after = Some(d.until - now);
        decision.reset_after = decision.reset_after.saturating_sub(elapsed);
        decision.next_permit_after = decision.next_permit_after.saturating_sub(elapsed);
        shard.hits += 1;
        Some(decision)
    }

    /// Remembers a denial the backend answered (not one a failure policy made).
    pub(crate) fn remember(&self, key: &str, quota: &Quota, cost: u64, decision: &Decision) {
        let Some(retry) = decision.retry_after.filter(|r| !r.is_zero()) else { return };
        if quota.warm_up().is_some() || decision.degraded.is_some() {
            return;
        }
        let at = Instant::now();
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash);
        let shard = &mut guard.table;
        if let Ok(mut entry) = shard.find_entry(hash, |d| d.quota == *quota && &*d.key == key) {
            let d = entry.get_mut();
            if cost <= d.cost || at >= d.until {
                *d = Denied { hash, key: key.into(), quota: *quota, cost, decision: *decision, until: at + retry, at };
            }
            return;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|d| d.until > at);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let denied = Denied { hash, key: key.into(), quota: *quota, cost, decision: *decision, until: at + retry, at };
        shard.insert_unique(hash, denied, |d| d.hash);
    }

    /// Forgets every denial of `key` (an admin reset).
    pub(crate) fn forget(&self, key: &str) {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        while let Ok(entry) = shard.table.find_entry(hash, |d| &*d.key == key) {
            entry.remove();
        }
    }

    /// How many denials are held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).table.len()).sum()
    }

    /// The most denials held (the capacity it was built with, rounded up to its shards).
    pub fn capacity(&self) -> usize {
        self.per_shard * NEAR_CACHE_SHARDS
    }

    /// How many checks asked the cache, and how many of them it answered, since it was built.
    pub fn hit_counts(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(lookups, hits), s| {
            let s = s.lock().unwrap_or_else(PoisonError::into_inner);
            (lookups + s.lookups, hits + s.hits)
        })
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_near_cache_counts_its_lookups_and_hits() {
        let cache = NearCache::new(10);
        let quota = Quota::per_minute(1).expect("quota");
        let denied = Decision::denied(1, 0, Duration::from_secs(60), Duration::from_secs(30));
        assert_eq!(cache.get("k", &quota, 1), None);
        cache.remember("k", &quota, 1, &denied);
        assert!(cache.get("k", &quota, 1).is_some());
        assert_eq!(cache.get("other", &quota, 1), None);
        assert_eq!(cache.hit_counts(), (3, 1));
        assert!(cache.capacity() >= 10);
    }

    #[test]
    fn the_breaker_opens_probes_once_and_closes() {
        let b = CircuitBreaker::new(3, Duration::from_millis(30));
        for _ in 0..2 {
            assert!(b.allow());
            b.failed();
        }
        assert!(!b.is_open(), "two failures of three");
        b.succeeded();
        for _ in 0..3 {
            b.failed();
        }
        assert!(b.is_open() && !b.allow(), "open: no calls");
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.allow(), "the probe");
        assert!(!b.allow(), "only one probe at a time");
        b.failed();
        assert!(b.is_open() && !b.allow(), "a failed probe reopens at once");
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.allow());
        b.succeeded();
        assert!(!b.is_open() && b.allow() && b.allow(), "closed");
    }

    #[test]
    fn the_near_cache_answers_until_retry_after_for_costlier_requests_only() {
        let cache = NearCache::new(100);
        let q = Quota::per_second(5).expect("valid");
        let denied = Decision::denied(5, 1, Duration::from_millis(900), Duration::from_millis(50));
        cache.remember("k", &q, 2, &denied);
        assert!(cache.get("k", &q, 2).is_some_and(|d| !d.allowed && d.retry_after <= Some(Duration::from_millis(50))));
        assert!(cache.get("k", &q, 3).is_some());
        assert!(cache.get("k", &q, 1).is_none(), "a cheaper request may fit");
        assert!(cache.get("k", &Quota::per_second(6).expect("valid"), 2).is_none(), "another quota");
        assert!(cache.get("other", &q, 2).is_none());
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get("k", &q, 2).is_none(), "expired");
        assert!(cache.is_empty(), "and dropped");
        cache.remember("k", &q, 2, &denied);
        cache.forget("k");
        assert!(cache.get("k", &q, 2).is_none(), "forgotten on reset");
        let degraded = Decision { degraded: Some(FailurePolicy::FailClosed), ..denied };
        cache.remember("k", &q, 2, &degraded);
        assert!(cache.is_empty(), "a policy's answer is not a fact about the key");
    }

    #[test]
    fn the_near_cache_is_bounded() {
        let cache = NearCache::new(32);
        let q = Quota::per_second(5).expect("valid");
        let denied = Decision::denied(5, 0, Duration::from_secs(1), Duration::from_secs(1));
        for i in 0..1_000 {
            cache.remember(&format!("k{i}"), &q, 1, &denied);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
    }

    #[test]
    fn policies_parse_and_rank() {
        assert_eq!(FailurePolicy::local(0.25).expect("valid"), FailurePolicy::Local { share_permille: 250 });
        assert!(FailurePolicy::local(0.0).is_err() && FailurePolicy::local(1.5).is_err());
        let all = [FailurePolicy::FailOpen, FailurePolicy::Local { share_permille: 500 }, FailurePolicy::FailClosed];
        assert_eq!(strictest(all), Some(FailurePolicy::FailClosed));
        assert_eq!(strictest(all[..2].iter().copied()), Some(all[1]));
        assert_eq!(all.map(FailurePolicy::as_str), ["fail_open", "local", "fail_closed"]);
    }
}
