//! The Redis backend: one key per limited key and algorithm, one atomic Lua script per decision.
//!
//! Scripts live beside this file, each opening with its KEYS/ARGV contract: `sliding_log.lua`
//! (one sliding-log key without warm-up, the hot path), `one_key.lua` (one fixed-window or GCRA
//! key without warm-up), `sliding_window.lua` (one sliding-window-counter key without warm-up),
//! `check.lua` (every algorithm, warm-up, one key or an atomic group, on the same keys and
//! fields, at about twice the one-key scripts' work), `inspect.lua` and `writable.lua` (a
//! write-back's probe: it does nothing, and Redis holds it as it holds writes, on either
//! engine: see [`Backend::accepts_writes`]). They run by `EVALSHA`;
//! when Redis answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`) the same call
//! is sent once more as `EVAL` with the body, which also puts the script back in Redis' cache.
//! Callers never see that error.
//!
//! When the server has slidegate's module loaded (`crates/slidegate-module`), the same
//! decisions are made by its `SLIDEGATE.CHECK` and `SLIDEGATE.INSPECT` commands instead, on the
//! same keys, at a fraction of the CPU: see [`RedisEngine`].

// Layout: this file holds `RedisBackend` and its `Backend` impl, which picks the command that
// answers each call. Around it:
// - `config.rs`: the settings and builder methods, and the Redis key of a limited key;
// - `call.rs`: every command sent within the call's deadline, and the constructors' deadline;
// - `engine.rs`: module or Lua scripts, chosen, detected and fallen back from;
// - `scripts.rs`: the Lua scripts, their registry and one method per deciding script;
// - `module.rs`: the module's two commands;
// - `wire.rs`: the arguments of those commands and the parsing of their replies (no I/O);
// - `replicas.rs`: the `WAIT` after each admission that `with_replicas_ack` asks for;
// - `fleet.rs` (`fleet.lua`): the heartbeat that counts a fleet's live instances;
// - `members.rs`: the unique sorted-set members a sliding log records;
// - `outlook.rs`: the per-key guess of the next outcome that orders the sliding-log script;
// - one file per kind of server: `standalone.rs` (over `pipelined.rs`, with its RESP framing in
//   `pipelined/resp.rs`), `cluster.rs` and `sentinel.rs`;
// - `tls.rs`: TLS to Redis, the one place its settings are read and its configuration built.
//
// Every `async fn` between a public call and the connection nests one more future inside the
// caller's, and rustc gives up on futures nested deep enough ("queries overflow the depth
// limit"; the server's binary is near that edge). So the public calls keep the depth they have:
// `Backend::inspect` runs `inspect.lua` itself, and each constructor connects and loads the
// scripts itself, rather than through one more helper.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

pub use cluster::{CLUSTER_STALL_BEFORE_RENEWAL, RedisClusterBackend, RenewingClusterConnection};
pub use config::{DEFAULT_PREFIX, DEFAULT_TIMEOUT};
pub use engine::RedisEngine;
pub use fleet::{FLEET_BEAT, FLEET_LAPSE, fleet_key, instance_id};
pub use pipelined::{DEFAULT_MAX_QUEUED, MAX_IN_FLIGHT, PipelinedConnection};
pub use redis::cluster_async::ClusterConnection;
pub use replicas::MAX_WAITING_FOR_REPLICAS;
pub use sentinel::{RedisSentinelBackend, SentinelConnection};
pub use tls::{MAX_PEM_BYTES, RedisTls, TlsFiles, pem_certificates, pem_private_key};

use crate::clock::{Clock, SystemClock};
use crate::{
    Algorithm, Backend, Charged, Check, Decision, Error, KeyState, KeyTimeline, MultiDecision, Quota, Refunded,
};

mod call;
mod cluster;
mod config;
mod engine;
mod fleet;
mod members;
mod module;
mod outlook;
mod pipelined;
mod replicas;
mod scripts;
mod sentinel;
mod standalone;
mod tls;
mod wire;

/// Rate limiting on Redis (standalone; any [`ConnectionLike`] connection).
///
/// Cheap to clone: clones share the connection. Keys in Redis are `<prefix>:<key>` for the
/// sliding log and `<prefix>.<algorithm>:<key>` for the others ([`RedisBackend::redis_key`]), so
/// each algorithm keeps its own state of a key.
///
/// ```no_run
/// use slidegate::{Limiter, Quota, RedisBackend};
///
/// # async fn run() -> Result<(), slidegate::Error> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?.with_prefix("myapp");
/// let limiter = Limiter::new(backend);
/// let decision = limiter.check("user:42", &Quota::per_minute(100)?).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend<C = PipelinedConnection> {
    conn: C,
    config: Arc<config::Config>,
    members: Arc<members::Members>,
    module: Arc<engine::ModuleState>,
    outlook: Arc<outlook::Outlook>,
    acks: Arc<replicas::Acks>,
}

impl<C> std::fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.config.prefix)
            .field("timeout", &self.config.timeout)
            .field("time", &if self.config.clock.is_some() { "caller" } else { "redis" })
            .field("engine", &self.engine())
            .finish()
    }
}

/// When a charge is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stamp {
    /// At this time in ms, or now on Redis' clock (`None`).
    At(Option<u64>),
    /// This many ms before now on Redis' clock: a write-back ([`Backend::charge_ago`]).
    Ago(u64),
}

impl Stamp {
    /// As the one time the module and `charge.lua` take (`None`: Redis' clock); `Ago` by this
    /// host's clock.
    pub(super) fn time(self) -> Option<u64> {
        match self {
            Self::At(at) => at,
            Self::Ago(ago) => Some(SystemClock.now_ms().saturating_sub(ago)),
        }
    }

    /// As the ARGV of the scripts that take it: a time, `""` for Redis' clock, `-<ago>`
    /// (`charge_log.lua`).
    pub(super) fn arg(self) -> String {
        match self {
            Self::At(at) => at.map_or_else(String::new, |at| at.to_string()),
            Self::Ago(ago) => format!("-{ago}"),
        }
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A charge or a refund by the module when the server has it, as a check chooses
    /// ([`RedisEngine`]), or else by the Lua scripts.
    async fn charge_or_refund(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
        charge: bool,
        at: Stamp,
    ) -> Result<(Decision, u64), Error> {
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_charge(key, quota, cost, charge, at.time()).await)
        {
            return answer;
        }
        self.charge_script(key, quota, cost, charge, at).await
    }
}

impl<C> Backend for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        let started = Instant::now();
        let check = [Check { key, quota: *quota, cost }];
        let first = |group: MultiDecision| group.decisions.into_iter().next().ok_or_else(|| wire::unexpected(&[]));
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_check(&check).await)
        {
            return self.acknowledged(started, answer.and_then(first), |d| d.allowed).await;
        }
        let algorithm = quota.algorithm();
        // One key without warm-up has a lean script; everything else runs the general one.
        let decision = match (algorithm, quota.warm_up()) {
            (Algorithm::SlidingLog, None) => self.sliding_log(key, quota, cost).await,
            (Algorithm::SlidingWindow { buckets }, None) => self.sliding_window(key, quota, buckets, cost).await,
            (Algorithm::FixedWindow, None) => {
                let args = [quota.window_ms(), quota.limit(), cost];
                self.one_key(key, algorithm, "f", args, quota.limit()).await
            }
            (Algorithm::Gcra { .. }, None) => {
                let te = quota.emission_us();
                let args = [te, quota.burst() * te, cost * te];
                self.one_key(key, algorithm, "g", args, quota.burst()).await
            }
            _ => self.check_script(&check, true).await.and_then(first),
        };
        self.acknowledged(started, self.noting_failure(decision), |d| d.allowed).await
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        let started = Instant::now();
        if self.config.one_slot {
            let mut keys = checks.iter().map(|c| self.redis_key(c.key, c.quota.algorithm()));
            if let Some(first) = keys.next() {
                let slot = crate::key_slot(&first);
                if let Some(other) = keys.find(|k| crate::key_slot(k) != slot) {
                    return Err(Error::CrossSlot { first, other });
                }
            }
        }
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_check(checks).await)
        {
            return self.acknowledged(started, answer, |group| group.allowed).await;
        }
        self.acknowledged(started, self.noting_failure(self.check_script(checks, true).await), |group| group.allowed)
            .await
    }

    async fn charge(&self, key: &str, quota: &Quota, cost: u64) -> Result<Charged, Error> {
        let started = Instant::now();
        let answer = self.charge_or_refund(key, quota, cost, true, Stamp::At(self.now_arg()?)).await;
        let charged = answer.map(|(decision, recorded)| Charged::new(decision, cost, recorded));
        self.acknowledged(started, self.noting_failure(charged), |c| c.recorded > 0).await
    }

    async fn charge_ago(&self, key: &str, quota: &Quota, cost: u64, ago: Duration) -> Result<Charged, Error> {
        let started = Instant::now();
        // Past where the algorithm keeps times: on the caller's clock if there is one, else on
        // Redis' (the module and the GCRA's script are told this host's time then).
        let at = match (self.now_arg()?, crate::write_back::keeps_times(quota)) {
            (Some(now), _) => Stamp::At(Some(crate::write_back::as_of(quota, now, ago))),
            (None, true) => Stamp::Ago(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)),
            (None, false) => Stamp::At(None),
        };
        let answer = self.charge_or_refund(key, quota, cost, true, at).await;
        let charged = answer.map(|(decision, recorded)| Charged::new(decision, cost, recorded));
        self.acknowledged(started, self.noting_failure(charged), |c| c.recorded > 0).await
    }

    async fn refund(&self, key: &str, quota: &Quota, cost: u64) -> Result<Refunded, Error> {
        let started = Instant::now();
        let answer = self.charge_or_refund(key, quota, cost, false, Stamp::At(self.now_arg()?)).await;
        let refunded = answer.map(|(decision, refunded)| Refunded::new(decision, refunded));
        self.acknowledged(started, self.noting_failure(refunded), |r| r.refunded > 0).await
    }

    async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_inspect(key, quota).await)
        {
            return answer;
        }
        if quota.algorithm() != Algorithm::SlidingLog {
            // A zero-cost look: what is used of the (effective) limit now.
            let group = self.check_script(&[Check { key, quota: *quota, cost: 0 }], false).await?;
            let d = group.decisions.first().ok_or_else(|| wire::unexpected(&[]))?;
            return Ok(KeyState { count: d.limit - d.remaining, oldest_ms: None, reset_after: d.reset_after });
        }
        let (window, now) = (quota.window_ms(), self.now_arg()?);
        let reply: Vec<i64> = self
            .run_script(&scripts::scripts().inspect, &[(key, Algorithm::SlidingLog)], |cmd| {
                wire::inspect_args(cmd, window, now, 0);
            })
            .await?;
        wire::parse_inspect(&reply)
    }

    // `inspect` with the admission times: the same path, each step asking for them too.
    async fn timeline(&self, key: &str, quota: &Quota, max_admissions: usize) -> Result<KeyTimeline, Error> {
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_timeline(key, quota, max_admissions).await)
        {
            return answer;
        }
        if quota.algorithm() != Algorithm::SlidingLog {
            let group = self.check_script(&[Check { key, quota: *quota, cost: 0 }], false).await?;
            let d = group.decisions.first().ok_or_else(|| wire::unexpected(&[]))?;
            let state = KeyState { count: d.limit - d.remaining, oldest_ms: None, reset_after: d.reset_after };
            return Ok(KeyTimeline { state, admissions_ms: Vec::new() });
        }
        let (window, now) = (quota.window_ms(), self.now_arg()?);
        let reply: Vec<i64> = self
            .run_script(&scripts::scripts().inspect, &[(key, Algorithm::SlidingLog)], |cmd| {
                wire::inspect_args(cmd, window, now, max_admissions);
            })
            .await?;
        wire::parse_timeline(&reply)
    }

    async fn accepts_writes(&self, key: &str, quota: &Quota) -> Result<(), Error> {
        let _: i64 = self.run_script(&scripts::scripts().writable, &[(key, quota.algorithm())], |_| {}).await?;
        Ok(())
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        let keys = [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow { buckets: 1 },
            Algorithm::FixedWindow,
            Algorithm::Gcra { burst: None },
        ]
        .map(|algorithm| self.redis_key(key, algorithm));
        // On a Cluster the four keys may live in four slots: one UNLINK each. UNLINK frees a
        // long sorted set off Redis' main thread.
        let groups: Vec<&[String]> = if self.config.one_slot { keys.chunks(1).collect() } else { vec![&keys] };
        for group in groups {
            let mut cmd = redis::cmd("UNLINK");
            cmd.arg(group);
            let _: i64 = self.query(&cmd).await?;
        }
        Ok(())
    }
}
