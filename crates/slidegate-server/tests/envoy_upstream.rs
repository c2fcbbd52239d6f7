//! envoyproxy/ratelimit's behaviour, as a migrating team would try it, against the real binary
//! with the project's RLS client: every field of its loader, its refusals at start and on
//! reload, its settings (as flags, rules-file settings and environment variables), its response
//! headers and its Prometheus series; on the memory backend and on a real redis-server where a
//! limit is decided.

mod support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::{UInt64Value, value::Kind};
use slidegate_testkit::RedisServer;
use support::envoy::{
    Descriptor, Dir, Envoy, OK, OVER, UNKNOWN, codes, on_both_backends, redis_rules, refusal, request,
};
use support::{RulesFile, run_to_exit};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/envoy");
const EVERY_FIELD: &str = include_str!("fixtures/envoy/every_field.yaml");

/// One way to give a setting: flags, and environment variables.
type Setting<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);

fn headers(r: &RateLimitResponse) -> Vec<(&str, &str)> {
    r.response_headers_to_add.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect()
}

#[tokio::test]
async fn every_refused_file_stops_the_start_naming_file_line_descriptor_and_reason() {
    let mut checked = 0;
    for entry in std::fs::read_dir(format!("{FIXTURES}/refused")).expect("fixtures") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let name = path.file_name().and_then(|n| n.to_str()).expect("name");
        let dir = Dir::with(&[(name, &text)]);
        let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
        let (status, stderr) =
            run_to_exit(&["serve", "--http", "127.0.0.1:0", "--grpc", &grpc, "--envoy-config", dir.arg()]);
        assert!(!status.success(), "{name} started");
        assert!(stderr.contains(&refusal(&dir.0.join(name), &text)), "{name}: {stderr}");
        checked += 1;
    }
    assert!(checked >= 18);
}

#[test]
fn a_refused_file_stops_the_start_as_an_envoy_configuration_problem_not_a_backend_one() {
    let text = std::fs::read_to_string(format!("{FIXTURES}/refused/unknown_unit.yaml")).expect("read");
    let dir = Dir::with(&[("edge.yaml", &text)]);
    let (status, stderr) = run_to_exit(&["serve", "--http", "127.0.0.1:0", "--envoy-config", dir.arg()]);
    assert!(!status.success());
    let refused = refusal(&dir.0.join("edge.yaml"), &text);
    assert!(stderr.contains(&format!("loading the Envoy configuration: {refused}")), "{stderr}");
    assert!(!stderr.contains("backend"), "{stderr}");
}

#[tokio::test]
async fn a_refused_file_on_reload_is_logged_and_the_previous_configuration_keeps_serving() {
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &[]).await;
    let status: Descriptor<'_> = &[("status", "500")];
    for entry in std::fs::read_dir(format!("{FIXTURES}/refused")).expect("fixtures") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let file = e.dir.0.join("refused.yaml");
        std::fs::write(&file, &text).expect("write");
        let logged = refusal(&file, &text);
        let seen = e.server.log_text().matches(&logged).count();
        let started = Instant::now();
        while e.server.log_text().matches(&logged).count() == seen {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{} not logged: {}",
                path.display(),
                e.server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r = e.ask("api", &[status], 0).await;
        assert_eq!(r.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(10), "{}", path.display());
        std::fs::remove_file(&file).expect("remove");
    }
    let page = e.metrics().await;
    let errors = page.lines().find_map(|l| l.strip_prefix("ratelimit_service_config_load_error ")).expect("errors");
    assert!(errors.parse::<u64>().expect("a count") >= 18, "{page}");
}

#[tokio::test]
async fn one_domain_in_two_files_loads_only_with_merging_from_flag_file_or_environment() {
    let users = std::fs::read_to_string(format!("{FIXTURES}/merge/shop_users.yaml")).expect("users");
    let paths = std::fs::read_to_string(format!("{FIXTURES}/merge/shop_paths.yaml")).expect("paths");
    let files = [("shop_users.yaml", users.as_str()), ("shop_paths.yaml", paths.as_str())];
    let dir = Dir::with(&files);
    let (status, stderr) = run_to_exit(&["serve", "--http", "127.0.0.1:0", "--envoy-config", dir.arg()]);
    assert!(!status.success());
    let line = users.lines().position(|l| l.starts_with("domain:")).expect("a domain") + 1;
    let at = format!("shop_users.yaml:{line}:1: duplicate domain 'shop' in config file");
    assert!(stderr.contains(&at), "{stderr}");
    let rules = RulesFile::new("envoy_merge_domains = true\n");
    let file_args = ["--config", rules.arg()];
    let ways: [Setting<'_>; 3] =
        [(&["--envoy-merge-domains"], &[]), (&file_args, &[]), (&[], &[("SLIDEGATE_ENVOY_MERGE_DOMAINS", "true")])];
    for (args, env) in ways {
        let mut e = Envoy::start_with_env(&files, args, env).await;
        let r = e.ask("shop", &[&[("user", "ada")], &[("path", "/cart/9")]], 0).await;
        let limits: Vec<u32> =
            r.statuses.iter().filter_map(|s| s.current_limit.as_ref()).map(|l| l.requests_per_unit).collect();
        assert_eq!(limits, [2, 3], "{args:?} {env:?}");
    }
}

#[tokio::test]
async fn quota_mode_share_threshold_and_wildcards_on_memory_and_redis() {
    on_both_backends(quota_mode_share_threshold_and_wildcards).await;
}

async fn quota_mode_share_threshold_and_wildcards(extra: &[&str]) {
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], extra).await;
    // Two quotas (2 and 1 a minute): the request passes while either has room.
    let quotas: [Descriptor<'_>; 2] = [&[("plan_quota", "p")], &[("team_quota", "t")]];
    assert_eq!(codes(&e.ask("api", &quotas, 0).await), (OK, vec![OK, OK]));
    let r = e.ask("api", &quotas, 0).await;
    assert_eq!(codes(&r), (OK, vec![OK, OVER]), "the team quota is spent, the plan quota has room");
    assert_eq!(r.statuses[0].limit_remaining, 0, "and was charged");
    assert_eq!(codes(&e.ask("api", &quotas, 0).await), (OVER, vec![OVER, OVER]), "every quota spent");
    // A rate limit over beside a quota with room: over, and the quota not charged.
    let blocked: Descriptor<'_> = &[("path", "/v1/admin/orders")];
    assert_eq!(codes(&e.ask("api", &[blocked], 0).await), (OK, vec![OK]));
    let r = e.ask("api", &[blocked, &[("plan_quota", "other")]], 0).await;
    assert_eq!((codes(&r), r.statuses[1].limit_remaining), ((OVER, vec![OVER, OK]), 2), "nothing charged");
    // share_threshold: every file under files/ shares one counter of 3.
    for (i, file) in ["files/a", "files/b", "files/c"].iter().enumerate() {
        let r = e.ask("api", &[&[("files", file)]], 0).await;
        assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK]), 2 - i as u32), "{file}");
    }
    assert_eq!(codes(&e.ask("api", &[&[("files", "files/d")]], 0).await), (OVER, vec![OVER]));
    // A wildcard in the middle: each value its own counter of 4; the exact value wins over it.
    for _ in 0..4 {
        assert_eq!(codes(&e.ask("api", &[&[("path", "/v1/shop/orders/7")]], 0).await).0, OK);
    }
    assert_eq!(codes(&e.ask("api", &[&[("path", "/v1/shop/orders/7")]], 0).await).0, OVER);
    assert_eq!(codes(&e.ask("api", &[&[("path", "/v1/shop/orders/8")]], 0).await).0, OK);
    assert_eq!(codes(&e.ask("api", &[blocked], 0).await).0, OVER, "the exact value's limit of 1");
}

#[tokio::test]
async fn the_request_s_own_limit_applies_and_unknown_units_are_refused_on_memory_and_redis() {
    on_both_backends(the_request_s_own_limit_applies).await;
}

async fn the_request_s_own_limit_applies(extra: &[&str]) {
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], extra).await;
    let with_limit = |requests_per_unit, unit: RateLimitUnit| {
        let mut r = request("api", &[&[("user", "ada"), ("action", "export")]], 0);
        r.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit, unit: unit as i32 });
        r
    };
    // No configured limit for user + action: the request's own applies, 10 a day.
    let r = e.send(with_limit(10, RateLimitUnit::Day)).await;
    let limit = r.statuses[0].current_limit.clone().expect("the request's limit");
    assert_eq!((limit.requests_per_unit, limit.unit, r.statuses[0].limit_remaining), (10, Unit::Day as i32, 9));
    // Then 42 an hour, on the same count.
    let r = e.send(with_limit(42, RateLimitUnit::Hour)).await;
    let limit = r.statuses[0].current_limit.clone().expect("the request's limit");
    assert_eq!((limit.requests_per_unit, limit.unit, r.statuses[0].limit_remaining), (42, Unit::Hour as i32, 40));
    // It replaces a configured limit too: `user` is 10 a minute, the request says 1.
    let mut r = request("api", &[&[("user", "bob")]], 0);
    r.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 1, unit: RateLimitUnit::Minute as i32 });
    assert_eq!(codes(&e.send(r.clone()).await), (OK, vec![OK]));
    assert_eq!(codes(&e.send(r).await), (OVER, vec![OVER]));
    // A unit that is not one: that descriptor is refused, not decided.
    let mut r = request("api", &[&[("user", "cy")], &[("status", "500")]], 0);
    r.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 5, unit: RateLimitUnit::Unknown as i32 });
    assert_eq!(codes(&e.send(r).await), (OK, vec![UNKNOWN, OK]));
    let page = e.metrics().await;
    let counted = r#"ratelimit_service_rate_limit_total_hits{domain="api",key1="user_ada",key2="action_export"} 2"#;
    assert!(page.lines().any(|l| l == counted), "{page}");
}

#[tokio::test]
async fn a_hits_addend_of_zero_checks_and_counts_nothing_on_memory_and_redis() {
    on_both_backends(a_hits_addend_of_zero_checks_and_counts_nothing).await;
}

async fn a_hits_addend_of_zero_checks_and_counts_nothing(extra: &[&str]) {
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], extra).await;
    let check = |value: u64| {
        let mut r = request("api", &[&[("user", "dee")]], 5);
        r.descriptors[0].hits_addend = Some(UInt64Value { value });
        r
    };
    for _ in 0..3 {
        let r = e.send(check(0)).await;
        assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OK, vec![OK]), 10), "nothing counted");
    }
    // The request's hits_addend (5) applies where the descriptor has none; 0 there means 1.
    let r = e.ask("api", &[&[("user", "dee")]], 5).await;
    assert_eq!(r.statuses[0].limit_remaining, 5);
    let r = e.ask("api", &[&[("user", "dee")]], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(e.send(check(4)).await.statuses[0].limit_remaining, 0);
    let r = e.send(check(0)).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), ((OVER, vec![OVER]), 0), "spent: a check is over");
    let page = e.metrics().await;
    let hits = r#"ratelimit_service_rate_limit_total_hits{domain="api",key1="user_dee"} 10"#;
    assert!(page.lines().any(|l| l == hits), "checks add no hits: {page}");
}

#[tokio::test]
async fn duration_until_reset_is_when_the_oldest_admission_leaves_on_memory_and_redis() {
    on_both_backends(duration_until_reset_is_when_the_oldest_admission_leaves).await;
}

async fn duration_until_reset_is_when_the_oldest_admission_leaves(extra: &[&str]) {
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], extra).await;
    let user: Descriptor<'_> = &[("user", "eve")];
    let reset = |r: &RateLimitResponse| {
        let d = r.statuses[0].duration_until_reset.expect("until reset");
        Duration::new(u64::try_from(d.seconds).expect("seconds"), u32::try_from(d.nanos).expect("nanos"))
    };
    let first = reset(&e.ask("api", &[user], 0).await);
    assert!(first > Duration::from_secs(58) && first <= Duration::from_secs(60), "{first:?}");
    // Time must pass for a reset to move: the second hit comes at least 2 s after the first.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let second = reset(&e.ask("api", &[user], 0).await);
    assert!(second <= Duration::from_secs(58), "the oldest admission leaves first: {second:?}");
    assert!(second > Duration::from_secs(40), "{second:?}");
}

#[tokio::test]
async fn duration_until_reset_is_when_the_oldest_admission_leaves_on_the_module() {
    let redis = RedisServer::start_with_module(&[]);
    let rules = redis_rules(&redis);
    duration_until_reset_is_when_the_oldest_admission_leaves(&["--config", rules.arg()]).await;
    assert!(calls(&redis, "slidegate.check") > 0, "the module decided");
}

/// `duration_until_reset` comes with the decision: a request with one sliding-log descriptor is
/// one command to Redis — one script run, or one module command — and no read besides.
#[tokio::test]
async fn one_sliding_log_descriptor_is_one_redis_command_on_lua_and_on_the_module() {
    for (redis, decides) in
        [(RedisServer::start(), "evalsha"), (RedisServer::start_with_module(&[]), "slidegate.check")]
    {
        let rules = redis_rules(&redis);
        let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &["--config", rules.arg()]).await;
        let user: Descriptor<'_> = &[("user", "fay")];
        // The first request finds out which engine the server has, and loads the script.
        assert_eq!(codes(&e.ask("api", &[user], 0).await), (OK, vec![OK]));
        let commands = ["evalsha", "eval", "slidegate.check", "slidegate.inspect"];
        let before = commands.map(|c| calls(&redis, c));
        for _ in 0..5 {
            let r = e.ask("api", &[user], 0).await;
            assert_eq!(codes(&r), (OK, vec![OK]));
            assert!(r.statuses[0].duration_until_reset.is_some_and(|d| d.seconds > 50), "{r:?}");
        }
        let made = commands.map(|c| calls(&redis, c)).iter().zip(before).map(|(a, b)| a - b).collect::<Vec<_>>();
        let expected = commands.map(|c| if c == decides { 5 } else { 0 });
        assert_eq!(made, expected, "{decides}: commands per request, {commands:?}");
    }
}

/// How many times `redis` has run `command` (`INFO commandstats`).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info: String = redis.query(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_counts_and_keeps_the_statuses() {
    let limited: Descriptor<'_> = &[("path", "/v1/admin/orders")];
    let rules = RulesFile::new("envoy_shadow_mode = true\n");
    let file_args = ["--config", rules.arg()];
    let ways: [Setting<'_>; 3] =
        [(&["--envoy-shadow-mode"], &[]), (&file_args, &[]), (&[], &[("SLIDEGATE_ENVOY_SHADOW_MODE", "true")])];
    for (args, env) in ways {
        let mut e = Envoy::start_with_env(&[("every_field.yaml", EVERY_FIELD)], args, env).await;
        assert_eq!(codes(&e.ask("api", &[limited], 0).await), (OK, vec![OK]));
        let r = e.ask("api", &[limited], 0).await;
        assert_eq!(codes(&r), (OK, vec![OVER]), "{args:?} {env:?}: answered OK, the status says over");
        let page = e.metrics().await;
        assert!(page.lines().any(|l| l == "ratelimit_service_global_shadow_mode 1"), "{page}");
        assert!(
            page.contains(r#"ratelimit_service_rate_limit_over_limit{domain="api",key1="path_/v1/admin/orders"} 1"#),
            "{page}"
        );
    }
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &[]).await;
    e.ask("api", &[limited], 0).await;
    assert_eq!(codes(&e.ask("api", &[limited], 0).await).0, OVER, "enforced without it");
}

#[tokio::test]
async fn the_near_limit_ratio_sets_where_near_limit_hits_start() {
    for (args, near) in [(&[][..], 2), (&["--envoy-near-limit-ratio", "0.5"][..], 5)] {
        let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], args).await;
        // 10 a minute: 9 hits, then 2 more (one over).
        for _ in 0..9 {
            e.ask("api", &[&[("user", "fay")]], 0).await;
        }
        assert_eq!(codes(&e.ask("api", &[&[("user", "fay")]], 2).await).0, OVER);
        let page = e.metrics().await;
        // Upstream's arithmetic: hits past 8 (or 5) of 10 are near, the 9th (or 6th to 9th)
        // admitted; the request of 2 that crosses 10 is 1 over, and 1 near (the 10th).
        let line = |name: &str| format!(r#"ratelimit_service_rate_limit_{name}{{domain="api",key1="user_fay"}} "#);
        let value = |name: &str| {
            page.lines().find_map(|l| l.strip_prefix(&line(name))).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        };
        assert_eq!((value("total_hits"), value("within_limit"), value("over_limit")), (11, 9, 1), "{page}");
        assert_eq!(value("near_limit"), near, "{args:?}: {page}");
    }
    let (status, stderr) = run_to_exit(&["serve", "--http", "127.0.0.1:0", "--envoy-near-limit-ratio", "1.5"]);
    assert!(!status.success() && stderr.contains("--envoy-near-limit-ratio: must be between 0 and 1"), "{stderr}");
}

#[tokio::test]
async fn response_headers_have_upstream_s_names_by_default_configurable_names_and_the_ietf_draft() {
    let user: Descriptor<'_> = &[("user", "gus")];
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &["--envoy-response-headers"]).await;
    let r = e.ask("api", &[user, &[("tenant", "acme")]], 0).await;
    let h = headers(&r);
    assert_eq!(h[..2], [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "9")], "the tightest limit");
    let reset: u64 = h[2].1.parse().expect("seconds");
    assert!(h[2].0 == "RateLimit-Reset" && (59..=60).contains(&reset), "{h:?}");
    // Names from the rules file, switched on by the environment.
    let rules = RulesFile::new(
        "envoy_limit_header = \"X-RL-Limit\"\nenvoy_remaining_header = \"X-RL-Remaining\"\nenvoy_reset_header = \"X-RL-Reset\"\n",
    );
    let env = [("SLIDEGATE_ENVOY_RESPONSE_HEADERS", "true")];
    let mut e = Envoy::start_with_env(&[("every_field.yaml", EVERY_FIELD)], &["--config", rules.arg()], &env).await;
    let r = e.ask("api", &[user], 0).await;
    let names: Vec<&str> = headers(&r).iter().map(|h| h.0).collect();
    assert_eq!(names, ["X-RL-Limit", "X-RL-Remaining", "X-RL-Reset"]);
    // The IETF draft's structured fields, one member per limit.
    let args = ["--envoy-response-headers", "--envoy-response-headers-style", "ietf"];
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &args).await;
    let r = e.ask("api", &[user, &[("tenant", "acme")]], 0).await;
    let h = headers(&r);
    assert_eq!(h[0], ("RateLimit-Policy", r#""api.user";q=10;w=60, "tenant";q=100;w=3600"#));
    assert!(h[1].0 == "RateLimit" && h[1].1.starts_with(r#""api.user";r=9;t="#), "{h:?}");
    assert!(h[1].1.contains(r#", "tenant";r=99;t="#), "{h:?}");
    // Without the setting: none.
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &[]).await;
    assert!(e.ask("api", &[user], 0).await.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn series_have_upstream_s_prometheus_names_and_labels() {
    let messaging = std::fs::read_to_string(format!("{FIXTURES}/messaging.yaml")).expect("messaging");
    let edge = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 100}\n    descriptors:\n      - key: path\n        descriptors:\n          - key: method\n            rate_limit: {unit: second, requests_per_unit: 100}\n";
    let mut e =
        Envoy::start(&[("messaging.yaml", &messaging), ("edge.yaml", edge), ("every_field.yaml", EVERY_FIELD)], &[])
            .await;
    e.ask("messaging", &[&[("to_number", "1")], &[("message_type", "marketing"), ("to_number", "2")]], 0).await;
    e.ask("edge", &[&[("remote_address", "10.0.0.1")]], 0).await;
    e.ask("edge", &[&[("remote_address", "10.0.0.1"), ("path", "/a"), ("method", "GET")]], 0).await;
    e.ask("api", &[&[("route", "/orders")], &[("trial", "t")]], 0).await;
    e.ask("api", &[&[("trial", "t")]], 0).await;
    e.ask("nowhere", &[&[("a", "b")], &[("c", "d")]], 0).await;
    let page = e.metrics().await;
    for line in [
        // One entry: domain and key1; two: key2; three and more: the third is dropped.
        r#"ratelimit_service_rate_limit_total_hits{domain="messaging",key1="to_number"} 1"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="messaging",key1="message_type_marketing",key2="to_number"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address",key2="path"} 1"#,
        // value_to_metric: the request's value.
        r#"ratelimit_service_rate_limit_total_hits{domain="api",key1="route_/orders"} 1"#,
        // Over a shadow-mode limit: over and shadow mode, answered OK.
        r#"ratelimit_service_rate_limit_over_limit{domain="api",key1="trial"} 1"#,
        r#"ratelimit_service_rate_limit_shadow_mode{domain="api",key1="trial"} 1"#,
        r#"ratelimit_service_rate_limit_domain_not_found{domain="nowhere"} 2"#,
        "ratelimit_service_config_load_success 1",
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 6"#,
    ] {
        assert!(page.lines().any(|l| l == line), "{line} not in {page}");
    }
    assert!(
        page.contains(r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="0.001"}"#),
        "{page}"
    );
    assert!(!page.contains("slidegate_envoy_total_hits"), "the former series are gone");
}

#[tokio::test]
async fn an_ipv4_value_is_one_label_as_upstream_s_exporter_cleans_it() {
    let edge = "domain: edge\ndescriptors:\n  - key: remote_address\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 100}\n";
    let mut e = Envoy::start(&[("edge.yaml", edge)], &[]).await;
    e.ask("edge", &[&[("remote_address", "192.168.1.100")]], 0).await;
    let page = e.metrics().await;
    let line = r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address_192_168_1_100"} 1"#;
    assert!(page.lines().any(|l| l == line), "{page}");
}

#[tokio::test]
async fn dynamic_metadata_carries_the_request_and_the_metadata_of_passed_limits() {
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &["--envoy-response-dynamic-metadata"]).await;
    let r = e.ask("api", &[&[("tenant", "acme")], &[("user", "hal")]], 3).await;
    let m = r.dynamic_metadata.expect("dynamic metadata");
    let text = |k: &str| match &m.fields[k].kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(text("domain"), "api");
    assert!(matches!(m.fields["hitsAddend"].kind, Some(Kind::NumberValue(n)) if n == 3.0));
    let Some(Kind::ListValue(descriptors)) = &m.fields["descriptors"].kind else { panic!("descriptors") };
    assert_eq!(descriptors.values.len(), 2);
    let Some(Kind::StructValue(metadata)) = &m.fields["metadata"].kind else { panic!("metadata: {m:?}") };
    assert!(matches!(&metadata.fields["owner"].kind, Some(Kind::StringValue(s)) if s == "payments"));
    // Without the setting: none.
    let mut e = Envoy::start(&[("every_field.yaml", EVERY_FIELD)], &[]).await;
    assert!(e.ask("api", &[&[("tenant", "acme")]], 0).await.dynamic_metadata.is_none());
}

#[tokio::test]
async fn hostile_wildcard_patterns_and_values_are_decided_in_bounded_time() {
    // The attack on a backtracking glob: many stars, and 500-byte values that fail at the end.
    let pattern = format!("{}*c*b", "*a".repeat(200));
    let yaml = format!(
        "domain: w\ndescriptors:\n  - key: v\n    value: \"{pattern}\"\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
    );
    let mut e = Envoy::start(&[("w.yaml", &yaml)], &[]).await;
    let started = Instant::now();
    for i in 0..200 {
        // Starts and ends as the pattern does; only the missing `c` fails it, at the end.
        let value = format!("{i}{}b", "a".repeat(480));
        let r = e.ask("w", &[&[("v", &value)]], 0).await;
        assert!(r.statuses[0].current_limit.is_none(), "no c: no match");
    }
    let matching = format!("{}cb", "a".repeat(400));
    assert!(e.ask("w", &[&[("v", &matching)]], 0).await.statuses[0].current_limit.is_some());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}
