//! `slidegate bench`: a load generator. `concurrency` workers each keep one decision in flight
//! against a running server (`http://…`) or straight against a backend through the library
//! (`memory`, `redis://…`), for a fixed time, bounded in count as well.
//!
//! Closed loop by default: a worker sends its next decision as soon as the last is answered, so
//! the load adapts to the target and the latencies are those of that load. With a `rate` the
//! load is open loop: decision `i` is due at `i / rate` seconds, worker `w` sends those with `i
//! mod concurrency = w`, and a decision that falls due while the target holds its worker's last
//! one (or behind such a decision) is sent when the worker is free and timed from when it was
//! due. A closed-loop generator would time it from when it was sent and so hide the stall behind
//! it ("coordinated omission"). A decision that is late for the generator's own reasons is timed
//! from when it was sent: the runtime's timer wakes a worker up to a millisecond late, and that
//! delay is not the target's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use slidegate::{Limiter, MemoryBackend, Quota, RedisBackend};

use crate::backend::AnyBackend;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// What to load and how hard.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `memory`, `redis://host:port`, `redis-cluster://host:port,host:port…`,
    /// `http://host:port` (a running `slidegate serve`) or `grpc://host:port` (its Envoy
    /// rate limit service, domain [`GRPC_DOMAIN`]).
    pub target: String,
    /// With a library target: a near-cache of this many denied keys (0: none).
    pub near_cache: usize,
    /// With a Redis target: which code decides.
    pub redis_engine: slidegate::RedisEngine,
    /// Distinct keys, drawn uniformly (1 = one hot key).
    pub keys: u64,
    /// Decisions in flight (at most, with a `rate`).
    pub concurrency: usize,
    /// Decisions per second on a fixed schedule (open loop); `None`: closed loop.
    pub rate: Option<u64>,
    /// How long to run.
    pub duration: Duration,
    /// The quota.
    pub quota: Quota,
    /// Against a server: check this rule instead of an inline quota.
    pub rule: Option<String>,
    /// Print progress every second (to stderr).
    pub progress: bool,
}

/// The outcome, as the table and `--json` show it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The target.
    pub target: String,
    /// With a library target, the code that decided at the end: `memory`, `lua` or `module`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<&'static str>,
    /// Distinct keys.
    pub keys: u64,
    /// Decisions in flight (at most, with a `rate`).
    pub concurrency: usize,
    /// The scheduled decisions per second, when open loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Open loop: decisions held back by the target, timed from when they were due.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late: Option<u64>,
    /// Seconds measured.
    pub duration_s: f64,
    /// Decisions answered per second (admitted or denied).
    pub decisions_per_sec: f64,
    /// Latency percentiles of answered decisions, µs.
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Slowest, µs.
    pub max_us: u64,
    /// Admitted decisions.
    pub allowed: u64,
    /// Denied decisions.
    pub denied: u64,
    /// Failed calls (transport, backend or HTTP errors).
    pub errors: u64,
}

/// Latencies in µs in log-linear buckets: exact below 128 µs, above it within 1/128 (0.8%), never
/// under; 26 KiB per worker however long the run (keeping every sample cost a long run on the
/// memory backend hundreds of MB, and 3.5% of the client's CPU in page faults at 64 in flight).
struct Histogram {
    counts: Vec<u64>,
    max: u32,
}

/// Sub-buckets per power of two, as bits.
const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;

impl Histogram {
    fn new() -> Self {
        Self { counts: vec![0; (33 - SUB_BITS as usize) * SUB], max: 0 }
    }

    fn bucket(us: u32) -> usize {
        if (us as usize) < SUB {
            return us as usize;
        }
        let shift = 31 - us.leading_zeros() - SUB_BITS;
        ((shift as usize + 1) << SUB_BITS) + (us >> shift) as usize - SUB
    }

    /// The largest value that falls in bucket `b`.
    fn highest(b: usize) -> u64 {
        if b < SUB {
            return b as u64;
        }
        let shift = (b >> SUB_BITS) - 1;
        ((((b & (SUB - 1)) + SUB + 1) as u64) << shift) - 1
    }

    fn record(&mut self, us: u32) {
        self.counts[Self::bucket(us)] += 1;
        self.max = self.max.max(us);
    }

    fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `p`-th percentile: the smallest recorded value with `p`% of the samples at or below
    /// it, rounded up to its bucket's top (0 with no samples).
    fn percentile(&self, p: f64) -> u64 {
        let rank = ((p / 100.0 * self.count() as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::highest(b).min(u64::from(self.max));
            }
        }
        0
    }
}

/// Decisions at most per worker, so a run ends even on a clock that stalls.
const MAX_PER_WORKER: u64 = 50_000_000;

enum Target {
    Library(Limiter<AnyBackend>),
    Http {
        client: reqwest::Client,
        url: String,
        bodies: Vec<String>,
    },
    /// The Envoy rate limit service: domain `bench`, one descriptor `key` = the key.
    Grpc(RateLimitServiceClient<tonic::transport::Channel>),
}

/// The domain `slidegate bench` asks a gRPC target about; its config must have a descriptor
/// `key` with a limit, e.g. `bench/envoy/bench.yaml`.
pub const GRPC_DOMAIN: &str = "bench";

impl Target {
    /// One decision: `Ok(allowed)`.
    async fn decide(&self, key_index: usize, keys: &[String], quota: &Quota) -> anyhow::Result<bool> {
        match self {
            Self::Library(limiter) => Ok(limiter.check(&keys[key_index], quota).await?.allowed),
            Self::Http { client, url, bodies } => {
                let response = client
                    .post(url.as_str())
                    .header("content-type", "application/json")
                    .body(bodies[key_index].clone())
                    .send()
                    .await?;
                let status = response.status();
                let body = response.bytes().await?;
                anyhow::ensure!(status.is_success(), "HTTP {status}");
                Ok(serde_json::from_slice::<Allowed>(&body)?.allowed)
            }
            Self::Grpc(client) => {
                let request = RateLimitRequest {
                    domain: GRPC_DOMAIN.to_owned(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry { key: "key".to_owned(), value: keys[key_index].clone() }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 0,
                };
                let response = client.clone().should_rate_limit(request).await?.into_inner();
                Ok(response.overall_code == Code::Ok as i32)
            }
        }
    }
}

/// The one field of a decision the load generator needs.
#[derive(serde::Deserialize)]
struct Allowed {
    allowed: bool,
}

/// Runs the load and returns what it measured.
pub async fn run(options: BenchOptions) -> anyhow::Result<Report> {
    let keys: Arc<Vec<String>> = Arc::new((0..options.keys.max(1)).map(|i| format!("bench:{i}")).collect());
    let library = |backend: AnyBackend| {
        let limiter = Limiter::new(backend);
        Target::Library(if options.near_cache > 0 { limiter.with_near_cache(options.near_cache) } else { limiter })
    };
    let target = if options.target == "memory" {
        library(AnyBackend::Memory(MemoryBackend::new()))
    } else if options.target.starts_with("redis://") {
        let backend = RedisBackend::connect(&options.target).await.context("connecting to Redis")?;
        library(AnyBackend::Redis(backend.with_timeout(Duration::from_secs(2)).with_engine(options.redis_engine)))
    } else if let Some(nodes) = options.target.strip_prefix("redis-cluster://") {
        let urls: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let backend = RedisBackend::connect_cluster(&urls).await.context("connecting to the Redis Cluster")?;
        library(AnyBackend::Cluster(backend.with_timeout(Duration::from_secs(2)).with_engine(options.redis_engine)))
    } else if let Some(addr) = options.target.strip_prefix("grpc://") {
        let client = RateLimitServiceClient::connect(format!("http://{addr}")).await.context("connecting over gRPC")?;
        Target::Grpc(client)
    } else if options.target.starts_with("http://") {
        let url = format!("{}/v1/check", options.target.trim_end_matches('/'));
        let q = &options.quota;
        let bodies = keys
            .iter()
            .map(|k| match &options.rule {
                Some(rule) => serde_json::json!({"rule": rule, "key": k}).to_string(),
                None => serde_json::json!({
                    "key": k, "limit": q.limit(), "window": format!("{}ms", q.window_ms()), "algorithm": q.algorithm().as_str(),
                })
                .to_string(),
            })
            .collect();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(options.concurrency)
            .timeout(Duration::from_secs(5))
            .build()?;
        Target::Http { client, url, bodies }
    } else {
        anyhow::bail!(
            "--target must be `memory`, `redis://…`, `redis-cluster://…`, `http://…` or `grpc://…`, got {:?}",
            options.target
        );
    };
    let target = Arc::new(target);

    let done = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + options.duration;
    let workers: Vec<_> = (0..options.concurrency.max(1))
        .map(|w| {
            let (target, keys, done, decided) =
                (Arc::clone(&target), Arc::clone(&keys), Arc::clone(&done), Arc::clone(&decided));
            let (quota, workers) = (options.quota, options.concurrency.max(1) as u64);
            // Open loop: this worker's k-th decision is due at (k * workers + w) / rate seconds.
            let due = options.rate.map(|rate| {
                move |k: u64| started + Duration::from_secs_f64((k * workers + w as u64) as f64 / rate as f64)
            });
            tokio::spawn(async move {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((w as u64 + 1) << 17);
                let (mut latencies, mut allowed, mut errors, mut late) = (Histogram::new(), 0u64, 0u64, 0u64);
                // When this worker's last decision went out, when its answer came, and whether
                // it was held back by the target (then so is every decision that fell due
                // before it went out: they queued behind the same stall).
                let (mut sent, mut answered, mut held) = (started, started, false);
                for i in 0..MAX_PER_WORKER {
                    if i % 64 == 63 {
                        // A memory backend never makes a worker wait: let the timer and the
                        // progress printer run.
                        tokio::task::yield_now().await;
                    }
                    let now = Instant::now();
                    let t = match &due {
                        None => now,
                        Some(due) => match due(i) {
                            at if at >= deadline => break,
                            at if at > now => {
                                held = false;
                                tokio::time::sleep_until(at.into()).await;
                                Instant::now()
                            }
                            at => {
                                held = (sent < at && at < answered) || (at <= sent && held);
                                if held {
                                    // Held back by the target: timed from when it was due.
                                    late += 1;
                                    at
                                } else {
                                    // Behind for the generator's own reasons (start-up, a timer
                                    // that woke late).
                                    now
                                }
                            }
                        },
                    };
                    if done.load(Ordering::Relaxed) || t >= deadline {
                        break;
                    }
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let index = (rng % keys.len() as u64) as usize;
                    sent = Instant::now();
                    let outcome = target.decide(index, &keys, &quota).await;
                    answered = Instant::now();
                    match outcome {
                        Ok(a) => {
                            latencies.record(u32::try_from((answered - t).as_micros()).unwrap_or(u32::MAX));
                            allowed += u64::from(a);
                            decided.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => errors += 1,
                    }
                }
                (latencies, allowed, errors, late)
            })
        })
        .collect();

    let mut last = (started, 0);
    while Instant::now() < deadline {
        tokio::time::sleep((deadline - Instant::now()).min(Duration::from_secs(1))).await;
        if options.progress {
            let (now, n) = (Instant::now(), decided.load(Ordering::Relaxed));
            let rate = (n - last.1) as f64 / (now - last.0).as_secs_f64();
            eprintln!("{:>6.1}s  {:>12.0} decisions/s", (now - started).as_secs_f64(), rate);
            last = (now, n);
        }
    }
    done.store(true, Ordering::Relaxed);
    let (mut latencies, mut allowed, mut errors, mut late) = (Histogram::new(), 0, 0, 0);
    for w in workers {
        let (l, a, e, held) = w.await?;
        latencies.merge(&l);
        allowed += a;
        errors += e;
        late += held;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let answered = latencies.count();
    let engine = match &*target {
        Target::Library(limiter) => Some(limiter.backend().engine()),
        _ => None,
    };
    Ok(Report {
        // The report is printed and shared: a Redis target's password stays out of it.
        target: crate::redact::redact(&options.target).into_owned(),
        engine,
        keys: options.keys,
        concurrency: options.concurrency,
        rate: options.rate,
        late: options.rate.map(|_| late),
        duration_s: elapsed,
        decisions_per_sec: answered as f64 / elapsed,
        p50_us: latencies.percentile(50.0),
        p90_us: latencies.percentile(90.0),
        p99_us: latencies.percentile(99.0),
        max_us: u64::from(latencies.max),
        allowed,
        denied: answered - allowed,
        errors,
    })
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "target        {}", self.target)?;
        if let Some(engine) = self.engine {
            writeln!(f, "engine        {engine}")?;
        }
        writeln!(f, "keys          {}", self.keys)?;
        writeln!(f, "concurrency   {}", self.concurrency)?;
        if let (Some(rate), Some(late)) = (self.rate, self.late) {
            writeln!(f, "rate          {rate}/s scheduled; {late} held back by the target")?;
        }
        writeln!(f, "duration      {:.2} s", self.duration_s)?;
        writeln!(f, "decisions/s   {:.0}", self.decisions_per_sec)?;
        writeln!(
            f,
            "latency µs    p50 {}  p90 {}  p99 {}  max {}",
            self.p50_us, self.p90_us, self.p99_us, self.max_us
        )?;
        writeln!(f, "admitted      {}", self.allowed)?;
        writeln!(f, "denied        {}", self.denied)?;
        write!(f, "errors        {}", self.errors)
    }
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    #[test]
    fn buckets_tile_every_value() {
        let mut v = 1u32;
        while v < u32::MAX / 3 {
            for us in [v - 1, v, v + 1, v.saturating_mul(3) / 2] {
                let b = Histogram::bucket(us);
                assert!(Histogram::highest(b) >= u64::from(us), "{us} above its bucket {b}");
                assert!(b == 0 || Histogram::highest(b - 1) < u64::from(us), "{us} belongs below bucket {b}");
            }
            v = v * 2 + 1;
        }
        assert_eq!(Histogram::highest(Histogram::bucket(u32::MAX)), u64::from(u32::MAX));
    }

    #[test]
    fn percentiles_are_exact_or_at_most_one_128th_over() {
        let mut samples = Vec::new();
        let mut h = Histogram::new();
        let mut x = 0x2545_F491_4F6C_DD1D_u64;
        for i in 0..100_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly tens to thousands of µs, some very slow.
            let us = (x % (1 << (5 + i % 12))) as u32;
            samples.push(us);
            h.record(us);
        }
        samples.sort_unstable();
        assert_eq!(h.count(), samples.len() as u64);
        for p in [1.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
            let exact = u64::from(samples[((p / 100.0 * samples.len() as f64).ceil() as usize).max(1) - 1]);
            let got = h.percentile(p);
            assert!(got >= exact && got <= exact + exact / 128, "p{p}: {got} against {exact}");
        }
        assert_eq!(h.percentile(100.0), u64::from(*samples.last().expect("samples")));
        assert_eq!(Histogram::new().percentile(50.0), 0);
    }
}
