//! The backend a Python `Limiter` runs on — one of the core's limiters — and the one tokio
//! runtime that serves every limiter of the process (pyo3-async-runtimes' own, so that
//! `acheck`'s futures and the Redis connections' tasks share it).

use slidegate::{Limiter, MemoryBackend, RedisBackend, RedisClusterBackend, RedisSentinelBackend};
use tokio::runtime::Runtime;

/// A limiter on each kind of backend the core has.
pub(crate) enum Engine {
    /// The embedded memory backend.
    Memory(Limiter<MemoryBackend>),
    /// A standalone Redis.
    Redis(Limiter<RedisBackend>),
    /// A Redis Cluster.
    Cluster(Limiter<RedisClusterBackend>),
    /// A Sentinel-monitored Redis.
    Sentinel(Limiter<RedisSentinelBackend>),
}

/// Runs `$call` with `$limiter` bound to the engine's limiter, whatever its backend.
macro_rules! on_limiter {
    ($engine:expr, $limiter:ident => $call:expr) => {
        match $engine {
            $crate::engine::Engine::Memory($limiter) => $call,
            $crate::engine::Engine::Redis($limiter) => $call,
            $crate::engine::Engine::Cluster($limiter) => $call,
            $crate::engine::Engine::Sentinel($limiter) => $call,
        }
    };
}
pub(crate) use on_limiter;

impl Engine {
    /// What decides: `memory`, or on Redis `lua` or `module` (`auto` until Redis was asked).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(l) => l.backend().engine().as_str(),
            Self::Cluster(l) => l.backend().engine().as_str(),
            Self::Sentinel(l) => l.backend().engine().as_str(),
        }
    }
}

/// The runtime every limiter's calls run on.
pub(crate) fn runtime() -> &'static Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}
