//! Bounds on inline checks (`{"key", "limit", "window"}` without a rule): the one place where a
//! caller, not the operator, chooses what a key costs the backend. `[inline]` in the rules file
//! sets them; they change on reload like the rules.

use std::time::Duration;

use slidegate::Quota;

/// The largest inline `limit` (and GCRA `burst`) unless `[inline] max_limit` says otherwise. A
/// sliding log keeps one entry per admission in the window (in Redis ~30 bytes, more past 128),
/// so this caps one inline key at a few hundred KiB; per-minute API limits fit, larger quotas
/// belong in the rules file, where the operator names them.
pub const DEFAULT_MAX_LIMIT: u64 = 10_000;

/// The longest inline `window` unless `[inline] max_window` says otherwise: a key's state lives
/// as long as its window, so this bounds how long a caller's keys occupy the backend; daily
/// quotas fit.
pub const DEFAULT_MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The largest inline `cost` unless `[inline] max_cost` says otherwise: a sliding log writes
/// one entry per permit, so the cost sizes one call's work; batches of up to 100 fit.
pub const DEFAULT_MAX_COST: u64 = 100;

/// The `[inline]` table: whether inline checks are served and within which bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineConfig {
    /// Whether inline checks are served at all (default true, so that the quick start works
    /// without a rules file).
    pub enabled: bool,
    /// The largest `limit`, and GCRA `burst` (default [`DEFAULT_MAX_LIMIT`]).
    pub max_limit: u64,
    /// The longest `window` (default [`DEFAULT_MAX_WINDOW`]).
    pub max_window: Duration,
    /// The largest `cost` (default [`DEFAULT_MAX_COST`]).
    pub max_cost: u64,
    /// The algorithms inline checks may ask for, by name (`sliding_log`, …); `None`: all.
    pub algorithms: Option<Vec<&'static str>>,
}

impl Default for InlineConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_limit: DEFAULT_MAX_LIMIT,
            max_window: DEFAULT_MAX_WINDOW,
            max_cost: DEFAULT_MAX_COST,
            algorithms: None,
        }
    }
}

/// Why an inline check is refused; each message names the bound and where it is set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InlineRefusal {
    /// `[inline] enabled = false`.
    #[error("inline checks are disabled on this server ([inline] enabled = false): name a rule")]
    Disabled,
    /// A limit or burst over `max_limit`.
    #[error("inline {field} {value} is over max_limit = {max} ([inline] in the rules file)")]
    LimitTooLarge {
        /// `limit` or `burst`.
        field: &'static str,
        /// The value asked for.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// A window over `max_window`.
    #[error(
        "inline window {} is over max_window = {} ([inline] in the rules file)",
        humantime::format_duration(*value),
        humantime::format_duration(*max)
    )]
    WindowTooLong {
        /// The window asked for.
        value: Duration,
        /// The bound.
        max: Duration,
    },
    /// A cost over `max_cost`.
    #[error("inline cost {value} is over max_cost = {max} ([inline] in the rules file)")]
    CostTooLarge {
        /// The cost asked for.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// An algorithm not in `algorithms`.
    #[error("inline algorithm {name:?} is not allowed; algorithms = {allowed:?} ([inline] in the rules file)")]
    AlgorithmNotAllowed {
        /// The algorithm asked for.
        name: &'static str,
        /// The allowed ones.
        allowed: Vec<&'static str>,
    },
}

impl InlineRefusal {
    /// The error code of the API's answer.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Disabled => "inline_disabled",
            Self::LimitTooLarge { .. } => "inline_limit_too_large",
            Self::WindowTooLong { .. } => "inline_window_too_long",
            Self::CostTooLarge { .. } => "inline_cost_too_large",
            Self::AlgorithmNotAllowed { .. } => "inline_algorithm_not_allowed",
        }
    }
}

impl InlineConfig {
    /// Refuses inline checks when they are disabled, before any field is looked at.
    pub fn check_enabled(&self) -> Result<(), InlineRefusal> {
        if self.enabled { Ok(()) } else { Err(InlineRefusal::Disabled) }
    }

    /// Whether an inline check of `cost` permits of `quota` is within the bounds.
    pub fn check(&self, quota: &Quota, cost: u64) -> Result<(), InlineRefusal> {
        self.check_enabled()?;
        let max = self.max_limit;
        for (field, value) in [("limit", quota.limit()), ("burst", quota.burst())] {
            if value > max {
                return Err(InlineRefusal::LimitTooLarge { field, value, max });
            }
        }
        if quota.window() > self.max_window {
            return Err(InlineRefusal::WindowTooLong { value: quota.window(), max: self.max_window });
        }
        if cost > self.max_cost {
            return Err(InlineRefusal::CostTooLarge { value: cost, max: self.max_cost });
        }
        let name = quota.algorithm().as_str();
        match &self.algorithms {
            Some(allowed) if !allowed.contains(&name) => {
                Err(InlineRefusal::AlgorithmNotAllowed { name, allowed: allowed.clone() })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use slidegate::Algorithm;

    use super::*;

    fn quota(limit: u64, window_s: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(window_s)).expect("valid quota")
    }

    #[test]
    fn each_bound_refuses_just_past_it_and_names_itself() {
        let c = InlineConfig::default();
        assert_eq!(c.check(&quota(10_000, 86_400), 100), Ok(()));
        let cases = [
            (c.check(&quota(10_001, 60), 1), "inline_limit_too_large", "max_limit = 10000"),
            (c.check(&quota(10, 86_401), 1), "inline_window_too_long", "max_window = 1day"),
            (c.check(&quota(1_000, 60), 101), "inline_cost_too_large", "max_cost = 100"),
        ];
        for (result, code, bound) in cases {
            let refusal = result.expect_err("refused");
            assert_eq!(refusal.code(), code);
            assert!(refusal.to_string().contains(bound), "{refusal}");
        }
        let bursty = quota(10, 60).with_algorithm(Algorithm::Gcra { burst: Some(20_000) }).expect("valid");
        let refusal = c.check(&bursty, 1).expect_err("refused");
        assert!(refusal.to_string().contains("burst 20000 is over max_limit = 10000"), "{refusal}");
    }

    #[test]
    fn algorithms_and_disabling_are_enforced() {
        let c = InlineConfig { algorithms: Some(vec!["gcra"]), ..InlineConfig::default() };
        let gcra = quota(10, 60).with_algorithm(Algorithm::Gcra { burst: None }).expect("valid");
        assert_eq!(c.check(&gcra, 1), Ok(()));
        let refusal = c.check(&quota(10, 60), 1).expect_err("sliding_log is not allowed");
        assert_eq!(refusal.code(), "inline_algorithm_not_allowed");
        let off = InlineConfig { enabled: false, ..InlineConfig::default() };
        assert_eq!(off.check(&quota(1, 1), 1), Err(InlineRefusal::Disabled));
        assert_eq!(off.check_enabled().map_err(|r| r.code()), Err("inline_disabled"));
    }
}
