//! `slidegate`: serve the rate-limit API, ask for one decision, or generate load.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use slidegate::{Algorithm, Quota};
use slidegate_server::backend::AnyBackend;
use slidegate_server::bench::{self, BenchOptions};
use slidegate_server::config::{Config, parse_duration};
use slidegate_server::redact::redact;
use slidegate_server::server::{self, ServeOptions};

// The service allocates a few small buffers per request (JSON in and out, headers); mimalloc
// serves them faster than glibc's allocator under two threads (bench/results/2026-12-01.md, §4).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "slidegate",
    version,
    about = "Exact distributed rate limiting: sliding window log on Redis or in memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP/JSON decision API (and, with --grpc, the Envoy rate limit service).
    Serve(ServeOptions),
    /// Decide once and print the decision; exit code 0 admitted, 1 denied, 2 error.
    Check {
        /// A rule of the rules file.
        #[arg(long, required_unless_present = "limit")]
        rule: Option<String>,
        /// The key (user, IP, phone number…).
        #[arg(long)]
        key: String,
        /// Permits asked for.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        /// The rule's tier.
        #[arg(long)]
        tier: Option<String>,
        /// Inline limit (instead of --rule).
        #[arg(long, requires = "window", conflicts_with = "rule")]
        limit: Option<u64>,
        /// Inline window, e.g. 10s (with --limit).
        #[arg(long)]
        window: Option<String>,
        /// TOML rules file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Redis URL (otherwise the file's, or a fresh in-process memory backend).
        #[arg(long)]
        redis: Option<String>,
    },
    /// Generate load against a server or a backend and report throughput and latency.
    Bench {
        /// `http://host:port` (a running server), `grpc://host:port` (its Envoy rate limit
        /// service), `memory`, `redis://host:port`, or `redis-cluster://host:port,host:port`.
        #[arg(long, default_value = "memory")]
        target: String,
        /// Distinct keys, uniformly drawn (1 = one hot key).
        #[arg(long, default_value_t = 1)]
        keys: u64,
        /// Requests in flight (with `--rate`: at most).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Send this many decisions per second on a fixed schedule (open loop) instead of each
        /// worker sending as soon as its last answer came (closed loop). A decision held back by
        /// a slow answer is timed from when it was due, so stalls show in the latencies.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        rate: Option<u64>,
        /// How long to run, e.g. 10s.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Quota limit.
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// Quota window, e.g. 60s.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        window: Duration,
        /// Quota algorithm.
        #[arg(long, default_value = "sliding_log")]
        algorithm: String,
        /// Against a server: check this rule instead of an inline quota.
        #[arg(long)]
        rule: Option<String>,
        /// Against a backend: a near-cache of this many denied keys (0: none).
        #[arg(long, default_value_t = 0)]
        near_cache: usize,
        /// Against Redis: which code decides (`auto`: the module when loaded, `lua`, `module`).
        #[arg(long, default_value = "auto")]
        redis_engine: slidegate::RedisEngine,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // One decision in flight has nothing to spread over threads: on one thread, each answer
    // wakes the waiting task where it runs, without a hop between threads.
    let mut builder = match &cli.command {
        Command::Bench { concurrency: 1, .. } | Command::Check { .. } => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            // An error can quote a Redis URL (a connect error, a bad flag): never its password.
            eprintln!("error: {}", redact(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(options) => {
            server::serve(options).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { rule, key, cost, tier, limit, window, config, redis } => {
            let config = match &config {
                Some(path) => Config::load(path)?,
                None => Config::default(),
            };
            let (name, quota) = match (&rule, limit) {
                (Some(rule), _) => {
                    let r = config.rules.get(rule).with_context(|| format!("no rule {rule:?} in the rules file"))?;
                    (
                        rule.clone(),
                        r.quota_for(tier.as_deref()).with_context(|| format!("rule {rule:?} has no tier {tier:?}"))?,
                    )
                }
                (None, Some(limit)) => {
                    let window = parse_duration(window.as_deref().unwrap_or_default()).map_err(anyhow::Error::msg)?;
                    ("inline".to_owned(), Quota::new(limit, window)?)
                }
                (None, None) => anyhow::bail!("give --rule or --limit and --window"),
            };
            let mut backend_config = config.backend;
            if let Some(url) = redis {
                (backend_config.redis, backend_config.redis_cluster, backend_config.redis_sentinel) =
                    (Some(url), Vec::new(), Vec::new());
            }
            // The same key layout as the server's, so a check here and there share state; one
            // decision has no use for a near-cache.
            backend_config.near_cache = 0;
            let limiter = AnyBackend::connect(&backend_config).await?.limiter(&backend_config);
            let d = limiter.check_cost(&format!("{name}:{{{key}}}"), &quota, cost).await?;
            println!(
                "{}",
                serde_json::json!({
                    "rule": name, "allowed": d.allowed, "limit": d.limit, "remaining": d.remaining,
                    "reset_after_ms": d.reset_after.as_millis(), "retry_after_ms": d.retry_after.map(|r| r.as_millis()),
                })
            );
            Ok(if d.allowed { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Bench {
            target,
            keys,
            concurrency,
            rate,
            duration,
            limit,
            window,
            algorithm,
            rule,
            near_cache,
            redis_engine,
            json,
        } => {
            let algorithm: Algorithm = algorithm.parse()?;
            let quota = Quota::new(limit, window)?.with_algorithm(algorithm)?;
            let report = bench::run(BenchOptions {
                target,
                keys,
                concurrency,
                rate,
                duration,
                quota,
                rule,
                near_cache,
                redis_engine,
                progress: !json,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("{report}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
