//! The HTTP listener's deadlines and connection cap, as `[server]` and `serve`'s flags set them.

use std::time::Duration;

/// The time a client gets to send a request head unless `[server] header_read_timeout` says
/// otherwise: ample for any real client (a head is a few hundred bytes), short enough that a
/// stalled connection gives its slot back soon.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The time a request gets, body and backend call included, unless `[server] request_timeout`
/// says otherwise: a body is at most `MAX_BODY` (64 KiB) and a backend call at
/// most `backend.timeout` (≤ 60 s, 50 ms by default), so only a client trickling its body or a
/// backend timeout set near its maximum comes near it.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Open connections unless `[server] max_connections` says otherwise: far more than the
/// connection pools of a fleet of callers keep open, and with the backend's own connections,
/// within the common soft limit of 1,024 open files.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The largest `max_connections` accepted (each connection holds a file descriptor and up to
/// `MAX_HEAD_BYTES` of buffer).
pub const MAX_CONNECTIONS: usize = 100_000;

/// The shortest and longest timeouts accepted.
pub const TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_millis(100)..=Duration::from_secs(3600);

/// Deadlines and the connection cap of the HTTP listener (`[server]` in the rules file, or
/// `serve`'s flags). They apply at start; a reload does not change them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a connection may take to send a request head (also the longest idle time
    /// between two requests on a kept-alive connection).
    pub header_read_timeout: Duration,
    /// How long a request may take, from its head to its answer, body included.
    pub request_timeout: Duration,
    /// The most connections open at once; more are refused.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// One of the [`HttpLimits`], as the rules file's `[server]` table and `serve`'s flags name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpLimit {
    /// `header_read_timeout`.
    HeaderReadTimeout,
    /// `request_timeout`.
    RequestTimeout,
    /// `max_connections`.
    MaxConnections,
}

impl std::fmt::Display for HttpLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::HeaderReadTimeout => "header_read_timeout",
            Self::RequestTimeout => "request_timeout",
            Self::MaxConnections => "max_connections",
        })
    }
}

/// A limit out of its range: which one, and the range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidHttpLimit {
    /// The limit.
    pub field: HttpLimit,
    /// Its range and the value given.
    pub message: String,
}

impl HttpLimits {
    /// Checks each value's range.
    pub fn validate(&self) -> Result<(), InvalidHttpLimit> {
        for (field, value) in [
            (HttpLimit::HeaderReadTimeout, self.header_read_timeout),
            (HttpLimit::RequestTimeout, self.request_timeout),
        ] {
            if !TIMEOUT_RANGE.contains(&value) {
                return Err(InvalidHttpLimit {
                    field,
                    message: format!("must be between 100ms and 1h, got {value:?}"),
                });
            }
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(InvalidHttpLimit {
                field: HttpLimit::MaxConnections,
                message: format!("must be between 1 and {MAX_CONNECTIONS}, got {}", self.max_connections),
            });
        }
        Ok(())
    }

    /// Checks that a request outlasts a backend call of `backend_timeout`: a slow backend must
    /// meet its own deadline (and the failure policy answer) before the request's passes.
    pub fn outlasts(&self, backend_timeout: Duration) -> Result<(), String> {
        if self.request_timeout > backend_timeout {
            return Ok(());
        }
        Err(format!(
            "{} must be longer than backend.timeout ({})",
            humantime::format_duration(self.request_timeout),
            humantime::format_duration(backend_timeout)
        ))
    }
}
