//! The backend over one standalone Redis: [`RedisBackend::connect`], on a
//! [`PipelinedConnection`].

use super::call::CONNECT_TIMEOUT;
use super::{PipelinedConnection, RedisBackend};
use crate::Error;

impl RedisBackend<PipelinedConnection> {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port[/db]` or
    /// `unix:///path`) with one pipelined connection that connects again after a failure
    /// ([`PipelinedConnection`]), and loads the scripts.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, PipelinedConnection::connect(url))
            .await
            .map_err(|_| Error::Timeout(CONNECT_TIMEOUT))??;
        let backend = Self::with_connection(conn);
        // Loading runs once, at start: it gets the connection's deadline, not a decision's.
        backend.clone().with_timeout(CONNECT_TIMEOUT).load_scripts().await?;
        Ok(backend)
    }
}
