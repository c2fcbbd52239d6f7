//! The dynamic metadata of an answer (`--envoy-response-dynamic-metadata`, upstream's
//! `RESPONSE_DYNAMIC_METADATA`), as envoyproxy/ratelimit writes it: the domain, each descriptor
//! (`entries` as `key=value`, its `limit` override, its `hitsAddend`), the request's
//! `hitsAddend`, and the `metadata` of every configured limit that passed, merged.

use std::collections::HashMap;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

/// The answer's metadata for `request`, given the `metadata` of each limit that passed.
pub fn dynamic_metadata<'a>(request: &RateLimitRequest, passed: impl Iterator<Item = &'a Struct>) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request.descriptors.iter().map(|d| Value { kind: Some(Kind::StructValue(descriptor(d))) });
    fields.insert("descriptors".to_owned(), list(descriptors.collect()));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(f64::from(request.hits_addend)));
    }
    let mut merged = Struct::default();
    for m in passed {
        merge(&mut merged, m);
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), Value { kind: Some(Kind::StructValue(merged)) });
    }
    Struct { fields }
}

fn descriptor(d: &RateLimitDescriptor) -> Struct {
    let mut fields = HashMap::new();
    let entries = d.entries.iter().map(|e| string(format!("{}={}", e.key, e.value))).collect();
    fields.insert("entries".to_owned(), list(entries));
    if let Some(limit) = &d.limit {
        let unit = envoy_types::pb::envoy::r#type::v3::RateLimitUnit::try_from(limit.unit)
            .map_or("UNKNOWN", |u| u.as_str_name());
        fields.insert("limit".to_owned(), string(format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit)));
    }
    if let Some(hits) = &d.hits_addend {
        // As a protobuf number, a double: exact up to 2^53.
        fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
    }
    Struct { fields }
}

/// Adds `src`'s fields to `dest`: a field `dest` has already stays, but two maps under one name
/// are merged, recursively.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match (dest.fields.get_mut(k), &v.kind) {
            (None, _) => {
                dest.fields.insert(k.clone(), v.clone());
            }
            (Some(Value { kind: Some(Kind::StructValue(d)) }), Some(Kind::StructValue(s))) => merge(d, s),
            (Some(_), _) => {}
        }
    }
}

fn string(s: String) -> Value {
    Value { kind: Some(Kind::StringValue(s)) }
}

fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

fn list(values: Vec<Value>) -> Value {
    Value { kind: Some(Kind::ListValue(ListValue { values })) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &str) -> Value {
        string(v.to_owned())
    }

    fn map(fields: &[(&str, Value)]) -> Struct {
        Struct { fields: fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect() }
    }

    #[test]
    fn passed_metadata_merges_maps_and_keeps_the_first_value() {
        let a =
            map(&[("name", text("a")), ("tags", Value { kind: Some(Kind::StructValue(map(&[("x", text("1"))]))) })]);
        let b =
            map(&[("name", text("b")), ("tags", Value { kind: Some(Kind::StructValue(map(&[("y", text("2"))]))) })]);
        let request = RateLimitRequest { domain: "d".into(), hits_addend: 3, ..RateLimitRequest::default() };
        let out = dynamic_metadata(&request, [&a, &b].into_iter());
        assert_eq!(out.fields["domain"], text("d"));
        assert_eq!(out.fields["hitsAddend"], number(3.0));
        let Some(Kind::StructValue(merged)) = &out.fields["metadata"].kind else { panic!("a map") };
        assert_eq!(merged.fields["name"], text("a"));
        let Some(Kind::StructValue(tags)) = &merged.fields["tags"].kind else { panic!("a map") };
        let mut keys: Vec<&String> = tags.fields.keys().collect();
        keys.sort();
        assert_eq!(keys, ["x", "y"]);
    }
}
