//! Checks of single values that several tables share: durations, Redis URLs, names and
//! failure policies.

use std::time::Duration;

use slidegate::FailurePolicy;
use toml::Spanned;

use super::{INLINE_RULE, Invalid};
use crate::redact::redact;

/// A humantime duration: "500ms", "10s", "1h", "1d".
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Some(d) = whole_seconds_or_ms(text) {
        return Ok(d);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like \"500ms\", \"10s\", \"1h\": {e}"))
}

/// The shapes a check's window nearly always has, "<n>s" and "<n>ms" with at most nine digits,
/// read straight from the digits: the same duration humantime reads from them, for a tenth of
/// its work (every inline check parses its window).
fn whole_seconds_or_ms(text: &str) -> Option<Duration> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 9 {
        return None;
    }
    let n = text[..digits].bytes().fold(0, |n, b| n * 10 + u64::from(b - b'0'));
    match &text[digits..] {
        "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        _ => None,
    }
}

/// Redis URLs are checked for shape only; whether the server answers is checked at start.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    if ["redis://", "rediss://", "unix://"].iter().any(|scheme| url.starts_with(scheme)) {
        Ok(())
    } else {
        // The URL may hold a password (`http://user:secret@host`): never echo it.
        Err(format!("{:?} is not a redis:// URL", redact(url)))
    }
}

/// Rule and tier names appear in Redis keys and headers: keep them plain.
pub(super) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        return Err(format!("{name:?} may use only letters, digits, `_`, `-` and `.`"));
    }
    if name == INLINE_RULE {
        return Err(format!("{name:?} is reserved for inline checks"));
    }
    Ok(())
}

/// A `failure_policy` (with `local_share` beside it for `local`) under `table`, if set.
pub(super) fn failure_policy(
    policy: Option<&Spanned<String>>,
    share: Option<&Spanned<f64>>,
    table: &str,
) -> Result<Option<FailurePolicy>, Invalid> {
    let policy_field = || format!("{table}.failure_policy");
    let share_field = || format!("{table}.local_share");
    let Some(policy) = policy else {
        return match share {
            Some(s) => Err(Invalid::new(share_field(), s.span(), "needs failure_policy = \"local\"")),
            None => Ok(None),
        };
    };
    let parsed = match (policy.get_ref().as_str(), share) {
        ("fail_open", None) => FailurePolicy::FailOpen,
        ("fail_closed", None) => FailurePolicy::FailClosed,
        ("local", Some(s)) => {
            FailurePolicy::local(*s.get_ref()).map_err(|e| Invalid::new(share_field(), s.span(), e.to_string()))?
        }
        ("local", None) => {
            return Err(Invalid::new(policy_field(), policy.span(), "\"local\" needs local_share (e.g. 0.25)"));
        }
        ("fail_open" | "fail_closed", Some(s)) => {
            return Err(Invalid::new(share_field(), s.span(), "applies to failure_policy = \"local\" only"));
        }
        (other, _) => {
            let message = format!("{other:?} is not one of \"fail_open\", \"fail_closed\", \"local\"");
            return Err(Invalid::new(policy_field(), policy.span(), message));
        }
    };
    Ok(Some(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_and_ms_read_as_humantime_reads_them() {
        let mut texts: Vec<String> =
            ["0s", "1s", "10s", "60s", "007s", "500ms", "999999999s", "999999999ms"].map(Into::into).to_vec();
        texts.extend((0..2_000u64).flat_map(|i| [format!("{}s", i * 7919), format!("{}ms", i * 104_729)]));
        for text in &texts {
            assert_eq!(whole_seconds_or_ms(text), humantime::parse_duration(text).ok(), "{text}");
        }
        for text in ["", "s", "ms", "10", "10 s", "1000000000s", "10sec", "-1s", "1.5s", "10m", "1h"] {
            assert_eq!(whole_seconds_or_ms(text), None, "{text}");
        }
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }
}
