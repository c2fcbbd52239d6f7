//! One envoyproxy/ratelimit YAML file read as envoyproxy/ratelimit reads it: every key anywhere
//! must be one of its known keys (a misspelt `ratelimit` is refused), lists hold maps, leaves
//! are strings, integers, booleans or empty; then each field is read where it belongs. A known
//! key in a place where it means nothing (a `unit` beside a descriptor's `key`) is ignored, as
//! upstream ignores it, with a warning. Scalars read as text take their text (`value: 500` is
//! the value `"500"`), as upstream's YAML decoder does. Each problem names the node it is
//! about (`position`), so that the file's line can be found.

use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as PbValue, value::Kind};
use serde_yaml_ng::{Mapping, Value};

use super::position::{Place, Position, Problem, Step, join};

/// Every key envoyproxy/ratelimit's loader knows, plus slidegate's `algorithm` and
/// `charge_over_limit`.
const KNOWN_KEYS: [&str; 18] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "algorithm",
    "charge_over_limit",
];

/// The keys of each place.
const FILE_KEYS: &[&str] = &["domain", "descriptors", "charge_over_limit"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "charge_over_limit",
];
const RATE_LIMIT_KEYS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm"];
const REPLACES_KEYS: &[&str] = &["name"];

/// The deepest a file may nest `[` and `{`: the YAML parser's time grows with the square of
/// the nesting (each token re-examines every open level), so 4,000 levels (100 KB) took seconds;
/// the deserializer refuses more than 128 levels of any kind anyway, but only after parsing.
pub const MAX_FLOW_NESTING: usize = 128;

/// A file as written.
#[derive(Debug)]
pub(super) struct FileSpec {
    /// `domain`.
    pub(super) domain: String,
    /// `descriptors`.
    pub(super) descriptors: Vec<DescriptorSpec>,
    /// slidegate's `charge_over_limit`, for every descriptor of the file.
    pub(super) charge_over_limit: bool,
}

/// A descriptor as written.
#[derive(Debug, Default)]
pub(super) struct DescriptorSpec {
    /// Where it is in the file, for messages.
    pub(super) at: Vec<Step>,
    /// `key`.
    pub(super) key: String,
    /// `value`; empty: none.
    pub(super) value: String,
    /// `rate_limit`.
    pub(super) rate_limit: Option<RateLimitSpec>,
    /// `descriptors`.
    pub(super) descriptors: Vec<DescriptorSpec>,
    /// `shadow_mode`.
    pub(super) shadow_mode: bool,
    /// `quota_mode`.
    pub(super) quota_mode: bool,
    /// `detailed_metric`.
    pub(super) detailed_metric: bool,
    /// `value_to_metric`.
    pub(super) value_to_metric: bool,
    /// `share_threshold`.
    pub(super) share_threshold: bool,
    /// `metadata`, as a protobuf `Struct`.
    pub(super) metadata: Option<Struct>,
    /// slidegate's `charge_over_limit`.
    pub(super) charge_over_limit: bool,
}

/// A `rate_limit` as written.
#[derive(Debug, Default)]
pub(super) struct RateLimitSpec {
    /// `requests_per_unit` (0 when absent, as upstream reads it).
    pub(super) requests_per_unit: u32,
    /// `unit`, as written.
    pub(super) unit: String,
    /// `unlimited`.
    pub(super) unlimited: bool,
    /// `name`.
    pub(super) name: String,
    /// The `name` of each `replaces` entry.
    pub(super) replaces: Vec<String>,
    /// slidegate's `algorithm`.
    pub(super) algorithm: Option<String>,
}

/// Reads `text`, pushing a warning for each known key that is ignored where it stands.
pub(super) fn parse(text: &str, warnings: &mut Vec<String>) -> Result<FileSpec, Problem> {
    if let Some(at) = too_deep(text) {
        let message = format!("brackets nested deeper than {MAX_FLOW_NESTING}");
        return Err(Problem { message, place: Place::Text(Some(at)) });
    }
    let root: Value = serde_yaml_ng::from_str(text).map_err(|e| Problem {
        message: format!("error loading config file: {e}"),
        place: Place::Text(e.location().map(|l| Position { line: l.line(), column: l.column() })),
    })?;
    let root = match root {
        Value::Null => Mapping::new(),
        Value::Mapping(m) => m,
        other => {
            let message = format!("error loading config file: the file is {}, not a map", kind(&other));
            return Err(Problem::at(Vec::new(), message));
        }
    };
    check_keys(&root, &mut Vec::new())?;
    let mut reader = Reader { warnings, path: String::new() };
    reader.ignore_misplaced(&root, FILE_KEYS);
    let domain = text_of(root.get("domain"), "domain").map_err(|e| Problem::at(join(&[], &["domain"]), e))?;
    reader.path = domain.clone();
    let charge_over_limit = flag_of(root.get("charge_over_limit"), "charge_over_limit")
        .map_err(|e| Problem::at(join(&[], &["charge_over_limit"]), e))?;
    let descriptors = reader.descriptors(root.get("descriptors"), &join(&[], &["descriptors"]))?;
    Ok(FileSpec { domain, descriptors, charge_over_limit })
}

/// Where `[` and `{` first nest deeper than [`MAX_FLOW_NESTING`] in `text`, counting every
/// bracket (also in strings and comments), which errs on the deep side for brackets the parser
/// sees (closing ones inside strings aside).
fn too_deep(text: &str) -> Option<Position> {
    let mut depth = 0usize;
    for (line, text) in text.lines().enumerate() {
        for (column, c) in text.chars().enumerate() {
            match c {
                '[' | '{' => depth += 1,
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            if depth > MAX_FLOW_NESTING {
                return Some(Position { line: line + 1, column: column + 1 });
            }
        }
    }
    None
}

/// Upstream's check of the whole tree before anything is read: each key a known one, each list
/// of maps, each leaf a string, an integer, a boolean or empty (a float is refused). What is
/// under `metadata` is free-form. `at` is where `map` is, for messages.
fn check_keys(map: &Mapping, at: &mut Vec<Step>) -> Result<(), Problem> {
    for (k, v) in map {
        let text = scalar_text(k).unwrap_or_default();
        at.push(Step::Key(text.clone()));
        let Value::String(key) = k else {
            return Err(Problem::at(at.clone(), format!("config error, key is not of type string: {text}")));
        };
        if !KNOWN_KEYS.contains(&key.as_str()) {
            return Err(Problem::at(at.clone(), format!("config error, unknown key '{key}'")));
        }
        match v {
            _ if key == "metadata" => {}
            Value::Sequence(items) => {
                for (i, item) in items.iter().enumerate() {
                    at.push(Step::Index(i));
                    let Value::Mapping(m) = item else {
                        let shown = scalar_text(item).unwrap_or_else(|| kind(item).to_owned());
                        let message = format!("config error, yaml file contains list of type other than map: {shown}");
                        return Err(Problem::at(at.clone(), message));
                    };
                    check_keys(m, at)?;
                    at.pop();
                }
            }
            Value::Mapping(m) => check_keys(m, at)?,
            Value::Null | Value::Bool(_) | Value::String(_) => {}
            Value::Number(n) if n.is_i64() || n.is_u64() => {}
            _ => return Err(Problem::at(at.clone(), format!("config error, the value of '{key}' is {}", kind(v)))),
        }
        at.pop();
    }
    Ok(())
}

/// Reads descriptors, knowing where it is (`domain.key_value.key`, upstream's composite key)
/// for its messages.
struct Reader<'w> {
    warnings: &'w mut Vec<String>,
    path: String,
}

impl Reader<'_> {
    /// The descriptors of `list`, which is at `at`.
    fn descriptors(&mut self, list: Option<&Value>, at: &[Step]) -> Result<Vec<DescriptorSpec>, Problem> {
        let items = match list {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Sequence(items)) => items,
            Some(other) => {
                return Err(self.at(at.to_vec(), &format!("descriptors must be a list, not {}", kind(other))));
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            // check_keys saw every list item is a map.
            let Value::Mapping(m) = item else { continue };
            let mut here = at.to_vec();
            here.push(Step::Index(i));
            out.push(self.descriptor(m, here)?);
        }
        Ok(out)
    }

    fn descriptor(&mut self, m: &Mapping, at: Vec<Step>) -> Result<DescriptorSpec, Problem> {
        let key = text_of(m.get("key"), "key").map_err(|e| self.at(join(&at, &["key"]), &e))?;
        if key.is_empty() {
            return Err(self.at(at, "descriptor has empty key"));
        }
        let value = text_of(m.get("value"), "value").map_err(|e| self.at(join(&at, &["value"]), &e))?;
        let parent = std::mem::take(&mut self.path);
        let segment = if value.is_empty() { key.clone() } else { format!("{key}_{value}") };
        self.path = format!("{parent}.{segment}");
        self.ignore_misplaced(m, DESCRIPTOR_KEYS);
        let mut spec = self.fields(m).map_err(|(field, e)| self.at(join(&at, &field), &e))?;
        (spec.key, spec.value) = (key, value);
        spec.descriptors = self.descriptors(m.get("descriptors"), &join(&at, &["descriptors"]))?;
        spec.at = at;
        self.path = parent;
        Ok(spec)
    }

    /// A descriptor's own fields (not `key`, `value` and `descriptors`); an error names the
    /// field it is about.
    fn fields(&mut self, m: &Mapping) -> Result<DescriptorSpec, (Vec<&'static str>, String)> {
        let flag = |name: &'static str| flag_of(m.get(name), name).map_err(|e| (vec![name], e));
        let rate_limit = match m.get("rate_limit") {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(r)) => Some(self.rate_limit(r).map_err(|(field, e)| (vec!["rate_limit", field], e))?),
            Some(other) => return Err((vec!["rate_limit"], format!("rate_limit must be a map, not {}", kind(other)))),
        };
        let metadata =
            metadata(m.get("metadata")).map_err(|e| (vec!["metadata"], format!("error parsing metadata: {e}")));
        Ok(DescriptorSpec {
            rate_limit,
            shadow_mode: flag("shadow_mode")?,
            quota_mode: flag("quota_mode")?,
            detailed_metric: flag("detailed_metric")?,
            value_to_metric: flag("value_to_metric")?,
            share_threshold: flag("share_threshold")?,
            metadata: metadata?,
            charge_over_limit: flag("charge_over_limit")?,
            ..DescriptorSpec::default()
        })
    }

    /// A `rate_limit`; an error names the field it is about.
    fn rate_limit(&mut self, r: &Mapping) -> Result<RateLimitSpec, (&'static str, String)> {
        self.ignore_misplaced(r, RATE_LIMIT_KEYS);
        let text = |name: &'static str| text_of(r.get(name), name).map_err(|e| (name, e));
        let requests_per_unit = match r.get("requests_per_unit") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                (
                    "requests_per_unit",
                    format!("requests_per_unit must be a whole number from 0 to {}, got {n}", u32::MAX),
                )
            })?,
            Some(other) => {
                return Err((
                    "requests_per_unit",
                    format!("requests_per_unit must be a whole number, not {}", kind(other)),
                ));
            }
        };
        let replaces = match r.get("replaces") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Sequence(items)) => {
                let mut names = Vec::with_capacity(items.len());
                for item in items {
                    let Value::Mapping(entry) = item else { continue };
                    self.ignore_misplaced(entry, REPLACES_KEYS);
                    names.push(text_of(entry.get("name"), "replaces name").map_err(|e| ("replaces", e))?);
                }
                names
            }
            Some(other) => return Err(("replaces", format!("replaces must be a list, not {}", kind(other)))),
        };
        Ok(RateLimitSpec {
            requests_per_unit,
            unit: text("unit")?,
            unlimited: flag_of(r.get("unlimited"), "unlimited").map_err(|e| ("unlimited", e))?,
            name: text("name")?,
            replaces,
            algorithm: match r.get("algorithm") {
                None | Some(Value::Null) => None,
                Some(_) => Some(text("algorithm")?),
            },
        })
    }

    /// Warns of each known key of `m` that `place` does not read.
    fn ignore_misplaced(&mut self, m: &Mapping, place: &[&str]) {
        for key in m.keys().filter_map(Value::as_str).filter(|k| !place.contains(k)) {
            let at = if self.path.is_empty() { "the file's top level".to_owned() } else { format!("'{}'", self.path) };
            self.warnings
                .push(format!("`{key}` has no meaning at {at} and is ignored (envoyproxy/ratelimit ignores it too)"));
        }
    }

    /// `message` about the descriptor being read, and the node at `at`.
    fn at(&self, at: Vec<Step>, message: &str) -> Problem {
        Problem::at(at, format!("descriptor '{}': {message}", self.path))
    }
}

/// A field read as text: a string, or an integer's or a boolean's text; empty when absent.
fn text_of(v: Option<&Value>, field: &str) -> Result<String, String> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(v) => scalar_text(v).ok_or_else(|| format!("{field} must be text, not {}", kind(v))),
    }
}

/// A field read as a boolean; false when absent.
fn flag_of(v: Option<&Value>, field: &str) -> Result<bool, String> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{field} must be true or false, not {}", kind(other))),
    }
}

/// The text of a scalar (a string, a number, a boolean), or `None` for anything else.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// What a value is, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "empty",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a float",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a map",
        Value::Tagged(_) => "a tagged value",
    }
}

/// `metadata` as the protobuf `Struct` it is answered as (a map's keys are their text).
fn metadata(v: Option<&Value>) -> Result<Option<Struct>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Mapping(m)) if m.is_empty() => Ok(None),
        Some(Value::Mapping(m)) => Ok(Some(pb_struct(m)?)),
        Some(other) => Err(format!("metadata must be a map, not {}", kind(other))),
    }
}

fn pb_struct(m: &Mapping) -> Result<Struct, String> {
    let mut fields = std::collections::HashMap::new();
    for (k, v) in m {
        let key = scalar_text(k).ok_or_else(|| format!("a key is {}", kind(k)))?;
        fields.insert(key, pb_value(v)?);
    }
    Ok(Struct { fields })
}

fn pb_value(v: &Value) -> Result<PbValue, String> {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Sequence(items) => {
            Kind::ListValue(ListValue { values: items.iter().map(pb_value).collect::<Result<_, _>>()? })
        }
        Value::Mapping(m) => Kind::StructValue(pb_struct(m)?),
        Value::Tagged(t) => return Err(format!("unsupported tag {}", t.tag)),
    };
    Ok(PbValue { kind: Some(kind) })
}
