//! The `Layer`: the limiter, the rules and the 429 answer, shared by every service it wraps.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use metrics::{Counter, Histogram};
use slidegate::{Backend, Check, Decision, Limiter, MemoryBackend, Quota};

use crate::{RateLimit, Rule, rate_limit_headers};

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
///     .layer(RateLimitLayer::new(Limiter::in_memory()).rule(Rule::new("login", Quota::per_minute(5)?)?));
/// # Ok(app) }
/// ```
///
/// Failures: the limiter's failure policy answers when the backend cannot
/// ([`Limiter::with_failure_policy`]); an error it leaves unanswered lets the request through
/// (counted in `rate_limit.error`) — a limiter outage must not become an API outage.
///
/// Metrics (through the `metrics` facade, by `rule`): `rate_limit.pass`, `rate_limit.block`,
/// `rate_limit.degraded`, `rate_limit.shadow_block`, `rate_limit.error`, and the histogram
/// `rate_limit.latency` (seconds per decision).
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
    limiter: Limiter<B>,
    rules: Vec<Rule>,
    counters: Vec<RuleCounters>,
    latency: Histogram,
    errors: Counter,
    pub(crate) deny_type: HeaderValue,
    pub(crate) deny_body: Bytes,
    shadow: bool,
}

#[derive(Clone)]
struct RuleCounters {
    pass: Counter,
    block: Counter,
    degraded: Counter,
    shadow_block: Counter,
}

impl RuleCounters {
    fn new(rule: &str) -> Self {
        let c = |name: &'static str| metrics::counter!(name, "rule" => rule.to_owned());
        Self {
            pass: c("rate_limit.pass"),
            block: c("rate_limit.block"),
            degraded: c("rate_limit.degraded"),
            shadow_block: c("rate_limit.shadow_block"),
        }
    }
}

/// What the layer decided for one request.
pub(crate) struct Outcome {
    /// RateLimit headers for the response (none when no rule applied).
    pub(crate) headers: Option<HeaderMap>,
    /// Answer 429 instead of calling the service.
    pub(crate) deny: bool,
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
                latency: metrics::histogram!("rate_limit.latency"),
                errors: metrics::counter!("rate_limit.error"),
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

    /// Adds a rule.
    #[must_use]
    pub fn rule(self, rule: Rule) -> Self {
        self.with(|s| {
            s.counters.push(RuleCounters::new(&rule.name));
            s.rules.push(rule);
        })
    }

    /// The body of a 429 answer and its content type (default `Too Many Requests`, plain text).
    #[must_use]
    pub fn deny_body(self, content_type: HeaderValue, body: impl Into<Bytes>) -> Self {
        self.with(|s| (s.deny_type, s.deny_body) = (content_type, body.into()))
    }

    /// Shadow mode: decide and record (headers, metrics, counts in the backend) but never block:
    /// to try rules on live traffic before enforcing them.
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

impl<B: Backend> Shared<B> {
    /// Decides `request` against every rule that applies to it, all together.
    pub(crate) async fn decide(&self, request: &Parts) -> Outcome {
        let mut applied: Vec<(usize, String, Quota, u64)> = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.matches(request) {
                continue;
            }
            // `<rule>:{<key>}`: readable, and one hash tag per key, so one key's rules share a
            // Redis Cluster slot (as the slidegate service keys them).
            let mut key = String::with_capacity(rule.name.len() + 48);
            key.push_str(&rule.name);
            key.push_str(":{");
            if !rule.key.extract(request, &mut key) {
                continue;
            }
            key.push('}');
            let (quota, cost) = rule.quota_and_cost(request);
            applied.push((i, key, quota, cost));
        }
        if applied.is_empty() {
            return Outcome { headers: None, deny: false };
        }
        let started = Instant::now();
        let decided: Result<Vec<Decision>, slidegate::Error> = match applied.as_slice() {
            [(_, key, quota, cost)] => self.limiter.check_cost(key, quota, *cost).await.map(|d| vec![d]),
            many => {
                let checks: Vec<Check<'_>> = many.iter().map(|(_, k, q, c)| Check::new(k, *q).with_cost(*c)).collect();
                self.limiter.check_all(&checks).await.map(|group| group.decisions)
            }
        };
        self.latency.record(started.elapsed().as_secs_f64());
        let Ok(decisions) = decided else {
            self.errors.increment(1);
            return Outcome { headers: None, deny: false };
        };
        let allowed = decisions.iter().all(|d| d.allowed);
        for ((i, ..), d) in applied.iter().zip(&decisions) {
            let c = &self.counters[*i];
            match (d.allowed || allowed, self.shadow) {
                (true, _) => c.pass.increment(1),
                (false, false) => c.block.increment(1),
                (false, true) => c.shadow_block.increment(1),
            }
            if d.degraded.is_some() {
                c.degraded.increment(1);
            }
        }
        let retry = if allowed { None } else { decisions.iter().filter_map(|d| d.retry_after).max() };
        let items: Vec<(&str, &Quota, &Decision)> =
            applied.iter().zip(&decisions).map(|((i, _, q, _), d)| (self.rules[*i].name.as_str(), q, d)).collect();
        Outcome { headers: Some(rate_limit_headers(&items, retry)), deny: !allowed && !self.shadow }
    }
}
