//! The specification: each algorithm's semantics, written once, plainly, and run — every backend
//! is tested against it decision for decision (`tests/conformance.rs`). Nothing here is tuned
//! for speed.
//!
//! What else runs this code: for the sliding window, the fixed window and the GCRA a key holds a
//! few numbers, for which the plain structure is already the right one, so the production state
//! ([`crate::state::Counter`], under the memory backend and the Redis module) runs [`Key`]
//! itself. The sliding log runs there in a compact structure of its own, tested against
//! [`SlidingLog`]. The Redis Lua scripts are a second, independent implementation of everything.
//!
//! Time `t` is in whole milliseconds. Every check asks for `cost` permits at `now` under an
//! effective limit `L` (the quota's limit, or less while warming up: [`crate::quota::WarmUp`]).
//! Only an admission writes; a denial records nothing, so a client that keeps retrying is not
//! locked out. `remaining` is what is left after the decision; `reset_after` is the time until
//! the key holds nothing; `retry_after` (denials only) is the time until this same request fits;
//! `next_permit_after` is the time until `remaining` next grows by waiting — until what the key
//! holds after the decision next shrinks (a warm-up's growing limit aside), zero when it holds
//! nothing.
//! Under warm-up `retry_after` is computed at today's effective limit, which only grows: the
//! request fits then at the latest (an idle key always admits a valid cost).
//!
//! # Sliding window log (exact)
//!
//! A key keeps a log of admissions, one entry per permit.
//!
//! - An admission made at `t` **is in the window at `now` iff `now < t + window`**: an entry
//!   exactly `window` old has left. (The Redis script removes scores `<= now - window`.)
//! - Admitted **iff `live + cost <= L`**, `live` = entries in the window; it appends `cost`
//!   entries stamped `now`.
//! - `reset_after`: until the newest entry leaves. `retry_after`: until the `k`-th oldest live
//!   entry leaves, `k = live + cost - L`. `next_permit_after`: until the oldest live entry leaves
//!   (after an admission, the new entries are live too).
//!
//! # Sliding window counter (near-exact, constant memory)
//!
//! The window of `W` ms is split into `n` buckets of `b = W / n` ms; bucket `i` counts the
//! permits admitted in `[i·b, (i+1)·b)`. At `now`, in bucket `j = now / b` at offset `r = now % b`,
//! the estimate is the sum of buckets `j-n+1 ..= j` plus bucket `j-n` weighted by the part of it
//! still inside the window: `floor(count(j-n) · (b − r) / b)`.
//!
//! - Admitted **iff `estimate + cost <= L`**; it adds `cost` to bucket `j`.
//! - `reset_after`: until the newest counted bucket `m` has left entirely, `(m+n+1)·b − now`.
//! - `retry_after`: the first instant the estimate has fallen far enough.
//! - `next_permit_after`: the first instant the estimate falls (after an admission, with its
//!   cost counted in bucket `j`). While the weighted bucket still adds `w > 0`, the first offset
//!   at which its share drops below `w`: `r' = floor(b·(c − w) / c) + 1` (`c` its count; at most
//!   `b`, the bucket's end, where the share is gone); otherwise 1 ms after the oldest counted
//!   bucket `k` with permits becomes the weighted one, `(k+n)·b + 1`.
//! - Error bound: the estimate assumes the oldest bucket's admissions were spread evenly over
//!   it. It can over- or under-count by at most that bucket's count (never more than `L`, and
//!   about `L / n` at a steady rate). So any rolling window of `W` holds at most `L + count(j-n)`
//!   admissions, and a client may be refused while fewer than `L` are really in the window. The
//!   measured disagreement with the exact log on a bursty trace is in BENCHMARKS.md.
//! - A caller whose clock lies behind the key's newest bucket `t` by at most a window (`j < t <=
//!   j + n`: another caller's clock is ahead) is decided, and recorded, as at `t`'s start, its
//!   durations still measured from its own `now`: the key's time never steps back, so one
//!   limit holds across both clocks. A bucket further ahead is kept and not counted (the Redis
//!   scripts decide there as at its start too; docs/redis.md).
//!
//! # Fixed window (crude)
//!
//! Window `j = now / W` (aligned to the clock's epoch) counts its admissions; admitted **iff
//! `count(j) + cost <= L`**. `reset_after`, `retry_after` and `next_permit_after` are the
//! window's end (`next_permit_after` is zero, as `reset_after` is, for a held check of an empty
//! window). Around an
//! edge, `L` at the end of one window and `L` at the start of the next pass: up to `2L` within
//! `W`.
//!
//! # GCRA (token bucket)
//!
//! One number per key: the theoretical arrival time `tat`, in µs. Permits are emitted every
//! `T = W·1000 / L₀` µs (`L₀` the quota's limit; rounded down), and a bucket holds up to `burst`:
//! `τ = burst · T`. While warming up each permit costs `Tₑ = W·1000 / L` µs instead.
//!
//! - With `base = max(tat, now)` and `new = base + cost · Tₑ`, admitted **iff `new − now <= τ`**;
//!   then `tat = new`.
//! - `limit` reported = `τ / Tₑ`; `remaining = (now + τ − new) / Tₑ`; `reset_after = new − now`
//!   (the bucket full again); `retry_after = new − τ − now`, rounded up to the ms: exact.
//! - `next_permit_after`: the bucket holds `L − remaining` permits' worth; one more is free once
//!   it has drained to `L − remaining − 1` of them: `reset_after − floor((L − remaining − 1)·Tₑ /
//!   1000)` ms, computed from the reported, whole-ms `reset_after` (so every engine gets it from
//!   what it answers; at most 1 ms after the exact instant, never before). Zero when
//!   `remaining >= L` (the bucket is empty).
//!
//! # Charges and refunds
//!
//! A **charge** records `cost` permits at `now` whatever the key holds (a cost known only after
//! the work, such as a response's tokens): never denied. It records `min(cost, room)`, `room` the
//! permits until the key holds [`crate::MAX_CHARGE_FACTOR`] (2) times the quota's limit `L₀`:
//! `2·L₀ − live` for the sliding log, `2·L₀ − estimate` for the sliding window (into bucket `j`, as
//! an admission), `2·L₀ − count(j)` for the fixed window, `floor((now + 2τ − base) / Tₑ)` for the
//! GCRA (which then moves `tat` to `base + recorded · Tₑ`). Past the room the charge is *clamped*.
//!
//! A **refund** gives back up to `cost` of the key's most recent admissions: the sliding log
//! drops its newest live entries; the sliding window takes from its fully counted buckets
//! (`j−n+1 ..= j`), newest first, dropping a bucket it empties (the weighted bucket is not
//! refunded: a permit there no longer weighs a whole one); the fixed window lowers `count(j)`; the
//! GCRA moves `tat` back by `cost · Tₑ`, not before `now`, and reports `min(cost, ceil((tat −
//! now) / Tₑ))`. It never goes below nothing: it reports what it gave back.
//!
//! Both answer the key's **standing** after them ([`Key::standing`]): when a check of no permit
//! would be admitted (the key within its limit), an admission with that check's `limit` and
//! `remaining`, the key's own `reset_after` and `next_permit_after`; otherwise (the key over its
//! limit) the denial a check of one permit gets.

use std::time::Duration;

use crate::{Algorithm, Charged, Decision, MAX_CHARGE_FACTOR, MultiDecision, Quota, Refunded};

/// The sliding window log of one key, as specified: one time per admitted permit.
///
/// ```
/// use slidegate::spec::SlidingLog;
///
/// // 5 per 10 s, seven requests 0.5 s apart: the sixth and seventh are denied.
/// let mut log = SlidingLog::default();
/// let admitted: Vec<bool> = (0..7).map(|i| log.check(i * 500, 5, 10_000, 1).allowed).collect();
/// assert_eq!(admitted, [true, true, true, true, true, false, false]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct SlidingLog {
    pub(crate) admissions: Vec<u64>,
}

impl SlidingLog {
    /// Decides `cost` permits of `limit` per `window_ms` at `now`; records them when admitted.
    pub fn check(&mut self, now: u64, limit: u64, window_ms: u64, cost: u64) -> Decision {
        let decision = self.decide(now, limit, window_ms, cost);
        if decision.allowed {
            self.record(now, cost);
        }
        decision
    }

    /// What [`SlidingLog::check`] would answer, recording nothing.
    pub fn decide(&self, now: u64, limit: u64, window_ms: u64, cost: u64) -> Decision {
        let live = self.live(now, window_ms);
        let count = live.len() as u64;
        if count + cost <= limit {
            let newest = live.last().map_or(now, |&t| t.max(now));
            // The new entries, stamped `now`, are the oldest when the clock stepped back.
            let oldest = live.first().map_or(now, |&t| t.min(now));
            return Decision::allowed(limit, limit - count - cost, ms(newest + window_ms - now))
                .with_next_permit_after(ms(oldest + window_ms - now));
        }
        let k = count + cost - limit;
        let next = self.next_permit_after(now, window_ms);
        // `k <= count` whenever `cost <= limit`; a larger cost can never be admitted.
        let Some(&blocking) = live.get(usize::try_from(k - 1).unwrap_or(usize::MAX)) else {
            return Decision::denied(limit, limit.saturating_sub(count), Duration::ZERO, Duration::MAX)
                .with_next_permit_after(next);
        };
        Decision::denied(
            limit,
            limit.saturating_sub(count),
            self.reset_after(now, window_ms),
            ms(blocking + window_ms - now),
        )
        .with_next_permit_after(next)
    }

    /// Drops up to `cost` of the newest admissions in the window at `now`; how many it dropped.
    pub fn refund(&mut self, now: u64, window_ms: u64, cost: u64) -> u64 {
        let mut live = self.live(now, window_ms);
        let dropped = cost.min(live.len() as u64);
        live.truncate(live.len() - usize::try_from(dropped).unwrap_or(usize::MAX));
        self.admissions.retain(|&t| now >= t + window_ms);
        self.admissions.extend(live);
        dropped
    }

    /// Appends `cost` admissions at `now`.
    pub fn record(&mut self, now: u64, cost: u64) {
        self.admissions.extend(std::iter::repeat_n(now, usize::try_from(cost).unwrap_or(usize::MAX)));
    }

    /// The admissions in the window at `now`, oldest first.
    pub fn live(&self, now: u64, window_ms: u64) -> Vec<u64> {
        let mut live: Vec<u64> = self.admissions.iter().copied().filter(|&t| now < t + window_ms).collect();
        live.sort_unstable();
        live
    }

    /// Time until the newest admission in the window leaves it; zero when none is in it.
    pub fn reset_after(&self, now: u64, window_ms: u64) -> Duration {
        self.live(now, window_ms).last().map_or(Duration::ZERO, |&t| ms(t + window_ms - now))
    }

    /// Time until the oldest admission in the window leaves it; zero when none is in it.
    pub fn next_permit_after(&self, now: u64, window_ms: u64) -> Duration {
        self.live(now, window_ms).first().map_or(Duration::ZERO, |&t| ms(t + window_ms - now))
    }

    /// The few admissions the log's standing at `now` depends on (see [`LogSummary`]).
    pub fn summary(&self, now: u64, limit: u64, window_ms: u64) -> LogSummary {
        let live = self.live(now, window_ms);
        let count = live.len() as u64;
        let at = |i: u64| usize::try_from(i).ok().and_then(|i| live.get(i).copied()).unwrap_or(0);
        let blocking = if count > limit { at(count - limit) } else { 0 };
        LogSummary { count, oldest: at(0), newest: live.last().copied().unwrap_or(0), blocking }
    }
}

/// What a sliding log's standing (see [the module](self)) depends on: a Redis script reads these
/// few admissions rather than the whole log, and the standing is computed from them here, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSummary {
    /// The permits in the window.
    pub count: u64,
    /// The oldest and the newest of their times (0 when `count` is 0).
    pub oldest: u64,
    /// See `oldest`.
    pub newest: u64,
    /// When `count` exceeds the limit: the time of the permit whose leaving lets one more in
    /// (the `count - limit`-th from the oldest, counting from 0); otherwise 0.
    pub blocking: u64,
}

impl LogSummary {
    /// The standing of a log so summarised at `now`, under `limit` per `window_ms`: what
    /// [`Key::standing`] answers for it.
    pub fn standing(&self, now: u64, limit: u64, window_ms: u64) -> Decision {
        let after = |t: u64| if self.count == 0 { Duration::ZERO } else { ms(t + window_ms - now) };
        let (reset, next) = (after(self.newest), after(self.oldest));
        if self.count > limit {
            return Decision::denied(limit, 0, reset, ms(self.blocking + window_ms - now)).with_next_permit_after(next);
        }
        Decision::allowed(limit, limit - self.count, reset).with_next_permit_after(next)
    }
}

/// One key under one algorithm, as specified, with the start of its warm-up.
///
/// ```
/// use slidegate::{Algorithm, Quota, spec::Key};
/// use std::time::Duration;
///
/// // A fixed window of 2 per second admits 4 around an edge.
/// let q = Quota::per_second(2)?.with_algorithm(Algorithm::FixedWindow)?;
/// let mut key = Key::new(q.algorithm());
/// let admitted = [900, 950, 1_000, 1_050].iter().filter(|&&t| key.check(t, &q, 1).allowed).count();
/// assert_eq!(admitted, 4);
/// # Ok::<(), slidegate::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Key {
    pub(crate) state: State,
    /// When the current warm-up began: the first admission under a warm-up after the key was
    /// idle (0: none, a key warm for as long as it holds permits).
    pub(crate) warm_since: u64,
}

/// What a [`Key`] holds, by algorithm (the snapshot format, `snapshot.rs`, writes it out).
#[derive(Debug, Clone)]
pub(crate) enum State {
    Log(SlidingLog),
    /// `(bucket index, permits admitted in it)`, indexes increasing: a handful of buckets, where
    /// a sorted vector is both the smallest and the quickest map.
    Window(Vec<(u64, u64)>),
    /// The window of the last admission and its count.
    Fixed(Option<(u64, u64)>),
    /// The theoretical arrival time in µs.
    Gcra(u64),
}

impl Key {
    /// A key that holds nothing yet, counted by `algorithm`.
    pub fn new(algorithm: Algorithm) -> Self {
        let state = match algorithm {
            Algorithm::SlidingLog => State::Log(SlidingLog::default()),
            Algorithm::SlidingWindow { .. } => State::Window(Vec::new()),
            Algorithm::FixedWindow => State::Fixed(None),
            Algorithm::Gcra { .. } => State::Gcra(0),
        };
        Self { state, warm_since: 0 }
    }

    /// Decides `cost` permits of `quota` at `now`; records them when admitted.
    pub fn check(&mut self, now: u64, quota: &Quota, cost: u64) -> Decision {
        let decision = self.decide(now, quota, cost);
        if decision.allowed {
            self.record(now, quota, cost);
        }
        decision
    }

    /// What [`Key::check`] would answer, recording nothing.
    pub fn decide(&self, now: u64, quota: &Quota, cost: u64) -> Decision {
        let limit = self.limit_at(now, quota);
        let w = quota.window_ms();
        match &self.state {
            State::Log(log) => log.decide(now, limit, w, cost),
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                let at = window_time(counts, now, n, b);
                let estimate = window_estimate(counts, at, n, b);
                if estimate + cost <= limit {
                    let next = window_next_drop(counts, at, n, b, cost) + ms(at - now);
                    return Decision::allowed(limit, limit - estimate - cost, ms((at / b + n + 1) * b - now))
                        .with_next_permit_after(next);
                }
                let retry = window_retry(counts, at, n, b, limit - cost);
                Decision::denied(limit, limit.saturating_sub(estimate), self.reset_after(now, quota), ms(retry - now))
                    .with_next_permit_after(window_next_permit(counts, now, n, b))
            }
            State::Fixed(last) => {
                let end = (now / w + 1) * w;
                let count = last.filter(|&(i, _)| i == now / w).map_or(0, |(_, c)| c);
                if count + cost <= limit {
                    return Decision::allowed(limit, limit - count - cost, ms(end - now));
                }
                // Both constructors' `next_permit_after` is the window's end.
                Decision::denied(limit, limit.saturating_sub(count), ms(end - now), ms(end - now))
            }
            &State::Gcra(tat) => {
                let (now_us, tau, t) = (now * 1000, quota.burst() * quota.emission_us(), w * 1000 / limit);
                let base = tat.max(now_us);
                let new = base + cost * t;
                if new - now_us <= tau {
                    let (remaining, reset) = ((now_us + tau - new) / t, ceil_ms(new - now_us));
                    return Decision::allowed(tau / t, remaining, ms(reset))
                        .with_next_permit_after(ms(gcra_next_permit(tau / t, remaining, reset, t)));
                }
                let (remaining, reset) = ((now_us + tau).saturating_sub(base) / t, ceil_ms(base - now_us));
                Decision::denied(tau / t, remaining, ms(reset), ms(ceil_ms(new - tau - now_us)))
                    .with_next_permit_after(ms(gcra_next_permit(tau / t, remaining, reset, t)))
            }
        }
    }

    /// Records `cost` permits at `now` (whether or not they fit).
    pub fn record(&mut self, now: u64, quota: &Quota, cost: u64) {
        let limit = self.limit_at(now, quota);
        // Only under a warm-up: a key busy since before one was added counts as warm.
        if quota.warm_up().is_some() && self.idle(now, quota) {
            self.warm_since = now;
        }
        let w = quota.window_ms();
        match &mut self.state {
            State::Log(log) => log.record(now, cost),
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                let j = window_time(counts, now, n, b) / b;
                counts.retain(|&(i, _)| i + n >= j);
                match counts.binary_search_by_key(&j, |&(i, _)| i) {
                    Ok(at) => counts[at].1 += cost,
                    Err(at) => {
                        if counts.len() == counts.capacity() {
                            // Doubling, but not past the n + 1 buckets one window spans.
                            let span = usize::try_from(n + 1).unwrap_or(usize::MAX);
                            let room = (counts.len() * 2).max(4).min(span).max(counts.len() + 1);
                            counts.reserve_exact(room - counts.len());
                        }
                        counts.insert(at, (j, cost));
                    }
                }
            }
            State::Fixed(last) => match last {
                Some((i, c)) if *i == now / w => *c += cost,
                _ => *last = Some((now / w, cost)),
            },
            State::Gcra(tat) => *tat = (*tat).max(now * 1000) + cost * (w * 1000 / limit),
        }
    }

    /// Records `cost` permits at `now` whatever the key holds, clamped at
    /// [`crate::MAX_CHARGE_FACTOR`] times the limit (see [the module](self)); the key's standing
    /// after it.
    pub fn charge(&mut self, now: u64, quota: &Quota, cost: u64) -> Charged {
        let recorded = cost.min(self.charge_room(now, quota));
        if recorded > 0 {
            self.record(now, quota, recorded);
        }
        Charged::new(self.standing(now, quota), cost, recorded)
    }

    /// The permits a charge at `now` may record before the key holds twice its limit.
    fn charge_room(&self, now: u64, quota: &Quota) -> u64 {
        let full = MAX_CHARGE_FACTOR * quota.limit();
        let w = quota.window_ms();
        match &self.state {
            State::Log(log) => full.saturating_sub(log.live(now, w).len() as u64),
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                full.saturating_sub(window_estimate(counts, window_time(counts, now, n, b), n, b))
            }
            State::Fixed(last) => full.saturating_sub(last.filter(|&(i, _)| i == now / w).map_or(0, |(_, c)| c)),
            &State::Gcra(tat) => {
                let (now_us, te) = (now * 1000, w * 1000 / self.limit_at(now, quota));
                let tau = quota.burst() * quota.emission_us();
                (now_us + MAX_CHARGE_FACTOR * tau).saturating_sub(tat.max(now_us)) / te
            }
        }
    }

    /// Gives back up to `cost` of the key's most recent admissions at `now` (see
    /// [the module](self)); what it gave back, and the key's standing after it.
    pub fn refund(&mut self, now: u64, quota: &Quota, cost: u64) -> Refunded {
        let te = quota.window_ms() * 1000 / self.limit_at(now, quota);
        let w = quota.window_ms();
        let refunded = match &mut self.state {
            State::Log(log) => log.refund(now, w, cost),
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                let j = window_time(counts, now, n, b) / b;
                let mut left = cost;
                for (i, c) in counts.iter_mut().rev() {
                    if *i <= j && *i + n > j {
                        let taken = left.min(*c);
                        (*c, left) = (*c - taken, left - taken);
                    }
                }
                counts.retain(|&(_, c)| c > 0);
                cost - left
            }
            State::Fixed(last) => match last {
                Some((i, c)) if *i == now / w => {
                    let taken = cost.min(*c);
                    *c -= taken;
                    taken
                }
                _ => 0,
            },
            State::Gcra(tat) => {
                let ahead = tat.saturating_sub(now * 1000);
                *tat = (*tat).saturating_sub(cost * te).max(now * 1000).min(*tat);
                cost.min(ahead.div_ceil(te))
            }
        };
        Refunded::new(self.standing(now, quota), refunded)
    }

    /// The key's standing at `now` (see [the module](self)): an admission of nothing while it is
    /// within its limit, with its own `reset_after` and `next_permit_after`; the denial of one
    /// permit once it is over it. What a charge and a refund answer.
    pub fn standing(&self, now: u64, quota: &Quota) -> Decision {
        if let State::Log(log) = &self.state {
            let (limit, w) = (self.limit_at(now, quota), quota.window_ms());
            return log.summary(now, limit, w).standing(now, limit, w);
        }
        let within = self.decide(now, quota, 0);
        if !within.allowed {
            return self.decide(now, quota, 1);
        }
        Decision::allowed(within.limit, within.remaining, self.reset_after(now, quota))
            .with_next_permit_after(self.next_permit_after(now, quota))
    }

    /// Time until the key holds nothing.
    pub fn reset_after(&self, now: u64, quota: &Quota) -> Duration {
        let w = quota.window_ms();
        match &self.state {
            State::Log(log) => log.reset_after(now, w),
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                let newest = counts.iter().rev().find(|&&(i, c)| c > 0 && i + n >= now / b);
                // A bucket counted under another quota's geometry may lie far ahead.
                newest.map_or(Duration::ZERO, |&(m, _)| ms((m + n + 1).saturating_mul(b).saturating_sub(now)))
            }
            State::Fixed(last) => match last {
                Some((i, c)) if *i == now / w && *c > 0 => ms((i + 1) * w - now),
                _ => Duration::ZERO,
            },
            &State::Gcra(tat) => ms(ceil_ms(tat.saturating_sub(now * 1000))),
        }
    }

    /// Time until `remaining` next grows, as the key stands (what a held check answers).
    pub fn next_permit_after(&self, now: u64, quota: &Quota) -> Duration {
        match &self.state {
            State::Log(log) => log.next_permit_after(now, quota.window_ms()),
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                window_next_permit(counts, now, n, b)
            }
            State::Fixed(_) => self.reset_after(now, quota),
            // A check of no permit is admitted, or denied, at the key's standing as it is.
            State::Gcra(_) => self.decide(now, quota, 0).next_permit_after,
        }
    }

    /// When, at the earliest, the key is idle and holds nothing; forgetting it then changes no
    /// decision (the memory backend sweeps by it).
    pub fn expires_at(&self, quota: &Quota) -> u64 {
        let w = quota.window_ms();
        match &self.state {
            State::Log(log) => log.admissions.iter().max().map_or(0, |&t| t + w),
            // Indexes counted under another quota's window may be far ahead of this one's.
            State::Window(counts) => {
                let (n, b) = geometry(quota);
                counts.last().map_or(0, |&(m, _)| (m + n + 1).saturating_mul(b))
            }
            State::Fixed(last) => last.map_or(0, |(i, _)| (i + 2).saturating_mul(w)),
            &State::Gcra(tat) => ceil_ms(tat),
        }
    }

    /// The bytes this key holds beyond its own size.
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.state {
            State::Log(log) => log.admissions.capacity() * size_of::<u64>(),
            State::Window(counts) => counts.capacity() * size_of::<(u64, u64)>(),
            State::Fixed(_) | State::Gcra(_) => 0,
        }
    }

    /// The algorithm this key is counted by (its parameters come with each quota).
    pub(crate) fn algorithm_kind(&self) -> Algorithm {
        match self.state {
            State::Log(_) => Algorithm::SlidingLog,
            State::Window(_) => Algorithm::SlidingWindow { buckets: 1 },
            State::Fixed(_) => Algorithm::FixedWindow,
            State::Gcra(_) => Algorithm::Gcra { burst: None },
        }
    }

    /// Whether the key holds nothing at `now`, so that a warm-up would start over.
    fn idle(&self, now: u64, quota: &Quota) -> bool {
        match &self.state {
            State::Fixed(last) => last.is_none_or(|(i, _)| i + 1 < now / quota.window_ms()),
            _ => self.reset_after(now, quota).is_zero(),
        }
    }

    /// The effective limit at `now`: the quota's, or less while warming up.
    fn limit_at(&self, now: u64, quota: &Quota) -> u64 {
        let since = if self.idle(now, quota) { now } else { self.warm_since };
        quota.limit_at(now.saturating_sub(since))
    }
}

/// A sliding window quota's bucket count and bucket length in ms.
fn geometry(quota: &Quota) -> (u64, u64) {
    let Algorithm::SlidingWindow { buckets } = quota.algorithm() else {
        return (1, quota.window_ms());
    };
    (u64::from(buckets), quota.window_ms() / u64::from(buckets))
}

/// The time a sliding window counter decides at: `now`, or, when `now` lies up to a window
/// before the newest bucket (a caller's clock behind another's), that bucket's start. So the
/// key's time never steps back: what a clock ahead admitted counts in full, and a clock behind
/// never drops a bucket still in another's window. (A bucket further ahead was counted under
/// another quota's geometry, and is not counted.)
fn window_time(counts: &[(u64, u64)], now: u64, n: u64, b: u64) -> u64 {
    match counts.last() {
        Some(&(t, _)) if t > now / b && t <= now / b + n => t * b,
        _ => now,
    }
}

/// [`window_next_drop`] of a key as it stands, from `now`: zero when it holds nothing.
fn window_next_permit(counts: &[(u64, u64)], now: u64, n: u64, b: u64) -> Duration {
    let at = window_time(counts, now, n, b);
    let next = window_next_drop(counts, at, n, b, 0);
    if next.is_zero() { next } else { next + ms(at - now) }
}

/// The sliding window counter's estimate at `t`.
fn window_estimate(counts: &[(u64, u64)], t: u64, n: u64, b: u64) -> u64 {
    let (j, r) = (t / b, t % b);
    let full: u64 = counts.iter().filter(|&&(i, _)| i + n > j && i <= j).map(|&(_, c)| c).sum();
    let oldest = counts.iter().find(|&&(i, _)| i + n == j).map_or(0, |&(_, c)| c);
    // A count of up to `MAX_LIMIT` (recorded under another quota) times a bucket of up to
    // `MAX_WINDOW` overflows 64 bits; the quotient is at most the count.
    full + (u128::from(oldest) * u128::from(b - r) / u128::from(b)) as u64
}

/// The first instant from `now` at which the estimate is at most `room`: bucket by bucket, then
/// by bisection inside the first bucket that reaches it (the estimate only falls within one).
fn window_retry(counts: &[(u64, u64)], now: u64, n: u64, b: u64, room: u64) -> u64 {
    let mut start = now;
    loop {
        let end = (start / b + 1) * b;
        if window_estimate(counts, end - 1, n, b) <= room {
            let (mut lo, mut hi) = (start, end - 1);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if window_estimate(counts, mid, n, b) <= room { hi = mid } else { lo = mid + 1 }
            }
            return lo;
        }
        start = end;
    }
}

/// The sliding window counter's `next_permit_after` at `now` (see [the module](self)), with
/// `added` more permits counted in the current bucket: zero when the estimate holds nothing.
pub(crate) fn window_next_drop(counts: &[(u64, u64)], now: u64, n: u64, b: u64, added: u64) -> Duration {
    let (j, r) = (now / b, now % b);
    let count_of = |i: u64| counts.iter().find(|&&(k, _)| k == i).map_or(0, |&(_, c)| c);
    // The weighted bucket's share, `floor(c·(b − r) / b)`, in 128 bits: see `window_estimate`.
    let c = u128::from(j.checked_sub(n).map_or(0, count_of));
    let share = c * u128::from(b - r) / u128::from(b);
    if share > 0 {
        let drops_at = (u128::from(b) * (c - share) / c + 1) as u64;
        return ms(drops_at.min(b) - r);
    }
    let counted = |&&(i, c): &&(u64, u64)| i + n > j && i <= j && c > 0;
    let oldest = counts.iter().filter(counted).map(|&(i, _)| i).min();
    let oldest = if added > 0 { Some(oldest.map_or(j, |i| i.min(j))) } else { oldest };
    oldest.map_or(Duration::ZERO, |k| ms(((k + n) * b + 1).saturating_sub(now)))
}

/// The GCRA's `next_permit_after` in ms (see [the module](self)): `limit` and `remaining` as
/// reported, `reset_ms` the reported `reset_after`, `te` the effective emission interval in µs.
pub(crate) fn gcra_next_permit(limit: u64, remaining: u64, reset_ms: u64, te: u64) -> u64 {
    if remaining >= limit {
        return 0;
    }
    reset_ms.saturating_sub((limit - remaining - 1).saturating_mul(te) / 1000)
}

fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

/// The atomic multi-limit check: `checks[i] = (quota, cost)` on `keys[i]`, all at `now`.
/// Either every check fits and all are recorded, or nothing is recorded; then each check that
/// fit is reported [`Decision::held`] with its uncharged `remaining`.
pub fn check_all(keys: &mut [Key], now: u64, checks: &[(Quota, u64)]) -> MultiDecision {
    let fits: Vec<Decision> = keys.iter().zip(checks).map(|(key, (q, cost))| key.decide(now, q, *cost)).collect();
    if fits.iter().all(|d| d.allowed) {
        for (key, (q, cost)) in keys.iter_mut().zip(checks) {
            key.record(now, q, *cost);
        }
        return MultiDecision::new(fits);
    }
    let decisions = fits
        .into_iter()
        .zip(keys.iter().zip(checks))
        .map(|(d, (key, (q, cost)))| {
            if d.allowed {
                Decision::held(d.limit, d.remaining + cost, key.reset_after(now, q))
                    .with_next_permit_after(key.next_permit_after(now, q))
            } else {
                d
            }
        })
        .collect();
    MultiDecision::new(decisions)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    #[test]
    fn fixed_window_edge_burst_is_denied() {
        // 100 per 60 s: 100 at 00:59, then 100 more at 01:01 — a fixed window would admit 200.
        let mut log = SlidingLog::default();
        for _ in 0..100 {
            assert!(log.check(59_000, 100, 60_000, 1).allowed);
        }
        let second_burst = (0..100).filter(|_| log.check(61_000, 100, 60_000, 1).allowed).count();
        assert_eq!(second_burst, 0);
        // The first burst leaves at 59 s + 60 s.
        let d = log.check(61_000, 100, 60_000, 1);
        assert_eq!(d.retry_after, Some(Duration::from_millis(58_000)));
        assert!(log.check(119_000, 100, 60_000, 1).allowed);
    }

    #[test]
    fn an_entry_exactly_one_window_old_has_left() {
        let mut log = SlidingLog::default();
        assert!(log.check(0, 1, 1_000, 1).allowed);
        assert!(!log.check(999, 1, 1_000, 1).allowed);
        assert!(log.check(1_000, 1, 1_000, 1).allowed);
    }

    #[test]
    fn retry_after_waits_for_enough_entries_to_leave() {
        let mut log = SlidingLog::default();
        for t in [0, 100, 200] {
            assert!(log.check(t, 3, 1_000, 1).allowed);
        }
        // Two permits need the two oldest gone: the one at 100 leaves at 1_100.
        let d = log.check(300, 3, 1_000, 2);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Some(Duration::from_millis(800)));
        assert_eq!(d.reset_after, Duration::from_millis(900));
        assert!(log.check(1_100, 3, 1_000, 2).allowed);
    }

    #[test]
    fn multi_limit_charges_all_or_nothing() {
        let mut keys = [Key::new(Algorithm::SlidingLog), Key::new(Algorithm::SlidingLog)];
        let per_second_and_per_minute =
            [(Quota::per_second(2).expect("valid"), 1), (Quota::per_minute(3).expect("valid"), 1)];
        for t in [0, 10] {
            assert!(check_all(&mut keys, t, &per_second_and_per_minute).allowed);
        }
        // The per-second limit denies: the per-minute one is not charged.
        let d = check_all(&mut keys, 20, &per_second_and_per_minute);
        assert_eq!((d.allowed, d.denied_by), (false, Some(0)));
        let until_first_leaves = Duration::from_millis(60_000 - 20);
        assert_eq!(
            d.decisions[1],
            Decision::held(3, 1, Duration::from_millis(60_000 - 10)).with_next_permit_after(until_first_leaves)
        );
        assert_eq!(d.retry_after(), Some(Duration::from_millis(980)));
        // A second later the third fits both; then the per-minute one denies.
        assert!(check_all(&mut keys, 1_000, &per_second_and_per_minute).allowed);
        let d = check_all(&mut keys, 2_000, &per_second_and_per_minute);
        assert_eq!(d.denied_by, Some(1));
        assert!(keys[0].reset_after(2_000, &per_second_and_per_minute[0].0).is_zero(), "per-second not charged");
    }

    fn quota(limit: u64, window_ms: u64, algorithm: Algorithm) -> Quota {
        Quota::new(limit, Duration::from_millis(window_ms)).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
    }

    #[test]
    fn fixed_window_admits_twice_the_limit_around_an_edge() {
        let q = quota(100, 60_000, Algorithm::FixedWindow);
        let mut key = Key::new(q.algorithm());
        let at_0059 = (0..100).filter(|_| key.check(59_000, &q, 1).allowed).count();
        let d = key.check(59_500, &q, 1);
        assert_eq!(d.retry_after, Some(Duration::from_millis(500)), "until the window's end");
        let at_0101 = (0..100).filter(|_| key.check(61_000, &q, 1).allowed).count();
        assert_eq!(at_0059 + at_0101, 200, "200 admitted within two seconds under a limit of 100");
    }

    #[test]
    fn gcra_admits_the_burst_then_one_per_interval() {
        // 10 per second (one per 100 ms), bursts of 3.
        let q = quota(10, 1_000, Algorithm::Gcra { burst: Some(3) });
        let mut key = Key::new(q.algorithm());
        let d: Vec<_> = (0..4).map(|_| key.check(0, &q, 1)).collect();
        assert_eq!(d.iter().map(|d| d.allowed).collect::<Vec<_>>(), [true, true, true, false]);
        assert_eq!((d[2].limit, d[2].remaining, d[2].reset_after), (3, 0, Duration::from_millis(300)));
        assert_eq!(d[3].retry_after, Some(Duration::from_millis(100)));
        assert!(!key.check(99, &q, 1).allowed);
        assert!(key.check(100, &q, 1).allowed, "exactly at retry_after");
        // Two permits need two intervals.
        assert_eq!(key.check(100, &q, 2).retry_after, Some(Duration::from_millis(200)));
    }

    #[test]
    fn sliding_window_weights_the_oldest_bucket() {
        // 10 per 1 s in 4 buckets of 250 ms: 8 admitted in bucket 0.
        let q = quota(10, 1_000, Algorithm::SlidingWindow { buckets: 4 });
        let mut key = Key::new(q.algorithm());
        assert_eq!((0..8).filter(|_| key.check(100, &q, 1).allowed).count(), 8);
        // At 1 s bucket 0 becomes the weighted one, still counted whole; 1 ms later it weighs 7.97.
        assert_eq!(key.check(900, &q, 3).retry_after, Some(Duration::from_millis(101)));
        // At 1_100 bucket 0 weighs 8 × 150/250 = 4.8 → 4: 6 fit.
        assert_eq!(key.decide(1_100, &q, 1).remaining, 5);
        let d = key.check(1_100, &q, 7);
        // 4 + 7 > 10; the estimate falls to 3 at offset r with 8 × (250 − r) / 250 < 4, r > 125.
        assert_eq!(d.retry_after, Some(Duration::from_millis(1_126 - 1_100)));
        assert!(key.check(1_126, &q, 7).allowed);
        assert_eq!(key.reset_after(1_126, &q), Duration::from_millis(2_250 - 1_126));
    }

    proptest::proptest! {
        /// The documented error bound: when the sliding window counter admits, the rolling
        /// window holds at most the limit plus the count of the partly expired bucket.
        #[test]
        fn sliding_window_overshoots_by_at_most_the_weighted_bucket(
            buckets in 1u32..=10,
            bucket_ms in 1u64..=200,
            limit in 1u64..=30,
            steps in proptest::collection::vec((0u64..=100, 1u64..=3), 1..200),
        ) {
            let window = bucket_ms * u64::from(buckets);
            let q = quota(limit, window, Algorithm::SlidingWindow { buckets });
            let mut key = Key::new(q.algorithm());
            let (mut now, mut admitted) = (0, Vec::new());
            for (gap, cost) in steps {
                now += gap;
                let cost = cost.min(limit);
                let State::Window(counts) = &key.state else { unreachable!() };
                let oldest = (now / bucket_ms).checked_sub(u64::from(buckets));
                let weighted = counts.iter().find(|&&(i, _)| Some(i) == oldest).map_or(0, |&(_, c)| c);
                if key.check(now, &q, cost).allowed {
                    admitted.extend(std::iter::repeat_n(now, cost as usize));
                    let in_window = admitted.iter().filter(|&&t| now < t + window).count() as u64;
                    proptest::prop_assert!(in_window <= limit + weighted, "{in_window} > {limit} + {weighted} at {now}");
                }
            }
        }
    }

    proptest::proptest! {
        /// `next_permit_after` is when `remaining` next grows by waiting, found by asking every
        /// ms after the decision; the GCRA's, from its whole-ms `reset_after`, at most 1 ms later.
        /// What a check answers and what the key answers standing after it agree.
        #[test]
        fn next_permit_after_is_when_remaining_next_grows(
            algorithm in proptest::prop_oneof![
                proptest::strategy::Just(Algorithm::SlidingLog),
                (1u32..=6).prop_map(|buckets| Algorithm::SlidingWindow { buckets }),
                proptest::strategy::Just(Algorithm::FixedWindow),
                (1u64..=5).prop_map(|burst| Algorithm::Gcra { burst: Some(burst) }),
            ],
            bucket_ms in 1u64..=40,
            limit in 1u64..=12,
            steps in proptest::collection::vec((0u64..=80, 1u64..=4), 1..30),
        ) {
            let buckets = match algorithm { Algorithm::SlidingWindow { buckets } => u64::from(buckets), _ => 4 };
            let q = quota(limit, bucket_ms * buckets, algorithm);
            let mut key = Key::new(q.algorithm());
            let mut now = 1_000_000;
            for (gap, cost) in steps {
                now += gap;
                let d = key.check(now, &q, cost.min(q.max_cost()));
                let standing = key.decide(now, &q, 0).remaining;
                let horizon = now + 6 * q.window_ms() + 2;
                let grows = (now + 1..=horizon).find(|&t| key.decide(t, &q, 0).remaining > standing);
                let scanned = grows.map_or(Duration::ZERO, |t| ms(t - now));
                let slack = if matches!(algorithm, Algorithm::Gcra { .. }) { ms(1) } else { Duration::ZERO };
                for (answer, what) in [(d.next_permit_after, "the decision"), (key.next_permit_after(now, &q), "the key")] {
                    proptest::prop_assert!(
                        answer >= scanned && answer <= scanned + slack,
                        "{what} at {now}: {answer:?}, remaining grows after {scanned:?}; {d:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn warm_up_starts_cold_after_idleness() {
        let q = quota(10, 1_000, Algorithm::SlidingLog).with_warm_up(Duration::from_millis(1_000), 0.2).expect("valid");
        let mut key = Key::new(q.algorithm());
        assert_eq!((0..10).filter(|_| key.check(0, &q, 1).allowed).count(), 2, "cold: a fifth");
        assert_eq!(key.decide(500, &q, 1).limit, 6, "half way: 2 + 8 / 2");
        assert_eq!((0..10).filter(|_| key.check(500, &q, 1).allowed).count(), 4);
        // Still busy (the admissions of 500 are live) and warm: all 10, 4 of them taken.
        assert_eq!((0..10).filter(|_| key.check(1_200, &q, 1).allowed).count(), 6);
        // Idle for a window: cold again.
        assert_eq!((0..10).filter(|_| key.check(2_200, &q, 1).allowed).count(), 2);
    }

    #[test]
    fn denial_records_nothing_and_cost_counts_each_permit() {
        let mut log = SlidingLog::default();
        let d = log.check(0, 5, 1_000, 4);
        assert_eq!((d.allowed, d.remaining), (true, 1));
        let d = log.check(1, 5, 1_000, 2);
        assert_eq!((d.allowed, d.remaining), (false, 1));
        assert_eq!(log.live(1, 1_000).len(), 4);
        assert_eq!(log.check(2, 5, 1_000, 1).remaining, 0);
    }
}
