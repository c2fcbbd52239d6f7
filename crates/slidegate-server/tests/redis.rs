//! The real binary on a real redis-server that the tests start.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate, check};

async fn admitted_by(urls: Vec<String>, clients: usize, requests_each: usize, body: Value) -> usize {
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (url, body) = (urls[i % urls.len()].clone(), body.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut admitted = 0;
                for _ in 0..requests_each {
                    let v: Value =
                        client.post(&url).json(&body).send().await.expect("response").json().await.expect("json");
                    admitted += usize::from(v["allowed"].as_bool().unwrap_or_else(|| panic!("not a decision: {v}")));
                }
                admitted
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("client");
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_sharing_one_redis_enforce_one_limit() {
    let redis = RedisServer::start();
    // Exactness is under test, not deadlines: a loaded CI machine must not turn into 503s.
    let rules = RulesFile::new(&format!("[backend]\nredis = \"{}\"\ntimeout = \"5s\"\n", redis.url()));
    let a = Slidegate::serve(&["--config", rules.arg()]);
    let b = Slidegate::serve(&["--config", rules.arg()]);
    let urls = vec![a.url("/v1/check"), b.url("/v1/check")];
    let body = json!({"key": "192.168.1.100", "limit": 100, "window": "60s"});
    assert_eq!(admitted_by(urls, 64, 5, body).await, 100, "64 clients over two servers, 320 requests");
    assert_eq!(redis.query::<u64>(&["ZCARD", "slidegate:inline:{192.168.1.100}"]), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_on_redis_get_exactly_the_limit_under_a_readable_key() {
    let redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\nprefix = \"rl\"\ntimeout = \"5s\"\n\n[[rules]]\nname = \"sms\"\nlimit = 100\nwindow = \"60s\"\n",
        redis.url()
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let body = json!({"rule": "sms", "key": "192.168.1.100"});
    assert_eq!(admitted_by(vec![server.url("/v1/check")], 64, 4, body).await, 100);
    let keys: Vec<String> = redis.query(&["KEYS", "*"]);
    assert_eq!(keys, ["rl:sms:{192.168.1.100}"]);
    let v: Value = reqwest::get(server.url("/readyz")).await.expect("readyz").json().await.expect("json");
    assert_eq!(v["backend"], "redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_module_decides_when_loaded_and_every_surface_says_so() {
    let redis = RedisServer::start_with_module(&[]);
    // A deadline a loaded machine cannot miss: this test counts exact admissions, and a late
    // answer would be admitted by the default fail-open policy.
    let rules = RulesFile::new(&format!("[backend]\nredis = \"{}\"\ntimeout = \"5s\"\n", redis.url()));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let body = json!({"key": "k", "limit": 100, "window": "60s"});
    assert_eq!(admitted_by(vec![server.url("/v1/check")], 64, 4, body.clone()).await, 100);
    assert_eq!(redis.query::<String>(&["TYPE", "slidegate:inline:{k}"]), "slidegate", "the module's own type");
    let client = reqwest::Client::new();
    let (_, _, v) = check(&client, &server, &body).await;
    assert_eq!((&v["allowed"], &v["engine"]), (&json!(false), &json!("module")));
    let v: Value = reqwest::get(server.url("/readyz")).await.expect("readyz").json().await.expect("json");
    assert_eq!(v["engine"], "module");
    let metrics = reqwest::get(server.url("/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("slidegate_engine{engine=\"module\"} 1"), "{metrics}");

    // Without the module: the scripts decide; forced to the module, the server is not ready and
    // its checks are answered by the failure policy (fail_open), marked degraded.
    let plain = RedisServer::start();
    let lua = Slidegate::serve(&["--redis", &plain.url()]);
    assert_eq!(check(&client, &lua, &body).await.2["engine"], "lua");
    let forced = Slidegate::serve(&["--redis", &plain.url(), "--redis-engine", "module"]);
    let response = reqwest::get(forced.url("/readyz")).await.expect("readyz");
    assert_eq!(response.status(), 503);
    let v: Value = response.json().await.expect("json");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("no slidegate module")), "{v}");
    let (_, _, v) = check(&client, &forced, &body).await;
    assert_eq!((&v["degraded"], v.get("engine")), (&json!(true), None));
}

#[tokio::test]
async fn sigterm_lets_requests_in_flight_finish_then_exits_zero() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let rules = RulesFile::new(&format!("[backend]\nredis = \"{}\"\ntimeout = \"3s\"\n", redis.url()));
    let mut server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    // Stall Redis so that a request is in flight when SIGTERM arrives.
    let url = redis.url();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).and_then(|c| c.get_connection()).expect("connect");
        redis::cmd("DEBUG").arg("SLEEP").arg("1").query::<()>(&mut conn).expect("DEBUG SLEEP");
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let in_flight = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/v1/check"));
        async move { client.post(url).json(&json!({"key": "k", "limit": 5, "window": "1s"})).send().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent_term = Instant::now();
    server.signal("TERM");
    let response = in_flight.await.expect("task").expect("the in-flight request was answered");
    assert_eq!(response.status(), 200);
    let v: Value = response.json().await.expect("json");
    assert_eq!(v["allowed"], true);
    let status = server.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
    assert!(sent_term.elapsed() < Duration::from_secs(5));
    sleeper.join().expect("sleeper");
}

#[tokio::test]
async fn with_redis_gone_each_rule_s_failure_policy_answers_and_says_so() {
    let redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        r#"
[backend]
redis = "{}"

[[rules]]
name = "open"
limit = 5
window = "1m"

[[rules]]
name = "closed"
limit = 5
window = "1m"
failure_policy = "fail_closed"

[[rules]]
name = "local"
limit = 8
window = "1m"
failure_policy = "local"
local_share = 0.25
"#,
        redis.url()
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    assert_eq!(client.get(server.url("/readyz")).send().await.expect("readyz").status(), 200);
    let (_, _, v) = check(&client, &server, &json!({"rule": "open", "key": "k"})).await;
    assert_eq!((v["degraded"].as_bool(), v.get("policy")), (Some(false), None), "{v}");
    drop(redis);
    let r = client.get(server.url("/readyz")).send().await.expect("readyz");
    assert_eq!(r.status(), 503);
    let started = Instant::now();
    let (status, _, v) = check(&client, &server, &json!({"rule": "open", "key": "k"})).await;
    assert!(started.elapsed() < Duration::from_secs(1), "answered without waiting on the dead Redis");
    assert_eq!((status, v["allowed"].as_bool(), v["degraded"].as_bool()), (200, Some(true), Some(true)), "{v}");
    assert_eq!(v["policy"], "fail_open", "the backend's default policy");
    let (status, headers, v) = check(&client, &server, &json!({"rule": "closed", "key": "k"})).await;
    assert_eq!((status, v["allowed"].as_bool(), v["policy"].as_str()), (200, Some(false), Some("fail_closed")), "{v}");
    assert!(headers.contains_key("retry-after"));
    let mut local = Vec::new();
    for _ in 0..4 {
        let (_, _, v) = check(&client, &server, &json!({"rule": "local", "key": "k"})).await;
        assert_eq!(v["policy"], "local", "{v}");
        local.push(v["allowed"].as_bool().expect("decision"));
    }
    assert_eq!(local, [true, true, false, false], "a quarter of 8, decided in this process");
    // Enough failures have opened the circuit; the metrics say so.
    let page = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(page.contains("slidegate_circuit_open 1"), "{page}");
    assert!(page.contains(r#"slidegate_degraded_decisions_total{rule="closed",policy="fail_closed"} 1"#), "{page}");
    // Why the policies answered: five failed calls (the lost connection) opened the circuit,
    // which kept the sixth from Redis.
    assert!(page.contains(r#"slidegate_policy_answers_total{kind="error"} 5"#), "{page}");
    assert!(page.contains(r#"slidegate_policy_answers_total{kind="circuit_open"} 1"#), "{page}");
    assert_eq!(client.get(server.url("/healthz")).send().await.expect("healthz").status(), 200, "the process is up");
}

#[tokio::test]
async fn the_near_cache_spares_redis_the_requests_of_a_key_over_its_limit() {
    let redis = RedisServer::start();
    let server = Slidegate::serve(&["--redis", &redis.url()]);
    let client = reqwest::Client::new();
    let body = json!({"key": "attacker", "limit": 3, "window": "1m"});
    let mut allowed = Vec::new();
    for _ in 0..200 {
        let (_, _, v) = check(&client, &server, &body).await;
        allowed.push(v["allowed"].as_bool().expect("decision"));
    }
    assert_eq!(allowed.iter().filter(|a| **a).count(), 3);
    let stats: String = redis.query(&["INFO", "commandstats"]);
    let calls = |cmd: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    // 3 admissions and the first denial; the other 196 were answered from the near-cache. Counted
    // as runs of the sliding log's script (each counts the log once, ZCARD), not as EVALSHA calls,
    // which the shared store's reads and a first NOSCRIPT reply add to.
    assert_eq!(calls("zcard"), 4, "{stats}");
}

#[tokio::test]
async fn a_redis_cluster_backend_serves_and_refuses_cross_slot_groups() {
    let cluster = slidegate_testkit::RedisCluster::start(3, 0);
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let rules = RulesFile::new(&format!(
        "[backend]\nredis_cluster = [{}]\n\n[[rules]]\nname = \"per_second\"\nlimit = 1\nwindow = \"1s\"\n\n[[rules]]\nname = \"per_day\"\nlimit = 100\nwindow = \"1d\"\nalgorithm = \"gcra\"\n",
        nodes.join(", ")
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let v: Value = client.get(server.url("/readyz")).send().await.expect("readyz").json().await.expect("json");
    assert_eq!(v["backend"], "redis_cluster", "{v}");
    for algorithm in ["sliding_log", "sliding_window", "fixed_window", "gcra"] {
        let body = json!({"key": "u1", "limit": 2, "window": "1h", "algorithm": algorithm});
        let seen: Vec<bool> = {
            let mut seen = Vec::new();
            for _ in 0..3 {
                let (status, _, v) = check(&client, &server, &body).await;
                assert_eq!(status, 200, "{v}");
                seen.push(v["allowed"].as_bool().expect("decision"));
            }
            seen
        };
        assert_eq!(seen, [true, true, false], "{algorithm}");
    }
    // Two keys of one rule hash to different slots: no atomic group on a cluster.
    let group = json!({"checks": [{"key": "a", "limit": 5, "window": "1m"}, {"key": "b", "limit": 5, "window": "1m"}]});
    let (status, _, v) = check(&client, &server, &group).await;
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("cross_slot")), "{v}");
    // Several rules on one key: `<rule>:{<key>}` shares the key's hash tag, so atomic on a
    // cluster too.
    let one_key = json!({"checks": [{"rule": "per_day", "key": "a"}, {"rule": "per_second", "key": "a"}]});
    let (status, _, v) = check(&client, &server, &one_key).await;
    assert_eq!((status, v["allowed"].as_bool()), (200, Some(true)), "{v}");
    let (_, _, v) = check(&client, &server, &one_key).await;
    assert_eq!((v["allowed"].as_bool(), v["denied_by"].as_u64()), (Some(false), Some(1)), "{v}");
    assert_eq!(v["results"][0]["remaining"], 99, "the per-day limit was not charged: {v}");
}

#[test]
fn the_check_command_shares_state_through_redis() {
    let redis = RedisServer::start();
    // The file's backend settings apply to `check` too; a generous deadline for a loaded machine.
    let rules = RulesFile::new("[backend]\ntimeout = \"5s\"\n");
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["check", "--key", "1.2.3.4", "--limit", "2", "--window", "60s", "--redis", &redis.url()])
            .args(["--config", rules.arg()])
            .output()
            .expect("run")
            .status
            .code()
    };
    assert_eq!([run(), run(), run()], [Some(0), Some(0), Some(1)]);
}

#[tokio::test]
async fn a_sentinel_backend_follows_its_master_through_a_failover() {
    let mut setup = slidegate_testkit::RedisSentinel::start();
    let server = Slidegate::serve(&["--redis-sentinel", &setup.sentinel_url()]);
    let client = reqwest::Client::new();
    let v: Value = client.get(server.url("/readyz")).send().await.expect("readyz").json().await.expect("json");
    assert_eq!(v["backend"], "redis_sentinel", "{v}");
    // The largest inline limit by default: never reached while the master fails over.
    let body = json!({"key": "k", "limit": 10_000, "window": "1m"});
    let (_, _, v) = check(&client, &server, &body).await;
    assert_eq!(v["degraded"], false, "{v}");
    setup.master.kill();
    let killed = Instant::now();
    let mut saw_degraded = false;
    loop {
        let (status, _, v) = check(&client, &server, &body).await;
        assert_eq!(status, 200, "{v}");
        match v["degraded"].as_bool() {
            Some(true) => saw_degraded = true,
            Some(false) if saw_degraded => break,
            _ => {}
        }
        assert!(killed.elapsed() < Duration::from_secs(20), "still degraded: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(setup.master_port(), Some(setup.master.port()), "served by the promoted replica");
}

#[tokio::test]
async fn caller_mistakes_are_400s_under_fail_open_never_degraded_and_never_open_the_circuit() {
    let redis = RedisServer::start();
    let rules = RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\nfailure_policy = \"fail_open\"\ntimeout = \"5s\"\n\n[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"1m\"\n",
        redis.url()
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let long_key = "k".repeat(600);
    // The attack: requests the core refuses, which fail_open would admit if they were counted
    // as backend failures, and which would open the circuit for everyone.
    let mistakes = [
        json!({"rule": "sms", "key": "a", "cost": 6}),
        json!({"rule": "sms", "key": long_key}),
        json!({"key": "a", "limit": 0, "window": "1m"}),
        json!({"key": "a", "limit": 5, "window": "1m", "cost": 6}),
        json!({"checks": [{"rule": "sms", "key": "a"}, {"rule": "sms", "key": "a"}]}),
    ];
    for body in mistakes.iter().cycle().take(20) {
        let (status, _, v) = check(&client, &server, body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert!(v["error"]["code"].is_string() && v.get("degraded").is_none() && v.get("allowed").is_none(), "{v}");
    }
    let (status, _, v) = check(&client, &server, &json!({"rule": "sms", "key": "a"})).await;
    assert_eq!((status, &v["allowed"], &v["degraded"]), (200, &json!(true), &json!(false)), "{v}");
    assert_eq!(v["remaining"], 4, "none of the mistakes was charged: {v}");
    let page = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(page.contains("slidegate_circuit_open 0"), "{page}");
    assert!(!page.contains("slidegate_backend_errors_total"), "no backend error was counted: {page}");
    assert!(!page.contains("slidegate_degraded_decisions_total"), "{page}");
}

#[tokio::test]
async fn a_redis_password_never_appears_in_the_log_or_any_answer() {
    const PASSWORD: &str = "hunter2-s3cret";
    let mut redis = RedisServer::start();
    redis.query::<String>(&["ACL", "SETUSER", "alice", "on", &format!(">{PASSWORD}"), "~*", "&*", "+@all"]);
    let url = redis.url().replacen("redis://", &format!("redis://alice:{PASSWORD}@"), 1);
    let masked = redis.url().replacen("redis://", "redis://alice:***@", 1);
    let rules = RulesFile::new(&format!(
        "admin_token = \"t\"\n[backend]\nredis = \"{url}\"\nfailure_policy = \"fail_closed\"\ntimeout = \"200ms\"\n"
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    let (status, _, v) = check(&client, &server, &json!({"key": "k", "limit": 5, "window": "1m"})).await;
    assert_eq!((status, &v["degraded"]), (200, &json!(false)), "connected with the password: {v}");
    // Redis goes away: the answers that carry the backend's error.
    redis.kill();
    for _ in 0..3 {
        answers.push(client.get(server.url("/readyz")).send().await.expect("readyz").text().await.expect("text"));
        let key = client.get(server.url("/v1/keys/r/k")).bearer_auth("t").send().await.expect("keys");
        answers.push(key.text().await.expect("text"));
        answers.push(check(&client, &server, &json!({"key": "k", "limit": 5, "window": "1m"})).await.2.to_string());
    }
    assert!(answers.iter().any(|a| a.contains("\"error\"")), "errors were answered: {answers:?}");
    // A rules file with a malformed URL, reloaded: the refusal is logged.
    rules.write(&format!("[backend]\nredis = \"http://alice:{PASSWORD}@127.0.0.1:1\"\n"));
    server.signal("HUP");
    let started = Instant::now();
    while !server.log_text().contains("not reloaded") {
        assert!(started.elapsed() < Duration::from_secs(5), "the bad file was never read: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = server.log_text();
    assert!(log.contains(&masked), "the log names the backend, masked: {log}");
    assert!(log.contains("http://alice:***@127.0.0.1:1"), "{log}");
    for text in answers.iter().chain([&log]) {
        assert!(!text.contains(PASSWORD), "the password leaked: {text}");
    }
}

#[test]
fn a_redis_password_never_appears_when_the_start_fails() {
    const PASSWORD: &str = "hunter2-s3cret";
    let closed = format!("redis://alice:{PASSWORD}@127.0.0.1:{}", slidegate_testkit::free_port());
    let rules = RulesFile::new(&format!("[backend]\nredis = \"ftp://alice:{PASSWORD}@host\"\n"));
    let cases: [&[&str]; 4] = [
        &["--redis", &closed],
        &["--redis", &format!("http://alice:{PASSWORD}@host")],
        &["--redis-cluster", &format!("{closed},redis://bob:{PASSWORD}@127.0.0.1:1")],
        &["--config", rules.arg()],
    ];
    for args in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["serve", "--http", "127.0.0.1:0"])
            .args(args)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("alice:***@"), "{args:?}: the error names the URL, masked: {stderr}");
        assert!(!stderr.contains(PASSWORD), "{args:?}: the password leaked: {stderr}");
    }
}

#[cfg(feature = "bench")]
#[test]
fn the_bench_report_masks_a_redis_password() {
    const PASSWORD: &str = "hunter2-s3cret";
    let redis = RedisServer::start();
    redis.query::<String>(&["ACL", "SETUSER", "alice", "on", &format!(">{PASSWORD}"), "~*", "&*", "+@all"]);
    let url = redis.url().replacen("redis://", &format!("redis://alice:{PASSWORD}@"), 1);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--target", &url, "--keys", "10", "--concurrency", "2", "--duration", "200ms", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["target"], redis.url().replacen("redis://", "redis://alice:***@", 1), "{report}");
    assert_eq!(report["errors"], 0, "the bench ran with the password: {report}");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains(PASSWORD), "{all}");
}
