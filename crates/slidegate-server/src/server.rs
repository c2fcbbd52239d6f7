//! `slidegate serve`: bind, serve until told to stop, reload the rules file as it changes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::info;

use crate::app::{App, StartError, admin_state};
use crate::config::{Config, Kind, SETTINGS, Setting, Source, parse_duration, put_setting};
use crate::envoy_rls::EnvoyRateLimit;
use crate::http::HttpLimits;
use crate::redact::redact;
use crate::tls::ListenerTls;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// `slidegate serve`'s command line: the rules file, the address, and each setting of
/// [`SETTINGS`] that is given, as a flag or as its `SLIDEGATE_*` variable (a flag on the command
/// line wins over its variable; either over the rules file).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The TOML rules file.
    pub config: Option<PathBuf>,
    /// The address to listen on.
    pub http: SocketAddr,
    /// The settings given, as a document of the rules file's shape (`[backend] tls_ca = …`),
    /// written over the file's fields ([`Config::load_over`]).
    pub settings: toml::Table,
}

impl clap::Args for ServeOptions {
    fn augment_args(command: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction, value_parser};
        let command = command
            .arg(
                Arg::new("config")
                    .long("config")
                    .env("SLIDEGATE_CONFIG")
                    .value_name("CONFIG")
                    .value_parser(value_parser!(PathBuf))
                    .help("TOML rules file (reloaded when it changes, and on SIGHUP)."),
            )
            .arg(
                Arg::new("http")
                    .long("http")
                    .env("SLIDEGATE_HTTP")
                    .value_name("HTTP")
                    .value_parser(value_parser!(SocketAddr))
                    .default_value("127.0.0.1:8080")
                    .help("Address to listen on."),
            );
        SETTINGS.iter().fold(command, |command, s| {
            let field = match s.field.split_once('.') {
                Some((table, name)) => format!("`[{table}] {name}`"),
                None => format!("`{}`", s.field),
            };
            let mut arg = Arg::new(s.flag).long(s.flag).env(s.env).help(format!("{} (rules file: {field})", s.help));
            if s.kind != Kind::Switch {
                arg = arg.value_name(s.value_name());
            }
            if !s.requires.is_empty() {
                arg = arg.requires(s.requires);
            }
            if s.flag.starts_with("otlp-") {
                arg = arg.help_heading("Tracing");
            }
            arg = match s.kind {
                Kind::Switch => arg.action(ArgAction::SetTrue),
                // A TOML integer is an i64.
                Kind::Whole => arg.value_parser(value_parser!(u64).range(..=i64::MAX.unsigned_abs())),
                Kind::Ratio => arg.value_parser(value_parser!(f64)),
                Kind::Duration => arg.value_parser(|v: &str| parse_duration(v).map(|_| v.to_owned())),
                Kind::Location { many } => {
                    let arg = arg.hide_env_values(true);
                    if many { arg.value_delimiter(',').action(ArgAction::Append) } else { arg }
                }
                Kind::Text if !s.choices.is_empty() => arg.value_parser(s.choices.to_vec()),
                Kind::Text | Kind::Path => arg,
            };
            command.arg(arg)
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl clap::FromArgMatches for ServeOptions {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let location = given_location(matches)?;
        let mut settings = toml::Table::new();
        for s in SETTINGS {
            let value = match s.kind {
                Kind::Switch if matches.get_flag(s.flag) => toml::Value::Boolean(true),
                Kind::Switch => continue,
                Kind::Location { .. } if Some(s.flag) != location => continue,
                Kind::Location { many: true } => match matches.get_many::<String>(s.flag) {
                    Some(urls) => toml::Value::Array(urls.map(|u| toml::Value::String(u.clone())).collect()),
                    None => continue,
                },
                Kind::Whole => match matches.get_one::<u64>(s.flag).and_then(|&n| i64::try_from(n).ok()) {
                    Some(n) => toml::Value::Integer(n),
                    None => continue,
                },
                Kind::Ratio => match matches.get_one::<f64>(s.flag) {
                    Some(&x) => toml::Value::Float(x),
                    None => continue,
                },
                _ => match matches.get_one::<String>(s.flag) {
                    Some(text) => toml::Value::String(text.clone()),
                    None => continue,
                },
            };
            put_setting(&mut settings, s.field, value);
        }
        Ok(Self {
            config: matches.get_one::<PathBuf>("config").cloned(),
            http: *matches.get_one::<SocketAddr>("http").expect("a default"),
            settings,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

/// Where Redis is — `--redis`, `--redis-cluster`, `--redis-sentinel` — is one setting: the one
/// given on the command line wins over the others' variables (clap's `conflicts_with` would
/// refuse a flag beside another's variable). Two given the same way are an error.
fn given_location(matches: &clap::ArgMatches) -> Result<Option<&'static str>, clap::Error> {
    use clap::parser::ValueSource::{CommandLine, EnvVariable};
    let locations = SETTINGS.iter().filter(|s| matches!(s.kind, Kind::Location { .. }));
    let given = |source| -> Vec<&Setting> {
        locations.clone().filter(|s| matches.value_source(s.flag) == Some(source)).collect()
    };
    let flags = given(CommandLine);
    let chosen = if flags.is_empty() { given(EnvVariable) } else { flags };
    match chosen.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.flag)),
        [a, b, ..] => {
            let name = |s: &Setting| format!("--{} / {}", s.flag, s.env);
            let message = format!(
                "give one of --redis, --redis-cluster, --redis-sentinel: {} and {} are both set",
                name(a),
                name(b)
            );
            Err(clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, message))
        }
    }
}

/// Loads the configuration, connects the backend, and serves until SIGINT or SIGTERM.
pub async fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let source = Source { path: options.config.clone(), settings: options.settings };
    let config = source.load()?;
    let limits = config.server;
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
    let app = App::start(config, source).await.map_err(|e| {
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
    let result = run(Arc::clone(&app), listener, limits, tls, stopped(stop_rx)).await;
    if let Some(g) = grpc_server {
        g.await.context("gRPC server task")?.context("gRPC server")?;
    }
    watcher.abort();
    if let Some(w) = tls_watcher {
        w.abort();
    }
    crate::write_back::at_stop(&app).await;
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
