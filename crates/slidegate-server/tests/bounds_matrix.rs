//! The bounds matrix of SECURITY.md, through the shipped binary: every bound of "Bounded work per
//! decision" and of the HTTP server, at each entry point that takes it from a caller (an inline
//! check, a rules-file rule, a tier, an override, a batch, an Envoy descriptor under its
//! configured limit and under a request's own `limit`), on each engine (memory, Redis Lua, the
//! Redis module, a Redis Cluster).
//!
//! Each engine gets one `slidegate serve` (rules, tiers, an Envoy directory, the admin token;
//! `[inline]` opened to the library's own bounds) and one with the default `[inline]` caps, both
//! kept for all its cells. A cell is the attack, then the safe outcome: past a bound a 4xx with
//! its code (gRPC: the descriptor refused or over), nothing charged; at the bound the largest
//! input decided exactly — admitted once, then denied, and the key holding it. Every cell runs
//! on every engine even when an earlier one fails, and the failures are listed by name.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::Client;
use serde_json::{Value, json};
use slidegate::{MAX_CHECKS, MAX_KEY_LEN, MAX_LIMIT, MAX_LOG_LIMIT};
use slidegate_testkit::{RedisCluster, RedisServer};
use support::envoy::{Dir, OK, OVER, UNKNOWN, codes, descriptor};
use support::{RulesFile, Slidegate};

/// The main server's rules: one rule or tier at each bound, and 16 one-permit rules for a batch
/// of [`MAX_CHECKS`] checks of one key (one Cluster slot).
fn rules(backend: &str, grpc: &str, envoy: &Dir) -> String {
    let batch: String =
        (0..MAX_CHECKS).map(|i| format!("[[rules]]\nname = \"b{i}\"\nlimit = 1\nwindow = \"1h\"\n\n")).collect();
    format!(
        r#"admin_token = "t"
grpc = "{grpc}"
envoy_config = "{envoy}"

[inline]
max_limit = {MAX_LIMIT}
max_window = "366d"
max_cost = {MAX_LIMIT}

{backend}

[[rules]]
name = "log"
limit = {MAX_LOG_LIMIT}
window = "1h"

[[rules]]
name = "few"
limit = 2
window = "1h"
tiers = {{ max = {{ limit = {MAX_LOG_LIMIT} }}, small = {{ limit = 1 }}, long = {{ limit = 2, window = "366d" }} }}

[[rules]]
name = "billion"
limit = {MAX_LIMIT}
window = "1h"
algorithm = "sliding_window"

[[rules]]
name = "counter"
limit = 5
window = "1h"
algorithm = "sliding_window"
buckets = 100
tiers = {{ max = {{ limit = {MAX_LIMIT} }} }}

[[rules]]
name = "long"
limit = 2
window = "366d"

[[rules]]
name = "gcra"
limit = 10
window = "1s"
algorithm = "gcra"
burst = 20

{batch}"#,
        envoy = envoy.arg(),
    )
}

/// The Envoy domain: limits at and past the bounds; `req` has none (for a request's `limit`).
const ENVOY: &str = r#"domain: bounds
descriptors:
  - key: log
    rate_limit: { unit: hour, requests_per_unit: 100000 }
  - key: over_log
    rate_limit: { unit: hour, requests_per_unit: 100001 }
  - key: billion
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: huge
    rate_limit: { unit: hour, requests_per_unit: 4000000000 }
  - key: small
    rate_limit: { unit: hour, requests_per_unit: 5 }
"#;

/// The Redis processes behind a server, kept alive with it.
enum Backing {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

/// One engine under test: its servers and what they run on.
struct Engine {
    /// `memory`, `lua` or `module`: what the decisions must say decided them.
    engine: &'static str,
    /// `[inline]` at the library's bounds.
    server: Slidegate,
    /// The default `[inline]` caps, fixed windows not allowed.
    tight: Slidegate,
    grpc: String,
    http: Client,
    _files: (RulesFile, RulesFile, Dir),
    _backing: Backing,
}

impl Engine {
    fn start(engine: &'static str, backing: Backing) -> Self {
        let timeout = "timeout = \"10s\"\n"; // exactness is under test, not deadlines
        let backend = match &backing {
            Backing::Memory => String::new(),
            Backing::Redis(r) => format!("[backend]\nredis = \"{}\"\nengine = \"{engine}\"\n{timeout}", r.url()),
            Backing::Cluster(c) => format!("[backend]\nredis_cluster = {:?}\n{timeout}", c.urls()),
        };
        let dir = Dir::with(&[("bounds.yaml", ENVOY)]);
        let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
        let main = RulesFile::new(&rules(&backend, &grpc, &dir));
        let tight_rules = format!(
            "admin_token = \"t\"\n[inline]\nalgorithms = [\"sliding_log\", \"sliding_window\", \"gcra\"]\n{backend}"
        );
        let tight = RulesFile::new(&tight_rules);
        let (server, tight_server) =
            (Slidegate::serve(&["--config", main.arg()]), Slidegate::serve(&["--config", tight.arg()]));
        Self {
            engine,
            server,
            tight: tight_server,
            grpc,
            http: Client::new(),
            _files: (main, tight, dir),
            _backing: backing,
        }
    }

    /// POSTs `body` to the main server's `/v1/check`: (status, JSON).
    async fn check(&self, body: &Value) -> (u16, Value) {
        self.check_on(&self.server, body).await
    }

    async fn check_on(&self, server: &Slidegate, body: &Value) -> (u16, Value) {
        let response = self.http.post(server.url("/v1/check")).json(body).send().await.expect("request");
        let status = response.status().as_u16();
        let json: Value = response.json().await.expect("a JSON answer");
        if status == 200 {
            let engines: Vec<&Value> = match json.get("results") {
                Some(Value::Array(results)) => results.iter().map(|r| &r["engine"]).collect(),
                _ => vec![&json["engine"]],
            };
            assert!(engines.iter().all(|e| *e == self.engine), "decided by {engines:?}, not {}: {json}", self.engine);
        }
        (status, json)
    }

    /// An admin request to the main server: (status, JSON).
    async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method.parse().expect("a method"), self.server.url(path)).bearer_auth("t");
        if let Some(b) = body {
            request = request.json(&b);
        }
        let response = request.send().await.expect("response");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// What `GET /v1/keys/{rule}/{key}` says the key holds.
    async fn held(&self, rule: &str, key: &str) -> Value {
        let (status, v) = self.admin("GET", &format!("/v1/keys/{rule}/{key}"), None).await;
        assert_eq!(status, 200, "inspecting {rule}/{key}: {v}");
        v
    }

    async fn count(&self, rule: &str, key: &str) -> u64 {
        self.held(rule, key).await["count"].as_u64().expect("a count")
    }

    /// Sets an override: (status, JSON).
    async fn set_override(&self, rule: &str, key: &str, body: Value) -> (u16, Value) {
        self.admin("PUT", &format!("/v1/overrides/{rule}/{key}"), Some(body)).await
    }

    async fn envoy(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc)).await.expect("gRPC")
    }
}

/// A 400 with `code`, whatever else the answer holds.
#[track_caller]
fn assert_refused((status, v): (u16, Value), code: &str) {
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some(code)), "{v}");
}

/// `check` with `cost` past what it admits is refused (`invalid_cost`); with `cost` it is
/// admitted once, leaving nothing, then denied: nothing was charged by the refusal.
async fn admits_cost_once(e: &Engine, check: Value, cost: u64) {
    admits_cost_once_past(e, check, cost, "invalid_cost").await;
}

/// [`admits_cost_once`], a cost past `cost` refused with `code`.
async fn admits_cost_once_past(e: &Engine, check: Value, cost: u64, code: &str) {
    let with = |c: u64| {
        let mut c2 = check.clone();
        c2["cost"] = json!(c);
        c2
    };
    assert_refused(e.check(&with(cost + 1)).await, code);
    let (status, v) = e.check(&with(cost)).await;
    assert_eq!((status, &v["allowed"], &v["remaining"]), (200, &json!(true), &json!(0)), "{v}");
    let (status, v) = e.check(&with(1)).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(false)), "{v}");
}

/// A batch of a fresh one-permit check beside `bad` is refused with `code`, and the good check's
/// key holds nothing.
async fn batch_refused(e: &Engine, key: &str, bad: Value, code: &str) {
    let good = json!({"rule": "b0", "key": key});
    assert_refused(e.check(&json!({"checks": [good, bad]})).await, code);
    assert_eq!(e.count("b0", key).await, 0, "the batch's other check was charged");
}

/// A batch of `at_bound` (admitting everything it asks) beside a one-permit check of the same
/// key: both admitted, then the pair denied.
async fn batch_admits_once(e: &Engine, key: &str, at_bound: Value) {
    let checks = json!({"checks": [at_bound, {"rule": "b0", "key": key}]});
    let (status, v) = e.check(&checks).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    let (status, v) = e.check(&checks).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(false)), "{v}");
    assert_eq!(e.count("b0", key).await, 1);
}

fn long_key(len: usize) -> String {
    "k".repeat(len)
}

// ---- MAX_LIMIT -------------------------------------------------------------------------------

async fn max_limit_inline(e: Arc<Engine>) {
    let past = json!({"key": "ml-in", "limit": MAX_LIMIT + 1, "window": "1h", "algorithm": "sliding_window"});
    assert_refused(e.check(&past).await, "invalid_quota");
    let at = json!({"key": "ml-in", "limit": MAX_LIMIT, "window": "1h", "algorithm": "sliding_window"});
    // [inline] max_cost is MAX_LIMIT here: past it, that bound answers.
    admits_cost_once_past(&e, at, MAX_LIMIT, "inline_cost_too_large").await;
}

async fn max_limit_rule(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "billion", "key": "ml-rule"}), MAX_LIMIT).await;
    assert_eq!(e.count("billion", "ml-rule").await, MAX_LIMIT);
}

async fn max_limit_tier(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "counter", "tier": "max", "key": "ml-tier"}), MAX_LIMIT).await;
    assert_eq!(e.count("counter", "ml-tier?tier=max").await, MAX_LIMIT);
}

/// An override of `rule`'s `key`, and of the Envoy descriptor `<descriptor>=<key>`, past `limit`
/// is refused; at `limit` it is taken, and decided exactly under it.
async fn override_at_bound(e: &Engine, rule: &str, descriptor: &str, key: &str, limit: u64) {
    assert_refused(e.set_override(rule, key, json!({"limit": limit + 1})).await, "invalid_quota");
    let refused = e.set_override("envoy:bounds", &format!("{descriptor}={key}"), json!({"limit": limit + 1})).await;
    assert_refused(refused, "invalid_quota");
    let (status, v) = e.set_override(rule, key, json!({"limit": limit})).await;
    assert_eq!(status, 200, "{v}");
    admits_cost_once(e, json!({"rule": rule, "key": key}), limit).await;
    let held = e.held(rule, key).await;
    assert_eq!((&held["count"], &held["source"]), (&json!(limit), &json!("override")), "{held}");
}

async fn max_limit_override(e: Arc<Engine>) {
    override_at_bound(&e, "counter", "small", "ml-ovr", MAX_LIMIT).await;
}

async fn max_limit_batch(e: Arc<Engine>) {
    let past = json!({"key": "ml-batch", "limit": MAX_LIMIT + 1, "window": "1h", "algorithm": "sliding_window"});
    batch_refused(&e, "ml-batch", past, "invalid_quota").await;
    let at = json!({"key": "ml-batch", "limit": MAX_LIMIT, "window": "1h", "algorithm": "sliding_window",
                    "cost": MAX_LIMIT});
    batch_admits_once(&e, "ml-batch", at).await;
}

// ---- MAX_LOG_LIMIT ---------------------------------------------------------------------------

async fn log_limit_inline(e: Arc<Engine>) {
    assert_refused(
        e.check(&json!({"key": "ll-in", "limit": MAX_LOG_LIMIT + 1, "window": "1h"})).await,
        "invalid_quota",
    );
    admits_cost_once(&e, json!({"key": "ll-in", "limit": MAX_LOG_LIMIT, "window": "1h"}), MAX_LOG_LIMIT).await;
}

async fn log_limit_rule(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "log", "key": "ll-rule"}), MAX_LOG_LIMIT).await;
    let v = e.held("log", "ll-rule").await;
    assert_eq!((&v["count"], &v["algorithm"]), (&json!(MAX_LOG_LIMIT), &json!("sliding_log")), "{v}");
}

async fn log_limit_tier(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "few", "tier": "max", "key": "ll-tier"}), MAX_LOG_LIMIT).await;
    assert_eq!(e.count("few", "ll-tier?tier=max").await, MAX_LOG_LIMIT);
}

async fn log_limit_override(e: Arc<Engine>) {
    let (rule, key) = ("few", "ll-ovr");
    assert_refused(e.set_override(rule, key, json!({"limit": MAX_LOG_LIMIT + 1})).await, "invalid_quota");
    let refused = e.set_override("envoy:bounds", &format!("log={key}"), json!({"limit": MAX_LOG_LIMIT + 1})).await;
    assert_refused(refused, "invalid_quota");
    let (status, v) = e.set_override(rule, key, json!({"limit": MAX_LOG_LIMIT})).await;
    assert_eq!(status, 200, "{v}");
    admits_cost_once(&e, json!({"rule": rule, "key": key}), MAX_LOG_LIMIT).await;
    let v = e.held(rule, key).await;
    assert_eq!((&v["count"], &v["source"]), (&json!(MAX_LOG_LIMIT), &json!("override")), "{v}");
}

async fn log_limit_batch(e: Arc<Engine>) {
    let past = json!({"key": "ll-batch", "limit": MAX_LOG_LIMIT + 1, "window": "1h"});
    batch_refused(&e, "ll-batch", past, "invalid_quota").await;
    let at = |cost: u64| json!({"key": "ll-batch", "limit": MAX_LOG_LIMIT, "window": "1h", "cost": cost});
    batch_admits_once(&e, "ll-batch", at(MAX_LOG_LIMIT - 1)).await;
}

// ---- Quota::max_cost -------------------------------------------------------------------------

async fn max_cost_inline(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"key": "mc-in", "limit": 7, "window": "1h"}), 7).await;
    let gcra = json!({"key": "mc-in-gcra", "limit": 7, "window": "1h", "algorithm": "gcra", "burst": 9});
    admits_cost_once(&e, gcra, 9).await;
}

async fn max_cost_rule(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "few", "key": "mc-rule"}), 2).await;
    admits_cost_once(&e, json!({"rule": "gcra", "key": "mc-rule"}), 20).await;
}

async fn max_cost_tier(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "few", "tier": "small", "key": "mc-tier"}), 1).await;
}

async fn max_cost_override(e: Arc<Engine>) {
    for rule in ["few", "gcra"] {
        let (status, v) = e.set_override(rule, "mc-ovr", json!({"limit": 5})).await;
        assert_eq!(status, 200, "{v}");
        // The override's limit bounds the cost, a GCRA rule's burst included.
        admits_cost_once(&e, json!({"rule": rule, "key": "mc-ovr"}), 5).await;
    }
}

async fn max_cost_batch(e: Arc<Engine>) {
    batch_refused(&e, "mc-batch", json!({"rule": "few", "key": "mc-batch", "cost": 3}), "invalid_cost").await;
    batch_admits_once(&e, "mc-batch", json!({"rule": "few", "key": "mc-batch", "cost": 2})).await;
}

// ---- MAX_CHECKS and checks per request -------------------------------------------------------

async fn max_checks_batch(e: Arc<Engine>) {
    let batch = |n: usize| -> Value {
        let checks: Vec<Value> = (0..n).map(|i| json!({"rule": format!("b{}", i % MAX_CHECKS), "key": "mx"})).collect();
        json!({ "checks": checks })
    };
    let mut over = batch(MAX_CHECKS);
    over["checks"].as_array_mut().expect("checks").push(json!({"rule": "few", "key": "mx"}));
    assert_refused(e.check(&over).await, "invalid_checks");
    assert_eq!(e.count("b0", "mx").await, 0);
    let (status, v) = e.check(&batch(MAX_CHECKS)).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    for i in 0..MAX_CHECKS {
        assert_eq!(e.count(&format!("b{i}"), "mx").await, 1, "b{i}");
    }
    assert_eq!(e.check(&batch(MAX_CHECKS)).await.1["allowed"], false);
}

async fn checks_per_request_batch(e: Arc<Engine>) {
    // 20,000 empty checks fit in a body: the decoder stops at the 17th.
    let body = format!("{{\"checks\":[{}{{}}]}}", "{},".repeat(19_999));
    let response = e.http.post(e.server.url("/v1/check")).body(body).send().await.expect("request");
    let status = response.status().as_u16();
    assert_refused((status, response.json().await.expect("JSON")), "invalid_checks");
}

// ---- MAX_BUCKETS -----------------------------------------------------------------------------

async fn buckets_inline(e: Arc<Engine>) {
    let past = json!({"key": "bk-in", "limit": 5, "window": "1h", "algorithm": "sliding_window", "buckets": 101});
    assert_refused(e.check(&past).await, "invalid_quota");
    let at = json!({"key": "bk-in", "limit": 5, "window": "1h", "algorithm": "sliding_window", "buckets": 100});
    admits_cost_once(&e, at, 5).await;
}

async fn buckets_rule(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "counter", "key": "bk-rule"}), 5).await;
    assert_eq!(e.count("counter", "bk-rule").await, 5);
}

async fn buckets_tier(e: Arc<Engine>) {
    // The tier inherits the rule's 100 buckets.
    admits_cost_once(&e, json!({"rule": "counter", "tier": "max", "key": "bk-tier"}), MAX_LIMIT).await;
}

async fn buckets_override(e: Arc<Engine>) {
    let past = json!({"limit": 5, "algorithm": "sliding_window", "buckets": 101});
    assert_refused(e.set_override("few", "bk-ovr", past).await, "invalid_quota");
    let (status, v) =
        e.set_override("few", "bk-ovr", json!({"limit": 5, "algorithm": "sliding_window", "buckets": 100})).await;
    assert_eq!(status, 200, "{v}");
    admits_cost_once(&e, json!({"rule": "few", "key": "bk-ovr"}), 5).await;
}

async fn buckets_batch(e: Arc<Engine>) {
    let past = json!({"key": "bk-batch", "limit": 5, "window": "1h", "algorithm": "sliding_window", "buckets": 101});
    batch_refused(&e, "bk-batch", past, "invalid_quota").await;
    let at = json!({"key": "bk-batch", "limit": 5, "window": "1h", "algorithm": "sliding_window", "buckets": 100,
                    "cost": 5});
    batch_admits_once(&e, "bk-batch", at).await;
}

// ---- MAX_KEY_LEN -----------------------------------------------------------------------------

/// The longest key a check of `rule` takes: MAX_KEY_LEN bytes together with `<rule>:{…}`.
fn longest_key(rule: &str) -> String {
    long_key(MAX_KEY_LEN - rule.len() - ":{}".len())
}

/// `check` under the longest key is admitted and held; one byte more is `key_too_long`.
async fn key_len(e: &Engine, check: Value, rule: &str, query: &str) {
    let with = |key: String| {
        let mut c = check.clone();
        c["key"] = json!(key);
        c
    };
    let longest = longest_key(rule);
    assert_refused(e.check(&with(format!("{longest}k"))).await, "key_too_long");
    let (status, v) = e.check(&with(longest.clone())).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    if rule != "inline" {
        assert_eq!(e.count(rule, &format!("{longest}{query}")).await, 1);
    }
}

async fn key_len_inline(e: Arc<Engine>) {
    key_len(&e, json!({"limit": 5, "window": "1h"}), "inline", "").await;
}

async fn key_len_rule(e: Arc<Engine>) {
    key_len(&e, json!({"rule": "log"}), "log", "").await;
}

async fn key_len_tier(e: Arc<Engine>) {
    key_len(&e, json!({"rule": "few", "tier": "max"}), "few", "?tier=max").await;
}

async fn key_len_override(e: Arc<Engine>) {
    // A longest key of its own: the other cells charge the one `longest_key` names.
    let longest = longest_key("log").replace('k', "o");
    let (status, v) = e.set_override("log", &format!("{longest}o"), json!({"limit": 5})).await;
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("key_too_long")), "{v}");
    let (status, v) = e.set_override("log", &longest, json!({"limit": 1})).await;
    assert_eq!(status, 200, "{v}");
    admits_cost_once(&e, json!({"rule": "log", "key": longest}), 1).await;
}

async fn key_len_batch(e: Arc<Engine>) {
    let key = longest_key("log");
    let past = json!({"rule": "log", "key": format!("{key}k")});
    batch_refused(&e, "kl-batch", past, "key_too_long").await;
    // One Cluster slot: the batch's other check has the same key.
    let checks = json!({"checks": [{"rule": "log", "key": key}, {"rule": "b0", "key": key}]});
    let (status, v) = e.check(&checks).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    assert_eq!(e.count("b0", &key).await, 1);
}

// ---- MAX_WINDOW ------------------------------------------------------------------------------

/// A decision's `reset_after_ms` is about `days` days.
#[track_caller]
fn resets_after_days(v: &Value, days: u64) {
    let ms = v["reset_after_ms"].as_u64().unwrap_or_else(|| panic!("no reset_after_ms: {v}"));
    let day = 24 * 3600 * 1000;
    assert!((days * day - 60_000..=days * day).contains(&ms), "reset after {ms} ms, not {days} days: {v}");
}

async fn window_inline(e: Arc<Engine>) {
    assert_refused(e.check(&json!({"key": "w-in", "limit": 2, "window": "367d"})).await, "invalid_quota");
    let (status, v) = e.check(&json!({"key": "w-in", "limit": 1, "window": "366d"})).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    resets_after_days(&v, 366);
    assert_eq!(e.check(&json!({"key": "w-in", "limit": 1, "window": "366d"})).await.1["allowed"], false);
}

async fn window_rule(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "long", "key": "w-rule"}), 2).await;
    let held = e.held("long", "w-rule").await;
    resets_after_days(&held, 366);
}

async fn window_tier(e: Arc<Engine>) {
    admits_cost_once(&e, json!({"rule": "few", "tier": "long", "key": "w-tier"}), 2).await;
    resets_after_days(&e.held("few", "w-tier?tier=long").await, 366);
}

async fn window_override(e: Arc<Engine>) {
    assert_refused(e.set_override("few", "w-ovr", json!({"limit": 2, "window": "367d"})).await, "invalid_quota");
    let (status, v) = e.set_override("few", "w-ovr", json!({"limit": 2, "window": "366d"})).await;
    assert_eq!(status, 200, "{v}");
    admits_cost_once(&e, json!({"rule": "few", "key": "w-ovr"}), 2).await;
    resets_after_days(&e.held("few", "w-ovr").await, 366);
}

async fn window_batch(e: Arc<Engine>) {
    batch_refused(&e, "w-batch", json!({"key": "w-batch", "limit": 2, "window": "367d"}), "invalid_quota").await;
    batch_admits_once(&e, "w-batch", json!({"key": "w-batch", "limit": 2, "window": "366d", "cost": 2})).await;
}

// ---- The [inline] caps (the tight server: the defaults, no fixed windows) --------------------

async fn inline_caps(e: Arc<Engine>) {
    let tight = |body: Value| {
        let e = Arc::clone(&e);
        async move { e.check_on(&e.tight, &body).await }
    };
    let refusals = [
        (json!({"key": "c", "limit": 10_001, "window": "1m"}), "inline_limit_too_large"),
        (
            json!({"key": "c", "limit": 10, "window": "1m", "algorithm": "gcra", "burst": 10_001}),
            "inline_limit_too_large",
        ),
        (json!({"key": "c", "limit": 10, "window": "86400001ms"}), "inline_window_too_long"),
        (json!({"key": "c", "limit": 1000, "window": "1m", "cost": 101}), "inline_cost_too_large"),
        (json!({"key": "c", "limit": 10, "window": "1m", "algorithm": "fixed_window"}), "inline_algorithm_not_allowed"),
    ];
    for (body, code) in &refusals {
        assert_refused(tight(body.clone()).await, code);
        // In a batch beside a check that fits: refused whole, the other check not charged.
        let good = json!({"key": "c-good", "limit": 1, "window": "1m"});
        assert_refused(tight(json!({"checks": [good, body]})).await, code);
    }
    let (status, v) = tight(json!({"key": "c-good", "limit": 1, "window": "1m"})).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "a refused batch charged its other check: {v}");
    // At the caps: the largest limit, window and cost, decided exactly.
    let at = json!({"key": "c", "limit": 10_000, "window": "1d", "cost": 100});
    for i in 0..100 {
        let (status, v) = tight(at.clone()).await;
        assert_eq!((status, &v["allowed"]), (200, &json!(true)), "admission {i}: {v}");
    }
    assert_eq!(tight(at).await.1["allowed"], false);
    let gcra = json!({"key": "c-gcra", "limit": 10, "window": "1m", "algorithm": "gcra", "burst": 10_000, "cost": 100});
    assert_eq!(tight(gcra).await.1["allowed"], true);
}

// ---- MAX_HEAD_BYTES and MAX_BODY -------------------------------------------------------------

async fn head_bytes(e: Arc<Engine>) {
    let big = "x".repeat(16 * 1024 + 1);
    for (method, path) in [("POST", "/v1/check"), ("PUT", "/v1/overrides/b1/hb")] {
        let request = e.http.request(method.parse().expect("method"), e.server.url(path)).bearer_auth("t");
        let response =
            request.header("x-big", &big).json(&json!({"rule": "few", "key": "hb", "limit": 5})).send().await;
        assert_eq!(response.expect("an answer").status().as_u16(), 431, "{method} {path}");
    }
    assert_eq!(e.count("few", "hb").await, 0);
    assert_eq!(e.admin("GET", "/v1/overrides/b1", None).await.1["total"], 0);
}

async fn body_bytes(e: Arc<Engine>) {
    let limit = 64 * 1024;
    let padded = |len: usize, body: &str| format!("{body}{}", " ".repeat(len - body.len()));
    let check = r#"{"rule":"few","key":"bb"}"#;
    let send = |body: String, method: &str, path: &str| {
        let request = e.http.request(method.parse().expect("method"), e.server.url(path)).bearer_auth("t");
        request.header("content-type", "application/json").body(body).send()
    };
    let over = send(padded(limit + 1, check), "POST", "/v1/check").await.expect("an answer");
    assert_eq!(over.status().as_u16(), 413);
    let v: Value = over.json().await.expect("JSON");
    assert_eq!(v["error"]["code"], "body_too_large", "{v}");
    let over = send(padded(limit + 1, r#"{"limit":5}"#), "PUT", "/v1/overrides/few/bb").await.expect("an answer");
    assert_eq!(over.status().as_u16(), 413);
    assert_eq!(e.count("few", "bb").await, 0);
    let at = send(padded(limit, check), "POST", "/v1/check").await.expect("an answer");
    assert_eq!(at.status().as_u16(), 200);
    assert_eq!(e.count("few", "bb").await, 1);
}

// ---- Envoy descriptors -----------------------------------------------------------------------

/// `entries`, with a request's own limit of `limit` per hour when given.
fn envoy_descriptor(entries: &[(&str, &str)], limit: Option<u32>) -> RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.limit = limit.map(|requests_per_unit| RateLimitOverride { requests_per_unit, unit: Unit::Hour as i32 });
    d
}

async fn should_rate_limit(e: &Engine, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> (i32, Vec<i32>) {
    let request = RateLimitRequest { domain: "bounds".into(), descriptors, hits_addend: hits };
    codes(&e.envoy().await.should_rate_limit(request).await.expect("an answer").into_inner())
}

/// `d` asking `hits + 1` is over (nothing charged), asking `hits` is admitted, then one more is
/// over.
async fn envoy_admits_once(e: &Engine, d: &RateLimitDescriptor, hits: u32) {
    assert_eq!(should_rate_limit(e, vec![d.clone()], hits + 1).await, (OVER, vec![OVER]), "{hits} + 1 hits");
    assert_eq!(should_rate_limit(e, vec![d.clone()], hits).await, (OK, vec![OK]), "{hits} hits");
    assert_eq!(should_rate_limit(e, vec![d.clone()], 1).await, (OVER, vec![OVER]), "one more");
}

fn u32_of(n: u64) -> u32 {
    u32::try_from(n).expect("fits a u32")
}

async fn envoy_max_limit(e: Arc<Engine>) {
    envoy_admits_once(&e, &envoy_descriptor(&[("billion", "ml")], None), u32_of(MAX_LIMIT)).await;
    assert_eq!(e.count("envoy:bounds", "billion=ml").await, MAX_LIMIT);
    // 4 × 10⁹ per hour is counted as MAX_LIMIT.
    envoy_admits_once(&e, &envoy_descriptor(&[("huge", "ml")], None), u32_of(MAX_LIMIT)).await;
    let held = e.held("envoy:bounds", "huge=ml").await;
    assert_eq!((&held["count"], &held["limit"]), (&json!(MAX_LIMIT), &json!(MAX_LIMIT)), "{held}");
}

async fn envoy_max_limit_request(e: Arc<Engine>) {
    envoy_admits_once(&e, &envoy_descriptor(&[("req", "ml")], Some(u32::MAX)), u32_of(MAX_LIMIT)).await;
    envoy_admits_once(&e, &envoy_descriptor(&[("small", "ml")], Some(u32_of(MAX_LIMIT))), u32_of(MAX_LIMIT)).await;
}

async fn envoy_log_limit(e: Arc<Engine>) {
    envoy_admits_once(&e, &envoy_descriptor(&[("log", "ll")], None), u32_of(MAX_LOG_LIMIT)).await;
    let held = e.held("envoy:bounds", "log=ll").await;
    assert_eq!((&held["count"], &held["algorithm"]), (&json!(MAX_LOG_LIMIT), &json!("sliding_log")), "{held}");
    // One more per hour is counted by the sliding window counter.
    envoy_admits_once(&e, &envoy_descriptor(&[("over_log", "ll")], None), u32_of(MAX_LOG_LIMIT + 1)).await;
    assert_eq!(e.held("envoy:bounds", "over_log=ll").await["algorithm"], "sliding_window");
}

async fn envoy_log_limit_request(e: Arc<Engine>) {
    let at = envoy_descriptor(&[("req", "ll")], Some(u32_of(MAX_LOG_LIMIT)));
    envoy_admits_once(&e, &at, u32_of(MAX_LOG_LIMIT)).await;
    let past = envoy_descriptor(&[("req", "ll-past")], Some(u32_of(MAX_LOG_LIMIT + 1)));
    envoy_admits_once(&e, &past, u32_of(MAX_LOG_LIMIT + 1)).await;
}

async fn envoy_max_cost(e: Arc<Engine>) {
    envoy_admits_once(&e, &envoy_descriptor(&[("small", "mc")], None), 5).await;
}

async fn envoy_max_cost_request(e: Arc<Engine>) {
    envoy_admits_once(&e, &envoy_descriptor(&[("req", "mc")], Some(3)), 3).await;
}

/// 17 fresh descriptors: the first 16 decided and charged, the 17th refused and not charged.
async fn envoy_checks(e: &Engine, limit: Option<u32>) {
    let tag = if limit.is_some() { "mx-req" } else { "mx" };
    let values: Vec<String> = (0..=MAX_CHECKS).map(|i| format!("{tag}{i}")).collect();
    let descriptors = values.iter().map(|v| envoy_descriptor(&[("small", v)], limit)).collect();
    let (overall, statuses) = should_rate_limit(e, descriptors, 1).await;
    let mut expected = vec![OK; MAX_CHECKS];
    expected.push(UNKNOWN);
    assert_eq!((overall, statuses), (OK, expected));
    if limit.is_none() {
        assert_eq!(e.count("envoy:bounds", &format!("small={}", values[MAX_CHECKS - 1])).await, 1);
        assert_eq!(e.count("envoy:bounds", &format!("small={}", values[MAX_CHECKS])).await, 0);
    }
}

async fn envoy_max_checks(e: Arc<Engine>) {
    envoy_checks(&e, None).await;
}

async fn envoy_max_checks_request(e: Arc<Engine>) {
    envoy_checks(&e, Some(5)).await;
}

/// The longest value whose descriptor key (`6:bounds:{5:small=489:…}`) is MAX_KEY_LEN bytes.
const LONGEST_SMALL_VALUE: usize = MAX_KEY_LEN - "6:bounds:{5:small=489:}".len();

async fn envoy_key_len_case(e: &Engine, limit: Option<u32>) {
    let (fits, over) = (long_key(LONGEST_SMALL_VALUE), long_key(LONGEST_SMALL_VALUE + 1));
    let long = envoy_descriptor(&[("small", &over)], limit);
    let alone = RateLimitRequest { domain: "bounds".into(), descriptors: vec![long.clone()], hits_addend: 1 };
    let status = e.envoy().await.should_rate_limit(alone).await.expect_err("nothing decidable");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // Beside a descriptor over its limit, the request is over.
    let blocked = envoy_descriptor(&[("small", if limit.is_some() { "kl-blocked-req" } else { "kl-blocked" })], limit);
    assert_eq!(should_rate_limit(e, vec![blocked.clone()], 5).await, (OK, vec![OK]));
    assert_eq!(should_rate_limit(e, vec![long, blocked], 1).await, (OVER, vec![UNKNOWN, OVER]));
    assert_eq!(should_rate_limit(e, vec![envoy_descriptor(&[("small", &fits)], limit)], 1).await, (OK, vec![OK]));
}

async fn envoy_key_len(e: Arc<Engine>) {
    envoy_key_len_case(&e, None).await;
    assert_eq!(e.count("envoy:bounds", &format!("small={}", long_key(LONGEST_SMALL_VALUE))).await, 1);
}

async fn envoy_key_len_request(e: Arc<Engine>) {
    envoy_key_len_case(&e, Some(5)).await;
}

// ---- The matrix ------------------------------------------------------------------------------

type CellFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A cell: the attack and the safe outcome on one engine.
type Cell = fn(Arc<Engine>) -> CellFuture;

/// Each cell by name, as SECURITY.md's matrix names it.
macro_rules! cells {
    ($($cell:ident),* $(,)?) => {
        &[$((stringify!($cell), |e: Arc<Engine>| -> CellFuture { Box::pin($cell(e)) })),*]
    };
}

const CELLS: &[(&str, Cell)] = cells![
    max_limit_inline,
    max_limit_rule,
    max_limit_tier,
    max_limit_override,
    max_limit_batch,
    envoy_max_limit,
    envoy_max_limit_request,
    log_limit_inline,
    log_limit_rule,
    log_limit_tier,
    log_limit_override,
    log_limit_batch,
    envoy_log_limit,
    envoy_log_limit_request,
    max_cost_inline,
    max_cost_rule,
    max_cost_tier,
    max_cost_override,
    max_cost_batch,
    envoy_max_cost,
    envoy_max_cost_request,
    max_checks_batch,
    envoy_max_checks,
    envoy_max_checks_request,
    checks_per_request_batch,
    buckets_inline,
    buckets_rule,
    buckets_tier,
    buckets_override,
    buckets_batch,
    key_len_inline,
    key_len_rule,
    key_len_tier,
    key_len_override,
    key_len_batch,
    envoy_key_len,
    envoy_key_len_request,
    window_inline,
    window_rule,
    window_tier,
    window_override,
    window_batch,
    inline_caps,
    head_bytes,
    body_bytes,
];

/// Runs every cell on `engine`, each to its end whatever the others do; fails naming those that
/// failed, each with the start of its panic's message.
async fn run_matrix(engine: Engine) {
    let engine = Arc::new(engine);
    let mut failed = Vec::new();
    for (name, cell) in CELLS {
        if let Err(e) = tokio::spawn(cell(Arc::clone(&engine))).await {
            let panic = e.try_into_panic().ok();
            let message = panic.as_ref().and_then(|p| {
                p.downcast_ref::<String>().map(String::as_str).or_else(|| p.downcast_ref::<&str>().copied())
            });
            let message: String = message.unwrap_or("cancelled").chars().take(300).collect();
            failed.push(format!("{name}: {message}"));
        }
    }
    let (engine, n) = (engine.engine, CELLS.len());
    assert!(failed.is_empty(), "on {engine}: {} of {n} cells failed:\n{}", failed.len(), failed.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    run_matrix(Engine::start("memory", Backing::Memory)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lua() {
    run_matrix(Engine::start("lua", Backing::Redis(RedisServer::start()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_module() {
    run_matrix(Engine::start("module", Backing::Redis(RedisServer::start_with_module(&[])))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    run_matrix(Engine::start("lua", Backing::Cluster(RedisCluster::start(3, 0)))).await;
}

/// Rules and tiers are the operator's: past a bound, the file is refused at load with the field
/// and the bound — `validate` as `serve` and every reload check it — whatever the backend.
#[test]
fn rules_and_tiers_past_a_bound_are_refused_at_load() {
    let rule = |fields: &str| format!("[[rules]]\nname = \"r\"\nwindow = \"1h\"\n{fields}\n");
    let files = [
        rule(&format!("limit = {}\nalgorithm = \"sliding_window\"", MAX_LIMIT + 1)),
        rule(&format!("limit = {}", MAX_LOG_LIMIT + 1)),
        rule("limit = 5\nalgorithm = \"sliding_window\"\nbuckets = 101"),
        rule("limit = 5\nalgorithm = \"gcra\"\nburst = 1000000001"),
        "[[rules]]\nname = \"r\"\nlimit = 5\nwindow = \"367d\"\n".to_owned(),
        rule(&format!("limit = 5\nalgorithm = \"sliding_window\"\ntiers = {{ t = {{ limit = {} }} }}", MAX_LIMIT + 1)),
        rule(&format!("limit = 5\ntiers = {{ t = {{ limit = {} }} }}", MAX_LOG_LIMIT + 1)),
        rule("limit = 5\ntiers = { t = { limit = 5, window = \"367d\" } }"),
    ];
    for text in files {
        let file = RulesFile::new(&text);
        let (status, stderr) = support::run_to_exit(&["validate", "--config", file.arg()]);
        assert!(!status.success(), "accepted:\n{text}");
        assert!(stderr.contains(&format!("{}:", file.arg())) && stderr.contains("rules[0]"), "{stderr}");
    }
}
