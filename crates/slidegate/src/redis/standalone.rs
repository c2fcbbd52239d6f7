//! The backend over one standalone Redis: [`RedisBackend::connect`], on a
//! [`PipelinedConnection`].

use super::call::CONNECT_TIMEOUT;
use super::{PipelinedConnection, RedisBackend, RedisTls};
use crate::Error;

impl RedisBackend<PipelinedConnection> {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port[/db]`,
    /// `rediss://…` over TLS trusting the system's certificate store, or `unix:///path`) with
    /// one pipelined connection that connects again after a failure ([`PipelinedConnection`]),
    /// and loads the scripts.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_tls(url, &RedisTls::default()).await
    }

    /// As [`RedisBackend::connect`], a `rediss://` URL over TLS as `tls` sets it up.
    pub async fn connect_tls(url: &str, tls: &RedisTls) -> Result<Self, Error> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, PipelinedConnection::connect_tls(url, tls))
            .await
            .map_err(|_| Error::Timeout(CONNECT_TIMEOUT))??;
        let backend = Self::with_connection(conn);
        // Loading runs once, at start: it gets the connection's deadline, not a decision's.
        backend.clone().with_timeout(CONNECT_TIMEOUT).load_scripts().await?;
        Ok(backend)
    }
}
