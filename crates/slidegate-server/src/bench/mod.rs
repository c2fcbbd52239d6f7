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
//!
//! Over gRPC the workers are streams of one HTTP/2 connection (`connections` of them), all of a
//! connection's driven in one task with it (`grpc.rs`), as h2load's `-c 1 -m <concurrency>`
//! does: the generator then costs far less per call than the servers it loads.
//!
//! Built only with the crate's `bench` feature (`cargo build --release --features bench`), so
//! that the clients it loads a server with are not part of the production server.

mod grpc;
mod histogram;
mod http;
mod report;
mod target;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use slidegate::{Algorithm, Quota};

pub use report::Report;
use target::Target;
use worker::{Load, Tally};

use crate::config::parse_duration;

/// The domain `slidegate bench` asks a gRPC target about; its config must have a descriptor
/// `key` with a limit, e.g. `bench/envoy/bench.yaml`.
pub const GRPC_DOMAIN: &str = "bench";

/// The most keys a run draws from: each key's name and, against a server, its request are made
/// before the run (a few hundred MB at this bound).
pub const MAX_KEYS: u64 = 1_000_000;

/// `slidegate bench`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// `http://host:port` (a running server), `grpc://host:port` (its Envoy rate limit
    /// service), `memory`, `redis://host:port` (`rediss://` over TLS, trusting `SSL_CERT_FILE` or the system store), or `redis-cluster://host:port,host:port`.
    #[arg(long, default_value = "memory")]
    pub target: String,
    /// Distinct keys, uniformly drawn (1 = one hot key), at most [`MAX_KEYS`].
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=MAX_KEYS))]
    pub keys: u64,
    /// Requests in flight (with `--rate`: at most).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Against a gRPC target: HTTP/2 connections, the requests in flight spread over them, each
    /// driven in a task of its own. On one, the server and the generator take turns on a batch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub connections: u64,
    /// Send this many decisions per second on a fixed schedule (open loop) instead of each
    /// worker sending as soon as its last answer came (closed loop). A decision held back by
    /// a slow answer is timed from when it was due, so stalls show in the latencies.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: Option<u64>,
    /// How long to run, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Quota limit.
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Quota window, e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub window: Duration,
    /// Quota algorithm.
    #[arg(long, default_value = "sliding_log")]
    pub algorithm: String,
    /// Against a server: check this rule instead of an inline quota.
    #[arg(long)]
    pub rule: Option<String>,
    /// Against a backend: a near-cache of this many denied keys (0: none).
    #[arg(long, default_value_t = 0)]
    pub near_cache: usize,
    /// Against Redis: which code decides (`auto`: the module when loaded, `lua`, `module`).
    #[arg(long, default_value = "auto")]
    pub redis_engine: slidegate::RedisEngine,
    /// Against Redis: answer each admission only once this many replicas acknowledged it
    /// (`WAIT`, as `serve --redis-replicas-ack`; 0: none).
    #[arg(long, default_value_t = 0)]
    pub redis_replicas_ack: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// The run these flags ask for; progress lines unless `--json`.
    pub fn options(self) -> anyhow::Result<BenchOptions> {
        let algorithm: Algorithm = self.algorithm.parse()?;
        Ok(BenchOptions {
            quota: Quota::new(self.limit, self.window)?.with_algorithm(algorithm)?,
            target: self.target,
            keys: self.keys,
            concurrency: self.concurrency,
            connections: self.connections,
            rate: self.rate,
            duration: self.duration,
            rule: self.rule,
            near_cache: self.near_cache,
            redis_engine: self.redis_engine,
            replicas_ack: self.redis_replicas_ack,
            progress: !self.json,
        })
    }
}

/// What to load and how hard.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `memory`, `redis://host:port` (`rediss://` over TLS), `redis-cluster://host:port,host:port…`,
    /// `http://host:port` (a running `slidegate serve`) or `grpc://host:port` (its Envoy
    /// rate limit service, domain [`GRPC_DOMAIN`]).
    pub target: String,
    /// With a library target: a near-cache of this many denied keys (0: none).
    pub near_cache: usize,
    /// With a Redis target: which code decides.
    pub redis_engine: slidegate::RedisEngine,
    /// With a Redis target: the replicas each admission waits for (`WAIT`; 0: none).
    pub replicas_ack: u32,
    /// Distinct keys, drawn uniformly (1 = one hot key).
    pub keys: u64,
    /// Decisions in flight (at most, with a `rate`).
    pub concurrency: usize,
    /// With a gRPC target: connections (at least 1, at most `concurrency`).
    pub connections: u64,
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

/// Runs the load and returns what it measured.
pub async fn run(options: BenchOptions) -> anyhow::Result<Report> {
    let keys: Vec<String> = (0..options.keys.max(1)).map(|i| format!("bench:{i}")).collect();
    let (target, connections) = Target::connect(&options, &keys).await?;
    let started = Instant::now();
    let load = Arc::new(Load {
        target,
        keys,
        quota: options.quota,
        rate: options.rate,
        workers: options.concurrency.max(1) as u64,
        started,
        deadline: started + options.duration,
        done: AtomicBool::new(false),
        decided: AtomicU64::new(0),
    });
    let workers: Vec<_> = if connections.is_empty() {
        (0..load.workers)
            .map(|w| {
                let load = Arc::clone(&load);
                tokio::spawn(async move { worker::work(&load, w).await })
            })
            .collect()
    } else {
        // gRPC: each worker a stream of a connection, all of a connection's in one task with it.
        let n = connections.len();
        let drive = |(c, connection)| tokio::spawn(grpc::drive(connection, Arc::clone(&load), c, n));
        connections.into_iter().enumerate().map(drive).collect()
    };
    wait_for_the_deadline(&load, options.progress).await;
    load.done.store(true, Ordering::Relaxed);
    let mut tally = Tally::new();
    for w in workers {
        tally.merge(&w.await?);
    }
    Ok(Report::new(&options, load.target.engine(), &tally, started.elapsed()))
}

/// Sleeps until `load`'s deadline, printing the decisions per second of each second on the way
/// when `progress` is set.
async fn wait_for_the_deadline(load: &Load, progress: bool) {
    let mut last = (load.started, 0);
    while Instant::now() < load.deadline {
        tokio::time::sleep((load.deadline - Instant::now()).min(Duration::from_secs(1))).await;
        if progress {
            let (now, n) = (Instant::now(), load.decided.load(Ordering::Relaxed));
            let rate = (n - last.1) as f64 / (now - last.0).as_secs_f64();
            eprintln!("{:>6.1}s  {:>12.0} decisions/s", (now - load.started).as_secs_f64(), rate);
            last = (now, n);
        }
    }
}
