//! The overrides in force in this instance, by backend key: looked up by every decision of a
//! named rule or an Envoy descriptor, so that a decision never asks Redis for them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use slidegate::Quota;

use super::Override;
pub use crate::config::{DEFAULT_MAX_OVERRIDES, MAX_OVERRIDES_CAP};

/// The table is full: a new key would exceed `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{max} overrides are set, the most this server holds (max_overrides): delete one first")]
pub struct Full {
    /// The bound.
    pub max: usize,
}

/// The overrides in force, by the backend key they apply to.
#[derive(Debug)]
pub struct Overrides {
    max: usize,
    // A std lock, not tokio's: it is held for a lookup or an insert, never across an await,
    // and readers (decisions) far outnumber writers (admin changes). Keys and overrides boxed:
    // the table holds two pointers per slot, a third of the memory of overrides inline.
    map: RwLock<HashMap<Box<str>, Box<Override>>>,
    /// The map's length, read without the lock: with no override, a decision takes no lock.
    len: AtomicUsize,
    /// The earliest expiry in the map (Unix ms; `u64::MAX`: none), so that lapsing is a load
    /// and a compare until something is due.
    next_expiry_ms: AtomicU64,
}

/// Unix time in ms: overrides are set and lapse by wall-clock time, which every instance
/// shares (within its clock's drift).
pub fn now_ms() -> u64 {
    // Seconds and milliseconds apart: `as_millis` divides a u128, twice the work of a lookup.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().saturating_mul(1000) + u64::from(d.subsec_millis()))
}

impl Overrides {
    /// An empty table that holds at most `max` overrides.
    pub fn new(max: usize) -> Self {
        Self { max, map: RwLock::default(), len: AtomicUsize::new(0), next_expiry_ms: AtomicU64::new(u64::MAX) }
    }

    /// The most overrides the table holds.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many overrides the table holds (lapsed ones not yet removed included).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The quota `key` is decided with: its override over `base`, or `base` when it has none
    /// (or a lapsed one, or one that no longer fits `base`).
    #[inline]
    pub fn quota(&self, key: &str, base: Quota) -> Quota {
        if self.is_empty() {
            return base;
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        match map.get(key) {
            Some(o) if o.live_at(now_ms()) => o.limits.over(&base).unwrap_or(base),
            _ => base,
        }
    }

    /// The override of `key` still in force, if any.
    pub fn get(&self, key: &str) -> Option<Override> {
        if self.is_empty() {
            return None;
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(key).filter(|o| o.live_at(now_ms())).map(|o| Override::clone(o))
    }

    /// Sets the override of `key`, returning the one it replaces; a new key is refused when
    /// the table is full.
    pub fn insert(&self, key: String, o: Override) -> Result<Option<Override>, Full> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max && !map.contains_key(key.as_str()) {
            return Err(Full { max: self.max });
        }
        if let Some(t) = o.expires_at_ms {
            self.next_expiry_ms.fetch_min(t, Ordering::Relaxed);
        }
        let previous = map.insert(key.into(), Box::new(o));
        self.len.store(map.len(), Ordering::Relaxed);
        Ok(previous.map(|o| *o))
    }

    /// Removes the override of `key`, returning it.
    pub fn remove(&self, key: &str) -> Option<Override> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let removed = map.remove(key);
        self.len.store(map.len(), Ordering::Relaxed);
        removed.map(|o| *o)
    }

    /// Replaces every override with `entries`, at most [`Overrides::max`] of them; returns how
    /// many were left out.
    pub fn replace_all(&self, entries: impl IntoIterator<Item = (String, Override)>) -> usize {
        let mut fresh: HashMap<Box<str>, Box<Override>> = HashMap::new();
        let mut left_out = 0;
        for (key, o) in entries {
            if fresh.len() < self.max || fresh.contains_key(key.as_str()) {
                fresh.insert(key.into(), Box::new(o));
            } else {
                left_out += 1;
            }
        }
        let earliest = fresh.values().filter_map(|o| o.expires_at_ms).min().unwrap_or(u64::MAX);
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        *map = fresh;
        self.len.store(map.len(), Ordering::Relaxed);
        self.next_expiry_ms.store(earliest, Ordering::Relaxed);
        left_out
    }

    /// The keys of the overrides lapsed at `now_ms`; empty (without a look at the map) until
    /// the earliest expiry is due.
    pub fn lapsed(&self, now_ms: u64) -> Vec<String> {
        if self.next_expiry_ms.load(Ordering::Relaxed) > now_ms {
            return Vec::new();
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let lapsed = map.iter().filter(|(_, o)| !o.live_at(now_ms)).map(|(k, _)| k.to_string()).collect();
        let next = map.values().filter_map(|o| o.expires_at_ms).filter(|t| *t > now_ms).min();
        self.next_expiry_ms.store(next.unwrap_or(u64::MAX), Ordering::Relaxed);
        lapsed
    }

    /// One page of `rule`'s overrides in force, ordered by key: at most `limit` of them with a
    /// key after `after`, and the number in force in all.
    pub fn page(&self, rule: &str, after: Option<&str>, limit: usize) -> (Vec<Override>, usize) {
        let now = now_ms();
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let mut of_rule: Vec<&Override> =
            map.values().map(|o| &**o).filter(|o| o.rule == rule && o.live_at(now)).collect();
        let total = of_rule.len();
        of_rule.retain(|o| after.is_none_or(|a| o.key.as_str() > a));
        of_rule.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        (of_rule.into_iter().take(limit).cloned().collect(), total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::Limits;

    fn set(rule: &str, key: &str, limit: u64, expires_at_ms: Option<u64>) -> Override {
        let limits = Limits { limit, window: None, counting: None };
        Override { rule: rule.into(), key: key.into(), limits, set_at_ms: 0, expires_at_ms, set_from: String::new() }
    }

    #[test]
    fn only_the_overridden_key_changes_and_only_while_it_is_in_force() {
        let table = Overrides::new(10);
        let base = Quota::per_minute(5).expect("valid");
        assert_eq!(table.quota("api:{a}", base), base);
        table.insert("api:{a}".into(), set("api", "a", 50, None)).expect("room");
        table.insert("api:{b}".into(), set("api", "b", 70, Some(1))).expect("room");
        assert_eq!(table.quota("api:{a}", base).limit(), 50);
        assert_eq!(table.quota("api:{c}", base), base, "another key");
        assert_eq!(table.quota("api:{b}", base), base, "lapsed long ago");
        assert_eq!(table.get("api:{b}"), None);
        assert_eq!(table.lapsed(now_ms()), ["api:{b}"]);
        assert_eq!(table.remove("api:{a}").map(|o| o.limits.limit), Some(50));
        assert_eq!(table.quota("api:{a}", base), base);
    }

    #[test]
    fn the_table_holds_at_most_its_bound() {
        let table = Overrides::new(2);
        for key in ["a", "b"] {
            table.insert(key.into(), set("r", key, 1, None)).expect("room");
        }
        assert_eq!(table.insert("c".into(), set("r", "c", 1, None)), Err(Full { max: 2 }));
        assert!(table.insert("a".into(), set("r", "a", 9, None)).is_ok(), "a replacement takes no room");
        let left_out = table.replace_all((0..5).map(|i| (i.to_string(), set("r", &i.to_string(), 1, None))));
        assert_eq!((table.len(), left_out), (2, 3));
    }

    #[test]
    fn pages_follow_the_key_order_within_one_rule() {
        let table = Overrides::new(100);
        for key in ["d", "a", "c", "b"] {
            table.insert(format!("api:{{{key}}}"), set("api", key, 1, None)).expect("room");
        }
        table.insert("sms:{a}".into(), set("sms", "a", 1, None)).expect("room");
        let keys = |page: Vec<Override>| page.into_iter().map(|o| o.key).collect::<Vec<_>>();
        let (first, total) = table.page("api", None, 3);
        assert_eq!((keys(first), total), (vec!["a".to_owned(), "b".into(), "c".into()], 4));
        assert_eq!(keys(table.page("api", Some("c"), 3).0), ["d"]);
    }
}
