//! The `[inline]` table: whether inline checks are served, and their bounds.

use serde::Deserialize;
use slidegate::Algorithm;
use toml::Spanned;

use super::{Invalid, parse_duration};
use crate::inline::InlineConfig;

/// `[inline]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct InlineSpec {
    enabled: Option<bool>,
    max_limit: Option<Spanned<u64>>,
    max_window: Option<Spanned<String>>,
    max_cost: Option<Spanned<u64>>,
    algorithms: Option<Spanned<Vec<String>>>,
}

impl InlineSpec {
    /// The table over the defaults.
    pub(super) fn validate(&self) -> Result<InlineConfig, Invalid> {
        let mut c = InlineConfig::default();
        c.enabled = self.enabled.unwrap_or(c.enabled);
        let count = |n: &Spanned<u64>, name: &str| {
            let v = *n.get_ref();
            if (1..=slidegate::MAX_LIMIT).contains(&v) {
                Ok(v)
            } else {
                let message = format!("must be between 1 and {}, got {v}", slidegate::MAX_LIMIT);
                Err(Invalid::new(format!("inline.{name}"), n.span(), message))
            }
        };
        if let Some(n) = &self.max_limit {
            c.max_limit = count(n, "max_limit")?;
        }
        if let Some(n) = &self.max_cost {
            c.max_cost = count(n, "max_cost")?;
        }
        if let Some(w) = &self.max_window {
            let invalid = |m| Invalid::new("inline.max_window", w.span(), m);
            let window = parse_duration(w.get_ref()).map_err(invalid)?;
            if window.is_zero() || window > slidegate::MAX_WINDOW {
                return Err(invalid("must be between 1ms and 366 days".into()));
            }
            c.max_window = window;
        }
        if let Some(names) = &self.algorithms {
            let invalid = |m: String| Invalid::new("inline.algorithms", names.span(), m);
            if names.get_ref().is_empty() {
                return Err(invalid("list at least one algorithm (or set enabled = false)".into()));
            }
            let parsed = names.get_ref().iter().map(|n| n.parse::<Algorithm>().map(Algorithm::as_str));
            c.algorithms = Some(parsed.collect::<Result<_, _>>().map_err(|e| invalid(e.to_string()))?);
        }
        Ok(c)
    }
}
