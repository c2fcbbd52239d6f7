//! The HTTP/JSON API. Handlers translate JSON to library calls and back; every client mistake
//! is a 4xx with `{"error": {"code", "message"}}`, never a 500.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use ::metrics::Histogram;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;
use slidegate::{Algorithm, Check, Quota};

pub mod override_routes;

use crate::api_error::{ApiError, MAX_BODY};
use crate::app::{App, Live, count_decision, decide_one, rule_named};
use crate::config::{AlgorithmSpec, INLINE_RULE, parse_duration};
use crate::http::decision::{decision_answer, decision_response, write_decision, write_optional_ms};
use crate::http::{Route, authorize, route};
use crate::metrics;
use crate::overrides::{self, Source, Target};
use crate::trace::Decided;

mod charge;
mod describe;

/// The most admission times `GET /v1/keys/{rule}/{key}` lists (a sliding log's newest): enough
/// to draw any window, and a bound on the answer (about 15 bytes each).
pub const INSPECT_ADMISSIONS: usize = 1_000;

/// The decision route.
pub(crate) const CHECK: &str = "/v1/check";

/// `POST /v1/check` outside the router (`crate::routes` takes it there at once): the state
/// and the latency histogram its handler would have there.
pub(crate) struct CheckRoute {
    app: Arc<App>,
    histogram: Histogram,
}

impl CheckRoute {
    /// The route over `app`.
    pub(crate) fn new(app: Arc<App>) -> Self {
        let histogram = ::metrics::histogram!(metrics::HTTP_SECONDS, "route" => CHECK);
        Self { app, histogram }
    }

    /// What the router would answer, body limit and latency histogram included.
    pub(crate) async fn answer(self: Arc<Self>, body: Incoming) -> Response {
        let started = self.app.now();
        let answer = match read_body(body).await {
            Ok(body) => decide(&self.app, &body).await,
            Err(e) => Err(e),
        };
        let answer = answer.unwrap_or_else(IntoResponse::into_response);
        self.histogram.record(self.app.now().duration_since(started).as_secs_f64());
        answer
    }
}

/// A request's body, refused once it passes [`MAX_BODY`]. A check's body comes in one frame,
/// taken as it is; a body in several is joined.
async fn read_body(mut body: Incoming) -> Result<Bytes, ApiError> {
    let (mut first, mut joined) = (Bytes::new(), Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request("invalid_body", format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        if first.len() + joined.len() + data.len() > MAX_BODY {
            return Err(ApiError::body_too_large());
        }
        if first.is_empty() && joined.is_empty() {
            first = data;
        } else {
            joined.extend_from_slice(&std::mem::take(&mut first));
            joined.extend_from_slice(&data);
        }
    }
    Ok(if joined.is_empty() { first } else { joined.into() })
}

/// The API's routes (`crate::routes` serves them with every other surface's).
pub fn routes() -> Vec<Route> {
    vec![
        route(Method::POST, CHECK, check),
        route(Method::POST, "/v1/charge", charge::charge),
        route(Method::POST, "/v1/refund", charge::refund),
        route(Method::GET, "/v1/rules", rules),
        route(Method::GET, "/v1/keys/{rule}/{key}", inspect_key),
        route(Method::DELETE, "/v1/keys/{rule}/{key}", reset_key),
        route(Method::PUT, "/v1/overrides/{rule}/{key}", override_routes::put),
        route(Method::DELETE, "/v1/overrides/{rule}/{key}", override_routes::delete),
        route(Method::GET, "/v1/overrides/{rule}", override_routes::list),
        route(Method::GET, "/metrics", render_metrics),
        route(Method::GET, "/healthz", || async { Json(json!({"status": "ok"})) }),
        route(Method::GET, "/readyz", ready),
        route(Method::GET, "/openapi.json", || async {
            ([(header::CONTENT_TYPE, "application/json")], crate::openapi::DOCUMENT)
        }),
    ]
}

/// One check as clients send it: a rule (with optional tier) or an inline limit and window.
/// The algorithm's fields are listed here rather than `#[serde(flatten)]` from an
/// [`AlgorithmSpec`], which would have serde buffer the whole map into intermediate values
/// first; strings borrow from the body unless they hold an escape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody<'a> {
    #[serde(borrow)]
    rule: Option<Text<'a>>,
    #[serde(borrow)]
    key: Option<Text<'a>>,
    cost: Option<u64>,
    #[serde(borrow)]
    tier: Option<Text<'a>>,
    limit: Option<u64>,
    #[serde(borrow)]
    window: Option<Text<'a>>,
    #[serde(borrow)]
    algorithm: Option<Text<'a>>,
    buckets: Option<u32>,
    burst: Option<u64>,
    #[serde(borrow)]
    warm_up: Option<Text<'a>>,
    cold_fraction: Option<f64>,
    #[serde(borrow)]
    checks: Option<Checks<'a>>,
}

/// A JSON string of a request body: borrowed from the body, or decoded when it has escapes.
/// (`Option<Cow<str>>` always copies: serde borrows only a `Cow` that is a field itself.)
#[derive(Debug)]
struct Text<'a>(Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Borrowing<'a>(PhantomData<&'a str>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Borrowing<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }

            fn visit_str<E>(self, text: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }

            fn visit_string<E>(self, text: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Borrowing(PhantomData))
    }
}

/// A multi-check's list as sent: at most [`slidegate::MAX_CHECKS`] checks are parsed, the rest
/// only counted, so a 64 KiB body of `{},{},…` (20,000 empty checks, each a few hundred bytes
/// parsed) costs no more memory than a valid group.
#[derive(Debug, Default)]
struct Checks<'a> {
    parsed: Vec<CheckBody<'a>>,
    count: usize,
}

impl<'de: 'a, 'a> Deserialize<'de> for Checks<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded<'a>(PhantomData<CheckBody<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Bounded<'a> {
            type Value = Checks<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of checks")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checks<'a>, A::Error> {
                let mut checks = Checks::default();
                while checks.count < slidegate::MAX_CHECKS {
                    match seq.next_element()? {
                        Some(check) => checks.parsed.push(check),
                        None => return Ok(checks),
                    }
                    checks.count += 1;
                }
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    checks.count += 1;
                }
                Ok(checks)
            }
        }
        deserializer.deserialize_seq(Bounded(PhantomData))
    }
}

/// A check resolved against the rules: the policy name for headers, the backend key, the quota.
struct Resolved<'a> {
    /// The rule's name as the body spells it, or [`INLINE_RULE`].
    policy: Cow<'a, str>,
    /// The backend key: [`slidegate::rule_key`] of the rule and the caller's key.
    key: String,
    quota: Quota,
    cost: u64,
}

impl<'a> CheckBody<'a> {
    /// Whether any field of a single check is set (they cannot stand beside `checks`).
    fn has_single_fields(&self) -> bool {
        self.rule.is_some()
            || self.key.is_some()
            || self.cost.is_some()
            || self.tier.is_some()
            || self.limit.is_some()
            || self.window.is_some()
            || self.has_algorithm_fields()
    }

    fn has_algorithm_fields(&self) -> bool {
        self.algorithm.is_some()
            || self.buckets.is_some()
            || self.burst.is_some()
            || self.warm_up.is_some()
            || self.cold_fraction.is_some()
    }

    /// How an inline check's quota counts.
    fn algorithm_spec(&self) -> AlgorithmSpec {
        AlgorithmSpec {
            algorithm: self.algorithm.as_deref().map(str::to_owned),
            buckets: self.buckets,
            burst: self.burst,
            warm_up: self.warm_up.as_deref().map(str::to_owned),
            cold_fraction: self.cold_fraction,
        }
    }

    /// Resolves against one snapshot of the rules, so no request sees half a reload.
    fn resolve(mut self, live: &Live) -> Result<Resolved<'a>, ApiError> {
        let inline_fields = self.limit.is_some() || self.window.is_some() || self.has_algorithm_fields();
        let key = self.key.take().ok_or_else(|| ApiError::bad_request("missing_key", "field `key` is required"))?;
        if self.checks.is_some() {
            return Err(ApiError::bad_request("invalid_checks", "`checks` cannot be nested"));
        }
        let (policy, quota) = match self.rule.take() {
            Some(rule) => {
                if inline_fields {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        "give either `rule` or an inline `limit` and `window`, not both",
                    ));
                }
                let r = rule_named(live, &rule)?;
                let tier = self.tier.as_deref();
                let quota = r.quota_for(tier).ok_or_else(|| {
                    ApiError::bad_request("unknown_tier", format!("rule {:?} has no tier {tier:?}", &*rule))
                })?;
                (rule.0, quota)
            }
            None => {
                live.inline.check_enabled()?;
                let (Some(limit), Some(window)) = (self.limit, &self.window) else {
                    return Err(ApiError::bad_request(
                        "missing_rule",
                        "give `rule`, or an inline `limit` and `window` (e.g. \"10s\")",
                    ));
                };
                if self.tier.is_some() {
                    return Err(ApiError::bad_request("invalid_request", "`tier` needs a `rule`"));
                }
                let window = parse_duration(window).map_err(|m| ApiError::bad_request("invalid_window", m))?;
                let quota = self.algorithm_spec().apply(Quota::new(limit, window)?).map_err(|e| e.error)?;
                live.inline.check(&quota, self.cost.unwrap_or(1))?;
                (Cow::Borrowed(INLINE_RULE), quota)
            }
        };
        slidegate::validate_key(&key)?;
        let key = slidegate::rule_key(&policy, &key);
        Ok(Resolved { policy, key, quota, cost: self.cost.unwrap_or(1) })
    }
}

async fn check(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    decide(&app, &body?).await
}

/// Answers a `/v1/check` body.
async fn decide(app: &App, body: &[u8]) -> Result<Response, ApiError> {
    let live = app.live();
    match decode_check(body, &live)? {
        CheckRequest::One(mut resolved) => {
            overridden(app, &mut resolved);
            check_one(app, &live, resolved).await
        }
        CheckRequest::Many(mut resolved) => {
            resolved.iter_mut().for_each(|r| overridden(app, r));
            check_many(app, &live, &resolved).await
        }
    }
}

/// A named rule's check under its key's override, if it has one (inline checks have none).
fn overridden(app: &App, r: &mut Resolved<'_>) {
    if r.policy != INLINE_RULE {
        r.quota = app.overrides.quota(&r.key, r.quota);
    }
}

/// A `/v1/check` body, resolved: one check, or a group decided all or nothing.
enum CheckRequest<'a> {
    One(Resolved<'a>),
    Many(Vec<Resolved<'a>>),
}

/// Decodes a `/v1/check` body and resolves it against `live`'s rules: anything else than a
/// request is a client error.
fn decode_check<'a>(body: &'a [u8], live: &Live) -> Result<CheckRequest<'a>, ApiError> {
    let mut request: CheckBody<'_> =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request("invalid_json", e.to_string()))?;
    match request.checks.take() {
        None => Ok(CheckRequest::One(request.resolve(live)?)),
        Some(checks) => {
            if request.has_single_fields() {
                return Err(ApiError::bad_request("invalid_request", "give either `checks` or one check, not both"));
            }
            if checks.count == 0 || checks.count > slidegate::MAX_CHECKS {
                return Err(slidegate::Error::CheckCount { count: checks.count }.into());
            }
            Ok(CheckRequest::Many(checks.parsed.into_iter().map(|c| c.resolve(live)).collect::<Result<_, _>>()?))
        }
    }
}

async fn check_one(app: &App, live: &Live, r: Resolved<'_>) -> Result<Response, ApiError> {
    let d = decide_one(app, live, &r.policy, &r.key, &r.quota, r.cost).await?;
    Ok(decision_answer(app, &r.policy, &r.quota, &d, true))
}

async fn check_many(app: &App, live: &Live, resolved: &[Resolved<'_>]) -> Result<Response, ApiError> {
    let checks: Vec<Check<'_>> = resolved.iter().map(|r| Check::new(&r.key, r.quota).with_cost(r.cost)).collect();
    let started = app.now();
    let group = app.timed(app.limiter.check_all(&checks)).await?;
    for (r, d) in resolved.iter().zip(&group.decisions) {
        count_decision(app, live, &r.policy, &r.key, d, started);
    }
    let items: Vec<_> = resolved.iter().zip(&group.decisions).map(|(r, d)| (&*r.policy, &r.quota, d)).collect();
    let engine = app.limiter.backend().engine();
    if crate::trace::exporting() {
        record_group(resolved, &group, engine);
    }
    // `{"allowed", "denied_by" (absent when allowed), "retry_after_ms", "results": [...]}`
    let mut body = String::with_capacity(64 + 320 * items.len());
    body.push_str(if group.allowed { r#"{"allowed":true,"# } else { r#"{"allowed":false,"# });
    if let Some(i) = group.denied_by {
        body.push_str(r#""denied_by":"#);
        body.push_str(itoa::Buffer::new().format(i));
        body.push(',');
    }
    body.push_str(r#""retry_after_ms":"#);
    write_optional_ms(&mut body, group.retry_after());
    body.push_str(r#","results":["#);
    for (i, (name, _, d)) in items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        write_decision(&mut body, name, d, engine);
    }
    body.push_str("]}");
    Ok(decision_response(Some(body), &items, group.retry_after()))
}

/// Writes a group's decision on its span: its rules and their algorithms, comma-separated.
fn record_group(resolved: &[Resolved<'_>], group: &slidegate::MultiDecision, engine: &'static str) {
    let rules = resolved.iter().map(|r| &*r.policy).collect::<Vec<_>>().join(",");
    let algorithm = resolved.iter().map(|r| r.quota.algorithm().as_str()).collect::<Vec<_>>().join(",");
    let degraded = group.decisions.iter().any(|d| d.degraded.is_some());
    crate::trace::record(&Decided {
        subject: ("rule", &rules),
        algorithm: &algorithm,
        engine,
        allowed: group.allowed,
        degraded,
    });
}

async fn rules(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let live = app.live();
    let describe = |q: &Quota| {
        let mut rule = json!({
            "limit": q.limit(),
            "window_ms": q.window_ms(),
            "window": humantime::format_duration(q.window()).to_string(),
            "algorithm": q.algorithm().as_str(),
            "failure_policy": q.failure_policy().map(slidegate::FailurePolicy::as_str),
        });
        match q.algorithm() {
            Algorithm::SlidingWindow { buckets } => rule["buckets"] = json!(buckets),
            Algorithm::Gcra { .. } => rule["burst"] = json!(q.burst()),
            _ => {}
        }
        if let Some(w) = q.warm_up() {
            rule["warm_up"] = json!(humantime::format_duration(w.period()).to_string());
            rule["cold_fraction"] = json!(w.cold_permille() as f64 / 1000.0);
        }
        rule
    };
    let rules: Vec<_> = live
        .rules
        .iter()
        .map(|r| {
            let mut rule = describe(&r.quota);
            rule["name"] = json!(r.name);
            rule["tiers"] = r.tiers.iter().map(|(name, q)| (name.clone(), describe(q))).collect();
            rule
        })
        .collect();
    let (inline, envoy) = (describe::inline(&live.inline), describe::envoy(&app.envoy()));
    Json(json!({ "rules": rules, "inline": inline, "envoy": envoy }))
}

#[derive(Deserialize)]
struct TierQuery {
    tier: Option<String>,
}

/// The key an admin request names, after the token check: a key of a named rule, or of an
/// Envoy descriptor (`envoy:<domain>`) — a [`Target`]; with its quota before any override, and
/// where that comes from.
fn admin_target(
    app: &App,
    headers: &HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    tier: Result<Option<String>, ApiError>,
) -> Result<(Target, Quota, Source), ApiError> {
    // One snapshot for the token and the rule, as for a check; the path and query are looked
    // at after the token, so an unauthorized caller learns nothing of them.
    let live = app.live();
    authorize(&live, headers)?;
    let Path((rule, key)) = path.map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
    let tier = tier?;
    let target = Target::parse(&rule, &key)?;
    let (quota, source) = target.base(&live, &app.envoy(), tier.as_deref())?;
    Ok((target, quota, source))
}

async fn inspect_key(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<TierQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tier = query.map(|Query(q)| q.tier).map_err(|e| ApiError::bad_request("invalid_query", e.body_text()));
    let (target, base, source) = admin_target(&app, &headers, path, tier)?;
    let backend_key = target.counted_key(&app.envoy());
    // Which limit applies and why: the override in force, unless it no longer fits the quota
    // under it (then decisions take that quota, and say so here).
    let set = app.overrides.get(&backend_key);
    let fitted = set.as_ref().map(|o| o.limits.over(&base));
    let quota = match &fitted {
        Some(Ok(q)) => *q,
        _ => base,
    };
    let timeline = app.timed(app.limiter.timeline(&backend_key, &quota, INSPECT_ADMISSIONS)).await?;
    let state = timeline.state;
    let mut answer = json!({
        "rule": target.rule(),
        "key": backend_key,
        "count": state.count,
        "limit": quota.limit(),
        "remaining": quota.limit().saturating_sub(state.count),
        "oldest_ms": state.oldest_ms,
        "reset_after_ms": state.reset_after.as_millis(),
        "algorithm": quota.algorithm().as_str(),
        "window_ms": quota.window_ms(),
        "now_ms": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis()),
        "admissions_ms": timeline.admissions_ms,
        "source": match (&source, &fitted) {
            (_, Some(Ok(_))) => "override",
            (Source::Rule, _) => "rule",
            (Source::Tier(_), _) => "tier",
            (Source::Descriptor, _) => "descriptor",
        },
    });
    if let Source::Tier(tier) = source {
        answer["tier"] = json!(tier);
    }
    // A GCRA's capacity, which its decisions report as their `limit`.
    if let Algorithm::Gcra { .. } = quota.algorithm() {
        answer["burst"] = json!(quota.burst());
    }
    if let Some(o) = &set {
        answer["override"] = json!(overrides::Record::from(o));
    }
    if let Some(Err(e)) = fitted {
        answer["override_error"] = json!(format!("{e}: the override does not fit the quota under it, which applies"));
    }
    Ok(Json(answer))
}

async fn reset_key(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (target, _, _) = admin_target(&app, &headers, path, Ok(None))?;
    let backend_key = target.counted_key(&app.envoy());
    app.timed(app.limiter.reset(&backend_key)).await?;
    Ok(Json(json!({"rule": target.rule(), "key": backend_key, "reset": true})))
}

async fn render_metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    ::metrics::gauge!(metrics::CIRCUIT_OPEN).set(if app.limiter.circuit_open() { 1.0 } else { 0.0 });
    let cached = app.limiter.near_cache().map_or(0, slidegate::NearCache::len);
    ::metrics::gauge!(metrics::NEAR_CACHE_KEYS).set(cached as f64);
    let engine = app.limiter.backend().engine();
    for name in ["memory", "lua", "module"] {
        ::metrics::gauge!(metrics::ENGINE, "engine" => name).set(if name == engine { 1.0 } else { 0.0 });
    }
    let mut page = metrics::handle().render();
    metrics::held::render(&mut page);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], page)
}

async fn ready(State(app): State<Arc<App>>) -> Response {
    let backend = app.limiter.backend();
    let (status, mut answer) = match backend.ready().await {
        Ok(()) => (StatusCode::OK, json!({"status": "ready", "backend": backend.name(), "engine": backend.engine()})),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({
                "status": "unavailable", "backend": backend.name(), "engine": backend.engine(),
                "error": crate::request_id::unready("readyz", &e)
            }),
        ),
    };
    if app.counts_fleet() {
        answer["fleet"] = json!({"instances": app.limiter.fleet().and_then(slidegate::Fleet::live)});
    }
    // The shared rules and overrides: which version is in force, and whether it is current.
    let Some(shared) = app.shared() else { return (status, Json(answer)).into_response() };
    answer["shared"] = shared.detail();
    // An instance with no rules because the stored ones are unreadable must take no traffic.
    if let Some(why) = shared.unready().filter(|_| status == StatusCode::OK) {
        answer["status"] = json!("unavailable");
        answer["error"] = json!(why);
        return (StatusCode::SERVICE_UNAVAILABLE, Json(answer)).into_response();
    }
    (status, Json(answer)).into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};
    use slidegate::{Decision, FailurePolicy};

    use super::{ApiError, write_decision};

    fn written(rule: &str, d: &Decision) -> Value {
        let mut out = String::new();
        write_decision(&mut out, rule, d, "memory");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?} is not JSON: {e}"))
    }

    #[test]
    fn decisions_are_written_as_the_api_documents_them() {
        let admitted = Decision::allowed(5, 4, Duration::from_millis(60_000));
        assert_eq!(
            written("sms", &admitted),
            json!({"rule": "sms", "allowed": true, "limit": 5, "remaining": 4, "reset_after_ms": 60_000,
                   "retry_after_ms": null, "next_permit_after_ms": 60_000, "degraded": false, "engine": "memory"})
        );
        let denied = Decision::denied(5, 0, Duration::from_millis(9_500), Duration::from_millis(1_250));
        assert_eq!(
            written("api.v2-x_y", &denied),
            json!({"rule": "api.v2-x_y", "allowed": false, "limit": 5, "remaining": 0, "reset_after_ms": 9_500,
                   "retry_after_ms": 1_250, "next_permit_after_ms": 1_250, "degraded": false, "engine": "memory"})
        );
        let degraded = Decision::allowed(u64::MAX, u64::MAX, Duration::ZERO).degraded_by(FailurePolicy::FailOpen);
        let v = written("sms", &degraded);
        assert_eq!((v["degraded"].clone(), v["policy"].clone()), (json!(true), json!("fail_open")));
        assert_eq!((v["limit"].as_u64(), v.get("engine")), (Some(u64::MAX), None));
    }

    #[test]
    fn only_backend_failures_are_503_and_caller_errors_are_400() {
        use slidegate::Error as E;
        let answer = |e: E| {
            let a = ApiError::from(e);
            (a.status.as_u16(), a.code)
        };
        let caller = [
            (E::InvalidCost { cost: 6, max: 5 }, "invalid_cost"),
            (E::InvalidLimit { limit: 0, max: slidegate::MAX_LIMIT }, "invalid_quota"),
            (E::KeyTooLong { len: 600 }, "key_too_long"),
            (E::EmptyKey, "invalid_key"),
            (E::CheckCount { count: 17 }, "invalid_checks"),
            (E::DuplicateKey { key: "k".into() }, "duplicate_key"),
            (E::UnknownAlgorithm("leaky".into()), "unknown_algorithm"),
            // Any error the mapping does not name is the caller's, never a 503.
            (E::UnknownEngine("fast".into()), "invalid_request"),
        ];
        for (e, code) in caller {
            assert!(!e.is_backend_failure(), "{e}");
            assert_eq!(answer(e), (400, code));
        }
        assert_eq!(answer(E::Timeout(Duration::from_millis(50))), (503, "backend_timeout"));
        assert_eq!(answer(E::CircuitOpen), (503, "backend_unavailable"));
        // A backend that answered wrongly is a fault, but only a failure is a 503.
        let wrongtype =
            redis::RedisError::from((redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError), "WRONGTYPE"));
        for e in [E::UnexpectedReply("?".into()), E::Redis(wrongtype)] {
            let want = if e.is_backend_failure() { (503, "backend_unavailable") } else { (500, "backend_error") };
            assert_eq!(answer(e), want);
        }
    }

    #[test]
    fn a_password_in_an_error_stays_out_of_the_answer() {
        let e = slidegate::Error::InvalidQuota("redis://u:hunter2@host".into());
        assert_eq!(ApiError::from(e).message, "invalid quota: redis://u:***@host");
    }

    #[test]
    fn a_rule_name_that_needs_escaping_stays_valid_json() {
        let d = Decision::allowed(1, 0, Duration::from_millis(1));
        for rule in ["say \"hi\"", "back\\slash", "tab\there", "naïve"] {
            assert_eq!(written(rule, &d)["rule"], json!(rule));
        }
    }
}

/// The request decoder under hostile bodies: random bytes, valid requests with bytes flipped,
/// inserted, deleted or cut, and hand-picked attacks.
#[cfg(test)]
mod fuzz {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::{ApiError, CheckRequest, decode_check};
    use crate::app::Live;
    use crate::config::{Config, parse_duration};

    const RULES: &str = r#"
[[rules]]
name = "sms"
limit = 5
window = "60s"

[[rules]]
name = "api"
limit = 10
window = "60s"
tiers = { vip = { limit = 100 } }
"#;

    const VALID: [&str; 6] = [
        r#"{"rule":"sms","key":"user-1"}"#,
        r#"{"rule":"api","key":"k","tier":"vip","cost":2}"#,
        r#"{"key":"k","limit":10,"window":"10s","algorithm":"gcra","burst":5}"#,
        r#"{"key":"k","limit":100,"window":"1m","algorithm":"sliding_window","buckets":6,"warm_up":"30s","cold_fraction":0.5}"#,
        r#"{"key":"k","limit":10000,"window":"1d","algorithm":"fixed_window"}"#,
        r#"{"checks":[{"rule":"sms","key":"a"},{"key":"b","limit":5,"window":"1s"}]}"#,
    ];

    fn live() -> Live {
        Live::new(Config::parse(RULES, "rules.toml").expect("valid"))
    }

    /// Decodes `body`, which must answer a request or a client error (4xx), within a second.
    fn decodes_or_is_refused<'a>(live: &'a Live, body: &'a [u8]) -> Result<Option<CheckRequest<'a>>, TestCaseError> {
        let started = Instant::now();
        let outcome = decode_check(body, live);
        prop_assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        match outcome {
            Ok(request) => {
                let resolved = match &request {
                    CheckRequest::One(r) => std::slice::from_ref(r),
                    CheckRequest::Many(rs) => rs.as_slice(),
                };
                for r in resolved {
                    // The key passed the library's checks; the backend key wraps it.
                    prop_assert!(r.key.len() <= slidegate::MAX_KEY_LEN + r.policy.len() + 3, "{}", r.key);
                }
                Ok(Some(request))
            }
            Err(ApiError { status, code, message, .. }) => {
                prop_assert!(status.is_client_error(), "{status} {code}: {message}");
                prop_assert!(!code.is_empty() && !message.is_empty());
                Ok(None)
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3_000, failure_persistence: None, ..ProptestConfig::default() })]
        /// Random bytes and mutated valid bodies: a request or a 4xx, never a panic or a 5xx.
        #[test]
        fn any_body_is_a_request_or_a_client_error(
            valid in 0..VALID.len(),
            edits in proptest::collection::vec((0u8..4, any::<usize>(), any::<u8>()), 0..6),
            random in proptest::option::weighted(0.2, proptest::collection::vec(any::<u8>(), 0..256)),
        ) {
            let body = crate::mutate::mutate(random.unwrap_or_else(|| VALID[valid].as_bytes().to_vec()), edits);
            decodes_or_is_refused(&live(), &body)?;
        }
    }

    #[test]
    fn valid_bodies_decode() {
        let live = live();
        for body in VALID {
            assert!(matches!(decodes_or_is_refused(&live, body.as_bytes()), Ok(Some(_))), "{body}");
        }
    }

    #[test]
    fn escaped_strings_decode_to_the_text_they_spell() {
        let live = live();
        let key_of = |body: &str| match decode_check(body.as_bytes(), &live) {
            Ok(CheckRequest::One(r)) => (r.policy.into_owned(), r.key),
            _ => panic!("{body} did not decode to one check"),
        };
        let (policy, key) = key_of(r#"{"rule":"s\u006ds","key":"a\"b\\c"}"#);
        assert_eq!(policy, "sms");
        assert_eq!(key, slidegate::rule_key("sms", "a\"b\\c").as_str());
        assert_eq!(key_of(r#"{"rule":"sms","key":"user-1"}"#).1, slidegate::rule_key("sms", "user-1").as_str());
    }

    #[test]
    fn hostile_bodies_are_client_errors() {
        let live = live();
        let long = "x".repeat(60_000);
        let bodies = [
            // Deep nesting, far past serde_json's recursion limit.
            format!("{}{}", r#"{"checks":["#.repeat(5_000), "]}".repeat(5_000)),
            "[".repeat(60_000),
            format!(r#"{{"key":{}1{}}}"#, "[".repeat(10_000), "]".repeat(10_000)),
            // Numbers past every type.
            r#"{"key":"k","limit":1e400,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":18446744073709551616,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":-1,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":1.5,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"1s","warm_up":"1s","cold_fraction":1e308}"#.into(),
            r#"{"key":"k","limit":5,"window":"1s","warm_up":"1s","cold_fraction":-0.0}"#.into(),
            r#"{"key":"k","limit":5,"window":"1s","algorithm":"sliding_window","buckets":4294967296}"#.into(),
            // Durations: huge, negative, not numbers, under a millisecond, very long.
            r#"{"key":"k","limit":5,"window":"99999999999999999999999999s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"18446744073709551615s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"584942417355y"}"#.into(),
            r#"{"key":"k","limit":5,"window":"NaN"}"#.into(),
            r#"{"key":"k","limit":5,"window":"inf"}"#.into(),
            r#"{"key":"k","limit":5,"window":"-1s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"1ns"}"#.into(),
            r#"{"key":"k","limit":5,"window":"367d"}"#.into(),
            format!(r#"{{"key":"k","limit":5,"window":"{}"}}"#, "1d ".repeat(15_000)),
            format!(r#"{{"key":"k","limit":5,"window":"1s","warm_up":"{}"}}"#, "9".repeat(10_000)),
            // Long strings, a lone surrogate, an empty key, duplicate and unknown fields.
            format!(r#"{{"rule":"sms","key":"{long}"}}"#),
            format!(r#"{{"rule":"{long}","key":"k"}}"#),
            r#"{"rule":"sms","key":"\ud800"}"#.into(),
            r#"{"rule":"sms","key":""}"#.into(),
            r#"{"rule":"sms","key":"a","key":"b"}"#.into(),
            r#"{"rule":"sms","key":"a","rule":"api"}"#.into(),
            r#"{"rule":"sms","key":"a","__proto__":1}"#.into(),
            r#"{"rule":"sms","key":"a","tier":"vip"}"#.into(),
            r#"{"checks":[{"checks":[{"rule":"sms","key":"a"}],"key":"b"}]}"#.into(),
            r#"{"checks":[],"rule":"sms"}"#.into(),
            "\u{feff}{}".into(),
            "null".into(),
            String::new(),
        ];
        for body in &bodies {
            let outcome = decodes_or_is_refused(&live, body.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            assert!(outcome.is_none(), "{} decoded", &body[..body.len().min(80)]);
        }
        // Unicode keys are data; 2,000 checks are refused, having built at most MAX_CHECKS.
        let unicode = r#"{"rule":"sms","key":"naïve ☃ \u0000 ключ"}"#;
        assert!(decodes_or_is_refused(&live, unicode.as_bytes()).unwrap_or_else(|e| panic!("{e}")).is_some());
        let many = format!(r#"{{"checks":[{}]}}"#, vec![r#"{"rule":"sms","key":"a"}"#; 2_000].join(","));
        assert!(decodes_or_is_refused(&live, many.as_bytes()).unwrap_or_else(|e| panic!("{e}")).is_none());
    }

    #[test]
    fn durations_of_any_size_parse_or_fail_cleanly() {
        for text in ["18446744073709551615s", "18446744073709551616ms", "584942417355y", "9999999999999999999d", "1e9s"]
        {
            // Either an error, or a duration that the quota then refuses.
            if let Ok(d) = parse_duration(text) {
                assert!(slidegate::Quota::new(1, d).is_err(), "{text}: {d:?}");
            }
        }
    }
}
