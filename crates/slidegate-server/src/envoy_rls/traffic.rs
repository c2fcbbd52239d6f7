//! A request's decided descriptors in the dashboard's traffic of their domain
//! ([`crate::stats`]), a denied one named by its entries (`key=value,…`).

use super::decide::{Outcome, Slot};
use crate::app::App;

/// Counts each descriptor of `slots` that the backend decided and that counts hits.
pub(super) fn record(app: &App, domain: &str, slots: &[Slot<'_>], outcomes: &[Outcome], started: quanta::Instant) {
    let Some(traffic) = app.stats.domain(domain) else { return };
    for (slot, outcome) in slots.iter().zip(outcomes) {
        if let (Ok(item), Outcome::Decided(d, _)) = (slot, outcome)
            && item.hits > 0
        {
            app.stats.record(&traffic, || named(&item.entries), d, started);
        }
    }
}

/// A denied descriptor's name in the dashboard: `key=value,…`, built only for a denial.
fn named(entries: &[(&str, &str)]) -> String {
    let mut name = String::with_capacity(entries.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            name.push(',');
        }
        name.push_str(k);
        name.push('=');
        name.push_str(v);
    }
    name
}
