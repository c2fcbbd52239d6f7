//! A Redis Cluster master killed under load, through the real binary: the master that holds
//! both a hot key and the shared store (overrides, `{rules}`) dies while 32 callers check that
//! key; every request is answered (the policy meanwhile), decisions come back from the promoted
//! replica, an override set before the failover still holds, and one set after it is stored and
//! enforced exactly.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate::key_slot;
use slidegate_testkit::RedisCluster;
use support::{RulesFile, Slidegate, check};

fn rules(cluster: &RedisCluster) -> RulesFile {
    RulesFile::new(&format!(
        r#"admin_token = "t"

[backend]
redis_cluster = {:?}
failure_policy = "fail_open"
timeout = "50ms"

[[rules]]
name = "api"
limit = 100000
window = "1m"
"#,
        cluster.urls()
    ))
}

async fn set_override(client: &Client, server: &Slidegate, key: &str, limit: u64) -> (u16, Value) {
    let response = client
        .put(server.url(&format!("/v1/overrides/api/{key}")))
        .bearer_auth("t")
        .json(&json!({ "limit": limit }))
        .send()
        .await
        .expect("override");
    (response.status().as_u16(), response.json().await.unwrap_or_default())
}

/// `n` checks of `key` from Redis (none degraded): which were admitted.
async fn decided(client: &Client, server: &Slidegate, key: &str, n: usize) -> Vec<bool> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let (status, _, v) = check(client, server, &json!({"rule": "api", "key": key})).await;
        assert_eq!((status, v["degraded"].as_bool()), (200, Some(false)), "{key}: {v}");
        seen.push(v["allowed"] == true);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_and_the_limits_and_overrides_hold() {
    let mut cluster = RedisCluster::start(3, 1);
    let file = rules(&cluster);
    let server = Arc::new(Slidegate::serve(&["--config", file.arg()]));
    let client = Client::new();
    let victim = cluster.master_of(key_slot("slidegate:{rules}:overrides")).port();
    let hot =
        (0..).map(|i| format!("hot-{i}")).find(|k| cluster.master_of(key_slot(format!("{{{k}}}"))).port() == victim);
    let hot = hot.expect("a key on the store's master");
    assert_eq!(set_override(&client, &server, "before", 3).await.0, 200);

    let (killed, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let from_redis_after_kill = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let (server, client, hot) = (Arc::clone(&server), client.clone(), hot.clone());
            let (killed, stop, back) = (Arc::clone(&killed), Arc::clone(&stop), Arc::clone(&from_redis_after_kill));
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let (status, _, v) = check(&client, &server, &json!({"rule": "api", "key": hot})).await;
                    slowest = slowest.max(started.elapsed());
                    assert_eq!((status, v["allowed"].as_bool()), (200, Some(true)), "answered, fail_open: {v}");
                    if killed.load(Ordering::Relaxed) && v["degraded"] == false {
                        back.fetch_add(1, Ordering::Relaxed);
                    }
                }
                slowest
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(victim);
    killed.store(true, Ordering::Relaxed);
    let killed_at = Instant::now();
    while from_redis_after_kill.load(Ordering::Relaxed) < 500 && killed_at.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut slowest = Duration::ZERO;
    for c in callers {
        slowest = slowest.max(c.await.expect("caller"));
    }
    let back = from_redis_after_kill.load(Ordering::Relaxed);
    println!(
        "decided by Redis again {back} times, {:?} after the kill; slowest request {slowest:?}",
        killed_at.elapsed()
    );
    assert!(back >= 500, "decisions came back from the promoted replica within 30 s: {back}");
    // The deadline plus a shared 2-core machine's scheduling, never a hang.
    assert!(slowest < Duration::from_secs(2), "slowest {slowest:?}");

    // The store's own connection came through the failover too.
    let deadline = Instant::now() + Duration::from_secs(15);
    while set_override(&client, &server, "after", 2).await.0 != 200 {
        assert!(Instant::now() < deadline, "an override stored after the failover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(decided(&client, &server, "after", 3).await, [true, true, false], "the new override, exactly");
    assert_eq!(decided(&client, &server, "before", 4).await, [true, true, true, false], "the old one holds");
}
