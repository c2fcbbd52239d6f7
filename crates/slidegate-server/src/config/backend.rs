//! The `[backend]` table: where the state lives (memory, Redis, Sentinel, Cluster), what
//! answers when it fails, and the Redis link's deadline, engine and TLS files.

use std::time::Duration;

use serde::Deserialize;
use slidegate::{FailurePolicy, RedisEngine, TlsFiles};
use toml::Spanned;

use super::value::{LocalShare, PolicyFields, failure_policy};
use super::{Invalid, check_redis_url, parse_duration};

/// The per-call backend deadline when the file does not set one.
pub const DEFAULT_TIMEOUT: Duration = slidegate::redis::DEFAULT_TIMEOUT;

/// Denied keys the near-cache holds unless `[backend] near_cache` says otherwise.
pub const DEFAULT_NEAR_CACHE: usize = 100_000;

/// The `[backend]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// A Redis URL; `None` (and no cluster) for the embedded memory backend.
    pub redis: Option<String>,
    /// Redis Cluster nodes to start from; when set, the Cluster backend is used.
    pub redis_cluster: Vec<String>,
    /// Sentinels to ask for the master of [`BackendConfig::sentinel_service`]; when set, the
    /// backend follows that master through failovers.
    pub redis_sentinel: Vec<String>,
    /// The master's name at the sentinels.
    pub sentinel_service: String,
    /// What answers when the backend fails, for rules without a policy of their own.
    pub failure_policy: FailurePolicy,
    /// Denied keys remembered to answer locally until their `retry_after` (0: none).
    pub near_cache: usize,
    /// The most keys the memory backend holds (`[backend] max_keys`, at least 1; default
    /// [`slidegate::memory::DEFAULT_MAX_KEYS`]).
    pub max_keys: usize,
    /// Key namespace in Redis.
    pub prefix: String,
    /// Deadline of each backend call.
    pub timeout: Duration,
    /// Which code decides on Redis: `auto` (the module when loaded), `lua` or `module`.
    pub engine: RedisEngine,
    /// The replicas each admission waits for (`WAIT`) before it is answered; 0: none
    /// ([`slidegate::RedisBackend::with_replicas_ack`]).
    pub replicas_ack: u32,
    /// TLS to a `rediss://` Redis: `tls_ca`, `tls_cert`, `tls_key`,
    /// `tls_skip_hostname_verification`.
    pub tls: TlsFiles,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            redis: None,
            redis_cluster: Vec::new(),
            redis_sentinel: Vec::new(),
            sentinel_service: "mymaster".to_owned(),
            prefix: slidegate::redis::DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            failure_policy: FailurePolicy::FailOpen,
            near_cache: DEFAULT_NEAR_CACHE,
            max_keys: slidegate::memory::DEFAULT_MAX_KEYS,
            engine: RedisEngine::Auto,
            replicas_ack: 0,
            tls: TlsFiles::default(),
        }
    }
}

impl BackendConfig {
    /// TLS files given for a Redis that is not reached over TLS would be ignored, and the
    /// operator who gave them would believe the link encrypted: refused instead.
    pub fn check_tls(&self) -> Result<(), String> {
        let mut urls = self.redis.iter().chain(&self.redis_cluster).chain(&self.redis_sentinel);
        match urls.find(|u| !u.starts_with("rediss://")) {
            Some(url) if self.tls.is_set() => Err(format!(
                "TLS settings are given but {:?} is not a rediss:// URL: use rediss:// (nothing falls back to plaintext)",
                crate::redact::redact(url)
            )),
            _ => Ok(()),
        }
    }
}

/// `[backend]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct BackendSpec {
    redis: Option<Spanned<String>>,
    redis_cluster: Option<Spanned<Vec<String>>>,
    redis_sentinel: Option<Spanned<Vec<String>>>,
    sentinel_service: Option<Spanned<String>>,
    failure_policy: Option<Spanned<String>>,
    local_share: Option<Spanned<LocalShare>>,
    local_share_fallback: Option<Spanned<f64>>,
    near_cache: Option<Spanned<usize>>,
    max_keys: Option<Spanned<usize>>,
    prefix: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<String>>,
    engine: Option<Spanned<String>>,
    replicas_ack: Option<Spanned<u32>>,
    tls_ca: Option<Spanned<String>>,
    tls_cert: Option<Spanned<String>>,
    tls_key: Option<Spanned<String>>,
    tls_skip_hostname_verification: Option<bool>,
}

impl BackendSpec {
    /// The `[backend]` table over the defaults.
    pub(super) fn validate(self) -> Result<BackendConfig, Invalid> {
        let mut backend = BackendConfig::default();
        self.locate(&mut backend)?;
        if let Some(name) = self.sentinel_service {
            backend.sentinel_service = name.into_inner();
        }
        let fields = PolicyFields {
            policy: self.failure_policy.as_ref(),
            share: self.local_share.as_ref(),
            fallback: self.local_share_fallback.as_ref(),
        };
        if let Some(policy) = failure_policy(fields, "backend")? {
            backend.failure_policy = policy;
        }
        if let Some(n) = self.near_cache {
            backend.near_cache = n.into_inner();
        }
        if let Some(n) = self.max_keys {
            if *n.get_ref() == 0 {
                return Err(Invalid::new("backend.max_keys", n.span(), "must be at least 1"));
            }
            backend.max_keys = n.into_inner();
        }
        if let Some(n) = self.replicas_ack {
            backend.replicas_ack = n.into_inner();
        }
        if let Some(engine) = self.engine {
            backend.engine = engine.get_ref().parse().map_err(|_| {
                let message = format!("{:?} is not one of \"auto\", \"lua\", \"module\"", engine.get_ref());
                Invalid::new("backend.engine", engine.span(), message)
            })?;
        }
        if let Some(prefix) = self.prefix {
            if prefix.get_ref().contains(['{', '}']) {
                return Err(Invalid::new("backend.prefix", prefix.span(), "must not contain `{` or `}` (hash tags)"));
            }
            backend.prefix = prefix.into_inner();
        }
        if let Some(timeout) = self.timeout {
            let invalid = |m| Invalid::new("backend.timeout", timeout.span(), m);
            let t = parse_duration(timeout.get_ref()).map_err(invalid)?;
            if t < Duration::from_millis(1) || t > Duration::from_secs(60) {
                return Err(invalid("must be between 1ms and 60s".into()));
            }
            backend.timeout = t;
        }
        let path = |f: &Option<Spanned<String>>| f.as_ref().map(|f| f.get_ref().into());
        (backend.tls.ca, backend.tls.cert, backend.tls.key) =
            (path(&self.tls_ca), path(&self.tls_cert), path(&self.tls_key));
        backend.tls.skip_hostname_verification = self.tls_skip_hostname_verification.unwrap_or(false);
        let given = [&self.tls_ca, &self.tls_cert, &self.tls_key].into_iter().flatten().next();
        backend.check_tls().map_err(|m| Invalid::new("backend", given.map_or(0..0, Spanned::span), m))?;
        Ok(backend)
    }

    /// Where Redis is: at most one of `redis`, `redis_cluster` and `redis_sentinel`.
    fn locate(&self, backend: &mut BackendConfig) -> Result<(), Invalid> {
        if let Some(url) = &self.redis {
            check_redis_url(url.get_ref()).map_err(|m| Invalid::new("backend.redis", url.span(), m))?;
            backend.redis = Some(url.get_ref().clone());
        }
        if let Some(nodes) = &self.redis_cluster {
            backend.redis_cluster = redis_nodes(nodes, "backend.redis_cluster", "node")?;
            if backend.redis.is_some() {
                let message = "give either `redis` or `redis_cluster`";
                return Err(Invalid::new("backend.redis_cluster", nodes.span(), message));
            }
        }
        if let Some(nodes) = &self.redis_sentinel {
            backend.redis_sentinel = redis_nodes(nodes, "backend.redis_sentinel", "sentinel")?;
            if backend.redis.is_some() || !backend.redis_cluster.is_empty() {
                let message = "give one of `redis`, `redis_cluster`, `redis_sentinel`";
                return Err(Invalid::new("backend.redis_sentinel", nodes.span(), message));
            }
        }
        Ok(())
    }
}

/// A non-empty list of Redis URLs, each a `what` (`node`, `sentinel`).
fn redis_nodes(nodes: &Spanned<Vec<String>>, field: &str, what: &str) -> Result<Vec<String>, Invalid> {
    if nodes.get_ref().is_empty() {
        return Err(Invalid::new(field, nodes.span(), format!("list at least one {what}")));
    }
    for url in nodes.get_ref() {
        check_redis_url(url).map_err(|m| Invalid::new(field, nodes.span(), m))?;
    }
    Ok(nodes.get_ref().clone())
}
