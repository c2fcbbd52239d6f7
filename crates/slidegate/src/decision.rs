//! The answer to a check, and what an operator sees of a key.

use std::time::Duration;

use crate::FailurePolicy;

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
    /// How long until `remaining` next grows, counted from the decision: until the first permit
    /// held after it frees (a sliding log's oldest admission in the window leaves; a window's
    /// count or a bucket drains by one). Zero when the key holds nothing. What an Envoy
    /// `duration_until_reset` answers; exact per algorithm in [`crate::spec`].
    pub next_permit_after: Duration,
    /// Set when the backend could not answer and this decision was made by a failure policy
    /// instead (see [`crate::Limiter::with_failure_policy`]).
    pub degraded: Option<FailurePolicy>,
}

impl Decision {
    /// An admission; `remaining` is what is left after it. Its `next_permit_after` is
    /// `reset_after`, by when every permit has freed, until set by
    /// [`Decision::with_next_permit_after`].
    pub fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        let next_permit_after = reset_after;
        Self { allowed: true, limit, remaining, reset_after, retry_after: None, next_permit_after, degraded: None }
    }

    /// A check that fit but was not charged because another limit of its group denied; its
    /// `next_permit_after` as for [`Decision::allowed`].
    pub fn held(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self { allowed: false, ..Self::allowed(limit, remaining, reset_after) }
    }

    /// The same decision, with `remaining` next growing after `next_permit_after`.
    #[must_use]
    pub fn with_next_permit_after(mut self, next_permit_after: Duration) -> Self {
        self.next_permit_after = next_permit_after;
        self
    }

    /// The same decision, marked as made by `policy` because the backend could not answer.
    #[must_use]
    pub fn degraded_by(mut self, policy: FailurePolicy) -> Self {
        self.degraded = Some(policy);
        self
    }

    /// A denial that recorded nothing. Its `next_permit_after` is `retry_after` (by then, a
    /// permit has freed), until set by [`Decision::with_next_permit_after`].
    pub fn denied(limit: u64, remaining: u64, reset_after: Duration, retry_after: Duration) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            reset_after,
            retry_after: Some(retry_after),
            next_permit_after: retry_after,
            degraded: None,
        }
    }
}

/// The answer to an atomic multi-limit check ([`crate::Limiter::check_all`]).
///
/// Either every check is admitted and recorded, or none is. In a denied group, a check that
/// would have fit on its own has `allowed == false` and `retry_after == None`, with its
/// uncharged `remaining`; each check that did not fit has its own `retry_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MultiDecision {
    /// Whether every check was admitted (and all were recorded).
    pub allowed: bool,
    /// One decision per check, in the order given.
    pub decisions: Vec<Decision>,
    /// The index of the first check that did not fit, when denied.
    pub denied_by: Option<usize>,
}

impl MultiDecision {
    /// The group's answer from its per-check decisions: admitted when all are, denied by the
    /// first that has a `retry_after`.
    pub fn new(decisions: Vec<Decision>) -> Self {
        let denied_by = decisions.iter().position(|d| d.retry_after.is_some());
        Self { allowed: denied_by.is_none() && decisions.iter().all(|d| d.allowed), decisions, denied_by }
    }

    /// When the whole group may be retried: the longest `retry_after` of the checks that did
    /// not fit. `None` when admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decisions.iter().filter_map(|d| d.retry_after).max()
    }
}

/// [`KeyState`] with the admissions behind it, read in one step: what a timeline of the key
/// draws (`Limiter::timeline`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyTimeline {
    /// What the key holds now.
    pub state: KeyState,
    /// A sliding log's admissions still in the window, in ms (on the clock of
    /// [`KeyState::oldest_ms`]), oldest first: the newest ones, as many as were asked for, one
    /// per permit. Empty for the other algorithms, which keep counts, not admissions.
    pub admissions_ms: Vec<u64>,
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

/// The answer to a charge ([`crate::Limiter::charge`]): permits spent whatever the key's
/// state, as a cost known only after the work (a response's tokens) must be.
///
/// A charge is never denied. [`Charged::decision`] is the key's standing after it
/// ([`crate::spec`], "Charges and refunds"): `allowed` while the key is within its limit
/// (`remaining` left), `false` once it is over it, with `retry_after` until one permit fits
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Charged {
    /// The key's standing after the charge.
    pub decision: Decision,
    /// Permits recorded: the cost, or less when the key would hold more than
    /// [`crate::MAX_CHARGE_FACTOR`] times its limit (then [`Charged::clamped`] is set).
    pub recorded: u64,
    /// Whether fewer permits than asked were recorded, at the bound.
    pub clamped: bool,
}

impl Charged {
    /// A charge of `cost` that recorded `recorded` permits and left the key at `decision`.
    pub fn new(decision: Decision, cost: u64, recorded: u64) -> Self {
        Self { decision, recorded, clamped: recorded < cost }
    }
}

/// The answer to a refund ([`crate::Limiter::refund`]): permits given back from the key's most
/// recent admissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refunded {
    /// The key's standing after the refund, as for [`Charged::decision`].
    pub decision: Decision,
    /// Permits given back: at most the cost asked, fewer when the key held fewer that a refund
    /// can give back ([`crate::spec`], "Charges and refunds").
    pub refunded: u64,
}

impl Refunded {
    /// A refund that gave back `refunded` permits and left the key at `decision`.
    pub fn new(decision: Decision, refunded: u64) -> Self {
        Self { decision, refunded }
    }
}
