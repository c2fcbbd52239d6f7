//! Exact distributed rate limiting: *may this key do this now?* — one answer across every
//! instance of a service, from a sliding window log.
//!
//! A fixed-window counter (`INCR` + `EXPIRE`) admits twice its limit around a window edge: 100 at
//! 00:59 and 100 more at 01:01. The sliding window log keeps one timestamp per admission and
//! counts exactly the admissions of the last `window`, so no rolling window ever holds more than
//! `limit`. On Redis the whole decision is one atomic Lua script on one sorted set per key, timed
//! by Redis' own clock; in memory it is the same algorithm under a sharded lock.
//!
//! ```
//! use slidegate::{Limiter, Quota};
//! use std::time::Duration;
//!
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # rt.block_on(async {
//! // At most 5 SMS per phone number in any 10 seconds, on the embedded backend.
//! let limiter = Limiter::in_memory();
//! let quota = Quota::new(5, Duration::from_secs(10))?;
//! for i in 1..=7 {
//!     let d = limiter.check("+15550100", &quota).await?;
//!     assert_eq!(d.allowed, i <= 5);
//! }
//! # Ok::<(), slidegate::Error>(()) }).unwrap();
//! ```
//!
//! With the `redis` feature, `Limiter::new(RedisBackend::connect("redis://127.0.0.1").await?)`
//! makes the same limit hold across every process that shares the Redis.
//!
//! # Layout
//!
//! - [`quota`]: what a key may do — [`Quota`] (limit, window, [`Algorithm`], [`WarmUp`]).
//! - [`decision`]: the answer — [`Decision`] (allowed, remaining, reset/retry after) and the
//!   operator's view of a key, [`KeyState`] and [`KeyTimeline`].
//! - [`spec`]: each algorithm's semantics written plainly and run: the specification every
//!   backend is tested against.
//! - [`backend`]: the [`Backend`] trait, where storage varies.
//! - [`state`]: [`state::Counter`], what one key keeps and how it decides in production, shared
//!   by the memory backend and the Redis module (it runs [`spec`]'s own code for the sliding
//!   window, the fixed window and the GCRA); `snapshot.rs`, its persisted format.
//! - [`memory`]: [`MemoryBackend`], the embedded, sharded, self-sweeping default.
//! - `redis` (feature `redis`): [`RedisBackend`], sorted sets and one Lua script per decision.
//! - [`limiter`]: [`Limiter`], the front door that validates input once.
//! - [`resilience`]: [`FailurePolicy`], [`CircuitBreaker`] and [`NearCache`]: what the limiter
//!   does when the backend fails, and how it spares the backend keys already over their limit.
//! - [`write_back`]: what a local policy admitted while the backend was away, written into it
//!   when it answers again ([`Limiter::write_back`]).
//! - [`client_ip`]: the client's address behind trusted proxies, and the key it counts as
//!   (IPv6 by network), for the HTTP surfaces.
//! - [`clock`]: [`Clock`]; [`SystemClock`], the TSC-fast [`MonotonicClock`], and [`ManualClock`]
//!   for tests.
//! - [`key`]: the names keys take in a backend: a rule's key [`rule_key`], `<rule>:{<key>}`, the
//!   one format every surface uses, and [`hash_tag`] for atomic multi-limit checks.
//! - [`slot`]: Redis Cluster slots ([`key_slot`]).
//! - [`headers`]: the RateLimit header fields' names and values, for the HTTP surfaces.
//! - [`error`]: [`Error`], the one error type, and [`ErrorClass`]: whom an error is on.

pub mod backend;
pub mod client_ip;
pub mod clock;
pub mod decision;
pub mod error;
pub mod headers;
pub mod key;
pub mod limiter;
pub mod memory;
pub mod quota;
#[cfg(feature = "redis")]
pub mod redis;
pub mod resilience;
pub mod slot;
mod snapshot;
pub mod spec;
pub mod state;
pub mod write_back;

pub use backend::{Backend, Check};
pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use decision::{Charged, Decision, KeyState, KeyTimeline, MultiDecision, Refunded};
pub use error::{Error, ErrorClass};
pub use key::{RuleKey, hash_tag, rule_key};
pub use limiter::{Limiter, MAX_CHECKS, MAX_KEY_LEN, MAX_TIMELINE, validate_key};
pub use memory::MemoryBackend;
pub use quota::{Algorithm, MAX_CHARGE_FACTOR, MAX_LIMIT, MAX_LOG_LIMIT, MAX_WINDOW, Quota, WarmUp};
#[cfg(feature = "redis")]
pub use redis::{
    PipelinedConnection, RedisBackend, RedisClusterBackend, RedisEngine, RedisSentinelBackend, RedisTls, TlsFiles,
};
pub use resilience::{CircuitBreaker, FailurePolicy, Fleet, NearCache};
pub use slot::key_slot;
pub use state::MAX_CLOCK_MS;
pub use write_back::{MAX_WRITE_BACK, WriteBack};
