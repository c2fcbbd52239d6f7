//! The backend chosen at start: the embedded memory backend or Redis.

use slidegate::{Backend, Check, Decision, Error, KeyState, MemoryBackend, MultiDecision, Quota, RedisBackend};

/// One of the library's backends, picked by configuration.
#[derive(Debug, Clone)]
pub enum AnyBackend {
    /// In this process: nothing to install, one instance only.
    Memory(MemoryBackend),
    /// Redis: one limit across every instance that shares it.
    Redis(RedisBackend),
}

impl AnyBackend {
    /// `memory` or `redis`, for logs, metrics and `/readyz`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(_) => "redis",
        }
    }

    /// Whether the backend answers (Redis: `PING` within the deadline).
    pub async fn ready(&self) -> Result<(), Error> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Redis(r) => r.ping().await,
        }
    }
}

// The Redis branch's futures are boxed: a future is as large as its largest variant, and the
// Redis call (command, deadline timer, connection future) is kilobytes that the memory path
// would otherwise build and move on every request. One allocation is nothing beside a round trip.
impl Backend for AnyBackend {
    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        match self {
            Self::Memory(b) => b.check(key, quota, cost).await,
            Self::Redis(b) => Box::pin(b.check(key, quota, cost)).await,
        }
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        match self {
            Self::Memory(b) => b.check_all(checks).await,
            Self::Redis(b) => Box::pin(b.check_all(checks)).await,
        }
    }

    async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        match self {
            Self::Memory(b) => b.inspect(key, quota).await,
            Self::Redis(b) => Box::pin(b.inspect(key, quota)).await,
        }
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        match self {
            Self::Memory(b) => b.reset(key).await,
            Self::Redis(b) => Box::pin(b.reset(key)).await,
        }
    }
}
