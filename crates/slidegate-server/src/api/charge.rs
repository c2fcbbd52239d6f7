//! `POST /v1/charge` and `POST /v1/refund`: costs a caller knows only once the work is done (an
//! LLM response's tokens). A body is a check's, one or `{"checks": [...]}`, resolved as
//! `/v1/check` resolves it (rule, tier, override, inline quota) and held to the same bounds; the
//! admin token is not needed, as a caller settles its own requests. A charge records its cost
//! whatever the key holds and answers whether the key is within its limit after it; a refund
//! gives back up to its cost of the key's most recent admissions. A group is settled check by
//! check, not all or nothing: a charge is never refused, so there is nothing to hold back.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use slidegate::Decision;

use super::body::{CheckRequest, Resolved, decode_check, overridden};
use crate::api_error::ApiError;
use crate::app::App;
use crate::http::decision::{decision_response, write_decision, write_optional_ms};

/// What a body asks of each of its checks.
#[derive(Debug, Clone, Copy)]
enum Settle {
    Charge,
    Refund,
}

pub(super) async fn charge(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    settle(&app, &body?, Settle::Charge).await
}

pub(super) async fn refund(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    settle(&app, &body?, Settle::Refund).await
}

/// Answers a `/v1/charge` or `/v1/refund` body.
async fn settle(app: &App, body: &[u8], how: Settle) -> Result<Response, ApiError> {
    let live = app.live();
    let (mut resolved, one) = match decode_check(body, &live)? {
        CheckRequest::One(r) => (vec![r], true),
        CheckRequest::Many(rs) => (rs, false),
    };
    for r in &mut resolved {
        overridden(app, r);
        // A check's bounds: a cost no idle key could admit is the caller's mistake here too, and
        // a group with one changes nothing.
        r.quota.validate_cost(r.cost)?;
    }
    let mut settled = Vec::with_capacity(resolved.len());
    for r in &resolved {
        settled.push(settle_one(app, r, how).await?);
    }
    let engine = app.limiter.backend().engine();
    // One settlement (~190 bytes) and its moved permits, or a group of them; then the header
    // values (~80 bytes per policy).
    let mut out = String::with_capacity(64 + 320 * settled.len());
    let retry_after = settled.iter().filter_map(|(d, _)| d.retry_after).max();
    if !one {
        let within = settled.iter().all(|(d, _)| d.allowed);
        out.push_str(if within {
            r#"{"allowed":true,"retry_after_ms":"#
        } else {
            r#"{"allowed":false,"retry_after_ms":"#
        });
        write_optional_ms(&mut out, retry_after);
        out.push_str(r#","results":["#);
    }
    for (i, (r, (d, moved))) in resolved.iter().zip(&settled).enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_settled(&mut out, r, d, *moved, how, engine);
    }
    if !one {
        out.push_str("]}");
    }
    let items: Vec<_> = resolved.iter().zip(&settled).map(|(r, (d, _))| (&*r.policy, &r.quota, d)).collect();
    Ok(decision_response(Some(out), &items, retry_after))
}

/// Charges or refunds one check: the key's standing after it, and the permits moved.
async fn settle_one(app: &App, r: &Resolved<'_>, how: Settle) -> Result<(Decision, u64), ApiError> {
    let limiter = &app.limiter;
    Ok(match how {
        Settle::Charge => {
            let charged = app.timed(limiter.charge(&r.key, &r.quota, r.cost)).await?;
            (charged.decision, charged.recorded)
        }
        Settle::Refund => {
            let refunded = app.timed(limiter.refund(&r.key, &r.quota, r.cost)).await?;
            (refunded.decision, refunded.refunded)
        }
    })
}

/// Appends one settlement: the decision's fields as `/v1/check` writes them, then `"recorded"`
/// and `"clamped"` (fewer recorded than charged: the charge met the library's bound) for a
/// charge, `"refunded"` for a refund.
fn write_settled(out: &mut String, r: &Resolved<'_>, d: &Decision, moved: u64, how: Settle, engine: &str) {
    write_decision(out, &r.policy, d, engine);
    // `write_decision` closes its object: reopened for the moved permits.
    out.pop();
    let field = match how {
        Settle::Charge => r#","recorded":"#,
        Settle::Refund => r#","refunded":"#,
    };
    out.push_str(field);
    out.push_str(itoa::Buffer::new().format(moved));
    if let Settle::Charge = how {
        out.push_str(if moved < r.cost { r#","clamped":true"# } else { r#","clamped":false"# });
    }
    out.push('}');
}
