//! The rules document: a rules file of `[[rules]]` and `[inline]` only, the part of the
//! configuration that instances share. Everything else — the admin token, the backend, the
//! listener — stays local to each instance.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::IgnoredAny;
use toml::Spanned;

use super::StoredRules;
use crate::config::{Config, ConfigError, line_column};
pub use crate::config::{MAX_DOCUMENT_BYTES, local_only};

/// A rules file that `slidegate rules push` refuses.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Not a valid rules file: the error `serve` would give.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Over [`MAX_DOCUMENT_BYTES`].
    #[error("{path}: {len} bytes, over the {MAX_DOCUMENT_BYTES} a rules document may have")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        len: usize,
    },
    /// A setting that is not shared.
    #[error(
        "{path}:{line}:{column}: {field}: stays local to each instance (its flags, environment or \
         own --config): push a file of [[rules]] and [inline] only"
    )]
    Local {
        /// The file.
        path: String,
        /// 1-based line of the setting.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The setting.
        field: String,
    },
}

/// `config` (the file at `path`), refused when the rules come from Redis (`from_redis`) and
/// it has rules of its own.
pub fn check_local(config: Config, from_redis: bool, path: &Path) -> Result<Config, ConfigError> {
    if from_redis && !local_only(&config.rules, &config.inline) {
        return Err(ConfigError::RulesFromRedis { path: path.display().to_string() });
    }
    Ok(config)
}

/// Validates `text` (the file at `path`) as `serve` would, then refuses a setting that is not
/// shared.
pub fn validate_push(text: &str, path: &str) -> Result<Config, PushError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(PushError::TooLarge { path: path.to_owned(), len: text.len() });
    }
    let config = Config::parse(text, path)?;
    // Valid TOML by now: only the top-level names are read again, with their places.
    let top: BTreeMap<Spanned<String>, IgnoredAny> = toml::from_str(text).unwrap_or_default();
    if let Some(local) = top.keys().find(|k| !matches!(k.get_ref().as_str(), "rules" | "inline")) {
        let (line, column) = line_column(text, local.span().start);
        return Err(PushError::Local { path: path.to_owned(), line, column, field: local.get_ref().clone() });
    }
    Ok(config)
}

/// The configuration of a stored document (its rules and inline bounds; nothing else is ever
/// stored), its errors named after the version.
pub fn parse_stored(stored: &StoredRules) -> Result<Config, ConfigError> {
    let path = format!("redis rules version {}", stored.version);
    let unreadable =
        |message| ConfigError::Invalid { path: path.clone(), line: 1, column: 1, field: "rules".into(), message };
    match &stored.text {
        Err(why) => Err(unreadable(why.clone())),
        Ok(text) if text.len() > MAX_DOCUMENT_BYTES => {
            Err(unreadable(format!("{} bytes, over {MAX_DOCUMENT_BYTES}", text.len())))
        }
        Ok(text) => Config::parse(text, &path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"60s\"\n\n[inline]\nmax_limit = 100\n";

    #[test]
    fn a_push_is_validated_as_serve_would_and_keeps_local_settings_out() {
        let config = validate_push(RULES, "rules.toml").expect("rules and inline only");
        assert_eq!((config.rules.len(), config.inline.max_limit), (1, 100));
        let bad = RULES.replace("limit = 5", "limit = 0");
        assert_eq!(
            validate_push(&bad, "rules.toml").expect_err("invalid").to_string(),
            Config::parse(&bad, "rules.toml").expect_err("invalid").to_string(),
            "the error serve gives"
        );
        let token = format!("admin_token = \"s3cret\"\n{RULES}");
        assert!(
            validate_push(&token, "rules.toml")
                .expect_err("local")
                .to_string()
                .starts_with("rules.toml:1:1: admin_token: stays local")
        );
        let backend = format!("{RULES}\n[backend]\nredis = \"redis://127.0.0.1:6379\"\n");
        assert!(
            validate_push(&backend, "rules.toml")
                .expect_err("local")
                .to_string()
                .starts_with("rules.toml:9:2: backend")
        );
        let huge = format!("{RULES}#{}\n", "x".repeat(MAX_DOCUMENT_BYTES));
        assert!(matches!(validate_push(&huge, "rules.toml"), Err(PushError::TooLarge { .. })));
    }

    #[test]
    fn a_local_file_leaves_the_rules_to_redis() {
        let path = Path::new("local.toml");
        let with_rules = Config::parse(RULES, "local.toml").expect("valid");
        assert!(check_local(with_rules.clone(), false, path).is_ok());
        assert!(matches!(check_local(with_rules, true, path), Err(ConfigError::RulesFromRedis { .. })));
        let token_only = Config::parse("admin_token = \"s3cret\"\n", "local.toml").expect("valid");
        assert!(check_local(token_only, true, path).is_ok());
        let setting = format!("rules_from_redis = true\n{RULES}");
        let e = Config::parse(&setting, "local.toml").expect_err("rules beside the setting").to_string();
        assert!(e.starts_with("local.toml:1:20: rules_from_redis: the rules come from Redis"), "{e}");
        let alone = Config::parse("rules_from_redis = true\nmax_overrides = 10\n", "local.toml").expect("valid");
        assert!(alone.rules_from_redis && alone.max_overrides == 10);
        let e = Config::parse("max_overrides = 0\n", "local.toml").expect_err("bound").to_string();
        assert!(e.starts_with("local.toml:1:17: max_overrides: must be between 1 and"), "{e}");
    }
}
