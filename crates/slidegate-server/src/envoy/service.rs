//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over the service's limiter.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use slidegate::{Check, Decision, Error, Quota};
use tonic::{Request, Response, Status};

use super::config::{Limit, Node, Unit};
use crate::app::App;
use crate::metrics::EnvoyCounters;

/// The gRPC service: one per server, sharing the HTTP API's limiter, backend and metrics.
#[derive(Debug, Clone)]
pub struct EnvoyRateLimit {
    app: Arc<App>,
}

impl EnvoyRateLimit {
    /// The service over `app`.
    pub fn new(app: Arc<App>) -> Self {
        Self { app }
    }
}

/// One descriptor of a request, as matched against the configuration.
struct Item<'a> {
    node: Option<&'a Node>,
    /// The backend key: `<domain>:{<key>_<value>.<key>_<value>…}`.
    key: String,
    /// The metrics key of a descriptor without configured counters: the request's values
    /// (`detailed_metric`, or no match).
    stat: Option<String>,
    cost: u64,
}

impl Item<'_> {
    fn limit(&self) -> Option<&Limit> {
        self.node.and_then(|n| n.limit.as_ref())
    }

    fn shadow(&self) -> bool {
        self.node.is_some_and(|n| n.shadow_mode)
    }
}

/// How one descriptor came out.
enum Outcome {
    /// No limit applies (none configured, or replaced).
    NoLimit,
    /// `unlimited: true`.
    Unlimited,
    /// Over before asking the backend: `requests_per_unit: 0`, or more hits than could ever fit.
    Refused,
    /// The backend's decision.
    Decided(Decision),
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRateLimit {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        // The same answers envoyproxy/ratelimit gives to malformed requests.
        if request.domain.is_empty() {
            return Err(Status::unknown("rate limit domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(Status::unknown("rate limit descriptor list must not be empty"));
        }
        let config = self.app.envoy();
        let domain = request.domain.as_str();
        let mut items: Vec<Item<'_>> = Vec::with_capacity(request.descriptors.len());
        for d in &request.descriptors {
            let entries: Vec<(&str, &str)> = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            let node = config.find(domain, &entries);
            let path: Vec<String> = entries.iter().map(|(k, v)| format!("{k}_{v}")).collect();
            let key = format!("{domain}:{{{}}}", path.join("."));
            let stat = match node {
                Some(n) if !n.detailed_metric => None,
                _ => Some(path.join(".")),
            };
            let hits = d.hits_addend.as_ref().map_or(u64::from(request.hits_addend), |h| h.value);
            items.push(Item { node, key, stat, cost: hits.max(1) });
        }
        // A limit named in another matched limit's `replaces` gives way to it: that descriptor
        // has no limit in this request.
        let replaced: Vec<String> =
            items.iter().filter_map(Item::limit).flat_map(|l| l.replaces.iter().cloned()).collect();
        for item in &mut items {
            if item.limit().and_then(|l| l.name.as_ref()).is_some_and(|n| replaced.contains(n)) {
                item.node = None;
            }
        }
        let outcomes = self.decide(&items).await?;

        let mut statuses = Vec::with_capacity(items.len());
        let mut over = false;
        let mut tightest: Option<(&Item<'_>, &Limit, &Decision)> = None;
        for (item, outcome) in items.iter().zip(&outcomes) {
            let limit = item.limit();
            let current_limit = limit.filter(|l| !l.unlimited).map(|l| CurrentLimit {
                name: l.name.clone().unwrap_or_default(),
                requests_per_unit: u32::try_from(l.requests_per_unit).unwrap_or(u32::MAX),
                unit: pb_unit(l.unit) as i32,
            });
            let (within, remaining, reset) = match outcome {
                Outcome::NoLimit => (true, 0, None),
                Outcome::Unlimited => (true, u32::MAX, None),
                Outcome::Refused => (false, 0, limit.map(|l| l.unit.window())),
                Outcome::Decided(d) => {
                    if let Some(l) = limit
                        && tightest.is_none_or(|(_, _, t)| d.remaining < t.remaining)
                    {
                        tightest = Some((item, l, d));
                    }
                    (
                        d.allowed || d.retry_after.is_none(),
                        u32::try_from(d.remaining).unwrap_or(u32::MAX),
                        Some(d.retry_after.unwrap_or(d.reset_after)),
                    )
                }
            };
            let shadow = item.shadow();
            over |= !within && !shadow;
            if limit.is_some() {
                count(domain, item, limit, within, shadow, remaining);
            }
            statuses.push(DescriptorStatus {
                code: if within || shadow { Code::Ok } else { Code::OverLimit } as i32,
                current_limit,
                limit_remaining: remaining,
                duration_until_reset: reset.map(pb_duration),
                quota: None,
            });
        }
        let response_headers_to_add = match (self.app.envoy_headers(), tightest) {
            (true, Some((_, l, d))) => rate_limit_headers(l, d),
            _ => Vec::new(),
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}

impl EnvoyRateLimit {
    /// Decides the request's descriptors. Enforced ones are decided together, all or nothing
    /// (an over-limit request consumes nothing anywhere); shadow ones each on their own, so
    /// that a shadow limit can never hold back an enforced one. On a Redis Cluster, enforced
    /// descriptors whose keys live in different slots are decided one by one, in order.
    async fn decide(&self, items: &[Item<'_>]) -> Result<Vec<Outcome>, Status> {
        let quota_of = |item: &Item<'_>| -> Result<Quota, Outcome> {
            let Some(limit) = item.limit() else { return Err(Outcome::NoLimit) };
            if limit.unlimited {
                return Err(Outcome::Unlimited);
            }
            match limit.quota {
                Some(q) if item.cost <= q.max_cost() => Ok(q),
                _ => Err(Outcome::Refused),
            }
        };
        let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(items.len());
        let mut enforced: Vec<(usize, Check<'_>)> = Vec::new();
        let limiter = &self.app.limiter;
        for (i, item) in items.iter().enumerate() {
            match quota_of(item) {
                Err(outcome) => outcomes.push(Some(outcome)),
                Ok(q) if item.shadow() => {
                    outcomes.push(Some(Outcome::Decided(
                        limiter.check_cost(&item.key, &q, item.cost).await.map_err(unavailable)?,
                    )));
                }
                Ok(q) => {
                    outcomes.push(None);
                    enforced.push((i, Check::new(&item.key, q).with_cost(item.cost)));
                }
            }
        }
        let refused = outcomes.iter().zip(items).any(|(o, item)| matches!(o, Some(Outcome::Refused)) && !item.shadow());
        let checks: Vec<Check<'_>> = enforced.iter().map(|(_, c)| *c).collect();
        let decisions: Vec<Decision> = if checks.is_empty() {
            Vec::new()
        } else if refused {
            // Over already: nothing may be charged. Report the others' standing, read only.
            let mut held = Vec::with_capacity(checks.len());
            for c in &checks {
                held.push(self.standing(c).await?);
            }
            held
        } else if let [one] = checks.as_slice() {
            // One enforced descriptor: the one-key path, which the near-cache can answer.
            vec![self.app.timed(limiter.check_cost(one.key, &one.quota, one.cost)).await.map_err(unavailable)?]
        } else {
            match self.app.timed(limiter.check_all(&checks)).await {
                Ok(group) => group.decisions,
                // Keys in several Cluster slots: no script can see them all. One by one, in
                // request order, stopping at the first over limit: the descriptors before it
                // are charged, those after it are not.
                Err(Error::CrossSlot { .. }) => {
                    let mut one_by_one: Vec<Decision> = Vec::with_capacity(checks.len());
                    for c in &checks {
                        let d = if one_by_one.iter().all(|d| d.allowed) {
                            limiter.check_cost(c.key, &c.quota, c.cost).await.map_err(unavailable)?
                        } else {
                            self.standing(c).await?
                        };
                        one_by_one.push(d);
                    }
                    one_by_one
                }
                Err(e) => return Err(unavailable(e)),
            }
        };
        for ((i, _), d) in enforced.iter().zip(decisions) {
            outcomes[*i] = Some(Outcome::Decided(d));
        }
        Ok(outcomes.into_iter().map(|o| o.unwrap_or(Outcome::NoLimit)).collect())
    }
}

impl EnvoyRateLimit {
    /// Where a check stands, read only: a decision that fit but was not charged.
    async fn standing(&self, c: &Check<'_>) -> Result<Decision, Status> {
        let state = self.app.limiter.inspect(c.key, &c.quota).await.map_err(unavailable)?;
        let limit = c.quota.limit();
        Ok(Decision::held(limit, limit.saturating_sub(state.count), state.reset_after))
    }
}

/// A backend failure that no failure policy answered.
fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(e.to_string())
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// envoyproxy/ratelimit's optional headers, for the tightest limit of the request.
fn rate_limit_headers(limit: &Limit, d: &Decision) -> Vec<HeaderValue> {
    let window = limit.unit.window().as_secs();
    let reset = slidegate_tower::ceil_secs(d.retry_after.unwrap_or(d.reset_after));
    [
        ("x-ratelimit-limit", format!("{}, {};w={window}", limit.requests_per_unit, limit.requests_per_unit)),
        ("x-ratelimit-remaining", d.remaining.to_string()),
        ("x-ratelimit-reset", reset.to_string()),
    ]
    .into_iter()
    .map(|(key, value)| HeaderValue { key: key.to_owned(), value, ..HeaderValue::default() })
    .collect()
}

/// The counters envoyproxy/ratelimit's users graph, by domain and descriptor key: a configured
/// descriptor's own (registered at its first hit), or, by the request's values, looked up.
fn count(domain: &str, item: &Item<'_>, limit: Option<&Limit>, within: bool, shadow: bool, remaining: u32) {
    let looked_up;
    let counters = match (item.node, &item.stat) {
        (Some(n), None) => n.counters.get_or_init(|| EnvoyCounters::new(domain, &n.stat_key)),
        (_, stat) => {
            looked_up = EnvoyCounters::new(domain, stat.as_deref().unwrap_or_default());
            &looked_up
        }
    };
    counters.total.increment(item.cost);
    if !within {
        counters.over.increment(item.cost);
        if shadow {
            counters.shadow.increment(item.cost);
        }
        return;
    }
    counters.within.increment(item.cost);
    // Near: 80% or more of the limit used once this request is counted.
    if let Some(l) = limit.filter(|l| !l.unlimited && l.requests_per_unit > 0)
        && u64::from(remaining) * 5 <= l.requests_per_unit
    {
        counters.near.increment(item.cost);
    }
}
