//! Where the shared rules and overrides live in Redis, and the scripts that change them.
//!
//! Keys, all under the backend's prefix and one hash tag, so that a Redis Cluster holds them in
//! one slot and one script changes them together (the tag starts with `{`, which no rule name,
//! inline key or Envoy descriptor key does, so they never meet a limiter's key):
//!
//! - `<prefix>:{rules}:state` — a hash: `version`, one counter for every change; `rules`, the
//!   TOML document; `rules_version`, `pushed_at_ms`, `pushed_from`.
//! - `<prefix>:{rules}:overrides` — a hash: `<len(rule)>:<rule>:<key>` → the override as JSON.
//! - `<prefix>:{rules}:expiries` — a sorted set: the same fields → the Unix ms they lapse at.
//!
//! - `<prefix>:{rules}:fleet` — beside them, not the store's: each instance's heartbeat, while
//!   some failure policy has `local_share = "auto"` ([`slidegate::redis::fleet_key`]).
//!
//! Every change bumps `version` and is published, in the same script, on the channel
//! `<prefix>:{rules}:changes` as `{"v": version, "op": "rules" | "set" | "del" | "lapse",
//! "o": override}`. Plain `PUBLISH` reaches the subscribers of every node of a Cluster.
//!
//! Reading everything ([`Store::snapshot`]) is not one call: `HGETALL` of 100,000 overrides
//! held Redis for 0.2 s (0.4 s inside a script), so it reads the version, then the overrides
//! [`SCAN_COUNT`] at a time (about a millisecond of Redis each). What changed meanwhile is
//! announced with a later version, and each notice carries the whole override, so applying
//! the notices after the version read puts every key where Redis has it.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, PubSub};
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};
use slidegate::RedisTls;
use slidegate::redis::{PipelinedConnection, RenewingClusterConnection, SentinelConnection};

use super::document::MAX_DOCUMENT_BYTES;
use crate::config::BackendConfig;

/// How long one call to the store may take.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many overrides one `HSCAN` of a snapshot asks for.
pub const SCAN_COUNT: usize = 1_000;

/// Why the store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis failed or refused the call.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer in time.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection (the subscription to changes) ended, or no node takes one.
    #[error("{0}")]
    Lost(&'static str),
    /// Redis answered something the scripts never answer.
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    /// TLS to Redis cannot be set up as configured.
    #[error("{0}")]
    Tls(#[from] slidegate::Error),
}

impl StoreError {
    /// What `/readyz` may say of this failure: its kind, never Redis' own text.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis failed or refused the call",
            Self::Timeout(_) => "redis did not answer in time",
            Self::Lost(_) => "redis cannot be reached",
            Self::Reply(_) => "unexpected reply from redis",
            Self::Tls(_) => "TLS to redis cannot be set up",
        }
    }
}

/// The rules document as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRules {
    /// The version it was pushed under.
    pub version: u64,
    /// The TOML text, or why it cannot be read (over [`MAX_DOCUMENT_BYTES`], not UTF-8): such
    /// a document is never sent whole.
    pub text: Result<String, String>,
    /// When it was pushed (Unix ms).
    pub pushed_at_ms: u64,
    /// The pushing client's address.
    pub pushed_from: String,
}

/// Everything an instance applies: as of `version` or later (the changes after `version`
/// are announced).
#[derive(Debug)]
pub struct Snapshot {
    /// The version read before the rest (0: nothing was ever stored).
    pub version: u64,
    /// The rules, when pushed.
    pub rules: Option<StoredRules>,
    /// The overrides read, `(field, JSON)`: at most the `most` asked for.
    pub overrides: Vec<(String, String)>,
    /// How many more there were.
    pub left_out: usize,
}

/// What setting an override did.
#[derive(Debug)]
pub enum SetOutcome {
    /// Stored under `version`; the override it replaced, as JSON.
    Stored {
        /// The change's version.
        version: u64,
        /// The previous override of the key, if any.
        previous: Option<String>,
    },
    /// Refused: `max` overrides are stored and the key had none.
    Full,
}

/// A connection to the Redis (or Cluster, or Sentinel master) of the store.
#[derive(Clone)]
enum Connection {
    Single(PipelinedConnection),
    Cluster(RenewingClusterConnection),
    Sentinel(SentinelConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Sentinel(c) => c.get_db(),
        }
    }
}

/// Where to subscribe to the channel: any node of a Cluster hears every `PUBLISH`; a Sentinel
/// group's master is asked of the sentinels at each subscription.
#[derive(Debug, Clone)]
enum Listen {
    Nodes(Vec<String>),
    Sentinel { sentinels: Vec<String>, service: String },
}

/// The shared rules and overrides in one Redis deployment, under one prefix.
#[derive(Clone)]
pub struct Store {
    conn: Connection,
    listen: Listen,
    /// TLS as the backend sets it up, for each subscription's connection.
    tls: RedisTls,
    state: String,
    overrides: String,
    expiries: String,
    channel: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("state", &self.state).finish_non_exhaustive()
    }
}

/// The name of the store's `part` under `prefix`, as the backend names keys.
fn name(prefix: &str, part: &str) -> String {
    if prefix.is_empty() { format!("{{rules}}:{part}") } else { format!("{prefix}:{{rules}}:{part}") }
}

/// The hash field of the override of `key` under `rule` (as the admin route names them):
/// length-prefixed, so no two pairs share one.
pub fn field(rule: &str, key: &str) -> String {
    format!("{}:{rule}:{key}", rule.len())
}

/// A shared-rules script: `unwritten.lua` (the checks made before anything is written), then
/// the script's own text.
macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| Script::new(concat!(include_str!("unwritten.lua"), include_str!($file))))
    };
}

static PUSH_RULES: LazyLock<Script> = script!("push_rules.lua");
static SET_OVERRIDE: LazyLock<Script> = script!("set_override.lua");
static REMOVE_OVERRIDES: LazyLock<Script> = script!("remove_overrides.lua");
// Neither changes the rules or overrides: no checks before them.
static READ_RULES: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("read_rules.lua")));

impl Store {
    fn new(conn: Connection, listen: Listen, tls: RedisTls, prefix: &str) -> Self {
        Self {
            conn,
            listen,
            tls,
            state: name(prefix, "state"),
            overrides: name(prefix, "overrides"),
            expiries: name(prefix, "expiries"),
            channel: name(prefix, "changes"),
        }
    }

    /// The store in the Redis that `backend` names, under its prefix, over TLS as it sets it
    /// up; `None` for the memory backend.
    pub async fn for_backend(backend: &BackendConfig) -> Result<Option<Self>, StoreError> {
        let prefix = &backend.prefix;
        let tls = if backend.tls.is_set() { RedisTls::load(&backend.tls)? } else { RedisTls::default() };
        if !backend.redis_cluster.is_empty() {
            let conn = cluster(&backend.redis_cluster, &tls).await?;
            return Ok(Some(Self::new(conn, Listen::Nodes(backend.redis_cluster.clone()), tls, prefix)));
        }
        if !backend.redis_sentinel.is_empty() {
            let sentinels: Vec<&str> = backend.redis_sentinel.iter().map(String::as_str).collect();
            let conn =
                within(STORE_TIMEOUT, SentinelConnection::connect_tls(&sentinels, &backend.sentinel_service, &tls))
                    .await?;
            let listen = Listen::Sentinel {
                sentinels: backend.redis_sentinel.clone(),
                service: backend.sentinel_service.clone(),
            };
            return Ok(Some(Self::new(Connection::Sentinel(conn), listen, tls, prefix)));
        }
        let Some(url) = &backend.redis else { return Ok(None) };
        let conn = within(STORE_TIMEOUT, PipelinedConnection::connect_tls(url, &tls)).await?;
        Ok(Some(Self::new(Connection::Single(conn), Listen::Nodes(vec![url.clone()]), tls, prefix)))
    }

    /// The store in the Redis at `url` — a standalone server or any node of a Cluster, which
    /// is then followed to the node that holds the store's slot. A `rediss://` URL trusts the
    /// system's certificate store.
    pub async fn at(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let tls = RedisTls::default();
        let single = within(STORE_TIMEOUT, PipelinedConnection::connect_tls(url, &tls)).await?;
        let mut probe = Connection::Single(single.clone());
        let info: String = within(STORE_TIMEOUT, redis::cmd("INFO").arg("cluster").query_async(&mut probe)).await?;
        let nodes = vec![url.to_owned()];
        let conn =
            if info.contains("cluster_enabled:1") { cluster(&nodes, &tls).await? } else { Connection::Single(single) };
        Ok(Self::new(conn, Listen::Nodes(nodes), tls, prefix))
    }

    /// This client's address as Redis sees it (`CLIENT INFO`), for the audit trail of a push.
    pub async fn client_address(&self) -> Result<String, StoreError> {
        let info: String =
            within(STORE_TIMEOUT, redis::cmd("CLIENT").arg("INFO").query_async(&mut self.conn.clone())).await?;
        let addr = info.split(' ').find_map(|f| f.strip_prefix("addr=")).unwrap_or("unknown");
        // `ip:port`: the port is this one connection's.
        Ok(addr.rsplit_once(':').map_or(addr, |(ip, _)| ip).to_owned())
    }

    /// Stores `text` as the rules of every instance; returns its version and the rules it
    /// replaced.
    pub async fn push_rules(
        &self,
        text: &str,
        pushed_at_ms: u64,
        from: &str,
    ) -> Result<(u64, Option<StoredRules>), StoreError> {
        let mut invocation = PUSH_RULES.key(&self.state);
        invocation.arg(text).arg(pushed_at_ms).arg(from).arg(&self.channel);
        let (version, previous, previous_version, at, by): (
            u64,
            Option<String>,
            Option<u64>,
            Option<u64>,
            Option<String>,
        ) = within(STORE_TIMEOUT, invocation.invoke_async(&mut self.conn.clone())).await?;
        let previous = previous.map(|text| StoredRules {
            version: previous_version.unwrap_or(0),
            text: Ok(text),
            pushed_at_ms: at.unwrap_or(0),
            pushed_from: by.unwrap_or_default(),
        });
        Ok((version, previous))
    }

    /// The rules stored now, if any were pushed.
    pub async fn rules(&self) -> Result<Option<StoredRules>, StoreError> {
        let mut invocation = READ_RULES.key(&self.state);
        invocation.arg(MAX_DOCUMENT_BYTES);
        let (text, version, at, by): (Value, Option<u64>, Option<u64>, Option<String>) =
            within(STORE_TIMEOUT, invocation.invoke_async(&mut self.conn.clone())).await?;
        let text = match text {
            Value::Nil => return Ok(None),
            Value::Int(len) => Err(format!("{len} bytes, over {MAX_DOCUMENT_BYTES}")),
            Value::BulkString(bytes) => String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned()),
            other => return Err(StoreError::Reply(format!("{other:?}"))),
        };
        Ok(Some(StoredRules {
            version: version.unwrap_or(0),
            text,
            pushed_at_ms: at.unwrap_or(0),
            pushed_from: by.unwrap_or_default(),
        }))
    }

    /// The version of the latest change (0: none yet).
    pub async fn version(&self) -> Result<u64, StoreError> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.state).arg("version");
        let version: Option<u64> = within(STORE_TIMEOUT, cmd.query_async(&mut self.conn.clone())).await?;
        Ok(version.unwrap_or(0))
    }

    /// The version, then the rules and the overrides — at most `most` of them, the others
    /// counted (a key `HSCAN` returns twice is counted twice).
    pub async fn snapshot(&self, most: usize) -> Result<Snapshot, StoreError> {
        let version = self.version().await?;
        let (mut overrides, mut left_out, mut cursor) = (Vec::new(), 0, 0_u64);
        loop {
            let mut scan = redis::cmd("HSCAN");
            scan.arg(&self.overrides).arg(cursor).arg("COUNT").arg(SCAN_COUNT);
            let (next, flat): (u64, Vec<String>) =
                within(STORE_TIMEOUT, scan.query_async(&mut self.conn.clone())).await?;
            let mut pairs = flat.into_iter();
            while let (Some(field), Some(json)) = (pairs.next(), pairs.next()) {
                if overrides.len() < most {
                    overrides.push((field, json));
                } else {
                    left_out += 1;
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(Snapshot { version, rules: self.rules().await?, overrides, left_out })
    }

    /// Stores an override (`json`) under `field`, lapsing at `expires_at_ms`, unless `max`
    /// overrides are stored and `field` is new.
    pub async fn set_override(
        &self,
        field: &str,
        json: &str,
        expires_at_ms: Option<u64>,
        max: usize,
    ) -> Result<SetOutcome, StoreError> {
        let mut invocation = SET_OVERRIDE.key(&self.state);
        invocation.key(&self.overrides).key(&self.expiries);
        let expires = expires_at_ms.map(|t| t.to_string()).unwrap_or_default();
        invocation.arg(field).arg(json).arg(expires).arg(max).arg(&self.channel);
        let (version, previous): (u64, Option<String>) =
            within(STORE_TIMEOUT, invocation.invoke_async(&mut self.conn.clone())).await?;
        Ok(if version == 0 { SetOutcome::Full } else { SetOutcome::Stored { version, previous } })
    }

    /// Removes the override under `field`: its version and JSON, `None` when there was none.
    pub async fn delete_override(&self, field: &str) -> Result<Option<(u64, String)>, StoreError> {
        Ok(self.remove(&["del", field, ""]).await?.pop())
    }

    /// Removes at most `most` overrides lapsed at `now_ms`: each one's version and JSON.
    pub async fn lapse(&self, now_ms: u64, most: usize) -> Result<Vec<(u64, String)>, StoreError> {
        self.remove(&["lapse", &now_ms.to_string(), &most.to_string()]).await
    }

    async fn remove(&self, args: &[&str]) -> Result<Vec<(u64, String)>, StoreError> {
        let mut invocation = REMOVE_OVERRIDES.key(&self.state);
        invocation.key(&self.overrides).key(&self.expiries).arg(&self.channel);
        for a in args {
            invocation.arg(*a);
        }
        within(STORE_TIMEOUT, invocation.invoke_async(&mut self.conn.clone())).await
    }

    /// A subscription to the channel of changes.
    pub async fn subscribe(&self) -> Result<PubSub, StoreError> {
        let clients = match &self.listen {
            Listen::Nodes(urls) => urls.iter().map(|u| self.tls.client(u)).collect::<Result<Vec<_>, _>>()?,
            Listen::Sentinel { sentinels, service } => {
                let sentinels: Vec<&str> = sentinels.iter().map(String::as_str).collect();
                let mut sentinel = self.tls.sentinel_client(&sentinels, service)?;
                vec![within(STORE_TIMEOUT, sentinel.async_get_client()).await?]
            }
        };
        let mut last = None;
        // Any node of a Cluster will do: try them in turn.
        for client in clients {
            let subscribed = within(STORE_TIMEOUT, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&self.channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            })
            .await;
            match subscribed {
                Ok(pubsub) => return Ok(pubsub),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::Lost("no node to subscribe to")))
    }
}

/// A Cluster connection through `nodes`, over TLS as `tls` sets it up.
async fn cluster(nodes: &[String], tls: &RedisTls) -> Result<Connection, StoreError> {
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let client =
        tls.cluster_builder(&nodes)?.connection_timeout(STORE_TIMEOUT).response_timeout(STORE_TIMEOUT).build()?;
    // Renewed when it stalls, as the backend's is: redis-rs' can stop answering after a
    // master's death (see `RenewingClusterConnection`).
    let conn = within(STORE_TIMEOUT, client.get_async_connection()).await?;
    Ok(Connection::Cluster(RenewingClusterConnection::new(client, conn)))
}

/// `call`, failed with [`StoreError::Timeout`] past `limit`.
async fn within<T, E: Into<StoreError>>(
    limit: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, call).await.map_err(|_| StoreError::Timeout(limit))?.map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keys_share_one_cluster_slot_and_meet_no_limiter_key() {
        for prefix in ["slidegate", "", "rl"] {
            let mut names = ["state", "overrides", "expiries"].map(|part| name(prefix, part)).to_vec();
            names.push(slidegate::redis::fleet_key(prefix));
            let slot = slidegate::key_slot(&names[0]);
            assert!(names.iter().all(|n| slidegate::key_slot(n) == slot), "{names:?}");
            // Limiter keys are `<prefix>:<rule|inline|digits>:...`: none starts with `{`.
            assert!(names.iter().all(|n| n.strip_prefix(prefix).unwrap_or(n).trim_start_matches(':').starts_with('{')));
        }
        assert_ne!(field("a:b", "c"), field("a", "b:c"));
        assert_eq!(field("envoy:edge", "user=alice"), "10:envoy:edge:user=alice");
    }
}
