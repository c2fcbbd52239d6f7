//! TLS on the listeners, against the real binary with certificates made in the test: HTTPS from
//! curl and gRPC over TLS from a tonic client, with the flags, their variables and the
//! `[server]` fields; mutual TLS refusing a client without a certificate or with one of another
//! CA at the handshake; handshakes never finished closed at the header deadline while they hold
//! slots under `max_connections`; the certificate replaced on disk while serving (and a bad
//! replacement keeping the one served); each file problem failing the start with the file and
//! the reason.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use slidegate_testkit::{CertFiles, Flaw, TestPki};
use support::envoy::{Dir, OK, USER_EDGE, request};
use support::tls::{curl, curl_with, grpc_call, serve_https, trust};
use support::{Slidegate, closed_before, path, run};

/// The flags of `server`'s certificate and key.
fn cert_flags(server: &CertFiles) -> Vec<String> {
    vec!["--tls-cert".into(), path(&server.cert).into(), "--tls-key".into(), path(&server.key).into()]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// A check of `key` (inline limit 100 a minute) over `client`: curl's exit code and answer.
fn https_check(server: &Slidegate, client: &[String], key: &str) -> (i32, String) {
    let body = format!(r#"{{"key": "{key}", "limit": 100, "window": "60s"}}"#);
    let (code, out, err) =
        curl_with(client, &["-H", "content-type: application/json", "-d", &body], &server.url("/v1/check"));
    (code, if code == 0 { out } else { err })
}

#[test]
fn https_is_served_with_the_flags_the_variables_and_the_server_fields() {
    let pki = TestPki::new("https");
    let server = pki.server();
    let client = trust(&pki.ca(), None);
    let by_flags = serve_https(&strs(&cert_flags(&server)), &[], &client);
    let (code, answer) = https_check(&by_flags, &client, "alice");
    assert!(code == 0 && answer.contains("\"allowed\":true"), "{code} {answer}");
    // Not trusted without the CA (the system's store has none of the test's), and no plaintext.
    let (code, _, err) = curl(&[&by_flags.url("/healthz")]);
    assert_eq!(code, 60, "a certificate curl cannot verify: {err}");
    let plain = by_flags.url("/healthz").replace("https://", "http://");
    assert_ne!(curl(&[&plain]).0, 0, "plaintext HTTP on the TLS port");
    assert!(by_flags.log_text().contains("https://127.0.0.1"), "{}", by_flags.log_text());

    let env = [("SLIDEGATE_TLS_CERT", path(&server.cert)), ("SLIDEGATE_TLS_KEY", path(&server.key))];
    let by_env = serve_https(&[], &env, &client);
    assert_eq!(https_check(&by_env, &client, "bob").0, 0);

    // Relative to the rules file; with the client CA, mutual TLS.
    let rules = pki.dir().join("rules.toml");
    let fields = "[server]\ntls_cert = \"server.pem\"\ntls_key = \"server.key\"\ntls_client_ca = \"ca.pem\"\n";
    std::fs::write(&rules, fields).expect("write rules");
    let mtls = trust(&pki.ca(), Some(&pki.client()));
    let by_fields = serve_https(&["--config", path(&rules)], &[], &mtls);
    assert_eq!(https_check(&by_fields, &mtls, "carol").0, 0);
    assert_ne!(https_check(&by_fields, &client, "carol").0, 0, "a client without a certificate was served");
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_or_with_one_of_another_ca() {
    let (pki, other) = (TestPki::new("mtls"), TestPki::new("mtls-other"));
    let mut args = cert_flags(&pki.server());
    args.extend(["--tls-client-ca".into(), path(&pki.ca()).into()]);
    let mtls = trust(&pki.ca(), Some(&pki.client()));
    let server = serve_https(&strs(&args), &[], &mtls);
    let (code, answer) = https_check(&server, &mtls, "dave");
    assert!(code == 0 && answer.contains("\"allowed\":true"), "{code} {answer}");
    // The attacks: no certificate, a certificate of another CA. Refused at the handshake: no
    // answer, so no decision either.
    for (who, client) in [("none", trust(&pki.ca(), None)), ("another CA", trust(&pki.ca(), Some(&other.client())))] {
        let (code, answer) = https_check(&server, &client, "dave");
        assert!(code != 0 && !answer.contains("allowed"), "{who}: {code} {answer}");
    }
    // The safe outcome: the key's count holds the admitted checks only.
    let (_, answer) = https_check(&server, &mtls, "dave");
    assert!(answer.contains("\"remaining\":98"), "{answer}");
}

#[test]
fn a_client_san_refuses_certificates_of_the_ca_issued_for_another_name() {
    let pki = TestPki::new("san");
    let envoy = pki.issue_for("envoy", &["envoy.mesh.internal"], Flaw::None);
    let mut args = cert_flags(&pki.server());
    args.extend(["--tls-client-ca".into(), path(&pki.ca()).into()]);
    args.extend(["--tls-client-san".into(), "envoy.mesh.internal".into()]);
    let named = trust(&pki.ca(), Some(&envoy));
    let server = serve_https(&strs(&args), &[], &named);
    let (code, answer) = https_check(&server, &named, "erin");
    assert!(code == 0 && answer.contains("\"allowed\":true"), "{code} {answer}");
    // The attack: a certificate of the same CA, for another name (localhost). Refused at the
    // handshake, so no decision and no count.
    let (code, answer) = https_check(&server, &trust(&pki.ca(), Some(&pki.client())), "erin");
    assert!(code != 0 && !answer.contains("allowed"), "{code} {answer}");
    let (_, answer) = https_check(&server, &named, "erin");
    assert!(answer.contains("\"remaining\":98"), "{answer}");
    // The same through the variable and through `[server] tls_client_san`.
    let by_variable =
        serve_https(&strs(&args[..args.len() - 2]), &[("SLIDEGATE_TLS_CLIENT_SAN", "envoy.mesh.internal")], &named);
    let rules = pki.dir().join("rules.toml");
    let fields = "[server]\ntls_cert = \"server.pem\"\ntls_key = \"server.key\"\ntls_client_ca = \"ca.pem\"\n\
                  tls_client_san = \"envoy.mesh.internal\"\n";
    std::fs::write(&rules, fields).expect("write rules");
    let by_fields = serve_https(&["--config", path(&rules)], &[], &named);
    for server in [&by_variable, &by_fields] {
        assert_eq!(https_check(server, &named, "fay").0, 0);
        assert_ne!(https_check(server, &trust(&pki.ca(), Some(&pki.client())), "fay").0, 0, "another name was served");
    }
}

/// A gRPC server over TLS with `pki`'s certificate (and its client CA when `mutual`), serving
/// `USER_EDGE`; its gRPC address and config directory.
fn serve_grpc(pki: &TestPki, mutual: bool, extra: &[&str]) -> (Slidegate, String, Dir) {
    let dir = Dir::with(&[("edge.yaml", USER_EDGE)]);
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let mut args = cert_flags(&pki.server());
    args.extend(["--grpc".into(), grpc.clone(), "--envoy-config".into(), dir.arg().into()]);
    let client = if mutual {
        args.extend(["--tls-client-ca".into(), path(&pki.ca()).into()]);
        trust(&pki.ca(), Some(&pki.client()))
    } else {
        trust(&pki.ca(), None)
    };
    args.extend(extra.iter().map(|&a| a.to_owned()));
    (serve_https(&strs(&args), &[], &client), grpc, dir)
}

/// One `ShouldRateLimit` of `user` in `USER_EDGE`'s domain over TLS ([`grpc_call`]).
async fn call(grpc: &str, ca: &Path, identity: Option<&CertFiles>, user: &str) -> Result<i32, String> {
    grpc_call(grpc, ca, identity, request("edge", &[&[("user", user)]], 1)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_served_over_tls_and_mutual_tls_refuses_clients_without_a_certificate_of_its_ca() {
    let (pki, other) = (TestPki::new("grpc"), TestPki::new("grpc-other"));
    let (_tls, grpc, _dir) = serve_grpc(&pki, false, &[]);
    assert_eq!(call(&grpc, &pki.ca(), None, "ada").await, Ok(OK));
    // Not over plaintext: the bytes of a plaintext preface are no TLS handshake.
    let plain = async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await?;
        client.should_rate_limit(request("edge", &[&[("user", "ada")]], 1)).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let plain = tokio::time::timeout(Duration::from_secs(10), plain).await.expect("an end within 10 s");
    assert!(plain.is_err(), "a plaintext gRPC call was answered");

    let (_mtls, grpc, _dir) = serve_grpc(&pki, true, &[]);
    assert_eq!(call(&grpc, &pki.ca(), Some(&pki.client()), "ada").await, Ok(OK));
    // USER_EDGE allows 2 a minute: the refused calls below must not count, so a second call
    // of the same user after them is still admitted.
    for (who, identity) in [("none", None), ("another CA", Some(other.client()))] {
        let answer = call(&grpc, &pki.ca(), identity.as_ref(), "ada").await;
        assert!(answer.is_err(), "{who}: {answer:?}");
    }
    assert_eq!(call(&grpc, &pki.ca(), Some(&pki.client()), "ada").await, Ok(OK));

    // With a client SAN, a certificate of the CA for another name is refused too.
    let envoy = pki.issue_for("envoy", &["envoy.mesh.internal"], Flaw::None);
    let (dir, grpc) = (Dir::with(&[("edge.yaml", USER_EDGE)]), format!("127.0.0.1:{}", slidegate_testkit::free_port()));
    let mut args = cert_flags(&pki.server());
    args.extend(["--grpc".into(), grpc.clone(), "--envoy-config".into(), dir.arg().into()]);
    args.extend(["--tls-client-ca".into(), path(&pki.ca()).into()]);
    args.extend(["--tls-client-san".into(), "envoy.mesh.internal".into()]);
    let _named = serve_https(&strs(&args), &[], &trust(&pki.ca(), Some(&envoy)));
    assert_eq!(call(&grpc, &pki.ca(), Some(&envoy), "bo").await, Ok(OK));
    let answer = call(&grpc, &pki.ca(), Some(&pki.client()), "bo").await;
    assert!(answer.is_err(), "a certificate for localhost: {answer:?}");
}

/// The attack on `addr` (limits: 2 connections, 1 s header deadline): both slots taken by
/// connections that start a TLS handshake and stall. A third is closed at once; the stalled
/// ones are closed at the deadline (with a margin for a loaded machine).
fn stall_handshakes(addr: &str) {
    let opened = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            // The first bytes of a TLS record holding a ClientHello, and no more.
            s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).expect("send");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(addr).expect("the kernel accepts the connection");
    assert!(closed_before(&mut third, Instant::now() + Duration::from_millis(900)), "{addr}: the third was kept");
    for s in &mut stalled {
        assert!(closed_before(s, opened + Duration::from_secs(6)), "{addr}: a stalled handshake outlived its deadline");
    }
}

/// The value of the first sample of `/metrics` (over `client`) whose line has every one of
/// `parts`, or 0.
fn metric(server: &Slidegate, client: &[String], parts: &[&str]) -> f64 {
    let (_, text, _) = curl_with(client, &[], &server.url("/metrics"));
    text.lines()
        .find(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_never_finished_hold_their_slots_until_the_header_deadline_only() {
    let pki = TestPki::new("stall");
    let (server, grpc, _dir) = serve_grpc(&pki, false, &["--header-read-timeout", "1s", "--max-connections", "2"]);
    let client = trust(&pki.ca(), None);
    // The readiness check's connection is closed; let the server see it go first.
    std::thread::sleep(Duration::from_millis(500));
    let http = server.base.trim_start_matches("https://").to_owned();
    stall_handshakes(&http);
    stall_handshakes(&grpc);
    // The safe outcome: the slots are back, both listeners serve, the refusals are counted.
    assert_eq!(https_check(&server, &client, "erin").0, 0);
    assert_eq!(call(&grpc, &pki.ca(), None, "erin").await, Ok(OK));
    assert!(metric(&server, &client, &["slidegate_http_connections_refused_total "]) >= 1.0);
    assert!(metric(&server, &client, &["slidegate_grpc_connections_refused_total "]) >= 1.0);
}

/// The subject of the certificate `addr` serves a new connection (curl, trusting `ca`).
fn served_subject(addr: &str, ca: &Path) -> String {
    let (_, _, err) = curl_with(&trust(ca, None), &["--verbose", "--output", "/dev/null"], &format!("https://{addr}/"));
    err.lines().find_map(|l| l.split_once("subject: ").map(|(_, s)| s.trim().to_owned())).unwrap_or(err)
}

/// Puts `from` in place of `to` at once (write beside, then rename), as a certificate manager
/// does.
fn install(from: &Path, to: &Path) {
    let beside = to.with_extension("new");
    std::fs::copy(from, &beside).expect("copy");
    std::fs::rename(&beside, to).expect("rename");
}

/// Waits (up to 5 s) until `done` holds.
fn within_5s(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_is_served_to_new_connections_and_a_bad_one_keeps_the_old() {
    let pki = TestPki::new("rotate");
    let live = CertFiles { cert: pki.dir().join("live.pem"), key: pki.dir().join("live.key") };
    install(&pki.server().cert, &live.cert);
    install(&pki.server().key, &live.key);
    let dir = Dir::with(&[("edge.yaml", USER_EDGE)]);
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let mut args = cert_flags(&live);
    args.extend(["--grpc".into(), grpc.clone(), "--envoy-config".into(), dir.arg().into()]);
    let client = trust(&pki.ca(), None);
    let server = serve_https(&strs(&args), &[], &client);
    let http = server.base.trim_start_matches("https://").to_owned();
    assert_eq!(served_subject(&http, &pki.ca()), "CN=slidegate test server");

    // Replaced while serving: both listeners serve the new one, with no restart nor signal.
    let next = pki.issue("next", slidegate_testkit::Flaw::None);
    install(&next.cert, &live.cert);
    install(&next.key, &live.key);
    for addr in [&http, &grpc] {
        within_5s(&format!("{addr} still serves the old certificate"), || {
            served_subject(addr, &pki.ca()) == "CN=slidegate test next"
        });
    }
    assert_eq!(call(&grpc, &pki.ca(), None, "fay").await, Ok(OK));

    // SIGHUP reloads at once, the files unchanged.
    let reloaded =
        |result: &str| metric(&server, &client, &["slidegate_config_reloads_total{", "file=\"tls\"", result]);
    let before = reloaded("result=\"ok\"");
    server.signal("HUP");
    within_5s("SIGHUP did not reload", || reloaded("result=\"ok\"") > before);

    // A bad replacement (no certificate in the file): logged, counted, the one in force kept.
    std::fs::write(pki.dir().join("junk.pem"), "not a certificate\n").expect("write");
    install(&pki.dir().join("junk.pem"), &live.cert);
    within_5s("the bad replacement was not counted", || reloaded("result=\"failed\"") >= 1.0);
    assert!(server.log_text().contains("not reloaded, the previous one is still served"), "{}", server.log_text());
    assert!(server.log_text().contains(path(&live.cert)), "the log names the file: {}", server.log_text());
    for addr in [&http, &grpc] {
        assert_eq!(served_subject(addr, &pki.ca()), "CN=slidegate test next", "{addr}");
    }
    assert_eq!(https_check(&server, &client, "fay").0, 0);
    assert_eq!(call(&grpc, &pki.ca(), None, "fay").await, Ok(OK));
}

/// `slidegate serve <args>`: its exit code and standard error.
fn start_fails(args: &[&str]) -> (Option<i32>, String) {
    let http = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let mut all = vec!["serve", "--http", &http];
    all.extend_from_slice(args);
    let out = run(&all);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn each_listener_tls_problem_fails_the_start_naming_the_file_and_the_reason() {
    let pki = TestPki::new("tls-problems");
    let (server, client, ca) = (pki.server(), pki.client(), pki.ca());
    let (cert, key, ca) = (path(&server.cert), path(&server.key), path(&ca));
    let missing = pki.dir().join("nowhere.pem");
    let fifo = pki.dir().join("fifo.pem");
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    let cases: [(&[&str], &str, &str); 8] = [
        (&["--tls-cert", path(&missing), "--tls-key", key], path(&missing), "cannot read it"),
        (&["--tls-cert", cert, "--tls-key", path(&client.key)], path(&client.key), "not the key of"),
        (&["--tls-cert", key, "--tls-key", key], key, "no PEM certificate"),
        (&["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", path(&fifo)], path(&fifo), "not a regular file"),
        (&["--tls-cert", cert], "--tls-cert (server)", "tls_cert needs tls_key"),
        (&["--tls-client-ca", ca], "--tls-client-ca (server)", "tls_client_ca needs tls_cert and tls_key"),
        (
            &["--tls-cert", cert, "--tls-key", key, "--tls-client-san", "envoy"],
            "--tls-cert, --tls-key, --tls-client-san (server)",
            "tls_client_san needs tls_client_ca",
        ),
        (
            &["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca, "--tls-client-san", "not a name!"],
            "--tls-client-san",
            "neither a DNS name nor an IP address",
        ),
    ];
    for (args, names, reason) in cases {
        let (code, stderr) = start_fails(args);
        assert!(code == Some(2) && stderr.contains(names) && stderr.contains(reason), "{args:?}: {code:?} {stderr}");
    }
    let rules = pki.dir().join("rules.toml");
    std::fs::write(&rules, "[server]\ntls_cert = \"server.pem\"\n").expect("write rules");
    let (code, stderr) = start_fails(&["--config", path(&rules)]);
    assert!(code == Some(2) && stderr.contains("rules.toml:2:12: server: tls_cert needs tls_key"), "{stderr}");
}
