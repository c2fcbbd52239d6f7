//! The backend over a Redis Cluster: [`RedisBackend::connect_cluster`], on redis-rs' Cluster
//! client.

use std::time::Duration;

use super::call::CONNECT_TIMEOUT;
use super::{ClusterConnection, RedisBackend, RedisTls};
use crate::Error;

/// The Redis backend over a Redis Cluster ([`RedisBackend::connect_cluster`]).
pub type RedisClusterBackend = RedisBackend<ClusterConnection>;

/// How long the Cluster client waits for one node's answer before it treats the node as gone
/// and refreshes its view of the cluster. Without it, redis-rs left requests to a killed master
/// hanging for minutes (measured); the backend's own deadline still bounds every call.
const CLUSTER_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

impl RedisBackend<ClusterConnection> {
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
        let backend = Self::with_connection(conn).with_cluster_slot_check(true);
        backend.clone().with_timeout(CONNECT_TIMEOUT).load_scripts().await?;
        Ok(backend)
    }
}
