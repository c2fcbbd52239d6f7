//! A request's id: what ties an error answer to the log line that holds its detail. A backend's
//! own error text (a script's line number, a Redis reply, a connection error) never reaches a
//! caller; the caller gets a stable code, a generic message and this id, the log gets the text.
//!
//! The id is the request's `x-request-id` (HTTP header or gRPC metadata) when it is one of
//! [`MAX_REQUEST_ID_LEN`] visible ASCII bytes or fewer, so that a proxy's id (Envoy sets one)
//! finds the line; otherwise one made here. It is read only when an answer needs it: a decision
//! that succeeds costs the header's lookup and nothing more.

use std::hash::{BuildHasher, RandomState};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::HeaderValue;
use slidegate::{Error, ErrorClass};

/// The header (and gRPC metadata key) a request's id is read from and answered in.
pub const HEADER: &str = slidegate::headers::REQUEST_ID;

/// The longest `x-request-id` taken as given; a longer one (or one that is not visible ASCII)
/// is replaced by an id of this server's, so a caller cannot write what it likes into the log.
pub use slidegate::headers::MAX_REQUEST_ID_LEN;

tokio::task_local! {
    /// The `x-request-id` the request being answered brought, if any.
    static GIVEN: Option<HeaderValue>;
}

/// Runs `answer` as the answer to a request that brought `given` as its `x-request-id`.
pub async fn scope<F: Future>(given: Option<HeaderValue>, answer: F) -> F::Output {
    GIVEN.scope(given, answer).await
}

/// The id of the request being answered: its own when usable, else a new one (also outside any
/// [`scope`]).
pub fn current() -> String {
    GIVEN.try_with(|given| given.as_ref().and_then(usable)).ok().flatten().unwrap_or_else(generated)
}

/// What an answer that needs no request id (`/readyz`, `/v1/stats`) says of a backend that is
/// not ready: the kind of failure, never the words of Redis or of the system (an address, a
/// reply); this server's own words (a module that is not loaded) as they are. Everything is
/// logged here, under `context`.
pub fn unready(context: &'static str, e: &Error) -> String {
    let text = crate::redact::redact(&e.to_string()).into_owned();
    tracing::warn!(context, "the backend is not ready: {text}");
    match e.class() {
        _ if matches!(e, Error::ModuleNotLoaded | Error::Tls { .. }) => text,
        ErrorClass::BackendFailure => "the backend cannot be reached or did not answer in time".into(),
        ErrorClass::BackendError => "the backend answered with an error; the server log has the detail".into(),
        _ => text,
    }
}

/// `given` when it is 1 to [`MAX_REQUEST_ID_LEN`] visible ASCII bytes.
fn usable(given: &HeaderValue) -> Option<String> {
    slidegate::headers::request_id(given.as_bytes()).map(str::to_owned)
}

/// A new id: 16 hex digits, unique within the process and unlikely to repeat across instances
/// (a per-process random start).
fn generated() -> String {
    static NEXT: LazyLock<AtomicU64> =
        LazyLock::new(|| AtomicU64::new(RandomState::new().hash_one(std::process::id())));
    format!("{:016x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_usable_id_is_kept_and_any_other_replaced() {
        let given = |text: &[u8]| scope(HeaderValue::from_bytes(text).ok(), async { current() });
        assert_eq!(given(b"abc-123").await, "abc-123");
        let long = "a".repeat(MAX_REQUEST_ID_LEN);
        assert_eq!(given(long.as_bytes()).await, long);
        for bad in ["a".repeat(MAX_REQUEST_ID_LEN + 1), "a b".into(), "caf\u{e9}".into()] {
            let id = given(bad.as_bytes()).await;
            assert!(id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{bad:?} → {id}");
        }
        assert_ne!(current(), current(), "each made id is new");
    }
}
