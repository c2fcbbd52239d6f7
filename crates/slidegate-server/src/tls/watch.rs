//! Puts the listeners' TLS files in force again when one of them changes — a certificate
//! replaced on disk is served to new connections within [`crate::watch::WATCH_INTERVAL`] of
//! its writing — and at once on SIGHUP. A set that fails to load (a key not of its certificate, half a file)
//! leaves the one in force serving; it is logged and counted in
//! `slidegate_config_reloads_total{file="tls",result="failed"}`, and loaded when the files
//! change again. Connections already open keep the certificate they were opened with.
//!
//! The files are read on the blocking pool, as the rules file is ([`crate::watch`]).

use std::sync::Arc;

use tracing::{error, info};

use super::{ListenerTls, MAX_PEM_BYTES};
use crate::metrics;
use crate::watch::{Look, look, looking};

/// The watcher's task: it ends only with the process.
pub fn watch_files(tls: Arc<ListenerTls>) -> impl Future<Output = ()> {
    // Looked at now: a change made before the task first runs is seen.
    let seen = looks(&tls);
    looking("TLS certificate", seen, move |seen: &Vec<Look>, forced| apply_changes(&tls, seen, forced))
}

fn looks(tls: &ListenerTls) -> Vec<Look> {
    tls.files().map(|f| look(f, MAX_PEM_BYTES)).collect()
}

/// Reloads when a file changed since `seen` (or when `forced`); returns what is seen now.
fn apply_changes(tls: &ListenerTls, seen: &[Look], forced: bool) -> Vec<Look> {
    let now = looks(tls);
    if forced || now != seen {
        let result = tls.reload();
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        ::metrics::counter!(metrics::RELOADS, "result" => outcome, "file" => "tls").increment(1);
        match result {
            Ok(()) => info!("listener TLS certificate reloaded"),
            Err(e) => error!("listener TLS certificate not reloaded, the previous one is still served: {e}"),
        }
    }
    now
}
