//! The fleet's live instances, for `local_share = "auto"`: while some failure policy asks for it,
//! each instance renews a heartbeat in the store every [`BEAT`] and records the count it reads
//! back into the limiter's [`slidegate::Fleet`], which divides each limit by it while Redis is
//! away (keeping the last count through the outage).

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::MissedTickBehavior;
use tracing::debug;

use crate::app::App;
use crate::metrics;

/// How often an instance renews its heartbeat and counts the fleet.
pub const BEAT: Duration = Duration::from_secs(1);

/// How long a heartbeat counts: an instance that stopped leaves the count within this.
pub const LAPSE: Duration = Duration::from_secs(3);

/// Beats while the process runs; idle while no policy counts the fleet, or on the memory backend.
pub async fn beat_forever(app: Arc<App>) {
    let (Some(shared), Some(fleet)) = (app.shared(), app.limiter.fleet()) else { return };
    let id = instance_id();
    let mut tick = tokio::time::interval(BEAT);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !app.counts_fleet() {
            continue;
        }
        match shared.store().heartbeat(&id, LAPSE).await {
            Ok(live) => {
                fleet.set_live(live);
                ::metrics::gauge!(metrics::FLEET_INSTANCES).set(f64::from(live));
            }
            // Redis away is told by /readyz and the breaker; the last count stands meanwhile.
            Err(e) => debug!(error = %e, "fleet heartbeat failed; keeping the last count"),
        }
    }
}

/// A random id per process: two instances drawing the same one would count as one.
fn instance_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:016x}", RandomState::new().hash_one((std::process::id(), nanos)))
}
