//! The memory backend beside governor (in-memory GCRA), on the peers harness' shapes:
//! W1 one hot key, 100 per 10 s (nearly every decision a denial); W2 10,000 keys drawn
//! uniformly, 100 per 60 s. One thread, and two threads sharing one limiter.

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

/// Runs `iters` decisions split over `threads` threads; returns the wall time.
fn run_threads(threads: u64, iters: u64, decide: impl Fn(u64, &mut u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let decide = &decide;
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
                for i in 0..iters / threads {
                    decide(i, &mut rng);
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    for shape in shapes() {
        let mut group = c.benchmark_group(format!("memory/{}", shape.name));
        group.throughput(Throughput::Elements(1));
        let quota = Quota::new(u64::from(shape.limit), shape.window).expect("quota");
        let n = shape.keys.len();
        for threads in [1, 2] {
            let backend = MemoryBackend::new();
            group.bench_function(format!("slidegate sliding log, {threads} thread(s)"), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, |_, rng| {
                        black_box(backend.check_now(&shape.keys[next_index(rng, n)], &quota, 1));
                    })
                });
            });
            let governor = governor_limiter(&shape);
            group.bench_function(format!("governor GCRA, {threads} thread(s)"), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, |_, rng| {
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
