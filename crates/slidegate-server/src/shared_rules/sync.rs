//! Keeps an instance in step with Redis: every change is announced on a channel, and applied
//! here in version order as its notice arrives; a version check every [`CHECK_INTERVAL`]
//! catches a notice that never came (a dropped subscription, a network that loses packets
//! silently). A gap in the versions, or a store whose version went back (a Redis restarted
//! empty), is answered by reading everything again. While Redis cannot be reached the
//! instance keeps what it has, and says so; it reads everything again once Redis answers.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::PubSub;
use tokio_stream::StreamExt;
use tracing::warn;

use super::apply::{self, Change};
use super::{Shared, StoreError};
use crate::app::App;

/// How often the stored version is compared with the one applied. A change whose notice is
/// lost is applied within two of these (one to notice, one to let a late notice arrive).
pub const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// How long to wait between attempts to reach Redis again.
const RETRY: Duration = Duration::from_millis(250);

/// Reads everything from Redis and applies it before the instance serves, then follows the
/// changes in a task of its own. Does nothing on the memory backend.
pub async fn start(app: &Arc<App>) -> Result<(), StoreError> {
    let Some(shared) = app.shared() else { return Ok(()) };
    let (subscription, version) = resubscribe(app, shared).await?;
    shared.reachable();
    tokio::spawn(follow_forever(Arc::clone(app), subscription, version));
    Ok(())
}

async fn follow_forever(app: Arc<App>, mut subscription: PubSub, mut version: u64) {
    let Some(shared) = app.shared() else { return };
    loop {
        let e = follow(&app, shared, subscription, version).await;
        shared.unreachable(&e);
        (subscription, version) = loop {
            tokio::time::sleep(RETRY).await;
            match resubscribe(&app, shared).await {
                Ok(back) => break back,
                Err(e) => shared.unreachable(&e),
            }
        };
        shared.reachable();
    }
}

/// A new subscription, and everything read again.
async fn resubscribe(app: &App, shared: &Shared) -> Result<(PubSub, u64), StoreError> {
    // Subscribe first: a change made while the snapshot is read is then announced too.
    let subscription = shared.store().subscribe().await?;
    Ok((subscription, resync(app, shared).await?))
}

/// Reads and applies everything; returns the version read first, which the changes announced
/// after it follow.
async fn resync(app: &App, shared: &Shared) -> Result<u64, StoreError> {
    let snapshot = shared.store().snapshot(app.overrides.max()).await?;
    let version = apply::snapshot(app, shared, snapshot);
    shared.set_applied(version);
    Ok(version)
}

/// Applies changes as they are announced, from `applied` on, until Redis fails.
async fn follow(app: &App, shared: &Shared, subscription: PubSub, mut applied: u64) -> StoreError {
    let mut notices = subscription.into_on_message();
    let mut check = tokio::time::interval(CHECK_INTERVAL);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The stored version seen by the last check while behind it.
    let mut behind: Option<u64> = None;
    loop {
        let step = tokio::select! {
            notice = notices.next() => match notice {
                None => Err(StoreError::Reply("the subscription closed".into())),
                Some(notice) => match serde_json::from_slice::<Change>(notice.get_payload_bytes()) {
                    Ok(change) if change.version <= applied => Ok(applied),
                    Ok(change) if change.version == applied + 1 => {
                        let version = change.version;
                        apply::change(app, shared, change).await.map(|()| version)
                    }
                    Ok(_) => resync(app, shared).await,
                    Err(e) => {
                        warn!("an unreadable notice from redis ({e}): reading everything again");
                        resync(app, shared).await
                    }
                },
            },
            _ = check.tick() => match shared.store().version().await {
                Ok(stored) if stored == applied => {
                    behind = None;
                    Ok(applied)
                }
                // Behind: give a notice on its way one more check to arrive.
                Ok(stored) if stored > applied && behind.is_none_or(|seen| applied >= seen) => {
                    behind = Some(stored);
                    Ok(applied)
                }
                // Still behind, or the store went back (a Redis restarted without its data).
                Ok(_) => {
                    behind = None;
                    resync(app, shared).await
                }
                Err(e) => Err(e),
            },
        };
        match step {
            Ok(version) => {
                applied = version;
                shared.set_applied(applied);
            }
            Err(e) => return e,
        }
    }
}
