//! The names keys take in a backend: a rule's key, `<rule>:{<key>}`, built here for every
//! surface (the service's HTTP API and CLI, the tower layer, the Envoy service), and
//! [`hash_tag`], for a library caller's own keys that must share a Redis Cluster slot.
//!
//! # A rule's key
//!
//! ```text
//! <rule>:{<key>}
//! ```
//!
//! `rule` is the rule's name (in the Envoy service, `<len>:<domain>`), `key` what the request is
//! counted as, byte for byte. The format is stored data: the Redis keys of a running deployment
//! are these names (under the backend's prefix, `slidegate:sms:{192.168.1.100}`), so it never
//! changes.
//!
//! - **One name per (rule, key)** when `rule` holds no `{` (rule names are
//!   `[A-Za-z0-9_.-]`; an Envoy domain that holds one is refused): the first `{` is then the one
//!   written after the rule, so the name reads back into exactly one rule and one key, whatever
//!   the key holds — `{`, `}` and `:` included.
//! - **One slot per key**: the braces make the key the Redis Cluster hash tag (up to its first
//!   `}`), so every rule's name of one key is in one slot and a multi-limit check over them is
//!   one script. A key that begins with `}` has an empty tag; Redis then hashes the whole name.
//!
//! A key of several parts (the tower layer's pairs, a forward-auth rule's `key = [...]`) joins
//! them with `|`, each but the last escaped by [`escape_separators`].
//!
//! [`hash_tag`] builds the other order, `{tag}:name`: there the caller chooses the tag (a user
//! id) and names several limits under it.

use std::fmt;

/// The backend key of `key` under `rule`: `<rule>:{<key>}` (see [the module](self)).
///
/// ```
/// assert_eq!(slidegate::rule_key("sms", "192.168.1.100"), "sms:{192.168.1.100}");
/// ```
pub fn rule_key(rule: &str, key: &str) -> String {
    let mut name = RuleKey::new(rule, key.len());
    name.key_mut().push_str(key);
    name.finish()
}

/// A rule's backend key built in place, for a surface that writes the key straight into it (the
/// tower layer's key extractors, the Envoy service's descriptor encoding): the same bytes as
/// [`rule_key`], without a copy of the key.
///
/// ```
/// use slidegate::RuleKey;
///
/// let mut name = RuleKey::new("search", 16);
/// name.key_mut().push_str("user-7");
/// assert_eq!(name.finish(), "search:{user-7}");
/// ```
pub struct RuleKey {
    name: String,
}

impl RuleKey {
    /// Starts `rule`'s name, with room for `key_len` bytes of key.
    #[inline]
    pub fn new(rule: &str, key_len: usize) -> Self {
        let mut name = String::with_capacity(rule.len() + key_len + 3);
        name.push_str(rule);
        name.push_str(":{");
        Self { name }
    }

    /// The name so far, to append the key to. Append only: it begins with the rule's part.
    #[inline]
    pub fn key_mut(&mut self) -> &mut String {
        &mut self.name
    }

    /// The finished name.
    #[inline]
    pub fn finish(mut self) -> String {
        self.name.push('}');
        self.name
    }
}

impl fmt::Debug for RuleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RuleKey").field(&self.name).finish()
    }
}

/// Escapes `|` and `\\` in `out[from..]` (one part of a key whose parts are joined by `|`)
/// with a `\\`: the first unescaped `|` then ends a part, so a caller who controls one part
/// cannot land on another list's key (`x|y` + `z` is `x\|y|z`, not `x` + `y|z`). The common
/// part has neither and is left as it is.
pub fn escape_separators(out: &mut String, from: usize) {
    if out[from..].contains(['|', '\\']) {
        let part = out.split_off(from);
        for c in part.chars() {
            if c == '|' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
}

/// `{tag}:name`: a key whose Cluster slot is decided by `tag` alone, so every key made with the
/// same tag lives in one slot and can be checked together atomically.
///
/// ```
/// use slidegate::{hash_tag, key_slot};
///
/// let sms = hash_tag("user:42", "sms");
/// assert_eq!(sms, "{user:42}:sms");
/// assert_eq!(key_slot(&sms), key_slot(&hash_tag("user:42", "login")));
/// ```
pub fn hash_tag(tag: &str, name: &str) -> String {
    let mut key = String::with_capacity(tag.len() + name.len() + 3);
    for part in ["{", tag, "}:", name] {
        key.push_str(part);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_slot;

    #[test]
    fn a_rule_key_is_rule_colon_brace_key_brace() {
        // Stored data: these are the Redis keys of running deployments (under the prefix).
        assert_eq!(rule_key("sms", "192.168.1.100"), "sms:{192.168.1.100}");
        assert_eq!(rule_key("inline", "user_1001"), "inline:{user_1001}");
        assert_eq!(rule_key("4:edge", "4:user=5:alice"), "4:edge:{4:user=5:alice}");
        assert_eq!(rule_key("a", "x}:{y"), "a:{x}:{y}");
        let mut built = RuleKey::new("login", 0);
        built.key_mut().push_str("10.0.0.1");
        assert_eq!(built.finish(), rule_key("login", "10.0.0.1"));
    }

    #[test]
    fn keys_with_braces_and_colons_never_take_another_rules_name() {
        // Rules as the surfaces name them (no `{`), keys as hostile callers choose them.
        let rules = ["a", "a.b", "a-", "5", "4:edge", "3:api", "a:"];
        let keys = ["b", "", "}", "{", ":", "b}", "{b", "b:{c", "}:{", "a:{b}", ":{a}", "edge:{x", "{x}"];
        let mut names = std::collections::HashMap::new();
        for rule in rules {
            for key in keys {
                if let Some(earlier) = names.insert(rule_key(rule, key), (rule, key)) {
                    panic!("{rule:?} {key:?} and {earlier:?} share {:?}", rule_key(rule, key));
                }
            }
        }
        // The precondition is needed: a `{` in a rule lets two pairs meet.
        assert_eq!(rule_key("5:{x", "y"), rule_key("5", "x:{y"));
    }

    #[test]
    fn every_rule_of_a_key_shares_its_slot() {
        for key in ["192.168.1.100", "user:42", "a}b", "{x}"] {
            assert_eq!(key_slot(rule_key("sms", key)), key_slot(rule_key("login", key)), "{key:?}");
        }
        // An empty tag: Redis hashes the whole name, rule and all.
        assert_ne!(key_slot(rule_key("sms", "}x")), key_slot(rule_key("login", "}x")));
    }
}
