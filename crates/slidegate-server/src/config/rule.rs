//! Named rules (`[[rules]]`): a default quota and quotas per tier, validated field by field.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;
use slidegate::Quota;
use toml::Spanned;

use super::value::{LocalShare, PolicyFields, check_name, failure_policy};
use super::{AlgorithmField, AlgorithmSpec, Invalid, parse_duration};
use super::{Caller, CallerError};

/// The most rules a rules file (or a pushed document) may have. Each rule costs an instance
/// about 40 KB whatever its traffic — its dashboard series ([`crate::stats::series`]) and
/// its metrics — and a reload that renames every rule holds both sets for a moment: this many
/// stay within the 256 MiB SECURITY.md promises, where the 24,000 minimal rules that fit the
/// document bound cost a gigabyte.
pub const MAX_RULES: usize = 5_000;

/// One named rule: a default quota and quotas per tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule's name, as requests and Redis keys spell it.
    pub name: String,
    /// The quota of a request that names no tier.
    pub quota: Quota,
    /// Quotas of named tiers (`vip`), each falling back to the rule's window.
    pub tiers: BTreeMap<String, Quota>,
    /// What a forward-auth request is counted as (`key`), and which ones the rule applies to
    /// (`methods`, `path_prefix`).
    pub caller: Caller,
}

impl Rule {
    /// The quota for `tier`, `None` when the rule has no such tier.
    pub fn quota_for(&self, tier: Option<&str>) -> Option<Quota> {
        match tier {
            None => Some(self.quota),
            Some(t) => self.tiers.get(t).copied(),
        }
    }
}

/// The active rules by name.
#[derive(Debug, Clone, Default)]
pub struct Rules(BTreeMap<String, Arc<Rule>>);

impl Rules {
    /// The rule called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Rule>> {
        self.0.get(name)
    }

    /// All rules, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.0.values()
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The file's `[[rules]]`, validated in order.
    pub(super) fn from_specs(specs: Vec<RuleSpec>) -> Result<Self, Invalid> {
        if let Some(over) = specs.get(MAX_RULES) {
            let message = format!("{} rules, over the {MAX_RULES} a rules file may have", specs.len());
            return Err(Invalid::new(format!("rules[{MAX_RULES}]"), over.name.span(), message));
        }
        let mut rules = BTreeMap::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let rule = spec.validate(&format!("rules[{i}]"), &rules)?;
            rules.insert(rule.name.clone(), Arc::new(rule));
        }
        Ok(Self(rules))
    }
}

/// One `[[rules]]` entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleSpec {
    name: Spanned<String>,
    limit: Spanned<u64>,
    window: Spanned<String>,
    algorithm: Option<Spanned<String>>,
    buckets: Option<Spanned<u32>>,
    burst: Option<Spanned<u64>>,
    warm_up: Option<Spanned<String>>,
    cold_fraction: Option<Spanned<f64>>,
    failure_policy: Option<Spanned<String>>,
    local_share: Option<Spanned<LocalShare>>,
    local_share_fallback: Option<Spanned<f64>>,
    #[serde(default)]
    tiers: BTreeMap<Spanned<String>, TierSpec>,
    key: Option<Spanned<Vec<String>>>,
    methods: Option<Spanned<Vec<String>>>,
    path_prefix: Option<Spanned<String>>,
}

/// One tier of a rule as written: a limit and a window over the rule's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TierSpec {
    limit: Option<Spanned<u64>>,
    window: Option<Spanned<String>>,
}

impl RuleSpec {
    /// The rule `table` (`rules[i]`) describes, unless `rules` already has its name.
    fn validate(self, table: &str, rules: &BTreeMap<String, Arc<Rule>>) -> Result<Rule, Invalid> {
        let field = |f: &str| format!("{table}.{f}");
        let name = &self.name;
        check_name(name.get_ref()).map_err(|m| Invalid::new(field("name"), name.span(), m))?;
        if rules.contains_key(name.get_ref()) {
            let message = format!("duplicate rule name {:?}", name.get_ref());
            return Err(Invalid::new(field("name"), name.span(), message));
        }
        let window =
            parse_duration(self.window.get_ref()).map_err(|m| Invalid::new(field("window"), self.window.span(), m))?;
        let quota = Quota::new(*self.limit.get_ref(), window).map_err(|e| match e {
            slidegate::Error::InvalidLimit { .. } => Invalid::new(field("limit"), self.limit.span(), e.to_string()),
            _ => Invalid::new(field("window"), self.window.span(), e.to_string()),
        })?;
        let algorithm = self.algorithm_spec();
        let mut quota = algorithm
            .apply(quota)
            .map_err(|e| Invalid::new(field(e.field.as_str()), self.span_of(e.field), e.error.to_string()))?;
        let policy = failure_policy(
            PolicyFields {
                policy: self.failure_policy.as_ref(),
                share: self.local_share.as_ref(),
                fallback: self.local_share_fallback.as_ref(),
            },
            table,
        )?;
        let mut tiers = BTreeMap::new();
        for (name, tier) in &self.tiers {
            let tier = tier.validate(name, &field("tiers"), &quota, &algorithm)?;
            tiers.insert(name.get_ref().clone(), policy.map_or(tier, |p| tier.with_failure_policy(p)));
        }
        if let Some(p) = policy {
            quota = quota.with_failure_policy(p);
        }
        let caller = self.caller().map_err(|(f, m)| Invalid::new(field(f), self.span_of_caller(f), m))?;
        Ok(Rule { name: self.name.into_inner(), quota, tiers, caller })
    }

    fn caller(&self) -> Result<Caller, CallerError> {
        fn list(l: &Option<Spanned<Vec<String>>>) -> Option<&[String]> {
            l.as_ref().map(|l| l.get_ref().as_slice())
        }
        let prefix = self.path_prefix.as_ref().map(|p| p.get_ref().as_str());
        Caller::parse(list(&self.key), list(&self.methods), prefix)
    }

    /// Where the caller's `field` is written.
    fn span_of_caller(&self, field: &str) -> Range<usize> {
        let span = match field {
            "key" => self.key.as_ref().map(Spanned::span),
            "methods" => self.methods.as_ref().map(Spanned::span),
            _ => self.path_prefix.as_ref().map(Spanned::span),
        };
        span.unwrap_or_else(|| self.name.span())
    }

    fn algorithm_spec(&self) -> AlgorithmSpec {
        AlgorithmSpec {
            algorithm: self.algorithm.as_ref().map(|a| a.get_ref().clone()),
            buckets: self.buckets.as_ref().map(|b| *b.get_ref()),
            burst: self.burst.as_ref().map(|b| *b.get_ref()),
            warm_up: self.warm_up.as_ref().map(|w| w.get_ref().clone()),
            cold_fraction: self.cold_fraction.as_ref().map(|c| *c.get_ref()),
        }
    }

    /// Where `field` is written; the algorithm (or the rule's name, when it names none) for
    /// the algorithm itself.
    fn span_of(&self, field: AlgorithmField) -> Range<usize> {
        let parameter = match field {
            AlgorithmField::Buckets => self.buckets.as_ref().map(Spanned::span),
            AlgorithmField::Burst => self.burst.as_ref().map(Spanned::span),
            AlgorithmField::WarmUp => self.warm_up.as_ref().map(Spanned::span),
            AlgorithmField::ColdFraction => self.cold_fraction.as_ref().map(Spanned::span),
            AlgorithmField::Algorithm => None,
        };
        parameter.unwrap_or_else(|| self.algorithm.as_ref().map_or(self.name.span(), Spanned::span))
    }
}

impl TierSpec {
    /// The quota of the tier `name` under `table` (`rules[i].tiers`): the rule's `quota` with
    /// this tier's limit and window, counted by the rule's `algorithm`.
    fn validate(
        &self,
        name: &Spanned<String>,
        table: &str,
        quota: &Quota,
        algorithm: &AlgorithmSpec,
    ) -> Result<Quota, Invalid> {
        check_name(name.get_ref()).map_err(|m| Invalid::new(table, name.span(), m))?;
        let field = |f: &str| format!("{table}.{}.{f}", name.get_ref());
        let limit = self.limit.as_ref().map_or(quota.limit(), |l| *l.get_ref());
        let window = match &self.window {
            Some(w) => parse_duration(w.get_ref()).map_err(|m| Invalid::new(field("window"), w.span(), m))?,
            None => quota.window(),
        };
        let span = self.limit.as_ref().map_or(name.span(), Spanned::span);
        Quota::new(limit, window)
            .and_then(|tier| algorithm.apply(tier).map_err(|e| e.error))
            .map_err(|e| Invalid::new(field("limit"), span, e.to_string()))
    }
}
