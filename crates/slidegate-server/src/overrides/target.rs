//! What an admin route's `{rule}/{key}` names: a key of a named rule (`api` / `customer-42`),
//! or a descriptor of an Envoy domain (`envoy:edge` / `user=alice,path=/x`: the descriptor's
//! entries in order, `\` escaping a `\`, `,` or `=` inside a key or value). Rule names hold no
//! `:`, so `envoy:` cannot be a rule's.

use slidegate::Quota;

use crate::config::Rules;
use crate::envoy::key::shared_descriptor_key;
use crate::envoy::{EnvoyConfig, MAX_ENTRIES, descriptor_key};

/// The `{rule}` prefix of an Envoy domain's descriptors.
pub const ENVOY_PREFIX: &str = "envoy:";

/// Why a `{rule}/{key}` names nothing an override can apply to.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The key is empty or over [`slidegate::MAX_KEY_LEN`] bytes.
    #[error(transparent)]
    Key(#[from] slidegate::Error),
    /// A key that fits [`slidegate::MAX_KEY_LEN`] alone but not inside its rule's backend key
    /// (`<rule>:{<key>}`): no check could ever use it.
    #[error(
        "a key of rule {rule:?} is checked as `{rule}:{{<key>}}`, at most {max} bytes: the key may be at most {room} bytes",
        max = slidegate::MAX_KEY_LEN
    )]
    KeyTooLongForRule {
        /// The rule.
        rule: String,
        /// The longest key the rule's backend key has room for.
        room: usize,
    },
    /// An Envoy descriptor that cannot be read, or is over the Envoy service's bounds.
    #[error("{0}")]
    Descriptor(String),
    /// No such rule (or Envoy domain).
    #[error("no rule {0:?}")]
    UnknownRule(String),
    /// The rule has no such tier.
    #[error("rule {rule:?} has no tier {tier:?}")]
    UnknownTier {
        /// The rule.
        rule: String,
        /// The tier asked for.
        tier: String,
    },
    /// The Envoy configuration has no limit for this descriptor.
    #[error("no limit of domain {domain:?} applies to the descriptor {key:?}")]
    UnknownDescriptor {
        /// The domain.
        domain: String,
        /// The descriptor, as named.
        key: String,
    },
    /// The descriptor's limit is `unlimited` or `requests_per_unit: 0`: no quota to change.
    #[error("the descriptor's limit is unlimited or blocks everything: it has no quota to change")]
    NoQuota,
    /// An Envoy descriptor whose value matches a `share_threshold` wildcard: every value that
    /// matches shares one counter, which is no one key's to override.
    #[error(
        "the descriptor's value matches the share_threshold wildcard {pattern:?}: every matching value shares one \
         counter, which an override of one key cannot change; change the descriptor's limit in the Envoy configuration"
    )]
    Shared {
        /// The wildcard.
        pattern: String,
    },
    /// A tier asked of an Envoy descriptor.
    #[error("Envoy descriptors have no tiers")]
    TierOfDescriptor,
}

/// A key that an admin route names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A key of a named rule.
    Rule {
        /// The rule.
        rule: String,
        /// The key.
        key: String,
    },
    /// A descriptor of an Envoy domain.
    Descriptor {
        /// The domain.
        domain: String,
        /// The descriptor's entries, in order.
        entries: Vec<(String, String)>,
    },
}

/// Where the quota under a key (before any override) comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The rule's own quota.
    Rule,
    /// One of its tiers.
    Tier(String),
    /// The Envoy configuration's limit for the descriptor.
    Descriptor,
}

impl Target {
    /// Reads `{rule}/{key}`, checking sizes only: the rule need not exist (an override of a
    /// rule since removed can still be deleted).
    pub fn parse(rule: &str, key: &str) -> Result<Self, TargetError> {
        let Some(domain) = rule.strip_prefix(ENVOY_PREFIX) else {
            slidegate::validate_key(key)?;
            if rule.len() > 64 {
                return Err(TargetError::UnknownRule(rule.chars().take(64).collect()));
            }
            // `<rule>:{<key>}`: the rule, three bytes, the key.
            let room = slidegate::MAX_KEY_LEN - rule.len() - 3;
            if key.len() > room {
                return Err(TargetError::KeyTooLongForRule { rule: rule.to_owned(), room });
            }
            return Ok(Self::Rule { rule: rule.to_owned(), key: key.to_owned() });
        };
        if domain.is_empty() {
            return Err(TargetError::UnknownRule(rule.to_owned()));
        }
        if key.len() > slidegate::MAX_KEY_LEN {
            return Err(slidegate::Error::KeyTooLong { len: key.len() }.into());
        }
        let entries = parse_entries(key)?;
        let borrowed: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if crate::envoy::key::encoded_len(domain, &borrowed) > slidegate::MAX_KEY_LEN {
            let message = format!("the descriptor's key is over {} bytes", slidegate::MAX_KEY_LEN);
            return Err(TargetError::Descriptor(message));
        }
        Ok(Self::Descriptor { domain: domain.to_owned(), entries })
    }

    /// The `{rule}` that names it.
    pub fn rule(&self) -> String {
        match self {
            Self::Rule { rule, .. } => rule.clone(),
            Self::Descriptor { domain, .. } => format!("{ENVOY_PREFIX}{domain}"),
        }
    }

    /// The `{key}` that names it, canonical: an Envoy descriptor escaped only where needed.
    pub fn key(&self) -> String {
        match self {
            Self::Rule { key, .. } => key.clone(),
            Self::Descriptor { entries, .. } => {
                let escape = |s: &str| s.replace('\\', "\\\\").replace(',', "\\,").replace('=', "\\=");
                entries.iter().map(|(k, v)| format!("{}={}", escape(k), escape(v))).collect::<Vec<_>>().join(",")
            }
        }
    }

    /// The backend key its state lives under, which its override is found by: what the HTTP
    /// API or the Envoy service decides.
    pub fn backend_key(&self) -> String {
        match self {
            Self::Rule { rule, key } => slidegate::rule_key(rule, key),
            Self::Descriptor { domain, entries } => {
                let borrowed: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                descriptor_key(domain, &borrowed)
            }
        }
    }

    /// The backend key the Envoy service counts it under: [`Target::backend_key`], except for
    /// a descriptor whose value matched a `share_threshold` wildcard of `envoy`, which counts
    /// under the key every matching value shares.
    pub fn counted_key(&self, envoy: &EnvoyConfig) -> String {
        match self.shared(envoy) {
            Some((key, _)) => key,
            None => self.backend_key(),
        }
    }

    /// Refuses a descriptor that counts under a shared key ([`Target::counted_key`]): an
    /// override is one key's.
    pub fn own_counter(&self, envoy: &EnvoyConfig) -> Result<(), TargetError> {
        self.shared(envoy).map_or(Ok(()), |(_, pattern)| Err(TargetError::Shared { pattern }))
    }

    /// For a descriptor counted under a shared key: that key and the (first) wildcard.
    fn shared(&self, envoy: &EnvoyConfig) -> Option<(String, String)> {
        let Self::Descriptor { domain, entries } = self else { return None };
        let borrowed: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let found = envoy.lookup(domain, &borrowed)?;
        let pattern = found.shared.iter().flatten().next()?;
        Some((shared_descriptor_key(domain, &borrowed, &found.shared), (*pattern).to_owned()))
    }

    /// The quota it has before any override, and where that comes from: the rule (its `tier`,
    /// when given) in `rules`, or the descriptor's limit in `envoy`.
    pub fn base(&self, rules: &Rules, envoy: &EnvoyConfig, tier: Option<&str>) -> Result<(Quota, Source), TargetError> {
        match self {
            Self::Rule { rule, .. } => {
                let r = rules.get(rule).ok_or_else(|| TargetError::UnknownRule(rule.clone()))?;
                let unknown_tier = |tier: &str| TargetError::UnknownTier { rule: rule.clone(), tier: tier.to_owned() };
                match tier {
                    None => Ok((r.quota, Source::Rule)),
                    Some(t) => {
                        r.quota_for(Some(t)).map(|q| (q, Source::Tier(t.to_owned()))).ok_or_else(|| unknown_tier(t))
                    }
                }
            }
            Self::Descriptor { domain, entries } => {
                if tier.is_some() {
                    return Err(TargetError::TierOfDescriptor);
                }
                let borrowed: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let limit = envoy
                    .find(domain, &borrowed)
                    .and_then(|n| n.limit.as_ref())
                    .ok_or_else(|| TargetError::UnknownDescriptor { domain: domain.clone(), key: self.key() })?;
                let quota = limit.quota.filter(|_| !limit.unlimited).ok_or(TargetError::NoQuota)?;
                Ok((quota, Source::Descriptor))
            }
        }
    }
}

/// `k=v,k2=v2`, with `\` escaping the next character, as at most [`MAX_ENTRIES`] entries.
fn parse_entries(text: &str) -> Result<Vec<(String, String)>, TargetError> {
    let mut entries = Vec::new();
    let (mut part, mut key) = (String::new(), None);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped) => part.push(escaped),
                None => return Err(TargetError::Descriptor("the descriptor ends in a lone `\\`".into())),
            },
            '=' if key.is_none() => key = Some(std::mem::take(&mut part)),
            ',' => push_entry(&mut entries, key.take(), std::mem::take(&mut part))?,
            c => part.push(c),
        }
    }
    push_entry(&mut entries, key, part)?;
    Ok(entries)
}

/// Adds the entry `key=value` (no key: no `=` was written).
fn push_entry(entries: &mut Vec<(String, String)>, key: Option<String>, value: String) -> Result<(), TargetError> {
    let Some(key) = key else {
        let message = format!("descriptor entry {value:?} has no `=`: write entries as key=value,key=value");
        return Err(TargetError::Descriptor(message));
    };
    if entries.len() == MAX_ENTRIES {
        return Err(TargetError::Descriptor(format!("a descriptor has at most {MAX_ENTRIES} entries")));
    }
    entries.push((key, value));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(key: &str) -> Result<Vec<(String, String)>, TargetError> {
        match Target::parse("envoy:edge", key)? {
            Target::Descriptor { entries, .. } => Ok(entries),
            other => panic!("{other:?}"),
        }
    }

    fn entries(key: &str) -> Option<Vec<(String, String)>> {
        descriptor(key).ok()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn descriptors_read_back_as_written_and_escapes_keep_them_apart() {
        assert_eq!(entries("user=alice"), Some(pairs(&[("user", "alice")])));
        assert_eq!(entries("user=alice,path=/x"), Some(pairs(&[("user", "alice"), ("path", "/x")])));
        assert_eq!(entries("user=a\\,path\\=/x"), Some(pairs(&[("user", "a,path=/x")])));
        assert_eq!(entries("user="), Some(pairs(&[("user", "")])));
        assert_eq!(entries("k=v=w"), Some(pairs(&[("k", "v=w")])), "only the first `=` separates");
        for bad in ["", "user", "user=a,", "user=a,path", "a=b\\"] {
            assert!(matches!(descriptor(bad), Err(TargetError::Descriptor(_))), "{bad:?}");
        }
        let many = vec!["k=v"; MAX_ENTRIES + 1].join(",");
        assert!(matches!(descriptor(&many), Err(TargetError::Descriptor(_))));
        for key in ["user=alice", "user=a\\,path\\=/x", "a\\\\b=c"] {
            let target = Target::parse("envoy:edge", key).expect("valid");
            assert_eq!(Target::parse("envoy:edge", &target.key()).ok(), Some(target.clone()), "{key}");
        }
        let escaped = Target::parse("envoy:edge", "user=\\a").expect("valid");
        assert_eq!(escaped.key(), "user=a", "one canonical form");
    }

    #[test]
    fn sizes_are_bounded_before_anything_is_built() {
        let long = "k".repeat(slidegate::MAX_KEY_LEN + 1);
        assert!(matches!(Target::parse("api", &long), Err(TargetError::Key(_))));
        let room = slidegate::MAX_KEY_LEN - "api:{}".len();
        assert!(Target::parse("api", &"k".repeat(room)).is_ok_and(|t| t.backend_key().len() == slidegate::MAX_KEY_LEN));
        let over = Target::parse("api", &"k".repeat(room + 1));
        assert!(matches!(over, Err(TargetError::KeyTooLongForRule { room: 506, .. })), "{over:?}");
        assert!(matches!(Target::parse("api", ""), Err(TargetError::Key(_))));
        assert!(matches!(Target::parse("envoy:edge", &format!("k={long}")), Err(TargetError::Key(_))));
        let near = format!("k={}", "v".repeat(slidegate::MAX_KEY_LEN - 4));
        assert!(matches!(Target::parse("envoy:edge", &near), Err(TargetError::Descriptor(_))), "the encoded key");
        assert!(matches!(Target::parse("envoy:", "k=v"), Err(TargetError::UnknownRule(_))));
        let rule = Target::parse("api", "customer-42").expect("valid");
        assert_eq!((rule.rule(), rule.backend_key()), ("api".to_owned(), "api:{customer-42}".to_owned()));
        let envoy = Target::parse("envoy:edge", "user=alice").expect("valid");
        assert_eq!(
            (envoy.rule(), envoy.backend_key()),
            ("envoy:edge".to_owned(), "4:edge:{4:user=5:alice}".to_owned())
        );
    }
}
