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
use slidegate::{Check, Decision, Error};
use tonic::{Request, Response, Status};

use super::bounds::{self, Invalid, MAX_DESCRIPTORS};
use super::config::{EnvoyConfig, Limit, Node, Unit};
use super::key::descriptor_key;
use super::stats::count_invalid;
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

/// One decidable descriptor of a request, as matched against the configuration.
struct Item<'a> {
    node: Option<&'a Node>,
    entries: Vec<(&'a str, &'a str)>,
    /// The backend key ([`descriptor_key`]).
    key: String,
    cost: u64,
}

/// A descriptor of a request: decidable, or refused (then not decided, and answered `UNKNOWN`).
type Slot<'a> = Result<Item<'a>, Invalid>;

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
    /// Refused: not decided.
    Invalid(Invalid),
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
        if !config.contains_domain(domain) {
            return Ok(Response::new(nothing_limited(request.descriptors.len())));
        }
        let slots = slots(&config, &request);
        refuse(domain, request.descriptors.len(), &slots)?;
        let outcomes = self.decide(&slots).await?;
        let (over, mut statuses, tightest) = answer(domain, &slots, &outcomes);
        // The descriptors after MAX_DESCRIPTORS: not decided. (`Code::Unknown` is 0, the default.)
        statuses.resize(request.descriptors.len(), DescriptorStatus::default());
        let response_headers_to_add = match (self.app.envoy_headers(), tightest) {
            (true, Some((l, d))) => rate_limit_headers(l, d),
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

/// The answer to a request of an unknown domain, which limits nothing (and whose name is
/// never a metric label).
fn nothing_limited(descriptors: usize) -> RateLimitResponse {
    let ok = DescriptorStatus { code: Code::Ok as i32, ..DescriptorStatus::default() };
    RateLimitResponse { overall_code: Code::Ok as i32, statuses: vec![ok; descriptors], ..Default::default() }
}

/// Counts the request's refused descriptors (of `total`, those past [`MAX_DESCRIPTORS`]
/// included), and fails the request when none of them can be decided: only then is an RPC
/// error — which Envoy answers with its `failure_mode_deny` — the request's answer.
fn refuse(domain: &str, total: usize, slots: &[Slot<'_>]) -> Result<(), Status> {
    if total > slots.len() {
        count_invalid(domain, Invalid::TooManyDescriptors, total - slots.len());
    }
    for reason in slots.iter().filter_map(|s| s.as_ref().err()) {
        count_invalid(domain, *reason, 1);
    }
    if slots.iter().any(Result::is_ok) {
        return Ok(());
    }
    let first = slots.first().and_then(|s| s.as_ref().err()).map_or("", |r| r.as_str());
    Err(Status::invalid_argument(format!("no descriptor of the request can be decided; the first is refused: {first}")))
}

/// The request's first [`MAX_DESCRIPTORS`] descriptors, sized, matched and keyed; repeats of an
/// earlier descriptor refused; `replaces` applied.
fn slots<'a>(config: &'a EnvoyConfig, request: &'a RateLimitRequest) -> Vec<Slot<'a>> {
    let domain = request.domain.as_str();
    let mut slots: Vec<Slot<'a>> = Vec::with_capacity(request.descriptors.len().min(MAX_DESCRIPTORS));
    for d in request.descriptors.iter().take(MAX_DESCRIPTORS) {
        let slot = bounds::entries(domain, d).and_then(|entries| {
            if slots.iter().flatten().any(|earlier| earlier.entries == entries) {
                return Err(Invalid::Duplicate);
            }
            let hits = d.hits_addend.as_ref().map_or(u64::from(request.hits_addend), |h| h.value);
            // 0 is "not set" (1 hit). Any cost over MAX_LIMIT is refused as over every limit
            // alike; capped there, it cannot wrap the hit counters either.
            let cost = hits.clamp(1, slidegate::MAX_LIMIT + 1);
            let key = descriptor_key(domain, &entries);
            Ok(Item { node: config.find(domain, &entries), entries, key, cost })
        });
        slots.push(slot);
    }
    // A limit named in another matched limit's `replaces` gives way to it: that descriptor
    // has no limit in this request.
    let replaced: Vec<String> =
        slots.iter().flatten().filter_map(Item::limit).flat_map(|l| l.replaces.iter().cloned()).collect();
    for item in slots.iter_mut().flatten() {
        if item.limit().and_then(|l| l.name.as_ref()).is_some_and(|n| replaced.contains(n)) {
            item.node = None;
        }
    }
    slots
}

/// The tightest decided limit of a request, for the `x-ratelimit-*` headers.
type Tightest<'a> = Option<(&'a Limit, &'a Decision)>;

/// Each descriptor's status, counted in the metrics; whether any enforced one is over; and the
/// tightest limit.
fn answer<'a>(
    domain: &str,
    slots: &'a [Slot<'a>],
    outcomes: &'a [Outcome],
) -> (bool, Vec<DescriptorStatus>, Tightest<'a>) {
    let mut statuses = Vec::with_capacity(slots.len());
    let mut over = false;
    let mut tightest: Tightest<'a> = None;
    for (slot, outcome) in slots.iter().zip(outcomes) {
        let item = match (slot, outcome) {
            // Refused before deciding (counted then), or by the limiter.
            (Err(_), _) => {
                statuses.push(DescriptorStatus::default());
                continue;
            }
            (Ok(_), Outcome::Invalid(reason)) => {
                count_invalid(domain, *reason, 1);
                statuses.push(DescriptorStatus::default());
                continue;
            }
            (Ok(item), _) => item,
        };
        let limit = item.limit();
        if let (Outcome::Decided(d), Some(l)) = (outcome, limit)
            && tightest.is_none_or(|(_, t)| d.remaining < t.remaining)
        {
            tightest = Some((l, d));
        }
        let (within, remaining, reset) = standing(outcome, limit);
        let shadow = item.shadow();
        over |= !within && !shadow;
        if let (Some(node), Some(limit)) = (item.node, limit) {
            count(domain, node, item, limit, within, shadow, remaining);
        }
        statuses.push(descriptor_status(limit, within || shadow, remaining, reset));
    }
    (over, statuses, tightest)
}

/// Whether a descriptor is within its limit, the permits it has left, and when it resets.
fn standing(outcome: &Outcome, limit: Option<&Limit>) -> (bool, u32, Option<Duration>) {
    match outcome {
        Outcome::Refused => (false, 0, limit.map(|l| l.unit.window())),
        Outcome::Decided(d) => (
            d.allowed || d.retry_after.is_none(),
            u32::try_from(d.remaining).unwrap_or(u32::MAX),
            Some(d.retry_after.unwrap_or(d.reset_after)),
        ),
        Outcome::Unlimited => (true, u32::MAX, None),
        Outcome::NoLimit | Outcome::Invalid(_) => (true, 0, None),
    }
}

/// The status Envoy reads for a descriptor under `limit`: OK or over it (`ok` false).
fn descriptor_status(limit: Option<&Limit>, ok: bool, remaining: u32, reset: Option<Duration>) -> DescriptorStatus {
    DescriptorStatus {
        code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: limit.filter(|l| !l.unlimited).map(|l| CurrentLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(l.requests_per_unit).unwrap_or(u32::MAX),
            unit: pb_unit(l.unit) as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: reset.map(pb_duration),
        quota: None,
    }
}

impl EnvoyRateLimit {
    /// Decides the request's decidable descriptors. Enforced ones are decided together, all or
    /// nothing (an over-limit request consumes nothing anywhere); shadow ones each on their own,
    /// so that a shadow limit can never hold back an enforced one. Refused descriptors are not
    /// decided and hold back nothing.
    async fn decide(&self, slots: &[Slot<'_>]) -> Result<Vec<Outcome>, Status> {
        let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(slots.len());
        let mut enforced: Vec<(usize, Check<'_>)> = Vec::new();
        let mut refused = false;
        for (i, slot) in slots.iter().enumerate() {
            let shadow = slot.as_ref().is_ok_and(Item::shadow);
            match check_of(slot) {
                Err(outcome) => {
                    refused |= matches!(outcome, Outcome::Refused) && !shadow;
                    outcomes.push(Some(outcome));
                }
                Ok(check) if shadow => outcomes.push(Some(self.one(&check).await?)),
                Ok(check) => {
                    outcomes.push(None);
                    enforced.push((i, check));
                }
            }
        }
        let checks: Vec<Check<'_>> = enforced.iter().map(|(_, c)| *c).collect();
        let decided = if refused {
            // Over already: nothing may be charged. Report the others' standing, read only.
            let mut held = Vec::with_capacity(checks.len());
            for c in &checks {
                held.push(self.standing(c).await?);
            }
            held
        } else {
            self.enforce(&checks).await?
        };
        for ((i, _), outcome) in enforced.iter().zip(decided) {
            outcomes[*i] = Some(outcome);
        }
        Ok(outcomes.into_iter().map(|o| o.unwrap_or(Outcome::NoLimit)).collect())
    }

    /// Decides the enforced checks, all or nothing when the backend can.
    async fn enforce(&self, checks: &[Check<'_>]) -> Result<Vec<Outcome>, Status> {
        let limiter = &self.app.limiter;
        match checks {
            [] => Ok(Vec::new()),
            // One enforced descriptor: the one-key path, which the near-cache can answer.
            [one] => Ok(vec![self.one(one).await?]),
            _ => match self.app.timed(limiter.check_all(checks)).await {
                Ok(group) => Ok(group.decisions.into_iter().map(Outcome::Decided).collect()),
                Err(e) if e.is_backend_failure() => Err(unavailable(e)),
                // Not one check (keys in several Redis Cluster slots, which no script can see
                // together): one by one, in request order, stopping at the first over limit —
                // the descriptors before it are charged, those after it are not.
                Err(_) => {
                    let mut one_by_one: Vec<Outcome> = Vec::with_capacity(checks.len());
                    for c in checks {
                        let over = one_by_one.iter().any(|o| matches!(o, Outcome::Decided(d) if !d.allowed));
                        one_by_one.push(if over { self.standing(c).await? } else { self.one(c).await? });
                    }
                    Ok(one_by_one)
                }
            },
        }
    }

    /// Decides one check.
    async fn one(&self, c: &Check<'_>) -> Result<Outcome, Status> {
        let decided = self.app.timed(self.app.limiter.check_cost(c.key, &c.quota, c.cost)).await;
        decided.map(Outcome::Decided).or_else(own_problem)
    }

    /// Where a check stands, read only, charging nothing: held when it would fit, denied (until
    /// the window empties, at the latest) when it would not.
    async fn standing(&self, c: &Check<'_>) -> Result<Outcome, Status> {
        let state = match self.app.limiter.inspect(c.key, &c.quota).await {
            Ok(state) => state,
            Err(e) => return own_problem(e),
        };
        let (limit, reset) = (c.quota.limit(), state.reset_after);
        let remaining = limit.saturating_sub(state.count);
        Ok(Outcome::Decided(if c.cost <= remaining {
            Decision::held(limit, remaining, reset)
        } else {
            Decision::denied(limit, remaining, reset, reset)
        }))
    }
}

/// What a descriptor asks the backend, or the outcome it has without asking.
fn check_of<'s>(slot: &'s Slot<'_>) -> Result<Check<'s>, Outcome> {
    let item = slot.as_ref().map_err(|reason| Outcome::Invalid(*reason))?;
    let Some(limit) = item.limit() else { return Err(Outcome::NoLimit) };
    if limit.unlimited {
        return Err(Outcome::Unlimited);
    }
    match limit.quota {
        Some(q) if item.cost <= q.max_cost() => Ok(Check::new(&item.key, q).with_cost(item.cost)),
        _ => Err(Outcome::Refused),
    }
}

/// A limiter error for one descriptor. A backend failure — which the failure policy, when one
/// is set, has already answered — fails the request (`UNAVAILABLE`); anything else is the
/// caller's mistake in that descriptor alone, which is then not decided.
fn own_problem(e: Error) -> Result<Outcome, Status> {
    if e.is_backend_failure() { Err(unavailable(e)) } else { Ok(Outcome::Invalid(Invalid::Rejected)) }
}

/// A backend failure that no failure policy answered (a Redis URL's password masked).
fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(crate::redact::redact(&e.to_string()))
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
    let reset = slidegate::headers::ceil_secs(d.retry_after.unwrap_or(d.reset_after));
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
/// descriptor's own (registered at its first hit), or, under `detailed_metric`, by the request's
/// values (bounded: see [`DetailedCounters`](super::stats::DetailedCounters)).
fn count(domain: &str, node: &Node, item: &Item<'_>, limit: &Limit, within: bool, shadow: bool, remaining: u32) {
    let detailed;
    let counters = if node.detailed_metric {
        let values: Vec<String> = item.entries.iter().map(|(k, v)| format!("{k}_{v}")).collect();
        detailed = node.detailed.get(domain, &node.stat_key, &values.join("."));
        &detailed
    } else {
        node.counters.get_or_init(|| EnvoyCounters::new(domain, &node.stat_key))
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
    if !limit.unlimited && limit.requests_per_unit > 0 && u64::from(remaining) * 5 <= limit.requests_per_unit {
        counters.near.increment(item.cost);
    }
}
