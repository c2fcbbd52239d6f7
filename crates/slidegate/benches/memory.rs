//! The memory backend beside governor (in-memory GCRA), on the peers harness' shapes:
//! W1 one hot key, 100 per 10 s (nearly every decision a denial); W2 10,000 keys drawn
//! uniformly, 100 per 60 s, in rounds of at most 500,000 decisions on a fresh limiter whose keys
//! were touched once beforehand (untimed), so that nearly every decision is an admission, as in
//! `../shared/peers`. One thread, and two threads sharing one limiter.

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use slidegate::{MemoryBackend, Quota};

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

fn bench(c: &mut Criterion) {
    for shape in shapes() {
        let mut group = c.benchmark_group(format!("memory/{}", shape.name));
        group.throughput(Throughput::Elements(1));
        let quota = Quota::new(u64::from(shape.limit), shape.window).expect("quota");
        let n = shape.keys.len();
        for threads in [1, 2] {
            let fresh_slidegate = || {
                let backend = MemoryBackend::new();
                for key in &shape.keys {
                    backend.check_now(key, &quota, 1);
                }
                backend
            };
            group.bench_function(format!("slidegate sliding log, {threads} thread(s)"), |b| {
                b.iter_custom(|iters| {
                    run_rounds(threads, iters, fresh_slidegate, |backend, rng| {
                        black_box(backend.check_now(&shape.keys[next_index(rng, n)], &quota, 1));
                    })
                });
            });
            let fresh_governor = || {
                let governor = governor_limiter(&shape);
                for key in &shape.keys {
                    let _ = governor.check_key(key);
                }
                governor
            };
            group.bench_function(format!("governor GCRA, {threads} thread(s)"), |b| {
                b.iter_custom(|iters| {
                    run_rounds(threads, iters, fresh_governor, |governor, rng| {
                        let _ = black_box(governor.check_key(&shape.keys[next_index(rng, n)]));
                    })
                });
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
