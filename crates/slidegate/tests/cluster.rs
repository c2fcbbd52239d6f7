//! The Redis backend on a real local Redis Cluster (3 masters, 3 replicas, created with
//! `redis-cli --cluster create`): every algorithm, hash-tagged multi-limit checks, script cache
//! loss on every master, and a master killed under load (from one caller, and from 64 at once);
//! and the same exactness with
//! slidegate's Redis module loaded on every master.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use slidegate::{
    Algorithm, Check, Error, FailurePolicy, Limiter, Quota, RedisBackend, RedisClusterBackend, RedisEngine, hash_tag,
    key_slot,
};
use slidegate_testkit::RedisCluster;

fn quota(algorithm: Algorithm) -> Quota {
    Quota::per_hour(20).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
}

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow { buckets: 6 },
    Algorithm::FixedWindow,
    Algorithm::Gcra { burst: None },
];

async fn connect(cluster: &RedisCluster) -> slidegate::RedisClusterBackend {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisBackend::connect_cluster(&urls).await.expect("connect").with_timeout(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_is_exact_on_keys_spread_over_the_masters() {
    let cluster = RedisCluster::start(3, 0);
    assert_exact_on_spread_keys(&cluster, Limiter::new(connect(&cluster).await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_decides_exactly_on_every_master() {
    let cluster = RedisCluster::start_with_module(3, 0);
    let backend = connect(&cluster).await.with_engine(RedisEngine::Module);
    assert_exact_on_spread_keys(&cluster, Limiter::new(backend.clone())).await;
    // A hash-tagged group, all or nothing on one master.
    let limiter = Limiter::new(backend);
    let (a, b) = (hash_tag("user:9", "a"), hash_tag("user:9", "b"));
    let group =
        [Check::new(&a, Quota::per_hour(2).expect("valid")), Check::new(&b, Quota::per_hour(1).expect("valid"))];
    assert!(limiter.check_all(&group).await.expect("check").allowed);
    let d = limiter.check_all(&group).await.expect("check");
    assert_eq!((d.allowed, d.denied_by), (false, Some(1)));
    assert_eq!(limiter.inspect(&a, &group[0].quota).await.expect("inspect").count, 1, "nothing charged");
    // Sent as is to the master of the first key, a group across slots is refused by the module.
    let (first, other) = ("slidegate:user:1", "slidegate:user:2");
    assert_ne!(key_slot(first), key_slot(other));
    let mut conn = cluster.master_of(key_slot(first)).conn();
    let refused = redis::cmd("SLIDEGATE.CHECK")
        .arg(&[first, "sliding_log", "5", "1000", "1", "AND", other, "sliding_log", "5", "1000", "1"])
        .query::<redis::Value>(&mut conn)
        .expect_err("cross-slot");
    assert_eq!(refused.code(), Some("CROSSSLOT"), "{refused}");
}

/// 16 tasks race on each of six keys spread over the masters, under every algorithm: exactly
/// the limit is admitted on each.
async fn assert_exact_on_spread_keys(cluster: &RedisCluster, limiter: Limiter<RedisClusterBackend>) {
    let limiter = Arc::new(limiter);
    // Keys in many slots, so every master serves some; 16 tasks race on each.
    let keys: Vec<String> = (0..6).map(|i| format!("user:{i}")).collect();
    let masters: std::collections::HashSet<u16> =
        keys.iter().map(|k| cluster.master_of(key_slot(format!("slidegate:{k}"))).port()).collect();
    assert!(masters.len() >= 2, "keys spread over the masters");
    for algorithm in ALGORITHMS {
        for key in &keys {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (limiter, key) = (Arc::clone(&limiter), key.clone());
                    tokio::spawn(async move {
                        let mut admitted = 0;
                        for _ in 0..3 {
                            admitted += u32::from(limiter.check(&key, &quota(algorithm)).await.expect("check").allowed);
                        }
                        admitted
                    })
                })
                .collect();
            let mut admitted = 0;
            for t in tasks {
                admitted += t.await.expect("task");
            }
            assert_eq!(admitted, 20, "{algorithm} on {key}: 48 checks, limit 20");
        }
    }
}

#[tokio::test]
async fn multi_limit_checks_need_one_slot_and_survive_script_flush() {
    let cluster = RedisCluster::start(3, 0);
    let limiter = Limiter::new(connect(&cluster).await);
    let per_second = Quota::per_second(2).expect("valid");
    let per_day =
        Quota::new(3, Duration::from_secs(86_400)).and_then(|q| q.with_algorithm(Algorithm::Gcra { burst: None }));
    let per_day = per_day.expect("valid");
    let apart = [Check::new("user:7:sms", per_second), Check::new("user:7:login", per_day)];
    assert!(matches!(limiter.check_all(&apart).await, Err(Error::CrossSlot { .. })), "a typed error, not CROSSSLOT");
    let (sms, login) = (hash_tag("user:7", "sms"), hash_tag("user:7", "login"));
    let together = [Check::new(&sms, per_second), Check::new(&login, per_day)];
    assert!(limiter.check_all(&together).await.expect("one slot").allowed);
    for node in cluster.nodes() {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut node.conn()).expect("flush");
    }
    assert!(limiter.check_all(&together).await.expect("reloaded transparently").allowed);
    let d = limiter.check_all(&together).await.expect("third");
    assert_eq!((d.allowed, d.denied_by), (false, Some(0)), "the per-second limit denies; nothing charged");
    assert_eq!(limiter.inspect(&login, &per_day).await.expect("inspect").count, 2);
    limiter.reset(&login).await.expect("reset");
    assert_eq!(limiter.inspect(&login, &per_day).await.expect("inspect").count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_and_decisions_continue() {
    let mut cluster = RedisCluster::start(3, 1);
    let deadline = Duration::from_millis(50);
    let limiter =
        Limiter::new(connect(&cluster).await.with_timeout(deadline)).with_failure_policy(FailurePolicy::FailOpen);
    let q = Quota::per_minute(slidegate::MAX_LOG_LIMIT).expect("valid");
    let key = "hot";
    let victim = cluster.master_of(key_slot("slidegate:hot")).port();
    assert!(limiter.check(key, &q).await.expect("check").degraded.is_none());

    let started = Instant::now();
    let (mut answered, mut degraded, mut slowest, mut killed_at, mut recovered_at) =
        (0u32, 0u32, Duration::ZERO, None, None);
    while started.elapsed() < Duration::from_secs(30) {
        if killed_at.is_none() && started.elapsed() > Duration::from_millis(300) {
            cluster.kill(victim);
            killed_at = Some(Instant::now());
        }
        let t = Instant::now();
        let d = limiter.check(key, &q).await.expect("a failure policy answers every request");
        slowest = slowest.max(t.elapsed());
        answered += 1;
        match (d.degraded, killed_at) {
            (Some(_), _) => degraded += 1,
            (None, Some(k)) if degraded > 0 => {
                recovered_at = Some(k.elapsed());
                break;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("failover: answered {answered}, degraded {degraded}, slowest {slowest:?}, back after {recovered_at:?}");
    let back = recovered_at.expect("decisions from Redis again after the failover");
    assert!(back < Duration::from_secs(20), "back after {back:?}");
    // Generous slack over the deadline on a shared 2-core machine; the point is: never hung.
    assert!(slowest < deadline + Duration::from_millis(200), "slowest {slowest:?}");
    // The promoted replica serves the slot before every node has seen the failover.
    let healing = Instant::now();
    while !cluster.is_ok() {
        assert!(healing.elapsed() < Duration::from_secs(15), "the cluster heals");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With many callers at once, redis-rs' Cluster connection could stop answering for good after
/// a master's kill (its slot refresh waits on requests it no longer polls); the backend renews
/// the connection after `CLUSTER_STALL_BEFORE_RENEWAL` and decisions come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_come_back_after_a_master_is_killed_under_64_callers() {
    let mut cluster = RedisCluster::start(3, 1);
    let limiter = Arc::new(Limiter::new(connect(&cluster).await.with_timeout(Duration::from_millis(50))));
    let q = Quota::per_minute(slidegate::MAX_LOG_LIMIT).expect("valid");
    let victim = cluster.master_of(key_slot("slidegate:busy")).port();
    let (killed, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let admitted_after_kill = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..64)
        .map(|_| {
            let (limiter, killed, stop, admitted) =
                (Arc::clone(&limiter), Arc::clone(&killed), Arc::clone(&stop), Arc::clone(&admitted_after_kill));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match limiter.check("busy", &q).await {
                        Ok(d) if d.allowed => {
                            if killed.load(Ordering::Relaxed) {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(victim);
    killed.store(true, Ordering::Relaxed);
    let killed_at = Instant::now();
    // Admissions from the promoted replica, well past any the old master answered in flight.
    while admitted_after_kill.load(Ordering::Relaxed) < 1_000 && killed_at.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.expect("caller");
    }
    let admitted = admitted_after_kill.load(Ordering::Relaxed);
    println!("64 callers: {admitted} admitted after the kill, {:?} after it", killed_at.elapsed());
    assert!(admitted >= 1_000, "only {admitted} admissions in 30 s after the kill: the connection never recovered");
}
