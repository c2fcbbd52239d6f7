//! The IETF RateLimit headers: `RateLimit-Policy` and `RateLimit` as structured fields of
//! draft-ietf-httpapi-ratelimit-headers-09/-10 (one list member per policy), and `Retry-After`.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use slidegate::{Decision, Quota};

/// The headers for `items` = (policy name, quota, decision), e.g.
/// `RateLimit-Policy: "login";q=5;w=60` and `RateLimit: "login";r=4;t=60`, where `t` is the
/// seconds until the window empties or, on a denial, until a retry succeeds; with
/// `Retry-After` (whole seconds, rounded up) when `retry_after` is given.
///
/// ```
/// use slidegate::{Decision, Quota};
/// use std::time::Duration;
///
/// let q = Quota::per_minute(5)?;
/// let d = Decision::allowed(5, 4, Duration::from_secs(60));
/// let h = slidegate_tower::rate_limit_headers(&[("login", &q, &d)], None);
/// assert_eq!(h["ratelimit-policy"], r#""login";q=5;w=60"#);
/// assert_eq!(h["ratelimit"], r#""login";r=4;t=60"#);
/// # Ok::<(), slidegate::Error>(())
/// ```
pub fn rate_limit_headers(items: &[(&str, &Quota, &Decision)], retry_after: Option<Duration>) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(3);
    insert_rate_limit_headers(&mut headers, items, retry_after);
    headers
}

/// [`rate_limit_headers`] written into an existing map (a response's own), which saves building
/// and merging a second one on every request.
pub fn insert_rate_limit_headers(
    headers: &mut HeaderMap,
    items: &[(&str, &Quota, &Decision)],
    retry_after: Option<Duration>,
) {
    // Names as constants: `from_static` validates its argument each time it runs.
    const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
    const STATE: HeaderName = HeaderName::from_static("ratelimit");
    let (mut policy, mut state) = (String::with_capacity(40 * items.len()), String::with_capacity(40 * items.len()));
    for (i, (name, q, d)) in items.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        for (out, a, b, c, d) in [
            (&mut policy, ";q=", q.limit(), ";w=", ceil_secs(q.window()).max(1)),
            (&mut state, ";r=", d.remaining, ";t=", ceil_secs(d.retry_after.unwrap_or(d.reset_after))),
        ] {
            out.push('"');
            out.push_str(name);
            out.push('"');
            out.push_str(a);
            push_u64(out, b);
            out.push_str(c);
            push_u64(out, d);
        }
    }
    let mut put = |name: HeaderName, value: String| {
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(name, v);
        }
    };
    put(POLICY, policy);
    put(STATE, state);
    if let Some(r) = retry_after {
        let mut secs = String::new();
        push_u64(&mut secs, ceil_secs(r).max(1));
        put(http::header::RETRY_AFTER, secs);
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).try_into().unwrap_or(u64::MAX)
}

/// Appends `n` in decimal, without the formatting machinery (this runs on every request; the
/// server writes its JSON answers with it too).
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[i..].iter().map(|&d| char::from(d)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_policies_and_a_denial() {
        let (a, b) = (Quota::per_second(10).expect("q"), Quota::per_hour(1_000).expect("q"));
        let da = Decision::denied(10, 0, Duration::from_millis(900), Duration::from_millis(1_200));
        let db = Decision::held(1_000, 7, Duration::from_secs(3_599));
        let h = rate_limit_headers(&[("api", &a, &da), ("daily", &b, &db)], Some(Duration::from_millis(1_200)));
        assert_eq!(h["ratelimit-policy"], r#""api";q=10;w=1, "daily";q=1000;w=3600"#);
        assert_eq!(h["ratelimit"], r#""api";r=0;t=2, "daily";r=7;t=3599"#);
        assert_eq!(h["retry-after"], "2");
        let mut s = String::new();
        push_u64(&mut s, u64::MAX);
        assert_eq!(s, u64::MAX.to_string());
    }
}
