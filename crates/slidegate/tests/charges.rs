//! Charges and refunds ([`Limiter::charge`], [`Limiter::refund`]) mixed with checks, on every
//! algorithm: each engine answers what the specification does (`slidegate::spec`, "Charges and
//! refunds") — the standing decision, what was recorded, what was given back — and concurrent
//! charges sum exactly: memory, the Lua scripts (`charge.lua`: fixed windows and GCRAs;
//! `charge_log.lua`: sliding logs, in both of their forms; `sliding_window.lua`: sliding window
//! counters; each with or without a warm-up, beside `check.lua`'s checks of the same keys),
//! slidegate's module (`SLIDEGATE.CHARGE`, `SLIDEGATE.REFUND`), and a Redis Cluster on each.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use slidegate::spec::Key;
use slidegate::{
    Algorithm, Backend, Charged, Check, Decision, FailurePolicy, Limiter, MAX_CHARGE_FACTOR, ManualClock,
    MemoryBackend, Quota, RedisBackend, RedisEngine, Refunded,
};
use slidegate_testkit::{RedisCluster, RedisServer};

const EPOCH_2026: u64 = 1_795_000_000_000;

const ALL: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow { buckets: 10 },
    Algorithm::FixedWindow,
    Algorithm::Gcra { burst: None },
];

async fn lua(server: &RedisServer, clock: &ManualClock) -> Limiter<RedisBackend> {
    on_engine(server, clock, RedisEngine::Lua).await
}

async fn on_engine(server: &RedisServer, clock: &ManualClock, engine: RedisEngine) -> Limiter<RedisBackend> {
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    Limiter::new(backend.with_clock(clock.clone()).with_timeout(Duration::from_secs(5)).with_engine(engine))
}

/// What one step asks.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    Charge(u64),
    Refund(u64),
}

/// What one step answers: the decision, and the permits recorded (a check's cost when admitted,
/// a charge's `recorded`) or given back (a refund's, negated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outcome {
    decision: Decision,
    permits: i64,
    clamped: bool,
}

impl Outcome {
    fn checked(decision: Decision, cost: u64) -> Self {
        let permits = if decision.allowed { cost as i64 } else { 0 };
        Self { decision, permits, clamped: false }
    }

    fn charged(c: Charged) -> Self {
        Self { decision: c.decision, permits: c.recorded as i64, clamped: c.clamped }
    }

    fn refunded(r: Refunded) -> Self {
        Self { decision: r.decision, permits: -(r.refunded as i64), clamped: false }
    }
}

#[derive(Debug, Clone)]
struct Scenario {
    quota: Quota,
    steps: Vec<(u64, Op)>,
}

impl Scenario {
    fn specified(&self) -> Vec<Outcome> {
        let mut key = Key::new(self.quota.algorithm());
        let q = &self.quota;
        self.steps
            .iter()
            .map(|&(t, op)| {
                let now = EPOCH_2026 + t;
                match op {
                    Op::Check(cost) => Outcome::checked(key.check(now, q, cost), cost),
                    Op::Charge(cost) => Outcome::charged(key.charge(now, q, cost)),
                    Op::Refund(cost) => Outcome::refunded(key.refund(now, q, cost)),
                }
            })
            .collect()
    }

    async fn run<B: Backend>(&self, limiter: &Limiter<B>, clock: &ManualClock, key: &str) -> Vec<Outcome> {
        let mut out = Vec::new();
        for &(t, op) in &self.steps {
            clock.set_ms(EPOCH_2026 + t);
            let q = &self.quota;
            out.push(match op {
                Op::Check(cost) => Outcome::checked(limiter.check_cost(key, q, cost).await.expect("check"), cost),
                Op::Charge(cost) => Outcome::charged(limiter.charge(key, q, cost).await.expect("charge")),
                Op::Refund(cost) => Outcome::refunded(limiter.refund(key, q, cost).await.expect("refund")),
            });
        }
        out
    }

    fn assert_agrees(&self, name: &str, got: &[Outcome]) {
        for (i, (got, expected)) in got.iter().zip(self.specified()).enumerate() {
            assert_eq!(
                *got,
                expected,
                "{name} differs from spec; {:?}, steps up to #{i}: {:?}",
                self.quota,
                &self.steps[..=i]
            );
        }
    }
}

fn quota(limit: u64, window_ms: u64, algorithm: Algorithm) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms)).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
}

/// Any algorithm, with a warm-up (period ms, cold thousandths) as `warm_up` draws it; small
/// limits (so that charges reach the bound) and limits above 256 (a Lua sliding log's counted
/// entries).
fn quotas(warm_up: BoxedStrategy<Option<(u64, u64)>>) -> impl Strategy<Value = Quota> {
    let algorithm = prop_oneof![
        Just(Algorithm::SlidingLog),
        (1u32..=10).prop_map(|buckets| Algorithm::SlidingWindow { buckets }),
        Just(Algorithm::FixedWindow),
        prop::option::of(1u64..=30).prop_map(|burst| Algorithm::Gcra { burst }),
    ];
    let limit = prop_oneof![4 => 1u64..=20, 1 => 257u64..=2_000];
    (limit, 1u64..=300, 1u64..=10, algorithm, warm_up).prop_filter_map(
        "the warm-up leaves an idle key room for a permit",
        |(limit, bucket_ms, buckets, algorithm, warm_up)| {
            let window_ms = match algorithm {
                Algorithm::SlidingWindow { buckets } => bucket_ms * u64::from(buckets),
                _ => bucket_ms * buckets,
            };
            let q = quota(limit, window_ms, algorithm);
            match warm_up {
                None => Some(q),
                Some((period, cold)) => q.with_warm_up(Duration::from_millis(period), cold as f64 / 1000.0).ok(),
            }
        },
    )
}

/// Scenarios of one key, a fifth of them with a warm-up.
fn scenarios() -> impl Strategy<Value = Scenario> {
    scenarios_of(prop::option::weighted(0.2, warm_ups()).boxed())
}

/// A warm-up's period in ms and cold share in thousandths.
fn warm_ups() -> impl Strategy<Value = (u64, u64)> {
    (1u64..=3_000, 1u64..=1_000)
}

fn scenarios_of(warm_up: BoxedStrategy<Option<(u64, u64)>>) -> impl Strategy<Value = Scenario> {
    quotas(warm_up).prop_flat_map(|quota| {
        let window_ms = quota.window_ms();
        let gap = prop_oneof![4 => 0..=window_ms / 4, 1 => 0..=window_ms * 2];
        let max = quota.max_cost();
        let cost = prop_oneof![3 => 1..=max.min(max / 10 + 1), 1 => 1..=max];
        let op = (0u8..6, cost).prop_map(|(kind, cost)| match kind {
            0 | 1 => Op::Check(cost),
            2..=4 => Op::Charge(cost),
            _ => Op::Refund(cost),
        });
        prop::collection::vec((gap, op), 1..60).prop_map(move |steps| {
            let mut t = 0;
            let steps = steps
                .into_iter()
                .map(|(gap, op)| {
                    t += gap;
                    (t, op)
                })
                .collect();
            Scenario { quota, steps }
        })
    })
}

fn run_property(cases: u32, strategy: impl Strategy<Value = Scenario>, agree: impl Fn(Scenario, u32)) {
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&strategy, |s| {
            agree(s, case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            Ok(())
        })
        .expect("every engine agrees with the spec");
}

#[test]
fn memory_charges_and_refunds_agree_with_the_spec() {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let clock = ManualClock::new(0);
    let memory = Limiter::new(MemoryBackend::with_clock(clock.clone()));
    run_property(512, scenarios(), |s, n| {
        let got = rt.block_on(s.run(&memory, &clock, &format!("prop{n}")));
        s.assert_agrees("memory", &got);
    });
}

#[test]
fn lua_charges_and_refunds_agree_with_the_spec() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (server, clock) = (RedisServer::start(), ManualClock::new(0));
    let redis = rt.block_on(lua(&server, &clock));
    run_property(384, scenarios(), |s, n| {
        let got = rt.block_on(s.run(&redis, &clock, &format!("prop{n}")));
        s.assert_agrees("redis (Lua)", &got);
        assert_expires(&server, &format!("prop{n}"), &s);
    });
}

/// Every Redis key of `key` that a scenario left expires: none kept forever.
fn assert_expires(server: &RedisServer, key: &str, s: &Scenario) {
    let names: Vec<String> = server.query(&["KEYS", &format!("*:{key}")]);
    for name in names {
        let ttl: i64 = server.query(&["PTTL", &name]);
        assert!(ttl > 0, "{name} has no expiry ({ttl}) after {:?}, steps {:?}", s.quota, s.steps);
    }
}

/// A warm-up's start is kept by `check.lua` (a sliding log's member scored -inf, a sliding
/// window's value of kind 2, a hash's `s`) and by the charge scripts alike: a charge into an
/// idle key starts the ramp, and each answers by the ramp the other started.
#[test]
fn lua_charges_and_refunds_under_a_warm_up_agree_with_the_spec() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (server, clock) = (RedisServer::start(), ManualClock::new(0));
    let redis = rt.block_on(lua(&server, &clock));
    run_property(256, scenarios_of(warm_ups().prop_map(Some).boxed()), |s, n| {
        let got = rt.block_on(s.run(&redis, &clock, &format!("warm{n}")));
        s.assert_agrees("redis (Lua), warm-up", &got);
        assert_expires(&server, &format!("warm{n}"), &s);
    });
}

#[tokio::test]
async fn lua_estimate_charge_refund() {
    let (server, clock) = (RedisServer::start(), ManualClock::new(0));
    estimate_charge_refund(&lua(&server, &clock).await, &clock, "tokens", &ALL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lua_concurrent_charges_sum_exactly() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.expect("connect").with_engine(RedisEngine::Lua);
    concurrent_charges_sum_exactly(Limiter::new(backend), "many", &ALL).await;
}

#[test]
fn module_charges_and_refunds_agree_with_the_spec() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (server, clock) = (RedisServer::start_with_module(&[]), ManualClock::new(0));
    let module = rt.block_on(on_engine(&server, &clock, RedisEngine::Module));
    let lua = rt.block_on(lua(&server, &clock));
    run_property(256, scenarios(), |s, n| {
        let got = rt.block_on(s.run(&module, &clock, &format!("prop{n}")));
        s.assert_agrees("redis (module)", &got);
        // What the scripts started, the module carries on: a key they wrote is converted.
        let (key, half) = (format!("handover{n}"), s.steps.len() / 2);
        let (first, second) = s.steps.split_at(half);
        let mut got = rt.block_on(Scenario { steps: first.to_vec(), ..s.clone() }.run(&lua, &clock, &key));
        got.extend(rt.block_on(Scenario { steps: second.to_vec(), ..s.clone() }.run(&module, &clock, &key)));
        s.assert_agrees("Lua then the module", &got);
    });
}

#[tokio::test]
async fn module_estimate_charge_refund() {
    let (server, clock) = (RedisServer::start_with_module(&[]), ManualClock::new(0));
    estimate_charge_refund(&on_engine(&server, &clock, RedisEngine::Module).await, &clock, "tokens", &ALL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn module_concurrent_charges_sum_exactly() {
    let server = RedisServer::start_with_module(&[]);
    let backend = RedisBackend::connect(&server.url()).await.expect("connect").with_engine(RedisEngine::Module);
    concurrent_charges_sum_exactly(Limiter::new(backend), "many", &ALL).await;
}

/// On a Cluster the scripts and the module take the key as `KEYS[1]` / their first argument:
/// each call goes to the key's master. Keys spread over three masters sum exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_and_refunds_on_a_cluster_reach_each_keys_master() {
    for (cluster, engine, algorithms) in [
        (RedisCluster::start(3, 0), RedisEngine::Lua, &ALL[..]),
        (RedisCluster::start_with_module(3, 0), RedisEngine::Module, &ALL[..]),
    ] {
        let urls = cluster.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let backend = RedisBackend::connect_cluster(&urls).await.expect("connect").with_engine(engine);
        let limiter = Limiter::new(backend.with_timeout(Duration::from_secs(2)));
        let keys: Vec<String> = (0..12).map(|i| format!("user{i}")).collect();
        let slots: std::collections::HashSet<_> =
            keys.iter().map(|k| cluster.master_of(slidegate::key_slot(k)).port()).collect();
        assert!(slots.len() > 1, "keys on several masters");
        for key in &keys {
            concurrent_charges_sum_exactly(limiter.clone(), key, algorithms).await;
        }
    }
}

/// A Lua sliding log changes form under charges: a key of per-permit members (limit 256 or
/// less) that a charge would leave over its limit, or whose limit was raised above 256, becomes
/// counted entries first; a counted key whose limit is lowered stays counted. Through every
/// change the answers are the specification's.
#[tokio::test]
async fn lua_sliding_logs_change_form_and_still_agree_with_the_spec() {
    let (server, clock) = (RedisServer::start(), ManualClock::new(0));
    let redis = lua(&server, &clock).await;
    let (small, large) = (quota(20, 10_000, Algorithm::SlidingLog), quota(400, 10_000, Algorithm::SlidingLog));
    let steps: [(u64, &Quota, Op); 12] = [
        (0, &small, Op::Check(5)),
        (100, &small, Op::Charge(10)),
        (200, &large, Op::Charge(300)),
        (300, &large, Op::Check(50)),
        (400, &small, Op::Check(1)),
        (500, &large, Op::Refund(120)),
        (600, &small, Op::Charge(15)),
        (700, &small, Op::Refund(20)),
        (800, &small, Op::Check(20)),
        (900, &small, Op::Charge(20)),
        (10_050, &small, Op::Check(1)),
        (10_950, &large, Op::Refund(5)),
    ];
    let mut key = Key::new(Algorithm::SlidingLog);
    for (i, &(t, q, op)) in steps.iter().enumerate() {
        let now = EPOCH_2026 + t;
        clock.set_ms(now);
        let (got, expected) = match op {
            Op::Check(c) => (
                Outcome::checked(redis.check_cost("k", q, c).await.expect("check"), c),
                Outcome::checked(key.check(now, q, c), c),
            ),
            Op::Charge(c) => (
                Outcome::charged(redis.charge("k", q, c).await.expect("charge")),
                Outcome::charged(key.charge(now, q, c)),
            ),
            Op::Refund(c) => (
                Outcome::refunded(redis.refund("k", q, c).await.expect("refund")),
                Outcome::refunded(key.refund(now, q, c)),
            ),
        };
        assert_eq!(got, expected, "step #{i}: {op:?} under {}", q.limit());
        if i < 2 {
            assert!(!counted(&server), "step #{i}: within its limit of 20, per permit");
        } else {
            assert!(counted(&server), "step #{i}: raised to 400 and charged, then counted whatever the limit");
        }
    }
    // Emptied and written afresh under the small limit, the key is per permit again, until a
    // charge would leave it over that limit.
    let now = EPOCH_2026 + 30_000;
    clock.set_ms(now);
    assert_eq!(redis.check_cost("k", &small, 5).await.expect("check"), key.check(now, &small, 5));
    assert!(!counted(&server));
    let c = redis.charge("k", &small, 20).await.expect("charge");
    assert_eq!((c, c.recorded, c.decision.allowed), (key.charge(now, &small, 20), 20, false));
    assert!(counted(&server), "over its limit: counted");
    clock.set_ms(now + 1);
    assert_eq!(redis.check("k", &small).await.expect("check"), key.check(now + 1, &small, 1));
}

/// A key a charge left over its limit, then checked in a group (`check.lua`, also on the
/// module): the group is denied by that key, charges nothing anywhere, and is admitted again
/// once the charge has left (a window and a bucket on), as in memory; sliding logs in both forms (a limit of
/// 20 kept per permit until the charge, a limit of 300 counted from the start).
#[tokio::test]
async fn a_group_reads_a_key_that_a_charge_left_over_its_limit() {
    let (server, clock) = (RedisServer::start_with_module(&[]), ManualClock::new(0));
    let memory = Limiter::new(MemoryBackend::with_clock(clock.clone()));
    let (lua, module) = (lua(&server, &clock).await, on_engine(&server, &clock, RedisEngine::Module).await);
    let mut quotas: Vec<Quota> = ALL.iter().map(|&a| quota(20, 10_000, a)).collect();
    quotas.push(quota(300, 10_000, Algorithm::SlidingLog));
    for (i, q) in quotas.iter().enumerate() {
        let (over, other) = (format!("over{i}"), format!("other{i}"));
        let group = [Check { key: &over, quota: *q, cost: 1 }, Check { key: &other, quota: *q, cost: 1 }];
        clock.set_ms(EPOCH_2026);
        for cost in [q.limit(), q.limit() - 5] {
            let expected = memory.charge(&over, q, cost).await.expect("charge");
            for (name, limiter) in [("lua", &lua), ("module", &module)] {
                let charged = limiter.charge(&format!("{name}:{over}"), q, cost).await.expect("charge");
                assert_eq!(charged, expected, "{name}, {q:?}");
            }
        }
        for t in [100, 5_000, 11_050] {
            clock.set_ms(EPOCH_2026 + t);
            let expected = memory.check_all(&group).await.expect("group");
            assert_eq!(expected.allowed, t > 11_000, "{q:?} at {t}");
            for (name, limiter) in [("lua", &lua), ("module", &module)] {
                let (o, p) = (format!("{name}:{over}"), format!("{name}:{other}"));
                let theirs = [Check { key: &o, ..group[0] }, Check { key: &p, ..group[1] }];
                assert_eq!(limiter.check_all(&theirs).await.expect("group"), expected, "{name}, {q:?} at {t}");
            }
        }
    }
}

/// Whether the sliding log `k` holds counted entries (counted_log.lua's `c…` members).
fn counted(server: &RedisServer) -> bool {
    let first: Vec<String> = server.query(&["ZRANGE", "slidegate:k", "0", "0"]);
    first.first().is_some_and(|m| m.starts_with('c'))
}

/// On Redis' clock a counted entry's tail names the key's expiry, which an admission then does
/// not set again; a refund that removes the entry that set it must not leave an older tail
/// claiming it: the newest entry always outlives its window.
#[tokio::test]
async fn a_refund_leaves_no_counted_entry_trusting_an_expiry_it_removed() {
    let server = RedisServer::start();
    let redis =
        Limiter::new(RedisBackend::connect(&server.url()).await.expect("connect").with_engine(RedisEngine::Lua));
    let q = quota(1_000, 60_000, Algorithm::SlidingLog);
    assert!(redis.check("k", &q).await.expect("check").allowed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.charge("k", &q, 10).await.expect("charge");
    redis.refund("k", &q, 10).await.expect("refund");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(redis.check("k", &q).await.expect("check").allowed);
    let ttl: i64 = server.query(&["PTTL", "slidegate:k"]);
    assert!(ttl >= 60_000, "the entry just admitted lives a window; the key expires in {ttl} ms");
    assert_eq!(redis.inspect("k", &q).await.expect("inspect").count, 2);
}

/// A per-permit key rewritten as counted entries keeps an expiry whichever script rewrites it
/// and whatever it then decides: a check that a raised limit sends to `counted_log.lua` and
/// denies, a charge under a lowered limit that records nothing. A key without one would hold
/// its entries until the next admission, if any ever came.
#[tokio::test]
async fn a_key_rewritten_as_counted_entries_still_expires() {
    let server = RedisServer::start();
    let redis =
        Limiter::new(RedisBackend::connect(&server.url()).await.expect("connect").with_engine(RedisEngine::Lua));
    let log = |limit| quota(limit, 60_000, Algorithm::SlidingLog);
    let expiry = |key: &str| -> i64 { server.query(&["PTTL", &format!("slidegate:{key}")]) };

    assert!(redis.check_cost("raised", &log(10), 5).await.expect("check").allowed);
    assert!(!redis.check_cost("raised", &log(1_000), 1_000).await.expect("check").allowed);
    assert!(redis.charge("lowered", &log(10), 10).await.expect("charge").decision.allowed);
    let c = redis.charge("lowered", &log(4), 1).await.expect("charge");
    assert_eq!((c.recorded, c.clamped), (0, true), "already past twice the lowered limit");
    for key in ["raised", "lowered"] {
        let first: Vec<String> = server.query(&["ZRANGE", &format!("slidegate:{key}"), "0", "0"]);
        assert!(first[0].starts_with('c'), "{key}: rewritten as counted entries, {first:?}");
        assert!((1..=60_000).contains(&expiry(key)), "{key}: expires in {} ms", expiry(key));
    }
}

/// Refunds that leave a key of counted entries with fewer members keep its expiry: the newest
/// left is rewritten without its tail (found by the property test's expiry check), and an entry
/// that straddles what stays is put back after the set was emptied.
#[tokio::test]
async fn refunds_that_rewrite_the_last_entries_keep_the_keys_expiry() {
    let (server, clock) = (RedisServer::start(), ManualClock::new(0));
    let redis = lua(&server, &clock).await;
    let log = |limit| quota(limit, 306, Algorithm::SlidingLog);
    let tail = Scenario {
        quota: log(6),
        steps: vec![
            (0, Op::Check(5)),
            (0, Op::Check(1)),
            (2, Op::Charge(1)),
            (306, Op::Check(1)),
            (308, Op::Check(1)),
            (308, Op::Refund(1)),
        ],
    };
    let straddle = Scenario { quota: log(600), steps: vec![(0, Op::Check(100)), (1, Op::Refund(30))] };
    for (name, s) in [("tail", tail), ("straddle", straddle)] {
        let got = s.run(&redis, &clock, name).await;
        s.assert_agrees(name, &got);
        assert_expires(&server, name, &s);
    }
}

/// The tokens-per-minute shape on every algorithm: an estimate checked, the rest charged over
/// the limit, an over-estimate refunded; a charge past twice the limit is clamped.
async fn estimate_charge_refund<B: Backend>(
    limiter: &Limiter<B>,
    clock: &ManualClock,
    key: &str,
    algorithms: &[Algorithm],
) {
    for &algorithm in algorithms {
        clock.set_ms(EPOCH_2026 - EPOCH_2026 % 60_000);
        let q = quota(1_000, 60_000, algorithm);
        let key = format!("{key}:{algorithm}");
        assert!(limiter.check_cost(&key, &q, 600).await.expect("check").allowed, "{algorithm}");
        let c = limiter.charge(&key, &q, 700).await.expect("charge");
        assert_eq!(
            (c.recorded, c.clamped, c.decision.allowed, c.decision.remaining),
            (700, false, false, 0),
            "{algorithm}"
        );
        assert!(c.decision.retry_after.is_some(), "{algorithm}: over until some leaves");
        assert!(!limiter.check(&key, &q).await.expect("check").allowed, "{algorithm}: over its limit");
        let r = limiter.refund(&key, &q, 400).await.expect("refund");
        assert_eq!((r.refunded, r.decision.allowed, r.decision.remaining), (400, true, 100), "{algorithm}");
        let c = limiter.charge(&key, &q, 1_000).await.expect("charge");
        assert_eq!((c.recorded, c.clamped, c.decision.allowed), (1_000, false, false), "{algorithm}");
        let c = limiter.charge(&key, &q, 1_000).await.expect("charge");
        assert_eq!(
            (c.recorded, c.clamped, c.decision.allowed),
            (MAX_CHARGE_FACTOR * 1_000 - 1_900, true, false),
            "{algorithm}"
        );
        for _ in 0..2 {
            assert_eq!(limiter.refund(&key, &q, 1_000).await.expect("refund").refunded, 1_000, "{algorithm}");
        }
        let r = limiter.refund(&key, &q, 1).await.expect("refund");
        assert_eq!((r.refunded, r.decision.remaining), (0, 1_000), "{algorithm}: never below nothing");
    }
}

#[tokio::test]
async fn memory_estimate_charge_refund() {
    let clock = ManualClock::new(0);
    estimate_charge_refund(&Limiter::new(MemoryBackend::with_clock(clock.clone())), &clock, "tokens", &ALL).await;
}

/// 64 tasks charging one key at once: the key holds exactly what they charged.
async fn concurrent_charges_sum_exactly<B: Backend + Clone + 'static>(
    limiter: Limiter<B>,
    key: &str,
    algorithms: &[Algorithm],
) {
    for &algorithm in algorithms {
        // A long window: nothing leaves while the tasks run. 64 × 10 × (1..=5) ≤ 3,200 of 2,000.
        let q = quota(2_000, 3_600_000, algorithm);
        let key = format!("{key}:{algorithm}");
        let tasks: Vec<_> = (0..64u64)
            .map(|task| {
                let (limiter, key) = (limiter.clone(), key.clone());
                tokio::spawn(async move {
                    let mut recorded = 0;
                    for i in 0..10 {
                        recorded += limiter.charge(&key, &q, 1 + (task + i) % 5).await.expect("charge").recorded;
                    }
                    recorded
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("task");
        }
        let asked: u64 = (0..64u64).flat_map(|task| (0..10).map(move |i| 1 + (task + i) % 5)).sum();
        assert_eq!(total, asked, "{algorithm}: within the bound, everything recorded");
        // What the key holds, read as the permits a refund can give back, to the last.
        let r = limiter.refund(&key, &q, q.max_cost()).await.expect("refund");
        let r2 = limiter.refund(&key, &q, q.max_cost()).await.expect("refund");
        assert_eq!(r.refunded + r2.refunded, total.min(2 * q.max_cost()), "{algorithm}");
        assert_eq!(
            limiter.inspect(&key, &q).await.expect("inspect").count,
            total - r.refunded - r2.refunded,
            "{algorithm}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_concurrent_charges_sum_exactly() {
    concurrent_charges_sum_exactly(Limiter::in_memory(), "many", &ALL).await;
}

#[tokio::test]
async fn a_charge_that_leaves_a_key_over_is_remembered_and_a_refund_forgets_it() {
    let limiter = Limiter::in_memory().with_near_cache(100);
    let q = Quota::per_minute(10).expect("valid");
    let c = limiter.charge("k", &q, 10).await.expect("charge");
    assert!(c.decision.allowed, "at its limit, not over");
    assert_eq!(limiter.near_cache().map(|n| n.len()), Some(0));
    let c = limiter.charge("k", &q, 1).await.expect("charge");
    assert!(!c.decision.allowed);
    assert_eq!(limiter.near_cache().map(|n| n.len()), Some(1), "remembered as a denial");
    assert!(!limiter.check("k", &q).await.expect("check").allowed);
    limiter.refund("k", &q, 5).await.expect("refund");
    assert_eq!(limiter.near_cache().map(|n| n.len()), Some(0), "forgotten");
    assert!(limiter.check("k", &q).await.expect("check").allowed, "the refund is seen at once");
}

#[tokio::test]
async fn invalid_charges_and_refunds_are_refused_as_checks_are() {
    let limiter = Limiter::in_memory();
    let q = Quota::per_minute(10).expect("valid");
    assert!(matches!(limiter.charge("k", &q, 0).await, Err(slidegate::Error::InvalidCost { cost: 0, max: 10 })));
    assert!(matches!(limiter.charge("k", &q, 11).await, Err(slidegate::Error::InvalidCost { cost: 11, max: 10 })));
    assert!(matches!(limiter.refund("", &q, 1).await, Err(slidegate::Error::EmptyKey)));
    assert!(matches!(limiter.refund("k", &q, 11).await, Err(slidegate::Error::InvalidCost { .. })));
}

/// A failure policy answers a charge the backend could not record: a local one records it on
/// the local limiter, `FailOpen` records nothing; without a policy, the error.
#[tokio::test]
async fn a_failing_backend_degrades_charges_and_refunds_by_the_policy() {
    let server = RedisServer::start();
    let url = server.url();
    let backend =
        || async { RedisBackend::connect(&url).await.expect("connect").with_timeout(Duration::from_millis(200)) };
    let (strict, open, local) = (
        Limiter::new(backend().await),
        Limiter::new(backend().await).with_failure_policy(FailurePolicy::FailOpen),
        Limiter::new(backend().await).with_failure_policy(FailurePolicy::local(0.5).expect("share")),
    );
    drop(server);
    let q = quota(10, 60_000, Algorithm::FixedWindow);
    let e = strict.charge("k", &q, 3).await.expect_err("no policy");
    assert!(e.is_backend_failure(), "{e:?}");
    assert!(strict.refund("k", &q, 3).await.expect_err("no policy").is_backend_failure());
    let c = open.charge("k", &q, 3).await.expect("fail open");
    assert_eq!((c.recorded, c.decision.allowed, c.decision.degraded), (0, true, Some(FailurePolicy::FailOpen)));
    let c = local.charge("k", &q, 7).await.expect("local");
    assert_eq!((c.recorded, c.decision.allowed, c.decision.limit), (7, false, 5), "half the limit, here");
    assert!(c.decision.degraded.is_some());
    let r = local.refund("k", &q, 3).await.expect("local");
    assert_eq!((r.refunded, r.decision.remaining), (3, 1));
}
