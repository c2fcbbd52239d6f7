//! The backend chosen at start: the embedded memory backend, Redis, or a Redis Cluster.

use std::time::Duration;

use slidegate::{
    Backend, Charged, Check, Decision, Error, KeyState, KeyTimeline, Limiter, MemoryBackend, MultiDecision, Quota,
    RedisBackend, RedisClusterBackend, RedisSentinelBackend, RedisTls, Refunded,
};

use crate::config::BackendConfig;

/// One of the library's backends, picked by configuration.
#[derive(Debug, Clone)]
pub enum AnyBackend {
    /// In this process: nothing to install, one instance only.
    Memory(MemoryBackend),
    /// Redis: one limit across every instance that shares it.
    Redis(RedisBackend),
    /// A Redis Cluster: the same, spread over its masters.
    Cluster(RedisClusterBackend),
    /// A Sentinel-monitored Redis: the same, following its master through failovers.
    Sentinel(RedisSentinelBackend),
}

impl AnyBackend {
    /// Connects what `config` names: a cluster, a Redis, or (neither) the memory backend;
    /// over TLS as `config.tls` sets it up, its files read first.
    pub async fn connect(config: &BackendConfig) -> Result<Self, Error> {
        let tls = if config.tls.is_set() { RedisTls::load(&config.tls)? } else { RedisTls::default() };
        if tls.skips_hostname_verification() {
            tracing::warn!(
                "Redis' TLS certificate is not checked against the host's name (--redis-tls-skip-hostname-verification)"
            );
        }
        if !config.redis_cluster.is_empty() {
            let nodes: Vec<&str> = config.redis_cluster.iter().map(String::as_str).collect();
            let backend = RedisBackend::connect_cluster_tls(&nodes, &tls).await?;
            return Ok(Self::Cluster(
                backend
                    .with_prefix(config.prefix.clone())
                    .with_timeout(config.timeout)
                    .with_engine(config.engine)
                    .with_replicas_ack(config.replicas_ack),
            ));
        }
        if !config.redis_sentinel.is_empty() {
            let sentinels: Vec<&str> = config.redis_sentinel.iter().map(String::as_str).collect();
            let backend = RedisBackend::connect_sentinel_tls(&sentinels, &config.sentinel_service, &tls).await?;
            return Ok(Self::Sentinel(
                backend
                    .with_prefix(config.prefix.clone())
                    .with_timeout(config.timeout)
                    .with_engine(config.engine)
                    .with_replicas_ack(config.replicas_ack),
            ));
        }
        Ok(match &config.redis {
            None => Self::Memory(MemoryBackend::new().with_max_keys(config.max_keys)),
            Some(url) => Self::Redis(
                RedisBackend::connect_tls(url, &tls)
                    .await?
                    .with_prefix(config.prefix.clone())
                    .with_timeout(config.timeout)
                    .with_engine(config.engine)
                    .with_replicas_ack(config.replicas_ack),
            ),
        })
    }

    /// The limiter a service runs over this backend: a shared backend gets `config`'s failure
    /// policy, its circuit breaker and the near-cache; the memory backend cannot fail and is
    /// local already, so it gets neither.
    pub fn limiter(self, config: &BackendConfig) -> Limiter<Self> {
        if matches!(self, Self::Memory(_)) {
            return Limiter::new(self);
        }
        let limiter = Limiter::new(self).with_failure_policy(config.failure_policy).with_write_back();
        let limiter = limiter.with_failure_observer(|e| {
            ::metrics::counter!(crate::metrics::POLICY_ANSWERS, "kind" => crate::metrics::failure_kind(e)).increment(1);
        });
        if config.near_cache > 0 { limiter.with_near_cache(config.near_cache) } else { limiter }
    }

    /// `memory`, `redis`, `redis_cluster` or `redis_sentinel`, for logs, metrics and `/readyz`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(_) => "redis",
            Self::Cluster(_) => "redis_cluster",
            Self::Sentinel(_) => "redis_sentinel",
        }
    }

    /// The code deciding: `memory`, or on Redis `lua` or `module` (`auto` until Redis has
    /// been asked), for decisions, metrics and `/readyz`.
    pub fn engine(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(r) => r.engine().as_str(),
            Self::Cluster(r) => r.engine().as_str(),
            Self::Sentinel(r) => r.engine().as_str(),
        }
    }

    /// Whether the backend answers (Redis: `PING` within the deadline), asking Redis again
    /// whether it has slidegate's module (a `MODULE LOAD` is picked up here). With the engine
    /// forced to `module`, a server without it is not ready.
    pub async fn ready(&self) -> Result<(), Error> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Redis(r) => r.ready().await,
            Self::Cluster(r) => r.ready().await,
            Self::Sentinel(r) => r.ready().await,
        }
    }

    /// Renews instance `id`'s heartbeat in Redis for `lapse` and counts the fleet's live
    /// instances ([`slidegate::RedisBackend::heartbeat`]); `None` on the memory backend, which
    /// no other instance shares.
    pub async fn heartbeat(&self, id: &str, lapse: Duration) -> Option<Result<u32, Error>> {
        Some(match self {
            Self::Memory(_) => return None,
            Self::Redis(r) => r.heartbeat(id, lapse).await,
            Self::Cluster(r) => r.heartbeat(id, lapse).await,
            Self::Sentinel(r) => r.heartbeat(id, lapse).await,
        })
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
            Self::Cluster(b) => Box::pin(b.check(key, quota, cost)).await,
            Self::Sentinel(b) => Box::pin(b.check(key, quota, cost)).await,
        }
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        match self {
            Self::Memory(b) => b.check_all(checks).await,
            Self::Redis(b) => Box::pin(b.check_all(checks)).await,
            Self::Cluster(b) => Box::pin(b.check_all(checks)).await,
            Self::Sentinel(b) => Box::pin(b.check_all(checks)).await,
        }
    }

    async fn charge(&self, key: &str, quota: &Quota, cost: u64) -> Result<Charged, Error> {
        match self {
            Self::Memory(b) => b.charge(key, quota, cost).await,
            Self::Redis(b) => Box::pin(b.charge(key, quota, cost)).await,
            Self::Cluster(b) => Box::pin(b.charge(key, quota, cost)).await,
            Self::Sentinel(b) => Box::pin(b.charge(key, quota, cost)).await,
        }
    }

    async fn charge_ago(&self, key: &str, quota: &Quota, cost: u64, ago: Duration) -> Result<Charged, Error> {
        match self {
            Self::Memory(b) => b.charge_ago(key, quota, cost, ago).await,
            Self::Redis(b) => Box::pin(b.charge_ago(key, quota, cost, ago)).await,
            Self::Cluster(b) => Box::pin(b.charge_ago(key, quota, cost, ago)).await,
            Self::Sentinel(b) => Box::pin(b.charge_ago(key, quota, cost, ago)).await,
        }
    }

    async fn refund(&self, key: &str, quota: &Quota, cost: u64) -> Result<Refunded, Error> {
        match self {
            Self::Memory(b) => b.refund(key, quota, cost).await,
            Self::Redis(b) => Box::pin(b.refund(key, quota, cost)).await,
            Self::Cluster(b) => Box::pin(b.refund(key, quota, cost)).await,
            Self::Sentinel(b) => Box::pin(b.refund(key, quota, cost)).await,
        }
    }

    async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        match self {
            Self::Memory(b) => b.inspect(key, quota).await,
            Self::Redis(b) => Box::pin(b.inspect(key, quota)).await,
            Self::Cluster(b) => Box::pin(b.inspect(key, quota)).await,
            Self::Sentinel(b) => Box::pin(b.inspect(key, quota)).await,
        }
    }

    async fn timeline(&self, key: &str, quota: &Quota, max_admissions: usize) -> Result<KeyTimeline, Error> {
        match self {
            Self::Memory(b) => b.timeline(key, quota, max_admissions).await,
            Self::Redis(b) => Box::pin(b.timeline(key, quota, max_admissions)).await,
            Self::Cluster(b) => Box::pin(b.timeline(key, quota, max_admissions)).await,
            Self::Sentinel(b) => Box::pin(b.timeline(key, quota, max_admissions)).await,
        }
    }

    async fn accepts_writes(&self, key: &str, quota: &Quota) -> Result<(), Error> {
        match self {
            Self::Memory(b) => b.accepts_writes(key, quota).await,
            Self::Redis(b) => Box::pin(b.accepts_writes(key, quota)).await,
            Self::Cluster(b) => Box::pin(b.accepts_writes(key, quota)).await,
            Self::Sentinel(b) => Box::pin(b.accepts_writes(key, quota)).await,
        }
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        match self {
            Self::Memory(b) => b.reset(key).await,
            Self::Redis(b) => Box::pin(b.reset(key)).await,
            Self::Cluster(b) => Box::pin(b.reset(key)).await,
            Self::Sentinel(b) => Box::pin(b.reset(key)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_backend_holds_at_most_the_configured_keys() {
        let config = BackendConfig { max_keys: 1_000, ..BackendConfig::default() };
        let AnyBackend::Memory(memory) = AnyBackend::connect(&config).await.expect("memory") else {
            panic!("no Redis configured: the memory backend");
        };
        assert!(memory.max_keys() <= 1_000 && memory.max_keys() > 900, "{memory:?}");
    }
}
