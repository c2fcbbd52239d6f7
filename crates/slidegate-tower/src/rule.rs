//! A rule: which requests it applies to, what key counts them, and the quota (per tier).

use std::sync::Arc;

use http::request::Parts;
use slidegate::Quota;

use crate::Error;
use crate::PeerIp;
use crate::key::KeyExtractor;

type TierFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// One limit of a [`crate::RateLimitLayer`]: `quota` per key, for the requests its routes match
/// (all of them by default), keyed by the client's IP unless set otherwise.
///
/// ```
/// use slidegate::Quota;
/// use slidegate_tower::{Extension, Rule};
///
/// # #[derive(Clone)] struct UserId(u64);
/// # impl std::fmt::Display for UserId {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{}", self.0) }
/// # }
/// let login = Rule::new("login", Quota::per_minute(5)?)?.route("/login");
/// let search = Rule::new("search", Quota::per_second(10)?)?
///     .route_prefix("/search")
///     .key(Extension::<UserId>::new())
///     .tier("vip", Quota::per_second(100)?)
///     .tier_by(|req| req.headers.get("x-plan").and_then(|v| v.to_str().ok()).map(str::to_owned));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Rule {
    pub(crate) name: String,
    quota: Quota,
    tiers: Vec<(String, Quota)>,
    tier_by: Option<Arc<TierFn>>,
    cost: Cost,
    pub(crate) key: Arc<dyn KeyExtractor>,
    paths: Vec<PathMatch>,
}

/// What a request costs: the same for every request, or computed from it.
#[derive(Clone)]
enum Cost {
    Fixed(u64),
    By(Arc<CostFn>),
}

#[derive(Debug, Clone)]
enum PathMatch {
    Exact(String),
    Prefix(String),
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("paths", &self.paths)
            .finish()
    }
}

impl Rule {
    /// `quota` per client IP for every request; `name` appears in the RateLimit headers, the
    /// metrics and the backend keys ([`slidegate::rule_key`]: `<name>:{<key>}`).
    pub fn new(name: impl Into<String>, quota: Quota) -> Result<Self, Error> {
        let name = name.into();
        let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
        if name.is_empty() || name.len() > 64 || !name.bytes().all(plain) {
            return Err(Error::InvalidRuleName(name));
        }
        Ok(Self {
            name,
            quota,
            tiers: Vec::new(),
            tier_by: None,
            cost: Cost::Fixed(1),
            key: Arc::new(PeerIp::new()),
            paths: Vec::new(),
        })
    }

    /// Applies to requests whose path is exactly `path` (may be given several times).
    #[must_use]
    pub fn route(mut self, path: impl Into<String>) -> Self {
        self.paths.push(PathMatch::Exact(path.into()));
        self
    }

    /// Applies to requests whose path starts with `prefix`.
    #[must_use]
    pub fn route_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.paths.push(PathMatch::Prefix(prefix.into()));
        self
    }

    /// Counts requests by `key` instead of the client IP.
    #[must_use]
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// The quota of tier `name`, for requests that [`Rule::tier_by`] puts in it.
    #[must_use]
    pub fn tier(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.tiers.push((name.into(), quota));
        self
    }

    /// Picks a request's tier (an unknown or absent tier gets the rule's quota).
    #[must_use]
    pub fn tier_by(mut self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.tier_by = Some(Arc::new(f));
        self
    }

    /// What every request costs (default 1): an expensive endpoint counts 5. Checked when the
    /// rule is added to a layer: 0, or more than any of the rule's quotas admits at once, is
    /// [`Error::InvalidCost`].
    #[must_use]
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// What a request costs, from the request: a bulk call of 50 SMS costs 50. A request
    /// whose cost is 0, or more than its quota admits at once, is refused
    /// (`400 invalid_cost`), nothing charged — a builder cannot know a closure's range, and a
    /// request that asks for nothing or for more than could ever fit is the request's error,
    /// not an admission.
    #[must_use]
    pub fn cost_by(mut self, f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Cost::By(Arc::new(f));
        self
    }

    /// Checks what can be checked before any request: every quota within its algorithm's
    /// bounds (a sliding log of a billion would refuse every request), tier names are unique,
    /// and a fixed cost fits every quota of the rule.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        for quota in std::iter::once(&self.quota).chain(self.tiers.iter().map(|(_, q)| q)) {
            quota.validate_cost(1).map_err(|source| Error::InvalidQuota { rule: self.name.clone(), source })?;
        }
        for (i, (tier, _)) in self.tiers.iter().enumerate() {
            if self.tiers[..i].iter().any(|(earlier, _)| earlier == tier) {
                return Err(Error::DuplicateTier { rule: self.name.clone(), tier: tier.clone() });
            }
        }
        if let Cost::Fixed(cost) = self.cost {
            let max = self.tiers.iter().map(|(_, q)| q.max_cost()).fold(self.quota.max_cost(), u64::min);
            if cost == 0 || cost > max {
                return Err(Error::InvalidCost { rule: self.name.clone(), cost, max });
            }
        }
        Ok(())
    }

    /// Whether the rule applies to this request.
    pub(crate) fn matches(&self, request: &Parts) -> bool {
        let path = request.uri.path();
        self.paths.is_empty()
            || self.paths.iter().any(|m| match m {
                PathMatch::Exact(p) => path == p,
                PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            })
    }

    /// The request's quota (by tier) and cost.
    pub(crate) fn quota_and_cost(&self, request: &Parts) -> (Quota, u64) {
        let tier = self.tier_by.as_ref().and_then(|f| f(request));
        let quota =
            tier.and_then(|t| self.tiers.iter().find(|(name, _)| *name == t).map(|(_, q)| *q)).unwrap_or(self.quota);
        let cost = match &self.cost {
            Cost::Fixed(cost) => *cost,
            Cost::By(f) => f(request),
        };
        (quota, cost)
    }
}
