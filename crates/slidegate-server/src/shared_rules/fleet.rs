//! The fleet's live instances, for `local_share = "auto"`: while some failure policy asks for it,
//! each instance renews a heartbeat in Redis every [`FLEET_BEAT`]
//! ([`slidegate::RedisBackend::heartbeat`]) and records the count it reads back into the
//! limiter's [`slidegate::Fleet`], which divides each limit by it while Redis is away (keeping
//! the last count through the outage).

use std::sync::Arc;

use slidegate::redis::{FLEET_BEAT, FLEET_LAPSE, instance_id};
use tokio::time::MissedTickBehavior;
use tracing::debug;

use crate::app::App;
use crate::metrics;

/// Beats while the process runs; idle while no policy counts the fleet, or on the memory backend.
pub async fn beat_forever(app: Arc<App>) {
    let Some(fleet) = app.limiter.fleet() else { return };
    let id = instance_id();
    let mut tick = tokio::time::interval(FLEET_BEAT);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !app.counts_fleet() {
            continue;
        }
        match app.limiter.backend().heartbeat(&id, FLEET_LAPSE).await {
            None => return,
            Some(Ok(live)) => {
                fleet.set_live(live);
                ::metrics::gauge!(metrics::FLEET_INSTANCES).set(f64::from(live));
            }
            // Redis away is told by /readyz and the breaker; the last count stands meanwhile.
            Some(Err(e)) => debug!(error = %e, "fleet heartbeat failed; keeping the last count"),
        }
    }
}
