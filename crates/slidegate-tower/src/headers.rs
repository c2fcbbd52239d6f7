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
    fn every_value_lands_under_its_name() {
        let q = Quota::per_second(10).expect("q");
        let denied = Decision::denied(10, 0, Duration::from_millis(900), Duration::from_millis(1_200));
        let values = RateLimitHeaders::new(&[("api", &q, &denied)], denied.retry_after);
        let h = rate_limit_headers(&[("api", &q, &denied)], denied.retry_after);
        assert_eq!(h["ratelimit-policy"], values.policy);
        assert_eq!(h["ratelimit"], values.state);
        assert_eq!(Some(h["retry-after"].to_str().expect("ascii")), values.retry_after.as_deref());
        assert_eq!(h.len(), 3);
        let admitted = Decision::allowed(10, 9, Duration::from_secs(1));
        assert_eq!(rate_limit_headers(&[("api", &q, &admitted)], None).len(), 2, "no Retry-After");
    }
}
