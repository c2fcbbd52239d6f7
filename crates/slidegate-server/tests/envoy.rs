//! The Envoy rate limit service of the real binary, driven by a tonic gRPC client, with
//! envoyproxy/ratelimit YAML files, on the memory backend and on a real redis-server.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::UInt64Value;
use slidegate_server::envoy::{MAX_DESCRIPTORS, MAX_DETAILED_SERIES, MAX_ENTRIES, MAX_REQUEST_BYTES, descriptor_key};
use slidegate_testkit::RedisServer;
use support::RulesFile;
use support::envoy::{Descriptor, Envoy, OK, OVER, UNKNOWN, codes, descriptor, on_both_backends, redis_rules, request};

const MESSAGING: &str = include_str!("fixtures/envoy/messaging.yaml");

const EDGE: &str = "
domain: edge
descriptors:
  - key: path
    value: /prefixed*
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    value: /health
    rate_limit:
      unlimited: true
  - key: client
    value: trial
    shadow_mode: true
    rate_limit:
      name: trial
      unit: hour
      requests_per_unit: 1
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: plan
    rate_limit:
      name: plan
      replaces:
        - name: trial
      unit: hour
      requests_per_unit: 1000
  - key: bulk
    rate_limit:
      unit: minute
      requests_per_unit: 1
      algorithm: gcra
";

#[tokio::test]
async fn nested_descriptors_get_the_most_specific_limit_with_full_statuses_on_memory_and_redis() {
    on_both_backends(nested_descriptors_get_the_most_specific_limit_with_full_statuses).await;
}

#[tokio::test]
async fn wildcard_unlimited_shadow_replaces_and_hits_addend_on_memory_and_redis() {
    on_both_backends(wildcard_unlimited_shadow_replaces_and_hits_addend).await;
}

#[tokio::test]
async fn an_over_limit_request_charges_none_of_its_descriptors_on_memory_and_redis() {
    on_both_backends(an_over_limit_request_charges_none_of_its_descriptors).await;
}

#[tokio::test]
async fn malformed_requests_get_envoyproxy_ratelimit_s_answers_on_memory_and_redis() {
    on_both_backends(malformed_requests_get_envoyproxy_ratelimit_s_answers).await;
}

async fn nested_descriptors_get_the_most_specific_limit_with_full_statuses(extra: &[&str]) {
    let mut e = Envoy::start(&[("messaging.yaml", MESSAGING)], extra).await;
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    for i in 0..5 {
        let r = e.ask("messaging", &[marketing], 0).await;
        assert_eq!(codes(&r), (OK, vec![OK]), "#{i}");
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().expect("current limit");
        assert_eq!((limit.requests_per_unit, limit.unit, s.limit_remaining), (5, Unit::Day as i32, 4 - i));
    }
    let r = e.ask("messaging", &[marketing], 0).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    let reset = r.statuses[0].duration_until_reset.expect("until reset");
    assert!((86_390..=86_400).contains(&reset.seconds), "the first message leaves a day after it was sent: {reset:?}");
    // The same number without the marketing type is the 100-per-day limit, counted apart.
    let r = e.ask("messaging", &[&[("to_number", "2061111111")]], 0).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK]), 99));
    // Each number has its own counter.
    let other: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(codes(&e.ask("messaging", &[other], 0).await), (OK, vec![OK]));
}

async fn wildcard_unlimited_shadow_replaces_and_hits_addend(extra: &[&str]) {
    let mut e = Envoy::start(&[("edge.yaml", EDGE)], &[&["--envoy-response-headers"], extra].concat()).await;
    let prefixed: &[(&str, &str)] = &[("path", "/prefixed/bar")];
    assert_eq!(codes(&e.ask("edge", &[prefixed], 0).await), (OK, vec![OK]));
    assert_eq!(
        codes(&e.ask("edge", &[&[("path", "/prefixed/baz")]], 0).await),
        (OK, vec![OK]),
        "each value its own counter"
    );
    assert_eq!(codes(&e.ask("edge", &[prefixed], 0).await), (OK, vec![OK]));
    let r = e.ask("edge", &[prefixed], 0).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    let headers: Vec<(&str, &str)> =
        r.response_headers_to_add.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect();
    assert!(
        headers.contains(&("RateLimit-Limit", "2")) && headers.contains(&("RateLimit-Remaining", "0")),
        "{headers:?}"
    );
    // Unlimited: always OK, remaining at its maximum; no limit at all: OK, nothing set.
    let r = e.ask("edge", &[&[("path", "/health")], &[("path", "/elsewhere")]], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!((r.statuses[0].limit_remaining, r.statuses[1].current_limit.is_none()), (u32::MAX, true));
    // Shadow: counted, answered OK.
    let trial: &[(&str, &str)] = &[("client", "trial")];
    for _ in 0..3 {
        assert_eq!(codes(&e.ask("edge", &[trial], 0).await).0, OK);
    }
    // `plan` replaces the `trial` limit in a request that has both: only plan's applies.
    let r = e.ask("edge", &[trial, &[("plan", "gold")]], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert!(r.statuses[0].current_limit.is_none(), "replaced");
    // hits_addend is the cost, from the request or from the descriptor.
    let user: &[(&str, &str)] = &[("user", "ada")];
    let r = e.ask("edge", &[user], 7).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK]), 3));
    assert_eq!(codes(&e.ask("edge", &[user], 4).await), (OVER, vec![OVER]), "7 + 4 > 10: refused whole");
    let mut one = request("edge", &[user], 0);
    one.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    let r = e.client.should_rate_limit(one).await.expect("answer").into_inner();
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK]), 0), "the denial consumed nothing");
    // More hits than the limit could ever hold.
    assert_eq!(codes(&e.ask("edge", &[&[("bulk", "x")]], 2).await), (OVER, vec![OVER]));
}

async fn an_over_limit_request_charges_none_of_its_descriptors(extra: &[&str]) {
    let mut e = Envoy::start(&[("edge.yaml", EDGE)], extra).await;
    let (user, prefixed): (Descriptor<'_>, Descriptor<'_>) = (&[("user", "bob")], &[("path", "/prefixed")]);
    for _ in 0..2 {
        assert_eq!(codes(&e.ask("edge", &[user, prefixed], 0).await), (OK, vec![OK, OK]));
    }
    let r = e.ask("edge", &[user, prefixed], 0).await;
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]), "the path limit is over; the user one would fit");
    assert_eq!(r.statuses[0].limit_remaining, 8, "and was not charged");
    assert_eq!(e.ask("edge", &[user], 0).await.statuses[0].limit_remaining, 7);
}

async fn malformed_requests_get_envoyproxy_ratelimit_s_answers(extra: &[&str]) {
    let mut e = Envoy::start(&[("messaging.yaml", MESSAGING)], extra).await;
    let err = e.client.should_rate_limit(request("", &[&[("a", "b")]], 0)).await.expect_err("no domain");
    assert_eq!((err.code(), err.message()), (tonic::Code::Unknown, "rate limit domain must not be empty"));
    let err = e.client.should_rate_limit(request("messaging", &[], 0)).await.expect_err("no descriptors");
    assert_eq!((err.code(), err.message()), (tonic::Code::Unknown, "rate limit descriptor list must not be empty"));
    let r = e.ask("no-such-domain", &[&[("a", "b")]], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]), "an unknown domain limits nothing");
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn metrics_and_hot_reload_of_the_config_directory() {
    const DETAIL: &str = "domain: detail\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
    let mut e = Envoy::start(&[("messaging.yaml", MESSAGING), ("detail.yaml", DETAIL)], &[]).await;
    let number: &[(&str, &str)] = &[("to_number", "1")];
    e.ask("messaging", &[number], 0).await;
    let page = reqwest::get(e.server.url("/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(
        page.contains(r#"ratelimit_service_rate_limit_total_hits{domain="messaging",key1="to_number"} 1"#),
        "{page}"
    );
    assert!(
        page.contains(r#"ratelimit_service_rate_limit_within_limit{domain="messaging",key1="to_number"} 1"#),
        "{page}"
    );
    // Under detailed_metric, each value is counted apart; the configured counters go on.
    for user in ["ann", "ann", "bob"] {
        e.ask("detail", &[&[("user", user)]], 0).await;
    }
    e.ask("messaging", &[number], 0).await;
    let page = reqwest::get(e.server.url("/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(page.contains(r#"ratelimit_service_rate_limit_total_hits{domain="detail",key1="user_ann"} 2"#), "{page}");
    assert!(page.contains(r#"ratelimit_service_rate_limit_total_hits{domain="detail",key1="user_bob"} 1"#), "{page}");
    assert!(
        page.contains(r#"ratelimit_service_rate_limit_total_hits{domain="messaging",key1="to_number"} 2"#),
        "{page}"
    );
    // Lower the limit to 1 a day: the next request is over.
    std::fs::write(e.dir.0.join("messaging.yaml"), MESSAGING.replace("requests_per_unit: 100", "requests_per_unit: 1"))
        .expect("write");
    let mut reloaded = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if e.ask("messaging", &[&[("to_number", "probe")]], 0).await.statuses[0]
            .current_limit
            .as_ref()
            .is_some_and(|l| l.requests_per_unit == 1)
        {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the new limit is in force: {}", e.server.log_text());
    // A broken file is refused; the previous configuration stays.
    std::fs::write(
        e.dir.0.join("broken.yaml"),
        "domain: x\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n",
    )
    .expect("write");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(e.server.log_text().contains("fortnight"), "the error is logged");
    assert_eq!(
        e.ask("messaging", &[number], 0).await.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_grpc_clients_on_redis_get_exactly_requests_per_unit() {
    let redis = RedisServer::start();
    let config =
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n";
    let rules = redis_rules(&redis);
    let e = Envoy::start(&[("api.yaml", config)], &["--config", rules.arg()]).await;
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let mut client = e.client.clone();
            tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..4 {
                    let r =
                        client.should_rate_limit(request("api", &[&[("tenant", "acme")]], 0)).await.expect("answer");
                    ok += usize::from(r.into_inner().overall_code == OK);
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("client");
    }
    assert_eq!(ok, 100, "256 requests from 64 gRPC clients, 100 per hour");
    let key = format!("slidegate:{}", descriptor_key("api", &[("tenant", "acme")]));
    assert_eq!(redis.query::<u64>(&["ZCARD", &key]), 100);
}

#[tokio::test]
async fn on_a_redis_cluster_descriptors_in_different_slots_are_decided_in_order() {
    let cluster = slidegate_testkit::RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(",");
    let mut e = Envoy::start(&[("edge.yaml", EDGE)], &["--redis-cluster", &nodes]).await;
    let (user, prefixed): (Descriptor<'_>, Descriptor<'_>) = (&[("user", "bob")], &[("path", "/prefixed")]);
    assert_ne!(
        slidegate::key_slot(format!("slidegate:{}", descriptor_key("edge", user))),
        slidegate::key_slot(format!("slidegate:{}", descriptor_key("edge", prefixed)))
    );
    for _ in 0..2 {
        assert_eq!(codes(&e.ask("edge", &[prefixed, user], 0).await), (OK, vec![OK, OK]));
    }
    // The path limit (first) is over: the user descriptor after it is not charged.
    let r = e.ask("edge", &[prefixed, user], 0).await;
    assert_eq!((codes(&r), r.statuses[1].limit_remaining), ((OVER, vec![OVER, OK]), 8));
    // With the user first, it is charged before the path limit denies: not atomic across slots.
    let r = e.ask("edge", &[user, prefixed], 0).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OVER, vec![OK, OVER]), 7));
}

/// `user` and `user` + `path`, each limited to 1: the two descriptor lists whose keys were once
/// both `nested:{user_alice.path_/x}`.
const NESTED: &str = "
domain: nested
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
    descriptors:
      - key: path
        rate_limit: { unit: minute, requests_per_unit: 1 }
";

/// A per-user limit of 1 and a per-header-value limit of 100: `header` stands for a descriptor
/// whose value an attacker sends.
const MIXED: &str = "
domain: mixed
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: header
    rate_limit: { unit: minute, requests_per_unit: 100 }
";

#[tokio::test]
async fn descriptor_lists_that_join_to_the_same_text_never_share_a_limit_on_memory_and_redis() {
    on_both_backends(descriptor_lists_that_join_to_the_same_text_never_share_a_limit).await;
}

#[tokio::test]
async fn a_bad_descriptor_never_lifts_an_over_limit_one_on_memory_and_redis() {
    on_both_backends(a_bad_descriptor_never_lifts_an_over_limit_one).await;
}

async fn descriptor_lists_that_join_to_the_same_text_never_share_a_limit(extra: &[&str]) {
    let mut e = Envoy::start(&[("nested.yaml", NESTED)], extra).await;
    let one: Descriptor<'_> = &[("user", "alice.path_/x")];
    let two: Descriptor<'_> = &[("user", "alice"), ("path", "/x")];
    assert_eq!(codes(&e.ask("nested", &[one], 0).await), (OK, vec![OK]));
    let r = e.ask("nested", &[two], 0).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        ((OK, vec![OK]), 0),
        "the first list's hit is not the second's"
    );
    assert_eq!(codes(&e.ask("nested", &[one], 0).await), (OVER, vec![OVER]), "each list is limited on its own");
    assert_eq!(codes(&e.ask("nested", &[two], 0).await), (OVER, vec![OVER]));
}

async fn a_bad_descriptor_never_lifts_an_over_limit_one(extra: &[&str]) {
    let mut e = Envoy::start(&[("mixed.yaml", MIXED)], extra).await;
    let mallory: Descriptor<'_> = &[("user", "mallory")];
    assert_eq!(codes(&e.ask("mixed", &[mallory], 0).await), (OK, vec![OK]));
    // mallory is over her limit now. Each attack adds a descriptor the service must refuse.
    let long = "x".repeat(10 * 1024);
    let long: Descriptor<'_> = &[("header", &long)];
    assert_eq!(codes(&e.ask("mixed", &[long, mallory], 0).await), (OVER, vec![UNKNOWN, OVER]), "a 10 KB value");
    assert_eq!(
        codes(&e.ask("mixed", &[mallory, long, mallory], 0).await),
        (OVER, vec![OVER, UNKNOWN, UNKNOWN]),
        "a duplicate"
    );
    let deep = vec![("header", "v"); MAX_ENTRIES + 1];
    assert_eq!(codes(&e.ask("mixed", &[&deep, mallory], 0).await), (OVER, vec![UNKNOWN, OVER]), "too many entries");
    let mut huge = request("mixed", &[&[("header", "h")], mallory], 0);
    huge.descriptors[0].hits_addend = Some(UInt64Value { value: u64::MAX });
    assert_eq!(codes(&e.send(huge).await), (OVER, vec![OVER, OVER]), "more hits than any limit holds: over itself");
    let r = e.ask("mixed", &[&[("header", "h")]], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 99, "and the refused hits charged nothing");
    // 1000 descriptors: the first MAX_DESCRIPTORS are decided, mallory's among them.
    let values: Vec<String> = (0..999).map(|i| format!("v{i}")).collect();
    let mut many = request("mixed", &[mallory], 0);
    many.descriptors.extend(values.iter().map(|v| descriptor(&[("header", v)])));
    let r = e.send(many).await;
    assert_eq!((r.overall_code, r.statuses.len(), r.statuses[0].code), (OVER, 1000, OVER));
    assert!(r.statuses[1..MAX_DESCRIPTORS].iter().all(|s| s.code == OK && s.current_limit.is_some()));
    assert!(r.statuses[MAX_DESCRIPTORS..].iter().all(|s| s.code == UNKNOWN && s.current_limit.is_none()));
    // Nothing decidable at all: the request fails as a whole.
    let err = e.client.should_rate_limit(request("mixed", &[long], 0)).await.expect_err("nothing decidable");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // A good descriptor beside a bad one is decided, and charged.
    let alice: Descriptor<'_> = &[("user", "alice")];
    let r = e.ask("mixed", &[alice, long], 0).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK, UNKNOWN]), 0));
    assert_eq!(codes(&e.ask("mixed", &[alice], 0).await), (OVER, vec![OVER]), "alice was charged");
    let page = e.metrics().await;
    for (reason, n) in [("key_too_long", 4), ("duplicate", 1), ("too_many_entries", 1), ("too_many_descriptors", 984)] {
        let line = format!(r#"slidegate_envoy_invalid_descriptors_total{{domain="mixed",reason="{reason}"}} {n}"#);
        assert!(page.lines().any(|l| l == line), "{line} in {page}");
    }
    let capped = format!(
        r#"ratelimit_service_rate_limit_over_limit{{domain="mixed",key1="header"}} {}"#,
        slidegate::MAX_LIMIT + 1
    );
    assert!(page.lines().any(|l| l == capped), "u64::MAX hits counted as MAX_LIMIT + 1: {page}");
}

#[tokio::test]
async fn a_request_as_large_as_envoy_sends_is_decided_and_a_larger_one_is_refused_undecoded() {
    let mut e = Envoy::start(&[("mixed.yaml", MIXED)], &[]).await;
    let mallory: Descriptor<'_> = &[("user", "mallory")];
    assert_eq!(codes(&e.ask("mixed", &[mallory], 0).await), (OK, vec![OK]));
    // The attack: a 60 KiB header (Envoy's default limit) in every other descriptor.
    let header = "x".repeat(60 * 1024);
    let mut large = request("mixed", &[mallory], 0);
    large.descriptors.extend((1..MAX_DESCRIPTORS).map(|_| descriptor(&[("header", &header)])));
    let r = e.send(large).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER), "decided: mallory is over");
    assert!(r.statuses[1..].iter().all(|s| s.code == UNKNOWN));
    // Past MAX_REQUEST_BYTES: refused by gRPC before it is decoded.
    let mut larger = request("mixed", &[mallory], 0);
    larger.descriptors.push(descriptor(&[("header", &"x".repeat(MAX_REQUEST_BYTES))]));
    let err = e.client.should_rate_limit(larger).await.expect_err("too large");
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
}

#[tokio::test]
async fn detailed_metric_series_stop_at_the_cap_and_the_rest_share_one_overflow_series() {
    const CAPPED: &str = "domain: capped\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
    let mut e = Envoy::start(&[("capped.yaml", CAPPED)], &[]).await;
    // The attack: more distinct header values than the cap, MAX_DESCRIPTORS to a request.
    let past_the_cap = 40;
    let values: Vec<String> = (0..MAX_DETAILED_SERIES + past_the_cap).map(|i| format!("u{i}")).collect();
    for chunk in values.chunks(MAX_DESCRIPTORS) {
        let mut r = request("capped", &[], 0);
        r.descriptors = chunk.iter().map(|v| descriptor(&[("user", v)])).collect();
        assert_eq!(e.send(r).await.overall_code, OK);
    }
    let page = e.metrics().await;
    let series =
        page.lines().filter(|l| l.starts_with(r#"ratelimit_service_rate_limit_total_hits{domain="capped","#)).count();
    assert_eq!(series, MAX_DETAILED_SERIES + 1, "the cap, and one overflow series");
    assert!(page.contains(r#"ratelimit_service_rate_limit_total_hits{domain="capped",key1="user_u0"} 1"#));
    let overflow = format!(
        r#"ratelimit_service_rate_limit_total_hits{{domain="capped",key1="user",key2="_overflow_"}} {past_the_cap}"#
    );
    assert!(page.lines().any(|l| l == overflow), "{overflow}");
}

#[tokio::test]
async fn with_redis_gone_the_failure_policy_answers_and_bad_descriptors_stay_their_own_problem() {
    let redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\ntimeout = \"10s\"\nfailure_policy = \"fail_closed\"\n",
        redis.url()
    ));
    let mut e = Envoy::start(&[("mixed.yaml", MIXED)], &["--config", rules.arg()]).await;
    let long = "x".repeat(10 * 1024);
    let (long, bob): (Descriptor<'_>, Descriptor<'_>) = (&[("header", &long)], &[("user", "bob")]);
    for _ in 0..10 {
        // Refused descriptors are not backend failures: they never open the circuit.
        assert_eq!(codes(&e.ask("mixed", &[long, &[("header", "ok")]], 0).await), (OK, vec![UNKNOWN, OK]));
    }
    let page = e.metrics().await;
    assert!(page.lines().any(|l| l == "slidegate_circuit_open 0"), "{page}");
    drop(redis);
    // A backend failure follows the failure policy, here fail_closed: an answer, not an RPC error.
    assert_eq!(codes(&e.ask("mixed", &[long, bob], 0).await), (OVER, vec![UNKNOWN, OVER]));
}

/// `slidegate bench --target grpc://…` against `envoy` with `extra` flags: its `--json` report.
#[cfg(feature = "bench")]
fn bench(envoy: &Envoy, extra: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--target", &format!("grpc://{}", envoy.grpc), "--json"])
        .args(extra)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[cfg(feature = "bench")]
#[tokio::test]
async fn bench_over_grpc_admits_exactly_the_limit_of_a_hot_key_and_spreads_the_others() {
    // The benchmarks' own domain: 100 per minute per `key`.
    let envoy = Envoy::start(&[("bench.yaml", include_str!("../../../bench/envoy/bench.yaml"))], &[]).await;
    // 64 streams of one connection on one key: the answers are read right, every call is one.
    let hot = bench(&envoy, &["--keys", "1", "--concurrency", "64", "--duration", "500ms"]);
    assert_eq!((hot["allowed"].as_u64(), hot["errors"].as_u64()), (Some(100), Some(0)), "{hot}");
    assert!(hot["denied"].as_u64().is_some_and(|d| d > 0), "{hot}");
    // Open loop over 100,000 keys, 8 workers on 3 connections: each call asks about its own key
    // (one key would admit 100 at most), at the scheduled rate.
    let flags = ["--keys", "100000", "--concurrency", "8", "--connections", "3", "--rate", "400", "--duration", "1s"];
    let spread = bench(&envoy, &flags);
    let (allowed, denied) = (spread["allowed"].as_u64().unwrap_or(0), spread["denied"].as_u64().unwrap_or(0));
    assert!((200..=400).contains(&(allowed + denied)) && allowed > 150, "{spread}");
    assert_eq!((spread["rate"].as_u64(), spread["errors"].as_u64()), (Some(400), Some(0)), "{spread}");
}

#[cfg(feature = "bench")]
#[test]
fn bench_over_grpc_without_a_server_fails_at_once() {
    let target = format!("grpc://127.0.0.1:{}", slidegate_testkit::free_port());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--target", &target, "--duration", "10s"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connecting to 127.0.0.1:"), "{err}");
}
