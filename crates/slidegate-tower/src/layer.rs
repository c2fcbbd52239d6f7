//! The `Layer`: the limiter, the rules and the 429 answer, shared by every service it wraps.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use metrics::{Counter, Histogram};
use slidegate::{Backend, Limiter, MemoryBackend};

use crate::metrics::{DECISION_SECONDS, DECISIONS};
use crate::{Error, RateLimit, Rule};

/// Rate limits the services it wraps: each request is decided against every [`Rule`] that
/// applies to it, all together (one backend round trip, all or nothing). Over a limit the
/// answer is `429 Too Many Requests` with `Retry-After`, `RateLimit-Policy` and `RateLimit`
/// (draft-ietf-httpapi-ratelimit-headers-09/-10); within it the inner response gets the same
/// RateLimit headers.
///
/// ```
/// use axum::{Router, routing::post};
/// use slidegate::{Limiter, Quota};
/// use slidegate_tower::{RateLimitLayer, Rule};
///
/// # fn build() -> Result<Router, Box<dyn std::error::Error>> {
/// let app = Router::new()
///     .route("/login", post(|| async { "welcome" }))
///     .layer(RateLimitLayer::new(Limiter::in_memory()).rule(Rule::new("login", Quota::per_minute(5)?)?)?);
/// # Ok(app) }
/// ```
///
/// A request whose key or cost cannot be counted (empty, too long, a cost of 0) is answered by
/// the layer with a [`crate::Rejection`] — a 4xx, never passed on (see [`crate::KeyExtractor`],
/// [`Rule::cost_by`]). On a Redis Cluster, rules whose keys live in different slots are
/// decided one by one, in order, stopping at the first denial (the rules before it stay
/// charged); so are more than [`slidegate::MAX_CHECKS`] rules on one request.
///
/// A gRPC request (`content-type: application/grpc…`, as tonic sends) is answered as gRPC
/// clients expect instead: `200 OK` with the status in the headers (a trailers-only answer),
/// `grpc-status: 8` (`RESOURCE_EXHAUSTED`) over the limit, with the delay in
/// `grpc-status-details-bin` (a `google.rpc.RetryInfo`, as `tonic_types::StatusExt` reads it)
/// and in `grpc-retry-pushback-ms` (gRPC's own retry policy reads it), and `3`
/// (`INVALID_ARGUMENT`) or `13` (`INTERNAL`) for a rejection. A tonic client reads a bare 429 as
/// `UNAVAILABLE`, which it would retry at once.
///
/// Failures: the limiter's failure policy answers when the backend cannot
/// ([`Limiter::with_failure_policy`]); a backend failure ([`slidegate::Error::is_backend_failure`])
/// it leaves unanswered lets the request through (counted in
/// `slidegate_backend_errors_total`) — a limiter outage must not become an API outage. Any other
/// limiter error is never a pass.
///
/// Metrics (through the `metrics` facade; names in [`crate::metrics`]):
/// `slidegate_decisions_total{rule,result}`, `slidegate_degraded_decisions_total{rule,policy}`,
/// `slidegate_backend_errors_total{kind}`, `slidegate_rejected_requests_total{rule,code}`, and
/// the histogram `slidegate_decision_seconds`.
pub struct RateLimitLayer<B = MemoryBackend> {
    shared: Arc<Shared<B>>,
}

impl<B> Clone for RateLimitLayer<B> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<B> std::fmt::Debug for RateLimitLayer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.rules)
            .field("shadow", &self.shared.shadow)
            .finish()
    }
}

#[derive(Clone)]
pub(crate) struct Shared<B> {
    pub(crate) limiter: Limiter<B>,
    pub(crate) rules: Vec<Rule>,
    pub(crate) counters: Vec<RuleCounters>,
    pub(crate) latency: Histogram,
    pub(crate) deny_type: HeaderValue,
    pub(crate) deny_body: Bytes,
    pub(crate) shadow: bool,
}

/// One rule's decision counters, registered once so that counting is an atomic add.
#[derive(Clone)]
pub(crate) struct RuleCounters {
    pub(crate) allowed: Counter,
    pub(crate) denied: Counter,
    pub(crate) shadow_denied: Counter,
}

impl RuleCounters {
    fn new(rule: &str) -> Self {
        let c = |result: &'static str| metrics::counter!(DECISIONS, "rule" => rule.to_owned(), "result" => result);
        Self { allowed: c("allowed"), denied: c("denied"), shadow_denied: c("shadow_denied") }
    }
}

impl<B: Backend + Clone> RateLimitLayer<B> {
    /// A layer deciding with `limiter` (any backend; set its failure policy and near-cache
    /// there), with no rules yet.
    pub fn new(limiter: Limiter<B>) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                rules: Vec::new(),
                counters: Vec::new(),
                latency: metrics::histogram!(DECISION_SECONDS),
                deny_type: HeaderValue::from_static("text/plain; charset=utf-8"),
                deny_body: Bytes::from_static(b"Too Many Requests\n"),
                shadow: false,
            }),
        }
    }

    /// The layer changed by `f`; a clone made earlier (or a service it built) keeps its settings.
    fn with(self, f: impl FnOnce(&mut Shared<B>)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        f(&mut shared);
        Self { shared: Arc::new(shared) }
    }

    /// Adds a rule: [`Error::DuplicateRule`] when the layer has one of that name already,
    /// [`Error::DuplicateTier`] or [`Error::InvalidCost`] when the rule cannot work.
    pub fn rule(self, rule: Rule) -> Result<Self, Error> {
        if self.shared.rules.iter().any(|r| r.name == rule.name) {
            return Err(Error::DuplicateRule(rule.name));
        }
        rule.validate()?;
        Ok(self.with(|s| {
            s.counters.push(RuleCounters::new(&rule.name));
            s.rules.push(rule);
        }))
    }

    /// The body of a 429 answer and its content type (default `Too Many Requests`, plain text).
    #[must_use]
    pub fn deny_body(self, content_type: HeaderValue, body: impl Into<Bytes>) -> Self {
        self.with(|s| (s.deny_type, s.deny_body) = (content_type, body.into()))
    }

    /// Shadow mode: decide and record (headers, metrics, counts in the backend) but never block,
    /// nor refuse a request whose key or cost cannot be counted (still counted in
    /// `slidegate_rejected_requests_total`): to try rules on live traffic before enforcing them.
    #[must_use]
    pub fn shadow(self, on: bool) -> Self {
        self.with(|s| s.shadow = on)
    }

    /// The layer's limiter.
    pub fn limiter(&self) -> &Limiter<B> {
        &self.shared.limiter
    }
}

impl<S, B> tower_layer::Layer<S> for RateLimitLayer<B> {
    type Service = RateLimit<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}
