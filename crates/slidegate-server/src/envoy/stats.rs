//! The Envoy service's per-descriptor counters, named and labelled as envoyproxy/ratelimit's own
//! Prometheus exporter (`USE_PROMETHEUS=true`, its `src/stats/prom/default_mapper.yaml`)
//! publishes them, so that a dashboard built on it keeps working:
//! `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}`
//! with labels `domain`, `key1` and, for a stats key of three parts or more, `key2`.
//!
//! Upstream's stats key is `<domain>.<key>_<value>.<key>…` ([`super::config::Node::stat_key`]);
//! its exporter cleans it (`:` and `|` become `_`, so do the dots of an IPv4 address), splits it
//! at the dots and keeps the first three parts. For keys of up to three parts this is also what
//! its example statsd_exporter mapping (`examples/prom-statsd-exporter/conf.yaml`) gives.
//!
//! Series whose keys come from requests (`detailed_metric`, `value_to_metric`, limits a request
//! brings) are bounded per descriptor by [`MAX_DETAILED_SERIES`]; so are the `domain` labels of
//! unknown domains, by [`MAX_UNKNOWN_DOMAINS`].

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use metrics::Counter;

use super::bounds::Invalid;
use crate::metrics::{
    ENVOY_DOMAIN_NOT_FOUND, ENVOY_INVALID_DESCRIPTORS, RATE_LIMIT_NEAR_LIMIT, RATE_LIMIT_OVER_LIMIT,
    RATE_LIMIT_SHADOW_MODE, RATE_LIMIT_TOTAL_HITS, RATE_LIMIT_WITHIN_LIMIT, held,
};

/// The most distinct request-built stats keys one descriptor gets series for; later keys share
/// one overflow series. Values come from request headers: without a cap, each new one would be
/// a new series in `/metrics` for as long as the process lives.
pub const MAX_DETAILED_SERIES: usize = 10_000;

/// The most unknown domains counted by name in [`ENVOY_DOMAIN_NOT_FOUND`]; later ones share
/// the `domain` label [`OVERFLOW_SUFFIX`]. A request names any domain it likes.
pub const MAX_UNKNOWN_DOMAINS: usize = 100;

/// The last part of an overflow series' stats key: the descriptor `<domain>.user` counts its
/// values past [`MAX_DETAILED_SERIES`] under `<domain>.user._overflow_` (`key2="_overflow_"`).
pub const OVERFLOW_SUFFIX: &str = "_overflow_";

/// One stats key's counters, registered once so that counting is an atomic add.
#[derive(Debug, Clone)]
pub struct Counters {
    total: Counter,
    over: Counter,
    near: Counter,
    within: Counter,
    shadow: Counter,
}

/// How one descriptor came out, for its counters.
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    /// The hits it brought (`hits_addend`).
    pub hits: u64,
    /// The limit's permits.
    pub limit: u64,
    /// Permits used before this request.
    pub before: u64,
    /// Whether it was admitted (or would have been: a descriptor held back by another).
    pub within: bool,
    /// Whether its limit is in shadow mode.
    pub shadow: bool,
}

impl Counters {
    /// The counters of upstream's stats key `key` (`<domain>.<key>_<value>…`).
    pub fn new(key: &str) -> Self {
        let labels = labels(key);
        // Held: a domain's series leave `/metrics` with its configuration.
        Self {
            total: held::counter(RATE_LIMIT_TOTAL_HITS, &labels),
            over: held::counter(RATE_LIMIT_OVER_LIMIT, &labels),
            near: held::counter(RATE_LIMIT_NEAR_LIMIT, &labels),
            within: held::counter(RATE_LIMIT_WITHIN_LIMIT, &labels),
            shadow: held::counter(RATE_LIMIT_SHADOW_MODE, &labels),
        }
    }

    /// Counts `hit` as upstream does: hits past the near-limit threshold (`near_ratio` of the
    /// limit, rounded down) are near the limit, hits past the limit over it, in proportion when
    /// a request of several hits crosses a threshold; over-limit hits of a shadow-mode limit
    /// are also counted as shadow mode.
    pub fn count(&self, hit: Hit, near_ratio: f64) {
        let Hit { hits, limit, before, within, shadow } = hit;
        let after = before.saturating_add(hits);
        // The threshold in u64, the ratio being in 0..=1.
        let near = (limit as f64 * near_ratio).floor() as u64;
        self.total.increment(hits);
        if within {
            self.within.increment(hits);
            if after > near {
                self.near.increment(if before >= near { hits } else { after - near });
            }
            return;
        }
        // Saturating: a failure policy's denial may come with permits left.
        let over = if before >= limit { hits } else { after.saturating_sub(limit) };
        self.over.increment(over);
        if before < limit {
            self.near.increment(limit.saturating_sub(near.max(before)));
        }
        if shadow {
            self.shadow.increment(over);
        }
    }
}

/// The exporter's labels of a stats key.
fn labels(key: &str) -> Vec<(&'static str, String)> {
    let clean = sanitize(key);
    let mut parts = clean.splitn(4, '.');
    let mut labels = Vec::with_capacity(3);
    for name in ["domain", "key1", "key2"] {
        match parts.next() {
            Some(part) => labels.push((name, part.to_owned())),
            None => break,
        }
    }
    labels
}

/// Upstream's `SanitizeStatName`: `:` and `|` become `_`, and so do the dots of every run that
/// reads as an IPv4 address (`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`, leftmost first).
fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key.bytes().map(|b| if b == b':' || b == b'|' { b'_' } else { b }).collect();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(end) => {
                for b in &mut out[i..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes.
    String::from_utf8(out).unwrap_or_default()
}

/// The end of the IPv4-like run starting at `at`, as a backtracking regex engine finds it.
fn ipv4_at(s: &[u8], at: usize) -> Option<usize> {
    fn groups(s: &[u8], at: usize, left: u32) -> Option<usize> {
        // Greedy: the longest run of digits first, as the regex tries it.
        let digits = s[at..].iter().take(3).take_while(|b| b.is_ascii_digit()).count();
        (1..=digits).rev().find_map(|n| {
            let end = at + n;
            match left {
                0 => Some(end),
                _ if s.get(end) == Some(&b'.') => groups(s, end + 1, left - 1),
                _ => None,
            }
        })
    }
    groups(s, at, 3)
}

/// Counters by request-built stats keys, at most `cap` of them; later keys share one.
#[derive(Debug)]
pub struct Series {
    cap: usize,
    by_key: Mutex<HashMap<String, Counters>>,
}

impl Default for Series {
    fn default() -> Self {
        Self::new(MAX_DETAILED_SERIES)
    }
}

impl Series {
    /// Counters for up to `cap` distinct keys.
    pub fn new(cap: usize) -> Self {
        Self { cap, by_key: Mutex::new(HashMap::new()) }
    }

    /// The counters of `key`; past the cap, those of the key `overflow` names.
    pub fn get(&self, key: &str, overflow: impl FnOnce() -> String) -> Counters {
        let mut by_key = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = by_key.get(key) {
            return c.clone();
        }
        let key = if by_key.len() < self.cap { key.to_owned() } else { overflow() };
        // The overflow series is kept under its own key, so the map holds at most cap + 1.
        by_key.entry(key).or_insert_with_key(|key| Counters::new(key)).clone()
    }
}

/// A configured domain's refused-descriptor counters, by [`Invalid`] reason: held by the
/// domain's configuration, so that a domain removed on a reload leaves `/metrics`
/// ([`crate::metrics::held`]); a domain that stays keeps its counts. Each series appears from
/// its first count on.
#[derive(Debug)]
pub struct InvalidCounters {
    domain: String,
    by_reason: [OnceLock<Counter>; Invalid::ALL.len()],
}

impl InvalidCounters {
    /// `domain`'s counters, those of the configuration before kept.
    pub fn new(domain: &str) -> Self {
        let by_reason = Invalid::ALL.map(|reason| {
            let kept = held::existing(ENVOY_INVALID_DESCRIPTORS, &invalid_labels(domain, reason));
            kept.map_or_else(OnceLock::new, OnceLock::from)
        });
        Self { domain: domain.to_owned(), by_reason }
    }

    /// Counts `n` of the domain's descriptors refused for `reason`.
    pub fn count(&self, reason: Invalid, n: usize) {
        let counter = &self.by_reason[reason.index()];
        counter
            .get_or_init(|| held::counter(ENVOY_INVALID_DESCRIPTORS, &invalid_labels(&self.domain, reason)))
            .increment(n as u64);
    }
}

fn invalid_labels(domain: &str, reason: Invalid) -> [(&'static str, String); 2] {
    [("domain", domain.to_owned()), ("reason", reason.as_str().to_owned())]
}

/// Counts `n` descriptors of a request for `domain`, which is not configured (upstream counts
/// each descriptor). The first [`MAX_UNKNOWN_DOMAINS`] domains are counted by name.
pub fn count_domain_not_found(domain: &str, n: usize) {
    static SEEN: OnceLock<Mutex<HashMap<String, Counter>>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
    let counter = match seen.get(domain) {
        Some(c) => c.clone(),
        None => {
            let label = if seen.len() < MAX_UNKNOWN_DOMAINS { domain } else { OVERFLOW_SUFFIX };
            let make = |label: &String| metrics::counter!(ENVOY_DOMAIN_NOT_FOUND, "domain" => label.clone());
            seen.entry(label.to_owned()).or_insert_with_key(make).clone()
        }
    };
    counter.increment(n as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_keys_become_the_exporter_s_labels() {
        let l = |key: &str| labels(key).into_iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(",");
        assert_eq!(l("mongo_cps.database_users"), "domain=mongo_cps,key1=database_users");
        assert_eq!(l("d.k1_v1.k2_v2"), "domain=d,key1=k1_v1,key2=k2_v2");
        assert_eq!(l("d.k3_v3.k4_v4.k5_v5"), "domain=d,key1=k3_v3,key2=k4_v4", "the fourth part is dropped");
        assert_eq!(l("edge.remote_address_10.0.0.1"), "domain=edge,key1=remote_address_10_0_0_1");
        assert_eq!(l("d.path_/a:b|c"), "domain=d,key1=path_/a_b_c");
        assert_eq!(l("d.wild_foo*"), "domain=d,key1=wild_foo*");
    }

    #[test]
    fn ipv4_runs_lose_their_dots_as_upstream_s_regex_finds_them() {
        assert_eq!(sanitize("1234.5.6.7"), "1234_5_6_7", "the run starts at 234");
        assert_eq!(sanitize("1.2.3.4.5"), "1_2_3_4.5");
        assert_eq!(sanitize("v1.2.3"), "v1.2.3");
        assert_eq!(sanitize("10.0.0.1.10.0.0.2"), "10_0_0_1.10_0_0_2");
        assert_eq!(sanitize("ip_192.168.1.100x"), "ip_192_168_1_100x");
    }

    #[test]
    fn keys_past_the_cap_share_the_overflow_series() {
        let s = Series::new(2);
        for key in ["d.user_a", "d.user_b", "d.user_c", "d.user_d", "d.user_a"] {
            s.get(key, || "d.user._overflow_".to_owned());
        }
        let by_key = s.by_key.lock().expect("lock");
        let mut keys: Vec<&str> = by_key.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["d.user._overflow_", "d.user_a", "d.user_b"]);
    }
}
