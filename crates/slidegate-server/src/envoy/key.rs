//! The backend key of a descriptor: the one place it is built.

use slidegate::RuleKey;

/// The backend key of a descriptor (`(key, value)` entries) of `domain`: a rule's key
/// ([`slidegate::rule_key`], `<rule>:{<key>}`) whose rule is the domain and whose key is the
/// descriptor:
///
/// ```text
/// <len>:<domain>:{<len>:<key>=<len>:<value>,<len>:<key>=<len>:<value>,…}
/// ```
///
/// Every part — the domain, each entry's key and each entry's value — is written as its length
/// in bytes (decimal), a colon, and its bytes as they are. Descriptor values come from request
/// headers and may hold any byte, `.`, `_`, `,`, `=` and `}` included; the length prefix is what
/// keeps two different descriptors apart (`[("user", "alice.path_/x")]` and
/// `[("user", "alice"), ("path", "/x")]` are `4:edge:{4:user=12:alice.path_/x}` and
/// `4:edge:{4:user=5:alice,4:path=2:/x}`): the key can be read back into exactly one
/// `(domain, entries)`. A configured domain holds no `{` (the configuration refuses it), so no
/// descriptor's key is the key of a rule of the rules file either, and the descriptor is the
/// Redis Cluster hash tag: a descriptor's key has the same slot in every domain.
///
/// ```
/// use slidegate_server::envoy::descriptor_key;
///
/// assert_eq!(descriptor_key("edge", &[("user", "alice")]), "4:edge:{4:user=5:alice}");
/// ```
pub fn descriptor_key(domain: &str, entries: &[(&str, &str)]) -> String {
    shared_descriptor_key(domain, entries, &[])
}

/// [`descriptor_key`] for a descriptor whose entry `i` matched a `share_threshold` wildcard
/// (`shared[i]`, the pattern's text): all values matching it share one key, where the value's
/// place holds `*` and the pattern, `*<len>:<pattern>`. A value's part always starts with a
/// digit, so no value — not even one spelt like the pattern — reaches a shared key.
///
/// ```
/// use slidegate_server::envoy::key::shared_descriptor_key;
///
/// assert_eq!(shared_descriptor_key("d", &[("path", "/a/b")], &[Some("/a/*")]), "1:d:{4:path=*4:/a/*}");
/// ```
pub fn shared_descriptor_key(domain: &str, entries: &[(&str, &str)], shared: &[Option<&str>]) -> String {
    let mut rule = String::with_capacity(part_len(domain));
    push_part(&mut rule, domain);
    let mut key = RuleKey::new(&rule, descriptor_len(entries) + 1);
    let out = key.key_mut();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_part(out, k);
        out.push('=');
        match shared.get(i).copied().flatten() {
            Some(pattern) => {
                out.push('*');
                push_part(out, pattern);
            }
            None => push_part(out, v),
        }
    }
    key.finish()
}

/// The length in bytes of [`descriptor_key`]'s answer, without building it: a request's key
/// sizes are checked against the limits before anything is copied.
pub(crate) fn encoded_len(domain: &str, entries: &[(&str, &str)]) -> usize {
    // `<rule>:{` … `}`
    part_len(domain) + 2 + descriptor_len(entries) + 1
}

/// The length of the entries' part, between the braces.
fn descriptor_len(entries: &[(&str, &str)]) -> usize {
    let entries_len: usize = entries.iter().map(|(k, v)| part_len(k) + 1 + part_len(v)).sum();
    entries_len + entries.len().saturating_sub(1)
}

/// The length of `part` written by [`push_part`].
fn part_len(part: &str) -> usize {
    digits(part.len()) + 1 + part.len()
}

fn push_part(key: &mut String, part: &str) {
    key.push_str(itoa::Buffer::new().format(part.len()));
    key.push(':');
    key.push_str(part);
}

/// The number of decimal digits of `n`.
fn digits(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_is_known_before_the_key_is_built() {
        let long = "v".repeat(1_000);
        let cases: [&[(&str, &str)]; 5] = [
            &[],
            &[("", "")],
            &[("user", "alice")],
            &[("user", "alice"), ("path", "/x"), ("k", &long)],
            &[("123456789", "0123456789")],
        ];
        for entries in cases {
            for domain in ["", "edge", "a-domain-of-ten-or-more-bytes"] {
                assert_eq!(encoded_len(domain, entries), descriptor_key(domain, entries).len(), "{entries:?}");
            }
        }
    }

    #[test]
    fn different_descriptors_never_share_a_key() {
        let lists: [(&str, &[(&str, &str)]); 10] = [
            ("edge", &[("user", "alice.path_/x")]),
            ("edge", &[("user", "alice"), ("path", "/x")]),
            ("edge", &[("user_alice", "path_/x")]),
            ("edge", &[("user", "alice,4:path=2:/x")]),
            ("edge", &[("user", "5:alice"), ("path", "/x")]),
            ("edge", &[("user", "")]),
            ("edge", &[("user", ""), ("", "")]),
            ("edge", &[]),
            ("edge:{4", &[("user", "alice")]),
            ("edg", &[("e", "user")]),
        ];
        let shared = shared_descriptor_key("edge", &[("user", "alice.path_/x")], &[Some("alice*")]);
        assert!(lists.iter().all(|(d, e)| descriptor_key(d, e) != shared), "{shared}");
        for (i, (d1, e1)) in lists.iter().enumerate() {
            for (d2, e2) in &lists[i + 1..] {
                assert_ne!(descriptor_key(d1, e1), descriptor_key(d2, e2), "{d1} {e1:?} / {d2} {e2:?}");
            }
        }
    }

    #[test]
    fn no_descriptor_key_is_a_rules_file_rules_key() {
        // A name's rule part is what stands before its first `{`, when no rule part holds one.
        // A rules-file name holds no `:`; a descriptor key's rule part, `<len>:<domain>`, does.
        for (domain, entries) in [("edge", &[("user", "alice")][..]), ("5", &[("{", "}")]), ("a:b", &[])] {
            let key = descriptor_key(domain, entries);
            let brace = key.find('{').expect("a hash tag");
            assert!(key[..brace - 1].contains(':'), "{key}");
        }
        // A `{` in the domain — refused by the configuration — would let an HTTP caller, who
        // chooses the key of a rules-file rule named `5`, count on Envoy's descriptor.
        let forged = slidegate::rule_key("5", "edge:{4:user=5:alice");
        assert_eq!(descriptor_key("{edge", &[("user", "alice")]), forged);
    }
}
