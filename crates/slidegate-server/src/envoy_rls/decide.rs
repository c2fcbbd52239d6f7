//! Deciding a request's descriptors: all or nothing for the enforced ones (an over-limit request
//! consumes nothing anywhere), each on its own in shadow mode, read only for `hits_addend: 0`,
//! charged whatever they hold under `charge_over_limit`; quota-mode descriptors that do not fit
//! set aside while another quota still has room.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slidegate::{Check, Decision, Error, ErrorClass};
use tonic::Status;

use super::service::EnvoyRateLimit;
use crate::envoy::bounds::Invalid;
use crate::envoy::config::Node;
use crate::envoy::limit::Limit;
use crate::envoy::stats::Counters;
use crate::overrides::Overrides;

/// One decidable descriptor of a request, as matched against the configuration.
pub(super) struct Item<'a> {
    /// Its `(key, value)` entries.
    pub entries: Vec<(&'a str, &'a str)>,
    /// The backend key ([`crate::envoy::descriptor_key`]).
    pub key: String,
    /// Its hits (`hits_addend`); 0 is a check that counts nothing.
    pub hits: u64,
    /// The limit that applies, if any.
    pub applied: Option<Applied<'a>>,
}

/// The limit a descriptor is decided under.
pub(super) struct Applied<'a> {
    /// The configured limit, or the one the request brought (`limit`).
    pub limit: Cow<'a, Limit>,
    /// The configured descriptor, for a configured limit.
    pub node: Option<&'a Node>,
    /// Where it is counted (not for an unlimited one, which upstream does not count): a
    /// configured descriptor's own counters, borrowed.
    pub counters: Option<Cow<'a, Counters>>,
    /// Its name for the IETF headers: the limit's `name`, or its stats key.
    pub label: Cow<'a, str>,
    /// Decided and counted, answered OK.
    pub shadow: bool,
    /// Over only when every quota-mode descriptor of the request is.
    pub quota: bool,
    /// Hits recorded even past the limit (`charge_over_limit`).
    pub charge: bool,
}

/// A descriptor of a request: decidable, or refused (then not decided, and answered `UNKNOWN`).
pub(super) type Slot<'a> = Result<Item<'a>, Invalid>;

impl Item<'_> {
    pub(super) fn limit(&self) -> Option<&Limit> {
        self.applied.as_ref().map(|a| a.limit.as_ref())
    }

    pub(super) fn shadow(&self) -> bool {
        self.applied.as_ref().is_some_and(|a| a.shadow)
    }

    fn charges(&self) -> bool {
        self.applied.as_ref().is_some_and(|a| a.charge)
    }
}

/// How one descriptor came out.
pub(super) enum Outcome {
    /// Refused: not decided.
    Invalid(Invalid),
    /// No limit applies (none configured, or replaced).
    NoLimit,
    /// `unlimited: true`.
    Unlimited,
    /// Over before asking the backend: `requests_per_unit: 0`, or more hits than could ever fit.
    Refused,
    /// The backend's decision, and the time until the descriptor's `remaining` next grows.
    Decided(Decision, Duration),
}

impl Outcome {
    /// A denial's `retry_after` (for one hit, the same instant), or when `remaining` next grows:
    /// the decision carries it, so no second read of the backend is needed.
    fn decided(d: Decision) -> Self {
        Self::Decided(d, d.retry_after.unwrap_or(d.next_permit_after))
    }

    /// Over its limit: refused, or denied (not merely held back by another descriptor).
    pub(super) fn is_over(&self) -> bool {
        match self {
            Self::Refused => true,
            Self::Decided(d, _) => !d.allowed && d.retry_after.is_some(),
            _ => false,
        }
    }
}

/// Whether every quota-mode descriptor of the request is over (and there is one); `outcomes`
/// are the slots' so far (`None`: not decided yet).
pub(super) fn quotas_all_over<'o>(
    slots: &[Slot<'_>],
    outcomes: impl IntoIterator<Item = Option<&'o Outcome>>,
    global: bool,
) -> bool {
    let mut quotas = slots.iter().zip(outcomes).filter_map(|(slot, outcome)| {
        let item = slot.as_ref().ok()?;
        let quota = item.applied.as_ref().map_or(global, |a| a.quota);
        (quota && !item.limit().is_some_and(|l| l.unlimited)).then_some(outcome)
    });
    let mut any = false;
    let all = quotas.all(|o| {
        any = true;
        o.is_some_and(Outcome::is_over)
    });
    any && all
}

impl EnvoyRateLimit {
    /// Decides the request's decidable descriptors.
    ///
    /// Enforced ones are decided together, all or nothing; a quota-mode one that does not fit
    /// is set aside and the rest decided again, as long as another quota-mode descriptor has
    /// room (each pass charges nothing unless it admits, and sets at least one aside, so there
    /// are at most [`super::MAX_DESCRIPTORS`] passes). Shadow ones are decided each on its own,
    /// so that a shadow limit can never hold back an enforced one. Checks (`hits_addend: 0`)
    /// read without charging. Descriptors under `charge_over_limit` are charged first, each on
    /// its own and whatever the others do (Envoy's stream-end calls report hits already spent);
    /// one over its limit after its charge holds back the enforced ones. Refused descriptors are
    /// not decided and hold back nothing.
    pub(super) async fn decide(&self, slots: &[Slot<'_>], global_quota: bool) -> Result<Vec<Outcome>, Status> {
        let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(slots.len());
        let mut members: Vec<(usize, Check<'_>)> = Vec::new();
        // An enforced descriptor is over before the backend is asked: nothing may be charged.
        let mut doomed = false;
        for slot in slots {
            let (shadow, quota) =
                slot.as_ref().map_or((false, false), |i| (i.shadow(), i.applied.as_ref().is_some_and(|a| a.quota)));
            let outcome = match (check_of(slot, &self.app.overrides), slot) {
                (Err(outcome), _) => outcome,
                (Ok(check), Ok(item)) if item.hits == 0 => self.standing(&check).await?,
                (Ok(check), Ok(item)) if item.charges() => self.charge(&check).await?,
                (Ok(check), _) if shadow => self.one(&check).await?,
                (Ok(check), _) => {
                    members.push((outcomes.len(), check));
                    outcomes.push(None);
                    continue;
                }
            };
            doomed |= outcome.is_over() && !shadow && !quota;
            outcomes.push(Some(outcome));
        }
        // Every quota is over already: so is the request, whatever the rest does.
        doomed |= quotas_all_over(slots, outcomes.iter().map(Option::as_ref), global_quota);
        if doomed {
            // Report the others' standing, read only.
            for (i, c) in &members {
                outcomes[*i] = Some(self.standing(c).await?);
            }
        }
        while !doomed && !members.is_empty() {
            let checks: Vec<Check<'_>> = members.iter().map(|(_, c)| *c).collect();
            let decided = self.enforce(&checks).await?;
            let mut set_aside = Vec::new();
            let mut over_rate = false;
            for ((i, _), outcome) in members.iter().zip(decided) {
                let quota = slots[*i].as_ref().is_ok_and(|item| item.applied.as_ref().is_some_and(|a| a.quota));
                if outcome.is_over() {
                    if quota { set_aside.push(*i) } else { over_rate = true }
                }
                outcomes[*i] = Some(outcome);
            }
            if over_rate
                || set_aside.is_empty()
                || quotas_all_over(slots, outcomes.iter().map(Option::as_ref), global_quota)
            {
                break;
            }
            members.retain(|(i, _)| !set_aside.contains(i));
        }
        Ok(outcomes.into_iter().map(|o| o.unwrap_or(Outcome::NoLimit)).collect())
    }

    /// Decides the enforced checks, all or nothing when the backend can.
    async fn enforce(&self, checks: &[Check<'_>]) -> Result<Vec<Outcome>, Status> {
        let limiter = &self.app.limiter;
        match checks {
            [] => Ok(Vec::new()),
            // One enforced descriptor: the one-key path, which the near-cache can answer.
            [one] => Ok(vec![self.one(one).await?]),
            _ => match self.app.timed(limiter.check_all(checks)).await {
                Ok(group) => Ok(group.decisions.into_iter().map(Outcome::decided).collect()),
                Err(e) if e.is_backend_failure() => Err(backend_status(&e)),
                // Not one check (keys in several Redis Cluster slots, which no script can see
                // together; sliding-log hits summing past what one call records): one by one,
                // in request order, stopping at the first over limit — the descriptors before
                // it are charged, those after it only read, for their standing.
                Err(_) => {
                    let mut outcomes = Vec::with_capacity(checks.len());
                    for answer in self.app.timed(limiter.check_in_order(checks)).await {
                        outcomes.push(answer.map(Outcome::decided).or_else(|e| own_problem(&e))?);
                    }
                    for c in &checks[outcomes.len()..] {
                        outcomes.push(self.standing(c).await?);
                    }
                    Ok(outcomes)
                }
            },
        }
    }

    /// Decides one check.
    async fn one(&self, c: &Check<'_>) -> Result<Outcome, Status> {
        let decided = self.app.timed(self.app.limiter.check_cost(c.key, &c.quota, c.cost)).await;
        decided.map(Outcome::decided).or_else(|e| own_problem(&e))
    }

    /// Records a check's cost whatever its key holds: over its limit after it, the outcome is
    /// over.
    async fn charge(&self, c: &Check<'_>) -> Result<Outcome, Status> {
        let charged = self.app.timed(self.app.limiter.charge(c.key, &c.quota, c.cost)).await;
        charged.map(|charged| Outcome::decided(charged.decision)).or_else(|e| own_problem(&e))
    }

    /// Where a check stands, read only, charging nothing: held when it would fit, denied (until
    /// the window empties, at the latest) when it would not.
    async fn standing(&self, c: &Check<'_>) -> Result<Outcome, Status> {
        let state = match self.app.limiter.inspect(c.key, &c.quota).await {
            Ok(state) => state,
            Err(e) => return own_problem(&e),
        };
        let (limit, reset) = (c.quota.limit(), state.reset_after);
        let remaining = limit.saturating_sub(state.count);
        let decision = if c.cost <= remaining {
            Decision::held(limit, remaining, reset)
        } else {
            Decision::denied(limit, remaining, reset, reset)
        };
        Ok(Outcome::decided(match state.oldest_ms {
            Some(oldest) => decision.with_next_permit_after(leaves_after(oldest, c.quota.window_ms())),
            None => decision,
        }))
    }
}

/// How long until a sliding log's admission made at `oldest_ms` (on the wall clock, as inspected)
/// leaves its window of `window_ms`.
fn leaves_after(oldest_ms: u64, window_ms: u64) -> Duration {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.as_millis());
    let leaves = u128::from(oldest_ms) + u128::from(window_ms);
    let ms = u64::try_from(leaves.saturating_sub(now_ms)).unwrap_or(u64::MAX);
    Duration::from_millis(ms.min(window_ms))
}

/// What a descriptor asks the backend (a check of one hit for `hits_addend: 0`; under its
/// override, if it has one), or the outcome it has without asking: over its limit when its hits
/// could never fit — over, not refused, since Envoy lets through a request whose descriptor is
/// not decided — unless they are charged whatever they hold (the library bounds that charge).
fn check_of<'s>(slot: &'s Slot<'_>, overrides: &Overrides) -> Result<Check<'s>, Outcome> {
    let item = slot.as_ref().map_err(|reason| Outcome::Invalid(*reason))?;
    let Some(limit) = item.limit() else { return Err(Outcome::NoLimit) };
    if limit.unlimited {
        return Err(Outcome::Unlimited);
    }
    match limit.quota.map(|q| overrides.quota(&item.key, q)) {
        Some(q) if item.hits <= q.max_cost() || item.charges() => {
            Ok(Check::new(&item.key, q).with_cost(item.hits.max(1)))
        }
        _ => Err(Outcome::Refused),
    }
}

/// A limiter error for one descriptor. A backend failure — which the failure policy, when one
/// is set, has already answered — fails the request (`UNAVAILABLE`), and so does a backend that
/// answered with an error (`INTERNAL`: a failure policy must not hide it, nor may a pass);
/// anything else is the caller's mistake in that descriptor alone, which is then not decided.
fn own_problem(e: &Error) -> Result<Outcome, Status> {
    match e.class() {
        ErrorClass::Caller => Ok(Outcome::Invalid(Invalid::Rejected)),
        _ => Err(backend_status(e)),
    }
}

/// The status of a backend's error: its code, a generic message and the request's id; the
/// backend's own text goes to the log under that id ([`crate::request_id`]), never to Envoy.
pub(super) fn backend_status(e: &Error) -> Status {
    let request_id = crate::request_id::current();
    tracing::warn!(request_id, "the backend failed: {}", crate::redact::redact(&e.to_string()));
    let (code, what) = match e.class() {
        ErrorClass::BackendFailure => (tonic::Code::Unavailable, "the backend cannot decide now"),
        _ => (tonic::Code::Internal, "the backend failed to decide this request"),
    };
    Status::new(code, format!("{what}; the server log has the detail under request id {request_id}"))
}
