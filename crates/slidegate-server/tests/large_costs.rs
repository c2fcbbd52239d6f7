//! Large sliding-log costs (token limits: thousands of permits per call) through the real
//! binary, decided exactly on every engine — memory, Redis' Lua scripts (counted entries for
//! limits above 256), the Redis module, Redis Cluster: what fits is admitted and recorded in
//! full, one permit more is denied, under concurrency too, and a limit lowered under a key's
//! counted entries admits nothing they already fill.

mod support;

use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::{RedisCluster, RedisServer};
use support::envoy::{Envoy, OK, OVER, codes};
use support::{RulesFile, Slidegate, check, key_count};

const RULES: &str = r#"admin_token = "t"

[[rules]]
name = "tokens"
limit = 100000
window = "60s"

[[rules]]
name = "tokens2"
limit = 100000
window = "60s"

[[rules]]
name = "small"
limit = 10
window = "60s"

[[rules]]
name = "mid"
limit = 1000
window = "60s"
"#;

/// The Envoy domain `llm`: docs/envoy.md's token-limit descriptor.
fn llm_domain() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/envoy.md")).expect("envoy.md");
    let section = &doc[doc.find("**Token limits**").expect("the token limits section")..];
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).expect("its YAML block");
    format!("domain: llm\ndescriptors:\n{block}")
}

/// A server with the rules above, `backend` as its `[backend]` section's lines, and the Envoy
/// domain `llm` on gRPC (the rules file lives as long as the server).
async fn serve(backend: &str) -> (Envoy, RulesFile) {
    let rules = RulesFile::new(&format!("{RULES}\n[backend]\n{backend}"));
    (Envoy::start(&[("llm.yaml", &llm_domain())], &["--config", rules.arg()]).await, rules)
}

async fn put_override(client: &Client, server: &Slidegate, path: &str, limit: u64) {
    let response = client
        .put(server.url(&format!("/v1/overrides/{path}")))
        .bearer_auth("t")
        .json(&json!({ "limit": limit }))
        .send()
        .await
        .expect("put");
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
}

/// Cost 50,000 twice on 100,000 per minute, the third denied until the first leaves; a group
/// of two 30,000s; an override of 100,000 taking 40,000; Envoy's hits_addend 50,000 OK, OK,
/// OVER_LIMIT — each recorded in full.
async fn large_costs_are_decided_exactly(backend: &str, engine: &str) {
    let (mut envoy, _rules) = serve(backend).await;
    let (client, server) = (Client::new(), &envoy.server);
    let body = json!({"rule": "tokens", "key": "k", "cost": 50_000});
    let sent = Instant::now();
    let (status, _, first) = check(&client, server, &body).await;
    assert_eq!((status, &first["allowed"], &first["remaining"]), (200, &json!(true), &json!(50_000)), "{first}");
    assert_eq!(first["engine"], engine, "{first}");
    // Apart in time, so that the denial's wait tells the first admission from the second.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, _, second) = check(&client, server, &body).await;
    assert_eq!((&second["allowed"], &second["remaining"]), (&json!(true), &json!(0)), "{second}");
    let (_, _, third) = check(&client, server, &body).await;
    let waited = u64::try_from(sent.elapsed().as_millis()).expect("ms");
    assert_eq!(third["allowed"], false, "{third}");
    let retry = third["retry_after_ms"].as_u64().expect("a denial's wait");
    assert!(retry <= 60_000 - 500 && retry + waited >= 60_000, "waits for the first to leave: {retry} ms, {third}");
    assert_eq!(key_count(&client, server, "tokens/k").await, 100_000);

    // Two rules on one key: one hash tag, so one atomic group on a cluster too.
    let group = json!({"checks": [{"rule": "tokens", "key": "g", "cost": 30_000},
                                  {"rule": "tokens2", "key": "g", "cost": 30_000}]});
    let (status, _, v) = check(&client, server, &group).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    assert_eq!((&v["results"][0]["remaining"], &v["results"][1]["remaining"]), (&json!(70_000), &json!(70_000)));
    let group = json!({"checks": [{"rule": "tokens", "key": "g", "cost": 70_000},
                                  {"rule": "tokens2", "key": "g", "cost": 70_001}]});
    let (_, _, v) = check(&client, server, &group).await;
    assert_eq!((&v["allowed"], &v["denied_by"]), (&json!(false), &json!(1)), "{v}");
    assert_eq!(key_count(&client, server, "tokens/g").await, 30_000, "a denied group charges nothing");
    assert_eq!(key_count(&client, server, "tokens2/g").await, 30_000);

    put_override(&client, server, "small/o", 100_000).await;
    let (status, _, v) = check(&client, server, &json!({"rule": "small", "key": "o", "cost": 40_000})).await;
    assert_eq!((status, &v["allowed"], &v["remaining"]), (200, &json!(true), &json!(60_000)), "{v}");

    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = envoy.ask("llm", &[&[("user", "alice")]], 50_000).await;
        answers.push(codes(&r).0);
    }
    assert_eq!(answers, [OK, OK, OVER]);
    assert_eq!(key_count(&client, &envoy.server, "envoy:llm/user=alice").await, 100_000);
}

#[tokio::test]
async fn large_costs_are_decided_exactly_in_memory() {
    large_costs_are_decided_exactly("", "memory").await;
}

#[tokio::test]
async fn large_costs_are_decided_exactly_by_the_redis_module() {
    let redis = RedisServer::start_with_module(&[]);
    let backend = format!("redis = \"{}\"\ntimeout = \"10s\"\nengine = \"module\"\n", redis.url());
    large_costs_are_decided_exactly(&backend, "module").await;
}

#[tokio::test]
async fn large_costs_are_decided_exactly_by_the_lua_scripts() {
    let redis = RedisServer::start();
    let backend = format!("redis = \"{}\"\ntimeout = \"10s\"\nfailure_policy = \"fail_open\"\n", redis.url());
    large_costs_are_decided_exactly(&backend, "lua").await;
}

#[tokio::test]
async fn large_costs_are_decided_exactly_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let backend = format!("redis_cluster = {:?}\ntimeout = \"10s\"\n", cluster.urls());
    large_costs_are_decided_exactly(&backend, "lua").await;
}

/// 64 calls at once of 3,000 each on 100,000 per minute: exactly 33 admitted (99,000, the
/// largest multiple that fits), recorded in full.
async fn concurrent_large_costs_admit_exactly_what_fits(backend: &str) {
    let (envoy, _rules) = serve(backend).await;
    let client = Client::new();
    let server = &envoy.server;
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let request = client.post(server.url("/v1/check")).json(&json!({"rule": "tokens", "key": "c", "cost": 3_000}));
        calls.spawn(async move {
            let response = request.send().await.expect("request");
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.expect("json")["allowed"] == json!(true)
        });
    }
    let admitted = calls.join_all().await.into_iter().filter(|&allowed| allowed).count();
    assert_eq!(admitted, 33);
    assert_eq!(key_count(&client, server, "tokens/c").await, 99_000);
}

/// A key's entries outlive a change of its limit. Counted entries (cost 300 of 1,000), then an
/// override of 100: the one-key script for small limits and the group script must read them as
/// 300 permits, and admit nothing. Per-permit members (10 of 10), then an override of 1,000:
/// rewritten as counted entries in the call that adds 500.
async fn a_changed_limit_reads_the_keys_entries_as_they_are(backend: &str) {
    let (envoy, _rules) = serve(backend).await;
    let client = Client::new();
    let server = &envoy.server;
    let (_, _, v) = check(&client, server, &json!({"rule": "mid", "key": "x", "cost": 300})).await;
    assert_eq!((&v["allowed"], &v["remaining"]), (&json!(true), &json!(700)), "{v}");
    put_override(&client, server, "mid/x", 100).await;
    for cost in [1, 50] {
        let (_, _, v) = check(&client, server, &json!({"rule": "mid", "key": "x", "cost": cost})).await;
        assert_eq!((&v["allowed"], &v["remaining"], &v["limit"]), (&json!(false), &json!(0), &json!(100)), "{v}");
    }
    let group = json!({"checks": [{"rule": "tokens", "key": "x"}, {"rule": "mid", "key": "x"}]});
    let (_, _, v) = check(&client, server, &group).await;
    assert_eq!((&v["allowed"], &v["denied_by"]), (&json!(false), &json!(1)), "{v}");
    assert_eq!(key_count(&client, server, "mid/x").await, 300);

    for _ in 0..10 {
        let (_, _, v) = check(&client, server, &json!({"rule": "small", "key": "p"})).await;
        assert_eq!(v["allowed"], true, "{v}");
    }
    put_override(&client, server, "small/p", 1_000).await;
    let (_, _, v) = check(&client, server, &json!({"rule": "small", "key": "p", "cost": 500})).await;
    assert_eq!((&v["allowed"], &v["remaining"]), (&json!(true), &json!(490)), "{v}");
    let (_, _, v) = check(&client, server, &json!({"rule": "small", "key": "p", "cost": 491})).await;
    assert_eq!((&v["allowed"], &v["remaining"]), (&json!(false), &json!(490)), "{v}");
    assert_eq!(key_count(&client, server, "small/p").await, 510);
}

#[tokio::test]
async fn concurrency_and_changed_limits_in_memory() {
    concurrent_large_costs_admit_exactly_what_fits("").await;
    a_changed_limit_reads_the_keys_entries_as_they_are("").await;
}

#[tokio::test]
async fn concurrency_and_changed_limits_on_the_lua_scripts() {
    let redis = RedisServer::start();
    let backend = format!("redis = \"{}\"\ntimeout = \"10s\"\n", redis.url());
    concurrent_large_costs_admit_exactly_what_fits(&backend).await;
    a_changed_limit_reads_the_keys_entries_as_they_are(&backend).await;
}

#[tokio::test]
async fn concurrency_and_changed_limits_on_the_redis_module() {
    let redis = RedisServer::start_with_module(&[]);
    let backend = format!("redis = \"{}\"\ntimeout = \"10s\"\nengine = \"module\"\n", redis.url());
    concurrent_large_costs_admit_exactly_what_fits(&backend).await;
    a_changed_limit_reads_the_keys_entries_as_they_are(&backend).await;
}

#[tokio::test]
async fn concurrency_and_changed_limits_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let backend = format!("redis_cluster = {:?}\ntimeout = \"10s\"\n", cluster.urls());
    concurrent_large_costs_admit_exactly_what_fits(&backend).await;
    a_changed_limit_reads_the_keys_entries_as_they_are(&backend).await;
}
