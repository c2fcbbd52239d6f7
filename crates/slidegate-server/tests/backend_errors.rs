//! A backend's own error text never reaches a caller, through the real binary on Redis (Lua
//! and module): the HTTP API and the Envoy service answer a stable code, a generic message and
//! the request's id; the log holds the backend's text under that id.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::envoy::{Dir, USER_EDGE, request};
use support::{RulesFile, Slidegate};

/// What Redis says of a key of another type, which the scripts and the module pass on.
const REDIS_TEXT: [&str; 4] = ["WRONGTYPE", "user_script", "ResponseError", "Operation against"];

/// Whether `text` holds none of Redis' own words.
fn generic(text: &str) -> bool {
    REDIS_TEXT.iter().all(|word| !text.contains(word))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_error_answers_a_stable_code_and_the_request_id_and_logs_the_detail() {
    for (engine, redis) in [("lua", RedisServer::start()), ("module", RedisServer::start_with_module(&[]))] {
        let rules = RulesFile::new(&format!(
            "[backend]\nredis = \"{}\"\ntimeout = \"10s\"\n[[rules]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n",
            redis.url()
        ));
        let dir = Dir::with(&[("edge.yaml", USER_EDGE)]);
        let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
        let server = Slidegate::serve(&["--config", rules.arg(), "--grpc", &grpc, "--envoy-config", dir.arg()]);
        // The attack: a key of another type where the limiter's key is, so Redis answers an error.
        let _: () = redis.query(&["SET", "slidegate:api:{k}", "x"]);
        let _: () = redis.query(&["SET", "slidegate:4:edge:{4:user=1:k}", "x"]);

        let client = Client::new();
        let check = json!({"rule": "api", "key": "k"});
        let answer = client
            .post(server.url("/v1/check"))
            .header("x-request-id", "req-42")
            .json(&check)
            .send()
            .await
            .expect("answer");
        let header = answer.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (status, v) = (answer.status().as_u16(), answer.json::<Value>().await.expect("JSON"));
        assert_eq!(
            (status, &v["error"]["code"], &v["error"]["request_id"]),
            (500, &json!("backend_error"), &json!("req-42"))
        );
        assert_eq!(header.as_deref(), Some("req-42"), "{engine}");
        assert!(generic(&v.to_string()), "{engine}: {v}");

        // No id given (or one too long to log as given): one of the server's, in the answer.
        let long = "r".repeat(slidegate_server::request_id::MAX_REQUEST_ID_LEN + 1);
        let answer = client.post(server.url("/v1/check")).header("x-request-id", &long).json(&check).send().await;
        let v: Value = answer.expect("answer").json().await.expect("JSON");
        let made = v["error"]["request_id"].as_str().expect("an id").to_owned();
        assert!(made.len() == 16 && made != long && generic(&v.to_string()), "{engine}: {v}");

        let mut envoy = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
        let mut asked = tonic::Request::new(request("edge", &[&[("user", "k")]], 1));
        asked.metadata_mut().insert("x-request-id", "grpc-7".parse().expect("ascii"));
        let status = envoy.should_rate_limit(asked).await.expect_err("a backend error fails the request");
        assert_eq!(status.code(), tonic::Code::Internal, "{engine}: {status:?}");
        assert!(status.message().contains("grpc-7") && generic(status.message()), "{engine}: {status:?}");

        // The log has each one's detail under its id.
        let log = server.log_text();
        for id in ["req-42", made.as_str(), "grpc-7"] {
            let line =
                log.lines().find(|l| l.contains(id)).unwrap_or_else(|| panic!("{engine}: no line for {id}: {log}"));
            assert!(line.contains("WRONGTYPE"), "{engine}: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_readyz_and_stats_say_the_kind_of_failure_never_its_text() {
    let mut redis = RedisServer::start();
    let port = redis.port().to_string();
    let rules = RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\ntimeout = \"100ms\"\n[[rules]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n",
        redis.url()
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = Client::new();
    redis.kill();

    // The attack is only to ask: /readyz needs no token. What a connection error says (the
    // address, the system's words) must not be in the answer.
    let own_words =
        |text: &str| ["os error", "refused", "Connection", "127.0.0.1", &port].iter().any(|w| text.contains(w));
    let started = std::time::Instant::now();
    let ready = loop {
        let answer = client.get(server.url("/readyz")).send().await.expect("readyz");
        let status = answer.status().as_u16();
        let ready: Value = answer.json().await.expect("JSON");
        if status == 503 && ready["shared"]["in_sync"] == false {
            break ready;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "not unready in time: {ready}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(ready["error"], json!("the backend cannot be reached or did not answer in time"), "{ready}");
    let kinds = ["redis cannot be reached", "redis failed or refused the call", "redis did not answer in time"];
    let shared =
        ready["shared"]["error"].as_str().and_then(|e| e.strip_suffix(": serving the last rules and overrides"));
    assert!(shared.is_some_and(|kind| kinds.contains(&kind)), "{ready}");
    assert!(!own_words(&ready.to_string()), "{ready}");

    let stats: Value = client.get(server.url("/v1/stats")).send().await.expect("stats").json().await.expect("JSON");
    assert_eq!(stats["backend"]["reachable"], json!(false), "{stats}");
    assert!(stats["backend"]["error"].is_string() && !own_words(&stats["backend"].to_string()), "{stats}");

    // The detail is the operator's, in the log.
    let log = server.log_text();
    assert!(log.lines().any(|l| l.contains("not ready") && own_words(l)), "{log}");
}

/// The set-up docs/operations.md advises against a partitioned master: with
/// `min-replicas-to-write` unmet Redis refuses every write (`NOREPLICAS`), and the binary takes
/// that as the backend failing — each rule's failure policy answers, never a 500 — on both engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_its_replicas_refuses_and_each_rule_s_failure_policy_answers() {
    let extra = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"];
    for (engine, redis) in
        [("lua", RedisServer::start_with(&extra)), ("module", RedisServer::start_with_module(&extra))]
    {
        let rules = RulesFile::new(&format!(
            "[backend]\nredis = \"{}\"\n\n[[rules]]\nname = \"strict\"\nlimit = 5\nwindow = \"1m\"\nfailure_policy = \"fail_closed\"\n\n\
             [[rules]]\nname = \"open\"\nlimit = 5\nwindow = \"1m\"\nfailure_policy = \"fail_open\"\n",
            redis.url()
        ));
        let server = Slidegate::serve(&["--config", rules.arg()]);
        let client = Client::new();
        for (rule, allowed) in [("strict", false), ("open", true)] {
            let answer = client.post(server.url("/v1/check")).json(&json!({"rule": rule, "key": "k"})).send().await;
            let answer = answer.expect("answered");
            assert_eq!(answer.status(), 200, "{engine} {rule}");
            let v: Value = answer.json().await.expect("json");
            assert_eq!(
                (v["allowed"].as_bool(), v["degraded"].as_bool()),
                (Some(allowed), Some(true)),
                "{engine} {rule}: {v}"
            );
        }
        let keys: Vec<String> = redis.query(&["KEYS", "slidegate:*"]);
        assert!(keys.is_empty(), "{engine}: nothing was written: {keys:?}");
    }
}
