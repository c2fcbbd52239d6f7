//! What a key may do: `limit` permits per `window`, counted by an [`Algorithm`], optionally
//! warming up after idleness ([`WarmUp`]).

use std::time::Duration;

use crate::{Error, FailurePolicy};

/// The largest `limit` a quota accepts. The counters (sliding window, fixed window, GCRA) keep
/// a few numbers per key whatever the limit, so only exact arithmetic bounds them.
pub const MAX_LIMIT: u64 = 1_000_000_000;

/// The largest `limit` of a [`Algorithm::SlidingLog`]. A log keeps one entry per admission
/// still in its window, so the limit bounds a key's memory: at most 100,000 entries, about
/// 12 MB in a Redis sorted set and at most 5 bytes each (usually 1–2) in the memory backend and
/// the Redis module. Larger limits are what the sliding window counter is for.
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// A charge ([`crate::Limiter::charge`]) fills a key to at most this many times its limit (a
/// GCRA's bucket: its burst), and records less than its cost past that
/// ([`crate::Charged::clamped`]). The bound keeps a sliding log within twice [`MAX_LOG_LIMIT`]
/// entries and every engine's arithmetic exact; a key that full stays over its limit until at
/// least a limit's worth has left it.
pub const MAX_CHARGE_FACTOR: u64 = 2;

/// The longest `window` a quota accepts: 366 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The most sub-buckets of a [`Algorithm::SlidingWindow`]: each decision reads them all.
pub const MAX_BUCKETS: u32 = 100;

/// Sub-buckets of a sliding window counter unless set otherwise.
pub const DEFAULT_BUCKETS: u32 = 10;

/// Every product the Lua scripts form stays below 2⁵³, where Lua's doubles are exact integers.
const EXACT: u64 = 1 << 53;

pub(crate) const MAX_WINDOW_MS: u64 = MAX_WINDOW.as_millis() as u64;

/// How a quota counts. The trade-offs: the README's "Which algorithm when", measured in BENCHMARKS.md.
///
/// Each algorithm keeps its own state for a key: checking one key under two algorithms counts
/// twice, independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// The sliding window log: one timestamp per admitted permit, exact for every rolling window.
    ///
    /// Memory grows with the limit (one entry per admission still in the window; in Redis about
    /// 30 bytes each, more past 128 entries when the sorted set leaves its listpack encoding), so
    /// it suits limits up to a few thousand per window.
    #[default]
    SlidingLog,
    /// The sliding window counter: the window split into `buckets` equal sub-buckets, one count
    /// each; the oldest, partly expired bucket is weighted by its overlap with the window.
    /// Constant memory per key whatever the traffic; near-exact (see [`crate::spec`] for the
    /// error bound).
    SlidingWindow {
        /// Sub-buckets per window (`1..=MAX_BUCKETS`, dividing the window into whole ms).
        buckets: u32,
    },
    /// The fixed window counter: one count per window aligned to the clock's epoch. The cheapest,
    /// and crude: around a window edge it admits up to twice the limit within one window's time.
    FixedWindow,
    /// A token bucket as the generic cell rate algorithm: one number per key (the theoretical
    /// arrival time). Permits flow at `limit / window`; up to `burst` may be taken at once.
    Gcra {
        /// The bucket's capacity; `None` means the limit.
        burst: Option<u64>,
    },
}

impl Algorithm {
    /// The name used in configuration files and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SlidingLog => "sliding_log",
            Self::SlidingWindow { .. } => "sliding_window",
            Self::FixedWindow => "fixed_window",
            Self::Gcra { .. } => "gcra",
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

    /// `sliding_log`, `sliding_window` (with [`DEFAULT_BUCKETS`]), `fixed_window`, `gcra` (or
    /// `token_bucket`, burst = limit).
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "sliding_log" => Ok(Self::SlidingLog),
            "sliding_window" => Ok(Self::SlidingWindow { buckets: DEFAULT_BUCKETS }),
            "fixed_window" => Ok(Self::FixedWindow),
            "gcra" | "token_bucket" => Ok(Self::Gcra { burst: None }),
            other => Err(Error::UnknownAlgorithm(other.to_owned())),
        }
    }
}

/// A ramp after idleness: a key that has been idle starts at `cold_fraction` of its limit and
/// ramps linearly to the full limit over `period` (Guava's `SmoothWarmingUp`, Sentinel's warm-up
/// flow control). For the GCRA the ramp slows the rate instead: each permit costs
/// `window / effective limit`.
///
/// A key is idle when its algorithm holds nothing of it: no admission in the sliding log's
/// window, no counted bucket left in the sliding window, no admission in the current or the
/// previous fixed window, a full GCRA bucket. The ramp starts at the first admission after that;
/// a key busy since before its quota had a warm-up has no ramp to run, and counts as warm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WarmUp {
    period_ms: u64,
    cold_permille: u64,
}

impl WarmUp {
    /// The ramp's length.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// The ramp's length in ms.
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The cold share of the limit, in thousandths.
    pub fn cold_permille(&self) -> u64 {
        self.cold_permille
    }

    /// The effective limit `elapsed_ms` into the ramp: `limit × f / 1000` rounded down, at
    /// least 1, with `f = cold + (1000 − cold) × min(elapsed, period) / period` rounded down.
    /// Integer arithmetic, so Rust and Lua agree to the permit.
    pub fn limit_at(&self, limit: u64, elapsed_ms: u64) -> u64 {
        let f = self.cold_permille + (1000 - self.cold_permille) * elapsed_ms.min(self.period_ms) / self.period_ms;
        (limit * f / 1000).max(1)
    }
}

/// At most `limit` permits per `window`, counted by an [`Algorithm`].
///
/// Built only through [`Quota::new`] (or its shorthands) and checked again by each `with_*`,
/// so every `Quota` is valid: a limit in `1..=MAX_LIMIT`, a window of whole milliseconds in
/// `1 ms..=MAX_WINDOW`, and the algorithm's parameters in range. A sliding log's limit is at
/// most [`MAX_LOG_LIMIT`]: `Quota::new` takes limits up to [`MAX_LIMIT`] so that
/// [`Quota::with_algorithm`] can give a larger one to a counter, and every check
/// ([`Quota::validate_cost`]) refuses a sliding log above it.
///
/// ```
/// use slidegate::{Algorithm, Quota};
/// use std::time::Duration;
///
/// let sms = Quota::new(5, Duration::from_secs(60))?;
/// assert_eq!(sms, Quota::per_minute(5)?);
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// // 100 per minute in six 10 s buckets, starting at a quarter after idleness.
/// let api = Quota::per_minute(100)?
///     .with_algorithm(Algorithm::SlidingWindow { buckets: 6 })?
///     .with_warm_up(Duration::from_secs(30), 0.25)?;
/// assert_eq!(api.max_cost(), 25);
/// # Ok::<(), slidegate::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
    warm_up: Option<WarmUp>,
    failure_policy: Option<FailurePolicy>,
}

impl Quota {
    /// `limit` permits per rolling `window`, with the sliding log.
    pub fn new(limit: u64, window: Duration) -> Result<Self, Error> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Error::InvalidLimit { limit, max: MAX_LIMIT });
        }
        if window.is_zero() || window > MAX_WINDOW || window.subsec_nanos() % 1_000_000 != 0 {
            return Err(Error::InvalidWindow { window });
        }
        let window_ms = u64::try_from(window.as_millis()).map_err(|_| Error::InvalidWindow { window })?;
        Ok(Self { limit, window_ms, algorithm: Algorithm::SlidingLog, warm_up: None, failure_policy: None })
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

    /// The same quota with `limit` permits per window (its algorithm, warm-up and failure policy
    /// kept); fails when the algorithm does not take that limit.
    pub fn with_limit(self, limit: u64) -> Result<Self, Error> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Error::InvalidLimit { limit, max: MAX_LIMIT });
        }
        Self { limit, ..self }.validated()
    }

    /// The same quota counted by `algorithm`; fails when its parameters do not fit the quota.
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Self, Error> {
        Self { algorithm, ..self }.validated()
    }

    /// The same quota ramping up from `cold_fraction` (in `0.001..=1`, to the thousandth) of its
    /// limit over `period` after idleness. See [`WarmUp`].
    pub fn with_warm_up(self, period: Duration, cold_fraction: f64) -> Result<Self, Error> {
        let bad = |reason: &str| Error::InvalidQuota(format!("warm-up: {reason}"));
        if period.is_zero() || period > MAX_WINDOW || period.subsec_nanos() % 1_000_000 != 0 {
            return Err(bad("the period must be whole milliseconds between 1ms and 366 days"));
        }
        if !(0.001..=1.0).contains(&cold_fraction) {
            return Err(bad("the cold fraction must be between 0.001 and 1"));
        }
        // In range by the two checks above.
        let (period_ms, cold_permille) = (period.as_millis() as u64, (cold_fraction * 1000.0).round() as u64);
        Self { warm_up: Some(WarmUp { period_ms, cold_permille }), ..self }.validated()
    }

    /// The same quota, answered by `policy` when the backend fails (overriding the limiter's
    /// default; see [`crate::Limiter::with_failure_policy`]).
    #[must_use]
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = Some(policy);
        self
    }

    /// The quota's own failure policy, if it has one.
    pub fn failure_policy(&self) -> Option<FailurePolicy> {
        self.failure_policy
    }

    /// This quota with `permille` thousandths of its limit (and of a GCRA's burst), at least 1:
    /// what one instance enforces alone under [`FailurePolicy::Local`]. Falls back to a plain
    /// sliding log when the algorithm's parameters do not fit the smaller limit.
    pub fn share(&self, permille: u16) -> Self {
        self.scaled(u64::from(permille), 1000)
    }

    /// This quota with its limit (and a GCRA's burst) divided by `instances`, rounded down, at
    /// least 1: what one instance of a fleet of `instances` enforces alone under
    /// [`FailurePolicy::LocalAuto`].
    pub fn divided(&self, instances: u32) -> Self {
        self.scaled(1, u64::from(instances.max(1)))
    }

    /// This quota with `numerator / denominator` (at most 1) of its limit and burst, at least 1.
    fn scaled(&self, numerator: u64, denominator: u64) -> Self {
        // limit <= MAX_LIMIT and numerator <= 1000: no overflow.
        let scale = |n: u64| (n * numerator / denominator).max(1);
        let mut algorithm = self.algorithm;
        if let Algorithm::Gcra { burst: Some(b) } = &mut algorithm {
            *b = scale(*b);
        }
        let scaled = Self { limit: scale(self.limit), algorithm, ..*self };
        scaled.validated().unwrap_or(Self { algorithm: Algorithm::SlidingLog, warm_up: None, ..scaled })
    }

    fn validated(self) -> Result<Self, Error> {
        let bad = |reason: String| Err(Error::InvalidQuota(format!("{}: {reason}", self.algorithm)));
        self.validate_limit()?;
        match self.algorithm {
            Algorithm::SlidingLog | Algorithm::FixedWindow => {}
            Algorithm::SlidingWindow { buckets } => {
                if buckets == 0 || buckets > MAX_BUCKETS || self.window_ms % u64::from(buckets) != 0 {
                    return bad(format!(
                        "buckets must be 1 to {MAX_BUCKETS} and divide the window ({} ms) into whole ms, got {buckets}",
                        self.window_ms
                    ));
                }
                if self.limit.checked_mul(self.window_ms / u64::from(buckets)).is_none_or(|p| p >= EXACT) {
                    return bad("limit * bucket length (ms) must stay below 2^53".into());
                }
            }
            Algorithm::Gcra { burst } => {
                if self.window_ms * 1000 < self.limit {
                    return bad("at most one permit per microsecond".into());
                }
                match burst {
                    Some(b) if b == 0 || b > MAX_LIMIT => return bad(format!("burst must be 1 to {MAX_LIMIT}")),
                    Some(b) if b.checked_mul(self.emission_us()).is_none_or(|tau| tau > MAX_WINDOW_MS * 1000) => {
                        return bad("burst * window / limit must not exceed 366 days".into());
                    }
                    _ => {}
                }
            }
        }
        if self.max_cost() == 0 {
            return bad("an idle key would admit nothing: raise the cold fraction or the burst".into());
        }
        Ok(self)
    }

    /// The number of permits per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// How this quota counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The warm-up ramp, if any.
    pub fn warm_up(&self) -> Option<WarmUp> {
        self.warm_up
    }

    /// The GCRA's bucket capacity (the limit unless set); the limit for other algorithms.
    pub fn burst(&self) -> u64 {
        match self.algorithm {
            Algorithm::Gcra { burst: Some(b) } => b,
            _ => self.limit,
        }
    }

    /// The effective limit of a key `elapsed_ms` after its warm-up began (the limit when the
    /// quota has no warm-up).
    pub fn limit_at(&self, elapsed_ms: u64) -> u64 {
        self.warm_up.map_or(self.limit, |w| w.limit_at(self.limit, elapsed_ms))
    }

    /// The GCRA's emission interval at full rate, in µs: `window / limit`, rounded down.
    pub(crate) fn emission_us(&self) -> u64 {
        self.window_ms * 1000 / self.limit
    }

    /// The largest cost one request may ask for: what an idle key admits at once (the limit, a
    /// GCRA's burst, or less while cold under warm-up). A larger cost could never be admitted.
    pub fn max_cost(&self) -> u64 {
        let cold = self.limit_at(0);
        match self.algorithm {
            Algorithm::Gcra { .. } => self.burst() * self.emission_us() / (self.window_ms * 1000 / cold),
            _ => cold,
        }
    }

    /// The largest limit of this quota's algorithm: [`MAX_LOG_LIMIT`] for a sliding log,
    /// [`MAX_LIMIT`] otherwise.
    pub fn max_limit(&self) -> u64 {
        match self.algorithm {
            Algorithm::SlidingLog => MAX_LOG_LIMIT,
            _ => MAX_LIMIT,
        }
    }

    fn validate_limit(&self) -> Result<(), Error> {
        let max = self.max_limit();
        if self.limit > max {
            return Err(Error::InvalidLimit { limit: self.limit, max });
        }
        Ok(())
    }

    /// Checks that one request may ask for `cost` permits of this quota: the quota's limit
    /// within its algorithm's ([`Quota::max_limit`]) and `cost` in `1..=`[`Quota::max_cost`].
    pub fn validate_cost(&self, cost: u64) -> Result<(), Error> {
        self.validate_limit()?;
        let max = self.max_cost();
        if cost == 0 || cost > max {
            return Err(Error::InvalidCost { cost, max });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_limit_keeps_the_rest_within_the_algorithms_bounds() {
        let q = Quota::per_minute(10)
            .and_then(|q| q.with_algorithm(Algorithm::Gcra { burst: Some(4) }))
            .and_then(|q| q.with_warm_up(Duration::from_secs(30), 0.5))
            .expect("valid")
            .with_failure_policy(FailurePolicy::FailClosed);
        let raised = q.with_limit(1_000).expect("valid");
        assert_eq!((raised.limit(), raised.window(), raised.burst()), (1_000, q.window(), 4));
        assert_eq!((raised.warm_up(), raised.failure_policy()), (q.warm_up(), q.failure_policy()));
        assert!(matches!(q.with_limit(0), Err(Error::InvalidLimit { .. })));
        let log = Quota::per_minute(10).expect("valid");
        assert!(matches!(log.with_limit(MAX_LOG_LIMIT + 1), Err(Error::InvalidLimit { max: MAX_LOG_LIMIT, .. })));
        assert!(log.with_algorithm(Algorithm::FixedWindow).and_then(|q| q.with_limit(MAX_LIMIT)).is_ok());
    }

    #[test]
    fn rejects_out_of_range_quotas() {
        let s = Duration::from_secs(1);
        assert!(matches!(Quota::new(0, s), Err(Error::InvalidLimit { limit: 0, max: MAX_LIMIT })));
        assert!(Quota::new(MAX_LIMIT + 1, s).is_err());
        assert!(Quota::new(MAX_LIMIT, s).is_ok());
        assert!(matches!(Quota::new(1, Duration::ZERO), Err(Error::InvalidWindow { .. })));
        assert!(Quota::new(1, MAX_WINDOW + Duration::from_millis(1)).is_err());
        assert!(Quota::new(1, Duration::from_micros(1500)).is_err());
        assert_eq!(Quota::new(1, Duration::from_millis(1)).expect("1ms").window_ms(), 1);
    }

    #[test]
    fn a_sliding_log_is_bounded_and_a_counter_takes_larger_limits() {
        let s = Duration::from_secs(1);
        let huge = Quota::new(MAX_LIMIT, s).expect("a counter's limit");
        assert!(matches!(huge.validate_cost(1), Err(Error::InvalidLimit { limit: MAX_LIMIT, max: MAX_LOG_LIMIT })));
        assert!(matches!(
            huge.with_algorithm(Algorithm::SlidingLog),
            Err(Error::InvalidLimit { max: MAX_LOG_LIMIT, .. })
        ));
        assert!(huge.with_warm_up(s, 0.5).is_err(), "a sliding log ramping to a billion");
        let fixed = huge.with_algorithm(Algorithm::FixedWindow).expect("a counter");
        assert!(fixed.validate_cost(MAX_LIMIT).is_ok());
        let log =
            Quota::new(MAX_LOG_LIMIT, s).expect("valid").with_algorithm(Algorithm::SlidingLog).expect("at the bound");
        assert!(log.validate_cost(MAX_LOG_LIMIT).is_ok());
        assert!(Quota::new(MAX_LOG_LIMIT + 1, s).expect("valid").validate_cost(1).is_err());
    }

    #[test]
    fn cost_must_fit_the_limit() {
        let q = Quota::per_second(5).expect("valid");
        assert!(q.validate_cost(1).is_ok());
        assert!(q.validate_cost(5).is_ok());
        assert!(matches!(q.validate_cost(0), Err(Error::InvalidCost { cost: 0, max: 5 })));
        assert!(q.validate_cost(6).is_err());
    }

    #[test]
    fn algorithm_parameters_are_checked() {
        let q = Quota::per_minute(100).expect("valid");
        let window = |buckets| q.with_algorithm(Algorithm::SlidingWindow { buckets });
        assert!(window(6).is_ok());
        for bad in [0, 7, MAX_BUCKETS + 1] {
            assert!(matches!(window(bad), Err(Error::InvalidQuota(m)) if m.contains("buckets")), "{bad}");
        }
        let big = Quota::new(MAX_LIMIT, MAX_WINDOW).expect("valid");
        assert!(big.with_algorithm(Algorithm::SlidingWindow { buckets: 1 }).is_err(), "2^53");
        let gcra = |burst| q.with_algorithm(Algorithm::Gcra { burst });
        assert_eq!(gcra(None).expect("valid").burst(), 100);
        assert_eq!(gcra(Some(5)).expect("valid").max_cost(), 5);
        assert!(gcra(Some(0)).is_err());
        let too_fast = Quota::new(2_000, Duration::from_millis(1)).expect("valid");
        assert!(too_fast.with_algorithm(Algorithm::Gcra { burst: None }).is_err());
    }

    #[test]
    fn warm_up_ramps_linearly_from_the_cold_share() {
        let q = Quota::per_minute(100).expect("valid").with_warm_up(Duration::from_secs(10), 0.25).expect("valid");
        let at = |s: u64| q.limit_at(s * 1000);
        assert_eq!([at(0), at(5), at(10), at(100)], [25, 62, 100, 100]);
        assert_eq!(q.max_cost(), 25);
        let tiny = Quota::per_minute(2).expect("valid").with_warm_up(Duration::from_secs(1), 0.1).expect("valid");
        assert_eq!(tiny.limit_at(0), 1, "never below one permit");
        let gcra = q.with_algorithm(Algorithm::Gcra { burst: Some(40) }).expect("valid");
        assert_eq!(gcra.max_cost(), 10, "a cold bucket admits a quarter of its burst at once");
        assert!(q.with_warm_up(Duration::ZERO, 0.5).is_err());
        assert!(q.with_warm_up(Duration::from_secs(1), 0.0).is_err());
        assert!(q.with_warm_up(Duration::from_secs(1), 1.5).is_err());
    }

    #[test]
    fn algorithm_names_round_trip() {
        for name in ["sliding_log", "sliding_window", "fixed_window", "gcra"] {
            let a: Algorithm = name.parse().expect("known");
            assert_eq!(a.to_string(), name);
        }
        assert_eq!("token_bucket".parse::<Algorithm>().expect("alias").as_str(), "gcra");
        assert!(matches!("leaky".parse::<Algorithm>(), Err(Error::UnknownAlgorithm(name)) if name == "leaky"));
    }
}
