//! The rate-limit headers Envoy adds to its answers (`response_headers_to_add`).

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};

use slidegate::headers::{RateLimitHeaders, ceil_secs};

use crate::config::{HeaderStyle, ResponseHeaders};

/// A decided descriptor as the headers see it.
#[derive(Debug)]
pub struct Limited<'a> {
    /// Its status (with a `current_limit`).
    pub status: &'a DescriptorStatus,
    /// The policy's name for the IETF headers: the limit's name, or its stats key.
    pub name: &'a str,
    /// Its window in seconds.
    pub window_secs: u64,
    /// Over a limit that is neither shadow nor quota mode: it decides the request.
    pub decisive: bool,
}

/// The headers for the request's decided descriptors, none when `limited` is empty.
pub fn response_headers(options: &ResponseHeaders, limited: &[Limited<'_>]) -> Vec<HeaderValue> {
    match options.style {
        HeaderStyle::Upstream => upstream(options, limited),
        HeaderStyle::Ietf => ietf(limited),
    }
}

/// envoyproxy/ratelimit's: the limit, remaining and reset (whole seconds, rounded up) of the
/// descriptor with the fewest permits left, or of the last one that is over its limit.
fn upstream(options: &ResponseHeaders, limited: &[Limited<'_>]) -> Vec<HeaderValue> {
    let over = limited.iter().rev().find(|l| l.decisive && l.status.code == Code::OverLimit as i32);
    let Some(chosen) = over.or_else(|| limited.iter().min_by_key(|l| l.status.limit_remaining)) else {
        return Vec::new();
    };
    let s = chosen.status;
    let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    [
        (&options.limit, limit.to_string()),
        (&options.remaining, s.limit_remaining.to_string()),
        (&options.reset, reset_secs(s).to_string()),
    ]
    .into_iter()
    .map(|(name, value)| header(name, value))
    .collect()
}

/// The IETF draft's `RateLimit-Policy` and `RateLimit`, one member per descriptor, as the HTTP
/// API and the tower layer write them ([`RateLimitHeaders`]).
fn ietf(limited: &[Limited<'_>]) -> Vec<HeaderValue> {
    if limited.is_empty() {
        return Vec::new();
    }
    let mut values = RateLimitHeaders::with_capacity(limited.len());
    for l in limited {
        let quota = l.status.current_limit.as_ref().map_or(0, |c| c.requests_per_unit);
        let remaining = l.status.limit_remaining;
        values.push(l.name, quota.into(), l.window_secs, remaining.into(), reset_secs(l.status));
    }
    vec![header("RateLimit-Policy", values.policy), header("RateLimit", values.state)]
}

/// Seconds until the status' reset, rounded up ([`ceil_secs`]).
fn reset_secs(s: &DescriptorStatus) -> u64 {
    s.duration_until_reset.as_ref().map_or(0, |d| {
        ceil_secs(Duration::new(u64::try_from(d.seconds).unwrap_or(0), u32::try_from(d.nanos).unwrap_or(0)))
    })
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue { key: key.to_owned(), value, ..HeaderValue::default() }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    use super::*;

    fn status(code: Code, limit: u32, remaining: u32, reset_ms: i64) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit { requests_per_unit: limit, ..RateLimit::default() }),
            limit_remaining: remaining,
            duration_until_reset: Some(PbDuration {
                seconds: reset_ms / 1000,
                nanos: i32::try_from(reset_ms % 1000 * 1_000_000).expect("nanos"),
            }),
            quota: None,
        }
    }

    fn pairs(h: &[HeaderValue]) -> Vec<(&str, &str)> {
        h.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect()
    }

    #[test]
    fn upstream_headers_name_the_tightest_limit_or_the_one_over() {
        let (a, b) = (status(Code::Ok, 10, 7, 30_000), status(Code::Ok, 100, 3, 1_500));
        let over = status(Code::OverLimit, 10, 5, 1_000);
        let limited = |status, decisive| Limited { status, name: "n", window_secs: 60, decisive };
        let upstream = ResponseHeaders::default();
        let h = response_headers(&upstream, &[limited(&a, true), limited(&b, true)]);
        assert_eq!(pairs(&h), [("RateLimit-Limit", "100"), ("RateLimit-Remaining", "3"), ("RateLimit-Reset", "2")]);
        let h = response_headers(&upstream, &[limited(&b, true), limited(&over, true)]);
        assert_eq!(pairs(&h)[..2], [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "5")], "the one over");
        let h = response_headers(&upstream, &[limited(&b, true), limited(&over, false)]);
        assert_eq!(pairs(&h)[1], ("RateLimit-Remaining", "3"), "a shadow or quota limit over decides nothing");
        let named = ResponseHeaders { limit: "X-L".into(), remaining: "X-R".into(), reset: "X-T".into(), ..upstream };
        assert_eq!(pairs(&response_headers(&named, &[limited(&a, true)]))[0], ("X-L", "10"));
        assert!(response_headers(&named, &[]).is_empty());
    }

    #[test]
    fn ietf_headers_list_every_limit_with_escaped_names() {
        let (a, b) = (status(Code::Ok, 10, 7, 30_000), status(Code::OverLimit, 100, 0, 1_001));
        let ietf = ResponseHeaders { style: HeaderStyle::Ietf, ..ResponseHeaders::default() };
        let h = response_headers(
            &ietf,
            &[
                Limited { status: &a, name: "per_ip", window_secs: 60, decisive: true },
                Limited { status: &b, name: "d.path_\"x\"\u{e9}", window_secs: 3600, decisive: true },
            ],
        );
        assert_eq!(
            pairs(&h),
            [
                ("RateLimit-Policy", r#""per_ip";q=10;w=60, "d.path_\"x\"?";q=100;w=3600"#),
                ("RateLimit", r#""per_ip";r=7;t=30, "d.path_\"x\"?";r=0;t=2"#)
            ]
        );
    }
}
