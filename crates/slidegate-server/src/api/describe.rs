//! What `/v1/rules` says beside the rules: the inline checks' bounds and the Envoy limits, so
//! that the dashboard shows every limit the service enforces.

use serde_json::{Value, json};

use crate::envoy::EnvoyConfig;
use crate::inline::InlineConfig;

/// The `[inline]` table as it is in force.
pub(super) fn inline(c: &InlineConfig) -> Value {
    json!({
        "enabled": c.enabled,
        "max_limit": c.max_limit,
        "max_window_ms": c.max_window.as_millis() as u64,
        "max_window": humantime::format_duration(c.max_window).to_string(),
        "max_cost": c.max_cost,
        "algorithms": c.algorithms,
    })
}

/// Every Envoy limit, by domain and descriptor path (`key_value.key`: its stats key without the
/// domain).
pub(super) fn envoy(c: &EnvoyConfig) -> Value {
    let limits: Vec<Value> = c
        .limits()
        .into_iter()
        .filter_map(|(domain, node)| {
            let limit = node.limit.as_ref()?;
            Some(json!({
                "domain": domain,
                "descriptor": node.stat_key.strip_prefix(domain).and_then(|k| k.strip_prefix('.')).unwrap_or(&node.stat_key),
                "requests_per_unit": limit.requests_per_unit,
                "unit": format!("{:?}", limit.unit).to_lowercase(),
                "algorithm": limit.quota.map(|q| q.algorithm().as_str()),
                "unlimited": limit.unlimited,
                "shadow_mode": node.shadow_mode,
                "name": limit.name,
                "replaces": limit.replaces,
            }))
        })
        .collect();
    let mut domains: Vec<&str> = c.domains().collect();
    domains.sort_unstable();
    json!({"domains": domains, "limits": limits})
}
