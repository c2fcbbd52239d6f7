//! The keys denied most over the last 15 minutes, in fixed memory whatever the number of keys:
//! a space-saving summary (Metwally, Agrawal, El Abbadi, 2005) per minute, merged on reading.
//!
//! A summary keeps [`COUNTERS`] keys with a count and an error each. A key already kept adds to
//! its count; a new one takes the place of the key with the smallest count, inheriting that
//! count as its error. So a kept key's true count lies in `[count - error, count]`, and a key
//! not kept has at most the smallest count, which is at most `N / COUNTERS` for `N` denials.
//!
//! One summary per minute ([`EPOCHS`] of them, a ring) makes the window slide: reading merges
//! the summaries of the last 15 to 16 minutes. A key's merged `count` adds its count in each
//! summary that keeps it and the smallest count of each full summary that does not (an upper
//! bound on what it had there); its `error` adds the uncertainty of each. Over the window, then,
//! every reported count is at most `N / COUNTERS` over the truth and `count - error` is never
//! over it, and any key with more than `N / COUNTERS` denials is among the candidates.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

/// Keys kept per one-minute summary.
pub const COUNTERS: usize = 64;

/// One-minute summaries kept: the current minute and the 15 before it.
pub const EPOCHS: usize = 16;

/// The longest key kept, in bytes: a longer key is cut (at a character boundary) and ends with
/// `…`, so two long keys that share their first 125 bytes count as one.
pub const MAX_KEY_BYTES: usize = 128;

/// The most heap memory a [`TopKeys`] holds, however many keys it is offered.
pub const MAX_HEAP_BYTES: usize = EPOCHS * COUNTERS * (size_of::<Entry>() + MAX_KEY_BYTES);

#[derive(Debug)]
struct Entry {
    hash: u64,
    count: u64,
    error: u64,
    key: Box<str>,
}

/// One minute's space-saving summary.
#[derive(Debug, Default)]
struct Summary {
    /// The minute it counts (minutes since the service's start) plus one; 0: never used.
    minute: u64,
    /// Every denial offered this minute.
    total: u64,
    entries: Vec<Entry>,
}

impl Summary {
    fn offer(&mut self, hash: u64, key: &str) {
        self.total += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.hash == hash && &*e.key == key) {
            e.count += 1;
        } else if self.entries.len() < COUNTERS {
            self.entries.push(Entry { hash, count: 1, error: 0, key: key.into() });
        } else if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            *min = Entry { hash, count: min.count + 1, error: min.count, key: key.into() };
        }
    }

    /// The smallest count: at least the count of any key not kept (0 while there is room).
    fn floor(&self) -> u64 {
        if self.entries.len() < COUNTERS { 0 } else { self.entries.iter().map(|e| e.count).min().unwrap_or(0) }
    }
}

/// One denied key in [`TopKeys::top`]: its true count lies in `[count - error, count]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    /// The key (cut to [`MAX_KEY_BYTES`]).
    pub key: String,
    /// Its denials over the window, never under the truth.
    pub count: u64,
    /// How far over the truth `count` may be.
    pub error: u64,
}

/// The heavy hitters of one rule's denials.
#[derive(Debug)]
pub struct TopKeys {
    summaries: Vec<Summary>,
    hasher: RandomState,
}

impl Default for TopKeys {
    fn default() -> Self {
        Self { summaries: (0..EPOCHS).map(|_| Summary::default()).collect(), hasher: RandomState::new() }
    }
}

impl TopKeys {
    /// Counts one denial of `key` in minute `minute` (since the service's start).
    pub fn offer(&mut self, minute: u64, key: &str) {
        let key = truncate(key);
        let hash = self.hasher.hash_one(key.as_ref());
        let summary = &mut self.summaries[(minute % EPOCHS as u64) as usize];
        if summary.minute != minute + 1 {
            summary.minute = minute + 1;
            summary.total = 0;
            summary.entries.clear();
            summary.entries.reserve_exact(COUNTERS);
        }
        summary.offer(hash, &key);
    }

    /// The `n` keys with the most denials over the window that ends in minute `now`, most
    /// first, and the window's denials.
    pub fn top(&self, now: u64, n: usize) -> (Vec<TopKey>, u64) {
        let live: Vec<&Summary> =
            self.summaries.iter().filter(|s| s.minute != 0 && s.minute + EPOCHS as u64 > now + 1).collect();
        let total = live.iter().map(|s| s.total).sum();
        let floors: u64 = live.iter().map(|s| s.floor()).sum();
        // Per key: its counts and errors where kept, and the floors of the summaries that keep
        // it; the floors of the others are added last.
        let mut merged: HashMap<&str, (TopKey, u64)> = HashMap::new();
        for s in &live {
            let floor = s.floor();
            for e in &s.entries {
                let (top, kept_floors) =
                    merged.entry(&e.key).or_insert_with(|| (TopKey { key: e.key.to_string(), count: 0, error: 0 }, 0));
                (top.count, top.error, *kept_floors) = (top.count + e.count, top.error + e.error, *kept_floors + floor);
            }
        }
        let mut top: Vec<TopKey> = merged
            .into_values()
            .map(|(mut top, kept_floors)| {
                let elsewhere = floors - kept_floors;
                (top.count, top.error) = (top.count + elsewhere, top.error + elsewhere);
                top
            })
            .collect();
        top.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        top.truncate(n);
        (top, total)
    }

    /// The heap memory held now: at most [`MAX_HEAP_BYTES`].
    pub fn heap_bytes(&self) -> usize {
        self.summaries
            .iter()
            .map(|s| s.entries.capacity() * size_of::<Entry>() + s.entries.iter().map(|e| e.key.len()).sum::<usize>())
            .sum()
    }
}

/// `key`, cut to [`MAX_KEY_BYTES`] at a character boundary and marked `…` when longer.
fn truncate(key: &str) -> std::borrow::Cow<'_, str> {
    if key.len() <= MAX_KEY_BYTES {
        return key.into();
    }
    let mut end = MAX_KEY_BYTES - '…'.len_utf8();
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &key[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heavy_hitters_are_found_among_many_light_keys_within_the_bound() {
        let mut t = TopKeys::default();
        // 3 heavy keys among 5,000 keys denied once each, over 3 minutes.
        for minute in 0..3 {
            for i in 0..5_000 {
                t.offer(minute, &format!("light-{minute}-{i}"));
                if i % 10 == 0 {
                    t.offer(minute, "heavy-a");
                }
                if i % 20 == 0 {
                    t.offer(minute, "heavy-b");
                }
                if i % 50 == 0 {
                    t.offer(minute, "heavy-c");
                }
            }
        }
        let (top, total) = t.top(2, 20);
        let truth = [("heavy-a", 1_500), ("heavy-b", 750), ("heavy-c", 300)];
        assert_eq!(total, 3 * (5_000 + 500 + 250 + 100));
        let bound = total / COUNTERS as u64;
        for (i, (key, count)) in truth.iter().enumerate() {
            assert_eq!(top[i].key, *key, "{top:?}");
            assert!(top[i].count >= *count && top[i].count - count <= bound, "{:?} vs {count}", top[i]);
            assert!(top[i].count - top[i].error <= *count, "{:?}", top[i]);
        }
        for light in &top[3..] {
            assert!(light.count - light.error <= 1 && light.count <= 1 + bound, "{light:?}");
        }
    }

    #[test]
    fn minutes_older_than_the_window_are_forgotten() {
        let mut t = TopKeys::default();
        t.offer(0, "old");
        t.offer(14, "recent");
        assert_eq!(t.top(15, 20).0.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(), ["old", "recent"]);
        assert_eq!(t.top(16, 20).0.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(), ["recent"]);
        // Minute 16 takes minute 0's place in the ring.
        t.offer(16, "new");
        assert_eq!(t.top(16, 20).1, 2);
    }

    #[test]
    fn memory_stays_fixed_under_a_flood_of_distinct_keys() {
        let mut t = TopKeys::default();
        let long = "k".repeat(300);
        let mut after_first_lap = 0;
        for minute in 0..40 {
            for i in 0..5_000 {
                t.offer(minute, &format!("{i}-{long}"));
            }
            assert!(t.heap_bytes() <= MAX_HEAP_BYTES, "minute {minute}: {} bytes", t.heap_bytes());
            if minute == EPOCHS as u64 - 1 {
                after_first_lap = t.heap_bytes();
            }
        }
        assert_eq!(t.heap_bytes(), after_first_lap, "every summary full: no growth over 24 more minutes");
        assert!(t.top(39, 20).0.iter().all(|k| k.key.len() <= MAX_KEY_BYTES && k.key.ends_with('…')));
    }

    #[test]
    fn long_keys_are_cut_at_a_character_boundary() {
        let key = "é".repeat(100);
        let cut = truncate(&key);
        assert!(cut.len() <= MAX_KEY_BYTES && cut.ends_with('…') && cut.starts_with("éé"), "{cut}");
        assert_eq!(truncate("short"), "short");
    }
}
