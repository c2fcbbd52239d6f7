//! The forward-auth endpoints against the real binary, on each engine: concurrent callers that
//! forge their address in every forwarding header are admitted exactly `limit` times in all,
//! each denial in its dialect (429 for Traefik, Caddy and HAProxy; 403 for nginx) with
//! `Retry-After` and the RateLimit headers; behind a trusted proxy the forwarded client counts,
//! IPv6 by its /64; rules' key parts, matches and costs; each spelling of a question (`HEAD`, a
//! rule's name percent-encoded) one route; failure policies with Redis gone; the decisions in
//! `/metrics` and on the dashboard.

mod support;

use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::{RedisCluster, RedisServer};
use support::{RulesFile, Slidegate, metric};

/// `api` counts the client's address; nothing is trusted but a network no test connects from.
const RULES: &str = r#"
[forward_auth]
trusted_proxies = ["10.0.0.0/8"]

[[rules]]
name = "api"
limit = 5
window = "60s"
"#;

/// An answer: status, headers, JSON body (`Null` when there is none).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The permits left, as the `RateLimit` header says (`"rule";r=…;t=…`): an allowed answer
    /// has no body.
    fn remaining(&self) -> Option<u64> {
        let r = self.header("ratelimit")?.split(';').find_map(|p| p.strip_prefix("r="))?;
        r.parse().ok()
    }
}

/// `GET path` with `headers`.
async fn ask(client: &Client, server: &Slidegate, path: &str, headers: &[(&str, String)]) -> Answer {
    let mut request = client.get(server.url(path));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.expect("request");
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let bytes = response.bytes().await.expect("body");
    Answer { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
}

/// Headers that claim to be client number `i`, in every forwarding header.
fn forged(i: usize) -> Vec<(&'static str, String)> {
    let ip = format!("198.51.{}.{}", i / 250, i % 250 + 1);
    vec![("x-forwarded-for", ip.clone()), ("x-real-ip", ip.clone()), ("forwarded", format!("for={ip}"))]
}

/// A denial as `dialect_status` says, carrying `Retry-After`, the RateLimit headers and the
/// decision `/v1/check` answers — nginx's (a 403) no body, which nginx would not read.
fn assert_denied(answer: &Answer, dialect_status: u16, what: &str) {
    assert_eq!(answer.status, dialect_status, "{what}: {:?}", answer.body);
    let retry: u64 = answer.header("retry-after").and_then(|v| v.parse().ok()).expect("a Retry-After in seconds");
    assert!((1..=60).contains(&retry), "{what}: Retry-After {retry}");
    assert_eq!(answer.header("ratelimit-policy"), Some("\"api\";q=5;w=60"), "{what}");
    assert!(answer.header("ratelimit").is_some_and(|v| v.starts_with("\"api\";r=0;t=")), "{what}");
    if dialect_status == 403 {
        assert_eq!((answer.header("content-length"), &answer.body), (Some("0"), &Value::Null), "{what}");
    } else {
        assert_eq!((&answer.body["rule"], &answer.body["allowed"]), (&json!("api"), &json!(false)), "{what}");
    }
}

/// 40 concurrent callers from this address, each forging a client of its own, admitted 5
/// times in all; then each dialect's denial.
async fn forged_callers_share_one_exact_limit(server: &Slidegate, engine: &str) {
    let client = Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (client, url) = (client.clone(), server.url("/v1/forward-auth/api"));
        tasks.spawn(async move {
            let mut request = client.get(url);
            for (name, value) in forged(i) {
                request = request.header(name, value);
            }
            request.send().await.expect("request").status().as_u16()
        });
    }
    let statuses = tasks.join_all().await;
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(admitted, 5, "{engine}: {statuses:?}");
    assert!(statuses.iter().all(|s| [200, 429].contains(s)), "{engine}: {statuses:?}");
    let denied = ask(&client, server, "/v1/forward-auth/api", &forged(99)).await;
    assert_denied(&denied, 429, &format!("{engine} forward-auth"));
    let nginx = ask(&client, server, "/v1/auth-request/api", &forged(98)).await;
    assert_denied(&nginx, 403, &format!("{engine} auth-request"));
    // HEAD is answered as GET, without the body.
    let head = client.head(server.url("/v1/forward-auth/api")).send().await.expect("HEAD");
    assert_eq!((head.status().as_u16(), head.headers().contains_key("retry-after")), (429, true), "{engine}");
}

async fn on(backend: &str, engine: &str) {
    let rules = RulesFile::new(&format!("{backend}{RULES}"));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    forged_callers_share_one_exact_limit(&server, engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    on("", "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lua() {
    let redis = RedisServer::start();
    on(&format!("[backend]\nredis = \"{}\"\nengine = \"lua\"\ntimeout = \"10s\"\n", redis.url()), "lua").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_module() {
    let redis = RedisServer::start_with_module(&[]);
    on(&format!("[backend]\nredis = \"{}\"\nengine = \"module\"\ntimeout = \"10s\"\n", redis.url()), "module").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    on(&format!("[backend]\nredis_cluster = {:?}\ntimeout = \"10s\"\n", cluster.urls()), "cluster").await;
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_client_counts_and_ipv6_by_its_network() {
    let rules = RulesFile::new(
        "[forward_auth]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n[[rules]]\nname = \"api\"\nlimit = 1\nwindow = \"60s\"\n",
    );
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    let xff = |v: &str| vec![("x-forwarded-for", v.to_owned())];
    // The client's own claim left of the proxy's hop is not believed: the last one counts.
    let first = ask(&client, &server, "/v1/forward-auth/api", &xff("198.51.100.66, 203.0.113.9")).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let again = ask(&client, &server, "/v1/forward-auth/api", &xff("198.51.100.67, 203.0.113.9")).await;
    assert_eq!(again.status, 429, "203.0.113.9 again, whatever it claims");
    assert_eq!(ask(&client, &server, "/v1/forward-auth/api", &xff("203.0.113.10")).await.status, 200);
    // Two addresses of one /64 are one client; the next /64 is another.
    assert_eq!(ask(&client, &server, "/v1/forward-auth/api", &xff("2001:db8:1:2::1")).await.status, 200);
    assert_eq!(ask(&client, &server, "/v1/forward-auth/api", &xff("2001:db8:1:2:ffff::9")).await.status, 429);
    assert_eq!(ask(&client, &server, "/v1/forward-auth/api", &xff("2001:db8:1:3::1")).await.status, 200);
    // Without the header, the proxy itself is the client.
    assert_eq!(ask(&client, &server, "/v1/forward-auth/api", &[]).await.status, 200);
    let long = ask(&client, &server, "/v1/forward-auth/api", &xff(&"203.0.113.1,".repeat(400))).await;
    assert_eq!((long.status, &long.body["error"]["code"]), (431, &json!("header_too_long")), "{:?}", long.body);
}

const KEYED: &str = r#"admin_token = "t"

[[rules]]
name = "keyed"
limit = 3
window = "60s"
key = ["header:X-Api-Key", "method", "path"]
methods = ["POST"]
path_prefix = "/api/"
"#;

#[tokio::test]
async fn key_parts_matches_and_costs_decide_which_limit_a_request_takes() {
    let rules = RulesFile::new(KEYED);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    let described = |key: &str, method: &str, uri: &str| {
        vec![
            ("x-api-key", key.to_owned()),
            ("x-forwarded-method", method.to_owned()),
            ("x-forwarded-uri", uri.to_owned()),
        ]
    };
    let path = "/v1/forward-auth/keyed";
    // Outside the rule's methods or path: not counted.
    for (method, uri) in [("GET", "/api/x"), ("POST", "/admin/x")] {
        let answer = ask(&client, &server, path, &described("k1", method, uri)).await;
        assert_eq!(
            (answer.status, &answer.body, answer.header("ratelimit")),
            (200, &Value::Null, None),
            "{method} {uri}"
        );
    }
    // A cost of 2 takes two of the key's three permits; the query is not part of the path.
    let mut two = described("k1", "POST", "/api/x?page=1");
    two.push(("x-ratelimit-cost", "2".to_owned()));
    let answer = ask(&client, &server, path, &two).await;
    assert_eq!((answer.status, answer.remaining()), (200, Some(1)), "{:?}", answer.headers);
    let inspected = client.get(server.url("/v1/keys/keyed/k1%7CPOST%7C%2Fapi%2Fx")).bearer_auth("t").send().await;
    let inspected: Value = inspected.expect("inspect").json().await.expect("JSON");
    assert_eq!(inspected["count"], 2, "the key is its parts joined by |: {inspected}");
    assert_eq!(ask(&client, &server, path, &two).await.status, 429, "one permit left, two asked");
    // A part that holds the separator cannot reach another key's limit.
    let escaped = ask(&client, &server, path, &described("k1|POST", "POST", "/api/x")).await;
    assert_eq!((escaped.status, escaped.remaining()), (200, Some(2)));
    // Bad input: a 4xx naming what is wrong, never counted.
    let refusals = [
        (described("k2", "POST", "/api/x").into_iter().skip(1).collect::<Vec<_>>(), 400, "missing_key", "x-api-key"),
        (
            [described("k2", "POST", "/api/x"), vec![("x-ratelimit-cost", "two".into())]].concat(),
            400,
            "invalid_cost",
            "x-ratelimit-cost",
        ),
        (
            [described("k2", "POST", "/api/x"), vec![("x-ratelimit-cost", "0".into())]].concat(),
            400,
            "invalid_cost",
            "cost",
        ),
        (
            [described("k2", "POST", "/api/x"), vec![("x-ratelimit-cost", "4".into())]].concat(),
            400,
            "invalid_cost",
            "4",
        ),
        (described(&"k".repeat(600), "POST", "/api/x"), 400, "key_too_long", "512"),
    ];
    for (headers, status, code, named) in refusals {
        let answer = ask(&client, &server, path, &headers).await;
        assert_eq!((answer.status, &answer.body["error"]["code"]), (status, &json!(code)), "{:?}", answer.body);
        let message = answer.body["error"]["message"].as_str().unwrap_or_default().to_ascii_lowercase();
        assert!(message.contains(named), "{message}");
    }
    let k2 = described("k2", "POST", "/api/x");
    assert_eq!(ask(&client, &server, path, &k2).await.remaining(), Some(2), "k2 was never counted");
    let unknown = ask(&client, &server, "/v1/auth-request/nope", &k2).await;
    assert_eq!((unknown.status, &unknown.body["error"]["code"]), (404, &json!("unknown_rule")));
    assert!(unknown.body["error"]["message"].as_str().is_some_and(|m| m.contains("\"nope\"")));
}

/// The listener answers a question itself, and leaves to the router what needs it (a `HEAD`,
/// a rule's name percent-encoded): each spelling is one route, one limit and one answer, an
/// allowed one the RateLimit headers without a body; paths of no rule are the router's 404s.
#[tokio::test]
async fn every_spelling_of_a_question_is_one_route_and_one_limit() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    let plain = ask(&client, &server, "/v1/auth-request/api", &[]).await;
    let encoded = ask(&client, &server, "/v1/auth-request/%61pi", &[]).await;
    for (answer, left) in [(&plain, 4), (&encoded, 3)] {
        assert_eq!((answer.status, answer.remaining(), &answer.body), (200, Some(left), &Value::Null));
        assert_eq!((answer.header("content-type"), answer.header("content-length")), (None, Some("0")));
        assert_eq!(answer.header("ratelimit-policy"), Some("\"api\";q=5;w=60"));
    }
    let head = client.head(server.url("/v1/forward-auth/api")).send().await.expect("HEAD");
    let state = head.headers().get("ratelimit").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(head.status().as_u16(), 200);
    assert!(state.as_deref().is_some_and(|s| s.starts_with("\"api\";r=2;")), "{state:?}");
    let unknown = ask(&client, &server, "/v1/forward-auth/nope", &[]).await;
    assert_eq!((unknown.status, &unknown.body["error"]["code"]), (404, &json!("unknown_rule")));
    for path in ["/v1/forward-auth/api/", "/v1/auth-request/", "/v1/auth-request/api/x"] {
        let answer = ask(&client, &server, path, &[]).await;
        assert_eq!((answer.status, &answer.body["error"]["code"]), (404, &json!("not_found")), "{path}");
    }
    let latency = |route: &str| format!("slidegate_http_request_seconds_count{{route=\"/v1/{route}/{{rule}}\"}}");
    let counted = (
        metric(&client, &server, &latency("auth-request")).await,
        metric(&client, &server, &latency("forward-auth")).await,
    );
    assert_eq!(counted, (2.0, 2.0), "each question in its route's latency, whoever answered it");
}

#[tokio::test]
async fn decisions_are_counted_in_metrics_and_on_the_dashboard() {
    let rules = RulesFile::new(&format!("{RULES}\n[[rules]]\nname = \"other\"\nlimit = 1\nwindow = \"1s\"\n"));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    for i in 0..7 {
        let path = if i % 2 == 0 { "/v1/forward-auth/api" } else { "/v1/auth-request/api" };
        ask(&client, &server, path, &[]).await;
    }
    let allowed = metric(&client, &server, "slidegate_decisions_total{rule=\"api\",result=\"allowed\"}").await;
    let denied = metric(&client, &server, "slidegate_decisions_total{rule=\"api\",result=\"denied\"}").await;
    assert_eq!((allowed, denied), (5.0, 2.0));
    let latency = metric(&client, &server, "slidegate_http_request_seconds_count{route=\"/v1/auth-request/{rule}\"}");
    assert_eq!(latency.await, 3.0);
    let stats: Value = client.get(server.url("/v1/stats")).send().await.expect("stats").json().await.expect("JSON");
    let api = stats["rules"].as_array().and_then(|r| r.iter().find(|r| r["rule"] == "api")).expect("api's traffic");
    let sum = |series: &Value| series.as_array().map_or(0, |s| s.iter().filter_map(Value::as_u64).sum::<u64>());
    assert_eq!((sum(&api["allowed"]), sum(&api["denied"])), (5, 2), "{api}");
    assert_eq!(api["top_denied"]["keys"][0]["key"], "127.0.0.1", "{api}");
}

#[tokio::test]
async fn with_redis_gone_each_rule_s_failure_policy_answers_in_each_dialect() {
    let mut redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\ntimeout = \"100ms\"\n\n[[rules]]\nname = \"open\"\nlimit = 5\nwindow = \"60s\"\nfailure_policy = \"fail_open\"\n\n[[rules]]\nname = \"closed\"\nlimit = 5\nwindow = \"60s\"\nfailure_policy = \"fail_closed\"\n",
        redis.url()
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    redis.kill();
    let started = Instant::now();
    for (path, status) in [
        ("/v1/forward-auth/open", 200),
        ("/v1/auth-request/open", 200),
        ("/v1/forward-auth/closed", 429),
        ("/v1/auth-request/closed", 403),
    ] {
        let answer = ask(&client, &server, path, &[]).await;
        // Only a denial for the proxies that hand it to the client has a body.
        let degraded = if status == 429 { json!(true) } else { Value::Null };
        assert_eq!((answer.status, &answer.body["degraded"]), (status, &degraded), "{path}: {:?}", answer.body);
        assert!(started.elapsed() < Duration::from_secs(10), "{path}: answered within the deadline");
    }
}
