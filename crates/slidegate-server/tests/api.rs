//! The HTTP API of the real binary on the embedded memory backend.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{RulesFile, Slidegate, check, metric};

const RULES: &str = r#"
[[rules]]
name = "sms"
limit = 5
window = "60s"

[[rules]]
name = "api"
limit = 2
window = "60s"
tiers = { vip = { limit = 100 } }

[[rules]]
name = "burst"
limit = 100
window = "3s"
"#;

fn allowed(v: &Value) -> bool {
    v["allowed"].as_bool().expect("allowed is a bool")
}

#[tokio::test]
async fn seven_requests_half_a_second_apart() {
    let server = Slidegate::serve(&[]);
    let client = reqwest::Client::new();
    let body = json!({"key": "user_1001", "limit": 5, "window": "10s", "algorithm": "sliding_log"});
    let mut seen = Vec::new();
    for i in 0..7 {
        let (status, headers, v) = check(&client, &server, &body).await;
        assert_eq!(status, 200);
        seen.push(allowed(&v));
        if i == 5 {
            assert_eq!(v["retry_after_ms"].as_u64().map(|r| r.div_ceil(1000)), Some(8), "{v}");
            assert_eq!(headers["retry-after"], "8");
            assert_eq!(headers["ratelimit"], "\"inline\";r=0;t=8");
        }
        if i < 6 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    assert_eq!(seen, [true, true, true, true, true, false, false]);
}

#[tokio::test]
async fn every_algorithm_is_served_with_its_parameters() {
    let server = Slidegate::serve(&[]);
    let client = reqwest::Client::new();
    let admitted = async |body: Value, n: usize| {
        let mut admitted = 0;
        for _ in 0..n {
            let (status, _, v) = check(&client, &server, &body).await;
            assert_eq!(status, 200, "{v}");
            admitted += usize::from(allowed(&v));
        }
        admitted
    };
    let gcra = json!({"key": "g", "limit": 10, "window": "1h", "algorithm": "gcra", "burst": 3});
    assert_eq!(admitted(gcra, 5).await, 3, "the burst, then one per 6 minutes");
    let window = json!({"key": "w", "limit": 4, "window": "1h", "algorithm": "sliding_window", "buckets": 6});
    assert_eq!(admitted(window, 6).await, 4);
    let fixed = json!({"key": "f", "limit": 2, "window": "1h", "algorithm": "fixed_window"});
    assert_eq!(admitted(fixed, 3).await, 2);
    let warm = json!({"key": "c", "limit": 10, "window": "1h", "warm_up": "1h", "cold_fraction": 0.3});
    assert_eq!(admitted(warm.clone(), 10).await, 3, "cold: 30% of 10");
    let (_, _, v) = check(&client, &server, &warm).await;
    assert_eq!((v["limit"].as_u64(), v["retry_after_ms"].is_u64()), (Some(3), true), "{v}");
}

#[tokio::test]
async fn a_burst_across_a_fixed_window_edge_is_denied() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let burst = |n: usize| {
        let client = client.clone();
        let url = server.url("/v1/check");
        async move {
            let requests = (0..n).map(|_| client.post(&url).json(&json!({"rule": "burst", "key": "ip"})).send());
            let mut admitted = 0;
            for r in futures_join(requests).await {
                let v: Value = r.expect("response").json().await.expect("json");
                admitted += usize::from(allowed(&v));
            }
            admitted
        }
    };
    let first_started = Instant::now();
    assert_eq!(burst(100).await, 100);
    // A second later: past the edge of any 1 s fixed window, inside the rolling 3 s one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = burst(100).await;
    assert!(first_started.elapsed() < Duration::from_secs(3), "the bursts took too long to test the window");
    assert_eq!(second, 0, "100 per 3 s: the second burst is inside the first's rolling window");
    // Once every admission has left its window, a burst is admitted whole.
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert_eq!(burst(100).await, 100, "a window later, all admitted again");
}

async fn futures_join<F: std::future::IntoFuture>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::IntoFuture: Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(|f| tokio::spawn(f.into_future())).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_get_exactly_the_limit() {
    let server = Slidegate::serve(&[]);
    let url = server.url("/v1/check");
    let clients = (0..64).map(|_| {
        let url = url.clone();
        async move {
            // One client (one connection pool) each.
            let client = reqwest::Client::new();
            let mut admitted = 0u32;
            for _ in 0..5 {
                let r = client.post(&url).json(&json!({"key": "hot", "limit": 100, "window": "60s"})).send().await;
                let v: Value = r.expect("response").json().await.expect("json");
                admitted += u32::from(allowed(&v));
            }
            admitted
        }
    });
    let admitted: u32 = futures_join(clients).await.into_iter().sum();
    assert_eq!(admitted, 100, "of 320 concurrent requests");
}

#[tokio::test]
async fn tiers_pick_their_own_limit() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let plain: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(allowed(&check(&client, &server, &json!({"rule": "api", "key": "u1"})).await.2));
        }
        v
    };
    assert_eq!(plain, [true, true, false]);
    for i in 0..5 {
        let (status, headers, v) = check(&client, &server, &json!({"rule": "api", "key": "u2", "tier": "vip"})).await;
        assert_eq!((status, allowed(&v), v["limit"].as_u64()), (200, true, Some(100)));
        assert_eq!(v["remaining"], 99 - i);
        assert_eq!(headers["ratelimit-policy"], "\"api\";q=100;w=60");
    }
    let (status, _, v) = check(&client, &server, &json!({"rule": "api", "key": "u3", "tier": "gold"})).await;
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("unknown_tier")));
}

#[tokio::test]
async fn multi_checks_are_all_or_nothing() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let both = json!({"checks": [{"rule": "sms", "key": "+1555"}, {"rule": "api", "key": "+1555", "cost": 2}]});
    let (status, headers, v) = check(&client, &server, &both).await;
    assert_eq!((status, allowed(&v)), (200, true), "{v}");
    assert!(v.get("denied_by").is_none());
    assert_eq!(headers["ratelimit-policy"], "\"sms\";q=5;w=60, \"api\";q=2;w=60");
    let (_, headers, v) = check(&client, &server, &both).await;
    assert_eq!((allowed(&v), v["denied_by"].as_u64()), (false, Some(1)), "{v}");
    assert_eq!(v["results"][0]["remaining"], 4, "sms not charged by the denied group: {v}");
    assert!(headers.contains_key("retry-after"));
    let (_, _, v) = check(&client, &server, &json!({"rule": "sms", "key": "+1555"})).await;
    assert_eq!(v["remaining"], 3);
}

#[tokio::test]
async fn every_bad_input_gets_its_4xx_and_the_server_keeps_serving() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let long_key = "k".repeat(600);
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "invalid_json"),
        (b"[1,2]".to_vec(), 400, "invalid_json"),
        (b"{\"rule\":\"sms\",\"key\":\"\xff\xfe\"}".to_vec(), 400, "invalid_json"),
        (br#"{"rule":"sms"}"#.to_vec(), 400, "missing_key"),
        (br#"{"rule":"nope","key":"a"}"#.to_vec(), 404, "unknown_rule"),
        (br#"{"rule":"sms","key":"a","cost":0}"#.to_vec(), 400, "invalid_cost"),
        (br#"{"rule":"sms","key":"a","cost":6}"#.to_vec(), 400, "invalid_cost"),
        (br#"{"rule":"sms","key":"a","cost":-1}"#.to_vec(), 400, "invalid_json"),
        (br#"{"rule":"sms","key":""}"#.to_vec(), 400, "invalid_key"),
        (format!(r#"{{"rule":"sms","key":"{long_key}"}}"#).into_bytes(), 400, "key_too_long"),
        (br#"{"rule":"sms","key":"a","colour":"red"}"#.to_vec(), 400, "invalid_json"),
        (br#"{"key":"a","limit":5}"#.to_vec(), 400, "missing_rule"),
        (br#"{"key":"a","limit":0,"window":"1s"}"#.to_vec(), 400, "invalid_quota"),
        (br#"{"key":"a","limit":5,"window":"soon"}"#.to_vec(), 400, "invalid_window"),
        (br#"{"key":"a","limit":5,"window":"1s","algorithm":"leaky"}"#.to_vec(), 400, "unknown_algorithm"),
        (br#"{"rule":"sms","key":"a","limit":5,"window":"1s"}"#.to_vec(), 400, "invalid_request"),
        (br#"{"rule":"sms","key":"a","algorithm":"gcra"}"#.to_vec(), 400, "invalid_request"),
        (
            br#"{"key":"a","limit":5,"window":"1s","algorithm":"sliding_window","buckets":3}"#.to_vec(),
            400,
            "invalid_quota",
        ),
        (br#"{"key":"a","limit":5,"window":"1s","burst":3}"#.to_vec(), 400, "invalid_quota"),
        (br#"{"key":"a","limit":5,"window":"1s","cold_fraction":0.5}"#.to_vec(), 400, "invalid_quota"),
        (br#"{"key":"a","limit":5,"window":"1s","warm_up":"later"}"#.to_vec(), 400, "invalid_quota"),
        (br#"{"key":"a","limit":5,"window":"1s","buckets":"six"}"#.to_vec(), 400, "invalid_json"),
        (br#"{"checks":[]}"#.to_vec(), 400, "invalid_checks"),
        (format!(r#"{{"checks":[{}{{}}]}}"#, "{},".repeat(20_000)).into_bytes(), 400, "invalid_checks"),
        (br#"{"checks":[{"rule":"sms","key":"a"},{"rule":"sms","key":"a"}]}"#.to_vec(), 400, "duplicate_key"),
        (br#"{"checks":[{"checks":[]}]}"#.to_vec(), 400, "missing_key"),
        (br#"{"checks":[{"rule":"sms","key":"a"}],"cost":2}"#.to_vec(), 400, "invalid_request"),
        (vec![b' '; 70_000], 413, "body_too_large"),
    ];
    for (body, status, code) in cases {
        let r = client
            .post(server.url("/v1/check"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        let r = r.expect("response");
        assert_eq!(r.status().as_u16(), status, "{}", String::from_utf8_lossy(&body[..body.len().min(80)]));
        let v: Value = r.json().await.expect("JSON error body");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    for (method, path, status) in [("GET", "/v1/check", 405), ("GET", "/nope", 404), ("GET", "/v1/keys/sms/a", 403)] {
        let r = client.request(method.parse().expect("method"), server.url(path)).send().await.expect("response");
        assert_eq!(r.status().as_u16(), status, "{method} {path}");
        let v: Value = r.json().await.expect("JSON error body");
        assert!(v["error"]["code"].is_string());
    }
    // Nothing above was charged, and the server still answers.
    let (status, _, v) = check(&client, &server, &json!({"rule": "sms", "key": "a"})).await;
    assert_eq!((status, v["remaining"].as_u64()), (200, Some(4)));
}

#[tokio::test]
async fn rules_and_keys_endpoints_with_the_admin_token() {
    let rules = RulesFile::new(&format!("admin_token = \"s3cret\"\n{RULES}"));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let v: Value = client.get(server.url("/v1/rules")).send().await.expect("rules").json().await.expect("json");
    let names: Vec<&str> = v["rules"].as_array().expect("list").iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["api", "burst", "sms"]);
    for _ in 0..2 {
        check(&client, &server, &json!({"rule": "sms", "key": "10.0.0.1"})).await;
    }
    let key_url = server.url("/v1/keys/sms/10.0.0.1");
    assert_eq!(client.get(&key_url).send().await.expect("get").status(), 401);
    assert_eq!(client.get(&key_url).bearer_auth("wrong").send().await.expect("get").status(), 401);
    let v: Value = client.get(&key_url).bearer_auth("s3cret").send().await.expect("get").json().await.expect("json");
    assert_eq!((v["count"].as_u64(), v["remaining"].as_u64()), (Some(2), Some(3)), "{v}");
    assert!(v["oldest_ms"].as_u64().is_some() && v["reset_after_ms"].as_u64().is_some_and(|r| r > 59_000));
    assert_eq!(client.delete(&key_url).send().await.expect("delete").status(), 401);
    assert_eq!(client.delete(&key_url).bearer_auth("s3cret").send().await.expect("delete").status(), 200);
    let v: Value = client.get(&key_url).bearer_auth("s3cret").send().await.expect("get").json().await.expect("json");
    assert_eq!(v["count"], 0);
    let bad_path = client.get(server.url("/v1/keys/sms/%FF")).bearer_auth("s3cret").send().await.expect("get");
    assert_eq!(bad_path.status(), 400);
    for guess in ["s3cre", "s3cret2", "S3CRET", ""] {
        let r = client.delete(&key_url).bearer_auth(guess).send().await.expect("delete");
        assert_eq!(r.status(), 401, "{guess:?}");
    }
    let (_, _, v) = check(&client, &server, &json!({"rule": "sms", "key": "10.0.0.1"})).await;
    assert_eq!(v["remaining"], 4);
}

#[tokio::test]
async fn metrics_move_with_decisions() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    for _ in 0..7 {
        check(&client, &server, &json!({"rule": "sms", "key": "m"})).await;
    }
    check(&client, &server, &json!({"rule": "nope", "key": "m"})).await;
    let allowed = metric(&client, &server, "slidegate_decisions_total{rule=\"sms\",result=\"allowed\"}").await;
    let denied = metric(&client, &server, "slidegate_decisions_total{rule=\"sms\",result=\"denied\"}").await;
    assert_eq!((allowed, denied), (5.0, 2.0));
    assert_eq!(metric(&client, &server, "slidegate_rules ").await, 3.0);
    assert!(metric(&client, &server, "slidegate_backend_call_seconds_count{backend=\"memory\"}").await >= 7.0);
    assert!(metric(&client, &server, "slidegate_http_request_seconds_count{route=\"/v1/check\"}").await >= 8.0);
}

#[tokio::test]
async fn the_rules_file_reloads_when_edited_and_on_sighup() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let sms_limit = || async {
        let v: Value = client.get(server.url("/v1/rules")).send().await.expect("rules").json().await.expect("json");
        v["rules"].as_array().expect("list").iter().find(|r| r["name"] == "sms").map(|r| r["limit"].clone())
    };
    let wait_for = |want: Option<Value>| async move {
        let started = Instant::now();
        loop {
            if sms_limit().await == want {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "rules never became {want:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    rules.write(&RULES.replace("limit = 5", "limit = 7"));
    wait_for(Some(json!(7))).await;
    let (_, _, v) = check(&client, &server, &json!({"rule": "sms", "key": "r"})).await;
    assert_eq!(v["limit"], 7);

    // An invalid file is refused, logged, and the old rules stay.
    rules.write(&RULES.replace("limit = 5", "limit = 0"));
    let started = Instant::now();
    while metric(&client, &server, "slidegate_config_reloads_total{result=\"failed\",file=\"rules\"}").await < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(5), "the invalid file was never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sms_limit().await, Some(json!(7)));
    assert!(server.log_text().contains("limit must be between 1"), "{}", server.log_text());

    // SIGHUP re-reads even an unchanged file.
    rules.write(&RULES.replace("limit = 5", "limit = 9"));
    wait_for(Some(json!(9))).await;
    let ok_before = metric(&client, &server, "slidegate_config_reloads_total{result=\"ok\",file=\"rules\"}").await;
    server.signal("HUP");
    let started = Instant::now();
    while metric(&client, &server, "slidegate_config_reloads_total{result=\"ok\",file=\"rules\"}").await <= ok_before {
        assert!(started.elapsed() < Duration::from_secs(5), "SIGHUP did not reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn invalid_rules_stop_the_start_with_file_line_and_field() {
    let rules = RulesFile::new("[[rules]]\nname = \"a\"\nlimit = 0\nwindow = \"1s\"\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["serve", "--http", "127.0.0.1:0", "--config", rules.arg()])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:3:9: rules[0].limit", rules.arg())), "{err}");
}

#[test]
fn the_check_command_answers_with_its_exit_code() {
    let run = |args: &[&str]| {
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_slidegate")).arg("check").args(args).output().expect("run");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let rules = RulesFile::new(RULES);
    let (code, out) = run(&["--rule", "sms", "--key", "1.2.3.4", "--config", rules.arg()]);
    assert_eq!(code, Some(0), "{out}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!((v["allowed"].as_bool(), v["remaining"].as_u64()), (Some(true), Some(4)));
    assert_eq!(run(&["--rule", "sms", "--key", "1.2.3.4", "--config", rules.arg(), "--cost", "6"]).0, Some(2));
    assert_eq!(run(&["--rule", "nope", "--key", "k", "--config", rules.arg()]).0, Some(2));
}

#[cfg(not(feature = "bench"))]
#[test]
fn bench_without_its_feature_says_how_to_build_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--target", "memory", "--duration", "1s"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cargo run --release --features bench -- bench"), "{err}");
}

#[cfg(feature = "bench")]
#[test]
fn bench_open_loop_sends_at_the_scheduled_rate() {
    let run = |extra: &[&str]| -> Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["bench", "--target", "memory", "--keys", "10", "--concurrency", "4", "--duration", "1s"])
            .args(["--limit", "1000", "--window", "60s", "--json"])
            .args(extra)
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    // 400 decisions are due in the second: never more are sent, and most of them are (how close
    // to 400 a run comes is the generator's accuracy, a benchmark's figure on a loaded
    // machine); a closed loop on memory decides far more.
    let open = run(&["--rate", "400"]);
    let decided = open["allowed"].as_u64().unwrap_or(0) + open["denied"].as_u64().unwrap_or(0);
    assert!((200..=400).contains(&decided), "{open}");
    assert_eq!((open["rate"].as_u64(), open["errors"].as_u64()), (Some(400), Some(0)), "{open}");
    assert!(open["late"].as_u64().is_some_and(|late| late <= decided), "{open}");
    let closed = run(&[]);
    assert!(closed["allowed"].as_u64().unwrap_or(0) > 1_000, "{closed}");
    assert!(closed.get("rate").is_none() && closed.get("late").is_none(), "{closed}");
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--rate", "0", "--duration", "10ms"])
        .output()
        .expect("run");
    assert_eq!(refused.status.code(), Some(2), "a rate of 0 is refused");
}

#[cfg(feature = "bench")]
#[test]
fn bench_open_loop_counts_a_stall_in_the_latencies() {
    // 200 decisions/s from two workers; the server is stopped for 300 ms in the middle. Every
    // decision that fell due meanwhile waits behind its worker's pending one and must be timed
    // from when it was due: a closed loop would show two slow decisions, not ~60.
    let server = Slidegate::serve(&[]);
    let bench = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--target", server.base.as_str(), "--keys", "10", "--concurrency", "2", "--rate", "200"])
        .args(["--duration", "1500ms", "--limit", "1000", "--window", "60s", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    std::thread::sleep(std::time::Duration::from_millis(500));
    server.signal("STOP");
    std::thread::sleep(std::time::Duration::from_millis(300));
    server.signal("CONT");
    let out = bench.wait_with_output().expect("bench ends");
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let late = v["late"].as_u64().expect("late");
    let decided = v["allowed"].as_u64().unwrap_or(0) + v["denied"].as_u64().unwrap_or(0);
    assert!((30..=decided).contains(&late), "decisions held back by the stall: {v}");
    assert!(v["max_us"].as_u64().is_some_and(|m| m >= 250_000), "{v}");
    // The median decision was not one held back by the stall (a loose bound: scheduling on a
    // loaded machine adds its own delays).
    assert!(v["p50_us"].as_u64().is_some_and(|p| p < 250_000), "most decisions are not behind the stall: {v}");
    assert_eq!(v["errors"], 0, "{v}");
}

#[cfg(feature = "bench")]
#[test]
fn bench_reports_json_against_memory_and_a_server() {
    let server = Slidegate::serve(&[]);
    for target in ["memory", server.base.as_str()] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["bench", "--target", target, "--keys", "10", "--concurrency", "4", "--duration", "300ms"])
            .args(["--limit", "5", "--window", "60s", "--json"])
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        for field in ["decisions_per_sec", "p50_us", "p99_us", "allowed", "denied", "errors"] {
            assert!(v[field].is_number(), "{field} missing: {v}");
        }
        assert_eq!(v["allowed"], 50, "10 keys × limit 5 on {target}: {v}");
        assert_eq!(v["errors"], 0);
    }
}

#[cfg(feature = "bench")]
#[test]
fn bench_counts_refused_connections_as_errors_and_still_ends() {
    // Two connections at most: two of the four workers hold one, the others are refused on
    // every attempt to open their own.
    let server = Slidegate::serve(&["--max-connections", "2"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--target", server.base.as_str(), "--keys", "10", "--concurrency", "4"])
        .args(["--duration", "300ms", "--limit", "5", "--window", "60s", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["errors"].as_u64().is_some_and(|e| e > 0), "refusals are errors: {v}");
    assert_eq!(v["allowed"], 50, "the workers that hold a connection decide: {v}");
}

/// The body of an error answer: (status, code, message).
async fn error_of(client: &reqwest::Client, server: &Slidegate, body: &Value) -> (u16, String, String) {
    let (status, _, v) = check(client, server, body).await;
    let text = |field: &str| v["error"][field].as_str().unwrap_or_else(|| panic!("not an error: {v}")).to_owned();
    (status, text("code"), text("message"))
}

#[tokio::test]
async fn without_an_admin_token_no_caller_can_reset_or_read_a_key() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let sms = json!({"rule": "sms", "key": "+1555"});
    for _ in 0..5 {
        check(&client, &server, &sms).await;
    }
    assert!(!allowed(&check(&client, &server, &sms).await.2), "the key is at its limit");
    // The caller tries to reset its own limit, with and without a made-up token.
    let key_url = server.url("/v1/keys/sms/+1555");
    let attempts = [
        client.delete(&key_url),
        client.delete(&key_url).bearer_auth("anything"),
        client.get(&key_url),
        client.get(format!("{key_url}?tier=vip")).bearer_auth(""),
    ];
    for attempt in attempts {
        let r = attempt.send().await.expect("response");
        assert_eq!(r.status(), 403);
        let v: Value = r.json().await.expect("JSON error body");
        assert_eq!(v["error"]["code"], "admin_disabled", "{v}");
    }
    assert!(!allowed(&check(&client, &server, &sms).await.2), "still at its limit: nothing was reset");
    let log = server.log_text();
    assert_eq!(log.matches("admin routes disabled").count(), 1, "logged once, at start: {log}");
}

#[tokio::test]
async fn inline_checks_past_each_bound_are_refused_naming_it_and_charge_nothing() {
    let rules = RulesFile::new(
        "[inline]\nmax_limit = 100\nmax_window = \"1h\"\nmax_cost = 5\nalgorithms = [\"sliding_log\", \"gcra\"]\n",
    );
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let attacks = [
        (json!({"key": "victim", "limit": 101, "window": "1m"}), "inline_limit_too_large", "max_limit = 100"),
        (json!({"key": "victim", "limit": 10, "window": "61m"}), "inline_window_too_long", "max_window = 1h"),
        (json!({"key": "victim", "limit": 10, "window": "1m", "cost": 6}), "inline_cost_too_large", "max_cost = 5"),
        (
            json!({"key": "victim", "limit": 10, "window": "1m", "algorithm": "gcra", "burst": 101}),
            "inline_limit_too_large",
            "burst 101 is over max_limit = 100",
        ),
        (
            json!({"key": "victim", "limit": 10, "window": "1m", "algorithm": "fixed_window"}),
            "inline_algorithm_not_allowed",
            "\"fixed_window\"",
        ),
        // One check out of bounds refuses its whole group: the check within bounds is not charged.
        (
            json!({"checks": [{"key": "victim", "limit": 10, "window": "1m"},
                              {"key": "other", "limit": 1000, "window": "1m"}]}),
            "inline_limit_too_large",
            "max_limit = 100",
        ),
    ];
    for (body, code, bound) in attacks {
        let (status, got, message) = error_of(&client, &server, &body).await;
        assert_eq!((status, got.as_str()), (400, code), "{body}");
        assert!(message.contains(bound), "{message:?} does not name {bound:?}");
    }
    let (status, _, v) = check(&client, &server, &json!({"key": "victim", "limit": 10, "window": "1m"})).await;
    assert_eq!((status, v["remaining"].as_u64()), (200, Some(9)), "no attack was charged: {v}");
    // At the bounds themselves, checks are served.
    let edge = json!({"key": "edge", "limit": 100, "window": "1h", "cost": 5, "algorithm": "gcra", "burst": 100});
    assert_eq!(check(&client, &server, &edge).await.0, 200);
}

#[tokio::test]
async fn inline_bounds_default_to_the_documented_values() {
    let server = Slidegate::serve(&[]);
    let client = reqwest::Client::new();
    let attacks = [
        (json!({"key": "k", "limit": 10_001, "window": "1m"}), "max_limit = 10000"),
        (json!({"key": "k", "limit": 10, "window": "25h"}), "max_window = 1day"),
        (json!({"key": "k", "limit": 1_000, "window": "1m", "cost": 101}), "max_cost = 100"),
    ];
    for (body, bound) in attacks {
        let (status, _, message) = error_of(&client, &server, &body).await;
        assert_eq!(status, 400, "{body}");
        assert!(message.contains(bound), "{message:?} does not name {bound:?}");
    }
    let within = json!({"key": "k", "limit": 10_000, "window": "24h", "cost": 100, "algorithm": "fixed_window"});
    assert_eq!(check(&client, &server, &within).await.0, 200);
}

#[tokio::test]
async fn inline_bounds_and_disabling_follow_the_rules_file_on_reload() {
    let rules = RulesFile::new(&format!("[inline]\nmax_limit = 100\n{RULES}"));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let inline = json!({"key": "k", "limit": 150, "window": "1m"});
    assert_eq!(error_of(&client, &server, &inline).await.1, "inline_limit_too_large");
    let status_becomes = async |want: u16| {
        let started = Instant::now();
        loop {
            let (status, _, v) = check(&client, &server, &inline).await;
            if status == want {
                return v;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "never {want}: {status} {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    rules.write(&format!("[inline]\nmax_limit = 200\n{RULES}"));
    assert_eq!(status_becomes(200).await["limit"], 150);
    rules.write(&format!("[inline]\nenabled = false\n{RULES}"));
    let v = status_becomes(403).await;
    assert_eq!(v["error"]["code"], "inline_disabled", "{v}");
    let (status, _, v) = check(&client, &server, &json!({"rule": "sms", "key": "k"})).await;
    assert_eq!((status, allowed(&v)), (200, true), "rules are still served: {v}");
}
