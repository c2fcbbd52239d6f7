//! Fault injection against real redis-server processes (loopback, bounded in time): Redis
//! killed with SIGKILL under load and restarted, `SCRIPT FLUSH`, `DEBUG SLEEP` and
//! `CLIENT KILL` mid-load. Each failure policy must do what it says, no request may hang (each
//! is answered within the deadline plus a generous margin for a loaded machine), and every
//! load task must get decisions from Redis again soon after it is back. Each test writes what
//! it measured to stderr (shown in CI logs); how close to the deadline answers come is a
//! benchmark's figure, not a test's.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slidegate::{Decision, FailurePolicy, Limiter, Quota, RedisBackend};
use slidegate_testkit::RedisServer;

const DEADLINE: Duration = Duration::from_millis(50);

/// What a request may take past the deadline before it counts as hung: scheduling delay on a
/// shared 2-core machine, not the limiter's. Still well under every stall these tests cause
/// (0.5 s and more), so a request that waited for Redis instead of its deadline fails.
const SLACK: Duration = Duration::from_millis(200);

/// How soon after Redis is healthy again every load task must be deciding from it.
const BACK_WITHIN: Duration = Duration::from_secs(1);

/// What one load run saw.
#[derive(Debug, Default)]
struct Seen {
    answered: u64,
    degraded: u64,
    degraded_allowed: u64,
    errors: u64,
    slowest: Duration,
    /// Per key: admissions made by the local fallback.
    local_admitted: std::collections::HashMap<String, u64>,
    /// When every task had its first non-degraded decision after `mark`, measured from `mark`:
    /// the slowest task's time; `None` when any task never got one.
    back_after: Option<Duration>,
}

/// 8 tasks check keys `k0`..`k7` in a loop until `stop`; `mark` (set by the test when Redis is
/// back) starts the recovery clock.
async fn load(
    limiter: Arc<Limiter<RedisBackend>>,
    quota: Quota,
    stop: Arc<AtomicBool>,
    mark: Arc<std::sync::Mutex<Option<Instant>>>,
) -> Seen {
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (limiter, stop, mark) = (Arc::clone(&limiter), Arc::clone(&stop), Arc::clone(&mark));
            tokio::spawn(async move {
                let key = format!("k{i}");
                let mut seen = Seen::default();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let result = limiter.check(&key, &quota).await;
                    seen.slowest = seen.slowest.max(t.elapsed());
                    seen.answered += 1;
                    match result {
                        Ok(Decision { degraded: Some(policy), allowed, .. }) => {
                            seen.degraded += 1;
                            seen.degraded_allowed += u64::from(allowed);
                            if matches!(policy, FailurePolicy::Local { .. }) && allowed {
                                *seen.local_admitted.entry(key.clone()).or_default() += 1;
                            }
                        }
                        Ok(_) => {
                            let marked = *mark.lock().expect("mark");
                            if let (Some(m), None) = (marked, seen.back_after) {
                                seen.back_after = Some(m.elapsed());
                            }
                        }
                        Err(_) => seen.errors += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                seen
            })
        })
        .collect();
    let mut total = Seen { back_after: Some(Duration::ZERO), ..Seen::default() };
    for t in tasks {
        let s = t.await.expect("task");
        total.answered += s.answered;
        total.degraded += s.degraded;
        total.degraded_allowed += s.degraded_allowed;
        total.errors += s.errors;
        total.slowest = total.slowest.max(s.slowest);
        total.local_admitted.extend(s.local_admitted);
        // Every task must be back: one that never was makes the whole run `None`.
        total.back_after = total.back_after.zip(s.back_after).map(|(a, b)| a.max(b));
    }
    total
}

fn report(name: &str, seen: &Seen) {
    let _ = writeln!(
        std::io::stderr(),
        "fault {name}: answered {}, degraded {} ({} admitted), errors {}, slowest {:?}, every task from Redis again after {:?}",
        seen.answered,
        seen.degraded,
        seen.degraded_allowed,
        seen.errors,
        seen.slowest,
        seen.back_after
    );
}

/// Runs the load while `fault` does its harm; `fault` returns when Redis should be healthy
/// again and the recovery clock starts.
async fn under_load<F: Future<Output = ()>>(
    limiter: Limiter<RedisBackend>,
    quota: Quota,
    fault: impl FnOnce() -> F,
) -> Seen {
    let (stop, mark) = (Arc::new(AtomicBool::new(false)), Arc::new(std::sync::Mutex::new(None)));
    let running = tokio::spawn(load(Arc::new(limiter), quota, Arc::clone(&stop), Arc::clone(&mark)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    fault().await;
    *mark.lock().expect("mark") = Some(Instant::now());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    running.await.expect("load")
}

async fn limiter(server: &RedisServer, policy: FailurePolicy) -> Limiter<RedisBackend> {
    let backend = RedisBackend::connect(&server.url()).await.expect("connect").with_timeout(DEADLINE);
    Limiter::new(backend).with_failure_policy(policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_and_restarted_under_each_policy() {
    let quota = Quota::per_minute(10).expect("valid");
    for policy in [FailurePolicy::FailOpen, FailurePolicy::FailClosed, FailurePolicy::local(0.5).expect("valid")] {
        let mut server = RedisServer::start();
        let port = server.port();
        let limiter = limiter(&server, policy).await;
        let mut restarted = None;
        let seen = under_load(limiter, quota, || async {
            server.kill();
            tokio::time::sleep(Duration::from_millis(700)).await;
            restarted = Some(RedisServer::start_on(port));
        })
        .await;
        report(&format!("kill -9 and restart, {policy}"), &seen);
        assert_eq!(seen.errors, 0, "{policy}: the policy answers every request");
        assert!(seen.degraded > 0, "{policy}: Redis was down");
        assert!(seen.slowest <= DEADLINE + SLACK, "{policy}: slowest {:?}", seen.slowest);
        let back = seen.back_after.unwrap_or_else(|| panic!("{policy}: every task decides from Redis again"));
        assert!(back <= BACK_WITHIN, "{policy}: every task back after {back:?}");
        match policy {
            FailurePolicy::FailOpen => assert_eq!(seen.degraded_allowed, seen.degraded, "fail_open admits"),
            FailurePolicy::FailClosed => assert_eq!(seen.degraded_allowed, 0, "fail_closed denies"),
            _ => {
                // Half of 10 per minute, per key, decided in this process while Redis was away.
                assert!(seen.local_admitted.values().all(|&n| n <= 5), "{:?}", seen.local_admitted);
                assert!(seen.local_admitted.values().any(|&n| n == 5), "{:?}", seen.local_admitted);
            }
        }
        drop(restarted);
    }
}

#[tokio::test]
async fn local_auto_decides_at_its_fallback_until_the_fleet_is_counted_then_at_the_limit_over_the_fleet() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::local_auto(0.5).expect("valid")).await;
    server.kill();
    let quota = Quota::per_minute(12).expect("valid");
    let admitted = |key: &'static str| {
        let limiter = &limiter;
        async move {
            let mut n = 0;
            for _ in 0..20 {
                let d = limiter.check(key, &quota).await.expect("the policy answers");
                assert_eq!(d.degraded, Some(FailurePolicy::LocalAuto { fallback_permille: 500 }));
                n += u32::from(d.allowed);
            }
            n
        }
    };
    assert_eq!(admitted("never-counted").await, 6, "the fallback: half of 12");
    limiter.fleet().expect("a guarded limiter").set_live(4);
    assert_eq!(admitted("counted").await, 3, "12 over a fleet of 4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_client_kill_mid_load_are_absorbed() {
    let server = RedisServer::start();
    let quota = Quota::per_minute(slidegate::MAX_LOG_LIMIT).expect("valid");
    let seen = under_load(limiter(&server, FailurePolicy::FailClosed).await, quota, || async {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut server.conn()).expect("flush");
    })
    .await;
    report("SCRIPT FLUSH", &seen);
    assert_eq!((seen.errors, seen.degraded), (0, 0), "NOSCRIPT is recovered inside the call");

    let mut killed: u64 = 0;
    let seen = under_load(limiter(&server, FailurePolicy::FailClosed).await, quota, || async {
        // `SKIPME yes` (the default) spares the connection sending the kill: what is killed is
        // the limiter's.
        killed = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").query(&mut server.conn()).expect("kill");
    })
    .await;
    report("CLIENT KILL", &seen);
    assert!(killed >= 1, "CLIENT KILL found the limiter's connection to kill");
    assert_eq!(seen.errors, 0);
    assert!(seen.slowest <= DEADLINE + SLACK, "slowest {:?}", seen.slowest);
    assert!(seen.back_after.is_some_and(|b| b <= BACK_WITHIN), "every task reconnected: {:?}", seen.back_after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_costs_each_request_the_deadline_at_most() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let quota = Quota::per_minute(slidegate::MAX_LOG_LIMIT).expect("valid");
    let stalled = server.url();
    let seen = under_load(limiter(&server, FailurePolicy::FailOpen).await, quota, || async move {
        // DEBUG SLEEP blocks Redis for 0.5 s; sent from a thread so this task does not wait.
        std::thread::spawn(move || {
            let mut conn = redis::Client::open(stalled).and_then(|c| c.get_connection()).expect("conn");
            let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg("0.5").query(&mut conn);
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
    })
    .await;
    report("DEBUG SLEEP 0.5", &seen);
    assert_eq!(seen.errors, 0);
    assert!(seen.degraded > 0 && seen.degraded_allowed == seen.degraded, "fail_open while stalled");
    assert!(seen.slowest <= DEADLINE + SLACK, "slowest {:?}", seen.slowest);
    assert!(seen.back_after.is_some_and(|b| b <= BACK_WITHIN), "every task back: {:?}", seen.back_after);
}

/// The breaker's deadline: long, so that "waited for it" and "answered at once" stay far apart
/// on a loaded machine (how fast an open circuit answers is a benchmark's figure), yet short
/// enough that the three waits end before the connection's own silence check replaces it.
const BREAKER_DEADLINE: Duration = Duration::from_millis(200);

#[tokio::test]
async fn an_open_circuit_answers_without_waiting_for_the_deadline() {
    let mut server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let backend = RedisBackend::connect(&server.url()).await.expect("connect").with_timeout(BREAKER_DEADLINE);
    let limiter = Limiter::new(backend)
        .with_failure_policy(FailurePolicy::FailClosed)
        .with_circuit_breaker(3, Duration::from_secs(5));
    let quota = Quota::per_minute(100).expect("valid");
    // A stalled Redis: calls wait for the deadline until the breaker opens. The stall (5 s)
    // outlasts the three waits with room for a slow machine.
    let url = server.url();
    std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).and_then(|c| c.get_connection()).expect("conn");
        let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg("5").query(&mut conn);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        let d = limiter.check("k", &quota).await.expect("policy");
        waits.push(t.elapsed());
        assert_eq!((d.allowed, d.degraded), (false, Some(FailurePolicy::FailClosed)));
    }
    report_waits(&waits);
    let waited = BREAKER_DEADLINE - Duration::from_millis(10);
    assert!(waits[..3].iter().all(|w| *w >= waited), "closed: each call waits the deadline");
    assert!(limiter.circuit_open());
    // Far under the deadline: the open circuit did not wait for the stalled Redis.
    assert!(waits[3..].iter().all(|w| *w < BREAKER_DEADLINE / 2), "open: answered without waiting");
    server.kill();
}

#[tokio::test]
async fn a_probe_whose_caller_gave_up_does_not_hold_the_circuit_open() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let backend = RedisBackend::connect(&server.url()).await.expect("connect").with_timeout(Duration::from_millis(200));
    let open_for = Duration::from_millis(100);
    let limiter =
        Limiter::new(backend).with_failure_policy(FailurePolicy::FailClosed).with_circuit_breaker(1, open_for);
    let quota = Quota::per_minute(100).expect("valid");
    let url = server.url();
    let stall = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).and_then(|c| c.get_connection()).expect("conn");
        let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg("1").query(&mut conn);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A stalled Redis misses the deadline: the circuit opens.
    let d = limiter.check("k", &quota).await.expect("policy");
    assert_eq!(d.degraded, Some(FailurePolicy::FailClosed));
    assert!(limiter.circuit_open());
    // The attack: the caller let through as the probe gives up before the probe can report.
    tokio::time::sleep(open_for * 2).await;
    let dropped = tokio::time::timeout(Duration::from_millis(20), limiter.check("k", &quota)).await;
    assert!(dropped.is_err(), "the probe was waiting on the stalled Redis: {dropped:?}");
    stall.join().expect("stall");
    // Redis is back: a later call probes, and Redis decides again.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(open_for).await;
        let d = limiter.check("k", &quota).await.expect("answered");
        if d.degraded.is_none() {
            break;
        }
        assert!(Instant::now() < until, "the circuit stayed open after Redis came back: {d:?}");
    }
    assert!(!limiter.circuit_open());
}

fn report_waits(waits: &[Duration]) {
    let _ = writeln!(std::io::stderr(), "fault breaker: waits per request while Redis stalls {waits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_load_is_followed() {
    let mut setup = slidegate_testkit::RedisSentinel::start();
    let url = setup.sentinel_url();
    let backend = RedisBackend::connect_sentinel(&[url.as_str()], slidegate_testkit::SENTINEL_SERVICE)
        .await
        .expect("connect through the sentinel")
        .with_timeout(DEADLINE);
    let limiter = Limiter::new(backend).with_failure_policy(FailurePolicy::FailOpen);
    let quota = Quota::per_minute(3).expect("valid");
    let first: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(limiter.check("exact", &quota).await.expect("check").allowed);
        }
        v
    };
    assert_eq!(first, [true, true, true, false], "exact through the sentinel's master");
    let old = setup.master.port();
    setup.master.kill();
    let killed = Instant::now();
    let (mut answered, mut degraded, mut slowest, mut back) = (0u32, 0u32, Duration::ZERO, None);
    while killed.elapsed() < Duration::from_secs(30) {
        let t = Instant::now();
        let d = limiter
            .check("load", &Quota::per_minute(slidegate::MAX_LOG_LIMIT).expect("valid"))
            .await
            .expect("policy answers");
        slowest = slowest.max(t.elapsed());
        answered += 1;
        if d.degraded.is_some() {
            degraded += 1;
        } else if degraded > 0 {
            back = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = writeln!(
        std::io::stderr(),
        "fault sentinel failover: answered {answered}, degraded {degraded}, slowest {slowest:?}, from the new master after {back:?}"
    );
    let back = back.expect("decisions from the promoted replica");
    assert!(back < Duration::from_secs(20), "back after {back:?}");
    let promoted = setup.replica.port();
    assert_eq!(setup.master_port(), Some(promoted), "the sentinel promoted the replica (the master was {old})");
    assert!(slowest <= DEADLINE + SLACK, "slowest {slowest:?}");
}
