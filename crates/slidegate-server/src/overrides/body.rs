//! The body of `PUT /v1/overrides/{rule}/{key}`: `{"limit", "window"?, "algorithm"?,
//! "buckets"?, "burst"?, "warm_up"?, "cold_fraction"?, "ttl"?}`, checked against the quota the
//! key has without it.

use std::time::Duration;

use serde::Deserialize;
use slidegate::Quota;

use super::{Counting, Limits};
use crate::api_error::ApiError;
use crate::config::{AlgorithmSpec, parse_duration};

/// The shortest `ttl`.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// The longest `ttl`: the longest window (366 days). Without a `ttl` an override stays until
/// deleted.
pub const MAX_TTL: Duration = slidegate::MAX_WINDOW;

/// An override as a client sends it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideBody {
    limit: Option<u64>,
    window: Option<String>,
    algorithm: Option<String>,
    buckets: Option<u32>,
    burst: Option<u64>,
    warm_up: Option<String>,
    cold_fraction: Option<f64>,
    ttl: Option<String>,
}

impl OverrideBody {
    /// What the body sets over `base` (the key's quota without an override) and for how long.
    /// A descriptor's window is its configured unit, which Envoy reads back: it cannot change.
    pub fn limits(self, base: &Quota, descriptor: bool) -> Result<(Limits, Option<Duration>), ApiError> {
        let limit = self.limit.ok_or_else(|| ApiError::bad_request("missing_limit", "field `limit` is required"))?;
        let window = match &self.window {
            Some(_) if descriptor => {
                let message = "an Envoy descriptor's window is its configured unit: set `limit` (and `algorithm`)";
                return Err(ApiError::bad_request("invalid_override", message));
            }
            Some(w) => Some(parse_duration(w).map_err(|m| ApiError::bad_request("invalid_window", m))?),
            None => None,
        };
        let counting = self.counting(limit, window.unwrap_or_else(|| base.window()))?;
        let limits = Limits { limit, window, counting };
        // Bounds of the algorithm (a sliding log's limit, a GCRA's rate…) as a check has them.
        limits.over(base)?;
        Ok((limits, self.ttl.as_deref().map(ttl).transpose()?))
    }

    /// The algorithm the body names, with its parameters; `None`: the key's own.
    fn counting(&self, limit: u64, window: Duration) -> Result<Option<Counting>, ApiError> {
        let spec = AlgorithmSpec {
            algorithm: self.algorithm.clone(),
            buckets: self.buckets,
            burst: self.burst,
            warm_up: self.warm_up.clone(),
            cold_fraction: self.cold_fraction,
        };
        let parameters = spec.buckets.is_some() || spec.burst.is_some() || spec.warm_up.is_some();
        match &spec.algorithm {
            None if parameters || spec.cold_fraction.is_some() => {
                let message = "`buckets`, `burst`, `warm_up` and `cold_fraction` need `algorithm`";
                Err(ApiError::bad_request("invalid_override", message))
            }
            None => Ok(None),
            Some(_) => {
                let quota = spec.apply(Quota::new(limit, window)?).map_err(|e| e.error)?;
                Ok(Some(Counting::of(&quota)))
            }
        }
    }
}

/// A `ttl` within [`MIN_TTL`]..=[`MAX_TTL`].
fn ttl(text: &str) -> Result<Duration, ApiError> {
    let ttl = parse_duration(text).map_err(|m| ApiError::bad_request("invalid_ttl", m))?;
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(ApiError::bad_request("invalid_ttl", format!("ttl {text:?} must be between 1s and 366 days")));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use slidegate::Algorithm;

    use super::*;

    fn body(json: &str) -> OverrideBody {
        serde_json::from_str(json).expect("a body")
    }

    fn code(json: &str, base: &Quota) -> &'static str {
        body(json).limits(base, false).map(|_| "ok").unwrap_or_else(|e| e.code())
    }

    #[test]
    fn a_body_sets_a_limit_within_its_algorithms_bounds_for_a_bounded_time() {
        let base = Quota::per_minute(10).expect("valid");
        let (limits, ttl) = body(r#"{"limit": 1000, "ttl": "7d"}"#).limits(&base, false).expect("valid");
        assert_eq!(
            (limits, ttl),
            (Limits { limit: 1000, window: None, counting: None }, Some(Duration::from_secs(604_800)))
        );
        let (gcra, _) = body(r#"{"limit": 10, "window": "1s", "algorithm": "gcra", "burst": 3}"#)
            .limits(&base, false)
            .expect("valid");
        assert_eq!(gcra.counting.map(|c| c.algorithm), Some(Algorithm::Gcra { burst: Some(3) }));
        assert_eq!(code(r#"{"ttl": "1d"}"#, &base), "missing_limit");
        assert_eq!(code(r#"{"limit": 100001}"#, &base), "invalid_quota", "a sliding log's bound");
        assert_eq!(code(r#"{"limit": 100001, "algorithm": "fixed_window"}"#, &base), "ok");
        assert_eq!(code(r#"{"limit": 0}"#, &base), "invalid_quota");
        assert_eq!(code(r#"{"limit": 5, "window": "soon"}"#, &base), "invalid_window");
        assert_eq!(code(r#"{"limit": 5, "window": "400d"}"#, &base), "invalid_quota");
        assert_eq!(code(r#"{"limit": 5, "burst": 3}"#, &base), "invalid_override");
        assert_eq!(code(r#"{"limit": 5, "algorithm": "leaky"}"#, &base), "unknown_algorithm");
        assert_eq!(code(r#"{"limit": 5, "algorithm": "sliding_window", "buckets": 7}"#, &base), "invalid_quota");
        assert_eq!(code(r#"{"limit": 5, "ttl": "500ms"}"#, &base), "invalid_ttl");
        assert_eq!(code(r#"{"limit": 5, "ttl": "367d"}"#, &base), "invalid_ttl");
        assert_eq!(code(r#"{"limit": 5, "ttl": "forever"}"#, &base), "invalid_ttl");
        let descriptor = body(r#"{"limit": 5, "window": "1m"}"#).limits(&base, true).map(|_| ()).expect_err("unit");
        assert_eq!(descriptor.code(), "invalid_override");
        assert!(serde_json::from_str::<OverrideBody>(r#"{"limit": 5, "limt": 6}"#).is_err(), "unknown fields");
    }
}
