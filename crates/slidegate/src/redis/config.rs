//! What a [`RedisBackend`] is set up with — key prefix, clock, deadline, engine, Cluster slot
//! check, replicas acknowledging admissions — the builder methods that set it, and the Redis key each limited key maps to.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::members::Members;
use super::outlook::Outlook;
use super::{RedisBackend, RedisEngine};
use crate::state::MAX_CLOCK_MS;
use crate::{Algorithm, Clock};

/// The deadline of one backend call unless set otherwise: a sick Redis must not hold requests.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The key namespace unless set otherwise: keys are `slidegate:<key>`.
pub const DEFAULT_PREFIX: &str = "slidegate";

/// A backend's settings, shared by its clones until one of them changes a setting.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) prefix: String,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) timeout: Duration,
    pub(super) one_slot: bool,
    pub(super) engine: RedisEngine,
    /// Set: the sliding-log script's order is fixed (`true`: expecting a denial) instead of
    /// guessed by [`Outlook`].
    pub(super) fixed_order: Option<bool>,
    /// The replicas each admission waits for (`WAIT`); 0: none (`replicas.rs`).
    pub(super) replicas_ack: u32,
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
                replicas_ack: 0,
            }),
            members: Arc::new(Members::new()),
            module: Arc::default(),
            outlook: Arc::new(Outlook::new()),
            acks: Arc::default(),
        }
    }

    /// Chooses the code that decides (default [`RedisEngine::Auto`]).
    #[must_use]
    pub fn with_engine(mut self, engine: RedisEngine) -> Self {
        Arc::make_mut(&mut self.config).engine = engine;
        self
    }

    /// Namespaces keys as `<prefix>:<key>`; an empty prefix uses the key as it is.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.config).prefix = prefix.into();
        self
    }

    /// Takes "now" from `clock` instead of Redis' `TIME` (deterministic tests, replays).
    /// Every client of a key must then share one clock; a reading past [`MAX_CLOCK_MS`] is
    /// refused ([`Error::ClockOutOfRange`](crate::Error::ClockOutOfRange)). Redis' own key
    /// expiry still runs on Redis' clock, so keys then expire one window plus one minute after
    /// the last admission: a caller's clock that lags Redis' by more than a minute can lose
    /// live entries.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        Arc::make_mut(&mut self.config).clock = Some(Arc::new(clock));
        self
    }

    /// The deadline of each call (default [`DEFAULT_TIMEOUT`]); past it the call fails with
    /// [`Error::Timeout`](crate::Error::Timeout).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).timeout = timeout;
        self
    }

    /// Refuses, with [`Error::CrossSlot`](crate::Error::CrossSlot) and before sending anything, a
    /// multi-limit check whose Redis keys do not share one Cluster slot — as a Redis Cluster
    /// would, but typed and early. Standalone Redis does not need it; turn it on to catch keys
    /// that will not work once the same code runs against a Cluster.
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

    /// The key a `replicas_ack` `WAIT` writes first (`replicas.rs`): `<prefix>.ack`, which no
    /// limiter key is under a prefix (those are `<prefix>[.tag]:<key>`; under an empty prefix
    /// every key is the caller's own).
    pub(super) fn ack_key(&self) -> String {
        format!("{}.ack", self.config.prefix)
    }

    /// "Now" for the scripts and the module when the caller's clock decides; `None` leaves it
    /// to Redis' `TIME`. A reading past [`MAX_CLOCK_MS`] is refused before anything is sent.
    pub(super) fn now_arg(&self) -> Result<Option<u64>, crate::Error> {
        match self.config.clock.as_ref().map(|c| c.now_ms()) {
            Some(now) if now > MAX_CLOCK_MS => Err(crate::Error::ClockOutOfRange { now, max: MAX_CLOCK_MS }),
            now => Ok(now),
        }
    }
}
