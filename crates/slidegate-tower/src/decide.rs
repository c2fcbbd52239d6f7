//! One request's decision: the keys and costs of the rules that apply, held to the limiter's
//! bounds before anything is sent, then decided together in one round trip — or one by one
//! when no single script can see them all.

use std::time::{Duration, Instant};

use http::HeaderMap;
use http::request::Parts;
use slidegate::{Backend, Check, Decision, MAX_CHECKS, Quota, RuleKey, headers};

use crate::key::extract_part;
use crate::layer::Shared;
use crate::metrics::{BACKEND_ERRORS, DEGRADED, REJECTIONS};
use crate::{Rejection, rate_limit_headers};

/// What the layer does with one request.
pub(crate) enum Outcome {
    /// Call the service; add the RateLimit headers (none when no rule applied).
    Pass(Option<HeaderMap>),
    /// Answer 429 (or gRPC `RESOURCE_EXHAUSTED`) with these headers: a retry succeeds after
    /// `retry_after`.
    Deny { headers: HeaderMap, retry_after: Duration },
    /// Answer the rejection: the request cannot be counted.
    Reject(Rejection),
}

/// A rule that applies to the request, with the request's key, quota and cost.
struct Applied {
    rule: usize,
    key: String,
    quota: Quota,
    cost: u64,
}

impl<B: Backend> Shared<B> {
    /// Decides `request` against every rule that applies to it.
    pub(crate) async fn decide(&self, request: &Parts) -> Outcome {
        let applied = match self.applied(request) {
            Ok(applied) if applied.is_empty() => return Outcome::Pass(None),
            Ok(applied) => applied,
            Err((rule, rejection)) => return self.reject(rule, rejection),
        };
        let started = Instant::now();
        let decided = self.check(&applied).await;
        self.latency.record(started.elapsed().as_secs_f64());
        match decided {
            Ok(decisions) => self.outcome(&applied, &decisions),
            Err(e) if e.is_backend_failure() => {
                let kind = if matches!(e, slidegate::Error::Timeout(_)) { "timeout" } else { "error" };
                metrics::counter!(BACKEND_ERRORS, "kind" => kind).increment(1);
                Outcome::Pass(None)
            }
            // Keys and costs were checked above and slots are handled in `check`: an error
            // left here is no caller's and no backend's, and must not let the request through.
            // Its text (a Redis reply) is the operator's: in the log, under the request's id.
            Err(e) => {
                let id = request.headers.get(headers::REQUEST_ID).and_then(|v| headers::request_id(v.as_bytes()));
                let rule = self.rules[applied[0].rule].name.as_str();
                tracing::warn!(request_id = id.unwrap_or("-"), rule, "slidegate: the backend failed to decide: {e}");
                self.reject(applied[0].rule, Rejection::Undecidable)
            }
        }
    }

    /// The rules that apply, with their keys ([`slidegate::rule_key`], as the slidegate service
    /// keys them: one key's rules share a Redis Cluster slot) and costs; the first rule whose
    /// key or cost cannot be counted, and why.
    fn applied(&self, request: &Parts) -> Result<Vec<Applied>, (usize, Rejection)> {
        let mut applied = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.matches(request) {
                continue;
            }
            // Room for the usual key (an IPv6 address, a user id) without growing.
            let mut key = RuleKey::new(&rule.name, 45);
            if !extract_part(&*rule.key, request, key.key_mut()).map_err(|r| (i, r))? {
                continue;
            }
            let key = key.finish();
            if key.len() > slidegate::MAX_KEY_LEN {
                return Err((i, rule.key.too_long()));
            }
            let (quota, cost) = rule.quota_and_cost(request);
            if quota.validate_cost(cost).is_err() {
                return Err((i, Rejection::InvalidCost { cost, max: quota.max_cost() }));
            }
            applied.push(Applied { rule: i, key, quota, cost });
        }
        Ok(applied)
    }

    /// The decisions: all together when one script can see every key; otherwise (keys in
    /// several Redis Cluster slots, more than [`MAX_CHECKS`] rules) one by one
    /// ([`slidegate::Limiter::check_in_order`]): in rule order, stopping at the first denial —
    /// the rules before it stay charged, those after it are not asked (nor charged) — or at
    /// the first error, which is the answer.
    async fn check(&self, applied: &[Applied]) -> Result<Vec<Decision>, slidegate::Error> {
        if let [one] = applied {
            // The one-key path, which the near-cache can answer.
            return self.limiter.check_cost(&one.key, &one.quota, one.cost).await.map(|d| vec![d]);
        }
        let checks: Vec<Check<'_>> = applied.iter().map(|a| Check::new(&a.key, a.quota).with_cost(a.cost)).collect();
        if applied.len() <= MAX_CHECKS {
            match self.limiter.check_all(&checks).await {
                Err(slidegate::Error::CrossSlot { .. }) => {}
                decided => return decided.map(|group| group.decisions),
            }
        }
        self.limiter.check_in_order(&checks).await.into_iter().collect()
    }

    /// The answer from the decisions (as many as the rules that were asked, in order): counted
    /// per rule, with RateLimit headers for each decided rule.
    fn outcome(&self, applied: &[Applied], decisions: &[Decision]) -> Outcome {
        let allowed = decisions.iter().all(|d| d.allowed);
        for (a, d) in applied.iter().zip(decisions) {
            let c = &self.counters[a.rule];
            match (d.allowed || allowed, self.shadow) {
                (true, _) => c.allowed.increment(1),
                (false, false) => c.denied.increment(1),
                (false, true) => c.shadow_denied.increment(1),
            }
            if let Some(policy) = d.degraded {
                // Rare (the backend is failing): a label lookup here is fine.
                let rule = self.rules[a.rule].name.clone();
                metrics::counter!(DEGRADED, "rule" => rule, "policy" => policy.as_str()).increment(1);
            }
        }
        let retry = if allowed { None } else { decisions.iter().filter_map(|d| d.retry_after).max() };
        let items: Vec<(&str, &Quota, &Decision)> =
            applied.iter().zip(decisions).map(|(a, d)| (self.rules[a.rule].name.as_str(), &a.quota, d)).collect();
        let headers = rate_limit_headers(&items, retry);
        if allowed || self.shadow {
            Outcome::Pass(Some(headers))
        } else {
            Outcome::Deny { headers, retry_after: retry.unwrap_or_default() }
        }
    }

    /// Counts the rejection (by rule and code) and answers it — outside shadow mode.
    fn reject(&self, rule: usize, rejection: Rejection) -> Outcome {
        let name = self.rules[rule].name.clone();
        metrics::counter!(REJECTIONS, "rule" => name, "code" => rejection.code()).increment(1);
        if self.shadow { Outcome::Pass(None) } else { Outcome::Reject(rejection) }
    }
}
