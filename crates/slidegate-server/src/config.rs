//! The rules file (TOML): backend settings, the HTTP listener's limits, an optional admin token,
//! the bounds of inline checks, and named rules with tiers.
//!
//! Parsing happens in two steps: serde reads the file into raw specs that keep every value's
//! position (so unknown fields and wrong types are reported with their line), then each table's
//! spec validates itself into its part of a [`Config`]; an error names its field and the
//! value's position, which [`Config::parse`] turns into a file and line.
//!
//! Here: [`Config`] and the file's top-level values. Beside it: `backend`, `server`, `inline`
//! and `forward_auth` (those tables), `rule` (`[[rules]]` and their tiers), `algorithm` (how a
//! quota counts, shared with inline checks), `value` (checks several tables share).

mod algorithm;
mod backend;
mod caller;
mod envoy;
mod envoy_options;
mod forward_auth;
mod http_limits;
mod inline;
mod overlay;
mod proxies;
mod rule;
mod server;
mod settings;
mod shared;
mod ui;
mod value;

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::{Spanned, Table};

pub use algorithm::{AlgorithmError, AlgorithmField, AlgorithmSpec, DEFAULT_COLD_FRACTION};
use backend::BackendSpec;
pub use backend::{BackendConfig, DEFAULT_NEAR_CACHE, DEFAULT_TIMEOUT};
pub use caller::{Caller, CallerError, KeyPart, MAX_KEY_PARTS, MAX_METHOD_LEN, MAX_METHODS, MAX_PATH_PREFIX};
use envoy::envoy_options;
pub use envoy_options::{DEFAULT_NEAR_LIMIT_RATIO, EnvoyOptions, HeaderStyle, ResponseHeaders};
use forward_auth::ForwardAuthSpec;
pub use http_limits::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT, HttpLimit, HttpLimits,
    InvalidHttpLimit, MAX_CONNECTIONS, TIMEOUT_RANGE,
};
use inline::InlineSpec;
pub use overlay::put as put_setting;
pub use proxies::{ClientHeader, ForwardAuthConfig, MAX_TRUSTED_PROXIES};
use rule::RuleSpec;
pub use rule::{MAX_RULES, Rule, Rules};
use server::ServerSpec;
pub use server::{ListenerTlsFiles, client_san};
pub use settings::{Kind, LOCATIONS, SETTINGS, Setting, reference as settings_reference};
pub use shared::{DEFAULT_MAX_OVERRIDES, MAX_DOCUMENT_BYTES, MAX_OVERRIDES_CAP, local_only};
pub use ui::UiConfig;
use ui::UiSpec;
pub use value::{check_redis_url, parse_duration};

use crate::file::FileError;
use crate::inline::InlineConfig;
use crate::trace::export::OtlpOptions;
// A rules file is bounded as a pushed one is: both are the rules every instance parses.

/// A name reserved for checks that carry their own limit instead of naming a rule.
pub const INLINE_RULE: &str = "inline";

/// A rules file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: FileError,
    },
    /// The file is not TOML of the rules file's shape: bad syntax, an unknown field, a value of
    /// the wrong type, a missing field.
    #[error("{path}:{line}:{column}: {message}")]
    Toml {
        /// The file.
        path: String,
        /// 1-based line of the offending text.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong, as the TOML parser says it.
        message: String,
    },
    /// A value is out of range or does not fit the others.
    #[error("{path}:{line}:{column}: {field}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// 1-based line of the offending value.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field, as the file spells it: `backend.timeout`, `rules[0].tiers.vip.limit`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A setting given on the command line (or as its variable) cannot be used: its flag, or,
    /// when it does not fit the file's other settings, the table or field it makes wrong.
    #[error("{setting}: {message}")]
    Setting {
        /// `--max-overrides`, or `server` (with the flags given).
        setting: String,
        /// What is wrong.
        message: String,
    },
    /// The rules come from Redis (`--rules-from-redis`), yet the file has rules of its own.
    #[error(
        "{path}: the rules come from Redis (rules_from_redis): remove [[rules]] and [inline] from this file, \
         or push it with `slidegate rules push`"
    )]
    RulesFromRedis {
        /// The file.
        path: String,
    },
}

/// A value that cannot be used: its field, where it is written, and why. [`Config::parse`]
/// turns the position into a line and column of the file.
#[derive(Debug)]
struct Invalid {
    field: String,
    span: Range<usize>,
    message: String,
}

impl Invalid {
    fn new(field: impl Into<String>, span: Range<usize>, message: impl Into<String>) -> Self {
        Self { field: field.into(), span, message: message.into() }
    }
}

/// The 1-based line and column (in bytes) of byte `offset` of `text`.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// A validated rules file.
#[derive(Debug, Clone)]
pub struct Config {
    /// The admin routes (`/v1/keys/{rule}/{key}`) require `Authorization: Bearer <token>`;
    /// without a token they are disabled (403 `admin_disabled`).
    pub admin_token: Option<String>,
    /// Where state lives.
    pub backend: BackendConfig,
    /// The `[server]` table: the HTTP listener's deadlines and connection cap.
    pub server: HttpLimits,
    /// `[server]`'s `tls_cert`, `tls_key` and `tls_client_ca`: TLS on the HTTP and gRPC
    /// listeners.
    pub tls: ListenerTlsFiles,
    /// `[server]`'s `otlp_*` fields: where traces go, read once at start (flags win).
    pub tracing: OtlpOptions,
    /// The `[inline]` table: whether inline checks are served, and their bounds.
    pub inline: InlineConfig,
    /// The `[ui]` table: whether the dashboard and `/v1/stats` are served, and to whom.
    pub ui: UiConfig,
    /// The `[forward_auth]` table: whose word on a forward-auth client's address is believed.
    pub forward_auth: ForwardAuthConfig,
    /// The named rules.
    pub rules: Rules,
    /// Where to serve the Envoy rate limit service (gRPC), if at all.
    pub grpc: Option<std::net::SocketAddr>,
    /// A directory of envoyproxy/ratelimit YAML files.
    pub envoy_config: Option<std::path::PathBuf>,
    /// The Envoy service's settings (`envoy_*`).
    pub envoy: EnvoyOptions,
    /// Serve the `[[rules]]` and `[inline]` stored in the backend's Redis by `slidegate rules
    /// push` instead of this file's ([`crate::shared_rules`]).
    pub rules_from_redis: bool,
    /// The most per-key overrides this instance holds and accepts (`max_overrides`, default
    /// [`DEFAULT_MAX_OVERRIDES`]).
    pub max_overrides: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            admin_token: None,
            backend: BackendConfig::default(),
            server: HttpLimits::default(),
            tls: ListenerTlsFiles::default(),
            tracing: OtlpOptions::default(),
            inline: InlineConfig::default(),
            ui: UiConfig::default(),
            forward_auth: ForwardAuthConfig::default(),
            rules: Rules::default(),
            grpc: None,
            envoy_config: None,
            envoy: EnvoyOptions::default(),
            rules_from_redis: false,
            max_overrides: DEFAULT_MAX_OVERRIDES,
        }
    }
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    admin_token: Option<Spanned<String>>,
    grpc: Option<Spanned<String>>,
    envoy_config: Option<Spanned<String>>,
    envoy_response_headers: Option<bool>,
    envoy_response_headers_style: Option<Spanned<String>>,
    envoy_limit_header: Option<Spanned<String>>,
    envoy_remaining_header: Option<Spanned<String>>,
    envoy_reset_header: Option<Spanned<String>>,
    envoy_merge_domains: Option<bool>,
    envoy_shadow_mode: Option<bool>,
    envoy_quota_mode: Option<bool>,
    envoy_near_limit_ratio: Option<Spanned<f64>>,
    envoy_response_dynamic_metadata: Option<bool>,
    rules_from_redis: Option<Spanned<bool>>,
    max_overrides: Option<Spanned<usize>>,
    #[serde(default)]
    backend: BackendSpec,
    #[serde(default)]
    server: ServerSpec,
    #[serde(default)]
    inline: InlineSpec,
    #[serde(default)]
    ui: UiSpec,
    #[serde(default)]
    forward_auth: ForwardAuthSpec,
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

/// Where the configuration comes from: the rules file, if any, and the settings given over it
/// on the command line (a document of the file's shape, see [`SETTINGS`]); read at start and
/// at each reload alike.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The rules file.
    pub path: Option<PathBuf>,
    /// The settings given as flags or variables.
    pub settings: Table,
}

impl Source {
    /// The configuration: the file with the settings over it, validated.
    pub fn load(&self) -> Result<Config, ConfigError> {
        Config::load_over(self.path.as_deref(), &self.settings)
    }
}

impl Config {
    /// Reads and validates the rules file at `path`. A relative `envoy_config` directory, and a
    /// relative `[backend]` or `[server]` TLS file, is relative to the file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_over(Some(path), &Table::new())
    }

    /// The rules file at `path` (or none: the defaults), and over its fields the settings
    /// given on the command line, as a document of the file's shape (see [`SETTINGS`]): the
    /// file is validated first on its own (its errors at its lines), then with them; an error
    /// then names the flag. A path a flag gives stays as given.
    pub fn load_over(path: Option<&Path>, flags: &Table) -> Result<Self, ConfigError> {
        let (text, shown) = match path {
            Some(path) => {
                let text = crate::file::read_text(path, MAX_DOCUMENT_BYTES, "rules")
                    .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
                (text, path.display().to_string())
            }
            None => (String::new(), "the command line".to_owned()),
        };
        let mut config = Self::parse(&text, &shown)?;
        if !flags.is_empty() {
            let mut document: Table = toml::from_str(&text).unwrap_or_default();
            overlay::write_over(&mut document, flags);
            let merged = toml::to_string(&document)
                .map_err(|e| ConfigError::Setting { setting: "the flags".to_owned(), message: e.to_string() })?;
            config = Self::parse(&merged, &shown).map_err(|e| overlay::name_flag(e, flags, &merged))?;
        }
        if let Some(beside) = path.and_then(Path::parent) {
            config.beside(beside, flags);
        }
        Ok(config)
    }

    /// Makes the file's relative paths relative to `beside`, its directory; those `flags` give
    /// stay as given.
    fn beside(&mut self, beside: &Path, flags: &Table) {
        let from_file = |field: &str| !overlay::sets(flags, field);
        let (redis, listeners) = (&mut self.backend.tls, &mut self.tls);
        let files = [
            ("envoy_config", &mut self.envoy_config),
            ("backend.tls_ca", &mut redis.ca),
            ("backend.tls_cert", &mut redis.cert),
            ("backend.tls_key", &mut redis.key),
            ("server.tls_cert", &mut listeners.cert),
            ("server.tls_key", &mut listeners.key),
            ("server.tls_client_ca", &mut listeners.client_ca),
        ];
        for (field, file) in files {
            if let Some(file) = file.as_mut().filter(|f| f.is_relative() && from_file(field)) {
                *file = beside.join(&*file);
            }
        }
    }

    /// Validates `text`, reporting errors against `path`.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let spec: FileSpec = toml::from_str(text).map_err(|e| {
            let (line, column) = line_column(text, e.span().map_or(0, |s| s.start));
            ConfigError::Toml { path: path.to_owned(), line, column, message: e.message().to_owned() }
        })?;
        spec.validate().map_err(|e| {
            let (line, column) = line_column(text, e.span.start);
            ConfigError::Invalid { path: path.to_owned(), line, column, field: e.field, message: e.message }
        })
    }
}

impl FileSpec {
    /// The whole file, table by table, in the order errors are reported.
    fn validate(self) -> Result<Config, Invalid> {
        let timeout_span = self.backend.timeout.as_ref().map(Spanned::span);
        let envoy = envoy_options(&self)?;
        let backend = self.backend.validate()?;
        let server = self.server.validate(backend.timeout, timeout_span)?;
        let tls = self.server.tls()?;
        let tracing = self.server.tracing()?;
        let rules = Rules::from_specs(self.rules)?;
        let grpc = match self.grpc {
            Some(addr) => Some(
                addr.get_ref()
                    .parse()
                    .map_err(|e| Invalid::new("grpc", addr.span(), format!("{e} (e.g. \"127.0.0.1:8081\")")))?,
            ),
            None => None,
        };
        let inline = self.inline.validate()?;
        let rules_from_redis = rules_from_redis(self.rules_from_redis.as_ref(), &rules, &inline)?;
        let ui = self.ui.validate(self.admin_token.is_some())?;
        let forward_auth = self.forward_auth.validate()?;
        Ok(Config {
            admin_token: self.admin_token.map(Spanned::into_inner),
            backend,
            server,
            tls,
            tracing,
            inline,
            ui,
            forward_auth,
            rules,
            grpc,
            envoy_config: self.envoy_config.map(|d| d.into_inner().into()),
            envoy,
            rules_from_redis,
            max_overrides: max_overrides(self.max_overrides.as_ref())?,
        })
    }
}

/// `rules_from_redis`, which leaves `[[rules]]` and `[inline]` to Redis: the file may not have
/// its own.
fn rules_from_redis(setting: Option<&Spanned<bool>>, rules: &Rules, inline: &InlineConfig) -> Result<bool, Invalid> {
    match setting {
        Some(s) if *s.get_ref() && !local_only(rules, inline) => {
            let message = "the rules come from Redis: remove [[rules]] and [inline] from this file, or push it with \
                           `slidegate rules push`";
            Err(Invalid::new("rules_from_redis", s.span(), message))
        }
        s => Ok(s.is_some_and(|s| *s.get_ref())),
    }
}

/// `max_overrides`, within `1..=`[`MAX_OVERRIDES_CAP`].
fn max_overrides(n: Option<&Spanned<usize>>) -> Result<usize, Invalid> {
    match n {
        None => Ok(DEFAULT_MAX_OVERRIDES),
        Some(n) if (1..=MAX_OVERRIDES_CAP).contains(n.get_ref()) => Ok(*n.get_ref()),
        Some(n) => {
            let message = format!("must be between 1 and {MAX_OVERRIDES_CAP}, got {}", n.get_ref());
            Err(Invalid::new("max_overrides", n.span(), message))
        }
    }
}

#[cfg(test)]
mod tests {
    use slidegate::{Algorithm, Quota};

    use super::*;
    use slidegate::{FailurePolicy, RedisEngine};
    use std::time::Duration;

    const EXAMPLE: &str = r#"
admin_token = "s3cret"

[backend]
redis = "redis://127.0.0.1:6379"
prefix = "slidegate"
timeout = "50ms"

[[rules]]
name = "sms"
limit = 5
window = "60s"
algorithm = "sliding_log"

[[rules]]
name = "api"
limit = 10
window = "60s"
tiers = { vip = { limit = 100 } }
"#;

    /// A document of the rules file's shape, as the command line's settings are.
    fn given(text: &str) -> Table {
        toml::from_str(text).expect("a document")
    }

    /// Each row of the settings table names a field the rules file has, of the kind it says.
    #[test]
    fn every_setting_is_a_field_of_the_rules_file() {
        for s in SETTINGS {
            let value = match s.kind {
                Kind::Switch => "true".to_owned(),
                Kind::Whole => "1".to_owned(),
                Kind::Ratio => "0.5".to_owned(),
                Kind::Location { many: true } => "[\"redis://127.0.0.1:1\"]".to_owned(),
                _ => format!("{:?}", s.choices.first().copied().unwrap_or("1s")),
            };
            let text = match s.field.split_once('.') {
                Some((table, name)) => format!("[{table}]\n{name} = {value}\n"),
                None => format!("{} = {value}\n", s.field),
            };
            match Config::load_over(None, &given(&text)) {
                Err(ConfigError::Setting { setting, message })
                    if setting == "the flags" || message.contains("unknown") =>
                {
                    panic!("--{}: {setting}: {message}", s.flag)
                }
                _ => {}
            }
        }
    }

    #[test]
    fn settings_given_go_over_the_file_and_are_validated_with_it_naming_their_flag() {
        let dir = std::env::temp_dir().join(format!("slidegate-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("rules.toml");
        let file =
            "[backend]\nredis_cluster = [\"rediss://a:1\"]\ntls_ca = \"ca.pem\"\n[server]\nmax_connections = 5\n";
        std::fs::write(&path, file).expect("write");
        let over = given(
            "max_overrides = 7\nenvoy_shadow_mode = true\n[backend]\nredis = \"rediss://b:2\"\n\
             [server]\nheader_read_timeout = \"3s\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n",
        );
        let c = Config::load_over(Some(&path), &over).expect("valid");
        assert_eq!((c.max_overrides, c.envoy.shadow_mode), (7, true));
        assert_eq!(
            (c.backend.redis.as_deref(), c.backend.redis_cluster.len()),
            (Some("rediss://b:2"), 0),
            "one location"
        );
        assert_eq!((c.server.max_connections, c.server.header_read_timeout), (5, Duration::from_secs(3)));
        assert_eq!(c.backend.tls.ca, Some(dir.join("ca.pem")), "the file's path: beside the file");
        assert_eq!(c.tls.cert, Some("c.pem".into()), "a flag's: as given");
        for (flags, says) in [
            ("max_overrides = 0", "--max-overrides: must be between 1 and"),
            ("[server]\nrequest_timeout = \"10ms\"", "--request-timeout: "),
            ("[backend]\nredis = \"redis://b:2\"", "--redis (backend): TLS settings are given"),
            ("envoy_near_limit_ratio = 2.0", "--envoy-near-limit-ratio: must be between 0 and 1"),
            ("[server]\notlp_protocol = \"carrier pigeon\"", "--otlp-protocol: unknown variant"),
            ("[backend]\nreplicas_ack = 99999999999", "--redis-replicas-ack: "),
        ] {
            let error = Config::load_over(Some(&path), &given(flags)).expect_err(flags).to_string();
            assert!(error.starts_with(says) || error.contains(says), "{flags}: {error}");
        }
        // The file's own errors keep their line, whatever the flags.
        std::fs::write(&path, "max_overrides = 0\n").expect("write");
        let error = Config::load_over(Some(&path), &given("max_overrides = 3")).expect_err("the file's").to_string();
        assert!(error.contains("rules.toml:1:17: max_overrides"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_documented_example_loads() {
        let c = Config::parse(EXAMPLE, "rules.toml").expect("valid");
        assert_eq!(c.admin_token.as_deref(), Some("s3cret"));
        assert_eq!(c.backend.redis.as_deref(), Some("redis://127.0.0.1:6379"));
        assert_eq!(c.backend.timeout, Duration::from_millis(50));
        let api = c.rules.get("api").expect("api");
        assert_eq!(api.quota_for(None), Some(Quota::per_minute(10).expect("q")));
        assert_eq!(api.quota_for(Some("vip")), Some(Quota::per_minute(100).expect("q")));
        assert_eq!(api.quota_for(Some("gold")), None);
        assert_eq!(c.rules.len(), 2);
    }

    fn error(text: &str) -> String {
        Config::parse(text, "rules.toml").expect_err("invalid").to_string()
    }

    #[test]
    fn forward_auth_settings_past_a_bound_are_refused_naming_the_field_and_the_bound() {
        let rule = |fields: &str| format!("[[rules]]\nname = \"r\"\nlimit = 5\nwindow = \"1m\"\n{fields}\n");
        let parts = format!("key = [{}]", ["\"method\""; 9].join(", "));
        let methods = format!("methods = [{}]", ["\"GET\""; 17].join(", "));
        let prefix = format!("path_prefix = \"/{}\"", "p".repeat(1024));
        let proxies = format!("[forward_auth]\ntrusted_proxies = [{}]\n", ["\"10.0.0.1\""; 65].join(", "));
        for (text, want) in [
            (rule(&parts), "rules.toml:5:7: rules[0].key: list 1 to 8 parts, got 9"),
            (rule("key = []"), "rules.toml:5:7: rules[0].key: list 1 to 8 parts, got 0"),
            (rule("key = [\"cookie\"]"), "rules[0].key: unknown key part \"cookie\""),
            (rule("key = [\"header:bad name\"]"), "rules[0].key: \"bad name\" is not a header name"),
            (rule(&methods), "rules[0].methods: list 1 to 16 methods, got 17"),
            (rule(&format!("methods = [\"{}\"]", "G".repeat(33))), "is not a method of at most 32 bytes"),
            (rule(&prefix), "rules[0].path_prefix: must start with / and be at most 1024 bytes"),
            (rule("path_prefix = \"api\""), "rules[0].path_prefix: must start with /"),
            (proxies, "forward_auth.trusted_proxies: 65 entries, over the 64 allowed"),
            ("[forward_auth]\ntrusted_proxies = [\"10.0.0.0/33\"]\n".into(), "\"10.0.0.0/33\" is not an IP address"),
            ("[forward_auth]\nclient_header = \"x-client-ip\"\n".into(), "forward_auth.client_header: \"x-client-ip\""),
        ] {
            let e = error(&text);
            assert!(e.contains(want), "{e}");
        }
        let c = Config::parse(&rule("key = [\"header:X-Api-Key\", \"path\"]\nmethods = [\"POST\"]"), "r.toml")
            .expect("valid");
        assert_eq!(c.rules.get("r").map(|r| r.caller.key.len()), Some(2));
        assert!(Config::default().forward_auth.trusted_proxies.is_empty(), "nothing trusted by default");
    }

    #[test]
    fn a_request_deadline_within_the_backend_s_is_an_error_at_the_value_the_file_sets() {
        assert_eq!(
            error("[backend]\ntimeout = \"20s\"\n"),
            "rules.toml:2:11: server.request_timeout: 15s must be longer than backend.timeout (20s)"
        );
        assert_eq!(
            error("[backend]\ntimeout = \"1s\"\n[server]\nrequest_timeout = \"1s\"\n"),
            "rules.toml:4:19: server.request_timeout: 1s must be longer than backend.timeout (1s)"
        );
        assert!(Config::parse("[backend]\ntimeout = \"1s\"\n[server]\nrequest_timeout = \"2s\"\n", "r").is_ok());
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let rule = "[[rules]]\nname = \"a\"\nlimit = 5\nwindow = \"1s\"\n";
        assert_eq!(
            error("[[rules]]\nname = \"a\"\nlimit = 0\nwindow = \"1s\"\n"),
            "rules.toml:3:9: rules[0].limit: limit must be between 1 and 1000000000 for this algorithm, got 0"
        );
        assert!(
            error("[[rules]]\nname = \"a\"\nlimit = 5\nwindow = \"soon\"\n")
                .starts_with("rules.toml:4:10: rules[0].window: \"soon\" is not a duration")
        );
        assert!(
            error(&format!("{rule}{rule}")).starts_with("rules.toml:6:8: rules[1].name: duplicate rule name \"a\"")
        );
        assert!(error(&format!("{rule}limt = 3\n")).contains("rules.toml:5:1: unknown field `limt`"));
        assert!(error("[[rules]]\nname = \"a\"\nlimit = -1\nwindow = \"1s\"\n").starts_with("rules.toml:3:9:"));
        assert!(error("[[rules]]\nname = \"a\"\nwindow = \"1s\"\n").contains("missing field `limit`"));
        assert!(
            error("[backend]\ntimeout = \"0s\"\n").starts_with("rules.toml:2:11: backend.timeout: must be between")
        );
        assert!(error("[backend]\nredis = \"localhost\"\n").contains("backend.redis"));
        assert!(
            error(&format!("{rule}algorithm = \"leaky\"\n"))
                .contains("rules[0].algorithm: unknown algorithm \"leaky\"")
        );
        assert!(error("[[rules]]\nname = \"a:b\"\nlimit = 5\nwindow = \"1s\"\n").contains("rules[0].name"));
        assert!(error("[[rules]]\nname = \"inline\"\nlimit = 5\nwindow = \"1s\"\n").contains("reserved"));
        assert!(error(&format!("{rule}tiers = {{ vip = {{ limit = 0 }} }}\n")).contains("rules[0].tiers.vip.limit"));
        assert!(error("admin_token = 5\n").starts_with("rules.toml:1:15:"));
        assert!(
            error(&format!("{rule}algorithm = \"sliding_window\"\nbuckets = 7\n"))
                .starts_with("rules.toml:6:11: rules[0].buckets:")
        );
        assert!(
            error(&format!("{rule}burst = 3\n")).contains("rules[0].burst: invalid quota: `burst` applies to the gcra")
        );
        assert!(
            error(&format!("{rule}warm_up = \"1s\"\ncold_fraction = 2.0\n"))
                .starts_with("rules.toml:6:17: rules[0].cold_fraction:")
        );
        assert!(error(&format!("{rule}warm_up = \"soon\"\n")).starts_with("rules.toml:5:11: rules[0].warm_up:"));
        assert!(
            error(&format!("{rule}failure_policy = \"retry\"\n"))
                .contains("rules[0].failure_policy: \"retry\" is not one of")
        );
        assert!(error(&format!("{rule}failure_policy = \"local\"\n")).contains("needs local_share"));
        assert!(
            error("[backend]\nfailure_policy = \"local\"\nlocal_share = 0\n")
                .starts_with("rules.toml:3:15: backend.local_share:")
        );
        assert!(error("[backend]\nlocal_share = 0.5\n").contains("needs failure_policy"));
        assert!(
            error("[backend]\nengine = \"fast\"\n")
                .starts_with("rules.toml:2:10: backend.engine: \"fast\" is not one of")
        );
        let c = Config::parse("[backend]\nengine = \"module\"\n", "rules.toml").expect("valid");
        assert_eq!(c.backend.engine, RedisEngine::Module);
        assert_eq!(Config::default().backend.engine, RedisEngine::Auto);
        assert!(
            error("[backend]\nredis = \"redis://a\"\nredis_cluster = [\"redis://b\"]\n")
                .contains("either `redis` or `redis_cluster`")
        );
        assert!(error("[backend]\nredis_cluster = [\"b:1\"]\n").contains("backend.redis_cluster"));
        assert!(error("[backend]\nredis = \"redis://a\"\nredis_sentinel = [\"redis://b\"]\n").contains("give one of"));
    }

    #[test]
    fn server_and_inline_tables_load_and_report_their_field() {
        let text = r#"
[server]
header_read_timeout = "5s"
request_timeout = "20s"
max_connections = 64

[inline]
enabled = false
max_limit = 500
max_window = "1h"
max_cost = 10
algorithms = ["gcra", "token_bucket", "sliding_log"]
"#;
        let c = Config::parse(text, "rules.toml").expect("valid");
        assert_eq!(
            c.server,
            HttpLimits {
                header_read_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(20),
                max_connections: 64
            }
        );
        let want = InlineConfig {
            enabled: false,
            max_limit: 500,
            max_window: Duration::from_secs(3600),
            max_cost: 10,
            algorithms: Some(vec!["gcra", "gcra", "sliding_log"]),
        };
        assert_eq!(c.inline, want);
        assert_eq!(
            (Config::default().server, Config::default().inline),
            (HttpLimits::default(), InlineConfig::default())
        );
        assert!(
            error(
                "[server]
max_connections = 0
"
            )
            .starts_with("rules.toml:2:19: server.max_connections: must be")
        );
        assert!(
            error(
                "[server]
request_timeout = \"2h\"
"
            )
            .starts_with("rules.toml:2:19: server.request_timeout: must be")
        );
        assert!(
            error(
                "[server]
header_read_timeout = \"soon\"
"
            )
            .contains("server.header_read_timeout:")
        );
        assert!(
            error(
                "[server]
idle = 3
"
            )
            .contains("unknown field `idle`")
        );
        assert!(
            error(
                "[inline]
max_limit = 0
"
            )
            .starts_with("rules.toml:2:13: inline.max_limit: must be between 1")
        );
        assert!(
            error(
                "[inline]
max_cost = 2000000000
"
            )
            .contains("inline.max_cost: must be between 1")
        );
        assert!(
            error(
                "[inline]
max_window = \"400d\"
"
            )
            .contains("inline.max_window: must be between 1ms")
        );
        assert!(
            error(
                "[inline]
algorithms = []
"
            )
            .contains("inline.algorithms: list at least one")
        );
        assert!(
            error(
                "[inline]
algorithms = [\"leaky\"]
"
            )
            .contains("inline.algorithms: unknown algorithm \"leaky\"")
        );
    }

    #[test]
    fn envoy_settings_load_and_report_their_field() {
        let text = r#"
envoy_response_headers = true
envoy_response_headers_style = "ietf"
envoy_limit_header = "X-RL-Limit"
envoy_remaining_header = "X-RL-Remaining"
envoy_reset_header = "X-RL-Reset"
envoy_merge_domains = true
envoy_shadow_mode = true
envoy_quota_mode = true
envoy_near_limit_ratio = 0.9
envoy_response_dynamic_metadata = true
"#;
        let e = Config::parse(text, "rules.toml").expect("valid").envoy;
        assert!(e.headers.enabled && e.merge_domains && e.shadow_mode && e.quota_mode && e.dynamic_metadata);
        assert_eq!(e.headers.style, HeaderStyle::Ietf);
        assert_eq!(
            (e.headers.limit.as_str(), e.headers.reset.as_str(), e.near_limit_ratio),
            ("X-RL-Limit", "X-RL-Reset", 0.9)
        );
        assert_eq!(Config::default().envoy, EnvoyOptions::default());
        assert_eq!(EnvoyOptions::default().near_limit_ratio, 0.8);
        assert_eq!(EnvoyOptions::default().headers.remaining, "RateLimit-Remaining");
        assert_eq!(
            error("envoy_near_limit_ratio = 1.5\n"),
            "rules.toml:1:26: envoy_near_limit_ratio: must be between 0 and 1, got 1.5"
        );
        assert!(error("envoy_reset_header = \"Reset Me\"\n").starts_with("rules.toml:1:22: envoy_reset_header:"));
        assert!(
            error("envoy_response_headers_style = \"fancy\"\n")
                .contains("envoy_response_headers_style: \"fancy\" is not one of")
        );
        assert!(error("envoy_shadow_mode = \"yes\"\n").starts_with("rules.toml:1:21:"));
    }

    #[test]
    fn a_password_in_a_malformed_redis_url_is_not_echoed() {
        let e = error("[backend]\nredis = \"http://user:hunter2@host\"\n");
        assert!(e.contains("http://user:***@host") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn max_keys_bounds_the_memory_backend() {
        let text = "[backend]\nmax_keys = 5000\n\n[[rules]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n";
        assert_eq!(Config::parse(text, "rules.toml").expect("valid").backend.max_keys, 5_000);
        assert_eq!(Config::default().backend.max_keys, slidegate::memory::DEFAULT_MAX_KEYS);
        assert!(error("[backend]\nmax_keys = 0\n").contains("backend.max_keys: must be at least 1"));
    }

    #[test]
    fn failure_policies_default_per_backend_and_override_per_rule() {
        let text = r#"
[backend]
redis_cluster = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
failure_policy = "local"
local_share = 0.25
near_cache = 0

[[rules]]
name = "payments"
limit = 5
window = "1m"
failure_policy = "fail_closed"
tiers = { vip = { limit = 50 } }

[[rules]]
name = "search"
limit = 100
window = "1m"
"#;
        let c = Config::parse(text, "rules.toml").expect("valid");
        assert_eq!(c.backend.redis_cluster.len(), 2);
        assert_eq!(c.backend.failure_policy, FailurePolicy::Local { share_permille: 250 });
        assert_eq!(c.backend.near_cache, 0);
        let payments = c.rules.get("payments").expect("payments");
        assert_eq!(payments.quota.failure_policy(), Some(FailurePolicy::FailClosed));
        assert_eq!(payments.quota_for(Some("vip")).and_then(|q| q.failure_policy()), Some(FailurePolicy::FailClosed));
        assert_eq!(c.rules.get("search").expect("search").quota.failure_policy(), None, "the backend's default");
        assert_eq!(Config::default().backend.failure_policy, FailurePolicy::FailOpen, "fail_open when unset");
    }

    #[test]
    fn every_algorithm_and_warm_up_load_with_their_tiers() {
        let text = r#"
[[rules]]
name = "search"
limit = 100
window = "1m"
algorithm = "sliding_window"
buckets = 6
warm_up = "30s"
cold_fraction = 0.5
tiers = { vip = { limit = 1000 } }

[[rules]]
name = "upload"
limit = 10
window = "1s"
algorithm = "gcra"
burst = 20

[[rules]]
name = "cheap"
limit = 1000
window = "1h"
algorithm = "fixed_window"
"#;
        let c = Config::parse(text, "rules.toml").expect("valid");
        let search = c.rules.get("search").expect("search");
        let expected = Quota::per_minute(100)
            .and_then(|q| q.with_algorithm(Algorithm::SlidingWindow { buckets: 6 }))
            .and_then(|q| q.with_warm_up(Duration::from_secs(30), 0.5))
            .expect("valid");
        assert_eq!(search.quota, expected);
        let vip = search.quota_for(Some("vip")).expect("vip");
        assert_eq!((vip.limit(), vip.algorithm(), vip.warm_up()), (1000, expected.algorithm(), expected.warm_up()));
        assert_eq!(c.rules.get("upload").expect("upload").quota.burst(), 20);
        assert_eq!(c.rules.get("cheap").expect("cheap").quota.algorithm(), Algorithm::FixedWindow);
    }
}

/// The rules-file parser under hostile files: random text, valid files with bytes flipped,
/// inserted, deleted or cut, and hand-picked attacks.
#[cfg(test)]
mod fuzz {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::{Config, ConfigError};

    const VALID: [&str; 3] = [
        r#"
admin_token = "s3cret"
grpc = "127.0.0.1:8081"

[backend]
redis = "redis://127.0.0.1:6379"
prefix = "slidegate"
timeout = "50ms"
failure_policy = "local"
local_share = 0.25

[[rules]]
name = "sms"
limit = 5
window = "60s"
tiers = { vip = { limit = 100, window = "1m" } }
"#,
        r#"
[[rules]]
name = "search"
limit = 100
window = "1m"
algorithm = "sliding_window"
buckets = 6
warm_up = "30s"
cold_fraction = 0.5
failure_policy = "fail_closed"

[[rules]]
name = "upload"
limit = 10
window = "1s"
algorithm = "gcra"
burst = 20
"#,
        r#"
[backend]
redis_sentinel = ["redis://127.0.0.1:26379"]
sentinel_service = "mymaster"
engine = "module"
near_cache = 0
"#,
    ];

    /// Parses `text`, which must give a config or an error naming a line and column inside it,
    /// within a second.
    fn parses_or_is_refused(text: &str) -> Result<Option<Config>, TestCaseError> {
        let started = Instant::now();
        let outcome = Config::parse(text, "rules.toml");
        prop_assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        match outcome {
            Ok(config) => Ok(Some(config)),
            Err(
                ConfigError::Invalid { line, column, message, .. } | ConfigError::Toml { line, column, message, .. },
            ) => {
                prop_assert!(line >= 1 && line <= text.lines().count().max(1) + 1, "line {line}: {message}");
                prop_assert!(column >= 1 && !message.is_empty());
                Ok(None)
            }
            Err(e) => Err(TestCaseError::fail(format!("not a parse error: {e}"))),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]
        /// Random text and mutated valid files: a config or an error with its place, never a
        /// panic (a place is cut from the text, which must not split a character).
        #[test]
        fn any_file_parses_or_is_refused_with_its_place(
            valid in 0..VALID.len(),
            edits in proptest::collection::vec((0u8..4, any::<usize>(), any::<char>()), 0..6),
            random in proptest::option::weighted(0.2, ".{0,200}"),
        ) {
            let text = random.unwrap_or_else(|| VALID[valid].to_owned()).chars().collect();
            let text: String = crate::mutate::mutate(text, edits).into_iter().collect();
            parses_or_is_refused(&text)?;
        }
    }

    #[test]
    fn hostile_files_are_refused() {
        let rule = "[[rules]]\nname = \"a\"\nwindow = \"1s\"\n";
        let long = "x".repeat(1 << 20);
        let files = [
            // Deep nesting of arrays and inline tables.
            format!("admin_token = {}1{}\n", "[".repeat(10_000), "]".repeat(10_000)),
            format!("admin_token = {}1{}\n", "{a=".repeat(10_000), "}".repeat(10_000)),
            format!("[a.{}c]\nd = 1\n", "b.".repeat(10_000)),
            format!("a{} = 1\n", ".b".repeat(10_000)),
            // Numbers past every type, and the floats that are not numbers.
            format!("{rule}limit = 99999999999999999999999\n"),
            format!("{rule}limit = -1\n"),
            format!("{rule}limit = 1.5\n"),
            format!("{rule}limit = inf\n"),
            format!("{rule}limit = 5\nwarm_up = \"1s\"\ncold_fraction = nan\n"),
            format!("{rule}limit = 5\nwarm_up = \"1s\"\ncold_fraction = inf\n"),
            format!("{rule}limit = 5\nwarm_up = \"1s\"\ncold_fraction = -0.0\n"),
            "[backend]\nfailure_policy = \"local\"\nlocal_share = nan\n".into(),
            "[backend]\nfailure_policy = \"local\"\nlocal_share = -inf\n".into(),
            "[backend]\nnear_cache = 18446744073709551616\n".into(),
            // Durations: huge, not numbers, under a millisecond.
            format!("{rule}limit = 5\nwarm_up = \"99999999999999999999999s\"\n"),
            "[backend]\ntimeout = \"18446744073709551615s\"\n".into(),
            "[backend]\ntimeout = \"inf\"\n".into(),
            "[backend]\ntimeout = \"1ns\"\n".into(),
            "[[rules]]\nname = \"a\"\nlimit = 5\nwindow = \"584942417355y\"\n".into(),
            // Duplicate keys and tables, long and non-ASCII strings, a NUL.
            format!("{rule}limit = 5\nlimit = 6\n"),
            "[backend]\n[backend]\n".into(),
            format!("[[rules]]\nname = \"{long}\"\nlimit = 5\nwindow = \"1s\"\n"),
            "[[rules]]\nname = \"règle☃\"\nlimit = 5\nwindow = \"1s\"\n".into(),
            "[[rules]]\nname = \"a\u{0}\"\nlimit = 5\nwindow = \"1s\"\n".into(),
            "[[rules]]\nname = \"\"\"\n".into(),
            "\u{feff}é = \"ü\"\n".into(),
            "é\u{301}é = 1".into(),
        ];
        for text in &files {
            let outcome = parses_or_is_refused(text).unwrap_or_else(|e| panic!("{e}"));
            assert!(outcome.is_none(), "{} parsed", text.chars().take(80).collect::<String>());
        }
    }
}
