//! A decision answered over HTTP: the RateLimit headers and `/v1/check`'s JSON, the one place
//! that builds them for every HTTP surface.

use std::sync::LazyLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::Response;
use slidegate::headers as rate_limit;
use slidegate::{Decision, Quota};

use crate::app::App;

/// A decision's answer: the RateLimit headers for `items` (and `Retry-After` with
/// `retry_after`), and `body`, the decisions already written out as JSON (by
/// [`write_decision`]), or no body when `None`. The header values are appended to the body's
/// buffer, which the body and each header value then share: one allocation for the whole
/// answer, not one per value. The one place that builds these headers.
pub(crate) fn decision_response(
    body: Option<String>,
    items: &[(&str, &Quota, &Decision)],
    retry_after: Option<Duration>,
) -> Response {
    let json = body.is_some();
    // The header values of one policy, ~80 bytes.
    let mut body = body.unwrap_or_else(|| String::with_capacity(96));
    let body_len = body.len();
    let spans = rate_limit::write_values(&mut body, items, retry_after);
    let answer = Bytes::from(body);
    let value = |span| HeaderValue::from_maybe_shared(answer.slice(span)).ok();
    let spans = [Some(spans.policy), Some(spans.state), spans.retry_after];
    let mut headers = DECISION_HEADS[usize::from(json)][usize::from(spans[2].is_some())].clone();
    for (slot, span) in headers.values_mut().skip(usize::from(json)).zip(spans.into_iter().flatten()) {
        // `write_values` writes visible ASCII: always a valid value.
        *slot = value(span).unwrap_or(HeaderValue::from_static(""));
    }
    let body = if json { Body::from(answer.slice(..body_len)) } else { Body::empty() };
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response
}

/// The heads of a decision's answer, their values to be filled in, by whether it has a JSON
/// body (`content-type` first) and then by whether it has a retry time: `RateLimit-Policy` and
/// `RateLimit`, then `Retry-After`. A copy of one costs an answer less than a new map with the
/// same fields, whose every insert hashes its name and probes for its place.
static DECISION_HEADS: LazyLock<[[HeaderMap; 2]; 2]> = LazyLock::new(|| {
    let head = |json: bool, names: &[HeaderName]| {
        let mut head = HeaderMap::with_capacity(names.len() + 1);
        if json {
            head.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        for name in names {
            head.insert(name, HeaderValue::from_static(""));
        }
        head
    };
    let (policy, state) = (HeaderName::from_static(rate_limit::POLICY), HeaderName::from_static(rate_limit::STATE));
    let (plain, retry) = ([policy.clone(), state.clone()], [policy, state, header::RETRY_AFTER]);
    [[head(false, &plain), head(false, &retry)], [head(true, &plain), head(true, &retry)]]
});

/// Appends one decision as the API answers it: `{"rule", "allowed", "limit", "remaining",
/// "reset_after_ms", "retry_after_ms" (null when admitted), "next_permit_after_ms", "degraded",
/// then "policy" when a
/// failure policy decided, else "engine"}`. Written by hand, as the RateLimit headers are:
/// serde_json spent ~2,100 instructions on this object, a sixteenth of a whole check. Only the
/// rule name can need escaping (config names are `[A-Za-z0-9_.-]`, the rest are constants).
pub(crate) fn write_decision(out: &mut String, rule: &str, d: &Decision, engine: &str) {
    out.push_str(r#"{"rule":"#);
    if rule.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(rule);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(rule).to_string());
    }
    out.push_str(if d.allowed { r#","allowed":true,"limit":"# } else { r#","allowed":false,"limit":"# });
    out.push_str(itoa::Buffer::new().format(d.limit));
    out.push_str(r#","remaining":"#);
    out.push_str(itoa::Buffer::new().format(d.remaining));
    out.push_str(r#","reset_after_ms":"#);
    push_ms(out, d.reset_after);
    out.push_str(r#","retry_after_ms":"#);
    write_optional_ms(out, d.retry_after);
    out.push_str(r#","next_permit_after_ms":"#);
    push_ms(out, d.next_permit_after);
    out.push_str(if d.degraded.is_some() { r#","degraded":true"# } else { r#","degraded":false"# });
    let (field, value) = match d.degraded {
        Some(policy) => (r#","policy":""#, policy.as_str()),
        None => (r#","engine":""#, engine),
    };
    for part in [field, value, "\"}"] {
        out.push_str(part);
    }
}

/// Appends a duration in whole ms.
fn push_ms(out: &mut String, d: Duration) {
    out.push_str(itoa::Buffer::new().format(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
}

/// Appends a duration in ms, or `null`.
pub(crate) fn write_optional_ms(out: &mut String, ms: Option<Duration>) {
    match ms {
        Some(ms) => push_ms(out, ms),
        None => out.push_str("null"),
    }
}

/// One decision answered as `/v1/check` answers it: the RateLimit headers, and with `json` the
/// decision's JSON as the body (else no body). The status is 200; a surface that denies with
/// another sets its own.
pub(crate) fn decision_answer(app: &App, rule: &str, quota: &Quota, d: &Decision, json: bool) -> Response {
    let body = json.then(|| {
        // The decision (~190 bytes) and the header values after it (~80 bytes per policy).
        let mut body = String::with_capacity(320);
        write_decision(&mut body, rule, d, app.limiter.backend().engine());
        body
    });
    decision_response(body, &[(rule, quota, d)], d.retry_after)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};
    use slidegate::{Decision, FailurePolicy};

    use super::write_decision;

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
    fn a_rule_name_that_needs_escaping_stays_valid_json() {
        let d = Decision::allowed(1, 0, Duration::from_millis(1));
        for rule in ["say \"hi\"", "back\\slash", "tab\there", "naïve"] {
            assert_eq!(written(rule, &d)["rule"], json!(rule));
        }
    }
}
