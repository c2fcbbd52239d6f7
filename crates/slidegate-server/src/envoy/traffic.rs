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
            let entries = || item.entries.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            app.stats.record(&traffic, entries, d, started);
        }
    }
}
