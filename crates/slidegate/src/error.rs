//! The one error type of the library.

use std::time::Duration;

/// Everything that can go wrong in a check. A denial is not an error (see [`crate::Decision`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A quota's limit outside `1..=max`: [`crate::MAX_LIMIT`], or [`crate::MAX_LOG_LIMIT`] for a
    /// sliding log.
    #[error("limit must be between 1 and {max} for this algorithm, got {limit}")]
    InvalidLimit {
        /// The limit given.
        limit: u64,
        /// The largest limit accepted.
        max: u64,
    },
    /// A quota's window that is zero, longer than `MAX_WINDOW`, or not whole milliseconds.
    #[error("window must be whole milliseconds between 1ms and 366 days, got {window:?}")]
    InvalidWindow {
        /// The window given.
        window: Duration,
    },
    /// A cost of zero, more than an idle key admits at once (such a request could never be
    /// admitted; see [`crate::Quota::max_cost`]), or more sliding-log permits than the backend
    /// records in one call ([`crate::Backend::max_log_cost`]; for a multi-limit check, `cost` is
    /// the sum of its sliding logs' costs).
    #[error("cost must be between 1 and {max} here, got {cost}")]
    InvalidCost {
        /// The cost given.
        cost: u64,
        /// The largest cost the quota admits.
        max: u64,
    },
    /// An algorithm's parameters or a warm-up that do not fit the quota.
    #[error("invalid quota: {0}")]
    InvalidQuota(String),
    /// An empty key.
    #[error("key must not be empty")]
    EmptyKey,
    /// A key longer than [`crate::MAX_KEY_LEN`] bytes.
    #[error("key is {len} bytes long, the maximum is {max}", max = crate::MAX_KEY_LEN)]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// A multi-limit check with no checks, or more than [`crate::MAX_CHECKS`].
    #[error("a multi-limit check needs 1 to {max} checks, got {count}", max = crate::MAX_CHECKS)]
    CheckCount {
        /// The number of checks given.
        count: usize,
    },
    /// The same key twice in one multi-limit check (each key can be charged once per check).
    #[error("key {key:?} appears more than once in one multi-limit check")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// An algorithm name that is not known.
    #[error("unknown algorithm {0:?} (known: sliding_log, sliding_window, fixed_window, gcra)")]
    UnknownAlgorithm(String),
    /// The keys of one multi-limit check live in different Redis Cluster slots, so no script
    /// can decide them atomically. Detected before anything is sent.
    #[error(
        "keys {first:?} and {other:?} are in different Redis Cluster slots; give them one hash tag, e.g. slidegate::hash_tag(\"user:42\", \"sms\") = \"{{user:42}}:sms\""
    )]
    CrossSlot {
        /// The first key's Redis key.
        first: String,
        /// A Redis key in another slot.
        other: String,
    },
    /// The circuit breaker is open (the backend kept failing) and no failure policy applies.
    #[error("the backend's circuit is open after repeated failures")]
    CircuitOpen,
    /// The backend did not answer within its deadline.
    #[error("backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    #[cfg(feature = "redis")]
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The Redis engine is forced to the module ([`crate::RedisEngine::Module`]) but the server
    /// does not have slidegate's module loaded.
    #[cfg(feature = "redis")]
    #[error("Redis has no slidegate module loaded, and the engine is forced to \"module\"")]
    ModuleNotLoaded,
    /// A Redis engine name that is not known.
    #[cfg(feature = "redis")]
    #[error("unknown Redis engine {0:?} (known: auto, lua, module)")]
    UnknownEngine(String),
    /// Redis answered something the script cannot have returned (a different script under the
    /// same name, a proxy in between).
    #[error("unexpected reply from backend: {0}")]
    UnexpectedReply(String),
}

impl Error {
    /// Whether this is the backend failing (unreachable, slow, broken) rather than the caller's
    /// mistake: the errors a failure policy answers for.
    pub fn is_backend_failure(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::UnexpectedReply(_) | Self::CircuitOpen => true,
            #[cfg(feature = "redis")]
            Self::Redis(_) | Self::ModuleNotLoaded => true,
            _ => false,
        }
    }
}
