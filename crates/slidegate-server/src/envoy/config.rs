//! envoyproxy/ratelimit's configuration files, loaded as it loads them: a `domain` and a tree of
//! `descriptors` (`key`, optional `value`, `rate_limit`, nested `descriptors`), with every field
//! its loader takes (`unlimited`, `name`, `replaces`, `shadow_mode`, `quota_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata`) and every check it makes;
//! wildcard values with a `*` anywhere. Two extensions, which envoyproxy's own service would
//! refuse: `rate_limit.algorithm` (default `sliding_log`, exact), and `charge_over_limit` on a
//! descriptor or at a file's top (hits recorded even past the limit, for Envoy's stream-end calls).
//!
//! Reading a file is `envoy/spec.rs`; here the tree is built, checked, merged and searched.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use envoy_types::pb::google::protobuf::Struct;

use super::bounds::Invalid;
use super::limit::{Limit, limit};
use super::position::{Position, Problem, Step, join};
use super::spec::{self, DescriptorSpec};
use super::stats::{Counters, InvalidCounters, Series};
use super::wildcard::Pattern;
use crate::file;

/// The most YAML files a configuration directory may hold: each is read again every
/// `serve` watch interval to notice a change.
pub const MAX_FILES: usize = 1_000;

/// The largest YAML file read (1 MiB): a domain of thousands of descriptors fits in a tenth.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// A configuration directory that cannot be used: the file, where in it, and why. Shown as
/// `file:line:column: message`, or `file: message` where no line applies (a directory or a
/// file that cannot be read).
#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {message}", .position.map(|p| format!(":{}:{}", p.line, p.column)).unwrap_or_default())]
pub struct EnvoyConfigError {
    /// The file (or directory).
    pub path: String,
    /// Where in the file: the offending node (a descriptor, a field, the `domain`), or the
    /// syntax error.
    pub position: Option<Position>,
    /// What is wrong: for a descriptor, `descriptor '<domain>.<key>_<value>…': <reason>`.
    pub message: String,
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
    /// Hits recorded whatever the key holds (`charge_over_limit`, here, above or at the file's
    /// top): over its limit after them, the descriptor is `OVER_LIMIT`.
    pub charge_over_limit: bool,
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
        for (k, text, pattern) in &self.wildcards {
            if k == key && pattern.matches(value) {
                // A wildcard's node is in `exact` under its text: they are added together.
                return values.and_then(|v| v.get(text)).map(|node| (node, Reached::Wildcard(text)));
            }
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

/// One domain: its tree, the stats of limits that requests bring (`limit` overrides), and its
/// refused descriptors' counters.
#[derive(Debug)]
struct Domain {
    level: Level,
    /// A file of the domain sets `charge_over_limit` at its top: the limits requests bring
    /// are charged so too.
    charge_over_limit: bool,
    overrides: Series,
    invalid: InvalidCounters,
}

impl Level {
    /// The nodes with a limit, at this level and below.
    fn limits(&self) -> usize {
        // Wildcard values' nodes are among the exact ones (by their text).
        let exact = self.exact.values().flat_map(HashMap::values);
        exact.chain(self.any.values()).map(|node| usize::from(node.limit.is_some()) + node.children.limits()).sum()
    }
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

    /// Loads every `*.yaml` / `*.yml` file of `dir`, in name order: at most [`MAX_FILES`],
    /// each of at most [`MAX_FILE_BYTES`]. An entry that is not a regular file (a FIFO, a
    /// device, a directory) is skipped, with a warning, and counted.
    pub fn load_dir(dir: &Path, merge_domains: bool) -> Result<Self, EnvoyConfigError> {
        let err = |path: &Path, message: String| EnvoyConfigError {
            path: path.display().to_string(),
            position: None,
            message,
        };
        let files = Self::files(dir).map_err(|e| err(dir, e.to_string()))?;
        if files.len() > MAX_FILES {
            return Err(err(dir, format!("{} YAML files, over the {MAX_FILES} a directory may have", files.len())));
        }
        let mut config = Self::new(merge_domains);
        for file in files {
            let text = match file::read_text(&file, MAX_FILE_BYTES, "envoy") {
                Ok(text) => text,
                Err(e @ file::FileError::NotAFile(_)) => {
                    config.warnings.push(format!("{}: {e}: skipped", file.display()));
                    continue;
                }
                Err(e) => return Err(err(&file, e.to_string())),
            };
            config.add_file(&file.display().to_string(), &text)?;
        }
        Ok(config)
    }

    /// The `*.yaml` / `*.yml` entries of `dir`, in name order (of any type: reading checks).
    pub fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let mut files: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Adds one file's domain.
    pub fn add(&mut self, yaml: &str) -> Result<(), EnvoyConfigError> {
        self.add_file("", yaml)
    }

    /// Adds the domain of the file `name` (for its warnings and errors).
    pub fn add_file(&mut self, name: &str, yaml: &str) -> Result<(), EnvoyConfigError> {
        self.add_text(name, yaml).map_err(|problem| EnvoyConfigError {
            path: name.to_owned(),
            position: problem.position(yaml),
            message: problem.message,
        })
    }

    fn add_text(&mut self, name: &str, yaml: &str) -> Result<(), Problem> {
        let mut warnings = Vec::new();
        let file = spec::parse(yaml, &mut warnings)?;
        let at_domain = || vec![Step::Key("domain".into())];
        if file.domain.is_empty() {
            return Err(Problem::at(at_domain(), "config file cannot have empty domain"));
        }
        if file.domain.contains('{') {
            // A descriptor's backend key begins with its domain: with a `{` there, it could be
            // the key of a rule of the rules file (`descriptor_key`).
            let message = format!("domain '{}' must not contain '{{' (slidegate's backend keys)", file.domain);
            return Err(Problem::at(at_domain(), message));
        }
        let merging = self.domains.contains_key(&file.domain);
        if merging && !self.merge_domains {
            let message =
                format!("duplicate domain '{}' in config file (merging is off: --envoy-merge-domains)", file.domain);
            return Err(Problem::at(at_domain(), message));
        }
        let domain = self.domains.entry(file.domain.clone()).or_insert_with_key(|name| Domain {
            level: Level::default(),
            charge_over_limit: false,
            overrides: Series::default(),
            invalid: InvalidCounters::new(name),
        });
        domain.charge_over_limit |= file.charge_over_limit;
        let charge = file.charge_over_limit;
        let built = build(&mut domain.level, file.descriptors, &file.domain, false, charge, &mut warnings);
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
        // Most descriptors share nothing: then nothing is collected.
        let shared: Vec<Option<&str>> = if path.iter().any(|p| shared_pattern(p).is_some()) {
            path.iter().map(shared_pattern).collect()
        } else {
            Vec::new()
        };
        let stats_key = node.dynamic_stats.then(|| dynamic_stats_key(domain, entries, &path, &shared));
        Some(Found { node, limit, shared, stats_key })
    }

    /// The counters of a limit that `domain`'s request brought, by the request's stats key
    /// (bounded: see [`Series`]).
    pub fn override_counters(&self, domain: &str, stats_key: &str) -> Option<Counters> {
        let overflow = || format!("{domain}.{}", super::stats::OVERFLOW_SUFFIX);
        self.domains.get(domain).map(|d| d.overrides.get(stats_key, overflow))
    }

    /// Counts `n` descriptors of `domain` (a configured one: a request's unknown domain is
    /// never a label) refused for `reason`.
    pub fn count_invalid(&self, domain: &str, reason: Invalid, n: usize) {
        if let Some(d) = self.domains.get(domain) {
            d.invalid.count(reason, n);
        }
    }

    /// Whether a file of `domain` sets `charge_over_limit` at its top.
    pub fn charges_over_limit(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|d| d.charge_over_limit)
    }

    /// Whether `domain` is configured.
    pub fn contains_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The configured domains' names.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every configured descriptor with a limit, as `(domain, node)`, by stats key.
    pub fn limits(&self) -> Vec<(&str, &Node)> {
        fn walk<'a>(domain: &'a str, level: &'a Level, out: &mut Vec<(&'a str, &'a Node)>) {
            // Wildcard values' nodes are in `exact` under their text.
            for node in level.exact.values().flat_map(HashMap::values).chain(level.any.values()) {
                if node.limit.is_some() {
                    out.push((domain, node));
                }
                walk(domain, &node.children, out);
            }
        }
        let mut out = Vec::new();
        for (name, domain) in &self.domains {
            walk(name, &domain.level, &mut out);
        }
        out.sort_by(|a, b| (a.0, &a.1.stat_key).cmp(&(b.0, &b.1.stat_key)));
        out
    }

    /// Each domain's name and number of descriptors that carry a `rate_limit`, by name.
    pub fn descriptor_counts(&self) -> impl Iterator<Item = (&str, usize)> {
        let mut domains: Vec<(&str, usize)> =
            self.domains.iter().map(|(name, domain)| (name.as_str(), domain.level.limits())).collect();
        domains.sort_unstable();
        domains.into_iter()
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

/// The pattern of a `share_threshold` wildcard a request entry reached.
fn shared_pattern<'a>((node, reached): &(&Node, Reached<'a>)) -> Option<&'a str> {
    match reached {
        Reached::Wildcard(text) if node.share_threshold => Some(text),
        _ => None,
    }
}

/// The stats key upstream builds from a request: `detailed_metric` writes every entry's
/// `key_value` (a shared wildcard's pattern in place of the value); otherwise each level writes
/// its key, then the value it matched (the pattern for a wildcard, the request's under
/// `value_to_metric`).
fn dynamic_stats_key(
    domain: &str,
    entries: &[(&str, &str)],
    path: &[(&Node, Reached<'_>)],
    shared: &[Option<&str>],
) -> String {
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
/// with the domain); `dynamic` when a level above has `value_to_metric`, `charge` when one (or
/// the file) has `charge_over_limit`.
fn build(
    level: &mut Level,
    specs: Vec<DescriptorSpec>,
    parent: &str,
    dynamic: bool,
    charge: bool,
    warnings: &mut Vec<String>,
) -> Result<(), Problem> {
    for d in specs {
        let composite = if d.value.is_empty() { d.key.clone() } else { format!("{}_{}", d.key, d.value) };
        let stat_key = format!("{parent}.{composite}");
        let bad = |m: &str| format!("descriptor '{stat_key}': {m}");
        if !level.composite.insert(composite.clone()) {
            return Err(Problem::at(d.at, format!("duplicate descriptor composite key '{stat_key}'")));
        }
        if d.key.contains('*') {
            warnings.push(bad("a `*` in a key is matched as itself, not as a wildcard"));
        }
        if d.share_threshold && !composite.contains('*') {
            let message = format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
            );
            return Err(Problem::at(join(&d.at, &["share_threshold"]), bad(&message)));
        }
        let limit = match d.rate_limit {
            Some(r) => {
                let (limit, warning) = limit(r).map_err(|(field, m)| {
                    let mut at = join(&d.at, &["rate_limit"]);
                    at.extend(field);
                    Problem::at(at, bad(&m))
                })?;
                warnings.extend(warning.map(|w| bad(&w)));
                Some(limit)
            }
            None => None,
        };
        let (dynamic_here, charge_here) = (dynamic || d.value_to_metric, charge || d.charge_over_limit);
        let mut node = Node {
            limit,
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            value_to_metric: d.value_to_metric,
            share_threshold: d.share_threshold,
            metadata: d.metadata,
            charge_over_limit: charge_here,
            dynamic_stats: dynamic_here || d.detailed_metric,
            stat_key: stat_key.clone(),
            ..Node::default()
        };
        build(&mut node.children, d.descriptors, &stat_key, dynamic_here, charge_here, warnings)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::limit::Unit;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/envoy");

    fn fixture(path: &str) -> String {
        std::fs::read_to_string(format!("{FIXTURES}/{path}")).expect(path)
    }

    fn every_field() -> EnvoyConfig {
        let mut c = EnvoyConfig::default();
        c.add_file("every_field.yaml", &fixture("every_field.yaml")).expect("loads");
        c
    }

    fn limit(c: &EnvoyConfig, domain: &str, entries: &[(&str, &str)]) -> Option<(u64, Unit, String)> {
        c.find(domain, entries)
            .and_then(|n| n.limit.as_ref().map(|l| (l.requests_per_unit, l.unit, n.stat_key.clone())))
    }

    fn stats_key(c: &EnvoyConfig, domain: &str, entries: &[(&str, &str)]) -> String {
        let found = c.lookup(domain, entries).expect("a limit");
        found.stats_key.unwrap_or_else(|| found.node.stat_key.clone())
    }

    /// Where a refused fixture marks its offending node: the line ending in `# refused at: <text>`,
    /// at the column of the first `<text>` on it.
    fn marked(text: &str) -> Option<Position> {
        text.lines().enumerate().find_map(|(i, line)| {
            let (_, at) = line.rsplit_once("# refused at: ")?;
            Some(Position { line: i + 1, column: line[..line.find(at)?].chars().count() + 1 })
        })
    }

    #[test]
    fn every_file_upstream_refuses_is_refused_naming_the_line_the_descriptor_and_the_reason() {
        let mut checked = 0;
        for entry in std::fs::read_dir(format!("{FIXTURES}/refused")).expect("fixtures") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read");
            let expected =
                text.lines().next().and_then(|l| l.strip_prefix("# refused: ")).expect("a `# refused:` line");
            let at = marked(&text).unwrap_or_else(|| panic!("{}: no `# refused at:` mark", path.display()));
            let dir = std::env::temp_dir().join(format!("slidegate-refused-{}-{checked}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::copy(&path, dir.join("file.yaml")).expect("copy");
            let err = EnvoyConfig::load_dir(&dir, false).expect_err(&path.display().to_string());
            std::fs::remove_dir_all(&dir).expect("clean");
            assert!(err.path.ends_with("file.yaml"), "{err}");
            assert!(
                err.message.starts_with(expected),
                "{}: {} does not start with {expected}",
                path.display(),
                err.message
            );
            assert_eq!(err.position, Some(at), "{}: {err}", path.display());
            assert!(err.to_string().starts_with(&format!("{}:{}:{}: ", err.path, at.line, at.column)), "{err}");
            checked += 1;
        }
        assert!(checked >= 18, "{checked} fixtures");
    }

    #[test]
    fn every_field_loads_with_a_warning_for_what_is_not_read_as_written() {
        let c = every_field();
        assert_eq!(c.warnings().len(), 2, "{:?}", c.warnings());
        assert!(
            c.warnings()[0].starts_with("every_field.yaml: `unit` has no meaning at 'api.region'"),
            "{:?}",
            c.warnings()
        );
        assert!(c.warnings()[1].contains("'api.bulk': requests_per_unit 5000000 is above the sliding log's bound"));
        let bulk = c.find("api", &[("bulk", "x")]).and_then(|n| n.limit.as_ref()).and_then(|l| l.quota).expect("quota");
        assert_eq!((bulk.limit(), bulk.algorithm()), (5_000_000, "sliding_window".parse().expect("algorithm")));
        let region =
            c.find("api", &[("region", "eu")]).and_then(|n| n.limit.as_ref()).and_then(|l| l.quota).expect("quota");
        assert_eq!(region.algorithm().as_str(), "gcra");
        let tenant = c.find("api", &[("tenant", "acme")]).expect("tenant");
        assert!(
            tenant.metadata.as_ref().is_some_and(|m| m.fields.contains_key("owner") && m.fields.contains_key("tags"))
        );
        assert!(c.find("api", &[("plan_quota", "p")]).is_some_and(|n| n.quota_mode));
        assert!(c.find("api", &[("trial", "t")]).is_some_and(|n| n.shadow_mode));
        let plan = c.find("api", &[("plan", "gold")]).and_then(|n| n.limit.as_ref()).expect("plan");
        assert_eq!((plan.name.as_deref(), plan.replaces.as_slice()), (Some("plan"), ["trial".to_owned()].as_slice()));
        assert!(c.find("api", &[("health", "x")]).and_then(|n| n.limit.as_ref()).is_some_and(|l| l.unlimited));
        assert_eq!(limit(&c, "api", &[("status", "500")]).map(|l| l.0), Some(10), "a number is its text");
    }

    #[test]
    fn wildcards_match_anywhere_and_an_exact_value_wins() {
        let c = every_field();
        let path = |v: &str| limit(&c, "api", &[("path", v)]).map(|l| (l.0, l.2));
        assert_eq!(path("/v1/admin/orders"), Some((1, "api.path_/v1/admin/orders".into())), "exact wins");
        assert_eq!(path("/v1/shop/orders"), Some((4, "api.path_/v1/*/orders*".into())));
        assert_eq!(path("/v1//orders"), Some((4, "api.path_/v1/*/orders*".into())), "an empty match");
        assert_eq!(path("/v1/a/b/orders/42"), Some((4, "api.path_/v1/*/orders*".into())));
        assert_eq!(path("/v2/shop/orders"), None);
        assert_eq!(path("/v1/orders"), None, "both runs are needed, apart");
        // Upstream's own wildcard cases and stats keys.
        let mut u = EnvoyConfig::default();
        u.add(
            "domain: test-domain
descriptors:
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: goo*, rate_limit: {unit: minute, requests_per_unit: 20}}
",
        )
        .expect("loads");
        assert_eq!(stats_key(&u, "test-domain", &[("wild", "foo1")]), "test-domain.wild_foo*");
        assert_eq!(stats_key(&u, "test-domain", &[("wild", "foo2")]), "test-domain.wild_foo*");
        assert_eq!(stats_key(&u, "test-domain", &[("midWild", "barXb")]), "test-domain.midWild_bar*b");
        assert!(u.find("test-domain", &[("midWild", "barX")]).is_none());
        assert_eq!(stats_key(&u, "test-domain", &[("multiWild", "foo1bar2baz")]), "test-domain.multiWild_foo*bar*baz");
        assert_eq!(
            stats_key(&u, "test-domain", &[("nestedWild", "val1"), ("wild", "goo2")]),
            "test-domain.nestedWild_val1.wild_goo*"
        );
    }

    #[test]
    fn entries_match_as_pairs_so_an_underscore_cannot_reach_another_key() {
        let mut c = EnvoyConfig::default();
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: p\n    value: x*\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
        c.add(yaml).expect("valid");
        assert_eq!(limit(&c, "d", &[("a", "b_c")]).map(|l| l.0), Some(1));
        assert_eq!(limit(&c, "d", &[("a_b", "c")]), None, "key a_b, not a");
        assert_eq!(limit(&c, "d", &[("p", "xyz")]).map(|l| l.0), Some(2));
        assert_eq!(limit(&c, "d", &[("p_x", "yz")]), None, "the wildcard is of key p only");
        assert!(c.contains_domain("d") && !c.contains_domain("e"));
    }

    #[test]
    fn a_limit_applies_at_the_descriptor_s_last_entry_only() {
        let mut c = EnvoyConfig::default();
        c.add(&fixture("messaging.yaml")).expect("loads");
        let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
        assert_eq!(
            limit(&c, "messaging", &marketing),
            Some((5, Unit::Day, "messaging.message_type_marketing.to_number".into()))
        );
        assert_eq!(limit(&c, "messaging", &[("to_number", "1")]).map(|l| l.0), Some(100));
        assert_eq!(limit(&c, "messaging", &[("message_type", "marketing")]), None);
        assert_eq!(limit(&c, "messaging", &[("to_number", "1"), ("extra", "x")]), None, "deeper than the tree");
    }

    #[test]
    fn stats_keys_follow_value_to_metric_detailed_metric_and_share_threshold() {
        let mut c = EnvoyConfig::default();
        c.add(
            "domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}
  - key: k1
    value_to_metric: true
    descriptors:
      - {key: k2, rate_limit: {unit: second, requests_per_unit: 1}}
  - key: svc
    value: svc/*
    share_threshold: true
    descriptors:
      - {key: endpoint, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}
  - {key: user, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: w, value: a*, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 5}}
",
        )
        .expect("loads");
        let route = [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")];
        assert_eq!(stats_key(&c, "d", &route), "d.route_draw.http_method_GET.subject_id");
        assert_eq!(stats_key(&c, "d", &[("k1", "A"), ("k2", "foo")]), "d.k1_A.k2");
        assert_eq!(stats_key(&c, "d", &[("svc", "svc/a"), ("endpoint", "/x")]), "d.svc_svc/*.endpoint_/x");
        assert_eq!(stats_key(&c, "d", &[("user", "ann")]), "d.user_ann");
        assert_eq!(stats_key(&c, "d", &[("user", "")]), "d.user_", "upstream writes key_ for an empty value");
        assert_eq!(stats_key(&c, "d", &[("w", "abc")]), "d.w_abc");
        let found = c.lookup("d", &[("svc", "svc/a"), ("endpoint", "/x")]).expect("found");
        assert_eq!(found.shared, [Some("svc/*"), None]);
        assert!(c.lookup("d", &[("w", "abc")]).expect("found").shared.is_empty());
    }

    #[test]
    fn files_of_one_domain_merge_only_when_asked() {
        let dir = format!("{FIXTURES}/merge");
        let refused = EnvoyConfig::load_dir(Path::new(&dir), false).expect_err("two files, one domain");
        assert!(refused.path.ends_with("shop_users.yaml"), "{refused}");
        assert!(refused.message.starts_with("duplicate domain 'shop' in config file"), "{refused}");
        let second = fixture("merge/shop_users.yaml");
        let line = second.lines().position(|l| l.starts_with("domain:")).expect("a domain") + 1;
        assert_eq!(refused.position, Some(Position { line, column: 1 }), "at the second file's domain: {refused}");
        let merged = EnvoyConfig::load_dir(Path::new(&dir), true).expect("merged");
        assert_eq!(merged.len(), 1);
        assert_eq!(limit(&merged, "shop", &[("user", "ada")]).map(|l| l.0), Some(2));
        assert_eq!(limit(&merged, "shop", &[("path", "/cart/1")]).map(|l| l.0), Some(3));
        // A descriptor both files declare is refused even when merging.
        let mut c = EnvoyConfig::new(true);
        c.add(&fixture("merge/shop_users.yaml")).expect("first");
        let again = c.add(&fixture("merge/shop_users.yaml")).expect_err("twice");
        assert_eq!(again.message, "duplicate descriptor composite key 'shop.user'");
    }
}

/// The Envoy configuration loader under hostile files: random text, valid files with characters
/// replaced, inserted, deleted or cut, and hand-picked attacks.
#[cfg(test)]
mod fuzz {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::EnvoyConfig;

    const VALID: [&str; 3] = [
        "
domain: mongo_cps
descriptors:
  - key: database
    value: \"users[{1}]\"
    rate_limit:
      unit: second
      requests_per_unit: 500
      algorithm: gcra
  - key: database
    value: def*ault*
    shadow_mode: true
    share_threshold: true
    metadata: {a: [1, {b: 2.5}]}
    rate_limit:
      name: db
      replaces: [{name: other}]
      unit: minute
      requests_per_unit: 50
",
        include_str!("../../tests/fixtures/envoy/messaging.yaml"),
        include_str!("../../tests/fixtures/envoy/every_field.yaml"),
    ];

    /// Loads `yaml`, which must add a domain or be refused with a message, within 5 s: a bound
    /// against work that grows faster than the text (a quadratic parse of the deep files below
    /// takes minutes), not a timing. A refused file is parsed twice (the second time to find
    /// the line), a megabyte in a debug build on a loaded machine in over a second.
    fn loads_or_is_refused(yaml: &str) -> Result<bool, TestCaseError> {
        let started = Instant::now();
        let outcome = EnvoyConfig::default().add(yaml);
        prop_assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        if let Err(refused) = &outcome {
            prop_assert!(!refused.message.is_empty());
        }
        Ok(outcome.is_ok())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]
        /// Random text and mutated valid files: a domain or an error, never a panic.
        #[test]
        fn any_file_loads_or_is_refused(
            valid in 0..VALID.len(),
            edits in proptest::collection::vec((0u8..4, any::<usize>(), any::<char>()), 0..6),
            random in proptest::option::weighted(0.2, ".{0,200}"),
        ) {
            let text = random.unwrap_or_else(|| VALID[valid].to_owned()).chars().collect();
            let text: String = crate::mutate::mutate(text, edits).into_iter().collect();
            loads_or_is_refused(&text)?;
        }
    }

    #[test]
    fn valid_files_load() {
        for yaml in VALID {
            assert!(loads_or_is_refused(yaml).unwrap_or_else(|e| panic!("{e}")), "{yaml}");
        }
    }

    #[test]
    fn hostile_files_are_refused() {
        // A billion descriptors from nine levels of aliases ("billion laughs").
        let mut laughs = String::from("domain: d\ndescriptors:\n  - &l0 {key: k}\n");
        for i in 1..10 {
            let refs = vec![format!("*l{}", i - 1); 10].join(", ");
            laughs.push_str(&format!("  - &l{i} {{key: k{i}, descriptors: [{refs}]}}\n"));
        }
        // Descriptors nested 1,000 deep in block style (a megabyte of indentation), 10,000 in flow.
        let deep_block: String =
            (0..1_000).map(|i| format!("{}- key: k\n{0}  descriptors:\n", "  ".repeat(i))).collect();
        let deep_flow =
            format!("domain: d\ndescriptors: {}{}", "[{key: k, descriptors: ".repeat(10_000), "}]".repeat(10_000));
        let long = "x".repeat(1 << 20);
        let refused = EnvoyConfig::default().add(&deep_flow).expect_err("too deep");
        assert!(refused.message.contains("nested deeper than 128"), "{refused}");
        let files = [
            laughs,
            format!("domain: d\ndescriptors:\n{deep_block}"),
            deep_flow,
            format!("domain: {}1{}", "[".repeat(10_000), "]".repeat(10_000)),
            // Numbers past every type, units that are not units.
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 99999999999999999999999}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: .nan}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: .inf}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n".into(),
            // Duplicate keys and descriptors, empty names, long and non-ASCII strings, tags.
            "domain: d\ndomain: e\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    key: j\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n".into(),
            "domain: \"\"\n".into(),
            "domain: d\ndescriptors:\n  - key: \"\"\n".into(),
            format!("domain: d\ndescriptors:\n  - key: {long}\n    unknown: 1\n"),
            "domain: d\ndescriptors: !!map {}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: !custom 1}\n".into(),
            "--- \ndomain: d\n--- \ndomain: e\n".into(),
            "\u{feff}domain: ☃\ndescriptors:\n  - {key: ключ, value: \"\\0\", rate_limit: {unit: second}}\n".into(),
        ];
        for yaml in &files {
            let head: String = yaml.chars().take(80).collect();
            let loaded = loads_or_is_refused(yaml).unwrap_or_else(|e| panic!("{head}: {e}"));
            assert!(!loaded, "{head} loaded");
        }
    }
}
