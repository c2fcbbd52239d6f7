//! The real binary reaching real redis-servers through the testkit's fault proxies, over HTTP
//! and Envoy's gRPC — a standalone Redis (Lua engine and module), a Sentinel-managed master and
//! a Cluster (Lua engine and module): a partition, latency past the deadline and resets are
//! answered by the failure policy within the deadline plus a margin, the circuit opens and
//! closes, and once healed every key is exact again and gets its own answers, never a held
//! reply of another.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use slidegate_testkit::{Fault, FaultProxy, RedisCluster, RedisSentinel, RedisServer, SENTINEL_SERVICE};
use support::envoy::{Envoy, OK, OVER, codes};
use support::{RulesFile, check, metric};

/// What a request may take past the 50 ms deadline: HTTP on loopback and scheduling on a
/// shared 2-core machine, not the backend's. Shorter than each fault (600 ms, a 300 ms round
/// trip), so a request that waited for the network instead of its deadline fails the bound.
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

/// Where Redis runs, behind fault proxies: the processes (kept alive), the proxies a fault is
/// set on (every one slidegate reaches Redis through) and the `[backend]` lines that reach it.
struct Behind {
    name: &'static str,
    proxies: Vec<FaultProxy>,
    backend: String,
    /// The processes, killed when dropped.
    _redis: Box<dyn std::any::Any>,
}

fn standalone(name: &'static str, redis: RedisServer, engine: &str) -> Behind {
    let proxy = FaultProxy::to_port(redis.port());
    let backend = format!("redis = \"{}\"\nengine = \"{engine}\"", proxy.url());
    Behind { name, proxies: vec![proxy], backend, _redis: Box::new(redis) }
}

fn sentinel() -> Behind {
    let (sentinel, proxy) = RedisSentinel::start_behind_proxy();
    let backend = format!(
        "redis_sentinel = [\"{}\"]\nsentinel_service = \"{SENTINEL_SERVICE}\"\nengine = \"lua\"",
        sentinel.sentinel_url()
    );
    Behind { name: "sentinel, lua", proxies: vec![proxy], backend, _redis: Box::new(sentinel) }
}

/// Three masters without replicas: a partition from every node holds no replication.
fn cluster(name: &'static str, cluster: RedisCluster, engine: &str) -> Behind {
    let proxies = cluster.behind_proxies();
    let urls: Vec<String> = proxies.iter().map(|p| format!("\"{}\"", p.url())).collect();
    let backend = format!("redis_cluster = [{}]\nengine = \"{engine}\"", urls.join(", "));
    Behind { name, proxies, backend, _redis: Box::new(cluster) }
}

/// Each topology in turn, started when its turn comes.
fn topologies() -> [fn() -> Behind; 5] {
    [
        || standalone("standalone, lua", RedisServer::start(), "lua"),
        || standalone("standalone, module", RedisServer::start_with_module(&[]), "module"),
        sentinel,
        || cluster("cluster, lua", RedisCluster::start(3, 0), "lua"),
        || cluster("cluster, module", RedisCluster::start_with_module(3, 0), "module"),
    ]
}

impl Behind {
    fn set(&self, fault: Fault) {
        self.proxies.iter().for_each(|p| p.set(fault));
    }

    fn accepted(&self) -> u64 {
        self.proxies.iter().map(FaultProxy::accepted).sum()
    }

    /// The near-cache off: it would answer the spent key's checks without Redis, and the test
    /// needs them held by the fault.
    fn rules(&self) -> RulesFile {
        RulesFile::new(&format!(
            "[backend]\n{}\ntimeout = \"50ms\"\nfailure_policy = \"fail_closed\"\nnear_cache = 0\n\n\
             [[rules]]\nname = \"sms\"\nlimit = 3\nwindow = \"60s\"\n",
            self.backend
        ))
    }
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

/// How soon after the heal a check must be decided by Redis again: the breaker's probe
/// interval, and for a Cluster the client's refresh of its view of the nodes.
const BACK_WITHIN: Duration = Duration::from_secs(3);

/// The faults each topology goes through, each held for at least as long (and for as long as
/// its sixteen checks take): a partition, a 300 ms round trip (six times the deadline) and
/// resets. Each is shorter than the connections' one-second silence limit and than the
/// Sentinel's down-after time, so nothing fails over and a partition keeps its connections.
const FAULTS: [(&str, Fault, Duration); 3] = [
    ("blackhole", Fault::Blackhole, Duration::from_millis(600)),
    (
        "latency",
        Fault::Latency { delay: Duration::from_millis(150), jitter: Duration::from_millis(20) },
        Duration::from_millis(600),
    ),
    ("reset", Fault::Reset, Duration::from_millis(600)),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_answered_in_time_by_the_policy_and_healed_keys_get_their_own_answers() {
    for start in topologies() {
        let redis = start();
        let name = redis.name;
        let rules = redis.rules();
        let mut e = Envoy::start(&[("edge.yaml", EDGE)], &["--config", rules.arg()]).await;
        assert_eq!(four_each(&mut e, "a", "a").await, exact(), "{name}: exact through the proxy");
        let client = reqwest::Client::new();
        for (round, (fault_name, fault, hold)) in FAULTS.into_iter().enumerate() {
            let what = format!("{name}, {fault_name}");
            // Checks of the spent key `a`, each a denial if Redis ever answers it.
            let connections = redis.accepted();
            // What the policy's answers are counted as: a reset fails a call at once, the
            // others make it miss its deadline.
            let kind = if matches!(fault, Fault::Reset) { "error" } else { "timeout" };
            let cause = format!("slidegate_policy_answers_total{{kind=\"{kind}\"}}");
            let answered_before = metric(&client, &e.server, &cause).await;
            redis.set(fault);
            let started = Instant::now();
            let mut slowest = Duration::ZERO;
            for _ in 0..8 {
                let t = Instant::now();
                let (status, _, v) = check(&client, &e.server, &json!({"rule": "sms", "key": "a"})).await;
                slowest = slowest.max(t.elapsed());
                assert_eq!(
                    (status, &v["allowed"], &v["degraded"], &v["policy"]),
                    (200, &json!(false), &json!(true), &json!("fail_closed")),
                    "{what}"
                );
                let t = Instant::now();
                assert_eq!(
                    codes(&e.ask("edge", &[&[("user", "a")]], 0).await).0,
                    OVER,
                    "{what}: fail_closed over gRPC"
                );
                slowest = slowest.max(t.elapsed());
            }
            let open = metric(&client, &e.server, "slidegate_circuit_open").await;
            eprintln!("network fault binary, {what}: answered in {slowest:?} at most, circuit open {open}");
            assert!(slowest <= DEADLINE + SLACK, "{what}: slowest {slowest:?}");
            assert_eq!(open, 1.0, "{what}: the circuit opened");
            let answered = metric(&client, &e.server, &cause).await;
            assert!(answered > answered_before, "{what}: the policy's answers counted under {cause}");
            tokio::time::sleep(hold.saturating_sub(started.elapsed())).await;
            redis.set(Fault::Pass);

            // The breaker probes within its interval; then fresh keys are exact, with their own
            // answers: a held denial of `a` handed to them would show.
            let healed = Instant::now();
            while check(&client, &e.server, &json!({"rule": "sms", "key": "probe"})).await.2["degraded"] == json!(true)
            {
                assert!(healed.elapsed() < BACK_WITHIN, "{what}: still degraded after the heal");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let fresh = format!("fresh-{round}");
            assert_eq!(four_each(&mut e, &fresh, &fresh).await, exact(), "{what}: exact once healed");
            assert_eq!(metric(&client, &e.server, "slidegate_circuit_open").await, 0.0, "{what}: closed");
            eprintln!(
                "network fault binary, {what}: back after {:?}, connections {connections} -> {}",
                healed.elapsed(),
                redis.accepted()
            );
            if fault == Fault::Blackhole {
                // No connection opened since the partition: the held replies were read on the
                // ones the healed checks used.
                assert_eq!(redis.accepted(), connections, "{what}: the same connections");
            }
        }
    }
}
