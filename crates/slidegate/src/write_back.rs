//! What a local failure policy admitted while the backend was away, kept to be written into the
//! backend once it answers again ([`crate::Limiter::write_back`]): without it, the window that
//! spans an outage forgets the fleet's local admissions (all of it, if Redis comes back empty),
//! and a key can admit up to twice its limit across it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::Quota;
use crate::quota::Algorithm;

/// The most local admissions an instance keeps for write-back; a local admission past it is
/// not written back (and counted in [`WriteBack::dropped`]). Each holds its key (at most
/// [`crate::MAX_KEY_LEN`] bytes, twice: the entry and the index of each key's newest) and its
/// quota, so the journal takes at most about 120 MiB. Admissions of one key in one millisecond
/// share one entry (up to a cost the quota takes in one call).
pub const MAX_WRITE_BACK: usize = 100_000;

/// One local admission: `cost` permits of `quota` for `key` at `at_ms` (the system clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) key: String,
    pub(crate) quota: Quota,
    pub(crate) cost: u64,
    pub(crate) at_ms: u64,
}

impl Admitted {
    /// Whether the admission no longer counts at `now_ms` under its algorithm, so that writing
    /// it back would change nothing (a sliding log's entry left the window, a fixed window has
    /// rolled over) or would add to a window it was not in (a sliding window's count is of
    /// now's window and the last). Arrivals of a GCRA stack, so none is judged alone: all of a
    /// key's have drained once its newest (`newest_ms`) is older than the most a bucket can be
    /// ahead ([`crate::MAX_CHARGE_FACTOR`] times the burst's emission time).
    pub(crate) fn is_stale(&self, now_ms: u64, newest_ms: u64) -> bool {
        let window = self.quota.window_ms();
        match self.quota.algorithm() {
            Algorithm::SlidingLog | Algorithm::SlidingWindow { .. } => self.at_ms.saturating_add(window) <= now_ms,
            Algorithm::FixedWindow => self.at_ms / window != now_ms / window,
            Algorithm::Gcra { .. } => {
                let ahead_us = crate::MAX_CHARGE_FACTOR * self.quota.burst() * self.quota.emission_us();
                newest_ms.saturating_add(ahead_us.div_ceil(1000)) <= now_ms
            }
        }
    }
}

/// Whether `quota`'s algorithm keeps the times of its admissions (a sliding log's entries, a
/// GCRA's arrival), so that a charge can be placed in the past ([`crate::Backend::charge_ago`]).
pub(crate) fn keeps_times(quota: &Quota) -> bool {
    matches!(quota.algorithm(), Algorithm::SlidingLog | Algorithm::Gcra { .. })
}

/// The time, in ms on a clock reading `now_ms`, at which [`crate::Backend::charge_ago`] records
/// a charge `ago` before now: then where `quota`'s algorithm keeps times, now where it does not.
pub(crate) fn as_of(quota: &Quota, now_ms: u64, ago: Duration) -> u64 {
    if keeps_times(quota) { now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)) } else { now_ms }
}

/// What one [`crate::Limiter::write_back`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteBack {
    /// Permits written into the backend.
    pub written: u64,
    /// Permits not written: no longer in their window, past the backend's
    /// [`crate::MAX_CHARGE_FACTOR`] bound, or — since the last write-back — past
    /// [`MAX_WRITE_BACK`].
    pub dropped: u64,
    /// Entries still waiting: the backend failed again part way, or another write-back runs.
    pub pending: usize,
}

/// Local admissions in the order they were made, with each key's newest: an admission merges
/// into it when it is of the same quota and millisecond and the two together are a cost the
/// quota takes in one call, however many other keys came between.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    pub(crate) list: VecDeque<Admitted>,
    /// Each key's newest entry, by its index in `list`.
    pub(crate) newest: HashMap<String, usize>,
}

impl Entries {
    fn push(&mut self, a: Admitted) {
        self.newest.insert(a.key.clone(), self.list.len());
        self.list.push_back(a);
    }

    /// The time of `key`'s newest entry.
    pub(crate) fn newest_ms(&self, key: &str) -> Option<u64> {
        self.newest.get(key).map(|&i| self.list[i].at_ms)
    }
}

/// The journal of local admissions: bounded, and taken whole by one write-back at a time.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    entries: Mutex<Entries>,
    /// Entries held, those a write-back has taken included: what [`MAX_WRITE_BACK`] bounds.
    held: AtomicUsize,
    dropped: AtomicU64,
    writing: AtomicBool,
}

impl Journal {
    /// Keeps a local admission, merged into its key's newest entry where it can be.
    pub(crate) fn keep(&self, key: &str, quota: &Quota, cost: u64, at_ms: u64) {
        let mut entries = lock(&self.entries);
        if let Some(&i) = entries.newest.get(key) {
            let last = &mut entries.list[i];
            if (last.at_ms, &last.quota) == (at_ms, quota) && last.cost + cost <= quota.max_cost() {
                last.cost += cost;
                return;
            }
        }
        if self.held.load(Ordering::Relaxed) >= MAX_WRITE_BACK {
            drop(entries);
            self.dropped.fetch_add(cost, Ordering::Relaxed);
            return;
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        entries.push(Admitted { key: key.to_owned(), quota: *quota, cost, at_ms });
    }

    /// Entries waiting to be written back, those a write-back holds included; a load, no lock.
    pub(crate) fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes every entry for one write-back, with the permits dropped since the last one;
    /// `None` while another write-back holds them.
    pub(crate) fn take(&self) -> Option<(Entries, u64)> {
        if self.writing.swap(true, Ordering::Acquire) {
            return None;
        }
        let entries = std::mem::take(&mut *lock(&self.entries));
        Some((entries, self.dropped.swap(0, Ordering::Relaxed)))
    }

    /// Ends a write-back, giving back the entries it could not write (ahead of any kept since,
    /// within [`MAX_WRITE_BACK`]); answers how many wait now.
    pub(crate) fn give_back(&self, unwritten: impl IntoIterator<Item = Admitted>) -> usize {
        let mut entries = lock(&self.entries);
        let mut all = Entries::default();
        for a in unwritten.into_iter().chain(std::mem::take(&mut entries.list)) {
            if all.list.len() < MAX_WRITE_BACK {
                all.push(a);
            } else {
                self.dropped.fetch_add(a.cost, Ordering::Relaxed);
            }
        }
        *entries = all;
        let pending = entries.list.len();
        self.held.store(pending, Ordering::Relaxed);
        drop(entries);
        self.writing.store(false, Ordering::Release);
        pending
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_merges_one_millisecond_of_a_key_among_others_and_is_bounded() {
        let journal = Journal::default();
        let quota = Quota::new(10, Duration::from_secs(1)).expect("quota");
        journal.keep("a", &quota, 1, 5);
        journal.keep("b", &quota, 1, 5);
        journal.keep("a", &quota, 2, 5);
        journal.keep("b", &quota, 1, 5);
        journal.keep("a", &quota, 8, 5);
        assert_eq!(journal.len(), 3, "a's and b's merged between each other; a's third past the limit kept apart");
        for i in 0..MAX_WRITE_BACK as u64 {
            journal.keep("c", &quota, 1, 10 + i);
        }
        assert_eq!(journal.len(), MAX_WRITE_BACK);
        let (entries, dropped) = journal.take().expect("not writing");
        assert_eq!((entries.list[0].cost, entries.list[1].cost, dropped), (3, 2, 3), "three of c's past the bound");
        assert_eq!(entries.newest_ms("c"), Some(10 + MAX_WRITE_BACK as u64 - 4));
        assert!(journal.take().is_none(), "one write-back at a time");
        // What a write-back holds counts against the bound: nothing more is kept meanwhile.
        journal.keep("d", &quota, 1, 1);
        assert_eq!(journal.len(), MAX_WRITE_BACK);
        assert_eq!(journal.give_back(entries.list), MAX_WRITE_BACK);
        let (_, dropped) = journal.take().expect("not writing");
        assert_eq!(dropped, 1, "d's, kept while the journal was full");
    }

    #[test]
    fn an_admission_is_stale_once_it_no_longer_counts() {
        let log = Quota::new(10, Duration::from_secs(1)).expect("quota");
        let at = |quota: Quota, at_ms| Admitted { key: "k".into(), quota, cost: 1, at_ms };
        assert!(!at(log, 1_000).is_stale(1_999, 1_000));
        assert!(at(log, 1_000).is_stale(2_000, 1_000));
        let fixed = log.with_algorithm(Algorithm::FixedWindow).expect("quota");
        assert!(!at(fixed, 1_000).is_stale(1_999, 1_000));
        assert!(at(fixed, 1_999).is_stale(2_000, 1_999), "the window rolled over");
        // 10 a second, burst 10: a bucket is at most 2 s ahead of its newest arrival.
        let gcra = log.with_algorithm(Algorithm::Gcra { burst: None }).expect("quota");
        assert!(!at(gcra, 0).is_stale(1_999, 0));
        assert!(at(gcra, 0).is_stale(2_000, 0), "drained");
        assert!(!at(gcra, 0).is_stale(2_000, 1_000), "a newer arrival of the key stacks on it");
    }
}
