//! The figures behind the README's "which algorithm when" (BENCHMARKS.md, "Algorithms"): bytes
//! per key in Redis (`MEMORY USAGE`) and in the memory backend, at 100 and at 100,000 admissions
//! per minute, and how often the sliding window counter decides differently from the exact log
//! on a bursty trace.
//!
//! Starts its own redis-server (loopback, stopped at exit).
//!
//!     cargo run --release --example algorithm_report --features redis

use slidegate::{Algorithm, Limiter, ManualClock, MemoryBackend, Quota, RedisBackend};
use slidegate_testkit::RedisServer;

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow { buckets: 6 },
    Algorithm::FixedWindow,
    Algorithm::Gcra { burst: None },
];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, algorithm, limit] = args.as_slice()
        && flag == "--memory-footprint"
    {
        // A child process of `footprint`: a fresh heap, so resident growth is this key set's.
        // The algorithm is named by its place in ALGORITHMS, parameters included.
        let algorithm = ALGORITHMS.get(algorithm.parse::<usize>()?).ok_or("no such algorithm")?;
        let quota = Quota::per_minute(limit.parse()?)?.with_algorithm(*algorithm)?;
        println!("{:.0}", memory_bytes_per_key(&quota));
        return Ok(());
    }
    footprint().await?;
    disagreement("bursty: the limit binds in every burst", &trace(1_000, 20, 150..400));
    disagreement("mostly quiet: rare bursts just over the limit", &trace(1_000, 400, 90..130));
    Ok(())
}

/// Fills a key with `limit` admissions spread over 50 s of a one-minute window: what it costs.
fn fill(quota: &Quota) -> impl Iterator<Item = (u64, u64)> {
    // At most 1,000 calls keeps the fill quick: at a limit of 100 each admission has its own
    // time (500 ms apart), at 100,000 a call admits 100 permits (50 ms apart). The memory
    // backend's log holds one entry per permit either way (costing more the further apart they
    // are); in Redis a log of limit above 256 holds one counted entry per call, so its figure at
    // 100,000 is 1,000 entries' (bounded_work.rs measures 100,000 of one permit each).
    let calls = quota.limit().min(1_000);
    let step = 50_000 / calls;
    (0..calls).map(move |i| (START + i * step, quota.limit() / calls))
}

const START: u64 = 1_795_000_000_000;

async fn footprint() -> Result<(), Box<dyn std::error::Error>> {
    let server = RedisServer::start();
    let clock = ManualClock::new(START);
    let redis = Limiter::new(RedisBackend::connect(&server.url()).await?.with_clock(clock.clone()));
    println!("bytes per key, a one-minute window filled to its limit (admissions spread over 50 s)");
    println!("| algorithm | limit | Redis MEMORY USAGE | memory backend (resident) |");
    println!("|---|---|---|---|");
    for limit in [100u64, 100_000] {
        for (index, algorithm) in ALGORITHMS.into_iter().enumerate() {
            let quota = Quota::per_minute(limit)?.with_algorithm(algorithm)?;
            for (t, cost) in fill(&quota) {
                clock.set_ms(t);
                assert!(redis.check_cost("footprint", &quota, cost).await?.allowed, "the fill fits the limit");
            }
            let key = redis.backend().redis_key("footprint", algorithm);
            let bytes: u64 = server.query(&["MEMORY", "USAGE", &key, "SAMPLES", "0"]);
            redis.reset("footprint").await?;
            let child = std::process::Command::new(std::env::current_exe()?)
                .args(["--memory-footprint", &index.to_string(), &limit.to_string()])
                .output()?;
            let memory = String::from_utf8_lossy(&child.stdout).trim().to_owned();
            println!("| {algorithm} | {limit} | {bytes} | {memory} |");
        }
    }
    Ok(())
}

/// The resident memory one key adds to the memory backend: many keys filled alike, measured as
/// the process's growth in resident set (so allocator overhead counts, as in production).
fn memory_bytes_per_key(quota: &Quota) -> f64 {
    let keys: u64 = if quota.limit() > 1_000 && quota.algorithm() == Algorithm::SlidingLog { 50 } else { 100_000 };
    let clock = ManualClock::new(START);
    let backend = MemoryBackend::with_clock(clock.clone());
    let names: Vec<String> = (0..keys).map(|i| format!("user:{i:08}")).collect();
    let before = resident_bytes();
    for (t, cost) in fill(quota) {
        clock.set_ms(t);
        for name in &names {
            assert!(backend.check_now(name, quota, cost).allowed, "the fill fits the limit");
        }
    }
    let grown = resident_bytes().saturating_sub(before);
    assert_eq!(backend.len() as u64, keys);
    grown as f64 / keys as f64
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// A trace through the exact log and the sliding window counter at several bucket counts, each
/// in its own memory backend (tested decision for decision against the specification): how many
/// decisions differ, and which way.
fn disagreement(name: &str, trace: &[(u64, usize)]) {
    let keys = trace.iter().map(|&(_, k)| k).max().map_or(0, |k| k + 1);
    println!();
    println!(
        "sliding window counter vs the exact log, {name}: {} requests, {keys} keys, one hour, 100 per minute",
        trace.len()
    );
    println!("| buckets | wrongly allowed | wrongly denied | decisions that differ |");
    println!("|---|---|---|---|");
    let exact_quota = Quota::per_minute(100).expect("valid");
    let names: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    for buckets in [1u32, 6, 10, 60] {
        let quota = exact_quota.with_algorithm(Algorithm::SlidingWindow { buckets }).expect("valid");
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone());
        let (mut wrongly_allowed, mut wrongly_denied) = (0u64, 0u64);
        for &(t, k) in trace {
            clock.set_ms(START + t);
            // Each algorithm decides on its own state, as two deployments would.
            let e = backend.check_now(&names[k], &exact_quota, 1).allowed;
            let c = backend.check_now(&names[k], &quota, 1).allowed;
            wrongly_allowed += u64::from(c && !e);
            wrongly_denied += u64::from(e && !c);
        }
        let share = |n: u64| 100.0 * n as f64 / trace.len() as f64;
        println!(
            "| {buckets} | {wrongly_allowed} ({:.4}%) | {wrongly_denied} ({:.4}%) | {:.4}% |",
            share(wrongly_allowed),
            share(wrongly_denied),
            share(wrongly_allowed + wrongly_denied)
        );
    }
}

/// An hour of requests `(ms, key)`: each key alternates quiet stretches (a request every 1 to 9
/// seconds) with, one time in `burst_odds`, a burst of `burst` requests within 1 to 10 seconds.
/// Deterministic (a fixed xorshift seed).
fn trace(keys: usize, burst_odds: u64, burst: std::ops::Range<u64>) -> Vec<(u64, usize)> {
    let duration_ms = 3_600_000;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut rand = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut trace = Vec::new();
    for k in 0..keys {
        let mut t = rand(60_000);
        while t < duration_ms {
            if rand(burst_odds) == 0 {
                let (n, span) = (burst.start + rand(burst.end - burst.start), 1_000 + rand(9_000));
                for _ in 0..n {
                    trace.push((t + rand(span), k));
                }
                t += span;
            } else {
                trace.push((t, k));
                t += 1_000 + rand(8_000);
            }
        }
    }
    trace.sort_unstable();
    trace
}
