//! The backend key of a descriptor: the one place it is built.

use std::fmt::Write as _;

/// The backend key of a descriptor (`(key, value)` entries) of `domain`:
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
/// `(domain, entries)`. The descriptor is the Redis Cluster hash tag (`{…}`), so a descriptor's
/// key has the same slot in every domain.
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
    let mut key = String::with_capacity(encoded_len(domain, entries) + 1);
    push_part(&mut key, domain);
    key.push_str(":{");
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        push_part(&mut key, k);
        key.push('=');
        match shared.get(i).copied().flatten() {
            Some(pattern) => {
                key.push('*');
                push_part(&mut key, pattern);
            }
            None => push_part(&mut key, v),
        }
    }
    key.push('}');
    key
}

/// The length in bytes of [`descriptor_key`]'s answer, without building it: a request's key
/// sizes are checked against the limits before anything is copied.
pub(crate) fn encoded_len(domain: &str, entries: &[(&str, &str)]) -> usize {
    let part = |s: &str| digits(s.len()) + 1 + s.len();
    let entries_len: usize = entries.iter().map(|(k, v)| part(k) + 1 + part(v)).sum();
    part(domain) + 2 + entries_len + entries.len().saturating_sub(1) + 1
}

fn push_part(key: &mut String, part: &str) {
    // Writing to a String cannot fail.
    let _ = write!(key, "{}:", part.len());
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
}
