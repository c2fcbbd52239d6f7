//! The Envoy service's counters whose labels come from requests, bounded.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::metrics::{ENVOY_INVALID_DESCRIPTORS, EnvoyCounters};

use super::bounds::Invalid;

/// The most distinct values a `detailed_metric` descriptor gets series for (each value's
/// `slidegate_envoy_*` counters); later values share one overflow series,
/// [`OVERFLOW_SUFFIX`]. Values come from request headers: without a cap, each new one would be
/// a new series in `/metrics` for as long as the process lives.
pub const MAX_DETAILED_SERIES: usize = 10_000;

/// Appended (after a `.`) to a descriptor's configured key to name its overflow series: the
/// descriptor `user` counts its values past [`MAX_DETAILED_SERIES`] under `user._overflow_`.
pub const OVERFLOW_SUFFIX: &str = "_overflow_";

/// One `detailed_metric` descriptor's counters by the request's own values, up to `cap` of them.
#[derive(Debug)]
pub struct DetailedCounters {
    cap: usize,
    by_value: Mutex<HashMap<String, EnvoyCounters>>,
}

impl Default for DetailedCounters {
    fn default() -> Self {
        Self::new(MAX_DETAILED_SERIES)
    }
}

impl DetailedCounters {
    /// Counters for up to `cap` distinct values.
    pub fn new(cap: usize) -> Self {
        Self { cap, by_value: Mutex::new(HashMap::new()) }
    }

    /// The counters of `stat` (the request's `key_value` path) in `domain`; past the cap, those
    /// of `<configured>._overflow_`.
    pub fn get(&self, domain: &str, configured: &str, stat: &str) -> EnvoyCounters {
        let mut by_value = self.by_value.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = by_value.get(stat) {
            return c.clone();
        }
        let label = if by_value.len() < self.cap { stat.to_owned() } else { format!("{configured}.{OVERFLOW_SUFFIX}") };
        // The overflow series is kept under its own label, so the map holds at most cap + 1.
        by_value.entry(label).or_insert_with_key(|label| EnvoyCounters::new(domain, label)).clone()
    }
}

/// Counts `n` descriptors of `domain` refused for `reason`. `domain` is a configured one: a
/// request's unknown domain is never a label.
pub fn count_invalid(domain: &str, reason: Invalid, n: usize) {
    metrics::counter!(ENVOY_INVALID_DESCRIPTORS, "domain" => domain.to_owned(), "reason" => reason.as_str())
        .increment(n as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_share_the_overflow_series() {
        let d = DetailedCounters::new(2);
        for v in ["user_a", "user_b", "user_c", "user_d", "user_a"] {
            d.get("dom", "user", v);
        }
        let by_value = d.by_value.lock().expect("lock");
        let mut labels: Vec<&str> = by_value.keys().map(String::as_str).collect();
        labels.sort_unstable();
        assert_eq!(labels, ["user._overflow_", "user_a", "user_b"]);
    }
}
