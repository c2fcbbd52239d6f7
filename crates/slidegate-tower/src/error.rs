//! What can go wrong: [`Error`], a layer built with settings that cannot work, and
//! [`Rejection`], a request the layer answers itself because it cannot be counted.

use http::StatusCode;

/// A rule or layer setting that cannot be used, found when the layer is built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A trusted proxy that is neither an IP address nor a CIDR block.
    #[error("trusted proxy {0:?} is not an IP address or a CIDR block like 10.0.0.0/8")]
    InvalidProxy(String),
    /// A rule name that cannot appear in keys and headers.
    #[error("rule name {0:?} must be 1 to 64 letters, digits, `_`, `-` or `.`")]
    InvalidRuleName(String),
    /// Two rules of one layer with the same name: they would count into the same keys and
    /// report the same `RateLimit` policy.
    #[error("two rules are named {0:?}; rule names must be unique within a layer")]
    DuplicateRule(String),
    /// Two tiers of one rule with the same name: only the first could ever be used.
    #[error("rule {rule:?} has two tiers named {tier:?}")]
    DuplicateTier {
        /// The rule.
        rule: String,
        /// The repeated tier.
        tier: String,
    },
    /// A rule's fixed cost ([`crate::Rule::cost`]) that is zero, or more than one of its quotas
    /// admits at once: every request would be refused.
    #[error("rule {rule:?} costs {cost}, but its quotas admit 1 to {max} per request")]
    InvalidCost {
        /// The rule.
        rule: String,
        /// The cost given.
        cost: u64,
        /// The largest cost the rule's tightest quota admits.
        max: u64,
    },
    /// A quota of the rule (or of one of its tiers) that no request could be checked against:
    /// past its algorithm's bounds (a sliding log's limit over [`slidegate::MAX_LOG_LIMIT`]).
    #[error("rule {rule:?}: {source}")]
    InvalidQuota {
        /// The rule.
        rule: String,
        /// Why the quota cannot be used.
        source: slidegate::Error,
    },
    /// A client-address prefix length outside `1..=32` (IPv4) or `1..=128` (IPv6).
    #[error("an {family} prefix must be 1 to {max} bits, got {bits}")]
    InvalidPrefix {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The prefix length given.
        bits: u8,
        /// The longest prefix of the family.
        max: u8,
    },
}

/// Why the layer answered a request itself instead of deciding it: its key or cost cannot be
/// counted. The request is never passed to the service (outside shadow mode) and never counted
/// as a backend failure: the answer carries `{"error":{"code":…,"message":…}}`, a 4xx for the
/// request's own input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The key is empty (a header sent empty, a closure returning `Some("")`):
    /// `400 invalid_key` (the code the slidegate service gives an empty key).
    EmptyKey,
    /// The key is longer than [`slidegate::MAX_KEY_LEN`] bytes with the rule name:
    /// `400 key_too_long`.
    KeyTooLong,
    /// A header the key is read from is too long: a [`crate::Header`] value over
    /// [`slidegate::MAX_KEY_LEN`] bytes, or a forwarding header over
    /// [`crate::peer::MAX_FORWARDED_LEN`]: `431 header_too_long`.
    HeaderTooLong,
    /// A header value the key is read from that is not visible ASCII: `400 invalid_key`.
    InvalidKey,
    /// A [`crate::Route`] key longer than [`slidegate::MAX_KEY_LEN`]: `414 uri_too_long`.
    UriTooLong,
    /// A request's cost (from [`crate::Rule::cost_by`]) of zero, or more than its quota
    /// admits at once: `400 invalid_cost`.
    InvalidCost {
        /// The cost computed.
        cost: u64,
        /// The largest cost the quota admits.
        max: u64,
    },
    /// The limiter refused the request's checks for a reason that is neither the request's
    /// input nor a backend failure (the layer checks keys, costs and slots first, so this is a
    /// bug or a limiter setting the layer does not know): `500 rate_limit_error`, never a pass.
    Undecidable,
}

impl Rejection {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::HeaderTooLong => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UriTooLong => StatusCode::URI_TOO_LONG,
            Self::Undecidable => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The `error.code` of the answer's JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::EmptyKey | Self::InvalidKey => "invalid_key",
            Self::KeyTooLong => "key_too_long",
            Self::HeaderTooLong => "header_too_long",
            Self::UriTooLong => "uri_too_long",
            Self::InvalidCost { .. } => "invalid_cost",
            Self::Undecidable => "rate_limit_error",
        }
    }

    /// The JSON body: `{"error":{"code":…,"message":…}}`. Every message is the crate's own text
    /// and numbers — nothing of the request is echoed — so no escaping is needed.
    pub fn body(&self) -> String {
        format!(r#"{{"error":{{"code":"{}","message":"{}"}}}}"#, self.code(), self.message())
    }

    /// What is wrong, in words (the body's `message`, and a gRPC answer's `grpc-message`).
    pub fn message(&self) -> String {
        match self {
            Self::EmptyKey => "the rate limit key of this request is empty".to_owned(),
            Self::KeyTooLong => {
                format!("the rate limit key of this request is longer than {} bytes", slidegate::MAX_KEY_LEN)
            }
            Self::HeaderTooLong => "a header the rate limit key is read from is too long".to_owned(),
            Self::InvalidKey => "a header the rate limit key is read from is not visible ASCII".to_owned(),
            Self::UriTooLong => {
                format!("the path, the rate limit key of this request, is longer than {} bytes", slidegate::MAX_KEY_LEN)
            }
            Self::InvalidCost { cost, max } => format!("this request costs {cost}; its limit admits 1 to {max}"),
            Self::Undecidable => "the rate limiter could not decide this request".to_owned(),
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status().as_u16(), self.code())
    }
}

impl std::error::Error for Rejection {}
