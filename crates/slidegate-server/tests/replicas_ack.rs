//! `[backend] replicas_ack`, `--redis-replicas-ack` and `SLIDEGATE_REDIS_REPLICAS_ACK` through
//! the real binary on a real master and replica: with any of the three, admissions are decided
//! by Redis while the replica acknowledges them, and answered by the failure policy once it is
//! killed; without, killing the replica changes nothing. Admissions whose connection is lost
//! while their `WAIT`s are blocked, and a `WAIT` a demoted master ends, are answered by the
//! policy: never as acknowledged, never a 500.

mod support;

use serde_json::json;
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate, check};

/// `(degraded, allowed)` of one check of a fresh `key`, limit 3 a minute.
async fn admit(server: &Slidegate, key: &str) -> (serde_json::Value, serde_json::Value) {
    let (status, _, v) =
        check(&reqwest::Client::new(), server, &json!({"key": key, "limit": 3, "window": "60s"})).await;
    assert_eq!(status, 200, "{v}");
    (v["degraded"].clone(), v["allowed"].clone())
}

/// A way to ask for it: name, `[backend]` line, flags, environment; and whether it is asked.
type Case = (&'static str, &'static str, &'static [&'static str], &'static [(&'static str, &'static str)], bool);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_ack_from_the_file_a_flag_or_the_environment_makes_a_lost_replica_a_failure() {
    let cases: [Case; 4] = [
        ("file", "replicas_ack = 1\n", &[], &[], true),
        ("flag", "", &["--redis-replicas-ack", "1"], &[], true),
        ("environment", "", &[], &[("SLIDEGATE_REDIS_REPLICAS_ACK", "1")], true),
        ("none", "", &[], &[], false),
    ];
    for (name, line, flags, env, waits) in cases {
        // Redis times a blocked WAIT out on its event loop's next pass: at 100 Hz within 10 ms.
        let master = RedisServer::start_with(&["--hz", "100"]);
        let mut replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        master.wait_for_replicas(1);
        let rules = RulesFile::new(&format!(
            "[backend]\nredis = \"{}\"\ntimeout = \"250ms\"\nfailure_policy = \"fail_closed\"\n{line}",
            master.url()
        ));
        let mut args = vec!["--config", rules.arg()];
        args.extend_from_slice(flags);
        let server = Slidegate::serve_with_env(&args, env);
        // The replica alive: decided by Redis.
        assert_eq!(
            admit(&server, "a").await,
            (json!(false), json!(true)),
            "{name}: decided by Redis: {}",
            server.log_text()
        );
        replica.kill();
        let expected = if waits { (json!(true), json!(false)) } else { (json!(false), json!(true)) };
        assert_eq!(admit(&server, "b").await, expected, "{name}: with the replica gone");
    }
}

/// A master with one replica, paused so that it acknowledges nothing, and an instance waiting
/// for it within a 2 s deadline, failing closed.
fn paused_replica() -> (RedisServer, RedisServer, Slidegate, RulesFile) {
    let master = RedisServer::start_with(&["--hz", "100"]);
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    master.wait_for_replicas(1);
    let rules = RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\ntimeout = \"2s\"\nfailure_policy = \"fail_closed\"\nreplicas_ack = 1\nnear_cache = 0\n",
        master.url()
    ));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    replica.pause();
    (master, replica, server, rules)
}

/// Admissions whose `WAIT`s are blocked lose their connection: a `WAIT` on the new, empty one
/// would be answered at once with every replica. None is answered as acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_whose_connection_is_lost_before_their_wait_are_never_answered_as_acknowledged() {
    let (master, replica, server, _rules) = paused_replica();
    let server = std::sync::Arc::new(server);
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let server = server.clone();
            tokio::spawn(async move { admit(&server, &format!("lost-{i}")).await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let killed: u64 = master.query(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed >= 1, "the instance's connection");
    for call in calls {
        let answer = call.await.expect("task");
        assert_eq!(answer, (json!(true), json!(false)), "the policy's answer, never Redis' admission");
    }
    replica.resume();
}

/// A master demoted to replica ends its blocked `WAIT`s with an error: the policy answers, no 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_redis_ends_as_its_master_is_demoted_is_answered_by_the_policy() {
    let (master, replica, server, _rules) = paused_replica();
    let elsewhere = RedisServer::start();
    let server = std::sync::Arc::new(server);
    let call = tokio::spawn({
        let server = server.clone();
        async move { admit(&server, "demoted").await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let _: () = master.query(&["REPLICAOF", "127.0.0.1", &elsewhere.port().to_string()]);
    assert_eq!(call.await.expect("task"), (json!(true), json!(false)), "the policy's answer: {}", server.log_text());
    replica.resume();
}
