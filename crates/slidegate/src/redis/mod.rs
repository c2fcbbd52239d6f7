//! The Redis backend: one key per limited key and algorithm, one atomic Lua script per decision.
//!
//! Scripts live beside this file, each opening with its KEYS/ARGV contract: `sliding_log.lua`
//! (one sliding-log key without warm-up, the hot path), `one_key.lua` (one fixed-window or GCRA
//! key without warm-up), `check.lua` (every algorithm, warm-up, one key or an atomic group, on
//! the same keys and fields, at about twice the one-key scripts' work) and `inspect.lua`. They
//! run by `EVALSHA`; when Redis answers `NOSCRIPT` (after a restart, a failover or `SCRIPT
//! FLUSH`) the same call is sent once more as `EVAL` with the body, which
//! also puts the script back in Redis' cache. Callers never see that error.
//!
//! When the server has slidegate's module loaded (`crates/slidegate-module`), the same
//! decisions are made by its `SLIDEGATE.CHECK` and `SLIDEGATE.INSPECT` commands instead, on the
//! same keys, at a fraction of the CPU: see [`RedisEngine`].

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

pub use pipelined::{DEFAULT_MAX_QUEUED, MAX_IN_FLIGHT, PipelinedConnection};
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClientBuilder;
pub use redis::cluster_async::ClusterConnection;
pub use sentinel::SentinelConnection;

mod pipelined;
mod sentinel;

/// The Redis backend over a Sentinel-monitored master ([`RedisBackend::connect_sentinel`]).
pub type RedisSentinelBackend = RedisBackend<SentinelConnection>;

/// The Redis backend over a Redis Cluster ([`RedisBackend::connect_cluster`]).
pub type RedisClusterBackend = RedisBackend<ClusterConnection>;
use redis::{Cmd, ErrorKind, FromRedisValue, ServerErrorKind};

use crate::{Algorithm, Backend, Check, Clock, Decision, Error, KeyState, KeyTimeline, MultiDecision, Quota};

/// The deadline of one backend call unless set otherwise: a sick Redis must not hold requests.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// How long connecting (and loading the scripts) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The most sliding-log permits one script call records (a multi-limit check's sliding logs
/// summed): each is a sorted-set member the script writes, besides at most 256 expired ones it
/// removes, so this bounds the time one decision holds Redis' single thread (well under a
/// millisecond; BENCHMARKS.md). The module writes a byte or two per permit and takes any cost
/// its quota admits.
pub const MAX_SCRIPT_LOG_COST: u64 = 256;

/// The key namespace unless set otherwise: keys are `slidegate:<key>`.
pub const DEFAULT_PREFIX: &str = "slidegate";

struct LuaScript {
    body: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(body: &'static str) -> Self {
        Self { body, sha: redis::Script::new(body).get_hash().to_owned() }
    }
}

struct Scripts {
    sliding_log: LuaScript,
    one_key: LuaScript,
    check: LuaScript,
    inspect: LuaScript,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        sliding_log: LuaScript::new(include_str!("sliding_log.lua")),
        one_key: LuaScript::new(include_str!("one_key.lua")),
        check: LuaScript::new(include_str!("check.lua")),
        inspect: LuaScript::new(include_str!("inspect.lua")),
    })
}

#[derive(Clone)]
struct Config {
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    timeout: Duration,
    one_slot: bool,
    engine: RedisEngine,
    /// Set: the sliding-log script's order is fixed (`true`: expecting a denial) instead of
    /// guessed by [`Outlook`].
    fixed_order: Option<bool>,
}

/// Which code decides on Redis.
///
/// The module and the scripts make identical decisions and use the same keys; a key the
/// scripts wrote is converted by the module on its first check (keeping its admissions), but
/// the scripts cannot read what the module wrote — so do not go back to `Lua` on a server
/// whose keys the module holds, until they have expired (one window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RedisEngine {
    /// The module when the server has it loaded, the Lua scripts otherwise (the default).
    /// The first call, and the first after the connection failed (a restart or a failover may
    /// have changed the server), goes to the module: if the server does not know the command,
    /// the scripts make that call and the ones after it. A script meeting a key of the
    /// module's type (the module was loaded since) makes the next call try the module again;
    /// so does [`RedisBackend::detect_module`] (`COMMAND INFO SLIDEGATE.CHECK`), which
    /// [`RedisBackend::ready`] calls.
    #[default]
    Auto,
    /// Always the Lua scripts.
    Lua,
    /// Always the module: calls fail when the server does not have it.
    Module,
}

impl RedisEngine {
    /// The name used in configuration files: `auto`, `lua` or `module`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Lua => "lua",
            Self::Module => "module",
        }
    }
}

impl std::str::FromStr for RedisEngine {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(Self::Auto),
            "lua" => Ok(Self::Lua),
            "module" => Ok(Self::Module),
            other => Err(Error::UnknownEngine(other.to_owned())),
        }
    }
}

/// What the backend knows of the server's module: not asked yet (or to ask again), absent,
/// loaded. Shared by clones.
#[derive(Default)]
struct ModuleState(AtomicU8);

const MODULE_UNKNOWN: u8 = 0;
const MODULE_ABSENT: u8 = 1;
const MODULE_LOADED: u8 = 2;

/// Makes sorted-set members unique per admission across every client of one Redis: a random
/// 64-bit id per backend instance (base-62, 11 characters) and a counter. Two instances would
/// have to draw the same id (odds about n²/2⁶⁵ for n instances) *and* reach the same counter
/// value on the same key within one window to collide; within one instance, never.
struct Members {
    id: String,
    counter: AtomicU64,
}

impl Members {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        // RandomState's keys come from the OS's randomness; mixing in pid and time guards
        // against a platform that hands every process the same keys.
        let random = RandomState::new().hash_one((std::process::id(), nanos));
        let mut id = String::with_capacity(24);
        push_base62(&mut id, random, 11);
        Self { id, counter: AtomicU64::new(0) }
    }

    fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut member = self.id.clone();
        push_base62(&mut member, n, 1);
        member
    }
}

/// Guesses, per key, whether the next sliding-log check will be denied, so that the script
/// takes the order that costs Redis less for that outcome (`sliding_log.lua`: three calls for a
/// denial looked at first, five for an admission counted first, one more each when the guess
/// was wrong). A wrong guess costs one call, never a different decision. Outcomes come in
/// runs — a key over its limit stays over it until entries leave; an attacked key is denied
/// call after call while other keys keep being admitted — so each of 1,024 slots, which keys
/// share by hash, remembers the last outcome seen there.
struct Outlook {
    hasher: RandomState,
    denied: [AtomicBool; OUTLOOK_SLOTS],
}

const OUTLOOK_SLOTS: usize = 1024;

impl Outlook {
    fn new() -> Self {
        Self { hasher: RandomState::new(), denied: std::array::from_fn(|_| AtomicBool::new(false)) }
    }

    fn slot(&self, key: &str) -> &AtomicBool {
        // The modulo of a 64-bit hash by a power of two keeps its low bits; all are mixed.
        let index = usize::try_from(self.hasher.hash_one(key) % OUTLOOK_SLOTS as u64).unwrap_or(0);
        &self.denied[index]
    }
}

/// Records an outcome in its slot; written only when it changes, so runs of one outcome leave
/// the slot's cache line shared between cores.
fn remember_outcome(slot: &AtomicBool, denied: bool) {
    if slot.load(Ordering::Relaxed) != denied {
        slot.store(denied, Ordering::Relaxed);
    }
}

fn push_base62(out: &mut String, mut n: u64, min_digits: usize) {
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let start = out.len();
    while n > 0 || out.len() - start < min_digits {
        out.push(char::from(DIGITS[(n % 62) as usize]));
        n /= 62;
    }
}

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
    config: Arc<Config>,
    members: Arc<Members>,
    module: Arc<ModuleState>,
    outlook: Arc<Outlook>,
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

impl<C> RedisBackend<C> {
    /// The code deciding now: [`RedisEngine::Lua`] or [`RedisEngine::Module`], or
    /// [`RedisEngine::Auto`] while the server has not been asked yet.
    pub fn engine(&self) -> RedisEngine {
        match (self.config.engine, self.module.0.load(Ordering::Relaxed)) {
            (RedisEngine::Auto, MODULE_LOADED) => RedisEngine::Module,
            (RedisEngine::Auto, MODULE_ABSENT) => RedisEngine::Lua,
            (engine, _) => engine,
        }
    }
}

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
        let client = ClusterClientBuilder::new(urls.to_vec())
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

impl RedisBackend<SentinelConnection> {
    /// Connects to the master of `service` as the sentinels at `sentinels` (`redis://host:26379`
    /// each) name it, and follows failovers: see [`SentinelConnection`].
    pub async fn connect_sentinel(sentinels: &[&str], service: &str) -> Result<Self, Error> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, SentinelConnection::connect(sentinels, service))
            .await
            .map_err(|_| Error::Timeout(CONNECT_TIMEOUT))??;
        let backend = Self::with_connection(conn);
        backend.clone().with_timeout(CONNECT_TIMEOUT).load_scripts().await?;
        Ok(backend)
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A backend over an existing connection.
    pub fn with_connection(conn: C) -> Self {
        Self {
            conn,
            config: Arc::new(Config {
                prefix: DEFAULT_PREFIX.to_owned(),
                clock: None,
                timeout: DEFAULT_TIMEOUT,
                one_slot: false,
                engine: RedisEngine::Auto,
                fixed_order: None,
            }),
            members: Arc::new(Members::new()),
            module: Arc::default(),
            outlook: Arc::new(Outlook::new()),
        }
    }

    /// Chooses the code that decides (default [`RedisEngine::Auto`]).
    #[must_use]
    pub fn with_engine(mut self, engine: RedisEngine) -> Self {
        Arc::make_mut(&mut self.config).engine = engine;
        self
    }

    /// Asks the server whether it has slidegate's module loaded (`COMMAND INFO
    /// SLIDEGATE.CHECK`), and remembers the answer for [`RedisEngine::Auto`].
    pub async fn detect_module(&self) -> Result<bool, Error> {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("SLIDEGATE.CHECK");
        let info: Vec<redis::Value> = self.query(&cmd).await?;
        let loaded = info.first().is_some_and(|v| !matches!(v, redis::Value::Nil));
        self.remember(if loaded { MODULE_LOADED } else { MODULE_ABSENT });
        Ok(loaded)
    }

    /// Whether this call goes to the module first: unless the engine is `Lua` or the server
    /// said it has no module. Not knowing yet (the first call, or the first after a failed
    /// connection), the call itself asks: no extra round trip, and no second deadline.
    fn module_first(&self) -> bool {
        match self.config.engine {
            RedisEngine::Lua => false,
            RedisEngine::Module => true,
            RedisEngine::Auto => self.module.0.load(Ordering::Relaxed) != MODULE_ABSENT,
        }
    }

    /// The module's answer, or `None` when the call is to be made by the scripts instead: the
    /// server does not know the command (no module, or a failover to a server without it) and
    /// the engine is `Auto` (forced to the module, that is [`Error::ModuleNotLoaded`]).
    fn module_answer<T>(&self, answer: Result<T, Error>) -> Option<Result<T, Error>> {
        match &answer {
            Err(Error::Redis(e)) if unknown_command(e) => {
                self.remember(MODULE_ABSENT);
                (self.config.engine == RedisEngine::Module).then_some(Err(Error::ModuleNotLoaded))
            }
            Ok(_) => {
                self.remember(MODULE_LOADED);
                Some(answer)
            }
            Err(_) => Some(self.noting_failure(answer)),
        }
    }

    /// Passes the scripts' (or the module's) `answer` on. A failed connection, or a script
    /// meeting a key of the module's type (another instance found the module first), makes
    /// the next call ask the server again.
    fn noting_failure<T>(&self, answer: Result<T, Error>) -> Result<T, Error> {
        let recheck = match &answer {
            Err(Error::Redis(e)) => e.code() == Some("WRONGTYPE") || e.is_io_error() || e.is_connection_dropped(),
            Err(Error::Timeout(_)) => true,
            _ => false,
        };
        if recheck {
            self.remember(MODULE_UNKNOWN);
        }
        answer
    }

    /// Records what the server said of its module; a store only when it changed, so that the
    /// calls of many threads do not pass one cache line around.
    fn remember(&self, state: u8) {
        if self.module.0.load(Ordering::Relaxed) != state {
            self.module.0.store(state, Ordering::Relaxed);
        }
    }

    /// Namespaces keys as `<prefix>:<key>`; an empty prefix uses the key as it is.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.config).prefix = prefix.into();
        self
    }

    /// Takes "now" from `clock` instead of Redis' `TIME` (deterministic tests, replays).
    /// Every client of a key must then share one clock. Redis' own key expiry still runs on
    /// Redis' clock, so keys then expire one window plus one minute after the last admission:
    /// a caller's clock that lags Redis' by more than a minute can lose live entries.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        Arc::make_mut(&mut self.config).clock = Some(Arc::new(clock));
        self
    }

    /// The deadline of each call (default [`DEFAULT_TIMEOUT`]); past it the call fails with
    /// [`Error::Timeout`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).timeout = timeout;
        self
    }

    /// Refuses, with [`Error::CrossSlot`] and before sending anything, a multi-limit check whose
    /// Redis keys do not share one Cluster slot — as a Redis Cluster would, but typed and early.
    /// Standalone Redis does not need it; turn it on to catch keys that will not work once the
    /// same code runs against a Cluster.
    #[must_use]
    pub fn with_cluster_slot_check(mut self, on: bool) -> Self {
        Arc::make_mut(&mut self.config).one_slot = on;
        self
    }

    /// Fixes the order the sliding-log script takes instead of guessing it per key
    /// (`expect_denial`: look at the blocking entry first; otherwise count first). Decisions
    /// are the same either way, only Redis' work differs: this exists so that tests can run
    /// every decision both ways.
    #[doc(hidden)]
    #[must_use]
    pub fn with_fixed_order(mut self, expect_denial: bool) -> Self {
        Arc::make_mut(&mut self.config).fixed_order = Some(expect_denial);
        self
    }

    /// The Redis key that holds `key`'s state under `algorithm`: `<prefix>:<key>` for the
    /// sliding log, `<prefix>.sw:<key>`, `<prefix>.fw:<key>` and `<prefix>.gcra:<key>` for the
    /// sliding window, the fixed window and the GCRA. The key goes last, so a hash tag in it
    /// (`{user:42}:sms`) decides the Cluster slot of all of them.
    pub fn redis_key(&self, key: &str, algorithm: Algorithm) -> String {
        let prefix = &self.config.prefix;
        let tag = match algorithm {
            Algorithm::SlidingLog => "",
            Algorithm::SlidingWindow { .. } => ".sw",
            Algorithm::FixedWindow => ".fw",
            Algorithm::Gcra { .. } => ".gcra",
        };
        let mut k = String::with_capacity(prefix.len() + tag.len() + 1 + key.len());
        k.push_str(prefix);
        k.push_str(tag);
        if !k.is_empty() {
            k.push(':');
        }
        k.push_str(key);
        k
    }

    /// Loads the scripts into Redis' cache (`SCRIPT LOAD`). Optional: a missing script is
    /// loaded on first use anyway.
    pub async fn load_scripts(&self) -> Result<(), Error> {
        let s = scripts();
        for script in [&s.sliding_log, &s.one_key, &s.check, &s.inspect] {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(script.body);
            let _: String = self.query(&cmd).await?;
        }
        Ok(())
    }

    /// Answers `PING` within the deadline: is Redis reachable?
    pub async fn ping(&self) -> Result<(), Error> {
        let _: String = self.query(&redis::cmd("PING")).await?;
        Ok(())
    }

    /// Whether the backend can decide: Redis answers `PING` within the deadline, and is asked
    /// again whether it has slidegate's module (so a `MODULE LOAD` is picked up). With the
    /// engine forced to the module, a server without it fails with [`Error::ModuleNotLoaded`].
    pub async fn ready(&self) -> Result<(), Error> {
        self.ping().await?;
        if self.config.engine != RedisEngine::Lua
            && !self.detect_module().await?
            && self.config.engine == RedisEngine::Module
        {
            return Err(Error::ModuleNotLoaded);
        }
        Ok(())
    }

    fn now_arg(&self) -> Option<u64> {
        self.config.clock.as_ref().map(|c| c.now_ms())
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        let mut conn = self.conn.clone();
        self.deadline(async move { Ok(cmd.query_async(&mut conn).await?) }).await
    }

    async fn deadline<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let timeout = self.config.timeout;
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(Error::Timeout(timeout)),
            // The connection's own timeouts (its queue full, a node or a link gone silent) are
            // this call missing its deadline too.
            Ok(Err(Error::Redis(e))) if e.is_timeout() => Err(Error::Timeout(timeout)),
            Ok(answer) => answer,
        }
    }

    /// Runs `script` by EVALSHA, falling back to EVAL on NOSCRIPT, all within one deadline.
    /// `args` appends the script's ARGV after its KEYS.
    async fn run_script<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[(&str, Algorithm)],
        args: impl Fn(&mut Cmd) + Send + Sync,
    ) -> Result<T, Error> {
        let build = |verb: &str, script_ref: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script_ref).arg(keys.len());
            for &(key, algorithm) in keys {
                cmd.arg(self.redis_key(key, algorithm));
            }
            args(&mut cmd);
            cmd
        };
        let evalsha = build("EVALSHA", &script.sha);
        let mut conn = self.conn.clone();
        self.deadline(async move {
            match evalsha.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    Ok(build("EVAL", script.body).query_async(&mut conn).await?)
                }
                other => Ok(other?),
            }
        })
        .await
    }

    /// One run of the one-key sliding-log script, in the order the key's outlook suggests.
    async fn sliding_log(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        let (id, now, limit, window) = (self.members.next(), self.now_arg(), quota.limit(), quota.window_ms());
        let slot = self.outlook.slot(key);
        let expect_denial = self.config.fixed_order.unwrap_or_else(|| slot.load(Ordering::Relaxed));
        // Precomputed here so that Redis formats no number: see the script's header.
        let room = limit - cost;
        let blocking_index = -i64::try_from(room).unwrap_or(i64::MAX) - 1;
        let reply: redis::Value = self
            .run_script(&scripts().sliding_log, &[(key, Algorithm::SlidingLog)], |cmd| {
                cmd.arg(id.as_str()).arg(window).arg(room);
                if expect_denial {
                    cmd.arg(blocking_index);
                } else {
                    cmd.arg("");
                }
                match now {
                    Some(now) => {
                        cmd.arg(now);
                    }
                    None if cost > 1 => {
                        cmd.arg("");
                    }
                    None => {}
                }
                if cost > 1 {
                    cmd.arg(cost).arg(limit);
                }
            })
            .await?;
        let decision = parse_sliding_log(&reply, limit, window)?;
        remember_outcome(slot, !decision.allowed);
        Ok(decision)
    }

    /// One run of `one_key.lua` for a fixed window or a GCRA without warm-up: `code` names the
    /// algorithm, `args` are its numbers, and the caller's clock, if any, comes last.
    async fn one_key(
        &self,
        key: &str,
        algorithm: Algorithm,
        code: &str,
        args: [u64; 3],
        limit: u64,
    ) -> Result<Decision, Error> {
        let now = self.now_arg();
        let reply: Vec<i64> = self
            .run_script(&scripts().one_key, &[(key, algorithm)], |cmd| {
                cmd.arg(code).arg(&args[..]).arg(now);
            })
            .await?;
        let number = |v: i64| u64::try_from(v).map_err(|_| unexpected(&reply));
        match *reply.as_slice() {
            [remaining, reset] => Ok(Decision::allowed(limit, number(remaining)?, ms(reset))),
            [remaining, reset, retry] => Ok(Decision::denied(limit, number(remaining)?, ms(reset), ms(retry))),
            _ => Err(unexpected(&reply)),
        }
    }

    /// `SLIDEGATE.CHECK` over `checks` (joined by `AND`): the module's decision, answered as
    /// `check.lua` answers.
    async fn module_check(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        let mut cmd = redis::cmd("SLIDEGATE.CHECK");
        for (i, c) in checks.iter().enumerate() {
            if i > 0 {
                cmd.arg("AND");
            }
            cmd.arg(self.redis_key(c.key, c.quota.algorithm()));
            module_quota(&mut cmd, &c.quota, Some(c.cost));
        }
        if let Some(now) = self.now_arg() {
            cmd.arg("NOW").arg(now);
        }
        let reply: Vec<i64> = self.query(&cmd).await?;
        parse_group(&reply, checks.len())
    }

    /// `SLIDEGATE.INSPECT` of `key` under `quota`, with the newest `times` admissions.
    async fn module_inspect(&self, key: &str, quota: &Quota, times: usize) -> Result<KeyTimeline, Error> {
        let mut cmd = redis::cmd("SLIDEGATE.INSPECT");
        cmd.arg(self.redis_key(key, quota.algorithm()));
        module_quota(&mut cmd, quota, None);
        if let Some(now) = self.now_arg() {
            cmd.arg("NOW").arg(now);
        }
        if times > 0 {
            cmd.arg("TIMES").arg(times);
        }
        let reply: Vec<redis::Value> = self.query(&cmd).await?;
        let bad = || Error::UnexpectedReply(format!("{reply:?}"));
        let number = |v: Option<&redis::Value>| match v {
            Some(redis::Value::Int(n)) => Ok(*n),
            _ => Err(bad()),
        };
        let admissions_ms = match reply.get(6) {
            None => Vec::new(),
            Some(redis::Value::Array(times)) => {
                times.iter().map(|t| u64::try_from(number(Some(t))?).map_err(|_| bad())).collect::<Result<_, _>>()?
            }
            Some(_) => return Err(bad()),
        };
        let state = KeyState {
            count: u64::try_from(number(reply.first())?).map_err(|_| bad())?,
            oldest_ms: u64::try_from(number(reply.get(1))?).ok(),
            reset_after: ms(number(reply.get(2))?),
        };
        Ok(KeyTimeline { state, admissions_ms })
    }

    /// One run of `check.lua` over `checks`: decided and recorded all or nothing, or, with
    /// `record == false`, only looked at.
    async fn check_script(&self, checks: &[Check<'_>], record: bool) -> Result<MultiDecision, Error> {
        let (member, now) = (self.members.next(), self.now_arg());
        let keys: Vec<(&str, Algorithm)> = checks.iter().map(|c| (c.key, c.quota.algorithm())).collect();
        let reply: Vec<i64> = self
            .run_script(&scripts().check, &keys, |cmd| {
                cmd.arg(member.as_str());
                match now {
                    Some(now) => cmd.arg(now),
                    None => cmd.arg(""),
                };
                cmd.arg(if record { "1" } else { "0" });
                for c in checks {
                    let q = &c.quota;
                    let (code, param) = match q.algorithm() {
                        Algorithm::SlidingLog => ("l", 0),
                        Algorithm::SlidingWindow { buckets } => ("w", u64::from(buckets)),
                        Algorithm::FixedWindow => ("f", 0),
                        Algorithm::Gcra { .. } => ("g", q.burst()),
                    };
                    let (period, cold) = q.warm_up().map_or((0, 0), |w| (w.period_ms(), w.cold_permille()));
                    cmd.arg(code).arg(q.limit()).arg(q.window_ms()).arg(c.cost).arg(param).arg(period).arg(cold);
                }
            })
            .await?;
        parse_group(&reply, checks.len())
    }
}

/// Appends `algorithm limit window_ms [cost]` and the options of `quota`, as the module reads
/// them.
fn module_quota(cmd: &mut Cmd, quota: &Quota, cost: Option<u64>) {
    cmd.arg(quota.algorithm().as_str()).arg(quota.limit()).arg(quota.window_ms()).arg(cost);
    match quota.algorithm() {
        Algorithm::SlidingWindow { buckets } => {
            cmd.arg("BUCKETS").arg(buckets);
        }
        Algorithm::Gcra { .. } => {
            cmd.arg("BURST").arg(quota.burst());
        }
        _ => {}
    }
    if let Some(w) = quota.warm_up() {
        cmd.arg("WARMUP").arg(w.period_ms()).arg(w.cold_permille());
    }
}

/// Whether Redis refused a command it does not know (the module is not loaded).
fn unknown_command(e: &redis::RedisError) -> bool {
    e.to_string().to_ascii_lowercase().contains("unknown command")
}

/// Reads `check.lua`'s (and `SLIDEGATE.CHECK`'s) answer for `count` checks: `admitted`, then per
/// check `fits, remaining, reset_after, retry_after, limit`.
fn parse_group(reply: &[i64], count: usize) -> Result<MultiDecision, Error> {
    let (Some(&admitted), Some(per_key)) = (reply.first(), reply.get(1..)) else {
        return Err(unexpected(reply));
    };
    if per_key.len() != 5 * count {
        return Err(unexpected(reply));
    }
    let decisions = per_key
        .chunks_exact(5)
        .map(|r| {
            let number = |v: i64| u64::try_from(v).map_err(|_| unexpected(reply));
            let (remaining, limit) = (number(r[1])?, number(r[4])?);
            Ok(match (admitted, r[0]) {
                (1, _) => Decision::allowed(limit, remaining, ms(r[2])),
                (0, 0) => Decision::denied(limit, remaining, ms(r[2]), ms(r[3])),
                (0, 1) => Decision::held(limit, remaining, ms(r[2])),
                _ => return Err(unexpected(reply)),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(MultiDecision::new(decisions))
}

/// Reads `sliding_log.lua`'s answer: `remaining` when admitted; a denial packed into one
/// negative integer, or `[remaining, reset_after, retry_after]`.
fn parse_sliding_log(reply: &redis::Value, limit: u64, window: u64) -> Result<Decision, Error> {
    let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
    match *reply {
        redis::Value::Int(remaining) if remaining >= 0 => {
            Ok(Decision::allowed(limit, remaining.unsigned_abs(), Duration::from_millis(window)))
        }
        redis::Value::Int(packed) => {
            // -1 - (reset * (window + 1) + retry), with retry <= window.
            let (packed, base) = ((-1 - packed).unsigned_abs(), window + 1);
            Ok(Decision::denied(limit, 0, Duration::from_millis(packed / base), Duration::from_millis(packed % base)))
        }
        redis::Value::Array(ref items) => match items.as_slice() {
            [redis::Value::Int(remaining), redis::Value::Int(reset), redis::Value::Int(retry)] => {
                let remaining = u64::try_from(*remaining).map_err(|_| unexpected())?;
                Ok(Decision::denied(limit, remaining, ms(*reset), ms(*retry)))
            }
            _ => Err(unexpected()),
        },
        _ => Err(unexpected()),
    }
}

fn ms(value: i64) -> Duration {
    Duration::from_millis(u64::try_from(value).unwrap_or(0))
}

fn unexpected(reply: &[i64]) -> Error {
    Error::UnexpectedReply(format!("{reply:?}"))
}

impl<C> Backend for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// [`MAX_SCRIPT_LOG_COST`], unless the engine is forced to the module (on `Auto` the Lua
    /// scripts may answer, after a failover to a server without the module).
    fn max_log_cost(&self) -> u64 {
        match self.config.engine {
            RedisEngine::Module => crate::MAX_LOG_LIMIT,
            _ => MAX_SCRIPT_LOG_COST,
        }
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        let check = [Check { key, quota: *quota, cost }];
        let first = |group: MultiDecision| group.decisions.into_iter().next().ok_or_else(|| unexpected(&[]));
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_check(&check).await)
        {
            return first(answer?);
        }
        let algorithm = quota.algorithm();
        // One key without warm-up has a lean script; everything else runs the general one.
        let decision = match (algorithm, quota.warm_up()) {
            (Algorithm::SlidingLog, None) => self.sliding_log(key, quota, cost).await,
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
        self.noting_failure(decision)
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
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
            return answer;
        }
        self.noting_failure(self.check_script(checks, true).await)
    }

    async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        Ok(self.timeline(key, quota, 0).await?.state)
    }

    async fn timeline(&self, key: &str, quota: &Quota, max_admissions: usize) -> Result<KeyTimeline, Error> {
        if self.module_first()
            && let Some(answer) = self.module_answer(self.module_inspect(key, quota, max_admissions).await)
        {
            return answer;
        }
        if quota.algorithm() != Algorithm::SlidingLog {
            // A zero-cost look: what is used of the (effective) limit now.
            let group = self.check_script(&[Check { key, quota: *quota, cost: 0 }], false).await?;
            let d = group.decisions.first().ok_or_else(|| unexpected(&[]))?;
            let state = KeyState { count: d.limit - d.remaining, oldest_ms: None, reset_after: d.reset_after };
            return Ok(KeyTimeline { state, admissions_ms: Vec::new() });
        }
        let (window, now) = (quota.window_ms(), self.now_arg());
        let reply: Vec<i64> = self
            .run_script(&scripts().inspect, &[(key, Algorithm::SlidingLog)], |cmd| {
                cmd.arg(window).arg(now.map_or(String::new(), |n| n.to_string())).arg(max_admissions);
            })
            .await?;
        let &[count, oldest, reset_after, ref times @ ..] = reply.as_slice() else {
            return Err(unexpected(&reply));
        };
        let admissions_ms = times.iter().rev().map(|&t| u64::try_from(t).map_err(|_| unexpected(&reply)));
        let state = KeyState {
            count: u64::try_from(count).map_err(|_| unexpected(&reply))?,
            oldest_ms: u64::try_from(oldest).ok(),
            reset_after: ms(reset_after),
        };
        Ok(KeyTimeline { state, admissions_ms: admissions_ms.collect::<Result<_, _>>()? })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_unique_and_short() {
        let m = Members::new();
        let a = m.next();
        let b = m.next();
        assert_ne!(a, b);
        assert_eq!(a.len(), 12);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(Members::new().id, m.id, "two instances draw different ids");
    }

    #[test]
    fn base62_pads_and_encodes() {
        let mut s = String::new();
        push_base62(&mut s, 0, 3);
        push_base62(&mut s, 61, 1);
        push_base62(&mut s, 62, 1);
        assert_eq!(s, "000z01");
    }
}
