//! `slidegate serve` on a Redis that speaks TLS, with certificates made in the test: decisions,
//! overrides shared between two instances (the store and its pub/sub) all over `rediss://`,
//! a client certificate for `tls-auth-clients yes`; the flags, their variables and the
//! `[backend]` fields; each certificate problem failing the start with its own message, and
//! TLS settings beside a plaintext URL refused rather than ignored; a TLS Cluster and Sentinel
//! over TLS.

mod support;

use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::{Flaw, RedisCluster, RedisSentinel, RedisServer, TestPki};
use support::{RulesFile, Slidegate, check, path, run};

const RULES: &str = "admin_token = \"t\"\n\n[[rules]]\nname = \"api\"\nlimit = 2\nwindow = \"60s\"\n";

/// The client flags of `pki`: its CA, its client certificate and key.
fn mtls_flags(pki: &TestPki) -> Vec<String> {
    let client = pki.client();
    let p = |f: &std::path::Path| path(f).to_owned();
    vec![
        "--redis-tls-ca".into(),
        p(&pki.ca()),
        "--redis-tls-cert".into(),
        p(&client.cert),
        "--redis-tls-key".into(),
        p(&client.key),
    ]
}

/// Three checks of `key` under the rule `api` (limit 2): admitted, admitted, denied.
async fn decides(client: &Client, server: &Slidegate, key: &str) {
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (status, _, v) = check(client, server, &json!({"rule": "api", "key": key})).await;
        assert_eq!((status, &v["degraded"]), (200, &json!(false)), "{v} {}", server.log_text());
        statuses.push(v["allowed"].clone());
    }
    assert_eq!(statuses, [true, true, false], "{}", server.log_text());
}

/// The local port of every client connection `redis` has but the one asking: the port each
/// client reached it on.
fn client_ports(redis: &RedisServer) -> Vec<String> {
    let list: String = redis.query(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("laddr=")))
        .map(|a| a.rsplit(':').next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_decide_and_share_overrides_over_mutual_tls() {
    let pki = TestPki::new("serve");
    let redis = RedisServer::start_tls(&pki, true, &[]);
    let rules = RulesFile::new(RULES);
    let mut args = vec!["--redis".to_owned(), redis.tls_url(), "--config".into(), rules.arg().into()];
    args.extend(mtls_flags(&pki));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Slidegate::serve(&args);
    let client = pki.client();
    let b = Slidegate::serve_with_env(
        &["--redis", &redis.tls_url(), "--config", rules.arg()],
        &[
            ("SLIDEGATE_REDIS_TLS_CA", path(&pki.ca())),
            ("SLIDEGATE_REDIS_TLS_CERT", path(&client.cert)),
            ("SLIDEGATE_REDIS_TLS_KEY", path(&client.key)),
        ],
    );
    let http = Client::new();
    decides(&http, &a, "alice").await;
    // One limit across both: the key's state is in the TLS Redis.
    assert_eq!(check(&http, &b, &json!({"rule": "api", "key": "alice"})).await.2["allowed"], false);
    let put = http
        .put(a.url("/v1/overrides/api/bob"))
        .bearer_auth("t")
        .json(&json!({"limit": 5}))
        .send()
        .await
        .expect("PUT override");
    assert_eq!(put.status().as_u16(), 200);
    // The override reaches the other instance through the store's pub/sub, over TLS too.
    let started = Instant::now();
    loop {
        let (_, _, v): (_, _, Value) = check(&http, &b, &json!({"rule": "api", "key": "bob", "cost": 1})).await;
        if v["limit"] == 5 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "override not applied by b: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tls_port = redis.tls_port().expect("TLS").to_string();
    let ports = client_ports(&redis);
    assert!(ports.len() >= 4 && ports.iter().all(|p| *p == tls_port), "connections not all over TLS: {ports:?}");
}

#[tokio::test]
async fn backend_fields_in_the_rules_file_set_tls_up_relative_to_the_file() {
    let pki = TestPki::new("fields");
    let redis = RedisServer::start_tls(&pki, false, &[]);
    let rules = RulesFile::new(&format!(
        "{RULES}\n[backend]\nredis = \"{}\"\ntls_ca = \"{}\"\n",
        redis.tls_url(),
        path(&pki.ca())
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    decides(&Client::new(), &server, "carol").await;
}

/// `slidegate serve --redis <url> <flags>`: its exit code and standard error.
fn refused(url: &str, flags: &[String]) -> (Option<i32>, String) {
    let http = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let mut args = vec!["serve".to_owned(), "--http".into(), http, "--redis".into(), url.to_owned()];
    args.extend(flags.iter().cloned());
    let out = run(&args);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn ca_flag(ca: &std::path::Path) -> Vec<String> {
    vec!["--redis-tls-ca".into(), path(ca).into()]
}

#[test]
fn each_certificate_problem_fails_the_start_with_its_own_message() {
    let (pki, other) = (TestPki::new("problems"), TestPki::new("problems-other"));
    let mtls = RedisServer::start_tls(&pki, true, &[]);
    let (code, stderr) = refused(&mtls.tls_url(), &ca_flag(&pki.ca()));
    assert!(code == Some(2) && stderr.contains("CertificateRequired"), "no client certificate: {code:?} {stderr}");
    assert_eq!(stderr.matches("CertificateRequired").count(), 1, "said once, not once per error layer: {stderr}");
    let (code, stderr) = refused(&mtls.tls_url(), &ca_flag(&other.ca()));
    assert!(code == Some(2) && stderr.contains("UnknownIssuer"), "another CA: {code:?} {stderr}");
    let missing = pki.dir().join("nowhere.pem");
    let (code, stderr) = refused(&mtls.tls_url(), &ca_flag(&missing));
    assert!(code == Some(2) && stderr.contains(path(&missing)) && stderr.contains("cannot read it"), "{stderr}");
    let (code, stderr) = refused(&mtls.url(), &ca_flag(&pki.ca()));
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("is not a rediss:// URL") && stderr.contains("nothing falls back to plaintext"),
        "{stderr}"
    );

    let expired = TestPki::new("problems-expired");
    expired.issue("server", Flaw::Expired);
    let redis = RedisServer::start_tls(&expired, false, &[]);
    let (code, stderr) = refused(&redis.tls_url(), &ca_flag(&expired.ca()));
    assert!(code == Some(2) && stderr.contains("expired"), "expired: {code:?} {stderr}");
}

#[tokio::test]
async fn another_hosts_certificate_fails_the_start_unless_hostname_verification_is_skipped_with_a_warning() {
    let pki = TestPki::new("hostname");
    pki.issue("server", Flaw::OtherHost);
    let redis = RedisServer::start_tls(&pki, false, &[]);
    let (code, stderr) = refused(&redis.tls_url(), &ca_flag(&pki.ca()));
    assert!(code == Some(2) && stderr.contains("not valid for name"), "{code:?} {stderr}");
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&[
        "--redis",
        &redis.tls_url(),
        "--config",
        rules.arg(),
        "--redis-tls-ca",
        path(&pki.ca()),
        "--redis-tls-skip-hostname-verification",
    ]);
    decides(&Client::new(), &server, "dave").await;
    assert!(server.log_text().contains("not checked against the host's name"), "{}", server.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_decides_on_every_master() {
    let pki = TestPki::new("cluster");
    let cluster = RedisCluster::start_tls(&pki, 3, 0);
    let rules = RulesFile::new(RULES);
    let nodes = cluster.tls_urls().join(",");
    let server =
        Slidegate::serve(&["--redis-cluster", &nodes, "--config", rules.arg(), "--redis-tls-ca", path(&pki.ca())]);
    let http = Client::new();
    // Keys of many slots, so that every master (reached after MOVED) decides some.
    for i in 0..12 {
        decides(&http, &server, &format!("user-{i}")).await;
    }
    let tls_ports: Vec<String> = cluster.nodes().iter().map(|n| n.tls_port().expect("TLS").to_string()).collect();
    for node in cluster.nodes() {
        let ports = client_ports(node);
        assert!(!ports.is_empty() && ports.iter().all(|p| tls_ports.contains(p)), "{ports:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_names_a_master_reached_over_tls() {
    let pki = TestPki::new("sentinel");
    let sentinel = RedisSentinel::start_tls(&pki);
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&[
        "--redis-sentinel",
        &sentinel.sentinel_tls_url(),
        "--config",
        rules.arg(),
        "--redis-tls-ca",
        path(&pki.ca()),
    ]);
    decides(&Client::new(), &server, "erin").await;
    let tls_port = sentinel.master.tls_port().expect("TLS").to_string();
    let ports = client_ports(&sentinel.master);
    assert!(ports.iter().filter(|p| **p == tls_port).count() >= 2, "slidegate's connections: {ports:?}");
}
