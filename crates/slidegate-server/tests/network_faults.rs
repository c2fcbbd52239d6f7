//! The real binary reaching a real redis-server through the testkit's fault proxy, over HTTP
//! and Envoy's gRPC, on the Lua engine and on the module: a partition is answered by the
//! failure policy within the deadline plus a margin, the circuit opens and closes, and once
//! healed every key is exact again and gets its own answers, never a held reply of another.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use slidegate_testkit::{Fault, FaultProxy, RedisServer};
use support::envoy::{Envoy, OK, OVER, codes};
use support::{RulesFile, check, metric};

/// What a request may take past the 50 ms deadline: HTTP on loopback and scheduling on a
/// shared 2-core machine, not the backend's. Shorter than the partition (600 ms), so a request
/// that waited for the network instead of its deadline fails the bound.
const SLACK: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_millis(50);

const EDGE: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
";

/// The near-cache off: it would answer the spent key's checks without Redis, and the test
/// needs them held by the partition.
fn rules(proxy: &FaultProxy, engine: &str) -> RulesFile {
    RulesFile::new(&format!(
        "[backend]\nredis = \"{}\"\ntimeout = \"50ms\"\nengine = \"{engine}\"\nfailure_policy = \"fail_closed\"\nnear_cache = 0\n\n\
         [[rules]]\nname = \"sms\"\nlimit = 3\nwindow = \"60s\"\n",
        proxy.url()
    ))
}

/// HTTP checks of `key`, then gRPC checks of `user`, four of each: `(allowed, remaining,
/// degraded)` and the descriptor codes.
async fn four_each(e: &mut Envoy, key: &str, user: &str) -> (Vec<(Value, Value, Value)>, Vec<i32>) {
    let client = reqwest::Client::new();
    let mut http = Vec::new();
    for _ in 0..4 {
        let (status, _, v) = check(&client, &e.server, &json!({"rule": "sms", "key": key})).await;
        assert_eq!(status, 200, "{v}");
        http.push((v["allowed"].clone(), v["remaining"].clone(), v["degraded"].clone()));
    }
    let mut grpc = Vec::new();
    for _ in 0..4 {
        grpc.push(codes(&e.ask("edge", &[&[("user", user)]], 0).await).0);
    }
    (http, grpc)
}

fn exact() -> (Vec<(Value, Value, Value)>, Vec<i32>) {
    let http = [(true, 2), (true, 1), (true, 0), (false, 0)].map(|(a, r)| (json!(a), json!(r), json!(false)));
    (http.into(), vec![OK, OK, OK, OVER])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_answered_in_time_by_the_policy_and_healed_keys_get_their_own_answers() {
    for (engine, redis) in [("lua", RedisServer::start()), ("module", RedisServer::start_with_module(&[]))] {
        let proxy = FaultProxy::to_port(redis.port());
        let rules = rules(&proxy, engine);
        let mut e = Envoy::start(&[("edge.yaml", EDGE)], &["--config", rules.arg()]).await;
        assert_eq!(four_each(&mut e, "a", "a").await, exact(), "{engine}: exact through the proxy");

        // The partition: checks of the spent key `a` are held, each a denial if it ever comes.
        let connections = proxy.accepted();
        proxy.set(Fault::Blackhole);
        let client = reqwest::Client::new();
        let started = Instant::now();
        let mut slowest = Duration::ZERO;
        for _ in 0..8 {
            let t = Instant::now();
            let (status, _, v) = check(&client, &e.server, &json!({"rule": "sms", "key": "a"})).await;
            slowest = slowest.max(t.elapsed());
            assert_eq!(
                (status, &v["allowed"], &v["degraded"], &v["policy"]),
                (200, &json!(false), &json!(true), &json!("fail_closed"))
            );
            let t = Instant::now();
            assert_eq!(codes(&e.ask("edge", &[&[("user", "a")]], 0).await).0, OVER, "{engine}: fail_closed over gRPC");
            slowest = slowest.max(t.elapsed());
        }
        let open = metric(&client, &e.server, "slidegate_circuit_open").await;
        eprintln!("network fault binary, {engine}: partition answered in {slowest:?} at most, circuit open {open}");
        assert!(slowest <= DEADLINE + SLACK, "{engine}: slowest {slowest:?}");
        assert_eq!(open, 1.0, "{engine}: the circuit opened");
        // Shorter than the connection's silence limit: the held replies come on the same one.
        tokio::time::sleep(Duration::from_millis(600).saturating_sub(started.elapsed())).await;
        proxy.set(Fault::Pass);

        // The breaker probes within its interval; then fresh keys are exact, with their own
        // answers: a held denial of `a` handed to them would show.
        let healed = Instant::now();
        while check(&client, &e.server, &json!({"rule": "sms", "key": "probe"})).await.2["degraded"] == json!(true) {
            assert!(healed.elapsed() < Duration::from_secs(2), "{engine}: still degraded after the heal");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(four_each(&mut e, "b", "b").await, exact(), "{engine}: exact once healed");
        assert_eq!(metric(&client, &e.server, "slidegate_circuit_open").await, 0.0, "{engine}: closed");
        // No connection opened since the partition: the held replies were read on the one the
        // healed checks used.
        assert_eq!(proxy.accepted(), connections, "{engine}: the same connections");
    }
}
