//! Per-key overrides through the real binary on the memory backend: the admin routes, what a
//! check and the key inspector then say, the bounds, the audit trail, and Envoy descriptors.

mod support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use reqwest::Client;
use serde_json::{Value, json};
use support::envoy::USER_EDGE;
use support::{RulesFile, Slidegate, check, metric};

const RULES: &str = r#"
admin_token = "t"

[[rules]]
name = "api"
limit = 2
window = "60s"
tiers = { vip = { limit = 3 } }
"#;

/// An admin request: (status, JSON).
async fn admin(client: &Client, method: &str, url: String, token: Option<&str>, body: Option<Value>) -> (u16, Value) {
    let mut request = client.request(method.parse().expect("a method"), url);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.expect("response");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn put(client: &Client, server: &Slidegate, path: &str, body: Value) -> (u16, Value) {
    admin(client, "PUT", server.url(&format!("/v1/overrides/{path}")), Some("t"), Some(body)).await
}

/// The limit a check of `key` under the rule `api` is decided with.
async fn limit_of(client: &Client, server: &Slidegate, key: &str) -> u64 {
    let (status, _, v) = check(client, server, &json!({"rule": "api", "key": key})).await;
    assert_eq!(status, 200, "{v}");
    v["limit"].as_u64().expect("a limit")
}

#[tokio::test]
async fn override_routes_need_the_admin_token() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    let one = server.url("/v1/overrides/api/k");
    let body = Some(json!({"limit": 100}));
    for (method, url, body) in
        [("PUT", &one, body.clone()), ("DELETE", &one, None), ("GET", &server.url("/v1/overrides/api"), None)]
    {
        for token in [None, Some("wrong"), Some("")] {
            let (status, v) = admin(&client, method, url.clone(), token, body.clone()).await;
            assert_eq!((status, &v["error"]["code"]), (401, &json!("unauthorized")), "{method} {token:?}");
        }
    }
    assert_eq!(limit_of(&client, &server, "k").await, 2, "nothing was set");

    let closed = Slidegate::serve(&[]);
    let (status, v) = admin(&client, "PUT", closed.url("/v1/overrides/api/k"), Some("t"), body).await;
    assert_eq!((status, &v["error"]["code"]), (403, &json!("admin_disabled")));
}

#[tokio::test]
async fn an_override_changes_one_keys_limit_keeps_its_count_and_is_listed_then_deleted() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    for allowed in [true, true, false] {
        assert_eq!(check(&client, &server, &json!({"rule": "api", "key": "k"})).await.2["allowed"], allowed);
    }
    let (status, v) = put(&client, &server, "api/k", json!({"limit": 5})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((&v["override"]["limit"], &v["previous"]), (&json!(5), &Value::Null));
    // The key keeps its two admissions: 5 - 2 - 1 remain after one more.
    let (_, _, v) = check(&client, &server, &json!({"rule": "api", "key": "k"})).await;
    assert_eq!((&v["allowed"], &v["limit"], &v["remaining"]), (&json!(true), &json!(5), &json!(2)), "{v}");
    assert_eq!(limit_of(&client, &server, "other").await, 2, "another key keeps the rule's limit");
    let (_, _, v) = check(&client, &server, &json!({"rule": "api", "key": "k", "tier": "vip"})).await;
    assert_eq!(v["limit"], 5, "the key's override over its tier");
    let group = json!({"checks": [{"rule": "api", "key": "k"}, {"rule": "api", "key": "other"}]});
    let (_, _, v) = check(&client, &server, &group).await;
    assert_eq!((&v["results"][0]["limit"], &v["results"][1]["limit"]), (&json!(5), &json!(2)), "{v}");

    // The inspector says which limit applies and why: 2 admissions before the override, 3 since.
    let inspect = |key: &str| admin(&client, "GET", server.url(&format!("/v1/keys/api/{key}")), Some("t"), None);
    let (_, v) = inspect("k").await;
    assert_eq!((&v["source"], &v["limit"], &v["count"]), (&json!("override"), &json!(5), &json!(5)), "{v}");
    assert_eq!((&v["override"]["limit"], v["override"].get("expires_at_ms")), (&json!(5), None), "no expiry");
    assert_eq!(inspect("other").await.1["source"], "rule");
    assert_eq!(inspect("other?tier=vip").await.1["source"], "tier");

    let (_, list) = admin(&client, "GET", server.url("/v1/overrides/api"), Some("t"), None).await;
    assert_eq!((&list["total"], &list["overrides"][0]["key"], &list["next"]), (&json!(1), &json!("k"), &Value::Null));
    let (status, v) = admin(&client, "DELETE", server.url("/v1/overrides/api/k"), Some("t"), None).await;
    assert_eq!((status, &v["deleted"], &v["previous"]["limit"]), (200, &json!(true), &json!(5)), "{v}");
    assert_eq!(limit_of(&client, &server, "k").await, 2);
    let (status, v) = admin(&client, "DELETE", server.url("/v1/overrides/api/k"), Some("t"), None).await;
    assert_eq!((status, &v["error"]["code"]), (404, &json!("no_override")));

    // Each change is in the audit trail: what, old → new, from where; and counted.
    let log = server.log_text();
    let set = log.lines().find(|l| l.contains("override set")).expect("the set's audit line");
    assert!(set.contains("old=none") && set.contains(r#""limit":5"#) && set.contains("from=\"127.0.0.1\""), "{set}");
    assert!(log.lines().any(|l| l.contains("override delete") && l.contains("new=none")), "{log}");
    assert_eq!(metric(&client, &server, "slidegate_override_changes_total{action=\"set\"}").await, 1.0);
    assert_eq!(metric(&client, &server, "slidegate_override_changes_total{action=\"delete\"}").await, 1.0);
}

#[tokio::test]
async fn pages_list_every_override_of_a_rule_once() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    for i in 0..7 {
        assert_eq!(put(&client, &server, &format!("api/user-{i}"), json!({"limit": 10 + i})).await.0, 200);
    }
    let (mut seen, mut after) = (Vec::new(), None::<String>);
    for _ in 0..10 {
        let query = after.as_ref().map_or_else(|| "?limit=3".to_owned(), |a| format!("?limit=3&after={a}"));
        let (status, page) =
            admin(&client, "GET", server.url(&format!("/v1/overrides/api{query}")), Some("t"), None).await;
        assert_eq!((status, &page["total"]), (200, &json!(7)), "{page}");
        seen.extend(
            page["overrides"].as_array().expect("a list").iter().map(|o| o["key"].as_str().expect("key").to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, (0..7).map(|i| format!("user-{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn bad_overrides_are_refused_with_a_4xx_naming_the_problem() {
    let rules = RulesFile::new(&format!("max_overrides = 2\n{RULES}"));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    let long = "k".repeat(slidegate::MAX_KEY_LEN + 1);
    let cases = [
        ("nope/k", json!({"limit": 5}), 404, "unknown_rule"),
        ("api/k", json!({"ttl": "1d"}), 400, "missing_limit"),
        ("api/k", json!({"limit": 0}), 400, "invalid_quota"),
        ("api/k", json!({"limit": 100_001}), 400, "invalid_quota"),
        ("api/k", json!({"limit": 5, "window": "soon"}), 400, "invalid_window"),
        ("api/k", json!({"limit": 5, "burst": 2}), 400, "invalid_override"),
        ("api/k", json!({"limit": 5, "algorithm": "leaky"}), 400, "unknown_algorithm"),
        ("api/k", json!({"limit": 5, "ttl": "0s"}), 400, "invalid_ttl"),
        ("api/k", json!({"limit": 5, "ttl": "367d"}), 400, "invalid_ttl"),
        ("api/k", json!({"limit": 5, "limt": 6}), 400, "invalid_json"),
        (&format!("api/{long}"), json!({"limit": 5}), 400, "key_too_long"),
        ("envoy:edge/k=v", json!({"limit": 5}), 404, "unknown_descriptor"),
        ("envoy:edge/k", json!({"limit": 5}), 400, "invalid_descriptor"),
    ];
    for (path, body, status, code) in cases {
        let (got, v) = put(&client, &server, path, body.clone()).await;
        assert_eq!((got, &v["error"]["code"]), (status, &json!(code)), "{path} {body}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    let (status, v) = put(&client, &server, "api/k", json!({"limit": 100_001})).await;
    assert!(status == 400 && v["error"]["message"].as_str().is_some_and(|m| m.contains("100000")), "{v}");
    let huge = client
        .put(server.url("/v1/overrides/api/k"))
        .bearer_auth("t")
        .body(format!(r#"{{"limit": 5, "window": "{}"}}"#, "1".repeat(70_000)))
        .send()
        .await
        .expect("response");
    assert_eq!(huge.status(), 413);
    for query in ["limit=0", "limit=1001", "limit=x", "page=2"] {
        let (status, v) =
            admin(&client, "GET", server.url(&format!("/v1/overrides/api?{query}")), Some("t"), None).await;
        assert_eq!((status, &v["error"]["code"]), (400, &json!("invalid_query")), "{query}");
    }

    // At most max_overrides keys; replacing one takes no room.
    for key in ["a", "b"] {
        assert_eq!(put(&client, &server, &format!("api/{key}"), json!({"limit": 5})).await.0, 200);
    }
    let (status, v) = put(&client, &server, "api/c", json!({"limit": 5})).await;
    assert_eq!((status, &v["error"]["code"]), (409, &json!("too_many_overrides")), "{v}");
    assert_eq!(put(&client, &server, "api/a", json!({"limit": 6})).await.0, 200);
    assert_eq!(limit_of(&client, &server, "c").await, 2, "the refused override changed nothing");
}

#[tokio::test]
async fn on_the_memory_backend_an_override_is_the_instances_own_and_lapses_after_its_ttl() {
    let rules = RulesFile::new(RULES);
    let (a, b) = (Slidegate::serve(&["--config", rules.arg()]), Slidegate::serve(&["--config", rules.arg()]));
    let client = Client::new();
    let (status, v) = put(&client, &a, "api/k", json!({"limit": 9, "ttl": "1s"})).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["override"]["expires_at_ms"].as_u64() > v["override"]["set_at_ms"].as_u64(), "{v}");
    assert_eq!((limit_of(&client, &a, "k").await, limit_of(&client, &b, "k").await), (9, 2));
    let started = Instant::now();
    while limit_of(&client, &a, "k").await != 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "the override did not lapse");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The sweep removes it within a second more, and records it.
    while metric(&client, &a, "slidegate_override_changes_total{action=\"lapse\"}").await != 1.0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the lapse was not recorded: {}", a.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, list) = admin(&client, "GET", a.url("/v1/overrides/api"), Some("t"), None).await;
    assert_eq!(list["total"], 0, "{list}");
}

/// Besides `user` ([`USER_EDGE`]), a descriptor without a limit to change.
const OPEN: &str = "  - key: open
    rate_limit:
      unlimited: true
";

async fn should_rate_limit(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    user: &str,
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "user".into(), value: user.into() }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    client.should_rate_limit(request).await.expect("an answer").into_inner()
}

#[tokio::test]
async fn an_override_for_an_envoy_descriptor_changes_its_limit_over_grpc() {
    let dir = std::env::temp_dir().join(format!(
        "slidegate-ov-envoy-{}-{}",
        std::process::id(),
        slidegate_testkit::free_port()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("edge.yaml"), format!("{USER_EDGE}{OPEN}")).expect("write");
    let rules = RulesFile::new("admin_token = \"t\"\n");
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let server =
        Slidegate::serve(&["--config", rules.arg(), "--grpc", &grpc, "--envoy-config", dir.to_str().expect("utf-8")]);
    let mut envoy = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
    let client = Client::new();

    let (status, v) = put(&client, &server, "envoy:edge/user=alice", json!({"limit": 4})).await;
    assert_eq!(status, 200, "{v}");
    let mut codes = Vec::new();
    for _ in 0..5 {
        let answer = should_rate_limit(&mut envoy, "alice").await;
        assert_eq!(answer.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(4), "{answer:?}");
        codes.push(answer.overall_code);
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::Ok, Code::OverLimit].map(|c| c as i32));
    let mut bob = Vec::new();
    for _ in 0..3 {
        bob.push(should_rate_limit(&mut envoy, "bob").await.overall_code);
    }
    assert_eq!(bob, [Code::Ok, Code::Ok, Code::OverLimit].map(|c| c as i32), "bob keeps the configured 2");

    let (_, v) = admin(&client, "GET", server.url("/v1/keys/envoy:edge/user=alice"), Some("t"), None).await;
    assert_eq!((&v["source"], &v["limit"], &v["count"]), (&json!("override"), &json!(4), &json!(4)), "{v}");
    let (_, v) = admin(&client, "GET", server.url("/v1/keys/envoy:edge/user=bob"), Some("t"), None).await;
    assert_eq!((&v["source"], &v["limit"]), (&json!("descriptor"), &json!(2)), "{v}");
    let (status, v) = put(&client, &server, "envoy:edge/user=alice", json!({"limit": 4, "window": "1h"})).await;
    assert_eq!((status, &v["error"]["code"]), (400, &json!("invalid_override")));
    let (status, v) = put(&client, &server, "envoy:edge/open=x", json!({"limit": 4})).await;
    assert_eq!((status, &v["error"]["code"]), (400, &json!("no_quota")));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
