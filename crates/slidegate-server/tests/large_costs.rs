//! Large sliding-log costs (token limits: thousands of permits per call) through the real
//! binary, on every engine: decided exactly where the engine records any cost the limit admits
//! (memory, the Redis module), and refused as the caller's error, naming the bound, where it
//! does not (Redis' Lua engine: 256 permits per call) — never an admission, never a 500, never
//! an Envoy OK with nothing counted.

mod support;

use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::envoy::{Envoy, OK, OVER, codes};
use support::{RulesFile, Slidegate, check};

const RULES: &str = r#"admin_token = "t"

[[rules]]
name = "tokens"
limit = 100000
window = "60s"

[[rules]]
name = "small"
limit = 10
window = "60s"
"#;

const LLM: &str = "
domain: llm
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 100000
  - key: team
    rate_limit: { unit: minute, requests_per_unit: 100000, algorithm: sliding_window }
";

/// A server with the rules above, `backend` as its `[backend]` section's lines, and the Envoy
/// domain `llm` on gRPC (the rules file lives as long as the server).
async fn serve(backend: &str) -> (Envoy, RulesFile) {
    let rules = RulesFile::new(&format!("{RULES}\n[backend]\n{backend}"));
    (Envoy::start(&[("llm.yaml", LLM)], &["--config", rules.arg()]).await, rules)
}

async fn key_count(client: &Client, server: &Slidegate, path: &str) -> u64 {
    let v: Value = client
        .get(server.url(&format!("/v1/keys/{path}")))
        .bearer_auth("t")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    v["count"].as_u64().unwrap_or_else(|| panic!("no count: {v}"))
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

    let group = json!({"checks": [{"rule": "tokens", "key": "g1", "cost": 30_000},
                                  {"rule": "tokens", "key": "g2", "cost": 30_000}]});
    let (status, _, v) = check(&client, server, &group).await;
    assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{v}");
    assert_eq!((&v["results"][0]["remaining"], &v["results"][1]["remaining"]), (&json!(70_000), &json!(70_000)));
    assert_eq!(key_count(&client, server, "tokens/g2").await, 30_000);

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

/// The attack on main: cost 50,000 on the Lua engine answered a 500 with Redis' own error text
/// (or, past the deadline, an admission under fail_open with nothing recorded), and Envoy's
/// hits_addend 50,000 answered OK with nothing counted. Now each surface refuses it before
/// anything is sent — 400 `cost_too_large` naming the bound, Envoy OVER_LIMIT (Envoy lets
/// through a request whose descriptor is not decided) — and costs within the bound still count.
#[tokio::test]
async fn a_cost_past_the_lua_engines_bound_is_refused_naming_it_never_admitted() {
    let redis = RedisServer::start();
    let backend = format!("redis = \"{}\"\ntimeout = \"10s\"\nfailure_policy = \"fail_open\"\n", redis.url());
    let (mut envoy, _rules) = serve(&backend).await;
    let (client, server) = (Client::new(), &envoy.server);
    put_override(&client, server, "small/o", 100_000).await;
    let refused = [
        json!({"rule": "tokens", "key": "k", "cost": 50_000}),
        json!({"checks": [{"rule": "tokens", "key": "g1", "cost": 200}, {"rule": "tokens", "key": "g2", "cost": 200}]}),
        json!({"rule": "small", "key": "o", "cost": 40_000}),
    ];
    for body in &refused {
        let (status, _, v) = check(&client, server, body).await;
        assert_eq!((status, &v["error"]["code"]), (400, &json!("cost_too_large")), "{body}: {v}");
        let message = v["error"]["message"].as_str().expect("a message");
        assert!(message.contains("max = 256") && !message.contains("user_script"), "{message}");
    }
    for key in ["tokens/k", "tokens/g1", "small/o"] {
        assert_eq!(key_count(&client, server, key).await, 0, "{key}: nothing recorded");
    }
    let (_, _, v) = check(&client, server, &json!({"rule": "tokens", "key": "k", "cost": 256})).await;
    assert_eq!((&v["allowed"], &v["remaining"], &v["engine"]), (&json!(true), &json!(99_744), &json!("lua")), "{v}");

    for _ in 0..2 {
        let r = envoy.ask("llm", &[&[("user", "alice")]], 50_000).await;
        assert_eq!(codes(&r), (OVER, vec![OVER]), "never OK: {r:?}");
    }
    assert_eq!(key_count(&client, &envoy.server, "envoy:llm/user=alice").await, 0);
    let r = envoy.ask("llm", &[&[("user", "alice")]], 200).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK]), 99_800));
    // docs/envoy.md's advice for token limits on plain Redis: the sliding window counter.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(codes(&envoy.ask("llm", &[&[("team", "a")]], 50_000).await).0);
    }
    assert_eq!(answers, [OK, OK, OVER]);
    // Two descriptors summing past one call's bound: decided one by one, each counted.
    let r = envoy.ask("llm", &[&[("user", "bob")], &[("user", "carol")]], 200).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]), "{r:?}");
    assert_eq!(key_count(&client, &envoy.server, "envoy:llm/user=carol").await, 200);
}
