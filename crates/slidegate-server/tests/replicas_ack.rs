//! `[backend] replicas_ack`, `--redis-replicas-ack` and `SLIDEGATE_REDIS_REPLICAS_ACK` through
//! the real binary on a real master and replica: with any of the three, admissions are decided
//! by Redis while the replica acknowledges them, and answered by the failure policy once it is
//! killed; without, killing the replica changes nothing.

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
