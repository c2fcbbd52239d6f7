//! `RedisBackend::with_replicas_ack` on a real master and replica, standalone (Lua engine and
//! module) and under Sentinel: an admission is answered once the replica holds it — its
//! sorted set on the replica counts it at the moment the caller hears of it — a denial needs no
//! replica, and with the replica killed an admission is a backend failure
//! (`Error::ReplicasAck`) that the failure policy answers, in time. Charges and refunds, which
//! write as admissions do, alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use slidegate::{Backend, Check, Error, FailurePolicy, Limiter, Quota, RedisBackend, RedisEngine};
use slidegate_testkit::{RedisSentinel, RedisServer, SENTINEL_SERVICE, Stall};

/// Five times the default deadline: the `WAIT`'s own timeout (half of it, timed by Redis' event
/// loop) is what must end it, not the call's deadline, on a machine busy enough to hold Redis
/// off the CPU for tens of milliseconds.
const DEADLINE: Duration = Duration::from_millis(250);

/// What a call may take past the deadline: scheduling on a shared 2-core machine. Far less
/// than a `WAIT` without a timeout would hold it (for ever), so a call that waited fails.
const SLACK: Duration = Duration::from_millis(200);

/// What every setup must show, on `backend` (with `replicas_ack = 1`) over a master whose one
/// replica is `replica`.
async fn acknowledged_then_refused<C>(
    name: &str,
    backend: RedisBackend<C>,
    master: &RedisServer,
    replica: &mut RedisServer,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    master.wait_for_replicas(1);
    // Redis times a blocked `WAIT` out on its event loop's next pass, up to 1 / hz later: at
    // 100 Hz within the deadline's other half.
    let _: () = master.query(&["CONFIG", "SET", "hz", "100"]);
    let backend = backend.with_timeout(DEADLINE).with_replicas_ack(1);
    assert_eq!(backend.replicas_ack(), 1);
    let quota = Quota::per_minute(3).expect("valid");
    let redis_key = backend.redis_key("k", quota.algorithm());
    // Acknowledged means applied on the replica: read there at once, the scripts' sorted set
    // counts them all (the module's key, of its own type, is there).
    let on_replica = |redis_key: &str, permits: u64| -> u64 {
        match replica.query::<String>(&["TYPE", redis_key]).as_str() {
            "zset" => replica.query(&["ZCARD", redis_key]),
            "none" => 0,
            _ => permits,
        }
    };
    for admitted in 1..=3 {
        let d = backend.check("k", &quota, 1).await.expect("admitted");
        assert!(d.allowed, "{name}: admission {admitted}");
        assert_eq!(on_replica(&redis_key, admitted), admitted, "{name}: what the replica holds");
    }
    let group = [Check { key: "g", quota, cost: 1 }, Check { key: "h", quota, cost: 1 }];
    assert!(backend.check_all(&group).await.expect("group admitted").allowed, "{name}: a group");
    // A charge and a refund change the key as an admission does: acknowledged alike.
    let charged_key = backend.redis_key("c", quota.algorithm());
    assert_eq!(backend.charge("c", &quota, 2).await.expect("charged").recorded, 2, "{name}");
    assert_eq!(on_replica(&charged_key, 2), 2, "{name}: the charge on the replica");
    assert_eq!(backend.refund("c", &quota, 1).await.expect("refunded").refunded, 1, "{name}");
    assert_eq!(on_replica(&charged_key, 1), 1, "{name}: the refund on the replica");
    replica.kill();
    // A denial records nothing a failover could lose: answered without the replica.
    let d = backend.check("k", &quota, 1).await.expect("denied without a WAIT");
    assert!(!d.allowed, "{name}: the key is spent");
    // An admission is not acknowledged: a backend failure, in time, for the policy to answer.
    let t = Instant::now();
    let refused = backend.check("fresh", &quota, 1).await;
    let took = t.elapsed();
    assert!(took <= DEADLINE + SLACK, "{name}: took {took:?}");
    assert!(
        matches!(refused, Err(Error::ReplicasAck { wanted: 1, acked: 0 })),
        "{name}: no replica acknowledged: {refused:?}"
    );
    assert!(refused.as_ref().is_err_and(Error::is_backend_failure), "{name}: a backend failure");
    let refused = backend.check_all(&group.map(|c| Check { key: "other", ..c })[..1]).await;
    assert!(matches!(refused, Err(Error::ReplicasAck { .. })), "{name}: a group too: {refused:?}");
    let charged = backend.charge("c", &quota, 1).await;
    assert!(matches!(charged, Err(Error::ReplicasAck { .. })), "{name}: a charge too: {charged:?}");
    let refunded = backend.refund("c", &quota, 2).await;
    assert!(matches!(refunded, Err(Error::ReplicasAck { .. })), "{name}: a refund too: {refunded:?}");
    let limiter = Limiter::new(backend).with_failure_policy(FailurePolicy::FailClosed);
    let d = limiter.check("fresh-2", &quota).await.expect("the policy answers");
    assert_eq!((d.allowed, d.degraded), (false, Some(FailurePolicy::FailClosed)), "{name}");
    eprintln!("replicas_ack {name}: acknowledged with the replica, refused in {took:?} without it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_wait_for_the_replica_and_fail_without_it_standalone() {
    for (engine, module) in [(RedisEngine::Lua, false), (RedisEngine::Module, true)] {
        let start = |extra: &[&str]| {
            if module { RedisServer::start_with_module(extra) } else { RedisServer::start_with(extra) }
        };
        let master = start(&[]);
        let mut replica = start(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        let backend = RedisBackend::connect(&master.url()).await.expect("connect").with_engine(engine);
        acknowledged_then_refused(&format!("standalone, {engine:?}"), backend, &master, &mut replica).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_wait_for_the_replica_and_fail_without_it_under_sentinel() {
    let mut setup = RedisSentinel::start();
    let url = setup.sentinel_url();
    let backend = RedisBackend::connect_sentinel(&[url.as_str()], SENTINEL_SERVICE).await.expect("connect");
    acknowledged_then_refused("sentinel", backend, &setup.master, &mut setup.replica).await;
}

/// A master, its replica in sync, and a backend on the master asking each admission to wait for
/// the replica, within `deadline`, on the Lua engine.
async fn master_and_replica(deadline: Duration) -> (RedisServer, RedisServer, RedisBackend) {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    master.wait_for_replicas(1);
    let backend = RedisBackend::connect(&master.url()).await.expect("connect");
    let backend = backend.with_timeout(deadline).with_engine(RedisEngine::Lua).with_replicas_ack(1);
    (master, replica, backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_in_flight_together_share_their_waits_and_each_is_on_the_replica_when_answered() {
    const CALLS: u64 = 64;
    let (master, replica, backend) = master_and_replica(DEADLINE).await;
    let quota = Quota::per_minute(3).expect("valid");
    let replica = Arc::new(replica);
    let start = Arc::new(tokio::sync::Barrier::new(CALLS as usize));
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let (backend, replica, start) = (backend.clone(), Arc::clone(&replica), Arc::clone(&start));
            tokio::spawn(async move {
                let key = backend.redis_key(&format!("k{i}"), quota.algorithm());
                start.wait().await;
                let d = backend.check(&format!("k{i}"), &quota, 1).await.expect("admitted");
                let held = tokio::task::spawn_blocking(move || replica.query::<u64>(&["ZCARD", &key]));
                (d.allowed, held.await.expect("read on the replica"))
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.expect("task"), (true, 1), "answered only once the replica held it");
    }
    let stats: String = master.query(&["INFO", "commandstats"]);
    let waits: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("WAIT was sent");
    assert!(waits < CALLS, "{waits} WAITs for {CALLS} admissions in flight together: none shared");
    eprintln!("{CALLS} admissions in flight together: {waits} WAITs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_whose_connection_is_lost_before_their_wait_are_not_acknowledged_on_the_next_one() {
    const CALLS: usize = 32;
    let (master, replica, backend) = master_and_replica(Duration::from_secs(2)).await;
    let quota = Quota::per_minute(3).expect("valid");
    // The replica stops acknowledging: the first WAIT waits out its timeout, the others queue.
    replica.pause(Stall::Process);
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let backend = backend.clone();
            tokio::spawn(async move { backend.check(&format!("k{i}"), &quota, 1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Their connection is lost: a new one has written nothing, and a bare WAIT on it would be
    // answered at once with every replica.
    let killed: u64 = master.query(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed >= 1, "the backend's connection");
    let mut acknowledged = 0;
    for call in calls {
        let answer = call.await.expect("task");
        assert!(answer.as_ref().is_err_and(Error::is_backend_failure), "a failure for the policy: {answer:?}");
        acknowledged += usize::from(answer.is_ok());
    }
    replica.resume(Stall::Process);
    assert_eq!(acknowledged, 0, "no admission acknowledged by a replica that holds none of them");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_redis_ends_as_its_master_is_demoted_is_a_failure_for_the_policy() {
    let (master, replica, backend) = master_and_replica(Duration::from_secs(2)).await;
    let elsewhere = RedisServer::start();
    let quota = Quota::per_minute(3).expect("valid");
    replica.pause(Stall::Process);
    let call = tokio::spawn({
        let backend = backend.clone();
        async move { backend.check("k", &quota, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Its WAIT is blocked; the master becomes a replica: Redis ends the WAIT with an error.
    let _: () = master.query(&["REPLICAOF", "127.0.0.1", &elsewhere.port().to_string()]);
    let answer = call.await.expect("task");
    replica.resume(Stall::Process);
    assert!(answer.as_ref().is_err_and(Error::is_backend_failure), "for the failure policy: {answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_before_each_wait_touches_no_callers_key() {
    let (_master, _replica, backend) = master_and_replica(DEADLINE).await;
    let quota = Quota::per_minute(3).expect("valid");
    for key in ["ack", "replicas-ack", ".ack", "slidegate.ack"] {
        for admitted in 1..=2 {
            let d = backend.check(key, &quota, 1).await.expect("admitted, its key still a sorted set");
            assert_eq!((d.allowed, d.remaining), (true, 3 - admitted), "{key}");
        }
    }
}

/// A write-back's write that the master ran and its replica did not acknowledge is written, not
/// sent again at the next probe: sent at each, it would count once per probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_its_replica_does_not_acknowledge_counts_once_however_many_probes_follow() {
    let (_master, replica, backend) = master_and_replica(DEADLINE).await;
    let policy = FailurePolicy::local(0.5).expect("policy");
    let limiter = Limiter::new(backend.clone()).with_failure_policy(policy).with_write_back();
    let quota = Quota::per_minute(10).expect("valid");
    replica.pause(Stall::Process);
    let mut local = 0;
    for _ in 0..10 {
        let d = limiter.check("wb", &quota).await.expect("answered by the policy");
        assert!(d.degraded.is_some(), "{d:?}");
        local += u64::from(d.allowed);
    }
    // The checks that reached the master before the circuit opened are on it, unacknowledged.
    let before = backend.inspect("wb", &quota).await.expect("the master answers").count;
    let (open_for, probing) = (slidegate::CircuitBreaker::default().open_for(), Instant::now());
    while probing.elapsed() < open_for * 8 {
        limiter.write_back().await;
        tokio::time::sleep(open_for / 4).await;
    }
    replica.resume(Stall::Process);
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.write_back().await.pending > 0 {
        assert!(Instant::now() < deadline, "still pending");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = backend.inspect("wb", &quota).await.expect("the master answers").count;
    assert_eq!((local, after), (5, before + local), "each local admission written once");
}
