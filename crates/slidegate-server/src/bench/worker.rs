//! One worker: keeps one decision in flight, on the open-loop schedule when there is a rate,
//! and counts what it saw.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use slidegate::Quota;

use super::histogram::Histogram;
use super::target::Target;

/// Decisions at most per worker, so a run ends even on a clock that stalls.
const MAX_PER_WORKER: u64 = 50_000_000;

/// How long past the deadline a worker waits for its last answer; one not in by then counts as
/// an error. One timer for the whole run, not one per decision: the generator's own cost per
/// decision stays small beside the target's.
const LAST_ANSWER: Duration = Duration::from_secs(5);

/// What every worker of a run shares.
pub(super) struct Load {
    pub(super) target: Target,
    pub(super) keys: Vec<String>,
    pub(super) quota: Quota,
    /// Decisions per second on a fixed schedule; `None`: closed loop.
    pub(super) rate: Option<u64>,
    /// How many workers there are (at least 1).
    pub(super) workers: u64,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    /// Set at the deadline: workers stop before their next decision.
    pub(super) done: AtomicBool,
    /// Decisions answered so far, for the progress line.
    pub(super) decided: AtomicU64,
}

/// What workers counted.
pub(super) struct Tally {
    pub(super) latencies: Histogram,
    pub(super) allowed: u64,
    pub(super) errors: u64,
    /// Decisions held back by the target, timed from when they were due.
    pub(super) late: u64,
}

impl Tally {
    pub(super) fn new() -> Self {
        Self { latencies: Histogram::new(), allowed: 0, errors: 0, late: 0 }
    }

    pub(super) fn merge(&mut self, other: &Self) {
        self.latencies.merge(&other.latencies);
        self.allowed += other.allowed;
        self.errors += other.errors;
        self.late += other.late;
    }
}

/// A worker's place in the open-loop schedule: when its last decision went out, when its answer
/// came, and whether it was held back by the target (then so is every decision that fell due
/// before it went out: they queued behind the same stall).
struct Pacing {
    sent: Instant,
    answered: Instant,
    held: bool,
}

/// Worker `w`'s loop, until the deadline or [`MAX_PER_WORKER`] decisions.
pub(super) async fn work(load: &Load, w: u64) -> Tally {
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((w + 1) << 17);
    let mut tally = Tally::new();
    let mut pacing = Pacing { sent: load.started, answered: load.started, held: false };
    let mut session = load.target.session(w);
    let give_up = tokio::time::sleep_until((load.deadline + LAST_ANSWER).into());
    tokio::pin!(give_up);
    for i in 0..MAX_PER_WORKER {
        if i % 64 == 63 {
            // A memory backend never makes a worker wait: let the timer and the progress
            // printer run.
            tokio::task::yield_now().await;
        }
        let Some(t) = load.timed_from(w, i, &mut pacing, &mut tally).await else { break };
        if load.done.load(Ordering::Relaxed) || t >= load.deadline {
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let index = (rng % load.keys.len() as u64) as usize;
        pacing.sent = Instant::now();
        let outcome = tokio::select! {
            biased;
            outcome = session.decide(index, &load.keys, &load.quota) => outcome,
            () = &mut give_up => {
                tally.errors += 1;
                break;
            }
        };
        pacing.answered = Instant::now();
        match outcome {
            Ok(allowed) => {
                tally.latencies.record(u32::try_from((pacing.answered - t).as_micros()).unwrap_or(u32::MAX));
                tally.allowed += u64::from(allowed);
                load.decided.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => tally.errors += 1,
        }
    }
    tally
}

impl Load {
    /// When worker `w`'s decision `i` is timed from, after waiting until it is due; `None` when
    /// it falls due after the deadline.
    async fn timed_from(&self, w: u64, i: u64, pacing: &mut Pacing, tally: &mut Tally) -> Option<Instant> {
        let now = Instant::now();
        let Some(rate) = self.rate else { return Some(now) };
        // Open loop: this worker's i-th decision is due at (i * workers + w) / rate seconds.
        let at = self.started + Duration::from_secs_f64((i * self.workers + w) as f64 / rate as f64);
        if at >= self.deadline {
            return None;
        }
        if at > now {
            pacing.held = false;
            tokio::time::sleep_until(at.into()).await;
            return Some(Instant::now());
        }
        pacing.held = (pacing.sent < at && at < pacing.answered) || (at <= pacing.sent && pacing.held);
        if pacing.held {
            // Held back by the target: timed from when it was due.
            tally.late += 1;
            Some(at)
        } else {
            // Behind for the generator's own reasons (start-up, a timer that woke late).
            Some(now)
        }
    }
}
