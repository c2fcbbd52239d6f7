//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over the service's limiter.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use metrics::{Counter, Histogram};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::decide::{Applied, Item, Outcome, Slot, quotas_all_over};
use super::headers::{Limited, response_headers};
use super::metadata::dynamic_metadata;
use crate::app::App;
use crate::config::EnvoyOptions;
use crate::envoy::bounds::{self, Invalid, MAX_DESCRIPTORS};
use crate::envoy::config::EnvoyConfig;
use crate::envoy::key::{descriptor_key, shared_descriptor_key};
use crate::envoy::limit::{Limit, Unit};
use crate::envoy::stats::{Counters, Hit, OVERFLOW_SUFFIX, count_domain_not_found};
use crate::metrics::{ENVOY_GLOBAL_SHADOW_MODE, GRPC_ERRORS, GRPC_REQUESTS, GRPC_SECONDS};

/// The gRPC service: one per server, sharing the HTTP API's limiter, backend and metrics.
#[derive(Debug, Clone)]
pub struct EnvoyRateLimit {
    pub(super) app: Arc<App>,
    calls: Counter,
    seconds: Histogram,
    service_errors: Counter,
    backend_errors: Counter,
}

impl EnvoyRateLimit {
    /// The service over `app`.
    pub fn new(app: Arc<App>) -> Self {
        const METHOD: &str = "ShouldRateLimit";
        Self {
            app,
            calls: metrics::counter!(GRPC_REQUESTS, "grpc_method" => METHOD),
            seconds: metrics::histogram!(GRPC_SECONDS, "grpc_method" => METHOD),
            service_errors: metrics::counter!(GRPC_ERRORS, "err_type" => "service_error"),
            backend_errors: metrics::counter!(GRPC_ERRORS, "err_type" => "redis_error"),
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRateLimit {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = self.app.now();
        // The id an error status and its log line share (`crate::request_id`).
        let given = request.metadata().get(crate::request_id::HEADER).and_then(|v| v.as_bytes().try_into().ok());
        let span = crate::trace::decision(request.metadata().as_ref());
        let answer = crate::request_id::scope(given, self.answer(&request.into_inner())).instrument(span).await;
        self.calls.increment(1);
        self.seconds.record(self.app.now().duration_since(started).as_secs_f64());
        if let Err(status) = &answer {
            let backend = matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Internal);
            if backend { &self.backend_errors } else { &self.service_errors }.increment(1);
        }
        answer.map(Response::new)
    }
}

impl EnvoyRateLimit {
    async fn answer(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        // The same answers envoyproxy/ratelimit gives to malformed requests.
        if request.domain.is_empty() {
            return Err(Status::unknown("rate limit domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(Status::unknown("rate limit descriptor list must not be empty"));
        }
        let (config, options) = (self.app.envoy(), self.app.envoy_options());
        let domain = request.domain.as_str();
        if !config.contains_domain(domain) {
            count_domain_not_found(domain, request.descriptors.len());
            return Ok(nothing_limited(request.descriptors.len()));
        }
        let slots = slots(&config, request, options);
        refuse(&config, domain, request.descriptors.len(), &slots)?;
        let started = self.app.now();
        let outcomes = self.decide(&slots, options.quota_mode).await?;
        super::traffic::record(&self.app, domain, &slots, &outcomes, started);
        let response = respond(&config, request, &slots, &outcomes, options);
        if crate::trace::exporting() {
            self.record(domain, &slots, &outcomes, &response);
        }
        Ok(response)
    }

    /// Writes the request's decision on its span: the domain, the algorithms of the
    /// descriptors the backend decided (comma-separated), the overall code.
    fn record(&self, domain: &str, slots: &[Slot<'_>], outcomes: &[Outcome], response: &RateLimitResponse) {
        let mut algorithms: Vec<&str> = Vec::new();
        let mut degraded = false;
        for (slot, outcome) in slots.iter().zip(outcomes) {
            let quota = slot.as_ref().ok().and_then(Item::limit).and_then(|l| l.quota);
            if let (Some(quota), Outcome::Decided(d, _)) = (quota, outcome) {
                algorithms.push(quota.algorithm().as_str());
                degraded |= d.degraded.is_some();
            }
        }
        algorithms.dedup();
        crate::trace::record(&crate::trace::Decided {
            subject: ("domain", domain),
            algorithm: &algorithms.join(","),
            engine: self.app.limiter.backend().engine(),
            allowed: response.overall_code != Code::OverLimit as i32,
            degraded,
        });
    }
}

/// The answer to a request of an unknown domain, which limits nothing (and whose name is
/// never a label of the per-descriptor counters).
fn nothing_limited(descriptors: usize) -> RateLimitResponse {
    let ok = DescriptorStatus { code: Code::Ok as i32, ..DescriptorStatus::default() };
    RateLimitResponse { overall_code: Code::Ok as i32, statuses: vec![ok; descriptors], ..Default::default() }
}

/// Counts the request's refused descriptors (of `total`, those past [`MAX_DESCRIPTORS`]
/// included), and fails the request when none of them can be decided: only then is an RPC
/// error — which Envoy answers with its `failure_mode_deny` — the request's answer.
fn refuse(config: &EnvoyConfig, domain: &str, total: usize, slots: &[Slot<'_>]) -> Result<(), Status> {
    if total > slots.len() {
        config.count_invalid(domain, Invalid::TooManyDescriptors, total - slots.len());
    }
    for reason in slots.iter().filter_map(|s| s.as_ref().err()) {
        config.count_invalid(domain, *reason, 1);
    }
    if slots.iter().any(Result::is_ok) {
        return Ok(());
    }
    let first = slots.first().and_then(|s| s.as_ref().err()).map_or("", |r| r.as_str());
    Err(Status::invalid_argument(format!("no descriptor of the request can be decided; the first is refused: {first}")))
}

/// The request's first [`MAX_DESCRIPTORS`] descriptors, sized, matched and keyed; repeats of an
/// earlier descriptor refused; `replaces` applied.
fn slots<'a>(config: &'a EnvoyConfig, request: &'a RateLimitRequest, options: &EnvoyOptions) -> Vec<Slot<'a>> {
    let domain = request.domain.as_str();
    let mut slots: Vec<Slot<'a>> = Vec::with_capacity(request.descriptors.len().min(MAX_DESCRIPTORS));
    for d in request.descriptors.iter().take(MAX_DESCRIPTORS) {
        let slot = bounds::entries(domain, d).and_then(|entries| {
            if slots.iter().flatten().any(|earlier| earlier.entries == entries) {
                return Err(Invalid::Duplicate);
            }
            // A descriptor's own hits_addend, 0 included (a check that counts nothing); else the
            // request's, where 0 means "not set": 1. Any count over MAX_LIMIT is over every
            // limit alike; capped there, it cannot wrap the counters either.
            let hits = d.hits_addend.as_ref().map_or(u64::from(request.hits_addend).max(1), |h| h.value);
            let hits = hits.min(slidegate::MAX_LIMIT + 1);
            let (applied, key) = apply(config, domain, d, &entries, options)?;
            Ok(Item { entries, key, hits, applied })
        });
        slots.push(slot);
    }
    // A limit named in another matched limit's `replaces` gives way to it: that descriptor
    // has no limit in this request.
    let replaced: Vec<String> =
        slots.iter().flatten().filter_map(Item::limit).flat_map(|l| l.replaces.iter().cloned()).collect();
    for item in slots.iter_mut().flatten() {
        if item.limit().and_then(|l| l.name.as_ref()).is_some_and(|n| replaced.contains(n)) {
            item.applied = None;
        }
    }
    slots
}

/// The limit that applies to descriptor `d` (the one it brings, else the configured one) and
/// its backend key.
fn apply<'a>(
    config: &'a EnvoyConfig,
    domain: &str,
    d: &RateLimitDescriptor,
    entries: &[(&str, &str)],
    options: &EnvoyOptions,
) -> Result<(Option<Applied<'a>>, String), Invalid> {
    if let Some(brought) = &d.limit {
        // As upstream: the request's own limit, not shadow, unnamed, counted under the request's
        // stats key.
        let unit = override_unit(brought.unit).ok_or(Invalid::Rejected)?;
        let (limit, _) =
            Limit::counted(u64::from(brought.requests_per_unit), unit, None).map_err(|_| Invalid::Rejected)?;
        let stats_key = upstream_key(domain, entries);
        let applied = Applied {
            limit: Cow::Owned(limit),
            node: None,
            counters: config.override_counters(domain, &stats_key).map(Cow::Owned),
            label: Cow::Owned(stats_key),
            shadow: false,
            quota: options.quota_mode,
            charge: config.charges_over_limit(domain),
        };
        return Ok((Some(applied), descriptor_key(domain, entries)));
    }
    let Some(found) = config.lookup(domain, entries) else { return Ok((None, descriptor_key(domain, entries))) };
    let node = found.node;
    let counters = match (&found.stats_key, found.limit.unlimited) {
        (_, true) => None,
        (Some(key), false) => {
            Some(Cow::Owned(node.dynamic.get(key, || format!("{}.{OVERFLOW_SUFFIX}", node.stat_key))))
        }
        (None, false) => Some(Cow::Borrowed(node.counters.get_or_init(|| Counters::new(&node.stat_key)))),
    };
    let key = if found.shared.is_empty() {
        descriptor_key(domain, entries)
    } else {
        shared_descriptor_key(domain, entries, &found.shared)
    };
    let applied = Applied {
        limit: Cow::Borrowed(found.limit),
        node: Some(node),
        counters,
        label: found.limit.name.as_deref().map_or(Cow::Borrowed(node.stat_key.as_str()), Cow::Borrowed),
        shadow: node.shadow_mode,
        quota: node.quota_mode || options.quota_mode,
        charge: node.charge_over_limit,
    };
    Ok((Some(applied), key))
}

/// Upstream's stats key of a request's descriptor: `<domain>.<key>_<value>.<key>…`.
fn upstream_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = String::from(domain);
    for (k, v) in entries {
        key.push('.');
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(v);
        }
    }
    key
}

/// The unit of a request's `limit` (`UNKNOWN` and unknown numbers are none).
fn override_unit(unit: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
        RateLimitUnit::Unknown => return None,
    })
}

/// The answer: each descriptor's status (counted), the overall code, and the headers and
/// dynamic metadata the options ask for.
fn respond(
    config: &EnvoyConfig,
    request: &RateLimitRequest,
    slots: &[Slot<'_>],
    outcomes: &[Outcome],
    options: &EnvoyOptions,
) -> RateLimitResponse {
    let domain = request.domain.as_str();
    let mut statuses = Vec::with_capacity(request.descriptors.len());
    let mut over_rate = false;
    for (slot, outcome) in slots.iter().zip(outcomes) {
        let item = match (slot, outcome) {
            // Refused before deciding (counted then), or by the limiter.
            (Err(_), _) => {
                statuses.push(DescriptorStatus::default());
                continue;
            }
            (Ok(_), Outcome::Invalid(reason)) => {
                config.count_invalid(domain, *reason, 1);
                statuses.push(DescriptorStatus::default());
                continue;
            }
            (Ok(item), _) => item,
        };
        let limit = item.limit();
        let (within, remaining, reset) = standing(outcome, limit);
        let (shadow, quota) = item.applied.as_ref().map_or((false, false), |a| (a.shadow, a.quota));
        over_rate |= !within && !shadow && !quota;
        if let Some(counters) = item.applied.as_ref().and_then(|a| a.counters.as_ref()) {
            count(counters, item, outcome, within, shadow, options.near_limit_ratio);
        }
        // The limit enforced: the configured one, or the key's override.
        let enforced = match outcome {
            Outcome::Decided(d, _) => Some(d.limit),
            _ => None,
        };
        statuses.push(descriptor_status(limit, enforced, within || shadow, remaining, reset));
    }
    let mut over = over_rate || quotas_all_over(slots, outcomes.iter().map(Some), options.quota_mode);
    if over && options.shadow_mode {
        over = false;
        metrics::counter!(ENVOY_GLOBAL_SHADOW_MODE).increment(1);
    }
    let response_headers_to_add = if options.headers.enabled {
        let limited = limited(slots, &statuses);
        response_headers(&options.headers, &limited)
    } else {
        Vec::new()
    };
    let dynamic_metadata = options.dynamic_metadata.then(|| {
        let passed = slots.iter().zip(&statuses).filter_map(|(slot, status)| {
            let applied = slot.as_ref().ok()?.applied.as_ref()?;
            let ok = status.code == Code::Ok as i32 && !applied.limit.unlimited;
            applied.node.and_then(|n| n.metadata.as_ref()).filter(|_| ok)
        });
        dynamic_metadata(request, passed)
    });
    // The descriptors after MAX_DESCRIPTORS: not decided. (`Code::Unknown` is 0, the default.)
    statuses.resize(request.descriptors.len(), DescriptorStatus::default());
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add,
        dynamic_metadata,
        ..RateLimitResponse::default()
    }
}

/// The decided descriptors with a limit, for the headers.
fn limited<'a>(slots: &'a [Slot<'a>], statuses: &'a [DescriptorStatus]) -> Vec<Limited<'a>> {
    slots
        .iter()
        .zip(statuses)
        .filter_map(|(slot, status)| {
            let applied = slot.as_ref().ok()?.applied.as_ref()?;
            status.current_limit.as_ref()?;
            Some(Limited {
                status,
                name: &applied.label,
                window_secs: applied.limit.unit.window().as_secs(),
                decisive: !applied.shadow && !applied.quota,
            })
        })
        .collect()
}

/// Whether a descriptor is within its limit, the permits it has left, and when it resets.
fn standing(outcome: &Outcome, limit: Option<&Limit>) -> (bool, u32, Option<Duration>) {
    match outcome {
        Outcome::Refused => (false, 0, limit.map(|l| l.unit.window())),
        Outcome::Decided(d, reset) => {
            (d.allowed || d.retry_after.is_none(), u32::try_from(d.remaining).unwrap_or(u32::MAX), Some(*reset))
        }
        Outcome::Unlimited => (true, u32::MAX, None),
        Outcome::NoLimit | Outcome::Invalid(_) => (true, 0, None),
    }
}

/// The status Envoy reads for a descriptor under `limit` (`enforced`: the limit decided with,
/// the key's override if it has one): OK or over it (`ok` false).
fn descriptor_status(
    limit: Option<&Limit>,
    enforced: Option<u64>,
    ok: bool,
    remaining: u32,
    reset: Option<Duration>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: limit.filter(|l| !l.unlimited).map(|l| CurrentLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(enforced.unwrap_or(l.requests_per_unit)).unwrap_or(u32::MAX),
            unit: pb_unit(l.unit) as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: reset.map(pb_duration),
        quota: None,
    }
}

/// Counts a decided descriptor's hits (none for a check, `hits_addend: 0`).
fn count(counters: &Counters, item: &Item<'_>, outcome: &Outcome, within: bool, shadow: bool, near_ratio: f64) {
    let hits = item.hits;
    let (limit, before) = match outcome {
        Outcome::Decided(d, _) => (d.limit, d.limit.saturating_sub(d.remaining + if d.allowed { hits } else { 0 })),
        Outcome::Refused => {
            let limit = item.limit().map_or(0, |l| l.requests_per_unit);
            (limit, limit)
        }
        _ => return,
    };
    if hits > 0 {
        counters.count(Hit { hits, limit, before, within, shadow }, near_ratio);
    }
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
