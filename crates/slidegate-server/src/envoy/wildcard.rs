//! Wildcard descriptor values: a `*` anywhere in a configured value stands for any run of
//! characters, the empty one included (`foo*`, `bar*b`, `foo*bar*baz`, `*`), as
//! envoyproxy/ratelimit matches them.

/// A configured value with at least one `*`, split on `*` once, when the file is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The literal runs between the stars: `foo*bar*baz` is `["foo", "bar", "baz"]`, `foo*` is
    /// `["foo", ""]`. Always at least two.
    parts: Vec<String>,
}

impl Pattern {
    /// The pattern of `value`, or `None` when it holds no `*` (an exact value).
    pub fn new(value: &str) -> Option<Self> {
        value.contains('*').then(|| Self { parts: value.split('*').map(str::to_owned).collect() })
    }

    /// Whether `value` matches: it starts with the first run, ends with the last, and holds the
    /// runs between in order, apart.
    ///
    /// Each middle run is found at its leftmost place after the previous one, and the search
    /// never goes back: a leftmost match leaves the most room for the runs after it, so when
    /// any placement fits this one does. The work is one forward scan of `value` per run with
    /// `str::find` (linear in the text it scans), so a hostile pattern like `*a*a*a*…` against
    /// a value of 512 `a`s and a `b` costs a few thousand comparisons, never the exponential
    /// backtracking of a naive glob.
    pub fn matches(&self, value: &str) -> bool {
        let (first, last) = (&self.parts[0], &self.parts[self.parts.len() - 1]);
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn matches(pattern: &str, value: &str) -> bool {
        Pattern::new(pattern).expect("a wildcard").matches(value)
    }

    #[test]
    fn a_star_matches_any_run_anywhere_the_empty_one_included() {
        let cases = [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("foo*", "xfoo", false),
            ("*foo", "barfoo", true),
            ("*foo", "foobar", false),
            ("bar*b", "barb", true),
            ("bar*b", "bar/xyz/b", true),
            ("bar*b", "bar", false),
            ("bar*b", "barbx", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foobaz", false),
            ("foo*bar*baz", "foo1baz2bar", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("*", "anything", true),
            ("**", "x", true),
            ("a**b", "ab", true),
            ("*x*", "abc", false),
            ("*x*", "axc", true),
        ];
        for (pattern, value, expected) in cases {
            assert_eq!(matches(pattern, value), expected, "{pattern} ~ {value}");
        }
        assert_eq!(Pattern::new("exact"), None);
    }

    #[test]
    fn many_stars_against_a_long_near_miss_take_linear_time() {
        // The attack on backtracking globs: every `*` could take any length, and the value
        // fails only at its last byte.
        let value = format!("{}b", "a".repeat(slidegate::MAX_KEY_LEN));
        for stars in [16, 64, 256] {
            // Starts and ends as the value does, so only the runs between can fail it.
            let pattern = format!("{}*c*b", "*a".repeat(stars));
            let started = Instant::now();
            for _ in 0..1_000 {
                assert!(!matches(&pattern, &value));
            }
            assert!(started.elapsed() < Duration::from_secs(5), "{stars} stars: {:?}", started.elapsed());
        }
        assert!(matches(&"*a".repeat(256), &"a".repeat(512)));
    }
}
