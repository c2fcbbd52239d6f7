//! The outcome guesser that orders the sliding-log script: per key, whether the next check is
//! likely denied.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};

/// Guesses, per key, whether the next sliding-log check will be denied, so that the script
/// takes the order that costs Redis less for that outcome (`sliding_log.lua`: three calls for a
/// denial looked at first, five for an admission counted first, one more each when the guess
/// was wrong). A wrong guess costs one call, never a different decision. Outcomes come in
/// runs — a key over its limit stays over it until entries leave; an attacked key is denied
/// call after call while other keys keep being admitted — so each of 1,024 slots, which keys
/// share by hash, remembers the last outcome seen there.
pub(super) struct Outlook {
    hasher: RandomState,
    denied: [AtomicBool; OUTLOOK_SLOTS],
}

const OUTLOOK_SLOTS: usize = 1024;

impl Outlook {
    pub(super) fn new() -> Self {
        Self { hasher: RandomState::new(), denied: std::array::from_fn(|_| AtomicBool::new(false)) }
    }

    /// The slot `key` shares with the keys of its hash: `true` when the last outcome seen
    /// there was a denial.
    pub(super) fn slot(&self, key: &str) -> &AtomicBool {
        // The modulo of a 64-bit hash by a power of two keeps its low bits; all are mixed.
        let index = usize::try_from(self.hasher.hash_one(key) % OUTLOOK_SLOTS as u64).unwrap_or(0);
        &self.denied[index]
    }
}

/// Records an outcome in its slot; written only when it changes, so runs of one outcome leave
/// the slot's cache line shared between cores.
pub(super) fn remember_outcome(slot: &AtomicBool, denied: bool) {
    if slot.load(Ordering::Relaxed) != denied {
        slot.store(denied, Ordering::Relaxed);
    }
}
