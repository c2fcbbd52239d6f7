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
use crate::app::App;
use crate::metrics;
use crate::shared_store::{Shared, StoreError};

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
    ::metrics::counter!(metrics::SHARED_RESYNCS).increment(1);
    let snapshot = shared.store().snapshot(app.overrides.max()).await?;
    let version = apply::snapshot(app, shared, snapshot);
    shared.set_applied(version);
    Ok(version)
}

/// What one notice or version check asks for.
enum Step {
    /// Nothing more: every change up to this version is applied.
    Applied(u64),
    /// Reading everything again.
    Resync,
    /// Everything was read again, as of this version.
    Read(u64),
}

/// Applies changes as they are announced, from `applied` on, until Redis fails.
///
/// Reading everything again can take seconds (100,000 overrides), and notices go on arriving
/// meanwhile: each that asks for it (unreadable, after a gap) only marks it pending, and it runs
/// once no notice is waiting, so however many asked, one read follows them.
async fn follow(app: &App, shared: &Shared, subscription: PubSub, mut applied: u64) -> StoreError {
    let mut notices = subscription.into_on_message();
    let mut check = tokio::time::interval(CHECK_INTERVAL);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The stored version seen by the last check while behind it.
    let mut behind: Option<u64> = None;
    let mut pending = false;
    loop {
        let step = tokio::select! {
            // Notices first: those waiting are seen before a pending read runs.
            biased;
            notice = notices.next() => match notice {
                None => Err(StoreError::Lost("the subscription to changes closed")),
                Some(notice) => on_notice(app, shared, notice.get_payload_bytes(), applied).await,
            },
            // Ready at once: taken only when no notice is. The read runs to its end (notices
            // wait meanwhile); cancelling it for each notice could starve it.
            () = std::future::ready(()), if pending => resync(app, shared).await.map(Step::Read),
            _ = check.tick() => match shared.store().version().await {
                Ok(stored) if stored == applied => {
                    behind = None;
                    Ok(Step::Applied(applied))
                }
                // Behind: give a notice on its way one more check to arrive.
                Ok(stored) if stored > applied && behind.is_none_or(|seen| applied >= seen) => {
                    behind = Some(stored);
                    Ok(Step::Applied(applied))
                }
                // Still behind, or the store went back (a Redis restarted without its data).
                Ok(_) => {
                    behind = None;
                    Ok(Step::Resync)
                }
                Err(e) => Err(e),
            },
        };
        match step {
            Ok(Step::Applied(version)) => applied = version,
            Ok(Step::Read(version)) => (applied, pending) = (version, false),
            Ok(Step::Resync) => pending = true,
            Err(e) => return e,
        }
        shared.set_applied(applied);
    }
}

/// Applies the notice `payload` if it is the change after `applied`.
async fn on_notice(app: &App, shared: &Shared, payload: &[u8], applied: u64) -> Result<Step, StoreError> {
    match serde_json::from_slice::<Change>(payload) {
        Ok(change) if change.version <= applied => Ok(Step::Applied(applied)),
        Ok(change) if change.version == applied + 1 => {
            let version = change.version;
            apply::change(app, shared, change).await.map(|()| Step::Applied(version))
        }
        Ok(_) => Ok(Step::Resync),
        Err(e) => {
            warn!("an unreadable notice from redis ({e}): reading everything again");
            Ok(Step::Resync)
        }
    }
}
