//! The RateLimit headers of an answer as an [`http::HeaderMap`]: `RateLimit-Policy`, `RateLimit`
//! and `Retry-After`, whose names and values [`slidegate::headers`] writes.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use slidegate::headers::{self, RateLimitHeaders};
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
    // Names as constants: `from_static` validates its argument each time it runs.
    const POLICY: HeaderName = HeaderName::from_static(headers::POLICY);
    const STATE: HeaderName = HeaderName::from_static(headers::STATE);
    let values = RateLimitHeaders::new(items, retry_after);
    let mut map = HeaderMap::with_capacity(3);
    for (name, value) in
        [(POLICY, Some(values.policy)), (STATE, Some(values.state)), (http::header::RETRY_AFTER, values.retry_after)]
    {
        if let Some(v) = value.and_then(|v| HeaderValue::try_from(v).ok()) {
            map.insert(name, v);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_of_two_policies_fills_every_header() {
        let (a, b) = (Quota::per_second(10).expect("q"), Quota::per_hour(1_000).expect("q"));
        let da = Decision::denied(10, 0, Duration::from_millis(900), Duration::from_millis(1_200));
        let db = Decision::held(1_000, 7, Duration::from_secs(3_599));
        let h = rate_limit_headers(&[("api", &a, &da), ("daily", &b, &db)], Some(Duration::from_millis(1_200)));
        assert_eq!(h["ratelimit-policy"], r#""api";q=10;w=1, "daily";q=1000;w=3600"#);
        assert_eq!(h["ratelimit"], r#""api";r=0;t=2, "daily";r=7;t=3599"#);
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h.len(), 3);
    }
}
