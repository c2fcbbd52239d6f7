//! Live traffic for the dashboard (`/ui`, `/v1/stats`), in fixed memory: per rule and per Envoy
//! domain, the decisions per 10 s over the last 15 minutes with their latency
//! ([`series`]), and the keys denied most ([`sketch`]).
//!
//! Recording is on the decision's path, so it is a few atomic adds, plus, for a denial, a short
//! lock to count the key. Each rule's [`Traffic`] lives here across reloads (a rule that keeps
//! its name keeps its history) and is handed to each configuration snapshot, so a decision finds
//! its rule's without a lock.

pub mod series;
pub mod sketch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slidegate::Decision;

use series::{Outcome, SLOT, Series, Snapshot};
use sketch::{TopKey, TopKeys};

/// The keys listed per rule in `/v1/stats`.
pub const TOP_KEYS: usize = 20;

/// One rule's (or one Envoy domain's) traffic.
#[derive(Debug, Default)]
pub struct Traffic {
    series: Series,
    // A std mutex: held for one summary update (tens of ns), never across an await.
    top: Mutex<TopKeys>,
}

/// What one [`Traffic`] shows now.
#[derive(Debug, Clone)]
pub struct TrafficReport {
    /// The decisions per slot and their latency.
    pub series: Snapshot,
    /// The keys denied most, most first.
    pub top: Vec<TopKey>,
    /// The denials over the window the keys are counted in.
    pub denials: u64,
}

impl Traffic {
    fn record<K: AsRef<str>>(&self, slot: u64, minute: u64, key: impl FnOnce() -> K, d: &Decision, took: Duration) {
        let outcome = match (d.degraded, d.allowed) {
            (Some(_), _) => Outcome::Degraded,
            (None, true) => Outcome::Allowed,
            (None, false) => Outcome::Denied,
        };
        self.series.record(slot, outcome, took);
        if outcome == Outcome::Denied {
            self.top.lock().unwrap_or_else(PoisonError::into_inner).offer(minute, key().as_ref());
        }
    }

    fn report(&self, slot: u64, minute: u64) -> TrafficReport {
        let (top, denials) = self.top.lock().unwrap_or_else(PoisonError::into_inner).top(minute, TOP_KEYS);
        TrafficReport { series: self.series.snapshot(slot), top, denials }
    }
}

/// Rule and domain names to their traffic.
pub type TrafficMap = HashMap<String, Arc<Traffic>>;

/// Every rule's and Envoy domain's traffic, and the clock it is counted by.
#[derive(Debug)]
pub struct Stats {
    clock: quanta::Clock,
    started: quanta::Instant,
    started_ms: u64,
    rules: Mutex<TrafficMap>,
    envoy: Mutex<TrafficMap>,
}

impl Default for Stats {
    fn default() -> Self {
        let clock = quanta::Clock::new();
        let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Self { started: clock.now(), clock, started_ms, rules: Mutex::default(), envoy: Mutex::default() }
    }
}

impl Stats {
    /// A monotonic instant, read in a few instructions (the CPU's time-stamp counter where it
    /// is reliable): when a decision starts.
    pub fn now(&self) -> quanta::Instant {
        self.clock.now()
    }

    /// The traffic of `names` (the rules of a new configuration): each name keeps what it had;
    /// names no longer in use are forgotten. With `enabled` false everything is forgotten and
    /// nothing is tracked.
    pub fn track_rules<'a>(&self, names: impl Iterator<Item = &'a str>, enabled: bool) -> TrafficMap {
        track(&self.rules, names, enabled)
    }

    /// The same for the Envoy domains of a new Envoy configuration.
    pub fn track_domains<'a>(&self, names: impl Iterator<Item = &'a str>, enabled: bool) {
        track(&self.envoy, names, enabled);
    }

    /// Counts one decision of `traffic`, which started at `started`; `key` names the key when
    /// it was denied.
    pub fn record<K: AsRef<str>>(
        &self,
        traffic: &Traffic,
        key: impl FnOnce() -> K,
        d: &Decision,
        started: quanta::Instant,
    ) {
        let now = self.clock.now();
        let since = now.duration_since(self.started);
        let slot = since.as_secs() / SLOT.as_secs();
        traffic.record(slot, since.as_secs() / 60, key, d, now.duration_since(started));
    }

    /// The traffic of Envoy domain `domain`, when it is tracked.
    pub fn domain(&self, domain: &str) -> Option<Arc<Traffic>> {
        self.envoy.lock().unwrap_or_else(PoisonError::into_inner).get(domain).cloned()
    }

    /// What every tracked rule and Envoy domain shows now.
    pub fn reports(&self) -> Reports {
        let since = self.clock.now().duration_since(self.started);
        let (slot, minute) = (since.as_secs() / SLOT.as_secs(), since.as_secs() / 60);
        let report = |registry: &Mutex<TrafficMap>| {
            let tracked: Vec<(String, Arc<Traffic>)> = {
                let map = registry.lock().unwrap_or_else(PoisonError::into_inner);
                map.iter().map(|(name, t)| (name.clone(), Arc::clone(t))).collect()
            };
            let mut reports: Vec<_> = tracked.into_iter().map(|(name, t)| (name, t.report(slot, minute))).collect();
            reports.sort_by(|a, b| a.0.cmp(&b.0));
            reports
        };
        Reports {
            now_ms: self.started_ms + since.as_millis() as u64,
            newest_slot_ms: self.started_ms + slot * SLOT.as_millis() as u64,
            rules: report(&self.rules),
            domains: report(&self.envoy),
        }
    }
}

/// Every tracked rule's and domain's traffic at one moment.
#[derive(Debug)]
pub struct Reports {
    /// The moment, in ms since the Unix epoch.
    pub now_ms: u64,
    /// When the newest slot (the last number of each series) began, in ms since the Unix epoch.
    pub newest_slot_ms: u64,
    /// Each rule's, by name.
    pub rules: Vec<(String, TrafficReport)>,
    /// Each Envoy domain's, by name.
    pub domains: Vec<(String, TrafficReport)>,
}

fn track<'a>(registry: &Mutex<TrafficMap>, names: impl Iterator<Item = &'a str>, enabled: bool) -> TrafficMap {
    let mut map = registry.lock().unwrap_or_else(PoisonError::into_inner);
    if !enabled {
        map.clear();
        return TrafficMap::new();
    }
    let kept: TrafficMap = names.map(|n| (n.to_owned(), map.get(n).cloned().unwrap_or_default())).collect();
    map.clone_from(&kept);
    kept
}

/// The caller's key inside a rule's backend key `<rule>:{<key>}` ([`slidegate::rule_key`]'s inverse); the whole backend key when it
/// is not of that shape.
pub fn client_key<'a>(backend_key: &'a str, rule: &str) -> &'a str {
    backend_key
        .strip_prefix(rule)
        .and_then(|k| k.strip_prefix(":{"))
        .and_then(|k| k.strip_suffix('}'))
        .unwrap_or(backend_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denials(stats: &Stats, rule: &str) -> u64 {
        stats.reports().rules.iter().find(|(name, _)| name == rule).map_or(0, |(_, r)| r.denials)
    }

    #[test]
    fn a_rule_keeps_its_traffic_across_reloads_until_it_is_removed_or_the_ui_disabled() {
        let stats = Stats::default();
        let denied = Decision::denied(1, 0, Duration::from_secs(1), Duration::from_secs(1));
        let map = stats.track_rules(["sms", "api"].into_iter(), true);
        stats.record(&map["sms"], || "alice", &denied, stats.now());
        let map = stats.track_rules(["sms", "login"].into_iter(), true);
        assert_eq!(denials(&stats, "sms"), 1, "kept across the reload");
        assert_eq!(stats.reports().rules.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["login", "sms"]);
        stats.record(&map["sms"], || "alice", &denied, stats.now());
        assert_eq!(denials(&stats, "sms"), 2);
        assert!(stats.track_rules(["sms"].into_iter(), false).is_empty());
        assert!(stats.reports().rules.is_empty(), "disabled: forgotten");
        stats.track_rules(["sms"].into_iter(), true);
        assert_eq!(denials(&stats, "sms"), 0, "enabled again: from nothing");
    }

    #[test]
    fn the_client_key_is_read_out_of_the_backend_key() {
        assert_eq!(client_key("sms:{+1 555}", "sms"), "+1 555");
        assert_eq!(client_key("sms:{a}b}", "sms"), "a}b");
        assert_eq!(client_key("other", "sms"), "other");
    }
}
