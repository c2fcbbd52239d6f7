//! The sorted-set members a sliding log records: unique per admission across every client of
//! one Redis, and short.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// Makes sorted-set members unique per admission across every client of one Redis: a random
/// 64-bit id per backend instance (base-62, 11 characters) and a counter. Two instances would
/// have to draw the same id (odds about n²/2⁶⁵ for n instances) *and* reach the same counter
/// value on the same key within one window to collide; within one instance, never.
pub(super) struct Members {
    id: String,
    counter: AtomicU64,
}

impl Members {
    pub(super) fn new() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        // RandomState's keys come from the OS's randomness; mixing in pid and time guards
        // against a platform that hands every process the same keys.
        let random = RandomState::new().hash_one((std::process::id(), nanos));
        let mut id = String::with_capacity(24);
        push_base62(&mut id, random, 11);
        Self { id, counter: AtomicU64::new(0) }
    }

    /// The next member: this instance's id and its counter's next value.
    pub(super) fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut member = self.id.clone();
        push_base62(&mut member, n, 1);
        member
    }
}

/// Appends `n` in base 62, least significant digit first, padded with zeros to `min_digits`.
fn push_base62(out: &mut String, mut n: u64, min_digits: usize) {
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let start = out.len();
    while n > 0 || out.len() - start < min_digits {
        out.push(char::from(DIGITS[(n % 62) as usize]));
        n /= 62;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_unique_and_short() {
        let m = Members::new();
        let a = m.next();
        let b = m.next();
        assert_ne!(a, b);
        assert_eq!(a.len(), 12);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(Members::new().id, m.id, "two instances draw different ids");
    }

    #[test]
    fn base62_pads_and_encodes() {
        let mut s = String::new();
        push_base62(&mut s, 0, 3);
        push_base62(&mut s, 61, 1);
        push_base62(&mut s, 62, 1);
        assert_eq!(s, "000z01");
    }
}
