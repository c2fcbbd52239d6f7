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

/// `local_share` as written: a share of the limit, or `"auto"` (the limit ÷ the fleet's live
/// instances, counted in Redis).
#[derive(serde::Deserialize, Debug, Clone)]
#[serde(untagged)]
pub(super) enum LocalShare {
    Share(f64),
    Named(String),
}

/// A table's failure policy fields as written: `failure_policy`, and beside it for `local`,
/// `local_share` and (for `local_share = "auto"`) `local_share_fallback`.
#[derive(Clone, Copy)]
pub(super) struct PolicyFields<'a> {
    pub policy: Option<&'a Spanned<String>>,
    pub share: Option<&'a Spanned<LocalShare>>,
    pub fallback: Option<&'a Spanned<f64>>,
}

/// A `failure_policy` under `table`, if set.
pub(super) fn failure_policy(fields: PolicyFields<'_>, table: &str) -> Result<Option<FailurePolicy>, Invalid> {
    let policy_field = || format!("{table}.failure_policy");
    let share_field = || format!("{table}.local_share");
    let fallback_field = || format!("{table}.local_share_fallback");
    let auto = matches!(fields.share.map(Spanned::get_ref), Some(LocalShare::Named(n)) if n == "auto");
    if let (Some(f), false) = (fields.fallback, auto) {
        return Err(Invalid::new(fallback_field(), f.span(), "applies to local_share = \"auto\" only"));
    }
    let Some(policy) = fields.policy else {
        return match fields.share {
            Some(s) => Err(Invalid::new(share_field(), s.span(), "needs failure_policy = \"local\"")),
            None => Ok(None),
        };
    };
    let parsed = match (policy.get_ref().as_str(), fields.share) {
        ("fail_open", None) => FailurePolicy::FailOpen,
        ("fail_closed", None) => FailurePolicy::FailClosed,
        ("local", Some(s)) => local(s, fields.fallback, &share_field, &fallback_field)?,
        ("local", None) => {
            return Err(Invalid::new(
                policy_field(),
                policy.span(),
                "\"local\" needs local_share (e.g. 0.25, or \"auto\")",
            ));
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

/// The policy `local` at `share` (a number, or `"auto"` with its `fallback`).
fn local(
    share: &Spanned<LocalShare>,
    fallback: Option<&Spanned<f64>>,
    share_field: &dyn Fn() -> String,
    fallback_field: &dyn Fn() -> String,
) -> Result<FailurePolicy, Invalid> {
    match share.get_ref() {
        LocalShare::Share(s) => {
            FailurePolicy::local(*s).map_err(|e| Invalid::new(share_field(), share.span(), e.to_string()))
        }
        LocalShare::Named(n) if n == "auto" => {
            let Some(f) = fallback else {
                let message =
                    "\"auto\" needs local_share_fallback: the share while the fleet has never been counted (e.g. 0.25)";
                return Err(Invalid::new(share_field(), share.span(), message));
            };
            FailurePolicy::local_auto(*f.get_ref()).map_err(|e| Invalid::new(fallback_field(), f.span(), e.to_string()))
        }
        LocalShare::Named(n) => {
            let message = format!("{n:?} is neither a share of the limit (e.g. 0.25) nor \"auto\"");
            Err(Invalid::new(share_field(), share.span(), message))
        }
    }
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
