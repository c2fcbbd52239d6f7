//! The memory backend beside governor (in-memory GCRA), on the shapes of every benchmark here:
//! W1 one hot key, 100 per 10 s (nearly every decision a denial); W2 10,000 keys drawn
//! uniformly, 100 per 60 s, in rounds of at most 500,000 decisions on a fresh limiter whose keys
//! were touched once beforehand (untimed), so that nearly every decision is an admission. One
//! thread, and two threads sharing one limiter.

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use slidegate::{ManualClock, MemoryBackend, Quota};

struct Shape {
    name: &'static str,
    keys: Vec<String>,
    limit: u32,
    window: Duration,
}

fn shapes() -> [Shape; 2] {
    [
        Shape { name: "W1 hot key", keys: vec!["rl:w1:hot".to_owned()], limit: 100, window: Duration::from_secs(10) },
        Shape {
            name: "W2 10k keys",
            keys: (0..10_000).map(|i| format!("rl:w2:{i}")).collect(),
            limit: 100,
            window: Duration::from_secs(60),
        },
    ]
}

/// A cheap uniform key index per decision, the same sequence for both limiters.
fn next_index(state: &mut u64, n: usize) -> usize {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % n as u64) as usize
}

fn governor_limiter(shape: &Shape) -> DefaultKeyedRateLimiter<String> {
    let quota = governor::Quota::with_period(shape.window / shape.limit)
        .expect("period")
        .allow_burst(NonZeroU32::new(shape.limit).expect("limit"));
    RateLimiter::keyed(quota)
}

/// Decisions per round at most: W2 keys then hold at most ~50 entries on average.
const ROUND: u64 = 500_000;

/// Runs `iters` decisions split over `threads` threads, in rounds of at most [`ROUND`] on a
/// fresh limiter from `fresh` (untimed); returns the wall time of the decisions.
fn run_rounds<L: Sync>(
    threads: u64,
    iters: u64,
    fresh: impl Fn() -> L,
    decide: impl Fn(&L, &mut u64) + Sync,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(ROUND);
        left -= n;
        let limiter = fresh();
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (decide, limiter) = (&decide, &limiter);
                s.spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
                    for _ in 0..n / threads {
                        decide(limiter, &mut rng);
                    }
                });
            }
        });
        total += start.elapsed();
    }
    total
}

fn fresh_slidegate(shape: &Shape, quota: &Quota) -> MemoryBackend {
    let backend = MemoryBackend::new();
    for key in &shape.keys {
        backend.check_now(key, quota, 1);
    }
    backend
}

fn fresh_governor(shape: &Shape) -> DefaultKeyedRateLimiter<String> {
    let governor = governor_limiter(shape);
    for key in &shape.keys {
        let _ = governor.check_key(key);
    }
    governor
}

/// Wall time of `iters` slidegate decisions over `threads` threads.
fn time_slidegate(shape: &Shape, quota: &Quota, threads: u64, iters: u64) -> Duration {
    let n = shape.keys.len();
    run_rounds(
        threads,
        iters,
        || fresh_slidegate(shape, quota),
        |backend, rng| {
            black_box(backend.check_now(&shape.keys[next_index(rng, n)], quota, 1));
        },
    )
}

/// Wall time of `iters` governor decisions over `threads` threads.
fn time_governor(shape: &Shape, threads: u64, iters: u64) -> Duration {
    let n = shape.keys.len();
    run_rounds(
        threads,
        iters,
        || fresh_governor(shape),
        |governor, rng| {
            let _ = black_box(governor.check_key(&shape.keys[next_index(rng, n)]));
        },
    )
}

fn bench(c: &mut Criterion) {
    for shape in shapes() {
        let mut group = c.benchmark_group(format!("memory/{}", shape.name));
        group.throughput(Throughput::Elements(1));
        let quota = Quota::new(u64::from(shape.limit), shape.window).expect("quota");
        for threads in [1, 2] {
            group.bench_function(format!("slidegate sliding log, {threads} thread(s)"), |b| {
                b.iter_custom(|iters| time_slidegate(&shape, &quota, threads, iters));
            });
            group.bench_function(format!("governor GCRA, {threads} thread(s)"), |b| {
                b.iter_custom(|iters| time_governor(&shape, threads, iters));
            });
        }
        group.finish();
    }
}

/// A denial deep in the longest log: a key holding `MAX_LOG_LIMIT` (100,000) admissions (one per
/// ms, or 1,000 per call), denied a cost of 50,000, must find its 50,000th oldest admission —
/// marks keep that to a few hundred gaps read instead of fifty thousand.
fn deep_denial(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory/deep denial");
    let limit = slidegate::MAX_LOG_LIMIT;
    let quota = Quota::new(limit, Duration::from_secs(3_600)).expect("quota");
    for (name, cost) in [("one admission per ms", 1), ("1,000 admissions per call", 1_000)] {
        let clock = ManualClock::new(0);
        let backend = MemoryBackend::with_clock(clock.clone());
        for t in 0..limit / cost {
            clock.set_ms(t);
            assert!(backend.check_now("deep", &quota, cost).allowed);
        }
        group.bench_function(name, |b| b.iter(|| black_box(backend.check_now("deep", &quota, limit / 2))));
    }
    group.finish();
}

/// The ratio the issue sets a target on, measured so that the VM's drift cancels: criterion
/// runs one function after the other, and a shared machine's speed can move by 2x over seconds,
/// so two functions timed minutes apart are not comparable. Here each pair times slidegate and
/// governor back to back on the same number of decisions, in alternating order, and the table
/// gives the median of the per-pair ratios (slidegate's decisions/s over governor's).
fn paired(pairs: usize, decisions: u64) {
    println!("\n| shape | threads | slidegate / governor, median of {pairs} pairs | range |\n|---|---|---|---|");
    for shape in shapes() {
        let quota = Quota::new(u64::from(shape.limit), shape.window).expect("quota");
        for threads in [1, 2] {
            let mut ratios: Vec<f64> = (0..pairs)
                .map(|i| {
                    let ours = || time_slidegate(&shape, &quota, threads, decisions);
                    let theirs = || time_governor(&shape, threads, decisions);
                    let (ours, theirs) = if i % 2 == 0 {
                        (ours(), theirs())
                    } else {
                        let t = theirs();
                        (ours(), t)
                    };
                    theirs.as_secs_f64() / ours.as_secs_f64()
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            let (low, median, high) = (ratios[0], ratios[pairs / 2], ratios[pairs - 1]);
            println!("| {} | {threads} | **{median:.2}** | {low:.2}–{high:.2} |", shape.name);
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench, deep_denial
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this once, as a smoke test.
    if std::env::args().any(|a| a == "--bench") {
        paired(15, 1_000_000);
    } else {
        paired(1, 20_000);
    }
}
