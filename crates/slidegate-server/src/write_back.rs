//! Writes into Redis what a local failure policy admitted while it was away
//! ([`slidegate::Limiter::write_back`]), in the background, as soon as it answers again: the
//! window that spans an outage then counts the fleet's local admissions, even on a Redis that
//! came back empty. Until its journal is written, the instance keeps deciding locally (the
//! limiter holds the circuit open): Redis, which does not hold those admissions yet, would
//! admit them again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use crate::app::App;
use crate::metrics;

/// How often the journal is looked at: how soon after Redis returns the write-back starts.
pub const EVERY: Duration = Duration::from_millis(250);

/// How long a stopping instance with local admissions not yet written keeps trying: a Redis
/// that returns within it still gets them. A stop with nothing to write does not wait.
pub const AT_STOP: Duration = Duration::from_secs(5);

/// Writes back while the process runs; a look at an empty journal is all it costs meanwhile.
pub async fn forever(app: Arc<App>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        once(&app, None).await;
    }
}

/// At the stop, once no decision is made any more: writes back what is still pending, trying
/// every [`EVERY`] and starting no write after [`AT_STOP`] has passed (one under way may take
/// the backend's deadline more), and logs what it could not write.
pub async fn at_stop(app: &App) {
    if app.limiter.write_back_pending() == 0 {
        return;
    }
    info!(pending = app.limiter.write_back_pending(), "writing back local admissions before stopping");
    let until = Instant::now() + AT_STOP;
    while app.limiter.write_back_pending() > 0 && Instant::now() < until {
        once(app, Some(until)).await;
        tokio::time::sleep(EVERY.min(until.saturating_duration_since(Instant::now()))).await;
    }
    let pending = app.limiter.write_back_pending();
    if pending > 0 {
        warn!(
            pending,
            within = %humantime::format_duration(AT_STOP),
            "stopping with local admissions not written back: the backend did not take them in time"
        );
    }
}

/// One look at the journal: a write-back (no entry started after `until`) when it holds
/// anything, counted and logged.
async fn once(app: &App, until: Option<Instant>) {
    let pending = app.limiter.write_back_pending();
    ::metrics::gauge!(metrics::WRITE_BACK_PENDING).set(pending as f64);
    if pending == 0 {
        return;
    }
    let done = app.limiter.write_back_until(until).await;
    ::metrics::counter!(metrics::WRITE_BACK_PERMITS, "outcome" => "written").increment(done.written);
    ::metrics::counter!(metrics::WRITE_BACK_PERMITS, "outcome" => "dropped").increment(done.dropped);
    ::metrics::gauge!(metrics::WRITE_BACK_PENDING).set(done.pending as f64);
    if done.written > 0 || done.dropped > 0 {
        info!(
            written = done.written,
            dropped = done.dropped,
            pending = done.pending,
            "wrote back what was admitted locally while the backend was away"
        );
    }
    if done.dropped > 0 {
        warn!(dropped = done.dropped, "local admissions not written back: out of their window or past a bound");
    }
}
