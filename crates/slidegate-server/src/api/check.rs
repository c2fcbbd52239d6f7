//! `POST /v1/check`: its route outside the router, and one check or a group decided and
//! answered.

use std::sync::Arc;

use ::metrics::Histogram;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use slidegate::Check;

use super::body::{CheckRequest, Resolved, decode_check, overridden};
use crate::api_error::{ApiError, MAX_BODY};
use crate::app::{App, Live, count_decision, decide_one};
use crate::http::decision::{decision_answer, decision_response, write_decision, write_optional_ms};
use crate::metrics;
use crate::trace::Decided;

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

pub(super) async fn check(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
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
