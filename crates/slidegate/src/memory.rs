//! The embedded backend: all state in this process, nothing to install.
//!
//! Keys are spread over cache-line-aligned shards, each a `std::sync::Mutex` around a hash
//! table, so two threads contend only when their keys share a shard. A critical section is a
//! few hundred nanoseconds of pure computation, never an `.await`, which is why a blocking mutex
//! is the right tool (an async mutex would only add overhead).
//!
//! Memory is bounded without a background task: after each sweep a shard counts down as many
//! operations as it then held keys (at least 64), and once that budget is spent and at least
//! 100 ms have passed, sweeps again, dropping keys whose newest admission has left the window.
//! A sweep therefore costs at most two key visits per operation, amortized, and a shard holds
//! the keys live at its last sweep plus at most those created since (one per operation, over at
//! most the larger of its key count in operations and 100 ms).
//!
//! The number of keys is bounded too: at most [`DEFAULT_MAX_KEYS`]
//! ([`MemoryBackend::with_max_keys`]), split evenly over the shards. A new key that finds its
//! shard full makes room, in this order, without ever dropping a key that holds a live denial —
//! a flood of new keys must not reset the limit of a key that is over it:
//! 1. keys that hold nothing any more (expired) are swept;
//! 2. keys not at their limit are evicted, those that would expire soonest first (they hold the
//!    least), [`EVICT_SHARE`] of the shard at once, so that the pass over the shard is paid
//!    for by that many new keys. An evicted key starts again from nothing;
//! 3. when every key of the shard is at its limit, the new key is not admitted into the table:
//!    it is denied, with a `retry_after` until the first of those keys leaves its limit (when
//!    room can be made). A denial, not an error: the memory backend does not fail, and a full
//!    table is no reason for a failure policy or a circuit breaker to step in.
//!
//! A key is *at its limit* from a denial until its `retry_after`, and from an admission that
//! leaves nothing remaining until the next permit frees.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as TableEntry;

use crate::clock::{Clock, MonotonicClock};
use crate::state::Counter;
use crate::{
    Algorithm, Backend, Charged, Check, Decision, Error, KeyState, KeyTimeline, MultiDecision, Quota, Refunded,
};

/// A shard sweeps at the earliest after this many operations, however few keys it holds.
const MIN_OPS_BETWEEN_SWEEPS: usize = 64;

/// A shard sweeps at most ten times a second: under millions of operations a second, sweeping
/// at every budget would visit a key per operation for nothing.
const MIN_MS_BETWEEN_SWEEPS: u64 = 100;

/// The most keys a memory backend holds unless [`MemoryBackend::with_max_keys`] says otherwise.
/// A key with a few admissions takes about 250 bytes (its table slot, its counter, its key when
/// longer than 22 bytes, a small log: `tests/memory_bound.rs` measures 253 B per 52-byte key),
/// so a full backend holds about a quarter of a gigabyte — a fraction of a server's memory —
/// plus 1–2 bytes per admission each sliding log holds (at most its limit, twice that after charges). A million distinct
/// keys live at once is more than one process's traffic meets in a window.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A shard holds at least this many keys (fewer shards when the bound is small), so that a
/// shard's share of the bound is not rounded to nothing.
const MIN_KEYS_PER_SHARD: usize = 64;

/// When a full shard must evict keys not at their limit, it evicts this fraction (1/16) of its
/// bound at once: one pass over the shard per that many new keys, not one per key.
pub const EVICT_SHARE: usize = 16;

/// Room for this many bytes of admissions (1–2 each) is reserved when a key first appears,
/// sparing the early regrowths of its log.
const INITIAL_LOG_CAPACITY: usize = 16;

/// The in-process backend. Cheap to clone: clones share their state.
///
/// ```
/// use slidegate::{Limiter, ManualClock, MemoryBackend, Quota};
///
/// # tokio_test();
/// # fn tokio_test() { let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// let clock = ManualClock::new(0);
/// let limiter = Limiter::new(MemoryBackend::with_clock(clock.clone()));
/// let quota = Quota::per_second(2)?;
/// assert!(limiter.check("k", &quota).await?.allowed);
/// assert!(limiter.check("k", &quota).await?.allowed);
/// assert!(!limiter.check("k", &quota).await?.allowed);
/// clock.set_ms(1_000);
/// assert!(limiter.check("k", &quota).await?.allowed);
/// # Ok::<(), slidegate::Error>(()) }).unwrap(); }
/// ```
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Shard]>,
    /// Keys one shard may hold.
    keys_per_shard: usize,
    /// Keyed per process, so clients cannot choose keys that collide (hash flooding).
    hasher: RandomState,
    clock: Arc<dyn Clock>,
}

/// Aligned so that two shards' locks never share a cache line.
#[repr(align(128))]
struct Shard(Mutex<Table>);

struct Table {
    keys: HashTable<Entry>,
    ops_until_sweep: usize,
    next_sweep_ms: u64,
    /// Set when the shard is full of keys at their limit: until then, no room can be made.
    full_until_ms: u64,
}

impl Default for Table {
    fn default() -> Self {
        Self { keys: HashTable::new(), ops_until_sweep: MIN_OPS_BETWEEN_SWEEPS, next_sweep_ms: 0, full_until_ms: 0 }
    }
}

/// One key under one algorithm (each algorithm keeps its own state of a key).
struct Entry {
    hash: u64,
    key: KeyBytes,
    counter: Counter,
    /// When the key holds nothing any more; it is swept from then on.
    expires_at: u64,
    /// Until when the key is at its limit (see [the module](self)): it is not evicted before.
    limited_until: u64,
}

/// A key, stored in its table slot when short (most user ids, IPs and phone numbers are), so
/// that finding it costs no extra memory load.
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<str>),
}

const INLINE_KEY: usize = 22;

impl KeyBytes {
    fn new(key: &str) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(key.into()),
        }
    }

    fn is(&self, key: &str) -> bool {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)] == key.as_bytes(),
            Self::Heap(k) => &**k == key,
        }
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.inner.shards.len())
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys())
            .finish()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A memory backend on the [`MonotonicClock`].
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }

    /// A memory backend on the given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::build(Arc::new(clock), DEFAULT_MAX_KEYS)
    }

    /// A new, empty backend on the same clock that holds at most `max_keys` keys (at least
    /// one; default [`DEFAULT_MAX_KEYS`]): see [the module](self) for what happens when it is
    /// full. Set it when building the backend — the keys this one holds are not carried over.
    #[must_use]
    pub fn with_max_keys(self, max_keys: usize) -> Self {
        Self::build(Arc::clone(&self.inner.clock), max_keys)
    }

    fn build(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let by_cores = (cores * 16).next_power_of_two().clamp(16, 1024);
        // The largest power of two of shards that each get MIN_KEYS_PER_SHARD of the bound.
        let by_bound = (max_keys / MIN_KEYS_PER_SHARD + 1).next_power_of_two() / 2;
        let shards = by_cores.min(by_bound.max(1));
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Shard(Mutex::default())).collect(),
                keys_per_shard: (max_keys / shards).max(1),
                hasher: RandomState::new(),
                clock,
            }),
        }
    }

    /// The most keys this backend holds: its bound, rounded down to a multiple of its shards.
    pub fn max_keys(&self) -> usize {
        self.inner.keys_per_shard * self.inner.shards.len()
    }

    /// The number of keys held, live or not yet swept.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).keys.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose admissions have all left their window. Runs by itself as keys are
    /// used; call it only to reclaim memory at a moment of your choosing.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_ms();
        for shard in &self.inner.shards {
            lock(shard).sweep(now);
        }
    }

    /// `key`'s hash: SipHash with this process' random keys (callers choose keys, so the table
    /// must not let them pick collisions), over the key's bytes alone — one key per hash, so the
    /// terminator a `str`'s `Hash` adds for composite keys is not needed.
    fn hash(&self, key: &str) -> u64 {
        let mut hasher = self.inner.hasher.build_hasher();
        hasher.write(key.as_bytes());
        hasher.finish()
    }

    /// Decides synchronously: the whole check is CPU work under one shard lock.
    pub fn check_now(&self, key: &str, quota: &Quota, cost: u64) -> Decision {
        let now = self.inner.clock.now_ms();
        let hash = self.hash(key);
        let mut table = lock(&self.inner.shards[self.shard_index(hash)]);
        table.count_op(now);
        if table.keys.len() >= self.inner.keys_per_shard
            && let Some(refusal) = table.refuse_new_key(now, self.inner.keys_per_shard, hash, key, quota)
        {
            return refusal;
        }
        let entry = table.get_or_insert(hash, key, quota.algorithm());
        let decision = entry.counter.evaluate(now, quota, cost);
        if decision.allowed {
            entry.record(now, quota, cost);
        }
        entry.note(now, &decision);
        decision
    }

    /// Records `cost` permits of `quota` for `key` whatever it holds, synchronously
    /// ([`crate::Limiter::charge`]). A new key that finds its shard full of keys at their
    /// limit is not admitted into the table (see [the module](self)): nothing is recorded, and
    /// the answer is that refusal, clamped.
    pub fn charge_now(&self, key: &str, quota: &Quota, cost: u64) -> Charged {
        self.charge_ago_now(key, quota, cost, Duration::ZERO)
    }

    /// [`MemoryBackend::charge_now`] as of `ago` before now, where `quota`'s algorithm keeps
    /// times ([`Backend::charge_ago`]).
    fn charge_ago_now(&self, key: &str, quota: &Quota, cost: u64, ago: Duration) -> Charged {
        let now = self.inner.clock.now_ms();
        let at = crate::write_back::as_of(quota, now, ago);
        let hash = self.hash(key);
        let mut table = lock(&self.inner.shards[self.shard_index(hash)]);
        table.count_op(now);
        if table.keys.len() >= self.inner.keys_per_shard
            && let Some(refusal) = table.refuse_new_key(now, self.inner.keys_per_shard, hash, key, quota)
        {
            return Charged::new(refusal, cost, 0);
        }
        let entry = table.get_or_insert(hash, key, quota.algorithm());
        let charged = entry.counter.charge(at, quota, cost);
        entry.expires_at = entry.counter.expires_at(quota);
        entry.note(now, &charged.decision);
        charged
    }

    /// Gives back up to `cost` of `key`'s most recent admissions under `quota`, synchronously
    /// ([`crate::Limiter::refund`]). A key not held gives back nothing and is not created.
    pub fn refund_now(&self, key: &str, quota: &Quota, cost: u64) -> Refunded {
        self.with_key(key, quota.algorithm(), |entry, now| match entry {
            Some(e) => {
                let refunded = e.counter.refund(now, quota, cost);
                e.expires_at = e.counter.expires_at(quota);
                refunded
            }
            None => Refunded::new(Counter::new(quota.algorithm()).standing(now, quota), 0),
        })
    }

    /// Decides several checks all or nothing: the shards involved are locked in index order
    /// (so two multi-checks cannot deadlock), every check is evaluated, and only if all fit are
    /// they recorded. Keys must be distinct ([`crate::Limiter::check_all`] checks).
    pub fn check_all_now(&self, checks: &[Check<'_>]) -> MultiDecision {
        let now = self.inner.clock.now_ms();
        let hashes: Vec<u64> = checks.iter().map(|c| self.hash(c.key)).collect();
        let mut shard_ids: Vec<usize> = hashes.iter().map(|&h| self.shard_index(h)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut tables: Vec<_> = shard_ids.iter().map(|&i| lock(&self.inner.shards[i])).collect();
        let table_of: Vec<usize> =
            hashes.iter().map(|&h| shard_ids.binary_search(&self.shard_index(h)).unwrap_or_default()).collect();
        for &t in &table_of {
            tables[t].count_op(now);
        }
        // Room for the keys not held yet is made first, sparing the keys of this group.
        let is_new: Vec<bool> = (0..checks.len())
            .map(|i| tables[table_of[i]].find_mut(hashes[i], checks[i].key, checks[i].quota.algorithm()).is_none())
            .collect();
        let mut refused = vec![false; tables.len()];
        for (t, table) in tables.iter_mut().enumerate() {
            let new = (0..checks.len()).filter(|&i| table_of[i] == t && is_new[i]).count();
            refused[t] = new > 0 && !table.make_room(now, self.inner.keys_per_shard, new, &hashes);
        }
        // Every check is evaluated before any is recorded; a key never seen before holds
        // nothing, so it is evaluated on a fresh entry that is kept only if recorded.
        let verdicts: Vec<Decision> = checks
            .iter()
            .enumerate()
            .map(|(i, c)| match tables[table_of[i]].find_mut(hashes[i], c.key, c.quota.algorithm()) {
                Some(entry) => entry.counter.evaluate(now, &c.quota, c.cost),
                None if refused[table_of[i]] => tables[table_of[i]].refusal(now, &c.quota),
                // Nothing is recorded yet: an unnamed entry with no room allocates nothing.
                None => Counter::new(c.quota.algorithm()).evaluate(now, &c.quota, c.cost),
            })
            .collect();
        let admitted = verdicts.iter().all(|d| d.allowed);
        let decisions = checks
            .iter()
            .zip(verdicts)
            .enumerate()
            .map(|(i, (c, d))| {
                let table = &mut tables[table_of[i]];
                if admitted {
                    let entry = table.get_or_insert(hashes[i], c.key, c.quota.algorithm());
                    entry.record(now, &c.quota, c.cost);
                    entry.note(now, &d);
                    return d;
                }
                if !d.allowed {
                    if let Some(entry) = table.find_mut(hashes[i], c.key, c.quota.algorithm()) {
                        entry.note(now, &d);
                    }
                    return d;
                }
                match table.find_mut(hashes[i], c.key, c.quota.algorithm()) {
                    Some(entry) => entry.counter.held(now, &c.quota, c.cost, &d),
                    None => Counter::new(c.quota.algorithm()).held(now, &c.quota, c.cost, &d),
                }
            })
            .collect();
        MultiDecision::new(decisions)
    }

    fn shard_index(&self, hash: u64) -> usize {
        // hashbrown indexes buckets with the low bits and tags with the top 7: take the shard
        // from bits in between, so keys of one shard still spread over its table.
        (hash >> 32) as usize & (self.inner.shards.len() - 1)
    }

    fn with_key<T>(&self, key: &str, algorithm: Algorithm, f: impl FnOnce(Option<&mut Entry>, u64) -> T) -> T {
        let now = self.inner.clock.now_ms();
        let hash = self.hash(key);
        let mut table = lock(&self.inner.shards[self.shard_index(hash)]);
        f(table.find_mut(hash, key, algorithm), now)
    }
}

fn lock(shard: &Shard) -> std::sync::MutexGuard<'_, Table> {
    // Nothing under the lock can panic halfway through an update, so a poisoned table is whole.
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Table {
    /// Counts one operation and sweeps when the budget since the last sweep is spent.
    fn count_op(&mut self, now: u64) {
        self.ops_until_sweep = self.ops_until_sweep.saturating_sub(1);
        if self.ops_until_sweep == 0 && now >= self.next_sweep_ms {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: u64) {
        self.keys.retain(|k| k.expires_at > now);
        self.ops_until_sweep = self.keys.len().max(MIN_OPS_BETWEEN_SWEEPS);
        self.next_sweep_ms = now + MIN_MS_BETWEEN_SWEEPS;
    }

    /// Makes room for `new` more keys under the bound `max`, as [the module](self) describes,
    /// never evicting a key whose hash is in `spare` (the keys of the check making room).
    /// Whether there is room.
    fn make_room(&mut self, now: u64, max: usize, new: usize, spare: &[u64]) -> bool {
        if self.keys.len() + new <= max {
            return true;
        }
        if now < self.full_until_ms {
            return false;
        }
        self.sweep(now);
        if self.keys.len() + new <= max {
            return true;
        }
        let evictable = |e: &Entry| e.limited_until <= now && !spare.contains(&e.hash);
        let mut expiries: Vec<u64> = self.keys.iter().filter(|e| evictable(e)).map(|e| e.expires_at).collect();
        let needed = self.keys.len() + new - max;
        if expiries.len() < needed {
            // Every key is at its limit: none leaves it before the first one's limit ends.
            self.full_until_ms =
                self.keys.iter().map(|e| e.limited_until).filter(|&t| t > now).min().unwrap_or(now + 1);
            return false;
        }
        let batch = (max / EVICT_SHARE).clamp(needed, expiries.len());
        let (_, &mut cutoff, _) = expiries.select_nth_unstable(batch - 1);
        // Into a new table rather than in place: removing from a full table leaves tombstones
        // that would make hashbrown double it at the next insert.
        let mut left = batch;
        let kept = HashTable::with_capacity(max);
        for e in std::mem::replace(&mut self.keys, kept) {
            if left > 0 && evictable(&e) && e.expires_at <= cutoff {
                left -= 1;
            } else {
                self.keys.insert_unique(e.hash, e, |e| e.hash);
            }
        }
        true
    }

    /// In a full shard, the refusal of `key` when it is new and no room can be made for it (the
    /// key is looked up twice then: to know whether it needs room). Out of line, so that the
    /// decision's common path stays small enough to be inlined whole.
    #[cold]
    #[inline(never)]
    fn refuse_new_key(&mut self, now: u64, max: usize, hash: u64, key: &str, quota: &Quota) -> Option<Decision> {
        let new = self.find_mut(hash, key, quota.algorithm()).is_none();
        (new && !self.make_room(now, max, 1, &[])).then(|| self.refusal(now, quota))
    }

    /// The answer to a new key that finds its shard full of keys at their limit: a denial until
    /// room can be made.
    fn refusal(&self, now: u64, quota: &Quota) -> Decision {
        let retry = Duration::from_millis(self.full_until_ms.saturating_sub(now).max(1));
        Decision::denied(quota.limit(), 0, retry, retry)
    }

    fn get_or_insert(&mut self, hash: u64, key: &str, algorithm: Algorithm) -> &mut Entry {
        match self.keys.entry(hash, |e| e.key.is(key) && e.counter.counts_by(algorithm), |e| e.hash) {
            TableEntry::Occupied(e) => e.into_mut(),
            TableEntry::Vacant(e) => e.insert(Entry::new(hash, key, algorithm, INITIAL_LOG_CAPACITY)).into_mut(),
        }
    }

    fn find_mut(&mut self, hash: u64, key: &str, algorithm: Algorithm) -> Option<&mut Entry> {
        self.keys.find_mut(hash, |e| e.key.is(key) && e.counter.counts_by(algorithm))
    }
}

impl Entry {
    /// A key that holds nothing, with room for `log_capacity` admissions if it is a log.
    fn new(hash: u64, key: &str, algorithm: Algorithm, log_capacity: usize) -> Self {
        let counter = Counter::with_capacity(algorithm, log_capacity);
        Self { hash, key: KeyBytes::new(key), counter, expires_at: 0, limited_until: 0 }
    }

    /// Notes whether `decision` leaves the key at its limit, and until when: a denial until its
    /// `retry_after`, an admission that left nothing until the next permit frees.
    fn note(&mut self, now: u64, decision: &Decision) {
        let limited_for = match decision.retry_after {
            Some(retry) => retry,
            None if decision.allowed && decision.remaining == 0 => decision.next_permit_after,
            None => return,
        };
        let until = now.saturating_add(u64::try_from(limited_for.as_millis()).unwrap_or(u64::MAX));
        self.limited_until = self.limited_until.max(until);
    }

    /// Records `cost` permits at `now`, after [`Counter::evaluate`] found that they fit.
    fn record(&mut self, now: u64, quota: &Quota, cost: u64) {
        self.counter.record(now, quota, cost);
        self.expires_at = self.counter.expires_at(quota);
    }
}

impl Backend for MemoryBackend {
    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        Ok(self.check_now(key, quota, cost))
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        Ok(self.check_all_now(checks))
    }

    async fn charge(&self, key: &str, quota: &Quota, cost: u64) -> Result<Charged, Error> {
        Ok(self.charge_now(key, quota, cost))
    }

    async fn charge_ago(&self, key: &str, quota: &Quota, cost: u64, ago: Duration) -> Result<Charged, Error> {
        Ok(self.charge_ago_now(key, quota, cost, ago))
    }

    async fn refund(&self, key: &str, quota: &Quota, cost: u64) -> Result<Refunded, Error> {
        Ok(self.refund_now(key, quota, cost))
    }

    async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        Ok(self.with_key(key, quota.algorithm(), |entry, now| {
            entry.map_or_else(KeyState::default, |e| e.counter.inspect(now, quota))
        }))
    }

    async fn timeline(&self, key: &str, quota: &Quota, max_admissions: usize) -> Result<KeyTimeline, Error> {
        Ok(self.with_key(key, quota.algorithm(), |entry, now| {
            entry.map_or_else(KeyTimeline::default, |e| KeyTimeline {
                state: e.counter.inspect(now, quota),
                admissions_ms: e.counter.admissions(now, quota, max_admissions),
            })
        }))
    }

    async fn accepts_writes(&self, _key: &str, _quota: &Quota) -> Result<(), Error> {
        // In this process: always, at once.
        Ok(())
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        let hash = self.hash(key);
        let mut table = lock(&self.inner.shards[self.shard_index(hash)]);
        // One entry per algorithm that counted the key.
        while let Ok(entry) = table.keys.find_entry(hash, |e| e.key.is(key)) {
            entry.remove();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;
    use crate::spec::SlidingLog;

    #[tokio::test]
    async fn a_timeline_lists_the_admissions_in_the_window_newest_last() {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone());
        let log = Quota::new(10, std::time::Duration::from_millis(1_000)).expect("quota");
        for (at, cost) in [(0, 1), (100, 1), (200, 2)] {
            clock.set_ms(at);
            assert!(backend.check("k", &log, cost).await.expect("check").allowed);
        }
        clock.set_ms(1_050);
        let t = backend.timeline("k", &log, 100).await.expect("timeline");
        assert_eq!((t.admissions_ms, t.state.count), (vec![100, 200, 200], 3), "the first left the window");
        assert_eq!(backend.timeline("k", &log, 2).await.expect("timeline").admissions_ms, [200, 200]);
        let gcra = log.with_algorithm(Algorithm::Gcra { burst: None }).expect("quota");
        backend.check("g", &gcra, 1).await.expect("check");
        assert!(backend.timeline("g", &gcra, 100).await.expect("timeline").admissions_ms.is_empty());
    }

    #[test]
    fn idle_keys_are_swept_by_use() {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone());
        let quota = Quota::new(10, Duration::from_millis(100)).expect("valid");
        for i in 0..5_000 {
            backend.check_now(&format!("k{i}"), &quota, 1);
        }
        assert_eq!(backend.len(), 5_000);
        clock.set_ms(100);
        // One fresh key per operation: every shard sweeps within a few hundred operations.
        for i in 0..20_000 {
            backend.check_now(&format!("new{i}"), &quota, 1);
        }
        assert_eq!(backend.len(), 20_000, "every expired key reclaimed, every live one kept");
        clock.set_ms(200);
        backend.sweep();
        assert!(backend.is_empty());
    }

    #[test]
    fn keys_are_found_again_after_their_tables_grow() {
        let backend = MemoryBackend::with_clock(ManualClock::new(0));
        let quota = Quota::per_second(1).expect("valid");
        let keys: Vec<String> =
            (0..10_000).map(|i| if i % 2 == 0 { format!("k{i}") } else { format!("{i:é>40}") }).collect();
        assert!(keys.iter().all(|k| backend.check_now(k, &quota, 1).allowed));
        assert!(keys.iter().all(|k| !backend.check_now(k, &quota, 1).allowed), "every key found in its grown table");
        assert_eq!(backend.len(), keys.len());
    }

    #[test]
    fn keys_inline_and_on_the_heap_are_told_apart() {
        let backend = MemoryBackend::with_clock(ManualClock::new(0));
        let quota = Quota::per_second(1).expect("valid");
        let short = "k".repeat(INLINE_KEY);
        let long = "k".repeat(INLINE_KEY + 1);
        let keys = ["", "k", "kk", short.as_str(), long.as_str(), "kkk\0", "é"];
        for key in keys.iter().filter(|k| !k.is_empty()) {
            assert!(backend.check_now(key, &quota, 1).allowed, "{key:?} is a key of its own");
        }
        for key in keys.iter().filter(|k| !k.is_empty()) {
            assert!(!backend.check_now(key, &quota, 1).allowed, "{key:?} found again");
        }
        assert!(matches!(KeyBytes::new(&short), KeyBytes::Inline { .. }));
        assert!(matches!(KeyBytes::new(&long), KeyBytes::Heap(_)));
        assert!(!KeyBytes::new("kk").is("k") && !KeyBytes::new("k").is("kk"));
    }

    #[test]
    fn backward_clock_step_keeps_the_log_sorted_like_the_spec() {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone());
        let quota = Quota::new(3, Duration::from_millis(1_000)).expect("valid");
        let mut spec = SlidingLog::default();
        // Steps back, never so far that an admission dropped as expired would be live again
        // (the log has forgotten it; the specification keeps every one).
        for t in [500, 100, 900, 1_200, 1_150, 1_600, 1_550] {
            clock.set_ms(t);
            assert_eq!(backend.check_now("k", &quota, 1), spec.check(t, 3, 1_000, 1), "at {t}");
        }
    }

    #[test]
    fn a_flood_of_new_keys_never_evicts_a_denied_key() {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone()).with_max_keys(64);
        assert_eq!(backend.max_keys(), 64);
        let (strict, loose) = (Quota::per_minute(2).expect("valid"), Quota::per_minute(10).expect("valid"));
        let victim = (0..3).map(|_| backend.check_now("victim", &strict, 1).allowed).collect::<Vec<_>>();
        assert_eq!(victim, [true, true, false]);
        // The attack: a thousand new keys, each admitted once, into a table of 64.
        for i in 0..1_000 {
            clock.set_ms(i);
            assert!(backend.check_now(&format!("flood{i}"), &loose, 1).allowed, "a key under its limit is evicted");
            assert!(backend.len() <= 64);
        }
        assert!(!backend.check_now("victim", &strict, 1).allowed, "the victim is still denied");
        clock.set_ms(60_000);
        assert!(backend.check_now("victim", &strict, 1).allowed, "until its window passes");
    }

    #[test]
    fn a_table_full_of_keys_at_their_limit_denies_new_keys_until_one_frees() {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone()).with_max_keys(64);
        let quota = Quota::per_second(1).expect("valid");
        for i in 0..64 {
            clock.set_ms(i);
            assert!(backend.check_now(&format!("k{i}"), &quota, 1).allowed);
        }
        // Every key took its only permit: none may be evicted, so the new key is denied.
        let d = backend.check_now("new", &quota, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(1_000 - 63)), "until k0's permit frees");
        let group = backend.check_all_now(&[Check::new("k63", quota), Check::new("other", quota)]);
        assert!(!group.allowed);
        assert_eq!(group.denied_by, Some(0));
        assert!(group.decisions[1].retry_after.is_some(), "the new key of the group is refused too");
        assert!((0..64).all(|i| !backend.check_now(&format!("k{i}"), &quota, 1).allowed), "all still limited");
        clock.set_ms(1_000);
        assert!(backend.check_now("new", &quota, 1).allowed, "room once k0 leaves its limit");
        assert_eq!(backend.len(), 64);
    }

    #[test]
    fn the_bound_is_spread_over_shards_and_never_exceeded() {
        for max in [1, 63, 100, 4_096, 100_000, DEFAULT_MAX_KEYS] {
            let backend = MemoryBackend::new().with_max_keys(max);
            assert!(backend.max_keys() <= max && backend.max_keys() > max - backend.inner.shards.len(), "{max}");
        }
        assert_eq!(MemoryBackend::new().with_max_keys(0).max_keys(), 1);
    }
}
