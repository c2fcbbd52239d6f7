//! envoyproxy/ratelimit's configuration files, loaded as they are: a `domain` and a tree of
//! `descriptors` (`key`, optional `value`, `rate_limit`, nested `descriptors`), with
//! `unlimited`, `shadow_mode`, `replaces`, `detailed_metric` and trailing-`*` wildcard values.
//! One extension: `rate_limit.algorithm` (default `sliding_log`, exact), which envoyproxy's own
//! service would not know.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use slidegate::{Algorithm, Quota};

use super::stats::DetailedCounters;

/// A configuration directory that cannot be used, with the file and why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct EnvoyConfigError {
    /// The file (or directory).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorSpec {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimitSpec>,
    #[serde(default)]
    descriptors: Vec<DescriptorSpec>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSpec {
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplacesSpec>,
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    algorithm: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesSpec {
    name: String,
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
    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Self::Second,
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
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
    /// `requests_per_unit` per `unit`; `None` when `requests_per_unit` is 0 (everything over).
    pub quota: Option<Quota>,
    /// As configured.
    pub requests_per_unit: u64,
    /// As configured.
    pub unit: Unit,
    /// Never limited (still counted in metrics).
    pub unlimited: bool,
    /// The limit's name, for `replaces`.
    pub name: Option<String>,
    /// Names of limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Node {
    /// The limit of a descriptor that ends here.
    pub limit: Option<Limit>,
    /// Decide and count, but answer OK.
    pub shadow_mode: bool,
    /// Metrics by the request's own values instead of the configured path.
    pub detailed_metric: bool,
    /// The configured path (`key_value.key`), for metrics.
    pub stat_key: String,
    /// Its counters, registered at its first hit (unless `detailed_metric`).
    pub counters: std::sync::OnceLock<crate::metrics::EnvoyCounters>,
    /// Its counters by the request's values (under `detailed_metric`), bounded.
    pub detailed: DetailedCounters,
    children: Level,
}

/// One level of the tree. Entries are matched as `(key, value)` pairs, never as one
/// `key_value` string: a value holding `_` cannot reach another key's node.
#[derive(Debug, Default)]
struct Level {
    /// `key` → `value` → node.
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, value prefix)` (a value ending in `*`, without it) → node, in file order.
    wildcard: Vec<(String, String, Node)>,
    /// `key` (no value: any value, each counted apart) → node.
    any: HashMap<String, Node>,
}

impl Level {
    /// The nodes with a limit, at this level and below.
    fn limits(&self) -> usize {
        let exact = self.exact.values().flat_map(HashMap::values);
        let wildcard = self.wildcard.iter().map(|(_, _, node)| node);
        exact
            .chain(wildcard)
            .chain(self.any.values())
            .map(|node| usize::from(node.limit.is_some()) + node.children.limits())
            .sum()
    }
}

/// Every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct EnvoyConfig {
    domains: HashMap<String, Level>,
}

impl EnvoyConfig {
    /// Loads every `*.yaml` / `*.yml` file of `dir` (one domain each).
    pub fn load_dir(dir: &Path) -> Result<Self, EnvoyConfigError> {
        let err = |path: &Path, message: String| EnvoyConfigError { path: path.display().to_string(), message };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| err(dir, e.to_string()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        let mut config = Self::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| err(&file, e.to_string()))?;
            config.add(&text).map_err(|m| err(&file, m))?;
        }
        Ok(config)
    }

    /// Adds one file's domain.
    pub fn add(&mut self, yaml: &str) -> Result<(), String> {
        if bracket_depth(yaml) > MAX_FLOW_NESTING {
            return Err(format!("brackets nested deeper than {MAX_FLOW_NESTING}"));
        }
        let spec: FileSpec = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        if spec.domain.is_empty() {
            return Err("domain must not be empty".into());
        }
        if self.domains.contains_key(&spec.domain) {
            return Err(format!("duplicate domain {:?}", spec.domain));
        }
        let level = build_level(spec.descriptors, "")?;
        self.domains.insert(spec.domain, level);
        Ok(())
    }

    /// The node of the limit that applies to a descriptor (`(key, value)` entries) of `domain`,
    /// as envoyproxy/ratelimit finds it: entry by entry, `key_value` first, then a wildcard
    /// value, then the bare `key`; a limit applies only when it is reached at the last entry.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<&Node> {
        let mut level = self.domains.get(domain)?;
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = level
                .exact
                .get(*key)
                .and_then(|values| values.get(*value))
                .or_else(|| {
                    let wildcard =
                        |(k, prefix, _): &&(String, String, Node)| k == key && value.starts_with(prefix.as_str());
                    level.wildcard.iter().find(wildcard).map(|(_, _, n)| n)
                })
                .or_else(|| level.any.get(*key))?;
            if i + 1 == entries.len() {
                return node.limit.is_some().then_some(node);
            }
            level = &node.children;
        }
        None
    }

    /// Whether `domain` is configured.
    pub fn contains_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Each domain's name and number of descriptors that carry a `rate_limit`, by name.
    pub fn domains(&self) -> impl Iterator<Item = (&str, usize)> {
        let mut domains: Vec<(&str, usize)> =
            self.domains.iter().map(|(name, level)| (name.as_str(), level.limits())).collect();
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

/// The deepest a file may nest `[` and `{`: the YAML parser's time grows with the square of
/// the nesting (each token re-examines every open level), so 4,000 levels (100 KB) took seconds;
/// the deserializer refuses more than 128 levels of any kind anyway, but only after parsing.
pub const MAX_FLOW_NESTING: usize = 128;

/// How deep `[` and `{` nest in `text`, counting every bracket (also in strings and comments),
/// which errs on the deep side for brackets the parser sees (closing ones inside strings aside).
fn bracket_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0);
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn build_level(specs: Vec<DescriptorSpec>, parent: &str) -> Result<Level, String> {
    let mut level = Level::default();
    for d in specs {
        if d.key.is_empty() {
            return Err("descriptor key must not be empty".into());
        }
        let segment = match &d.value {
            Some(v) => format!("{}_{v}", d.key),
            None => d.key.clone(),
        };
        let stat_key = if parent.is_empty() { segment.clone() } else { format!("{parent}.{segment}") };
        let limit = d.rate_limit.map(|r| build_limit(r, &stat_key)).transpose()?;
        let node = Node {
            limit,
            shadow_mode: d.shadow_mode,
            detailed_metric: d.detailed_metric,
            children: build_level(d.descriptors, &stat_key)?,
            stat_key,
            counters: std::sync::OnceLock::new(),
            detailed: DetailedCounters::default(),
        };
        let duplicate = match d.value {
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_owned();
                level.wildcard.push((d.key, prefix, node));
                false
            }
            Some(v) => level.exact.entry(d.key).or_default().insert(v, node).is_some(),
            None => level.any.insert(d.key, node).is_some(),
        };
        if duplicate {
            return Err(format!("duplicate descriptor {segment:?}"));
        }
    }
    Ok(level)
}

fn build_limit(r: RateLimitSpec, at: &str) -> Result<Limit, String> {
    let bad = |m: String| format!("descriptor {at:?}: {m}");
    let unit_name = r.unit.as_deref().unwrap_or(if r.unlimited { "second" } else { "" });
    let unit = Unit::parse(unit_name)
        .ok_or_else(|| bad(format!("unit {unit_name:?} is not one of second, minute, hour, day, week, month, year")))?;
    let requests_per_unit = match (r.requests_per_unit, r.unlimited) {
        (Some(n), _) => n,
        (None, true) => 0,
        (None, false) => return Err(bad("rate_limit needs requests_per_unit (or unlimited: true)".into())),
    };
    let quota = if r.unlimited || requests_per_unit == 0 {
        None
    } else {
        let algorithm: Algorithm =
            r.algorithm.as_deref().unwrap_or("sliding_log").parse().map_err(|e| bad(format!("{e}")))?;
        let q = Quota::new(requests_per_unit, unit.window()).and_then(|q| q.with_algorithm(algorithm));
        Some(q.map_err(|e| bad(e.to_string()))?)
    };
    Ok(Limit {
        quota,
        requests_per_unit,
        unit,
        unlimited: r.unlimited,
        name: r.name,
        replaces: r.replaces.into_iter().map(|x| x.name).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of envoyproxy/ratelimit's README, typed in from its text.
    const MONGO: &str = "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

    const MESSAGING: &str = include_str!("../../tests/fixtures/envoy/messaging.yaml");

    const EDGE: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

    const WILDCARD_AND_UNLIMITED: &str = "
domain: wildcard
descriptors:
  - key: path
    value: /foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /health
    rate_limit:
      unlimited: true
  - key: client_id
    value: noisy
    shadow_mode: true
    detailed_metric: true
    rate_limit:
      name: noisy
      unit: hour
      requests_per_unit: 10
      algorithm: gcra
  - key: client_id
    rate_limit:
      name: clients
      replaces:
        - name: noisy
      unit: hour
      requests_per_unit: 100
";

    fn config() -> EnvoyConfig {
        let mut c = EnvoyConfig::default();
        for yaml in [MONGO, MESSAGING, EDGE, WILDCARD_AND_UNLIMITED] {
            c.add(yaml).expect("valid");
        }
        c
    }

    fn limit(c: &EnvoyConfig, domain: &str, entries: &[(&str, &str)]) -> Option<(u64, Unit, String)> {
        c.find(domain, entries)
            .and_then(|n| n.limit.as_ref().map(|l| (l.requests_per_unit, l.unit, n.stat_key.clone())))
    }

    #[test]
    fn the_readme_examples_produce_their_limits() {
        let c = config();
        assert_eq!(c.len(), 4);
        assert_eq!(
            limit(&c, "mongo_cps", &[("database", "users")]),
            Some((500, Unit::Second, "database_users".into()))
        );
        assert_eq!(limit(&c, "mongo_cps", &[("database", "other")]), None, "no limit for unknown values");
        let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
        assert_eq!(limit(&c, "messaging", &marketing), Some((5, Unit::Day, "message_type_marketing.to_number".into())));
        assert_eq!(limit(&c, "messaging", &[("to_number", "2061111111")]), Some((100, Unit::Day, "to_number".into())));
        assert_eq!(limit(&c, "messaging", &[("message_type", "marketing")]), None, "a limit applies at the last entry");
        assert_eq!(limit(&c, "edge_proxy_per_ip", &[("remote_address", "10.0.0.1")]).map(|l| l.0), Some(10));
        let blocked = c.find("edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]).and_then(|n| n.limit.as_ref());
        assert!(
            blocked.is_some_and(|l| l.requests_per_unit == 0 && l.quota.is_none()),
            "a value is more specific than any value"
        );
        assert_eq!(limit(&c, "nope", &[("database", "users")]), None);
    }

    #[test]
    fn wildcards_unlimited_shadow_and_replaces_load() {
        let c = config();
        assert_eq!(limit(&c, "wildcard", &[("path", "/foo/bar")]).map(|l| l.0), Some(20));
        assert_eq!(limit(&c, "wildcard", &[("path", "/bar")]), None);
        let health = c.find("wildcard", &[("path", "/health")]).and_then(|n| n.limit.as_ref()).expect("limit");
        assert!(health.unlimited && health.quota.is_none());
        let noisy = c.find("wildcard", &[("client_id", "noisy")]).expect("node");
        assert!(noisy.shadow_mode && noisy.detailed_metric);
        let q = noisy.limit.as_ref().and_then(|l| l.quota).expect("quota");
        assert_eq!((q.limit(), q.algorithm().as_str()), (10, "gcra"));
        let clients = c.find("wildcard", &[("client_id", "x")]).and_then(|n| n.limit.as_ref()).expect("limit");
        assert_eq!(clients.replaces, ["noisy"]);
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
    fn bad_files_say_what_is_wrong() {
        let err = |yaml: &str| EnvoyConfig::default().add(yaml).expect_err("invalid");
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n").contains("fortnight"));
        assert!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n")
                .contains("requests_per_unit")
        );
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    colour: red\n").contains("colour"));
        assert!(err("domain: \"\"\n").contains("domain"));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n  - key: k\n").contains("duplicate"));
        let mut c = config();
        assert!(c.add(MONGO).is_err_and(|e| e.contains("duplicate domain")));
    }
}

/// The Envoy configuration loader under hostile files: random text, valid files with characters
/// replaced, inserted, deleted or cut, and hand-picked attacks.
#[cfg(test)]
mod fuzz {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::EnvoyConfig;

    const VALID: [&str; 2] = [
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
    value: default*
    shadow_mode: true
    rate_limit:
      name: db
      replaces: [{name: other}]
      unit: minute
      requests_per_unit: 50
",
        include_str!("../../tests/fixtures/envoy/messaging.yaml"),
    ];

    /// Loads `yaml`, which must add a domain or be refused with a message, within a second.
    fn loads_or_is_refused(yaml: &str) -> Result<bool, TestCaseError> {
        let started = Instant::now();
        let outcome = EnvoyConfig::default().add(yaml);
        prop_assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        if let Err(message) = &outcome {
            prop_assert!(!message.is_empty());
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
        assert!(refused.contains("nested deeper than 128"), "{refused}");
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
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000001}\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n".into(),
            // Duplicate keys and descriptors, empty names, long and non-ASCII strings, tags.
            "domain: d\ndomain: e\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n    key: j\n".into(),
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n".into(),
            "domain: \"\"\n".into(),
            "domain: d\ndescriptors:\n  - key: \"\"\n".into(),
            format!("domain: d\ndescriptors:\n  - key: {long}\n    unknown: 1\n"),
            "domain: d\ndescriptors: !!map {}\n".into(),
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
