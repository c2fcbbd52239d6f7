//! An instance's link to the shared rules and overrides: the store, the version applied, and
//! whether Redis can be reached — for `/readyz` and the metrics.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{error, info};

use super::{Store, StoreError, StoredRules};
use crate::config::Config;
use crate::metrics;
use crate::redact::redact;

/// How long a change made through this instance waits for the instance to apply it, so that
/// its next request sees it; past it, the change stands and applies when its notice arrives.
pub const APPLY_WAIT: Duration = Duration::from_secs(1);

/// The shared rules and overrides of an instance on a Redis backend.
#[derive(Debug)]
pub struct Shared {
    store: Store,
    rules_from_redis: bool,
    applied: watch::Sender<u64>,
    // A std lock: held to copy or set a few fields, never across an await.
    status: Mutex<Status>,
}

#[derive(Debug, Default)]
struct Status {
    /// What kind of failure keeps Redis from answering, while it does not (its text is logged).
    unreachable: Option<&'static str>,
    /// The rules document in force, when it came from Redis.
    rules: Option<StoredRules>,
    /// Why the stored rules document could not be put in force, while it cannot.
    refused: Option<String>,
}

impl Shared {
    /// The store of `config`'s Redis backend; `None` on the memory backend.
    pub async fn connect(config: &Config) -> Result<Option<Self>, StoreError> {
        Ok(Store::for_backend(&config.backend).await?.map(|store| Self {
            store,
            rules_from_redis: config.rules_from_redis,
            applied: watch::Sender::new(0),
            status: Mutex::default(),
        }))
    }

    /// Whether the rules come from Redis too (`--rules-from-redis`), not only the overrides.
    pub fn rules_from_redis(&self) -> bool {
        self.rules_from_redis
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The rules document in force, when it came from Redis.
    pub fn rules(&self) -> Option<StoredRules> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).rules.clone()
    }

    pub(crate) fn set_rules(&self, rules: StoredRules) {
        ::metrics::gauge!(metrics::RULES_VERSION).set(rules.version as f64);
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        status.rules = Some(rules);
        status.refused = None;
    }

    /// Records that the stored rules document cannot be put in force, and why.
    pub(crate) fn refuse_rules(&self, why: String) {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).refused = Some(why);
    }

    /// Why this instance is not ready: its rules come from Redis and it has none in force,
    /// the stored document being unreadable (an instance with rules keeps serving them).
    pub fn unready(&self) -> Option<String> {
        let status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        let why = status.refused.as_ref().filter(|_| self.rules_from_redis && status.rules.is_none())?;
        Some(format!("no rules in force: {why}"))
    }

    /// Records that every change up to `version` is applied.
    pub(crate) fn set_applied(&self, version: u64) {
        self.applied.send_replace(version);
    }

    /// Waits (at most [`APPLY_WAIT`]) until the change of `version` is applied here.
    pub async fn wait_applied(&self, version: u64) {
        let mut applied = self.applied.subscribe();
        let _ = tokio::time::timeout(APPLY_WAIT, applied.wait_for(|v| *v >= version)).await;
    }

    /// Records that Redis answers again.
    pub(crate) fn reachable(&self) {
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        if status.unreachable.take().is_some() {
            info!("shared rules and overrides: redis answers again, changes apply again");
        }
        ::metrics::gauge!(metrics::SHARED_UNREACHABLE).set(0.0);
    }

    /// Records that Redis cannot be reached, and why.
    pub(crate) fn unreachable(&self, e: &StoreError) {
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        if status.unreachable.is_none() {
            let why = e.to_string();
            let why = redact(&why);
            error!("shared rules and overrides: {why}; serving the last ones until redis answers");
        }
        status.unreachable = Some(e.kind());
        ::metrics::gauge!(metrics::SHARED_UNREACHABLE).set(1.0);
    }

    /// `/readyz`'s detail: `{"in_sync", "error"?, "version", "rules"?}`. It names no address:
    /// `/readyz` needs no token (`rules show` says who pushed).
    pub fn detail(&self) -> Value {
        let status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        let mut detail = json!({"in_sync": status.unreachable.is_none(), "version": *self.applied.borrow()});
        if let Some(why) = &status.unreachable {
            detail["error"] = json!(format!("{why}: serving the last rules and overrides"));
        } else if let Some(why) = status.refused.as_ref().filter(|_| self.rules_from_redis) {
            detail["error"] = json!(format!("the stored rules are not in force: {why}"));
        }
        if self.rules_from_redis {
            detail["rules"] = status
                .rules
                .as_ref()
                .map_or(Value::Null, |r| json!({"version": r.version, "pushed_at_ms": r.pushed_at_ms}));
        }
        detail
    }
}
