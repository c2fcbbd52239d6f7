//! `slidegate serve`: bind, serve until told to stop, reload the rules file as it changes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::info;

use crate::app::{App, StartError, admin_state};
use crate::config::{Config, check_redis_url, parse_duration};
use crate::envoy::{EnvoyOptions, HeaderStyle};
use crate::envoy_rls::EnvoyRateLimit;
use crate::http::HttpLimits;
use crate::redact::redact;
use crate::tls::{ListenerTls, ListenerTlsFiles};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// `slidegate serve`'s flags; each overrides the rules file's setting, and each can be given as
/// the environment variable `SLIDEGATE_<FLAG>` instead (`--redis-cluster` as
/// `SLIDEGATE_REDIS_CLUSTER`); a flag on the command line wins over its variable.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// TOML rules file (reloaded when it changes, and on SIGHUP).
    #[arg(long, env = "SLIDEGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "SLIDEGATE_HTTP", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Redis URL: use the Redis backend (otherwise the file's, or the embedded memory backend).
    #[arg(long, env = "SLIDEGATE_REDIS", hide_env_values = true)]
    pub redis: Option<String>,
    /// Redis Cluster nodes, comma-separated: use the Cluster backend.
    #[arg(long, env = "SLIDEGATE_REDIS_CLUSTER", hide_env_values = true, value_delimiter = ',')]
    pub redis_cluster: Vec<String>,
    /// Redis Sentinels, comma-separated: follow the master they name through failovers.
    #[arg(long, env = "SLIDEGATE_REDIS_SENTINEL", hide_env_values = true, value_delimiter = ',')]
    pub redis_sentinel: Vec<String>,
    /// The master's name at the sentinels (default `mymaster`).
    #[arg(long, env = "SLIDEGATE_SENTINEL_SERVICE")]
    pub sentinel_service: Option<String>,
    /// The CA certificates (PEM) a `rediss://` Redis' certificate must chain to (default: the
    /// system's store; `[backend] tls_ca`).
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CA", value_name = "FILE")]
    pub redis_tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) to present to Redis, for `tls-auth-clients yes`
    /// (`[backend] tls_cert`; with --redis-tls-key).
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CERT", value_name = "FILE", requires = "redis_tls_key")]
    pub redis_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM; `[backend] tls_key`).
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_KEY", value_name = "FILE", requires = "redis_tls_cert")]
    pub redis_tls_key: Option<PathBuf>,
    /// Accept a Redis certificate that does not name the host connected to, still checking
    /// its chain and dates (providers whose certificates name no endpoint; logged as a warning;
    /// `[backend] tls_skip_hostname_verification`).
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")]
    pub redis_tls_skip_hostname_verification: bool,
    /// Which code decides on Redis: `auto` (slidegate's Redis module when the server has it
    /// loaded, the Lua scripts otherwise), `lua` or `module`.
    #[arg(long, env = "SLIDEGATE_REDIS_ENGINE")]
    pub redis_engine: Option<slidegate::RedisEngine>,
    /// Answer each admission only once this many replicas acknowledged it (`WAIT`; `[backend]
    /// replicas_ack`, 0: none): fewer within half the deadline is a backend failure the policy answers.
    #[arg(long, env = "SLIDEGATE_REDIS_REPLICAS_ACK", value_name = "N")]
    pub redis_replicas_ack: Option<u32>,
    /// Serve HTTPS — and gRPC over TLS, with --grpc — with this certificate chain (PEM), served
    /// anew to new connections when the file changes (`[server] tls_cert`; with --tls-key).
    #[arg(long, env = "SLIDEGATE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM; `[server] tls_key`).
    #[arg(long, env = "SLIDEGATE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require of every client a certificate that chains to these CA certificates (PEM):
    /// mutual TLS, a client without one refused at the handshake (`[server] tls_client_ca`).
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Require also that a client's certificate be valid for this DNS name or IP address (a
    /// subject alternative name; envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN; `[server]
    /// tls_client_san`; with --tls-client-ca).
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_SAN", value_name = "NAME")]
    pub tls_client_san: Option<String>,
    /// Serve the Envoy rate limit service (gRPC) on this address.
    #[arg(long, env = "SLIDEGATE_GRPC")]
    pub grpc: Option<SocketAddr>,
    /// A directory of envoyproxy/ratelimit YAML files (reloaded when they change).
    #[arg(long, env = "SLIDEGATE_ENVOY_CONFIG")]
    pub envoy_config: Option<PathBuf>,
    /// Add rate-limit headers to gRPC answers, for Envoy to pass to its clients
    /// (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED; `envoy_response_headers`).
    #[arg(long, env = "SLIDEGATE_ENVOY_RESPONSE_HEADERS")]
    pub envoy_response_headers: bool,
    /// Which headers: `upstream` (envoyproxy/ratelimit's RateLimit-Limit, RateLimit-Remaining,
    /// RateLimit-Reset) or `ietf` (the IETF draft's RateLimit-Policy and RateLimit).
    #[arg(long, env = "SLIDEGATE_ENVOY_RESPONSE_HEADERS_STYLE")]
    pub envoy_response_headers_style: Option<HeaderStyle>,
    /// The limit header's name (default RateLimit-Limit; LIMIT_LIMIT_HEADER).
    #[arg(long, env = "SLIDEGATE_ENVOY_LIMIT_HEADER")]
    pub envoy_limit_header: Option<String>,
    /// The remaining header's name (default RateLimit-Remaining; LIMIT_REMAINING_HEADER).
    #[arg(long, env = "SLIDEGATE_ENVOY_REMAINING_HEADER")]
    pub envoy_remaining_header: Option<String>,
    /// The reset header's name (default RateLimit-Reset; LIMIT_RESET_HEADER).
    #[arg(long, env = "SLIDEGATE_ENVOY_RESET_HEADER")]
    pub envoy_reset_header: Option<String>,
    /// Merge the descriptors of files that declare the same domain instead of refusing them
    /// (MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "SLIDEGATE_ENVOY_MERGE_DOMAINS")]
    pub envoy_merge_domains: bool,
    /// Answer OK to every request over its limits, still deciding and counting them
    /// (SHADOW_MODE).
    #[arg(long, env = "SLIDEGATE_ENVOY_SHADOW_MODE")]
    pub envoy_shadow_mode: bool,
    /// Every descriptor in quota mode: a request is over only when all of them are (QUOTA_MODE).
    #[arg(long, env = "SLIDEGATE_ENVOY_QUOTA_MODE")]
    pub envoy_quota_mode: bool,
    /// The share of a limit past which hits count as near it, 0 to 1 (default 0.8;
    /// NEAR_LIMIT_RATIO).
    #[arg(long, env = "SLIDEGATE_ENVOY_NEAR_LIMIT_RATIO")]
    pub envoy_near_limit_ratio: Option<f64>,
    /// Answer with the request and the passed limits' `metadata` as dynamic metadata
    /// (RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "SLIDEGATE_ENVOY_RESPONSE_DYNAMIC_METADATA")]
    pub envoy_response_dynamic_metadata: bool,
    /// How long a client may take to send a request head (request line and headers), also the
    /// longest idle time between two requests on one connection; then the connection is closed
    /// (default 10s; `[server] header_read_timeout`).
    #[arg(long, env = "SLIDEGATE_HEADER_READ_TIMEOUT", value_parser = parse_duration)]
    pub header_read_timeout: Option<Duration>,
    /// How long a request may take from its head to its answer, body included; then it is
    /// answered 408 `request_timeout` (default 15s; `[server] request_timeout`). Must be longer
    /// than the backend timeout.
    #[arg(long, env = "SLIDEGATE_REQUEST_TIMEOUT", value_parser = parse_duration)]
    pub request_timeout: Option<Duration>,
    /// The most HTTP connections open at once; one more is answered 503 `too_many_connections`
    /// and closed (default 512; `[server] max_connections`).
    #[arg(long, env = "SLIDEGATE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Serve the `[[rules]]` and `[inline]` that `slidegate rules push` stored in the backend's
    /// Redis, applying each push within a second (`rules_from_redis` in the rules file, which
    /// then holds no rules of its own).
    #[arg(long, env = "SLIDEGATE_RULES_FROM_REDIS")]
    pub rules_from_redis: bool,
    /// The most per-key overrides this instance holds and accepts (default 100000;
    /// `max_overrides`).
    #[arg(long, env = "SLIDEGATE_MAX_OVERRIDES")]
    pub max_overrides: Option<usize>,
    /// OpenTelemetry traces (`--otlp-*`).
    #[command(flatten)]
    pub otlp: crate::trace::export::OtlpOptions,
}

impl ServeOptions {
    /// Where Redis is — `--redis`, `--redis-cluster`, `--redis-sentinel` — is one setting: the
    /// one given on the command line wins over the others' variables (clap's `conflicts_with`
    /// would refuse a flag beside another's variable). Two given the same way are an error.
    pub fn prefer_command_line(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        use clap::parser::ValueSource::{CommandLine, EnvVariable};
        const LOCATIONS: [(&str, &str); 3] = [
            ("redis", "--redis / SLIDEGATE_REDIS"),
            ("redis_cluster", "--redis-cluster / SLIDEGATE_REDIS_CLUSTER"),
            ("redis_sentinel", "--redis-sentinel / SLIDEGATE_REDIS_SENTINEL"),
        ];
        let given = |source| -> Vec<&(&str, &str)> {
            LOCATIONS.iter().filter(|(id, _)| matches.value_source(id) == Some(source)).collect()
        };
        let flags = given(CommandLine);
        let chosen = if flags.is_empty() { given(EnvVariable) } else { flags };
        let keep = match chosen.as_slice() {
            [] => return Ok(()),
            [(keep, _)] => *keep,
            [(_, a), (_, b), ..] => {
                let message =
                    format!("give one of --redis, --redis-cluster, --redis-sentinel: {a} and {b} are both set");
                return Err(clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, message));
            }
        };
        if keep != "redis" {
            self.redis = None;
        }
        if keep != "redis_cluster" {
            self.redis_cluster.clear();
        }
        if keep != "redis_sentinel" {
            self.redis_sentinel.clear();
        }
        Ok(())
    }
}

/// Loads the configuration, connects the backend, and serves until SIGINT or SIGTERM.
pub async fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let config = match &options.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let limits = http_limits(&options, &config)?;
    let config = with_flags(config, &options)?;
    let config = match &options.config {
        Some(path) => {
            let from_redis = config.rules_from_redis;
            crate::shared_store::check_local(config, from_redis, path)?
        }
        None => config,
    };
    let tls = ListenerTls::load(&config.tls).context("loading the listeners' TLS files")?.map(Arc::new);
    let grpc = config.grpc;
    let where_ = backend_location(&config);
    let app = App::start(config, options.config.clone()).await.map_err(|e| {
        let doing = starting(&e, &where_);
        anyhow::Error::new(e).context(doing)
    })?;
    let app = Arc::new(app);
    crate::shared_rules::start(&app).await.context("reading the shared rules and overrides")?;
    tokio::spawn(crate::override_changes::lapse_forever(Arc::clone(&app)));
    tokio::spawn(crate::shared_rules::beat_forever(Arc::clone(&app)));
    tokio::spawn(crate::write_back::forever(Arc::clone(&app)));
    let listener = TcpListener::bind(options.http).await.with_context(|| format!("binding {}", options.http))?;
    log_start(&app, listener.local_addr()?, &where_, &limits, tls.as_deref());
    // One signal stops both servers.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let grpc_server = match grpc {
        Some(addr) => Some(serve_grpc(addr, Arc::clone(&app), limits, tls.clone(), stopped(stop_rx.clone())).await?),
        None => None,
    };
    let watcher = tokio::spawn(crate::watch::watch_config(Arc::clone(&app)));
    let tls_watcher = tls.clone().map(|tls| tokio::spawn(crate::tls::watch::watch_files(tls)));
    let result = run(app, listener, limits, tls, stopped(stop_rx)).await;
    if let Some(g) = grpc_server {
        g.await.context("gRPC server task")?.context("gRPC server")?;
    }
    watcher.abort();
    if let Some(w) = tls_watcher {
        w.abort();
    }
    info!("slidegate stopped");
    result
}

/// What the start was doing when it failed with `e`, for the message: `backend` is where the
/// backend is.
fn starting(e: &StartError, backend: &str) -> String {
    match e {
        StartError::Envoy(_) => "loading the Envoy configuration".to_owned(),
        StartError::RulesFromRedisWithoutRedis => "checking the rules file".to_owned(),
        StartError::Backend(_) | StartError::Shared(_) => format!("connecting the backend ({backend})"),
    }
}

/// Completes when the stop signal is sent.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// `config` under `options`' backend and Envoy flags, checked.
fn with_flags(mut config: Config, options: &ServeOptions) -> anyhow::Result<Config> {
    let backend = &mut config.backend;
    if let Some(url) = &options.redis {
        check_redis_url(url).map_err(|m| anyhow::anyhow!("--redis: {m}"))?;
        (backend.redis, backend.redis_cluster, backend.redis_sentinel) = (Some(url.clone()), Vec::new(), Vec::new());
    }
    if !options.redis_cluster.is_empty() {
        for url in &options.redis_cluster {
            check_redis_url(url).map_err(|m| anyhow::anyhow!("--redis-cluster: {m}"))?;
        }
        (backend.redis, backend.redis_cluster, backend.redis_sentinel) =
            (None, options.redis_cluster.clone(), Vec::new());
    }
    if !options.redis_sentinel.is_empty() {
        for url in &options.redis_sentinel {
            check_redis_url(url).map_err(|m| anyhow::anyhow!("--redis-sentinel: {m}"))?;
        }
        (backend.redis, backend.redis_cluster, backend.redis_sentinel) =
            (None, Vec::new(), options.redis_sentinel.clone());
    }
    if let Some(name) = &options.sentinel_service {
        backend.sentinel_service = name.clone();
    }
    if let Some(engine) = options.redis_engine {
        backend.engine = engine;
    }
    if let Some(n) = options.redis_replicas_ack {
        backend.replicas_ack = n;
    }
    redis_tls_flags(backend, options)?;
    listener_tls_flags(&mut config.tls, options)?;
    if let Some(addr) = options.grpc {
        config.grpc = Some(addr);
    }
    if let Some(dir) = &options.envoy_config {
        config.envoy_config = Some(dir.clone());
    }
    envoy_flags(&mut config.envoy, options);
    config.envoy.validate().map_err(|(field, m)| anyhow::anyhow!("--{}: {m}", field.replace('_', "-")))?;
    config.rules_from_redis |= options.rules_from_redis;
    if let Some(n) = options.max_overrides {
        let cap = crate::overrides::MAX_OVERRIDES_CAP;
        if !(1..=cap).contains(&n) {
            anyhow::bail!("--max-overrides: must be between 1 and {cap}, got {n}");
        }
        config.max_overrides = n;
    }
    Ok(config)
}

/// The Envoy settings under `options`' flags: a flag that is set wins over the file.
fn envoy_flags(envoy: &mut EnvoyOptions, options: &ServeOptions) {
    envoy.headers.enabled |= options.envoy_response_headers;
    envoy.merge_domains |= options.envoy_merge_domains;
    envoy.shadow_mode |= options.envoy_shadow_mode;
    envoy.quota_mode |= options.envoy_quota_mode;
    envoy.dynamic_metadata |= options.envoy_response_dynamic_metadata;
    if let Some(style) = options.envoy_response_headers_style {
        envoy.headers.style = style;
    }
    for (flag, name) in [
        (&options.envoy_limit_header, &mut envoy.headers.limit),
        (&options.envoy_remaining_header, &mut envoy.headers.remaining),
        (&options.envoy_reset_header, &mut envoy.headers.reset),
    ] {
        if let Some(value) = flag {
            name.clone_from(value);
        }
    }
    if let Some(ratio) = options.envoy_near_limit_ratio {
        envoy.near_limit_ratio = ratio;
    }
}

/// The start's log lines: where, which backend, how many rules, the HTTP limits, the admin
/// routes' state.
fn log_start(app: &App, addr: SocketAddr, where_: &str, limits: &HttpLimits, tls: Option<&ListenerTls>) {
    let scheme = if tls.is_some() { "https" } else { "http" };
    info!(
        http = %format!("{scheme}://{addr}"),
        backend = app.limiter.backend().name(),
        location = where_,
        rules = app.live().rules.len(),
        "slidegate serving"
    );
    info!(
        header_read_timeout = %humantime::format_duration(limits.header_read_timeout),
        request_timeout = %humantime::format_duration(limits.request_timeout),
        max_connections = limits.max_connections,
        "HTTP limits"
    );
    if app.live().admin_token.is_none() {
        info!("{}", admin_state(false));
    }
    if let Some(tls) = tls {
        let clients = tls.client_certificates();
        info!(client_certificates = clients, "listeners serve TLS");
    }
}

/// Binds `addr` and serves the Envoy rate limit service there, within `limits` (over `tls` when
/// given), until `shutdown` completes.
async fn serve_grpc(
    addr: SocketAddr,
    app: Arc<App>,
    limits: HttpLimits,
    tls: Option<Arc<ListenerTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr} (gRPC)"))?;
    info!(grpc = %listener.local_addr()?, domains = app.envoy().len(), "slidegate serving Envoy rate limit gRPC");
    let (reporter, health) = tonic_health::server::health_reporter();
    let health = health.max_decoding_message_size(crate::health::MAX_HEALTH_REQUEST_BYTES);
    let readiness = tokio::spawn(crate::health::follow_readiness(reporter, Arc::clone(&app)));
    let service = RateLimitServiceServer::new(EnvoyRateLimit::new(app))
        .max_decoding_message_size(crate::envoy::MAX_REQUEST_BYTES);
    let routes = crate::grpc::routes(service, health);
    Ok(tokio::spawn(async move {
        let served = crate::grpc::serve(listener, routes, limits, tls, shutdown).await;
        readiness.abort();
        served
    }))
}

/// Serves `app` on `listener` within `limits` (over `tls` when given) until `shutdown`
/// completes; requests in flight then finish.
pub async fn run(
    app: Arc<App>,
    listener: TcpListener,
    limits: HttpLimits,
    tls: Option<Arc<ListenerTls>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    crate::http::serve(listener, crate::routes::Routes::new(app), limits, tls, shutdown).await?;
    Ok(())
}

/// `backend`'s TLS files under `options`' `--redis-tls-*` flags, checked against the URLs.
fn redis_tls_flags(backend: &mut crate::config::BackendConfig, options: &ServeOptions) -> anyhow::Result<()> {
    let tls = &mut backend.tls;
    flags_over([
        (&mut tls.ca, &options.redis_tls_ca),
        (&mut tls.cert, &options.redis_tls_cert),
        (&mut tls.key, &options.redis_tls_key),
    ]);
    tls.skip_hostname_verification |= options.redis_tls_skip_hostname_verification;
    backend.check_tls().map_err(|m| anyhow::anyhow!("--redis-tls-*: {m}"))
}

/// The listeners' TLS files under `options`' `--tls-*` flags, checked.
fn listener_tls_flags(files: &mut ListenerTlsFiles, options: &ServeOptions) -> anyhow::Result<()> {
    flags_over([
        (&mut files.cert, &options.tls_cert),
        (&mut files.key, &options.tls_key),
        (&mut files.client_ca, &options.tls_client_ca),
    ]);
    if options.tls_client_san.is_some() {
        files.client_san.clone_from(&options.tls_client_san);
    }
    files.check().map_err(|m| anyhow::anyhow!("--tls-* ([server] tls_*): {m}"))
}

/// Each file a flag gives, in place of the rules file's.
fn flags_over(files: [(&mut Option<PathBuf>, &Option<PathBuf>); 3]) {
    for (file, flag) in files {
        if flag.is_some() {
            file.clone_from(flag);
        }
    }
}

/// The rules file's `[server]` limits under `options`' flags, checked.
fn http_limits(options: &ServeOptions, config: &Config) -> anyhow::Result<HttpLimits> {
    let mut limits = config.server;
    limits.header_read_timeout = options.header_read_timeout.unwrap_or(limits.header_read_timeout);
    limits.request_timeout = options.request_timeout.unwrap_or(limits.request_timeout);
    limits.max_connections = options.max_connections.unwrap_or(limits.max_connections);
    limits.validate().map_err(|m| anyhow::anyhow!("server.{m}"))?;
    limits.outlasts(config.backend.timeout).map_err(|m| anyhow::anyhow!("server.request_timeout: {m}"))?;
    Ok(limits)
}

/// Where the backend is, for logs and errors, without passwords.
fn backend_location(config: &Config) -> String {
    let b = &config.backend;
    let urls = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
    match (&b.redis, &b.redis_cluster, &b.redis_sentinel) {
        (Some(url), _, _) => redact(url).into_owned(),
        (None, nodes, _) if !nodes.is_empty() => urls(nodes),
        (None, _, sentinels) if !sentinels.is_empty() => format!("{} via {}", b.sentinel_service, urls(sentinels)),
        _ => "embedded".to_owned(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("SIGINT: finishing requests in flight"),
        _ = term.recv() => info!("SIGTERM: finishing requests in flight"),
    }
}
