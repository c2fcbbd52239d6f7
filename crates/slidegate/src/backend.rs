//! The one place where behaviour truly varies: where the state lives.

use std::future::Future;

use crate::{Charged, Decision, Error, KeyState, KeyTimeline, MultiDecision, Quota, Refunded};

/// One limit of an atomic multi-limit check: `cost` permits of `quota` for `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check<'a> {
    /// The key charged.
    pub key: &'a str,
    /// Its quota.
    pub quota: Quota,
    /// Permits asked for.
    pub cost: u64,
}

impl<'a> Check<'a> {
    /// One permit of `quota` for `key`.
    pub fn new(key: &'a str, quota: Quota) -> Self {
        Self { key, quota, cost: 1 }
    }

    /// The same check asking for `cost` permits.
    #[must_use]
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
}

/// Storage and atomic decision for keys. Implemented by [`crate::MemoryBackend`] and, with the
/// `redis` feature, [`crate::RedisBackend`].
///
/// A backend receives input already validated by [`crate::Limiter`] (non-empty key of at most
/// [`crate::MAX_KEY_LEN`] bytes, `1 <= cost <= quota.max_cost()`, a sliding log's limit at most
/// [`crate::MAX_LOG_LIMIT`]), records any cost its quota admits in work bounded by the key's
/// entries, not by the permits, and must decide
/// atomically: two concurrent checks of one key never both take the last permit.
///
/// No method has a default body: a bound one stated by default would be lost, silently, by a
/// wrapper that forgot to forward it (an enum over backends, a decorator), so every
/// implementor states each one (`tests/backend_seams.rs` holds the workspace to it).
pub trait Backend: Send + Sync {
    /// Decides `cost` permits of `quota` for `key` now, recording them only when admitted.
    fn check(&self, key: &str, quota: &Quota, cost: u64) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Decides several checks at once, all or nothing: when any does not fit, nothing is
    /// recorded anywhere. Checks name distinct keys.
    fn check_all(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<MultiDecision, Error>> + Send;

    /// Records `cost` permits of `quota` for `key` now whatever the key holds, never denied,
    /// clamped where the key would hold more than [`crate::MAX_CHARGE_FACTOR`] times its limit;
    /// answers the key's standing after it ([`crate::spec`], "Charges and refunds").
    fn charge(&self, key: &str, quota: &Quota, cost: u64) -> impl Future<Output = Result<Charged, Error>> + Send;

    /// Records `cost` permits of `quota` for `key` as [`Backend::charge`] does, but as of `ago`
    /// before now where the algorithm keeps times — a sliding log's entries and a GCRA's arrival
    /// — and now for the counters, whose windows keep none (a time before the current window
    /// would replace its count): how [`crate::Limiter::write_back`] writes in what a local
    /// policy admitted while the backend was away.
    fn charge_ago(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
        ago: std::time::Duration,
    ) -> impl Future<Output = Result<Charged, Error>> + Send;

    /// Gives back up to `cost` of the most recent admissions of `key` under `quota`; answers
    /// what it gave back and the key's standing after it ([`crate::spec`], "Charges and refunds").
    fn refund(&self, key: &str, quota: &Quota, cost: u64) -> impl Future<Output = Result<Refunded, Error>> + Send;

    /// Reads the state of `key` under `quota` without changing it.
    fn inspect(&self, key: &str, quota: &Quota) -> impl Future<Output = Result<KeyState, Error>> + Send;

    /// Reads the state of `key` under `quota` and, for a sliding log, the times of its newest
    /// `max_admissions` admissions still in the window, in one step, without changing anything.
    fn timeline(
        &self,
        key: &str,
        quota: &Quota,
        max_admissions: usize,
    ) -> impl Future<Output = Result<KeyTimeline, Error>> + Send;

    /// Forgets every admission of `key`.
    fn reset(&self, key: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Answers once the backend runs writes to `key` under `quota`, writing nothing: what
    /// [`crate::Limiter::write_back`] asks before it writes, for a write sent to a backend that
    /// holds writes (stalled, or paused for writes as Redis' `FAILOVER` pauses them) runs when
    /// it resumes, though its caller gave up. A read does not tell: Redis answers reads
    /// through a write pause.
    fn accepts_writes(&self, key: &str, quota: &Quota) -> impl Future<Output = Result<(), Error>> + Send;
}
