//! `[backend] replicas_ack`, `--redis-replicas-ack` and `SLIDEGATE_REDIS_REPLICAS_ACK` through
//! the real binary on a real master and replica: with any of the three, admissions are decided
//! by Redis while the replica acknowledges them, and answered by the failure policy once it is
//! killed; without, killing the replica changes nothing. Admissions whose connection is lost
//! while their `WAIT`s are blocked, and a `WAIT` a demoted master ends, are answered by the
//! policy: never as acknowledged, never a 500.

mod support;

use serde_json::json;
use slidegate_testkit::{RedisServer, Stall};
use support::{RulesFile, Slidegate, check, key_state};

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
    replica.pause(Stall::Process);
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
    replica.resume(Stall::Process);
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
    replica.resume(Stall::Process);
}

/// A write-back's write whose `WAIT` no replica answers (there is none, and at Redis' default
/// `hz 10` a `WAIT`'s timeout ends up to 100 ms late, past a 50 ms deadline) ran on the master:
/// it is written once, not again at every probe.
#[tokio::test]
async fn a_write_back_no_replica_acknowledges_is_written_once_on_each_engine() {
    for engine in ["lua", "module"] {
        let module = engine == "module";
        let mut redis = if module { RedisServer::start_with_module(&[]) } else { RedisServer::start() };
        let rules = RulesFile::new(&format!(
            "admin_token = \"t\"\n[backend]\nredis = \"{}\"\nengine = \"{engine}\"\nfailure_policy = \"local\"\n\
             local_share = 0.5\ntimeout = \"50ms\"\nnear_cache = 0\nreplicas_ack = 1\n\n\
             [[rules]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\n",
            redis.url()
        ));
        let server = Slidegate::serve(&["--config", rules.arg()]);
        let client = reqwest::Client::new();
        redis.kill();
        let (_, _, v) = check(&client, &server, &json!({"rule": "api", "key": "one"})).await;
        assert_eq!((&v["allowed"], &v["policy"]), (&json!(true), &json!("local")), "{engine}: {v}");
        let port = redis.port();
        let _redis = if module { RedisServer::start_with_module_on(port) } else { RedisServer::start_on(port) };
        // Probes every half second meanwhile: each would have written the entry again.
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        let state = key_state(&client, &server, "api/one", "t").await;
        assert_eq!(state["count"], 1, "{engine}: the local admission, once: {state}");
    }
}
