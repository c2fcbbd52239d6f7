//! Redis over TLS against redis-server's own TLS (`--tls-port`), with certificates made in the
//! test: decisions over `rediss://` on the pipelined connection, with and without
//! `tls-auth-clients`; a wrong CA, an expired certificate, another host's certificate and a
//! missing client certificate each refused with its own reason; a certificate file that is
//! missing, not a file, too large or not PEM refused before connecting, naming the file.

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::ConnectionLike;
use slidegate::{Error, Limiter, PipelinedConnection, Quota, RedisBackend, RedisTls, TlsFiles};
use slidegate_testkit::{Flaw, RedisServer, Stall, TestPki};

fn files(ca: Option<PathBuf>) -> TlsFiles {
    let mut f = TlsFiles::default();
    f.ca = ca;
    f
}

fn with_client(pki: &TestPki) -> TlsFiles {
    let mut f = files(Some(pki.ca()));
    (f.cert, f.key) = (Some(pki.client().cert), Some(pki.client().key));
    f
}

fn load(f: &TlsFiles) -> RedisTls {
    RedisTls::load(f).expect("load the TLS files")
}

/// Three checks of a limit of two: admitted, admitted, denied.
async fn decides(backend: RedisBackend) {
    let limiter = Limiter::new(backend);
    let quota = Quota::per_minute(2).expect("quota");
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(limiter.check("tls:user", &quota).await.expect("check").allowed);
    }
    assert_eq!(seen, [true, true, false]);
}

/// Why connecting to `url` with `tls` fails.
async fn refusal(url: &str, tls: &RedisTls) -> String {
    match RedisBackend::connect_tls(url, tls).await {
        Ok(_) => panic!("{url}: connected, expected a refusal"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn decisions_over_tls_trusting_the_given_ca() {
    let pki = TestPki::new("ca");
    let server = RedisServer::start_tls(&pki, false, &[]);
    let backend = RedisBackend::connect_tls(&server.tls_url(), &load(&files(Some(pki.ca())))).await.expect("connect");
    decides(backend).await;
    // The keys are in that server: the decisions went over its TLS port.
    let n: i64 = server.query(&["ZCARD", "slidegate:tls:user"]);
    assert_eq!(n, 2);
}

#[tokio::test]
async fn sixty_four_callers_share_one_tls_connection_each_getting_its_own_reply() {
    let pki = TestPki::new("batch");
    let server = RedisServer::start_tls(&pki, false, &[]);
    let conn =
        PipelinedConnection::connect_tls(&server.tls_url(), &load(&files(Some(pki.ca())))).await.expect("connect");
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let mut conn = conn.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    let what = format!("{t}:{i}:{}", "x".repeat(i * 40));
                    let echoed: String = redis::cmd("ECHO").arg(&what).query_async(&mut conn).await.expect("ECHO");
                    assert_eq!(echoed, what);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(conn.get_db(), 0);
}

/// Over TLS at most two writes are in flight (Redis reads one record per pass, so what comes
/// meanwhile waits to go out as one): what comes while both wait for a stalled Redis stays in
/// this process and is dropped, never sent, once its callers give up. Redis runs only those two.
#[tokio::test]
async fn over_tls_a_stalled_redis_is_sent_two_writes_and_what_callers_gave_up_meanwhile_never_runs() {
    let pki = TestPki::new("paced");
    let server = RedisServer::start_tls(&pki, false, &[]);
    let conn =
        PipelinedConnection::connect_tls(&server.tls_url(), &load(&files(Some(pki.ca())))).await.expect("connect");
    server.pause(Stall::Process);
    for i in 0..6 {
        let (mut conn, mut set) = (conn.clone(), redis::cmd("SET"));
        let set = set.arg(format!("paced:{i}")).arg(1).query_async::<()>(&mut conn);
        assert!(tokio::time::timeout(Duration::from_millis(50), set).await.is_err(), "Redis is stopped");
    }
    server.resume(Stall::Process);
    let _: () = redis::cmd("SET").arg("paced:after").arg(1).query_async(&mut conn.clone()).await.expect("answered");
    let ran: Vec<usize> = (0..6).filter(|i| server.query::<i64>(&["EXISTS", &format!("paced:{i}")]) == 1).collect();
    assert_eq!(ran, [0, 1], "the two written; the rest held and dropped");
}

#[tokio::test]
async fn a_client_certificate_is_presented_where_redis_requires_one_and_its_absence_refused() {
    let pki = TestPki::new("mtls");
    let server = RedisServer::start_tls(&pki, true, &[]);
    let backend = RedisBackend::connect_tls(&server.tls_url(), &load(&with_client(&pki))).await.expect("connect");
    decides(backend).await;
    let without = refusal(&server.tls_url(), &load(&files(Some(pki.ca())))).await;
    assert!(without.contains("CertificateRequired"), "{without}");
}

#[tokio::test]
async fn a_server_certificate_of_another_ca_is_refused() {
    let (pki, other) = (TestPki::new("right"), TestPki::new("wrong"));
    let server = RedisServer::start_tls(&pki, false, &[]);
    let message = refusal(&server.tls_url(), &load(&files(Some(other.ca())))).await;
    assert!(message.contains("TLS handshake with 127.0.0.1") && message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let pki = TestPki::new("expired");
    pki.issue("server", Flaw::Expired);
    let server = RedisServer::start_tls(&pki, false, &[]);
    let message = refusal(&server.tls_url(), &load(&files(Some(pki.ca())))).await;
    assert!(message.contains("expired"), "{message}");
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused_unless_hostname_verification_is_skipped() {
    let pki = TestPki::new("host");
    pki.issue("server", Flaw::OtherHost);
    let server = RedisServer::start_tls(&pki, false, &[]);
    let message = refusal(&server.tls_url(), &load(&files(Some(pki.ca())))).await;
    assert!(message.contains("not valid for name"), "{message}");
    let mut skip = files(Some(pki.ca()));
    skip.skip_hostname_verification = true;
    let backend = RedisBackend::connect_tls(&server.tls_url(), &load(&skip)).await.expect("hostname not checked");
    decides(backend).await;
    // Skipping the name checks nothing less: another CA's certificate is still refused.
    let other = TestPki::new("host-other");
    skip.ca = Some(other.ca());
    let message = refusal(&server.tls_url(), &load(&skip)).await;
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn insecure_urls_are_refused() {
    let pki = TestPki::new("insecure");
    let server = RedisServer::start_tls(&pki, false, &[]);
    let message = refusal(&format!("{}/#insecure", server.tls_url()), &load(&files(Some(pki.ca())))).await;
    assert!(message.contains("#insecure"), "{message}");
}

/// The message of loading `f`.
fn load_error(f: &TlsFiles) -> String {
    match RedisTls::load(f) {
        Ok(_) => panic!("{f:?} loaded"),
        Err(e @ Error::Tls { .. }) => e.to_string(),
        Err(e) => panic!("{f:?}: not a TLS error: {e}"),
    }
}

#[test]
fn each_file_problem_is_refused_naming_the_file_and_the_reason() {
    let pki = TestPki::new("files");
    let dir = pki.dir().to_path_buf();
    let missing = dir.join("missing.pem");
    let message = load_error(&files(Some(missing.clone())));
    assert!(message.contains(&missing.display().to_string()) && message.contains("cannot read it"), "{message}");
    let message = load_error(&files(Some(dir.clone())));
    assert!(message.contains("not a regular file"), "{message}");
    let big = dir.join("big.pem");
    std::fs::write(&big, vec![b'a'; slidegate::redis::MAX_PEM_BYTES as usize + 1]).expect("write");
    let message = load_error(&files(Some(big)));
    assert!(message.contains("more than the 1048576 a PEM file may have"), "{message}");
    let text = dir.join("text.pem");
    std::fs::write(&text, "not a certificate\n").expect("write");
    let message = load_error(&files(Some(text.clone())));
    assert!(message.contains(&text.display().to_string()) && message.contains("no PEM certificate"), "{message}");
    let mut key_is_a_cert = with_client(&pki);
    key_is_a_cert.key = Some(pki.ca());
    let message = load_error(&key_is_a_cert);
    assert!(message.contains("ca.pem") && message.contains("no PEM private key"), "{message}");
    let mut no_key = with_client(&pki);
    no_key.key = None;
    assert!(load_error(&no_key).contains("needs its private key"));
    let mut wrong_key = with_client(&pki);
    wrong_key.key = Some(pki.server().key);
    let message = load_error(&wrong_key);
    assert!(message.contains("server.key") && message.contains("not the key of"), "{message}");
}
