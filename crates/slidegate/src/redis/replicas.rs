//! `WAIT` after each admission ([`RedisBackend::with_replicas_ack`]): an admission is answered
//! only once `N` replicas hold it, so that a failover to one of them does not lose it.
//!
//! What `WAIT n t` guarantees is per connection: it returns how many replicas acknowledged
//! every write the connection sent before it. The backend's connection is shared and pipelined
//! (one connection to the master, standalone or under Sentinel; one per master on a Cluster),
//! and the `WAIT` is sent once the admission's reply has arrived, so it follows that admission
//! on the connection and covers it, along with every write other callers sent before it: an
//! acknowledgement may cover more than its caller asked, never less. What it cannot do is
//! make the promoted replica one of the `N`: with more replicas than `N`, Sentinel or the
//! Cluster may promote one that had not acknowledged yet.
//!
//! While a `WAIT` waits, Redis serves nothing else of that connection: every call pipelined
//! behind it waits too. Its timeout is half of what is left of the call's deadline: an
//! admission and its `WAIT` take one deadline at most, the bound the operator set for any call,
//! and the other half is Redis' margin, which times a blocked `WAIT` out on its event loop's
//! next pass, up to `1 / hz` late (10 ms at `hz 100`; at the default `hz 10`, 100 ms, past a
//! 50 ms deadline). A replica that acknowledges within that half counts, so one held up for a
//! moment (its own fork, a busy machine) fails nothing; one that does not is a backend
//! failure, [`Error::ReplicasAck`] (or [`Error::Timeout`] when Redis answers past the
//! deadline): the failure policy answers the caller and the circuit breaker counts it, so a
//! lost replica opens the circuit instead of holding every call behind one `WAIT` after
//! another. The admission itself stays recorded on the master: the key is charged for a
//! request its caller saw answered by the policy, an error towards fewer admissions, never
//! more. On a Cluster, redis-rs sends `WAIT` to every master and keeps the smallest count, so
//! each admission waits for the slowest master's replicas.
//!
//! A denial writes nothing a failover could lose, and is answered without a `WAIT`.

use std::time::Instant;

use redis::aio::ConnectionLike;

use super::RedisBackend;
use crate::Error;

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Answers each admission only once `replicas` replicas acknowledged it (`WAIT replicas
    /// timeout`, half of what is left of the call's deadline); fewer fails the call with
    /// [`Error::ReplicasAck`], a backend failure the failure policy answers. `0`, the default,
    /// sends no `WAIT`. What it guarantees on a shared connection, and what it costs: see the
    /// module's documentation in `replicas.rs`.
    #[must_use]
    pub fn with_replicas_ack(mut self, replicas: u32) -> Self {
        std::sync::Arc::make_mut(&mut self.config).replicas_ack = replicas;
        self
    }

    /// The replicas each admission waits for ([`RedisBackend::with_replicas_ack`]).
    pub fn replicas_ack(&self) -> u32 {
        self.config.replicas_ack
    }

    /// Passes `answer` on once the replicas hold it: when it is an admission (`admitted`) and
    /// [`RedisBackend::with_replicas_ack`] asks for replicas, after a `WAIT` that they
    /// acknowledged — within what is left of the deadline of the call that began at `started`,
    /// so that an admission waited for still takes one deadline at most.
    pub(super) async fn acknowledged<T>(
        &self,
        started: Instant,
        answer: Result<T, Error>,
        admitted: fn(&T) -> bool,
    ) -> Result<T, Error> {
        let wanted = self.config.replicas_ack;
        match answer {
            Ok(decision) if wanted > 0 && admitted(&decision) => {
                let deadline = self.config.timeout;
                let left = deadline.saturating_sub(started.elapsed());
                // Whole milliseconds, at least one: `WAIT n 0` would wait for ever.
                let timeout = u64::try_from((left / 2).as_millis().max(1)).unwrap_or(u64::MAX);
                let mut cmd = redis::cmd("WAIT");
                cmd.arg(wanted).arg(timeout);
                let acked: u64 =
                    tokio::time::timeout(left, self.query(&cmd)).await.map_err(|_| Error::Timeout(deadline))??;
                if acked < u64::from(wanted) {
                    return Err(Error::ReplicasAck { wanted, acked });
                }
                Ok(decision)
            }
            other => other,
        }
    }
}
