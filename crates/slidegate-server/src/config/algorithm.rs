//! How a quota counts, as a rule or an inline check spells it: the algorithm, its parameters and
//! a warm-up; an error names the field at fault.

use serde::Deserialize;
use slidegate::{Algorithm, Quota};

use super::parse_duration;

/// How a quota counts, as a rule or a request spells it: `algorithm` (default `sliding_log`)
/// with its parameters, and an optional warm-up.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AlgorithmSpec {
    /// `sliding_log`, `sliding_window`, `fixed_window` or `gcra`.
    pub algorithm: Option<String>,
    /// Sub-buckets of a `sliding_window` (default 10).
    pub buckets: Option<u32>,
    /// A `gcra` bucket's capacity (default: the limit).
    pub burst: Option<u64>,
    /// The warm-up period after idleness ("30s").
    pub warm_up: Option<String>,
    /// The share of the limit a warming key starts at (default 0.25; needs `warm_up`).
    pub cold_fraction: Option<f64>,
}

/// The cold share of a warm-up that names none.
pub const DEFAULT_COLD_FRACTION: f64 = 0.25;

/// A field of an [`AlgorithmSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AlgorithmField {
    /// `algorithm`, or the quota as a whole when the algorithm does not fit it.
    Algorithm,
    /// `buckets`.
    Buckets,
    /// `burst`.
    Burst,
    /// `warm_up`.
    WarmUp,
    /// `cold_fraction`.
    ColdFraction,
}

impl AlgorithmField {
    /// The field's name, as rules and requests spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Algorithm => "algorithm",
            Self::Buckets => "buckets",
            Self::Burst => "burst",
            Self::WarmUp => "warm_up",
            Self::ColdFraction => "cold_fraction",
        }
    }
}

/// An [`AlgorithmSpec`] that does not fit its quota: the field at fault, and why.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AlgorithmError {
    /// The field at fault.
    pub field: AlgorithmField,
    /// Why.
    pub error: slidegate::Error,
}

impl AlgorithmError {
    fn invalid(field: AlgorithmField, message: String) -> Self {
        Self { field, error: slidegate::Error::InvalidQuota(message) }
    }
}

impl AlgorithmSpec {
    /// `quota` counted as this spec says.
    pub fn apply(&self, quota: Quota) -> Result<Quota, AlgorithmError> {
        self.warm(self.count(quota)?)
    }

    /// `quota` counted by the algorithm with its parameters. A parameter is at fault when the
    /// algorithm fits the quota without it; otherwise the algorithm is.
    fn count(&self, quota: Quota) -> Result<Quota, AlgorithmError> {
        use AlgorithmField as F;
        let name = self.algorithm.as_deref().unwrap_or("sliding_log");
        let defaults: Algorithm = name.parse().map_err(|error| AlgorithmError { field: F::Algorithm, error })?;
        let mut algorithm = defaults;
        let parameter = match (&mut algorithm, self.buckets, self.burst) {
            (_, None, None) => F::Algorithm,
            (Algorithm::SlidingWindow { buckets }, Some(b), None) => {
                *buckets = b;
                F::Buckets
            }
            (Algorithm::Gcra { burst }, None, Some(b)) => {
                *burst = Some(b);
                F::Burst
            }
            (_, Some(_), _) => {
                let message = "`buckets` applies to the sliding_window algorithm only";
                return Err(AlgorithmError::invalid(F::Buckets, message.into()));
            }
            (_, _, Some(_)) => {
                return Err(AlgorithmError::invalid(F::Burst, "`burst` applies to the gcra algorithm only".into()));
            }
        };
        quota.with_algorithm(algorithm).map_err(|error| {
            let field = if quota.with_algorithm(defaults).is_ok() { parameter } else { F::Algorithm };
            AlgorithmError { field, error }
        })
    }

    /// `quota` with the warm-up, if any. The cold fraction is at fault when the default one
    /// fits; otherwise the warm-up period is.
    fn warm(&self, quota: Quota) -> Result<Quota, AlgorithmError> {
        use AlgorithmField as F;
        match (&self.warm_up, self.cold_fraction) {
            (None, None) => Ok(quota),
            (None, Some(_)) => {
                Err(AlgorithmError::invalid(F::ColdFraction, "`cold_fraction` needs a `warm_up` period".into()))
            }
            (Some(period), cold) => {
                let period =
                    parse_duration(period).map_err(|m| AlgorithmError::invalid(F::WarmUp, format!("warm_up: {m}")))?;
                quota.with_warm_up(period, cold.unwrap_or(DEFAULT_COLD_FRACTION)).map_err(|error| {
                    let default_fits = quota.with_warm_up(period, DEFAULT_COLD_FRACTION).is_ok();
                    let field = if cold.is_some() && default_fits { F::ColdFraction } else { F::WarmUp };
                    AlgorithmError { field, error }
                })
            }
        }
    }
}
