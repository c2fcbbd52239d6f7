//! The Redis backend on a redis-server this bench starts: W1 one hot key (100 per 10 s) and
//! W2 10,000 uniform keys (100 per 60 s), one decision at a time and 64 in flight over the one
//! pipelined connection. For ratios to Redis' own ceiling, `bench/redis_ceiling.py` runs
//! redis-benchmark and the load generator side by side.

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use slidegate::{Limiter, Quota, RedisBackend};
use slidegate_testkit::RedisServer;

fn bench(c: &mut Criterion) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let backend =
        rt.block_on(RedisBackend::connect(&server.url())).expect("connect").with_timeout(Duration::from_secs(5));
    let limiter = Arc::new(Limiter::new(backend));
    let shapes: [(&str, u64, Quota); 2] = [
        ("W1 hot key", 1, Quota::new(100, Duration::from_secs(10)).expect("quota")),
        ("W2 10k keys", 10_000, Quota::new(100, Duration::from_secs(60)).expect("quota")),
    ];
    for (name, keys, quota) in shapes {
        let mut group = c.benchmark_group(format!("redis/{name}"));
        group.throughput(Throughput::Elements(1));
        let keys: Arc<Vec<String>> = Arc::new((0..keys).map(|i| format!("rl:{i}")).collect());
        for in_flight in [1u64, 64] {
            group.bench_function(format!("{in_flight} in flight"), |b| {
                b.iter_custom(|iters| {
                    let counter = Arc::new(AtomicU64::new(0));
                    rt.block_on(async {
                        let start = Instant::now();
                        let tasks: Vec<_> = (0..in_flight)
                            .map(|_| {
                                let (limiter, keys, counter) =
                                    (Arc::clone(&limiter), Arc::clone(&keys), Arc::clone(&counter));
                                tokio::spawn(async move {
                                    loop {
                                        let i = counter.fetch_add(1, Ordering::Relaxed);
                                        if i >= iters {
                                            break;
                                        }
                                        let key =
                                            &keys[(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys.len() as u64) as usize];
                                        limiter.check(key, &quota).await.expect("check");
                                    }
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("task");
                        }
                        start.elapsed()
                    })
                });
            });
        }
        group.finish();
    }
    drop(server);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(20);
    targets = bench
}
criterion_main!(benches);
