//! The settings `slidegate serve` takes on its command line as well as in the rules file, one
//! row each: the composition root builds the flags (and their `SLIDEGATE_*` variables) from
//! this table, the values given are written over the file's fields before one validation reads
//! both ([`crate::config::Config::load_over`]), and docs/settings.md is this table as text
//! ([`reference`]). A new setting is a field of its table's spec and a row here.

/// How a setting's value is written on the command line, and so into the rules file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Text,
    /// A file or directory (a relative one given as a flag is relative to the working
    /// directory, in the rules file to the file's own).
    Path,
    /// On when given; a file's `true` stays on without it.
    Switch,
    /// A whole number.
    Whole,
    /// A number with a fraction.
    Ratio,
    /// A duration such as `10s`.
    Duration,
    /// Where Redis is: one URL, or several comma-separated (`many`). The three are one
    /// setting: the one given replaces the file's others.
    Location {
        /// Several URLs.
        many: bool,
    },
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The flag, without its dashes: `redis-tls-ca`.
    pub flag: &'static str,
    /// The environment variable: `SLIDEGATE_` and the flag in capitals, `_` for `-`.
    pub env: &'static str,
    /// The rules file's field, its table first: `backend.tls_ca`.
    pub field: &'static str,
    /// How its value is written.
    pub kind: Kind,
    /// The value's name in `--help` (`FILE`), or `""` for clap's.
    pub value_name: &'static str,
    /// What it does, as `--help` says it.
    pub help: &'static str,
    /// Another flag it is given only with (a certificate and its key), or `""`.
    pub requires: &'static str,
    /// The values a text takes, when they are few (`--help` lists them); empty: any.
    pub choices: &'static [&'static str],
}

const fn setting(
    flag: &'static str,
    env: &'static str,
    field: &'static str,
    kind: Kind,
    help: &'static str,
) -> Setting {
    Setting { flag, env, field, kind, value_name: "", help, requires: "", choices: &[] }
}

const fn one_of(choices: &'static [&'static str], s: Setting) -> Setting {
    Setting { choices, ..s }
}

const fn with(requires: &'static str, s: Setting) -> Setting {
    Setting { requires, ..s }
}

const fn named(value_name: &'static str, s: Setting) -> Setting {
    Setting { value_name, ..s }
}

use Kind::{Duration, Location, Path, Ratio, Switch, Text, Whole};

/// Every setting, in `--help`'s order.
pub const SETTINGS: &[Setting] = &[
    setting(
        "redis",
        "SLIDEGATE_REDIS",
        "backend.redis",
        Location { many: false },
        "Redis URL: use the Redis backend (otherwise the file's, or the embedded memory backend).",
    ),
    setting(
        "redis-cluster",
        "SLIDEGATE_REDIS_CLUSTER",
        "backend.redis_cluster",
        Location { many: true },
        "Redis Cluster nodes, comma-separated: use the Cluster backend.",
    ),
    setting(
        "redis-sentinel",
        "SLIDEGATE_REDIS_SENTINEL",
        "backend.redis_sentinel",
        Location { many: true },
        "Redis Sentinels, comma-separated: follow the master they name through failovers.",
    ),
    named(
        "NAME",
        setting(
            "sentinel-service",
            "SLIDEGATE_SENTINEL_SERVICE",
            "backend.sentinel_service",
            Text,
            "The master's name at the sentinels (default `mymaster`).",
        ),
    ),
    named(
        "FILE",
        setting(
            "redis-tls-ca",
            "SLIDEGATE_REDIS_TLS_CA",
            "backend.tls_ca",
            Path,
            "The CA certificates (PEM) a `rediss://` Redis' certificate must chain to (default: the system's store).",
        ),
    ),
    with(
        "redis-tls-key",
        named(
            "FILE",
            setting(
                "redis-tls-cert",
                "SLIDEGATE_REDIS_TLS_CERT",
                "backend.tls_cert",
                Path,
                "A client certificate (PEM) to present to Redis, for `tls-auth-clients yes` (with --redis-tls-key).",
            ),
        ),
    ),
    with(
        "redis-tls-cert",
        named(
            "FILE",
            setting(
                "redis-tls-key",
                "SLIDEGATE_REDIS_TLS_KEY",
                "backend.tls_key",
                Path,
                "The client certificate's private key (PEM).",
            ),
        ),
    ),
    setting(
        "redis-tls-skip-hostname-verification",
        "SLIDEGATE_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "backend.tls_skip_hostname_verification",
        Switch,
        "Accept a Redis certificate that does not name the host connected to, still checking its chain and dates \
         (providers whose certificates name no endpoint; logged as a warning).",
    ),
    one_of(
        &["auto", "lua", "module"],
        named(
            "ENGINE",
            setting(
                "redis-engine",
                "SLIDEGATE_REDIS_ENGINE",
                "backend.engine",
                Text,
                "Which code decides on Redis: `auto` (slidegate's Redis module when the server has it loaded, the Lua \
         scripts otherwise), `lua` or `module`.",
            ),
        ),
    ),
    named(
        "N",
        setting(
            "redis-replicas-ack",
            "SLIDEGATE_REDIS_REPLICAS_ACK",
            "backend.replicas_ack",
            Whole,
            "Answer each admission only once this many replicas acknowledged it (`WAIT`; 0: none): fewer within half \
             the deadline is a backend failure the policy answers.",
        ),
    ),
    named(
        "FILE",
        setting(
            "tls-cert",
            "SLIDEGATE_TLS_CERT",
            "server.tls_cert",
            Path,
            "Serve HTTPS — and gRPC over TLS, with --grpc — with this certificate chain (PEM), served anew to new \
             connections when the file changes (with --tls-key).",
        ),
    ),
    named(
        "FILE",
        setting("tls-key", "SLIDEGATE_TLS_KEY", "server.tls_key", Path, "The certificate's private key (PEM)."),
    ),
    named(
        "FILE",
        setting(
            "tls-client-ca",
            "SLIDEGATE_TLS_CLIENT_CA",
            "server.tls_client_ca",
            Path,
            "Require of every client a certificate that chains to these CA certificates (PEM): mutual TLS, a client \
             without one refused at the handshake.",
        ),
    ),
    named(
        "NAME",
        setting(
            "tls-client-san",
            "SLIDEGATE_TLS_CLIENT_SAN",
            "server.tls_client_san",
            Text,
            "Require also that a client's certificate be valid for this DNS name or IP address (a subject alternative \
             name; envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN; with --tls-client-ca).",
        ),
    ),
    named(
        "ADDR",
        setting("grpc", "SLIDEGATE_GRPC", "grpc", Text, "Serve the Envoy rate limit service (gRPC) on this address."),
    ),
    named(
        "DIR",
        setting(
            "envoy-config",
            "SLIDEGATE_ENVOY_CONFIG",
            "envoy_config",
            Path,
            "A directory of envoyproxy/ratelimit YAML files (reloaded when they change).",
        ),
    ),
    setting(
        "envoy-response-headers",
        "SLIDEGATE_ENVOY_RESPONSE_HEADERS",
        "envoy_response_headers",
        Switch,
        "Add rate-limit headers to gRPC answers, for Envoy to pass to its clients (envoyproxy/ratelimit's \
         LIMIT_RESPONSE_HEADERS_ENABLED).",
    ),
    one_of(
        &["upstream", "ietf"],
        named(
            "STYLE",
            setting(
                "envoy-response-headers-style",
                "SLIDEGATE_ENVOY_RESPONSE_HEADERS_STYLE",
                "envoy_response_headers_style",
                Text,
                "Which headers: `upstream` (envoyproxy/ratelimit's RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset) \
         or `ietf` (the IETF draft's RateLimit-Policy and RateLimit).",
            ),
        ),
    ),
    named(
        "NAME",
        setting(
            "envoy-limit-header",
            "SLIDEGATE_ENVOY_LIMIT_HEADER",
            "envoy_limit_header",
            Text,
            "The limit header's name (default RateLimit-Limit; LIMIT_LIMIT_HEADER).",
        ),
    ),
    named(
        "NAME",
        setting(
            "envoy-remaining-header",
            "SLIDEGATE_ENVOY_REMAINING_HEADER",
            "envoy_remaining_header",
            Text,
            "The remaining header's name (default RateLimit-Remaining; LIMIT_REMAINING_HEADER).",
        ),
    ),
    named(
        "NAME",
        setting(
            "envoy-reset-header",
            "SLIDEGATE_ENVOY_RESET_HEADER",
            "envoy_reset_header",
            Text,
            "The reset header's name (default RateLimit-Reset; LIMIT_RESET_HEADER).",
        ),
    ),
    setting(
        "envoy-merge-domains",
        "SLIDEGATE_ENVOY_MERGE_DOMAINS",
        "envoy_merge_domains",
        Switch,
        "Merge the descriptors of files that declare the same domain instead of refusing them (MERGE_DOMAIN_CONFIG).",
    ),
    setting(
        "envoy-shadow-mode",
        "SLIDEGATE_ENVOY_SHADOW_MODE",
        "envoy_shadow_mode",
        Switch,
        "Answer OK to every request over its limits, still deciding and counting them (SHADOW_MODE).",
    ),
    setting(
        "envoy-quota-mode",
        "SLIDEGATE_ENVOY_QUOTA_MODE",
        "envoy_quota_mode",
        Switch,
        "Every descriptor in quota mode: a request is over only when all of them are (QUOTA_MODE).",
    ),
    setting(
        "envoy-near-limit-ratio",
        "SLIDEGATE_ENVOY_NEAR_LIMIT_RATIO",
        "envoy_near_limit_ratio",
        Ratio,
        "The share of a limit past which hits count as near it, 0 to 1 (default 0.8; NEAR_LIMIT_RATIO).",
    ),
    setting(
        "envoy-response-dynamic-metadata",
        "SLIDEGATE_ENVOY_RESPONSE_DYNAMIC_METADATA",
        "envoy_response_dynamic_metadata",
        Switch,
        "Answer with the request and the passed limits' `metadata` as dynamic metadata (RESPONSE_DYNAMIC_METADATA).",
    ),
    setting(
        "header-read-timeout",
        "SLIDEGATE_HEADER_READ_TIMEOUT",
        "server.header_read_timeout",
        Duration,
        "How long a client may take to send a request head (request line and headers), also the longest idle time \
         between two requests on one connection; then the connection is closed (default 10s).",
    ),
    setting(
        "request-timeout",
        "SLIDEGATE_REQUEST_TIMEOUT",
        "server.request_timeout",
        Duration,
        "How long a request may take from its head to its answer, body included; then it is answered 408 \
         `request_timeout` (default 15s). Must be longer than the backend timeout.",
    ),
    setting(
        "max-connections",
        "SLIDEGATE_MAX_CONNECTIONS",
        "server.max_connections",
        Whole,
        "The most HTTP connections open at once; one more is answered 503 `too_many_connections` and closed \
         (default 512).",
    ),
    setting(
        "rules-from-redis",
        "SLIDEGATE_RULES_FROM_REDIS",
        "rules_from_redis",
        Switch,
        "Serve the `[[rules]]` and `[inline]` that `slidegate rules push` stored in the backend's Redis, applying \
         each push within a second (the rules file then holds no rules of its own).",
    ),
    setting(
        "max-overrides",
        "SLIDEGATE_MAX_OVERRIDES",
        "max_overrides",
        Whole,
        "The most per-key overrides this instance holds and accepts (default 100000).",
    ),
    named(
        "URL",
        setting(
            "otlp-endpoint",
            "SLIDEGATE_OTLP_ENDPOINT",
            "server.otlp_endpoint",
            Text,
            "Export a span per decision over OTLP to this collector: `http://host:4317` (gRPC) or \
             `http://host:4318/v1/traces` (HTTP/protobuf). Without it nothing is traced.",
        ),
    ),
    one_of(
        &["grpc", "http"],
        named(
            "PROTOCOL",
            setting(
                "otlp-protocol",
                "SLIDEGATE_OTLP_PROTOCOL",
                "server.otlp_protocol",
                Text,
                "`grpc` or `http` (HTTP/protobuf); default `http` when the endpoint's path ends in `/v1/traces`, `grpc` \
         otherwise.",
            ),
        ),
    ),
    setting(
        "otlp-sampling-ratio",
        "SLIDEGATE_OTLP_SAMPLING_RATIO",
        "server.otlp_sampling_ratio",
        Ratio,
        "The share of new traces exported, 0.0 to 1.0 (default 1.0); a request continuing a trace follows its \
         parent's sampling decision instead.",
    ),
];

impl Setting {
    /// The value's name in `--help`: the given one, or its kind's.
    pub fn value_name(&self) -> &'static str {
        match (self.value_name, self.kind) {
            ("", Location { many: false }) => "URL",
            ("", Location { many: true }) => "URLS",
            ("", Path) => "FILE",
            ("", Whole) => "N",
            ("", Ratio) => "RATIO",
            ("", Duration) => "DURATION",
            ("", Text | Switch) => "VALUE",
            (name, _) => name,
        }
    }
}

/// The setting whose rules-file field is `field`.
pub(super) fn by_field(field: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.field == field)
}

/// The rules file's fields that say where Redis is: one of them, the backend's location.
pub const LOCATIONS: [&str; 3] = ["backend.redis", "backend.redis_cluster", "backend.redis_sentinel"];

/// The table as docs/settings.md shows it: flag, variable, field, what it does.
pub fn reference() -> String {
    let mut out = String::from("| flag | environment | rules file | what it does |\n|---|---|---|---|\n");
    for s in SETTINGS {
        let value = match (s.kind, s.value_name) {
            (Switch, _) => String::new(),
            _ => format!(" {}", s.value_name()),
        };
        let field = match s.field.split_once('.') {
            Some((table, name)) => format!("`[{table}] {name}`"),
            None => format!("`{}`", s.field),
        };
        out += &format!("| `--{}{value}` | `{}` | {field} | {} |\n", s.flag, s.env, s.help);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variable_is_its_flag_in_capitals_and_each_flag_and_field_is_named_once() {
        for (i, s) in SETTINGS.iter().enumerate() {
            assert_eq!(s.env, format!("SLIDEGATE_{}", s.flag.to_uppercase().replace('-', "_")), "{}", s.flag);
            let later = &SETTINGS[i + 1..];
            assert!(later.iter().all(|o| o.flag != s.flag && o.field != s.field), "{} twice", s.flag);
        }
    }
}
