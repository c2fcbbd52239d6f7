//! One decision as every surface takes it: the rule it names, the limiter's call, and its
//! counting (metrics, the dashboard's traffic, the trace).

use std::sync::Arc;

use axum::http::StatusCode;
use slidegate::{Decision, Quota};

use super::{App, Live};
use crate::api_error::ApiError;
use crate::config::Rule;
use crate::trace::Decided;

/// The rule called `name` in `live`, or the 404 `unknown_rule` answer naming it.
pub(crate) fn rule_named<'l>(live: &'l Live, name: &str) -> Result<&'l Arc<Rule>, ApiError> {
    live.rules
        .get(name)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "unknown_rule", format!("no rule {name:?}")))
}

/// Counts a decision of `key` under `rule`, which started at `started`, with the counters of
/// the snapshot that resolved it, and in the dashboard's traffic.
pub(crate) fn count_decision(app: &App, live: &Live, rule: &str, key: &str, d: &Decision, started: quanta::Instant) {
    if let Some(c) = live.counters(rule) {
        c.decisions.count(d.allowed);
        if let Some(policy) = d.degraded {
            c.decisions.count_degraded(policy);
        }
        if let Some(traffic) = &c.traffic {
            app.stats.record(traffic, || crate::stats::client_key(key, rule), d, started);
        }
    }
}

/// Decides `cost` permits of the backend key `key` under `rule`'s `quota` and counts the
/// decision; each surface then answers it as it does (HTTP: `crate::http::decision::decision_answer`).
pub(crate) async fn decide_one(
    app: &App,
    live: &Live,
    rule: &str,
    key: &str,
    quota: &Quota,
    cost: u64,
) -> Result<Decision, ApiError> {
    let started = app.now();
    let d = app.timed(app.limiter.check_cost(key, quota, cost)).await?;
    count_decision(app, live, rule, key, &d, started);
    if crate::trace::exporting() {
        let (algorithm, engine) = (quota.algorithm().as_str(), app.limiter.backend().engine());
        let degraded = d.degraded.is_some();
        crate::trace::record(&Decided { subject: ("rule", rule), algorithm, engine, allowed: d.allowed, degraded });
    }
    Ok(d)
}
