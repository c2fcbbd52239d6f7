//! What a check answers, as Python objects: [`Decision`], [`MultiDecision`], [`Charged`],
//! [`Refunded`] and [`KeyState`],
//! with durations in seconds (floats), and the RateLimit header fields of an answer, written by
//! the core's `slidegate::headers`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use slidegate::Quota;
use slidegate::headers::{POLICY, RETRY_AFTER, RateLimitHeaders, STATE};

/// The answer to one check.
#[pyclass(frozen, module = "slidegate")]
pub(crate) struct Decision {
    inner: slidegate::Decision,
    /// The quota decided, for the headers' policy.
    quota: Quota,
}

impl Decision {
    pub(crate) fn new(inner: slidegate::Decision, quota: Quota) -> Self {
        Self { inner, quota }
    }
}

#[pymethods]
impl Decision {
    /// Whether the request was admitted (and its permits recorded).
    #[getter]
    fn allowed(&self) -> bool {
        self.inner.allowed
    }

    /// The quota's limit.
    #[getter]
    fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Permits still available in the window after this request.
    #[getter]
    fn remaining(&self) -> u64 {
        self.inner.remaining
    }

    /// Seconds until the window holds no admission of this key.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.inner.reset_after.as_secs_f64()
    }

    /// For a denial, seconds until this same request would be admitted; `None` when allowed.
    #[getter]
    fn retry_after(&self) -> Option<f64> {
        self.inner.retry_after.map(|d| d.as_secs_f64())
    }

    /// Seconds until `remaining` next grows.
    #[getter]
    fn next_permit_after(&self) -> f64 {
        self.inner.next_permit_after.as_secs_f64()
    }

    /// The failure policy that decided because the backend could not (`"fail_open"`,
    /// `"fail_closed"`, `"local"`), or `None`.
    #[getter]
    fn degraded(&self) -> Option<&'static str> {
        self.inner.degraded.map(|p| p.as_str())
    }

    /// The answer's `RateLimit-Policy`, `RateLimit` and (on a denial) `Retry-After` fields,
    /// with `name` as the policy's name.
    #[pyo3(signature = (name = "default"))]
    fn headers<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        header_dict(py, &RateLimitHeaders::new(&[(name, &self.quota, &self.inner)], self.inner.retry_after))
    }

    fn __bool__(&self) -> bool {
        self.inner.allowed
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "Decision(allowed={}, limit={}, remaining={}, retry_after={}, reset_after={:?}, degraded={})",
            if d.allowed { "True" } else { "False" },
            d.limit,
            d.remaining,
            d.retry_after.map_or_else(|| "None".to_owned(), |r| format!("{:?}", r.as_secs_f64())),
            d.reset_after.as_secs_f64(),
            d.degraded.map_or_else(|| "None".to_owned(), |p| format!("{:?}", p.as_str())),
        )
    }
}

/// The answer to `check_all`: every check admitted and recorded, or none.
#[pyclass(frozen, module = "slidegate")]
pub(crate) struct MultiDecision {
    inner: slidegate::MultiDecision,
    quotas: Vec<Quota>,
}

impl MultiDecision {
    pub(crate) fn new(inner: slidegate::MultiDecision, quotas: Vec<Quota>) -> Self {
        Self { inner, quotas }
    }
}

#[pymethods]
impl MultiDecision {
    /// Whether every check was admitted (and all were recorded).
    #[getter]
    fn allowed(&self) -> bool {
        self.inner.allowed
    }

    /// One decision per check, in the order given.
    #[getter]
    fn decisions(&self) -> Vec<Decision> {
        self.inner.decisions.iter().zip(&self.quotas).map(|(d, q)| Decision::new(*d, *q)).collect()
    }

    /// The index of the first check that did not fit, when denied.
    #[getter]
    fn denied_by(&self) -> Option<usize> {
        self.inner.denied_by
    }

    /// Seconds until the whole group may be retried; `None` when admitted.
    #[getter]
    fn retry_after(&self) -> Option<f64> {
        self.inner.retry_after().map(|d| d.as_secs_f64())
    }

    /// The answer's RateLimit fields, one policy per check named by `names` (in order).
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts a Python list into an owned Vec
    fn headers<'py>(&self, py: Python<'py>, names: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
        if names.len() != self.quotas.len() {
            let (got, want) = (names.len(), self.quotas.len());
            return Err(crate::error::invalid(format!("headers needs one name per check: {want}, got {got}")));
        }
        let items: Vec<_> =
            names.iter().zip(&self.quotas).zip(&self.inner.decisions).map(|((n, q), d)| (n.as_str(), q, d)).collect();
        header_dict(py, &RateLimitHeaders::new(&items, self.inner.retry_after()))
    }

    fn __bool__(&self) -> bool {
        self.inner.allowed
    }

    fn __repr__(&self) -> String {
        format!(
            "MultiDecision(allowed={}, denied_by={:?})",
            if self.inner.allowed { "True" } else { "False" },
            self.inner.denied_by
        )
    }
}

/// What a charge answers: the key's standing after it and the permits recorded.
#[pyclass(frozen, module = "slidegate")]
pub(crate) struct Charged {
    inner: slidegate::Charged,
    quota: Quota,
}

impl Charged {
    pub(crate) fn new(inner: slidegate::Charged, quota: Quota) -> Self {
        Self { inner, quota }
    }
}

#[pymethods]
impl Charged {
    /// The key's standing after the charge: admitted while within its limit, else the denial
    /// one more permit would get (with its `retry_after`).
    #[getter]
    fn decision(&self) -> Decision {
        Decision::new(self.inner.decision, self.quota)
    }

    /// Permits recorded: the cost, or fewer at twice the limit (then `clamped`).
    #[getter]
    fn recorded(&self) -> u64 {
        self.inner.recorded
    }

    /// Whether fewer permits than asked were recorded.
    #[getter]
    fn clamped(&self) -> bool {
        self.inner.clamped
    }

    fn __repr__(&self) -> String {
        let (c, allowed) = (&self.inner, if self.inner.decision.allowed { "True" } else { "False" });
        format!(
            "Charged(recorded={}, clamped={}, allowed={allowed})",
            c.recorded,
            if c.clamped { "True" } else { "False" }
        )
    }
}

/// What a refund answers: the key's standing after it and the permits given back.
#[pyclass(frozen, module = "slidegate")]
pub(crate) struct Refunded {
    inner: slidegate::Refunded,
    quota: Quota,
}

impl Refunded {
    pub(crate) fn new(inner: slidegate::Refunded, quota: Quota) -> Self {
        Self { inner, quota }
    }
}

#[pymethods]
impl Refunded {
    /// The key's standing after the refund, as `Charged.decision`.
    #[getter]
    fn decision(&self) -> Decision {
        Decision::new(self.inner.decision, self.quota)
    }

    /// Permits given back: at most the cost, fewer when the key held fewer.
    #[getter]
    fn refunded(&self) -> u64 {
        self.inner.refunded
    }

    fn __repr__(&self) -> String {
        let allowed = if self.inner.decision.allowed { "True" } else { "False" };
        format!("Refunded(refunded={}, allowed={allowed})", self.inner.refunded)
    }
}

/// What one key holds now (`inspect`): nothing was changed to read it.
#[pyclass(frozen, module = "slidegate")]
pub(crate) struct KeyState {
    inner: slidegate::KeyState,
}

impl From<slidegate::KeyState> for KeyState {
    fn from(inner: slidegate::KeyState) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl KeyState {
    /// Permits admitted within the current window.
    #[getter]
    fn count(&self) -> u64 {
        self.inner.count
    }

    /// When the oldest admission still in the window was made, in ms since the Unix epoch.
    #[getter]
    fn oldest_ms(&self) -> Option<u64> {
        self.inner.oldest_ms
    }

    /// Seconds until the window holds no admission of this key.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.inner.reset_after.as_secs_f64()
    }

    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "KeyState(count={}, oldest_ms={:?}, reset_after={:?})",
            s.count,
            s.oldest_ms,
            s.reset_after.as_secs_f64()
        )
    }
}

/// The header fields as a dict of name to value, the names as the core writes them
/// (lowercase: HTTP names are case-insensitive, and HTTP/2 sends them so).
fn header_dict<'py>(py: Python<'py>, h: &RateLimitHeaders) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item(POLICY, &h.policy)?;
    dict.set_item(STATE, &h.state)?;
    if let Some(r) = &h.retry_after {
        dict.set_item(RETRY_AFTER, r)?;
    }
    Ok(dict)
}
