//! The HTTP/JSON API. Handlers translate JSON to library calls and back; every client mistake
//! is a 4xx with `{"error": {"code", "message"}}`, never a 500.
//!
//! Here: the route table, `/v1/rules`, the key routes, `/metrics` and the probes. Beside it:
//! `check` (`/v1/check`), `charge` (`/v1/charge`, `/v1/refund`), `body` (their bodies, decoded
//! and resolved), `override_routes` (`/v1/overrides`), `describe` (what `/v1/rules` says of the
//! inline bounds and the Envoy limits).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use slidegate::{Algorithm, Quota};

use crate::api_error::ApiError;
use crate::app::App;
use crate::http::{Route, authorize, route};
use crate::metrics;
use crate::overrides::{self, Source, Target};

mod body;
mod charge;
mod check;
mod describe;
pub mod override_routes;

pub(crate) use check::{CHECK, CheckRoute};

/// The most admission times `GET /v1/keys/{rule}/{key}` lists (a sliding log's newest): enough
/// to draw any window, and a bound on the answer (about 15 bytes each).
pub const INSPECT_ADMISSIONS: usize = 1_000;

/// The API's routes (`crate::routes` serves them with every other surface's).
pub fn routes() -> Vec<Route> {
    vec![
        route(Method::POST, CHECK, check::check),
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
    let (quota, source) = target.base(&live.rules, &app.envoy(), tier.as_deref())?;
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
