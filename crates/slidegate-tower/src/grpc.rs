//! Answers to gRPC requests: a gRPC client reads the outcome of a call from `grpc-status`, not
//! from the HTTP status (tonic reads a 429 as `UNAVAILABLE`), so the layer's own answers to a
//! gRPC request are trailers-only responses: `200 OK`, `content-type: application/grpc`, the
//! status in the headers and no body.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, header};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::Rejection;

/// gRPC's server pushback (gRFC A6): a client with a retry policy waits this many milliseconds
/// before retrying.
const RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether the request is a gRPC call (`application/grpc`, `application/grpc+proto`, …; not
/// gRPC-Web, whose answers travel in the body).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.strip_prefix(b"application/grpc").is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    })
}

/// The headers of a call over its limit: `RESOURCE_EXHAUSTED`, the delay in words, as a
/// `google.rpc.RetryInfo` detail and as gRPC's pushback.
pub(crate) fn exhausted(retry_after: Duration) -> HeaderMap {
    // Whole milliseconds, rounded up: a client that waits this long is never early.
    let ms = u64::try_from(retry_after.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    let delay = Duration::from_millis(ms);
    let message = format!("rate limit exceeded, retry after {delay:?}");
    let status =
        Status::with_error_details(Code::ResourceExhausted, message, ErrorDetails::with_retry_info(Some(delay)));
    let mut headers = status_headers(&status);
    headers.insert(RETRY_PUSHBACK_MS, HeaderValue::from(ms));
    headers
}

/// The headers of a call the layer refuses to count: `INVALID_ARGUMENT` for the request's own
/// input, `INTERNAL` when the limiter could not decide.
pub(crate) fn rejected(rejection: Rejection) -> HeaderMap {
    let code = if rejection.status().is_client_error() { Code::InvalidArgument } else { Code::Internal };
    status_headers(&Status::new(code, rejection.message()))
}

/// `content-type`, `grpc-status`, `grpc-message` (percent-encoded) and
/// `grpc-status-details-bin` (base64), as tonic writes them.
fn status_headers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(5);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    // Only a message that is not a header value can fail, and `add_header` percent-encodes it.
    let _ = status.add_header(&mut headers);
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_told_from_others() {
        let with = |v: &'static str| HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static(v))]);
        for grpc in ["application/grpc", "application/grpc+proto", "application/grpc;charset=utf-8"] {
            assert!(is_grpc(&with(grpc)), "{grpc}");
        }
        for other in ["application/grpc-web", "application/grpc-web+proto", "application/json", "application/grpcx"] {
            assert!(!is_grpc(&with(other)), "{other}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn the_delay_is_rounded_up_to_the_millisecond() {
        let headers = exhausted(Duration::from_micros(1_200_001));
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(headers[RETRY_PUSHBACK_MS], "1201");
        let status = Status::from_header_map(&headers).expect("a status");
        let retry = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(1201)));
    }
}
