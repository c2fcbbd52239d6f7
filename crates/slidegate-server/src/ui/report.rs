//! The `/v1/stats` answer: each rule's and Envoy domain's traffic, the totals, and the
//! backend's health. Its size is bounded: at most [`MAX_LISTED`] rules and as many domains, each
//! with [`SLOTS`] numbers per series and [`crate::stats::TOP_KEYS`] keys of at most [`MAX_KEY_BYTES`] bytes.

use serde_json::{Value, json};

use crate::app::{App, Live};
use crate::stats::series::{SLOT, SLOTS, Snapshot};
use crate::stats::sketch::{COUNTERS, MAX_KEY_BYTES};
use crate::stats::{TrafficReport, sketch::EPOCHS};

/// The most rules, and the most Envoy domains, listed (by name); `"truncated": true` says that
/// more were left out. The totals count every one.
pub const MAX_LISTED: usize = 100;

/// The answer of `GET /v1/stats`.
pub(super) async fn build(app: &App, live: &Live) -> Value {
    let reports = app.stats.reports();
    let (rules, domains) = (reports.rules, reports.domains);
    let mut totals = Snapshot::default();
    for (_, r) in rules.iter().chain(&domains) {
        totals.add(&r.series);
    }
    let truncated = rules.len() > MAX_LISTED || domains.len() > MAX_LISTED;
    let listed = |reports: Vec<(String, TrafficReport)>, field: &str| -> Vec<Value> {
        reports
            .into_iter()
            .take(MAX_LISTED)
            .map(|(name, report)| {
                let mut v = traffic(&report);
                v[field] = json!(name);
                v
            })
            .collect()
    };
    json!({
        "now_ms": reports.now_ms,
        "newest_slot_ms": reports.newest_slot_ms,
        "slot_ms": SLOT.as_millis() as u64,
        "slots": SLOTS,
        "admin_enabled": live.admin_token.is_some(),
        "totals": series(&totals),
        "rules": listed(rules, "rule"),
        "envoy": listed(domains, "domain"),
        "truncated": truncated,
        "backend": backend(app, &totals).await,
        "sketch": {"counters": COUNTERS, "minutes": EPOCHS - 1, "max_key_bytes": MAX_KEY_BYTES},
    })
}

fn series(s: &Snapshot) -> Value {
    let latency = s.latency_us().map(|(p50, p99)| json!({"p50": p50, "p99": p99}));
    json!({"allowed": s.allowed, "denied": s.denied, "degraded": s.degraded, "latency_us": latency})
}

fn traffic(r: &TrafficReport) -> Value {
    let keys: Vec<Value> = r
        .top
        .iter()
        .map(|k| {
            let share = if r.denials == 0 { 0.0 } else { k.count as f64 / r.denials as f64 };
            json!({"key": k.key, "count": k.count, "error": k.error, "share": share.min(1.0)})
        })
        .collect();
    let mut v = series(&r.series);
    v["top_denied"] = json!({"denials": r.denials, "max_error": r.denials / COUNTERS as u64, "keys": keys});
    v
}

async fn backend(app: &App, totals: &Snapshot) -> Value {
    let limiter = &app.limiter;
    let backend = limiter.backend();
    let ready = backend.ready().await;
    let near_cache = limiter.near_cache().map(|c| {
        let (lookups, hits) = c.hit_counts();
        let hit_rate = if lookups == 0 { 0.0 } else { hits as f64 / lookups as f64 };
        json!({"keys": c.len(), "capacity": c.capacity(), "lookups": lookups, "hits": hits, "hit_rate": hit_rate})
    });
    json!({
        "kind": backend.name(),
        "engine": backend.engine(),
        "reachable": ready.is_ok(),
        "error": ready.err().map(|e| crate::request_id::unready("stats", &e)),
        "circuit_open": limiter.circuit_open(),
        "near_cache": near_cache,
        "degraded": totals.degraded.iter().sum::<u64>(),
    })
}
