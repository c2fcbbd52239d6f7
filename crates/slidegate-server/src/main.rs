//! `slidegate`: serve the rate-limit API, validate its configuration, ask for one decision, or
//! generate load.

// `serve`'s future nests every surface's futures, each backend call inside a tracing span's:
// its layout takes more than the default 128 levels of queries to compute.
#![recursion_limit = "256"]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use slidegate::Quota;
use slidegate_server::backend::AnyBackend;
#[cfg(feature = "bench")]
use slidegate_server::bench::{self, BenchArgs};
use slidegate_server::config::{Config, INLINE_RULE, parse_duration};
use slidegate_server::logging::LogOptions;
use slidegate_server::redact::redact;
use slidegate_server::server::{self, ServeOptions};
use slidegate_server::shared_rules::cli::{self as rules, RulesArgs};
use slidegate_server::trace::export::Exporter;
use slidegate_server::validate::{self, ValidateArgs};

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
    #[command(flatten)]
    log: LogOptions,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP/JSON decision API (and, with --grpc, the Envoy rate limit service).
    Serve(Box<ServeOptions>),
    /// Load the rules file and the Envoy configuration as `serve` would, without serving; print
    /// each problem (exit code 1) or a summary (exit code 0).
    Validate(ValidateArgs),
    /// Decide once and print the decision; exit code 0 admitted, 1 denied, 2 error.
    Check(CheckArgs),
    /// Push the rules of every instance started with --rules-from-redis to their Redis, or show
    /// the rules stored there.
    Rules(RulesArgs),
    /// Generate load against a server or a backend and report throughput and latency.
    #[cfg(feature = "bench")]
    Bench(BenchArgs),
    /// Generate load (not in this build: build with `--features bench`).
    #[cfg(not(feature = "bench"))]
    #[command(disable_help_flag = true)]
    Bench {
        /// The flags a build with the load generator takes.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        _flags: Vec<String>,
    },
}

impl Command {
    /// One decision in flight has nothing to spread over threads: on one thread, each answer
    /// wakes the waiting task where it runs, without a hop between threads.
    fn one_in_flight(&self) -> bool {
        match self {
            Self::Check(_) | Self::Rules(_) => true,
            #[cfg(feature = "bench")]
            Self::Bench(args) => args.concurrency == 1,
            _ => false,
        }
    }
}

#[derive(clap::Args)]
struct CheckArgs {
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
}

/// The command line (and the `SLIDEGATE_*` variables): a usage error exits 2 with clap's words.
fn parse() -> Cli {
    let matches = Cli::command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| {
        let mut command = Cli::command();
        match command.find_subcommand_mut("serve") {
            Some(serve) if matches.subcommand_name() == Some("serve") => e.format(serve).exit(),
            _ => e.format(&mut command).exit(),
        }
    })
}

fn main() -> ExitCode {
    let cli = parse();
    let mut builder = if cli.command.one_in_flight() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // The exporter's batches are sent from a task on the runtime.
    let exporter = {
        let _entered = runtime.enter();
        match start_logging(&cli) {
            Ok(exporter) => exporter,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let outcome = runtime.block_on(async {
        let outcome = run(cli.command).await;
        if let Some(exporter) = exporter {
            exporter.shutdown().await;
        }
        outcome
    });
    match outcome {
        Ok(code) => code,
        Err(e) => {
            // An error can quote a Redis URL (a connect error, a bad flag): never its password.
            eprintln!("error: {}", redact(&causes(&e)));
            ExitCode::from(2)
        }
    }
}

/// `e` and its causes, `: `-joined, leaving out a cause whose text ends what is already said: a
/// wrapper that repeats its source's message (an I/O error carrying a TLS alert, in a Redis
/// error) would say it once per layer.
fn causes(e: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if said.ends_with(&cause) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&cause);
    }
    said
}

/// Installs the logger, with `serve`'s trace exporter when its flags ask for one.
fn start_logging(cli: &Cli) -> Result<Option<Exporter>, String> {
    let exporter = match &cli.command {
        Command::Serve(options) => {
            // The exporter feeds the logger, so it starts before `serve` reads its rules file:
            // the file's tracing fields are read here, once.
            let config = Config::load_over(options.config.as_deref(), &options.settings);
            config.map_err(|e| redact(&e.to_string()).into_owned())?.tracing.install()?
        }
        _ => None,
    };
    cli.log.init(exporter.as_ref().map(Exporter::tracer))?;
    Ok(exporter)
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(options) => {
            server::serve(*options).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate(args) => Ok(validate(&args)),
        Command::Check(args) => check(args).await,
        Command::Rules(args) => rules::run(args).await,
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench(args).await,
        #[cfg(not(feature = "bench"))]
        Command::Bench { .. } => anyhow::bail!(
            "this slidegate is built without the load generator; build it with `--features bench`: \
             `cargo run --release --features bench -- bench …`"
        ),
    }
}

/// `slidegate validate`: the problems on stderr (exit code 1), or the summary on stdout.
fn validate(args: &ValidateArgs) -> ExitCode {
    let report = validate::validate(args);
    for problem in &report.problems {
        eprintln!("{problem}");
    }
    if !report.problems.is_empty() {
        return ExitCode::from(1);
    }
    for line in &report.summary {
        println!("{line}");
    }
    ExitCode::SUCCESS
}

/// `slidegate check`: one decision, printed as JSON; the exit code says admitted or denied.
async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let (name, quota) = check_quota(&args, &config)?;
    let mut backend_config = config.backend;
    if let Some(url) = args.redis {
        (backend_config.redis, backend_config.redis_cluster, backend_config.redis_sentinel) =
            (Some(url), Vec::new(), Vec::new());
    }
    // One decision has no use for a near-cache.
    backend_config.near_cache = 0;
    let limiter = AnyBackend::connect(&backend_config).await?.limiter(&backend_config);
    // The server's key, so a check here and there share state.
    let d = limiter.check_cost(&slidegate::rule_key(&name, &args.key), &quota, args.cost).await?;
    println!(
        "{}",
        serde_json::json!({
            "rule": name, "allowed": d.allowed, "limit": d.limit, "remaining": d.remaining,
            "reset_after_ms": d.reset_after.as_millis(), "retry_after_ms": d.retry_after.map(|r| r.as_millis()),
            "next_permit_after_ms": d.next_permit_after.as_millis(),
        })
    );
    Ok(if d.allowed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The rule's name and quota `check` decides with: the rules file's rule, or an inline quota.
fn check_quota(args: &CheckArgs, config: &Config) -> anyhow::Result<(String, Quota)> {
    match (&args.rule, args.limit) {
        (Some(rule), _) => {
            let r = config.rules.get(rule).with_context(|| format!("no rule {rule:?} in the rules file"))?;
            let tier = args.tier.as_deref();
            let quota = r.quota_for(tier).with_context(|| format!("rule {rule:?} has no tier {tier:?}"))?;
            Ok((rule.clone(), quota))
        }
        (None, Some(limit)) => {
            let window = parse_duration(args.window.as_deref().unwrap_or_default()).map_err(anyhow::Error::msg)?;
            Ok((INLINE_RULE.to_owned(), Quota::new(limit, window)?))
        }
        (None, None) => anyhow::bail!("give --rule or --limit and --window"),
    }
}

/// `slidegate bench`: runs the load and prints the report.
#[cfg(feature = "bench")]
async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let json = args.json;
    let report = bench::run(args.options()?).await?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}
