//! What a key may do: `limit` permits in any rolling `window`, decided by an [`Algorithm`].

use std::time::Duration;

use crate::Error;

/// The largest `limit` a quota accepts.
pub const MAX_LIMIT: u64 = 1_000_000_000;

/// The longest `window` a quota accepts: 366 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// How a quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// The sliding window log: one timestamp per admitted permit, exact for every rolling window.
    ///
    /// Memory grows with the limit (one entry per admission still in the window; in Redis about
    /// 30 bytes each, more past 128 entries when the sorted set leaves its listpack encoding), so
    /// it suits limits up to a few thousand per window. A rule of 100,000 per minute wants a
    /// counter-based algorithm instead.
    #[default]
    SlidingLog,
}

impl Algorithm {
    /// The name used in configuration files and APIs (`sliding_log`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SlidingLog => "sliding_log",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "sliding_log" => Ok(Self::SlidingLog),
            other => Err(Error::UnknownAlgorithm(other.to_owned())),
        }
    }
}

/// At most `limit` permits in any rolling `window`.
///
/// Built only through [`Quota::new`] (or its shorthands), so every `Quota` is valid: a limit in
/// `1..=MAX_LIMIT`, a window of whole milliseconds in `1 ms..=MAX_WINDOW`.
///
/// ```
/// use slidegate::Quota;
/// use std::time::Duration;
///
/// let sms = Quota::new(5, Duration::from_secs(60))?;
/// assert_eq!(sms, Quota::per_minute(5)?);
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), slidegate::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
}

impl Quota {
    /// `limit` permits per rolling `window`, with the sliding log.
    pub fn new(limit: u64, window: Duration) -> Result<Self, Error> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Error::InvalidLimit { limit });
        }
        if window.is_zero() || window > MAX_WINDOW || window.subsec_nanos() % 1_000_000 != 0 {
            return Err(Error::InvalidWindow { window });
        }
        let window_ms = u64::try_from(window.as_millis()).map_err(|_| Error::InvalidWindow { window })?;
        Ok(Self { limit, window_ms, algorithm: Algorithm::SlidingLog })
    }

    /// `limit` permits per rolling second.
    pub fn per_second(limit: u64) -> Result<Self, Error> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` permits per rolling minute.
    pub fn per_minute(limit: u64) -> Result<Self, Error> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` permits per rolling hour.
    pub fn per_hour(limit: u64) -> Result<Self, Error> {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// The same quota counted by `algorithm`.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The number of permits per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The rolling window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The rolling window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// How this quota counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Checks that one request may ask for `cost` permits of this quota.
    pub(crate) fn validate_cost(&self, cost: u64) -> Result<(), Error> {
        if cost == 0 || cost > self.limit {
            return Err(Error::InvalidCost { cost, limit: self.limit });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_out_of_range_quotas() {
        let s = Duration::from_secs(1);
        assert!(matches!(Quota::new(0, s), Err(Error::InvalidLimit { limit: 0 })));
        assert!(Quota::new(MAX_LIMIT + 1, s).is_err());
        assert!(Quota::new(MAX_LIMIT, s).is_ok());
        assert!(matches!(Quota::new(1, Duration::ZERO), Err(Error::InvalidWindow { .. })));
        assert!(Quota::new(1, MAX_WINDOW + Duration::from_millis(1)).is_err());
        assert!(Quota::new(1, Duration::from_micros(1500)).is_err());
        assert_eq!(Quota::new(1, Duration::from_millis(1)).expect("1ms").window_ms(), 1);
    }

    #[test]
    fn cost_must_fit_the_limit() {
        let q = Quota::per_second(5).expect("valid");
        assert!(q.validate_cost(1).is_ok());
        assert!(q.validate_cost(5).is_ok());
        assert!(matches!(q.validate_cost(0), Err(Error::InvalidCost { cost: 0, limit: 5 })));
        assert!(q.validate_cost(6).is_err());
    }

    #[test]
    fn algorithm_names_round_trip() {
        let a: Algorithm = "sliding_log".parse().expect("known");
        assert_eq!(a.to_string(), "sliding_log");
        assert!(matches!("leaky".parse::<Algorithm>(), Err(Error::UnknownAlgorithm(name)) if name == "leaky"));
    }
}
