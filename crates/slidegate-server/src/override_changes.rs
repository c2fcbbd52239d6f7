//! Setting, deleting and lapsing overrides — in this instance's table on the memory backend, in
//! Redis (and from there in every instance) on a Redis backend — and the audit trail of each.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::app::App;
use crate::metrics;
use crate::overrides::{Full, Override, Record, Target, now_ms};
use crate::shared_store::{SetOutcome, StoreError, field};

/// How often lapsed overrides are removed. A decision already ignores an override past its
/// expiry; removing it frees its memory (and, on Redis, its entry) and records it lapsed.
pub const LAPSE_INTERVAL: Duration = Duration::from_secs(1);

/// The most overrides one sweep removes from Redis in one script call, so that a mass expiry
/// holds Redis for a few milliseconds at a time.
const LAPSE_BATCH: usize = 1_000;

/// Why an override could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The table (or the Redis hash) holds `max_overrides` and the key has none.
    #[error(transparent)]
    Full(#[from] Full),
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Sets `o`, the override of `target`; returns the override it replaces. On Redis it returns
/// once this instance applies it (or after [`crate::shared_store::APPLY_WAIT`]).
pub async fn set(app: &App, target: &Target, o: Override) -> Result<Option<Override>, ChangeError> {
    let Some(shared) = app.shared() else {
        let previous = app.overrides.insert(target.backend_key(), o)?;
        ::metrics::gauge!(metrics::OVERRIDES).set(app.overrides.len() as f64);
        return Ok(previous);
    };
    let json = serde_json::to_string(&Record::from(&o)).expect("an override is JSON");
    let max = app.overrides.max();
    match shared.store().set_override(&field(&o.rule, &o.key), &json, o.expires_at_ms, max).await? {
        SetOutcome::Full => Err(Full { max }.into()),
        SetOutcome::Stored { version, previous } => {
            shared.wait_applied(version).await;
            Ok(previous.as_deref().and_then(parse))
        }
    }
}

/// Deletes the override of `target`; returns it, `None` when it had none.
pub async fn delete(app: &App, target: &Target) -> Result<Option<Override>, ChangeError> {
    let Some(shared) = app.shared() else {
        let removed = app.overrides.remove(&target.backend_key());
        ::metrics::gauge!(metrics::OVERRIDES).set(app.overrides.len() as f64);
        return Ok(removed);
    };
    let Some((version, json)) = shared.store().delete_override(&field(&target.rule(), &target.key())).await? else {
        return Ok(None);
    };
    shared.wait_applied(version).await;
    Ok(parse(&json))
}

/// Removes lapsed overrides every [`LAPSE_INTERVAL`], recording each.
pub async fn lapse_forever(app: Arc<App>) {
    let mut tick = tokio::time::interval(LAPSE_INTERVAL);
    loop {
        tick.tick().await;
        let now = now_ms();
        let lapsed = app.overrides.lapsed(now);
        if lapsed.is_empty() {
            continue;
        }
        let Some(shared) = app.shared() else {
            for key in lapsed {
                if let Some(o) = app.overrides.remove(&key) {
                    audit("lapse", &o.rule, &o.key, Some(&o), None, "its ttl");
                }
            }
            ::metrics::gauge!(metrics::OVERRIDES).set(app.overrides.len() as f64);
            continue;
        };
        // Every instance may sweep the same overrides: the script removes each once, and the
        // instance that removed it records it. The notices remove them from every table.
        loop {
            match shared.store().lapse(now, LAPSE_BATCH).await {
                Ok(removed) => {
                    for o in removed.iter().filter_map(|(_, json)| parse(json)) {
                        audit("lapse", &o.rule, &o.key, Some(&o), None, "its ttl");
                    }
                    if removed.len() < LAPSE_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    warn!("lapsed overrides stay in redis until the next sweep: {e}");
                    break;
                }
            }
        }
    }
}

/// An override's JSON record, read back.
fn parse(json: &str) -> Option<Override> {
    serde_json::from_str::<Record>(json).ok().and_then(|r| Override::try_from(r).ok())
}

/// Records a change of `rule`'s override of `key` (`action`: `set`, `delete`, `lapse`), from
/// `old` to `new`, made by `from`: a log line under the `slidegate::audit` target and
/// [`metrics::OVERRIDE_CHANGES`]. The log line's time is when.
pub fn audit(action: &'static str, rule: &str, key: &str, old: Option<&Override>, new: Option<&Override>, from: &str) {
    let json =
        |o: Option<&Override>| o.map_or_else(|| "none".to_owned(), |o| serde_json::json!(Record::from(o)).to_string());
    info!(target: "slidegate::audit", action, rule, key, old = %json(old), new = %json(new), from, "override {action}");
    ::metrics::counter!(metrics::OVERRIDE_CHANGES, "action" => action).increment(1);
}
