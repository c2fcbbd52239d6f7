//! The answer to a check, and what an operator sees of a key.

use std::time::Duration;

/// The answer to "may this key spend `cost` permits now?".
///
/// A denial is a decision, not an error: errors are infrastructure failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request was admitted (and its permits recorded).
    pub allowed: bool,
    /// The quota's limit.
    pub limit: u64,
    /// Permits still available in the window after this request.
    pub remaining: u64,
    /// How long until the window holds no admission of this key, counted from the decision.
    pub reset_after: Duration,
    /// For a denial: how long until enough admissions have left the window for this same
    /// request to succeed. `None` when allowed.
    pub retry_after: Option<Duration>,
}

impl Decision {
    /// An admission; `remaining` is what is left after it.
    pub fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self { allowed: true, limit, remaining, reset_after, retry_after: None }
    }

    /// A denial that recorded nothing.
    pub fn denied(limit: u64, remaining: u64, reset_after: Duration, retry_after: Duration) -> Self {
        Self { allowed: false, limit, remaining, reset_after, retry_after: Some(retry_after) }
    }
}

/// What one key holds now, for operators (`inspect`): nothing here changes state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyState {
    /// Permits admitted within the current window.
    pub count: u64,
    /// When the oldest admission still in the window was made, in ms since the Unix epoch
    /// (or the caller clock's epoch).
    pub oldest_ms: Option<u64>,
    /// How long until the window holds no admission of this key.
    pub reset_after: Duration,
}
