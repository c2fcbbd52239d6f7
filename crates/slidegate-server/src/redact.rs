//! Passwords out of logs and answers: every text that may hold a Redis URL (a startup line, a
//! connect error, a configuration error, `/readyz`'s detail, an error answer) passes through
//! [`redact`] before anyone sees it.

use std::borrow::Cow;

/// What a password is replaced with.
const MASK: &str = "***";

/// `text` with the password of every URL in it replaced by `***`:
/// `redis://user:secret@host` → `redis://user:***@host`, `redis://:secret@host` →
/// `redis://:***@host`.
///
/// A URL's credentials end at the last `@` before the next whitespace, so a password that holds
/// `/`, `@` or `,` (unescaped) is masked whole; what is masked in excess (a `:` and `@` in a path,
/// a comma-joined list of URLs) is only ever more than the password, never less. A text without
/// credentials is returned as is, without a copy.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + "://".len();
        let end = text[start..].find(char::is_whitespace).map_or(text.len(), |i| start + i);
        let chunk = &text[start..end];
        // The password: from the first `:` of the credentials to their last `@`.
        let at = chunk.rfind('@');
        if let Some((colon, at)) = at.and_then(|at| chunk[..at].find(':').map(|colon| (colon, at))) {
            out.push_str(&text[copied..start + colon + 1]);
            out.push_str(MASK);
            copied = start + at;
        }
        from = end;
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_masked_and_everything_else_kept() {
        let cases = [
            ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
            ("redis://:secret@host", "redis://:***@host"),
            ("rediss://u:p%40ss@h", "rediss://u:***@h"),
            ("connecting the backend (redis://a:pw@h1:1)", "connecting the backend (redis://a:***@h1:1)"),
            ("\"redis://a:pw@h\" is not a redis:// URL", "\"redis://a:***@h\" is not a redis:// URL"),
            ("redis://a:x@y@h, then redis://b:z@h2", "redis://a:***@h, then redis://b:***@h2"),
            ("redis://a:p/w@h", "redis://a:***@h"),
            ("redis://a:1@h1,redis://b:2@h2", "redis://a:***@h2"),
        ];
        for (text, want) in cases {
            assert_eq!(redact(text), want, "{text}");
        }
    }

    #[test]
    fn a_text_without_credentials_is_not_copied() {
        for text in ["redis://host:6379", "redis://user@host", "no URL here", "unix:///tmp/redis.sock", "a://"] {
            assert!(matches!(redact(text), std::borrow::Cow::Borrowed(t) if t == text), "{text}");
        }
    }
}
