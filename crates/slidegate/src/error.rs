//! The one error type of the library.

use std::time::Duration;

/// Everything that can go wrong in a check. A denial is not an error (see [`crate::Decision`]).
///
/// [`Error::class`] says whom an error is on — the caller, a backend failing for now, or a
/// backend answering with an error — and so whether a failure policy may answer it.
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
    /// A cost of zero, or more than an idle key admits at once (such a request could never be
    /// admitted; see [`crate::Quota::max_cost`]).
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
    /// The backend did not answer within its deadline, or could not take the command within
    /// it (the Redis connection's queue is full).
    #[error("backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed: [`Error::class`] tells which
    /// (a connection failure or `BUSY`, `LOADING`, `READONLY`… is a backend failure; a script
    /// error, `WRONGTYPE`, an unknown command is not).
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
    /// The clock a Redis backend was given ([`crate::RedisBackend::with_clock`]) reads past
    /// [`crate::MAX_CLOCK_MS`]: nothing is sent.
    #[cfg(feature = "redis")]
    #[error("the limiter's clock reads {now} ms, past the latest time a Redis backend takes ({max} ms)")]
    ClockOutOfRange {
        /// What the clock read.
        now: u64,
        /// [`crate::MAX_CLOCK_MS`].
        max: u64,
    },
    /// TLS to Redis cannot be set up as configured: `what` (a certificate or key file, the
    /// system's certificate store) and why. Raised at start, before anything is sent.
    #[cfg(feature = "redis")]
    #[error("TLS to Redis: {what}: {reason}")]
    Tls {
        /// The file (or store) at fault.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Fewer replicas than asked acknowledged an admission in time: within half of what was
    /// left of the call's deadline ([`crate::RedisBackend::with_replicas_ack`]). The admission
    /// is recorded on the master only, and a failover could lose it.
    #[cfg(feature = "redis")]
    #[error("{acked} of the {wanted} replicas asked for acknowledged the admission in time")]
    ReplicasAck {
        /// The replicas asked for.
        wanted: u32,
        /// The replicas that acknowledged.
        acked: u64,
    },
    /// Redis answered something the script cannot have returned (a different script under the
    /// same name, a proxy in between).
    #[error("unexpected reply from backend: {0}")]
    UnexpectedReply(String),
}

/// Who an error is on, and so what answers it: see [`Error::class`].
///
/// The line between the last two is whether a request can cause the error. A failure policy
/// answers only for errors no request can cause: were a caller able to provoke an error that
/// fail-open answers, it could make the limiter admit at will.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The caller's input: a key, quota, cost or group the limiter refuses. Retrying the same
    /// request fails the same way. Never answered by a failure policy, never counted by the
    /// circuit breaker; a server answers it HTTP 400 / gRPC `INVALID_ARGUMENT`.
    Caller,
    /// The backend cannot decide now, for a reason of its own: unreachable (a transport error,
    /// a refused or reset connection), slow (a missed deadline, a full queue, an open circuit),
    /// refusing for now (`BUSY`, `LOADING`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`,
    /// `READONLY`, `OOM`…), or not set up as configured (refused credentials, a forced module
    /// that is not loaded). The one class a failure policy answers and the circuit breaker
    /// counts; a server answers it HTTP 503 / gRPC `UNAVAILABLE` when no policy does.
    BackendFailure,
    /// Neither: the backend answered, with an error a request's content can provoke and that a
    /// failure policy must therefore not hide (fail-open would admit) — a script error such as
    /// `too many results to unpack`, a key of another type where the limiter's key is
    /// (`WRONGTYPE`), an unknown command, an ACL refusing a key (`NOPERM`), a reply the scripts
    /// cannot have given. Returned as it is, never counted by the breaker; a server answers it
    /// HTTP 500 / gRPC `INTERNAL`.
    BackendError,
}

impl Error {
    /// Which [`ErrorClass`] this error is. Every variant is listed here, once: the one place
    /// the limiter, its circuit breaker and the server learn whom an error is on.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidLimit { .. }
            | Self::InvalidWindow { .. }
            | Self::InvalidCost { .. }
            | Self::InvalidQuota(_)
            | Self::EmptyKey
            | Self::KeyTooLong { .. }
            | Self::CheckCount { .. }
            | Self::DuplicateKey { .. }
            | Self::UnknownAlgorithm(_)
            | Self::CrossSlot { .. } => ErrorClass::Caller,
            Self::CircuitOpen | Self::Timeout(_) => ErrorClass::BackendFailure,
            Self::UnexpectedReply(_) => ErrorClass::BackendError,
            #[cfg(feature = "redis")]
            Self::UnknownEngine(_) => ErrorClass::Caller,
            #[cfg(feature = "redis")]
            Self::ModuleNotLoaded | Self::Tls { .. } | Self::ReplicasAck { .. } => ErrorClass::BackendFailure,
            #[cfg(feature = "redis")]
            Self::ClockOutOfRange { .. } => ErrorClass::BackendError,
            #[cfg(feature = "redis")]
            Self::Redis(e) => redis_class(e),
        }
    }

    /// Whether this is the backend failing (unreachable, slow, refusing for now) rather than
    /// anything else: the errors a failure policy answers and the circuit breaker counts
    /// ([`ErrorClass::BackendFailure`]).
    pub fn is_backend_failure(&self) -> bool {
        self.class() == ErrorClass::BackendFailure
    }

    /// Whether the call's write was made and only its replicas' acknowledgement failed
    /// ([`Error::ReplicasAck`]): sent again, it would count twice.
    pub(crate) fn is_unacknowledged_write(&self) -> bool {
        #[cfg(feature = "redis")]
        if matches!(self, Self::ReplicasAck { .. }) {
            return true;
        }
        false
    }

    /// Whether this is the caller's mistake ([`ErrorClass::Caller`]): HTTP 400 / gRPC
    /// `INVALID_ARGUMENT`, never a failure.
    pub fn is_caller_error(&self) -> bool {
        self.class() == ErrorClass::Caller
    }
}

/// Redis error codes of a server that cannot serve now, beyond those redis-rs names: `BUSY` (a
/// script or function running past `busy-reply-threshold`), `OOM` (`maxmemory` reached under
/// `noeviction`), `NOREPLICAS` (`min-replicas-to-write` not met), `MISCONF` (writes stopped
/// after a failed snapshot), `NOAUTH` and `WRONGPASS` (the configured credentials refused).
#[cfg(feature = "redis")]
const UNAVAILABLE_CODES: [&str; 6] = ["BUSY", "OOM", "NOREPLICAS", "MISCONF", "NOAUTH", "WRONGPASS"];

/// The class of a Redis error: transport errors and the replies of a server that cannot serve
/// now are failures; `CROSSSLOT` is the caller's keys; everything else Redis said (a script
/// error, `WRONGTYPE`, an unknown command, `NOPERM`, a reply that does not convert) is an error
/// to report, not to fail over.
#[cfg(feature = "redis")]
fn redis_class(e: &redis::RedisError) -> ErrorClass {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    match e.kind() {
        K::Io
        | K::AuthenticationFailed
        | K::ClusterConnectionNotFound
        | K::MasterNameNotFoundBySentinel
        | K::NoValidReplicasFoundBySentinel => ErrorClass::BackendFailure,
        K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly | S::Moved | S::Ask) => {
            ErrorClass::BackendFailure
        }
        K::Server(S::CrossSlot) => ErrorClass::Caller,
        _ if e.code().is_some_and(|code| UNAVAILABLE_CODES.contains(&code)) => ErrorClass::BackendFailure,
        // Redis' refusal of one connection too many comes as a plain `ERR`.
        _ if e.detail().is_some_and(|d| d.starts_with("max number of clients reached")) => ErrorClass::BackendFailure,
        _ => ErrorClass::BackendError,
    }
}
