//! One suite, three implementations: every timed scenario runs through the reference model, the
//! memory backend and the Redis backend (on the caller's clock, against a real redis-server),
//! and all three must give identical decisions — `allowed`, `remaining`, `reset_after`,
//! `retry_after`.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use slidegate::reference::SlidingLog;
use slidegate::{Check, Decision, Limiter, ManualClock, MemoryBackend, MultiDecision, Quota, RedisBackend};
use slidegate_testkit::RedisServer;

/// A rule and a timed sequence of requests `(ms since start, cost)`.
#[derive(Debug, Clone)]
struct Scenario {
    limit: u64,
    window_ms: u64,
    start_ms: u64,
    requests: Vec<(u64, u64)>,
}

impl Scenario {
    fn quota(&self) -> Quota {
        Quota::new(self.limit, Duration::from_millis(self.window_ms)).expect("valid quota")
    }

    fn reference(&self) -> Vec<Decision> {
        let mut log = SlidingLog::default();
        self.requests.iter().map(|&(t, cost)| log.check(self.start_ms + t, self.limit, self.window_ms, cost)).collect()
    }

    async fn run<B: slidegate::Backend>(&self, limiter: &Limiter<B>, clock: &ManualClock, key: &str) -> Vec<Decision> {
        let mut out = Vec::new();
        for &(t, cost) in &self.requests {
            clock.set_ms(self.start_ms + t);
            out.push(limiter.check_cost(key, &self.quota(), cost).await.expect("check"));
        }
        out
    }
}

struct Backends {
    clock: ManualClock,
    memory: Limiter<MemoryBackend>,
    redis: Limiter<RedisBackend>,
    _server: RedisServer,
}

impl Backends {
    async fn start() -> Self {
        let server = RedisServer::start();
        let clock = ManualClock::new(0);
        let redis = RedisBackend::connect(&server.url())
            .await
            .expect("connect")
            .with_clock(clock.clone())
            .with_timeout(Duration::from_secs(5));
        Self {
            memory: Limiter::new(MemoryBackend::with_clock(clock.clone())),
            redis: Limiter::new(redis),
            clock,
            _server: server,
        }
    }

    /// Runs `scenario` on a fresh key everywhere and returns the (identical) decisions.
    async fn agree(&self, scenario: &Scenario, key: &str) -> Vec<Decision> {
        let expected = scenario.reference();
        let memory = scenario.run(&self.memory, &self.clock, key).await;
        let redis = scenario.run(&self.redis, &self.clock, key).await;
        for (i, ((e, m), r)) in expected.iter().zip(&memory).zip(&redis).enumerate() {
            let (limit, window, at) = (scenario.limit, scenario.window_ms, &scenario.requests[..=i]);
            let context = format!("{limit} per {window} ms, requests (ms, cost) up to #{i}: {at:?}");
            assert_eq!(m, e, "memory differs from reference; {context}");
            assert_eq!(r, e, "redis differs from reference; {context}");
        }
        expected
    }
}

fn allowed(decisions: &[Decision]) -> Vec<bool> {
    decisions.iter().map(|d| d.allowed).collect()
}

const EPOCH_2026: u64 = 1_795_000_000_000;

#[tokio::test]
async fn seed_seven_requests_half_a_second_apart() {
    let b = Backends::start().await;
    let s = Scenario {
        limit: 5,
        window_ms: 10_000,
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
async fn seed_window_edge_double_burst_is_denied() {
    let b = Backends::start().await;
    // 100 per 60 s: 100 at 00:59, then 100 more at 01:01, then 100 more once the first left.
    let requests = [(59_000, 100), (61_000, 100), (119_000, 100)]
        .iter()
        .flat_map(|&(t, n)| std::iter::repeat_n((t, 1), n))
        .collect();
    let s = Scenario { limit: 100, window_ms: 60_000, start_ms: EPOCH_2026, requests };
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
    ];
    for (i, (limit, window_ms, requests)) in cases.into_iter().enumerate() {
        for start_ms in [0, EPOCH_2026] {
            let s = Scenario { limit, window_ms, start_ms, requests: requests.clone() };
            b.agree(&s, &format!("case{i}:{start_ms}")).await;
        }
    }
}

fn scenarios() -> impl Strategy<Value = Scenario> {
    (1u64..=20, 1u64..=3_000).prop_flat_map(|(limit, window_ms)| {
        // Gaps mostly inside the window, sometimes a whole window or more.
        let gap = prop_oneof![4 => 0..=window_ms / 4, 1 => 0..=window_ms * 2];
        let request = (gap, 1..=limit);
        prop::collection::vec(request, 1..80).prop_map(move |steps| Scenario {
            limit,
            window_ms,
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
    run_property(128, &scenarios(), &async |b, s, n| {
        b.agree(&s, &format!("prop{n}")).await;
    });
}

/// Several limits decided together: `quotas[i] = (limit, window_ms)` on key i; each request
/// asks `costs[i]` of every key at `t`.
#[derive(Debug, Clone)]
struct MultiScenario {
    quotas: Vec<(u64, u64)>,
    requests: Vec<(u64, Vec<u64>)>,
}

fn multi_scenarios() -> impl Strategy<Value = MultiScenario> {
    prop::collection::vec((1u64..=8, 1u64..=2_000), 1..=3).prop_flat_map(|quotas| {
        let costs: Vec<_> = quotas.iter().map(|&(limit, _)| 1..=limit).collect();
        let request = (0u64..=400, costs);
        prop::collection::vec(request, 1..50)
            .prop_map(move |steps| MultiScenario { quotas: quotas.clone(), requests: timeline(steps) })
    })
}

impl Backends {
    async fn agree_multi(&self, s: &MultiScenario, case: u32) {
        let keys: Vec<String> = (0..s.quotas.len()).map(|i| format!("multi{case}:{i}")).collect();
        let quotas: Vec<Quota> =
            s.quotas.iter().map(|&(l, w)| Quota::new(l, Duration::from_millis(w)).expect("quota")).collect();
        let mut logs = vec![SlidingLog::default(); s.quotas.len()];
        for (step, (t, costs)) in s.requests.iter().enumerate() {
            let now = EPOCH_2026 + t;
            let spec: Vec<(u64, u64, u64)> = s.quotas.iter().zip(costs).map(|(&(l, w), &c)| (l, w, c)).collect();
            let expected = slidegate::reference::check_all(&mut logs, now, &spec);
            let checks: Vec<Check<'_>> =
                keys.iter().zip(&quotas).zip(costs).map(|((k, q), &c)| Check::new(k, *q).with_cost(c)).collect();
            self.clock.set_ms(now);
            let memory = self.memory.check_all(&checks).await.expect("memory");
            // With one key, every other step goes through the one-key script: both scripts
            // must read what the other wrote.
            let redis = if checks.len() == 1 && step % 2 == 1 {
                let c = checks[0];
                let d = self.redis.check_cost(c.key, &c.quota, c.cost).await.expect("redis");
                MultiDecision::new(vec![d])
            } else {
                self.redis.check_all(&checks).await.expect("redis")
            };
            let context = format!("step {step} of {s:?}");
            assert_eq!(memory, expected, "memory differs from reference; {context}");
            assert_eq!(redis, expected, "redis differs from reference; {context}");
        }
    }
}

#[test]
fn random_multi_limit_scenarios_agree() {
    run_property(64, &multi_scenarios(), &async |b, s, n| b.agree_multi(&s, n).await);
}
