//! The front door: validates input once, answers keys known to be over their limit from the
//! near-cache, asks the backend, and applies the failure policy when the backend cannot answer.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::resilience::{CircuitBreaker, Fleet, NearCache, strictest};
use crate::write_back::{Journal, WriteBack};
use crate::{
    Backend, Charged, Check, Decision, Error, FailurePolicy, KeyState, KeyTimeline, MemoryBackend, MultiDecision,
    Quota, Refunded,
};

/// The most checks one multi-limit check may hold.
pub const MAX_CHECKS: usize = 16;

/// The longest key accepted, in bytes. Keys are data: they are hashed in memory and passed to
/// Redis only as `KEYS`, never spliced into script text, so any bytes of valid UTF-8 are fine.
pub const MAX_KEY_LEN: usize = 512;

/// Decides for keys over a backend. Cheap to clone when the backend is (both built-in ones are).
///
/// ```
/// use slidegate::{Limiter, Quota};
///
/// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// let limiter = Limiter::in_memory();
/// let sms = Quota::per_minute(5)?;
/// let d = limiter.check("+15550100", &sms).await?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 4);
/// // A bulk send of 5 more does not fit; nothing is charged.
/// let d = limiter.check_cost("+15550100", &sms, 5).await?;
/// assert!(!d.allowed);
/// assert_eq!(d.remaining, 4);
/// # Ok::<(), slidegate::Error>(()) }).unwrap();
/// ```
///
/// In production, over Redis:
///
/// ```no_run
/// # #[cfg(feature = "redis")] async fn run() -> Result<(), slidegate::Error> {
/// use slidegate::{FailurePolicy, Limiter, RedisBackend};
///
/// let limiter = Limiter::new(RedisBackend::connect("redis://127.0.0.1:6379").await?)
///     .with_failure_policy(FailurePolicy::local(0.25)?) // Redis down: a quarter of each limit, locally
///     .with_near_cache(100_000); // keys over their limit are answered without a round trip
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Limiter<B = MemoryBackend> {
    backend: B,
    guard: Option<Arc<Guard>>,
    near_cache: Option<Arc<NearCache>>,
    observer: Option<FailureObserver>,
}

/// What [`Limiter::with_failure_observer`] calls.
#[derive(Clone)]
struct FailureObserver(Arc<dyn Fn(&Error) + Send + Sync>);

impl std::fmt::Debug for FailureObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FailureObserver")
    }
}

/// Failure handling: the default policy, the breaker, and the local limiter of `Local`.
#[derive(Debug)]
struct Guard {
    policy: Option<FailurePolicy>,
    breaker: CircuitBreaker,
    local: MemoryBackend,
    fleet: Fleet,
    /// What `local` admitted, to be written into the backend when it answers again: with
    /// [`Limiter::with_write_back`] only.
    journal: Option<Journal>,
}

impl Limiter<MemoryBackend> {
    /// A limiter on the embedded memory backend: nothing to install.
    pub fn in_memory() -> Self {
        Self::new(MemoryBackend::new())
    }
}

impl<B: Backend> Limiter<B> {
    /// A limiter over `backend`. Backend errors are returned as they are until a failure policy
    /// or a circuit breaker is set.
    pub fn new(backend: B) -> Self {
        Self { backend, guard: None, near_cache: None, observer: None }
    }

    /// Calls `observe` with the cause of each decision a failure policy makes instead of the
    /// backend: the backend's failure, or [`Error::CircuitOpen`] while the breaker keeps the
    /// backend from being called. The caller sees a decision ([`Decision::degraded`]); an
    /// operator needs to know why (a counter by kind, a log line). Called on the deciding
    /// task, so it must be quick.
    #[must_use]
    pub fn with_failure_observer(mut self, observe: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.observer = Some(FailureObserver(Arc::new(observe)));
        self
    }

    /// Tells the failure observer of `error` when a policy answers for it.
    fn observe(&self, policy: Option<FailurePolicy>, error: &Error) {
        if let (Some(_), Some(observer)) = (policy, &self.observer) {
            (observer.0)(error);
        }
    }

    /// Answers with `policy` — for every quota that has none of its own
    /// ([`Quota::with_failure_policy`]) — when the backend errs or misses its deadline, and
    /// behind a circuit breaker ([`crate::resilience::DEFAULT_BREAKER_FAILURES`] consecutive
    /// failures open it for [`crate::resilience::DEFAULT_BREAKER_OPEN_FOR`]) so that a dead
    /// backend costs microseconds, not a deadline, per request. Such decisions carry
    /// [`Decision::degraded`].
    #[must_use]
    pub fn with_failure_policy(self, policy: FailurePolicy) -> Self {
        let (breaker, write_back) = (self.breaker_as_set(), self.writes_back());
        self.guarded(Some(policy), breaker, write_back)
    }

    /// The circuit breaker's settings: open after `failures` consecutive failures, probe after
    /// `open_for`. Without a failure policy an open circuit answers [`Error::CircuitOpen`].
    #[must_use]
    pub fn with_circuit_breaker(self, failures: u32, open_for: Duration) -> Self {
        let (policy, write_back) = (self.guard.as_ref().and_then(|g| g.policy), self.writes_back());
        self.guarded(policy, CircuitBreaker::new(failures, open_for), write_back)
    }

    /// Keeps what a local failure policy admits while the backend is away, to be written into
    /// it by [`Limiter::write_back`], which the caller then runs in the background (see there);
    /// until it has, after an outage, decisions stay local. Without it, local admissions are
    /// forgotten when the backend returns and a window spanning an outage can hold up to twice
    /// the limit.
    #[must_use]
    pub fn with_write_back(self) -> Self {
        let (policy, breaker) = (self.guard.as_ref().and_then(|g| g.policy), self.breaker_as_set());
        self.guarded(policy, breaker, true)
    }

    /// A new breaker with the settings of the one set, or the defaults.
    fn breaker_as_set(&self) -> CircuitBreaker {
        let settings = self.guard.as_ref().map(|g| (g.breaker.failures(), g.breaker.open_for()));
        settings.map_or_else(CircuitBreaker::default, |(failures, open_for)| CircuitBreaker::new(failures, open_for))
    }

    fn writes_back(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.journal.is_some())
    }

    fn guarded(mut self, policy: Option<FailurePolicy>, breaker: CircuitBreaker, write_back: bool) -> Self {
        let journal = write_back.then(Journal::default);
        self.guard =
            Some(Arc::new(Guard { policy, breaker, local: MemoryBackend::new(), fleet: Fleet::default(), journal }));
        self
    }

    /// Remembers up to `capacity` keys the backend denied and answers them locally until their
    /// `retry_after` (see [`NearCache`]): under a flood on one key, one backend call per
    /// `retry_after` instead of one per request.
    #[must_use]
    pub fn with_near_cache(mut self, capacity: usize) -> Self {
        self.near_cache = Some(Arc::new(NearCache::new(capacity)));
        self
    }

    /// The live instances of the fleet that [`FailurePolicy::LocalAuto`] divides by, for the
    /// caller that counts them to record them; `None` until a failure policy or breaker is set.
    pub fn fleet(&self) -> Option<&Fleet> {
        self.guard.as_deref().map(|g| &g.fleet)
    }

    /// Whether the circuit breaker is open (the backend is not being called).
    pub fn circuit_open(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.breaker.is_open())
    }

    /// The near-cache, when enabled.
    pub fn near_cache(&self) -> Option<&NearCache> {
        self.near_cache.as_deref()
    }

    /// Writes into the backend what a local failure policy ([`FailurePolicy::Local`],
    /// [`FailurePolicy::LocalAuto`]) admitted while it was away, so that the window spanning an
    /// outage counts the fleet's local admissions too: a sliding log's at their own times (the
    /// window is exact again), a GCRA's at their own arrival, a counter's added to its current
    /// window; what has left its window since is not written, nor a GCRA's arrivals once its bucket
    /// drained. Each is recorded as [`Limiter::charge`] records, within
    /// [`crate::MAX_CHARGE_FACTOR`] times the limit, one backend call per key and millisecond, in
    /// admission order, at most [`crate::MAX_WRITE_BACK`] of them. Stops at the first backend
    /// failure, keeping the rest for the next call; one runs at a time (a call while another runs
    /// writes nothing).
    ///
    /// A write whose answer never came may still run: a Redis that stalls (a pause, a swap storm)
    /// or pauses writes (Redis' `FAILOVER`) runs everything it was sent once it resumes. So each
    /// call first asks whether the backend runs writes to its first entry's key
    /// ([`Backend::accepts_writes`]) and writes only once it answered: a stall sends no write that
    /// would run later, however many calls probe it meanwhile, and one that begins while a call
    /// writes repeats at most the one entry it cut (counted twice, towards fewer admissions). A
    /// write the backend ran whose replicas did not acknowledge it (`Error::ReplicasAck`) is
    /// written, and not sent again.
    ///
    /// It goes behind the circuit breaker: while the circuit is open it is the probe, and the
    /// circuit stays open — decisions stay local — until the journal is written, for the backend,
    /// which does not hold those admissions yet, would admit them again. The caller runs it in the
    /// background while [`Limiter::write_back_pending`] is non-zero: decisions never wait for it.
    pub async fn write_back(&self) -> WriteBack {
        self.write_back_until(None).await
    }

    /// As [`Limiter::write_back`], starting no entry's write after `until` (a stop's last
    /// moment): what is left stays pending, and the circuit open.
    pub async fn write_back_until(&self, until: Option<std::time::Instant>) -> WriteBack {
        let Some((guard, journal)) = self.guard.as_ref().and_then(|g| Some((g, g.journal.as_ref()?))) else {
            return WriteBack::default();
        };
        // Behind the breaker as a check is: while open, its probe is this.
        let pending = || WriteBack { pending: journal.len(), ..WriteBack::default() };
        if journal.len() == 0 || !guard.breaker.allow() {
            return pending();
        }
        let Some((entries, dropped)) = journal.take() else {
            guard.breaker.settled();
            return pending();
        };
        let mut report = WriteBack { dropped, ..WriteBack::default() };
        let (done, cut_short) = match entries.list.front() {
            Some(first) if !self.takes_writes(&first.key, &first.quota, &guard.breaker).await => (0, true),
            _ => self.write_entries(&entries, &guard.breaker, until, &mut report).await,
        };
        let mut entries = entries.list;
        report.pending = journal.give_back(entries.drain(done..));
        if !cut_short {
            // Written (what came in since goes next time): Redis decides again.
            guard.breaker.succeeded();
        }
        report
    }

    /// Whether the backend runs writes to `key` now ([`Backend::accepts_writes`]; a failure is
    /// the breaker's).
    async fn takes_writes(&self, key: &str, quota: &Quota, breaker: &CircuitBreaker) -> bool {
        match self.backend.accepts_writes(key, quota).await {
            Err(e) if e.is_backend_failure() => {
                breaker.failed();
                false
            }
            _ => true,
        }
    }

    /// Writes `entries` in order, until the first backend failure or `until`, into `report`:
    /// how many are done (written or dropped), and whether it stopped short of the end.
    async fn write_entries(
        &self,
        entries: &crate::write_back::Entries,
        breaker: &CircuitBreaker,
        until: Option<std::time::Instant>,
        report: &mut WriteBack,
    ) -> (usize, bool) {
        for (done, a) in entries.list.iter().enumerate() {
            if until.is_some_and(|t| std::time::Instant::now() >= t) {
                return (done, true);
            }
            let now = SystemClock.now_ms();
            if a.is_stale(now, entries.newest_ms(&a.key).unwrap_or(a.at_ms)) {
                report.dropped += a.cost;
                continue;
            }
            let ago = Duration::from_millis(now.saturating_sub(a.at_ms));
            match self.backend.charge_ago(&a.key, &a.quota, a.cost, ago).await {
                Ok(charged) => {
                    breaker.hold_open();
                    report.written += charged.recorded;
                    report.dropped += a.cost - charged.recorded;
                }
                Err(e) if e.is_unacknowledged_write() => {
                    // On the master, not on its replicas: written, and a failure to the breaker.
                    breaker.failed();
                    report.written += a.cost;
                    return (done + 1, true);
                }
                Err(e) if e.is_backend_failure() => {
                    breaker.failed();
                    return (done, true);
                }
                Err(_) => {
                    breaker.settled();
                    report.dropped += a.cost;
                }
            }
        }
        (entries.list.len(), false)
    }

    /// Local admissions waiting for [`Limiter::write_back`], those it is writing included
    /// (entries of one key and millisecond each).
    pub fn write_back_pending(&self) -> usize {
        self.guard.as_ref().map_or(0, |g| g.waiting())
    }

    /// Decides one permit of `quota` for `key`.
    pub async fn check(&self, key: &str, quota: &Quota) -> Result<Decision, Error> {
        self.check_cost(key, quota, 1).await
    }

    /// Decides `cost` permits of `quota` for `key` at once (a bulk send of 50 SMS costs 50).
    pub async fn check_cost(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        validate_key(key)?;
        quota.validate_cost(cost)?;
        if let Some(d) = self.near_cache.as_ref().and_then(|c| c.get(key, quota, cost)) {
            return Ok(d);
        }
        let Some(guard) = &self.guard else {
            let d = self.backend.check(key, quota, cost).await?;
            self.remember(key, quota, cost, &d);
            return Ok(d);
        };
        let policy = quota.failure_policy().or(guard.policy);
        if !guard.allow() {
            self.observe(policy, &Error::CircuitOpen);
            return guard.single(policy, key, quota, cost, Error::CircuitOpen);
        }
        match self.backend.check(key, quota, cost).await {
            Ok(d) => {
                guard.succeeded();
                self.remember(key, quota, cost, &d);
                Ok(d)
            }
            Err(e) if e.is_backend_failure() => {
                guard.breaker.failed();
                self.observe(policy, &e);
                guard.single(policy, key, quota, cost, e)
            }
            Err(e) => {
                guard.breaker.settled();
                Err(e)
            }
        }
    }

    fn remember(&self, key: &str, quota: &Quota, cost: u64, d: &Decision) {
        if let (Some(cache), false) = (&self.near_cache, d.allowed) {
            cache.remember(key, quota, cost, d);
        }
    }

    /// Decides several limits together, all or nothing, in one backend round trip: "10 per
    /// second AND 1,000 per day for the user AND 100 per minute for the IP". When any check
    /// does not fit, nothing is charged anywhere and [`MultiDecision::denied_by`] names it.
    pub async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        if checks.is_empty() || checks.len() > MAX_CHECKS {
            return Err(Error::CheckCount { count: checks.len() });
        }
        for (i, c) in checks.iter().enumerate() {
            validate_key(c.key)?;
            c.quota.validate_cost(c.cost)?;
            if checks[..i].iter().any(|earlier| earlier.key == c.key) {
                return Err(Error::DuplicateKey { key: c.key.to_owned() });
            }
        }
        let Some(guard) = &self.guard else {
            return self.backend.check_all(checks).await;
        };
        // One policy answers for the group: the strictest of its checks'.
        let policy = strictest(checks.iter().filter_map(|c| c.quota.failure_policy().or(guard.policy)));
        if !guard.allow() {
            self.observe(policy, &Error::CircuitOpen);
            return guard.group(policy, checks, Error::CircuitOpen);
        }
        match self.backend.check_all(checks).await {
            Ok(d) => {
                guard.succeeded();
                Ok(d)
            }
            Err(e) if e.is_backend_failure() => {
                guard.breaker.failed();
                self.observe(policy, &e);
                guard.group(policy, checks, e)
            }
            Err(e) => {
                guard.breaker.settled();
                Err(e)
            }
        }
    }

    /// Decides `checks` one after another, each by itself ([`Limiter::check_cost`], its own
    /// failure policy included), in order, stopping after the first denial or the first error
    /// that is not the caller's: the checks before it stay charged, those after it are not
    /// asked. A check the caller got wrong ([`crate::ErrorClass::Caller`]) is its own answer and
    /// the next is asked. The answers of the checks asked, in order.
    ///
    /// For checks that [`Limiter::check_all`] cannot decide together (keys in several Redis
    /// Cluster slots, [`Error::CrossSlot`]): not all or nothing, so a denial after an admission
    /// leaves the admission charged.
    pub async fn check_in_order(&self, checks: &[Check<'_>]) -> Vec<Result<Decision, Error>> {
        let mut answers = Vec::with_capacity(checks.len());
        for c in checks {
            let answer = self.check_cost(c.key, &c.quota, c.cost).await;
            let last = match &answer {
                Ok(d) => !d.allowed,
                Err(e) => e.class() != crate::ErrorClass::Caller,
            };
            answers.push(answer);
            if last {
                break;
            }
        }
        answers
    }

    /// Records `cost` permits of `quota` for `key` whatever the key holds: a cost known only
    /// after the work (a response's tokens, charged at its end), which an over-limit check
    /// would refuse and so not count. Never denied; [`Charged::decision`] says whether the key
    /// is now over its limit (`allowed == false`) and until when. Validated as a check is
    /// (`1 <= cost <=` [`Quota::max_cost`]); a key never holds more than
    /// [`crate::MAX_CHARGE_FACTOR`] times its limit, past which the charge is clamped
    /// ([`Charged::clamped`]). Semantics per algorithm: [`crate::spec`], "Charges and refunds".
    ///
    /// A charge that leaves the key over its limit is remembered by the near-cache as a
    /// denial. When the backend fails, the failure policy answers as for a check, with
    /// [`Decision::degraded`] set: a local policy records the charge on this instance's local
    /// limiter (`recorded` is what it recorded there), `FailOpen` and `FailClosed` record
    /// nothing (`recorded == 0`); without a policy the error is returned.
    ///
    /// ```
    /// use slidegate::{Limiter, Quota};
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let limiter = Limiter::in_memory();
    /// let tokens = Quota::per_minute(1_000)?;
    /// assert!(limiter.check_cost("user", &tokens, 600).await?.allowed); // the estimate
    /// let c = limiter.charge("user", &tokens, 700).await?; // the rest, at the stream's end
    /// assert_eq!((c.recorded, c.decision.allowed), (700, false), "1,300 of 1,000: over");
    /// let r = limiter.refund("user", &tokens, 400).await?; // an over-estimate given back
    /// assert_eq!((r.refunded, r.decision.remaining), (400, 100));
    /// # Ok::<(), slidegate::Error>(()) }).unwrap();
    /// ```
    pub async fn charge(&self, key: &str, quota: &Quota, cost: u64) -> Result<Charged, Error> {
        validate_key(key)?;
        quota.validate_cost(cost)?;
        let charged = self
            .behind_breaker(quota, self.backend.charge(key, quota, cost), |guard, policy, error| {
                guard.charged(policy, key, quota, cost, error)
            })
            .await?;
        self.remember(key, quota, 1, &charged.decision);
        Ok(charged)
    }

    /// Gives back up to `cost` of `key`'s most recent admissions under `quota` (an estimate
    /// admitted at a request's start that its end found too high): a sliding log's newest
    /// entries, a window's current count, a GCRA's bucket — never below nothing
    /// ([`Refunded::refunded`] says how many). Validated as a check is; forgets what the
    /// near-cache remembers of the key. When the backend fails, the failure policy answers as
    /// for [`Limiter::charge`] (`refunded == 0` unless a local policy gave back on its local
    /// limiter).
    pub async fn refund(&self, key: &str, quota: &Quota, cost: u64) -> Result<Refunded, Error> {
        validate_key(key)?;
        quota.validate_cost(cost)?;
        let refunded = self
            .behind_breaker(quota, self.backend.refund(key, quota, cost), |guard, policy, error| {
                guard.refunded(policy, key, quota, cost, error)
            })
            .await;
        if let Some(cache) = &self.near_cache {
            cache.forget(key);
        }
        refunded
    }

    /// `call` to the backend behind the breaker, answered by `degrade` with `quota`'s failure
    /// policy when the backend fails or the circuit is open, as a check is.
    async fn behind_breaker<T>(
        &self,
        quota: &Quota,
        call: impl Future<Output = Result<T, Error>>,
        degrade: impl FnOnce(&Guard, Option<FailurePolicy>, Error) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let Some(guard) = &self.guard else { return call.await };
        let policy = quota.failure_policy().or(guard.policy);
        if !guard.allow() {
            self.observe(policy, &Error::CircuitOpen);
            return degrade(guard, policy, Error::CircuitOpen);
        }
        match call.await {
            Ok(answer) => {
                guard.succeeded();
                Ok(answer)
            }
            Err(e) if e.is_backend_failure() => {
                guard.breaker.failed();
                self.observe(policy, &e);
                degrade(guard, policy, e)
            }
            Err(e) => {
                guard.breaker.settled();
                Err(e)
            }
        }
    }

    /// What `key` holds under `quota` now, without changing it.
    pub async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        validate_key(key)?;
        self.backend.inspect(key, quota).await
    }

    /// What `key` holds under `quota` now and, for a sliding log, the times of its newest
    /// `max_admissions` admissions in the window (at most [`MAX_TIMELINE`]), without changing
    /// anything: what a timeline of the key draws.
    pub async fn timeline(&self, key: &str, quota: &Quota, max_admissions: usize) -> Result<KeyTimeline, Error> {
        validate_key(key)?;
        self.backend.timeline(key, quota, max_admissions.min(MAX_TIMELINE)).await
    }

    /// Forgets every admission of `key`.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        validate_key(key)?;
        if let Some(cache) = &self.near_cache {
            cache.forget(key);
        }
        self.backend.reset(key).await
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl Guard {
    /// A backend call answered: the circuit closes — unless it is open and local admissions
    /// wait to be written back. Until they are, decisions stay local: Redis, which does not
    /// hold them yet, would admit them again. [`Limiter::write_back`] closes it once written.
    fn succeeded(&self) {
        if self.breaker.is_open() && self.waiting() > 0 {
            self.breaker.hold_open();
        } else {
            self.breaker.succeeded();
        }
    }

    /// Local admissions waiting to be written back (none without a journal).
    fn waiting(&self) -> usize {
        self.journal.as_ref().map_or(0, Journal::len)
    }

    /// Keeps a local admission for the write-back, when there is one.
    fn keep(&self, key: &str, quota: &Quota, cost: u64) {
        if let Some(journal) = &self.journal {
            journal.keep(key, quota, cost, SystemClock.now_ms());
        }
    }

    /// Whether a call may go to the backend now ([`CircuitBreaker`]); while the circuit is
    /// open and local admissions wait, the probe is the write-back's.
    fn allow(&self) -> bool {
        !(self.breaker.is_open() && self.waiting() > 0) && self.breaker.allow()
    }

    /// What this instance enforces alone of `quota` under a local `policy`.
    fn local_quota(&self, policy: FailurePolicy, quota: &Quota) -> Quota {
        match (policy, self.fleet.live()) {
            (FailurePolicy::Local { share_permille }, _) => quota.share(share_permille),
            (FailurePolicy::LocalAuto { .. }, Some(instances)) => quota.divided(instances),
            (FailurePolicy::LocalAuto { fallback_permille }, None) => quota.share(fallback_permille),
            (FailurePolicy::FailOpen | FailurePolicy::FailClosed, _) => *quota,
        }
    }

    /// One check's answer by `policy` when the backend could not give it (`error`).
    fn single(
        &self,
        policy: Option<FailurePolicy>,
        key: &str,
        quota: &Quota,
        cost: u64,
        error: Error,
    ) -> Result<Decision, Error> {
        let policy = policy.ok_or(error)?;
        let (limit, open_for) = (quota.limit(), self.breaker.open_for());
        let d = match policy {
            FailurePolicy::FailOpen => Decision::allowed(limit, limit - cost, Duration::ZERO),
            FailurePolicy::FailClosed => Decision::denied(limit, 0, Duration::ZERO, open_for),
            FailurePolicy::Local { .. } | FailurePolicy::LocalAuto { .. } => {
                let local = self.local_quota(policy, quota);
                if cost > local.max_cost() {
                    Decision::denied(local.limit(), local.limit(), Duration::ZERO, quota.window())
                } else {
                    let d = self.local.check_now(key, &local, cost);
                    if d.allowed {
                        self.keep(key, quota, cost);
                    }
                    d
                }
            }
        };
        Ok(d.degraded_by(policy))
    }

    /// A charge's answer by `policy` when the backend could not record it (`error`): a local
    /// policy records it locally, the others record nothing.
    fn charged(
        &self,
        policy: Option<FailurePolicy>,
        key: &str,
        quota: &Quota,
        cost: u64,
        error: Error,
    ) -> Result<Charged, Error> {
        let policy = policy.ok_or(error)?;
        let mut charged = match policy {
            FailurePolicy::Local { .. } | FailurePolicy::LocalAuto { .. } => {
                let charged = self.local.charge_now(key, &self.local_quota(policy, quota), cost);
                if charged.recorded > 0 {
                    self.keep(key, quota, charged.recorded);
                }
                charged
            }
            _ => Charged { decision: self.unknown(policy, quota), recorded: 0, clamped: false },
        };
        charged.decision = charged.decision.degraded_by(policy);
        Ok(charged)
    }

    /// A refund's answer by `policy` when the backend could not give back (`error`), as for
    /// [`Guard::charged`].
    fn refunded(
        &self,
        policy: Option<FailurePolicy>,
        key: &str,
        quota: &Quota,
        cost: u64,
        error: Error,
    ) -> Result<Refunded, Error> {
        let policy = policy.ok_or(error)?;
        let mut refunded = match policy {
            FailurePolicy::Local { .. } | FailurePolicy::LocalAuto { .. } => {
                self.local.refund_now(key, &self.local_quota(policy, quota), cost)
            }
            _ => Refunded::new(self.unknown(policy, quota), 0),
        };
        refunded.decision = refunded.decision.degraded_by(policy);
        Ok(refunded)
    }

    /// The standing `FailOpen` or `FailClosed` answers for a key the backend could not read.
    fn unknown(&self, policy: FailurePolicy, quota: &Quota) -> Decision {
        let limit = quota.limit();
        match policy {
            FailurePolicy::FailClosed => Decision::denied(limit, 0, Duration::ZERO, self.breaker.open_for()),
            _ => Decision::allowed(limit, limit, Duration::ZERO).with_next_permit_after(Duration::ZERO),
        }
    }

    /// A group's answer by `policy` when the backend could not give it (`error`).
    fn group(&self, policy: Option<FailurePolicy>, checks: &[Check<'_>], error: Error) -> Result<MultiDecision, Error> {
        let policy = policy.ok_or(error)?;
        let decisions = match policy {
            FailurePolicy::Local { .. } | FailurePolicy::LocalAuto { .. } => {
                let local: Vec<Check<'_>> =
                    checks.iter().map(|c| Check { quota: self.local_quota(policy, &c.quota), ..*c }).collect();
                if local.iter().all(|c| c.cost <= c.quota.max_cost()) {
                    let group = self.local.check_all_now(&local);
                    if group.allowed {
                        checks.iter().for_each(|c| self.keep(c.key, &c.quota, c.cost));
                    }
                    group.decisions
                } else {
                    let window = |c: &Check<'_>| c.quota.window();
                    local
                        .iter()
                        .map(|c| Decision::denied(c.quota.limit(), c.quota.limit(), Duration::ZERO, window(c)))
                        .collect()
                }
            }
            _ => {
                let one = |c: &Check<'_>| self.single(Some(policy), c.key, &c.quota, c.cost, Error::CircuitOpen);
                checks.iter().map(one).collect::<Result<Vec<_>, Error>>()?
            }
        };
        Ok(MultiDecision::new(decisions.into_iter().map(|d| d.degraded_by(policy)).collect()))
    }
}

/// The most admissions [`Limiter::timeline`] reads: a timeline's resolution, not a log's
/// length, and a bound on the reply (8 bytes or so per admission).
pub const MAX_TIMELINE: usize = 10_000;

/// Checks that `key` is a key the limiter accepts: non-empty, at most [`MAX_KEY_LEN`] bytes.
pub fn validate_key(key: &str) -> Result<(), Error> {
    match key.len() {
        0 => Err(Error::EmptyKey),
        len if len > MAX_KEY_LEN => Err(Error::KeyTooLong { len }),
        _ => Ok(()),
    }
}
