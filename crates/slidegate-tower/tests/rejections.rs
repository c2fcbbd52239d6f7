//! Requests the layer cannot count, and rules it cannot use: each test is the attack (or the
//! misconfiguration) followed by the safe outcome — a 4xx with a JSON error, nothing charged,
//! the service never called; or a typed error when the layer is built. Never a pass.

mod support;

use std::time::Duration;

use http::HeaderName;
use http::request::Parts;
use slidegate::{FailurePolicy, Limiter, MAX_CHECKS, MAX_KEY_LEN, RedisBackend};
use slidegate_testkit::RedisServer;
use slidegate_tower::{Error, Header, RateLimitLayer, Route};
use support::{App, charged, error_code, quota, rule};

fn api_key() -> Header {
    Header::new(HeaderName::from_static("x-api-key"))
}

#[tokio::test]
async fn an_over_long_header_key_is_431_and_charges_nothing() {
    let limiter = Limiter::in_memory();
    let layer = RateLimitLayer::new(limiter.clone())
        .rule(rule("ip", 10))
        .and_then(|l| l.rule(rule("api", 10).key(api_key())))
        .expect("layer");
    let app = App::new(layer);
    // A value over MAX_KEY_LEN on its own; ones that fit alone but not inside `api:{…}`.
    for len in [MAX_KEY_LEN + 1, MAX_KEY_LEN - 3, MAX_KEY_LEN - "api:{}".len() + 1] {
        let answer = app.send("/", "203.0.113.9:1", &[("x-api-key", &vec![b'k'; len])]).await;
        assert_eq!(answer.status, 431, "{len} bytes: {answer:?}");
        assert_eq!(error_code(&answer), "header_too_long");
    }
    assert_eq!(app.reached(), 0, "the service never saw them");
    assert_eq!(charged(&limiter, "ip:{203.0.113.9}", 10).await, 0, "no rule of the request was charged");
    // The longest key that fits is counted.
    let fits = vec![b'k'; MAX_KEY_LEN - "api:{}".len()];
    assert_eq!(app.send("/", "203.0.113.9:1", &[("x-api-key", &fits)]).await.status, 200);
}

#[tokio::test]
async fn an_empty_or_undecodable_header_key_is_400_not_a_shared_or_skipped_key() {
    let limiter = Limiter::in_memory();
    let app = App::new(RateLimitLayer::new(limiter.clone()).rule(rule("api", 1).key(api_key())).expect("layer"));
    for value in [&b""[..], b"k\xff"] {
        // Over and over: each is refused, none is passed on a key of its own or of nobody's.
        for _ in 0..3 {
            let answer = app.send("/", "203.0.113.9:1", &[("x-api-key", value)]).await;
            assert_eq!((answer.status.as_u16(), error_code(&answer)), (400, "invalid_key".to_owned()), "{value:?}");
        }
    }
    assert_eq!(app.reached(), 0);
    assert_eq!(charged(&limiter, "api:{}", 1).await, 0);
    // A request without the header has no key: the per-key rule does not apply to it.
    assert_eq!(app.send("/", "203.0.113.9:1", &[]).await.status, 200);
}

#[tokio::test]
async fn over_long_and_empty_keys_from_closures_and_paths_are_refused() {
    let from_query = |p: &Parts| p.uri.query().map(str::to_owned);
    let layer = RateLimitLayer::new(Limiter::in_memory())
        .rule(rule("query", 10).route_prefix("/q").key(from_query))
        .and_then(|l| l.rule(rule("path", 10).route_prefix("/p").key(Route)))
        .expect("layer");
    let app = App::new(layer);
    let long = "a".repeat(MAX_KEY_LEN);
    let answer = app.send(&format!("/q?{long}"), "203.0.113.9:1", &[]).await;
    assert_eq!((answer.status.as_u16(), error_code(&answer)), (400, "key_too_long".to_owned()));
    let answer = app.send("/q?", "203.0.113.9:1", &[]).await;
    assert_eq!((answer.status.as_u16(), error_code(&answer)), (400, "invalid_key".to_owned()));
    let answer = app.send(&format!("/p/{long}"), "203.0.113.9:1", &[]).await;
    assert_eq!((answer.status.as_u16(), error_code(&answer)), (414, "uri_too_long".to_owned()));
    assert_eq!(app.reached(), 0);
}

#[tokio::test]
async fn a_cost_of_zero_or_beyond_the_limit_is_400_and_charges_nothing() {
    let limiter = Limiter::in_memory();
    let cost = |p: &Parts| p.headers.get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
    let layer = RateLimitLayer::new(limiter.clone())
        .rule(rule("ip", 10))
        .and_then(|l| l.rule(rule("sms", 5).cost_by(cost)))
        .expect("layer");
    let app = App::new(layer);
    // A cost of 0 would be a free pass; 6 can never fit a limit of 5.
    for cost in ["0", "6", "18446744073709551615"] {
        let answer = app.send("/", "203.0.113.9:1", &[("x-cost", cost.as_bytes())]).await;
        assert_eq!((answer.status.as_u16(), error_code(&answer)), (400, "invalid_cost".to_owned()), "cost {cost}");
    }
    assert_eq!(app.reached(), 0);
    assert_eq!(charged(&limiter, "ip:{203.0.113.9}", 10).await, 0);
    assert_eq!(app.send("/", "203.0.113.9:1", &[("x-cost", b"5")]).await.status, 200);
    assert_eq!(app.send("/", "203.0.113.9:1", &[("x-cost", b"1")]).await.status, 429, "5 of 5 spent");
}

#[tokio::test]
async fn a_large_cost_on_the_lua_engine_is_decided_exactly_never_a_400_or_a_pass() {
    // A cost of hundreds of sliding-log permits on limits above 256 (counted entries on Redis'
    // Lua engine) is decided exactly, two rules together: what fits passes, one permit more is
    // a 429 charging nothing.
    let redis = RedisServer::start();
    let backend = RedisBackend::connect(&redis.url()).await.expect("connect").with_timeout(Duration::from_secs(5));
    let limiter = Limiter::new(backend).with_failure_policy(FailurePolicy::FailOpen);
    let cost = |p: &Parts| p.headers.get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
    let layer = RateLimitLayer::new(limiter.clone())
        .rule(rule("ip", 1_000).cost_by(cost))
        .and_then(|l| l.rule(rule("sms", 1_000).cost_by(cost)))
        .expect("layer");
    let app = App::new(layer);
    assert_eq!(app.send("/", "203.0.113.9:1", &[("x-cost", b"600")]).await.status, 200);
    assert_eq!(app.send("/", "203.0.113.9:1", &[("x-cost", b"401")]).await.status, 429, "1,001 of 1,000");
    assert_eq!((app.reached(), charged(&limiter, "ip:{203.0.113.9}", 1_000).await), (1, 600));
    assert_eq!(app.send("/", "203.0.113.9:1", &[("x-cost", b"400")]).await.status, 200);
    assert_eq!(charged(&limiter, "sms:{203.0.113.9}", 1_000).await, 1_000);
}

#[test]
fn misconfigured_rules_are_typed_errors_when_the_layer_is_built() {
    let layer = || RateLimitLayer::new(Limiter::in_memory());
    let twice = layer().rule(rule("login", 5)).and_then(|l| l.rule(rule("login", 50).route("/other")));
    assert!(matches!(twice, Err(Error::DuplicateRule(ref name)) if name == "login"), "{twice:?}");
    let tiers = rule("api", 5).tier("vip", quota(50)).tier("vip", quota(500));
    assert!(matches!(layer().rule(tiers), Err(Error::DuplicateTier { .. })));
    assert!(matches!(layer().rule(rule("free", 5).cost(0)), Err(Error::InvalidCost { cost: 0, .. })));
    // A fixed cost must fit every quota of the rule, the tiers' too.
    let tight_tier = rule("bulk", 50).cost(10).tier("trial", quota(5));
    assert!(matches!(layer().rule(tight_tier), Err(Error::InvalidCost { cost: 10, max: 5, .. })));
    assert!(layer().rule(rule("bulk", 50).cost(10).tier("pro", quota(500))).is_ok());
    // A sliding log past its bound, as the rule's quota or a tier's: no request could be decided.
    let billion = slidegate::Quota::per_second(1_000_000_000).expect("a counter's limit");
    let huge = slidegate_tower::Rule::new("huge", billion).expect("a valid name");
    assert!(matches!(layer().rule(huge), Err(Error::InvalidQuota { .. })));
    let huge_tier = rule("api", 5).tier("vip", billion);
    assert!(matches!(layer().rule(huge_tier), Err(Error::InvalidQuota { ref rule, .. }) if rule == "api"));
}

#[tokio::test]
async fn rejections_are_counted_and_shadow_mode_passes_them() {
    // The one test of this file that installs the process-wide recorder.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().expect("recorder");
    let enforced =
        App::new(RateLimitLayer::new(Limiter::in_memory()).rule(rule("api", 5).key(api_key())).expect("layer"));
    assert_eq!(enforced.send("/", "203.0.113.9:1", &[("x-api-key", b"")]).await.status, 400);
    let shadow = RateLimitLayer::new(Limiter::in_memory()).rule(rule("trial", 5).key(api_key())).expect("layer");
    let shadow = App::new(shadow.shadow(true));
    let answer = shadow.send("/", "203.0.113.9:1", &[("x-api-key", b"")]).await;
    assert_eq!(answer.status, 200, "shadow mode never refuses: {answer:?}");
    assert_eq!(shadow.reached(), 1);
    let page = recorder.render();
    for rule in ["api", "trial"] {
        let line = page
            .lines()
            .find(|l| l.starts_with("slidegate_rejected_requests_total{") && l.contains(&format!(r#"rule="{rule}""#)));
        let line = line.unwrap_or_else(|| panic!("no slidegate_rejected_requests_total for {rule}: {page}"));
        assert!(line.contains(r#"code="invalid_key""#) && line.ends_with(" 1"), "{line}");
    }
}

#[tokio::test]
async fn more_rules_than_one_check_holds_are_decided_one_by_one_not_passed() {
    let limiter = Limiter::in_memory();
    let mut layer = RateLimitLayer::new(limiter.clone());
    for i in 0..=MAX_CHECKS {
        // The last rule is the tightest.
        layer = layer.rule(rule(&format!("r{i}"), if i == MAX_CHECKS { 2 } else { 10 })).expect("layer");
    }
    let app = App::new(layer);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(app.send("/", "203.0.113.9:1", &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    let last = app.send("/", "203.0.113.9:1", &[]).await;
    assert!(last.headers["ratelimit"].to_str().expect("ascii").contains(&format!("\"r{MAX_CHECKS}\";r=0")));
    assert_eq!(app.reached(), 2);
}

#[tokio::test]
async fn a_flood_of_bad_keys_is_never_a_backend_failure() {
    // Fail closed after 2 backend failures: if bad keys counted as failures, this flood would
    // open the circuit and refuse everyone.
    let redis = RedisServer::start();
    let backend = RedisBackend::connect(&redis.url()).await.expect("connect").with_timeout(Duration::from_secs(5));
    let limiter = Limiter::new(backend)
        .with_failure_policy(FailurePolicy::FailClosed)
        .with_circuit_breaker(2, Duration::from_secs(60));
    let layer = RateLimitLayer::new(limiter.clone()).rule(rule("api", 5).key(api_key())).expect("layer");
    let app = App::new(layer);
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    for value in [&b""[..], b"\xff", &long].into_iter().cycle().take(12) {
        assert!(app.send("/", "203.0.113.9:1", &[("x-api-key", value)]).await.status.is_client_error());
    }
    assert!(!limiter.circuit_open());
    let answer = app.send("/", "203.0.113.9:1", &[("x-api-key", b"k1")]).await;
    assert_eq!((answer.status.as_u16(), answer.headers.get("ratelimit").is_some()), (200, true), "{answer:?}");
}

#[tokio::test]
async fn a_key_redis_cannot_decide_is_500_never_a_pass_even_failing_open() {
    // A value no script wrote (another application's key, a key of an earlier layout a rolling
    // upgrade left behind) makes Redis answer WRONGTYPE: neither the caller's mistake nor a
    // backend failure, so the fail-open policy must not turn it into an admission.
    let redis = RedisServer::start();
    let backend = RedisBackend::connect(&redis.url()).await.expect("connect").with_timeout(Duration::from_secs(5));
    let limiter = Limiter::new(backend).with_failure_policy(FailurePolicy::FailOpen);
    let app = App::new(RateLimitLayer::new(limiter.clone()).rule(rule("ip", 5)).expect("layer"));
    let _: () = redis.query(&["SET", "slidegate:ip:{203.0.113.9}", "not a log"]);
    let log = Log::default();
    let _logging =
        tracing::subscriber::set_default(tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).finish());
    for id in ["req-1", "req-2", "req-3"] {
        let answer = app.send("/", "203.0.113.9:1", &[("x-request-id", id.as_bytes())]).await;
        assert_eq!((answer.status.as_u16(), error_code(&answer)), (500, "rate_limit_error".to_owned()), "{answer:?}");
        assert!(!answer.body.contains("WRONGTYPE"), "{answer:?}");
        // Redis' words are the operator's: in the log, under the request's id.
        let text = log.text();
        assert!(text.lines().any(|l| l.contains(id) && l.contains("WRONGTYPE")), "{text}");
    }
    assert_eq!(app.reached(), 0, "the service never saw them");
    assert!(!limiter.circuit_open(), "not counted as a backend failure");
    // Another client's key is decided as usual.
    assert_eq!(app.send("/", "203.0.113.10:1", &[]).await.status, 200);
    assert_eq!(app.reached(), 1);
}

/// A log written into memory, for a test to read.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}
