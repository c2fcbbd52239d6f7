//! The layer in a real axum server on a loopback port, driven by a real HTTP client.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use http::HeaderValue;
use reqwest::StatusCode;
use slidegate::{Backend, FailurePolicy, Limiter, Quota, RedisBackend};
use slidegate_testkit::RedisServer;
use slidegate_tower::{ForwardedHeader, PeerIp, RateLimitLayer, Rule};

/// Serves `layer` over two routes on 127.0.0.1:0; returns the base URL. The server task ends
/// with the test's runtime.
async fn serve<B: Backend + Clone + 'static>(layer: RateLimitLayer<B>) -> String {
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/search", get(|| async { "results" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.expect("serve");
    });
    format!("http://{addr}")
}

fn rule(name: &str, limit: u64) -> Rule {
    Rule::new(name, Quota::per_minute(limit).expect("quota")).expect("rule")
}

async fn statuses(client: &reqwest::Client, url: &str, n: usize, xff: Option<&str>) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut r = client.post(url);
        if let Some(xff) = xff {
            r = r.header("x-forwarded-for", xff);
        }
        out.push(r.send().await.expect("response").status().as_u16());
    }
    out
}

#[tokio::test]
async fn over_the_limit_is_429_with_retry_after_and_ratelimit_headers() {
    let layer = RateLimitLayer::new(Limiter::in_memory())
        .rule(rule("login", 2).route("/login"))
        .expect("layer")
        .deny_body(HeaderValue::from_static("text/plain; charset=utf-8"), "请求过于频繁，请稍后再试");
    let base = serve(layer).await;
    let client = reqwest::Client::new();
    let ok = client.post(format!("{base}/login")).send().await.expect("first");
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit-policy"], r#""login";q=2;w=60"#);
    assert_eq!(ok.headers()["ratelimit"], r#""login";r=1;t=60"#);
    assert!(ok.headers().get("retry-after").is_none());
    assert_eq!(ok.text().await.expect("body"), "welcome");
    client.post(format!("{base}/login")).send().await.expect("second");
    let denied = client.post(format!("{base}/login")).send().await.expect("third");
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = denied.headers().clone();
    assert_eq!(h["retry-after"], "60");
    assert_eq!(h["ratelimit"], r#""login";r=0;t=60"#);
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    assert_eq!(denied.text().await.expect("body"), "请求过于频繁，请稍后再试");
}

#[tokio::test]
async fn each_route_has_its_own_rule() {
    let layer = RateLimitLayer::new(Limiter::in_memory())
        .rule(rule("login", 2).route("/login"))
        .and_then(|l| l.rule(rule("search", 3).route_prefix("/search")))
        .expect("layer");
    let base = serve(layer).await;
    let client = reqwest::Client::new();
    assert_eq!(statuses(&client, &format!("{base}/login"), 3, None).await, [200, 200, 429]);
    let mut search = Vec::new();
    for _ in 0..4 {
        let r = client.get(format!("{base}/search")).send().await.expect("search");
        assert!(r.headers()["ratelimit-policy"].to_str().expect("ascii").starts_with("\"search\""));
        search.push(r.status().as_u16());
    }
    assert_eq!(search, [200, 200, 200, 429], "the login limit does not touch search");
    let unlimited = client.get(format!("{base}/elsewhere")).send().await.expect("404");
    assert!(unlimited.headers().get("ratelimit").is_none(), "no rule matches");
}

#[tokio::test]
async fn x_forwarded_for_counts_only_behind_a_trusted_proxy() {
    let client = reqwest::Client::new();
    // Untrusted by default: every spoofed address is still 127.0.0.1.
    let base = serve(RateLimitLayer::new(Limiter::in_memory()).rule(rule("login", 2)).expect("layer")).await;
    let url = format!("{base}/login");
    assert_eq!(statuses(&client, &url, 1, Some("198.51.100.1")).await, [200]);
    assert_eq!(statuses(&client, &url, 1, Some("198.51.100.2")).await, [200]);
    assert_eq!(statuses(&client, &url, 1, Some("198.51.100.3")).await, [429], "a header cannot buy a fresh limit");
    // Behind a trusted proxy (the test client plays it), each forwarded client has its own limit.
    let key = PeerIp::behind(["127.0.0.1"]).expect("valid").forwarded_by(ForwardedHeader::XForwardedFor);
    let base = serve(RateLimitLayer::new(Limiter::in_memory()).rule(rule("login", 2).key(key)).expect("layer")).await;
    let url = format!("{base}/login");
    assert_eq!(statuses(&client, &url, 3, Some("198.51.100.1")).await, [200, 200, 429]);
    assert_eq!(
        statuses(&client, &url, 2, Some("203.0.113.5, 198.51.100.2")).await,
        [200, 200],
        "the rightmost untrusted hop"
    );
    assert_eq!(statuses(&client, &url, 1, Some("198.51.100.2")).await, [429]);
}

#[tokio::test]
async fn shadow_mode_decides_and_reports_but_never_blocks() {
    let base =
        serve(RateLimitLayer::new(Limiter::in_memory()).rule(rule("login", 1)).expect("layer").shadow(true)).await;
    let client = reqwest::Client::new();
    let url = format!("{base}/login");
    assert_eq!(statuses(&client, &url, 3, None).await, [200, 200, 200]);
    let r = client.post(&url).send().await.expect("fourth");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["ratelimit"], r#""login";r=0;t=60"#, "what enforcement would say");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_one_redis_enforce_one_limit() {
    let redis = RedisServer::start();
    let instance = async || {
        let backend = RedisBackend::connect(&redis.url()).await.expect("connect").with_timeout(Duration::from_secs(5));
        serve(RateLimitLayer::new(Limiter::new(backend)).rule(rule("login", 10)).expect("layer")).await
    };
    let (a, b) = (instance().await, instance().await);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let url = format!("{}/login", if i % 2 == 0 { &a } else { &b });
            tokio::spawn(async move { statuses(&reqwest::Client::new(), &url, 3, None).await })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("client").iter().filter(|&&s| s == 200).count();
    }
    assert_eq!(admitted, 10, "48 requests over two instances, one limit of 10");
}

#[tokio::test]
async fn with_redis_down_each_failure_policy_does_what_it_says() {
    let cases = [
        (Some(FailurePolicy::FailOpen), [200, 200, 200]),
        (Some(FailurePolicy::FailClosed), [429, 429, 429]),
        (Some(FailurePolicy::local(0.5).expect("valid")), [200, 200, 429]),
        // No policy: the layer lets requests through rather than failing them.
        (None, [200, 200, 200]),
    ];
    for (policy, expected) in cases {
        let mut redis = RedisServer::start();
        let backend = RedisBackend::connect(&redis.url()).await.expect("connect");
        redis.kill();
        let limiter = Limiter::new(backend);
        let limiter = match policy {
            Some(p) => limiter.with_failure_policy(p),
            None => limiter,
        };
        let base = serve(RateLimitLayer::new(limiter).rule(rule("login", 4)).expect("layer")).await;
        let got = statuses(&reqwest::Client::new(), &format!("{base}/login"), 3, None).await;
        assert_eq!(got, expected, "{policy:?}");
    }
}

#[tokio::test]
async fn metrics_count_decisions_and_latency_in_the_service_s_naming_scheme() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().expect("recorder");
    let base = serve(RateLimitLayer::new(Limiter::in_memory()).rule(rule("metered", 2)).expect("layer")).await;
    statuses(&reqwest::Client::new(), &format!("{base}/login"), 3, None).await;
    let page = recorder.render();
    assert!(page.contains(r#"slidegate_decisions_total{rule="metered",result="allowed"} 2"#), "{page}");
    assert!(page.contains(r#"slidegate_decisions_total{rule="metered",result="denied"} 1"#), "{page}");
    // The histogram is the layer's, not the rule's: other tests' layers may add to it.
    let timed = page.lines().find_map(|l| l.strip_prefix("slidegate_decision_seconds_count "));
    assert!(timed.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n >= 3), "{page}");
    // Every family: counters end in `_total`, distributions (durations) in `_seconds`.
    let families: Vec<(&str, &str)> =
        page.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_once(' ')).collect();
    assert!(families.len() >= 2, "{page}");
    for (name, kind) in families {
        assert!(name.starts_with("slidegate_"), "{name}");
        match kind {
            "counter" => assert!(name.ends_with("_total"), "{name}"),
            "summary" | "histogram" => assert!(name.ends_with("_seconds"), "{name}"),
            _ => assert!(!name.ends_with("_total"), "{name} is a {kind}"),
        }
    }
}

#[tokio::test]
async fn tiers_and_costs_come_from_the_request() {
    let header = |name: &'static str| {
        move |req: &http::request::Parts| req.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
    };
    let plan = header("x-plan");
    let cost = header("x-cost");
    let rule = rule("api", 3)
        .tier("vip", Quota::per_minute(30).expect("quota"))
        .tier_by(plan)
        .cost_by(move |req| cost(req).and_then(|c| c.parse().ok()).unwrap_or(1))
        .key(header("x-user"));
    let base = serve(RateLimitLayer::new(Limiter::in_memory()).rule(rule).expect("layer")).await;
    let client = reqwest::Client::new();
    let send = async |user: &str, plan: Option<&str>, cost: u64| {
        let mut r = client.post(format!("{base}/login")).header("x-user", user).header("x-cost", cost.to_string());
        if let Some(p) = plan {
            r = r.header("x-plan", p);
        }
        let r = r.send().await.expect("response");
        (r.status().as_u16(), r.headers()["ratelimit-policy"].to_str().expect("ascii").to_owned())
    };
    assert_eq!(send("ada", None, 2).await, (200, r#""api";q=3;w=60"#.to_owned()));
    assert_eq!(send("ada", None, 2).await.0, 429, "2 + 2 > 3: the bulk request is refused whole");
    assert_eq!(send("ada", None, 1).await.0, 200);
    assert_eq!(send("bob", Some("vip"), 20).await, (200, r#""api";q=30;w=60"#.to_owned()));
    let anonymous = client.post(format!("{base}/login")).send().await.expect("response");
    assert!(anonymous.headers().get("ratelimit").is_none(), "no key, no limit from a per-user rule");
}
