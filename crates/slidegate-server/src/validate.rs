//! `slidegate validate`: everything `serve` would load — the rules file (and the listeners' TLS
//! files it names) and the Envoy configuration directory, through the same loaders, so with the same errors — checked
//! without binding a port or connecting a backend: for CI, and before a reload.

use std::path::{Path, PathBuf};

use crate::config::{Config, INLINE_RULE};
use crate::envoy::EnvoyConfig;
use crate::redact::redact;
use crate::tls::ListenerTls;

/// `slidegate validate`'s flags (the same variables as `serve`'s name the same files).
#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    /// The TOML rules file to check.
    #[arg(long, env = "SLIDEGATE_CONFIG", required_unless_present = "envoy_config")]
    pub config: Option<PathBuf>,
    /// A directory of envoyproxy/ratelimit YAML files to check (otherwise the rules file's
    /// `envoy_config`, when it names one).
    #[arg(long, env = "SLIDEGATE_ENVOY_CONFIG")]
    pub envoy_config: Option<PathBuf>,
    /// Files of one domain merge instead of being refused, as `serve --envoy-merge-domains`
    /// (otherwise the rules file's `envoy_merge_domains`).
    #[arg(long, env = "SLIDEGATE_ENVOY_MERGE_DOMAINS")]
    pub envoy_merge_domains: bool,
}

/// What `validate` found: the problems (each `file:line:column: …` where the loader knows the
/// line), or, when there are none, a summary of what `serve` would run, with the warnings
/// `serve` would log (a field accepted but not read as written).
#[derive(Debug, Default)]
pub struct Report {
    /// One line per problem.
    pub problems: Vec<String>,
    /// Lines describing what was loaded.
    pub summary: Vec<String>,
}

/// Loads what `args` name and reports.
pub fn validate(args: &ValidateArgs) -> Report {
    let mut report = Report::default();
    let mut envoy_dir = args.envoy_config.clone();
    let mut merge_domains = args.envoy_merge_domains;
    if let Some(path) = &args.config {
        match Config::load(path) {
            Ok(config) => {
                envoy_dir = envoy_dir.or_else(|| config.envoy_config.clone());
                merge_domains |= config.envoy.merge_domains;
                report.summary.extend(describe(path, &config));
                // The listeners' TLS files, read and checked as `serve` reads them at start.
                match ListenerTls::load(&config.tls) {
                    Ok(Some(tls)) => report.summary.push(describe_tls(&tls)),
                    Ok(None) => {}
                    Err(e) => report.problems.push(e.to_string()),
                }
            }
            // A password in the file may be quoted by the error: never print it.
            Err(e) => report.problems.push(redact(&e.to_string()).into_owned()),
        }
    }
    if let Some(dir) = &envoy_dir {
        match EnvoyConfig::load_dir(dir, merge_domains) {
            Ok(envoy) => report.summary.extend(describe_envoy(dir, &envoy)),
            Err(e) => report.problems.push(e.to_string()),
        }
    }
    report
}

/// The rules file's summary: rules and tiers, backend, HTTP limits, inline bounds, admin routes.
fn describe(path: &Path, config: &Config) -> Vec<String> {
    let rules: Vec<&str> = config.rules.iter().map(|r| r.name.as_str()).collect();
    let tiers: Vec<String> =
        config.rules.iter().flat_map(|r| r.tiers.keys().map(move |t| format!("{}.{t}", r.name))).collect();
    let b = &config.backend;
    let redis = match (&b.redis, b.redis_cluster.as_slice(), b.redis_sentinel.as_slice()) {
        (Some(url), _, _) => format!("redis {}", redact(url)),
        (None, [], []) => String::new(),
        (None, [], sentinels) => format!("redis sentinel {} via {}", b.sentinel_service, redacted(sentinels)),
        (None, nodes, _) => format!("redis cluster {}", redacted(nodes)),
    };
    // Failure policies and the near-cache apply to a shared backend only (`AnyBackend::limiter`).
    let backend = if redis.is_empty() {
        format!("memory, in this process, at most {} keys", b.max_keys)
    } else {
        format!(
            "{redis} (not contacted), timeout {}, failure policy {}, near-cache {} keys",
            humantime::format_duration(b.timeout),
            b.failure_policy.as_str(),
            b.near_cache
        )
    };
    let inline = &config.inline;
    let inline = if inline.enabled {
        let algorithms = inline.algorithms.as_ref().map_or_else(|| "all".to_owned(), |a| a.join(", "));
        format!(
            "max_limit {}, max_window {}, max_cost {}, algorithms {algorithms}",
            inline.max_limit,
            humantime::format_duration(inline.max_window),
            inline.max_cost
        )
    } else {
        "disabled".to_owned()
    };
    let server = &config.server;
    vec![
        format!("{}: ok", path.display()),
        format!("  rules: {}", counted(&rules)),
        format!("  tiers: {}", counted(&tiers)),
        format!("  inline checks (rule {INLINE_RULE:?}): {inline}"),
        format!("  backend: {backend}"),
        format!(
            "  http: header_read_timeout {}, request_timeout {}, max_connections {}",
            humantime::format_duration(server.header_read_timeout),
            humantime::format_duration(server.request_timeout),
            server.max_connections
        ),
        format!("  admin routes: {}", if config.admin_token.is_some() { "enabled" } else { "disabled" }),
    ]
}

/// The listeners' TLS line of the summary.
fn describe_tls(tls: &ListenerTls) -> String {
    let files: Vec<String> = tls.files().map(|f| f.display().to_string()).collect();
    let clients = tls.client_certificates();
    format!("  tls: {} (client certificates {clients})", files.join(", "))
}

/// `3 (a, b, c)`, or `0`.
fn counted(names: &[impl AsRef<str>]) -> String {
    if names.is_empty() {
        return "0".to_owned();
    }
    let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    format!("{} ({})", names.len(), names.join(", "))
}

fn redacted(urls: &[String]) -> String {
    urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",")
}

/// The Envoy directory's summary: each domain with its number of descriptors that carry a limit.
fn describe_envoy(dir: &Path, envoy: &EnvoyConfig) -> Vec<String> {
    let domains: Vec<String> =
        envoy.descriptor_counts().map(|(name, limits)| format!("{name}: {limits} limits")).collect();
    let mut lines = vec![format!("{}: ok", dir.display()), format!("  envoy domains: {}", counted(&domains))];
    lines.extend(envoy.warnings().iter().map(|w| format!("  warning: {w}")));
    lines
}
