//! The bodies of `/v1/check`, `/v1/charge` and `/v1/refund`: decoded without copies, and
//! resolved against the live rules into the keys and quotas to decide.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::Deserialize;
use slidegate::Quota;

use crate::api_error::ApiError;
use crate::app::{App, Live, rule_named};
use crate::config::{AlgorithmSpec, INLINE_RULE, parse_duration};

/// One check as clients send it: a rule (with optional tier) or an inline limit and window.
/// The algorithm's fields are listed here rather than `#[serde(flatten)]` from an
/// [`AlgorithmSpec`], which would have serde buffer the whole map into intermediate values
/// first; strings borrow from the body unless they hold an escape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody<'a> {
    #[serde(borrow)]
    rule: Option<Text<'a>>,
    #[serde(borrow)]
    key: Option<Text<'a>>,
    cost: Option<u64>,
    #[serde(borrow)]
    tier: Option<Text<'a>>,
    limit: Option<u64>,
    #[serde(borrow)]
    window: Option<Text<'a>>,
    #[serde(borrow)]
    algorithm: Option<Text<'a>>,
    buckets: Option<u32>,
    burst: Option<u64>,
    #[serde(borrow)]
    warm_up: Option<Text<'a>>,
    cold_fraction: Option<f64>,
    #[serde(borrow)]
    checks: Option<Checks<'a>>,
}

/// A JSON string of a request body: borrowed from the body, or decoded when it has escapes.
/// (`Option<Cow<str>>` always copies: serde borrows only a `Cow` that is a field itself.)
#[derive(Debug)]
struct Text<'a>(Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Borrowing<'a>(PhantomData<&'a str>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Borrowing<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }

            fn visit_str<E>(self, text: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }

            fn visit_string<E>(self, text: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Borrowing(PhantomData))
    }
}

/// A multi-check's list as sent: at most [`slidegate::MAX_CHECKS`] checks are parsed, the rest
/// only counted, so a 64 KiB body of `{},{},…` (20,000 empty checks, each a few hundred bytes
/// parsed) costs no more memory than a valid group.
#[derive(Debug, Default)]
struct Checks<'a> {
    parsed: Vec<CheckBody<'a>>,
    count: usize,
}

impl<'de: 'a, 'a> Deserialize<'de> for Checks<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded<'a>(PhantomData<CheckBody<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Bounded<'a> {
            type Value = Checks<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of checks")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checks<'a>, A::Error> {
                let mut checks = Checks::default();
                while checks.count < slidegate::MAX_CHECKS {
                    match seq.next_element()? {
                        Some(check) => checks.parsed.push(check),
                        None => return Ok(checks),
                    }
                    checks.count += 1;
                }
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    checks.count += 1;
                }
                Ok(checks)
            }
        }
        deserializer.deserialize_seq(Bounded(PhantomData))
    }
}

/// A check resolved against the rules: the policy name for headers, the backend key, the quota.
pub(super) struct Resolved<'a> {
    /// The rule's name as the body spells it, or [`INLINE_RULE`].
    pub(super) policy: Cow<'a, str>,
    /// The backend key: [`slidegate::rule_key`] of the rule and the caller's key.
    pub(super) key: String,
    pub(super) quota: Quota,
    pub(super) cost: u64,
}

impl<'a> CheckBody<'a> {
    /// Whether any field of a single check is set (they cannot stand beside `checks`).
    fn has_single_fields(&self) -> bool {
        self.rule.is_some()
            || self.key.is_some()
            || self.cost.is_some()
            || self.tier.is_some()
            || self.limit.is_some()
            || self.window.is_some()
            || self.has_algorithm_fields()
    }

    fn has_algorithm_fields(&self) -> bool {
        self.algorithm.is_some()
            || self.buckets.is_some()
            || self.burst.is_some()
            || self.warm_up.is_some()
            || self.cold_fraction.is_some()
    }

    /// How an inline check's quota counts.
    fn algorithm_spec(&self) -> AlgorithmSpec {
        AlgorithmSpec {
            algorithm: self.algorithm.as_deref().map(str::to_owned),
            buckets: self.buckets,
            burst: self.burst,
            warm_up: self.warm_up.as_deref().map(str::to_owned),
            cold_fraction: self.cold_fraction,
        }
    }

    /// Resolves against one snapshot of the rules, so no request sees half a reload.
    fn resolve(mut self, live: &Live) -> Result<Resolved<'a>, ApiError> {
        let inline_fields = self.limit.is_some() || self.window.is_some() || self.has_algorithm_fields();
        let key = self.key.take().ok_or_else(|| ApiError::bad_request("missing_key", "field `key` is required"))?;
        if self.checks.is_some() {
            return Err(ApiError::bad_request("invalid_checks", "`checks` cannot be nested"));
        }
        let (policy, quota) = match self.rule.take() {
            Some(rule) => {
                if inline_fields {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        "give either `rule` or an inline `limit` and `window`, not both",
                    ));
                }
                let r = rule_named(live, &rule)?;
                let tier = self.tier.as_deref();
                let quota = r.quota_for(tier).ok_or_else(|| {
                    ApiError::bad_request("unknown_tier", format!("rule {:?} has no tier {tier:?}", &*rule))
                })?;
                (rule.0, quota)
            }
            None => {
                live.inline.check_enabled()?;
                let (Some(limit), Some(window)) = (self.limit, &self.window) else {
                    return Err(ApiError::bad_request(
                        "missing_rule",
                        "give `rule`, or an inline `limit` and `window` (e.g. \"10s\")",
                    ));
                };
                if self.tier.is_some() {
                    return Err(ApiError::bad_request("invalid_request", "`tier` needs a `rule`"));
                }
                let window = parse_duration(window).map_err(|m| ApiError::bad_request("invalid_window", m))?;
                let quota = self.algorithm_spec().apply(Quota::new(limit, window)?).map_err(|e| e.error)?;
                live.inline.check(&quota, self.cost.unwrap_or(1))?;
                (Cow::Borrowed(INLINE_RULE), quota)
            }
        };
        slidegate::validate_key(&key)?;
        let key = slidegate::rule_key(&policy, &key);
        Ok(Resolved { policy, key, quota, cost: self.cost.unwrap_or(1) })
    }
}

/// A named rule's check under its key's override, if it has one (inline checks have none).
pub(super) fn overridden(app: &App, r: &mut Resolved<'_>) {
    if r.policy != INLINE_RULE {
        r.quota = app.overrides.quota(&r.key, r.quota);
    }
}

/// A `/v1/check` body, resolved: one check, or a group decided all or nothing.
pub(super) enum CheckRequest<'a> {
    One(Resolved<'a>),
    Many(Vec<Resolved<'a>>),
}

/// Decodes a `/v1/check` body and resolves it against `live`'s rules: anything else than a
/// request is a client error.
pub(super) fn decode_check<'a>(body: &'a [u8], live: &Live) -> Result<CheckRequest<'a>, ApiError> {
    let mut request: CheckBody<'_> =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request("invalid_json", e.to_string()))?;
    match request.checks.take() {
        None => Ok(CheckRequest::One(request.resolve(live)?)),
        Some(checks) => {
            if request.has_single_fields() {
                return Err(ApiError::bad_request("invalid_request", "give either `checks` or one check, not both"));
            }
            if checks.count == 0 || checks.count > slidegate::MAX_CHECKS {
                return Err(slidegate::Error::CheckCount { count: checks.count }.into());
            }
            Ok(CheckRequest::Many(checks.parsed.into_iter().map(|c| c.resolve(live)).collect::<Result<_, _>>()?))
        }
    }
}

/// The request decoder under hostile bodies: random bytes, valid requests with bytes flipped,
/// inserted, deleted or cut, and hand-picked attacks.
#[cfg(test)]
mod fuzz {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::{ApiError, CheckRequest, decode_check};
    use crate::app::Live;
    use crate::config::{Config, parse_duration};

    const RULES: &str = r#"
[[rules]]
name = "sms"
limit = 5
window = "60s"

[[rules]]
name = "api"
limit = 10
window = "60s"
tiers = { vip = { limit = 100 } }
"#;

    const VALID: [&str; 6] = [
        r#"{"rule":"sms","key":"user-1"}"#,
        r#"{"rule":"api","key":"k","tier":"vip","cost":2}"#,
        r#"{"key":"k","limit":10,"window":"10s","algorithm":"gcra","burst":5}"#,
        r#"{"key":"k","limit":100,"window":"1m","algorithm":"sliding_window","buckets":6,"warm_up":"30s","cold_fraction":0.5}"#,
        r#"{"key":"k","limit":10000,"window":"1d","algorithm":"fixed_window"}"#,
        r#"{"checks":[{"rule":"sms","key":"a"},{"key":"b","limit":5,"window":"1s"}]}"#,
    ];

    fn live() -> Live {
        Live::new(Config::parse(RULES, "rules.toml").expect("valid"))
    }

    /// Decodes `body`, which must answer a request or a client error (4xx), within a second.
    fn decodes_or_is_refused<'a>(live: &'a Live, body: &'a [u8]) -> Result<Option<CheckRequest<'a>>, TestCaseError> {
        let started = Instant::now();
        let outcome = decode_check(body, live);
        prop_assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        match outcome {
            Ok(request) => {
                let resolved = match &request {
                    CheckRequest::One(r) => std::slice::from_ref(r),
                    CheckRequest::Many(rs) => rs.as_slice(),
                };
                for r in resolved {
                    // The key passed the library's checks; the backend key wraps it.
                    prop_assert!(r.key.len() <= slidegate::MAX_KEY_LEN + r.policy.len() + 3, "{}", r.key);
                }
                Ok(Some(request))
            }
            Err(ApiError { status, code, message, .. }) => {
                prop_assert!(status.is_client_error(), "{status} {code}: {message}");
                prop_assert!(!code.is_empty() && !message.is_empty());
                Ok(None)
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3_000, failure_persistence: None, ..ProptestConfig::default() })]
        /// Random bytes and mutated valid bodies: a request or a 4xx, never a panic or a 5xx.
        #[test]
        fn any_body_is_a_request_or_a_client_error(
            valid in 0..VALID.len(),
            edits in proptest::collection::vec((0u8..4, any::<usize>(), any::<u8>()), 0..6),
            random in proptest::option::weighted(0.2, proptest::collection::vec(any::<u8>(), 0..256)),
        ) {
            let body = crate::mutate::mutate(random.unwrap_or_else(|| VALID[valid].as_bytes().to_vec()), edits);
            decodes_or_is_refused(&live(), &body)?;
        }
    }

    #[test]
    fn valid_bodies_decode() {
        let live = live();
        for body in VALID {
            assert!(matches!(decodes_or_is_refused(&live, body.as_bytes()), Ok(Some(_))), "{body}");
        }
    }

    #[test]
    fn escaped_strings_decode_to_the_text_they_spell() {
        let live = live();
        let key_of = |body: &str| match decode_check(body.as_bytes(), &live) {
            Ok(CheckRequest::One(r)) => (r.policy.into_owned(), r.key),
            _ => panic!("{body} did not decode to one check"),
        };
        let (policy, key) = key_of(r#"{"rule":"s\u006ds","key":"a\"b\\c"}"#);
        assert_eq!(policy, "sms");
        assert_eq!(key, slidegate::rule_key("sms", "a\"b\\c").as_str());
        assert_eq!(key_of(r#"{"rule":"sms","key":"user-1"}"#).1, slidegate::rule_key("sms", "user-1").as_str());
    }

    #[test]
    fn hostile_bodies_are_client_errors() {
        let live = live();
        let long = "x".repeat(60_000);
        let bodies = [
            // Deep nesting, far past serde_json's recursion limit.
            format!("{}{}", r#"{"checks":["#.repeat(5_000), "]}".repeat(5_000)),
            "[".repeat(60_000),
            format!(r#"{{"key":{}1{}}}"#, "[".repeat(10_000), "]".repeat(10_000)),
            // Numbers past every type.
            r#"{"key":"k","limit":1e400,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":18446744073709551616,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":-1,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":1.5,"window":"1s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"1s","warm_up":"1s","cold_fraction":1e308}"#.into(),
            r#"{"key":"k","limit":5,"window":"1s","warm_up":"1s","cold_fraction":-0.0}"#.into(),
            r#"{"key":"k","limit":5,"window":"1s","algorithm":"sliding_window","buckets":4294967296}"#.into(),
            // Durations: huge, negative, not numbers, under a millisecond, very long.
            r#"{"key":"k","limit":5,"window":"99999999999999999999999999s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"18446744073709551615s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"584942417355y"}"#.into(),
            r#"{"key":"k","limit":5,"window":"NaN"}"#.into(),
            r#"{"key":"k","limit":5,"window":"inf"}"#.into(),
            r#"{"key":"k","limit":5,"window":"-1s"}"#.into(),
            r#"{"key":"k","limit":5,"window":"1ns"}"#.into(),
            r#"{"key":"k","limit":5,"window":"367d"}"#.into(),
            format!(r#"{{"key":"k","limit":5,"window":"{}"}}"#, "1d ".repeat(15_000)),
            format!(r#"{{"key":"k","limit":5,"window":"1s","warm_up":"{}"}}"#, "9".repeat(10_000)),
            // Long strings, a lone surrogate, an empty key, duplicate and unknown fields.
            format!(r#"{{"rule":"sms","key":"{long}"}}"#),
            format!(r#"{{"rule":"{long}","key":"k"}}"#),
            r#"{"rule":"sms","key":"\ud800"}"#.into(),
            r#"{"rule":"sms","key":""}"#.into(),
            r#"{"rule":"sms","key":"a","key":"b"}"#.into(),
            r#"{"rule":"sms","key":"a","rule":"api"}"#.into(),
            r#"{"rule":"sms","key":"a","__proto__":1}"#.into(),
            r#"{"rule":"sms","key":"a","tier":"vip"}"#.into(),
            r#"{"checks":[{"checks":[{"rule":"sms","key":"a"}],"key":"b"}]}"#.into(),
            r#"{"checks":[],"rule":"sms"}"#.into(),
            "\u{feff}{}".into(),
            "null".into(),
            String::new(),
        ];
        for body in &bodies {
            let outcome = decodes_or_is_refused(&live, body.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            assert!(outcome.is_none(), "{} decoded", &body[..body.len().min(80)]);
        }
        // Unicode keys are data; 2,000 checks are refused, having built at most MAX_CHECKS.
        let unicode = r#"{"rule":"sms","key":"naïve ☃ \u0000 ключ"}"#;
        assert!(decodes_or_is_refused(&live, unicode.as_bytes()).unwrap_or_else(|e| panic!("{e}")).is_some());
        let many = format!(r#"{{"checks":[{}]}}"#, vec![r#"{"rule":"sms","key":"a"}"#; 2_000].join(","));
        assert!(decodes_or_is_refused(&live, many.as_bytes()).unwrap_or_else(|e| panic!("{e}")).is_none());
    }

    #[test]
    fn durations_of_any_size_parse_or_fail_cleanly() {
        for text in ["18446744073709551615s", "18446744073709551616ms", "584942417355y", "9999999999999999999d", "1e9s"]
        {
            // Either an error, or a duration that the quota then refuses.
            if let Ok(d) = parse_duration(text) {
                assert!(slidegate::Quota::new(1, d).is_err(), "{text}: {d:?}");
            }
        }
    }
}
