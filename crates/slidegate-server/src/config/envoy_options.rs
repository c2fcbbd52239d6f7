//! The Envoy service's settings, envoyproxy/ratelimit's environment variables in slidegate's
//! form: each is a `serve` flag, a rules-file setting of the same name and an environment
//! variable `SLIDEGATE_<FLAG>` (docs/envoy.md has the table).

/// The near-limit ratio when none is set (upstream's `NEAR_LIMIT_RATIO` default).
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

/// How the service answers and counts, fixed at start.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyOptions {
    /// Files declaring the same domain are merged instead of refused (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// Every request over a limit is answered OK, and counted (`SHADOW_MODE`).
    pub shadow_mode: bool,
    /// Every descriptor is in quota mode (`QUOTA_MODE`).
    pub quota_mode: bool,
    /// The share of a limit past which hits count as near it, in `0..=1` (`NEAR_LIMIT_RATIO`).
    pub near_limit_ratio: f64,
    /// The response headers, when they are added (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub headers: ResponseHeaders,
    /// Answers carry the request and the passed limits' `metadata` as dynamic metadata
    /// (`RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        Self {
            merge_domains: false,
            shadow_mode: false,
            quota_mode: false,
            near_limit_ratio: DEFAULT_NEAR_LIMIT_RATIO,
            headers: ResponseHeaders::default(),
            dynamic_metadata: false,
        }
    }
}

/// The rate-limit headers added to Envoy's answers to its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeaders {
    /// Whether they are added at all.
    pub enabled: bool,
    /// Which headers.
    pub style: HeaderStyle,
    /// The limit header's name (`LIMIT_LIMIT_HEADER`), for [`HeaderStyle::Upstream`].
    pub limit: String,
    /// The remaining header's name (`LIMIT_REMAINING_HEADER`).
    pub remaining: String,
    /// The reset header's name (`LIMIT_RESET_HEADER`).
    pub reset: String,
}

impl Default for ResponseHeaders {
    fn default() -> Self {
        Self {
            enabled: false,
            style: HeaderStyle::Upstream,
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

/// Which rate-limit headers an answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderStyle {
    /// envoyproxy/ratelimit's three headers for the descriptor nearest its limit (the one over
    /// it, when one is): `RateLimit-Limit: 10`, `RateLimit-Remaining: 3`, `RateLimit-Reset: 42`.
    Upstream,
    /// The IETF draft's (draft-ietf-httpapi-ratelimit-headers) two structured fields, one list
    /// member per limit: `RateLimit-Policy: "per_ip";q=10;w=60` and
    /// `RateLimit: "per_ip";r=3;t=42`.
    Ietf,
}

impl std::str::FromStr for HeaderStyle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "upstream" => Ok(Self::Upstream),
            "ietf" => Ok(Self::Ietf),
            other => Err(format!("{other:?} is not one of \"upstream\", \"ietf\"")),
        }
    }
}

impl EnvoyOptions {
    /// Checks the values a file or a flag may get wrong: `Err((field, message))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            let message = format!("must be between 0 and 1, got {}", self.near_limit_ratio);
            return Err(("envoy_near_limit_ratio", message));
        }
        let h = &self.headers;
        for (field, name) in [
            ("envoy_limit_header", &h.limit),
            ("envoy_remaining_header", &h.remaining),
            ("envoy_reset_header", &h.reset),
        ] {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err((field, format!("{name:?} is not a header name")));
            }
        }
        Ok(())
    }
}
