//! Puts what Redis holds in force in this instance: a rules document, one override's change,
//! or a whole snapshot. Each is applied at once — the rules swapped whole, an override set or
//! removed — so a decision sees the state before or after a change, never part of it.

use serde::Deserialize;
use tracing::{error, info, warn};

use super::diff;
use crate::app::App;
use crate::metrics;
use crate::overrides::{Override, Record, Target};
use crate::redact::redact;
use crate::shared_store::{Shared, Snapshot, StoreError, StoredRules, parse_stored};

/// The notice of one change, as the scripts publish it: `{"v", "op", "o"?}`.
#[derive(Debug, Deserialize)]
pub(super) struct Change {
    /// Its version: one more than the change before it.
    #[serde(rename = "v")]
    pub version: u64,
    op: Op,
    /// The override set or removed.
    #[serde(rename = "o", default)]
    record: Option<Record>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Op {
    Rules,
    Set,
    Del,
    Lapse,
}

/// Applies one change; a rules change reads the document it announces.
pub(super) async fn change(app: &App, shared: &Shared, change: Change) -> Result<(), StoreError> {
    match (change.op, change.record) {
        (Op::Rules, _) if shared.rules_from_redis() => {
            if let Some(stored) = shared.store().rules().await? {
                rules(app, shared, stored);
            }
        }
        (Op::Rules, _) => {}
        (Op::Set, Some(record)) => match keyed(record) {
            Ok((key, o)) => {
                if let Err(full) = app.overrides.insert(key, o) {
                    error!("an override from redis is not applied: {full}");
                }
            }
            Err(e) => warn!("an override from redis is not applied: {e}"),
        },
        (Op::Del | Op::Lapse, Some(record)) => {
            if let Ok(target) = Target::parse(&record.rule, &record.key) {
                app.overrides.remove(&target.backend_key());
            }
        }
        (op, None) => warn!("a change ({op:?}) from redis without its override, ignored"),
    }
    ::metrics::gauge!(metrics::OVERRIDES).set(app.overrides.len() as f64);
    Ok(())
}

/// Applies a snapshot: its rules (when they come from Redis) and its overrides; returns its
/// version.
pub(super) fn snapshot(app: &App, shared: &Shared, snapshot: Snapshot) -> u64 {
    match snapshot.rules {
        Some(stored) if shared.rules_from_redis() => rules(app, shared, stored),
        None if shared.rules_from_redis() && shared.rules().is_none() => {
            warn!("no rules in redis yet: serving none until `slidegate rules push`");
        }
        _ => {}
    }
    let entries = snapshot.overrides.into_iter().filter_map(|(field, json)| {
        let parsed = serde_json::from_str::<Record>(&json).map_err(|e| e.to_string()).and_then(keyed);
        parsed.map_err(|e| warn!(field, "an override from redis is not applied: {e}")).ok()
    });
    let left_out = snapshot.left_out + app.overrides.replace_all(entries);
    if left_out > 0 {
        let max = app.overrides.max();
        error!("{left_out} overrides in redis are not applied: this instance holds at most max_overrides = {max}");
    }
    ::metrics::gauge!(metrics::OVERRIDES).set(app.overrides.len() as f64);
    snapshot.version
}

/// The backend key and override of a record.
fn keyed(record: Record) -> Result<(String, Override), String> {
    let target = Target::parse(&record.rule, &record.key).map_err(|e| e.to_string())?;
    Ok((target.backend_key(), Override::try_from(record)?))
}

/// Puts a rules document in force, unless it is in force already; an invalid one changes
/// nothing. The audit line names each rule changed, old → new.
pub(super) fn rules(app: &App, shared: &Shared, stored: StoredRules) {
    if shared.rules().is_some_and(|r| r.text == stored.text) {
        shared.set_rules(stored);
        return;
    }
    let config = match parse_stored(&stored) {
        Ok(config) => config,
        Err(e) => {
            ::metrics::counter!(metrics::RELOADS, "result" => "failed", "file" => "redis").increment(1);
            error!("rules version {} from redis not applied, the previous rules stay in force: {e}", stored.version);
            shared.refuse_rules(redact(&e.to_string()).into_owned());
            return;
        }
    };
    let old = app.put_shared_rules(config.rules, config.inline);
    let new = app.live();
    let changes = diff::changes((&old.rules, &old.inline), (&new.rules, &new.inline));
    ::metrics::counter!(metrics::RELOADS, "result" => "ok", "file" => "redis").increment(1);
    info!(
        target: "slidegate::audit",
        version = stored.version,
        pushed_at = %super::format_ms(stored.pushed_at_ms),
        pushed_from = %stored.pushed_from,
        "rules version {} in force, {} rules: {}",
        stored.version,
        new.rules.len(),
        if changes.is_empty() { "no change".to_owned() } else { changes.join("; ") }
    );
    shared.set_rules(stored);
}
