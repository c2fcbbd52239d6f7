//! A failure as an HTTP answer, `{"error": {"code", "message"}}`, shared by every surface
//! that answers over HTTP and by the models whose requests come from it.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use slidegate::ErrorClass;

use crate::inline::InlineRefusal;
use crate::metrics;
use crate::redact::redact;

/// The largest request body accepted (a multi-check of 16 long keys fits easily).
pub const MAX_BODY: usize = 64 * 1024;

/// A client's or the backend's failure as an HTTP answer.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// Set on a backend's failure: the id its log line is under ([`crate::request_id`]).
    request_id: Option<String>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), request_id: None }
    }

    /// A backend's failure (`code`: `backend_unavailable`, `backend_timeout`, `backend_error`):
    /// its own text goes to the log under the request's id, the answer says only what kind of
    /// failure it was and that id.
    pub(crate) fn backend(status: StatusCode, code: &'static str, detail: &dyn std::fmt::Display) -> Self {
        let request_id = crate::request_id::current();
        // Errors can quote a backend URL; its password stays out of the log too.
        tracing::warn!(request_id, code, "the backend failed: {}", redact(&detail.to_string()));
        let what = match code {
            "backend_timeout" => "the backend did not answer in time",
            "backend_unavailable" => "the backend cannot decide now",
            _ => "the backend failed to decide this request",
        };
        let message = format!("{what}; the server log has the detail under request id {request_id}");
        Self { status, code, message, request_id: Some(request_id) }
    }

    pub(crate) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn body_too_large() -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", format!("request body over {MAX_BODY} bytes"))
    }

    /// The error's code, as the answer spells it.
    #[cfg(test)]
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let Some(id) = self.request_id else {
            let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
            return (self.status, body).into_response();
        };
        let body = Json(json!({"error": {"code": self.code, "message": self.message, "request_id": id}}));
        let header = HeaderValue::from_str(&id).ok().map(|v| [(crate::request_id::HEADER, v)]);
        (self.status, header, body).into_response()
    }
}

/// Only the backend failing (unreachable, slow: [`slidegate::Error::is_backend_failure`]) is a
/// 503 and counts in `slidegate_backend_errors_total`; a backend that answered wrongly (a Redis
/// error reply, a reply no script gives) is a 500 `backend_error`, counted nowhere as degraded;
/// everything else is about what the caller sent: a 400, never a 503.
impl From<slidegate::Error> for ApiError {
    fn from(e: slidegate::Error) -> Self {
        use slidegate::Error as E;
        match e.class() {
            ErrorClass::BackendFailure => {
                let code = if matches!(e, E::Timeout(_)) { "backend_timeout" } else { "backend_unavailable" };
                ::metrics::counter!(metrics::BACKEND_ERRORS, "kind" => metrics::failure_kind(&e)).increment(1);
                return Self::backend(StatusCode::SERVICE_UNAVAILABLE, code, &e);
            }
            ErrorClass::Caller => {}
            _ => return Self::backend(StatusCode::INTERNAL_SERVER_ERROR, "backend_error", &e),
        }
        // A caller's error quotes only what the caller sent and the bounds; a URL's password
        // stays out all the same.
        let message = redact(&e.to_string()).into_owned();
        let code = match e {
            E::InvalidCost { .. } => "invalid_cost",
            E::EmptyKey => "invalid_key",
            E::KeyTooLong { .. } => "key_too_long",
            E::InvalidLimit { .. } | E::InvalidWindow { .. } | E::InvalidQuota(_) => "invalid_quota",
            E::UnknownAlgorithm(_) => "unknown_algorithm",
            E::CheckCount { .. } => "invalid_checks",
            E::DuplicateKey { .. } => "duplicate_key",
            E::CrossSlot { .. } => "cross_slot",
            _ => "invalid_request",
        };
        Self::bad_request(code, message)
    }
}

impl From<InlineRefusal> for ApiError {
    fn from(r: InlineRefusal) -> Self {
        let status = if r == InlineRefusal::Disabled { StatusCode::FORBIDDEN } else { StatusCode::BAD_REQUEST };
        Self::new(status, r.code(), r.to_string())
    }
}

/// The answer to a request that outlived the request deadline (see [`crate::http`]).
pub(crate) fn request_timed_out(limit: Duration) -> Response {
    let message = format!("the request took longer than request_timeout = {}", humantime::format_duration(limit));
    ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message).into_response()
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::body_too_large()
        } else {
            Self::bad_request("invalid_body", r.body_text())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ApiError;

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
}
