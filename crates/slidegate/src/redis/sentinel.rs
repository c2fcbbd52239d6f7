//! The backend over a Sentinel-monitored master: [`RedisBackend::connect_sentinel`], on a
//! connection to the master that a Redis Sentinel group names, following failovers.
//!
//! redis-rs asks Sentinel for the master once per connection; nothing follows a failover. This
//! wrapper keeps one multiplexed connection to the current master and, when a call fails the way
//! a failover makes calls fail — the connection refused or dropped, or `READONLY` from an old
//! master that came back as a replica — asks Sentinel again and retries the call once on the new
//! master. The backend's deadline bounds all of it.

use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

use super::call::CONNECT_TIMEOUT;
use super::{RedisBackend, RedisTls};
use crate::Error;

/// The Redis backend over a Sentinel-monitored master ([`RedisBackend::connect_sentinel`]).
pub type RedisSentinelBackend = RedisBackend<SentinelConnection>;

impl RedisBackend<SentinelConnection> {
    /// Connects to the master of `service` as the sentinels at `sentinels` (`redis://host:26379`
    /// each) name it, and follows failovers: see [`SentinelConnection`].
    pub async fn connect_sentinel(sentinels: &[&str], service: &str) -> Result<Self, Error> {
        Self::connect_sentinel_tls(sentinels, service, &RedisTls::default()).await
    }

    /// As [`RedisBackend::connect_sentinel`], `rediss://` sentinels — and the master they
    /// name — over TLS as `tls` sets it up.
    pub async fn connect_sentinel_tls(sentinels: &[&str], service: &str, tls: &RedisTls) -> Result<Self, Error> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, SentinelConnection::connect_tls(sentinels, service, tls))
            .await
            .map_err(|_| Error::Timeout(CONNECT_TIMEOUT))??;
        let backend = Self::with_connection(conn);
        backend.clone().with_timeout(CONNECT_TIMEOUT).load_scripts().await?;
        Ok(backend)
    }
}

/// The master of a Sentinel-monitored group, rediscovered after failovers. Cheap to clone:
/// clones share the connection.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    master: Mutex<Option<MultiplexedConnection>>,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection").finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// Asks the sentinels at `sentinels` (`redis://host:26379` each) for the master of
    /// `service` and connects to it.
    pub async fn connect(sentinels: &[&str], service: &str) -> RedisResult<Self> {
        Self::connect_tls(sentinels, service, &RedisTls::default()).await
    }

    /// As [`SentinelConnection::connect`], `rediss://` sentinels and the master they name over
    /// TLS as `tls` sets it up.
    pub async fn connect_tls(sentinels: &[&str], service: &str, tls: &RedisTls) -> RedisResult<Self> {
        let client = tls.sentinel_client(sentinels, service)?;
        let conn =
            Self { inner: Arc::new(Inner { sentinel: tokio::sync::Mutex::new(client), master: Mutex::new(None) }) };
        conn.master().await?;
        Ok(conn)
    }

    /// The connection to the current master, asking Sentinel when there is none.
    async fn master(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(c) = self.inner.master.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Ok(c);
        }
        let mut sentinel = self.inner.sentinel.lock().await;
        // Another call may have reconnected while this one waited.
        if let Some(c) = self.inner.master.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Ok(c);
        }
        let c = sentinel.get_async_connection().await?;
        *self.inner.master.lock().unwrap_or_else(PoisonError::into_inner) = Some(c.clone());
        Ok(c)
    }

    fn forget(&self) {
        *self.inner.master.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Whether `e` is how a failover shows: the master gone, or demoted to a replica.
fn failed_over(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.master().await?.req_packed_command(cmd).await {
                Err(e) if failed_over(&e) => {
                    self.forget();
                    self.master().await?.req_packed_command(cmd).await
                }
                other => other,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.master().await?.req_packed_commands(pipeline, offset, count).await {
                Err(e) if failed_over(&e) => {
                    self.forget();
                    self.master().await?.req_packed_commands(pipeline, offset, count).await
                }
                other => other,
            }
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
