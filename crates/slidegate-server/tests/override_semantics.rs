//! What an override means, through the real binary on each engine (memory, Redis Lua, Redis
//! module): on a GCRA it bounds the burst, every route reports the limit decisions use, keys
//! no check can use are refused, a lowered sliding log denies until enough leave (and says when
//! the first does), one raised past 256 still expires, and a `share_threshold` descriptor's
//! shared counter is what a reset acts on while an override of it is refused.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::envoy::{Dir, OK, OVER, request};
use support::{RulesFile, Slidegate, check};

/// The rules: `upload`, a GCRA of 10 per 10 s with a burst of 20, and its tier `big` of 30.
const RULES: &str = r#"
[[rules]]
name = "upload"
limit = 10
window = "10s"
algorithm = "gcra"
burst = 20
tiers = { big = { limit = 30 } }
"#;

/// `search`, a sliding log of 12 per 10 s.
const SEARCH: &str = "[[rules]]\nname = \"search\"\nlimit = 12\nwindow = \"10s\"\n";

/// Runs `case(engine, backend)` on each engine in turn, `backend` the rules file's
/// `[backend]` section (empty: memory).
async fn on_each_engine(case: impl AsyncFn(&str, &str)) {
    case("memory", "").await;
    for (engine, redis) in [("lua", RedisServer::start()), ("module", RedisServer::start_with_module(&[]))] {
        case(engine, &format!("[backend]\nredis = \"{}\"\ntimeout = \"10s\"\n", redis.url())).await;
    }
}

/// A server with `extra` flags on a rules file of the admin token `t`, `backend` and `rules`
/// (returned too: the server reads it while it runs).
fn serve(backend: &str, rules: &str, extra: &[&str]) -> (Slidegate, RulesFile) {
    let rules = RulesFile::new(&format!("admin_token = \"t\"\n{backend}{rules}"));
    (Slidegate::serve(&[&["--config", rules.arg()], extra].concat()), rules)
}

/// `n` checks of `body` sent at once: their answers.
async fn at_once(server: &Slidegate, body: &Value, n: usize) -> Vec<Value> {
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..n {
        let request = Client::new().post(server.url("/v1/check")).json(body);
        sent.spawn(async move { request.send().await.expect("answer").json::<Value>().await.expect("JSON") });
    }
    sent.join_all().await
}

/// An admin request: (status, JSON).
async fn admin(client: &Client, method: &str, url: String, body: Option<Value>) -> (u16, Value) {
    let mut request = client.request(method.parse().expect("a method"), url).bearer_auth("t");
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.expect("response");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_a_gcra_bounds_its_burst_and_every_route_reports_that_limit() {
    on_each_engine(async |engine, backend| {
        let (server, _rules) = serve(backend, RULES, &[]);
        let client = Client::new();
        let (status, v) =
            admin(&client, "PUT", server.url("/v1/overrides/upload/abuser"), Some(json!({"limit": 1}))).await;
        assert_eq!(status, 200, "{engine}: {v}");

        // The attack: 25 checks at once. The rule's burst of 20 would admit 20.
        let body = json!({"rule": "upload", "key": "abuser"});
        let answers = at_once(&server, &body, 25).await;
        let admitted = answers.iter().filter(|v| v["allowed"] == true).count();
        assert_eq!(admitted, 1, "{engine}: the override's limit bounds what is taken at once");
        assert!(answers.iter().all(|v| v["limit"] == 1), "{engine}: {answers:?}");
        let (_, v) = admin(&client, "GET", server.url("/v1/keys/upload/abuser"), None).await;
        assert_eq!((&v["source"], &v["limit"], &v["burst"]), (&json!("override"), &json!(1), &json!(1)), "{v}");
        let (_, v) = admin(&client, "GET", server.url("/v1/overrides/upload"), None).await;
        assert_eq!(v["overrides"][0]["limit"], 1, "{engine}: {v}");
        // The tier's quota, under the same override: bounded the same way.
        let (_, _, v) = check(&client, &server, &json!({"rule": "upload", "key": "abuser", "tier": "big"})).await;
        assert_eq!((&v["limit"], &v["allowed"]), (&json!(1), &json!(false)), "{engine}: {v}");

        // Another key keeps the rule's burst; an override that names its own burst keeps it.
        let (_, _, v) = check(&client, &server, &json!({"rule": "upload", "key": "other"})).await;
        assert_eq!(v["limit"], 20, "{engine}: {v}");
        let own = json!({"limit": 1, "algorithm": "gcra", "burst": 3});
        assert_eq!(admin(&client, "PUT", server.url("/v1/overrides/upload/named"), Some(own)).await.0, 200);
        let body = json!({"rule": "upload", "key": "named"});
        let answers = at_once(&server, &body, 5).await;
        assert_eq!(answers.iter().filter(|v| v["allowed"] == true).count(), 3, "{engine}: {answers:?}");
        let (_, v) = admin(&client, "GET", server.url("/v1/keys/upload/named"), None).await;
        assert_eq!((&v["limit"], &v["burst"]), (&json!(1), &json!(3)), "{engine}: {v}");
    })
    .await;
}

/// An override lowering a sliding log's limit below what a key holds: the key is denied until
/// enough admissions leave, and a denial says the next permit comes when the oldest leaves,
/// before the one that blocks the request (six admissions at 0 ms and six at ~400 ms, then a
/// limit of 4: the request waits for the eighth oldest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_sliding_log_denies_until_enough_leave_and_says_when_the_first_does() {
    on_each_engine(async |engine, backend| {
        let (server, _rules) = serve(backend, SEARCH, &[]);
        let client = Client::new();
        let body = json!({"rule": "search", "key": "k"});
        for batch in 0..2 {
            let answers = at_once(&server, &body, 6).await;
            assert!(answers.iter().all(|v| v["allowed"] == true), "{engine}, batch {batch}: {answers:?}");
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        }
        let lowered = json!({"limit": 4});
        assert_eq!(admin(&client, "PUT", server.url("/v1/overrides/search/k"), Some(lowered)).await.0, 200);
        for _ in 0..2 {
            let (status, _, v) = check(&client, &server, &body).await;
            assert_eq!((status, &v["allowed"], &v["limit"]), (200, &json!(false), &json!(4)), "{engine}: {v}");
            let (retry, next) = (v["retry_after_ms"].as_u64(), v["next_permit_after_ms"].as_u64());
            let (retry, next) = (retry.expect("a retry"), next.expect("a next permit"));
            assert!(next + 300 <= retry && retry <= 10_000, "{engine}: the oldest leaves first: {v}");
        }
    })
    .await;
}

/// An override raising a sliding log's limit above 256: the Lua scripts rewrite the key's
/// per-permit members as counted entries on its next check, and when that check is denied the
/// key still expires (it would otherwise hold its entries until some admission came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_raised_past_256_and_denied_still_expires() {
    let redis = RedisServer::start();
    let (server, _rules) = serve(&format!("[backend]\nredis = \"{}\"\n", redis.url()), SEARCH, &[]);
    let client = Client::new();
    let body = json!({"rule": "search", "key": "k"});
    assert!(at_once(&server, &body, 5).await.iter().all(|v| v["allowed"] == true));
    let raised = json!({"limit": 1_000});
    assert_eq!(admin(&client, "PUT", server.url("/v1/overrides/search/k"), Some(raised)).await.0, 200);
    let (_, _, v) = check(&client, &server, &json!({"rule": "search", "key": "k", "cost": 1_000})).await;
    assert_eq!((&v["allowed"], &v["remaining"]), (&json!(false), &json!(995)), "{v}");
    let first: Vec<String> = redis.query(&["ZRANGE", "slidegate:search:{k}", "0", "0"]);
    assert!(first[0].starts_with('c'), "counted entries now: {first:?}");
    let ttl: i64 = redis.query(&["PTTL", "slidegate:search:{k}"]);
    assert!((1..=10_000).contains(&ttl), "the key expires in {ttl} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_that_does_not_fit_a_tier_is_refused_naming_the_tier() {
    let rules = RulesFile::new(
        "admin_token = \"t\"\n[[rules]]\nname = \"api\"\nlimit = 10\nwindow = \"1s\"\n\
         algorithm = \"sliding_window\"\nbuckets = 1\ntiers = { long = { window = \"366d\" } }\n",
    );
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    // A million a window fits the rule's 1 s bucket, not the tier's 366-day one (limit × bucket
    // stays below 2^53): checks under the tier would ignore it.
    let (status, v) = admin(&client, "PUT", server.url("/v1/overrides/api/k"), Some(json!({"limit": 1_000_000}))).await;
    assert_eq!((status, &v["error"]["code"]), (400, &json!("invalid_quota")), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("\"long\"") && m.contains("2^53")), "{v}");
    let (_, v) = admin(&client, "GET", server.url("/v1/overrides/api"), None).await;
    assert_eq!(v["total"], 0, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_no_check_can_use_are_refused_and_take_no_room() {
    on_each_engine(async |engine, backend| {
        let (server, _rules) = serve(backend, RULES, &[]);
        let client = Client::new();
        // `upload:{<key>}` holds 9 bytes beside the key: 503 bytes of key fit, 504 do not.
        let room = slidegate::MAX_KEY_LEN - "upload:{}".len();
        for len in [room + 1, slidegate::MAX_KEY_LEN] {
            let url = server.url(&format!("/v1/overrides/upload/{}", "k".repeat(len)));
            let (status, v) = admin(&client, "PUT", url, Some(json!({"limit": 5}))).await;
            assert_eq!((status, &v["error"]["code"]), (400, &json!("key_too_long")), "{engine} {len}: {v}");
            assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(&room.to_string())), "{v}");
            let (_, _, v) = check(&client, &server, &json!({"rule": "upload", "key": "k".repeat(len)})).await;
            assert_eq!(v["error"]["code"], "key_too_long", "{engine}: no check can use it either: {v}");
        }
        let (_, v) = admin(&client, "GET", server.url("/v1/overrides/upload"), None).await;
        assert_eq!(v["total"], 0, "{engine}: {v}");
        let url = server.url(&format!("/v1/overrides/upload/{}", "k".repeat(room)));
        assert_eq!(
            admin(&client, "PUT", url, Some(json!({"limit": 5}))).await.0,
            200,
            "{engine}: the longest that fits"
        );
        let (status, _, v) = check(&client, &server, &json!({"rule": "upload", "key": "k".repeat(room)})).await;
        assert_eq!((status, &v["limit"]), (200, &json!(5)), "{engine}: {v}");
    })
    .await;
}

/// Paths under `/api/` share one counter of 2 a minute.
const SHARED: &str = r#"
domain: edge
descriptors:
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_threshold_descriptor_is_reset_on_its_shared_counter_and_not_overridden() {
    on_each_engine(async |engine, backend| {
        let dir = Dir::with(&[("edge.yaml", SHARED)]);
        let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
        let (server, _rules) = serve(backend, "", &["--grpc", &grpc, "--envoy-config", dir.arg()]);
        let mut envoy = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
        let client = Client::new();
        let one = "/v1/overrides/envoy:edge/path=%2Fapi%2Fx";

        let (status, v) = admin(&client, "PUT", server.url(one), Some(json!({"limit": 5}))).await;
        assert_eq!((status, &v["error"]["code"]), (400, &json!("shared_descriptor")), "{engine}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("/api/*")), "{v}");
        let (_, v) = admin(&client, "GET", server.url("/v1/overrides/envoy:edge"), None).await;
        assert_eq!(v["total"], 0, "{engine}: {v}");

        let mut ask = async |path: &str| {
            let answer = envoy.should_rate_limit(request("edge", &[&[("path", path)]], 1)).await.expect("answer");
            answer.into_inner().overall_code
        };
        assert_eq!([ask("/api/x").await, ask("/api/y").await, ask("/api/z").await], [OK, OK, OVER], "{engine}");
        let (_, v) = admin(&client, "GET", server.url("/v1/keys/envoy:edge/path=%2Fapi%2Fq"), None).await;
        assert_eq!((&v["count"], &v["key"]), (&json!(2), &json!("4:edge:{4:path=*6:/api/*}")), "{engine}: {v}");
        let (status, v) = admin(&client, "DELETE", server.url("/v1/keys/envoy:edge/path=%2Fapi%2Fx"), None).await;
        assert_eq!((status, &v["reset"], &v["key"]), (200, &json!(true), &json!("4:edge:{4:path=*6:/api/*}")), "{v}");
        assert_eq!(ask("/api/w").await, OK, "{engine}: the reset emptied the shared counter");
    })
    .await;
}
