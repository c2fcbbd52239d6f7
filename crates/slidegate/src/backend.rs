//! The one place where behaviour truly varies: where the state lives.

use std::future::Future;

use crate::{Decision, Error, KeyState, Quota};

/// Storage and atomic decision for keys. Implemented by [`crate::MemoryBackend`] and, with the
/// `redis` feature, [`crate::RedisBackend`].
///
/// A backend receives input already validated by [`crate::Limiter`] (non-empty key of at most
/// [`crate::MAX_KEY_LEN`] bytes, `1 <= cost <= quota.limit()`), and must decide atomically: two
/// concurrent checks of one key never both take the last permit.
pub trait Backend: Send + Sync {
    /// Decides `cost` permits of `quota` for `key` now, recording them only when admitted.
    fn check(&self, key: &str, quota: &Quota, cost: u64) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Reads the state of `key` under `quota` without changing it.
    fn inspect(&self, key: &str, quota: &Quota) -> impl Future<Output = Result<KeyState, Error>> + Send;

    /// Forgets every admission of `key`.
    fn reset(&self, key: &str) -> impl Future<Output = Result<(), Error>> + Send;
}
