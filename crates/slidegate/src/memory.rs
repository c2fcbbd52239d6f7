//! The embedded backend: all state in this process, nothing to install.
//!
//! Keys are spread over cache-line-aligned shards, each a `std::sync::Mutex` around a hash
//! table, so two threads contend only when their keys share a shard. A critical section is a
//! few hundred nanoseconds of pure computation, never an `.await`, which is why a blocking mutex
//! is the right tool (an async mutex would only add overhead).
//!
//! Memory is bounded without a background task: after each sweep a shard counts down as many
//! operations as it then held keys (at least 64) and sweeps again, dropping keys whose newest
//! admission has left the window. A sweep therefore costs at most two key visits per operation,
//! amortized, and a shard never holds more than about twice the keys that were live at its last
//! sweep plus those created since.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as TableEntry;

use crate::clock::{Clock, SystemClock};
use crate::{Backend, Decision, Error, KeyState, Quota};

/// A shard sweeps at the earliest after this many operations, however few keys it holds.
const MIN_OPS_BETWEEN_SWEEPS: usize = 64;

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
    /// Keyed per process, so clients cannot choose keys that collide (hash flooding).
    hasher: RandomState,
    clock: Arc<dyn Clock>,
}

/// Aligned so that two shards' locks never share a cache line.
#[repr(align(128))]
struct Shard(Mutex<Table>);

struct Table {
    keys: HashTable<KeyLog>,
    ops_until_sweep: usize,
}

impl Default for Table {
    fn default() -> Self {
        Self { keys: HashTable::new(), ops_until_sweep: MIN_OPS_BETWEEN_SWEEPS }
    }
}

struct KeyLog {
    hash: u64,
    key: Box<str>,
    /// Admission times in ms, oldest first, one per permit.
    log: VecDeque<u64>,
    /// When the newest admission leaves its window; the key is dead from then on.
    expires_at: u64,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").field("shards", &self.inner.shards.len()).field("keys", &self.len()).finish()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A memory backend on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A memory backend on the given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let shards = (cores * 16).next_power_of_two().clamp(16, 1024);
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Shard(Mutex::default())).collect(),
                hasher: RandomState::new(),
                clock: Arc::new(clock),
            }),
        }
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

    /// Decides synchronously: the whole check is CPU work under one shard lock.
    pub fn check_now(&self, key: &str, quota: &Quota, cost: u64) -> Decision {
        let now = self.inner.clock.now_ms();
        let hash = self.inner.hasher.hash_one(key);
        let mut table = lock(self.shard(hash));
        table.ops_until_sweep -= 1;
        if table.ops_until_sweep == 0 {
            table.sweep(now);
        }
        let entry = match table.keys.entry(hash, |k| &*k.key == key, |k| k.hash) {
            TableEntry::Occupied(e) => e.into_mut(),
            TableEntry::Vacant(e) => {
                e.insert(KeyLog { hash, key: key.into(), log: VecDeque::new(), expires_at: 0 }).into_mut()
            }
        };
        let decision = sliding_log(&mut entry.log, now, quota.limit(), quota.window_ms(), cost);
        if decision.allowed {
            entry.expires_at = entry.expires_at.max(now + quota.window_ms());
        }
        decision
    }

    fn shard(&self, hash: u64) -> &Shard {
        // hashbrown indexes buckets with the low bits and tags with the top 7: take the shard
        // from bits in between, so keys of one shard still spread over its table.
        let index = (hash >> 32) as usize & (self.inner.shards.len() - 1);
        &self.inner.shards[index]
    }

    fn with_key<T>(&self, key: &str, f: impl FnOnce(Option<&mut KeyLog>, u64) -> T) -> T {
        let now = self.inner.clock.now_ms();
        let hash = self.inner.hasher.hash_one(key);
        let mut table = lock(self.shard(hash));
        f(table.keys.find_mut(hash, |k| &*k.key == key), now)
    }
}

fn lock(shard: &Shard) -> std::sync::MutexGuard<'_, Table> {
    // Nothing under the lock can panic halfway through an update, so a poisoned table is whole.
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Table {
    fn sweep(&mut self, now: u64) {
        self.keys.retain(|k| k.expires_at > now);
        self.ops_until_sweep = self.keys.len().max(MIN_OPS_BETWEEN_SWEEPS);
    }
}

/// The sliding log on a sorted deque: expired entries are a prefix, so they pop from the front
/// and every question is answered by position. Semantics: [`crate::reference::SlidingLog`].
fn sliding_log(log: &mut VecDeque<u64>, now: u64, limit: u64, window: u64, cost: u64) -> Decision {
    while log.front().is_some_and(|&t| t + window <= now) {
        log.pop_front();
    }
    let live = log.len() as u64;
    if live + cost <= limit {
        let permits = usize::try_from(cost).unwrap_or(usize::MAX);
        if log.back().is_none_or(|&t| t <= now) {
            log.extend(std::iter::repeat_n(now, permits));
        } else {
            // The clock stepped back: keep the log sorted.
            let at = log.partition_point(|&t| t <= now);
            for _ in 0..permits {
                log.insert(at, now);
            }
        }
        let newest = log.back().copied().unwrap_or(now);
        return Decision::allowed(limit, limit - live - cost, ms(newest + window - now));
    }
    let newest = log.back().copied().unwrap_or(now);
    let k = usize::try_from(live + cost - limit).unwrap_or(usize::MAX);
    let retry = log.get(k - 1).map_or(Duration::MAX, |&t| ms(t + window - now));
    Decision::denied(limit, limit.saturating_sub(live), ms(newest + window - now), retry)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

impl Backend for MemoryBackend {
    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        Ok(self.check_now(key, quota, cost))
    }

    async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        let window = quota.window_ms();
        Ok(self.with_key(key, |entry, now| {
            let Some(entry) = entry else {
                return KeyState::default();
            };
            let first_live = entry.log.partition_point(|&t| t + window <= now);
            let live = entry.log.range(first_live..);
            KeyState {
                count: live.len() as u64,
                oldest_ms: entry.log.get(first_live).copied(),
                reset_after: entry
                    .log
                    .back()
                    .filter(|_| live.len() > 0)
                    .map_or(Duration::ZERO, |&t| ms(t + window - now)),
            }
        }))
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        let hash = self.inner.hasher.hash_one(key);
        let mut table = lock(self.shard(hash));
        if let Ok(entry) = table.keys.find_entry(hash, |k| &*k.key == key) {
            entry.remove();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;
    use crate::reference::SlidingLog;

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
    fn backward_clock_step_keeps_the_log_sorted_like_the_reference() {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone());
        let quota = Quota::new(3, Duration::from_millis(1_000)).expect("valid");
        let mut reference = SlidingLog::default();
        for t in [500, 100, 900, 1_200, 1_050, 1_600, 1_400] {
            clock.set_ms(t);
            assert_eq!(backend.check_now("k", &quota, 1), reference.check(t, 3, 1_000, 1), "at {t}");
        }
    }
}
