//! Reloads the rules file and the Envoy configuration directory when their content changes,
//! and both on SIGHUP.
//!
//! Looking is reading every watched file (a digest of each is kept, not its text) and reloading
//! reads them again: both run on the blocking pool, never on a runtime thread, so a slow disk
//! cannot stall requests, `/healthz` or the shutdown. Each file is read as [`file`](mod@file) reads: a
//! FIFO or a device is refused at once, never waited on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::error;

use crate::app::App;
use crate::envoy::{EnvoyConfig, MAX_FILE_BYTES, MAX_FILES};
use crate::file;
use crate::redact::redact;
use crate::shared_store::MAX_DOCUMENT_BYTES;

/// How often the watched files are looked at for changes.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// What one file holds: a digest of its bytes, or why it could not be read.
pub(crate) type Look = Result<[u8; 32], String>;

/// What the watched files held when last looked at.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    file: Option<Look>,
    dir: Option<Vec<(PathBuf, Look)>>,
}

impl Seen {
    fn now(app: &App) -> Self {
        Self {
            file: app.config_path().map(|p| look(p, MAX_DOCUMENT_BYTES)),
            dir: app.envoy_dir().map(|d| directory(d)),
        }
    }
}

/// What the file at `path`, of at most `max` bytes, holds now.
pub(crate) fn look(path: &Path, max: usize) -> Look {
    file::read(path, max).map(|bytes| Sha256::digest(bytes).into()).map_err(|e| e.to_string())
}

/// Each YAML file of `dir` (one past [`MAX_FILES`] at most: loading refuses that many).
fn directory(dir: &Path) -> Vec<(PathBuf, Look)> {
    let files = EnvoyConfig::files(dir).unwrap_or_default();
    files.into_iter().take(MAX_FILES + 1).map(|p| (look(&p, MAX_FILE_BYTES), p)).map(|(seen, p)| (p, seen)).collect()
}

/// The watcher's task: it ends only with the process (or if a look panics).
pub fn watch_config(app: Arc<App>) -> impl Future<Output = ()> {
    let watched = app.config_path().is_some() || app.envoy_dir().is_some();
    // Looked at now, not when the task first runs: a change made in between would go unseen.
    let seen = Seen::now(&app);
    let watching =
        watched.then(|| looking("configuration", seen, move |seen, forced| apply_changes(&app, seen, forced)));
    async move {
        if let Some(watching) = watching {
            watching.await;
        }
    }
}

/// A watcher's loop: `apply` on the blocking pool every [`WATCH_INTERVAL`], and at once on
/// SIGHUP (`forced`), each time given what it returned the time before (`seen` first). It ends
/// only with the process, or if `apply` panics (logged as `what`'s watcher stopping).
pub(crate) fn looking<S: Send + 'static>(
    what: &'static str,
    mut seen: S,
    apply: impl Fn(&S, bool) -> S + Clone + Send + 'static,
) -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Registered now: a SIGHUP before the task first runs would end the process.
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    async move {
        loop {
            let forced = tokio::select! {
                _ = hup.recv() => true,
                () = tokio::time::sleep(WATCH_INTERVAL) => false,
            };
            let apply = apply.clone();
            seen = match tokio::task::spawn_blocking(move || apply(&seen, forced)).await {
                Ok(now) => now,
                Err(e) => {
                    error!("the {what} watcher stopped: {e}");
                    return;
                }
            };
        }
    }
}

/// Reloads what changed since `seen` (everything when `forced`); returns what is seen now.
fn apply_changes(app: &App, seen: &Seen, forced: bool) -> Seen {
    let now = Seen::now(app);
    if now.file.is_some() && (forced || now.file != seen.file) {
        if let Err(e) = app.reload() {
            error!("rules file not reloaded, the previous rules stay in force: {}", redact(&e.to_string()));
        }
    }
    if now.dir.is_some() && (forced || now.dir != seen.dir) {
        if let Err(e) = app.reload_envoy() {
            error!("envoy configuration not reloaded, the previous one stays in force: {e}");
        }
    }
    now
}
