//! Whom an error is on, against real redis-server processes: each condition a server can be in
//! is produced for real, and the error it gives is classed as `Error::class` says. Only backend
//! failures reach the failure policy and the circuit breaker: a script error under fail-open is
//! an error, not an admission, however often it repeats.

use std::time::{Duration, Instant};

use slidegate::resilience::DEFAULT_BREAKER_FAILURES;
use slidegate::{
    Check, Error, ErrorClass, FailurePolicy, Limiter, PipelinedConnection, Quota, RedisBackend, RedisEngine, hash_tag,
};
use slidegate_testkit::{RedisCluster, RedisServer};

/// A backend on the Lua scripts (no module probe first), patient enough for a busy box.
async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(url)
        .await
        .expect("connect")
        .with_engine(RedisEngine::Lua)
        .with_timeout(Duration::from_secs(2))
}

fn quota() -> Quota {
    Quota::per_minute(10).expect("valid")
}

/// The Redis error code of `e`, or a description of what else it is.
fn code(e: &Error) -> String {
    match e {
        Error::Redis(r) => r.code().unwrap_or("io").to_owned(),
        other => format!("{other:?}"),
    }
}

/// Checks until the error with `expected` code shows (a server's state takes a moment to
/// change), within five seconds; returns it.
async fn error_with_code(backend: &RedisBackend, key: &str, expected: &str) -> Error {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match backend_check(backend, key).await {
            Err(e) if code(&e) == expected => return e,
            other => assert!(Instant::now() < until, "no {expected} within 5 s, last: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn backend_check(backend: &RedisBackend, key: &str) -> Result<slidegate::Decision, Error> {
    Limiter::new(backend.clone()).check(key, &quota()).await
}

fn assert_failure(e: &Error) {
    assert_eq!(e.class(), ErrorClass::BackendFailure, "{e}");
    assert!(e.is_backend_failure() && !e.is_caller_error(), "{e}");
}

fn assert_backend_error(e: &Error) {
    assert_eq!(e.class(), ErrorClass::BackendError, "{e}");
    assert!(!e.is_backend_failure() && !e.is_caller_error(), "{e}");
}

#[tokio::test]
async fn busy_while_another_client_runs_a_long_script_is_a_failure() {
    let server = RedisServer::start();
    server.query::<String>(&["CONFIG", "SET", "busy-reply-threshold", "100"]);
    let b = backend(&server.url()).await;
    let mut looping = server.conn();
    let script =
        std::thread::spawn(move || redis::cmd("EVAL").arg("while true do end").arg(0).query::<()>(&mut looping));
    let e = error_with_code(&b, "k", "BUSY").await;
    assert_failure(&e);
    server.query::<String>(&["SCRIPT", "KILL"]);
    assert!(script.join().expect("thread").is_err(), "the script was killed");
    assert!(backend_check(&b, "after").await.expect("served again").allowed);
}

#[tokio::test]
async fn loading_while_redis_reloads_its_dataset_is_a_failure() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let b = backend(&server.url()).await;
    // 2,000 keys loaded at 1 ms each, answering clients every KB: two seconds of LOADING.
    server.query::<String>(&["DEBUG", "POPULATE", "2000"]);
    server.query::<String>(&["CONFIG", "SET", "key-load-delay", "1000"]);
    server.query::<String>(&["CONFIG", "SET", "loading-process-events-interval-bytes", "1024"]);
    let mut reloading = server.conn();
    let reload = std::thread::spawn(move || redis::cmd("DEBUG").arg("RELOAD").query::<()>(&mut reloading));
    let e = error_with_code(&b, "k", "LOADING").await;
    assert_failure(&e);
    reload.join().expect("thread").expect("DEBUG RELOAD");
    assert!(backend_check(&b, "after").await.expect("served again").allowed);
}

#[tokio::test]
async fn readonly_from_a_replica_is_a_failure() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    let b = backend(&replica.url()).await;
    assert_failure(&error_with_code(&b, "k", "READONLY").await);
}

#[tokio::test]
async fn masterdown_from_a_replica_cut_off_from_its_master_is_a_failure() {
    let mut master = RedisServer::start();
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &master.port().to_string(),
        "--replica-serve-stale-data",
        "no",
    ]);
    let b = backend(&replica.url()).await;
    master.kill();
    assert_failure(&error_with_code(&b, "k", "MASTERDOWN").await);
}

#[tokio::test]
async fn a_server_refusing_writes_is_a_failure() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    // maxmemory reached under noeviction: OOM.
    server.query::<String>(&["CONFIG", "SET", "maxmemory", "1"]);
    assert_failure(&error_with_code(&b, "k", "OOM").await);
    server.query::<String>(&["CONFIG", "SET", "maxmemory", "0"]);
    // Fewer replicas than min-replicas-to-write: NOREPLICAS.
    server.query::<String>(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    assert_failure(&error_with_code(&b, "k", "NOREPLICAS").await);
}

#[tokio::test]
async fn a_stopped_server_is_a_failure() {
    let mut server = RedisServer::start();
    let b = backend(&server.url()).await;
    server.kill();
    let e = error_with_code(&b, "k", "io").await;
    assert_failure(&e);
}

#[tokio::test]
async fn credentials_refused_after_a_password_change_are_a_failure() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    assert!(backend_check(&b, "k").await.expect("decided").allowed);
    // The operator sets a password the backend was not given, and drops every connection.
    let mut admin = server.conn();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("requirepass").arg("s3cret").query(&mut admin).expect("CONFIG");
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .expect("KILL");
    assert_failure(&error_with_code(&b, "k", "NOAUTH").await);
}

#[tokio::test]
async fn a_forced_module_that_is_not_loaded_is_a_failure() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await.with_engine(RedisEngine::Module);
    let e = backend_check(&b, "k").await.expect_err("no module");
    assert!(matches!(e, Error::ModuleNotLoaded), "{e}");
    assert_failure(&e);
}

#[tokio::test]
async fn clusterdown_from_a_node_serving_no_slot_is_a_failure() {
    let bus = slidegate_testkit::free_port().to_string();
    let node = RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-port", &bus]);
    let b = backend(&node.url()).await;
    assert_failure(&error_with_code(&b, "k", "CLUSTERDOWN").await);
}

#[tokio::test]
async fn tryagain_during_a_slot_migration_is_a_failure() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (hash_tag("t", "a"), hash_tag("t", "b"));
    let slot = slidegate::key_slot(format!("slidegate:{a}"));
    let master = cluster.master_of(slot);
    let other = cluster.nodes().iter().find(|n| n.port() != master.port()).expect("another master");
    let other_id: String = other.query(&["CLUSTER", "MYID"]);
    // Straight to the master (the standalone backend follows no redirection).
    let direct = backend(&master.url()).await;
    assert!(backend_check(&direct, &a).await.expect("decided").allowed, "one key of the slot exists");
    master.query::<String>(&["CLUSTER", "SETSLOT", &slot.to_string(), "MIGRATING", &other_id]);
    // A script on two keys of a migrating slot, one here and one not: TRYAGAIN.
    let checks = [Check::new(&a, quota()), Check::new(&b, quota())];
    let e = Limiter::new(direct).check_all(&checks).await.expect_err("the slot is migrating");
    assert_eq!(code(&e), "TRYAGAIN", "{e}");
    assert_failure(&e);
}

#[tokio::test]
async fn script_errors_wrong_types_unknown_commands_and_acl_refusals_are_errors_not_failures() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    // Another program's string where the limiter keeps its sorted set.
    server.query::<String>(&["SET", "slidegate:victim", "not a sorted set"]);
    let e = backend_check(&b, "victim").await.expect_err("WRONGTYPE");
    assert_eq!(code(&e), "WRONGTYPE", "{e}");
    assert_backend_error(&e);
    // A Lua error raised inside a script, and a command the server does not know.
    let mut conn = PipelinedConnection::connect(&server.url()).await.expect("connect");
    let unpack = redis::cmd("EVAL").arg("return unpack({}, 1, 10000000)").arg(0).to_owned();
    let unknown = redis::cmd("NO.SUCH.COMMAND");
    for cmd in [unpack, unknown] {
        let e = Error::from(cmd.query_async::<redis::Value>(&mut conn).await.expect_err("refused"));
        assert_backend_error(&e);
    }
    // An ACL that lets the limiter's user at some keys only: a caller choosing another key.
    server.query::<String>(&["ACL", "SETUSER", "limiter", "on", ">pw", "~slidegate:user:*", "+@all"]);
    let port = server.port();
    let scoped = backend(&format!("redis://limiter:pw@127.0.0.1:{port}")).await;
    assert!(backend_check(&scoped, "user:1").await.expect("its own keys").allowed);
    let e = backend_check(&scoped, "admin").await.expect_err("NOPERM");
    assert_eq!(code(&e), "NOPERM", "{e}");
    assert_backend_error(&e);
}

#[test]
fn replies_of_servers_that_cannot_serve_for_now_are_failures() {
    // Conditions a test cannot produce cheaply (a failed snapshot; one client too many while
    // reconnecting), classed from the reply Redis sends for them.
    for reply in [
        "-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.\r\n",
        "-ERR max number of clients reached\r\n",
    ] {
        let value = redis::parse_redis_value(reply.as_bytes()).expect("RESP");
        let e = Error::from(value.extract_error().expect_err("an error reply"));
        assert_failure(&e);
    }
    let e = Error::from(
        redis::parse_redis_value(b"-ERR wrong number of arguments\r\n")
            .expect("RESP")
            .extract_error()
            .expect_err("error"),
    );
    assert_backend_error(&e);
}

#[tokio::test]
async fn under_fail_open_a_script_error_or_a_caller_error_is_never_an_admission() {
    let mut server = RedisServer::start();
    let limiter = Limiter::new(backend(&server.url()).await).with_failure_policy(FailurePolicy::FailOpen);
    server.query::<String>(&["SET", "slidegate:victim", "not a sorted set"]);
    let repeats = 4 * DEFAULT_BREAKER_FAILURES;
    for _ in 0..repeats {
        let e = limiter.check("victim", &quota()).await.expect_err("an error, not fail-open's admission");
        assert_backend_error(&e);
        let e = limiter.check_cost("k", &quota(), 11).await.expect_err("a cost over the limit");
        assert!(e.is_caller_error(), "{e}");
        let e = limiter.check(&"k".repeat(slidegate::MAX_KEY_LEN + 1), &quota()).await.expect_err("too long");
        assert!(e.is_caller_error(), "{e}");
        let checks = [Check::new("victim", quota()), Check::new("k", quota())];
        assert_backend_error(&limiter.check_all(&checks).await.expect_err("a group with the victim"));
    }
    assert!(!limiter.circuit_open(), "{repeats} errors of each kind do not open the breaker");
    let d = limiter.check("k", &quota()).await.expect("decided by Redis");
    assert_eq!((d.allowed, d.degraded), (true, None));
    // A real fault: the policy answers, and the breaker opens.
    server.kill();
    for _ in 0..DEFAULT_BREAKER_FAILURES {
        let d = limiter.check("k", &quota()).await.expect("the policy answers");
        assert_eq!((d.allowed, d.degraded), (true, Some(FailurePolicy::FailOpen)));
    }
    assert!(limiter.circuit_open(), "consecutive failures open the breaker");
}

#[tokio::test]
async fn a_probe_answered_with_a_script_error_does_not_leave_the_circuit_open() {
    let mut server = RedisServer::start();
    let port = server.port();
    let open_for = Duration::from_millis(100);
    let limiter = Limiter::new(backend(&server.url()).await)
        .with_failure_policy(FailurePolicy::FailClosed)
        .with_circuit_breaker(1, open_for);
    // A real fault opens the circuit.
    server.kill();
    let d = limiter.check("k", &quota()).await.expect("the policy answers");
    assert_eq!(d.degraded, Some(FailurePolicy::FailClosed));
    assert!(limiter.circuit_open());
    let server = RedisServer::start_on(port);
    server.query::<String>(&["SET", "slidegate:victim", "not a sorted set"]);
    // The attack: the probe, when the circuit lets one through, provokes a script error.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(open_for).await;
        match limiter.check("victim", &quota()).await {
            Err(e) => break assert_backend_error(&e),
            Ok(d) => assert!(d.degraded.is_some() && Instant::now() < until, "no probe within 5 s: {d:?}"),
        }
    }
    // The next call probes again, finds Redis answering, and closes the circuit.
    let d = limiter.check("k", &quota()).await.expect("decided");
    assert_eq!((d.allowed, d.degraded), (true, None), "decided by Redis again");
    assert!(!limiter.circuit_open());
}
