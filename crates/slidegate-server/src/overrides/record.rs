//! One override: what it sets over the quota that would otherwise apply, and its record — the
//! JSON form stored in Redis, sent to every instance and listed by the API.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use slidegate::{Algorithm, Quota};

/// What an override sets. Unset parts come from the quota the key would otherwise have (its
/// rule's, its tier's, or its Envoy descriptor's), so the override follows that quota's window
/// and algorithm unless it names its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Permits per window.
    pub limit: u64,
    /// The window; `None`: the underlying quota's.
    pub window: Option<Duration>,
    /// The algorithm and warm-up; `None`: the underlying quota's.
    pub counting: Option<Counting>,
}

/// An override's own algorithm (with its parameters) and warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counting {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The warm-up period and cold share in thousandths, if any.
    pub warm_up: Option<(Duration, u64)>,
}

impl Counting {
    /// How `quota` counts.
    pub fn of(quota: &Quota) -> Self {
        Self { algorithm: quota.algorithm(), warm_up: quota.warm_up().map(|w| (w.period(), w.cold_permille())) }
    }

    /// How an override that names no algorithm counts over `base`: as `base` does, a GCRA's
    /// burst following the override's limit ([`Limits::over`]).
    fn inherited(base: &Quota) -> Self {
        let mut counting = Self::of(base);
        if let Algorithm::Gcra { burst } = &mut counting.algorithm {
            *burst = None;
        }
        counting
    }
}

impl Limits {
    /// The quota a key with this override is decided with, over `base`, the quota it would
    /// otherwise have. Fails when the two do not fit together: a rule changed since the
    /// override was set (its algorithm no longer takes the limit, say).
    ///
    /// An override that keeps a GCRA's algorithm sets its burst too, to the override's limit:
    /// the rule's burst was chosen for the rule's limit, and kept under a lower one it would
    /// admit more at once than the override allows in a window (a burst of 20 under a limit
    /// of 1). Only an override that names `algorithm = gcra` sets a burst of its own.
    pub fn over(&self, base: &Quota) -> Result<Quota, slidegate::Error> {
        let gcra = matches!(base.algorithm(), Algorithm::Gcra { .. });
        if self.window.is_none() && self.counting.is_none() && !gcra {
            return base.with_limit(self.limit);
        }
        let counting = self.counting.unwrap_or_else(|| Counting::inherited(base));
        let mut quota =
            Quota::new(self.limit, self.window.unwrap_or_else(|| base.window()))?.with_algorithm(counting.algorithm)?;
        if let Some((period, cold_permille)) = counting.warm_up {
            quota = quota.with_warm_up(period, cold_permille as f64 / 1000.0)?;
        }
        Ok(base.failure_policy().map_or(quota, |p| quota.with_failure_policy(p)))
    }
}

/// One override in force.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The rule as the admin route names it: a rule's name, or `envoy:<domain>`.
    pub rule: String,
    /// The key as the admin route names it (an Envoy descriptor in its canonical form).
    pub key: String,
    /// What it sets.
    pub limits: Limits,
    /// When it was set (Unix ms).
    pub set_at_ms: u64,
    /// When it lapses (Unix ms); `None`: never.
    pub expires_at_ms: Option<u64>,
    /// The address of the admin client that set it.
    pub set_from: String,
}

impl Override {
    /// Whether it still applies at `now_ms`.
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|t| now_ms < t)
    }
}

/// An override as JSON: `{"rule", "key", "limit", "window_ms"?, "algorithm"?, "buckets"?,
/// "burst"?, "warm_up_ms"?, "cold_fraction"?, "set_at_ms", "expires_at_ms"?, "set_from"}`.
/// Unknown fields are ignored, so that an older instance reads what a newer one wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// [`Override::rule`].
    pub rule: String,
    /// [`Override::key`].
    pub key: String,
    /// [`Limits::limit`].
    pub limit: u64,
    /// [`Limits::window`], in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// The algorithm's name, when the override names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// A `sliding_window`'s buckets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u32>,
    /// A `gcra`'s burst, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// The warm-up period, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up_ms: Option<u64>,
    /// The warm-up's cold share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_fraction: Option<f64>,
    /// [`Override::set_at_ms`].
    pub set_at_ms: u64,
    /// [`Override::expires_at_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// [`Override::set_from`].
    #[serde(default)]
    pub set_from: String,
}

impl From<&Override> for Record {
    fn from(o: &Override) -> Self {
        let counting = o.limits.counting;
        let (buckets, burst) = match counting.map(|c| c.algorithm) {
            Some(Algorithm::SlidingWindow { buckets }) => (Some(buckets), None),
            Some(Algorithm::Gcra { burst }) => (None, burst),
            _ => (None, None),
        };
        let warm_up = counting.and_then(|c| c.warm_up);
        Self {
            rule: o.rule.clone(),
            key: o.key.clone(),
            limit: o.limits.limit,
            window_ms: o.limits.window.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            algorithm: counting.map(|c| c.algorithm.as_str().to_owned()),
            buckets,
            burst,
            warm_up_ms: warm_up.map(|(p, _)| u64::try_from(p.as_millis()).unwrap_or(u64::MAX)),
            cold_fraction: warm_up.map(|(_, permille)| permille as f64 / 1000.0),
            set_at_ms: o.set_at_ms,
            expires_at_ms: o.expires_at_ms,
            set_from: o.set_from.clone(),
        }
    }
}

impl TryFrom<Record> for Override {
    type Error = String;

    /// The override a record describes. Only its shape is checked here: whether it fits the
    /// quota under it is known at each decision, which falls back to that quota otherwise.
    fn try_from(r: Record) -> Result<Self, String> {
        let counting = match &r.algorithm {
            None if r.buckets.is_some() || r.burst.is_some() || r.warm_up_ms.is_some() => {
                return Err("algorithm parameters without an algorithm".into());
            }
            None => None,
            Some(name) => {
                let mut algorithm: Algorithm = name.parse().map_err(|e: slidegate::Error| e.to_string())?;
                match &mut algorithm {
                    Algorithm::SlidingWindow { buckets } => *buckets = r.buckets.unwrap_or(*buckets),
                    Algorithm::Gcra { burst } => *burst = r.burst,
                    _ => {}
                }
                let cold = (r.cold_fraction.unwrap_or(crate::config::DEFAULT_COLD_FRACTION) * 1000.0).round();
                let warm_up = r.warm_up_ms.map(|ms| (Duration::from_millis(ms), cold.clamp(0.0, 1000.0) as u64));
                Some(Counting { algorithm, warm_up })
            }
        };
        Ok(Self {
            limits: Limits { limit: r.limit, window: r.window_ms.map(Duration::from_millis), counting },
            rule: r.rule,
            key: r.key,
            set_at_ms: r.set_at_ms,
            expires_at_ms: r.expires_at_ms,
            set_from: r.set_from,
        })
    }
}

#[cfg(test)]
mod tests {
    use slidegate::FailurePolicy;

    use super::*;

    fn minute(limit: u64) -> Quota {
        Quota::per_minute(limit).expect("valid")
    }

    #[test]
    fn an_override_changes_the_limit_and_keeps_the_rest_of_its_quota() {
        let base = minute(10)
            .with_algorithm(Algorithm::SlidingWindow { buckets: 6 })
            .and_then(|q| q.with_warm_up(Duration::from_secs(30), 0.5))
            .expect("valid")
            .with_failure_policy(FailurePolicy::FailClosed);
        let raised = Limits { limit: 1000, window: None, counting: None }.over(&base).expect("fits");
        assert_eq!((raised.limit(), raised.window(), raised.algorithm()), (1000, base.window(), base.algorithm()));
        assert_eq!((raised.warm_up(), raised.failure_policy()), (base.warm_up(), Some(FailurePolicy::FailClosed)));
        let own = Counting { algorithm: Algorithm::Gcra { burst: Some(5) }, warm_up: None };
        let gcra = Limits { limit: 20, window: Some(Duration::from_secs(1)), counting: Some(own) };
        let q = gcra.over(&base).expect("fits");
        assert_eq!((q.limit(), q.window(), q.burst(), q.warm_up()), (20, Duration::from_secs(1), 5, None));
    }

    #[test]
    fn an_override_of_a_gcra_bounds_its_burst_unless_it_names_its_own() {
        let base = Quota::new(10, Duration::from_secs(10))
            .and_then(|q| q.with_algorithm(Algorithm::Gcra { burst: Some(20) }))
            .expect("valid")
            .with_failure_policy(FailurePolicy::FailClosed);
        for window in [None, Some(Duration::from_secs(60))] {
            let lowered = Limits { limit: 1, window, counting: None }.over(&base).expect("fits");
            assert_eq!((lowered.limit(), lowered.burst(), lowered.max_cost()), (1, 1, 1), "{window:?}");
            assert_eq!(lowered.failure_policy(), Some(FailurePolicy::FailClosed));
        }
        let raised = Limits { limit: 100, window: None, counting: None }.over(&base).expect("fits");
        assert_eq!((raised.burst(), raised.window()), (100, base.window()));
        let own = Counting { algorithm: Algorithm::Gcra { burst: Some(3) }, warm_up: None };
        let named = Limits { limit: 1, window: None, counting: Some(own) }.over(&base).expect("fits");
        assert_eq!((named.limit(), named.burst()), (1, 3), "a burst the override names");
    }

    #[test]
    fn an_override_that_does_not_fit_its_quota_says_so() {
        let log = Limits { limit: slidegate::MAX_LOG_LIMIT + 1, window: None, counting: None };
        assert!(log.over(&minute(10)).is_err(), "a sliding log's bound");
        let window = minute(10).with_algorithm(Algorithm::FixedWindow).expect("valid");
        assert_eq!(log.over(&window).map(|q| q.limit()).ok(), Some(slidegate::MAX_LOG_LIMIT + 1));
    }

    #[test]
    fn records_round_trip() {
        let o = Override {
            rule: "api".into(),
            key: "customer-42".into(),
            limits: Limits {
                limit: 100,
                window: Some(Duration::from_secs(60)),
                counting: Some(Counting {
                    algorithm: Algorithm::SlidingWindow { buckets: 6 },
                    warm_up: Some((Duration::from_secs(30), 250)),
                }),
            },
            set_at_ms: 1_000,
            expires_at_ms: Some(2_000),
            set_from: "127.0.0.1".into(),
        };
        let json = serde_json::to_string(&Record::from(&o)).expect("json");
        let back: Record = serde_json::from_str(&json).expect("json");
        assert_eq!(Override::try_from(back), Ok(o));
        let bare: Record = serde_json::from_str(r#"{"rule":"a","key":"k","limit":5,"set_at_ms":1,"future":true}"#)
            .expect("unknown fields are ignored");
        assert_eq!(Override::try_from(bare).map(|o| o.limits.counting), Ok(None));
        let orphan = r#"{"rule":"a","key":"k","limit":5,"set_at_ms":1,"burst":3}"#;
        assert!(Override::try_from(serde_json::from_str::<Record>(orphan).expect("json")).is_err());
    }
}
