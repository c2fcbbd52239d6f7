//! A check's Python arguments read into what the core takes: the key (under its rule), the
//! [`Quota`] and the cost. Bounds are the core's, checked by [`Quota`] and the limiter; this
//! file adds only the rule name's.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use slidegate::{Algorithm, Quota};

use crate::error::{invalid, to_py};

/// The longest rule name, as the service's rules file takes them (`[A-Za-z0-9_.-]`).
pub(crate) const MAX_RULE_LEN: usize = 64;

/// One check, read: the backend key, the quota and the cost.
pub(crate) struct CheckArgs {
    pub(crate) key: String,
    pub(crate) quota: Quota,
    pub(crate) cost: u64,
}

/// What `check`, `inspect` and each item of `check_all` take, as Python passed it.
pub(crate) struct RawCheck<'a, 'py> {
    pub(crate) key: &'a str,
    pub(crate) limit: &'a Bound<'py, PyAny>,
    pub(crate) window: &'a Bound<'py, PyAny>,
    pub(crate) cost: Option<&'a Bound<'py, PyAny>>,
    pub(crate) algorithm: &'a str,
    pub(crate) rule: Option<&'a str>,
    pub(crate) burst: Option<&'a Bound<'py, PyAny>>,
    pub(crate) buckets: Option<&'a Bound<'py, PyAny>>,
}

impl RawCheck<'_, '_> {
    /// The key, quota and cost, or `InvalidArgument` naming the bound that is not met.
    pub(crate) fn read(&self) -> PyResult<CheckArgs> {
        let algorithm = algorithm(self.algorithm, self.burst, self.buckets)?;
        let quota = Quota::new(whole("limit", self.limit)?, window(self.window)?)
            .and_then(|q| q.with_algorithm(algorithm))
            .map_err(|e| to_py(&e))?;
        Ok(CheckArgs {
            key: rule_key(self.rule, self.key)?,
            quota,
            cost: self.cost.map_or(Ok(1), |c| whole("cost", c))?,
        })
    }
}

/// One item of `check_all`: a dict with `check`'s keyword arguments.
pub(crate) fn read_item(item: &Bound<'_, PyAny>) -> PyResult<CheckArgs> {
    let item =
        item.cast::<PyDict>().map_err(|_| invalid("each check of check_all is a dict of check's arguments".into()))?;
    let get = |name: &str| item.get_item(name);
    let required = |name: &str| get(name)?.ok_or_else(|| invalid(format!("a check of check_all needs {name:?}")));
    let text = |v: Option<Bound<'_, PyAny>>, name: &str| -> PyResult<Option<String>> {
        v.filter(|v| !v.is_none())
            .map(|v| v.extract::<String>().map_err(|_| invalid(format!("{name} must be a str"))))
            .transpose()
    };
    let (key, rule) = (text(Some(required("key")?), "key")?.unwrap_or_default(), text(get("rule")?, "rule")?);
    let algorithm = text(get("algorithm")?, "algorithm")?.unwrap_or_else(|| Algorithm::SlidingLog.as_str().to_owned());
    let (cost, burst, buckets) = (get("cost")?, get("burst")?, get("buckets")?);
    RawCheck {
        key: &key,
        limit: &required("limit")?,
        window: &required("window")?,
        cost: cost.as_ref(),
        algorithm: &algorithm,
        rule: rule.as_deref(),
        burst: burst.as_ref(),
        buckets: buckets.as_ref(),
    }
    .read()
}

/// The backend key of `key`: under a rule, the service's name for it, `<rule>:{<key>}`, so a
/// check from Python and one through the service count in the same log.
pub(crate) fn rule_key(rule: Option<&str>, key: &str) -> PyResult<String> {
    let Some(rule) = rule else { return Ok(key.to_owned()) };
    if rule.is_empty() || rule.len() > MAX_RULE_LEN {
        return Err(invalid(format!("rule must be 1 to {MAX_RULE_LEN} characters, got {}", rule.len())));
    }
    if !rule.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        return Err(invalid(format!("rule {rule:?} may use only letters, digits, `_`, `-` and `.`")));
    }
    Ok(slidegate::rule_key(rule, key))
}

/// An algorithm by name, with its parameter when given: `burst` for the GCRA, `buckets` for
/// the sliding window counter.
fn algorithm(name: &str, burst: Option<&Bound<'_, PyAny>>, buckets: Option<&Bound<'_, PyAny>>) -> PyResult<Algorithm> {
    match (name.parse::<Algorithm>().map_err(|e| to_py(&e))?, given(burst), given(buckets)) {
        (Algorithm::Gcra { .. }, Some(b), None) => Ok(Algorithm::Gcra { burst: Some(whole("burst", &b)?) }),
        (Algorithm::SlidingWindow { .. }, None, Some(b)) => {
            let buckets = whole("buckets", &b)?;
            let buckets = u32::try_from(buckets).map_err(|_| {
                invalid(format!("buckets must be at most {}, got {buckets}", slidegate::quota::MAX_BUCKETS))
            })?;
            Ok(Algorithm::SlidingWindow { buckets })
        }
        (a, None, None) => Ok(a),
        (a, _, _) => Err(invalid(format!(
            "{a} takes no {}",
            if given(burst).is_some() { "burst (gcra only)" } else { "buckets (sliding_window only)" }
        ))),
    }
}

/// An optional argument, `None` being not given.
fn given<'py>(value: Option<&Bound<'py, PyAny>>) -> Option<Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none()).cloned()
}

/// A whole number of at least 0, or `InvalidArgument` naming `name`.
fn whole(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid(format!("{name} must be a whole number, got a bool")));
    }
    value
        .extract::<u64>()
        .map_err(|_| invalid(format!("{name} must be a whole number from 0 to {}, got {value}", u64::MAX)))
}

/// A window: a duration as text (`"60s"`, `"1h"`, `"500ms"`), a number of seconds, or a
/// `datetime.timedelta`; the quota then checks it is whole milliseconds up to 366 days.
fn window(value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    if value.is_instance_of::<PyString>() {
        let text: String = value.extract()?;
        return humantime::parse_duration(&text)
            .map_err(|e| invalid(format!("window {text:?} is not a duration such as \"60s\": {e}")));
    }
    let seconds = if value.hasattr("total_seconds")? { value.call_method0("total_seconds")? } else { value.clone() };
    let seconds = seconds
        .extract::<f64>()
        .map_err(|_| invalid(format!("window must be a duration (\"60s\", seconds, a timedelta), got {value}")))?;
    let ms = seconds * 1000.0;
    // A window of seconds written as a float is whole milliseconds up to the float's rounding.
    if !(ms.is_finite()
        && ms >= 0.0
        && (ms - ms.round()).abs() < 1e-6
        && ms.round() <= slidegate::MAX_WINDOW.as_millis() as f64)
    {
        return Err(invalid(format!("window must be whole milliseconds between 1ms and 366 days, got {seconds} s")));
    }
    Ok(Duration::from_millis(ms.round() as u64))
}
