//! What a local failure policy admitted while the backend was away, kept to be written into the
//! backend once it answers again ([`crate::Limiter::write_back`]): without it, the window that
//! spans an outage forgets the fleet's local admissions (all of it, if Redis comes back empty),
//! and a key can admit up to twice its limit across it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::Quota;
use crate::quota::Algorithm;

/// The most local admissions an instance keeps for write-back; a local admission past it is
/// not written back (and counted in [`WriteBack::dropped`]). Each holds its key (at most
/// [`crate::MAX_KEY_LEN`] bytes) and its quota, so the journal takes at most about 60 MiB.
/// Admissions of one key in one millisecond share one entry.
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
    /// now's window and the last). A GCRA's arrival is written back at its own time whatever
    /// its age: arrivals stack, so no single one can be judged drained alone.
    pub(crate) fn is_stale(&self, now_ms: u64) -> bool {
        let window = self.quota.window_ms();
        match self.quota.algorithm() {
            Algorithm::SlidingLog | Algorithm::SlidingWindow { .. } => self.at_ms.saturating_add(window) <= now_ms,
            Algorithm::FixedWindow => self.at_ms / window != now_ms / window,
            Algorithm::Gcra { .. } => false,
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
    /// [`crate::MAX_CHARGE_FACTOR`] bound, refused by the backend as unsupported (a warm-up
    /// quota on Redis without the module), or — since the last write-back — past
    /// [`MAX_WRITE_BACK`].
    pub dropped: u64,
    /// Entries still waiting: the backend failed again part way, or another write-back runs.
    pub pending: usize,
}

/// The journal of local admissions: bounded, and taken whole by one write-back at a time.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    entries: Mutex<VecDeque<Admitted>>,
    dropped: AtomicU64,
    writing: AtomicBool,
}

impl Journal {
    /// Keeps a local admission, merged with the last one when it is of the same key, quota
    /// and millisecond and the two together are a cost the quota takes in one call.
    pub(crate) fn keep(&self, key: &str, quota: &Quota, cost: u64, at_ms: u64) {
        let mut entries = lock(&self.entries);
        if let Some(last) = entries.back_mut()
            && (last.at_ms, last.key.as_str(), &last.quota) == (at_ms, key, quota)
            && last.cost + cost <= quota.max_cost()
        {
            last.cost += cost;
            return;
        }
        if entries.len() >= MAX_WRITE_BACK {
            drop(entries);
            self.dropped.fetch_add(cost, Ordering::Relaxed);
            return;
        }
        entries.push_back(Admitted { key: key.to_owned(), quota: *quota, cost, at_ms });
    }

    /// Entries waiting to be written back.
    pub(crate) fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Takes every entry for one write-back, with the permits dropped since the last one;
    /// `None` while another write-back holds them.
    pub(crate) fn take(&self) -> Option<(VecDeque<Admitted>, u64)> {
        if self.writing.swap(true, Ordering::Acquire) {
            return None;
        }
        let entries = std::mem::take(&mut *lock(&self.entries));
        Some((entries, self.dropped.swap(0, Ordering::Relaxed)))
    }

    /// Ends a write-back, giving back the entries it could not write (ahead of any kept since,
    /// within [`MAX_WRITE_BACK`]); answers how many wait now.
    pub(crate) fn give_back(&self, mut unwritten: VecDeque<Admitted>) -> usize {
        let mut entries = lock(&self.entries);
        if !unwritten.is_empty() {
            unwritten.extend(entries.drain(..));
            if unwritten.len() > MAX_WRITE_BACK {
                let lost: u64 = unwritten.drain(MAX_WRITE_BACK..).map(|a| a.cost).sum();
                self.dropped.fetch_add(lost, Ordering::Relaxed);
            }
            *entries = unwritten;
        }
        let pending = entries.len();
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
    fn the_journal_merges_one_millisecond_of_a_key_and_is_bounded() {
        let journal = Journal::default();
        let quota = Quota::new(10, Duration::from_secs(1)).expect("quota");
        journal.keep("a", &quota, 1, 5);
        journal.keep("a", &quota, 2, 5);
        journal.keep("a", &quota, 8, 5);
        journal.keep("b", &quota, 1, 5);
        assert_eq!(journal.len(), 3, "a's third would make a cost past the limit: kept apart");
        for i in 0..MAX_WRITE_BACK as u64 {
            journal.keep("c", &quota, 1, 10 + i);
        }
        assert_eq!(journal.len(), MAX_WRITE_BACK);
        let (entries, dropped) = journal.take().expect("not writing");
        assert_eq!((entries[0].cost, dropped), (3, 3), "a's first two merged; three of c's past the bound");
        assert!(journal.take().is_none(), "one write-back at a time");
        assert_eq!(journal.give_back(entries), MAX_WRITE_BACK);
        assert!(journal.take().is_some());
    }

    #[test]
    fn an_admission_is_stale_once_it_no_longer_counts() {
        let log = Quota::new(10, Duration::from_secs(1)).expect("quota");
        let at = |quota: Quota, at_ms| Admitted { key: "k".into(), quota, cost: 1, at_ms };
        assert!(!at(log, 1_000).is_stale(1_999));
        assert!(at(log, 1_000).is_stale(2_000));
        let fixed = log.with_algorithm(Algorithm::FixedWindow).expect("quota");
        assert!(!at(fixed, 1_000).is_stale(1_999));
        assert!(at(fixed, 1_999).is_stale(2_000), "the window rolled over");
        let gcra = log.with_algorithm(Algorithm::Gcra { burst: None }).expect("quota");
        assert!(!at(gcra, 0).is_stale(1_000_000));
    }
}
