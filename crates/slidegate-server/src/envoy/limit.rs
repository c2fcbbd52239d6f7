//! A descriptor's limit: envoyproxy/ratelimit's `rate_limit` (`requests_per_unit` per `unit`,
//! `unlimited`, `name`, `replaces`), checked as upstream checks it, and the quota that counts it.

use std::time::Duration;

use slidegate::{Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, Quota};

use super::position::Step;
use super::spec::RateLimitSpec;

/// A time unit of envoyproxy/ratelimit, with the window it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 1 h.
    Hour,
    /// 24 h.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts it.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit named `s` in any case, as the protobuf enum names it (`UNKNOWN` is none).
    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Self::Second,
            "MINUTE" => Self::Minute,
            "HOUR" => Self::Hour,
            "DAY" => Self::Day,
            "WEEK" => Self::Week,
            "MONTH" => Self::Month,
            "YEAR" => Self::Year,
            _ => return None,
        })
    }

    /// The window.
    pub fn window(self) -> Duration {
        Duration::from_secs(match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        })
    }
}

/// A descriptor's limit.
#[derive(Debug, Clone)]
pub struct Limit {
    /// `requests_per_unit` per `unit`; `None` when unlimited or `requests_per_unit` is 0
    /// (everything over).
    pub quota: Option<Quota>,
    /// As configured.
    pub requests_per_unit: u64,
    /// As configured.
    pub unit: Unit,
    /// Never limited.
    pub unlimited: bool,
    /// The limit's name, for `replaces`.
    pub name: Option<String>,
    /// Names of limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
}

impl Limit {
    /// `requests_per_unit` per `unit`, counted by `algorithm` or, when none is named, by the
    /// sliding log up to [`MAX_LOG_LIMIT`] and the sliding window counter above it (capped at
    /// [`MAX_LIMIT`]). Also a warning when the limit is not counted as written.
    pub fn counted(
        requests_per_unit: u64,
        unit: Unit,
        algorithm: Option<&str>,
    ) -> Result<(Self, Option<String>), String> {
        let mut warning = None;
        let quota = match (requests_per_unit, algorithm) {
            (0, _) => None,
            (n, Some(name)) => {
                let algorithm: Algorithm = name.parse().map_err(|e| format!("{e}"))?;
                Some(
                    Quota::new(n, unit.window())
                        .and_then(|q| q.with_algorithm(algorithm))
                        .map_err(|e| e.to_string())?,
                )
            }
            (n, None) => {
                let algorithm = if n <= MAX_LOG_LIMIT {
                    Algorithm::SlidingLog
                } else {
                    "sliding_window".parse().map_err(|e| format!("{e}"))?
                };
                if n > MAX_LOG_LIMIT {
                    warning = Some(format!(
                        "requests_per_unit {n} is above the sliding log's bound ({MAX_LOG_LIMIT}): counted with the \
                         sliding window counter{} (name an `algorithm` to choose)",
                        if n > MAX_LIMIT { format!(", capped at {MAX_LIMIT}") } else { String::new() }
                    ));
                }
                Some(
                    Quota::new(n.min(MAX_LIMIT), unit.window())
                        .and_then(|q| q.with_algorithm(algorithm))
                        .map_err(|e| e.to_string())?,
                )
            }
        };
        let limit = Self { quota, requests_per_unit, unit, unlimited: false, name: None, replaces: Vec::new() };
        Ok((limit, warning))
    }
}

/// A `rate_limit`, checked as upstream checks it, and a warning when it is not counted as
/// written. An error names the node under `rate_limit` that it is about.
pub(super) fn limit(r: RateLimitSpec) -> Result<(Limit, Option<String>), (Vec<Step>, String)> {
    let field = |name: &str| vec![Step::Key(name.to_owned())];
    let unit = Unit::parse(&r.unit);
    if r.unlimited && unit.is_some() {
        return Err((field("unit"), "should not specify rate limit unit when unlimited".into()));
    }
    for (i, replaced) in r.replaces.iter().enumerate() {
        let entry = || vec![Step::Key("replaces".into()), Step::Index(i)];
        if replaced.is_empty() {
            return Err((entry(), "should not have an empty replaces entry".into()));
        }
        if *replaced == r.name {
            return Err((entry(), "replaces should not contain name of same descriptor".into()));
        }
    }
    let (mut limit, warning) = if r.unlimited {
        let limit = Limit {
            quota: None,
            requests_per_unit: 0,
            unit: Unit::Second,
            unlimited: true,
            name: None,
            replaces: Vec::new(),
        };
        (limit, None)
    } else {
        let unit = unit.ok_or_else(|| (field("unit"), format!("invalid rate limit unit '{}'", r.unit)))?;
        // Without an `algorithm`, any limit is counted (capped, with a warning).
        Limit::counted(u64::from(r.requests_per_unit), unit, r.algorithm.as_deref())
            .map_err(|e| (field("algorithm"), e))?
    };
    limit.name = (!r.name.is_empty()).then_some(r.name);
    limit.replaces = r.replaces;
    Ok((limit, warning))
}
