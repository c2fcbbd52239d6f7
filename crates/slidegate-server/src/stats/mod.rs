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

    /// Every tracked rule's (`envoy` false) or domain's report, by name.
    pub fn reports(&self, envoy: bool) -> Vec<(String, TrafficReport)> {
        let since = self.clock.now().duration_since(self.started).as_secs();
        let registry = if envoy { &self.envoy } else { &self.rules };
        let tracked: Vec<(String, Arc<Traffic>)> = {
            let map = registry.lock().unwrap_or_else(PoisonError::into_inner);
            map.iter().map(|(name, t)| (name.clone(), Arc::clone(t))).collect()
        };
        let mut reports: Vec<_> =
            tracked.into_iter().map(|(name, t)| (name, t.report(since / SLOT.as_secs(), since / 60))).collect();
        reports.sort_by(|a, b| a.0.cmp(&b.0));
        reports
    }

    /// When the newest slot began, in ms since the Unix epoch.
    pub fn newest_slot_ms(&self) -> u64 {
        let since = self.clock.now().duration_since(self.started).as_secs();
        self.started_ms + since / SLOT.as_secs() * SLOT.as_millis() as u64
    }
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

/// The caller's key inside a rule's backend key `<rule>:{<key>}`; the whole backend key when it
/// is not of that shape.
pub fn client_key<'a>(backend_key: &'a str, rule: &str) -> &'a str {
    backend_key
        .strip_prefix(rule)
        .and_then(|k| k.strip_prefix(":{"))
        .and_then(|k| k.strip_suffix('}'))
        .unwrap_or(backend_key)
}
