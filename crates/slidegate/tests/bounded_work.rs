//! Bounded work per decision against real redis-server processes: the largest inputs the
//! limiter accepts, sent as a barrage, never hold Redis' one thread for long (measured from
//! Redis' own SLOWLOG), a long sliding log is trimmed a bounded amount per admission without
//! changing a decision, and inputs past the bounds are the caller's error — never a backend
//! failure that a fail-open policy would turn into an admission.

use std::collections::BTreeMap;
use std::time::Duration;

use slidegate::{
    Algorithm, Check, Error, FailurePolicy, Limiter, MAX_LIMIT, MAX_LOG_LIMIT, ManualClock, MemoryBackend, Quota,
    RedisBackend, RedisEngine,
};
use slidegate_testkit::RedisServer;

const WINDOW: Duration = Duration::from_secs(60);

/// The most a kind of call may hold Redis, in µs, by the median of its repeats. The largest
/// accepted calls (100,000 permits at once, a group of 16 logs with warm-up) take one to three
/// milliseconds on a shared 2-core machine (BENCHMARKS.md has the measured figures); this bound
/// leaves room for its noise, not for a path that grows with an input. A median, not the single
/// slowest, because such a machine can preempt Redis in any one command; an input that makes
/// unbounded work is slow every time.
const MEDIAN_US: u64 = 6_000;

/// What no single command may exceed, preempted or not: the call never hung.
const WORST_US: u64 = 50_000;

/// The timing test runs alone (write), the others side by side (read): on a 2-core machine
/// another test's barrage would preempt the Redis being timed.
static TIMING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn quota(limit: u64, algorithm: Algorithm) -> Quota {
    Quota::new(limit, WINDOW).and_then(|q| q.with_algorithm(algorithm)).expect("valid quota")
}

async fn limiter(server: &RedisServer, engine: RedisEngine, clock: &ManualClock) -> Limiter<RedisBackend> {
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    Limiter::new(backend.with_engine(engine).with_clock(clock.clone()).with_timeout(Duration::from_secs(10)))
}

/// Every command Redis logged since the log was reset, by kind — the command and its first key
/// (for a script, the key it decides) — with the µs each run took.
fn timings(server: &RedisServer) -> BTreeMap<String, Vec<u64>> {
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    let entries: Vec<redis::Value> = server.query(&["SLOWLOG", "GET", "-1"]);
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for entry in &entries {
        let redis::Value::Array(fields) = entry else { continue };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) = (fields.get(2), fields.get(3)) else {
            continue;
        };
        let command = args.first().map(text).unwrap_or_default().to_uppercase();
        // A script by its SHA's first characters and the first key it decides.
        let (command, key) = match command.as_str() {
            "EVALSHA" => (format!("{command} {:.6}", args.get(1).map(text).unwrap_or_default()), args.get(3)),
            _ => (command, args.get(1)),
        };
        let kind = format!("{command} {}", key.map(text).unwrap_or_default());
        out.entry(kind).or_default().push(u64::try_from(*us).unwrap_or(0));
    }
    out
}

/// Logs every command's duration (SLOWLOG with a threshold of 0), forgetting earlier ones.
fn start_timing(server: &RedisServer) {
    let _: () = server.query(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let _: () = server.query(&["CONFIG", "SET", "slowlog-max-len", "100000"]);
    let _: () = server.query(&["SLOWLOG", "RESET"]);
}

/// Fills `key` to its limit in calls of `cost`, expires it all, then admits `rounds` more calls
/// of `cost`: the longest set, the longest trim, the largest write the bounds allow.
async fn fill_expire_refill(limiter: &Limiter<RedisBackend>, clock: &ManualClock, key: &str, q: &Quota, cost: u64) {
    for _ in 0..q.limit().div_ceil(cost) {
        limiter.check_cost(key, q, cost).await.expect("fill");
    }
    let denied = limiter.check_cost(key, q, cost).await.expect("denial at a full log");
    assert!(!denied.allowed, "{key} full");
    clock.advance(WINDOW);
    for _ in 0..(q.limit() / cost).min(4) {
        assert!(limiter.check_cost(key, q, cost).await.expect("refill").allowed, "{key} after a window");
    }
    clock.advance(WINDOW / 2);
}

/// Every algorithm at the largest limit and cost the engine accepts, alone and in a group of
/// MAX_CHECKS sliding logs with warm-up, then the inspection and reset of the longest log.
async fn barrage(server: &RedisServer, engine: RedisEngine) -> BTreeMap<String, Vec<u64>> {
    let clock = ManualClock::new(1_700_000_000_000);
    let limiter = limiter(server, engine, &clock).await;
    let log_cost = MAX_LOG_LIMIT;
    start_timing(server);

    let log = quota(MAX_LOG_LIMIT, Algorithm::SlidingLog);
    fill_expire_refill(&limiter, &clock, "log", &log, log_cost).await;
    if engine == RedisEngine::Lua {
        let stored: u64 = server.query(&["ZCARD", "slidegate:log"]);
        assert!(stored <= MAX_LOG_LIMIT, "a log never holds more than its limit: {stored}");
    }

    // A group of long expired logs: each trimmed a bounded amount by the general script.
    let keys: Vec<String> = (0..slidegate::MAX_CHECKS).map(|i| format!("group{i}")).collect();
    for key in &keys {
        for _ in 0..5_000 / log_cost.min(5_000) {
            limiter.check_cost(key, &log, log_cost.min(5_000)).await.expect("fill a group's key");
        }
    }
    clock.advance(WINDOW);
    let warm = log.with_warm_up(WINDOW, 1.0).expect("warm-up");
    let each = log_cost / keys.len() as u64;
    let group: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k, warm).with_cost(each)).collect();
    for _ in 0..4 {
        assert!(limiter.check_all(&group).await.expect("group").allowed);
    }

    for algorithm in [Algorithm::FixedWindow, Algorithm::Gcra { burst: None }] {
        // A day: a GCRA admits at most one permit per µs.
        let q = Quota::new(MAX_LIMIT, WINDOW * 1440).and_then(|q| q.with_algorithm(algorithm)).expect("a counter");
        for _ in 0..3 {
            limiter.check_cost("counter", &q, MAX_LIMIT).await.expect("counter");
        }
        let ramped = q.with_warm_up(WINDOW, 1.0).expect("warm-up");
        limiter.check_cost("ramped", &ramped, MAX_LIMIT).await.expect("counter with warm-up");
    }
    let buckets = Quota::new(1_000_000, WINDOW)
        .and_then(|q| q.with_algorithm(Algorithm::SlidingWindow { buckets: 100 }))
        .expect("100 buckets");
    for _ in 0..100 {
        limiter.check_cost("buckets", &buckets, 1_000).await.expect("sliding window");
        clock.advance(WINDOW / 100);
    }

    for _ in 0..3 {
        limiter.inspect("log", &log).await.expect("inspect");
    }
    limiter.reset("log").await.expect("reset");
    timings(server)
}

fn assert_bounded(engine: &str, timings: &BTreeMap<String, Vec<u64>>) {
    let slidegate_calls: usize =
        timings.iter().filter(|(kind, _)| kind.contains(" slidegate")).map(|(_, t)| t.len()).sum();
    assert!(slidegate_calls > 20, "{engine}: the barrage was logged: {timings:?}");
    for (kind, runs) in timings {
        let mut sorted = runs.clone();
        sorted.sort_unstable();
        let (median, worst) = (sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
        eprintln!("{engine}: {kind}: {} runs, median {median} µs, worst {worst} µs", sorted.len());
        if sorted.len() >= 3 {
            assert!(median <= MEDIAN_US, "{engine}: {kind} holds Redis for {median} µs (median of {})", sorted.len());
        }
        assert!(worst <= WORST_US, "{engine}: {kind} held Redis for {worst} µs");
    }
}

/// One test for both engines, so that the two barrages do not compete for the CPU.
#[tokio::test]
async fn the_largest_inputs_never_hold_redis_for_long() {
    let _alone = TIMING.write().await;
    let server = RedisServer::start();
    assert_bounded("lua", &barrage(&server, RedisEngine::Lua).await);
    let server = RedisServer::start_with_module(&[]);
    assert_bounded("module", &barrage(&server, RedisEngine::Module).await);
}

/// A log far longer than the trim bound, expired whole: each admission removes a bounded number
/// of expired entries and still decides exactly as the memory backend (an independent
/// implementation) on the same clock.
#[tokio::test]
async fn a_long_expired_log_is_trimmed_a_bounded_amount_per_admission_without_changing_decisions() {
    let _beside = TIMING.read().await;
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000);
    let redis = limiter(&server, RedisEngine::Lua, &clock).await;
    let memory = Limiter::new(MemoryBackend::with_clock(clock.clone()));
    // Over 2,000 entries of costs 1 to 3, the last few denied.
    let q = quota(4_000, Algorithm::SlidingLog);
    let step = |i: u64| Duration::from_millis(i % 7);
    for i in 0..2_100 {
        let cost = 1 + i % 3;
        let (r, m) = (redis.check_cost("k", &q, cost).await.expect("redis"), memory.check_cost("k", &q, cost).await);
        assert_eq!(r, m.expect("memory"), "fill, call {i}");
        clock.advance(step(i));
    }
    clock.advance(WINDOW);
    let mut sizes = vec![];
    for i in 0..40 {
        let cost = 1 + i % 3;
        let (r, m) = (redis.check_cost("k", &q, cost).await.expect("redis"), memory.check_cost("k", &q, cost).await);
        assert_eq!(r, m.expect("memory"), "after a window, call {i}");
        sizes.push(server.query::<u64>(&["ZCARD", "slidegate:k"]));
        clock.advance(Duration::from_millis(3));
    }
    for pair in sizes.windows(2) {
        assert!(pair[0] - pair[1].min(pair[0]) <= 256, "one admission removed at most 256: {sizes:?}");
    }
    assert!(sizes[0] > 1_500, "the first admission did not remove everything at once: {sizes:?}");
    assert!(*sizes.last().expect("sizes") < 100, "the expired entries are gone after a few admissions: {sizes:?}");
}

/// The attacks of a caller who sizes the work: a billion-permit sliding log is the caller's
/// error under a fail-open policy — never an admission, never `degraded`, never counted by the
/// breaker — and a cost of thousands of permits on a log of 10,000 is decided exactly.
#[tokio::test]
async fn inputs_past_the_bounds_are_the_callers_error_never_an_admission() {
    let _beside = TIMING.read().await;
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000);
    let limiter = limiter(&server, RedisEngine::Lua, &clock)
        .await
        .with_failure_policy(FailurePolicy::FailOpen)
        .with_circuit_breaker(3, Duration::from_secs(30));
    let billion = Quota::new(MAX_LIMIT, WINDOW).expect("a counter's limit");
    let log = quota(10_000, Algorithm::SlidingLog);
    for _ in 0..10 {
        let too_big = limiter.check_cost("d", &billion, MAX_LIMIT).await;
        assert!(matches!(too_big, Err(Error::InvalidLimit { max: MAX_LOG_LIMIT, .. })), "{too_big:?}");
    }
    assert!(!limiter.circuit_open(), "caller errors never open the breaker");
    let keys: u64 = server.query(&["DBSIZE"]);
    assert_eq!(keys, 0, "nothing was sent");
    let d = limiter.check_cost("a", &log, 5_000).await.expect("a large cost is decided");
    assert!(d.allowed && d.degraded.is_none(), "{d:?}");
    assert_eq!(d.remaining, 5_000);
    assert!(!limiter.check_cost("a", &log, 5_001).await.expect("decided").allowed, "one permit past the limit");
}

/// The module records a permit in a byte or two, so a forced module engine takes any cost its
/// quota admits; the sliding log's limit is bounded there too.
#[tokio::test]
async fn the_module_takes_large_costs_within_the_log_limit() {
    let _beside = TIMING.read().await;
    let server = RedisServer::start_with_module(&[]);
    let clock = ManualClock::new(1_700_000_000_000);
    let limiter = limiter(&server, RedisEngine::Module, &clock).await;
    let log = quota(10_000, Algorithm::SlidingLog);
    let d = limiter.check_cost("a", &log, 5_000).await.expect("module");
    assert_eq!((d.allowed, d.remaining), (true, 5_000));
    let billion = Quota::new(MAX_LIMIT, WINDOW).expect("a counter's limit");
    assert!(matches!(limiter.check("d", &billion).await, Err(Error::InvalidLimit { .. })));
}

/// The memory one key can hold at the bounds, as SECURITY.md and the README state it: a sliding
/// log of MAX_LOG_LIMIT admissions, in batches spread over the longest window, and a sliding
/// window counter with every one of its MAX_BUCKETS counted, read with `MEMORY USAGE` on each
/// engine. (The module's bound is the analytical worst case: n gaps within one window average
/// at most window / n, about 3 LEB128 bytes each at 100,000 in 366 days, plus a mark per 256.
/// The Lua bound leaves room for a long-lived key: its entries' `seq` and `cum` grow by a digit
/// each per tenfold admissions, up to 16 digits, ~20 bytes an entry more than measured here.)
#[tokio::test]
async fn memory_per_key_stays_within_the_documented_bound() {
    let _beside = TIMING.read().await;
    const LOG_SCRIPT_BYTES: u64 = 16_000_000;
    const LOG_MODULE_BYTES: u64 = 320_000;
    const COUNTER_BYTES: u64 = 4_096;
    for (server, engine, log_bound) in [
        (RedisServer::start(), RedisEngine::Lua, LOG_SCRIPT_BYTES),
        (RedisServer::start_with_module(&[]), RedisEngine::Module, LOG_MODULE_BYTES),
    ] {
        let clock = ManualClock::new(1_700_000_000_000);
        let limiter = limiter(&server, engine, &clock).await;
        let window = slidegate::MAX_WINDOW;
        let log = Quota::new(MAX_LOG_LIMIT, window).expect("the longest log");
        // The worst case is one admission per permit: an entry each on Lua (counted entries), a
        // gap each in the module. 1,000 rounds of 100 at once, spread over the window.
        const ROUND: u64 = 100;
        let gap = window / u32::try_from(MAX_LOG_LIMIT / ROUND).expect("rounds");
        for _ in 0..MAX_LOG_LIMIT / ROUND {
            let mut round = tokio::task::JoinSet::new();
            for _ in 0..ROUND {
                let limiter = limiter.clone();
                round.spawn(async move { limiter.check("log", &log).await.expect("fill").allowed });
            }
            while let Some(allowed) = round.join_next().await {
                assert!(allowed.expect("task"), "{engine:?}: the log admits up to its limit");
            }
            clock.advance(gap - Duration::from_millis(1));
        }
        let buckets = slidegate::quota::MAX_BUCKETS;
        let counter = Quota::new(MAX_LIMIT / 1_000, WINDOW * 100)
            .and_then(|q| q.with_algorithm(Algorithm::SlidingWindow { buckets }))
            .expect("every bucket");
        for _ in 0..buckets {
            limiter.check_cost("buckets", &counter, 1).await.expect("bucket");
            clock.advance(WINDOW);
        }
        for (key, bound) in [("slidegate:log", log_bound), ("slidegate.sw:buckets", COUNTER_BYTES)] {
            let bytes: u64 = server.query(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
            eprintln!("{engine:?}: {key}: {bytes} bytes");
            assert!(bytes > 0 && bytes <= bound, "{engine:?}: {key} holds {bytes} bytes, over {bound}");
        }
    }
}
