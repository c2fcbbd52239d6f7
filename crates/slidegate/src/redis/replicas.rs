//! `WAIT` after admissions ([`RedisBackend::with_replicas_ack`]): an admission is answered only
//! once `N` replicas hold it, so that a failover to one of them does not lose it.
//!
//! What `WAIT n t` guarantees is per connection: it returns how many replicas acknowledged
//! every write the connection sent before it. The backend's connection is shared and pipelined
//! (one connection to the master, standalone or under Sentinel; one per master on a Cluster),
//! and the `WAIT` is sent once the admission's reply has arrived, so it follows that admission
//! on the connection and covers it, along with every write other callers sent before it: an
//! acknowledgement may cover more than its caller asked, never less — on the connection the
//! admission went over. One that failed and was replaced in between has written nothing, and a
//! `WAIT` on it would be answered at once: so the `WAIT` follows a write of its own in one
//! pipeline (`SET` of [`RedisBackend::ack_key`]). A master's replication stream is one, in
//! order, so replicas that hold that write hold every admission answered before it, whichever
//! connection carried them. (On a Cluster, where redis-rs sends `WAIT` to every master, no write
//! precedes it.) What it cannot do is make the promoted replica one of the `N`: with more
//! replicas than `N`, Sentinel or the Cluster may promote one that had not acknowledged yet.
//!
//! Admissions share their `WAIT`s, as a database's group commit shares a flush: each one
//! answered joins the queue of a task of the backend's that sends one `WAIT` for all of those
//! waiting and, while it waits, gathers the next batch; with many calls in flight a `WAIT`
//! covers many admissions instead of each of them holding the connection in turn.
//!
//! While a `WAIT` waits, Redis serves nothing else of that connection: every call pipelined
//! behind it waits too. Its timeout is half of what is left of the deadline of its batch's
//! earliest call: an admission and its `WAIT` take one deadline at most, the bound the operator
//! set for any call, and the other half is Redis' margin, which times a blocked `WAIT` out on
//! its event loop's next pass, up to `1 / hz` late (10 ms at `hz 100`; at the default `hz 10`,
//! 100 ms, past a 50 ms deadline). A replica that acknowledges within that half counts, so one
//! held up for a moment (its own fork, a busy machine) fails nothing; one that does not is a
//! backend failure, [`Error::ReplicasAck`] (however the wait ends: past the deadline, its connection
//! lost): the failure policy answers the caller and the circuit breaker counts it, so a
//! lost replica opens the circuit instead of holding every call behind one `WAIT` after
//! another. The admission itself stays recorded on the master: the key is charged for a
//! request its caller saw answered by the policy, an error towards fewer admissions, never
//! more. On a Cluster, redis-rs sends `WAIT` to every master and keeps the smallest count, so
//! each admission waits for the slowest master's replicas.
//!
//! A denial writes nothing a failover could lose, and is answered without a `WAIT`.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use redis::aio::ConnectionLike;
use tokio::sync::{mpsc, oneshot};

use super::RedisBackend;
use crate::Error;

/// The most admissions waiting for the backend's next `WAIT`; past it an admission waits for
/// room, within its deadline.
pub const MAX_WAITING_FOR_REPLICAS: usize = 4096;

/// The queue of the task that sends the backend's `WAIT`s, started at the first admission that
/// waits (on the runtime of that call; again on another's if that one has ended).
#[derive(Default)]
pub(super) struct Acks {
    queue: Mutex<Option<mpsc::Sender<Waiter>>>,
}

/// An admission answered by Redis, waiting for `wanted` replicas until `deadline`.
struct Waiter {
    wanted: u32,
    deadline: tokio::time::Instant,
    acked: oneshot::Sender<Result<u64, Error>>,
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Answers each admission only once `replicas` replicas acknowledged it (`WAIT replicas
    /// timeout`, half of what is left of the call's deadline, one `WAIT` for the admissions
    /// answered meanwhile); fewer fails the call with [`Error::ReplicasAck`], a backend failure
    /// the failure policy answers. `0`, the default, sends no `WAIT`. What it guarantees on a
    /// shared connection, and what it costs: see the module's documentation in `replicas.rs`.
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
    /// [`RedisBackend::with_replicas_ack`] asks for replicas, after a `WAIT` sent once it was
    /// answered that they acknowledged — within what is left of the deadline of the call that
    /// began at `started`, so that an admission waited for still takes one deadline at most.
    pub(super) async fn acknowledged<T>(
        &self,
        started: Instant,
        answer: Result<T, Error>,
        admitted: fn(&T) -> bool,
    ) -> Result<T, Error> {
        let wanted = self.config.replicas_ack;
        match answer {
            Ok(decision) if wanted > 0 && admitted(&decision) => {
                let left = self.config.timeout.saturating_sub(started.elapsed());
                let (acked, answered) = oneshot::channel();
                let waiter = Waiter { wanted, deadline: tokio::time::Instant::now() + left, acked };
                let waited = async {
                    self.ack_queue().send(waiter).await.ok()?;
                    answered.await.ok()?.ok()
                };
                // However the wait ends (missed, its connection lost), the master made the
                // admission: the caller hears that too few replicas acknowledged it, never that
                // nothing was written, so that nothing sends the write again.
                let acked = tokio::time::timeout(left, waited).await.ok().flatten().unwrap_or(0);
                if acked < u64::from(wanted) {
                    return Err(Error::ReplicasAck { wanted, acked });
                }
                Ok(decision)
            }
            other => other,
        }
    }

    /// The `WAIT` task's queue, the task started if none runs.
    fn ack_queue(&self) -> mpsc::Sender<Waiter> {
        let mut queue = self.acks.queue.lock().unwrap_or_else(PoisonError::into_inner);
        match queue.as_ref() {
            Some(q) if !q.is_closed() => q.clone(),
            _ => {
                let (q, waiting) = mpsc::channel(MAX_WAITING_FOR_REPLICAS);
                // The task holds the connection, not the backend: it ends with the last backend.
                let marker = (!self.config.one_slot).then(|| self.ack_key());
                tokio::spawn(send_waits(self.conn.clone(), marker, waiting));
                queue.insert(q).clone()
            }
        }
    }
}

/// How long the key a `WAIT` writes first lasts: it holds nothing anyone reads.
const ACK_KEY_TTL_MS: u64 = 60_000;

/// Sends one `WAIT` for every batch of admissions waiting (after a write to `marker`, when
/// given), until no backend is left to send any.
async fn send_waits<C: ConnectionLike + Send>(
    mut conn: C,
    marker: Option<String>,
    mut waiting: mpsc::Receiver<Waiter>,
) {
    let mut batch = Vec::new();
    while waiting.recv_many(&mut batch, MAX_WAITING_FOR_REPLICAS).await > 0 {
        // A caller past its deadline has gone.
        batch.retain(|w: &Waiter| !w.acked.is_closed());
        let (Some(wanted), Some(deadline)) =
            (batch.iter().map(|w| w.wanted).max(), batch.iter().map(|w| w.deadline).min())
        else {
            continue;
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // Whole milliseconds, at least one: `WAIT n 0` would wait for ever.
        let timeout = u64::try_from((left / 2).as_millis().max(1)).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        if let Some(key) = &marker {
            pipe.cmd("SET").arg(key).arg(1).arg("PX").arg(ACK_KEY_TTL_MS).ignore();
        }
        pipe.cmd("WAIT").arg(wanted).arg(timeout);
        // A connection lost is the backend failing; Redis ending or refusing the `WAIT` (a
        // master demoted to replica: "UNBLOCKED", "WAIT cannot be used with replica
        // instances") is the admissions not acknowledged: a failure too, for the policy.
        let acked = match tokio::time::timeout(left, pipe.query_async::<(u64,)>(&mut conn)).await {
            Ok(Ok((acked,))) => Ok(acked),
            Ok(Err(e)) if !e.is_timeout() && (e.is_io_error() || e.is_connection_dropped()) => Err(e),
            Ok(Err(e)) if !e.is_timeout() => Ok(0),
            // Missed: its callers hear of it as their deadline missed.
            _ => {
                batch.clear();
                continue;
            }
        };
        for w in batch.drain(..) {
            let _ = w.acked.send(acked.clone().map_err(Error::Redis));
        }
    }
}
