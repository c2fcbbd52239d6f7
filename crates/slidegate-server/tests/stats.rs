//! `/v1/stats`, `/ui` and the dashboard's additions to `/v1/rules` and `/v1/keys` on the real
//! binary: the answer's shape and bounds, `[ui] enabled` and `[ui] require_token`.

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use support::{RulesFile, Slidegate, check};

const RULES: &str = r#"
admin_token = "t0ken"

[[rules]]
name = "sms"
limit = 5
window = "60s"

[[rules]]
name = "one"
limit = 1
window = "1h"
failure_policy = "fail_closed"
"#;

async fn get(client: &reqwest::Client, server: &Slidegate, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = client.get(server.url(path));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn sum(v: &Value) -> u64 {
    v.as_array().expect("a series").iter().map(|n| n.as_u64().expect("a count")).sum()
}

#[tokio::test]
async fn stats_show_each_rules_traffic_latency_and_top_denied_keys() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    for (key, n) in [("alice", 12), ("bob", 7), ("carol", 2)] {
        for _ in 0..n {
            check(&client, &server, &json!({"rule": "sms", "key": key})).await;
        }
    }
    check(&client, &server, &json!({"key": "k", "limit": 5, "window": "1s"})).await;

    let (status, stats) = get(&client, &server, "/v1/stats", None).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!((stats["slots"].as_u64(), stats["slot_ms"].as_u64()), (Some(90), Some(10_000)));
    assert_eq!(stats["admin_enabled"], true);
    let names: Vec<&str> =
        stats["rules"].as_array().expect("rules").iter().filter_map(|r| r["rule"].as_str()).collect();
    assert_eq!(names, ["inline", "one", "sms"], "every rule, and inline checks");
    let sms = &stats["rules"][2];
    for series in ["allowed", "denied", "degraded"] {
        assert_eq!(sms[series].as_array().map(Vec::len), Some(90), "{series}");
    }
    assert_eq!((sum(&sms["allowed"]), sum(&sms["denied"]), sum(&sms["degraded"])), (5 + 5 + 2, 7 + 2, 0));
    assert!(sms["latency_us"]["p50"].as_u64() <= sms["latency_us"]["p99"].as_u64(), "{sms}");
    let top = &sms["top_denied"];
    assert_eq!(top["denials"], 9);
    assert_eq!(top["keys"][0], json!({"key": "alice", "count": 7, "error": 0, "share": 7.0 / 9.0}));
    assert_eq!(top["keys"][1]["key"], "bob");
    assert_eq!(top["keys"].as_array().map(Vec::len), Some(2), "carol was never denied");
    assert_eq!(sum(&stats["totals"]["allowed"]), 12 + 1);
    let backend = &stats["backend"];
    assert_eq!((backend["kind"].as_str(), backend["engine"].as_str()), (Some("memory"), Some("memory")));
    assert_eq!((backend["reachable"].as_bool(), backend["circuit_open"].as_bool()), (Some(true), Some(false)));
    assert_eq!(backend["near_cache"], Value::Null, "the memory backend has none");
    assert_eq!(stats["envoy"], json!([]));
}

#[tokio::test]
async fn rules_and_keys_answer_what_the_dashboard_draws() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let (_, listed) = get(&client, &server, "/v1/rules", None).await;
    assert_eq!(listed["rules"][0]["failure_policy"], "fail_closed", "{listed}");
    assert_eq!(listed["rules"][1]["failure_policy"], Value::Null);
    assert_eq!(listed["inline"]["max_limit"], 10_000);
    assert_eq!(listed["envoy"], json!({"domains": [], "limits": []}));

    for _ in 0..3 {
        check(&client, &server, &json!({"rule": "sms", "key": "dave"})).await;
    }
    let (status, key) = get(&client, &server, "/v1/keys/sms/dave", Some("t0ken")).await;
    assert_eq!(status, 200, "{key}");
    let times: Vec<u64> = serde_json::from_value(key["admissions_ms"].clone()).expect("admission times");
    assert_eq!(times.len(), 3, "{key}");
    assert!(times.is_sorted() && times[0] == key["oldest_ms"].as_u64().expect("oldest"), "{key}");
    let now = key["now_ms"].as_u64().expect("now");
    assert!(times.iter().all(|&t| t <= now + 1_000 && t + 60_000 > now), "{times:?} at {now}");
    assert_eq!((key["algorithm"].as_str(), key["window_ms"].as_u64()), (Some("sliding_log"), Some(60_000)));
}

#[tokio::test]
async fn the_page_is_served_with_its_assets_and_a_strict_policy() {
    let server = Slidegate::serve(&[]);
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let root = client.get(server.url("/")).send().await.expect("/");
    assert_eq!((root.status().as_u16(), root.headers()["location"].to_str().ok()), (303, Some("/ui")));
    for (path, kind, marker) in [
        ("/ui", "text/html", "<script src=\"/ui/app.js\""),
        ("/ui/app.js", "text/javascript", "slidegateErrors"),
        ("/ui/app.css", "text/css", "color-scheme: dark"),
    ] {
        let response = client.get(server.url(path)).send().await.expect(path);
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert!(headers["content-type"].to_str().expect("ascii").starts_with(kind), "{path}");
        let policy = headers["content-security-policy"].to_str().expect("ascii");
        assert!(policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"), "{policy}");
        let body = response.text().await.expect("body");
        assert!(body.contains(marker), "{path}");
        // No address but SVG's namespace name, which is never fetched.
        let addresses = body.replace("http://www.w3.org/2000/svg", "");
        assert!(!addresses.contains("http://") && !addresses.contains("https://"), "{path} fetches nothing");
    }
}

#[tokio::test]
async fn reading_stats_follows_ui_enabled_and_require_token_across_reloads() {
    let rules = RulesFile::new(&format!("{RULES}\n[ui]\nrequire_token = true\n"));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let (status, body) = get(&client, &server, "/v1/stats", None).await;
    assert_eq!((status, &body["error"]["code"]), (401, &json!("unauthorized")), "{body}");
    assert_eq!(get(&client, &server, "/v1/stats", Some("wrong")).await.0, 401);
    assert_eq!(get(&client, &server, "/v1/stats", Some("t0ken")).await.0, 200);
    assert_eq!(get(&client, &server, "/ui", None).await.0, 200, "the page holds no data; it asks for the token");

    rules.write(&format!("{RULES}\n[ui]\nenabled = false\n"));
    let disabled = wait_for(async || get(&client, &server, "/v1/stats", Some("t0ken")).await.0 == 403).await;
    assert!(disabled, "the reload disables the dashboard");
    let (_, body) = get(&client, &server, "/v1/stats", None).await;
    assert_eq!(body["error"]["code"], "ui_disabled");
    assert_eq!(get(&client, &server, "/ui", None).await.0, 403);
    // Disabled: nothing is recorded, and what was is forgotten.
    check(&client, &server, &json!({"rule": "one", "key": "x"})).await;
    check(&client, &server, &json!({"rule": "one", "key": "x"})).await;
    rules.write(RULES);
    assert!(wait_for(async || get(&client, &server, "/v1/stats", None).await.0 == 200).await);
    let (_, stats) = get(&client, &server, "/v1/stats", None).await;
    let one = &stats["rules"][1];
    assert_eq!((sum(&one["allowed"]), sum(&one["denied"]), &one["top_denied"]["denials"]), (0, 0, &json!(0)), "{one}");
}

#[tokio::test]
async fn envoy_domains_show_their_traffic_top_descriptors_and_limits() {
    let grpc = slidegate_testkit::free_port();
    let fixtures = format!("{}/tests/fixtures/envoy", env!("CARGO_MANIFEST_DIR"));
    let server = Slidegate::serve(&["--grpc", &format!("127.0.0.1:{grpc}"), "--envoy-config", &fixtures]);
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await.expect("connect");
    // Marketing messages to one number: 5 a day, then denied.
    for _ in 0..8 {
        let entries = [("message_type", "marketing"), ("to_number", "2061234567")]
            .map(|(key, value)| Entry { key: key.into(), value: value.into() });
        let descriptors = vec![RateLimitDescriptor { entries: entries.into(), ..RateLimitDescriptor::default() }];
        let request = RateLimitRequest { domain: "messaging".into(), descriptors, hits_addend: 0 };
        client.should_rate_limit(request).await.expect("answer");
    }
    let http = reqwest::Client::new();
    let (_, stats) = get(&http, &server, "/v1/stats", None).await;
    let domains = stats["envoy"].as_array().expect("domains");
    let messaging = domains.iter().find(|d| d["domain"] == "messaging").expect("the fixture's domain");
    assert_eq!((sum(&messaging["allowed"]), sum(&messaging["denied"])), (5, 3));
    let top = &messaging["top_denied"]["keys"][0];
    assert_eq!((top["key"].as_str(), &top["count"]), (Some("message_type=marketing,to_number=2061234567"), &json!(3)));
    let (_, rules) = get(&http, &server, "/v1/rules", None).await;
    assert!(rules["envoy"]["domains"].as_array().expect("domains").contains(&json!("messaging")), "{rules}");
    let limits: Vec<&Value> =
        rules["envoy"]["limits"].as_array().expect("limits").iter().filter(|l| l["domain"] == "messaging").collect();
    let paths: Vec<&str> = limits.iter().filter_map(|l| l["descriptor"].as_str()).collect();
    assert_eq!(paths, ["message_type_marketing.to_number", "to_number"]);
    assert_eq!((&limits[0]["unit"], &limits[0]["requests_per_unit"]), (&json!("day"), &json!(5)));
}

#[test]
fn require_token_without_an_admin_token_stops_the_start() {
    let rules = RulesFile::new("[ui]\nrequire_token = true\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["serve", "--http", "127.0.0.1:0", "--config", rules.arg()])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("ui.require_token: needs admin_token"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_stays_bounded_under_a_flood_of_long_distinct_keys() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    // 300 keys of about 200 bytes, each denied once, many of their characters ones JSON must
    // escape; sent by 10 clients at once.
    let flood = (0..10).map(|worker| {
        let client = client.clone();
        let url = server.url("/v1/check");
        async move {
            for i in (worker..300).step_by(10) {
                let key: String = format!("{i:03}{}", "\u{1}\"\\é".repeat(127)).chars().take(170).collect();
                for _ in 0..2 {
                    let response = client.post(&url).json(&json!({"rule": "one", "key": key})).send().await;
                    assert_eq!(response.expect("check").status(), 200);
                }
            }
        }
    });
    futures_join(flood).await;
    let response = client.get(server.url("/v1/stats")).send().await.expect("stats");
    let text = response.text().await.expect("body");
    let stats: Value = serde_json::from_str(&text).expect("JSON");
    let one = &stats["rules"][1];
    assert_eq!(one["top_denied"]["denials"], 300);
    let keys = one["top_denied"]["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 20, "the top 20 only");
    assert!(keys.iter().all(|k| k["key"].as_str().is_some_and(|k| k.len() <= 128 && k.ends_with('…'))));
    // Per rule: 3 × 90 counts and 20 keys of at most 128 bytes, each byte at most 6 escaped;
    // three rules (inline checks count as one).
    let per_rule = 3 * (90 * 21 + 200) + 20 * (128 * 6 + 120) + 2_000;
    assert!(text.len() < 3 * per_rule + 4_000, "{} bytes", text.len());
}

async fn futures_join<F: Future<Output = ()> + Send + 'static>(futures: impl Iterator<Item = F>) {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    for h in handles {
        h.await.expect("task");
    }
}

/// Whether `condition` holds within 10 s (the rules file is watched every 250 ms).
async fn wait_for(condition: impl AsyncFn() -> bool) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(10) {
        if condition().await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}
