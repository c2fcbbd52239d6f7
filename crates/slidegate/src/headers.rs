//! The RateLimit header fields of an answer — `RateLimit-Policy` and `RateLimit` as structured
//! fields of draft-ietf-httpapi-ratelimit-headers-09/-10 (one list member per policy), and
//! `Retry-After` — as names and text: the one place their values are written. No HTTP types
//! here: the tower layer and the service's HTTP API each put them into their own header map.

use std::ops::Range;
use std::time::Duration;

use crate::{Decision, Quota};

/// The name of the `RateLimit-Policy` field (lowercase, as HTTP/2 sends names).
pub const POLICY: &str = "ratelimit-policy";
/// The name of the `RateLimit` field.
pub const STATE: &str = "ratelimit";
/// The name of the `Retry-After` field.
pub const RETRY_AFTER: &str = "retry-after";

/// The name of the field a request's id is read from (a proxy's, as Envoy sets it), for the
/// log lines that hold a failure's detail.
pub const REQUEST_ID: &str = "x-request-id";

/// The longest request id taken as given: a longer one, or one that is not visible ASCII, is
/// not written into a log (a caller cannot write what it likes there).
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// `value` as a request id fit for a log line: 1 to [`MAX_REQUEST_ID_LEN`] visible ASCII bytes.
///
/// ```
/// assert_eq!(slidegate::headers::request_id(b"req-42"), Some("req-42"));
/// assert_eq!(slidegate::headers::request_id(b"a b\n"), None);
/// ```
pub fn request_id(value: &[u8]) -> Option<&str> {
    let fits = !value.is_empty() && value.len() <= MAX_REQUEST_ID_LEN && value.iter().all(u8::is_ascii_graphic);
    fits.then(|| std::str::from_utf8(value).ok()).flatten()
}

/// The values of an answer's RateLimit header fields.
///
/// ```
/// use slidegate::headers::RateLimitHeaders;
/// use slidegate::{Decision, Quota};
/// use std::time::Duration;
///
/// let q = Quota::per_minute(5)?;
/// let d = Decision::allowed(5, 4, Duration::from_secs(60));
/// let h = RateLimitHeaders::new(&[("login", &q, &d)], None);
/// assert_eq!(h.policy, r#""login";q=5;w=60"#);
/// assert_eq!(h.state, r#""login";r=4;t=60"#);
/// assert_eq!(h.retry_after, None);
/// # Ok::<(), slidegate::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitHeaders {
    /// [`POLICY`]: `"<name>";q=<limit>;w=<window in seconds>` per policy.
    pub policy: String,
    /// [`STATE`]: `"<name>";r=<remaining>;t=<seconds>` per policy, where `t` is the time until
    /// the window empties or, on a denial, until a retry succeeds.
    pub state: String,
    /// [`RETRY_AFTER`]: whole seconds, at least 1; when the answer gives a retry time.
    pub retry_after: Option<String>,
}

impl RateLimitHeaders {
    /// The fields for `items` = (policy name, quota, decision), in order, with `Retry-After`
    /// when `retry_after` is given. Every number is rounded up to whole seconds: a client that
    /// waits this long is never early.
    pub fn new(items: &[(&str, &Quota, &Decision)], retry_after: Option<Duration>) -> Self {
        let mut headers = Self::with_capacity(items.len());
        for (name, q, d) in items {
            let (window, reset) = seconds(q, d);
            headers.push(name, q.limit(), window, d.remaining, reset);
        }
        headers.retry_after = retry_after.map(|r| itoa::Buffer::new().format(retry_secs(r)).to_owned());
        headers
    }

    /// No policy yet, with room for `policies`.
    pub fn with_capacity(policies: usize) -> Self {
        Self {
            policy: String::with_capacity(40 * policies),
            state: String::with_capacity(40 * policies),
            retry_after: None,
        }
    }

    /// Appends one policy: `"<name>";q=<limit>;w=<window_secs>` to [`POLICY`] and
    /// `"<name>";r=<remaining>;t=<reset_secs>` to [`STATE`]. The name is written as a
    /// structured-field string: quoted, `"` and `\` escaped, anything but printable ASCII as `?`
    /// (names may come from a request).
    pub fn push(&mut self, name: &str, limit: u64, window_secs: u64, remaining: u64, reset_secs: u64) {
        push_member(&mut self.policy, 0, name, POLICY_PARAMS, limit, window_secs);
        push_member(&mut self.state, 0, name, STATE_PARAMS, remaining, reset_secs);
    }
}

/// Where [`write_values`] wrote each field's value in its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ValueSpans {
    /// [`POLICY`]'s value.
    pub policy: Range<usize>,
    /// [`STATE`]'s value.
    pub state: Range<usize>,
    /// [`RETRY_AFTER`]'s value, when the answer gives a retry time.
    pub retry_after: Option<Range<usize>>,
}

/// Appends the values [`RateLimitHeaders::new`] gives to `out`, one after the other, and says
/// where each lies: a server can then send an answer's body and its header values from one
/// buffer, allocated once.
///
/// ```
/// use slidegate::headers::write_values;
/// use slidegate::{Decision, Quota};
/// use std::time::Duration;
///
/// let q = Quota::per_minute(5)?;
/// let d = Decision::allowed(5, 4, Duration::from_secs(60));
/// let mut out = String::from("{}");
/// let spans = write_values(&mut out, &[("login", &q, &d)], None);
/// assert_eq!(&out[spans.policy], r#""login";q=5;w=60"#);
/// assert_eq!(&out[spans.state], r#""login";r=4;t=60"#);
/// assert_eq!(spans.retry_after, None);
/// # Ok::<(), slidegate::Error>(())
/// ```
pub fn write_values(
    out: &mut String,
    items: &[(&str, &Quota, &Decision)],
    retry_after: Option<Duration>,
) -> ValueSpans {
    let policy = append_list(out, items, |q, d| (POLICY_PARAMS, q.limit(), seconds(q, d).0));
    let state = append_list(out, items, |q, d| (STATE_PARAMS, d.remaining, seconds(q, d).1));
    let retry_after = retry_after.map(|r| {
        let start = out.len();
        out.push_str(itoa::Buffer::new().format(retry_secs(r)));
        start..out.len()
    });
    ValueSpans { policy, state, retry_after }
}

/// Appends a list with a member per item, whose parameters `member` gives; its span.
fn append_list(
    out: &mut String,
    items: &[(&str, &Quota, &Decision)],
    member: impl Fn(&Quota, &Decision) -> ([&'static str; 2], u64, u64),
) -> Range<usize> {
    let start = out.len();
    for (name, q, d) in items {
        let (params, x, y) = member(q, d);
        push_member(out, start, name, params, x, y);
    }
    start..out.len()
}

/// The parameter names of a [`POLICY`] member (limit, window) and of a [`STATE`] member
/// (remaining, reset).
const POLICY_PARAMS: [&str; 2] = ["\";q=", ";w="];
const STATE_PARAMS: [&str; 2] = ["\";r=", ";t="];

/// A policy's window and the seconds until its window empties or, on a denial, until a retry
/// succeeds: both rounded up.
fn seconds(q: &Quota, d: &Decision) -> (u64, u64) {
    (ceil_secs(q.window()).max(1), ceil_secs(d.retry_after.unwrap_or(d.reset_after)))
}

/// `Retry-After`'s seconds: rounded up, at least 1 (a retry is never due at once).
fn retry_secs(r: Duration) -> u64 {
    ceil_secs(r).max(1)
}

/// Appends one list member, `"<name>";<p>=<x>;<q>=<y>`, to the list in `out` that starts at
/// `list_start`.
fn push_member(out: &mut String, list_start: usize, name: &str, params: [&str; 2], x: u64, y: u64) {
    if out.len() > list_start {
        out.push_str(", ");
    }
    out.push('"');
    push_escaped(out, name);
    let mut digits = itoa::Buffer::new();
    out.push_str(params[0]);
    out.push_str(digits.format(x));
    out.push_str(params[1]);
    out.push_str(digits.format(y));
}

/// `text` inside a structured-field string: `"` and `\` escaped, anything but printable ASCII
/// replaced by `?`. Rule names, the common case, are copied as they are.
fn push_escaped(out: &mut String, text: &str) {
    if text.bytes().all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\') {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early. Whole
/// milliseconds count (a part of one does not), as everywhere the API answers in ms; no 128-bit
/// division, as this runs up to three times per answer.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_millis() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_policies_and_a_denial() {
        let (a, b) = (Quota::per_second(10).expect("q"), Quota::per_hour(1_000).expect("q"));
        let da = Decision::denied(10, 0, Duration::from_millis(900), Duration::from_millis(1_200));
        let db = Decision::held(1_000, 7, Duration::from_secs(3_599));
        let h = RateLimitHeaders::new(&[("api", &a, &da), ("daily", &b, &db)], Some(Duration::from_millis(1_200)));
        assert_eq!(h.policy, r#""api";q=10;w=1, "daily";q=1000;w=3600"#);
        assert_eq!(h.state, r#""api";r=0;t=2, "daily";r=7;t=3599"#);
        assert_eq!(h.retry_after.as_deref(), Some("2"));
    }

    #[test]
    fn names_are_structured_field_strings() {
        let mut h = RateLimitHeaders::with_capacity(2);
        h.push("per_ip", 10, 60, 7, 30);
        h.push("d.path_\"x\"\\\u{e9}", 100, 3_600, 0, 2);
        assert_eq!(h.policy, r#""per_ip";q=10;w=60, "d.path_\"x\"\\?";q=100;w=3600"#);
        assert_eq!(h.state, r#""per_ip";r=7;t=30, "d.path_\"x\"\\?";r=0;t=2"#);
        assert_eq!(h.retry_after, None);
    }

    #[test]
    fn seconds_round_up_and_saturate() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
        let q = Quota::per_second(1).expect("q");
        let d = Decision::allowed(u64::MAX, u64::MAX, Duration::ZERO);
        let h = RateLimitHeaders::new(&[("x", &q, &d)], Some(Duration::ZERO));
        assert_eq!(h.state, format!(r#""x";r={};t=0"#, u64::MAX));
        assert_eq!(h.retry_after.as_deref(), Some("1"), "never 0: a retry is not due at once");
    }
}
