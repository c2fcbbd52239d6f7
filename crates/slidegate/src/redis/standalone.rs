//! The backend over one standalone Redis: [`RedisBackend::connect`], on a
//! [`PipelinedConnection`].

use super::{PipelinedConnection, RedisBackend};
use crate::Error;

impl RedisBackend<PipelinedConnection> {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port[/db]` or
    /// `unix:///path`) with one pipelined connection that connects again after a failure
    /// ([`PipelinedConnection`]), and loads the scripts.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::open(PipelinedConnection::connect(url)).await
    }
}
