//! `local_share = "auto"` through real processes: three instances on one Redis count each other
//! by heartbeat, and while Redis is away each decides at the limit ÷ the fleet it last counted,
//! so the fleet keeps the limit; an instance that stops leaves the count; and what they admitted
//! locally is written into Redis when it comes back, even empty.

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate_testkit::{Fault, FaultProxy, RedisServer, Stall};
use support::{RulesFile, Slidegate, check, key_state, metric};

const LIMIT: u64 = 90;

fn rules(redis: &RedisServer) -> RulesFile {
    RulesFile::new(&format!(
        r#"
[backend]
redis = "{}"
failure_policy = "local"
local_share = "auto"
local_share_fallback = 0.5
timeout = "50ms"

[[rules]]
name = "api"
limit = {LIMIT}
window = "1m"
"#,
        redis.url()
    ))
}

async fn fleet_seen(client: &Client, server: &Slidegate) -> Value {
    let ready: Value = client.get(server.url("/readyz")).send().await.expect("readyz").json().await.expect("json");
    ready["fleet"]["instances"].clone()
}

/// Waits (bounded) until every one of `servers` has counted `n` instances.
async fn until_counted(client: &Client, servers: &[&Slidegate], n: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for server in servers {
        while fleet_seen(client, server).await != json!(n) {
            assert!(Instant::now() < deadline, "never counted {n}: {}", fleet_seen(client, server).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn with_redis_gone_three_instances_keep_the_limit_between_them_and_a_stopped_one_leaves_the_count() {
    let redis = RedisServer::start();
    let file = rules(&redis);
    let servers: Vec<Slidegate> = (0..3).map(|_| Slidegate::serve(&["--config", file.arg()])).collect();
    let client = Client::new();
    let all: Vec<&Slidegate> = servers.iter().collect();
    until_counted(&client, &all, 3).await;
    let page = client.get(servers[0].url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(page.contains("slidegate_fleet_instances 3"), "{page}");

    drop(redis);
    // Every instance is asked for more than the whole limit: each admits its third, locally.
    let mut admitted = Vec::new();
    for server in &servers {
        let mut n = 0;
        for _ in 0..LIMIT + 10 {
            let (status, _, v) = check(&client, server, &json!({"rule": "api", "key": "user-1"})).await;
            assert_eq!(
                (status, v["degraded"].as_bool(), v["policy"].as_str()),
                (200, Some(true), Some("local")),
                "{v}"
            );
            n += u64::from(v["allowed"] == true);
        }
        admitted.push(n);
    }
    assert_eq!(admitted, [LIMIT / 3; 3], "each instance a third of the limit, the fleet the limit");
    // The count it last saw stands through the outage.
    assert_eq!(fleet_seen(&client, &servers[1]).await, json!(3));
}

#[tokio::test]
async fn an_instance_that_stops_leaves_the_count_within_its_lapse() {
    let redis = RedisServer::start();
    let file = rules(&redis);
    let mut servers: Vec<Slidegate> = (0..3).map(|_| Slidegate::serve(&["--config", file.arg()])).collect();
    let client = Client::new();
    until_counted(&client, &servers.iter().collect::<Vec<_>>(), 3).await;
    let mut stopped = servers.pop().expect("three");
    stopped.signal("KILL");
    stopped.wait_exit(Duration::from_secs(5));
    until_counted(&client, &servers.iter().collect::<Vec<_>>(), 2).await;
    drop(redis);
    let mut n = 0;
    for _ in 0..LIMIT {
        let (_, _, v) = check(&client, &servers[0], &json!({"rule": "api", "key": "user-2"})).await;
        n += u64::from(v["allowed"] == true);
    }
    assert_eq!(n, LIMIT / 2, "half the limit with two instances left");
}

#[tokio::test]
async fn without_auto_no_heartbeat_is_written_and_readyz_says_nothing_of_a_fleet() {
    let redis = RedisServer::start();
    let server = Slidegate::serve(&["--redis", &redis.url()]);
    let client = Client::new();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ready: Value = client.get(server.url("/readyz")).send().await.expect("readyz").json().await.expect("json");
    assert!(ready.get("fleet").is_none(), "{ready}");
    let keys: Vec<String> = redis.query(&["KEYS", "*fleet*"]);
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn redis_killed_and_back_empty_gets_the_fleets_local_admissions_and_the_window_holds_the_limit() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let file = rules(&redis);
    let servers: Vec<Slidegate> = (0..3).map(|_| Slidegate::serve(&["--config", file.arg()])).collect();
    let client = Client::new();
    until_counted(&client, &servers.iter().collect::<Vec<_>>(), 3).await;
    redis.kill();
    let mut admitted = 0;
    for server in &servers {
        for _ in 0..LIMIT {
            let (_, _, v) = check(&client, server, &json!({"rule": "api", "key": "user-3"})).await;
            assert_eq!(v["policy"], "local", "{v}");
            admitted += u64::from(v["allowed"] == true);
        }
    }
    assert_eq!(admitted, LIMIT, "the fleet's local thirds: the limit");
    let back_at = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis();
    let redis = RedisServer::start_on(port);
    // Each instance writes its third back in the background; then Redis holds the window.
    let deadline = Instant::now() + Duration::from_secs(15);
    let entries = || -> u64 {
        let keys: Vec<String> = redis.query(&["KEYS", "*user-3*"]);
        keys.first().map_or(0, |k| redis.query(&["ZCARD", k]))
    };
    while entries() < LIMIT {
        assert!(Instant::now() < deadline, "written back: {} of {LIMIT}", entries());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for server in &servers {
        let page = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        assert!(
            page.contains(&format!("slidegate_write_back_permits_total{{outcome=\"written\"}} {}", LIMIT / 3)),
            "{page}"
        );
        let (_, _, v) = check(&client, server, &json!({"rule": "api", "key": "user-3"})).await;
        assert_eq!((v["allowed"].as_bool(), v["degraded"].as_bool()), (Some(false), Some(false)), "Redis denies: {v}");
    }
    assert_eq!(entries(), LIMIT, "the window across the outage holds exactly the limit");
    let keys: Vec<String> = redis.query(&["KEYS", "*user-3*"]);
    let times: Vec<(String, u128)> = redis.query(&["ZRANGE", &keys[0], "0", "-1", "WITHSCORES"]);
    assert!(times.iter().all(|(_, t)| *t < back_at), "each at its own time, before Redis was back: {times:?}");
}

/// Starts one instance of `file`, waits until it counts itself, kills `redis` and has the
/// instance admit `n` checks of `key` locally.
async fn admitted_locally(client: &Client, file: &RulesFile, redis: &mut RedisServer, key: &str, n: u64) -> Slidegate {
    let server = Slidegate::serve(&["--config", file.arg()]);
    until_counted(client, &[&server], 1).await;
    redis.kill();
    for _ in 0..n {
        let (_, _, v) = check(client, &server, &json!({"rule": "api", "key": key})).await;
        assert_eq!((v["allowed"].as_bool(), v["policy"].as_str()), (Some(true), Some("local")), "{v}");
    }
    server
}

#[tokio::test]
async fn an_instance_stopped_during_the_outage_writes_its_journal_to_a_redis_back_within_its_stop() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let file = rules(&redis);
    let client = Client::new();
    let mut server = admitted_locally(&client, &file, &mut redis, "user-4", 10).await;
    server.signal("TERM");
    // Redis returns after the stop began: the instance is still trying.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(server.log_text().contains("writing back local admissions before stopping"), "{}", server.log_text());
    let redis = RedisServer::start_on(port);
    assert!(server.wait_exit(Duration::from_secs(10)).success(), "{}", server.log_text());
    let keys: Vec<String> = redis.query(&["KEYS", "*user-4*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(redis.query::<u64>(&["ZCARD", &keys[0]]), 10, "the local admissions, in Redis after the stop");
    assert!(!server.log_text().contains("not written back"), "{}", server.log_text());
}

#[tokio::test]
async fn an_instance_stopped_while_redis_stays_away_exits_within_its_wait_and_says_what_it_could_not_write() {
    let mut redis = RedisServer::start();
    let file = rules(&redis);
    let client = Client::new();
    let mut server = admitted_locally(&client, &file, &mut redis, "user-5", 10).await;
    let stopped_at = Instant::now();
    server.signal("TERM");
    assert!(server.wait_exit(Duration::from_secs(10)).success(), "{}", server.log_text());
    let took = stopped_at.elapsed();
    // AT_STOP (5 s): it tried that long, and not much longer.
    assert!(took >= Duration::from_millis(4500) && took < Duration::from_secs(8), "{took:?}");
    assert!(server.log_text().contains("stopping with local admissions not written back"), "{}", server.log_text());
}

/// A Redis that stalls — its process stopped (`SIGSTOP`), or its writes paused (`CLIENT PAUSE
/// WRITE`, as a `FAILOVER` pauses them, answering reads meanwhile) — runs what it was sent once
/// it resumes. The instance's write-back probes it every half second meanwhile; were each probe
/// a write, or a read that a write follows, the first entry would count more than once. The
/// circuit is opened by resets first, so no check reaches Redis and the count after the stall is
/// exact: the one admission before, and the local ones.
#[tokio::test]
async fn a_stalled_redis_that_resumes_counts_each_local_admission_once_on_each_engine() {
    for stall in [Stall::Process, Stall::Writes] {
        for (engine, redis) in [("lua", RedisServer::start()), ("module", RedisServer::start_with_module(&[]))] {
            stalled_and_resumed(engine, stall, &redis).await;
        }
    }
}

async fn stalled_and_resumed(engine: &str, stall: Stall, redis: &RedisServer) {
    let proxy = FaultProxy::to_port(redis.port());
    let file = RulesFile::new(&format!(
        "admin_token = \"t\"\n[backend]\nredis = \"{}\"\nengine = \"{}\"\nfailure_policy = \"local\"\nlocal_share = 0.5\n\
         timeout = \"50ms\"\nnear_cache = 0\n\n[[rules]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\n",
        proxy.url(),
        engine
    ));
    let server = Slidegate::serve(&["--config", file.arg()]);
    let client = Client::new();
    let body = json!({"rule": "api", "key": "stalled"});
    let ask = || check(&client, &server, &body);
    assert_eq!(ask().await.2["degraded"], false, "{engine}, {stall:?}: Redis admits");
    proxy.set(Fault::Reset);
    let mut local = 0;
    for _ in 0..10 {
        let (_, _, v) = ask().await;
        assert_eq!(v["policy"], "local", "{engine}, {stall:?}: {v}");
        local += u64::from(v["allowed"] == true);
    }
    redis.pause(stall);
    proxy.set(Fault::Pass);
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.resume(stall);
    let deadline = Instant::now() + Duration::from_secs(15);
    while metric(&client, &server, "slidegate_write_back_pending").await > 0.0 {
        assert!(Instant::now() < deadline, "{engine}, {stall:?}: still pending");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = key_state(&client, &server, "api/stalled", "t").await;
    assert_eq!((local, &state["count"]), (5, &json!(1 + local)), "{engine}, {stall:?}: each counted once: {state}");
}
