//! The slidegate service: the library's decisions behind an HTTP/JSON API, configured by a
//! rules file, observed through Prometheus metrics, and the Envoy rate limit service over gRPC;
//! plus the `check` and `bench` commands.
//!
//! # Layout
//!
//! - [`config`]: the TOML rules file, validated with file/line/field errors.
//! - [`file`](mod@file): reading a configuration file: regular files only, size-bounded, never waiting.
//! - [`backend`]: [`backend::AnyBackend`], the memory or Redis backend chosen at start.
//! - [`app`]: the shared state — limiter and live rules, swapped whole on reload.
//! - [`api`]: the HTTP routes, JSON bodies, RateLimit headers and error answers.
//! - [`routes`]: every HTTP route, assembled from the surfaces, and the dispatch the listener calls.
//! - [`server`]: `serve` — bind, graceful shutdown.
//! - [`watch`]: reloads on a change of the rules file or the Envoy directory, and on SIGHUP.
//! - [`http`]: the HTTP listener — header-read and request deadlines, the connection cap.
//! - [`inline`]: the bounds of inline checks (`[inline]`).
//! - [`admin`]: the admin token, compared in constant time.
//! - [`redact`](mod@redact): passwords out of every log line and answer.
//! - [`request_id`]: the id that ties an error answer to its log line.
//! - [`envoy`]: envoyproxy/ratelimit's YAML files as descriptor trees, and a descriptor's key.
//! - [`envoy_rls`]: the Envoy rate limit service (gRPC) over them.
//! - [`forward_auth`]: the forward-auth endpoints of nginx, Caddy, Traefik and HAProxy.
//! - [`grpc`]: the gRPC listener — the HTTP listener's deadlines and connection cap.
//! - [`tls`]: TLS on both listeners, its files replaced live.
//! - [`health`]: the gRPC health service, following the backend's readiness.
//! - [`overrides`]: per-key overrides of a rule's limit, set through the admin routes.
//! - [`override_changes`]: setting, deleting and lapsing overrides, here or through Redis.
//! - [`shared_store`]: the store of the rules and overrides shared through Redis, and an
//!   instance's link to it.
//! - [`shared_rules`]: following and applying their changes in every instance, and
//!   `slidegate rules push | show`.
//! - [`write_back`]: what the local failure policy admitted while Redis was away, written into
//!   it once it answers again.
//! - [`metrics`]: metric names and the Prometheus recorder.
//! - [`stats`]: the dashboard's live traffic per rule, in fixed memory.
//! - [`ui`]: the dashboard (`/ui`) and `/v1/stats`.
//! - [`openapi`](mod@openapi): the HTTP API's OpenAPI document.
//! - [`validate`](mod@validate): `slidegate validate`, everything `serve` loads, checked offline.
//! - [`logging`]: text or JSON log lines.
//! - `bench`: the load generator (with the `bench` feature).

pub mod admin;
pub mod api;
pub mod api_error;
pub mod app;
pub mod backend;
#[cfg(feature = "bench")]
pub mod bench;
pub mod config;
pub mod envoy;
pub mod envoy_rls;
pub mod file;
pub mod forward_auth;
pub mod grpc;
pub mod health;
pub mod http;
pub mod inline;
mod log_buckets;
pub mod logging;
pub mod metrics;
#[cfg(test)]
mod mutate;
pub mod openapi;
pub mod override_changes;
pub mod overrides;
pub mod redact;
pub mod request_id;
pub mod routes;
pub mod server;
pub mod shared_rules;
pub mod shared_store;
pub mod stats;
pub mod tls;
pub mod trace;
pub mod ui;
pub mod validate;
pub mod watch;
pub mod write_back;
