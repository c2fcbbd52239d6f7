//! envoyproxy/ratelimit's configuration files, loaded as it loads them: a `domain` and a tree of
//! `descriptors` (`key`, optional `value`, `rate_limit`, nested `descriptors`), with every field
//! its loader takes (`unlimited`, `name`, `replaces`, `shadow_mode`, `quota_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata`) and every check it makes;
//! wildcard values with a `*` anywhere. One extension: `rate_limit.algorithm` (default
//! `sliding_log`, exact), which envoyproxy's own service would refuse.
//!
//! Reading a file is [`super::spec`]; here the tree is built, checked, merged and searched.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use envoy_types::pb::google::protobuf::Struct;
use slidegate::{Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, Quota};

use super::spec::{self, DescriptorSpec, RateLimitSpec};
use super::stats::{Counters, Series};
use super::wildcard::Pattern;

/// A configuration directory that cannot be used, with the file and why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct EnvoyConfigError {
    /// The file (or directory).
    pub path: String,
    /// What is wrong: for a descriptor, `descriptor '<domain>.<key>_<value>…': <reason>`.
    pub message: String,
}

/// A time unit of envoyproxy/ratelimit, with the window it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 1 h.
    Hour,
    /// 24 h.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts it.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit named `s` in any case, as the protobuf enum names it (`UNKNOWN` is none).
    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Self::Second,
            "MINUTE" => Self::Minute,
            "HOUR" => Self::Hour,
            "DAY" => Self::Day,
            "WEEK" => Self::Week,
            "MONTH" => Self::Month,
            "YEAR" => Self::Year,
            _ => return None,
        })
    }

    /// The window.
    pub fn window(self) -> Duration {
        Duration::from_secs(match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        })
    }
}

/// A descriptor's limit.
#[derive(Debug, Clone)]
pub struct Limit {
    /// `requests_per_unit` per `unit`; `None` when unlimited or `requests_per_unit` is 0
    /// (everything over).
    pub quota: Option<Quota>,
    /// As configured.
    pub requests_per_unit: u64,
    /// As configured.
    pub unit: Unit,
    /// Never limited.
    pub unlimited: bool,
    /// The limit's name, for `replaces`.
    pub name: Option<String>,
    /// Names of limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
}

impl Limit {
    /// `requests_per_unit` per `unit`, counted by `algorithm` or, when none is named, by the
    /// sliding log up to [`MAX_LOG_LIMIT`] and the sliding window counter above it (capped at
    /// [`MAX_LIMIT`]). Also a warning when the limit is not counted as written.
    pub fn counted(requests_per_unit: u64, unit: Unit, algorithm: Option<&str>) -> Result<(Self, Option<String>), String> {
        let mut warning = None;
        let quota = match (requests_per_unit, algorithm) {
            (0, _) => None,
            (n, Some(name)) => {
                let algorithm: Algorithm = name.parse().map_err(|e| format!("{e}"))?;
                Some(Quota::new(n, unit.window()).and_then(|q| q.with_algorithm(algorithm)).map_err(|e| e.to_string())?)
            }
            (n, None) => {
                let algorithm = if n <= MAX_LOG_LIMIT { Algorithm::SlidingLog } else { "sliding_window".parse().map_err(|e| format!("{e}"))? };
                if n > MAX_LOG_LIMIT {
                    warning = Some(format!(
                        "requests_per_unit {n} is above the sliding log's bound ({MAX_LOG_LIMIT}): counted with the \
                         sliding window counter{} (name an `algorithm` to choose)",
                        if n > MAX_LIMIT { format!(", capped at {MAX_LIMIT}") } else { String::new() }
                    ));
                }
                Some(Quota::new(n.min(MAX_LIMIT), unit.window()).and_then(|q| q.with_algorithm(algorithm)).map_err(|e| e.to_string())?)
            }
        };
        let limit = Self { quota, requests_per_unit, unit, unlimited: false, name: None, replaces: Vec::new() };
        Ok((limit, warning))
    }
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Node {
    /// The limit of a descriptor that ends here.
    pub limit: Option<Limit>,
    /// Decide and count, but answer OK.
    pub shadow_mode: bool,
    /// Over this limit, the request is over only when every quota-mode descriptor of it is.
    pub quota_mode: bool,
    /// Stats by the request's own values.
    pub detailed_metric: bool,
    /// Stats with the request's value at this level (`key_<value>` for a bare key, the value
    /// for a wildcard).
    value_to_metric: bool,
    /// All values matching this wildcard share one counter.
    share_threshold: bool,
    /// Answered in the response's dynamic metadata when this limit passes.
    pub metadata: Option<Struct>,
    /// The configured path (`<domain>.<key>_<value>.<key>…`), upstream's stats key.
    pub stat_key: String,
    /// Whether the stats key is built from the request (`detailed_metric`, or
    /// `value_to_metric` here or above).
    dynamic_stats: bool,
    /// Its counters, registered at its first hit.
    pub counters: OnceLock<Counters>,
    /// Its counters by request-built stats keys, bounded.
    pub dynamic: Series,
    children: Level,
}

/// One level of the tree. Entries are matched as `(key, value)` pairs, never as one
/// `key_value` string: a value holding `_` cannot reach another key's node.
#[derive(Debug, Default)]
struct Level {
    /// `key` → `value` → node, wildcard values (by their text) included.
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, value)` of each wildcard value, in file order, with its pattern.
    wildcards: Vec<(String, String, Pattern)>,
    /// `key` (no value: any value, each counted apart) → node.
    any: HashMap<String, Node>,
    /// Upstream's `key` or `key_value` of each node, which it refuses to see twice.
    composite: HashSet<String>,
}

impl Level {
    /// The node a request entry reaches, and how: its value, a wildcard (the pattern's text),
    /// or the bare key.
    fn get(&self, key: &str, value: &str) -> Option<(&Node, Reached<'_>)> {
        let values = self.exact.get(key);
        if let Some(node) = values.and_then(|v| v.get(value)) {
            return Some((node, Reached::Value));
        }
        let wildcard = self.wildcards.iter().find(|(k, _, p)| k == key && p.matches(value));
        if let Some((node, (_, text, _))) = wildcard.and_then(|w| values?.get(&w.1).map(|n| (n, w))) {
            return Some((node, Reached::Wildcard(text)));
        }
        self.any.get(key).map(|node| (node, Reached::Key))
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.any.is_empty()
    }
}

/// How a request entry reached a node.
#[derive(Debug, Clone, Copy)]
enum Reached<'a> {
    Value,
    Wildcard(&'a str),
    Key,
}

/// A request descriptor's limit, as found.
#[derive(Debug)]
pub struct Found<'a> {
    /// The node whose limit applies.
    pub node: &'a Node,
    /// The limit.
    pub limit: &'a Limit,
    /// Per entry, the wildcard whose values share one counter (`share_threshold`), if any.
    pub shared: Vec<Option<&'a str>>,
    /// The stats key, when built from the request rather than the node's own.
    pub stats_key: Option<String>,
}

/// One domain: its tree, and the stats of limits that requests bring (`limit` overrides).
#[derive(Debug, Default)]
struct Domain {
    level: Level,
    overrides: Series,
}

/// Every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct EnvoyConfig {
    domains: HashMap<String, Domain>,
    merge_domains: bool,
    warnings: Vec<String>,
}

impl EnvoyConfig {
    /// An empty configuration in which files of one domain merge (`true`, upstream's
    /// `MERGE_DOMAIN_CONFIG`) or are refused.
    pub fn new(merge_domains: bool) -> Self {
        Self { merge_domains, ..Self::default() }
    }

    /// Loads every `*.yaml` / `*.yml` file of `dir`, in name order.
    pub fn load_dir(dir: &Path, merge_domains: bool) -> Result<Self, EnvoyConfigError> {
        let err = |path: &Path, message: String| EnvoyConfigError { path: path.display().to_string(), message };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| err(dir, e.to_string()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        let mut config = Self::new(merge_domains);
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| err(&file, e.to_string()))?;
            config.add_file(&file.display().to_string(), &text).map_err(|m| err(&file, m))?;
        }
        Ok(config)
    }

    /// Adds one file's domain.
    pub fn add(&mut self, yaml: &str) -> Result<(), String> {
        self.add_file("", yaml)
    }

    /// Adds the domain of the file `name` (for its warnings).
    pub fn add_file(&mut self, name: &str, yaml: &str) -> Result<(), String> {
        let mut warnings = Vec::new();
        let file = spec::parse(yaml, &mut warnings)?;
        if file.domain.is_empty() {
            return Err("config file cannot have empty domain".into());
        }
        let merging = self.domains.contains_key(&file.domain);
        if merging && !self.merge_domains {
            return Err(format!("duplicate domain '{}' in config file (merging is off: --envoy-merge-domains)", file.domain));
        }
        let domain = self.domains.entry(file.domain.clone()).or_default();
        let built = build(&mut domain.level, file.descriptors, &file.domain, false, &mut warnings);
        if built.is_err() && !merging {
            self.domains.remove(&file.domain);
        }
        built?;
        let named = |w: String| if name.is_empty() { w } else { format!("{name}: {w}") };
        self.warnings.extend(warnings.into_iter().map(named));
        Ok(())
    }

    /// What was accepted but is not read as written, file by file.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The node of the limit that applies to a descriptor (`(key, value)` entries) of `domain`.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<&Node> {
        self.lookup(domain, entries).map(|f| f.node)
    }

    /// The limit that applies to a descriptor of `domain`, as envoyproxy/ratelimit finds it:
    /// entry by entry, the entry's value first, then the first wildcard it matches, then the
    /// bare key; a limit applies only when it is reached at the last entry.
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Found<'_>> {
        let mut level = &self.domains.get(domain)?.level;
        let mut path: Vec<(&Node, Reached<'_>)> = Vec::with_capacity(entries.len());
        for (i, (key, value)) in entries.iter().enumerate() {
            let (node, reached) = level.get(key, value)?;
            path.push((node, reached));
            if i + 1 < entries.len() {
                if node.children.is_empty() {
                    return None;
                }
                level = &node.children;
            }
        }
        let &(node, _) = path.last()?;
        let limit = node.limit.as_ref()?;
        let shared: Vec<Option<&str>> = path
            .iter()
            .map(|(n, r)| match r {
                Reached::Wildcard(text) if n.share_threshold => Some(*text),
                _ => None,
            })
            .collect();
        let shared = if shared.iter().any(Option::is_some) { shared } else { Vec::new() };
        let stats_key = node.dynamic_stats.then(|| dynamic_stats_key(domain, entries, &path, &shared));
        Some(Found { node, limit, shared, stats_key })
    }

    /// The counters of a limit that `domain`'s request brought, by the request's stats key
    /// (bounded: see [`Series`]).
    pub fn override_counters(&self, domain: &str, stats_key: &str) -> Option<Counters> {
        let overflow = format!("{domain}.{}", super::stats::OVERFLOW_SUFFIX);
        self.domains.get(domain).map(|d| d.overrides.get(stats_key, &overflow))
    }

    /// Whether `domain` is configured.
    pub fn contains_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The number of domains.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Whether no domain is loaded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }
}

/// The stats key upstream builds from a request: `detailed_metric` writes every entry's
/// `key_value` (a shared wildcard's pattern in place of the value); otherwise each level writes
/// its key, then the value it matched (the pattern for a wildcard, the request's under
/// `value_to_metric`).
fn dynamic_stats_key(domain: &str, entries: &[(&str, &str)], path: &[(&Node, Reached<'_>)], shared: &[Option<&str>]) -> String {
    let detailed = path.last().is_some_and(|(n, _)| n.detailed_metric);
    let mut key = String::from(domain);
    for (i, ((k, v), (node, reached))) in entries.iter().zip(path).enumerate() {
        let pattern = shared.get(i).copied().flatten();
        let value = match (detailed, reached) {
            // Upstream writes `key_` for an empty value here, and only here.
            (true, _) if shared.is_empty() => {
                key.push_str(&format!(".{k}_{v}"));
                continue;
            }
            (true, _) => pattern.unwrap_or(v),
            (false, Reached::Wildcard(text)) if node.share_threshold || !node.value_to_metric => text,
            (false, Reached::Key) if !node.value_to_metric => "",
            (false, _) => v,
        };
        key.push('.');
        key.push_str(k);
        if !value.is_empty() {
            key.push('_');
            key.push_str(value);
        }
    }
    key
}

/// Adds `specs` to `level`, the descriptors under `parent` (upstream's composite key, starting
/// with the domain); `dynamic` when a level above has `value_to_metric`.
fn build(level: &mut Level, specs: Vec<DescriptorSpec>, parent: &str, dynamic: bool, warnings: &mut Vec<String>) -> Result<(), String> {
    for d in specs {
        let composite = if d.value.is_empty() { d.key.clone() } else { format!("{}_{}", d.key, d.value) };
        let stat_key = format!("{parent}.{composite}");
        let bad = |m: &str| format!("descriptor '{stat_key}': {m}");
        if !level.composite.insert(composite.clone()) {
            return Err(format!("duplicate descriptor composite key '{stat_key}'"));
        }
        if d.key.contains('*') {
            warnings.push(format!("descriptor '{stat_key}': a `*` in a key is matched as itself, not as a wildcard"));
        }
        if d.share_threshold && !composite.contains('*') {
            return Err(bad(&format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
            )));
        }
        let limit = match d.rate_limit {
            Some(r) => {
                let (limit, warning) = limit(r).map_err(|m| bad(&m))?;
                warnings.extend(warning.map(|w| bad(&w)));
                Some(limit)
            }
            None => None,
        };
        let dynamic_here = dynamic || d.value_to_metric;
        let mut node = Node {
            limit,
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            value_to_metric: d.value_to_metric,
            share_threshold: d.share_threshold,
            metadata: d.metadata,
            dynamic_stats: dynamic_here || d.detailed_metric,
            stat_key: stat_key.clone(),
            ..Node::default()
        };
        build(&mut node.children, d.descriptors, &stat_key, dynamic_here, warnings)?;
        if d.value.is_empty() {
            level.any.insert(d.key, node);
            continue;
        }
        if let Some(pattern) = Pattern::new(&d.value) {
            level.wildcards.push((d.key.clone(), d.value.clone(), pattern));
        }
        level.exact.entry(d.key).or_default().insert(d.value, node);
    }
    Ok(())
}

/// A `rate_limit`, checked as upstream checks it, and a warning when it is not counted as written.
fn limit(r: RateLimitSpec) -> Result<(Limit, Option<String>), String> {
    let unit = Unit::parse(&r.unit);
    if r.unlimited && unit.is_some() {
        return Err("should not specify rate limit unit when unlimited".into());
    }
    for replaced in &r.replaces {
        if replaced.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if *replaced == r.name {
            return Err("replaces should not contain name of same descriptor".into());
        }
    }
    let (mut limit, warning) = if r.unlimited {
        let limit =
            Limit { quota: None, requests_per_unit: 0, unit: Unit::Second, unlimited: true, name: None, replaces: Vec::new() };
        (limit, None)
    } else {
        let unit = unit.ok_or_else(|| format!("invalid rate limit unit '{}'", r.unit))?;
        Limit::counted(u64::from(r.requests_per_unit), unit, r.algorithm.as_deref())?
    };
    limit.name = (!r.name.is_empty()).then_some(r.name);
    limit.replaces = r.replaces;
    Ok((limit, warning))
}
