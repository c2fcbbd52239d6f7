//! `/metrics` of the real binary after every kind of event the service counts: each family
//! follows one naming scheme.

mod support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;
use slidegate_server::envoy::MAX_ENTRIES;
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate, check, metric};

const MESSAGING: &str = include_str!("fixtures/envoy/messaging.yaml");

/// The families upstream-compatible dashboards read, named as envoyproxy/ratelimit names them:
/// the one exception to the scheme.
const UPSTREAM_PREFIX: &str = "ratelimit_service_";

/// Each `# TYPE` line's family and kind.
fn families(page: &str) -> Vec<(&str, &str)> {
    page.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_once(' ')).collect()
}

/// What is wrong with a family's name, if anything: `slidegate_` and snake case; counters end
/// in `_total`, and nothing else does; distributions are durations, in `_seconds`.
fn misnamed(name: &str, kind: &str) -> Option<String> {
    if name.starts_with(UPSTREAM_PREFIX) {
        return None;
    }
    let problem = if !name.starts_with("slidegate_") {
        "does not start with slidegate_"
    } else if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        "is not snake case"
    } else if kind == "counter" && !name.ends_with("_total") {
        "is a counter without _total"
    } else if kind != "counter" && name.ends_with("_total") {
        "ends in _total but is no counter"
    } else if matches!(kind, "histogram" | "summary") && !name.ends_with("_seconds") {
        "is a distribution not in _seconds"
    } else {
        return None;
    };
    Some(format!("{name} ({kind}) {problem}"))
}

#[test]
fn the_naming_rule_catches_what_it_names() {
    assert_eq!(misnamed("slidegate_decisions_total", "counter"), None);
    assert_eq!(misnamed("slidegate_backend_call_seconds", "histogram"), None);
    assert_eq!(misnamed("ratelimit_service_rate_limit_total_hits", "counter"), None);
    for (name, kind) in [
        ("slidegate_envoy_total_hits", "counter"),
        ("slidegate_rules_total", "gauge"),
        ("slidegate_latency", "summary"),
        ("rate_limit_pass", "counter"),
        ("slidegate_Decisions_total", "counter"),
    ] {
        assert!(misnamed(name, kind).is_some(), "{name} {kind}");
    }
}

#[tokio::test]
async fn every_metric_family_follows_the_naming_scheme() {
    let mut redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        "admin_token = \"t\"\n[backend]\nredis = {:?}\n\n[[rules]]\nname = \"sms\"\nlimit = 1\nwindow = \"60s\"\n",
        redis.url()
    ));
    let dir = std::env::temp_dir().join(format!("slidegate-metrics-{}", slidegate_testkit::free_port()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("messaging.yaml"), MESSAGING).expect("write");
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let server =
        Slidegate::serve(&["--config", rules.arg(), "--grpc", &grpc, "--envoy-config", dir.to_str().expect("utf-8")]);
    let client = reqwest::Client::new();

    // Decisions, admitted and denied; the read-only routes.
    for _ in 0..2 {
        check(&client, &server, &json!({"rule": "sms", "key": "k"})).await;
    }
    for route in ["/v1/rules", "/readyz", "/healthz"] {
        client.get(server.url(route)).send().await.expect(route);
    }
    // Envoy: a hit, and a descriptor refused for its size.
    let mut envoy = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
    let descriptor = |entries: Vec<Entry>| RateLimitDescriptor { entries, ..RateLimitDescriptor::default() };
    let number = descriptor(vec![Entry { key: "to_number".into(), value: "1".into() }]);
    let oversized = descriptor(vec![Entry { key: "k".into(), value: "v".into() }; MAX_ENTRIES + 1]);
    let request = RateLimitRequest { domain: "messaging".into(), descriptors: vec![number, oversized], hits_addend: 1 };
    envoy.should_rate_limit(request).await.expect("answer");
    // A reload refused.
    rules.write("[[rules]]\nname = \"sms\"\nlimit = 0\nwindow = \"60s\"\n");
    let started = Instant::now();
    while metric(&client, &server, "slidegate_config_reloads_total{result=\"failed\",file=\"rules\"}").await < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the broken file was never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Redis gone: a degraded decision, a backend error.
    redis.kill();
    check(&client, &server, &json!({"rule": "sms", "key": "other"})).await;
    let inspect = client.get(server.url("/v1/keys/sms/k")).bearer_auth("t").send().await.expect("inspect");
    assert_eq!(inspect.status(), 503);

    let page = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let families = families(&page);
    let problems: Vec<String> = families.iter().filter_map(|(name, kind)| misnamed(name, kind)).collect();
    assert!(problems.is_empty(), "{problems:#?}\n{page}");
    // Every family the events above make was there to be checked.
    for expected in [
        "slidegate_decisions_total",
        "slidegate_degraded_decisions_total",
        "slidegate_backend_errors_total",
        "slidegate_backend_call_seconds",
        "slidegate_http_request_seconds",
        "slidegate_http_connections",
        "slidegate_rules",
        "slidegate_config_reloads_total",
        "slidegate_circuit_open",
        "slidegate_engine",
        "slidegate_near_cache_keys",
        "ratelimit_service_rate_limit_total_hits",
        "ratelimit_service_rate_limit_within_limit",
        "slidegate_envoy_invalid_descriptors_total",
    ] {
        assert!(families.iter().any(|(name, _)| *name == expected), "{expected} missing:\n{page}");
    }
    let content_type =
        client.get(server.url("/metrics")).send().await.expect("metrics").headers()["content-type"].clone();
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rules file of `count` rules named `<prefix><i>`.
fn named_rules(prefix: &str, count: usize) -> String {
    (0..count).map(|i| format!("[[rules]]\nname = \"{prefix}{i}\"\nlimit = 5\nwindow = \"1m\"\n\n")).collect()
}

/// The `slidegate_decisions_total` series of `/metrics`, and whether any names a rule of `prefix`.
async fn decision_series(client: &reqwest::Client, server: &Slidegate, prefix: &str) -> (usize, bool) {
    let page = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let series: Vec<&str> = page.lines().filter(|l| l.starts_with("slidegate_decisions_total{")).collect();
    (series.len(), series.iter().any(|l| l.contains(&format!("rule=\"{prefix}"))))
}

/// Waits (at most 5 s) until `/metrics` has `want` decision series and none of a rule of `gone`.
async fn until_series(client: &reqwest::Client, server: &Slidegate, want: usize, gone: &str) {
    let started = Instant::now();
    loop {
        let now = decision_series(client, server, gone).await;
        if now == (want, false) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{now:?}, want ({want}, false): {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_rule_or_domain_leaves_metrics_and_stats_on_reload() {
    let dir = support::envoy::Dir::with(&[("edge.yaml", &MESSAGING.replace("messaging", "edge"))]);
    let rules = RulesFile::new(&named_rules("old", 100));
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let server = Slidegate::serve(&["--config", rules.arg(), "--envoy-config", dir.arg(), "--grpc", &grpc]);
    let client = reqwest::Client::new();
    let mut envoy = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: "to_number".into(), value: "1".into() }],
        ..RateLimitDescriptor::default()
    };
    let request = |domain: &str| RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor.clone()],
        hits_addend: 1,
    };
    envoy.should_rate_limit(request("edge")).await.expect("decided");
    // A repeated descriptor is refused, and counted under its domain.
    let mut repeated = request("edge");
    repeated.descriptors.push(descriptor.clone());
    envoy.should_rate_limit(repeated).await.expect("decided");
    let refused = r#"slidegate_envoy_invalid_descriptors_total{domain="edge",reason="duplicate"}"#;
    assert_eq!(metric(&client, &server, refused).await, 1.0);
    check(&client, &server, &json!({"rule": "old7", "key": "k"})).await;
    // Allowed and denied for each rule and for inline checks.
    assert_eq!(decision_series(&client, &server, "old").await, (202, true));
    assert!(metric(&client, &server, r#"ratelimit_service_rate_limit_total_hits{domain="edge""#).await >= 1.0);

    // Every rule renamed, the domain renamed.
    rules.write(&named_rules("new", 100));
    std::fs::write(dir.0.join("edge.yaml"), MESSAGING.replace("messaging", "core")).expect("write");
    until_series(&client, &server, 202, "old").await;
    let started = Instant::now();
    let core = r#"ratelimit_service_rate_limit_total_hits{domain="core",key1="to_number"}"#;
    while metric(&client, &server, core).await < 1.0 {
        envoy.should_rate_limit(request("core")).await.expect("decided");
        assert!(started.elapsed() < Duration::from_secs(5), "domain core not in force: {}", server.log_text());
    }
    let page = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let mut upstream = page.lines().filter(|l| l.starts_with("ratelimit_service_rate_limit_"));
    assert!(upstream.all(|l| !l.contains(r#"domain="edge""#)), "{page}");
    assert!(!page.contains(r#"slidegate_envoy_invalid_descriptors_total{domain="edge""#), "{page}");
    let stats: serde_json::Value =
        client.get(server.url("/v1/stats")).send().await.expect("stats").json().await.expect("json");
    let text = stats.to_string();
    assert!(!text.contains("\"old7\"") && !text.contains("\"edge\"") && text.contains("\"core\""), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_rule_leaves_metrics_on_push() {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new("admin_token = \"t\"\n"), RulesFile::new(&named_rules("push0-", 300)));
    let push = |rules: &RulesFile| {
        let out = support::run(&["rules", "push", "--redis", &redis.url(), rules.arg()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    push(&rules);
    let server = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    let client = reqwest::Client::new();
    assert_eq!(decision_series(&client, &server, "push0-").await, (602, true));
    for round in 1..5 {
        rules.write(&named_rules(&format!("push{round}-"), 300));
        push(&rules);
        until_series(&client, &server, 602, &format!("push{}-", round - 1)).await;
    }
    assert_eq!(decision_series(&client, &server, "push").await.0, 602, "five pushes of 300 names: 300 rules' series");
}
