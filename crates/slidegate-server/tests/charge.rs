//! Costs known after the work, through the real binary: a tokens-per-minute budget settled when
//! the work ends. Over HTTP an estimate is checked, the rest charged, an over-estimate refunded
//! (docs/service.md's rule and commands, as written); over gRPC docs/envoy.md's token route is
//! played as Envoy sends it — a check at the request, the tokens at the stream's end — against
//! its `charge_over_limit` domain. On memory and on Redis (by the Lua scripts and by slidegate's
//! module), 64 callers at once: the window holds
//! exactly the tokens charged, and a user over budget is denied until the window frees. Bad
//! input is refused as a check refuses it, changing nothing.

mod support;

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::envoy::{Envoy, OK, OVER, codes, descriptor, request};
use support::{RulesFile, Slidegate, key_count};

/// Users of 12,000 tokens a minute (`budget`), and of 1,000 every 2 s (`fast`).
const RULES: &str = r#"admin_token = "t"

[[rules]]
name = "budget"
limit = 12000
window = "60s"

[[rules]]
name = "fast"
limit = 1000
window = "2s"
"#;

fn doc(path: &str) -> String {
    let full = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The body of the `n`th fenced block in `lang` after the first line starting with `marker`.
fn block(text: &str, marker: &str, lang: &str, n: usize) -> String {
    let section = &text[format!("\n{text}").find(&format!("\n{marker}")).unwrap_or_else(|| panic!("no {marker:?}"))..];
    let fence = format!("```{lang}\n");
    let body = section.split(&fence).nth(n + 1).unwrap_or_else(|| panic!("no {lang} block {n} after {marker:?}"));
    body[..body.find("```").expect("closed block")].to_owned()
}

/// A server with [`RULES`], docs/service.md's token rule, `backend` as `[backend]`, and
/// docs/envoy.md's token domain on gRPC.
async fn serve(backend: &str) -> (Envoy, RulesFile) {
    let service = doc("docs/service.md");
    let tpm = block(&service, "### Costs known after the work", "toml", 0);
    let rules = RulesFile::new(&format!("{RULES}\n{tpm}\n[backend]\n{backend}"));
    let domain = block(&doc("docs/envoy.md"), "### Tokens known at stream end", "yaml", 0);
    (Envoy::start(&[("llm.yaml", &domain)], &["--config", rules.arg()]).await, rules)
}

/// POSTs `body` to `path` of the server at `base`: (status, JSON).
async fn post(client: &Client, base: &str, path: &str, body: &str) -> (u16, Value) {
    let response = client.post(format!("{base}{path}")).body(body.to_owned()).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The tokens caller `i` uses: from 400 to 2,299, an estimate of 1,000 both short and over.
fn used_over_http(i: u64) -> u64 {
    400 + (i * 733) % 1_900
}

/// 64 callers on 4 users, each checking an estimate of 1,000 and settling what it used; then one
/// user over a 2-second budget, denied until its window frees.
async fn tokens_per_minute_over_http(backend: &str) {
    let (envoy, _rules) = serve(backend).await;
    let (client, server) = (Client::new(), &envoy.server);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (client, base) = (client.clone(), server.base.clone());
        calls.spawn(async move {
            let user = format!("u{}", i % 4);
            let estimate = format!(r#"{{"rule":"budget","key":"{user}","cost":1000}}"#);
            let (status, v) = post(&client, &base, "/v1/check", &estimate).await;
            assert_eq!(status, 200, "{v}");
            if v["allowed"] != true {
                return (user, 0);
            }
            let used = used_over_http(i);
            let (path, cost, field) = if used > 1000 {
                ("/v1/charge", used - 1000, "recorded")
            } else {
                ("/v1/refund", 1000 - used, "refunded")
            };
            let body = format!(r#"{{"rule":"budget","key":"{user}","cost":{cost}}}"#);
            let (status, v) = post(&client, &base, path, &body).await;
            assert_eq!((status, &v[field]), (200, &json!(cost)), "{path}: {v}");
            (user, used)
        });
    }
    let mut spent = [0u64; 4];
    for (user, used) in calls.join_all().await {
        spent[user[1..].parse::<usize>().expect("u<n>")] += used;
    }
    for (i, spent) in spent.iter().enumerate() {
        let user = format!("u{i}");
        assert_eq!(key_count(&client, server, &format!("budget/{user}")).await, *spent, "{user}: the tokens charged");
        if *spent >= 12_000 {
            let (_, v) =
                post(&client, &server.base, "/v1/check", &format!(r#"{{"rule":"budget","key":"{user}"}}"#)).await;
            assert_eq!(v["allowed"], false, "{user} spent {spent}: {v}");
        }
    }

    // An estimate of 600 admitted, 1,500 used: the 900 more are recorded past the limit, and the
    // user is denied until the 600 leave the window.
    let (_, v) = post(&client, &server.base, "/v1/check", r#"{"rule":"fast","key":"f","cost":600}"#).await;
    assert_eq!((&v["allowed"], &v["remaining"]), (&json!(true), &json!(400)), "{v}");
    let (status, v) = post(&client, &server.base, "/v1/charge", r#"{"rule":"fast","key":"f","cost":900}"#).await;
    assert_eq!(
        (status, &v["allowed"], &v["recorded"], &v["clamped"]),
        (200, &json!(false), &json!(900), &json!(false))
    );
    let wait = v["retry_after_ms"].as_u64().unwrap_or_else(|| panic!("over: a wait: {v}"));
    assert!(wait > 0 && wait <= 2_000, "{v}");
    assert_eq!(key_count(&client, server, "fast/f").await, 1_500);
    let (_, v) = post(&client, &server.base, "/v1/check", r#"{"rule":"fast","key":"f"}"#).await;
    assert_eq!(v["allowed"], false, "denied while over: {v}");
    let wait = v["retry_after_ms"].as_u64().unwrap_or_else(|| panic!("a denial's wait: {v}"));
    tokio::time::sleep(Duration::from_millis(wait + 100)).await;
    let (_, v) = post(&client, &server.base, "/v1/check", r#"{"rule":"fast","key":"f"}"#).await;
    assert_eq!(v["allowed"], true, "the window freed the first 600: {v}");

    // docs/service.md's commands, as written: an estimate of 1,000, 350 more, then 600 back.
    let commands = block(&doc("docs/service.md"), "### Costs known after the work", "sh", 0);
    let answers: Vec<Value> = commands
        .lines()
        .map(|line| {
            let line = line.replace("localhost:8080", server.base.trim_start_matches("http://"));
            let out = Command::new("sh").args(["-c", &line]).output().expect("sh and curl");
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{line}: {e}: {out:?}"))
        })
        .collect();
    assert_eq!(answers.len(), 3);
    assert_eq!(
        (&answers[0]["allowed"], &answers[1]["recorded"], &answers[2]["refunded"]),
        (&json!(true), &json!(350), &json!(600))
    );
    assert_eq!(key_count(&client, server, "tpm/user-1").await, 750);
}

/// The tokens Envoy caller `i` reports at its stream's end: 3,000 to 11,999.
fn used_over_grpc(i: u64) -> u64 {
    3_000 + (i * 2_741) % 9_000
}

/// One call of docs/envoy.md's route: which descriptor key, with what `hits_addend` — a number,
/// or (for the format reading the response's usage) `None` — and whether at the stream's end.
struct RouteLimit {
    key: String,
    hits: Option<u64>,
    on_stream_done: bool,
}

/// docs/envoy.md's route, read as Envoy reads it.
fn route_limits() -> Vec<RouteLimit> {
    let route = block(&doc("docs/envoy.md"), "### Tokens known at stream end", "yaml", 1);
    let route: serde_yaml_ng::Value = serde_yaml_ng::from_str(&route).expect("the route's YAML");
    let limits = route["typed_per_filter_config"]["envoy.filters.http.ratelimit"]["rate_limits"]
        .as_sequence()
        .expect("rate_limits");
    limits
        .iter()
        .map(|l| {
            let actions = l["actions"].as_sequence().expect("actions");
            assert_eq!(actions.len(), 1, "one entry a descriptor");
            let key = actions[0]["request_headers"]["descriptor_key"].as_str().expect("a descriptor key").to_owned();
            let hits = &l["hits_addend"];
            let hits = match (hits["number"].as_u64(), hits["format"].as_str()) {
                (Some(n), None) => Some(n),
                (None, Some(format)) => {
                    assert!(format.starts_with("%DYNAMIC_METADATA("), "{format}");
                    None
                }
                other => panic!("hits_addend: {other:?}"),
            };
            RouteLimit { key, hits, on_stream_done: l["apply_on_stream_done"].as_bool().unwrap_or(false) }
        })
        .collect()
}

/// The call Envoy sends for `user` in one phase of the route: the request's, or with `tokens`
/// the stream end's.
fn envoy_call(limits: &[RouteLimit], user: &str, tokens: Option<u64>) -> RateLimitRequest {
    let descriptors = limits
        .iter()
        .filter(|l| l.on_stream_done == tokens.is_some())
        .map(|l| {
            let mut d = descriptor(&[(&l.key, user)]);
            d.hits_addend = Some(UInt64Value { value: l.hits.or(tokens).expect("a hit count") });
            d
        })
        .collect();
    RateLimitRequest { domain: "llm".into(), descriptors, hits_addend: 0 }
}

/// 64 Envoy streams on 4 users of 100,000 tokens a minute, more than their budgets: each checked
/// at the request and, admitted, charged its tokens at the stream's end, recorded in full; then
/// a user charged past the limit is over at its next request.
async fn tokens_per_minute_over_grpc(backend: &str) {
    let (envoy, _rules) = serve(backend).await;
    let limits = route_limits();
    assert_eq!(limits.iter().map(|l| l.on_stream_done).collect::<Vec<_>>(), [false, true]);
    let client = Client::new();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64 {
        let mut grpc = envoy.client.clone();
        let (request, done) = (envoy_call(&limits, &format!("u{}", i % 4), None), used_over_grpc(i));
        let end = envoy_call(&limits, &format!("u{}", i % 4), Some(done));
        calls.spawn(async move {
            let answer = grpc.should_rate_limit(request).await.expect("answer").into_inner();
            if answer.overall_code != OK {
                return (i % 4, 0);
            }
            // Envoy ignores the stream end's answer; the tokens are recorded whatever it says.
            grpc.should_rate_limit(end).await.expect("answer");
            (i % 4, done)
        });
    }
    let mut spent = [0u64; 4];
    for (user, used) in calls.join_all().await {
        spent[usize::try_from(user).expect("small")] += used;
    }
    let mut grpc = envoy.client.clone();
    for (i, spent) in spent.iter().enumerate() {
        let user = format!("u{i}");
        assert_eq!(key_count(&client, &envoy.server, &format!("envoy:llm/user={user}")).await, *spent, "{user}");
        if *spent >= 100_000 {
            let answer = grpc.should_rate_limit(envoy_call(&limits, &user, None)).await.expect("answer").into_inner();
            assert_eq!(codes(&answer), (OVER, vec![OVER]), "{user} spent {spent}");
        }
    }

    // 99,000 tokens, then 2,000 more past the limit: both recorded, the second answered over,
    // the user's next request over until the first leave the window.
    let mut settle = async |tokens| grpc.should_rate_limit(envoy_call(&limits, "heavy", Some(tokens))).await;
    assert_eq!(codes(&settle(99_000).await.expect("answer").into_inner()), (OK, vec![OK]));
    assert_eq!(codes(&settle(2_000).await.expect("answer").into_inner()), (OVER, vec![OVER]));
    assert_eq!(key_count(&client, &envoy.server, "envoy:llm/user=heavy").await, 101_000);
    let answer = grpc.should_rate_limit(envoy_call(&limits, "heavy", None)).await.expect("answer").into_inner();
    assert_eq!(codes(&answer), (OVER, vec![OVER]));
    let reset = answer.statuses[0].duration_until_reset.as_ref().expect("a reset");
    assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");
}

#[tokio::test]
async fn tokens_per_minute_over_http_in_memory() {
    tokens_per_minute_over_http("").await;
}

#[tokio::test]
async fn tokens_per_minute_over_grpc_in_memory() {
    tokens_per_minute_over_grpc("").await;
}

/// `[backend]` on `redis` by `engine`, with a deadline no busy machine misses (a missed one
/// would answer by the failure policy, not decide).
fn on_redis(redis: &RedisServer, engine: &str) -> String {
    format!("redis = \"{}\"\nengine = \"{engine}\"\ntimeout = \"10s\"", redis.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_over_http_on_redis_by_lua() {
    let redis = RedisServer::start();
    tokens_per_minute_over_http(&on_redis(&redis, "lua")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_over_grpc_on_redis_by_lua() {
    let redis = RedisServer::start();
    tokens_per_minute_over_grpc(&on_redis(&redis, "lua")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_over_http_on_redis_by_the_module() {
    let redis = RedisServer::start_with_module(&[]);
    tokens_per_minute_over_http(&on_redis(&redis, "module")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_over_grpc_on_redis_by_the_module() {
    let redis = RedisServer::start_with_module(&[]);
    tokens_per_minute_over_grpc(&on_redis(&redis, "module")).await;
}

/// Bad bodies, each answered by `/v1/charge` and `/v1/refund` as `/v1/check` answers it, and
/// changing nothing; a group is settled check by check.
#[tokio::test]
async fn bad_input_is_refused_as_a_check_refuses_it_and_groups_settle_check_by_check() {
    let (envoy, _rules) = serve("").await;
    let (client, server) = (Client::new(), &envoy.server);
    for (body, status, code) in [
        (r#"{"rule":"budget","key":"x","cost":0}"#, 400, "invalid_cost"),
        (r#"{"rule":"budget","key":"x","cost":12001}"#, 400, "invalid_cost"),
        (r#"{"rule":"nope","key":"x","cost":1}"#, 404, "unknown_rule"),
        (r#"{"rule":"budget","key":"x","cost":"#, 400, "invalid_json"),
        (r#"{"rule":"budget","key":"x","cost":"5"}"#, 400, "invalid_json"),
        (r#"{"rule":"budget","cost":1}"#, 400, "missing_key"),
        (r#"{"checks":[]}"#, 400, "invalid_checks"),
        (
            r#"{"checks":[{"rule":"budget","key":"x","cost":5},{"rule":"budget","key":"y","cost":0}]}"#,
            400,
            "invalid_cost",
        ),
    ] {
        for path in ["/v1/check", "/v1/charge", "/v1/refund"] {
            let (got, v) = post(&client, &server.base, path, body).await;
            assert_eq!((got, v["error"]["code"].as_str()), (status, Some(code)), "{path} {body}: {v}");
        }
    }
    assert_eq!(key_count(&client, server, "budget/x").await, 0, "nothing charged");
    // Over gRPC, a stream end with nothing decidable is INVALID_ARGUMENT, as a check is.
    let entries: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut grpc = envoy.client.clone();
    let refused = grpc.should_rate_limit(request("llm", &[&entries], 500)).await.expect_err("nothing decidable");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");

    let group = r#"{"checks":[{"rule":"budget","key":"g","cost":11000},{"rule":"fast","key":"g","cost":1000}]}"#;
    let (status, v) = post(&client, &server.base, "/v1/charge", group).await;
    assert_eq!((status, &v["allowed"], &v["retry_after_ms"]), (200, &json!(true), &Value::Null), "{v}");
    assert_eq!((&v["results"][0]["recorded"], &v["results"][1]["remaining"]), (&json!(11000), &json!(0)), "{v}");
    let (_, v) = post(&client, &server.base, "/v1/charge", group).await;
    assert_eq!(
        (&v["allowed"], &v["results"][0]["allowed"], &v["results"][1]["allowed"]),
        (&json!(false), &json!(false), &json!(false))
    );
    assert!(v["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{v}");
    assert_eq!(key_count(&client, server, "budget/g").await, 22_000, "each recorded, past the limit");
    let refund = r#"{"checks":[{"rule":"budget","key":"g","cost":12000},{"rule":"budget","key":"h","cost":5}]}"#;
    let (_, v) = post(&client, &server.base, "/v1/refund", refund).await;
    assert_eq!((&v["results"][0]["refunded"], &v["results"][1]["refunded"]), (&json!(12000), &json!(0)), "{v}");
    assert_eq!((&v["results"][0]["allowed"], &v["results"][0]["remaining"]), (&json!(true), &json!(2000)), "{v}");
    assert_eq!(key_count(&client, server, "budget/g").await, 10_000);
}

/// A rule with a warm-up is charged and refunded on every engine: a charge into an idle key
/// starts the ramp (the cold limit, half of 10, for the hour it lasts), so a check that a warm
/// key would admit is denied; a charge past the cold limit is recorded whole; refunds give it
/// back, no more than it holds. The memory backend, Lua scripts on Redis' clock, the module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_up_rules_are_charged_and_refunded_on_every_engine() {
    let (plain, with_module) = (RedisServer::start(), RedisServer::start_with_module(&[]));
    for backend in [String::new(), on_redis(&plain, "lua"), on_redis(&with_module, "module")] {
        let mut text = format!("admin_token = \"t\"\n[backend]\n{backend}\n");
        for algorithm in ["sliding_log", "sliding_window", "fixed_window", "gcra"] {
            text += &format!(
                "[[rules]]\nname = \"{algorithm}\"\nlimit = 10\nwindow = \"1h\"\nalgorithm = \"{algorithm}\"\n\
                 warm_up = \"1h\"\ncold_fraction = 0.5\n"
            );
        }
        let rules = RulesFile::new(&text);
        let server = Slidegate::serve(&["--config", rules.arg()]);
        let client = Client::new();
        for rule in ["sliding_log", "sliding_window", "fixed_window", "gcra"] {
            let at = |cost: u64| format!(r#"{{"rule":"{rule}","key":"x","cost":{cost}}}"#);
            let (status, v) = post(&client, &server.base, "/v1/charge", &at(4)).await;
            let answer = (&v["recorded"], &v["allowed"], &v["limit"], &v["remaining"]);
            assert_eq!(
                (status, answer),
                (200, (&json!(4), &json!(true), &json!(5), &json!(1))),
                "{backend} {rule}: {v}"
            );
            let (_, v) = post(&client, &server.base, "/v1/check", &at(2)).await;
            assert_eq!((&v["allowed"], &v["limit"]), (&json!(false), &json!(5)), "{rule} on {backend}: cold, {v}");
            let (_, v) = post(&client, &server.base, "/v1/charge", &at(3)).await;
            assert_eq!((&v["recorded"], &v["allowed"]), (&json!(3), &json!(false)), "{backend} {rule}: {v}");
            if rule == "sliding_log" {
                // (The counters' count is what they use of the limit, at most 5: the refunds
                // below show the 7 they hold.)
                assert_eq!(key_count(&client, &server, &format!("{rule}/x")).await, 7, "{backend} {rule}");
            }
            // A refund's cost is bounded as a check's: what an idle key admits, the cold 5.
            for (refunded, remaining) in [(5, 3), (2, 5)] {
                let (_, v) = post(&client, &server.base, "/v1/refund", &at(5)).await;
                let answer = (&v["refunded"], &v["allowed"], &v["remaining"]);
                assert_eq!(answer, (&json!(refunded), &json!(true), &json!(remaining)), "{backend} {rule}: {v}");
            }
            assert_eq!(key_count(&client, &server, &format!("{rule}/x")).await, 0, "{backend} {rule}");
        }
    }
}

/// Every algorithm is charged and refunded by the Lua scripts: a sliding
/// window counter's and a GCRA's charge past the limit is recorded, the key then denied; the
/// refund brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_and_gcra_rules_are_charged_on_lua() {
    let redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        "[backend]\n{}\n[[rules]]\nname = \"sw\"\nlimit = 10\nwindow = \"60s\"\nalgorithm = \"sliding_window\"\n\n[[rules]]\nname = \"g\"\nlimit = 10\nwindow = \"60s\"\nalgorithm = \"gcra\"\n",
        on_redis(&redis, "lua")
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    for rule in ["sw", "g"] {
        let body = format!(r#"{{"rule":"{rule}","key":"x","cost":10}}"#);
        let (status, v) = post(&client, &server.base, "/v1/check", &body).await;
        assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{rule}: {v}");
        let (status, v) = post(&client, &server.base, "/v1/charge", &body).await;
        assert_eq!((status, &v["recorded"], &v["allowed"]), (200, &json!(10), &json!(false)), "{rule}: {v}");
        let one = format!(r#"{{"rule":"{rule}","key":"x"}}"#);
        assert_eq!(post(&client, &server.base, "/v1/check", &one).await.1["allowed"], false, "{rule}: over");
        let (_, v) = post(&client, &server.base, "/v1/refund", &body).await;
        assert_eq!(
            (&v["refunded"], &v["allowed"], &v["remaining"]),
            (&json!(10), &json!(true), &json!(0)),
            "{rule}: {v}"
        );
        let (_, v) = post(&client, &server.base, "/v1/refund", &body).await;
        assert_eq!((&v["refunded"], &v["remaining"]), (&json!(10), &json!(10)), "{rule}: {v}");
    }
}
