//! The backend over a Redis Cluster: [`RedisBackend::connect_cluster`], on redis-rs' Cluster
//! client, renewed when it stalls ([`RenewingClusterConnection`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::call::CONNECT_TIMEOUT;
use super::{ClusterConnection, RedisBackend, RedisTls};
use crate::Error;

/// The Redis backend over a Redis Cluster ([`RedisBackend::connect_cluster`]).
pub type RedisClusterBackend = RedisBackend<RenewingClusterConnection>;

/// How long the Cluster client waits for one node's answer before it treats the node as gone
/// and refreshes its view of the cluster. Without it, redis-rs left requests to a killed master
/// hanging for minutes (measured); the backend's own deadline still bounds every call.
const CLUSTER_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long calls may go unanswered (each cut by its deadline or timed out) before the Cluster
/// connection is replaced by a new one; also the least time between two replacements.
pub const CLUSTER_STALL_BEFORE_RENEWAL: Duration = Duration::from_secs(2);

impl RedisBackend<RenewingClusterConnection> {
    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port` each), and
    /// loads the scripts on every master. Redirections (`MOVED`, `ASK`), topology refreshes and
    /// failovers are followed by the client; every call keeps its deadline. Multi-limit checks
    /// must name keys of one slot ([`crate::hash_tag`]); others fail early with
    /// [`Error::CrossSlot`].
    pub async fn connect_cluster(urls: &[&str]) -> Result<Self, Error> {
        Self::connect_cluster_tls(urls, &RedisTls::default()).await
    }

    /// As [`RedisBackend::connect_cluster`], `rediss://` nodes over TLS as `tls` sets it up —
    /// every node, those found after `MOVED` or a failover too.
    pub async fn connect_cluster_tls(urls: &[&str], tls: &RedisTls) -> Result<Self, Error> {
        let client = tls
            .cluster_builder(urls)?
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(CLUSTER_RESPONSE_TIMEOUT)
            .overall_response_timeout(None)
            .retries(2)
            .build()?;
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection())
            .await
            .map_err(|_| Error::Timeout(CONNECT_TIMEOUT))??;
        let conn = RenewingClusterConnection::new(client, conn);
        let backend = Self::with_connection(conn).with_cluster_slot_check(true);
        backend.clone().with_timeout(CONNECT_TIMEOUT).load_scripts().await?;
        Ok(backend)
    }
}

/// redis-rs' Cluster connection, replaced by a new one from the same client once calls have
/// gone unanswered for [`CLUSTER_STALL_BEFORE_RENEWAL`]. Cheap to clone: clones share it.
///
/// Why: when a master dies under concurrent load, redis-rs' Cluster connection can stop
/// answering for good. Its slot refresh waits for the write half of the lock over its node
/// map, while requests that hold the read half are not polled until the refresh ends (seen
/// with 64 concurrent callers after a master's `SIGKILL`: the refresh began and never ended,
/// and every call timed out, minutes after the replica was promoted). A new connection reads
/// the cluster's map afresh. Calls already on the old connection keep it until they end.
#[derive(Clone)]
pub struct RenewingClusterConnection {
    inner: Arc<Renewal>,
}

struct Renewal {
    client: ClusterClient,
    current: Mutex<ClusterConnection>,
    started: Instant,
    /// Milliseconds from `started` to the last answer (any reply, an error one too) or to the
    /// end of the last renewal.
    last_answer_ms: AtomicU64,
    renewing: AtomicBool,
}

impl std::fmt::Debug for RenewingClusterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewingClusterConnection").finish_non_exhaustive()
    }
}

impl RenewingClusterConnection {
    /// `conn`, renewed from `client` when it stalls.
    pub fn new(client: ClusterClient, conn: ClusterConnection) -> Self {
        let inner = Renewal {
            client,
            current: Mutex::new(conn),
            started: Instant::now(),
            last_answer_ms: AtomicU64::new(0),
            renewing: AtomicBool::new(false),
        };
        Self { inner: Arc::new(inner) }
    }

    fn current(&self) -> ClusterConnection {
        self.inner.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Runs `call`, noting whether it was answered; a call dropped before its answer (its
    /// deadline passed) counts as unanswered.
    async fn watched<T>(&self, call: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
        let mut watch = Watch { conn: self, answered: false };
        let answer = call.await;
        if !matches!(&answer, Err(e) if e.is_timeout()) {
            watch.answered = true;
            self.inner.last_answer_ms.store(self.inner.elapsed_ms(), Ordering::Relaxed);
        }
        answer
    }

    /// A call went unanswered: renews the connection in the background when none was
    /// answered for [`CLUSTER_STALL_BEFORE_RENEWAL`] and no renewal is under way.
    fn unanswered(&self) {
        let inner = &self.inner;
        let quiet = inner.elapsed_ms().saturating_sub(inner.last_answer_ms.load(Ordering::Relaxed));
        if u128::from(quiet) < CLUSTER_STALL_BEFORE_RENEWAL.as_millis() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if inner.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(inner);
        runtime.spawn(async move {
            // A cluster that cannot be reached keeps its old connection, to try again later.
            if let Ok(Ok(conn)) = tokio::time::timeout(CONNECT_TIMEOUT, inner.client.get_async_connection()).await {
                *inner.current.lock().unwrap_or_else(PoisonError::into_inner) = conn;
            }
            inner.last_answer_ms.store(inner.elapsed_ms(), Ordering::Relaxed);
            inner.renewing.store(false, Ordering::Release);
        });
    }
}

impl Renewal {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Reports its call as unanswered when dropped before the answer came.
struct Watch<'a> {
    conn: &'a RenewingClusterConnection,
    answered: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.conn.unanswered();
        }
    }
}

impl ConnectionLike for RenewingClusterConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut conn = self.current();
        Box::pin(async move { self.watched(conn.req_packed_command(cmd)).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut conn = self.current();
        Box::pin(async move { self.watched(conn.req_packed_commands(pipeline, offset, count)).await })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
