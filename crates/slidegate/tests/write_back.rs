//! Write-back against real redis-servers, on the Lua engine and on the module, for every
//! algorithm: what a local failure policy admitted while Redis was away is written into Redis
//! once it answers again — into a Redis that came back empty (killed, restarted without its
//! data) and into one that kept its data (the network reset meanwhile), on a Cluster too — so the key then admits
//! exactly what its limit leaves, and a sliding log's entries keep their own times.

use std::time::{Duration, Instant};

use slidegate::{Algorithm, FailurePolicy, Limiter, Quota, RedisBackend, RedisEngine, SystemClock, WriteBack};
use slidegate::{Backend, Clock, Decision};
use slidegate_testkit::{Fault, FaultProxy, RedisCluster, RedisServer, Stall};

const LIMIT: u64 = 10;

/// A day's window, so no fixed window rolls over while a test runs (it would, at midnight UTC,
/// within a few seconds of it).
fn quotas() -> Vec<Quota> {
    let day = Quota::new(LIMIT, Duration::from_secs(86_400)).expect("quota");
    [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow { buckets: 8 },
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: None },
    ]
    .into_iter()
    .map(|a| day.with_algorithm(a).expect("quota"))
    .collect()
}

#[derive(Debug, Clone, Copy)]
enum Engine {
    Lua,
    Module,
}

fn start(engine: Engine, port: Option<u16>) -> RedisServer {
    match (engine, port) {
        (Engine::Lua, None) => RedisServer::start(),
        (Engine::Lua, Some(port)) => RedisServer::start_on(port),
        (Engine::Module, None) => RedisServer::start_with_module(&[]),
        (Engine::Module, Some(port)) => RedisServer::start_with_module_on(port),
    }
}

/// A limiter on `url` deciding at half of each limit locally while Redis is away.
async fn limiter(url: &str, engine: Engine) -> Limiter<RedisBackend> {
    let engine = match engine {
        Engine::Lua => RedisEngine::Lua,
        Engine::Module => RedisEngine::Module,
    };
    let backend = RedisBackend::connect(url).await.expect("connect").with_engine(engine);
    let backend = backend.with_timeout(Duration::from_millis(50));
    Limiter::new(backend).with_failure_policy(FailurePolicy::local(0.5).expect("policy")).with_write_back()
}

/// `n` checks of `key`, each answered: how many were admitted, every one by the policy.
async fn admitted_locally<B: Backend>(limiter: &Limiter<B>, key: &str, quota: &Quota, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let d = limiter.check(key, quota).await.expect("answered by the policy");
        assert!(d.degraded.is_some(), "{key}: decided locally: {d:?}");
        admitted += u64::from(d.allowed);
    }
    admitted
}

/// Writes back until nothing waits (Redis may take a reconnect to reach): the report summed.
async fn write_back_all<B: Backend>(limiter: &Limiter<B>) -> WriteBack {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut total = WriteBack::default();
    loop {
        let w = limiter.write_back().await;
        (total.written, total.dropped, total.pending) =
            (total.written + w.written, total.dropped + w.dropped, w.pending);
        if w.pending == 0 {
            return total;
        }
        assert!(Instant::now() < deadline, "still pending: {w:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks `key` until Redis denies it: how many Redis admitted, none by the policy.
async fn admitted_by_redis<B: Backend>(limiter: &Limiter<B>, key: &str, quota: &Quota) -> u64 {
    let mut admitted = 0;
    loop {
        let d: Decision = limiter.check(key, quota).await.expect("answered");
        assert_eq!(d.degraded, None, "{key}: decided by Redis: {d:?}");
        if !d.allowed {
            return admitted;
        }
        admitted += 1;
        assert!(admitted <= LIMIT, "{key}: Redis admitted past the limit");
    }
}

#[tokio::test]
async fn a_redis_back_empty_gets_what_was_admitted_locally_and_the_key_admits_only_the_rest() {
    for engine in [Engine::Lua, Engine::Module] {
        let mut redis = start(engine, None);
        let port = redis.port();
        let limiter = limiter(&redis.url(), engine).await;
        let keys: Vec<String> = (0..quotas().len()).map(|i| format!("{engine:?}-empty-{i}")).collect();
        for (key, quota) in keys.iter().zip(quotas()) {
            assert!(limiter.check(key, &quota).await.expect("check").degraded.is_none(), "Redis is up");
        }
        redis.kill();
        let away_from = SystemClock.now_ms();
        for (key, quota) in keys.iter().zip(quotas()) {
            // One went to Redis, and is lost with it; locally, half the limit.
            assert_eq!(admitted_locally(&limiter, key, &quota, LIMIT).await, LIMIT / 2, "{key}");
        }
        let away_until = SystemClock.now_ms();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let redis = start(engine, Some(port));
        let report = write_back_all(&limiter).await;
        assert_eq!(report, WriteBack { written: 4 * LIMIT / 2, dropped: 0, pending: 0 }, "{engine:?}");
        let log = &quotas()[0];
        let times = limiter.timeline(&keys[0], log, 100).await.expect("timeline").admissions_ms;
        assert_eq!(times.len() as u64, LIMIT / 2, "{engine:?}");
        // Placed by Redis' clock less each admission's age as the write-back measured it: later
        // by the call's own latency at most, long before the write-back (300 ms after).
        assert!(
            times.iter().all(|t| (away_from..=away_until + 100).contains(t)),
            "{engine:?}: each entry at its own time, within {away_from}..={away_until} (+100 ms): {times:?}"
        );
        for (key, quota) in keys.iter().zip(quotas()) {
            assert_eq!(
                admitted_by_redis(&limiter, key, &quota).await,
                LIMIT / 2,
                "{key}: the limit less what was written back"
            );
        }
        drop(redis);
    }
}

#[tokio::test]
async fn a_redis_that_kept_its_data_adds_what_was_admitted_locally() {
    for engine in [Engine::Lua, Engine::Module] {
        let redis = start(engine, None);
        let proxy = FaultProxy::to_port(redis.port());
        let limiter = limiter(&proxy.url(), engine).await;
        let keys: Vec<String> = (0..quotas().len()).map(|i| format!("{engine:?}-kept-{i}")).collect();
        for (key, quota) in keys.iter().zip(quotas()) {
            for _ in 0..3 {
                assert!(limiter.check(key, &quota).await.expect("check").allowed, "{key}: Redis admits");
            }
        }
        proxy.set(Fault::Reset);
        for (key, quota) in keys.iter().zip(quotas()) {
            assert_eq!(admitted_locally(&limiter, key, &quota, LIMIT).await, LIMIT / 2, "{key}");
        }
        proxy.set(Fault::Pass);
        let report = write_back_all(&limiter).await;
        assert_eq!(report, WriteBack { written: 4 * LIMIT / 2, dropped: 0, pending: 0 }, "{engine:?}");
        for (key, quota) in keys.iter().zip(quotas()) {
            assert_eq!(
                admitted_by_redis(&limiter, key, &quota).await,
                LIMIT - 3 - LIMIT / 2,
                "{key}: 3 before, 5 locally"
            );
        }
    }
}

/// A rule with a warm-up is written back on both engines: the local limiter (half of 10) admits
/// its cold half, 2; written into a Redis back empty, they start the key's ramp there, whose
/// cold limit (5) then leaves 3.
#[tokio::test]
async fn a_warm_up_rule_is_written_back_and_its_ramp_starts_with_it() {
    let day = Duration::from_secs(86_400);
    for engine in [Engine::Lua, Engine::Module] {
        let mut redis = start(engine, None);
        let port = redis.port();
        let limiter = limiter(&redis.url(), engine).await;
        redis.kill();
        let quotas: Vec<Quota> = quotas().into_iter().map(|q| q.with_warm_up(day, 0.5).expect("warm-up")).collect();
        let keys: Vec<String> = (0..quotas.len()).map(|i| format!("{engine:?}-warm-{i}")).collect();
        for (key, quota) in keys.iter().zip(&quotas) {
            assert_eq!(admitted_locally(&limiter, key, quota, LIMIT).await, 2, "{key}: cold, half of half");
        }
        let _redis = start(engine, Some(port));
        assert_eq!(write_back_all(&limiter).await, WriteBack { written: 4 * 2, dropped: 0, pending: 0 }, "{engine:?}");
        for (key, quota) in keys.iter().zip(&quotas) {
            assert_eq!(admitted_by_redis(&limiter, key, quota).await, 3, "{key}: the cold 5 less the 2 written");
        }
    }
}

#[tokio::test]
async fn an_admission_that_left_its_window_is_not_written_back() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let limiter = limiter(&redis.url(), Engine::Lua).await;
    let quota = Quota::new(LIMIT, Duration::from_millis(500)).expect("quota");
    redis.kill();
    assert_eq!(admitted_locally(&limiter, "brief", &quota, LIMIT).await, LIMIT / 2);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let _redis = RedisServer::start_on(port);
    assert_eq!(write_back_all(&limiter).await, WriteBack { written: 0, dropped: LIMIT / 2, pending: 0 });
    assert_eq!(limiter.inspect("brief", &quota).await.expect("inspect").count, 0);
}

#[tokio::test]
async fn a_sliding_log_written_back_resets_when_its_newest_entry_leaves() {
    for engine in [Engine::Lua, Engine::Module] {
        let mut redis = start(engine, None);
        let port = redis.port();
        let limiter = limiter(&redis.url(), engine).await;
        let window = Duration::from_secs(20);
        let quota = Quota::new(LIMIT, window).expect("quota");
        redis.kill();
        assert_eq!(admitted_locally(&limiter, "ttl", &quota, LIMIT).await, LIMIT / 2);
        let admitted_by = Instant::now();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let redis = start(engine, Some(port));
        assert_eq!(write_back_all(&limiter).await.written, LIMIT / 2);
        // Within a few ms: the journal's times, Redis' TIME and the test's clock round apart.
        let most = window.saturating_sub(admitted_by.elapsed()) + Duration::from_millis(10);
        let state = limiter.inspect("ttl", &quota).await.expect("inspect");
        assert_eq!(state.count, LIMIT / 2, "{engine:?}");
        assert!(
            state.reset_after <= most,
            "{engine:?}: reset after {:?}, the newest entry leaves within {most:?}",
            state.reset_after
        );
        if let Engine::Lua = engine {
            // The scripts read a key's reset from its TTL.
            let keys: Vec<String> = redis.query(&["KEYS", "*ttl*"]);
            let ttl: u64 = redis.query(&["PTTL", &keys[0]]);
            assert!(
                ttl > 0 && ttl <= most.as_millis() as u64,
                "PTTL {ttl} ms, the newest entry leaves within {most:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_kept_its_data_adds_what_was_admitted_locally() {
    let cluster = RedisCluster::start(3, 0);
    let proxies = cluster.behind_proxies();
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisBackend::connect_cluster(&urls).await.expect("connect").with_timeout(Duration::from_millis(50));
    let limiter =
        Limiter::new(backend).with_failure_policy(FailurePolicy::local(0.5).expect("policy")).with_write_back();
    // Keys spread over the masters.
    let keys: Vec<String> = (0..quotas().len()).map(|i| format!("cluster-{i}")).collect();
    for (key, quota) in keys.iter().zip(quotas()) {
        for _ in 0..3 {
            assert!(limiter.check(key, &quota).await.expect("check").allowed, "{key}: Redis admits");
        }
    }
    proxies.iter().for_each(|p| p.set(Fault::Reset));
    for (key, quota) in keys.iter().zip(quotas()) {
        assert_eq!(admitted_locally(&limiter, key, &quota, LIMIT).await, LIMIT / 2, "{key}");
    }
    proxies.iter().for_each(|p| p.set(Fault::Pass));
    let report = write_back_all(&limiter).await;
    assert_eq!(report, WriteBack { written: 4 * LIMIT / 2, dropped: 0, pending: 0 });
    for (key, quota) in keys.iter().zip(quotas()) {
        assert_eq!(admitted_by_redis(&limiter, key, &quota).await, LIMIT - 3 - LIMIT / 2, "{key}: 3 before, 5 locally");
    }
}

/// The race of a Redis that is back: checks keep coming while the journal is not written yet.
/// Until it is, they are decided locally (Redis, which does not hold them yet, would admit them
/// again); then by Redis, which holds them: the key admits its limit, not more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_while_redis_is_back_but_the_journal_unwritten_stay_local_and_the_limit_holds() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let limiter = std::sync::Arc::new(limiter(&redis.url(), Engine::Lua).await);
    let quota = Quota::new(LIMIT, Duration::from_secs(60)).expect("quota");
    redis.kill();
    let mut admitted = admitted_locally(&limiter, "race", &quota, LIMIT).await;
    let _redis = RedisServer::start_on(port);
    let writer = {
        let limiter = std::sync::Arc::clone(&limiter);
        tokio::spawn(async move {
            // As `slidegate serve` runs it: every 250 ms.
            while limiter.write_back_pending() > 0 {
                tokio::time::sleep(Duration::from_millis(250)).await;
                limiter.write_back().await;
            }
        })
    };
    let until = Instant::now() + Duration::from_secs(3);
    let mut by_redis_before_written = 0;
    while Instant::now() < until {
        let d = limiter.check("race", &quota).await.expect("answered");
        admitted += u64::from(d.allowed);
        if d.degraded.is_none() && limiter.write_back_pending() > 0 {
            by_redis_before_written += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writer.await.expect("writer");
    assert_eq!(limiter.write_back_pending(), 0);
    assert_eq!(by_redis_before_written, 0, "decided by Redis while the journal was unwritten");
    assert_eq!(admitted, LIMIT, "local half, then Redis' rest: the limit");
    assert_eq!(limiter.inspect("race", &quota).await.expect("inspect").count, LIMIT);
}

#[tokio::test]
async fn a_write_back_cut_off_at_a_time_starts_no_write_after_it_and_keeps_the_rest_pending() {
    let mut redis = start(Engine::Lua, None);
    let port = redis.port();
    let limiter = limiter(&redis.url(), Engine::Lua).await;
    let quota = quotas()[0];
    redis.kill();
    let local = admitted_locally(&limiter, "cut", &quota, LIMIT).await;
    let pending = limiter.write_back_pending();
    assert!(pending > 0, "journaled");
    let redis = start(Engine::Lua, Some(port));
    // Past the breaker's pause, so that the write-back is let through as its probe.
    tokio::time::sleep(slidegate::CircuitBreaker::default().open_for() * 2).await;
    // Already past: nothing is started, nothing is lost, and Redis does not decide yet.
    let w = limiter.write_back_until(Some(Instant::now())).await;
    assert_eq!((w.written, w.dropped, w.pending), (0, 0, pending), "{w:?}");
    assert_eq!(limiter.write_back_pending(), pending);
    let d = limiter.check("cut", &quota).await.expect("answered");
    assert!(d.degraded.is_some(), "still local while the journal waits: {d:?}");
    let all = write_back_all(&limiter).await;
    let on_redis: u64 = redis.query(&["ZCARD", &limiter.backend().redis_key("cut", quota.algorithm())]);
    assert_eq!((all.written, on_redis), (local + u64::from(d.allowed), local + u64::from(d.allowed)), "{all:?}");
}

/// A Redis that stalls runs what it was sent once it resumes: every probe of the write-back
/// meanwhile must send no write of its own, or each would count the first entry again (one
/// local admission became 14 on a limit of 10). The circuit is opened by resets, so no check
/// reaches Redis and the count after the stall is exact.
#[tokio::test]
async fn a_stalled_redis_that_resumes_counts_each_local_admission_once_however_many_probes_it_missed() {
    for (engine, stall) in
        [Engine::Lua, Engine::Module].into_iter().flat_map(|e| [(e, Stall::Process), (e, Stall::Writes)])
    {
        let redis = start(engine, None);
        let proxy = FaultProxy::to_port(redis.port());
        let limiter = limiter(&proxy.url(), engine).await;
        let keys: Vec<String> = (0..quotas().len()).map(|i| format!("{engine:?}-{stall:?}-{i}")).collect();
        for (key, quota) in keys.iter().zip(quotas()) {
            assert!(limiter.check(key, &quota).await.expect("check").allowed, "{key}: Redis admits");
        }
        proxy.set(Fault::Reset);
        for (key, quota) in keys.iter().zip(quotas()) {
            assert_eq!(admitted_locally(&limiter, key, &quota, LIMIT).await, LIMIT / 2, "{key}");
        }
        redis.pause(stall);
        proxy.set(Fault::Pass);
        let (open_for, probing) = (slidegate::CircuitBreaker::default().open_for(), Instant::now());
        while probing.elapsed() < open_for * 6 {
            assert!(limiter.write_back().await.pending > 0, "{engine:?}, {stall:?}: nothing written while stalled");
            tokio::time::sleep(open_for / 4).await;
        }
        redis.resume(stall);
        let report = write_back_all(&limiter).await;
        assert_eq!(report.written, 4 * LIMIT / 2, "{engine:?}, {stall:?}: {report:?}");
        for (key, quota) in keys.iter().zip(quotas()) {
            assert_eq!(
                admitted_by_redis(&limiter, key, &quota).await,
                LIMIT - 1 - LIMIT / 2,
                "{key}: 1 before, 5 locally"
            );
        }
    }
}
