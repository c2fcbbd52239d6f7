//! OpenTelemetry traces from the real binary to a real OTLP receiver (gRPC and HTTP/protobuf):
//! the caller's trace continued from HTTP (checks and forward-auth questions) and Envoy gRPC requests, one span per decision with
//! its attributes and the backend call a child span, on memory and on Redis; sampling, the
//! flush at SIGTERM, and nothing at all without an endpoint.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use slidegate_testkit::{RedisCluster, RedisServer};
use support::envoy::{Envoy, OK, OVER, USER_EDGE, request};
use support::otlp::{Received, Receiver};
use support::{RulesFile, Slidegate};

const RULE: &str = "[[rules]]\nname = \"api\"\nlimit = 1\nwindow = \"1m\"\n";
const HTTP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const HTTP_PARENT: &str = "00f067aa0ba902b7";
const ENVOY_TRACE: &str = "80f198ee56343ba864fe8b2a57d3eff7";
const ENVOY_PARENT: &str = "e457b5a2e4d86bd1";

fn traceparent(trace: &str, parent: &str, flags: &str) -> String {
    format!("00-{trace}-{parent}-{flags}")
}

/// A rules file with [`RULE`] over `backend` (a `[backend]` table's lines, none: memory), with
/// a deadline no busy machine misses.
fn rules(backend: Option<String>) -> RulesFile {
    let backend = backend.map(|b| format!("[backend]\n{b}timeout = \"10s\"\n\n"));
    RulesFile::new(&format!("{}{RULE}", backend.unwrap_or_default()))
}

fn on_redis(redis: &RedisServer) -> Option<String> {
    Some(format!("redis = \"{}\"\n", redis.url()))
}

async fn check_with(server: &Slidegate, headers: &[(&str, &str)]) -> bool {
    let mut request = reqwest::Client::new().post(server.url("/v1/check")).json(&json!({"rule": "api", "key": "k"}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request");
    let body: serde_json::Value = response.json().await.expect("JSON");
    body["allowed"].as_bool().expect("allowed")
}

/// The decision span and its backend child among `spans`, checked for shape.
fn decision_and_backend<'s>(spans: &'s [Received], parent: &str) -> (&'s Received, &'s Received) {
    let decision = spans.iter().find(|s| s.name == "slidegate.decision").expect("a decision span");
    assert_eq!(decision.parent_span_id, parent, "continues the caller's span: {decision:?}");
    let backend = spans.iter().find(|s| s.name == "slidegate.backend").expect("a backend span");
    assert_eq!(backend.parent_span_id, decision.span_id, "the backend call is the decision's child: {spans:?}");
    (decision, backend)
}

async fn continues_traces(backend: Option<String>, engine: &str) {
    let receiver = Receiver::grpc().await;
    let rules = rules(backend);
    let url = receiver.url();
    let mut envoy =
        Envoy::start(&[("edge.yaml", USER_EDGE)], &["--config", rules.arg(), "--otlp-endpoint", &url]).await;

    // HTTP, W3C traceparent: the limit is 1, so the second check of the trace is denied.
    let parent = traceparent(HTTP_TRACE, HTTP_PARENT, "01");
    assert!(check_with(&envoy.server, &[("traceparent", &parent)]).await);
    let spans = receiver.trace(HTTP_TRACE, 2).await;
    let (decision, backend) = decision_and_backend(&spans, HTTP_PARENT);
    for (name, value) in [("rule", "api"), ("algorithm", "sliding_log"), ("engine", engine), ("outcome", "allowed")] {
        assert_eq!(decision.attribute(name), Some(value), "{name}: {decision:?}");
    }
    assert_eq!(decision.attribute("degraded"), Some("false"));
    assert_eq!(backend.attribute("engine"), Some(engine));
    let denied = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    assert!(!check_with(&envoy.server, &[("traceparent", denied)]).await);
    let spans = receiver.trace("0af7651916cd43dd8448eb211c80319c", 2).await;
    assert_eq!(decision_and_backend(&spans, "b7ad6b7169203331").0.attribute("outcome"), Some("denied"));

    // A proxy's forward-auth question, W3C traceparent (the rule's key: the client's address).
    let (trace, parent) = ("5ce929d0e0e47364bf92f3577b34da6a", "a2fb4a1d1a96d312");
    let question = reqwest::Client::new()
        .get(envoy.server.url("/v1/forward-auth/api"))
        .header("traceparent", traceparent(trace, parent, "01"))
        .header("x-forwarded-method", "GET")
        .header("x-forwarded-uri", "/");
    assert_eq!(question.send().await.expect("answer").status(), 200);
    let spans = receiver.trace(trace, 2).await;
    let (decision, _) = decision_and_backend(&spans, parent);
    assert_eq!((decision.attribute("rule"), decision.attribute("outcome")), (Some("api"), Some("allowed")));

    // Envoy gRPC, B3 single header in the metadata; then the multi headers.
    let mut asked = tonic::Request::new(request("edge", &[&[("user", "u")]], 1));
    asked.metadata_mut().insert("b3", format!("{ENVOY_TRACE}-{ENVOY_PARENT}-1").parse().expect("metadata"));
    assert_eq!(envoy.client.should_rate_limit(asked).await.expect("answer").into_inner().overall_code, OK);
    let spans = receiver.trace(ENVOY_TRACE, 2).await;
    let (decision, _) = decision_and_backend(&spans, ENVOY_PARENT);
    for (name, value) in [("domain", "edge"), ("algorithm", "sliding_log"), ("engine", engine), ("outcome", "allowed")]
    {
        assert_eq!(decision.attribute(name), Some(value), "{name}: {decision:?}");
    }
    let mut asked = tonic::Request::new(request("edge", &[&[("user", "u")]], 2));
    for (name, value) in [("x-b3-traceid", "a3ce929d0e0e4736"), ("x-b3-spanid", HTTP_PARENT), ("x-b3-sampled", "1")] {
        asked.metadata_mut().insert(name, value.parse().expect("metadata"));
    }
    assert_eq!(envoy.client.should_rate_limit(asked).await.expect("answer").into_inner().overall_code, OVER);
    let spans = receiver.trace("0000000000000000a3ce929d0e0e4736", 2).await;
    assert_eq!(decision_and_backend(&spans, HTTP_PARENT).0.attribute("outcome"), Some("denied"));
}

#[tokio::test(flavor = "multi_thread")]
async fn http_and_grpc_checks_continue_the_callers_trace_on_memory() {
    continues_traces(None, "memory").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_and_grpc_checks_continue_the_callers_trace_on_redis_lua() {
    let redis = RedisServer::start();
    continues_traces(on_redis(&redis), "lua").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_and_grpc_checks_continue_the_callers_trace_on_the_redis_module() {
    let redis = RedisServer::start_with_module(&[]);
    continues_traces(on_redis(&redis), "module").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_and_grpc_checks_continue_the_callers_trace_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect::<Vec<_>>().join(", ");
    continues_traces(Some(format!("redis_cluster = [{nodes}]\n")), "lua").await;
}

/// Stops `server` with SIGTERM and waits for its exit.
fn terminate(mut server: Slidegate) {
    server.signal("TERM");
    assert!(server.wait_exit(Duration::from_secs(20)).success(), "{}", server.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn http_protobuf_export_flushes_the_last_spans_at_sigterm() {
    let receiver = Receiver::http().await;
    let rules = rules(None);
    let url = format!("{}/v1/traces", receiver.url());
    let server = Slidegate::serve(&["--config", rules.arg(), "--otlp-endpoint", &url]);
    assert!(check_with(&server, &[("traceparent", &traceparent(HTTP_TRACE, HTTP_PARENT, "01"))]).await);
    // At once: the batch's delay has not passed, so only the stop's flush sends the spans.
    terminate(server);
    let spans = receiver.spans();
    assert_eq!(spans.iter().filter(|s| s.trace_id == HTTP_TRACE).count(), 2, "{spans:?}");
    decision_and_backend(&spans, HTTP_PARENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_ratio_zero_exports_new_traces_never_and_follows_a_sampled_parent() {
    let receiver = Receiver::grpc().await;
    let rules = rules(None);
    let url = receiver.url();
    let server = Slidegate::serve(&["--config", rules.arg(), "--otlp-endpoint", &url, "--otlp-sampling-ratio", "0"]);
    check_with(&server, &[]).await;
    check_with(&server, &[("traceparent", &traceparent(ENVOY_TRACE, ENVOY_PARENT, "00"))]).await;
    check_with(&server, &[("traceparent", &traceparent(HTTP_TRACE, HTTP_PARENT, "01"))]).await;
    terminate(server);
    let spans = receiver.spans();
    assert!(
        !spans.is_empty() && spans.iter().all(|s| s.trace_id == HTTP_TRACE),
        "only the sampled parent's: {spans:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported_nor_connected_to() {
    let receiver = Receiver::grpc().await;
    let rules = rules(None);
    // The SDK's own variables do not turn tracing on: only --otlp-endpoint does.
    let server =
        Slidegate::serve_with_env(&["--config", rules.arg()], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url())]);
    check_with(&server, &[("traceparent", &traceparent(HTTP_TRACE, HTTP_PARENT, "01"))]).await;
    terminate(server);
    assert_eq!((receiver.connections(), receiver.spans().len()), (0, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_never_answers_does_not_delay_decisions() {
    // Accepts connections and never answers them.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let rules = rules(None);
    let server = Slidegate::serve(&["--config", rules.arg(), "--otlp-endpoint", &url]);
    for _ in 0..20 {
        let started = Instant::now();
        check_with(&server, &[]).await;
        // Far under the export's 5 s timeout: the decision did not wait for it.
        assert!(started.elapsed() < Duration::from_secs(2), "a check waited {:?}", started.elapsed());
    }
    terminate(server);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rules_files_server_fields_export_and_flags_win_over_them() {
    let receiver = Receiver::http().await;
    let url = format!("{}/v1/traces", receiver.url());
    let file = |ratio: &str| {
        RulesFile::new(&format!(
            "[server]\notlp_endpoint = \"{url}\"\notlp_protocol = \"http\"\notlp_sampling_ratio = {ratio}\n\n{RULE}"
        ))
    };
    // The file's endpoint, protocol and ratio: a new trace is exported at ratio 1.
    let rules = file("1.0");
    let server = Slidegate::serve(&["--config", rules.arg()]);
    check_with(&server, &[]).await;
    terminate(server);
    assert!(receiver.spans().iter().any(|s| s.name == "slidegate.decision"), "exported from the file's settings");
    // The flag's ratio wins over the file's: nothing new is exported at ratio 0.
    let before = receiver.spans().len();
    let server = Slidegate::serve(&["--config", rules.arg(), "--otlp-sampling-ratio", "0"]);
    check_with(&server, &[]).await;
    terminate(server);
    assert_eq!(receiver.spans().len(), before, "--otlp-sampling-ratio 0 over the file's 1.0");
    // The file's ratio 0 holds without the flag.
    let zero = file("0.0");
    let server = Slidegate::serve(&["--config", zero.arg()]);
    check_with(&server, &[]).await;
    terminate(server);
    assert_eq!(receiver.spans().len(), before, "the file's otlp_sampling_ratio = 0.0");
}

#[test]
fn unusable_tracing_fields_are_refused_with_their_place() {
    for (table, says) in [
        (
            "otlp_endpoint = \"https://collector:4317\"\n",
            ":2:17: server.otlp_endpoint: \"https://collector:4317\": give http://",
        ),
        (
            "otlp_endpoint = \"http://127.0.0.1:4317\"\notlp_sampling_ratio = 2.0\n",
            ":3:23: server.otlp_sampling_ratio: must be between",
        ),
        ("otlp_protocol = \"http\"\n", ":2:17: server.otlp_protocol: give the OTLP endpoint"),
        ("otlp_protocol = \"udp\"\n", ":2:17: unknown variant `udp`, expected `grpc` or `http`"),
    ] {
        let rules = RulesFile::new(&format!("[server]\n{table}\n{RULE}"));
        for command in
            [&["serve", "--http", "127.0.0.1:0", "--config", rules.arg()][..], &["validate", "--config", rules.arg()]]
        {
            let out = support::run(command);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_ne!(out.status.code(), Some(0), "{table:?} {command:?}: {stderr}");
            assert!(stderr.contains(says) || stdout.contains(says), "{table:?} {command:?}: {stdout} {stderr}");
        }
    }
}

#[test]
fn unusable_tracing_flags_are_refused_with_their_names() {
    for (args, says) in [
        (
            &["--otlp-endpoint", "http://127.0.0.1:4317", "--otlp-sampling-ratio", "1.5"][..],
            "--otlp-sampling-ratio: must be between 0.0 and 1.0, got 1.5",
        ),
        (
            &["--otlp-endpoint", "https://collector:4317"],
            "--otlp-endpoint: \"https://collector:4317\": give http://host:port",
        ),
        (&["--otlp-endpoint", "not a url"], "--otlp-endpoint: \"not a url\""),
        (&["--otlp-protocol", "http"], "--otlp-protocol: give the OTLP endpoint (otlp_endpoint) too"),
    ] {
        let mut all = vec!["serve", "--http", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let out = support::run(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
