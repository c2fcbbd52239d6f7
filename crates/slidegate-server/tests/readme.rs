//! The examples of the README and of `docs/`, run as written against the real binary: the quick
//! start's request and the answer it shows, the rules files (with this test's redis-server in
//! place of the documented address), the Python client, the `check` and `bench` commands, the
//! Envoy configuration and command, and loading the Redis module. The files are read at test
//! time, so an edit that breaks an example fails here. (Their Rust examples compile as doctests
//! of `slidegate-tower`.)

mod support;

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;
use slidegate::FailurePolicy;
use slidegate_server::config::Config;
use slidegate_server::envoy::config::EnvoyConfig;
use slidegate_server::envoy::limit::Unit;
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate, tls};

/// A documentation file, by its path from the repository's root.
fn doc(path: &str) -> String {
    let full = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The body of the first fenced block in `lang` after the first line that starts with `marker`.
fn block(text: &str, marker: &str, lang: &str) -> String {
    // A newline before the text, so that its first line counts as a line.
    let start = format!("\n{text}").find(&format!("\n{marker}")).unwrap_or_else(|| panic!("no line {marker:?}"));
    let section = &text[start..];
    let fence = format!("```{lang}\n");
    let body =
        &section[section.find(&fence).unwrap_or_else(|| panic!("no {lang} block after {marker:?}")) + fence.len()..];
    body[..body.find("```").expect("closed block")].to_owned()
}

/// The commands of a shell block: its lines without comments, split into words.
fn commands(sh: &str) -> Vec<Vec<String>> {
    sh.lines()
        .map(|l| l.split(" #").next().unwrap_or(l).trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// The documented address of the service, `localhost:8080` or `127.0.0.1:8080`, made `server`'s.
fn at(text: &str, server: &Slidegate) -> String {
    let addr = server.base.trim_start_matches("http://");
    text.replace("localhost:8080", addr).replace("127.0.0.1:8080", addr)
}

#[tokio::test]
async fn the_quick_start_answers_what_the_readme_shows() {
    let readme = doc("README.md");
    let quick_start = block(&readme, "## Quick start (fresh Debian/Ubuntu machine with Rust)", "sh");
    assert!(quick_start.contains("cargo run --release -- serve\n"), "{quick_start}");
    assert!(quick_start.contains("bash scripts/test.sh\n"), "{quick_start}");
    let curl = block(&readme, "Then, from another terminal:", "sh");
    let mut lines = curl.lines();
    let request = lines.next().expect("the curl line");
    let shown = lines.next().and_then(|l| l.strip_prefix("# ")).expect("the answer, as a comment");
    let body = request.split('\'').nth(1).expect("the body, in single quotes");
    assert!(request.starts_with("curl -s -X POST localhost:8080/v1/check -d '"), "{request}");

    let server = Slidegate::serve(&[]);
    let answer = reqwest::Client::new()
        .post(server.url("/v1/check"))
        .body(body.to_owned())
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert_eq!(answer, shown, "the answer differs from the README's");
}

#[tokio::test]
async fn the_rules_file_and_the_python_client_work_as_written() {
    let text = doc("docs/service.md");
    let redis = RedisServer::start();
    let rules = RulesFile::new(&block(&text, "## Rules file", "toml").replace("redis://127.0.0.1:6379", &redis.url()));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();

    let listed: Value = client.get(server.url("/v1/rules")).send().await.expect("rules").json().await.expect("JSON");
    let names: Vec<&str> =
        listed["rules"].as_array().expect("rules").iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names.len(), 4, "{listed}");
    for name in ["sms", "api", "search", "upload"] {
        assert!(names.contains(&name), "{name} missing: {listed}");
    }

    // `is_allowed` as the docs define it, seven times against the "sms" rule (5 per 60 s).
    let python = format!(
        "{}\nprint([is_allowed(\"192.168.1.100\") for _ in range(7)])\n",
        at(&block(&text, "## From any language", "python"), &server)
    );
    let out =
        Command::new("python3").args(["-c", &python]).output().expect("python3 runs (scripts/setup.sh installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[True, True, True, True, True, False, False]");

    // The documented key layout, in the documented Redis.
    let entries: usize = redis.query(&["ZCARD", "slidegate:sms:{192.168.1.100}"]);
    assert_eq!(entries, 5);
    // The admin token guards the key endpoints.
    let key = server.url("/v1/keys/sms/192.168.1.100");
    assert_eq!(client.get(&key).send().await.expect("keys").status(), 401);
    let authorized = client.get(&key).bearer_auth("change-me").send().await.expect("keys");
    assert_eq!(authorized.status(), 200);
}

#[tokio::test]
async fn the_check_and_bench_commands_run_as_written() {
    let text = doc("docs/service.md");
    let redis = RedisServer::start();
    let rules = RulesFile::new(&block(&text, "## Rules file", "toml").replace("redis://127.0.0.1:6379", &redis.url()));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let lines = commands(&block(&text, "## `slidegate check` and `slidegate bench`", "sh"));
    assert_eq!(lines.len(), 5, "{lines:?}");

    for line in lines {
        assert_eq!(line[0], "slidegate", "{line:?}");
        // This test's rules file, Redis and server in place of the documented ones, and runs of a
        // second instead of ten.
        let args: Vec<String> = line[1..]
            .iter()
            .enumerate()
            .map(|(i, w)| match w.as_str() {
                "rules.toml" => rules.arg().to_owned(),
                "redis://127.0.0.1:6379" => redis.url(),
                _ if line[i] == "--duration" => "1s".to_owned(),
                other => at(other, &server),
            })
            .collect();
        let out = support::run(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        if args[0] == "check" {
            // Exit code 0: admitted, and the decision printed as JSON.
            let decision: Value = serde_json::from_str(&stdout).expect("one JSON decision");
            assert_eq!(decision["allowed"], true, "{decision}");
            // The first admission into the key: its permit frees when the window has passed.
            assert_eq!(decision["next_permit_after_ms"], decision["reset_after_ms"], "{decision}");
        } else if args.contains(&"--json".to_owned()) {
            let report: Value = serde_json::from_str(&stdout).expect("one JSON object");
            for field in ["decisions_per_sec", "p50_us", "p90_us", "p99_us", "max_us", "allowed", "denied", "errors"] {
                assert!(report[field].is_number(), "{field} missing: {report}");
            }
            assert_eq!(report["errors"], 0, "{report}");
            assert!(report["allowed"].as_u64() >= Some(1), "{report}");
        }
    }
}

#[test]
fn the_operations_rules_file_loads_with_its_documented_policies() {
    let text = block(&doc("docs/operations.md"), "# Operations", "toml");
    let config = Config::parse(&text, "operations.toml").expect("the documented file loads");
    assert_eq!(config.backend.failure_policy, FailurePolicy::FailOpen);
    assert_eq!(config.backend.near_cache, 100_000);
    assert_eq!(config.backend.timeout, Duration::from_millis(50));
    let policy = |name: &str| config.rules.get(name).expect(name).quota.failure_policy();
    assert_eq!(policy("sms"), Some(FailurePolicy::FailClosed));
    assert_eq!(policy("api"), Some(FailurePolicy::Local { share_permille: 250 }));
    assert_eq!(policy("search"), Some(FailurePolicy::LocalAuto { fallback_permille: 250 }));
}

#[test]
fn the_documented_tracing_fields_load() {
    let text = block(&doc("docs/operations.md"), "The rules file's `[server]` fields are read once", "toml");
    let config = Config::parse(&text, "tracing.toml").expect("the documented table loads");
    assert_eq!(config.tracing.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
    assert_eq!(config.tracing.otlp_sampling_ratio, Some(0.1));
}

/// The port of an Envoy `cluster`'s endpoint, checked to be the one the `serve` command's
/// `--grpc` binds.
fn cluster_port(cluster: &serde_yaml_ng::Value, serve: &[String]) -> u64 {
    let port = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        ["port_value"]
        .as_u64()
        .expect("a port");
    let grpc_flag = serve.iter().position(|w| w == "--grpc").expect("--grpc");
    assert!(serve[grpc_flag + 1].ends_with(&format!(":{port}")), "{serve:?}");
    port
}

#[tokio::test]
async fn the_envoy_configuration_and_command_work_as_written() {
    let text = doc("docs/envoy.md");
    let edge = block(&text, "# Envoy's rate limit service", "yaml");

    // What the comments of the configuration say, as the real loader reads it.
    let mut config = EnvoyConfig::default();
    config.add(&edge).expect("the documented domain loads");
    let limit = |entries: &[(&str, &str)]| config.find("edge", entries).and_then(|n| n.limit.clone()).expect("a limit");
    let per_address = limit(&[("remote_address", "10.1.2.3")]);
    assert_eq!((per_address.requests_per_unit, per_address.unit), (10, Unit::Second));
    assert!(limit(&[("remote_address", "50.0.0.5")]).quota.is_none(), "50.0.0.5 is blocked");
    assert_eq!(limit(&[("path", "/api/orders")]).requests_per_unit, 600);
    let nested = limit(&[("path", "/api/orders"), ("user", "ada")]);
    assert_eq!((nested.requests_per_unit, nested.unit), (1000, Unit::Hour));
    assert!(limit(&[("health", "x")]).unlimited);
    let tenant = config.find("edge", &[("tenant", "acme")]).expect("tenant");
    assert!(tenant.shadow_mode && tenant.detailed_metric);

    // The Envoy side points at the port `--grpc` binds and names the domain.
    let serve = commands(&block(&text, "# Envoy's rate limit service", "sh")).remove(0);
    let envoy: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&block(&text, "## The Envoy side", "yaml")).expect("Envoy's YAML");
    let cluster = &envoy["static_resources"]["clusters"][0];
    let filter = &envoy["http_filters"][0]["typed_config"];
    assert_eq!(cluster["name"], filter["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]);
    let port = cluster_port(cluster, &serve);
    assert_eq!(filter["domain"].as_str(), Some("edge"));

    // The README shows the same command.
    assert_eq!(commands(&block(&doc("README.md"), "**Envoy**", "sh")), std::slice::from_ref(&serve));

    // The command, with a free port and the configuration in a directory of its own.
    assert_eq!(serve[..2], ["slidegate", "serve"], "{serve:?}");
    let dir =
        std::env::temp_dir().join(format!("slidegate-docs-{}-{}", std::process::id(), slidegate_testkit::free_port()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("edge.yaml"), &edge).expect("write");
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let args: Vec<String> = serve[2..]
        .iter()
        .map(|w| match w.as_str() {
            "./ratelimit-config" => dir.to_str().expect("utf-8").to_owned(),
            w if w.ends_with(&format!(":{port}")) => grpc.clone(),
            other => other.to_owned(),
        })
        .collect();
    let server = Slidegate::serve(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
    for (address, code) in [("50.0.0.5", Code::OverLimit), ("10.1.2.3", Code::Ok)] {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "remote_address".into(), value: address.into() }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.expect("answer").into_inner();
        assert_eq!(answer.overall_code, code as i32, "{address}: {answer:?}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_envoy_migration_commands_run_as_written() {
    let text = doc("docs/envoy.md");
    let edge = block(&text, "# Envoy's rate limit service", "yaml");
    let sh = block(&text, "## Migrating from envoyproxy/ratelimit", "sh");
    let lines = commands(&sh);
    assert_eq!(lines.len(), 2, "the environment form and the flag form: {lines:?}");
    // Each upstream variable the comment sets has its row in the table.
    for var in ["SHADOW_MODE", "NEAR_LIMIT_RATIO", "LIMIT_RESPONSE_HEADERS_ENABLED", "REDIS_URL", "RUNTIME_ROOT"] {
        assert!(sh.contains(&format!("{var}=")), "{var} in the comment");
        assert!(
            text.lines().any(|l| l.starts_with("| ") && l.contains(&format!("`{var}")) && l.contains("`--")),
            "{var} row"
        );
    }
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!(
        "slidegate-migrate-{}-{}",
        std::process::id(),
        slidegate_testkit::free_port()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("edge.yaml"), &edge).expect("write");
    for line in lines {
        // `VAR=value … slidegate serve <flags>`, with this test's directory, port and Redis.
        let start = line.iter().position(|w| w == "slidegate").expect("slidegate");
        let env: Vec<(&str, &str)> = line[..start].iter().map(|w| w.split_once('=').expect("VAR=value")).collect();
        assert_eq!(line[start + 1], "serve", "{line:?}");
        let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
        let args: Vec<String> = line[start + 2..]
            .iter()
            .map(|w| match w.as_str() {
                "/srv/runtime_data/current/ratelimit/config" => dir.to_str().expect("utf-8").to_owned(),
                "127.0.0.1:8081" => grpc.clone(),
                "redis://127.0.0.1:6379" => redis.url(),
                other => other.to_owned(),
            })
            .collect();
        let server = Slidegate::serve_with_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), &env);
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
        // 50.0.0.5 is blocked (0 a second): in shadow mode the answer is OK, its status over,
        // and the headers are upstream's.
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "remote_address".into(), value: "50.0.0.5".into() }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.expect("answer").into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32, "{line:?}: {answer:?}");
        assert_eq!(answer.statuses[0].code, Code::OverLimit as i32, "{line:?}");
        let names: Vec<&str> = answer.response_headers_to_add.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(names, ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"], "{line:?}");
        let page = reqwest::get(server.url("/metrics")).await.expect("metrics").text().await.expect("text");
        assert!(page.lines().any(|l| l == "ratelimit_service_global_shadow_mode 1"), "{line:?}: {page}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_redis_module_loads_as_written() {
    let text = doc("docs/redis.md");
    let sh = block(&text, "## The Redis module", "sh");
    let lines = commands(&sh);
    let start = lines.iter().find(|l| l[0] == "redis-server").expect("the redis-server line");
    // The README shows the same build and start.
    let readme = commands(&block(&doc("README.md"), "**Redis module**", "sh"));
    assert!(readme.iter().all(|l| lines.contains(l)), "{readme:?} not in {lines:?}");

    // `redis-server --loadmodule <the build>`, on a free port: the commands answer.
    assert_eq!(start[1..], ["--loadmodule", "\"$PWD/target/release/libslidegate_module.so\""]);
    let module = slidegate_testkit::module_path();
    let module = module.to_str().expect("utf-8");
    let server = RedisServer::start_with(&["--loadmodule", module]);
    let admitted: Vec<i64> = server.query(&["SLIDEGATE.CHECK", "k", "sliding_log", "5", "10000", "1"]);
    assert_eq!(admitted.first(), Some(&1), "{admitted:?}");

    // On a running server with the setting the block's comment names: `MODULE LOAD`.
    assert!(sh.contains("with `enable-module-command local`"), "{sh}");
    let load = sh.lines().find_map(|l| l.split("redis-cli ").nth(1)).expect("the MODULE LOAD line");
    let words: Vec<&str> = load.split_whitespace().collect();
    assert_eq!(words[..2], ["MODULE", "LOAD"]);
    let plain = RedisServer::start_with(&["--enable-module-command", "local"]);
    let loaded: String = plain.query(&["MODULE", "LOAD", module]);
    assert_eq!(loaded, "OK");
    let answered: Vec<i64> = plain.query(&["SLIDEGATE.CHECK", "k", "sliding_log", "5", "10000", "1"]);
    assert_eq!(answered.first(), Some(&1), "{answered:?}");
}

#[test]
fn the_dashboard_settings_parse_as_written() {
    let text = block(&doc("docs/dashboard.md"), "## Settings", "toml");
    let config = Config::parse(&text, "docs/dashboard.md").expect("the documented [ui] table");
    assert!(config.ui.enabled && !config.ui.require_token);
}

/// A JSON value's shape: its objects' keys, its arrays' first elements, its scalars' types.
fn same_shape(documented: &Value, real: &Value, at: &str) {
    match (documented, real) {
        (Value::Object(d), Value::Object(r)) => {
            let (dk, rk): (Vec<&String>, Vec<&String>) = (d.keys().collect(), r.keys().collect());
            assert_eq!(dk, rk, "the fields of {at}");
            for (k, v) in d {
                same_shape(v, &r[k], &format!("{at}.{k}"));
            }
        }
        (Value::Array(d), Value::Array(r)) => {
            if let (Some(d), Some(r)) = (d.first(), r.first()) {
                same_shape(d, r, &format!("{at}[0]"));
            }
        }
        (d, r) => assert_eq!(std::mem::discriminant(d), std::mem::discriminant(r), "{at}: {d} vs {r}"),
    }
}

#[tokio::test]
async fn the_stats_answer_has_the_documented_shape() {
    let documented = block(&doc("docs/service.md"), "### `GET /v1/stats`", "json").replace("…, ", "");
    let documented: Value = serde_json::from_str(&documented).expect("the documented answer is JSON");
    let redis = RedisServer::start();
    let rules = RulesFile::new("[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"60s\"\n");
    let server = Slidegate::serve(&["--config", rules.arg(), "--redis", &redis.url()]);
    let client = reqwest::Client::new();
    for body in [r#"{"key": "k", "limit": 5, "window": "1s"}"#]
        .into_iter()
        .chain([r#"{"rule": "sms", "key": "192.168.1.100"}"#; 7])
    {
        let response = client.post(server.url("/v1/check")).body(body).send().await.expect("check");
        assert_eq!(response.status(), 200);
    }
    let real: Value = client.get(server.url("/v1/stats")).send().await.expect("stats").json().await.expect("JSON");
    // The documented rule is the real answer's second (inline checks come first).
    let mut real = real;
    real["rules"] = Value::Array(vec![real["rules"][1].clone()]);
    same_shape(&documented, &real, "the answer");
}

#[tokio::test]
async fn the_operations_commands_run_as_written() {
    let lines = commands(&block(&doc("docs/operations.md"), "## Running it", "sh"));
    assert_eq!(lines.len(), 2, "{lines:?}");

    // `validate` with the documented rules file and Envoy configuration in place of the names.
    let rules = RulesFile::new(&block(&doc("docs/service.md"), "## Rules file", "toml"));
    let dir =
        std::env::temp_dir().join(format!("slidegate-ops-{}-{}", std::process::id(), slidegate_testkit::free_port()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("edge.yaml"), block(&doc("docs/envoy.md"), "# Envoy's rate limit service", "yaml"))
        .expect("write");
    let files = |w: &str| match w {
        "rules.toml" => rules.arg().to_owned(),
        "./ratelimit-config" => dir.to_str().expect("utf-8").to_owned(),
        other => other.to_owned(),
    };
    let validate: Vec<String> = lines[0].iter().map(|w| files(w)).collect();
    assert_eq!(validate[..2], ["slidegate", "validate"]);
    let out = support::run(&validate[1..]);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{summary}{}", String::from_utf8_lossy(&out.stderr));
    assert!(summary.contains("rules: 4 (api, search, sms, upload)"), "{summary}");
    assert!(summary.contains("envoy domains: 1 (edge: "), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);

    // `serve` with its leading VAR=value words as its environment: the gRPC port it names
    // answers health checks, and the log is JSON.
    let (env, command): (Vec<&String>, Vec<&String>) = lines[1].iter().partition(|w| w.starts_with("SLIDEGATE_"));
    assert_eq!(command[..2], ["slidegate", "serve"]);
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|w| w.split_once('=').expect("VAR=value"))
        .map(|(name, value)| (name, if name == "SLIDEGATE_GRPC" { grpc.as_str() } else { value }))
        .collect();
    assert_eq!(env.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["SLIDEGATE_GRPC", "SLIDEGATE_LOG_FORMAT"]);
    let memory = RulesFile::new("[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"60s\"\n");
    let args: Vec<String> =
        command[2..].iter().map(|w| if *w == "rules.toml" { memory.arg().to_owned() } else { (*w).clone() }).collect();
    let server = Slidegate::serve_with_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), &env);
    let mut health = tonic_health::pb::health_client::HealthClient::new(support::grpc_channel(&grpc).await);
    let status = health.check(tonic_health::pb::HealthCheckRequest::default()).await.expect("health").into_inner();
    assert_eq!(status.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
    let log = server.log_text();
    assert!(log.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_tls_command_and_envoy_s_mutual_tls_cluster_work_as_written() {
    let text = doc("docs/operations.md");
    let serve = commands(&block(&text, "## TLS on the listeners", "sh")).remove(0);
    let envoy: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&block(&text, "Envoy's side of mutual TLS", "yaml")).expect("Envoy's YAML");

    // The cluster speaks HTTP/2 over TLS (ALPN h2) to the port `--grpc` binds, presents a
    // certificate and checks slidegate's against a CA.
    let cluster = &envoy["static_resources"]["clusters"][0];
    let options =
        &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(options["explicit_http_config"]["http2_protocol_options"].is_mapping(), "{options:?}");
    let tls = &cluster["transport_socket"]["typed_config"];
    assert_eq!(tls["@type"], "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext");
    let common = &tls["common_tls_context"];
    assert_eq!(common["alpn_protocols"][0], "h2");
    let presented = &common["tls_certificates"][0];
    assert!(presented["certificate_chain"]["filename"].is_string() && presented["private_key"]["filename"].is_string());
    assert!(common["validation_context"]["trusted_ca"]["filename"].is_string());
    let port = cluster_port(cluster, &serve);

    // The command, with the test's certificates in place of the documented files: a client
    // presenting a certificate of the CA given to --tls-client-ca, as Envoy does, is answered;
    // one presenting none is refused.
    assert_eq!(serve[..2], ["slidegate", "serve"], "{serve:?}");
    let pki = slidegate_testkit::TestPki::new("docs-tls");
    let edge = block(&doc("docs/envoy.md"), "# Envoy's rate limit service", "yaml");
    std::fs::create_dir_all(pki.dir().join("ratelimit-config")).expect("dir");
    std::fs::write(pki.dir().join("ratelimit-config/edge.yaml"), edge).expect("write");
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let (server_files, client) = (pki.server(), pki.client());
    let args: Vec<String> = serve[2..]
        .iter()
        .map(|w| match w.as_str() {
            "./ratelimit-config" => support::path(&pki.dir().join("ratelimit-config")).to_owned(),
            "/etc/slidegate/tls/server.pem" => support::path(&server_files.cert).to_owned(),
            "/etc/slidegate/tls/server.key" => support::path(&server_files.key).to_owned(),
            "/etc/slidegate/tls/envoy-ca.pem" => support::path(&pki.ca()).to_owned(),
            w if w.ends_with(&format!(":{port}")) => grpc.clone(),
            other => other.to_owned(),
        })
        .collect();
    assert!(!args.iter().any(|a| a.starts_with("/etc/")), "a documented file left unmapped: {args:?}");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _server = tls::serve_https(&args, &[], &tls::trust(&pki.ca(), Some(&client)));
    let request = || RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "remote_address".into(), value: "10.1.2.3".into() }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    assert_eq!(tls::grpc_call(&grpc, &pki.ca(), Some(&client), request()).await, Ok(Code::Ok as i32));
    let refused = tls::grpc_call(&grpc, &pki.ca(), None, request()).await;
    assert!(refused.is_err(), "{refused:?}");
}

#[test]
fn a_refused_envoy_file_is_reported_as_the_operations_guide_shows() {
    let marker = "A refused Envoy file";
    let text = doc("docs/operations.md");
    let file = block(&text, marker, "yaml");
    let shown = block(&text, marker, "text");
    let (command, output) = shown.split_once('\n').expect("a command, then its output");
    let command = command.strip_prefix("$ ").expect("a command").split_whitespace().collect::<Vec<_>>();
    assert_eq!(command, ["slidegate", "validate", "--envoy-config", "ratelimit-config"]);
    // The file where its comment says, under a scratch directory: the report names it from there.
    let scratch = std::env::temp_dir().join(format!(
        "slidegate-refused-{}-{}",
        std::process::id(),
        slidegate_testkit::free_port()
    ));
    let name = file.lines().next().and_then(|l| l.strip_prefix("# ")).expect("the file's name");
    let path = scratch.join(name);
    std::fs::create_dir_all(path.parent().expect("a directory")).expect("dir");
    std::fs::write(&path, &file).expect("write");
    let dir = scratch.join(command[3]);
    let out = support::run(&["validate", "--envoy-config", dir.to_str().expect("utf-8")]);
    let _ = std::fs::remove_dir_all(&scratch);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim(), format!("{}/{}", scratch.display(), output.trim()));
}

#[tokio::test]
async fn changing_limits_at_run_time_works_as_written() {
    let text = doc("docs/operations.md");
    let redis = RedisServer::start();
    let url = redis.url();
    let rules = RulesFile::new(&block(&text, "A pushed document", "toml"));
    let local =
        RulesFile::new(&block(&text, "What stays with each instance", "toml").replace("redis://127.0.0.1:6379", &url));
    let swap = |w: &String| match w.as_str() {
        "redis://127.0.0.1:6379" => url.clone(),
        "rules.toml" => rules.arg().to_owned(),
        "local.toml" => local.arg().to_owned(),
        other => other.to_owned(),
    };
    let lines = commands(&block(&text, "## Changing limits at run time", "sh"));
    assert_eq!(
        lines.iter().map(|l| l[..3].join(" ")).collect::<Vec<_>>(),
        ["slidegate rules push", "slidegate rules show", "slidegate serve --redis"]
    );
    for line in &lines[..2] {
        let out = support::run(&line[1..].iter().map(swap).collect::<Vec<_>>());
        assert!(out.status.success(), "{line:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let shown = support::run(&lines[1][1..].iter().map(swap).collect::<Vec<_>>());
    assert!(String::from_utf8_lossy(&shown.stdout).starts_with("# slidegate rules version 1,"));
    let args: Vec<String> = lines[2][2..].iter().map(swap).collect();
    let server = Slidegate::serve(&args.iter().map(String::as_str).collect::<Vec<_>>());

    // The overrides' commands, as written, in order: set, inspect, list, delete.
    let answers: Vec<Value> = block(&text, "**Overrides.**", "sh")
        .lines()
        .map(|line| {
            let out = Command::new("sh").args(["-c", &at(line, &server)]).output().expect("sh and curl");
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{line}: {e}: {out:?}"))
        })
        .collect();
    assert_eq!(answers.len(), 4);
    assert!(answers[0]["override"]["limit"] == 1000 && answers[0]["override"]["expires_at_ms"].is_u64(), "{answers:?}");
    assert_eq!(
        (&answers[1]["source"], &answers[1]["limit"]),
        (&serde_json::json!("override"), &serde_json::json!(1000))
    );
    assert_eq!(answers[2]["total"], 1, "{}", answers[2]);
    assert_eq!(answers[3]["deleted"], true, "{}", answers[3]);
}
