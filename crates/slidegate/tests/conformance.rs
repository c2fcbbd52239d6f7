//! One suite, four implementations: every timed scenario runs through the specification
//! (`slidegate::spec`), the memory backend, the Redis backend's Lua scripts and slidegate's Redis
//! module (each on the caller's clock, against a real redis-server; the module's loaded with
//! `--loadmodule`), and all must give identical decisions — `allowed`, `remaining`,
//! `reset_after`, `retry_after`, `next_permit_after`. On a fifth key each scenario starts on the scripts and finishes
//! on the module, on the same server: the module takes over what the scripts wrote without
//! losing an admission. On a sixth it starts with single checks (the one-key scripts) and
//! finishes in groups of one (`check.lua`): both scripts read and write one format. The
//! sliding-log script, which takes one of two orders per call as the backend guesses the
//! outcome, runs each scenario in both orders too, on two more keys.
//!
//! What is independent of what: for the sliding window, the fixed window and the GCRA, the
//! memory backend and the module run the specification's own code (`slidegate::state::Counter`
//! holds a `spec::Key` for them), so "memory == spec" and "module == spec" compare the model
//! with itself there: they check the plumbing around it (clocks, costs, storage, the module's
//! snapshot encoding), not the algorithm. The Lua scripts are the independent implementation of
//! every algorithm, and the sliding log's compact structure (memory and module,
//! `slidegate::state`) is independent of the specification's plain one.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use slidegate::spec::Key;
use slidegate::{
    Algorithm, Check, Decision, Limiter, ManualClock, MemoryBackend, MultiDecision, Quota, RedisBackend, RedisEngine,
};
use slidegate_testkit::RedisServer;

/// A rule and a timed sequence of requests `(ms since start, cost)`.
#[derive(Debug, Clone)]
struct Scenario {
    quota: Quota,
    start_ms: u64,
    requests: Vec<(u64, u64)>,
}

impl Scenario {
    fn specified(&self) -> Vec<Decision> {
        let mut key = Key::new(self.quota.algorithm());
        self.requests.iter().map(|&(t, cost)| key.check(self.start_ms + t, &self.quota, cost)).collect()
    }

    async fn run<B: slidegate::Backend>(&self, limiter: &Limiter<B>, clock: &ManualClock, key: &str) -> Vec<Decision> {
        self.run_as(limiter, clock, key, false).await
    }

    /// As [`Scenario::run`], or with each request a group of one check.
    async fn run_as<B: slidegate::Backend>(
        &self,
        limiter: &Limiter<B>,
        clock: &ManualClock,
        key: &str,
        in_groups: bool,
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        for &(t, cost) in &self.requests {
            clock.set_ms(self.start_ms + t);
            if in_groups {
                let group = limiter.check_all(&[Check { key, quota: self.quota, cost }]).await.expect("check_all");
                out.extend(group.decisions);
            } else {
                out.push(limiter.check_cost(key, &self.quota, cost).await.expect("check"));
            }
        }
        out
    }

    /// The scenario split in two: its first half, and its second.
    fn halves(&self) -> (Self, Self) {
        let (first, second) = self.requests.split_at(self.requests.len() / 2);
        (Self { requests: first.to_vec(), ..self.clone() }, Self { requests: second.to_vec(), ..self.clone() })
    }
}

fn quota(limit: u64, window_ms: u64, algorithm: Algorithm) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms)).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
}

struct Backends {
    clock: ManualClock,
    memory: Limiter<MemoryBackend>,
    redis: Limiter<RedisBackend>,
    /// The scripts with the sliding log's order fixed: expecting denials, then admissions.
    redis_orders: [Limiter<RedisBackend>; 2],
    /// The module, forced: a call it cannot make fails rather than falling back to Lua.
    module: Limiter<RedisBackend>,
    /// The scripts, on the module's server: a key they start, the module finishes.
    lua_on_module_server: Limiter<RedisBackend>,
    _servers: [RedisServer; 2],
}

impl Backends {
    async fn start() -> Self {
        let servers = [RedisServer::start(), RedisServer::start_with_module(&[])];
        let clock = ManualClock::new(0);
        let connect = async |server: &RedisServer, engine, fixed_order: Option<bool>| {
            let mut backend = RedisBackend::connect(&server.url()).await.expect("connect");
            if let Some(expect_denial) = fixed_order {
                backend = backend.with_fixed_order(expect_denial);
            }
            Limiter::new(backend.with_clock(clock.clone()).with_timeout(Duration::from_secs(5)).with_engine(engine))
        };
        Self {
            memory: Limiter::new(MemoryBackend::with_clock(clock.clone())),
            redis: connect(&servers[0], RedisEngine::Lua, None).await,
            redis_orders: [
                connect(&servers[0], RedisEngine::Lua, Some(true)).await,
                connect(&servers[0], RedisEngine::Lua, Some(false)).await,
            ],
            module: connect(&servers[1], RedisEngine::Module, None).await,
            lua_on_module_server: connect(&servers[1], RedisEngine::Lua, None).await,
            clock,
            _servers: servers,
        }
    }

    /// Runs `scenario` on a fresh key everywhere and returns the (identical) decisions.
    async fn agree(&self, scenario: &Scenario, key: &str) -> Vec<Decision> {
        let expected = scenario.specified();
        let memory = scenario.run(&self.memory, &self.clock, key).await;
        let redis = scenario.run(&self.redis, &self.clock, key).await;
        let mut orders = Vec::new();
        for (limiter, name) in self.redis_orders.iter().zip(["probe", "count"]) {
            orders.push(scenario.run(limiter, &self.clock, &format!("{key}:{name}")).await);
        }
        let module = scenario.run(&self.module, &self.clock, key).await;
        let half = scenario.requests.len() / 2;
        let (first, second) = scenario.halves();
        let handover_key = format!("{key}:handover");
        let mut handover = first.run(&self.lua_on_module_server, &self.clock, &handover_key).await;
        handover.extend(second.run(&self.module, &self.clock, &handover_key).await);
        let groups_key = format!("{key}:groups");
        let mut groups = first.run(&self.redis, &self.clock, &groups_key).await;
        groups.extend(second.run_as(&self.redis, &self.clock, &groups_key, true).await);
        for (i, e) in expected.iter().enumerate() {
            let (q, at) = (scenario.quota, &scenario.requests[..=i]);
            let context = format!("{q:?}, requests (ms, cost) up to #{i}: {at:?}");
            assert_eq!(&memory[i], e, "memory differs from spec; {context}");
            assert_eq!(&redis[i], e, "redis (Lua) differs from spec; {context}");
            assert_eq!(&orders[0][i], e, "redis (Lua, expecting denials) differs from spec; {context}");
            assert_eq!(&orders[1][i], e, "redis (Lua, expecting admissions) differs from spec; {context}");
            assert_eq!(&module[i], e, "redis module differs from spec; {context}");
            assert_eq!(&handover[i], e, "Lua then module (from #{half}) differs from spec; {context}");
            assert_eq!(&groups[i], e, "single checks then groups (from #{half}) differ from spec; {context}");
        }
        expected
    }
}

fn allowed(decisions: &[Decision]) -> Vec<bool> {
    decisions.iter().map(|d| d.allowed).collect()
}

const EPOCH_2026: u64 = 1_795_000_000_000;

#[tokio::test]
async fn seven_requests_half_a_second_apart() {
    let b = Backends::start().await;
    let s = Scenario {
        quota: Quota::new(5, Duration::from_secs(10)).expect("valid"),
        start_ms: EPOCH_2026,
        requests: (0..7).map(|i| (i * 500, 1)).collect(),
    };
    let d = b.agree(&s, "user_1001").await;
    assert_eq!(allowed(&d), [true, true, true, true, true, false, false]);
    assert_eq!(d.iter().map(|d| d.remaining).collect::<Vec<_>>(), [4, 3, 2, 1, 0, 0, 0]);
    // The 6th waits for the 1st (at 0 s) to leave at 10 s; it was asked at 2.5 s.
    assert_eq!(d[5].retry_after, Some(Duration::from_millis(7_500)));
    assert_eq!(d[6].retry_after, Some(Duration::from_millis(7_000)));
}

#[tokio::test]
async fn window_edge_double_burst_is_denied() {
    let b = Backends::start().await;
    // 100 per 60 s: 100 at 00:59, then 100 more at 01:01, then 100 more once the first left.
    let requests = [(59_000, 100), (61_000, 100), (119_000, 100)]
        .iter()
        .flat_map(|&(t, n)| std::iter::repeat_n((t, 1), n))
        .collect();
    let s = Scenario { quota: Quota::per_minute(100).expect("valid"), start_ms: EPOCH_2026, requests };
    let d = b.agree(&s, "api").await;
    let admitted = |range: std::ops::Range<usize>| d[range].iter().filter(|d| d.allowed).count();
    assert_eq!(admitted(0..100), 100);
    assert_eq!(admitted(100..200), 0, "a fixed window would admit these 100");
    assert_eq!(admitted(200..300), 100);
}

#[tokio::test]
async fn named_edge_cases_agree() {
    let b = Backends::start().await;
    let cases = [
        // An entry exactly one window old has left.
        (1, 1_000, vec![(0, 1), (999, 1), (1_000, 1), (1_999, 1), (2_000, 1)]),
        // Costs: a bulk request that does not fit charges nothing; retry waits for enough room.
        (10, 1_000, vec![(0, 4), (100, 4), (200, 3), (300, 2), (1_000, 3), (1_099, 8), (1_100, 8)]),
        // Cost equal to the limit.
        (5, 500, vec![(0, 5), (1, 1), (499, 5), (500, 5)]),
        // Many admissions in one millisecond.
        (50, 10, vec![(0, 1); 60]),
        // A 1 ms window.
        (2, 1, vec![(0, 1), (0, 1), (0, 1), (1, 1), (1, 2), (2, 1)]),
        // Long idle, then a burst.
        (3, 100, vec![(0, 3), (10, 1), (1_000_000, 2), (1_000_000, 1), (1_000_001, 1)]),
        // Long windows: the sliding-log script packs a cost-1 denial into one integer up to
        // 94,906,264 ms (about 26 h) and answers a table beyond; both sides of that line.
        (2, 94_906_264, vec![(0, 1), (1, 1), (2, 1), (3, 2), (94_906_264, 1), (94_906_265, 1), (94_906_265, 1)]),
        (2, 94_906_265, vec![(0, 1), (1, 1), (2, 1), (3, 2), (94_906_265, 1), (94_906_266, 1), (94_906_266, 1)]),
    ];
    let algorithms = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow { buckets: 1 },
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: None },
    ];
    for (i, (limit, window_ms, requests)) in cases.into_iter().enumerate() {
        for (algorithm, start_ms) in algorithms.iter().flat_map(|&a| [(a, 0), (a, EPOCH_2026)]) {
            let s = Scenario { quota: quota(limit, window_ms, algorithm), start_ms, requests: requests.clone() };
            b.agree(&s, &format!("case{i}:{algorithm}:{start_ms}")).await;
        }
    }
}

/// A limit changed under a key, as an override or an edited rule does: a key lowered below what
/// it holds denies until enough leave, and its answers — `next_permit_after` too, which waits
/// for the oldest live entry, not the one that blocks — are the specification's, on every
/// engine and in both orders of the sliding-log script; raised across 256, where the Lua
/// scripts change form, and lowered back, too.
#[tokio::test]
async fn a_limit_changed_under_a_key_agrees() {
    let b = Backends::start().await;
    let log = |limit| quota(limit, 10_000, Algorithm::SlidingLog);
    let (ten, four, large) = (log(10), log(4), log(300));
    let steps: Vec<(u64, Quota, u64)> = (0..10)
        .map(|i| (i * 100, ten, 1))
        .chain([(1_000, four, 1), (1_500, four, 2), (3_000, ten, 1), (5_000, large, 250)])
        .chain([(10_050, four, 1), (10_450, four, 3), (15_100, four, 1), (15_200, ten, 1)])
        .collect();
    let mut key = Key::new(Algorithm::SlidingLog);
    let expected: Vec<Decision> = steps.iter().map(|&(t, q, cost)| key.check(EPOCH_2026 + t, &q, cost)).collect();
    let got = [
        ("memory", checked(&b.memory, &b.clock, "changed", &steps).await),
        ("Lua", checked(&b.redis, &b.clock, "changed", &steps).await),
        ("Lua, expecting denials", checked(&b.redis_orders[0], &b.clock, "changed:probe", &steps).await),
        ("Lua, expecting admissions", checked(&b.redis_orders[1], &b.clock, "changed:count", &steps).await),
        ("module", checked(&b.module, &b.clock, "changed", &steps).await),
    ];
    assert!(!expected[10].allowed && expected[10].next_permit_after < expected[10].retry_after.expect("denied"));
    for (name, decisions) in got {
        for (i, (d, e)) in decisions.iter().zip(&expected).enumerate() {
            assert_eq!(d, e, "{name} differs from spec at #{i}, {:?}", steps[i]);
        }
    }
}

/// A warm-up added to a rule whose key is busy: no ramp has started (none was recorded), so the
/// key counts as warm until it is idle; then the next admission starts the ramp. Every engine
/// as the specification, every algorithm, checks and charges alike.
#[tokio::test]
async fn a_warm_up_added_under_a_busy_key_agrees() {
    let b = Backends::start().await;
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow { buckets: 10 },
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: None },
    ] {
        let plain = quota(10, 10_000, algorithm);
        let warm = plain.with_warm_up(Duration::from_secs(60), 0.2).expect("warm-up");
        // Busy under the plain quota, then the warm-up; idle for two windows, then again.
        let steps: Vec<(u64, Quota, u64)> = [(0, plain, 2), (100, warm, 2), (200, warm, 2), (300, warm, 2)]
            .into_iter()
            .chain([(40_000, warm, 1), (40_100, warm, 2), (40_200, warm, 1), (70_000, warm, 2)])
            .collect();
        let mut key = Key::new(algorithm);
        let expected: Vec<Decision> = steps.iter().map(|&(t, q, cost)| key.check(EPOCH_2026 + t, &q, cost)).collect();
        assert_eq!(expected[2].limit, 10, "{algorithm}: warm while busy: {:?}", expected[2]);
        assert_eq!(expected[4].limit, 2, "{algorithm}: cold after idleness: {:?}", expected[4]);
        let name = format!("added:{algorithm}");
        let got = [
            ("memory", checked(&b.memory, &b.clock, &name, &steps).await),
            ("Lua", checked(&b.redis, &b.clock, &name, &steps).await),
            ("module", checked(&b.module, &b.clock, &name, &steps).await),
        ];
        for (engine, decisions) in got {
            for (i, (d, e)) in decisions.iter().zip(&expected).enumerate() {
                assert_eq!(d, e, "{engine} differs from spec at #{i}, {algorithm}, {:?}", steps[i]);
            }
        }
    }
}

/// Each of `steps` (time, quota, cost) checked in turn on `key`.
async fn checked<B: slidegate::Backend>(
    limiter: &Limiter<B>,
    clock: &ManualClock,
    key: &str,
    steps: &[(u64, Quota, u64)],
) -> Vec<Decision> {
    let mut out = Vec::new();
    for &(t, q, cost) in steps {
        clock.set_ms(EPOCH_2026 + t);
        out.push(limiter.check_cost(key, &q, cost).await.expect("check"));
    }
    out
}

/// Sliding logs of limits above 256, which the Lua scripts keep as counted entries (one per
/// admission, whatever its cost): token-sized costs, many admissions in one millisecond, a
/// denial whose room comes only once many small entries have left (found by a search among
/// them), and a key taking costs up to its limit, each decided as the specification does.
#[tokio::test]
async fn large_costs_on_large_limits_agree() {
    let b = Backends::start().await;
    let small_then_large: Vec<(u64, u64)> =
        (0..300).map(|i| (i * 3, 3)).chain([(900, 500), (950, 101), (1_000, 120), (1_500, 400)]).collect();
    let cases = [
        (
            100_000,
            60_000,
            vec![(0, 50_000), (500, 50_000), (1_000, 1), (60_000, 1), (60_000, 50_000), (60_500, 50_000), (60_500, 1)],
        ),
        (
            1_000,
            1_000,
            vec![(0, 300), (0, 300), (0, 300), (0, 200), (1, 100), (999, 1), (1_000, 600), (1_001, 301), (1_999, 1)],
        ),
        (300, 10, vec![(0, 7); 50]),
        (1_000, 1_000, small_then_large),
        (257, 100, vec![(0, 257), (50, 1), (99, 1), (100, 256), (100, 1), (101, 2), (250, 257)]),
    ];
    for (i, (limit, window_ms, requests)) in cases.into_iter().enumerate() {
        for start_ms in [0, EPOCH_2026] {
            let s = Scenario {
                quota: quota(limit, window_ms, Algorithm::SlidingLog),
                start_ms,
                requests: requests.clone(),
            };
            b.agree(&s, &format!("large{i}:{start_ms}")).await;
        }
    }
}

/// A counter whose answer does not fit the lean sliding-window script's one packed integer
/// (limit × window past 2^53) answers in a table instead: both forms, each outcome.
#[tokio::test]
async fn huge_counters_agree_past_the_packed_reply() {
    let b = Backends::start().await;
    let requests = vec![(0, 1), (1, 100_000_000), (2, 250_000_000), (3, 199_999_999), (12_500_000, 2), (25_000_001, 1)];
    for buckets in [1, 5] {
        let q = quota(300_000_000, 25_000_000, Algorithm::SlidingWindow { buckets });
        let d = b
            .agree(&Scenario { quota: q, start_ms: EPOCH_2026, requests: requests.clone() }, &format!("huge{buckets}"))
            .await;
        assert_eq!(
            allowed(&d),
            [true, true, false, true, false, true],
            "{buckets} buckets: full until the window ends"
        );
    }
}

/// Callers' clocks up to a window apart (times that step back): a bucket ahead of a caller's is
/// kept uncounted, and one that has left the window of the latest admission is gone, whichever
/// clock comes next and whether the one-key script or a group writes the bucket.
#[tokio::test]
async fn sliding_window_clocks_a_window_apart_agree() {
    let b = Backends::start().await;
    // The last three: a denial whose room comes only once a bucket ahead of its clock has left.
    let requests = vec![
        (3_105, 35),
        (2_808, 80),
        (3_199, 33),
        (2_902, 33),
        (3_000, 40),
        (2_950, 1),
        (3_301, 50),
        (3_390, 40),
        (3_100, 1),
        (3_100, 90),
    ];
    // Buckets of 200 ms: the clocks stay within one bucket of each other.
    for buckets in [1, 2] {
        let s = Scenario {
            quota: quota(100, 200 * u64::from(buckets), Algorithm::SlidingWindow { buckets }),
            start_ms: EPOCH_2026,
            requests: requests.clone(),
        };
        b.agree(&s, &format!("skewed{buckets}")).await;
    }
}

#[tokio::test]
async fn fixed_window_lets_twice_the_limit_through_at_an_edge() {
    let b = Backends::start().await;
    let requests = [(59_000, 100), (61_000, 100)].iter().flat_map(|&(t, n)| std::iter::repeat_n((t, 1), n)).collect();
    let s = Scenario { quota: quota(100, 60_000, Algorithm::FixedWindow), start_ms: 0, requests };
    let d = b.agree(&s, "edge").await;
    assert_eq!(d.iter().filter(|d| d.allowed).count(), 200, "200 within two seconds under a limit of 100");
}

#[tokio::test]
async fn gcra_bursts_then_paces_and_warm_up_ramps() {
    let b = Backends::start().await;
    // 10 per second, burst 5: five at once, then one per 100 ms; retry_after is exact.
    let gcra = quota(10, 1_000, Algorithm::Gcra { burst: Some(5) });
    let requests = vec![(0, 1), (0, 1), (0, 1), (0, 2), (0, 1), (99, 1), (100, 1), (100, 1), (250, 2)];
    let d = b.agree(&Scenario { quota: gcra, start_ms: EPOCH_2026, requests }, "gcra").await;
    assert_eq!(allowed(&d), [true, true, true, true, false, false, true, false, false]);
    assert_eq!(d[4].retry_after, Some(Duration::from_millis(100)));
    // Warm-up on each algorithm: cold at a fifth, full after 1 s of activity, cold after idleness.
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow { buckets: 4 },
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: None },
    ] {
        let q = quota(10, 1_000, algorithm).with_warm_up(Duration::from_secs(1), 0.2).expect("valid");
        let requests: Vec<(u64, u64)> =
            [0, 500, 900, 1_200, 1_500, 5_000].iter().flat_map(|&t| std::iter::repeat_n((t, 1), 12)).collect();
        let d = b.agree(&Scenario { quota: q, start_ms: 0, requests }, &format!("warm:{algorithm}")).await;
        let first = d[..12].iter().filter(|d| d.allowed).count();
        let after_idle = d[60..].iter().filter(|d| d.allowed).count();
        assert_eq!((first, after_idle), (2, 2), "{algorithm}: a fifth of 10 when cold");
        assert!(d[..60].iter().filter(|d| d.allowed).count() > 10, "{algorithm}: ramps up while busy");
    }
}

/// Any algorithm, sometimes with a warm-up; windows of 1 ms to 3 s.
fn quotas() -> impl Strategy<Value = Quota> {
    let algorithm = prop_oneof![
        Just(Algorithm::SlidingLog),
        (1u32..=10).prop_map(|buckets| Algorithm::SlidingWindow { buckets }),
        Just(Algorithm::FixedWindow),
        prop::option::of(1u64..=30).prop_map(|burst| Algorithm::Gcra { burst }),
    ];
    let warm_up = prop::option::weighted(0.3, (1u64..=3_000, 1u64..=1_000));
    (1u64..=20, 1u64..=300, 1u64..=10, algorithm, warm_up).prop_filter_map(
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

fn scenarios() -> impl Strategy<Value = Scenario> {
    quotas().prop_flat_map(|quota| {
        let window_ms = quota.window_ms();
        // Gaps mostly inside the window, sometimes a whole window or more.
        let gap = prop_oneof![4 => 0..=window_ms / 4, 1 => 0..=window_ms * 2];
        let request = (gap, 1..=quota.max_cost());
        prop::collection::vec(request, 1..80).prop_map(move |steps| Scenario {
            quota,
            start_ms: EPOCH_2026,
            requests: timeline(steps),
        })
    })
}

/// Turns `(gap since the previous request, what it asks)` steps into absolute times.
fn timeline<T>(steps: Vec<(u64, T)>) -> Vec<(u64, T)> {
    let mut t = 0;
    steps
        .into_iter()
        .map(|(gap, ask)| {
            t += gap;
            (t, ask)
        })
        .collect()
}

/// Runs `cases` generated scenarios through `agree` (given the scenario and a case number for
/// fresh keys) against one set of backends.
fn run_property<S: Strategy>(cases: u32, strategy: &S, agree: &impl AsyncFn(&Backends, S::Value, u32)) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let b = rt.block_on(Backends::start());
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(strategy, |s| {
            rt.block_on(agree(&b, s, case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
            Ok(())
        })
        .expect("all implementations agree");
}

#[test]
fn random_scenarios_agree() {
    run_property(256, &scenarios(), &async |b, s, n| {
        b.agree(&s, &format!("prop{n}")).await;
    });
}

/// Sliding logs of limits above 256 (counted entries on the Lua scripts), costs small and up to
/// the limit. One clock: a caller's clock that steps back is where counted entries may differ
/// (an entry is never stamped before the newest one: later, so conservative; see counted_log.lua).
fn large_log_scenarios() -> impl Strategy<Value = Scenario> {
    (257u64..=3_000, 1u64..=3_000).prop_flat_map(|(limit, window_ms)| {
        let quota = quota(limit, window_ms, Algorithm::SlidingLog);
        let gap = prop_oneof![4 => 0..=window_ms / 4, 1 => 0..=window_ms * 2];
        let cost = prop_oneof![3 => 1..=limit / 20 + 1, 1 => 1..=limit];
        prop::collection::vec((gap, cost), 1..60).prop_map(move |steps| Scenario {
            quota,
            start_ms: EPOCH_2026,
            requests: timeline(steps),
        })
    })
}

#[test]
fn random_large_log_scenarios_agree() {
    run_property(64, &large_log_scenarios(), &async |b, s, n| {
        b.agree(&s, &format!("large_log{n}")).await;
    });
}

/// Sliding window counters checked from two clocks up to a window apart: each request comes
/// from one of them, the second `skew` ms behind the first.
fn skewed_window_scenarios() -> impl Strategy<Value = Scenario> {
    let windows =
        quotas().prop_filter("a sliding window", |q| matches!(q.algorithm(), Algorithm::SlidingWindow { .. }));
    windows.prop_flat_map(|quota| {
        let window_ms = quota.window_ms();
        let gap = prop_oneof![4 => 0..=window_ms / 4, 1 => 0..=window_ms * 2];
        let request = (gap, (1..=quota.max_cost(), any::<bool>()));
        (0..=window_ms, prop::collection::vec(request, 1..80)).prop_map(move |(skew, steps)| Scenario {
            quota,
            start_ms: EPOCH_2026,
            requests: timeline(steps)
                .into_iter()
                .map(|(t, (cost, behind))| (if behind { t } else { t + skew }, cost))
                .collect(),
        })
    })
}

#[test]
fn random_skewed_window_scenarios_agree() {
    run_property(128, &skewed_window_scenarios(), &async |b, s, n| {
        b.agree(&s, &format!("skewed{n}")).await;
    });
}

/// Several limits decided together: key i has `quotas[i]`; each request asks `costs[i]` of
/// every key at `t`.
#[derive(Debug, Clone)]
struct MultiScenario {
    quotas: Vec<Quota>,
    requests: Vec<(u64, Vec<u64>)>,
}

fn multi_scenarios() -> impl Strategy<Value = MultiScenario> {
    prop::collection::vec(quotas(), 1..=3).prop_flat_map(|quotas| {
        let costs: Vec<_> = quotas.iter().map(|q| 1..=q.max_cost()).collect();
        let request = (0u64..=400, costs);
        prop::collection::vec(request, 1..50)
            .prop_map(move |steps| MultiScenario { quotas: quotas.clone(), requests: timeline(steps) })
    })
}

impl Backends {
    async fn agree_multi(&self, s: &MultiScenario, case: u32) {
        let keys: Vec<String> = (0..s.quotas.len()).map(|i| format!("multi{case}:{i}")).collect();
        let mut models: Vec<Key> = s.quotas.iter().map(|q| Key::new(q.algorithm())).collect();
        for (step, (t, costs)) in s.requests.iter().enumerate() {
            let now = EPOCH_2026 + t;
            let asked: Vec<(Quota, u64)> = s.quotas.iter().copied().zip(costs.iter().copied()).collect();
            let expected = slidegate::spec::check_all(&mut models, now, &asked);
            let checks: Vec<Check<'_>> =
                keys.iter().zip(&s.quotas).zip(costs).map(|((k, q), &c)| Check::new(k, *q).with_cost(c)).collect();
            self.clock.set_ms(now);
            let memory = self.memory.check_all(&checks).await.expect("memory");
            // With one key, every other step goes through the one-key path (for a sliding log
            // without warm-up, the lean script): both scripts must read what the other wrote.
            let redis = if checks.len() == 1 && step % 2 == 1 {
                let c = checks[0];
                let d = self.redis.check_cost(c.key, &c.quota, c.cost).await.expect("redis");
                MultiDecision::new(vec![d])
            } else {
                self.redis.check_all(&checks).await.expect("redis")
            };
            let module = self.module.check_all(&checks).await.expect("module");
            let context = format!("step {step} of {s:?}");
            assert_eq!(memory, expected, "memory differs from spec; {context}");
            assert_eq!(redis, expected, "redis (Lua) differs from spec; {context}");
            assert_eq!(module, expected, "redis module differs from spec; {context}");
        }
    }
}

#[test]
fn random_multi_limit_scenarios_agree() {
    run_property(128, &multi_scenarios(), &async |b, s, n| b.agree_multi(&s, n).await);
}
