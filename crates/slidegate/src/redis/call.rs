//! How every command reaches Redis: over a clone of the backend's connection and within the
//! call's deadline, a connection's own timeouts counting as the deadline missed.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue};

use super::RedisBackend;
use crate::Error;

/// How long connecting (and loading the scripts) may take: the constructors' deadline.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Answers `PING` within the deadline: is Redis reachable?
    pub async fn ping(&self) -> Result<(), Error> {
        let _: String = self.query(&redis::cmd("PING")).await?;
        Ok(())
    }

    /// Sends `cmd` and reads its reply as `T`, within the deadline.
    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        let mut conn = self.conn.clone();
        self.deadline(async move { Ok(cmd.query_async(&mut conn).await?) }).await
    }

    /// Runs `call` within the deadline.
    pub(super) async fn deadline<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let timeout = self.config.timeout;
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(Error::Timeout(timeout)),
            // The connection's own timeouts (its queue full, a node or a link gone silent) are
            // this call missing its deadline too.
            Ok(Err(Error::Redis(e))) if e.is_timeout() => Err(Error::Timeout(timeout)),
            Ok(answer) => answer,
        }
    }
}
