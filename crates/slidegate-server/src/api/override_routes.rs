//! The admin routes of overrides, behind the admin token:
//!
//! - `PUT /v1/overrides/{rule}/{key}` with [`OverrideBody`]: sets the key's override →
//!   `{"rule", "key", "override", "previous"}`.
//! - `DELETE /v1/overrides/{rule}/{key}` → `{"rule", "key", "deleted": true, "previous"}`, or
//!   404 `no_override`.
//! - `GET /v1/overrides/{rule}?after=<key>&limit=<n>` → `{"rule", "total", "overrides": […],
//!   "next"}`: one page, ordered by key; `next` is the `after` of the next page.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api_error::ApiError;
use crate::app::{App, Live};
use crate::http::authorize;
use crate::override_changes::{self as change, ChangeError, audit};
use crate::overrides::{Limits, OverrideBody, Record, Target, TargetError, now_ms};

/// The page size of a list unless `limit` says otherwise.
pub const DEFAULT_PAGE: usize = 100;

/// The largest page of a list.
pub const MAX_PAGE: usize = 1_000;

/// The admin client's address, which the HTTP listener attaches to admin requests.
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

fn address(peer: &Peer) -> String {
    peer.as_ref().map_or_else(|| "unknown".to_owned(), |Extension(ConnectInfo(addr))| addr.ip().to_string())
}

/// The target of an admin request, after the token check.
fn target(
    app: &App,
    headers: &HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Target, ApiError> {
    authorize(&app.live(), headers)?;
    let Path((rule, key)) = path.map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
    Ok(Target::parse(&rule, &key)?)
}

/// `PUT /v1/overrides/{rule}/{key}`.
pub async fn put(
    State(app): State<Arc<App>>,
    peer: Peer,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let target = target(&app, &headers, path)?;
    let (live, envoy) = (app.live(), app.envoy());
    let (base, _) = target.base(&live.rules, &envoy, None)?;
    target.own_counter(&envoy)?;
    let body: OverrideBody =
        serde_json::from_slice(&body?).map_err(|e| ApiError::bad_request("invalid_json", e.to_string()))?;
    let (limits, ttl) = body.limits(&base, matches!(target, Target::Descriptor { .. }))?;
    fits_every_tier(&live, &target, &limits)?;
    let now = now_ms();
    let from = address(&peer);
    let o = crate::overrides::Override {
        rule: target.rule(),
        key: target.key(),
        limits,
        set_at_ms: now,
        expires_at_ms: ttl.map(|t| now.saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX))),
        set_from: from.clone(),
    };
    let previous = change::set(&app, &target, o.clone()).await?;
    audit("set", &o.rule, &o.key, previous.as_ref(), Some(&o), &from);
    Ok(Json(json!({
        "rule": o.rule, "key": o.key, "override": Record::from(&o), "previous": previous.as_ref().map(Record::from),
    })))
}

/// Refuses `limits` when they do not fit a tier of the target's rule: a key is checked under
/// any tier with the one override, which would then be ignored there.
fn fits_every_tier(live: &Live, target: &Target, limits: &Limits) -> Result<(), ApiError> {
    let Some(rule) = live.rules.get(&target.rule()).filter(|_| matches!(target, Target::Rule { .. })) else {
        return Ok(());
    };
    for (tier, quota) in &rule.tiers {
        limits.over(quota).map_err(|e| ApiError::bad_request("invalid_quota", format!("under tier {tier:?}: {e}")))?;
    }
    Ok(())
}

/// `DELETE /v1/overrides/{rule}/{key}`.
pub async fn delete(
    State(app): State<Arc<App>>,
    peer: Peer,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let target = target(&app, &headers, path)?;
    let (rule, key) = (target.rule(), target.key());
    let Some(previous) = change::delete(&app, &target).await? else {
        let message = format!("{rule:?} has no override for {key:?}");
        return Err(ApiError::new(StatusCode::NOT_FOUND, "no_override", message));
    };
    audit("delete", &rule, &key, Some(&previous), None, &address(&peer));
    Ok(Json(json!({"rule": rule, "key": key, "deleted": true, "previous": Record::from(&previous)})))
}

/// A list's query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/overrides/{rule}`.
pub async fn list(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Page>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    authorize(&app.live(), &headers)?;
    let Path(rule) = path.map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
    let Query(page) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let limit = page.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request("invalid_query", format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let (overrides, total) = app.overrides.page(&rule, page.after.as_deref(), limit);
    let next = (overrides.len() == limit).then(|| overrides.last().map(|o| o.key.clone())).flatten();
    let records: Vec<Record> = overrides.iter().map(Record::from).collect();
    Ok(Json(json!({"rule": rule, "total": total, "overrides": records, "next": next})))
}

impl From<TargetError> for ApiError {
    fn from(e: TargetError) -> Self {
        let message = e.to_string();
        match e {
            TargetError::Key(e) => e.into(),
            TargetError::KeyTooLongForRule { .. } => ApiError::bad_request("key_too_long", message),
            TargetError::Descriptor(_) => ApiError::bad_request("invalid_descriptor", message),
            TargetError::UnknownRule(_) => ApiError::new(StatusCode::NOT_FOUND, "unknown_rule", message),
            TargetError::UnknownTier { .. } => ApiError::bad_request("unknown_tier", message),
            TargetError::UnknownDescriptor { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_descriptor", message)
            }
            TargetError::NoQuota => ApiError::bad_request("no_quota", message),
            TargetError::TierOfDescriptor => ApiError::bad_request("invalid_request", message),
            TargetError::Shared { .. } => ApiError::bad_request("shared_descriptor", message),
        }
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Full(full) => ApiError::new(StatusCode::CONFLICT, "too_many_overrides", full.to_string()),
            ChangeError::Store(e) => ApiError::backend(StatusCode::SERVICE_UNAVAILABLE, "backend_unavailable", &e),
        }
    }
}
