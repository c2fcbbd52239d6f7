//! What the load generator sends its decisions to: the library over a backend, a running server
//! over HTTP, or its Envoy rate limit service over gRPC; and each worker's way to it.

use std::time::Duration;

use anyhow::Context;
use slidegate::{Limiter, MemoryBackend, Quota, RedisBackend};

use super::BenchOptions;
use super::grpc::{self, GrpcTarget};
use super::http::{Connection, HttpTarget};
use crate::backend::AnyBackend;

pub(super) enum Target {
    Library(Limiter<AnyBackend>),
    Http(HttpTarget),
    /// The Envoy rate limit service: domain `bench`, one descriptor `key` = the key.
    Grpc(GrpcTarget),
}

impl Target {
    /// Connects to `options.target`; an HTTP or gRPC target gets one request body per key, made
    /// once. A gRPC target comes with its connections, which the workers' tasks must drive
    /// ([`grpc::drive`]); the others with none.
    pub(super) async fn connect(
        options: &BenchOptions,
        keys: &[String],
    ) -> anyhow::Result<(Self, Vec<grpc::Connection>)> {
        let target = options.target.as_str();
        if target == "memory" {
            Ok((Self::library(options, AnyBackend::Memory(MemoryBackend::new())), Vec::new()))
        } else if target.starts_with("redis://") || target.starts_with("rediss://") {
            // `rediss://` trusts the system's store (`SSL_CERT_FILE` names another CA file).
            let backend = RedisBackend::connect(target).await.context("connecting to Redis")?;
            let backend = backend.with_timeout(Duration::from_secs(2)).with_engine(options.redis_engine);
            let backend = backend.with_replicas_ack(options.replicas_ack);
            Ok((Self::library(options, AnyBackend::Redis(backend)), Vec::new()))
        } else if let Some(nodes) = target.strip_prefix("redis-cluster://") {
            let urls: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            let backend = RedisBackend::connect_cluster(&urls).await.context("connecting to the Redis Cluster")?;
            let backend = backend.with_timeout(Duration::from_secs(2)).with_engine(options.redis_engine);
            let backend = backend.with_replicas_ack(options.replicas_ack);
            Ok((Self::library(options, AnyBackend::Cluster(backend)), Vec::new()))
        } else if let Some(authority) = target.strip_prefix("grpc://") {
            let connections = options.connections.clamp(1, options.concurrency.max(1) as u64);
            let (target, connections) = GrpcTarget::connect(authority, keys, connections).await?;
            Ok((Self::Grpc(target), connections))
        } else if target.starts_with("http://") {
            Ok((Self::http(options, keys)?, Vec::new()))
        } else {
            anyhow::bail!(
                "--target must be `memory`, `redis://…`, `rediss://…`, `redis-cluster://…`, `http://…` or `grpc://…`, got {target:?}"
            );
        }
    }

    fn library(options: &BenchOptions, backend: AnyBackend) -> Self {
        let limiter = Limiter::new(backend);
        Self::Library(if options.near_cache > 0 { limiter.with_near_cache(options.near_cache) } else { limiter })
    }

    fn http(options: &BenchOptions, keys: &[String]) -> anyhow::Result<Self> {
        let q = &options.quota;
        let bodies = keys
            .iter()
            .map(|k| match &options.rule {
                Some(rule) => serde_json::json!({"rule": rule, "key": k}).to_string(),
                None => serde_json::json!({
                    "key": k, "limit": q.limit(), "window": format!("{}ms", q.window_ms()), "algorithm": q.algorithm().as_str(),
                })
                .to_string(),
            })
            .collect();
        Ok(Self::Http(HttpTarget::new(&options.target, bodies)?))
    }

    /// With a library target, the code that decides: `memory`, `lua` or `module`.
    pub(super) fn engine(&self) -> Option<&'static str> {
        match self {
            Self::Library(limiter) => Some(limiter.backend().engine()),
            _ => None,
        }
    }

    /// Worker `w`'s way to the target: over HTTP a connection of its own, over gRPC a stream at
    /// a time on one of the connections, otherwise the target.
    pub(super) fn session(&self, w: u64) -> Session<'_> {
        match self {
            Self::Library(limiter) => Session::Library(limiter),
            Self::Http(target) => Session::Http(target.connection()),
            Self::Grpc(target) => Session::Grpc(target.stream(w)),
        }
    }
}

/// One worker's way to the [`Target`].
pub(super) enum Session<'a> {
    Library(&'a Limiter<AnyBackend>),
    Http(Connection<'a>),
    Grpc(grpc::Stream<'a>),
}

impl Session<'_> {
    /// One decision: `Ok(allowed)`.
    pub(super) async fn decide(&mut self, key_index: usize, keys: &[String], quota: &Quota) -> anyhow::Result<bool> {
        match self {
            Self::Library(limiter) => Ok(limiter.check(&keys[key_index], quota).await?.allowed),
            Self::Http(connection) => connection.decide(key_index).await,
            Self::Grpc(stream) => stream.decide(key_index).await,
        }
    }
}
