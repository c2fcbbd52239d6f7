//! `slidegate serve`: bind, serve until told to stop, reload the rules file as it changes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::{error, info};

use crate::app::App;
use crate::config::{Config, check_redis_url};

/// How often the rules file is looked at for changes.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// `slidegate serve`'s settings after flags and file are merged (flags win).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The rules file.
    pub config: Option<PathBuf>,
    /// Where to listen for HTTP.
    pub http: SocketAddr,
    /// A Redis URL overriding the file's backend.
    pub redis: Option<String>,
    /// Redis Cluster nodes overriding the file's backend.
    pub redis_cluster: Vec<String>,
}

/// Loads the configuration, connects the backend, and serves until SIGINT or SIGTERM.
pub async fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let mut config = match &options.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(url) = options.redis {
        check_redis_url(&url).map_err(|m| anyhow::anyhow!("--redis: {m}"))?;
        (config.backend.redis, config.backend.redis_cluster) = (Some(url), Vec::new());
    }
    if !options.redis_cluster.is_empty() {
        for url in &options.redis_cluster {
            check_redis_url(url).map_err(|m| anyhow::anyhow!("--redis-cluster: {m}"))?;
        }
        (config.backend.redis, config.backend.redis_cluster) = (None, options.redis_cluster);
    }
    let where_ = match (&config.backend.redis, &config.backend.redis_cluster) {
        (Some(url), _) => url.clone(),
        (None, nodes) if !nodes.is_empty() => nodes.join(","),
        _ => "embedded".to_owned(),
    };
    let app = App::start(config, options.config.clone())
        .await
        .with_context(|| format!("connecting the backend ({where_})"))?;
    let app = Arc::new(app);
    let listener = TcpListener::bind(options.http).await.with_context(|| format!("binding {}", options.http))?;
    let addr = listener.local_addr()?;
    info!(
        "slidegate serving on http://{addr}, backend {} ({where_}), {} rules",
        app.limiter.backend().name(),
        app.live().rules.len()
    );
    let watcher = tokio::spawn(watch_config(Arc::clone(&app)));
    let result = run(app, listener, shutdown_signal()).await;
    watcher.abort();
    info!("slidegate stopped");
    result
}

/// Serves `app` on `listener` until `shutdown` completes; requests in flight then finish.
pub async fn run(
    app: Arc<App>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, crate::api::router(app)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("SIGINT: finishing requests in flight"),
        _ = term.recv() => info!("SIGTERM: finishing requests in flight"),
    }
}

/// Reloads the rules file when its content changes or on SIGHUP.
async fn watch_config(app: Arc<App>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Some(path) = app.config_path().cloned() else { return };
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let mut seen = tokio::fs::read(&path).await.ok();
    loop {
        let forced = tokio::select! {
            _ = hup.recv() => true,
            () = tokio::time::sleep(WATCH_INTERVAL) => false,
        };
        let now = tokio::fs::read(&path).await.ok();
        if !forced && now == seen {
            continue;
        }
        seen = now;
        if let Err(e) = app.reload() {
            error!("rules file not reloaded, the previous rules stay in force: {e}");
        }
    }
}
